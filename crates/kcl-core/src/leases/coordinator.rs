//! The lease coordinator: the public face of the lease engine. It starts
//! the lease taker and the lease renewer, and releases, hands off and
//! shuts down the tenures they keep.
//!
//! A held lease is exposed as a [`LeaseHandle`]. Its consumer must check
//! [`LeaseHandle::is_valid`] before each fetch and each checkpoint, and stop
//! when [`LeaseHandle::ended`] completes: that happens when the lease goes
//! to another holder, when renewals have failed for so long that peers may
//! soon judge the lease expired (self-fencing, invariant 4), on release,
//! and on shutdown.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

use crate::config::LeaseConfig;
use crate::leases::events::{CoordinatorSnapshot, CoordinatorStats, LeaseEvent};
use crate::leases::handoff::{Ours, Verdict, judge};
use crate::leases::held::{EndReason, Held, LeaseHandle, LetGo, Phase};
use crate::leases::shared::task_failed::guarded;
use crate::leases::shared::{HolderJudged, LeaseFilter, Shared, each_unblocked};
use crate::leases::{renewer, taker, watcher};
use crate::observe::Observer;
use crate::store::{LeaseStore, StoreError};

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

/// How long a coordinator dropped without a shutdown spends releasing its
/// leases, all of them together.
const DROP_RELEASE_DEADLINE: Duration = Duration::from_secs(2);

/// How long a shutdown waits for the consumers of a lease it releases to
/// let go of it (they normally have: the worker drained them).
const CONSUMER_STOP_WAIT: Duration = Duration::from_secs(2);

/// Whether no consumer of lease `key` runs, of `held`'s tenure or of an
/// older one whose call outlived it, waiting [`CONSUMER_STOP_WAIT`] at
/// most.
async fn consumers_stopped(shared: &Shared, key: &str, held: &Held) -> bool {
    let older = shared.older_tenures_running(key);
    tokio::time::timeout(CONSUMER_STOP_WAIT, async {
        held.consumer_stopped().await;
        for tenure in older {
            tenure.consumer_stopped().await;
        }
    })
    .await
    .is_ok()
}

/// Runs the lease taker and renewer of one worker.
///
/// Dropping it without [`LeaseCoordinator::shutdown`] (a panic, a runtime
/// shut down under it) stops both tasks and releases the leases still held,
/// best effort within two seconds, each release pinned to its tenure;
/// [`LeaseConfig`]'s `release_on_drop(false)` leaves them to expire
/// instead, as a crash would.
#[derive(Debug)]
pub struct LeaseCoordinator {
    shared: Arc<Shared>,
    taker_stop: CancellationToken,
    renewer_stop: CancellationToken,
    tasks: TaskTracker,
    /// Leases held when taking stopped: a worker releases them as its
    /// shards drain, and its shutdown then wakes that many peers.
    held_when_stopped: AtomicUsize,
}

impl LeaseCoordinator {
    /// Starts the taker (its first tick runs at once) and the renewer.
    /// Lease changes arrive on the returned receiver.
    pub fn start(
        store: Arc<dyn LeaseStore>,
        config: LeaseConfig,
    ) -> (LeaseCoordinator, mpsc::Receiver<LeaseEvent>) {
        Self::start_filtered(store, config, None, None)
    }

