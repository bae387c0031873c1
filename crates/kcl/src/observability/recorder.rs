//! The process-wide Prometheus recorder.
//!
//! The `metrics` facade has one global recorder per process, so the first
//! worker that serves metrics installs it and later ones (several workers
//! in one process, or a worker restarted in place) share it.

use std::sync::OnceLock;

use kcl_core::ConfigError;
use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Buckets of the `*_seconds` histograms: 1 ms to 30 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets of `kcl_records_per_batch`, up to GetRecords' 10000.
const BATCH_BUCKETS: &[f64] = &[
    1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

static RECORDER: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// The handle of kcl's Prometheus recorder, installing it on first use.
/// Fails if the application installed another recorder first.
pub(crate) fn handle() -> Result<PrometheusHandle, ConfigError> {
    RECORDER
        .get_or_init(install)
        .clone()
        .map_err(|reason| ConfigError {
            field: "serve_metrics",
            reason,
        })
}

fn install() -> Result<PrometheusHandle, String> {
    // Histograms with buckets (not summaries) so that they aggregate
    // across a fleet: histogram_quantile(0.99, sum by (le) (rate(...))).
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full("kcl_records_per_batch".into()), BATCH_BUCKETS)
        })
        .map_err(|e| format!("invalid histogram buckets: {e}"))?;
    let handle = builder.install_recorder().map_err(|e| {
        format!(
            "cannot install kcl's Prometheus recorder ({e}); another `metrics` recorder is \
             already installed in this process: serve it yourself instead of calling \
             serve_metrics"
        )
    })?;
    describe();
    Ok(handle)
}

