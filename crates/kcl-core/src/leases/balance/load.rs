//! Balancing by load: which leases a thief takes so that what the leases
//! carry, not how many there are, evens out over the fleet.
//!
//! Each holder publishes what its leases carry on their items (KB/s over
//! a sliding window, `throughputKBps`); every worker reads the same
//! figures in its scan, so every worker weighs the fleet alike.
//!
//! **Weights.** A lease weighs its figure plus [`LEASE_COST`] times the
//! mean figure of all leases: a lease costs something of its own (a
//! reader, a processor, its memory) even when idle, and idle leases can
//! then move like any other. A worker weighs what the leases it holds
//! weigh. Missing figures weigh as idle leases.
//!
//! **The rule.** A thief looks at the heaviest worker (the victim; ties go
//! to the smallest id, as in the count rule) and takes, one at a time and
//! at most `max_leases_to_steal` a tick, the lease that leaves the pair
//! closest to even, among those whose move still *helps* once every
//! figure is taken [`TOLERANCE`] (20 %) off against it: what the victim
//! keeps without the lease must exceed `(1 + 0.2) / (1 - 0.2) = 1.5` times
//! what the thief carries ([`helps`]). That is the hysteresis: moving a
//! lease of weight `x` from `V` to `T` lowers the sum of squared worker
//! weights by `2x (V - x - T)`, so it helps exactly when the victim's rest
//! `V - x` exceeds `T`, whatever `x` is; with figures up to 20 % off, the
//! rest read may be 20 % high and the thief's load 20 % low, hence the
//! factor 1.5. So:
//!
//! - every move lowers the true sum of squares, however the figures were
//!   off (within 20 %): no state of the fleet can come back, and a fleet
//!   whose figures jitter settles instead of moving leases back and forth;
//! - a move never raises the heaviest worker nor lowers the lightest (the
//!   thief ends below the victim's old weight, the victim above the
//!   thief's): the spread never widens;
//! - with exact figures the fleet stops once, for the lightest worker `T`
//!   and the heaviest `V`, every lease `x` of `V` leaves `V - x <= 1.5 T`:
//!   the heaviest worker carries at most 1.5 times the lightest plus its
//!   own lightest lease. One hot lease heavier than the fleet's mean stays
//!   alone on its worker, as no move can split it.
//!
//! **Counts.** Free leases are still taken by count (every worker up to
//! `ceil(leases / workers)`), and a thief never holds more than
//! [`count_cap`] leases, twice that share: a fleet balanced by load holds
//! counts within that bound of each other. Load balance applies only
//! while some lease carries a figure and no Java KCL worker shares the
//! table (the Java leader balances its own workers by its own figures;
//! kcl balances counts against them, as before) and every holder is a kcl
//! worker known from its liveness record (a Java worker not counted at
//! the moment still holds leases): otherwise the decision is the count
//! rule's. A worker that takes no lease (it stops, sits out, or cannot
//! read the table) is no holder here: it and its leases are left out
//! before the weighing, so the others still balance by load.

use std::collections::BTreeMap;

use super::{Balance, BalanceInput, Decision, LeaseView, counted_for, spread};

/// How far off a published figure may be, as a fraction, without moving a
/// lease the wrong way: figures are measured over a window and written
/// again when they moved by more than this.
pub(crate) const TOLERANCE: f64 = 0.2;

/// What a lease weighs beyond its figure, as a fraction of the mean figure
/// of all leases.
pub(crate) const LEASE_COST: f64 = 0.05;

/// The most leases a thief holds after a load steal: twice its count share
/// `ceil(leases / workers)`, and never more than `max_leases_per_worker`.
pub(crate) fn count_cap(leases: usize, workers: usize, max_leases_per_worker: usize) -> usize {
    (2 * leases.div_ceil(workers.max(1)))
        .max(1)
        .min(max_leases_per_worker)
}

/// True if moving a lease from a worker that keeps `rest` without it to a
/// worker weighing `thief` lowers the fleet's sum of squared weights even
/// with every figure [`TOLERANCE`] off against the move.
pub(crate) fn helps(rest: f64, thief: f64) -> bool {
    rest / (1.0 + TOLERANCE) > thief / (1.0 - TOLERANCE)
}

