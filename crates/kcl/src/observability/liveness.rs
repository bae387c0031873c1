//! When a worker is alive: its process answers, and (with a stall bound)
//! none of its shards has had work waiting without moving for longer.

use std::fmt::Write as _;
use std::time::Duration;

use kcl_core::worker::{ShardProgress, WorkerHandle};
use tokio::time::Instant;

/// The liveness check of one worker.
#[derive(Debug, Clone)]
pub(crate) struct Liveness {
    worker: WorkerHandle,
    /// `None`: alive while the process answers.
    stall_bound: Option<Duration>,
}

impl Liveness {
    pub(crate) fn new(worker: WorkerHandle, stall_bound: Option<Duration>) -> Self {
        Liveness {
            worker,
            stall_bound,
        }
    }

    /// `Ok` when alive, else which shards stall and for how long.
    pub(crate) fn check(&self) -> Result<(), String> {
        let Some(bound) = self.stall_bound else {
            return Ok(());
        };
        let stalled = self.worker.stalled(bound);
        if stalled.is_empty() {
            return Ok(());
        }
        Err(describe(&stalled, bound, Instant::now()))
    }
}

/// "2 shards made no progress for longer than 60s while work waited:
/// shardId-1 (12 records waiting, 75s), ..."
fn describe(stalled: &[ShardProgress], bound: Duration, now: Instant) -> String {
    let mut why = format!(
        "{} shard(s) made no progress for longer than {}s while work waited:",
        stalled.len(),
        bound.as_secs()
    );
    for (i, s) in stalled.iter().enumerate() {
        let idle = now.saturating_duration_since(s.still_since()).as_secs();
        let sep = if i == 0 { " " } else { ", " };
        let _ = write!(
            why,
            "{sep}{} ({} records waiting",
            s.lease_key, s.records_waiting
        );
        if let Some(ms) = s.millis_behind_latest.filter(|ms| *ms > 0) {
            let _ = write!(why, ", {ms} ms behind");
        }
        if let Some(call) = s.processor_call {
            let _ = write!(why, ", in {}", call.stage);
        }
        if s.window_full {
            let _ = write!(why, ", its lanes' window full");
        }
        let _ = write!(why, ", {idle}s)");
    }
    why
}
