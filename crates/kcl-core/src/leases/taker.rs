//! The lease taker: one task per worker, one paginated scan per tick.
//!
//! Each tick scans the table once (invariant 7); that one result feeds the
//! expiry tracker, the per-worker counts and the steal candidates, and is
//! also an observation of the tenures this worker holds (a lease lost or
//! asked for is noticed here if the renewer has not noticed it yet). The
//! decision itself is [`crate::leases::balance::decide`]; this module
//! gathers its input and applies its output with conditional writes, each
//! starting a fresh tenure.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::lease::{Lease, Throughput};
use crate::leases::balance::{BalanceInput, Decision, LeaseView, decide};
use crate::leases::expiry::ExpiryTracker;
use crate::leases::held::{Held, Phase};
use crate::leases::java_fleet::JavaFleet;
use crate::leases::liveness::FleetDigest;
use crate::leases::renewer::{observe_one, tell_previous_owner};
use crate::leases::shared::{Shared, each_unblocked};
use crate::leases::tenure::instance_of;
use crate::observe::{Acquisition, Event};
use crate::store::retry::counted_as_throttling;
use crate::store::{Holder, StoreError, StoreOp};

/// Writes issued at once when a tick takes many leases (a cold start).
const TAKE_CONCURRENCY: usize = 16;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut rng = match shared.config.seed {
        Some(seed) => SmallRng::seed_from_u64(seed),
        None => SmallRng::from_rng(&mut rand::rng()),
    };
    let mut taker = Taker {
        tracker: ExpiryTracker::new(),
        last_digest: None,
        unsettled: true,
        rescan_at: None,
        java: JavaFleet::default(),
        java_probe_at: None,
        stopping: Vec::new(),
    };
    // Peers must be able to see this instance alive before a lease names
    // it: the first tick waits for the first beat (bounded: a store that
    // does not answer fails the beat, and the taker goes on).
    let mut first_beat = shared.first_beat.subscribe();
    let _ = tokio::time::timeout(shared.config.renew_interval, first_beat.wait_for(|b| *b)).await;
    // And judges from the watcher's first read of the records.
    let mut first_read = shared.first_read.subscribe();
    let _ = tokio::time::timeout(shared.config.renew_interval, first_read.wait_for(|r| *r)).await;
    loop {
        let next_wake = taker.tick(&shared).await;
        let interval = shared
            .config
            .taker_interval
            .mul_f64(1.0 + shared.config.jitter * rng.random_range(-1.0..=1.0));
        let mut wake = Instant::now() + interval;
        if shared.liveness_mode()
            && let Some(round) = *shared.beat_round.lock().unwrap_or_else(|e| e.into_inner())
        {
            wake = between_beats(wake, round, shared.config.renew_interval);
        }
        if let Some(at) = next_wake {
            wake = wake.min(at);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(wake) => {}
            _ = shared.tick_now.notified() => {}
            // A consumer of an ended tenure stopped: the handoff it held
            // back completes at the scan this asks for (in the liveness
            // mode a tick reads only the records unless asked).
            () = any_consumer_stopped(&taker.stopping) => shared.rescan.store(true, Ordering::Relaxed),
        }
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Completes once the consumer of one of `tenures` stopped; never if there
/// are none.
async fn any_consumer_stopped(tenures: &[Arc<Held>]) {
    if tenures.is_empty() {
        return std::future::pending().await;
    }
    futures::future::select_all(tenures.iter().map(|t| Box::pin(t.consumer_stopped()))).await;
}

/// The midpoint between two of this instance's beats nearest to `wake`
/// (beats are due at `round` plus whole renew intervals). A peer's request
/// to look at the table (a departing worker's wake-up) is seen at this
/// instance's next beat or next liveness read, whichever comes first:
/// ticks half-way between beats halve the longest wait for either, at no
/// extra request.
fn between_beats(wake: Instant, round: Instant, interval: Duration) -> Instant {
    let first = round + interval / 2;
    if interval.is_zero() {
        return wake;
    }
    if wake <= first {
        return first;
    }
    let k = ((wake - first).as_secs_f64() / interval.as_secs_f64()).round();
    first + interval.mul_f64(k)
}

/// What the taker remembers between ticks.
struct Taker {
    tracker: ExpiryTracker,
    /// The fleet as the liveness records showed it at the last scan.
    last_digest: Option<FleetDigest>,
    /// The last scan's decision moved leases (or this is the first tick):
    /// look again at the next tick.
    unsettled: bool,
    /// When the table must be read again whatever the liveness records say:
    /// a lease judged by its own counter (its holder renews per lease) could
    /// expire, or a free lease could turn stale, and neither shows in them.
    rescan_at: Option<Instant>,
    /// Java KCL 3.x workers on the table (per-lease renewal only).
    java: JavaFleet,
    /// When the liveness mode last looked for Java KCL workers' reports.
    java_probe_at: Option<Instant>,
    /// Ended tenures whose consumers are still running, each holding back
    /// a handoff left behind on its lease (see `finish_orphaned_handoffs`):
    /// the taker scans again as soon as one stops.
    stopping: Vec<Arc<Held>>,
}

/// How often a worker renewing through its liveness record looks for Java
/// KCL workers' reports: rarely, since a kcl-only fleet pays for every
/// read, and a Java worker that takes a lease is seen at once anyway (see
/// `Shared::lost_to`); this finds one that has not taken any yet.
const JAVA_PROBE_EVERY: Duration = Duration::from_secs(300);

impl Taker {
    /// One tick. Returns when the next tick should come early: the moment a
    /// lease whose owner has missed renewals will expire, so that failover
    /// takes the lease duration plus at most one tick rather than two.
    async fn tick(&mut self, shared: &Shared) -> Option<Instant> {
        shared.emit(Event::Tick);
        // The liveness records as the watcher last read them: who is
        // alive, and in the liveness mode whether anything changed that
        // calls for reading the lease table at all. With no read for a
        // lease duration (the workers table does not answer) nothing can
        // be judged: a lease renewed by beats would look expired.
        let d = shared.config.lease_duration;
        let last_read = *shared.last_read.lock().unwrap_or_else(|e| e.into_inner());
        let Some(asked) = last_read.filter(|at| at.elapsed() < d) else {
            shared.emit(Event::ScanFailed);
            debug!("no read of the liveness records within the lease duration; retrying next tick");
            return None;
        };
        if shared.liveness_mode() {
            self.probe_java_workers(shared).await;
        }
        let digest = shared
            .liveness()
            .digest(shared.instance(), d, Instant::now());
        if shared.liveness_mode() {
            let rescan = shared.rescan.swap(false, Ordering::Relaxed);
            let due = self.rescan_at.is_some_and(|at| Instant::now() >= at);
            if !rescan && !due && !self.unsettled && self.last_digest.as_ref() == Some(&digest) {
                shared.emit(Event::QuietTick);
                self.elect(shared, None);
                return self.rescan_at;
            }
        }
        // In the Java-compatible mode, Java KCL 3.x workers on the table
        // count in the balance: they take nothing themselves.
        if !shared.liveness_mode() && self.java.due(Instant::now()) {
            match shared.store.java_workers().await {
                Ok(workers) => self.java.observe(workers, Instant::now(), wall_secs()),
                Err(e) => {
                    self.java.failed(Instant::now());
                    if !counted_as_throttling(StoreOp::ReadJavaWorkers, &e) {
                        warn!(error = %e, "reading the Java KCL workers' reports failed; retrying in 30 s");
                    }
                }
            }
        }
        // Validity of what this tick takes counts from when the scan asked
        // for the page that held the lease: a take the store reconciles as
        // applied may be an older write of ours that landed after that page
        // was read, never before it was asked for.
        let (leases, asked_at) = match scan_timed(shared).await {
            Ok(scanned) => scanned,
            Err(e) => {
                shared.emit(Event::ScanFailed);
                if !counted_as_throttling(StoreOp::ScanPage, &e) {
                    warn!(error = %e, "lease scan failed; retrying next tick");
                }
                self.unsettled = true;
                return None;
            }
        };
        let now = Instant::now();
        if shared.liveness_mode() {
            // A lease renewed in place by an owner no liveness record names:
            // that owner judges leases by their counters, and to it every
            // lease this worker renews only by beats looks expired. Only as
            // of a read of the records made after the owner was seen
            // holding the lease: a kcl worker beats before it takes, so
            // such a read shows its record. A late joiner's leases, moved
            // by this worker's own handoff completions and scanned before
            // a read showed the joiner, were taken for a Java worker's.
            let read = *shared.last_read.lock().unwrap_or_else(|e| e.into_inner());
            let renewing = leases
                .iter()
                .filter(|l| {
                    self.tracker
                        .renewed_in_place(l)
                        .is_some_and(|held_since| read.is_some_and(|r| r > held_since))
                })
                .filter_map(|l| l.owner.as_deref())
                .find(|o| shared.judges_by_counters(o));
            if let Some(owner) = renewing {
                shared.switch_to_per_lease(owner, "renews its leases per lease");
            }
        }
        self.tracker.observe(&leases, now);
        observe_held(shared, &leases).await;
        let config = &shared.config;
        let me = shared.me();

        // Finished shards need no owner; they stay in the table for lineage.
        let active: Vec<&Lease> = leases
            .iter()
            .filter(|l| !l.is_finished() && shared.accepts(l))
            .collect();
        // A Java worker finds a lease its leader (or a kcl gift) assigned it
        // only at its next discovery, up to a failover time later, and
        // renews it from then: a lease of a Java worker that still reports
        // expires after twice the lease duration, not once.
        let java_expiry = config.lease_duration * 2;
        let reporting: Vec<String> = self
            .java
            .alive(now)
            .into_iter()
            .filter(|id| id != me)
            .collect();
        // Its reports go on for a while after it stopped (nothing deletes
        // them): one that leaves a lease of its own unrenewed for more than
        // that discovery lag is not processing, and is neither counted nor
        // given anything.
        let idle: HashSet<&str> = if reporting.is_empty() {
            HashSet::new()
        } else {
            active
                .iter()
                .filter(|l| self.tracker.unchanged_for(l, now) >= config.lease_duration * 3 / 2)
                .filter_map(|l| l.owner.as_deref())
                .collect()
        };
        let java: Vec<String> = reporting
            .iter()
            .filter(|j| !idle.contains(j.as_str()))
            .cloned()
            .collect();
        // A lease whose holder the liveness read judged dead is free only
        // if its item stood still since before that read (free_by_liveness).
        let mut held_back = false;
        let mut held_for_read = false;
        let views: Vec<LeaseView<'_>> = {
            let liveness = shared.liveness();
            active
                .iter()
                .map(|l| {
                    let held_here = shared.is_held(&l.key);
                    LeaseView {
                        key: &l.key,
                        owner: l.owner.as_deref(),
                        expired: match liveness.judge(l, config.lease_duration, now) {
                            Some(alive) => {
                                let free =
                                    free_by_liveness(alive, self.tracker.seen_since(l), asked);
                                held_for_read |= !alive && !free;
                                // A holder that renews every lease too holds
                                // it no longer than its counter shows, even
                                // while it beats (its renewals fail).
                                let lapsed = liveness
                                    .per_lease_owner(l, config.lease_duration)
                                    .is_some_and(|d| self.tracker.is_expired(l, d, now));
                                free || lapsed
                            }
                            // Renewed per lease (or never seen beating):
                            // unrenewed for the lease duration.
                            None => {
                                let reports = l
                                    .owner
                                    .as_deref()
                                    .is_some_and(|o| reporting.iter().any(|j| j == o));
                                let d = if reports {
                                    java_expiry
                                } else {
                                    config.lease_duration
                                };
                                self.tracker.is_expired(l, d, now)
                            }
                        },
                        unrenewed_for: self.tracker.unchanged_for(l, now),
                        held_here,
                        // Our worker id under a tenure this process did not
                        // write: another process under the same id holds it,
                        // or held it before it stopped (a restart). The two
                        // cannot be told apart, so it is taken like any other
                        // worker's lease, once expired: taking it earlier
                        // would overlap a live holder.
                        other_process: l.is_owned_by(me)
                            && !held_here
                            && !written_here(shared, l.tenure.as_deref()),
                        in_handoff: l.in_handoff(),
                        seen_alive: self.tracker.has_moved(l)
                            || liveness.runs(l, config.lease_duration),
                        load: l.throughput.map(Throughput::kbps),
                    }
                })
                .collect()
        };
        // Leases of holders not yet seen writing are not stolen (they may
        // have stopped); one more look settles it: their next write, or
        // their expiry.
        let unproven = views.iter().any(|v| {
            v.owner.is_some() && !v.held_here && !v.expired && !v.in_handoff && !v.seen_alive
        });
        if unproven {
            // The watcher wakes us as soon as a read proves them running.
            shared.wants_proof.store(true, Ordering::Relaxed);
        }
        if held_for_read {
            // A fresh read judges those leases: ask for it now, and look
            // again when it comes, rather than a tick later.
            shared.read_now.notify_one();
        }
        held_back |= unproven || held_for_read;
        // An expired lease left to a peer's share turns stale (taken beyond
        // the target, see `balance::decide`) two lease durations after it
        // last changed; nothing in the liveness records shows that moment.
        let stale_at = views
            .iter()
            .filter(|v| v.expired && !v.held_here && v.owner.is_some())
            .filter_map(|v| (config.lease_duration * 2).checked_sub(v.unrenewed_for))
            .filter(|left| !left.is_zero())
            .min()
            .map(|left| now + left + Duration::from_millis(1));
        let peers: Vec<String> = shared
            .liveness()
            .alive(config.lease_duration, now)
            .into_iter()
            .filter(|b| !b.stopping)
            .map(|b| b.worker.clone())
            .collect();
        let peers: Vec<&str> = peers.iter().chain(&java).map(String::as_str).collect();
        let decision = decide(&BalanceInput {
            me,
            leases: views,
            max_leases_per_worker: config.max_leases_per_worker,
            max_leases_to_steal: config.max_leases_to_steal,
            peers,
            stale_after: config.lease_duration,
            foreign: java.iter().map(String::as_str).collect(),
            balance: config.balance,
        });
        self.unsettled = held_back
            || !decision.take.is_empty()
            || !decision.steal.is_empty()
            || !decision.reclaim.is_empty()
            || !decision.give.is_empty();
        self.last_digest = Some(digest);
        self.rescan_at = {
            let liveness = shared.liveness();
            active
                .iter()
                // Not ours in the table (one we are handing off counts:
                // its new owner may renew per lease).
                .filter(|l| !written_here(shared, l.tenure.as_deref()))
                .filter(|l| match l.owner {
                    // Its owner renews per lease (no record to show it
                    // stop, or one that says so): look again when its
                    // counter could expire.
                    Some(_) => {
                        !l.tenure
                            .as_deref()
                            .is_some_and(|t| liveness.has_record(instance_of(t)))
                            || liveness.per_lease_owner(l, config.lease_duration).is_some()
                    }
                    None => !l.in_handoff(),
                })
                .filter_map(|l| {
                    let d = liveness
                        .per_lease_owner(l, config.lease_duration)
                        .unwrap_or(config.lease_duration);
                    self.tracker.expires_at(l, d)
                })
                .filter(|at| *at > now)
                .min()
                .map(|at| at + Duration::from_millis(1))
        };
        self.rescan_at = earliest(self.rescan_at, stale_at);
        let decision = unless_unbeaten(shared.can_hold(now), decision);
        let decision = unless_sitting_out(shared.sitting_out(now), decision);
        if !decision.take.is_empty() || !decision.steal.is_empty() || !decision.reclaim.is_empty() {
            debug!(?decision, "lease taker decision");
        }
        // A Java worker whose expired lease this tick takes has left (only
        // with Java workers on the table: a cold start takes thousands).
        if !reporting.is_empty() {
            let taken: HashSet<&str> = decision.take.iter().map(String::as_str).collect();
            for lease in leases.iter().filter(|l| taken.contains(l.key.as_str())) {
                if let Some(owner) = lease.owner.as_deref()
                    && reporting.iter().any(|j| j == owner)
                {
                    self.java.departed(owner);
                }
            }
        }
        apply(shared, &leases, &decision, &asked_at).await;
        self.stopping = finish_orphaned_handoffs(shared, &leases).await;
        // And at the latest once the handoff timeout since such a tenure
        // ended has passed: a hung processor keeps no shard unread.
        let timeout = config.handoff_timeout;
        let bound = self
            .stopping
            .iter()
            .filter_map(|t| t.ended_at())
            .map(|at| at + timeout + Duration::from_millis(1))
            .min();
        self.rescan_at = earliest(self.rescan_at, bound);
        self.elect(shared, Some(&leases));
        if shared.sync_leader.load(Ordering::Relaxed) {
            forget_the_dead(shared, &leases).await;
        }

        // A renewing owner moves the counter every renew interval; one that
        // missed two renewals is suspect: look again right when it would
        // expire.
        let suspect_after = config.renew_interval * 2;
        let by_lease = active
            .iter()
            .filter(|l| l.owner.is_some() && !shared.is_held(&l.key))
            .filter(|l| self.tracker.unchanged_for(l, now) >= suspect_after)
            .filter_map(|l| self.tracker.expires_at(l, config.lease_duration))
            .filter(|at| *at > now)
            .min()
            .map(|at| at + Duration::from_millis(1));
        // A holder dying is the watcher's to see: it reads at the holder's
        // deadline and wakes this task then.
        earliest(by_lease, self.rescan_at)
    }

    /// In the liveness mode, every [`JAVA_PROBE_EVERY`] (the first at the
    /// first tick, before anything is taken): Java KCL workers reporting
    /// on this table share it, and judge this worker's leases by their
    /// counters, so this worker switches to per-lease renewal.
    async fn probe_java_workers(&mut self, shared: &Shared) {
        let now = Instant::now();
        if self
            .java_probe_at
            .is_some_and(|at| now.saturating_duration_since(at) < JAVA_PROBE_EVERY)
        {
            return;
        }
        self.java_probe_at = Some(now);
        match shared.store.java_workers().await {
            Ok(workers) => self.java.observe(workers, now, wall_secs()),
            Err(e) => {
                debug!(error = %e, "reading the Java KCL workers' reports failed; trying again later");
                return;
            }
        }
        if let Some(java) = self
            .java
            .alive(now)
            .into_iter()
            .find(|id| id != shared.me())
        {
            shared.switch_to_per_lease(&java, "reports to the Java KCL's WorkerMetricStats table");
        }
    }

    /// Whether this worker runs the fleet's shard sync and cleanup: the
    /// live instance with the smallest id, from the liveness records; with
    /// none (a fleet renewing per lease), the live owner with the smallest
    /// worker id, from the scan (this worker counts itself).
    fn elect(&self, shared: &Shared, scan: Option<&[Lease]>) {
        let now = Instant::now();
        let d = shared.config.lease_duration;
        let liveness = shared.liveness();
        let alive = liveness.alive(d, now);
        let leader = if let Some(first) = alive.iter().map(|b| b.instance.as_str()).min() {
            first == shared.instance()
        } else if let Some(leases) = scan {
            let me = shared.me();
            leases
                .iter()
                .filter(|l| !self.tracker.is_expired(l, d, now))
                .filter_map(|l| l.owner.as_deref())
                .chain([me])
                .min()
                == Some(me)
        } else {
            return;
        };
        shared.sync_leader.store(leader, Ordering::Relaxed);
    }
}

