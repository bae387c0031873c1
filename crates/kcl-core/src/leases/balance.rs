//! The balancing decision: a pure function from one scan's view of the
//! table to the leases this worker should take or steal.
//!
//! The lease taker gathers the view (one scan per tick) and applies the
//! decision; everything about *what* to do lives here, where it is tested
//! with tables of cases and property tests.
//!
//! The rules:
//! - Live workers are the owners of unexpired leases, plus this worker, which
//!   counts itself even while it holds nothing (otherwise a new worker would
//!   compute a target of zero and never get its share). A worker whose
//!   record says it takes no lease (stopping, sitting out, cut off from the
//!   lease table) is left out, and the leases it holds with it.
//! - Leases the table says are this worker's, in a tenure this process
//!   wrote, but that it does not hold (a take whose answer was lost, a
//!   fenced tenure) are reclaimed. Those under a tenure another process
//!   wrote with the same worker id (a second process, or a previous run
//!   before a restart) count as this worker's while they live (the fleet
//!   sees one id) and are taken only once they expire, so the two
//!   processes never take leases from under each other.
//! - `target = min(ceil(leases / live workers), max_leases_per_worker)`.
//! - Take every available lease (unowned or expired) this worker is owed, in
//!   one tick, the longest-unrenewed first.
//! - Leases that stay free (unowned for a lease duration, or expired and
//!   untouched for two) are taken beyond the target: the peer whose share
//!   they are may not be able to take them (its scans fail).
//! - Only when nothing is available, steal from the most loaded worker
//!   `min(target - mine, (victim - mine) / 2)` leases, capped by
//!   `max_leases_to_steal`. Stealing half the gap at most means the thief
//!   never ends above its victim, so steals never flip-flop; a lead of a
//!   single lease is never worth a steal. Only leases whose holder this
//!   worker has seen write are stolen (a worker that stopped before this
//!   one started gets no handoff requests; its leases expire first).
//! - Balancing by load ([`Balance::ByLoad`], the default) replaces the
//!   count steal with the load steal of [`load`] once any lease carries a
//!   load figure and no Java KCL worker shares the table: leases are
//!   weighed by what they carry, and a thief takes the leases that bring
//!   the most loaded worker closest to itself, only when the move helps
//!   even with every figure 20 % off against it (see [`load`] for the rule,
//!   its margin and its bounds). Takes of free leases stay by count.

use std::collections::BTreeMap;
use std::time::Duration;

pub(crate) use crate::config::Balance;

pub(crate) mod load;

/// One lease as this worker sees it at the end of a scan.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LeaseView<'a> {
    /// The lease key.
    pub(crate) key: &'a str,
    /// The owner recorded in the table.
    pub(crate) owner: Option<&'a str>,
    /// True when this worker has seen the counter stand still for the lease
    /// duration (judged on its own monotonic clock).
    pub(crate) expired: bool,
    /// How long this worker has seen the counter stand still.
    pub(crate) unrenewed_for: Duration,
    /// True when this worker holds the lease right now.
    pub(crate) held_here: bool,
    /// True when the owner is this worker's id but the tenure was written by
    /// another process under the same id (alive, or stopped: a restart).
    pub(crate) other_process: bool,
    /// True while a graceful handoff of the lease runs; it is never stolen
    /// again before it completes.
    pub(crate) in_handoff: bool,
    /// True when this worker has seen the lease's holder write since it
    /// started watching (the lease renewed or taken, or a beat of the
    /// holder's liveness record). Only such leases are stolen: a worker
    /// seen only standing still may have stopped before this one started,
    /// and a handoff asked of it would never complete; its leases are
    /// taken once they expire instead.
    pub(crate) seen_alive: bool,
    /// What the lease carries, as its holder last published it (KB/s, the
    /// lease item's `throughputKBps`); `None` when no figure was published
    /// (a lease nobody processed, or one held by a Java KCL worker that
    /// publishes none), which weighs as an idle lease.
    pub(crate) load: Option<f64>,
}

