//! The state the coordinator's tasks share: the held tenures, the event
//! channel to the worker, the counters (declared in `events`), and the
//! transitions every task applies the same way (acquired, awaiting,
//! activated, ended). Which renewal runs is in `renewal_mode`, sitting
//! out after an unreadable shard in `sit_out`, being cut off from the lease
//! table in `cut_off`, what became of the leases the filter turns down in
//! `turned_down`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use futures::StreamExt;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::config::LeaseConfig;
use crate::lease::Lease;
use crate::leases::events::{CoordinatorStats, LeaseEvent};
use crate::leases::held::{EndReason, Held, LeaseHandle, LetGo, Phase};
use crate::leases::liveness::LivenessTracker;
use crate::leases::tenure::Tenures;
use crate::observe::{Event, Observer, record_metric};
use crate::store::timeout::TimeoutStore;
use crate::store::{Holder, LeaseStore, StoreError};

pub(crate) mod beats;
mod cut_off;
mod given_up;
mod latch;
mod renewal_mode;
mod sit_out;
pub(crate) mod task_failed;
mod turned_down;

use cut_off::CutOff;
use given_up::GivenUp;
use latch::Latch;
use sit_out::SitOut;
pub(crate) use turned_down::HolderJudged;

/// Decides which leases of the table this worker competes for (a
/// multi-stream worker ignores leases of streams it was not configured for).
pub type LeaseFilter = Arc<dyn Fn(&Lease) -> bool + Send + Sync>;

/// State shared by the coordinator and its tasks.
pub(crate) struct Shared {
    pub(crate) config: LeaseConfig,
    /// The lease table, every call bounded by the store call timeout.
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) filter: Option<LeaseFilter>,
    pub(crate) tenures: Tenures,
    /// Held tenures by lease key, in key order: every round walks them in
    /// the same order, so a seeded simulation replays its store calls.
    held: Mutex<BTreeMap<String, Arc<Held>>>,
    /// Tenures that ended while their consumer was still running (a
    /// processor call in flight), by lease key: this process may still be
    /// processing those shards (see [`Shared::still_processing`]).
    ended_running: Mutex<HashMap<String, Vec<Weak<Held>>>>,
    /// See [`GivenUp`].
    given_up: Mutex<GivenUp>,
    events: mpsc::Sender<LeaseEvent>,
    pub(crate) stats: Arc<CoordinatorStats>,
    /// The application's own observer of lease events, if any.
    observer: Option<Arc<dyn Observer>>,
    /// A tenure was added: its deadline may be earlier than the one the
    /// fence loop sleeps towards (takes count validity from the scan).
    pub(crate) held_added: Notify,
    /// Every instance's liveness, as last read by the taker.
    pub(crate) liveness: Mutex<LivenessTracker>,
    /// What this instance's next beat writes.
    pub(crate) beat_state: Mutex<BeatState>,
    /// The taker must read the lease table at its next tick (a tenure
    /// ended under us, a peer poked us, we changed the table).
    pub(crate) rescan: AtomicBool,
    /// Wakes the taker for a tick now.
    pub(crate) tick_now: Notify,
    /// Set once the first beat was tried (the taker's first tick waits for
    /// it, so peers can see this instance before it takes anything).
    pub(crate) first_beat: Latch,
    /// True while this worker runs the fleet's shard sync and cleanup.
    pub(crate) sync_leader: std::sync::atomic::AtomicBool,
    /// When the last beat that landed was sent (liveness mode).
    pub(crate) last_beat: Mutex<Option<Instant>>,
    /// See [`Shared::beat_sending`].
    unsure_beat: Mutex<Option<Instant>>,
    /// When the current beat round was due (the taker ticks between rounds).
    pub(crate) beat_round: Mutex<Option<Instant>>,
    /// When the last successful read of the liveness records was asked for
    /// (the watcher's): what the taker judges as of.
    pub(crate) last_read: Mutex<Option<Instant>>,
    /// Set once the watcher's first read was tried (the taker's first tick
    /// waits for it).
    pub(crate) first_read: Latch,
    /// Asks the watcher for a read now (a decision held back for one).
    pub(crate) read_now: Notify,
    /// Asks the renewer for a round now: a tenure started handing off, and
    /// with liveness records its lease item is renewed from then on.
    pub(crate) renew_now: Notify,
    /// The taker held a steal back for want of proof that its victim runs:
    /// the watcher wakes it once a read brings that proof.
    pub(crate) wants_proof: AtomicBool,
    /// The held leases this worker's filter turns down, as the taker's last
    /// scan judged them (on the sync leader only), by key: the counter
    /// judged, and whether the holder was gone (expired as a lease it could
    /// take would be). See [`Shared::judged`].
    pub(crate) turned_down: Mutex<HashMap<String, (u64, bool)>>,
    /// When this worker, configured for liveness records, switched to
    /// per-lease renewal (see [`Shared::switch_to_per_lease`]).
    switched: Mutex<Option<Instant>>,
    /// See [`Shared::sit_out`].
    sit_out: Mutex<SitOut>,
    /// See [`Shared::table_read`].
    cut_off: Mutex<CutOff>,
    /// The first of the worker's tasks that panicked.
    pub(crate) task_failed: task_failed::TaskFailed,
}