/// Whether a lease whose named instances have liveness records is free:
/// only if none of them beats (`alive` false: their tenures all lapsed, see
/// `Shared::valid_from`), and the item already stood as it does before the
/// read that judged them was asked for (`read_asked`): a state written
/// after it (a holder that came back, beat, and reclaimed in a new tenure)
/// may rest on a beat the read missed. `seen_since` is when this worker
/// first saw the item as it stands. The model checker runs the same rule.
pub(crate) fn free_by_liveness(
    alive: bool,
    seen_since: Option<Instant>,
    read_asked: Instant,
) -> bool {
    !alive && seen_since.is_some_and(|s| s <= read_asked)
}

/// `decision` without its takes, reclaims and steals while this instance
/// could not hold what it took (`can_hold` false, see `Shared::can_hold`): with liveness records a tenure is valid
/// only up to a lease duration after this instance's last beat that
/// landed, so with none landed for that long (the workers table down,
/// throttled or write-denied while the lease table works, or no beat ever
/// landed) a take would be fenced at once. Worse, a reclaim or take every
/// tick moves the lease's counter, and peers never judge free a lease
/// written since their liveness read: the shards would stand unread for
/// the whole outage. Taking nothing, this instance's leases stand still,
/// peers take them once its record stops moving, and it takes its share
/// again once a beat lands.
pub(crate) fn unless_unbeaten(can_hold: bool, decision: Decision) -> Decision {
    if can_hold {
        return decision;
    }
    if !decision.take.is_empty() || !decision.reclaim.is_empty() || !decision.steal.is_empty() {
        debug!(
            ?decision,
            "no beat landed within the lease duration; taking nothing until one does"
        );
    }
    take_nothing(decision)
}

