//! Splitting fetched records into user records.

use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;
use kcl_core::Record;
use kcl_core::metric_names::{KPL_MALFORMED_AGGREGATES, KPL_RECORDS_OUTSIDE_SHARD};
use prost::Message as _;

use super::hash_key::{HashKeyError, ShardHashRange, parse_hash_key, partition_key_hash};
use super::{DIGEST_LEN, MAGIC, md5, proto};

/// A record as fetched from Kinesis, before de-aggregation.
///
/// A plain struct so this module does not depend on the SDK's types; the
/// retrieval code converts from `aws_sdk_kinesis::types::Record`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord {
    /// The record's payload: user data, or a whole KPL aggregate.
    pub data: Bytes,
    /// The partition key the record was put with (for an aggregate, the key
    /// the KPL routed the whole aggregate by).
    pub partition_key: String,
    /// The explicit hash key, when known. `GetRecords` does not return one;
    /// other sources (tests, replays) may.
    pub explicit_hash_key: Option<String>,
    /// The Kinesis sequence number.
    pub sequence_number: String,
    /// When Kinesis accepted the record (approximate).
    pub approximate_arrival: Option<SystemTime>,
}

/// What [`deaggregate`] made of one [`RawRecord`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Deaggregated {
    /// The user records, in order; never empty. One plain record for a
    /// non-aggregated or malformed input, else one per sub-record.
    pub records: Vec<Record>,
    /// Why an input that started with the KPL magic was passed through as
    /// one plain record instead of being split. `None` for plain records and
    /// for well-formed aggregates.
    pub malformed: Option<MalformedReason>,
    /// How many sub-records lie outside the shard's hash-key range (always 0
    /// unless the [`Deaggregator`] was built with [`Deaggregator::for_shard`]).
    /// They are still in `records`.
    pub outside_shard: usize,
}

/// Why a record that starts with the KPL magic is not a usable aggregate.
///
/// Every variant leads to the same handling: the record is delivered as one
/// plain record with its original bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MalformedReason {
    /// Too short to hold the magic and the digest.
    #[error("{len} bytes is too short for a KPL aggregate (magic and digest alone take 20)")]
    Truncated {
        /// Length of the record's data.
        len: usize,
    },
    /// The trailing MD5 does not match the protobuf body: a corrupted
    /// aggregate, or user data that happens to start with the magic.
    #[error("MD5 digest does not match the aggregate's body")]
    DigestMismatch,
    /// The body is not a valid `AggregatedRecord` message.
    #[error("the aggregate's body is not a valid AggregatedRecord")]
    Decode(#[source] DecodeError),
    /// A field the schema marks `required` is absent.
    #[error("sub-record {sub} lacks required field {field}")]
    MissingField {
        /// Index of the offending sub-record.
        sub: u64,
        /// The missing field, e.g. `Record.data` or `Tag.key`.
        field: &'static str,
    },
    /// A `partition_key_index` points past the partition key table.
    #[error("sub-record {sub}: partition_key_index {index} is outside a table of {table_len}")]
    PartitionKeyIndexOutOfRange {
        /// Index of the offending sub-record.
        sub: u64,
        /// The index it holds.
        index: u64,
        /// Length of the partition key table.
        table_len: usize,
    },
    /// A sub-record's partition key is longer than Kinesis allows one (256
    /// characters), which it would have rejected in a plain put. Each
    /// sub-record owns a copy of its key: one long key named by every
    /// sub-record would make a 1 MiB aggregate take gigabytes.
    #[error(
        "sub-record {sub}: its partition key of {chars} characters is longer than \
         the 256 Kinesis allows"
    )]
    PartitionKeyTooLong {
        /// Index of the offending sub-record.
        sub: u64,
        /// The key's length in characters.
        chars: usize,
    },
    /// An `explicit_hash_key_index` points past the explicit hash key table.
    #[error("sub-record {sub}: explicit_hash_key_index {index} is outside a table of {table_len}")]
    ExplicitHashKeyIndexOutOfRange {
        /// Index of the offending sub-record.
        sub: u64,
        /// The index it holds.
        index: u64,
        /// Length of the explicit hash key table.
        table_len: usize,
    },
    /// A sub-record's explicit hash key is not a decimal integer below
    /// 2^128, so it maps to no shard. Kinesis would have rejected it in a
    /// plain put.
    #[error("sub-record {sub}: explicit hash key is invalid")]
    InvalidExplicitHashKey {
        /// Index of the offending sub-record.
        sub: u64,
        /// Why the key is invalid (holds a bounded excerpt of it).
        #[source]
        source: HashKeyError,
    },
    /// A well-formed aggregate without a single user record. The KPL never
    /// writes one; passing it through keeps its sequence number visible to
    /// the processor, which can checkpoint it.
    #[error("aggregate holds no user records")]
    Empty,
}

