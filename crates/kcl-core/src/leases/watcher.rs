//! The liveness watcher: one task per worker that reads the liveness
//! records just after peers' beats land, and at the moment a peer's
//! lease duration since its last beat runs out.
//!
//! Failover is bounded by when this worker first sees a holder's last
//! beat: a holder counts as dead a lease duration after that sighting, no
//! earlier. Reading the records once per taker tick saw the last beat up to
//! a tick late (failover from a lease duration to twice it plus a tick);
//! reading them on a fixed faster cadence costs requests in proportion.
//! Instead each peer's [`Cadence`] tells when its next beat lands, and the
//! watcher reads just after it: with one peer, one read per beat interval
//! sees each beat within about a tenth of a second. Reads come at most
//! twice per beat interval however many peers there are (their beats then
//! fall between reads, seen at most half an interval late), plus one read
//! at each peer's deadline, which confirms its death and wakes the taker
//! to take its leases at once instead of at its next tick.
//!
//! The taker judges from what the watcher read last; it reads the records
//! itself no more.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::leases::cadence::Cadence;
use crate::leases::shared::Shared;
use crate::observe::Event;
use crate::store::retry::counted_as_throttling;
use crate::store::{Beat, StoreOp};

/// Reads per beat interval at most on average, peers' deadlines aside; a
/// read saved up (one peer needs only one read per interval) lets a read
/// follow at once one that came just before a beat landed.
const READS_PER_INTERVAL: f64 = 2.0;

/// The least time between two reads the taker asks for (a decision held
/// back for a fresher read).
const FRESH_READ_GAP: Duration = Duration::from_millis(500);

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut watcher = Watcher::default();
    // The first read waits for this instance's first beat (bounded, as the
    // taker's first tick is): its own record is then among those read.
    let _ = tokio::time::timeout(shared.config.renew_interval, shared.first_beat.wait()).await;
    loop {
        watcher.read(&shared).await;
        shared.first_read.set();
        let at = watcher.next_read(&shared, Instant::now());
        // In a fixed order (a seeded simulation replays exactly).
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(at) => {}
            _ = shared.read_now.notified() => {
                // Asked for by the taker: no sooner than a short gap after
                // the last read, so a decision held back again and again
                // cannot turn into a stream of reads.
                if let Some(last) = watcher.last_asked {
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep_until(last + FRESH_READ_GAP) => {}
                    }
                }
                watcher.fresh_for_taker = true;
            }
        }
    }
}

#[derive(Debug, Default)]
struct Watcher {
    cadences: HashMap<String, Cadence>,
    /// Reads that may come at once (at most [`READS_PER_INTERVAL`]), as of
    /// `budget_at`.
    budget: f64,
    budget_at: Option<Instant>,
    /// When the last read (successful or not) was asked for.
    last_asked: Option<Instant>,
    /// When the last successful read was asked for.
    last_read: Option<Instant>,
    /// The read under way was asked for by the taker: wake it after.
    fresh_for_taker: bool,
}

impl Watcher {
    /// One read of every liveness record, applied to the liveness tracker;
    /// wakes the taker when it shows something to act on now.
    async fn read(&mut self, shared: &Shared) {
        let asked = Instant::now();
        self.last_asked = Some(asked);
        let rate = READS_PER_INTERVAL / shared.config.renew_interval.as_secs_f64().max(1e-3);
        self.budget = (self.budget_now(asked, rate) - 1.0).max(-1.0);
        self.budget_at = Some(asked);
        let Some(beats) = read_beats(shared).await else {
            return;
        };
        let answered = Instant::now();
        if !shows_own_record(shared, &beats) {
            return;
        }
        let mut act_now = std::mem::take(&mut self.fresh_for_taker);
        act_now |= woken_by_peer(shared, &beats);
        self.learn_cadences(shared, &beats, asked, answered);
        let seen = observe_beats(shared, beats, asked, answered);
        act_now |= seen.changed;
        self.last_read = Some(asked);
        *shared.last_read.lock().unwrap_or_else(|e| e.into_inner()) = Some(asked);
        // A peer just judged dead: its leases are free now, not at the
        // next tick. A peer just proven to run, while the taker held a
        // steal back for want of that proof: steal now.
        let wants_proof = seen.proven && shared.wants_proof.swap(false, Ordering::Relaxed);
        if seen.died {
            debug!("a peer stopped beating; its leases are taken now");
        }
        if seen.died || act_now || wants_proof {
            shared.want_rescan();
        }
    }

