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
//! README ("Metrics").
//!
//! # Layout
//!
//! - `recorder` (feature `prometheus`): the process-wide Prometheus
//!   recorder, installed once, with histogram buckets for kcl's histograms
//!   and a description of every kcl metric.
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
//! the server stops. Rendering `/metrics` and the periodic upkeep (draining
//! histogram samples) happen on the server future itself.

mod liveness;
mod readiness;
#[cfg(feature = "prometheus")]
mod recorder;
mod server;
mod status;
#[cfg(test)]
mod tests;

pub(crate) use liveness::Liveness;
pub(crate) use readiness::Probe;
pub(crate) use server::{Endpoint, Probes};

/// How long the lease table may go without answering before `/readyz`
/// fails: three taker ticks or renewals, whichever is longer (30 s with
/// the defaults). The taker scans the table every tick (jittered up to
/// +25%), so a healthy worker never comes close.
pub(crate) fn readiness_window(lease: &kcl_core::LeaseConfig) -> std::time::Duration {
    lease.taker_interval().max(lease.renew_interval()) * 3
}