/// `decision` without its takes and steals while this worker sits out
/// after a shard it could not read (see `Shared::sit_out`): the worker
/// that can read takes what it gave back. Reclaims stay: a lease the table
/// still says is this worker's (its release failed) is read by nobody
/// else, so it is taken up again and given back once more.
pub(crate) fn unless_sitting_out(sitting_out: bool, mut decision: Decision) -> Decision {
    if sitting_out {
        decision.take.clear();
        decision.steal.clear();
        decision.victim = None;
    }
    decision
}

/// `decision` with no take, reclaim or steal left (its gives stand).
fn take_nothing(mut decision: Decision) -> Decision {
    decision.take.clear();
    decision.reclaim.clear();
    decision.steal.clear();
    decision.victim = None;
    decision
}

/// Liveness records of instances dead for three lease durations that no
/// lease names any more (they crashed, and their leases moved on) are
/// deleted, each only if it has not beaten since, so the records read every
/// tick stay as many as the live workers.
async fn forget_the_dead(shared: &Shared, leases: &[Lease]) {
    let now = Instant::now();
    let own = shared.config.lease_duration;
    let dead: Vec<(String, u64)> = {
        let liveness = shared.liveness();
        // A tenure left on a lease another worker took since (a Java KCL
        // take) does not keep its instance's record.
        let named: HashSet<&str> = leases
            .iter()
            .flat_map(|l| liveness.named(l))
            .flatten()
            .collect();
        liveness
            .beats()
            .filter(|b| {
                let gone_for = liveness.duration_of(&b.instance, own).unwrap_or(own) * 3;
                liveness.unchanged_for(&b.instance, now) >= Some(gone_for)
            })
            .filter(|b| !named.contains(b.instance.as_str()))
            .map(|b| (b.instance.clone(), b.counter))
            .collect()
    };
    for (instance, counter) in dead {
        match shared.store.forget(&instance, Some(counter)).await {
            Ok(()) => {
                info!(%instance, "deleted the liveness record of a worker that stopped beating")
            }
            Err(e) => {
                debug!(%instance, error = %e, "deleting a dead worker's liveness record failed")
            }
        }
    }
}

