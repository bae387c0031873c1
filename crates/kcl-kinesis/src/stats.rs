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
    access_denied: AtomicU64,
    call_timeouts: AtomicU64,
    expired_shards: AtomicU64,
    trimmed_starts: AtomicU64,
    silent_subscriptions: AtomicU64,
    buffered_bytes: AtomicU64,
    peak_buffered_bytes: AtomicU64,
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
    /// Calls denied access to the stream or its KMS key (retried while the lease lasts).
    pub access_denied: u64,
    /// Calls given up for not answering within their attempt timeout (retried).
    pub call_timeouts: u64,
    /// Shards found gone (past retention) before they were read to their end: taken as ended, their remaining records lost.
    pub expired_shards: u64,
    /// Starting positions behind the trim horizon (a checkpoint older than the retention): reading resumed at TRIM_HORIZON, the records in between lost.
    pub trimmed_starts: u64,
    /// Fan-out subscriptions that delivered no event within the event timeout and were replaced.
    pub silent_subscriptions: u64,
    /// Bytes the readers hold right now (fetched, not yet handed out), as
    /// the worker-wide prefetch budget counts them.
    pub buffered_bytes: u64,
    /// The most bytes the readers held at once.
    pub peak_buffered_bytes: u64,
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
            access_denied: get(&self.access_denied),
            call_timeouts: get(&self.call_timeouts),
            expired_shards: get(&self.expired_shards),
            trimmed_starts: get(&self.trimmed_starts),
            silent_subscriptions: get(&self.silent_subscriptions),
            buffered_bytes: get(&self.buffered_bytes),
            peak_buffered_bytes: get(&self.peak_buffered_bytes),
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

    pub(crate) fn access_denied(&self) {
        self.access_denied.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn call_timeout(&self) {
        self.call_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn expired_shard(&self) {
        self.expired_shards.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn trimmed_start(&self) {
        self.trimmed_starts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn silent_subscription(&self) {
        self.silent_subscriptions.fetch_add(1, Ordering::Relaxed);
    }

    /// Records bytes taken from (positive) or given back to the budget.
    pub(crate) fn buffered(&self, taken: u64) {
        let now = self.buffered_bytes.fetch_add(taken, Ordering::Relaxed) + taken;
        self.peak_buffered_bytes.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn unbuffered(&self, given_back: u64) {
        self.buffered_bytes.fetch_sub(given_back, Ordering::Relaxed);
    }
}
