//! A [`FailureDestination`] that writes records a processor kept failing on
//! to a Kinesis stream (a dead-letter stream), one JSON document per
//! record, under the record's own partition key (so a key's failed records
//! share a shard of the dead-letter stream; `PutRecords` does not promise
//! their order, and a refused entry is resent after the others).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::DisplayErrorContext;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use aws_smithy_types::base64;
use kcl_core::backoff::Backoff;
use kcl_core::poison::{FailedRecord, FailureDestination};
use kcl_core::processor::ProcessorError;

/// Kinesis takes at most this many records per `PutRecords`.
const MAX_RECORDS_PER_CALL: usize = 500;
/// ... and at most this many bytes per call (data and partition keys).
const MAX_BYTES_PER_CALL: usize = 5 * 1024 * 1024;
/// ... and at most this many per record.
const MAX_RECORD_BYTES: usize = 1024 * 1024;
/// An error text is cut to this many bytes.
const MAX_ERROR_BYTES: usize = 8 * 1024;
/// Resending the entries a `PutRecords` refused (throttled shards): twice,
/// 100 ms then 200 ms later, before `send` fails and the consumer retries
/// it with its own backoff.
const RESEND: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(200))
    .retries(2)
    .without_jitter();

/// Writes failed records to a Kinesis stream as JSON:
///
/// ```json
/// {"stream": "orders", "shard_id": "shardId-000000000001",
///  "sequence_number": "4959...", "sub_sequence_number": 0,
///  "partition_key": "customer-17", "explicit_hash_key": null,
///  "aggregated": false, "approximate_arrival_ms": 1764600000000,
///  "error": "...", "attempts": 3, "reason": "max_attempts",
///  "failed_at_ms": 1764600012000, "worker_id": "...",
///  "data_base64": "eyJvcmRlciI6...", "data_bytes": 42}
/// ```
///
/// A record whose document would pass Kinesis's 1 MiB limit is written
/// without `data_base64` (`"data_omitted": true`); its position lets it be
/// read again from the source stream while that retains it.
#[derive(Debug, Clone)]
pub struct KinesisDestination {
    client: Client,
    stream: String,
}

impl KinesisDestination {
    /// Writes to `stream` (a name, or an ARN) with `client`.
    pub fn new(client: Client, stream: impl Into<String>) -> Self {
        KinesisDestination {
            client,
            stream: stream.into(),
        }
    }

