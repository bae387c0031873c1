//! A [`FailureDestination`] that writes records a processor kept failing on
//! to a Kinesis stream (a dead-letter stream), as JSON documents under the
//! record's own partition key (so a key's failed records share a shard of
//! the dead-letter stream; `PutRecords` does not promise their order, and a
//! refused entry is resent after the others). A record too big for one
//! dead-letter record is written in parts; [`reassemble_dead_letters`] reads them back.

mod document;
mod reassemble;

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::DisplayErrorContext;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, PutRecordsResultEntry};
use kcl_core::backoff::Backoff;
use kcl_core::poison::{FailedRecord, FailureDestination};
use kcl_core::processor::ProcessorError;

pub use reassemble::{DeadLetter, DeadLetterError, DeadLetterReassembler, reassemble_dead_letters};

/// Kinesis takes at most this many records per `PutRecords`.
const MAX_RECORDS_PER_CALL: usize = 500;
/// ... and at most this many bytes per call (data and partition keys).
const MAX_BYTES_PER_CALL: usize = 5 * 1024 * 1024;
/// Resending the entries a `PutRecords` refused (throttled shards): twice,
/// 100 ms then 200 ms later, before `send` fails and the consumer retries
/// it with its own backoff.
const RESEND: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(200))
    .retries(2)
    .without_jitter();

/// Writes failed records to a Kinesis stream as JSON:
///
/// ```json
/// {"id": "orders/shardId-000000000001/4959.../0",
///  "stream": "orders", "shard_id": "shardId-000000000001",
///  "sequence_number": "4959...", "sub_sequence_number": 0,
///  "partition_key": "customer-17", "explicit_hash_key": null,
///  "aggregated": false, "approximate_arrival_ms": 1764600000000,
///  "error": "...", "attempts": 3, "reason": "max_attempts",
///  "failed_at_ms": 1764600012000, "worker_id": "...",
///  "data_bytes": 42, "part": 0, "parts": 1,
///  "data_base64": "eyJvcmRlciI6..."}
/// ```
///
/// Every record is stored whole. One whose document would pass Kinesis's
/// 1 MiB per-record limit (a record above about 750 KiB: base64 adds a
/// third) is written as several documents, `part` 0 to `parts - 1`, each
/// with the same `id` and metadata and a slice of the data, under the same
/// partition key. To read it back, join the decoded `data_base64` of its
/// parts in `part` order, ignoring repeats: [`reassemble_dead_letters`] and
/// [`DeadLetterReassembler`] do this.
///
/// A record whose partition key and metadata alone would fill a
/// dead-letter record cannot be split to fit: its send fails with
/// [`CannotStore`](kcl_core::poison::CannotStore), so the shard stays with
/// its worker, its checkpoint before the record, and the send is retried
/// until the destination is changed.
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

    /// The entries of `failed`: one per part.
    fn entries(failed: &FailedRecord) -> Result<Vec<PutRecordsRequestEntry>, ProcessorError> {
        document::documents(failed)?
            .into_iter()
            .map(|doc| {
                Ok(PutRecordsRequestEntry::builder()
                    .data(Blob::new(doc))
                    .partition_key(failed.record.partition_key.clone())
                    .build()?)
            })
            .collect()
    }
}