/// The fields of this instance's liveness record that it sets itself.
#[derive(Debug, Default)]
pub(crate) struct BeatState {
    /// See [`crate::store::Beat::changes`].
    pub(crate) changes: u64,
    /// Handoff requests to clear from the record at the next beat.
    pub(crate) answered: Vec<String>,
    /// The last [`crate::store::Beat::wake`] acted on.
    pub(crate) wake_seen: Option<u64>,
    /// See [`crate::store::Beat::stopping`].
    pub(crate) stopping: bool,
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
    pub(crate) fn new(
        config: LeaseConfig,
        store: Arc<dyn LeaseStore>,
        filter: Option<LeaseFilter>,
        events: mpsc::Sender<LeaseEvent>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Self {
        let timeout = config.store_timeout;
        let tenures = config.seed.map_or_else(Tenures::new, |seed| {
            Tenures::seeded(seed, &config.worker_id)
        });
        Shared {
            config,
            store: Arc::new(TimeoutStore::new(store, timeout)),
            filter,
            tenures,
            held: Mutex::default(),
            ended_running: Mutex::default(),
            given_up: Mutex::default(),
            events,
            stats: Arc::default(),
            observer,
            held_added: Notify::new(),
            liveness: Mutex::default(),
            beat_state: Mutex::default(),
            rescan: AtomicBool::new(false),
            tick_now: Notify::new(),
            first_beat: Latch::default(),
            sync_leader: std::sync::atomic::AtomicBool::new(true),
            last_beat: Mutex::new(None),
            unsure_beat: Mutex::new(None),
            beat_round: Mutex::new(None),
            last_read: Mutex::new(None),
            first_read: Latch::default(),
            read_now: Notify::new(),
            renew_now: Notify::new(),
            wants_proof: AtomicBool::new(false),
            turned_down: Mutex::default(),
            switched: Mutex::new(None),
            sit_out: Mutex::default(),
            cut_off: Mutex::default(),
            task_failed: task_failed::TaskFailed::default(),
        }
    }

    /// Whether a peer that is not stopping beat within its lease duration:
    /// one that could take what this worker gives back.
    pub(crate) fn has_active_peer(&self, now: Instant) -> bool {
        let me = self.me();
        self.liveness()
            .alive(self.config.lease_duration, now)
            .into_iter()
            .any(|b| !b.stopping && b.worker != me)
    }

    /// Reports `event`: to the counters, to the metrics, and to the
    /// application's observer.
    pub(crate) fn emit(&self, event: Event<'_>) {
        let worker = &self.config.worker_id;
        self.stats.observe(worker, &event);
        record_metric(worker, &event);
        if let Some(observer) = &self.observer {
            observer.observe(worker, &event);
        }
    }

    /// This process's instance id (its liveness record's key).
    pub(crate) fn instance(&self) -> &str {
        self.tenures.instance()
    }

    pub(crate) fn liveness(&self) -> MutexGuard<'_, LivenessTracker> {
        self.liveness.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn given_up(&self) -> MutexGuard<'_, GivenUp> {
        self.given_up.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn beat_state(&self) -> MutexGuard<'_, BeatState> {
        self.beat_state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the taker read the lease table at a tick that comes now.
    pub(crate) fn want_rescan(&self) {
        self.rescan.store(true, Ordering::Relaxed);
        self.tick_now.notify_one();
    }

    /// This worker changed the lease table in a way peers should look at
    /// (created or released leases): its next beat says so.
    pub(crate) fn table_changed(&self) {
        self.beat_state().changes += 1;
        self.want_rescan();
    }

    /// The number of tenures held (active, awaited or handing off).
    pub(crate) fn held_count(&self) -> usize {
        self.held_map().len()
    }

    /// True if this worker competes for `lease`.
    pub(crate) fn accepts(&self, lease: &Lease) -> bool {
        self.filter.as_ref().is_none_or(|f| f(lease))
    }

    pub(crate) fn me(&self) -> &str {
        &self.config.worker_id
    }

    /// This worker in a new tenure.
    pub(crate) fn fresh_tenure(&self) -> String {
        self.tenures.fresh()
    }

    fn held_map(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Held>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_held(&self, key: &str) -> bool {
        self.held_map().contains_key(key)
    }

    pub(crate) fn held(&self, key: &str) -> Option<Arc<Held>> {
        self.held_map().get(key).cloned()
    }

    pub(crate) fn held_keys(&self) -> Vec<String> {
        self.held_map().keys().cloned().collect()
    }

    pub(crate) fn held_snapshot(&self) -> Vec<(String, Arc<Held>)> {
        self.held_map()
            .iter()
            .map(|(k, h)| (k.clone(), Arc::clone(h)))
            .collect()
    }

    /// The entry `lease` belongs to, if it is still the current one: a
    /// consumer of an earlier tenure of the same lease must not end a later
    /// one.
    pub(crate) fn tenure_of(&self, lease: &LeaseHandle) -> Option<Arc<Held>> {
        self.held_map()
            .get(lease.key())
            .filter(|h| lease.same_tenure(h))
            .cloned()
    }

    fn set_held_gauge(&self, len: usize) {
        self.emit(Event::Held { leases: len });
    }

    fn insert(&self, key: String, held: &Arc<Held>) {
        let (previous, len) = {
            let mut map = self.held_map();
            let previous = map.insert(key.clone(), Arc::clone(held));
            (previous, map.len())
        };
        self.held_added.notify_one();
        if let Some(previous) = previous {
            // A re-take replaced a tenure whose loss the renewer had not
            // noticed yet: that loss still counts.
            self.count_end(&key, &previous, EndReason::Lost);
        }
        self.set_held_gauge(len);
    }

    /// Starts holding `lease` (one of our tenures), written at `sent`; tells
    /// the worker. `sent` must be no later than any write of ours that could
    /// have produced the lease's current state: a write the store
    /// reconciled as applied (its response lost) may have landed before
    /// this call, so takes count from the scan that read the lease. A
    /// tenure whose validity is already over when its take answers (a very
    /// slow take) is ended at once as fenced, before any consumer starts:
    /// the next tick reclaims it from a fresh read.
    pub(crate) async fn acquired(&self, lease: Lease, sent: Instant) {
        let key = lease.key.clone();
        let valid_until =
            self.valid_from(sent) + self.config.lease_duration - self.config.fence_margin;
        let held = Arc::new(Held::new(
            lease,
            valid_until,
            Phase::Active,
            self.config.load_report_interval,
        ));
        held.item_written(sent);
        self.insert(key.clone(), &held);
        if Instant::now() >= valid_until {
            warn!(lease = %key, "the take answered after its validity ran out; fencing this tenure");
            self.ended(&key, &held, EndReason::Fenced).await;
            return;
        }
        // The worker may have stopped listening (shutdown); holding the lease
        // is still right until it is released or expires.
        let _ = self
            .events
            .send(LeaseEvent::Acquired(LeaseHandle::new(key, held)))
            .await;
    }

    /// Starts waiting for `from` to hand over a lease we now own in the
    /// table (a steal, or a reclaim found mid-handoff). No consumer starts
    /// until [`Shared::activate`]. `valid_from` is no later than the moment
    /// the lease was last seen unchanged before our write (see
    /// [`Shared::acquired`]); `sent` is when our handoff write was sent.
    pub(crate) fn awaiting(
        &self,
        lease: Lease,
        from: String,
        valid_from: Instant,
        sent: Instant,
    ) -> Arc<Held> {
        let key = lease.key.clone();
        // Renewing per lease, nothing renews an awaited handoff but its
        // previous owner (see `Phase::Awaiting`), and nothing is processed
        // under it: validity starts when it activates.
        let valid_until = if self.liveness_mode() {
            self.valid_from(valid_from) + self.config.lease_duration - self.config.fence_margin
        } else {
            sent + FOREVER
        };
        // Not forced until the previous owner was told (`Held::ask_told`
        // then sets the deadline a handoff timeout, at least a lease
        // duration, later): a previous owner renewing per lease learns from
        // its next renewal, one with a liveness record from its record, and
        // either way its own validity has run out by the deadline, so no
        // two workers process at once.
        let force_at = sent + FOREVER;
        let held = Arc::new(Held::new(
            lease,
            valid_until,
            Phase::Awaiting { from, force_at },
            self.config.load_report_interval,
        ));
        // Held in the table (and renewed) while awaiting: counted as held.
        self.insert(key, &held);
        held
    }

    /// The previous owner completed the handoff (or it was forced): start
    /// consuming, with validity from the write sent at `sent`.
    pub(crate) async fn activate(&self, key: &str, held: &Arc<Held>, lease: Lease, sent: Instant) {
        // Nothing was read while awaiting: the window starts now, from the
        // figure the previous owner left on the item.
        held.meter.restart(lease.throughput, Instant::now());
        if !held.renewed(lease, self.valid_from(sent), &self.config) {
            self.ended(key, held, EndReason::Fenced).await;
            return;
        }
        held.item_written(sent);
        held.activate();
        let _ = self
            .events
            .send(LeaseEvent::Acquired(LeaseHandle::new(
                key.to_owned(),
                Arc::clone(held),
            )))
            .await;
    }

    /// Extends `held` from a beat sent at `sent`; a tenure whose validity
    /// lapsed before the beat answered ends as fenced instead.
    pub(crate) async fn extended(&self, key: &str, held: &Arc<Held>, sent: Instant) {
        if held.extend(self.valid_from(sent), !self.liveness_mode(), &self.config) {
            self.emit(Event::Renewed { key });
        } else if !held.is_ended() {
            warn!(lease = %key, "a beat answered after the lease's validity ran out; fencing this tenure");
            self.ended(key, held, EndReason::Fenced).await;
        }
    }

    /// Records a successful write of `held` sent at `sent`; a tenure whose
    /// validity lapsed before the answer came ends as fenced instead.
    pub(crate) async fn renewed(&self, key: &str, held: &Arc<Held>, lease: Lease, sent: Instant) {
        if held.renewed(lease, self.valid_from(sent), &self.config) {
            held.item_written(sent);
            self.emit(Event::Renewed { key });
        } else if !held.is_ended() {
            warn!(lease = %key, "a renewal answered after the lease's validity ran out; fencing this tenure");
            self.ended(key, held, EndReason::Fenced).await;
        }
    }

    /// The lease went to another tenure of our own worker id: another live
    /// process uses this worker id. Worth an error: the two processes take
    /// leases from each other instead of sharing the work.
    pub(crate) fn same_id_conflict(&self, key: &str) {
        self.emit(Event::SameIdConflict { key });
        error!(
            lease = %key,
            worker = %self.config.worker_id,
            "another process holds this lease under this worker's id: worker ids must be unique \
             per process; this tenure stops"
        );
    }

    fn count_end(&self, key: &str, held: &Arc<Held>, reason: EndReason) {
        if !held.end(reason) {
            return;
        }
        if held.consumer_running() {
            self.ended_while_running(key, held);
        }
        self.emit(Event::Ended { key, reason });
    }

    /// Remembers a tenure that ended while its consumer still ran: its
    /// consumer stops only once the processor's call in flight returns.
    fn ended_while_running(&self, key: &str, held: &Arc<Held>) {
        let mut ended = self.ended_running.lock().unwrap_or_else(|e| e.into_inner());
        // Forget the tenures whose consumers stopped, so the map stays as
        // small as the consumers still stopping (a shutdown waits for each
        // of those however long ago it ended).
        ended.retain(|_, tenures| {
            tenures.retain(|t| t.upgrade().is_some_and(|h| h.consumer_running()));
            !tenures.is_empty()
        });
        ended
            .entry(key.to_owned())
            .or_default()
            .push(Arc::downgrade(held));
    }

    /// The ended tenures of `key` whose consumer may still be processing
    /// the shard (a processor call in flight), up to the handoff timeout
    /// after each ended: a handoff this process leaves behind on `key`
    /// completes only once they are gone, or no two workers would be
    /// processing it, and no later than that timeout, or a hung processor
    /// would keep the shard unread (invariant 12).
    pub(crate) fn still_processing(&self, key: &str, now: Instant) -> Vec<Arc<Held>> {
        let timeout = self.config.handoff_timeout;
        self.ended_running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|tenures| {
                tenures
                    .iter()
                    .filter_map(|t| processing(t, now, timeout))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every ended tenure of `key` whose consumer may still be processing
    /// the shard, however long ago it ended: a shutdown frees `key` only
    /// once none is.
    pub(crate) fn older_tenures_running(&self, key: &str) -> Vec<Arc<Held>> {
        self.ended_running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|tenures| {
                (tenures.iter())
                    .filter_map(Weak::upgrade)
                    .filter(|h| h.consumer_running())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Stops holding `key` if `held` is still its entry; tells the worker.
    pub(crate) async fn ended(&self, key: &str, held: &Arc<Held>, reason: EndReason) {
        let len = {
            let mut map = self.held_map();
            if map.get(key).is_some_and(|h| Arc::ptr_eq(h, held)) {
                map.remove(key);
            }
            map.len()
        };
        self.set_held_gauge(len);
        let first = !held.is_ended();
        self.count_end(key, held, reason);
        // Nothing renews a lease item in the liveness mode: a tenure that
        // ended without a release or handoff may still name this instance
        // in the table, alive as long as it beats. The taker looks again
        // (and reclaims it if it is still ours).
        if first && matches!(reason, EndReason::Lost | EndReason::Fenced) {
            self.rescan.store(true, Ordering::Relaxed);
        }
        if first && reason == EndReason::Fenced && self.liveness_mode() {
            self.given_up().insert(key, held);
        }
        if first && reason != EndReason::Abandoned {
            // Never wait here: the renewer calls this, and a worker slow to
            // read events must not delay renewals. The handle already told
            // the consumer; the event is for bookkeeping.
            let _ = self.events.try_send(LeaseEvent::Ended {
                key: key.to_owned(),
                reason,
            });
        }
    }

    /// Releases one tenure in the table. A release that finds a peer's
    /// handoff started from under it (the peer's steal landed first) does
    /// not leave the peer waiting for the handoff timeout: this worker is
    /// the checkpoint owner, so it completes the handoff instead. What it
    /// did: released, handed off, or nothing (a peer owns the lease).
    pub(crate) async fn release_in_table(
        &self,
        key: &str,
        by: Holder<'_>,
    ) -> Result<LetGo, StoreError> {
        let current = match self.store.release(key, by).await {
            Ok(_) => {
                // Peers see a free lease only by reading the table: the
                // next beat tells them to.
                self.beat_state().changes += 1;
                return Ok(LetGo::Released);
            }
            Err(StoreError::ConditionFailed { current, .. }) => current,
            Err(e) => return Err(e),
        };
        match current {
            Some(current) if by.hands_off(&current) => {
                self.complete_in_table(key, by).await?;
                info!(lease = %key, to = ?current.owner, "a peer's handoff started under our release; completed it");
                Ok(LetGo::HandedOff)
            }
            // Someone else owns it already: nothing left to release.
            _ => Ok(LetGo::NotHeld),
        }
    }

    /// Completes a handoff `from` is the previous owner of. A failed
    /// condition means the thief forced it or took it: it has the lease
    /// either way.
    pub(crate) async fn complete_in_table(
        &self,
        key: &str,
        from: Holder<'_>,
    ) -> Result<(), StoreError> {
        match self.store.complete_handoff(key, from).await {
            Ok(_) => {
                // The new owner may have died while it waited: the lease is
                // then free only to a reader of the table, and nothing else
                // in the liveness records would say so.
                self.table_changed();
                Ok(())
            }
            Err(e) if e.is_condition_failed() => Ok(()),
            Err(e) => {
                // Nobody retries the completion but the taker's next read
                // of the table (the orphaned handoffs it finishes).
                self.rescan.store(true, Ordering::Relaxed);
                Err(e)
            }
        }
    }
}

/// `tenure` if its consumer may still be processing at `now`: it ended
/// less than `timeout` ago, and its consumer still runs.
fn processing(
    tenure: &Weak<Held>,
    now: Instant,
    timeout: std::time::Duration,
) -> Option<Arc<Held>> {
    let held = tenure.upgrade()?;
    let recent = held.ended_at().is_none_or(|at| now < at + timeout);
    (recent && held.consumer_running()).then_some(held)
}

/// A deadline that never comes, until a handoff's previous owner was told.
const FOREVER: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);

/// How long a call may run before it gives its place among the calls in
/// flight back (see [`each_unblocked`]); lease-table calls normally answer
/// in milliseconds.
const SLOW_CALL: std::time::Duration = std::time::Duration::from_millis(250);

/// Runs `f` for every item, at most `limit` starting at once. A call still
/// running after [`SLOW_CALL`] gives its place back: however many calls hang
/// on dead connections, the others still start (invariant 11), while the
/// rate at which calls start stays bounded.
pub(crate) async fn each_unblocked<T, F, Fut>(items: Vec<T>, limit: usize, f: F)
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let permits = Semaphore::new(limit);
    let permits = &permits;
    futures::stream::iter(items)
        .for_each_concurrent(None, |item| {
            let call = f(item);
            async move {
                let Ok(permit) = permits.acquire().await else {
                    return;
                };
                tokio::pin!(call);
                tokio::select! {
                    biased;
                    () = &mut call => return,
                    () = tokio::time::sleep(SLOW_CALL) => drop(permit),
                }
                call.await;
            }
        })
        .await;
}
