//! A [`FailureDestination`] that writes records a processor kept failing on
//! to a DynamoDB table, one item per record, keyed by the record's position
//! so that writing one twice (a retried send) leaves one item.

use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use kcl_core::poison::{FailedRecord, FailureDestination};
use kcl_core::processor::ProcessorError;

/// The table's partition key: `stream/shard/sequence/sub-sequence`.
pub const FAILURE_KEY: &str = "id";

/// Data above this many bytes is left out of the item (DynamoDB items are
/// at most 400 KB, and the other attributes need room).
const MAX_DATA_BYTES: usize = 350 * 1024;

/// An error text is cut to this many bytes, so that the item fits.
const MAX_ERROR_BYTES: usize = 8 * 1024;

/// Writes failed records to a DynamoDB table whose partition key is the
/// string attribute `id` ([`FAILURE_KEY`]):
///
/// | attribute | type | |
/// |---|---|---|
/// | `id` | S | `stream/shard/sequence/sub-sequence` |
/// | `stream`, `shard_id`, `sequence_number`, `partition_key`, `worker_id` | S | |
/// | `sub_sequence_number`, `attempts` | N | |
/// | `error`, `reason` | S | the processor's last error (cut to 8 KiB); `max_attempts` or `max_record_age` |
/// | `failed_at_ms`, `approximate_arrival_ms` | N | milliseconds since the epoch |
/// | `data` | B | left out above 350 KB, with `data_omitted` true |
/// | `data_bytes` | N | |
#[derive(Debug, Clone)]
pub struct DynamoDbDestination {
    client: Client,
    table: String,
}

impl DynamoDbDestination {
    /// Writes to `table` with `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoDbDestination {
            client,
            table: table.into(),
        }
    }

    /// Creates the table (on-demand, key `id`) unless it exists, and waits
    /// until it is ACTIVE.
    pub async fn create_table_if_absent(&self) -> Result<(), ProcessorError> {
        let created = self
            .client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(FAILURE_KEY)
                    .attribute_type(ScalarAttributeType::S)
                    .build()?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(FAILURE_KEY)
                    .key_type(KeyType::Hash)
                    .build()?,
            )
            .send()
            .await;
        if let Err(e) = created
            && !e
                .as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception())
        {
            return Err(format!(
                "creating the failure table {:?} failed: {}",
                self.table,
                DisplayErrorContext(&e)
            )
            .into());
        }
        for _ in 0..120 {
            let described = self
                .client
                .describe_table()
                .table_name(&self.table)
                .send()
                .await
                .map_err(|e| format!("describing {:?}: {}", self.table, DisplayErrorContext(&e)))?;
            let active = described
                .table
                .and_then(|t| t.table_status)
                .is_some_and(|s| s.as_str() == "ACTIVE");
            if active {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        Err(format!("the failure table {:?} never became ACTIVE", self.table).into())
    }
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

/// The item of `failed`.
pub(crate) fn item(failed: &FailedRecord) -> Vec<(&'static str, AttributeValue)> {
    let r = &failed.record;
    let mut item = vec![
        (
            FAILURE_KEY,
            s(&format!(
                "{}/{}/{}/{}",
                failed.shard.stream,
                failed.shard.shard_id,
                r.sequence_number,
                r.sub_sequence_number
            )),
        ),
        ("stream", s(&failed.shard.stream)),
        ("shard_id", s(&failed.shard.shard_id)),
        ("sequence_number", s(&r.sequence_number)),
        ("sub_sequence_number", n(r.sub_sequence_number)),
        ("partition_key", s(&r.partition_key)),
        ("worker_id", s(&failed.shard.worker_id)),
        ("error", s(failed.error_within(MAX_ERROR_BYTES))),
        ("reason", s(failed.reason.as_str())),
        ("attempts", n(u64::from(failed.attempts))),
        ("failed_at_ms", n(millis(failed.failed_at))),
        ("data_bytes", n(r.data.len() as u64)),
    ];
    if let Some(at) = r.approximate_arrival {
        item.push(("approximate_arrival_ms", n(millis(at))));
    }
    if r.data.len() <= MAX_DATA_BYTES {
        item.push(("data", AttributeValue::B(Blob::new(r.data.to_vec()))));
    } else {
        item.push(("data_omitted", AttributeValue::Bool(true)));
    }
    item
}

#[async_trait]
impl FailureDestination for DynamoDbDestination {
    async fn send(&self, failed: &[FailedRecord]) -> Result<(), ProcessorError> {
        // One put per record: poison records are rare, and a put is
        // idempotent by its key where a batch write needs its own retries.
        for f in failed {
            let mut put = self.client.put_item().table_name(&self.table);
            for (name, value) in item(f) {
                put = put.item(name, value);
            }
            put.send().await.map_err(|e| {
                format!(
                    "writing a failed record to {:?} failed: {}",
                    self.table,
                    DisplayErrorContext(&e)
                )
            })?;
        }
        Ok(())
    }
}