    fn learn_cadences(
        &mut self,
        shared: &Shared,
        beats: &[Beat],
        asked: Instant,
        answered: Instant,
    ) {
        let default_interval = shared.config.lease_duration / 2;
        let mut next = HashMap::with_capacity(beats.len());
        for b in beats.iter().filter(|b| b.instance != shared.instance()) {
            let interval = b.beat_interval.unwrap_or(default_interval);
            let cadence = match self.cadences.remove(&b.instance) {
                Some(mut c) => {
                    c.observe(interval, b.counter, asked, answered);
                    c
                }
                None => Cadence::new(interval, b.counter, asked, answered),
            };
            next.insert(b.instance.clone(), cadence);
        }
        self.cadences = next;
    }

    /// The read budget at `at`, refilled at `rate` reads a second.
    fn budget_now(&self, at: Instant, rate: f64) -> f64 {
        let refill = self.budget_at.map_or(READS_PER_INTERVAL, |b| {
            at.saturating_duration_since(b).as_secs_f64() * rate
        });
        (self.budget + refill).min(READS_PER_INTERVAL)
    }

    /// When to read next, as of `now`: just after the next peer beat the
    /// cadences expect, or at the next peer's deadline, whichever comes
    /// first; beats no faster than the budget allows (deadlines aside),
    /// and no later than a taker interval after the last read.
    fn next_read(&self, shared: &Shared, now: Instant) -> Instant {
        let config = &shared.config;
        let Some(last) = self.last_asked else {
            return now;
        };
        // At least one read per half lease duration, so the taker (which
        // judges nothing from a read older than a lease duration) never
        // skips a tick for want of one, however long its interval.
        let latest = last + config.taker_interval.min(config.lease_duration / 2);
        if self.last_read != self.last_asked {
            // The last read failed: again after a short pause.
            return (last + config.renew_interval / 4).min(latest);
        }
        // The first moment a whole read is in the budget.
        let rate = READS_PER_INTERVAL / config.renew_interval.as_secs_f64().max(1e-3);
        let short = 1.0 - self.budget_now(now, rate);
        let floor = if short > 0.0 {
            now + Duration::from_secs_f64(short / rate)
        } else {
            now
        };
        let by_beat = self
            .cadences
            .values()
            .map(|c| c.next_read(now))
            .min()
            .map(|at| at.max(floor));
        // Read exactly at a live peer's deadline: a read asked for then
        // that still shows its last beat proves it dead. Every peer's, not
        // only those whose record says they hold leases: a worker killed
        // after its first takes but before its next beat holds leases its
        // record does not count yet, and they waited for the next tick
        // (up to a tick past the bound). A peer that beats moves its
        // deadline on, so this costs a read only when one stopped.
        let by_deadline = {
            let liveness = shared.liveness();
            liveness
                .alive(config.lease_duration, last)
                .into_iter()
                .filter(|b| b.instance != shared.instance())
                .filter_map(|b| liveness.expires_at(&b.instance, config.lease_duration))
                .filter(|at| *at > last)
                .min()
        };
        // With no peer's beat to follow, the reads fall between this
        // worker's own beats, at thirds of the interval: a beat's answer
        // and a read both show a peer's wake in its record (a late
        // joiner's steal), so spread like this they leave it unaware for a
        // third of an interval at most, at the same two reads per
        // interval. Once a beat interval, right after its beats, a lone
        // holder learned of a steal up to a beat interval late.
        let between_beats = if self.cadences.is_empty() {
            let round = *shared.beat_round.lock().unwrap_or_else(|e| e.into_inner());
            round.and_then(|round| {
                let third = config.renew_interval / 3;
                [1, 2, 4, 5]
                    .into_iter()
                    .map(|k| round + third * k)
                    .find(|at| *at >= floor)
            })
        } else {
            None
        };
        [by_beat, by_deadline, between_beats]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(latest)
            .min(latest)
            .max(now)
    }
}

