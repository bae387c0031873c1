//! The `/status` document: this worker's shards, their lanes, lag and last
//! progress, as JSON.

use kcl_core::worker::{ShardProgress, WorkerHandle};
use serde::Serialize;
use tokio::time::Instant;

#[derive(Debug, Serialize)]
struct Status<'a> {
    worker_id: &'a str,
    ready: bool,
    /// Why not ready, when not.
    not_ready: Option<String>,
    shutting_down: bool,
    /// Why the liveness check fails, when it does.
    stalled: Option<String>,
    shards_finished: u64,
    shards: Vec<Shard>,
}

/// One shard; times are ages in seconds (a monotonic clock has no date).
#[derive(Debug, Serialize)]
struct Shard {
    lease_key: String,
    stream: String,
    shard_id: String,
    lanes: usize,
    consuming_seconds: f64,
    last_delivery_seconds_ago: Option<f64>,
    last_delivery_records: Option<usize>,
    last_checkpoint: Option<String>,
    last_checkpoint_seconds_ago: Option<f64>,
    millis_behind_latest: Option<u64>,
    records_waiting: usize,
    window_full: bool,
    processor_call: Option<&'static str>,
    processor_call_seconds: Option<f64>,
}

impl Shard {
    fn of(p: ShardProgress, now: Instant) -> Self {
        let ago = |at: Instant| now.saturating_duration_since(at).as_secs_f64();
        Shard {
            consuming_seconds: ago(p.consuming_since),
            last_delivery_seconds_ago: p.last_delivery.map(|d| ago(d.at)),
            last_delivery_records: p.last_delivery.map(|d| d.records),
            last_checkpoint_seconds_ago: p.last_checkpoint.as_ref().map(|c| ago(c.at)),
            last_checkpoint: p.last_checkpoint.map(|c| c.value),
            processor_call: p.processor_call.map(|c| c.stage),
            processor_call_seconds: p.processor_call.map(|c| ago(c.since)),
            lease_key: p.lease_key,
            stream: p.stream,
            shard_id: p.shard_id,
            lanes: p.lanes,
            millis_behind_latest: p.millis_behind_latest,
            records_waiting: p.records_waiting,
            window_full: p.window_full,
        }
    }
}

/// The document, given the probes' verdicts.
pub(crate) fn render(
    worker: &WorkerHandle,
    worker_id: &str,
    readiness: Result<(), String>,
    liveness: Result<(), String>,
) -> String {
    let now = Instant::now();
    let status = worker.status();
    let doc = Status {
        worker_id,
        ready: readiness.is_ok(),
        not_ready: readiness.err(),
        shutting_down: worker.is_shutting_down(),
        stalled: liveness.err(),
        shards_finished: status.shards_finished,
        shards: worker
            .shards()
            .into_iter()
            .map(|p| Shard::of(p, now))
            .collect(),
    };
    // Plain data: serializing it cannot fail.
    serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