impl MalformedReason {
    /// A short, stable label for metrics and logs, e.g. `"digest_mismatch"`.
    pub fn label(&self) -> &'static str {
        match self {
            MalformedReason::Truncated { .. } => "truncated",
            MalformedReason::DigestMismatch => "digest_mismatch",
            MalformedReason::Decode(_) => "decode",
            MalformedReason::MissingField { .. } => "missing_field",
            MalformedReason::PartitionKeyIndexOutOfRange { .. } => "partition_key_index",
            MalformedReason::PartitionKeyTooLong { .. } => "partition_key_too_long",
            MalformedReason::ExplicitHashKeyIndexOutOfRange { .. } => "explicit_hash_key_index",
            MalformedReason::InvalidExplicitHashKey { .. } => "invalid_explicit_hash_key",
            MalformedReason::Empty => "empty",
        }
    }
}

/// The protobuf decoder's complaint about an aggregate body.
///
/// Opaque so the protobuf library's error type stays out of this crate's
/// public API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct DecodeError(prost::DecodeError);

/// Splits fetched records into user records; see the [module docs](super).
///
/// Without a shard range ([`Deaggregator::new`]) it only splits. Built with
/// [`Deaggregator::for_shard`], it also checks every sub-record's effective
/// hash key against the shard's range. Sub-records outside it are **still
/// delivered**, and counted (`kcl_kpl_records_outside_shard_total`, a `warn!`
/// per aggregate, [`Deaggregated::outside_shard`]).
///
/// Why deliver them. Such sub-records appear when the producer routed an
/// aggregate by a stale shard map (around a resharding). The Java KCL drops
/// the whole aggregate then, because the KPL notices the misrouting in its
/// `PutRecords` response ("Wrong Shard") and re-puts those user records, so
/// the copies read here are duplicates. Other aggregators (aws-kinesis-agg,
/// hand-rolled ones) do not re-put, and for them the copy read here is the
/// only one: dropping it would lose data. This crate promises at-least-once
/// delivery, so it prefers a possible duplicate to a possible loss. A later
/// resharding-aware filter may offer dropping as an option for KPL-only
/// streams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deaggregator {
    shard_range: Option<ShardHashRange>,
}

impl Deaggregator {
    /// A de-aggregator that does not check hash-key ranges.
    pub fn new() -> Self {
        Deaggregator { shard_range: None }
    }

    /// A de-aggregator for one shard: sub-records whose effective hash key
    /// lies outside `range` are delivered, counted and warned about.
    pub fn for_shard(range: ShardHashRange) -> Self {
        Deaggregator {
            shard_range: Some(range),
        }
    }

    /// The shard range this de-aggregator checks against, if any.
    pub fn shard_range(&self) -> Option<ShardHashRange> {
        self.shard_range
    }

    /// Splits one fetched record. Never panics; see [`Deaggregated`].
    pub fn deaggregate(&self, raw: RawRecord) -> Deaggregated {
        let mut records = Vec::new();
        let (malformed, outside_shard) = self.deaggregate_into(raw, &mut records);
        Deaggregated {
            records,
            malformed,
            outside_shard,
        }
    }

    /// Splits a fetched batch into one list of user records, in order.
    ///
    /// The same as calling [`Deaggregator::deaggregate`] on each record and
    /// concatenating, without a vector per record. Malformed aggregates and
    /// out-of-shard sub-records are reported through logs and metrics only.
    pub fn deaggregate_batch(&self, raws: impl IntoIterator<Item = RawRecord>) -> Vec<Record> {
        let raws = raws.into_iter();
        let mut records = Vec::with_capacity(raws.size_hint().0);
        for raw in raws {
            self.deaggregate_into(raw, &mut records);
        }
        records
    }

    /// Appends the user records of `raw` to `out`; returns the malformed
    /// reason (if any) and the out-of-shard count.
    fn deaggregate_into(
        &self,
        raw: RawRecord,
        out: &mut Vec<Record>,
    ) -> (Option<MalformedReason>, usize) {
        if !super::has_magic(&raw.data) {
            out.push(plain(raw));
            return (None, 0);
        }
        let start = out.len();
        match self.split(&raw, out) {
            Ok(outside) => {
                if outside > 0 {
                    report_outside(&raw, outside, out.len() - start);
                }
                (None, outside)
            }
            Err(reason) => {
                // Undo a partial split: the aggregate is delivered whole or
                // not split at all, never half of each.
                out.truncate(start);
                report_malformed(&raw, &reason);
                out.push(plain(raw));
                (Some(reason), 0)
            }
        }
    }

