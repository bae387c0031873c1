//! The lease protocol's judgement of liveness, model-checked with
//! `stateright`: two workers and one lease, explicit time in whole
//! seconds, and every interleaving of beats, reads of the liveness
//! records, taker ticks and the passing of time that the cadences allow,
//! explored exhaustively up to a horizon.
//!
//! The decisions are the engine's own, called as production calls them:
//! the liveness tracker's judgement of a holder (`LivenessTracker::judge`,
//! by the lease duration the holder's record states), whether a lease
//! judged that way is free (`taker::free_by_liveness`), the balance
//! decision (`balance::decide`), the rule that an instance whose beats do
//! not land takes nothing (`taker::unless_unbeaten`, `shared::can_hold`),
//! and the validity a take and a beat give (`shared::valid_from`). What
//! the model writes itself is the orchestration: when each worker beats,
//! reads, ticks and fences, as the renewer, watcher and taker loops do.
//!
//! Properties, checked on every state:
//! - at no instant may two workers process the lease;
//! - a holder that stops (killed, or its beats stop landing while its
//!   lease-table writes work) has its lease held by the other worker
//!   within `lease_duration + beat_interval + read gap + tick + 2 s`.
//!
//! Scenarios (each an initial state): a holder with a 30 s lease and a
//! peer with a 10 s one (a rolling change of `lease_duration`); a holder
//! whose beats fail from the third second; a holder killed at the third
//! second. Reads come at most `READ_GAP` apart and ticks at most
//! `TICK_GAP` apart, at any moment within that; beats on their cadence.
//!
//! Not covered here: handoffs and steals (one lease between two workers is
//! never stolen: a lead of one is never worth a steal), the per-lease mode,
//! Java KCL workers, lost answers and reordered requests, restarts under
//! the same id, more workers or leases. The seeded fleet simulator
//! (`tests/sim.rs`) runs those on the whole engine.

use std::sync::OnceLock;
use std::time::Duration;

use stateright::{Checker, Model, Property};
use tokio::time::Instant;

use crate::config::LeaseConfig;
use crate::lease::{Checkpoint, Lease};
use crate::leases::balance::{Balance, BalanceInput, LeaseView, decide};
use crate::leases::liveness::LivenessTracker;
use crate::leases::shared::{can_hold, valid_from};
use crate::leases::taker::{free_by_liveness, unless_unbeaten};
use crate::store::Beat;

/// The longest time between two reads of the liveness records by one
/// worker (the watcher reads just after each beat: well within this).
const READ_GAP: u32 = 2;
/// The longest time between two taker ticks of one worker (the watcher
/// wakes the taker at a holder's deadline; ticks in between change
/// nothing this model checks).
const TICK_GAP: u32 = 4;

const IDS: [&str; 2] = ["w0", "w1"];
const INSTANCES: [&str; 2] = ["i0", "i1"];

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn at(t: u32) -> Instant {
    base() + Duration::from_secs(u64::from(t))
}

