//! The name of every metric kcl records, declared once.
//!
//! Every emit site (in kcl-core, kcl-kinesis and kcl-dynamodb) names its
//! metric by one of these constants, the Prometheus recorder takes its
//! `# HELP` lines from [`ALL`], and a test holds the metrics tables of
//! docs/metrics.md to [`ALL`]: a metric added, renamed or dropped in one
//! place and not the others fails the build's tests instead of going
//! unnoticed.

/// What kind of metric a name is recorded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A monotonic count (`metrics::counter!`); its name ends in `_total`.
    Counter,
    /// A value that goes up and down (`metrics::gauge!`).
    Gauge,
    /// A distribution (`metrics::histogram!`), exported with buckets.
    Histogram,
}

impl MetricKind {
    /// The kind as docs/metrics.md's tables and Prometheus spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// The unit a metric's values are in, where it is not a plain count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricUnit {
    /// Bytes.
    Bytes,
    /// Seconds (durations and Unix timestamps).
    Seconds,
    /// Milliseconds.
    Milliseconds,
}

/// One metric kcl records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricSpec {
    /// The full name, `kcl_...`.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// The unit of its values, if not a plain count.
    pub unit: Option<MetricUnit>,
    /// The labels it carries (a site may carry a subset, as the
    /// description says).
    pub labels: &'static [&'static str],
    /// The one-line description, the recorder's `# HELP` text.
    pub help: &'static str,
}

macro_rules! unit {
    () => {
        None
    };
    ($unit:ident) => {
        Some(MetricUnit::$unit)
    };
}

/// Declares each metric's constant (its doc is its description) and the
/// [`ALL`] table from one list, so the two cannot disagree.
macro_rules! metrics {
    ($(
        $constant:ident = $name:literal, $kind:ident $(($unit:ident))?,
        [$($label:literal),*], $help:literal;
    )*) => {
        $(
            #[doc = concat!("`", $name, "` (", stringify!($kind), "): ", $help, ".")]
            pub const $constant: &str = $name;
        )*

        /// Every metric kcl records, in docs/metrics.md's order.
        pub const ALL: &[MetricSpec] = &[$(
            MetricSpec {
                name: $constant,
                kind: MetricKind::$kind,
                unit: unit!($($unit)?),
                labels: &[$($label),*],
                help: $help,
            },
        )*];
    };
}

