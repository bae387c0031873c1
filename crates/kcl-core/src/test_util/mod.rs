//! Harnesses the crates' tests share (feature `test-util`): whole workers
//! over the in-memory lease table ([`fleet`]), a metrics recorder that
//! reads back what the code under test recorded ([`metrics`]), and a
//! record given up on for failure destinations' tests ([`failed_record`]).
//!
//! Unlike [`testing`](crate::testing), which drives one processor without
//! a worker, these run the real [`Worker`](crate::worker::Worker) engine.

use bytes::Bytes;

use crate::Record;
use crate::poison::{FailedRecord, FailureReason};
use crate::processor::ShardContext;

pub mod fleet;
pub mod metrics;

/// A plain record `data` at `seq` (sub-sequence 2, a partition key of the
/// largest size) of shard 1 of `orders`, given up on after three attempts
/// failing with `error`.
pub fn failed_record(data: Bytes, seq: &str, error: &str) -> FailedRecord {
    FailedRecord::new(
        ShardContext {
            stream: "orders".into(),
            shard_id: "shardId-000000000001".into(),
            lease_key: "shardId-000000000001".into(),
            worker_id: "w-1".into(),
            lane: None,
        },
        Record {
            data,
            partition_key: "k".repeat(256),
            explicit_hash_key: None,
            sequence_number: seq.into(),
            sub_sequence_number: 2,
            approximate_arrival: None,
            aggregated: false,
        },
        error.into(),
        3,
        FailureReason::MaxAttempts,
    )
}