/// True if `tenure` was written by this process.
fn written_here(shared: &Shared, tenure: Option<&str>) -> bool {
    tenure.is_some_and(|t| shared.tenures.is_ours(t))
}

/// The scan is an observation of every tenure held here: one lost to
/// another holder ends now, one a peer asked for starts draining now,
/// rather than at the next renewal.
async fn observe_held(shared: &Shared, leases: &[Lease]) {
    for lease in leases {
        if let Some(held) = shared.held(&lease.key) {
            observe_one(shared, &lease.key, &held, Some(lease)).await;
        }
    }
}

/// Leases another worker asked this one for (or an operator evicted it
/// from), in a tenure of this process that no longer runs (its completion
/// failed, or it ended while draining, or an eviction ended it): the
/// handoff completes as soon as nothing here is processing them instead of
/// waiting to be forced. A tenure ends before its consumer stops (the
/// processor's call in flight returns first), so a lease whose ended
/// tenure's consumer still runs waits for it (invariant 1: a draining
/// victim counts as processing until its last call returns), up to the
/// handoff timeout after that tenure ended; those tenures are returned,
/// for the taker to look again as soon as one stops. Each completion is
/// pinned to the tenure the handoff recorded. A tenure another process
/// wrote under this id is left alone (that process may still be draining;
/// the thief forces it at the timeout if not). A handoff recorded without
/// a tenure (of a lease held before tenures, or started by a Java KCL
/// leader) is completed as before tenures: the one case where a second
/// process under this id, still draining, could have its handoff completed
/// under it.
async fn finish_orphaned_handoffs(shared: &Shared, leases: &[Lease]) -> Vec<Arc<Held>> {
    let me = shared.me();
    let now = Instant::now();
    let mut stopping = Vec::new();
    let orphaned: Vec<&Lease> = leases
        .iter()
        .filter(|l| l.checkpoint_owner.as_deref() == Some(me) && !shared.is_held(&l.key))
        .filter(|l| {
            let tenure = l.checkpoint_owner_tenure.as_deref();
            tenure.is_none() || written_here(shared, tenure)
        })
        .filter(|l| {
            let running = shared.still_processing(&l.key, now);
            if !running.is_empty() {
                debug!(lease = %l.key, "a handoff left behind waits for this worker's consumer to stop");
            }
            let done = running.is_empty();
            stopping.extend(running);
            done
        })
        .collect();
    each_unblocked(orphaned, TAKE_CONCURRENCY, |lease| async move {
        let Some(from) = Holder::checkpoint_owner_of(lease) else {
            return;
        };
        match shared.complete_in_table(&lease.key, from).await {
            Ok(()) => info!(lease = %lease.key, "completed a handoff nobody here was draining"),
            Err(e) => {
                debug!(lease = %lease.key, error = %e, "completing a leftover handoff failed")
            }
        }
    })
    .await;
    stopping
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reclaim,
    Take,
    Steal,
}