    fn entry(failed: &FailedRecord) -> Result<PutRecordsRequestEntry, ProcessorError> {
        let mut doc = document(failed, true);
        if doc.len() + failed.record.partition_key.len() > MAX_RECORD_BYTES {
            doc = document(failed, false);
        }
        Ok(PutRecordsRequestEntry::builder()
            .data(Blob::new(doc))
            .partition_key(failed.record.partition_key.clone())
            .build()?)
    }
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The JSON document of `failed`, with its data or without.
pub(crate) fn document(failed: &FailedRecord, with_data: bool) -> Vec<u8> {
    let r = &failed.record;
    let mut doc = serde_json::json!({
        "stream": failed.shard.stream,
        "shard_id": failed.shard.shard_id,
        "sequence_number": r.sequence_number,
        "sub_sequence_number": r.sub_sequence_number,
        "partition_key": r.partition_key,
        "explicit_hash_key": r.explicit_hash_key,
        "aggregated": r.aggregated,
        "approximate_arrival_ms": r.approximate_arrival.map(millis),
        "error": failed.error_within(MAX_ERROR_BYTES),
        "attempts": failed.attempts,
        "reason": failed.reason.as_str(),
        "failed_at_ms": millis(failed.failed_at),
        "worker_id": failed.shard.worker_id,
        "data_bytes": r.data.len(),
    });
    if with_data {
        doc["data_base64"] = serde_json::Value::String(base64::encode(&r.data));
    } else {
        doc["data_omitted"] = serde_json::Value::Bool(true);
    }
    serde_json::to_vec(&doc).unwrap_or_default()
}

#[async_trait]
impl FailureDestination for KinesisDestination {
    async fn send(&self, failed: &[FailedRecord]) -> Result<(), ProcessorError> {
        let entries = failed
            .iter()
            .map(Self::entry)
            .collect::<Result<Vec<_>, _>>()?;
        for chunk in chunks(entries) {
            self.put(chunk).await?;
        }
        Ok(())
    }
}

impl KinesisDestination {
    /// Puts `entries`, resending those refused a few rounds.
    async fn put(&self, mut entries: Vec<PutRecordsRequestEntry>) -> Result<(), ProcessorError> {
        let mut pauses = RESEND.pauses();
        loop {
            let call = self.client.put_records().set_records(Some(entries.clone()));
            let call = if self.stream.starts_with("arn:") {
                call.stream_arn(&self.stream)
            } else {
                call.stream_name(&self.stream)
            };
            let out = call.send().await.map_err(|e| {
                format!(
                    "PutRecords to the failure stream {:?} failed: {}",
                    self.stream,
                    DisplayErrorContext(&e)
                )
            })?;
            if out.failed_record_count.unwrap_or(0) == 0 {
                return Ok(());
            }
            let mut refused = Vec::new();
            let mut why = String::new();
            for (entry, result) in entries.into_iter().zip(out.records) {
                if let Some(code) = result.error_code {
                    if why.is_empty() {
                        why = format!("{code}: {}", result.error_message.unwrap_or_default());
                    }
                    refused.push(entry);
                }
            }
            let Some(pause) = pauses.next() else {
                return Err(format!(
                    "the failure stream {:?} refused {} records ({why})",
                    self.stream,
                    refused.len()
                )
                .into());
            };
            entries = refused;
            tokio::time::sleep(pause).await;
        }
    }
}

/// Splits entries into calls within Kinesis's per-call limits.
fn chunks(entries: Vec<PutRecordsRequestEntry>) -> Vec<Vec<PutRecordsRequestEntry>> {
    let mut out: Vec<Vec<PutRecordsRequestEntry>> = Vec::new();
    let mut bytes = 0;
    for e in entries {
        let size = e.data().as_ref().len() + e.partition_key().map_or(0, str::len);
        let full = out
            .last()
            .is_none_or(|c| c.len() == MAX_RECORDS_PER_CALL || bytes + size > MAX_BYTES_PER_CALL);
        if full {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        if let Some(chunk) = out.last_mut() {
            chunk.push(e);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use kcl_core::Record;
    use kcl_core::poison::FailureReason;
    use kcl_core::processor::ShardContext;

    fn failed(data: Bytes) -> FailedRecord {
        let mut f = FailedRecord::new(
            ShardContext {
                stream: "orders".into(),
                shard_id: "shardId-000000000001".into(),
                lease_key: "shardId-000000000001".into(),
                worker_id: "w-1".into(),
                lane: None,
            },
            Record {
                data,
                partition_key: "k".into(),
                explicit_hash_key: None,
                sequence_number: "49590".into(),
                sub_sequence_number: 2,
                approximate_arrival: None,
                aggregated: true,
            },
            "bad json".into(),
            3,
            FailureReason::MaxAttempts,
        );
        f.failed_at = UNIX_EPOCH + std::time::Duration::from_millis(5);
        f
    }

    #[test]
    fn the_document_names_the_record_its_error_and_carries_its_data() {
        let doc: serde_json::Value =
            serde_json::from_slice(&document(&failed(Bytes::from_static(b"{oops")), true)).unwrap();
        assert_eq!(doc["sequence_number"], "49590");
        assert_eq!(doc["sub_sequence_number"], 2);
        assert_eq!(doc["error"], "bad json");
        assert_eq!(doc["reason"], "max_attempts");
        assert_eq!(doc["attempts"], 3);
        assert_eq!(doc["failed_at_ms"], 5);
        assert_eq!(
            base64::decode(doc["data_base64"].as_str().unwrap()).unwrap(),
            b"{oops"
        );
    }

    #[test]
    fn a_record_too_big_for_kinesis_goes_without_its_data() {
        let big = failed(Bytes::from(vec![b'x'; MAX_RECORD_BYTES]));
        let entry = KinesisDestination::entry(&big).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(entry.data().as_ref()).unwrap();
        assert_eq!(doc["data_omitted"], true);
        assert_eq!(doc["data_bytes"], MAX_RECORD_BYTES);
        assert!(entry.data().as_ref().len() < 2048);
    }

    #[test]
    fn calls_stay_within_the_put_records_limits() {
        let small: Vec<_> = (0..1200)
            .map(|_| KinesisDestination::entry(&failed(Bytes::from_static(b"x"))).unwrap())
            .collect();
        let sizes: Vec<usize> = chunks(small).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![500, 500, 200]);
        let large: Vec<_> = (0..12)
            .map(|_| KinesisDestination::entry(&failed(Bytes::from(vec![b'x'; 600_000]))).unwrap())
            .collect();
        for chunk in chunks(large) {
            let bytes: usize = chunk.iter().map(|e| e.data().as_ref().len() + 1).sum();
            assert!(bytes <= MAX_BYTES_PER_CALL, "{bytes}");
        }
    }
}