    /// Decodes an aggregate (magic already checked) and appends its
    /// sub-records. Returns how many lie outside the shard.
    fn split(&self, raw: &RawRecord, out: &mut Vec<Record>) -> Result<usize, MalformedReason> {
        let agg = decode(raw)?;
        let keys = KeyTables::of(
            &agg.partition_key_table,
            &agg.explicit_hash_key_table,
            self.shard_range.is_some(),
        );
        out.reserve(agg.records.len());
        let mut outside = 0;
        for (sub, rec) in (0u64..).zip(agg.records) {
            let (record, pk_slot, ehk_value) = keys.sub_record(raw, sub, rec)?;
            if let Some(range) = self.shard_range {
                // `pk_hashes` mirrors the partition key table when a range is set.
                let hash_key = ehk_value.unwrap_or(keys.pk_hashes[pk_slot]);
                if !range.contains(hash_key) {
                    outside += 1;
                }
            }
            out.push(record);
        }
        Ok(outside)
    }
}

/// Checks an aggregate's length and digest and decodes its body: the
/// checks before any sub-record is looked at.
fn decode(raw: &RawRecord) -> Result<proto::AggregatedRecord, MalformedReason> {
    let len = raw.data.len();
    if len < MAGIC.len() + DIGEST_LEN {
        return Err(MalformedReason::Truncated { len });
    }
    let body_end = len - DIGEST_LEN;
    // `slice` shares the buffer; decoding from it makes every `data`
    // field a view into the fetched record rather than a copy.
    let body = raw.data.slice(MAGIC.len()..body_end);
    if md5(&body) != raw.data[body_end..] {
        return Err(MalformedReason::DigestMismatch);
    }
    let agg = proto::AggregatedRecord::decode(body)
        .map_err(|e| MalformedReason::Decode(DecodeError(e)))?;
    if agg.records.is_empty() {
        return Err(MalformedReason::Empty);
    }
    Ok(agg)
}

/// An aggregate's key tables, each entry parsed once for all the
/// sub-records that name it.
struct KeyTables<'a> {
    partition_keys: &'a [String],
    explicit_hash_keys: &'a [String],
    /// Mirrors `explicit_hash_keys`. An invalid entry is only an error if a
    /// sub-record uses it (as in the Java KCL, which parses them lazily).
    ehk_values: Vec<Result<u128, HashKeyError>>,
    /// Mirrors `partition_keys` when the shard range is checked, else empty.
    pk_hashes: Vec<u128>,
    /// Mirrors `partition_keys`: whether the entry is longer than a
    /// partition key may be (an error only if a sub-record names it).
    pk_too_long: Vec<bool>,
}

impl<'a> KeyTables<'a> {
    /// Parses the tables; the partition keys' hashes only if `ranged`
    /// (they are needed only for the range check).
    fn of(partition_keys: &'a [String], explicit_hash_keys: &'a [String], ranged: bool) -> Self {
        // Explicit hash keys are parsed once per table entry, not per
        // sub-record.
        let ehk_values: Vec<Result<u128, HashKeyError>> = explicit_hash_keys
            .iter()
            .map(|s| parse_hash_key(s))
            .collect();
        let pk_hashes: Vec<u128> = if ranged {
            partition_keys
                .iter()
                .map(|pk| partition_key_hash(pk))
                .collect()
        } else {
            Vec::new()
        };
        KeyTables {
            partition_keys,
            explicit_hash_keys,
            ehk_values,
            pk_hashes,
            pk_too_long: partition_keys.iter().map(|pk| too_long(pk)).collect(),
        }
    }