/// The figure a lease is weighed by: its published one if it is a
/// positive finite number, else none.
fn figure(lease: &LeaseView<'_>) -> f64 {
    lease
        .load
        .filter(|x| x.is_finite() && *x > 0.0)
        .unwrap_or(0.0)
}

/// The weights of one decision: per lease (in the input's order) and per
/// worker.
#[derive(Debug, Clone)]
pub(super) struct Weights<'a> {
    leases: Vec<f64>,
    workers: BTreeMap<&'a str, f64>,
}

impl<'a> Weights<'a> {
    /// The weights when the decision balances by load: `None` when it
    /// counts (balance by count configured, no lease with a figure, or a
    /// holder that is not a kcl worker known from its liveness record: a
    /// Java KCL worker, counted or not).
    pub(super) fn of(input: &BalanceInput<'a>, counts: &BTreeMap<&'a str, usize>) -> Option<Self> {
        if input.balance != Balance::ByLoad || !input.foreign.is_empty() {
            return None;
        }
        // A Java worker judged idle for a moment (it renews a lease handed
        // to it only once it found it) is not among the Java workers
        // counted, but still holds leases: balancing by load against it
        // would steal from a worker whose leader balances by its own rule.
        if counts
            .keys()
            .any(|w| *w != input.me && !input.peers.contains(w))
        {
            return None;
        }
        let total: f64 = input.leases.iter().map(figure).sum();
        if total <= 0.0 {
            return None;
        }
        let cost = LEASE_COST * total / input.leases.len() as f64;
        let leases: Vec<f64> = input.leases.iter().map(|l| figure(l) + cost).collect();
        let mut workers: BTreeMap<&str, f64> = counts.keys().map(|w| (*w, 0.0)).collect();
        for (lease, weight) in input.leases.iter().zip(&leases) {
            if let Some(holder) = counted_for(lease, input.me) {
                *workers.entry(holder).or_default() += weight;
            }
        }
        Some(Weights { leases, workers })
    }

    fn of_worker(&self, worker: &str) -> f64 {
        self.workers.get(worker).copied().unwrap_or(0.0)
    }
}

/// The load steal: leases of the heaviest worker that bring it and this
/// worker closest to even, each only if it [`helps`].
pub(super) fn steal(
    input: &BalanceInput<'_>,
    counts: &BTreeMap<&str, usize>,
    weights: &Weights<'_>,
    decision: &mut Decision,
) {
    let me = input.me;
    let mine = weights.of_worker(me);
    // Heaviest worker; ties broken by name so every tick picks the same.
    let Some((&victim, &heaviest)) = weights
        .workers
        .iter()
        .filter(|(w, _)| **w != me)
        .max_by(|a, b| a.1.total_cmp(b.1).then_with(|| b.0.cmp(a.0)))
    else {
        return;
    };
    if heaviest <= mine {
        return;
    }
    let cap = count_cap(
        input.leases.len(),
        counts.len(),
        input.max_leases_per_worker,
    );
    let held = counts.get(me).copied().unwrap_or(0);
    let mut room = cap.saturating_sub(held).min(input.max_leases_to_steal);
    let mut candidates: Vec<(&str, f64)> = input
        .leases
        .iter()
        .zip(&weights.leases)
        .filter(|(l, _)| {
            l.owner == Some(victim)
                && counted_for(l, me) == Some(victim)
                && !l.in_handoff
                && l.seen_alive
        })
        .map(|(l, w)| (l.key, *w))
        .collect();
    let (mut from, mut to) = (heaviest, mine);
    while room > 0 {
        // The lease that leaves the pair closest to even; ties by a
        // per-thief order, so thieves of one victim pick different ones.
        let best = candidates
            .iter()
            .enumerate()
            .filter(|(_, (_, x))| helps(from - x, to))
            .min_by(|(_, a), (_, b)| {
                let uneven = |x: f64| (from - x - (to + x)).abs();
                uneven(a.1)
                    .total_cmp(&uneven(b.1))
                    .then_with(|| spread(me, a.0).cmp(&spread(me, b.0)))
            })
            .map(|(i, _)| i);
        let Some(i) = best else { break };
        let (key, x) = candidates.swap_remove(i);
        decision.steal.push(key.to_owned());
        from -= x;
        to += x;
        room -= 1;
    }
    if !decision.steal.is_empty() {
        decision.victim = Some(victim.to_owned());
    }
}

#[cfg(test)]
mod tests;