#[async_trait]
impl FailureDestination for KinesisDestination {
    async fn send(&self, failed: &[FailedRecord]) -> Result<(), ProcessorError> {
        let mut entries = Vec::with_capacity(failed.len());
        for f in failed {
            entries.extend(Self::entries(f)?);
        }
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
            let (refused, why) = refused(entries, &out.records);
            if refused.is_empty() {
                return Ok(());
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

/// The entries of a `PutRecords` call not stored, and why the first was
/// not: each entry's result stands at its index, and only one with a
/// sequence number and no error code was stored. An answer with fewer
/// results than entries (or a result with neither) stores nothing for the
/// rest: counting those as stored would let the shard's checkpoint pass
/// poison records that are nowhere.
fn refused(
    entries: Vec<PutRecordsRequestEntry>,
    results: &[PutRecordsResultEntry],
) -> (Vec<PutRecordsRequestEntry>, String) {
    let mut refused = Vec::new();
    let mut why = String::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let reason = match results.get(i) {
            Some(r) if r.error_code.is_none() && r.sequence_number.is_some() => continue,
            Some(r) => match &r.error_code {
                Some(code) => format!("{code}: {}", r.error_message.as_deref().unwrap_or("")),
                None => "a result without a sequence number".to_owned(),
            },
            None => format!("{} results for {} records", results.len(), i + 1),
        };
        if why.is_empty() {
            why = reason;
        }
        refused.push(entry);
    }
    (refused, why)
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
    use super::document::MAX_RECORD_BYTES;
    use super::*;
    use aws_smithy_types::base64;
    use bytes::Bytes;
    use kcl_core::test_util::failed_record;
    use std::time::UNIX_EPOCH;

    fn failed(data: Bytes) -> FailedRecord {
        failed_at(data, "49590", "bad json")
    }

    fn failed_at(data: Bytes, seq: &str, error: &str) -> FailedRecord {
        let mut f = failed_record(data, seq, error);
        f.record.aggregated = true;
        f.failed_at = UNIX_EPOCH + std::time::Duration::from_millis(5);
        f
    }

    /// The data of each entry, as a reader of the stream gets it.
    fn written(failed: &[FailedRecord]) -> Vec<Vec<u8>> {
        failed
            .iter()
            .flat_map(|f| KinesisDestination::entries(f).unwrap())
            .map(|e| e.data().as_ref().to_vec())
            .collect()
    }

    /// A 1 MiB record of bytes that differ by position, so a part out of
    /// place or lost shows.
    fn mebibyte() -> Bytes {
        (0..MAX_RECORD_BYTES)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into()
    }

    #[test]
    fn the_document_names_the_record_its_error_and_carries_its_data() {
        let entries = KinesisDestination::entries(&failed(Bytes::from_static(b"{oops"))).unwrap();
        assert_eq!(entries.len(), 1);
        let doc: serde_json::Value = serde_json::from_slice(entries[0].data().as_ref()).unwrap();
        assert_eq!(doc["id"], "orders/shardId-000000000001/49590/2");
        assert_eq!(doc["sequence_number"], "49590");
        assert_eq!(doc["sub_sequence_number"], 2);
        assert_eq!(doc["error"], "bad json");
        assert_eq!(doc["reason"], "max_attempts");
        assert_eq!(doc["attempts"], 3);
        assert_eq!(doc["failed_at_ms"], 5);
        assert_eq!(
            (doc["part"].as_u64(), doc["parts"].as_u64()),
            (Some(0), Some(1))
        );
        assert_eq!(
            base64::decode(doc["data_base64"].as_str().unwrap()).unwrap(),
            b"{oops"
        );
    }

    #[test]
    fn a_1_mib_record_is_written_whole_in_parts_that_reassemble_in_any_order() {
        let data = mebibyte();
        // The longest error and partition key leave the least room.
        let big = failed_at(data.clone(), "49590", &"e".repeat(100_000));
        let entries = KinesisDestination::entries(&big).unwrap();
        assert_eq!(entries.len(), 2, "base64 of 1 MiB needs two records");
        for e in &entries {
            let size = e.data().as_ref().len() + e.partition_key().unwrap().len();
            assert!(size <= MAX_RECORD_BYTES, "{size} bytes in one record");
            assert_eq!(e.partition_key(), Some(big.record.partition_key.as_str()));
        }
        // Parts out of order, one repeated (a retried send), and another
        // record in between.
        let small = failed_at(Bytes::from_static(b"tiny"), "49591", "x");
        let mut stream = written(std::slice::from_ref(&big));
        stream.reverse();
        stream.insert(1, written(std::slice::from_ref(&small)).remove(0));
        stream.push(stream[0].clone());
        let letters = reassemble_dead_letters(stream.iter().map(Vec::as_slice)).unwrap();
        let ids: Vec<&str> = letters.iter().map(|l| l.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "orders/shardId-000000000001/49591/2",
                "orders/shardId-000000000001/49590/2"
            ]
        );
        assert_eq!(letters[1].data, data, "the 1 MiB record, byte for byte");
        assert_eq!(letters[1].document["data_bytes"], MAX_RECORD_BYTES);
        assert_eq!(letters[1].document["parts"], 2);
        assert!(letters[1].document.get("data_base64").is_none());
        assert_eq!(letters[0].data.as_ref(), b"tiny");
    }

    #[test]
    fn a_record_missing_a_part_or_a_stray_document_is_named_not_skipped() {
        let stream = written(&[failed(mebibyte())]);
        let e = reassemble_dead_letters([stream[1].as_slice()]).unwrap_err();
        assert_eq!(
            e,
            DeadLetterError::Incomplete {
                id: "orders/shardId-000000000001/49590/2".into(),
                held: 1,
                parts: 2,
            }
        );
        let e = reassemble_dead_letters([b"{\"stream\": \"orders\"}".as_slice()]).unwrap_err();
        assert!(matches!(e, DeadLetterError::NotADocument(_)), "{e}");
        let mut doc: serde_json::Value = serde_json::from_slice(&stream[0]).unwrap();
        doc["data_bytes"] = 7.into();
        let e = reassemble_dead_letters([serde_json::to_vec(&doc).unwrap().as_slice(), &stream[1]])
            .unwrap_err();
        assert!(e.to_string().contains("49590/2"), "{e}");
    }

    #[tokio::test]
    async fn a_record_that_cannot_be_split_to_fit_fails_the_send_for_good() {
        // Nothing listens there: the send must fail before any call.
        let client = crate::test_util::offline_client();
        let mut f = failed(Bytes::from_static(b"x"));
        f.record.partition_key = "k".repeat(MAX_RECORD_BYTES);
        let err = KinesisDestination::new(client, "orders-failed")
            .send(&[f])
            .await
            .unwrap_err();
        let never = kcl_core::poison::CannotStore::find(&*err);
        assert!(never.is_some(), "no retry can store it: {err}");
        assert!(
            err.to_string()
                .contains("orders/shardId-000000000001/49590/2"),
            "{err}"
        );
    }

    #[test]
    fn calls_stay_within_the_put_records_limits() {
        let small: Vec<_> = (0..1200)
            .flat_map(|_| KinesisDestination::entries(&failed(Bytes::from_static(b"x"))).unwrap())
            .collect();
        let sizes: Vec<usize> = chunks(small).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![500, 500, 200]);
        let large: Vec<_> = (0..12)
            .flat_map(|_| KinesisDestination::entries(&failed(mebibyte())).unwrap())
            .collect();
        assert_eq!(large.len(), 24);
        for chunk in chunks(large) {
            let bytes: usize = chunk
                .iter()
                .map(|e| e.data().as_ref().len() + e.partition_key().unwrap().len())
                .sum();
            assert!(bytes <= MAX_BYTES_PER_CALL, "{bytes}");
        }
    }

