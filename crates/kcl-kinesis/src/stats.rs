//! Counters of a source's Kinesis calls, shared by all its readers.
//!
//! The same events also go to the `metrics` facade (with stream and shard
//! labels); these plain counters exist so tests and tools can read them
//! without installing a metrics recorder.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one [`crate::KinesisShardSource`] and its readers.
#[derive(Debug, Default)]
pub struct SourceStats {
    list_shards_calls: AtomicU64,
    get_shard_iterator_calls: AtomicU64,
    get_records_calls: AtomicU64,
    throttles: AtomicU64,
    retries: AtomicU64,
    expired_iterators: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
}

/// A point-in-time copy of [`SourceStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// `ListShards` calls (one per page), including failed ones.
    pub list_shards_calls: u64,
    /// `GetShardIterator` calls, including failed ones.
    pub get_shard_iterator_calls: u64,
    /// `GetRecords` calls, including failed ones.
    pub get_records_calls: u64,
    /// Calls the service throttled.
    pub throttles: u64,
    /// Calls repeated after a throttle or a transient failure.
    pub retries: u64,
    /// Shard iterators that expired and were replaced.
    pub expired_iterators: u64,
    /// User records fetched (after de-aggregation, before skipping the ones
    /// a checkpoint covers).
    pub records: u64,
    /// Payload bytes fetched.
    pub bytes: u64,
}

impl SourceStats {
    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            list_shards_calls: get(&self.list_shards_calls),
            get_shard_iterator_calls: get(&self.get_shard_iterator_calls),
            get_records_calls: get(&self.get_records_calls),
            throttles: get(&self.throttles),
            retries: get(&self.retries),
            expired_iterators: get(&self.expired_iterators),
            records: get(&self.records),
            bytes: get(&self.bytes),
        }
    }

    pub(crate) fn list_shards_call(&self) {
        self.list_shards_calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get_shard_iterator_call(&self) {
        self.get_shard_iterator_calls
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get_records_call(&self) {
        self.get_records_calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn throttle(&self) {
        self.throttles.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn expired_iterator(&self) {
        self.expired_iterators.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn fetched(&self, records: u64, bytes: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}
