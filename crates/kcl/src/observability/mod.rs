//! Prometheus metrics and health probes, served by the worker (feature
//! `prometheus`).
//!
//! [`crate::WorkerBuilder::serve_metrics`] binds an address at `build()`;
//! [`crate::Worker::run_until`] serves it for as long as the worker runs:
//!
//! | path | answers |
//! |---|---|
//! | `GET /metrics` | every `kcl_*` metric (and any other metric the application records through the `metrics` facade) in the Prometheus text format |
//! | `GET /healthz` | 200 while the process serves requests (liveness) |
//! | `GET /readyz` | 200 when the worker finished its startup checks, is not shutting down, and the lease table answered one of its calls recently; otherwise 503 with a one-line reason |
//!
//! The metric names, their labels and example queries are listed in the
//! repository's README ("Metrics").
//!
//! # Layout
//!
//! - `recorder`: the process-wide Prometheus recorder, installed once, with
//!   histogram buckets for kcl's histograms and a description of every
//!   kcl metric.
//! - `readiness`: the readiness decision, a pure function over a snapshot
//!   (worker status, lease-table call counts, the time).
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

mod readiness;
mod recorder;
mod server;

pub(crate) use readiness::Probe;
pub(crate) use server::Endpoint;

/// How long the lease table may go without answering before `/readyz`
/// fails: three taker ticks or renewals, whichever is longer (30 s with
/// the defaults). The taker scans the table every tick (jittered up to
/// +25%), so a healthy worker never comes close.
pub(crate) fn readiness_window(lease: &kcl_core::LeaseConfig) -> std::time::Duration {
    lease.taker_interval().max(lease.renew_interval()) * 3
}