metrics! {
    // Leases.
    LEASES_HELD = "kcl_leases_held", Gauge, ["worker"],
        "Leases this worker holds, including those awaiting a handoff to it";
    LEASES_ACQUIRED = "kcl_leases_acquired_total", Counter, ["worker", "how"],
        "Leases acquired, by how: taken (unowned or expired), stolen (a handoff started), reclaimed";
    WORKER_ID_CONFLICTS = "kcl_worker_id_conflicts_total", Counter, ["worker"],
        "Tenures lost to another process running under this worker's id (worker ids must be unique per process)";
    RENEWAL_SWITCHED_TO_PER_LEASE = "kcl_renewal_switched_to_per_lease_total", Counter, ["worker"],
        "Switches from liveness-record renewal to per-lease renewal: the table is shared with workers that judge leases by their counters";
    LEASES_ENDED = "kcl_leases_ended_total", Counter, ["worker", "reason"],
        "Leases this worker stopped holding, by reason: lost, fenced, released, handed_off";
    HANDOFFS = "kcl_handoffs_total", Counter, ["worker", "outcome"],
        "Handoffs to this worker, by outcome: completed by the previous owner, or forced";
    HANDOFFS_REQUESTED = "kcl_handoffs_requested_total", Counter, ["worker"],
        "Leases another worker asked this worker to hand over";
    HANDOFFS_GIVEN = "kcl_handoffs_given_total", Counter, ["worker"],
        "Leases this worker let a Java KCL worker that asked for them have";
    LEASE_RENEWALS = "kcl_lease_renewals_total", Counter, ["worker"],
        "Lease renewals that succeeded (per lease, by its own write or a liveness beat)";
    LEASE_RENEWAL_FAILURES = "kcl_lease_renewal_failures_total", Counter, ["worker"],
        "Lease renewals that failed (not a lost race); persistent failures fence the lease";
    LEASE_TAKER_TICKS = "kcl_lease_taker_ticks_total", Counter, ["worker"],
        "Lease-taker ticks";
    LEASE_TAKER_QUIET_TICKS = "kcl_lease_taker_quiet_ticks_total", Counter, ["worker"],
        "Lease-taker ticks that read only the liveness records (nothing had changed)";
    LEASE_TAKER_SCAN_FAILURES = "kcl_lease_taker_scan_failures_total", Counter, ["worker"],
        "Lease-taker ticks whose table scan failed";
    LIVENESS_READ_FAILURES = "kcl_liveness_read_failures_total", Counter, ["worker"],
        "Reads of the liveness records that failed";
    LEASE_TAKE_CONFLICTS = "kcl_lease_take_conflicts_total", Counter, ["worker"],
        "Lease takes that lost their race to another worker";
    LEASE_TAKE_FAILURES = "kcl_lease_take_failures_total", Counter, ["worker"],
        "Lease takes that failed otherwise (tried again at the next tick)";
    CONSUMER_PANICS = "kcl_consumer_panics_total", Counter, ["worker"],
        "Shard consumers whose processor panicked (the lease is released)";

    // Processing.
    MILLIS_BEHIND_LATEST = "kcl_millis_behind_latest", Gauge(Milliseconds), ["stream", "shard"],
        "How far the last delivered batch was behind the tip of the shard; 0 once this worker stops consuming the shard";
    SHARD_LAST_DELIVERY_TIMESTAMP = "kcl_shard_last_delivery_timestamp_seconds", Gauge(Seconds), ["stream", "shard"],
        "When a processor last finished a batch of the shard (Unix time; time() minus it is the age); 0 once this worker stops consuming the shard";
    SHARD_RECORDS_WAITING = "kcl_shard_records_waiting", Gauge, ["stream", "shard"],
        "Records read from the shard and not yet processed (a batch counts until the processor call it is in returns); 0 once this worker stops consuming the shard";
    SHARD_LAST_CHECKPOINT_TIMESTAMP = "kcl_shard_last_checkpoint_timestamp_seconds", Gauge(Seconds), ["stream", "shard"],
        "When the shard's checkpoint was last written (Unix time); 0 once this worker stops consuming the shard";
    RECORDS_PROCESSED = "kcl_records_processed_total", Counter, ["stream", "shard"],
        "Records handed to the processor";
    BYTES_PROCESSED = "kcl_bytes_processed_total", Counter(Bytes), ["stream", "shard"],
        "Payload bytes handed to the processor";
    RECORDS_PER_BATCH = "kcl_records_per_batch", Histogram, ["stream", "shard"],
        "Records per batch handed to the processor";
    BATCH_PROCESSING_SECONDS = "kcl_batch_processing_seconds", Histogram(Seconds), ["stream", "shard"],
        "Time the processor took per batch, checkpoint included";
    LANE_RECORDS_IN_FLIGHT = "kcl_lane_records_in_flight", Gauge, ["stream", "shard"],
        "Records handed to parallel lanes and not yet passed by the shard's checkpoint; 0 once this worker stops consuming the shard";
    PROCESSOR_ERRORS = "kcl_processor_errors_total", Counter, ["stream", "shard", "stage"],
        "Errors returned by the processor, by stage";
    PROCESSOR_CALLS_SLOW = "kcl_processor_calls_slow_total", Counter, ["stream", "shard", "stage"],
        "Processor calls still running after processor_warn_after (once per call), by stage";
    PROCESSOR_TIMEOUTS = "kcl_processor_timeouts_total", Counter, ["stream", "shard", "stage"],
        "Processor calls cancelled at processor_timeout (the shard is given back), by stage";
    PROCESSOR_BATCHES_SKIPPED = "kcl_processor_batches_skipped_total", Counter, ["stream", "shard"],
        "Failed batches skipped under FailurePolicy::Skip";
    POISON_RECORDS = "kcl_poison_records_total", Counter, ["stream", "shard", "outcome"],
        "Records set aside under FailurePolicy::Isolate, by outcome: sent, dropped";
    FAILURE_DESTINATION_ERRORS = "kcl_failure_destination_errors_total", Counter, ["stream", "shard"],
        "Sends the failure destination refused or that timed out (retried)";
    FAILURE_DESTINATION_DEADLINES = "kcl_failure_destination_deadlines_total", Counter, ["stream", "shard"],
        "Shards given back because no send was accepted before send_deadline";
    FAILURE_DESTINATION_CANNOT_STORE = "kcl_failure_destination_cannot_store_total", Counter, ["stream", "shard"],
        "Sends the failure destination refused for good (CannotStore); the shard is kept and the send retried";
    CHECKPOINTS = "kcl_checkpoints_total", Counter, ["stream", "shard"],
        "Checkpoints written";
    SHARD_END_NOT_CHECKPOINTED = "kcl_shard_end_not_checkpointed_total", Counter, ["stream", "shard"],
        "shard_ended calls that returned without checkpointing SHARD_END";
    UNREADABLE_SHARDS_RELEASED = "kcl_unreadable_shards_released_total", Counter, ["stream", "shard", "stage"],
        "Shards given back after repeated fatal read errors or no successful read, by stage: open, read, stalled";

    // Retrieval.
    KINESIS_GET_RECORDS_CALLS = "kcl_kinesis_get_records_calls_total", Counter, ["stream", "shard"],
        "GetRecords calls";
    KINESIS_RECORDS_FETCHED = "kcl_kinesis_records_fetched_total", Counter, ["stream", "shard"],
        "Records fetched before KPL de-aggregation (per shard by polling, per stream by fan-out)";
    KINESIS_BYTES_FETCHED = "kcl_kinesis_bytes_fetched_total", Counter(Bytes), ["stream", "shard"],
        "Bytes fetched (per shard by polling, per stream by fan-out)";
    KINESIS_MILLIS_BEHIND_LATEST = "kcl_kinesis_millis_behind_latest", Gauge(Milliseconds), ["stream", "shard"],
        "MillisBehindLatest of the last fetch (fetch side, ahead of processing by the prefetch); 0 once this worker stops reading the shard";
    KINESIS_EXPIRED_ITERATORS = "kcl_kinesis_expired_iterators_total", Counter, ["stream", "shard"],
        "Shard iterators that expired and were renewed";
    KINESIS_LIST_SHARDS_CALLS = "kcl_kinesis_list_shards_calls_total", Counter, ["stream"],
        "ListShards calls";
    KINESIS_THROTTLES = "kcl_kinesis_throttles_total", Counter, ["stream", "call"],
        "Kinesis calls throttled, by call";
    KINESIS_RETRIES = "kcl_kinesis_retries_total", Counter, ["stream", "call"],
        "Kinesis calls retried, by call";
    KINESIS_CALL_TIMEOUTS = "kcl_kinesis_call_timeouts_total", Counter, ["stream", "call"],
        "Kinesis calls that did not answer within their attempt timeout and were made again, by call";
    KINESIS_ACCESS_ERRORS = "kcl_kinesis_access_errors_total", Counter, ["stream", "call", "code"],
        "Kinesis calls denied access to the stream or its KMS key (retried), by call and code";
    KINESIS_EXPIRED_SHARDS = "kcl_kinesis_expired_shards_total", Counter, ["stream", "shard"],
        "Shards found past the stream's retention before they were read to their end (unread records lost)";
    KINESIS_TRIMMED_CHECKPOINTS = "kcl_kinesis_trimmed_checkpoints_total", Counter, ["stream", "shard"],
        "Starting positions behind the trim horizon, or refused with their trim unproven (records lost, or maybe; reading resumed at TRIM_HORIZON)";
    KINESIS_FANOUT_CONSUMERS_REGISTERED = "kcl_kinesis_fanout_consumers_registered_total", Counter, ["stream"],
        "Enhanced fan-out stream consumers this worker registered";
    KINESIS_FANOUT_SUBSCRIPTIONS = "kcl_kinesis_fanout_subscriptions_total", Counter, ["stream"],
        "SubscribeToShard subscriptions opened";
    KINESIS_FANOUT_RESUBSCRIBES = "kcl_kinesis_fanout_resubscribes_total", Counter, ["stream"],
        "Subscriptions opened after a shard's first one";
    KINESIS_FANOUT_EVENTS = "kcl_kinesis_fanout_events_total", Counter, ["stream"],
        "SubscribeToShard events received";
    KINESIS_FANOUT_REPEATED_RECORDS = "kcl_kinesis_fanout_repeated_records_total", Counter, ["stream"],
        "Records a resubscription delivered again, dropped to keep order";
    KINESIS_FANOUT_CLOSED_SHARD_CHECKS = "kcl_kinesis_fanout_closed_shard_checks_total", Counter, ["stream"],
        "Checks whether a shard is closed, for endpoints that never announce its end";
    KINESIS_FANOUT_ERRORS = "kcl_kinesis_fanout_errors_total", Counter, ["stream", "kind"],
        "Failed subscriptions, by kind: throttled, in_use, transient, not_found, access_denied, invalid_argument, fatal";
    KINESIS_FANOUT_SILENT_SUBSCRIPTIONS = "kcl_kinesis_fanout_silent_subscriptions_total", Counter, ["stream"],
        "Fan-out subscriptions that delivered no event within event_timeout and were replaced";
    KPL_MALFORMED_AGGREGATES = "kcl_kpl_malformed_aggregates_total", Counter, ["reason"],
        "KPL aggregates that could not be decoded (delivered as one plain record), by reason";
    KPL_RECORDS_OUTSIDE_SHARD = "kcl_kpl_records_outside_shard_total", Counter, [],
        "KPL sub-records whose hash key lies outside the shard (delivered anyway)";

    // Lease table.
    STORE_OPERATIONS = "kcl_store_operations_total", Counter, ["op", "outcome"],
        "Lease-table calls, by op and outcome (ok, condition_failed, throttled, retryable, fatal)";
    STORE_OPERATION_SECONDS = "kcl_store_operation_seconds", Histogram(Seconds), ["op"],
        "Lease-table call latency, by op";
    STORE_CAPACITY_UNITS_MILLI = "kcl_store_capacity_units_milli_total", Counter, ["op"],
        "DynamoDB capacity consumed, in thousandths of a unit, by op";
    STORE_SCANS = "kcl_store_scans_total", Counter, [],
        "Whole-table scans started";
    LEASE_ITEMS_MALFORMED = "kcl_lease_items_malformed_total", Counter, ["lease"],
        "Lease items that could not be read (skipped), by lease key";

    // Shard sync.
    SHARD_SYNC_LEASES_CREATED = "kcl_shard_sync_leases_created_total", Counter, ["stream"],
        "Leases created for new shards";
    SHARD_SYNC_LEASES_ALREADY_EXISTED = "kcl_shard_sync_leases_already_existed_total", Counter, ["stream"],
        "Lease creations that found the lease already there";
    SHARD_SYNC_HASH_KEY_HOLES = "kcl_shard_sync_hash_key_holes_total", Counter, ["stream"],
        "Hash-key ranges no open shard covered, found by shard sync";
    LEASES_CLEANED_UP = "kcl_leases_cleaned_up_total", Counter, [],
        "Finished leases deleted after their retention period";

    // Export (kcl feature "otlp"; made by the exporter, not recorded).
    OTLP_MEASUREMENTS_DROPPED = "kcl_otlp_measurements_dropped_total", Counter, [],
        "Measurements the OTLP exporter dropped because it already held max_series series";
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_metric_name_is_declared_once() {
        let mut seen = HashSet::new();
        let repeated: Vec<_> = ALL.iter().filter(|m| !seen.insert(m.name)).collect();
        assert!(repeated.is_empty(), "declared twice: {repeated:?}");
    }

    #[test]
    fn names_follow_the_prometheus_conventions_for_their_kind() {
        for m in ALL {
            assert!(
                m.name.starts_with("kcl_"),
                "{} lacks the kcl_ prefix",
                m.name
            );
            let total = m.name.ends_with("_total");
            assert_eq!(
                total,
                m.kind == MetricKind::Counter,
                "{}: counters, and only counters, end in _total",
                m.name
            );
            let seconds = m.name.ends_with("_seconds");
            assert_eq!(
                seconds,
                m.unit == Some(MetricUnit::Seconds),
                "{}: a name ends in _seconds exactly when its unit is seconds",
                m.name
            );
        }
    }
}
