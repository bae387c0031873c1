//! The lease coordinator: owns this worker's held leases and the two tasks
//! that keep them, the lease taker and the lease renewer.
//!
//! A held lease is exposed as a [`LeaseHandle`]. Its consumer must check
//! [`LeaseHandle::is_valid`] before each fetch and each checkpoint, and stop
//! when [`LeaseHandle::ended`] completes: that happens when a renewal fails
//! its condition (another worker owns the lease), when renewals have failed
//! for so long that peers may soon judge the lease expired (self-fencing,
//! invariant 4), on release, and on shutdown.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

use crate::config::LeaseConfig;
use crate::lease::Lease;
use crate::store::{LeaseStore, StoreError};
use crate::{renewer, taker};

/// Why this worker stopped holding a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndReason {
    /// A renewal failed its condition: another worker owns the lease now.
    Lost,
    /// Renewals kept failing until peers could soon judge the lease expired;
    /// the worker stopped using it first.
    Fenced,
    /// This worker released the lease (graceful shutdown or hand-back).
    Released,
    /// This worker handed the lease to the worker that asked for it, after
    /// its processor had the chance to checkpoint.
    HandedOff,
    /// The coordinator shut down without releasing (the lease will expire).
    Abandoned,
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndReason::Lost => "lost",
            EndReason::Fenced => "fenced",
            EndReason::Released => "released",
            EndReason::HandedOff => "handed_off",
            EndReason::Abandoned => "abandoned",
        })
    }
}

/// A change to the set of leases this worker holds.
#[derive(Debug)]
#[non_exhaustive]
pub enum LeaseEvent {
    /// This worker now holds a lease; start consuming its shard.
    Acquired(LeaseHandle),
    /// This worker no longer holds a lease; its handle's `ended` completed.
    Ended {
        /// The lease key.
        key: String,
        /// Why.
        reason: EndReason,
    },
}

/// Where a held lease stands in a graceful handoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Ours to process.
    Active,
    /// We asked `from` to hand the lease over: we own and renew it in the
    /// table, but do not process until `from` completes the handoff (its
    /// processor checkpoints first) or until `force_at`.
    Awaiting {
        /// The previous owner, still the checkpoint owner.
        from: String,
        /// When the handoff is forced if `from` has not completed it.
        force_at: Instant,
    },
    /// Another worker asked for the lease: stop fetching, let the processor
    /// checkpoint, then complete the handoff.
    HandingOff,
}

#[derive(Debug)]
struct HeldInner {
    lease: Lease,
    valid_until: Instant,
    ended: Option<EndReason>,
    phase: Phase,
    /// When we first sent a write expecting the current counter. A later
    /// write that the store reconciles as applied may in fact be that first
    /// one, landed late: validity counts from here, never from the retry.
    first_write: Option<(u64, Instant)>,
}

/// The shared state behind a [`LeaseHandle`].
#[derive(Debug)]
pub(crate) struct Held {
    inner: Mutex<HeldInner>,
    ended: CancellationToken,
    handoff: CancellationToken,
    /// Serialises this lease's writes (renewal, handoff progress, force).
    pub(crate) writing: tokio::sync::Mutex<()>,
}

