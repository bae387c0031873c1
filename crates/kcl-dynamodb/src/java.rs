//! The Java KCL 3.x's own table, read in the Java-compatible mode so that a
//! mixed fleet shares the shards: `<lease table>-WorkerMetricStats`, one
//! entry per Java worker, which its leader balances over.
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `wid` (hash key) | S | the worker id, as in `leaseOwner` |
//! | `lut` | N | when it last reported, epoch seconds (every 30 s) |
//!
//! kcl only reads this table (the `wid` and `lut` of every entry, one
//! paginated scan); it never creates it and never writes to it.

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_core::store::{JavaWorker, StoreError, StoreOp};

use crate::schema::java_workers::{LAST_UPDATE, WORKER_ID};
pub use crate::schema::worker_metric_stats_table_for;
use crate::store::DynamoDbLeaseStore;

impl DynamoDbLeaseStore {
    pub(crate) async fn read_java_workers(&self) -> Result<Vec<JavaWorker>, StoreError> {
        let table = worker_metric_stats_table_for(self.table());
        // No such table: no Java KCL 3.x worker ever ran here.
        let projection = format!("{WORKER_ID}, {LAST_UPDATE}");
        let items = self
            .scan_all(StoreOp::ReadJavaWorkers, &table, false, Some(&projection))
            .await?
            .unwrap_or_default();
        Ok(items
            .iter()
            .filter_map(|item| {
                let id = match item.get(WORKER_ID) {
                    Some(AttributeValue::S(id)) => id.clone(),
                    _ => return None,
                };
                let last_update_secs = match item.get(LAST_UPDATE) {
                    Some(AttributeValue::N(n)) => n.parse().ok()?,
                    _ => return None,
                };
                Some(JavaWorker {
                    id,
                    last_update_secs,
                })
            })
            .collect())
    }
}
