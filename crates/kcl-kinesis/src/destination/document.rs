//! The dead-letter stream's record format: JSON documents, one per part of
//! a failed record.
//!
//! A Kinesis record holds at most 1 MiB of data and partition key, and a
//! failed record may itself be 1 MiB, base64 in JSON a third more: such a
//! record cannot go whole into one dead-letter record, and leaving its data
//! out would lose it once the source stream's retention ends. So its data
//! is cut into parts, each a document with the full metadata, its place
//! (`part` of `parts`) and its slice as `data_base64`, written under the
//! record's own partition key. [`super::reassemble_dead_letters`] puts them back
//! together: the parts of one `id`, any order, repeats ignored, slices
//! joined by `part`. A record that fits is one document, part 0 of 1. A
//! record whose partition key and metadata alone fill a dead-letter record
//! can never be written: its send fails with [`CannotStore`].

use std::time::{SystemTime, UNIX_EPOCH};

use aws_smithy_types::base64;
use kcl_core::poison::{CannotStore, FailedRecord};
use serde_json::{Map, Value};

/// Kinesis takes at most this many bytes per record (data and partition
/// key).
pub(crate) const MAX_RECORD_BYTES: usize = 1024 * 1024;
/// An error text is cut to this many bytes.
const MAX_ERROR_BYTES: usize = 8 * 1024;

/// The documents of `failed`, each within Kinesis's per-record limit once
/// its partition key is added: one if it fits, else one per part. An error
/// is for good: the same record fails the same way on every try.
pub(crate) fn documents(failed: &FailedRecord) -> Result<Vec<Vec<u8>>, CannotStore> {
    let meta = metadata(failed);
    let data = &failed.record.data;
    let per_part = part_capacity(failed, &meta)?;
    let parts = data.len().div_ceil(per_part).max(1);
    (0..parts)
        .map(|i| {
            let slice = &data[(i * per_part).min(data.len())..((i + 1) * per_part).min(data.len())];
            document(&meta, i, parts, slice).map_err(CannotStore::new)
        })
        .collect()
}

/// How many bytes of data fit in one part: what is left of the record
/// limit after the partition key and the metadata (with the widest part
/// numbers), in whole base64 groups.
fn part_capacity(failed: &FailedRecord, meta: &Map<String, Value>) -> Result<usize, CannotStore> {
    let widest = u32::MAX as usize;
    let overhead = document(meta, widest, widest, &[])
        .map_err(CannotStore::new)?
        .len()
        + failed.record.partition_key.len();
    match MAX_RECORD_BYTES.checked_sub(overhead) {
        Some(room) if room >= 4 => Ok(room / 4 * 3),
        _ => Err(CannotStore::new(format!(
            "the failed record {} leaves no room for its data in a dead-letter record \
             ({overhead} bytes of metadata and partition key, of at most {MAX_RECORD_BYTES}); \
             it is not stored, and the shard does not move past it",
            failed.id()
        ))),
    }
}

/// One part's document.
fn document(
    meta: &Map<String, Value>,
    part: usize,
    parts: usize,
    slice: &[u8],
) -> Result<Vec<u8>, String> {
    let mut doc = meta.clone();
    doc.insert("part".into(), part.into());
    doc.insert("parts".into(), parts.into());
    doc.insert("data_base64".into(), base64::encode(slice).into());
    serde_json::to_vec(&Value::Object(doc))
        .map_err(|e| format!("encoding a dead-letter document failed: {e}"))
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Every field but the part's own.
fn metadata(failed: &FailedRecord) -> Map<String, Value> {
    let r = &failed.record;
    let fields: [(&str, Value); 15] = [
        ("id", failed.id().into()),
        ("stream", failed.shard.stream.as_str().into()),
        ("shard_id", failed.shard.shard_id.as_str().into()),
        ("sequence_number", r.sequence_number.as_str().into()),
        ("sub_sequence_number", r.sub_sequence_number.into()),
        ("partition_key", r.partition_key.as_str().into()),
        ("explicit_hash_key", r.explicit_hash_key.clone().into()),
        ("aggregated", r.aggregated.into()),
        (
            "approximate_arrival_ms",
            r.approximate_arrival.map(millis).into(),
        ),
        ("error", failed.error_within(MAX_ERROR_BYTES).into()),
        ("attempts", failed.attempts.into()),
        ("reason", failed.reason.as_str().into()),
        ("failed_at_ms", millis(failed.failed_at).into()),
        ("worker_id", failed.shard.worker_id.as_str().into()),
        ("data_bytes", r.data.len().into()),
    ];
    fields
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
}
