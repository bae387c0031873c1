//! Counters of a source's Kinesis calls, shared by all its readers.
//!
//! The same events also go to the `metrics` facade (with stream and shard
//! labels); these plain counters exist so tests and tools can read them
//! without installing a metrics recorder.

use std::sync::atomic::Ordering;

kcl_core::counters! {
    /// Counters of one [`crate::KinesisShardSource`] and its readers.
    pub struct SourceStats => SourceSnapshot {
        counts {
            /// `ListShards` calls (one per page), including failed ones.
            list_shards_calls,
            /// `GetShardIterator` calls, including failed ones.
            get_shard_iterator_calls,
            /// `GetRecords` calls, including failed ones.
            get_records_calls,
            /// Calls the service throttled.
            throttles,
            /// Calls repeated after a throttle or a transient failure.
            retries,
            /// Shard iterators that expired and were replaced.
            expired_iterators,
            /// User records fetched (after de-aggregation, before skipping the ones
            /// a checkpoint covers).
            records,
            /// Payload bytes fetched.
            bytes,
            /// Stream-consumer calls of enhanced fan-out (`DescribeStreamSummary`,
            /// `DescribeStreamConsumer`, `RegisterStreamConsumer`,
            /// `DeregisterStreamConsumer`), including failed ones.
            consumer_calls,
            /// `SubscribeToShard` calls, including failed ones.
            subscribe_calls,
            /// Subscriptions a fan-out reader opened after its first one (after the
            /// service or the configured lifetime ended one, or after an error).
            resubscribes,
            /// `SubscribeToShard` events received.
            events,
            /// Failed subscriptions (the call or the event stream).
            subscription_errors,
            /// Calls denied access to the stream or its KMS key (retried while the lease lasts).
            access_denied,
            /// Calls given up for not answering within their attempt timeout (retried).
            call_timeouts,
            /// Shards found gone (past retention) before they were read to their end: taken as ended, their remaining records lost.
            expired_shards,
            /// Starting positions behind the trim horizon (a checkpoint older than the retention): reading resumed at TRIM_HORIZON, the records in between lost.
            trimmed_starts,
            /// Fan-out subscriptions that delivered no event within the event timeout and were replaced.
            silent_subscriptions,
        }
        levels {
            /// Bytes the readers hold right now (fetched, not yet handed out), as
            /// the worker-wide prefetch budget counts them.
            buffered_bytes,
            /// The most bytes the readers held at once.
            peak_buffered_bytes,
        }
    }
}

impl SourceStats {
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