impl Held {
    fn new(lease: Lease, valid_until: Instant, phase: Phase) -> Self {
        Held {
            inner: Mutex::new(HeldInner {
                lease,
                valid_until,
                ended: None,
                phase,
                first_write: None,
            }),
            ended: CancellationToken::new(),
            handoff: CancellationToken::new(),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HeldInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn phase(&self) -> Phase {
        self.lock().phase.clone()
    }

    /// The send time to count validity from for a write expecting
    /// `counter`, sent now: the first such write's, if there was one.
    pub(crate) fn write_base(&self, counter: u64, now: Instant) -> Instant {
        let mut inner = self.lock();
        match inner.first_write {
            Some((c, at)) if c == counter => at,
            _ => {
                inner.first_write = Some((counter, now));
                now
            }
        }
    }

    /// Adopts the table's view of a lease that is still ours (a counter
    /// moved by a handoff step) without extending validity.
    pub(crate) fn adopt(&self, lease: Lease) {
        let mut inner = self.lock();
        if inner.ended.is_none() {
            inner.lease = lease;
        }
    }

    /// Another worker asked for this lease; returns false if the lease
    /// already ended or was already handing off.
    pub(crate) fn request_handoff(&self) -> bool {
        let mut inner = self.lock();
        if inner.ended.is_some() || inner.phase == Phase::HandingOff {
            return false;
        }
        inner.phase = Phase::HandingOff;
        drop(inner);
        self.handoff.cancel();
        true
    }

    fn activate(&self) {
        self.lock().phase = Phase::Active;
    }

    /// The lease as last written by this worker.
    pub(crate) fn lease(&self) -> Lease {
        self.lock().lease.clone()
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.lock().valid_until
    }

    /// Records a successful write sent at `sent`: peers saw the counter
    /// change no earlier than `sent`, so they cannot judge the lease expired
    /// before `sent + lease_duration`; this worker stops `fence_margin`
    /// before that.
    pub(crate) fn renewed(&self, lease: Lease, sent: Instant, config: &LeaseConfig) {
        let mut inner = self.lock();
        if inner.ended.is_none() {
            inner.lease = lease;
            inner.valid_until = sent + config.lease_duration - config.fence_margin;
        }
    }

    /// Marks the lease ended; returns false if it already was.
    pub(crate) fn end(&self, reason: EndReason) -> bool {
        let first = {
            let mut inner = self.lock();
            let first = inner.ended.is_none();
            if first {
                inner.ended = Some(reason);
            }
            first
        };
        self.ended.cancel();
        first
    }
}

/// A lease this worker holds, given to the shard's consumer.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    key: String,
    held: Arc<Held>,
}

impl LeaseHandle {
    /// The lease key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease as this worker last wrote it (owner, counter, checkpoint
    /// at acquisition).
    pub fn lease(&self) -> Lease {
        self.held.lease()
    }

    /// True while this worker may fetch and process the shard: the lease
    /// has not ended, no other worker asked for it, and the last successful
    /// renewal is recent enough that no peer can have judged it expired
    /// (invariant 4).
    pub fn is_valid(&self) -> bool {
        let inner = self.held.lock();
        inner.ended.is_none() && inner.phase == Phase::Active && Instant::now() < inner.valid_until
    }

    /// True while this worker may still checkpoint: as [`Self::is_valid`],
    /// and also while handing the lease off (the previous owner
    /// checkpoints before it lets go).
    pub fn may_checkpoint(&self) -> bool {
        let inner = self.held.lock();
        inner.ended.is_none()
            && !matches!(inner.phase, Phase::Awaiting { .. })
            && Instant::now() < inner.valid_until
    }

    /// Completes when another worker asks for this lease: stop fetching,
    /// let the processor checkpoint, then complete the handoff.
    pub fn handoff_requested(&self) -> WaitForCancellationFutureOwned {
        self.held.handoff.clone().cancelled_owned()
    }

    /// The instant this worker fences itself unless a renewal succeeds.
    pub fn valid_until(&self) -> Instant {
        self.held.valid_until()
    }

    /// Why the lease ended, once it has.
    pub fn end_reason(&self) -> Option<EndReason> {
        self.held.lock().ended
    }

    /// Completes when the lease ends for any [`EndReason`].
    pub fn ended(&self) -> WaitForCancellationFutureOwned {
        self.held.ended.clone().cancelled_owned()
    }

    /// A handle not backed by a coordinator, valid for `valid_for` from now
    /// or until [`LeaseHandle::end_for_test`], for testing readers and
    /// consumers in isolation.
    #[cfg(any(test, feature = "test-util"))]
    pub fn detached(lease: Lease, valid_for: std::time::Duration) -> Self {
        LeaseHandle {
            key: lease.key.clone(),
            held: Arc::new(Held::new(lease, Instant::now() + valid_for, Phase::Active)),
        }
    }

