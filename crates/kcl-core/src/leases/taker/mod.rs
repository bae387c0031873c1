//! The lease taker: one task per worker, one paginated scan per tick.
//!
//! Each tick scans the table once (invariant 7); that one result feeds the
//! expiry tracker, the per-worker counts and the steal candidates, and is
//! also an observation of the tenures this worker holds (a lease lost or
//! asked for is noticed here if the renewer has not noticed it yet). The
//! decision itself is [`crate::leases::balance::decide`]; this module
//! gathers its input and applies its output with conditional writes, each
//! starting a fresh tenure.
//!
//! Layout: this file runs the loop and the tick, one method per step of
//! the tick; `judge` builds the view of the table the decision reads,
//! `claims` writes the takes, reclaims, steals and gifts, and `cleanup`
//! finishes what other ticks and instances left behind.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::lease::Lease;
use crate::leases::balance::{BalanceInput, Decision, decide};
use crate::leases::expiry::ExpiryTracker;
use crate::leases::held::Held;
use crate::leases::java_fleet::JavaFleet;
use crate::leases::liveness::FleetDigest;
use crate::leases::renewer::observe_one;
use crate::leases::shared::Shared;
use crate::observe::Event;
use crate::store::retry::counted_as_throttling;
use crate::store::{StoreError, StoreOp};

mod claims;
mod cleanup;
mod judge;

