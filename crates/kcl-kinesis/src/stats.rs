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
    consumer_calls: AtomicU64,
    subscribe_calls: AtomicU64,
    resubscribes: AtomicU64,
    events: AtomicU64,
    subscription_errors: AtomicU64,
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
    /// Stream-consumer calls of enhanced fan-out (`DescribeStreamSummary`,
    /// `DescribeStreamConsumer`, `RegisterStreamConsumer`,
    /// `DeregisterStreamConsumer`), including failed ones.
    pub consumer_calls: u64,
    /// `SubscribeToShard` calls, including failed ones.
    pub subscribe_calls: u64,
    /// Subscriptions a fan-out reader opened after its first one (after the
    /// service or the configured lifetime ended one, or after an error).
    pub resubscribes: u64,
    /// `SubscribeToShard` events received.
    pub events: u64,
    /// Failed subscriptions (the call or the event stream).
    pub subscription_errors: u64,
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
            consumer_calls: get(&self.consumer_calls),
            subscribe_calls: get(&self.subscribe_calls),
            resubscribes: get(&self.resubscribes),
            events: get(&self.events),
            subscription_errors: get(&self.subscription_errors),
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

    pub(crate) fn consumer_call(&self) {
        self.consumer_calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn subscribe_call(&self) {
        self.subscribe_calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn resubscribe(&self) {
        self.resubscribes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn event(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn subscription_error(&self) {
        self.subscription_errors.fetch_add(1, Ordering::Relaxed);
    }
}