    /// Ends a [`LeaseHandle::detached`] handle as the coordinator would.
    #[cfg(any(test, feature = "test-util"))]
    pub fn end_for_test(&self, reason: EndReason) {
        self.held.end(reason);
    }

    /// Asks a [`LeaseHandle::detached`] handle to hand off, as the
    /// coordinator would when another worker steals it.
    #[cfg(any(test, feature = "test-util"))]
    pub fn request_handoff_for_test(&self) {
        self.held.request_handoff();
    }
}

/// Counters of the coordinator's work, for tests, benchmarks and logs.
#[derive(Debug, Default)]
pub struct CoordinatorStats {
    pub(crate) ticks: AtomicU64,
    pub(crate) scan_failures: AtomicU64,
    pub(crate) taken: AtomicU64,
    pub(crate) stolen: AtomicU64,
    pub(crate) handoffs_completed: AtomicU64,
    pub(crate) handoffs_forced: AtomicU64,
    pub(crate) handed_off: AtomicU64,
    pub(crate) reclaimed: AtomicU64,
    pub(crate) take_conflicts: AtomicU64,
    pub(crate) take_failures: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) renew_failures: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) fenced: AtomicU64,
    pub(crate) released: AtomicU64,
}

/// A copy of [`CoordinatorStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct StatsSnapshot {
    pub ticks: u64,
    pub scan_failures: u64,
    pub taken: u64,
    pub stolen: u64,
    pub handoffs_completed: u64,
    pub handoffs_forced: u64,
    pub handed_off: u64,
    pub reclaimed: u64,
    pub take_conflicts: u64,
    pub take_failures: u64,
    pub renewals: u64,
    pub renew_failures: u64,
    pub lost: u64,
    pub fenced: u64,
    pub released: u64,
}