/// Every liveness record, or `None` (counted, and logged unless it was
/// throttling) when the read failed.
async fn read_beats(shared: &Shared) -> Option<Vec<Beat>> {
    match shared.store.beats().await {
        Ok(beats) => Some(beats),
        Err(e) => {
            shared.emit(Event::LivenessReadFailed);
            if !counted_as_throttling(StoreOp::ReadBeats, &e) {
                warn!(error = %e, "reading the liveness records failed; retrying");
            }
            None
        }
    }
}

/// False (the read counted as failed) when our own record is missing after
/// a beat landed: the read did not see the liveness table we beat into
/// (deleted, or another name), and judging leases from it would take every
/// live holder's.
fn shows_own_record(shared: &Shared, beats: &[Beat]) -> bool {
    let landed = shared
        .last_beat
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some();
    if landed && !beats.iter().any(|b| b.instance == shared.instance()) {
        shared.emit(Event::LivenessReadFailed);
        warn!(
            "the liveness records read do not include this worker's own; is the workers table there? retrying"
        );
        return false;
    }
    true
}

/// Whether a peer woke us through our own record since the last look (it
/// is seen here as well as at our next beat); asks the taker for a scan.
fn woken_by_peer(shared: &Shared, beats: &[Beat]) -> bool {
    let mut woken = false;
    if let Some(own) = beats.iter().find(|b| b.instance == shared.instance()) {
        let mut state = shared.beat_state();
        if state.wake_seen.is_some_and(|w| w != own.wake) {
            shared.rescan.store(true, Ordering::Relaxed);
            woken = true;
        }
        if state.wake_seen.is_some() {
            state.wake_seen = Some(own.wake);
        }
    }
    woken
}

/// What applying one read to the liveness tracker showed.
struct Seen {
    /// A peer alive before the read is not any more (whatever its record
    /// said it held: it may have died between its takes and its next beat).
    died: bool,
    /// The read proved more instances running than before.
    proven: bool,
    /// A peer's change counter moved: it created, released or finished
    /// leases.
    changed: bool,
}

/// Applies `beats` to the liveness tracker, and tells what they changed.
fn observe_beats(shared: &Shared, beats: Vec<Beat>, asked: Instant, answered: Instant) -> Seen {
    let own = shared.config.lease_duration;
    let mut liveness = shared.liveness();
    // A peer that created, released or finished leases says so by
    // its change counter: look at the table now (children of a
    // finished shard, released leases), not at the next tick.
    let before: HashMap<&str, u64> = liveness
        .beats()
        .map(|b| (b.instance.as_str(), b.changes))
        .collect();
    let changed = beats.iter().any(|b| {
        b.instance != shared.instance()
            && before
                .get(b.instance.as_str())
                .is_some_and(|c| *c != b.changes)
    });
    drop(before);
    let peers_alive: HashSet<String> = liveness
        .alive(own, asked)
        .into_iter()
        .filter(|b| b.instance != shared.instance())
        .map(|b| b.instance.clone())
        .collect();
    let moved_before = liveness.moved_instances();
    liveness.observe(beats, asked, answered);
    let still: HashSet<&str> = liveness
        .alive(own, asked)
        .into_iter()
        .map(|b| b.instance.as_str())
        .collect();
    let died = peers_alive.iter().any(|i| !still.contains(i.as_str()));
    let proven = liveness.moved_instances() > moved_before;
    Seen {
        died,
        proven,
        changed,
    }
}