/// The inputs of one decision.
#[derive(Debug, Clone)]
pub(crate) struct BalanceInput<'a> {
    /// This worker's id.
    pub(crate) me: &'a str,
    /// Every lease that needs an owner (finished leases left out).
    pub(crate) leases: Vec<LeaseView<'a>>,
    /// Upper bound on leases one worker holds.
    pub(crate) max_leases_per_worker: usize,
    /// Upper bound on leases stolen in one decision (0 disables stealing).
    pub(crate) max_leases_to_steal: usize,
    /// Live workers known from their liveness records (this one included or
    /// not), counted even while they hold nothing: a fleet starting together
    /// divides the leases at once instead of the first tick taking all.
    pub(crate) peers: Vec<&'a str>,
    /// How long an unowned lease must stay untaken before any worker takes
    /// it beyond its target (the lease duration).
    pub(crate) stale_after: Duration,
    /// Live workers of the Java KCL 3.x (known from their reports, and
    /// among `peers` too): they take no lease themselves (their leader
    /// assigns), so the most loaded kcl worker hands them their share.
    pub(crate) foreign: Vec<&'a str>,
    /// Whether leases are weighed by their load figures or counted (see
    /// [`load`]).
    pub(crate) balance: Balance,
    /// Live kcl workers whose records say they take no lease now (they
    /// stop, sit out, or cannot read the lease table): they and the leases
    /// they hold are left out of the division, so the others share every
    /// other lease between them, and nothing is stolen from them. This
    /// worker's own id, and an id also among `peers` (another process
    /// under it takes leases), are not left out.
    pub(crate) resting: Vec<&'a str>,
}

/// What the lease taker should do this tick.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Decision {
    /// Leases the table says are ours but that we do not hold (a take whose
    /// response was lost, or a restart under the same worker id): take them
    /// back under the counter guard.
    pub(crate) reclaim: Vec<String>,
    /// Unowned or expired leases to take, most urgent first.
    pub(crate) take: Vec<String>,
    /// Leases to steal, all from `victim`.
    pub(crate) steal: Vec<String>,
    /// The worker being stolen from, when `steal` is not empty.
    pub(crate) victim: Option<String>,
    /// Leases of ours to hand to `give_to` by graceful handoff.
    pub(crate) give: Vec<String>,
    /// The Java KCL worker `give` goes to.
    pub(crate) give_to: Option<String>,
    /// The target this worker computed (for logs and metrics).
    pub(crate) target: usize,
    /// Live workers counted, this one included.
    pub(crate) live_workers: usize,
}

/// Decides what this worker takes and steals, from one view of the table.
pub(crate) fn decide(input: &BalanceInput<'_>) -> Decision {
    // A worker id one of whose processes takes leases takes leases (two
    // processes under one id hold its leases between them).
    let resting =
        |w: &str| w != input.me && input.resting.contains(&w) && !input.peers.contains(&w);
    if !input.resting.iter().any(|w| resting(w)) {
        return decide_among(input);
    }
    // Counting a worker that takes nothing gave the others a target that
    // left some free leases to it: they stood unread until it took leases
    // again, or until they turned stale for a peer that had watched them
    // for two lease durations.
    let mut working = input.clone();
    working
        .leases
        .retain(|l| counted_for(l, input.me).is_none_or(|h| !resting(h)));
    decide_among(&working)
}

/// [`decide`] among the workers that take leases.
fn decide_among(input: &BalanceInput<'_>) -> Decision {
    let me = input.me;
    let (counts, reclaim) = count(input);
    let live_workers = counts.len();
    let total = input.leases.len();
    let target = total
        .div_ceil(live_workers)
        .min(input.max_leases_per_worker);
    let mine = counts[me];
    let mut decision = Decision {
        reclaim,
        target,
        live_workers,
        ..Decision::default()
    };
    let stale = stale(input);
    let weights = load::Weights::of(input, &counts);
    if mine >= target {
        if !stale.is_empty() && mine < input.max_leases_per_worker {
            decision.take = stale
                .into_iter()
                .take(input.max_leases_per_worker - mine)
                .collect();
        } else if let Some(weights) = &weights {
            load::steal(input, &counts, weights, &mut decision);
        } else {
            give(input, &counts, target, &mut decision);
        }
        return decision;
    }
    let owed = target - mine;

    let available = available(input);
    if !available.is_empty() {
        decision.take = take_first(input, &counts, available, owed);
        return decision;
    }
    if let Some(weights) = &weights {
        load::steal(input, &counts, weights, &mut decision);
        return decision;
    }
    steal_by_count(input, &counts, owed, &mut decision);
    decision
}