impl CoordinatorStats {
    /// Copies the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            ticks: l(&self.ticks),
            scan_failures: l(&self.scan_failures),
            taken: l(&self.taken),
            stolen: l(&self.stolen),
            handoffs_completed: l(&self.handoffs_completed),
            handoffs_forced: l(&self.handoffs_forced),
            handed_off: l(&self.handed_off),
            reclaimed: l(&self.reclaimed),
            take_conflicts: l(&self.take_conflicts),
            take_failures: l(&self.take_failures),
            renewals: l(&self.renewals),
            renew_failures: l(&self.renew_failures),
            lost: l(&self.lost),
            fenced: l(&self.fenced),
            released: l(&self.released),
        }
    }
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Decides which leases of the table this worker competes for (a
/// multi-stream worker ignores leases of streams it was not configured for).
pub type LeaseFilter = Arc<dyn Fn(&Lease) -> bool + Send + Sync>;

/// State shared by the coordinator and its tasks.
pub(crate) struct Shared {
    pub(crate) config: LeaseConfig,
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) filter: Option<LeaseFilter>,
    held: Mutex<HashMap<String, Arc<Held>>>,
    events: mpsc::Sender<LeaseEvent>,
    pub(crate) stats: Arc<CoordinatorStats>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("store", &self.store)
            .field("filtered", &self.filter.is_some())
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// True if this worker competes for `lease`.
    pub(crate) fn accepts(&self, lease: &Lease) -> bool {
        self.filter.as_ref().is_none_or(|f| f(lease))
    }

    fn held_map(&self) -> MutexGuard<'_, HashMap<String, Arc<Held>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_held(&self, key: &str) -> bool {
        self.held_map().contains_key(key)
    }

    pub(crate) fn held_snapshot(&self) -> Vec<(String, Arc<Held>)> {
        self.held_map()
            .iter()
            .map(|(k, h)| (k.clone(), Arc::clone(h)))
            .collect()
    }

    /// Starts holding `lease`, written at `sent`; tells the worker.
    /// Starts holding `lease`. `sent` must be no later than any write of
    /// ours that could have produced the lease's current state: a write the
    /// store reconciled as applied (its response lost) may have landed
    /// before this call, so takes count from the scan that read the lease.
    pub(crate) async fn acquired(&self, lease: Lease, sent: Instant) {
        let key = lease.key.clone();
        let valid_until = sent + self.config.lease_duration - self.config.fence_margin;
        let held = Arc::new(Held::new(lease, valid_until, Phase::Active));
        let previous = self.held_map().insert(key.clone(), Arc::clone(&held));
        if let Some(previous) = previous {
            // A re-take replaced an entry whose loss the renewer had not
            // noticed yet: that loss still counts.
            self.replaced(&previous);
        }
        metrics::gauge!("kcl_leases_held", "worker" => self.config.worker_id.clone())
            .set(self.held_map().len() as f64);
        // The worker may have stopped listening (shutdown); holding the lease
        // is still right until it is released or expires.
        let _ = self
            .events
            .send(LeaseEvent::Acquired(LeaseHandle { key, held }))
            .await;
    }

    fn replaced(&self, previous: &Held) {
        if previous.end(EndReason::Lost) {
            bump(&self.stats.lost);
            metrics::counter!("kcl_leases_ended_total", "reason" => EndReason::Lost.to_string(), "worker" => self.config.worker_id.clone())
                .increment(1);
        }
    }

    /// Starts waiting for `from` to hand over a lease we now own in the
    /// table (a steal, or a reclaim found mid-handoff). No consumer starts
    /// until [`Shared::activate`].
    /// `valid_from` is no later than the moment the lease was last seen
    /// unchanged before our write (see [`Shared::acquired`]); `sent` is when
    /// our handoff write was sent.
    pub(crate) fn awaiting(&self, lease: Lease, from: String, valid_from: Instant, sent: Instant) {
        let key = lease.key.clone();
        let valid_until = valid_from + self.config.lease_duration - self.config.fence_margin;
        // Forcing no earlier than a lease duration after our write means the
        // previous owner's own validity (from a renewal that landed before
        // our write) has run out by then: no two workers process at once.
        let force_at = sent + self.config.handoff_timeout;
        let held = Arc::new(Held::new(
            lease,
            valid_until,
            Phase::Awaiting { from, force_at },
        ));
        if let Some(previous) = self.held_map().insert(key, held) {
            self.replaced(&previous);
        }
        // Held in the table (and renewed) while awaiting: counted as held.
        metrics::gauge!("kcl_leases_held", "worker" => self.config.worker_id.clone())
            .set(self.held_map().len() as f64);
    }

    /// The previous owner completed the handoff (or it was forced): start
    /// consuming.
    pub(crate) async fn activate(&self, key: &str, held: &Arc<Held>, lease: Lease, sent: Instant) {
        held.renewed(lease, sent, &self.config);
        held.activate();
        let _ = self
            .events
            .send(LeaseEvent::Acquired(LeaseHandle {
                key: key.to_owned(),
                held: Arc::clone(held),
            }))
            .await;
    }

    /// Stops holding `key` if `held` is still its entry; tells the worker.
    pub(crate) async fn ended(&self, key: &str, held: &Arc<Held>, reason: EndReason) {
        {
            let mut map = self.held_map();
            if map.get(key).is_some_and(|h| Arc::ptr_eq(h, held)) {
                map.remove(key);
            }
            metrics::gauge!("kcl_leases_held", "worker" => self.config.worker_id.clone())
                .set(map.len() as f64);
        }
        if held.end(reason) {
            let counter = match reason {
                EndReason::Lost => &self.stats.lost,
                EndReason::Fenced => &self.stats.fenced,
                EndReason::Released => &self.stats.released,
                EndReason::HandedOff => &self.stats.handed_off,
                EndReason::Abandoned => return,
            };
            bump(counter);
            metrics::counter!(
                "kcl_leases_ended_total",
                "worker" => self.config.worker_id.clone(),
                "reason" => reason.to_string()
            )
            .increment(1);
            // Never wait here: the renewer calls this, and a worker slow to
            // read events must not delay renewals. The handle already told
            // the consumer; the event is for bookkeeping.
            let _ = self.events.try_send(LeaseEvent::Ended {
                key: key.to_owned(),
                reason,
            });
        }
    }
}