/// One paginated scan; each lease with the time its page was asked for.
async fn scan_timed(shared: &Shared) -> Result<(Vec<Lease>, HashMap<String, Instant>), StoreError> {
    let mut pages = shared.store.scan();
    let (mut leases, mut asked_at) = (Vec::new(), HashMap::new());
    loop {
        let asked = Instant::now();
        match pages.next().await {
            Some(Ok(page)) => {
                for lease in page {
                    asked_at.insert(lease.key.clone(), asked);
                    leases.push(lease);
                }
            }
            Some(Err(e)) => return Err(e),
            None => return Ok((leases, asked_at)),
        }
    }
}

async fn apply(
    shared: &Shared,
    leases: &[Lease],
    decision: &Decision,
    asked_at: &HashMap<String, Instant>,
) {
    let by_key: HashMap<&str, &Lease> = leases.iter().map(|l| (l.key.as_str(), l)).collect();
    let work = decision
        .reclaim
        .iter()
        .map(|k| (Kind::Reclaim, k))
        .chain(decision.take.iter().map(|k| (Kind::Take, k)))
        .chain(decision.steal.iter().map(|k| (Kind::Steal, k)))
        .filter_map(|(kind, key)| by_key.get(key.as_str()).map(|l| (kind, *l)));
    futures::stream::iter(work)
        .for_each_concurrent(TAKE_CONCURRENCY, |(kind, seen)| {
            take_one(
                shared,
                kind,
                seen,
                asked_at
                    .get(&seen.key)
                    .copied()
                    .unwrap_or_else(Instant::now),
            )
        })
        .await;
    if let Some(to) = &decision.give_to {
        for key in &decision.give {
            give_one(shared, key, to).await;
        }
    }
}

