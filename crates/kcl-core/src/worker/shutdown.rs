//! A worker's graceful shutdown: the drain of its consumers, the release
//! of its leases, and the report of what it did, for
//! [`WorkerHandle::shutdown_and_wait`](super::WorkerHandle::shutdown_and_wait).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::ended::Ended;
use super::{Session, Worker};
use crate::consumer::ConsumerExit;
use crate::leases::{LetGo, ShutdownMode};
use crate::store::StoreError;

/// How long consumers whose processor calls were cut at the shutdown
/// timeout get to write the positions their processors asked for and to
/// tell them `lease_lost`, before they are stopped where they are.
pub(crate) const CUT_GRACE: Duration = Duration::from_secs(2);

/// What a worker's shutdown did with its shards and leases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Shards whose processors finished within the shutdown timeout
    /// (`shutdown_requested` called, lanes drained; or the shard ended or
    /// was given back): the next owner resumes where they checkpointed.
    /// Each shard counts once, in this field or one of the next two, by
    /// the consumer of its current tenure (not by an older consumer whose
    /// call outlived its tenure).
    pub drained: usize,
    /// Shards whose processors were still running at the shutdown timeout,
    /// or panicked while draining, and were stopped: the call under way is
    /// cancelled, the position the processor asked for before is written,
    /// and it is told `lease_lost` (within a grace of 2 s, after which the
    /// shard is stopped where it is). Records past that position are
    /// delivered again to the next owner.
    pub cut_off: usize,
    /// Shards whose lease ended under them while draining (taken by a
    /// peer, or a checkpoint refused): their processors were told
    /// `lease_lost`, and the next owner resumes from the last checkpoint.
    pub lost: usize,
    /// Leases released in the table, for peers to take at once: each as
    /// its shard's consumer finished, the rest after the drain.
    pub released: usize,
    /// Handoffs completed to the worker that asked for the lease.
    pub handed_off: usize,
    /// Releases the table refused or did not answer: those leases expire
    /// instead (a lease duration later).
    pub release_failures: usize,
    /// False if the worker stopped with an error rather than a graceful
    /// shutdown. The counts are then zero, but for a task that failed
    /// ([`WorkerError::TaskFailed`](super::WorkerError::TaskFailed)): its
    /// worker still drained and released, and counts what it did.
    pub graceful: bool,
}

/// Where the worker publishes its report, once, for every handle. While
/// a wrapper holds it back ([`Stopped::hold`]), what the worker publishes
/// waits for the last hold to drop.
#[derive(Debug, Clone)]
pub(crate) struct Stopped(Arc<Published>);

#[derive(Debug)]
struct Published {
    report: watch::Sender<Option<ShutdownReport>>,
    held: std::sync::Mutex<Held>,
}

/// The holds on a report, and the report they hold back.
#[derive(Debug, Default)]
struct Held {
    holds: usize,
    pending: Option<ShutdownReport>,
}

impl Default for Stopped {
    fn default() -> Self {
        Stopped(Arc::new(Published {
            report: watch::channel(None).0,
            held: std::sync::Mutex::default(),
        }))
    }
}

impl Stopped {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn publish(&self, report: ShutdownReport) {
        let mut held = self.held();
        if held.holds > 0 {
            held.pending = Some(report);
        } else {
            self.0.report.send_replace(Some(report));
        }
    }

    /// Publishes `report` unless a report was published already.
    pub(crate) fn publish_unless_published(&self, report: ShutdownReport) {
        let mut held = self.held();
        if held.holds > 0 {
            if held.pending.is_none() && self.0.report.borrow().is_none() {
                held.pending = Some(report);
            }
            return;
        }
        self.0.report.send_if_modified(|published| {
            let first = published.is_none();
            if first {
                *published = Some(report);
            }
            first
        });
    }

    /// Holds back what the worker publishes until the hold drops.
    pub(crate) fn hold(&self) -> ReportHold {
        self.held().holds += 1;
        ReportHold(self.clone())
    }

    /// The report, once the worker stopped.
    pub(crate) async fn wait(&self) -> ShutdownReport {
        let mut rx = self.0.report.subscribe();
        loop {
            if let Some(report) = *rx.borrow_and_update() {
                return report;
            }
            // The sender lives as long as any handle, this one included.
            if rx.changed().await.is_err() {
                return ShutdownReport::default();
            }
        }
    }
}

/// Holds back a worker's shutdown report (see
/// [`WorkerHandle::hold_report`](super::WorkerHandle::hold_report)) until
/// dropped.
#[derive(Debug)]
#[doc(hidden)]
#[must_use = "the report is held back only while this lives"]
pub struct ReportHold(Stopped);

impl Drop for ReportHold {
    /// The last hold publishes what was held back, or, if nothing was
    /// published at all (the wrapper's run was dropped before the worker
    /// ran), the default report (graceful false), so no waiter waits for
    /// good.
    fn drop(&mut self) {
        let mut held = self.0.held();
        held.holds -= 1;
        if held.holds > 0 {
            return;
        }
        let report = held.pending.take().or_else(|| {
            self.0
                .0
                .report
                .borrow()
                .is_none()
                .then(ShutdownReport::default)
        });
        if let Some(report) = report {
            self.0.0.report.send_replace(Some(report));
        }
    }
}

/// Publishes the default report (graceful false) as it drops, unless a
/// report was published already: a run dropped before its end.
pub(crate) struct PublishOnDrop(pub(crate) Stopped);

