//! The model's handoffs: a steal's thief awaits the handoff and forces it
//! on its previous owner's death (`renewer::awaited`), and the victim
//! drains; each observation of a held tenure goes through
//! `handoff::judge`, as in production.

use crate::leases::handoff::{Ours, Verdict, judge};
use crate::leases::held::Phase;
use crate::leases::renewer::awaited::{forced_by_death, previous_owner_dead};
use crate::leases::shared::beats::valid_from;
use crate::store::Holder;

use super::{IDS, INSTANCES, Seen, State, at, secs};

/// Where a tenure stands in a handoff (`held::Phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Stage {
    Active,
    /// A steal's thief, not processing until it forces the handoff: the
    /// victim's counter and since when it has seen it
    /// (`Held::watch_previous_owner`; 0 once a read was asked after that:
    /// only its order against reads asked later matters), and the instant
    /// its previous owner's death lets it force the handoff from.
    Awaiting {
        victim: Option<(u64, u32)>,
        force_at: Option<u32>,
    },
    /// A steal's victim, processing while it drains.
    HandingOff,
}

/// One tenure held by a worker (`held::Held`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Tenure {
    /// Its tenure id (`i<worker>.<id>`).
    pub(super) id: u64,
    /// The counter last written or adopted in it.
    pub(super) counter: u64,
    /// Its validity (exclusive).
    pub(super) valid: u32,
    pub(super) stage: Stage,
}

impl Tenure {
    fn name(&self, w: usize) -> String {
        format!("{}.{}", INSTANCES[w], self.id)
    }
}

/// The conditional writes of a tick (`taker::claims`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Claim {
    Take,
    Reclaim,
    Steal,
}

impl State {
    /// `handoff::judge` of what `w` just read of the lease, for the tenure
    /// it holds, in the phase it stands in.
    fn verdict(&self, w: usize, force_at: Option<u32>) -> Option<Verdict> {
        let held = self.workers[w].held?;
        let tenure = held.name(w);
        let phase = match held.stage {
            Stage::Active => Phase::Active,
            Stage::HandingOff => Phase::HandingOff,
            Stage::Awaiting { .. } => Phase::Awaiting {
                from: self
                    .previous
                    .map(|(p, _)| IDS[p])
                    .unwrap_or_default()
                    .to_owned(),
                force_at: force_at.map_or(at(u32::MAX), at),
            },
        };
        let ours = Ours {
            holder: Holder::new(IDS[w], &tenure),
            counter: held.counter,
            phase: &phase,
        };
        Some(judge(ours, Some(&self.lease()), at(self.t)))
    }

    /// An active tenure's observation of the item (`renewer::observe_one`:
    /// the scan's, and a beat's of a lease asked for in its record): lost
    /// to another holder it ends, asked for by a thief it drains.
    pub(super) fn observe_held(&mut self, w: usize) {
        if !self.workers[w]
            .held
            .is_some_and(|h| h.stage == Stage::Active)
        {
            return;
        }
        let verdict = self.verdict(w, None);
        let counter = self.counter;
        let worker = &mut self.workers[w];
        match verdict {
            Some(Verdict::Lost { .. }) => worker.held = None,
            Some(Verdict::Drain) => {
                if let Some(h) = &mut worker.held {
                    h.stage = Stage::HandingOff;
                }
            }
            Some(Verdict::Adopt) => {
                if let Some(h) = &mut worker.held {
                    h.counter = counter;
                }
            }
            _ => {}
        }
    }

    /// `w`'s conditional write of the lease lands (nothing else writes in
    /// between), in a fresh tenure valid from the scan (`Shared::acquired`,
    /// and `Shared::awaiting` alike): a take ends a handoff, a reclaim
    /// keeps it, a steal (`start_handoff`) leaves the counter and makes the
    /// victim's tenure the previous owner's. A steal, or a reclaim in
    /// another worker's handoff, awaits it (`claims::acquired`; the victim
    /// is told at once).
    pub(super) fn claim(&mut self, w: usize, claim: Claim) {
        let t = self.t;
        let own = self.config(w).lease_duration;
        let beat = self.workers[w].last_beat.map(at);
        let from = secs(valid_from(beat, at(t), own));
        let valid = from + self.usable(w);
        match claim {
            Claim::Take => {
                self.counter += 1;
                self.previous = None;
            }
            Claim::Reclaim => self.counter += 1,
            Claim::Steal => self.previous = self.owner.map(|o| (o, self.tenure)),
        }
        let stage = match self.previous {
            Some((p, _)) if p != w => Stage::Awaiting {
                victim: None,
                force_at: None,
            },
            _ => Stage::Active,
        };
        self.owner = Some(w);
        self.tenure += 1;
        let held = Tenure {
            id: self.tenure,
            counter: self.counter,
            valid,
            stage,
        };
        let worker = &mut self.workers[w];
        worker.began_awaiting = matches!(stage, Stage::Awaiting { .. });
        worker.held = (valid > t).then_some(held);
        worker.seen = Some(Seen {
            counter: self.counter,
            owner: self.owner,
            since: t,
            moved: true,
        });
    }

    /// The handoff poller (`awaited::progress_handoff`): reads the awaited
    /// lease, lets the handoff be forced now if the last read shows the
    /// previous owner dead, then acts on `handoff::judge`.
    pub(super) fn poll(&mut self, w: usize) {
        let t = self.t;
        let lease = self.lease();
        let own = self.config(w).lease_duration;
        self.workers[w].done[3] = true;
        let worker = &mut self.workers[w];
        let Some(Tenure {
            stage: Stage::Awaiting { victim, force_at },
            ..
        }) = &mut worker.held
        else {
            return;
        };
        if lease.checkpoint_owner.is_some() {
            // `Held::watch_previous_owner`: when its counter was first seen.
            let since = match *victim {
                Some((c, s)) if c == lease.counter => s,
                _ => t,
            };
            let dead = previous_owner_dead(&worker.tracker, &lease, own, at(t));
            if forced_by_death(dead, at(since), worker.last_read.map(at)) {
                *force_at = Some(force_at.map_or(t, |f| f.min(t)));
            }
            let read_since = worker.last_read.is_some_and(|r| r > since);
            *victim = Some((lease.counter, if read_since { 0 } else { since }));
        }
        let force_at = *force_at;
        match self.verdict(w, force_at) {
            Some(Verdict::Force | Verdict::Activate) => self.activate(w),
            Some(Verdict::Lost { .. }) => self.workers[w].held = None,
            Some(Verdict::Adopt) => {
                if let Some(h) = &mut self.workers[w].held {
                    h.counter = self.counter;
                }
            }
            _ => {}
        }
    }

    /// The forced take (or the renewal of a completed handoff) lands:
    /// `Shared::activate` gives a fresh validity from its send, unless the
    /// awaiting tenure lapsed first.
    fn activate(&mut self, w: usize) {
        let t = self.t;
        let own = self.config(w).lease_duration;
        let usable = self.usable(w);
        self.counter += 1;
        self.previous = None;
        let counter = self.counter;
        let worker = &mut self.workers[w];
        let beat = worker.last_beat.map(at);
        let from = secs(valid_from(beat, at(t), own));
        worker.held = worker.held.filter(|h| h.valid > t).map(|h| Tenure {
            counter,
            valid: from + usable,
            stage: Stage::Active,
            ..h
        });
    }
}