/// `# HELP` lines for every metric kcl records.
fn describe() {
    use metrics::describe_histogram as histogram;
    use metrics::{describe_counter as counter, describe_gauge as gauge};
    // Leases (label worker).
    gauge!(
        "kcl_leases_held",
        "Leases this worker holds, including those awaiting a handoff to it"
    );
    counter!(
        "kcl_leases_acquired_total",
        "Leases acquired, by how: taken (unowned or expired), stolen (a handoff started), reclaimed"
    );
    counter!(
        "kcl_leases_ended_total",
        "Leases this worker stopped holding, by reason: lost, fenced, released, handed_off"
    );
    counter!(
        "kcl_handoffs_total",
        "Handoffs to this worker, by outcome: completed by the previous owner, or forced"
    );
    counter!(
        "kcl_handoffs_requested_total",
        "Leases another worker asked this worker to hand over"
    );
    counter!(
        "kcl_handoffs_given_total",
        "Leases this worker let a Java KCL worker that asked for them have"
    );
    counter!(
        "kcl_lease_renewals_total",
        "Lease renewals that succeeded (per lease, by its own write or a liveness beat)"
    );
    counter!(
        "kcl_lease_renewal_failures_total",
        "Lease renewals that failed (not a lost race); persistent failures fence the lease"
    );
    counter!("kcl_lease_taker_ticks_total", "Lease-taker ticks");
    counter!(
        "kcl_lease_taker_quiet_ticks_total",
        "Lease-taker ticks that read only the liveness records (nothing had changed)"
    );
    counter!(
        "kcl_lease_taker_scan_failures_total",
        "Lease-taker ticks whose table scan failed"
    );
    counter!(
        "kcl_liveness_read_failures_total",
        "Reads of the liveness records that failed"
    );
    counter!(
        "kcl_lease_take_conflicts_total",
        "Lease takes that lost their race to another worker"
    );
    counter!(
        "kcl_lease_take_failures_total",
        "Lease takes that failed otherwise (tried again at the next tick)"
    );
    counter!(
        "kcl_consumer_panics_total",
        "Shard consumers whose processor panicked (the lease is released)"
    );
    // Shard sync (label stream).
    counter!(
        "kcl_shard_sync_leases_created_total",
        "Leases created for new shards"
    );
    counter!(
        "kcl_shard_sync_leases_already_existed_total",
        "Lease creations that found the lease already there"
    );
    counter!(
        "kcl_shard_sync_hash_key_holes_total",
        "Hash-key ranges no open shard covered, found by shard sync"
    );
    // Processing (labels stream, shard).
    counter!(
        "kcl_records_processed_total",
        "Records handed to the processor"
    );
    counter!(
        "kcl_bytes_processed_total",
        Unit::Bytes,
        "Payload bytes handed to the processor"
    );
    histogram!(
        "kcl_records_per_batch",
        "Records per batch handed to the processor"
    );
    histogram!(
        "kcl_batch_processing_seconds",
        Unit::Seconds,
        "Time the processor took per batch, checkpoint included"
    );
    gauge!(
        "kcl_millis_behind_latest",
        Unit::Milliseconds,
        "How far the last delivered batch was behind the tip of the shard; 0 once this worker stops consuming the shard"
    );
    gauge!(
        "kcl_shard_last_delivery_timestamp_seconds",
        Unit::Seconds,
        "When a processor last finished a batch of the shard (Unix time; time() minus it is the age); 0 once this worker stops consuming the shard"
    );
    gauge!(
        "kcl_shard_last_checkpoint_timestamp_seconds",
        Unit::Seconds,
        "When the shard's checkpoint was last written (Unix time); 0 once this worker stops consuming the shard"
    );
    counter!(
        "kcl_processor_errors_total",
        "Errors returned by the processor, by stage"
    );
    counter!(
        "kcl_processor_batches_skipped_total",
        "Failed batches skipped under FailurePolicy::Skip"
    );
    counter!("kcl_checkpoints_total", "Checkpoints written");
    counter!(
        "kcl_shard_end_not_checkpointed_total",
        "shard_ended calls that returned without checkpointing SHARD_END"
    );
    // Lease table.
    counter!(
        "kcl_store_operations_total",
        "Lease-table calls, by op and outcome (ok, condition_failed, throttled, retryable, fatal)"
    );
    histogram!(
        "kcl_store_operation_seconds",
        Unit::Seconds,
        "Lease-table call latency, by op"
    );
    counter!("kcl_store_scans_total", "Whole-table scans started");
    counter!(
        "kcl_store_capacity_units_milli_total",
        "DynamoDB capacity consumed, in thousandths of a unit, by op"
    );
    counter!(
        "kcl_lease_items_malformed_total",
        "Lease items that could not be read (skipped), by lease key"
    );
    // Kinesis.
    counter!("kcl_kinesis_get_records_calls_total", "GetRecords calls");
    counter!(
        "kcl_kinesis_records_fetched_total",
        "Records fetched by GetRecords (before KPL de-aggregation)"
    );
    counter!(
        "kcl_kinesis_bytes_fetched_total",
        Unit::Bytes,
        "Bytes fetched by GetRecords"
    );
    counter!(
        "kcl_kinesis_expired_iterators_total",
        "Shard iterators that expired and were renewed"
    );
    gauge!(
        "kcl_kinesis_millis_behind_latest",
        Unit::Milliseconds,
        "MillisBehindLatest of the last GetRecords (fetch side, ahead of processing by the prefetch); 0 once this worker stops reading the shard"
    );
    counter!("kcl_kinesis_list_shards_calls_total", "ListShards calls");
    counter!(
        "kcl_kinesis_throttles_total",
        "Kinesis calls throttled, by call"
    );
    counter!(
        "kcl_kinesis_retries_total",
        "Kinesis calls retried, by call"
    );
    counter!(
        "kcl_kpl_malformed_aggregates_total",
        "KPL aggregates that could not be decoded (delivered as one plain record), by reason"
    );
    counter!(
        "kcl_kpl_records_outside_shard_total",
        "KPL sub-records whose hash key lies outside the shard (delivered anyway)"
    );
}
