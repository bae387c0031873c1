//! When a worker is ready: a pure decision over a snapshot, and the probe
//! that gathers the snapshot.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::store::metered::StoreStats;
use kcl_core::worker::WorkerHandle;
use tokio::time::Instant;

/// What one readiness check looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// The worker finished its startup checks (streams, lease table, first
    /// shard sync).
    pub(crate) ready: bool,
    /// A shutdown was asked for; the worker may still be draining.
    pub(crate) shutting_down: bool,
    /// Lease-table calls that got an answer (success or a failed
    /// condition, which is an answer too), since the worker started.
    pub(crate) answered: u64,
    /// Lease-table calls that failed (unreachable, throttled, fatal).
    pub(crate) failed: u64,
}

/// The last time the count of answered calls was seen to grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LastAnswer {
    answered: u64,
    failed: u64,
    seen_at: Instant,
}

/// Decides readiness and updates `last` with what `now`'s snapshot shows.
///
/// The store is judged by its calls' outcomes rather than by a call of the
/// probe's own: the lease taker scans the table every tick and the renewer
/// writes every renew interval, so a healthy worker always has recent
/// answers, and a probe costs nothing. A call that answered is noticed at
/// the first check after it, so the age is exact to one probe period.
pub(crate) fn judge(
    snapshot: Snapshot,
    last: &mut Option<LastAnswer>,
    now: Instant,
    window: Duration,
) -> Result<(), String> {
    if last.is_none_or(|l| snapshot.answered > l.answered) && snapshot.answered > 0 {
        *last = Some(LastAnswer {
            answered: snapshot.answered,
            failed: snapshot.failed,
            seen_at: now,
        });
    }
    if snapshot.shutting_down {
        return Err("shutting down: the worker stops taking leases and drains its shards".into());
    }
    if !snapshot.ready {
        return Err(
            "starting: the worker has not finished its startup checks (streams, lease table, \
             first shard sync)"
                .into(),
        );
    }
    match last {
        None => Err(format!(
            "the lease table has not answered any call yet ({} failed)",
            snapshot.failed
        )),
        Some(l) if now.saturating_duration_since(l.seen_at) > window => Err(format!(
            "the lease table has not answered for {}s ({} calls failed since; the limit is {}s)",
            now.saturating_duration_since(l.seen_at).as_secs(),
            snapshot.failed.saturating_sub(l.failed),
            window.as_secs()
        )),
        Some(_) => Ok(()),
    }
}

/// Gathers snapshots of one worker and remembers its last answer.
#[derive(Debug)]
pub(crate) struct Probe {
    worker: WorkerHandle,
    store: Arc<StoreStats>,
    window: Duration,
    last: Mutex<Option<LastAnswer>>,
}

impl Probe {
    /// A probe of `worker`, whose lease-table calls are counted in `store`.
    /// The store must have answered within `window` for the worker to be
    /// ready.
    pub(crate) fn new(worker: WorkerHandle, store: Arc<StoreStats>, window: Duration) -> Self {
        Probe {
            worker,
            store,
            window,
            last: Mutex::new(None),
        }
    }

    /// `Ok` when ready, else why not.
    pub(crate) fn check(&self) -> Result<(), String> {
        let status = self.worker.status();
        let stats = self.store.snapshot();
        let calls = stats.total_calls();
        let failed: u64 = stats.ops.values().map(|o| o.errors).sum();
        let snapshot = Snapshot {
            ready: status.ready,
            shutting_down: self.worker.is_shutting_down(),
            answered: calls.saturating_sub(failed),
            failed,
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let verdict = judge(snapshot, &mut last, Instant::now(), self.window);
        match (&verdict, status.starting) {
            // Startup retrying a failure: say which.
            (Err(_), Some(why)) if !status.ready && !snapshot.shutting_down => {
                Err(format!("starting: {why}"))
            }
            _ => verdict,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(30);

    fn snap(ready: bool, answered: u64, failed: u64) -> Snapshot {
        Snapshot {
            ready,
            shutting_down: false,
            answered,
            failed,
        }
    }

    #[test]
    fn the_cases() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // (snapshot, seconds after t0, expected: Ok or a word of the reason)
        let cases: &[(Snapshot, u64, Result<(), &str>)] = &[
            (snap(false, 0, 0), 0, Err("starting")),
            (snap(false, 3, 0), 1, Err("starting")),
            (snap(true, 3, 0), 2, Ok(())),
            (snap(true, 3, 1), 20, Ok(())),
            // No new answer for more than the window since the first one
            // was seen (at 1 s): not ready.
            (
                snap(true, 3, 7),
                40,
                Err("not answered for 39s (7 calls failed"),
            ),
            // A new answer: ready again.
            (snap(true, 4, 7), 41, Ok(())),
            (
                Snapshot {
                    shutting_down: true,
                    ..snap(true, 5, 7)
                },
                42,
                Err("shutting down"),
            ),
        ];
        let mut last = None;
        for (i, (snapshot, at, expected)) in cases.iter().enumerate() {
            let got = judge(*snapshot, &mut last, t0 + s(*at), WINDOW);
            match (expected, &got) {
                (Ok(()), Ok(())) => {}
                (Err(word), Err(reason)) if reason.contains(word) => {}
                _ => panic!("case {i}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn ready_worker_whose_store_never_answered() {
        let mut last = None;
        let got = judge(snap(true, 0, 4), &mut last, Instant::now(), WINDOW);
        assert_eq!(
            got,
            Err("the lease table has not answered any call yet (4 failed)".into())
        );
    }
}
