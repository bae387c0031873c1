//! The one record pipeline both readers feed: where a reader starts, the
//! de-aggregation of what it receives, the sub-records a resume checkpoint
//! already covers, and what the records hold in memory.

use std::time::SystemTime;

use bytes::Bytes;
use kcl_core::leases::LeaseHandle;
use kcl_core::source::StartPosition;
use kcl_core::{Checkpoint, Record};
use tracing::warn;

use crate::calls::IteratorStart;
use crate::kpl::{self, Deaggregator, RawRecord, ShardHashRange};

/// Where a reader starts.
#[derive(Debug, Clone)]
pub(crate) struct Start {
    /// The first iterator (or subscription) position.
    pub(crate) iterator: IteratorStart,
    /// The checkpoint resumed from, whose covered sub-records are dropped.
    pub(crate) resume: Option<Checkpoint>,
}

impl Start {
    /// The start for `position`. Kinesis resumes only at whole records: a
    /// checkpoint re-reads its record and drops the sub-records it covers.
    pub(crate) fn of(position: StartPosition) -> Self {
        match position {
            StartPosition::TrimHorizon => Start {
                iterator: IteratorStart::TrimHorizon,
                resume: None,
            },
            StartPosition::Latest => Start {
                iterator: IteratorStart::Latest,
                resume: None,
            },
            StartPosition::AtTimestamp(t) => Start {
                iterator: IteratorStart::AtTimestamp(t),
                resume: None,
            },
            StartPosition::AfterCheckpoint { seq, sub } => Start {
                iterator: IteratorStart::AtSequence(seq.clone()),
                resume: Some(Checkpoint::at(seq, sub)),
            },
        }
    }
}

/// What one response (or event) yields.
#[derive(Debug)]
pub(crate) struct Taken {
    /// User records, in order.
    pub(crate) user: Vec<Record>,
    /// Kinesis records received.
    pub(crate) fetched: usize,
    /// Their payload bytes, as received.
    pub(crate) payload_bytes: usize,
}

/// One reader's record pipeline.
#[derive(Debug)]
pub(crate) struct Records {
    deaggregator: Deaggregator,
    /// A resume checkpoint whose covered sub-records are still to drop.
    skip: Option<Checkpoint>,
    /// The last Kinesis record received.
    last_sequence: Option<String>,
}

impl Records {
    /// The pipeline of `shard`, checking sub-records against the hash-key
    /// range the lease records.
    pub(crate) fn new(stream: &str, shard: &str, lease: &LeaseHandle, start: &Start) -> Self {
        let deaggregator = match lease
            .lease()
            .hash_key_range
            .as_ref()
            .map(ShardHashRange::parse)
        {
            Some(Ok(range)) => Deaggregator::for_shard(range),
            Some(Err(e)) => {
                warn!(%stream, %shard, error = %e,
                    "lease has an invalid hash-key range; sub-records are not checked against it");
                Deaggregator::new()
            }
            None => Deaggregator::new(),
        };
        Records {
            deaggregator,
            skip: start.resume.clone(),
            last_sequence: None,
        }
    }

    /// The last Kinesis record received, if any.
    pub(crate) fn last_sequence(&self) -> Option<&str> {
        self.last_sequence.as_deref()
    }

    /// De-aggregates one response's records and drops the sub-records the
    /// resume checkpoint covers.
    pub(crate) fn take(&mut self, records: Vec<aws_sdk_kinesis::types::Record>) -> Taken {
        let fetched = records.len();
        if let Some(last) = records.last() {
            self.last_sequence = Some(last.sequence_number.clone());
        }
        let payload_bytes = records.iter().map(|r| r.data.as_ref().len()).sum();
        let mut user = self
            .deaggregator
            .deaggregate_batch(records.into_iter().map(raw_record));
        if let Some(checkpoint) = &self.skip {
            kpl::skip_checkpointed(&mut user, checkpoint);
            // Everything after the checkpointed record is new: once a
            // record survives, or the batch went past it, stop checking.
            let past = self.last_sequence.as_deref() != Some(checkpoint.as_str());
            if !user.is_empty() || (fetched > 0 && past) {
                self.skip = None;
            }
        }
        Taken {
            user,
            fetched,
            payload_bytes,
        }
    }
}

/// What `records` hold in memory, as a prefetch budget counts it: the
/// payload, the strings each record owns and the record itself. (The
/// sub-records of one aggregate are slices of its buffer; their lengths add
/// up to about the buffer's.)
///
/// An aggregate therefore holds more than it takes on the wire: each
/// sub-record takes at least 6 bytes of it (an empty payload and a
/// partition-key index) yet owns a record, a copy of its partition key (at
/// most 256 characters, 1,024 bytes of UTF-8; an aggregate naming a longer
/// one is not split), of the sequence number (at most 128 digits) and of
/// its explicit hash key (at most 39 digits). An aggregate of n bytes holds
/// at most `n x (size_of::<Record>() + 1191) / 6` bytes, about 221 n (93 n
/// with ASCII keys): the worst case the budgets' overshoot is made of.
pub(crate) fn held_bytes(records: &[Record]) -> usize {
    records
        .iter()
        .map(|r| {
            std::mem::size_of::<Record>()
                + r.data.len()
                + r.partition_key.len()
                + r.sequence_number.len()
                + r.explicit_hash_key.as_ref().map_or(0, String::len)
        })
        .sum()
}

/// The kpl module's view of a received record (no copy of the payload).
fn raw_record(r: aws_sdk_kinesis::types::Record) -> RawRecord {
    RawRecord {
        data: Bytes::from(r.data.into_inner()),
        partition_key: r.partition_key.unwrap_or_default(),
        explicit_hash_key: None,
        sequence_number: r.sequence_number,
        approximate_arrival: r
            .approximate_arrival_timestamp
            .and_then(|t| SystemTime::try_from(t).ok()),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::held_bytes;
    use crate::kpl::{RawRecord, UserRecord, aggregate, deaggregate};

    /// The most one sub-record holds, and the least of an aggregate it
    /// takes: the bound of [`held_bytes`]'s notes is their ratio.
    const MAX_HELD: usize = std::mem::size_of::<kcl_core::Record>() + 256 + 128;
    const MIN_TAKEN: usize = 6;

    #[test]
    fn an_aggregate_of_empty_sub_records_expands_to_its_stated_bound() {
        let subs: Vec<UserRecord> = (0..10_000)
            .map(|_| UserRecord {
                partition_key: "k".repeat(256),
                explicit_hash_key: None,
                data: Bytes::new(),
            })
            .collect();
        let data = aggregate(&subs);
        let raw = RawRecord {
            data: data.clone(),
            partition_key: "k".into(),
            explicit_hash_key: None,
            sequence_number: "9".repeat(128),
            approximate_arrival: None,
        };
        let expanded = deaggregate(raw);
        assert_eq!(expanded.records.len(), subs.len());
        let held = held_bytes(&expanded.records);
        // The worst case is reached, not just bounded: only the aggregate's
        // fixed parts (magic, digest, key table) are not sub-records.
        let bound = data.len() * MAX_HELD / MIN_TAKEN;
        assert!(held <= bound, "{held} from {}", data.len());
        assert!(held * 100 >= bound * 99, "{held} from {}", data.len());
    }
}
