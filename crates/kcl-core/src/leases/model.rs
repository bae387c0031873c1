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
//! not land takes nothing (`taker::unless_unbeaten`, `shared::beats::can_hold`),
//! the validity a take and a beat give (`shared::beats::valid_from`), the
//! judgement of an observed tenure (`handoff::judge`: lost, draining,
//! forced), and whether an awaited handoff is forced on its previous
//! owner's death (`awaited::previous_owner_dead`,
//! `awaited::forced_by_death`). What the model writes itself is the
//! orchestration: when each worker beats, reads, ticks, polls an awaited
//! handoff and fences, as the renewer, watcher and taker loops do.
//!
//! Within a second the steps of both workers interleave in every order,
//! and all happen at the same instant: a read "asked at t" that comes
//! before a beat at t missed it, and an item first seen at t was seen no
//! earlier than that read was asked. That is the equal instant of a paused
//! (or coarse) clock, where a read asked as a beat and a reclaim land is
//! served before them.
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
//! second; a holder whose beats fail from the third second to its beat at
//! 10 s (a pause: its tenure lapsed, it beats and reclaims the lease the
//! very second its peer, which first saw its record at 0 s, may judge it
//! dead by a read that missed that beat), whose peer steals the lease
//! whenever `decide` lets it (simulator seed 13917891215581911684),
//! explored to `PAUSE_TAIL` past the pause. Reads come at most `READ_GAP`
//! apart and ticks at most `TICK_GAP` apart, at any moment within that;
//! beats on their cadence; an awaited handoff is polled every second.
//!
//! Steals (`model/handoff.rs`): one lease between two workers is never
//! stolen (a lead of one is never worth a steal), so in the pause scenario
//! w0 also holds a second lease the model does not follow, `shard2`, in a
//! handoff to it (counted as w0's, never free, never stolen): it tips
//! w1's balance to a steal of `shard` whenever `decide` allows one. The
//! victim of a steal drains until its tenure lapses, never completing the
//! handoff, and the thief activates only by forcing it on the victim's
//! death. Left out, both shortening the victim's tenure or delaying the
//! thief: the victim's renewals of the item while it drains (so its beats
//! extend it no further), and the deadline a handoff timeout after the
//! victim was told.
//!
//! Not covered here: completed handoffs, the handoff deadline, the
//! per-lease mode, Java KCL workers, lost answers and reordered requests,
//! restarts under the same id, more workers or leases. The seeded fleet
//! simulator (`tests/sim.rs`) runs those on the whole engine.

use std::sync::OnceLock;
use std::time::Duration;

use stateright::{Checker, Model, Property};
use tokio::time::Instant;

use crate::config::LeaseConfig;
use crate::lease::{Checkpoint, Lease};
use crate::leases::balance::{Balance, BalanceInput, LeaseView, decide};
use crate::leases::liveness::LivenessTracker;
use crate::leases::shared::beats::can_hold;
use crate::leases::taker::{free_by_liveness, unless_unbeaten};
use crate::store::Beat;

mod handoff;

use handoff::{Claim, Stage, Tenure};

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
    /// The worker's beats fail from `at` until `until` (its process
    /// paused, its lease-table writes working): back, it beats and
    /// reclaims what its lapsed tenures held.
    BeatsPause { who: usize, at: u32, until: u32 },
}