    /// Like [`LeaseCoordinator::start`], competing only for the leases
    /// `filter` accepts, and telling `observer` of every lease event (see
    /// [`crate::observe`]) besides counting it and emitting its metric.
    pub fn start_filtered(
        store: Arc<dyn LeaseStore>,
        config: LeaseConfig,
        filter: Option<LeaseFilter>,
        observer: Option<Arc<dyn Observer>>,
    ) -> (LeaseCoordinator, mpsc::Receiver<LeaseEvent>) {
        let (events, rx) = mpsc::channel(EVENT_CAPACITY);
        let shared = Arc::new(Shared::new(config, store, filter, events, observer));
        let taker_stop = CancellationToken::new();
        let renewer_stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let span = info_span!("lease_coordinator", worker = %shared.config.worker_id);
        let task = |name: &'static str, work| {
            let shared = Arc::clone(&shared);
            async move { guarded(&shared.task_failed, name, work).await }.instrument(span.clone())
        };
        tasks.spawn(task(
            "lease taker",
            taker::run(Arc::clone(&shared), taker_stop.clone()).boxed(),
        ));
        // The watcher stops with the taker: nothing else judges from its reads.
        tasks.spawn(task(
            "liveness watcher",
            watcher::run(Arc::clone(&shared), taker_stop.clone()).boxed(),
        ));
        tasks.spawn(task(
            "lease renewer",
            renewer::run(Arc::clone(&shared), renewer_stop.clone()).boxed(),
        ));
        tasks.close();
        (
            LeaseCoordinator {
                shared,
                taker_stop,
                renewer_stop,
                tasks,
                held_when_stopped: AtomicUsize::new(0),
            },
            rx,
        )
    }

    /// Completes with the task's name once one of the worker's own tasks
    /// (the lease taker, the liveness watcher, the renewer, or one run with
    /// [`FleetSignals::guard`]) ended in a panic: the worker cannot go on
    /// as it should, and stops.
    pub async fn task_failed(&self) -> &'static str {
        self.shared.task_failed.wait().await
    }

    /// This worker's id.
    pub fn worker_id(&self) -> &str {
        &self.shared.config.worker_id
    }

    /// The keys of the leases held right now.
    pub fn held_keys(&self) -> Vec<String> {
        self.shared.held_keys()
    }

    /// The handle of a held lease.
    pub fn handle(&self, key: &str) -> Option<LeaseHandle> {
        self.shared
            .held(key)
            .map(|held| LeaseHandle::new(key.to_owned(), held))
    }

    /// The coordinator's counters.
    pub fn stats(&self) -> CoordinatorSnapshot {
        self.shared.stats.snapshot()
    }

    /// The live counters, for readers that outlive a call (status probes).
    pub fn stats_source(&self) -> Arc<CoordinatorStats> {
        Arc::clone(&self.shared.stats)
    }

    /// What the worker's shard sync needs from the lease engine (see
    /// [`FleetSignals`]).
    pub fn signals(&self) -> FleetSignals {
        FleetSignals {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops taking and stealing leases; held leases stay renewed.
    pub fn stop_taking(&self) {
        self.held_when_stopped
            .fetch_max(self.shared.held_count(), Ordering::Relaxed);
        self.taker_stop.cancel();
    }

    /// Releases a held lease in the table so that another worker takes it.
    /// Returns false if this worker did not hold that tenure, or the table
    /// showed a peer owning the lease already.
    pub async fn release(&self, lease: &LeaseHandle) -> Result<bool, StoreError> {
        self.let_go(lease).await.map(|done| done != LetGo::NotHeld)
    }

    /// Releases a held lease, or completes its handoff if another worker
    /// asked for it: which of the two it did.
    pub async fn let_go(&self, lease: &LeaseHandle) -> Result<LetGo, StoreError> {
        let key = lease.key();
        let Some(held) = self.shared.tenure_of(lease) else {
            return Ok(LetGo::NotHeld);
        };
        // Another worker asked for it: hand it to that worker instead.
        if held.phase() == Phase::HandingOff {
            return self.complete_handoff(lease).await.map(LetGo::handed_off);
        }
        // End the handle first: the consumer must stop before the lease is
        // visible as free to peers.
        self.shared.ended(key, &held, EndReason::Released).await;
        let released = self.shared.release_in_table(key, held.holder()).await;
        if released.is_err() {
            // The table may still name this tenure, and with liveness
            // records this instance's beats keep it alive for as long as
            // it runs: the taker reads the table again and reclaims it
            // (without the read, when it cannot scan) rather than leave a
            // lease held and read by nobody.
            self.shared.rescan.store(true, Ordering::Relaxed);
            if self.shared.liveness_mode() {
                self.shared.given_up().insert(key, &held);
            }
        }
        released
    }

    /// Releases a held lease whose shard this worker could not read for
    /// `limit` (`max_read_failure_time`) while the stream service answered
    /// none of its calls. With a peer that could take it (one that beats
    /// and is not stopping), this worker sits out: it takes no lease for a
    /// while and tells its peers so, so that a worker that can read takes
    /// the shard (see `Shared::sit_out` for how long). Returns what it did
    /// with the lease (see [`Self::let_go`]).
    pub async fn give_back_unreadable(
        &self,
        lease: &LeaseHandle,
        limit: Duration,
    ) -> Result<LetGo, StoreError> {
        let now = Instant::now();
        // Alone (or with every peer sitting out or stopping), nobody would
        // take the shard: sitting out would only leave it unread after
        // the route comes back. The lease is given back and taken up again
        // at the next tick, with a fresh reader.
        if self.shared.has_active_peer(now) {
            let length = self.shared.sit_out(now, limit);
            warn!(lease = %lease.key(), sit_out = ?length,
                "giving back a shard this worker cannot read, and taking no lease for a while so that a worker that can read takes it");
        } else {
            warn!(lease = %lease.key(),
                "giving back a shard this worker cannot read; no other worker is there to take it, so this one tries again");
        }
        self.let_go(lease).await
    }

    /// Releases the lease of a shard processed to SHARD_END, whose
    /// consumer created its children's leases: this worker's taker reads
    /// the table now, and peers learn it from this instance's next beat
    /// (its change counter), so the children start within a beat interval
    /// instead of at the next shard sync. Returns what it did with the
    /// lease (see [`Self::let_go`]).
    pub async fn shard_finished(&self, lease: &LeaseHandle) -> Result<LetGo, StoreError> {
        // The release (or the handoff it completes) bumps this instance's
        // change counter, which wakes peers; this worker's taker looks now.
        let released = self.let_go(lease).await;
        self.shared.want_rescan();
        released
    }

    /// Completes the handoff of a lease another worker asked for, once its
    /// processor had the chance to checkpoint. Returns false if this worker
    /// was not handing that tenure off.
    pub async fn complete_handoff(&self, lease: &LeaseHandle) -> Result<bool, StoreError> {
        let key = lease.key();
        let Some(held) = self.shared.tenure_of(lease) else {
            return Ok(false);
        };
        if held.phase() != Phase::HandingOff {
            return Ok(false);
        }
        self.shared.ended(key, &held, EndReason::HandedOff).await;
        self.shared
            .complete_in_table(key, held.holder())
            .await
            .map(|()| true)
    }

    /// The shard's consumer stopped without releasing or handing off (it
    /// found the lease invalid, or a checkpoint was rejected). A tenure
    /// nobody reads must not be renewed on (invariant 12): it ends now, as
    /// fenced if its validity lapsed, else as lost, and the taker's next
    /// scan decides again from the table (a new tenure and a new consumer
    /// if the lease is still this worker's).
    pub async fn consumer_stopped(&self, lease: &LeaseHandle) {
        // Its calls returned: a handoff its ended tenure left behind need
        // not wait for the handle to be dropped.
        lease.held.consumer_exited();
        let Some(held) = self.shared.tenure_of(lease) else {
            return;
        };
        if held.is_ended() {
            return;
        }
        let key = lease.key();
        if Instant::now() >= held.valid_until() {
            warn!(lease = %key, "the shard's consumer stopped on a lapsed lease; fencing its tenure");
            self.shared.ended(key, &held, EndReason::Fenced).await;
            return;
        }
        // A rejected checkpoint: the table says who has the lease now (one
        // read, on a rare path), which tells another process under this
        // worker's id apart from a peer.
        if let Ok(Some(item)) = self.shared.store.get(key).await {
            let phase = held.phase();
            let ours = Ours {
                holder: held.holder(),
                counter: held.counter(),
                phase: &phase,
            };
            match judge(ours, Some(&item), Instant::now()) {
                Verdict::Lost { same_id: true } => self.shared.same_id_conflict(key),
                Verdict::Lost { same_id: false } => self.shared.lost_to(Some(&item)),
                _ => {}
            }
        }
        warn!(lease = %key, "the shard's consumer stopped (its checkpoint was rejected); ending its tenure");
        self.shared.ended(key, &held, EndReason::Lost).await;
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
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops both tasks and waits for them; held leases are released or
    /// abandoned as `mode` says. Handoffs this worker was asked for are
    /// completed, including one a peer started just before the release
    /// (the release then finds the peer owning the lease).
    pub async fn shutdown(self, mode: ShutdownMode) -> Released {
        self.taker_stop.cancel();
        self.shared.beat_state().stopping = true;
        if mode == ShutdownMode::Release {
            self.settle_handoffs().await;
        }
        self.renewer_stop.cancel();
        self.tasks.wait().await;
        let shared = &self.shared;
        // It wakes as many peers as it held leases when it stopped
        // taking, those its drain released already included.
        let releasing = shared
            .held_count()
            .max(self.held_when_stopped.load(Ordering::Relaxed));
        let released = Mutex::new(Released::default());
        let released_ref = &released;
        // A lease left to expire beside a consumer still running.
        let left = AtomicBool::new(false);
        let left_ref = &left;
        each_unblocked(shared.held_snapshot(), RELEASE_CONCURRENCY, |(key, held)| async move {
            let count = |f: fn(&mut Released)| {
                f(&mut released_ref.lock().unwrap_or_else(|e| e.into_inner()));
            };
            if mode == ShutdownMode::Abandon {
                shared.ended(&key, &held, EndReason::Abandoned).await;
                return;
            }
            let handoff = held.phase() == Phase::HandingOff;
            // The consumer stops before peers can see the lease free, and a
            // checkpoint write queued for it stops retrying.
            let reason = if handoff { EndReason::HandedOff } else { EndReason::Released };
            shared.ended(&key, &held, reason).await;
            if !consumers_stopped(shared, &key, &held).await {
                // A consumer of the lease still runs (a call blocking its
                // thread, which no cancellation reaches; of this tenure or an
                // older one): freed now, a peer would process the shard
                // beside it.
                warn!(lease = %key, wait = ?CONSUMER_STOP_WAIT, "a consumer of the lease still runs; leaving the lease to expire rather than free it beside its call");
                count(|r| r.failed += 1);
                left_ref.store(true, Ordering::Relaxed);
                return;
            }
            let done = if handoff {
                let completed = shared.complete_in_table(&key, held.holder()).await;
                completed.map(|()| LetGo::HandedOff)
            } else {
                shared.release_in_table(&key, held.holder()).await
            };
            match done {
                Ok(LetGo::Released) => count(|r| r.released += 1),
                Ok(LetGo::HandedOff) => count(|r| r.handed_off += 1),
                Ok(LetGo::NotHeld) => {}
                Err(e) => {
                    count(|r| r.failed += 1);
                    warn!(lease = %key, error = %e, handoff, "letting the lease go at shutdown failed; it expires instead (or the handoff is forced)");
                }
            }
        })
        .await;
        if mode == ShutdownMode::Release {
            // A lease left to expire is judged by this instance's liveness
            // record: deleted, a peer would take the lease at once.
            let stay = left.load(Ordering::Relaxed);
            leave_the_fleet(shared, releasing, !stay).await;
        }
        info!(mode = ?mode, "lease coordinator stopped");
        released.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a coordinator's shutdown did with the leases it still held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Released {
    /// Leases released in the table, for peers to take at once.
    pub released: usize,
    /// Handoffs completed to the worker that asked for the lease.
    pub handed_off: usize,
    /// Releases or handoffs the table refused or did not answer: those
    /// leases expire (or the handoff is forced) instead.
    pub failed: usize,
}

/// The lease engine's side of the fleet-wide shard sync, shared with the
/// worker's sync loop.
#[derive(Debug, Clone)]
pub struct FleetSignals {
    shared: Arc<Shared>,
}

impl FleetSignals {
    /// The worker's task that panicked, if one did (see
    /// [`LeaseCoordinator::task_failed`]).
    pub fn failed_task(&self) -> Option<&'static str> {
        self.shared.task_failed.task()
    }

    /// Runs `work` as the worker's task `task`: a panic in it is noted for
    /// [`LeaseCoordinator::task_failed`].
    pub async fn guard(&self, task: &'static str, work: impl Future<Output = ()>) {
        guarded(&self.shared.task_failed, task, work).await;
    }

    /// True while this worker runs the fleet's periodic shard sync and
    /// finished-lease cleanup: one worker per fleet, chosen from the lease
    /// table itself (the live instance with the smallest id in the liveness
    /// records, or with per-lease renewal only, the live owner with the
    /// smallest worker id). Every worker judges it from what it read last,
    /// so at a change of leader two may sync in one round, which is safe
    /// (creates are conditional) and rare.
    pub fn is_sync_leader(&self) -> bool {
        self.shared.sync_leader.load(Ordering::Relaxed)
    }

    /// This worker created leases (a shard sync): peers learn it from its
    /// next beat and read the table, and this worker's taker looks now.
    pub fn leases_created(&self) {
        self.shared.table_changed();
    }

    /// The taker looks at the table now: this worker deleted leases it
    /// does not compete for (a removed stream's), and what named only them
    /// (a dead holder's liveness record) goes too; or it needs the taker's
    /// judgement of such leases. Peers, which do not compete for them
    /// either, are not told.
    pub(crate) fn look_at_turned_down(&self) {
        self.shared.want_rescan();
    }

    /// What this worker's taker judged of `lease`, a held lease it does not
    /// compete for: whether its holder is gone, so that the lease is one it
    /// would take if it did. Only the sync leader judges these.
    pub(crate) fn judged(&self, lease: &crate::lease::Lease) -> HolderJudged {
        self.shared.judged(lease)
    }

    /// A full read of the lease table made outside the taker (the sync
    /// leader's): if it shows a lease that needs an owner and has none, the
    /// fleet is told to look (a release or an edit whose signal was missed).
    pub fn saw_table(&self, leases: &[crate::lease::Lease]) {
        let free = leases.iter().any(|l| {
            !l.is_finished() && l.owner.is_none() && !l.in_handoff() && self.shared.accepts(l)
        });
        if free {
            self.shared.table_changed();
        }
    }
}

/// After a graceful release: this instance's liveness record goes (unless
/// `forget` is false: a lease left to expire is judged by it), and the
/// least loaded live peers (as many as there were leases to pick up,
/// at least one) are woken to read the table at their next beat instead of
/// their next tick.
async fn leave_the_fleet(shared: &Shared, released: usize, forget: bool) {
    let released = released.max(1);
    if forget
        && let Err(e) = shared.store.forget(shared.instance(), None).await
        && !e.is_condition_failed()
    {
        warn!(error = %e, "deleting this worker's liveness record failed; peers see it stop beating instead");
    }
    let mut peers: Vec<(u64, String)> = {
        let liveness = shared.liveness();
        liveness
            .alive(shared.config.lease_duration, Instant::now())
            .into_iter()
            .filter(|b| b.instance != shared.instance())
            .map(|b| (b.held, b.instance.clone()))
            .collect()
    };
    peers.sort();
    peers.truncate(released);
    each_unblocked(peers, RELEASE_CONCURRENCY, |(_, instance)| async move {
        if let Err(e) = shared.store.poke(&instance, None).await {
            tracing::debug!(%instance, error = %e, "waking a peer failed; it finds the leases at its next tick");
        }
    })
    .await;
}

impl Drop for LeaseCoordinator {
    fn drop(&mut self) {
        self.taker_stop.cancel();
        self.renewer_stop.cancel();
        if !self.shared.config.release_on_drop {
            return;
        }
        let running: Vec<(String, Arc<Held>)> = self
            .shared
            .held_snapshot()
            .into_iter()
            .filter(|(_, h)| !h.is_ended())
            .collect();
        if running.is_empty() {
            return;
        }
        for (_, held) in &running {
            // Consumers stop before the leases are visible as free.
            held.end(EndReason::Abandoned);
        }
        let shared = Arc::clone(&self.shared);
        // Other threads of a multi-threaded runtime may still be running a
        // processor call of a lease (its task aborted, not yet dropped):
        // its release waits for the call to end. On one thread, no call
        // runs while this does, and an aborted task is never polled again.
        let wait_for_consumers = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread);
        // Drop cannot await, and the runtime this ran on may be the one
        // shutting down: the releases run on a runtime of their own, in a
        // thread of their own, joined here (at most the deadline).
        let releasing = std::thread::Builder::new()
            .name("kcl-release-on-drop".into())
            .spawn(move || release_on_drop(&shared, running, wait_for_consumers));
        match releasing {
            Ok(thread) => {
                let join = move || {
                    let _ = thread.join();
                };
                // The consumer task whose handles the releases wait for may
                // sit in this very worker thread's queue (an abort wakes it
                // there), where no other thread steals it: block_in_place
                // hands this thread's work to another while it waits. Off a
                // worker thread (a `block_on` thread) there is nothing to
                // hand over.
                if wait_for_consumers && tokio::task::try_id().is_some() {
                    tokio::task::block_in_place(join);
                } else {
                    join();
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot start the thread that releases leases on drop; they will expire")
            }
        }
    }
}

/// Releases `running` (each pinned to its tenure) within
/// [`DROP_RELEASE_DEADLINE`] on a fresh single-threaded runtime; with
/// `wait_for_consumers`, each once no consumer of its tenure runs (a lease
/// whose consumer still runs at the deadline is left to expire).
fn release_on_drop(shared: &Shared, running: Vec<(String, Arc<Held>)>, wait_for_consumers: bool) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            warn!(error = %e, "cannot start a runtime to release leases on drop; they will expire");
            return;
        }
    };
    let count = running.len();
    let releases = each_unblocked(running, RELEASE_CONCURRENCY, |(key, held)| async move {
        if wait_for_consumers {
            held.consumer_stopped().await;
        }
        if let Err(e) = shared.release_in_table(&key, held.holder()).await {
            warn!(lease = %key, error = %e, "releasing on drop failed; the lease will expire");
        }
    });
    let done = runtime.block_on(async {
        tokio::time::timeout(DROP_RELEASE_DEADLINE, async {
            releases.await;
            leave_the_fleet(shared, count, true).await;
        })
        .await
    });
    match done {
        Ok(()) => warn!(
            leases = count,
            "the lease coordinator was dropped without a shutdown; released its leases"
        ),
        Err(_) => warn!(
            leases = count,
            "the lease coordinator was dropped without a shutdown; not every release answered in time"
        ),
    }
}