/// Hands one of our leases to a Java KCL worker by the handoff the Java
/// KCL's leader would write: it becomes the owner, we the checkpoint owner
/// while our processor drains; then we complete the handoff and the Java
/// worker finds the lease at its next discovery.
async fn give_one(shared: &Shared, key: &str, to: &str) {
    let Some(held) = shared.held(key) else {
        return;
    };
    if held.phase() != Phase::Active || held.is_ended() {
        return;
    }
    let Ok(_writing) = tokio::time::timeout(shared.config.store_timeout, held.writing.lock()).await
    else {
        return;
    };
    let mut seen = held.lease();
    for attempt in 0..2 {
        match shared
            .store
            .start_handoff(
                &seen,
                Holder {
                    owner: to,
                    tenure: None,
                },
            )
            .await
        {
            Ok(_) => {
                if held.request_handoff() {
                    info!(lease = %key, to, "handing a lease to a Java KCL worker; draining the shard");
                    shared.emit(Event::HandoffGiven { key });
                }
                return;
            }
            // Our own renewal moved the counter since: once more from it.
            Err(StoreError::ConditionFailed { current, .. }) => match current {
                Some(cur)
                    if attempt == 0
                        && held.holder().owns(&cur)
                        && cur.checkpoint_owner.is_none() =>
                {
                    seen = *cur;
                }
                _ => return,
            },
            Err(e) => {
                debug!(lease = %key, error = %e, "handing a lease to a Java KCL worker failed");
                return;
            }
        }
    }
}

