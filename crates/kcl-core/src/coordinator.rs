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
    /// The coordinator shut down without releasing (the lease will expire).
    Abandoned,
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndReason::Lost => "lost",
            EndReason::Fenced => "fenced",
            EndReason::Released => "released",
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

#[derive(Debug)]
struct HeldInner {
    lease: Lease,
    valid_until: Instant,
    ended: Option<EndReason>,
}

/// The shared state behind a [`LeaseHandle`].
#[derive(Debug)]
pub(crate) struct Held {
    inner: Mutex<HeldInner>,
    ended: CancellationToken,
}

impl Held {
    fn lock(&self) -> MutexGuard<'_, HeldInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
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

    /// True while this worker may act on the lease: it has not ended and
    /// the last successful renewal is recent enough that no peer can have
    /// judged it expired (invariant 4).
    pub fn is_valid(&self) -> bool {
        let inner = self.held.lock();
        inner.ended.is_none() && Instant::now() < inner.valid_until
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
            held: Arc::new(Held {
                inner: Mutex::new(HeldInner {
                    lease,
                    valid_until: Instant::now() + valid_for,
                    ended: None,
                }),
                ended: CancellationToken::new(),
            }),
        }
    }

    /// Ends a [`LeaseHandle::detached`] handle as the coordinator would.
    #[cfg(any(test, feature = "test-util"))]
    pub fn end_for_test(&self, reason: EndReason) {
        self.held.end(reason);
    }
}

/// Counters of the coordinator's work, for tests, benchmarks and logs.
#[derive(Debug, Default)]
pub struct CoordinatorStats {
    pub(crate) ticks: AtomicU64,
    pub(crate) scan_failures: AtomicU64,
    pub(crate) taken: AtomicU64,
    pub(crate) stolen: AtomicU64,
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

/// State shared by the coordinator and its tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: LeaseConfig,
    pub(crate) store: Arc<dyn LeaseStore>,
    held: Mutex<HashMap<String, Arc<Held>>>,
    events: mpsc::Sender<LeaseEvent>,
    pub(crate) stats: CoordinatorStats,
}

impl Shared {
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
    pub(crate) async fn acquired(&self, lease: Lease, sent: Instant) {
        let key = lease.key.clone();
        let held = Arc::new(Held {
            inner: Mutex::new(HeldInner {
                lease,
                valid_until: sent + self.config.lease_duration - self.config.fence_margin,
                ended: None,
            }),
            ended: CancellationToken::new(),
        });
        let previous = self.held_map().insert(key.clone(), Arc::clone(&held));
        if let Some(previous) = previous {
            // Only a reclaim can replace an entry, after the old one ended.
            previous.end(EndReason::Lost);
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
                EndReason::Abandoned => return,
            };
            bump(counter);
            metrics::counter!("kcl_leases_ended_total", "reason" => reason.to_string())
                .increment(1);
            let _ = self
                .events
                .send(LeaseEvent::Ended {
                    key: key.to_owned(),
                    reason,
                })
                .await;
        }
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
        let (events, rx) = mpsc::channel(EVENT_CAPACITY);
        let shared = Arc::new(Shared {
            config,
            store,
            held: Mutex::default(),
            events,
            stats: CoordinatorStats::default(),
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

    /// Stops taking and stealing leases; held leases stay renewed.
    pub fn stop_taking(&self) {
        self.taker_stop.cancel();
    }

    /// Releases a held lease in the table so that another worker takes it.
    /// Returns false if this worker did not hold it.
    pub async fn release(&self, key: &str) -> Result<bool, StoreError> {
        let Some(held) = self.shared.held_map().get(key).cloned() else {
            return Ok(false);
        };
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

    /// Stops both tasks and waits for them; held leases are released or
    /// abandoned as `mode` says.
    pub async fn shutdown(self, mode: ShutdownMode) {
        self.taker_stop.cancel();
        self.renewer_stop.cancel();
        self.tasks.wait().await;
        let shared = &self.shared;
        futures::stream::iter(shared.held_snapshot())
            .for_each_concurrent(RELEASE_CONCURRENCY, |(key, held)| async move {
                match mode {
                    ShutdownMode::Abandon => shared.ended(&key, &held, EndReason::Abandoned).await,
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
