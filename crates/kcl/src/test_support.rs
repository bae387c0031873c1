//! What the unit tests of several modules, and the integration tests
//! (which include this file by path), share: AWS settings that need no
//! account and a processor that does nothing.

use aws_config::SdkConfig;
use kcl_core::checkpointer::Checkpointer;
use kcl_core::processor::{ProcessorError, RecordBatch, RecordProcessor};

/// A region and behaviour version, and no credentials: enough to build a
/// worker, and to run one against a local endpoint of the test's own.
pub(crate) fn offline_sdk() -> SdkConfig {
    SdkConfig::builder()
        .region(aws_config::Region::new("us-east-1"))
        .behavior_version(aws_config::BehaviorVersion::latest())
        .build()
}

/// Accepts every batch without checkpointing.
pub(crate) struct NoOp;

#[async_trait::async_trait]
impl RecordProcessor for NoOp {
    async fn process_records(
        &mut self,
        _: &RecordBatch,
        _: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        Ok(())
    }
}