/// Seconds since the epoch on this host's clock.
fn wall_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One take, reclaim or steal, in a fresh tenure. A write whose outcome is
/// unknown (an error) leaves that tenure in the table or not; the next
/// tick's scan tells, and a tenure written here is reclaimed.
async fn take_one(shared: &Shared, kind: Kind, seen: &Lease, read_from: Instant) {
    let me = shared.me();
    let tenure = shared.fresh_tenure();
    let by = Holder::new(me, &tenure);
    let mut seen = seen.clone();
    for attempt in 0..2 {
        let sent = Instant::now();
        let write = match kind {
            Kind::Reclaim => shared.store.reclaim(&seen, by).await,
            Kind::Take => shared.store.take(&seen, by).await,
            // A steal is a graceful handoff: the victim drains and
            // checkpoints before this worker starts, so no two workers
            // process the shard.
            Kind::Steal => shared.store.start_handoff(&seen, by).await,
        };
        match write {
            Ok(lease) => {
                acquired(shared, kind, &seen, lease, read_from, sent).await;
                return;
            }
            Err(StoreError::ConditionFailed { current, .. }) => {
                // A victim that merely renewed since the scan is still the
                // victim: retry once with its new counter. Any other change
                // (a new owner, a release) means the scan's reasoning no
                // longer holds: skip until the next tick.
                if let (Kind::Steal, 0, Some(cur)) = (kind, attempt, current.as_deref())
                    && cur.owner == seen.owner
                    && cur.checkpoint_owner.is_none()
                {
                    seen = cur.clone();
                    continue;
                }
                shared.emit(Event::TakeConflict { key: &seen.key });
                debug!(lease = %seen.key, "lost the race for a lease");
                return;
            }
            Err(e) => {
                shared.emit(Event::TakeFailed { key: &seen.key });
                let op = match kind {
                    Kind::Take => StoreOp::Take,
                    Kind::Steal => StoreOp::StartHandoff,
                    Kind::Reclaim => StoreOp::Reclaim,
                };
                if !counted_as_throttling(op, &e) {
                    warn!(lease = %seen.key, error = %e, "taking a lease failed; retrying next tick");
                }
                return;
            }
        }
    }
}