    /// Only an entry whose result names a sequence number was stored: an
    /// answer short of results (or one with a result naming none) used to
    /// count the rest as stored, and the shard's checkpoint passed poison
    /// records the failure stream never held.
    #[test]
    fn only_entries_whose_result_names_a_sequence_number_count_as_stored() {
        let entries: Vec<_> = (0..4)
            .flat_map(|_| KinesisDestination::entries(&failed(Bytes::from_static(b"x"))).unwrap())
            .collect();
        let stored = PutRecordsResultEntry::builder()
            .sequence_number("1")
            .shard_id("s")
            .build();
        let throttled = PutRecordsResultEntry::builder()
            .error_code("ProvisionedThroughputExceededException")
            .error_message("slow down")
            .build();
        let blank = PutRecordsResultEntry::builder().build();
        let (refused, why) = super::refused(entries, &[stored, throttled, blank]);
        assert_eq!(
            refused.len(),
            3,
            "the throttled, the blank and the unanswered"
        );
        assert_eq!(why, "ProvisionedThroughputExceededException: slow down");
        let entries = KinesisDestination::entries(&failed(Bytes::from_static(b"x"))).unwrap();
        let (refused, why) = super::refused(entries, &[]);
        assert_eq!(
            (refused.len(), why.as_str()),
            (1, "0 results for 1 records")
        );
    }
}