impl Drop for PublishOnDrop {
    fn drop(&mut self) {
        self.0.publish_unless_published(ShutdownReport::default());
    }
}

impl ShutdownReport {
    /// Counts a consumer that ended during the drain, unless its shard
    /// was counted (in `counted`) or a newer tenure's consumer counts it.
    fn count_end(&mut self, ended: &Ended, counted: &mut HashSet<String>) {
        if ended.superseded || !counted.insert(ended.key.clone()) {
            return;
        }
        match ended.exit {
            _ if ended.lost => self.lost += 1,
            Some(ConsumerExit::LeaseLost) => self.lost += 1,
            None | Some(ConsumerExit::CutOff) => self.cut_off += 1,
            Some(_) => self.drained += 1,
        }
    }

    /// Counts what became of a lease as its consumer ended.
    fn count_let_go(&mut self, let_go: &Result<LetGo, StoreError>) {
        match let_go {
            Ok(LetGo::Released) => self.released += 1,
            Ok(LetGo::HandedOff) => self.handed_off += 1,
            Ok(LetGo::NotHeld) => {}
            Err(_) => self.release_failures += 1,
        }
    }
}

impl Worker {
    /// Waits for the stopped consumers until the shutdown timeout, then
    /// cuts the processor calls still under way and waits [`CUT_GRACE`]
    /// for those consumers to end, then stops the rest where they are; the
    /// report of the shutdown so far. Each lease is let go as its last
    /// consumer ends (see [`super::ended::Deferred`]), beside the others:
    /// a slow table delays no cut.
    pub(super) async fn drain(&self, s: &mut Session) -> ShutdownReport {
        let mut report = ShutdownReport {
            graceful: true,
            ..ShutdownReport::default()
        };
        let coordinator = &s.coordinator;
        let mut settling = FuturesUnordered::new();
        let deadline = tokio::time::sleep(self.config.shutdown_timeout);
        tokio::pin!(deadline);
        let mut cut = false;
        // Each shard counts once: an older tenure's consumer may end after
        // the newer one.
        let mut counted = HashSet::new();
        while !(s.consumers.is_empty() && settling.is_empty()) {
            tokio::select! {
                Some(done) = s.consumers.join_next_with_id() => {
                    let ended = self.consumer_ended(coordinator, &mut s.running, &mut s.deferred, done);
                    if let Some(ended) = ended {
                        report.count_end(&ended, &mut counted);
                        settling.extend(ended.due.into_iter().map(|due| self.settle(coordinator, due)));
                    }
                }
                Some(let_go) = settling.next() => report.count_let_go(&let_go),
                () = &mut deadline, if !s.consumers.is_empty() => {
                    if cut {
                        // Counted once per shard: an older tenure's
                        // consumer may still run beside its lease's newer
                        // one, or after the newer one ended.
                        let stopped = s.running.current_keys(coordinator);
                        report.cut_off += stopped.iter().filter(|k| !counted.contains(**k)).count();
                        warn!(remaining = s.consumers.len(), "consumers did not end within the grace after the cut; stopping them");
                        s.consumers.shutdown().await;
                    } else {
                        warn!(remaining = s.consumers.len(), "processors did not finish within the shutdown timeout; cutting their calls");
                        s.cut.cancel();
                        cut = true;
                        deadline.as_mut().reset(tokio::time::Instant::now() + CUT_GRACE);
                    }
                }
                // Keep the event channel flowing so no coordinator task waits on it.
                Some(_) = s.events.recv() => {}
            }
        }
        report
    }

    /// Releases every lease still held (or hands it off), and marks the
    /// worker stopped.
    pub(super) async fn release_all(&self, s: Session, report: &mut ShutdownReport) {
        let Session {
            coordinator,
            mut events,
            running,
            deferred,
            consumers,
            ..
        } = s;
        // The last lease handles of this side: the coordinator releases a
        // lease only once no handle of it is left (a consumer stopped where
        // it was at the grace's end may have left lane tasks behind that
        // still hold one).
        drop((running, deferred, consumers));
        // Read until the coordinator is shut down: a taker pass under way
        // reports each take (the shutdown releases them all), and with the
        // channel full it waited for good, and so did the shutdown.
        let shutdown = coordinator.shutdown(ShutdownMode::Release);
        tokio::pin!(shutdown);
        let released = loop {
            tokio::select! {
                released = &mut shutdown => break released,
                Some(_) = events.recv() => {}
            }
        };
        report.released += released.released;
        report.handed_off += released.handed_off;
        report.release_failures += released.failed;
        self.handle.update(|s| s.ready = false);
        self.handle
            .consuming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        info!(?report, "worker stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(drained: usize) -> ShutdownReport {
        ShutdownReport {
            drained,
            graceful: true,
            ..ShutdownReport::default()
        }
    }

    /// What the worker publishes under a hold reaches the waiters once the
    /// last hold drops, the first of two unless-published reports winning.
    #[tokio::test]
    async fn a_held_report_reaches_its_waiters_when_the_last_hold_drops() {
        let stopped = Stopped::default();
        let (first, second) = (stopped.hold(), stopped.hold());
        stopped.publish_unless_published(report(1));
        stopped.publish_unless_published(report(2));
        drop(first);
        assert_eq!(*stopped.0.report.borrow(), None, "still held");
        drop(second);
        assert_eq!(stopped.wait().await, report(1));
        // Unheld, an unless-published report changes nothing.
        stopped.publish_unless_published(report(3));
        assert_eq!(stopped.wait().await, report(1));
    }
}
