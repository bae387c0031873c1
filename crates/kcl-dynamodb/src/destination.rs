//! A [`FailureDestination`] that writes records a processor kept failing on
//! to a DynamoDB table, one item per record, keyed by the record's position
//! so that writing one twice (a retried send) leaves one item.
//!
//! An item holds at most 400 KB. A record whose item would not fit fails the
//! send with [`CannotStore`], so the checkpoint stays before it and the
//! shard stays with its worker, unless the application chose to keep a
//! prefix of its data instead ([`DynamoDbDestination::truncate_oversized_data`]).

use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kcl_core::poison::{CannotStore, FailedRecord, FailureDestination};
use kcl_core::processor::ProcessorError;

/// The table's partition key: `stream/shard/sequence/sub-sequence`.
pub const FAILURE_KEY: &str = "id";

/// DynamoDB's item limit, attribute names included.
const MAX_ITEM_BYTES: usize = 400 * 1024;

/// Puts in flight at once in one send: one by one, a group of a few
/// thousand records (a whole batch given up on without bisection) could
/// outlast the poison policy's attempt timeout and never complete.
const PUTS_IN_FLIGHT: usize = 16;

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
/// | `data` | B | the record's data, whole (see below) |
/// | `data_bytes` | N | the record's size |
/// | `data_truncated` | BOOL | present (true) when `data` holds only a prefix |
///
/// An item is at most 400 KB, so a record of more than about 390 KB cannot
/// be stored whole: its send fails with [`CannotStore`], naming the record
/// and the sizes, and the shard does not move past it. No other worker
/// could store it either, so the shard is kept (not given back at
/// `PoisonPolicy::send_deadline`) and the send retried with capped backoff
/// until the application changes the destination. Use
/// `KinesisDestination` for records up to Kinesis's 1 MiB, or
/// [`truncate_oversized_data`](Self::truncate_oversized_data) to keep what
/// fits.
#[derive(Debug, Clone)]
pub struct DynamoDbDestination {
    client: Client,
    table: String,
    truncate: bool,
}

impl DynamoDbDestination {
    /// Writes to `table` with `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        DynamoDbDestination {
            client,
            table: table.into(),
            truncate: false,
        }
    }

    /// Whether a record too big for an item is stored with only the first
    /// bytes of its data that fit (the item then has `data_truncated` true
    /// and the original size in `data_bytes`) rather than failing the send.
    /// Off by default: the rest of such a record's data is lost once the
    /// source stream's retention ends.
    pub fn truncate_oversized_data(mut self, on: bool) -> Self {
        self.truncate = on;
        self
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

/// An item's attributes.
pub(crate) type Item = Vec<(&'static str, AttributeValue)>;

/// The item of `failed`; if its data does not fit, [`CannotStore`], or a
/// prefix of the data with `truncate`.
pub(crate) fn item(failed: &FailedRecord, truncate: bool) -> Result<Item, CannotStore> {
    let r = &failed.record;
    let mut item = vec![
        (FAILURE_KEY, s(&failed.id())),
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
    // Room for the data, with the truncation mark counted in case.
    let room = MAX_ITEM_BYTES
        .saturating_sub(item_bytes(&item) + "data".len() + "data_truncated".len() + 1);
    let kept = if r.data.len() <= room {
        r.data.len()
    } else if truncate {
        item.push(("data_truncated", AttributeValue::Bool(true)));
        room
    } else {
        return Err(CannotStore::new(format!(
            "the failed record {} has {} bytes of data, and its item holds at most {room} \
             (DynamoDB items are at most 400 KB); it is not stored, and the shard does not \
             move past it. Use a destination that holds it (KinesisDestination stores up to \
             1 MiB) or DynamoDbDestination::truncate_oversized_data(true) to keep its first {room} bytes",
            failed.id(),
            r.data.len()
        )));
    };
    item.push((
        "data",
        AttributeValue::B(Blob::new(r.data[..kept].to_vec())),
    ));
    Ok(item)
}

/// The size DynamoDB counts for `item`, or more: names and strings by their
/// UTF-8 length, binaries by theirs, a number at most one byte per digit
/// plus one, a boolean one byte.
fn item_bytes(item: &[(&str, AttributeValue)]) -> usize {
    item.iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    AttributeValue::S(v) => v.len(),
                    AttributeValue::N(v) => v.len() + 1,
                    AttributeValue::B(v) => v.as_ref().len(),
                    // Only the types above and booleans are written.
                    _ => 1,
                }
        })
        .sum()
}

