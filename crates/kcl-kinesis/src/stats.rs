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

/// The methods that each add one to a counter (`method => counter`).
macro_rules! one_more {
    ($($method:ident => $counter:ident),* $(,)?) => {
        impl SourceStats {
            $(
                pub(crate) fn $method(&self) {
                    self.$counter.fetch_add(1, Ordering::Relaxed);
                }
            )*
        }
    };
}

one_more! {
    list_shards_call => list_shards_calls,
    get_shard_iterator_call => get_shard_iterator_calls,
    get_records_call => get_records_calls,
    throttle => throttles,
    retry => retries,
    expired_iterator => expired_iterators,
    consumer_call => consumer_calls,
    subscribe_call => subscribe_calls,
    resubscribe => resubscribes,
    event => events,
    subscription_error => subscription_errors,
    access_denied => access_denied,
    call_timeout => call_timeouts,
    expired_shard => expired_shards,
    trimmed_start => trimmed_starts,
    silent_subscription => silent_subscriptions,
}

impl SourceStats {
    pub(crate) fn fetched(&self, records: u64, bytes: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
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