/// The lease item as one worker's scans last saw it (`ExpiryTracker`'s
/// view of one lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Seen {
    counter: u64,
    owner: Option<usize>,
    since: u32,
    /// It changed at least once while watched.
    moved: bool,
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
    seen: Option<Seen>,
    held: Option<Tenure>,
    /// Beat, read, tick and handoff poll already done in this second.
    done: [bool; 4],
    /// It began awaiting a handoff in this second (a steal): its first
    /// poll may come in the next.
    began_awaiting: bool,
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
    /// The owner's tenure id (a fresh one at every take, reclaim and
    /// steal).
    tenure: u64,
    /// The previous owner of a handoff and its tenure id (the item's
    /// `checkpoint_owner` and `checkpoint_owner_tenure`).
    previous: Option<(usize, u64)>,
    /// w0 holds a second lease, in a handoff to it (see the module's doc).
    second_lease: bool,
    records: [u64; 2],
    workers: [Worker; 2],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Beat(usize),
    Read(usize),
    Tick(usize),
    Poll(usize),
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
        if let Some((p, id)) = self.previous {
            lease.checkpoint_owner = Some(IDS[p].to_owned());
            lease.checkpoint_owner_tenure = Some(format!("{}.{id}", INSTANCES[p]));
        }
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

    /// Workers that may process the lease now (a thief awaiting a
    /// handoff does not; a victim draining does).
    fn processing(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| w.alive)
            .filter_map(|w| w.held)
            .filter(|h| h.valid > self.t && !matches!(h.stage, Stage::Awaiting { .. }))
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
        self.workers[w].last_beat = Some(t);
        // `judge_asked`: a thief that stole a lease of ours asked for it in
        // our record (it tells at once); the beat judges it before it
        // renews anything.
        if self.previous.is_some_and(|(p, _)| p == w) {
            self.observe_held(w);
        }
        // `Held::extend`: a lapsed tenure stays lapsed; one handing off is
        // extended no further than its last drain renewal (none here).
        if let Some(h) = &mut self.workers[w].held
            && h.valid > t
            && h.stage != Stage::HandingOff
        {
            h.valid = h.valid.max(t + usable);
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
        let d = self.durations[w];
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
            Some(s) if s.counter == counter && s.owner == owner => {}
            before => {
                worker.seen = Some(Seen {
                    counter,
                    owner,
                    since: t,
                    moved: before.is_some(),
                });
            }
        }
        self.observe_held(w);
        let decision = self.decision(w, read);
        let named = |keys: &[String]| keys.iter().any(|k| k == "shard");
        if named(&decision.reclaim) {
            self.claim(w, Claim::Reclaim);
        } else if named(&decision.take) {
            self.claim(w, Claim::Take);
        } else if named(&decision.steal) {
            self.claim(w, Claim::Steal);
        }
    }

    /// What `balance::decide` makes of the scan that `w`'s tick just made,
    /// judged by its read asked at `read`, as far as this instance may act
    /// on it now.
    fn decision(&self, w: usize, read: u32) -> crate::leases::balance::Decision {
        let t = self.t;
        let lease = self.lease();
        let config = self.config(w);
        let worker = &self.workers[w];
        let seen = worker.seen.expect("the tick scanned");
        let own = config.lease_duration;
        let expired = match worker.tracker.judge(&lease, own, at(t)) {
            Some(alive) => free_by_liveness(alive, Some(at(seen.since)), at(read)),
            None => t - seen.since >= self.durations[w],
        };
        let peers: Vec<&str> = worker
            .tracker
            .alive(own, at(t))
            .into_iter()
            .map(|b| b.worker.as_str())
            .collect();
        let mut leases = vec![LeaseView {
            key: "shard",
            owner: self.owner.map(|o| IDS[o]),
            expired,
            unrenewed_for: Duration::from_secs(u64::from(t - seen.since)),
            held_here: worker.held.is_some(),
            other_process: false,
            in_handoff: lease.in_handoff(),
            seen_alive: seen.moved || worker.tracker.runs(&lease, own),
            // The lease carries load, so the decision weighs by it: a lone
            // lease is never worth a load steal either (its holder would
            // keep nothing).
            load: Some(100.0),
        }];
        if self.second_lease {
            leases.push(LeaseView {
                key: "shard2",
                owner: Some(IDS[0]),
                expired: false,
                unrenewed_for: Duration::ZERO,
                held_here: w == 0,
                other_process: false,
                in_handoff: true,
                seen_alive: true,
                load: Some(100.0),
            });
        }
        let decision = decide(&BalanceInput {
            me: IDS[w],
            leases,
            max_leases_per_worker: usize::MAX,
            max_leases_to_steal: config.max_leases_to_steal,
            peers,
            stale_after: own,
            foreign: Vec::new(),
            balance: Balance::ByLoad,
            resting: Vec::new(),
        });
        let beat = worker.last_beat.map(at);
        unless_unbeaten(can_hold(beat, at(t), &config), decision)
    }

    /// Whether time may pass: every worker did what its cadence owes now
    /// (an awaited handoff is polled every second after the steal's).
    fn may_advance(&self) -> bool {
        self.workers.iter().all(|w| {
            let awaiting = matches!(w.held.map(|h| h.stage), Some(Stage::Awaiting { .. }));
            let polled = !awaiting || w.done[3] || w.began_awaiting;
            !w.alive
                || ((w.next_beat > self.t || w.done[0])
                    && w.last_read.is_some_and(|r| self.t - r < READ_GAP)
                    && self.t - w.last_tick < TICK_GAP
                    && polled)
        })
    }

    fn advance(&mut self) {
        self.t += 1;
        let t = self.t;
        for worker in &mut self.workers {
            worker.done = [false; 4];
            worker.began_awaiting = false;
            // The fence loop: a tenure whose validity ran out ends.
            if worker.held.is_some_and(|h| h.valid <= t) {
                worker.held = None;
            }
        }
        match self.fault {
            Some(Fault::BeatsFail { who, at } | Fault::BeatsPause { who, at, .. }) if at == t => {
                self.workers[who].beats_fail = true;
            }
            Some(Fault::BeatsPause { who, until, .. }) if until == t => {
                self.workers[who].beats_fail = false;
            }
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
            // It comes back: the properties checked are safety's.
            Some(Fault::BeatsPause { .. }) | None => return true,
        };
        let other = 1 - who;
        let bound = self.durations[who] + self.intervals[who] + READ_GAP + TICK_GAP + 2;
        self.t < from + bound
            || self.workers[other]
                .held
                .is_some_and(|h| h.valid > self.t && self.owner == Some(other))
    }
}