impl Drop for LeaseCoordinator {
    fn drop(&mut self) {
        self.taker_stop.cancel();
        self.renewer_stop.cancel();
    }
}

/// How [`LeaseCoordinator::shutdown`] leaves the leases still held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Release each lease in the table so peers take it on their next tick.
    Release,
    /// Leave the leases to expire (as a crashed worker would).
    Abandon,
}

/// Releases in flight at once during a graceful shutdown.
const RELEASE_CONCURRENCY: usize = 16;

/// Capacity of the event channel; the taker waits when the worker falls
/// this far behind, instead of queueing without bound.
const EVENT_CAPACITY: usize = 1024;

/// Runs the lease taker and renewer of one worker.
///
/// Dropping it without [`LeaseCoordinator::shutdown`] stops both tasks and
/// leaves the leases to expire, as a crash would.
#[derive(Debug)]
pub struct LeaseCoordinator {
    shared: Arc<Shared>,
    taker_stop: CancellationToken,
    renewer_stop: CancellationToken,
    tasks: TaskTracker,
}

impl LeaseCoordinator {
    /// Starts the taker (its first tick runs at once) and the renewer.
    /// Lease changes arrive on the returned receiver.
    pub fn start(
        store: Arc<dyn LeaseStore>,
        config: LeaseConfig,
    ) -> (LeaseCoordinator, mpsc::Receiver<LeaseEvent>) {
        Self::start_filtered(store, config, None)
    }

    /// Like [`LeaseCoordinator::start`], competing only for the leases
    /// `filter` accepts.
    pub fn start_filtered(
        store: Arc<dyn LeaseStore>,
        config: LeaseConfig,
        filter: Option<LeaseFilter>,
    ) -> (LeaseCoordinator, mpsc::Receiver<LeaseEvent>) {
        let (events, rx) = mpsc::channel(EVENT_CAPACITY);
        let shared = Arc::new(Shared {
            config,
            store,
            filter,
            held: Mutex::default(),
            events,
            stats: Arc::default(),
        });
        let taker_stop = CancellationToken::new();
        let renewer_stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let span = info_span!("lease_coordinator", worker = %shared.config.worker_id);
        tasks.spawn(taker::run(Arc::clone(&shared), taker_stop.clone()).instrument(span.clone()));
        tasks.spawn(renewer::run(Arc::clone(&shared), renewer_stop.clone()).instrument(span));
        tasks.close();
        (
            LeaseCoordinator {
                shared,
                taker_stop,
                renewer_stop,
                tasks,
            },
            rx,
        )
    }

    /// This worker's id.
    pub fn worker_id(&self) -> &str {
        &self.shared.config.worker_id
    }

    /// The keys of the leases held right now.
    pub fn held_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.shared.held_map().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// The handle of a held lease.
    pub fn handle(&self, key: &str) -> Option<LeaseHandle> {
        self.shared.held_map().get(key).map(|h| LeaseHandle {
            key: key.to_owned(),
            held: Arc::clone(h),
        })
    }

    /// The coordinator's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The live counters, for readers that outlive a call (status probes).
    pub fn stats_source(&self) -> Arc<CoordinatorStats> {
        Arc::clone(&self.shared.stats)
    }

    /// Stops taking and stealing leases; held leases stay renewed.
    pub fn stop_taking(&self) {
        self.taker_stop.cancel();
    }