#[async_trait]
impl FailureDestination for DynamoDbDestination {
    async fn send(&self, failed: &[FailedRecord]) -> Result<(), ProcessorError> {
        // Every item is checked before any is written: a record that cannot
        // be stored fails the send at once, without writes to repeat.
        let items = failed
            .iter()
            .map(|f| item(f, self.truncate))
            .collect::<Result<Vec<_>, _>>()?;
        self.put_all(items).await
    }
}

impl DynamoDbDestination {
    /// One put per record: poison records are rare, and a put is
    /// idempotent by its key where a batch write needs its own retries.
    async fn put_all(&self, items: Vec<Item>) -> Result<(), ProcessorError> {
        let mut items = items.into_iter();
        let mut running = FuturesUnordered::new();
        loop {
            while running.len() < PUTS_IN_FLIGHT
                && let Some(item) = items.next()
            {
                running.push(self.put(item));
            }
            match running.next().await {
                Some(put) => put?,
                None => return Ok(()),
            }
        }
    }

    async fn put(&self, item: Item) -> Result<(), ProcessorError> {
        let mut put = self.client.put_item().table_name(&self.table);
        for (name, value) in item {
            put = put.item(name, value);
        }
        put.send().await.map_err(|e| {
            format!(
                "writing a failed record to {:?} failed: {}",
                self.table,
                DisplayErrorContext(&e)
            )
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    use kcl_core::test_util::failed_record;

    fn failed(bytes: usize, error: &str) -> FailedRecord {
        let mut f = failed_record(vec![7u8; bytes].into(), "49590", error);
        f.record.approximate_arrival = Some(SystemTime::now());
        f
    }

    fn get<'a>(item: &'a Item, name: &str) -> Option<&'a AttributeValue> {
        item.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// A client whose calls could only fail: nothing listens there.
    fn nowhere() -> Client {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "test"))
            .endpoint_url("http://127.0.0.1:9")
            .build();
        Client::from_conf(config)
    }

    #[test]
    fn a_record_that_fits_an_item_is_stored_whole() {
        // A long error and partition key leave the least room.
        let f = failed(390_000, &"e".repeat(100_000));
        let item = item(&f, false).unwrap();
        let Some(AttributeValue::B(data)) = get(&item, "data") else {
            panic!(
                "no data among {:?}",
                item.iter().map(|(n, _)| n).collect::<Vec<_>>()
            );
        };
        assert_eq!(data.as_ref(), f.record.data.as_ref());
        assert!(get(&item, "data_truncated").is_none());
        assert!(item_bytes(&item) <= MAX_ITEM_BYTES, "{}", item_bytes(&item));
    }

    #[tokio::test]
    async fn a_record_too_big_for_an_item_fails_the_send_for_good_naming_it() {
        let destination = DynamoDbDestination::new(nowhere(), "failed");
        let err = destination
            .send(&[failed(100, "x"), failed(500_000, "x")])
            .await
            .unwrap_err();
        assert!(
            CannotStore::find(&*err).is_some(),
            "no retry can store it: {err}"
        );
        let err = err.to_string();
        assert!(
            err.contains("orders/shardId-000000000001/49590/2")
                && err.contains("500000 bytes")
                && err.contains("400 KB"),
            "{err}"
        );
    }

    #[test]
    fn with_truncation_an_oversized_record_keeps_a_prefix_marked_with_its_size() {
        let f = failed(1024 * 1024, "x");
        let item = item(&f, true).unwrap();
        let Some(AttributeValue::B(data)) = get(&item, "data") else {
            panic!(
                "no data among {:?}",
                item.iter().map(|(n, _)| n).collect::<Vec<_>>()
            );
        };
        assert!(data.as_ref().len() > 390_000, "{}", data.as_ref().len());
        assert_eq!(data.as_ref(), &f.record.data[..data.as_ref().len()]);
        assert_eq!(
            get(&item, "data_truncated"),
            Some(&AttributeValue::Bool(true))
        );
        assert_eq!(get(&item, "data_bytes"), Some(&n(1024 * 1024)));
        assert!(item_bytes(&item) <= MAX_ITEM_BYTES, "{}", item_bytes(&item));
    }
}