/// The leases each live worker holds (this worker and every known peer
/// counted, even with none), and the leases to reclaim: ours in the
/// table, in a tenure this process wrote, but not held here.
fn count<'v>(input: &'v BalanceInput<'_>) -> (BTreeMap<&'v str, usize>, Vec<String>) {
    let me = input.me;
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    counts.insert(me, 0);
    for peer in &input.peers {
        counts.entry(peer).or_insert(0);
    }
    let mut reclaim = Vec::new();
    for lease in &input.leases {
        if let Some(holder) = counted_for(lease, me) {
            *counts.entry(holder).or_default() += 1;
        }
        if lease.owner == Some(me) && !lease.other_process && !lease.held_here {
            reclaim.push(lease.key.to_owned());
        }
    }
    (counts, reclaim)
}

/// The leases taken beyond the target: nobody took them for a lease
/// duration.
fn stale(input: &BalanceInput<'_>) -> Vec<String> {
    let me = input.me;
    // Leases nobody took for a lease duration are taken whatever the
    // target says: a peer counted in the balance may not compete for them
    // (another stream set, or it cannot read the table and has not said so
    // yet: its scans fail while its beats land), and a lease must never
    // stay unread. An expired lease counts once it stood still a lease
    // duration past its expiry.
    input
        .leases
        .iter()
        .filter(|l| {
            let unowned = l.owner.is_none() && !l.in_handoff;
            let abandoned = l.expired && !l.held_here && (l.owner != Some(me) || l.other_process);
            (unowned && l.unrenewed_for >= input.stale_after)
                || (abandoned && l.unrenewed_for >= input.stale_after * 2)
        })
        .map(|l| l.key.to_owned())
        .collect()
}

/// The leases free to take: unowned, or expired and not this process's.
fn available<'v, 'a>(input: &'v BalanceInput<'a>) -> Vec<&'v LeaseView<'a>> {
    let me = input.me;
    input
        .leases
        .iter()
        // An unowned lease whose previous owner still hands it off (its
        // thief left) is not free until that owner completes or expires.
        .filter(|l| {
            (l.owner.is_none() && !l.in_handoff)
                || (l.expired && (l.owner != Some(me) || l.other_process))
        })
        .collect()
}

/// The `owed` leases of `available` this worker takes first.
fn take_first(
    input: &BalanceInput<'_>,
    counts: &BTreeMap<&str, usize>,
    mut available: Vec<&LeaseView<'_>>,
    owed: usize,
) -> Vec<String> {
    let me = input.me;
    // Unowned leases first (nobody will renew them), then the longest
    // unrenewed. Workers that know each other (liveness records) start
    // from a slice of their own (the leases whose hash falls on their
    // rank), so a fleet starting together splits without collisions;
    // ties otherwise broken by a per-worker hash so that workers
    // starting together try different leases first.
    let ranked: Vec<&str> = counts.keys().copied().collect();
    let (rank, n) = match ranked.iter().position(|w| *w == me) {
        Some(r) if !input.peers.is_empty() => (r as u64, ranked.len() as u64),
        _ => (0, 1),
    };
    available.sort_by_key(|l| {
        (
            l.owner.is_some(),
            std::cmp::Reverse(l.unrenewed_for),
            (spread("", l.key) % n + n - rank) % n,
            spread(me, l.key),
        )
    });
    available
        .iter()
        .take(owed)
        .map(|l| l.key.to_owned())
        .collect()
}