fn secs(i: Instant) -> u32 {
    i.saturating_duration_since(base()).as_secs() as u32
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Fault {
    /// The worker's beats stop landing from `at` on; its lease-table
    /// writes still work.
    BeatsFail { who: usize, at: u32 },
    /// The worker stops at `at`.
    Kill { who: usize, at: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Worker {
    alive: bool,
    beats_fail: bool,
    next_beat: u32,
    /// When the last beat that landed was sent.
    last_beat: Option<u32>,
    last_read: Option<u32>,
    last_tick: u32,
    tracker: LivenessTracker,
    /// The lease item as this worker's scans last saw it: counter, owner,
    /// and since when (the expiry tracker's view of one lease).
    seen: Option<(u64, Option<usize>, u32)>,
    /// The tenure held and its validity (exclusive), if any.
    held: Option<u32>,
    /// Beat, read and tick already done in this second.
    done: [bool; 3],
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    t: u32,
    fault: Option<Fault>,
    /// Lease durations and beat intervals, in seconds.
    durations: [u32; 2],
    intervals: [u32; 2],
    owner: Option<usize>,
    counter: u64,
    tenure: u64,
    records: [u64; 2],
    workers: [Worker; 2],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Beat(usize),
    Read(usize),
    Tick(usize),
    Advance,
}

struct LeaseModel {
    horizon: u32,
}

impl State {
    fn config(&self, w: usize) -> LeaseConfig {
        LeaseConfig::builder(IDS[w])
            .lease_duration(Duration::from_secs(u64::from(self.durations[w])))
            .renew_interval(Duration::from_secs(u64::from(self.intervals[w])))
            .build()
            .expect("a valid model configuration")
    }

    /// How long a tenure is usable after what its validity counts from.
    fn usable(&self, w: usize) -> u32 {
        let c = self.config(w);
        (c.lease_duration - c.fence_margin).as_secs() as u32
    }

    fn lease(&self) -> Lease {
        let mut lease = Lease::new("shard", Checkpoint::TrimHorizon);
        lease.owner = self.owner.map(|o| IDS[o].to_owned());
        lease.tenure = self
            .owner
            .map(|o| format!("{}.{}", INSTANCES[o], self.tenure));
        lease.counter = self.counter;
        lease
    }

    fn beats(&self) -> Vec<Beat> {
        (0..2)
            .map(|w| Beat {
                instance: INSTANCES[w].to_owned(),
                worker: IDS[w].to_owned(),
                counter: self.records[w],
                held: u64::from(self.owner == Some(w)),
                lease_duration: Some(Duration::from_secs(u64::from(self.durations[w]))),
                beat_interval: Some(Duration::from_secs(u64::from(self.intervals[w]))),
                ..Beat::default()
            })
            .collect()
    }

    /// Workers that may process the lease now.
    fn processing(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| w.alive && w.held.is_some_and(|v| v > self.t))
            .count()
    }

    fn beat(&mut self, w: usize) {
        let t = self.t;
        let usable = self.usable(w);
        let worker = &mut self.workers[w];
        worker.done[0] = true;
        worker.next_beat = t + self.intervals[w];
        if worker.beats_fail {
            return;
        }
        self.records[w] += 1;
        worker.last_beat = Some(t);
        // `Held::extend`: a lapsed tenure stays lapsed.
        if let Some(valid) = worker.held
            && valid > t
        {
            worker.held = Some(valid.max(t + usable));
        }
    }

    fn read(&mut self, w: usize) {
        let beats = self.beats();
        let worker = &mut self.workers[w];
        worker.done[1] = true;
        worker.tracker.observe(beats, at(self.t), at(self.t));
        worker.last_read = Some(self.t);
    }

    fn tick(&mut self, w: usize) {
        let t = self.t;
        let lease = self.lease();
        let config = self.config(w);
        let d = self.durations[w];
        let usable = self.usable(w);
        let (owner, counter) = (self.owner, self.counter);
        let worker = &mut self.workers[w];
        worker.done[2] = true;
        worker.last_tick = t;
        // No recent read of the records: nothing can be judged.
        let Some(read) = worker.last_read.filter(|r| t - r < d) else {
            return;
        };
        // The scan: an observation of the item, and of a tenure held here.
        match worker.seen {
            Some((c, o, _)) if c == counter && o == owner => {}
            _ => worker.seen = Some((counter, owner, t)),
        }
        if worker.held.is_some() && owner != Some(w) {
            worker.held = None;
        }
        let since = worker.seen.map(|(_, _, s)| s).unwrap_or(t);
        let own = config.lease_duration;
        let expired = match worker.tracker.judge(&lease, own, at(t)) {
            Some(alive) => free_by_liveness(alive, Some(at(since)), at(read)),
            None => t - since >= d,
        };
        let peers: Vec<&str> = worker
            .tracker
            .alive(own, at(t))
            .into_iter()
            .map(|b| b.worker.as_str())
            .collect();
        let view = LeaseView {
            key: "shard",
            owner: owner.map(|o| IDS[o]),
            expired,
            unrenewed_for: Duration::from_secs(u64::from(t - since)),
            held_here: worker.held.is_some(),
            other_process: false,
            in_handoff: false,
            seen_alive: true,
            // The lease carries load, so the decision weighs by it: a lone
            // lease is never worth a load steal either (its holder would
            // keep nothing).
            load: Some(100.0),
        };
        let decision = decide(&BalanceInput {
            me: IDS[w],
            leases: vec![view],
            max_leases_per_worker: usize::MAX,
            max_leases_to_steal: config.max_leases_to_steal,
            peers,
            stale_after: own,
            foreign: Vec::new(),
            balance: Balance::ByLoad,
        });
        let beat = worker.last_beat.map(at);
        let decision = unless_unbeaten(can_hold(beat, at(t), &config), decision);
        if decision.take.is_empty() && decision.reclaim.is_empty() {
            return;
        }
        // The conditional write lands (nothing else writes in between):
        // a fresh tenure, valid from the scan.
        let from = secs(valid_from(beat, at(t), own));
        self.owner = Some(w);
        self.counter += 1;
        self.tenure += 1;
        let valid = from + usable;
        let worker = &mut self.workers[w];
        worker.held = (valid > t).then_some(valid);
        worker.seen = Some((self.counter, self.owner, t));
    }

    /// Whether time may pass: every worker did what its cadence owes now.
    fn may_advance(&self) -> bool {
        self.workers.iter().all(|w| {
            !w.alive
                || ((w.next_beat > self.t || w.done[0])
                    && w.last_read.is_some_and(|r| self.t - r < READ_GAP)
                    && self.t - w.last_tick < TICK_GAP)
        })
    }

    fn advance(&mut self) {
        self.t += 1;
        let t = self.t;
        for worker in &mut self.workers {
            worker.done = [false; 3];
            // The fence loop: a tenure whose validity ran out ends.
            if worker.held.is_some_and(|v| v <= t) {
                worker.held = None;
            }
        }
        match self.fault {
            Some(Fault::BeatsFail { who, at }) if at == t => self.workers[who].beats_fail = true,
            Some(Fault::Kill { who, at }) if at == t => {
                self.workers[who].alive = false;
                self.workers[who].held = None;
            }
            _ => {}
        }
    }

    /// The lease is held by the worker the fault spared, once the fault is
    /// old enough.
    fn taken_over_in_time(&self) -> bool {
        let (who, from) = match self.fault {
            Some(Fault::BeatsFail { who, at } | Fault::Kill { who, at }) => (who, at),
            None => return true,
        };
        let other = 1 - who;
        let bound = self.durations[who] + self.intervals[who] + READ_GAP + TICK_GAP + 2;
        self.t < from + bound
            || self.workers[other]
                .held
                .is_some_and(|v| v > self.t && self.owner == Some(other))
    }
}

impl LeaseModel {
    fn scenario(durations: [u32; 2], intervals: [u32; 2], fault: Option<Fault>) -> State {
        let worker = |_: usize| Worker {
            alive: true,
            beats_fail: false,
            next_beat: 0,
            last_beat: None,
            last_read: None,
            last_tick: 0,
            tracker: LivenessTracker::default(),
            seen: None,
            held: None,
            done: [false; 3],
        };
        let mut s = State {
            t: 0,
            fault,
            durations,
            intervals,
            owner: None,
            counter: 0,
            tenure: 0,
            records: [0, 0],
            workers: [worker(0), worker(1)],
        };
        // w0 holds the lease: it beat, read and took at time 0.
        s.beat(0);
        s.beat(1);
        s.read(0);
        s.tick(0);
        assert_eq!(s.owner, Some(0), "w0 starts as the holder");
        s
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![
            // A rolling change of lease_duration: 30 s and 10 s.
            Self::scenario([30, 10], [15, 5], None),
            // The holder's beats fail; its lease-table writes work.
            Self::scenario([10, 10], [5, 5], Some(Fault::BeatsFail { who: 0, at: 3 })),
            Self::scenario([10, 10], [5, 5], Some(Fault::Kill { who: 0, at: 3 })),
        ]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (w, worker) in s.workers.iter().enumerate() {
            if !worker.alive {
                continue;
            }
            if s.t >= worker.next_beat && !worker.done[0] {
                actions.push(Action::Beat(w));
            }
            if !worker.done[1] {
                actions.push(Action::Read(w));
            }
            if !worker.done[2] {
                actions.push(Action::Tick(w));
            }
        }
        if s.t < self.horizon && s.may_advance() {
            actions.push(Action::Advance);
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut next = s.clone();
        match action {
            Action::Beat(w) => next.beat(w),
            Action::Read(w) => next.read(w),
            Action::Tick(w) => next.tick(w),
            Action::Advance => next.advance(),
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no two workers may process the lease", |_, s: &State| {
                s.processing() <= 1
            }),
            Property::always(
                "a stopped holder's lease is taken in time",
                |_, s: &State| s.taken_over_in_time(),
            ),
        ]
    }
}

/// The horizon: `MODEL_HORIZON` seconds, 26 by default (`make test`: the
/// first moment a stopped holder's lease is overdue);
/// `make check-model` goes deeper.
fn horizon() -> u32 {
    std::env::var("MODEL_HORIZON")
        .ok()
        .and_then(|h| h.parse().ok())
        .unwrap_or(26)
}

#[test]
fn the_lease_protocol_holds_its_properties_in_every_interleaving() {
    let started = std::time::Instant::now();
    let checker = LeaseModel { horizon: horizon() }
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    let states = checker.unique_state_count();
    println!(
        "model: {states} states to a horizon of {} s, max depth {}, in {:.1} s",
        horizon(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker.assert_properties();
    assert!(states > 1_000, "the model explored {states} states");
}