    /// The entry `lease` belongs to, if it is still the current one: a
    /// consumer of an earlier tenure of the same lease must not end a later
    /// one.
    fn tenure(&self, lease: &LeaseHandle) -> Option<Arc<Held>> {
        self.shared
            .held_map()
            .get(lease.key())
            .filter(|h| Arc::ptr_eq(h, &lease.held))
            .cloned()
    }

    /// Releases a held lease in the table so that another worker takes it.
    /// Returns false if this worker did not hold it.
    pub async fn release(&self, lease: &LeaseHandle) -> Result<bool, StoreError> {
        let key = lease.key();
        let Some(held) = self.tenure(lease) else {
            return Ok(false);
        };
        // Another worker asked for it: hand it to that worker instead.
        if held.phase() == Phase::HandingOff {
            return Box::pin(self.complete_handoff(lease)).await;
        }
        // End the handle first: the consumer must stop before the lease is
        // visible as free to peers.
        self.shared.ended(key, &held, EndReason::Released).await;
        match self
            .shared
            .store
            .release(key, &self.shared.config.worker_id)
            .await
        {
            Ok(_) => Ok(true),
            // Someone else owns it already: nothing left to release.
            Err(e) if e.is_condition_failed() => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Lets handoffs this worker asked for finish before it releases them
    /// (bounded by the lease duration): released mid-handoff, a lease stays
    /// unavailable to peers until its previous owner finishes draining,
    /// while released after, peers take it on their next tick.
    async fn settle_handoffs(&self) {
        let deadline = Instant::now() + self.shared.config.lease_duration;
        while Instant::now() < deadline
            && self
                .shared
                .held_snapshot()
                .iter()
                .any(|(_, h)| matches!(h.phase(), Phase::Awaiting { .. }))
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Completes the handoff of a lease another worker asked for, once its
    /// processor had the chance to checkpoint. Returns false if this worker
    /// was not handing it off.
    pub async fn complete_handoff(&self, lease: &LeaseHandle) -> Result<bool, StoreError> {
        let key = lease.key();
        let Some(held) = self.tenure(lease) else {
            return Ok(false);
        };
        if held.phase() != Phase::HandingOff {
            return Ok(false);
        }
        self.shared.ended(key, &held, EndReason::HandedOff).await;
        match self
            .shared
            .store
            .complete_handoff(key, &self.shared.config.worker_id)
            .await
        {
            Ok(_) => Ok(true),
            // Forced or taken already: the new owner has it either way.
            Err(e) if e.is_condition_failed() => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Stops both tasks and waits for them; held leases are released or
    /// abandoned as `mode` says.
    pub async fn shutdown(self, mode: ShutdownMode) {
        self.taker_stop.cancel();
        if mode == ShutdownMode::Release {
            self.settle_handoffs().await;
        }
        self.renewer_stop.cancel();
        self.tasks.wait().await;
        let shared = &self.shared;
        futures::stream::iter(shared.held_snapshot())
            .for_each_concurrent(RELEASE_CONCURRENCY, |(key, held)| async move {
                match mode {
                    ShutdownMode::Abandon => shared.ended(&key, &held, EndReason::Abandoned).await,
                    ShutdownMode::Release if held.phase() == Phase::HandingOff => {
                        shared.ended(&key, &held, EndReason::HandedOff).await;
                        if let Err(e) = shared.store.complete_handoff(&key, &shared.config.worker_id).await
                            && !e.is_condition_failed()
                        {
                            warn!(lease = %key, error = %e, "completing a handoff at shutdown failed; it will be forced");
                        }
                    }
                    ShutdownMode::Release => {
                        // The consumer stops before peers can see the lease free.
                        shared.ended(&key, &held, EndReason::Released).await;
                        match shared.store.release(&key, &shared.config.worker_id).await {
                            Ok(_) => {}
                            Err(e) if e.is_condition_failed() => {}
                            Err(e) => warn!(lease = %key, error = %e,
                                "release at shutdown failed; the lease will expire instead"),
                        }
                    }
                }
            })
            .await;
        info!(mode = ?mode, "lease coordinator stopped");
    }
}