/// With nothing free to take and leases counted rather than weighed: the
/// steal from the most loaded worker, half its lead at most.
fn steal_by_count(
    input: &BalanceInput<'_>,
    counts: &BTreeMap<&str, usize>,
    owed: usize,
    decision: &mut Decision,
) {
    let me = input.me;
    let mine = counts[me];
    let Some((victim, victim_count)) = most_loaded(counts, |w| w != me) else {
        return;
    };
    let lead = victim_count.saturating_sub(mine);
    if lead <= 1 {
        return;
    }
    let count = owed.min(lead / 2).min(input.max_leases_to_steal);
    if count == 0 {
        return;
    }
    // Thieves stealing from the same victim at the same time pick different
    // leases, so their conditional writes rarely collide.
    decision.steal = pick(input, count, |l| {
        l.owner == Some(victim) && !l.expired && !l.in_handoff && l.seen_alive
    });
    decision.victim = Some(victim.to_owned());
}

/// Hands leases to the least loaded Java KCL worker, which takes none
/// itself. Only the most loaded kcl worker gives (ties: the smallest id),
/// so a fleet gives one worker's worth at a time, and only while the Java
/// worker is below the target and two or more behind: giving half the gap
/// at most, the giver never ends below the receiver, so a gift is never
/// stolen back.
fn give(
    input: &BalanceInput<'_>,
    counts: &BTreeMap<&str, usize>,
    target: usize,
    decision: &mut Decision,
) {
    let me = input.me;
    let is_foreign = |w: &str| input.foreign.contains(&w);
    let Some((&to, &theirs)) = counts
        .iter()
        .filter(|(w, _)| is_foreign(w))
        .min_by(|a, b| a.1.cmp(b.1).then_with(|| a.0.cmp(b.0)))
    else {
        return;
    };
    let giver = most_loaded(counts, |w| !is_foreign(w)).map(|(w, _)| w);
    let mine = counts[me];
    if giver != Some(me) || theirs >= target || mine < theirs + 2 {
        return;
    }
    let count = ((mine - theirs) / 2)
        .min(target - theirs)
        .min(input.max_leases_to_steal);
    decision.give = pick(input, count, |l| {
        l.owner == Some(me) && l.held_here && !l.other_process && !l.in_handoff
    });
    if !decision.give.is_empty() {
        decision.give_to = Some(to.to_owned());
    }
}

/// The keys of up to `count` leases `keep` accepts, in this worker's own
/// order of them: workers choosing at the same time choose differently.
fn pick(
    input: &BalanceInput<'_>,
    count: usize,
    keep: impl Fn(&LeaseView<'_>) -> bool,
) -> Vec<String> {
    let mut chosen: Vec<&LeaseView<'_>> = input.leases.iter().filter(|l| keep(l)).collect();
    chosen.sort_by_key(|l| spread(input.me, l.key));
    chosen
        .iter()
        .take(count)
        .map(|l| l.key.to_owned())
        .collect()
}

/// The worker holding the most leases of those `counts` lists that `keep`
/// accepts; ties broken by name (the smallest id) so every tick picks the
/// same.
fn most_loaded<'c>(
    counts: &BTreeMap<&'c str, usize>,
    keep: impl Fn(&str) -> bool,
) -> Option<(&'c str, usize)> {
    counts
        .iter()
        .filter(|(w, _)| keep(w))
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(w, n)| (*w, *n))
}

/// The worker a lease counts for in the balance: its owner while it lives.
/// Another process under our id counts as us (the fleet sees one id) for
/// its live leases; expired leases count for nobody.
fn counted_for<'a>(lease: &LeaseView<'a>, me: &'a str) -> Option<&'a str> {
    match lease.owner {
        Some(owner) if owner == me && lease.other_process => (!lease.expired).then_some(me),
        Some(owner) if owner == me => Some(me),
        Some(owner) if !lease.expired => Some(owner),
        _ => None,
    }
}

/// A stable per-(worker, lease) ordering key (FNV-1a), so that the
/// decision stays a pure function of its input.
fn spread(me: &str, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in me.bytes().chain([0xff]).chain(key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests;
