//! De-aggregation of records written by the Kinesis Producer Library (KPL).
//!
//! The KPL packs many user records into one Kinesis record to save
//! per-record costs. Such an *aggregate* is
//!
//! ```text
//! MAGIC (F3 89 9A C2) | protobuf AggregatedRecord | MD5 of the protobuf bytes (16)
//! ```
//!
//! where `AggregatedRecord` holds a table of partition keys, a table of
//! explicit hash keys, and the user records, each naming its keys by index
//! into those tables (format description: `aggregation-format.md` in the
//! amazon-kinesis-producer repository).
//!
//! # What this module does
//!
//! - [`deaggregate`] / [`Deaggregator`] turn one fetched [`RawRecord`] into
//!   the [`kcl_core::Record`]s a processor sees. Sub-records share the
//!   aggregate's sequence number, are numbered 0..n-1 by sub-sequence number,
//!   and their `data` are slices of the fetched buffer, not copies. A plain
//!   record becomes one record with sub-sequence 0.
//! - Malformed aggregates (wrong digest, undecodable protobuf, missing
//!   required field, key index outside its table, a partition key longer
//!   or an explicit hash key invalid where Kinesis would refuse it, no
//!   records) are delivered as **one plain record** carrying the original
//!   bytes, reported with a `warn!` naming the sequence number and a
//!   `kcl_kpl_malformed_aggregates_total{reason}` counter, and the reason is
//!   returned in [`Deaggregated::malformed`]. Passing through rather than
//!   dropping keeps at-least-once delivery: the processor sees the bytes and
//!   can checkpoint past them, and nothing is lost silently. Never a panic.
//! - [`skip_checkpointed`] drops the sub-records a checkpoint already covers
//!   when a consumer resumes `AT_SEQUENCE_NUMBER` inside an aggregate.
//! - [`ShardHashRange`] and [`effective_hash_key`] tell whether a record
//!   belongs to a shard's hash-key range. A [`Deaggregator`] built with
//!   [`Deaggregator::for_shard`] counts and warns about sub-records outside
//!   the shard (`kcl_kpl_records_outside_shard_total`) but still delivers
//!   them; see [`Deaggregator`] for why.
//! - [`aggregate`] writes aggregates, for tests, benchmarks and tools that
//!   need KPL-shaped input without the KPL.
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use kcl_kinesis::kpl::{self, RawRecord, UserRecord};
//!
//! let user = |pk: &str, data: &'static [u8]| UserRecord {
//!     partition_key: pk.to_owned(),
//!     explicit_hash_key: None,
//!     data: Bytes::from_static(data),
//! };
//! let fetched = RawRecord {
//!     data: kpl::aggregate(&[user("a", b"first"), user("b", b"second")]),
//!     partition_key: "a".to_owned(),
//!     explicit_hash_key: None,
//!     sequence_number: "49590338271490256608559692538361571095921575989136588898".to_owned(),
//!     approximate_arrival: None,
//! };
//! let out = kpl::deaggregate(fetched);
//! assert_eq!(out.malformed, None);
//! assert_eq!(out.records.len(), 2);
//! assert_eq!(out.records[1].partition_key, "b");
//! assert_eq!(out.records[1].sub_sequence_number, 1);
//! assert_eq!(&out.records[1].data[..], b"second");
//! ```

mod aggregate;
mod deaggregate;
mod hash_key;
mod proto;
mod resume;

pub use aggregate::{UserRecord, aggregate};
pub use deaggregate::{
    Deaggregated, Deaggregator, DecodeError, MalformedReason, RawRecord, deaggregate,
};
pub use hash_key::{
    HashKeyError, ShardHashRange, effective_hash_key, parse_hash_key, partition_key_hash,
    record_in_range,
};
pub use resume::{is_checkpointed, skip_checkpointed};

/// The four bytes every KPL aggregate starts with.
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];

/// Length of the MD5 digest that ends every KPL aggregate.
pub const DIGEST_LEN: usize = 16;

/// True when `data` starts with the KPL [`MAGIC`], i.e. claims to be an
/// aggregate. Whether it really is one is decided by [`deaggregate`].
pub fn has_magic(data: &[u8]) -> bool {
    data.starts_with(&MAGIC)
}

/// MD5 of `data`. One place for the digest so both the aggregate check and
/// the partition-key hash use the same implementation.
fn md5(data: &[u8]) -> [u8; 16] {
    use md5::Digest as _;
    md5::Md5::digest(data).into()
}
