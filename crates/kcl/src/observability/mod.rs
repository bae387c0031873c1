//! Health probes, a status document and (feature `prometheus`) Prometheus
//! metrics, served by the worker.
//!
//! [`crate::WorkerBuilder::serve_health`] (always available) and
//! `WorkerBuilder::serve_metrics` (feature `prometheus`) bind an
//! address at `build()`; [`crate::Worker::run_until`] serves it for as
//! long as the worker runs:
//!
//! | path | answers |
//! |---|---|
//! | `GET /healthz` | liveness: 200 while the process serves requests; with [`crate::WorkerBuilder::liveness_stall_bound`], 503 naming the shards that had work waiting (records behind the tip or fetched, or a processor call running) and neither processed a batch nor checkpointed for longer than the bound |
//! | `GET /readyz` | 200 when the worker finished its startup checks, is not shutting down, and the lease table answered one of its calls recently; otherwise 503 with a one-line reason |
//! | `GET /status` | JSON: the worker id, readiness and liveness verdicts, and per held shard its lanes, lag (`millis_behind_latest`, records waiting), last batch processed, last checkpoint and any processor call running, with ages in seconds |
//! | `GET /metrics` | `serve_metrics` only: every `kcl_*` metric (and any other metric the application records through the `metrics` facade) in the Prometheus text format |
//!
//! `serve_health` never installs a `metrics` recorder, so the probes work
//! with any recorder the application installed, or none. The metric
//! names, their labels and example queries are listed in the repository's
//! docs/metrics.md.
//!
//! # Layout
//!
//! - `registry` (features `prometheus`, `otlp`): the series both
//!   exporters read (counters, gauges, explicit-bucket histograms), which
//!   forgets a shard's series once no consumer of the process reads it.
//! - `prometheus` (feature `prometheus`): the process-wide recorder,
//!   installed once, and the Prometheus text rendering of its series, with
//!   a description of every kcl metric.
//! - `cloudwatch` (feature `cloudwatch`): a recorder that aggregates
//!   the metrics under the Java KCL's CloudWatch names and dimensions, and
//!   the publisher that sends them with PutMetricData.
//! - `otlp` (feature `otlp`): `OtlpMetrics`, a recorder that aggregates
//!   every metric (cumulative sums, gauges, explicit-bucket histograms,
//!   at most `max_series` series) and the exporter that pushes them to an
//!   OpenTelemetry collector over OTLP/HTTP
//!   (`WorkerBuilder::export_otlp_metrics`).
//! - `readiness`: the readiness decision, a pure function over a snapshot
//!   (worker status, lease-table call counts, the time).
//! - `liveness`: the stall check over the worker's shard progress.
//! - `status`: the `/status` document.
//! - `server`: the HTTP/1.1 endpoint on hyper.
//!
//! # Concurrency model
//!
//! The endpoint is not a background task: `Worker::run_until` polls the
//! server future next to the worker's own, and stops it once the worker
//! has shut down (so `/readyz` reports the drain with 503 until the very
//! end). Connections run in a `JoinSet` owned by the server future, at most
//! 64 at once, each bounded by a header-read timeout; they are aborted when
//! the server stops. Rendering `/metrics` happens on the server future
//! itself.

#[cfg(feature = "cloudwatch")]
pub mod cloudwatch;
mod liveness;
#[cfg(feature = "otlp")]
mod otlp;
#[cfg(feature = "prometheus")]
mod prometheus;
mod readiness;
#[cfg(any(feature = "prometheus", feature = "otlp"))]
mod registry;
mod server;
mod status;
#[cfg(test)]
mod tests;

pub(crate) use liveness::Liveness;
#[cfg(feature = "otlp")]
pub(crate) use otlp::install_for_worker as install_otlp;
#[cfg(feature = "otlp")]
pub use otlp::{OtlpExportError, OtlpExporter, OtlpMetrics, OtlpRecorder, OtlpStats};
pub(crate) use readiness::Probe;
pub(crate) use server::{Endpoint, Probes};

/// How long the lease table may go without answering before `/readyz`
/// fails: three taker ticks or renewals, whichever is longer (30 s with
/// the defaults). The taker scans the table every tick (jittered up to
/// +25%), so a healthy worker never comes close.
pub(crate) fn readiness_window(lease: &kcl_core::LeaseConfig) -> std::time::Duration {
    lease.taker_interval().max(lease.renew_interval()) * 3
}

/// Buckets of the `*_seconds` histograms: 1 ms to 30 s.
#[cfg(any(feature = "prometheus", feature = "otlp"))]
pub(crate) const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of [`kcl_core::metric_names::RECORDS_PER_BATCH`], up to
/// GetRecords' 10000.
#[cfg(any(feature = "prometheus", feature = "otlp"))]
pub(crate) const BATCH_BUCKETS: &[f64] = &[
    1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

/// The buckets kcl gives histogram `name`, if any: the exporters bucket
/// alike, so dashboards and quantiles mean the same whichever is used.
#[cfg(any(feature = "prometheus", feature = "otlp"))]
pub(crate) fn kcl_histogram_buckets(name: &str) -> Option<&'static [f64]> {
    if name == kcl_core::metric_names::RECORDS_PER_BATCH {
        Some(BATCH_BUCKETS)
    } else if name.ends_with("_seconds") {
        Some(SECONDS_BUCKETS)
    } else {
        None
    }
}