async fn acquired(
    shared: &Shared,
    kind: Kind,
    seen: &Lease,
    lease: Lease,
    read_from: Instant,
    sent: Instant,
) {
    let me = shared.me();
    let how = match kind {
        Kind::Reclaim => Acquisition::Reclaimed,
        Kind::Take => Acquisition::Taken,
        Kind::Steal => Acquisition::Stolen,
    };
    shared.emit(Event::Acquired {
        key: &lease.key,
        how,
    });
    // A steal, or a reclaim of a lease whose handoff from another worker is
    // still running (our handoff start applied, its answer lost): wait for
    // that worker's processor to checkpoint rather than start under it.
    let from = match kind {
        Kind::Steal => seen.owner.clone(),
        _ => lease.checkpoint_owner.clone().filter(|f| f != me),
    };
    match from {
        Some(from) => {
            info!(lease = %lease.key, from = %from, how = how.as_str(), "handoff started");
            let key = lease.key.clone();
            let held = shared.awaiting(lease, from, read_from, sent);
            tell_previous_owner(shared, &key, &held).await;
        }
        None => {
            info!(lease = %lease.key, from = ?seen.owner, how = how.as_str(), "lease acquired");
            shared.acquired(lease, read_from).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ticks_fall_half_way_between_beats() {
        let round = Instant::now();
        let i = Duration::from_secs(5);
        let s = |x: f64| round + Duration::from_secs_f64(x);
        // Nearest midpoint: 2.5, 7.5, 12.5, ...
        assert_eq!(between_beats(s(10.1), round, i), s(12.5));
        assert_eq!(between_beats(s(9.0), round, i), s(7.5));
        assert_eq!(between_beats(s(11.0), round, i), s(12.5));
        assert_eq!(between_beats(s(1.0), round, i), s(2.5));
        // Never moves a tick by more than half an interval.
        for x in [3.0, 7.9, 12.4, 40.1] {
            let moved = between_beats(s(x), round, i);
            let d = if moved > s(x) {
                moved - s(x)
            } else {
                s(x) - moved
            };
            assert!(d <= Duration::from_millis(2500), "{x}: {d:?}");
        }
    }
}