use judge::Judging;

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
    let _ = tokio::time::timeout(shared.config.renew_interval, shared.first_beat.wait()).await;
    // And judges from the watcher's first read of the records.
    let _ = tokio::time::timeout(shared.config.renew_interval, shared.first_read.wait()).await;
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
        // In a fixed order (a seeded simulation replays exactly).
        tokio::select! {
            biased;
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

/// One tick's scan of the lease table.
struct Scan {
    leases: Vec<Lease>,
    /// When the page that held each lease was asked for.
    asked_at: HashMap<String, Instant>,
    /// When the scan answered: the moment the tick judges the table at.
    now: Instant,
}

impl Scan {
    /// The leases that need an owner: finished shards need none (they
    /// stay in the table for lineage), and leases this worker's filter
    /// turns down are not its to take.
    fn active(&self, shared: &Shared) -> Vec<&Lease> {
        self.leases
            .iter()
            .filter(|l| !l.is_finished() && shared.accepts(l))
            .collect()
    }
}

/// How often a worker renewing through its liveness record looks for Java
/// KCL workers' reports: rarely, since a kcl-only fleet pays for every
/// read, and a Java worker that takes a lease is seen at once anyway (see
/// `Shared::lost_to`); this finds one that has not taken any yet.
const JAVA_PROBE_EVERY: Duration = Duration::from_secs(300);

impl Taker {
    /// One tick, the steps of "One tick of the lease taker" in
    /// docs/ARCHITECTURE.md in order. Returns when the next tick should
    /// come early: the moment a lease whose owner has missed renewals will
    /// expire, so that failover takes the lease duration plus at most one
    /// tick rather than two.
    async fn tick(&mut self, shared: &Shared) -> Option<Instant> {
        shared.emit(Event::Tick);
        let Some(asked) = last_liveness_read(shared) else {
            shared.table_read(false, Instant::now());
            // Scan once reads come back, if only to clear the failure: a
            // quiet tick would leave this worker saying it takes no lease.
            self.unsettled = true;
            claims::reclaim_given_up(shared).await;
            return None;
        };
        let digest = match self.needs_scan(shared).await {
            ControlFlow::Continue(digest) => digest,
            ControlFlow::Break(wake) => return wake,
        };
        self.count_java_workers(shared).await;
        let Some(scan) = self.scan(shared).await else {
            shared.table_read(false, Instant::now());
            claims::reclaim_given_up(shared).await;
            return None;
        };
        shared.table_read(true, scan.now);
        shared.given_up().retain_named(&scan.leases);
        let releases_waiting = claims::release_turned_down(shared, &scan.leases).await;
        self.track_expiry(shared, &scan);
        observe_held(shared, &scan.leases).await;
        let active = scan.active(shared);
        let decision = self.decision(shared, &scan, &active, asked, digest);
        claims::apply(shared, &scan.leases, &decision, &scan.asked_at).await;
        self.finish_orphaned_handoffs(shared, &scan.leases, releases_waiting)
            .await;
        self.elect(shared, Some(&scan.leases));
        if shared.sync_leader.load(Ordering::Relaxed) {
            cleanup::forget_the_dead(shared, &scan.leases).await;
        }
        self.next_wake(shared, &active, scan.now)
    }

    /// Step 2, in the liveness mode: whether anything calls for the lease
    /// table (the fleet's digest changed, a peer or a tenure asked for a
    /// scan, one is due, or the last decision moved leases). A quiet tick
    /// ends here: `Break` with when the next must come. Otherwise the
    /// digest the scan is judged with.
    async fn needs_scan(&mut self, shared: &Shared) -> ControlFlow<Option<Instant>, FleetDigest> {
        if shared.liveness_mode() {
            self.probe_java_workers(shared).await;
        }
        let digest = shared.liveness().digest(
            shared.instance(),
            shared.config.lease_duration,
            Instant::now(),
        );
        if shared.liveness_mode() {
            let rescan = shared.rescan.swap(false, Ordering::Relaxed);
            let due = self.rescan_at.is_some_and(|at| Instant::now() >= at);
            if !rescan && !due && !self.unsettled && self.last_digest.as_ref() == Some(&digest) {
                shared.emit(Event::QuietTick);
                self.elect(shared, None);
                return ControlFlow::Break(self.rescan_at);
            }
        }
        ControlFlow::Continue(digest)
    }

    /// In the Java-compatible mode, Java KCL 3.x workers on the table
    /// count in the balance: they take nothing themselves. Their reports
    /// are read when due, before the scan.
    async fn count_java_workers(&mut self, shared: &Shared) {
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
    }

    /// Step 3: one paginated scan. A failed one ends the tick, leaving it
    /// unsettled so that the next tick scans again.
    async fn scan(&mut self, shared: &Shared) -> Option<Scan> {
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
        Some(Scan {
            leases,
            asked_at,
            now,
        })
    }

    /// Step 4: the expiry tracker records what the scan shows changed; in
    /// the liveness mode, a lease renewed in place by an owner that judges
    /// by counters switches this worker to per-lease renewal first.
    fn track_expiry(&mut self, shared: &Shared, scan: &Scan) {
        let leases = &scan.leases;
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
        self.tracker.observe(leases, scan.now);
    }

    /// Step 6: the view of the table `balance::decide` turns into leases to
    /// reclaim, take, steal or give; what the next tick must look at again
    /// (`unsettled`, `rescan_at`); and the decision as far as this instance
    /// may act on it now.
    fn decision(
        &mut self,
        shared: &Shared,
        scan: &Scan,
        active: &[&Lease],
        asked: Instant,
        digest: FleetDigest,
    ) -> Decision {
        let config = &shared.config;
        let now = scan.now;
        let java = self.java_peers(shared, active, now);
        let judging = Judging::new(self, shared, asked, &java.reporting, now);
        let (views, mut held_for_read) = judging.views(shared, active);
        let turned_down = judge::turned_down(shared, &scan.leases);
        *shared.turned_down.lock().unwrap_or_else(|e| e.into_inner()) =
            judging.turned_down(shared, &turned_down, &mut held_for_read);
        let held_back = judge::hold_back(shared, &views, held_for_read);
        let stale_at = judge::stale_at(&views, config.lease_duration, now);
        let (peers, resting) = judge::live_peers(shared, now);
        let peers: Vec<&str> = peers
            .iter()
            .chain(&java.counted)
            .map(String::as_str)
            .collect();
        let decision = decide(&BalanceInput {
            me: shared.me(),
            leases: views,
            max_leases_per_worker: config.max_leases_per_worker,
            max_leases_to_steal: config.max_leases_to_steal,
            peers,
            stale_after: config.lease_duration,
            foreign: java.counted.iter().map(String::as_str).collect(),
            balance: config.balance,
            resting: resting.iter().map(String::as_str).collect(),
        });
        self.unsettled = held_back
            || !decision.take.is_empty()
            || !decision.steal.is_empty()
            || !decision.reclaim.is_empty()
            || !decision.give.is_empty();
        self.last_digest = Some(digest);
        self.rescan_at = self.counters_expire_at(shared, active, now);
        self.rescan_at = earliest(self.rescan_at, stale_at);
        // A turned-down lease's holder may stop too, with nothing in the
        // liveness records to show it.
        let down_at = self.counters_expire_at(shared, &turned_down, now);
        self.rescan_at = earliest(self.rescan_at, down_at);
        if shared.sync_leader.load(Ordering::Relaxed) {
            let forget_at = cleanup::forgettable_at(shared, now);
            self.rescan_at = earliest(self.rescan_at, forget_at);
        }
        let decision = unless_unbeaten(shared.can_hold(now), decision);
        let decision = unless_sitting_out(shared.sitting_out(now), decision);
        if !decision.take.is_empty() || !decision.steal.is_empty() || !decision.reclaim.is_empty() {
            debug!(?decision, "lease taker decision");
        }
        self.java_departed(&java.reporting, &scan.leases, &decision);
        decision
    }

    /// After step 7: handoffs left behind on leases no tenure here runs any
    /// more complete now (`finish_orphaned_handoffs`); those still held back
    /// by a running consumer, and the releases `releases_waiting` holds back
    /// (`release_turned_down`), are looked at again when it stops, and at
    /// the latest once the handoff timeout since its tenure ended has passed.
    async fn finish_orphaned_handoffs(
        &mut self,
        shared: &Shared,
        leases: &[Lease],
        releases_waiting: Vec<Arc<Held>>,
    ) {
        self.stopping = cleanup::finish_orphaned_handoffs(shared, leases).await;
        self.stopping.extend(releases_waiting);
        // And at the latest once the handoff timeout since such a tenure
        // ended has passed: a hung processor keeps no shard unread.
        let timeout = shared.config.handoff_timeout;
        let bound = self
            .stopping
            .iter()
            .filter_map(|t| t.ended_at())
            .map(|at| at + timeout + Duration::from_millis(1))
            .min();
        self.rescan_at = earliest(self.rescan_at, bound);
    }

    /// Step 8: when the next tick should come early, as of the scan's `now`.
    fn next_wake(&self, shared: &Shared, active: &[&Lease], now: Instant) -> Option<Instant> {
        let config = &shared.config;
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

/// Step 1: when the read of the liveness records this tick judges from (as
/// the watcher last read them: who is alive, and in the liveness mode
/// whether anything changed that calls for reading the lease table at all)
/// was asked for. `None`, and the tick goes no further, with no read for a
/// lease duration (the workers table does not answer): nothing can be
/// judged, a lease renewed by beats would look expired.
fn last_liveness_read(shared: &Shared) -> Option<Instant> {
    let d = shared.config.lease_duration;
    let last_read = *shared.last_read.lock().unwrap_or_else(|e| e.into_inner());
    let Some(asked) = last_read.filter(|at| at.elapsed() < d) else {
        shared.emit(Event::ScanFailed);
        debug!("no read of the liveness records within the lease duration; retrying next tick");
        return None;
    };
    Some(asked)
}

/// Whether a lease whose named instances have liveness records is free:
/// only if none of them beats (`alive` false: their tenures all lapsed, see
/// `Shared::valid_from`), and the item already stood as it does before the
/// read that judged them was asked for (`read_asked`): a state written
/// after it (a holder that came back, beat, and reclaimed in a new tenure)
/// may rest on a beat the read missed. `seen_since` is when this worker
/// first saw the item as it stands. Strictly before: an item first seen at
/// the very instant the read was asked (a paused clock, a coarse one) may
/// have been written after the read was served, on the beat it missed.
/// The model checker runs the same rule.
pub(crate) fn free_by_liveness(
    alive: bool,
    seen_since: Option<Instant>,
    read_asked: Instant,
) -> bool {
    !alive && seen_since.is_some_and(|s| s < read_asked)
}

/// `decision` without its takes, reclaims and steals while this instance could
/// not hold what it took (`can_hold` false, see `Shared::can_hold`): with
/// liveness records a tenure is valid only up to a lease duration after this
/// instance's last beat that landed, so with none landed for that long (the
/// workers table down, throttled or write-denied while the lease table works,
/// or no beat ever landed) a take would be fenced at once. Worse, a reclaim or
/// take every tick moves the lease's counter, and peers never judge free a
/// lease written since their liveness read: the shards would stand unread for
/// the whole outage. Taking nothing, this instance's leases stand still, peers
/// take them once its record stops moving, and it takes its share again once a
/// beat lands.
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

/// True if `tenure` was written by this process.
fn written_here(shared: &Shared, tenure: Option<&str>) -> bool {
    tenure.is_some_and(|t| shared.tenures.is_ours(t))
}

/// Step 5: the scan is an observation of every tenure held here: one lost
/// to another holder ends now, one a peer asked for starts draining now,
/// rather than at the next renewal.
async fn observe_held(shared: &Shared, leases: &[Lease]) {
    for lease in leases {
        if let Some(held) = shared.held(&lease.key) {
            observe_one(shared, &lease.key, &held, Some(lease)).await;
        }
    }
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

/// Seconds since the epoch on this host's clock.
fn wall_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease is free by its holder's death only if this worker saw it
    /// as it stands before the read that judged the holder was asked: at
    /// the very instant (a paused clock, a coarse one), the read may have
    /// been served before the holder's beat and the item written after
    /// it (simulator seed 13917891215581911684).
    #[tokio::test(start_paused = true)]
    async fn a_lease_first_seen_as_the_read_was_asked_is_not_free() {
        let read = Instant::now();
        let before = read - Duration::from_millis(1);
        assert!(free_by_liveness(false, Some(before), read));
        assert!(!free_by_liveness(false, Some(read), read));
        assert!(!free_by_liveness(
            false,
            Some(read + Duration::from_millis(1)),
            read
        ));
        assert!(!free_by_liveness(true, Some(before), read));
        assert!(!free_by_liveness(false, None, read));
    }

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