    /// Sub-record `sub` as a user record, with its partition key's slot
    /// and its explicit hash key's value (for the range check); an error
    /// for a missing field or a key index out of its table.
    fn sub_record(
        &self,
        raw: &RawRecord,
        sub: u64,
        rec: proto::Record,
    ) -> Result<(Record, usize, Option<u128>), MalformedReason> {
        let missing = |field| MalformedReason::MissingField { sub, field };
        let pk_index = rec
            .partition_key_index
            .ok_or_else(|| missing("Record.partition_key_index"))?;
        let data = rec.data.ok_or_else(|| missing("Record.data"))?;
        if rec.tags.iter().any(|t| t.key.is_none()) {
            return Err(missing("Tag.key"));
        }
        let pk_slot = table_slot(pk_index, self.partition_keys.len()).ok_or(
            MalformedReason::PartitionKeyIndexOutOfRange {
                sub,
                index: pk_index,
                table_len: self.partition_keys.len(),
            },
        )?;
        let partition_key = &self.partition_keys[pk_slot];
        if self.pk_too_long[pk_slot] {
            let chars = partition_key.chars().count();
            return Err(MalformedReason::PartitionKeyTooLong { sub, chars });
        }
        let (explicit_hash_key, ehk_value) =
            self.explicit_hash_key(sub, rec.explicit_hash_key_index)?;
        let record = Record {
            data,
            partition_key: partition_key.clone(),
            explicit_hash_key,
            sequence_number: raw.sequence_number.clone(),
            sub_sequence_number: sub,
            approximate_arrival: raw.approximate_arrival,
            aggregated: true,
        };
        Ok((record, pk_slot, ehk_value))
    }

    /// The explicit hash key a sub-record names, if any, and its value.
    fn explicit_hash_key(
        &self,
        sub: u64,
        index: Option<u64>,
    ) -> Result<(Option<String>, Option<u128>), MalformedReason> {
        let Some(index) = index else {
            return Ok((None, None));
        };
        let slot = table_slot(index, self.explicit_hash_keys.len()).ok_or(
            MalformedReason::ExplicitHashKeyIndexOutOfRange {
                sub,
                index,
                table_len: self.explicit_hash_keys.len(),
            },
        )?;
        // `slot` is in range of both: `ehk_values` mirrors the table.
        match &self.ehk_values[slot] {
            Ok(v) => Ok((Some(self.explicit_hash_keys[slot].clone()), Some(*v))),
            Err(e) => Err(MalformedReason::InvalidExplicitHashKey {
                sub,
                source: e.clone(),
            }),
        }
    }
}

/// Splits one fetched record without a shard-range check; see
/// [`Deaggregator::deaggregate`].
pub fn deaggregate(raw: RawRecord) -> Deaggregated {
    Deaggregator::new().deaggregate(raw)
}

/// The most characters Kinesis allows in a partition key.
const MAX_PARTITION_KEY_CHARS: usize = 256;

/// Whether `pk` is longer than Kinesis allows a partition key. An
/// aggregate's key table is the producer's own bytes: nothing else bounds
/// what copying a key into each sub-record that names it costs.
fn too_long(pk: &str) -> bool {
    pk.len() > MAX_PARTITION_KEY_CHARS && pk.chars().count() > MAX_PARTITION_KEY_CHARS
}

/// `index` as a position in a table of `len` entries, if it is one.
fn table_slot(index: u64, len: usize) -> Option<usize> {
    usize::try_from(index).ok().filter(|&i| i < len)
}

/// The fetched record as one user record, bytes untouched.
fn plain(raw: RawRecord) -> Record {
    Record {
        data: raw.data,
        partition_key: raw.partition_key,
        explicit_hash_key: raw.explicit_hash_key,
        sequence_number: raw.sequence_number,
        sub_sequence_number: 0,
        approximate_arrival: raw.approximate_arrival,
        aggregated: false,
    }
}

fn report_malformed(raw: &RawRecord, reason: &MalformedReason) {
    tracing::warn!(
        sequence_number = %raw.sequence_number,
        partition_key = %raw.partition_key,
        len = raw.data.len(),
        reason = reason.label(),
        error = %ErrorChain(reason),
        "malformed KPL aggregate, delivering it as one plain record"
    );
    metrics::counter!(KPL_MALFORMED_AGGREGATES, "reason" => reason.label()).increment(1);
}

fn report_outside(raw: &RawRecord, outside: usize, total: usize) {
    // One line per aggregate, not per sub-record: a stale KPL shard map can
    // misroute every sub-record of every aggregate for a while.
    tracing::warn!(
        sequence_number = %raw.sequence_number,
        outside,
        total,
        "KPL sub-records outside the shard's hash-key range, delivering them anyway"
    );
    metrics::counter!(KPL_RECORDS_OUTSIDE_SHARD).increment(outside as u64);
}

/// Displays an error with its sources, `a: b: c`, for one-line logs.
struct ErrorChain<'a>(&'a dyn std::error::Error);

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