/// How long past a pause's end its scenario is explored. A read asked at
/// the end at the latest may miss the beat that ends the pause; the next
/// read is due `READ_GAP` later, so every tick and poll that judges by
/// such a read comes by then, and what each does shows in the state at
/// once (a take processes, a forced handoff too). From there both workers
/// beat on as in the scenario without a fault.
const PAUSE_TAIL: u32 = READ_GAP;

impl LeaseModel {
    /// The horizon of `s`'s scenario.
    fn horizon_of(&self, s: &State) -> u32 {
        match s.fault {
            Some(Fault::BeatsPause { until, .. }) => self.horizon.min(until + PAUSE_TAIL),
            _ => self.horizon,
        }
    }

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
            done: [false; 4],
            began_awaiting: false,
        };
        let mut s = State {
            t: 0,
            fault,
            durations,
            intervals,
            owner: None,
            counter: 0,
            tenure: 0,
            previous: None,
            second_lease: false,
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
            // w0's beats fail from 3 s to its beat at 10 s, the second w1
            // (which first saw its record at 0 s) may judge it dead; w0
            // reclaims as its beat lands, and w1 steals when it may.
            State {
                second_lease: true,
                ..Self::scenario(
                    [10, 10],
                    [5, 5],
                    Some(Fault::BeatsPause {
                        who: 0,
                        at: 3,
                        until: 10,
                    }),
                )
            },
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
            if !worker.done[3]
                && matches!(worker.held.map(|h| h.stage), Some(Stage::Awaiting { .. }))
            {
                actions.push(Action::Poll(w));
            }
        }
        if s.t < self.horizon_of(s) && s.may_advance() {
            actions.push(Action::Advance);
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut next = s.clone();
        match action {
            Action::Beat(w) => next.beat(w),
            Action::Read(w) => next.read(w),
            Action::Tick(w) => next.tick(w),
            Action::Poll(w) => next.poll(w),
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
