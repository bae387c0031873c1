//! The view of the table `balance::decide` judges (step 6 of a tick), and
//! what the judgement tells the taker besides the decision: when to look
//! again, and whether a fresher read of the liveness records must come
//! first.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Taker, free_by_liveness, written_here};
use crate::config::LeaseConfig;
use crate::lease::{Lease, Throughput, instance_of};
use crate::leases::balance::{Decision, LeaseView};
use crate::leases::expiry::ExpiryTracker;
use crate::leases::liveness::LivenessTracker;
use crate::leases::shared::Shared;

/// The Java KCL 3.x workers one tick knows of.
pub(super) struct JavaPeers {
    /// Those whose reports are fresh, this worker's id left out.
    pub(super) reporting: Vec<String>,
    /// Those of `reporting` that process: counted in the balance, and
    /// given leases.
    pub(super) counted: Vec<String>,
}

/// What judging one lease of a tick reads besides the lease itself.
pub(super) struct Judging<'a> {
    tracker: &'a ExpiryTracker,
    config: &'a LeaseConfig,
    me: &'a str,
    /// When the liveness read judged from was asked for.
    asked: Instant,
    /// Java KCL workers whose reports are fresh.
    reporting: &'a [String],
    now: Instant,
}

impl Taker {
    /// The Java KCL workers reporting on the table, and which of them
    /// count in the balance.
    pub(super) fn java_peers(&self, shared: &Shared, active: &[&Lease], now: Instant) -> JavaPeers {
        let config = &shared.config;
        let me = shared.me();
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
        let counted: Vec<String> = reporting
            .iter()
            .filter(|j| !idle.contains(j.as_str()))
            .cloned()
            .collect();
        JavaPeers { reporting, counted }
    }

    /// When a lease judged by its own counter could expire (its holder
    /// renews per lease, and nothing in the liveness records shows that
    /// moment): the table must be read again then.
    pub(super) fn counters_expire_at(
        &self,
        shared: &Shared,
        active: &[&Lease],
        now: Instant,
    ) -> Option<Instant> {
        let config = &shared.config;
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
    }

    /// A Java worker whose expired lease this tick takes has left (only
    /// with Java workers on the table: a cold start takes thousands).
    pub(super) fn java_departed(
        &mut self,
        reporting: &[String],
        leases: &[Lease],
        decision: &Decision,
    ) {
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
    }
}

impl<'a> Judging<'a> {
    pub(super) fn new(
        taker: &'a Taker,
        shared: &'a Shared,
        asked: Instant,
        reporting: &'a [String],
        now: Instant,
    ) -> Self {
        Judging {
            tracker: &taker.tracker,
            config: &shared.config,
            me: shared.me(),
            asked,
            reporting,
            now,
        }
    }

    /// What `balance::decide` sees of each active lease; and whether a
    /// lease whose holder the liveness read judged dead is held back for a
    /// fresher read (it is free only if its item stood still since before
    /// that read: `free_by_liveness`).
    pub(super) fn views<'l>(
        &self,
        shared: &Shared,
        active: &[&'l Lease],
    ) -> (Vec<LeaseView<'l>>, bool) {
        let (config, me, now) = (self.config, self.me, self.now);
        let mut held_for_read = false;
        let liveness = shared.liveness();
        let views = active
            .iter()
            .map(|l| {
                let held_here = shared.is_held(&l.key);
                LeaseView {
                    key: &l.key,
                    owner: l.owner.as_deref(),
                    expired: self.expired(&liveness, l, &mut held_for_read),
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
            .collect();
        (views, held_for_read)
    }

    /// `turned_down` (see [`turned_down`]) judged: by key, the counter
    /// judged and whether this worker would judge the lease expired if it
    /// could take it. Sets `held_for_read` for one whose holder the read
    /// judged dead but whose item moved since, as [`Judging::views`] does.
    pub(super) fn turned_down(
        &self,
        shared: &Shared,
        turned_down: &[&Lease],
        held_for_read: &mut bool,
    ) -> HashMap<String, (u64, bool)> {
        let liveness = shared.liveness();
        turned_down
            .iter()
            .map(|l| {
                let gone = self.expired(&liveness, l, held_for_read);
                (l.key.clone(), (l.counter, gone))
            })
            .collect()
    }

    /// Whether `l` is expired: by its holder's beats where its tenure names
    /// an instance with a liveness record, else by its own counter. Sets
    /// `held_for_read` for a lease whose holder the read judged dead but
    /// whose item moved since that read was asked for.
    fn expired(&self, liveness: &LivenessTracker, l: &Lease, held_for_read: &mut bool) -> bool {
        let (config, now) = (self.config, self.now);
        // A Java worker finds a lease its leader (or a kcl gift) assigned it
        // only at its next discovery, up to a failover time later, and
        // renews it from then: a lease of a Java worker that still reports
        // expires after twice the lease duration, not once.
        let java_expiry = config.lease_duration * 2;
        match liveness.judge(l, config.lease_duration, now) {
            Some(alive) => {
                let free = free_by_liveness(alive, self.tracker.seen_since(l), self.asked);
                *held_for_read |= !alive && !free;
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
                    .is_some_and(|o| self.reporting.iter().any(|j| j == o));
                let d = if reports {
                    java_expiry
                } else {
                    config.lease_duration
                };
                self.tracker.is_expired(l, d, now)
            }
        }
    }
}

/// The held leases this worker's filter turns down (a removed stream's,
/// or one of a stream only peers consume), as far as the sync leader
/// judges them: it deletes a removed stream's leases, and one a dead worker
/// still holds once that holder is judged gone. Other workers and an
/// unfiltered one judge none.
pub(super) fn turned_down<'l>(shared: &Shared, leases: &'l [Lease]) -> Vec<&'l Lease> {
    if shared.filter.is_none() || !shared.sync_leader.load(Ordering::Relaxed) {
        return Vec::new();
    }
    leases
        .iter()
        .filter(|l| !shared.accepts(l) && !shared.is_held(&l.key))
        .filter(|l| l.owner.is_some() || l.in_handoff())
        .collect()
}

/// Whether the decision is held back for one more look (and asks for it):
/// leases of holders not yet seen writing are not stolen (they may have
/// stopped), and leases held for a fresher liveness read are not taken.
pub(super) fn hold_back(shared: &Shared, views: &[LeaseView<'_>], held_for_read: bool) -> bool {
    // Leases of holders not yet seen writing are not stolen (they may
    // have stopped); one more look settles it: their next write, or
    // their expiry.
    let unproven = views
        .iter()
        .any(|v| v.owner.is_some() && !v.held_here && !v.expired && !v.in_handoff && !v.seen_alive);
    if unproven {
        // The watcher wakes us as soon as a read proves them running.
        shared.wants_proof.store(true, Ordering::Relaxed);
    }
    if held_for_read {
        // A fresh read judges those leases: ask for it now, and look
        // again when it comes, rather than a tick later.
        shared.read_now.notify_one();
    }
    unproven || held_for_read
}

/// When an expired lease left to a peer's share turns stale (taken beyond
/// the target, see `balance::decide`): two lease durations after it last
/// changed; nothing in the liveness records shows that moment.
pub(super) fn stale_at(
    views: &[LeaseView<'_>],
    lease_duration: Duration,
    now: Instant,
) -> Option<Instant> {
    views
        .iter()
        .filter(|v| v.expired && !v.held_here && v.owner.is_some())
        .filter_map(|v| (lease_duration * 2).checked_sub(v.unrenewed_for))
        .filter(|left| !left.is_zero())
        .min()
        .map(|left| now + left + Duration::from_millis(1))
}

/// The kcl workers the liveness records show alive: those that take
/// leases (not stopping), then those whose records say they take none
/// (`BalanceInput::resting`, which decides what that leaves out).
pub(super) fn live_peers(shared: &Shared, now: Instant) -> (Vec<String>, Vec<String>) {
    let (mut taking, mut resting) = (Vec::new(), Vec::new());
    for beat in shared.liveness().alive(shared.config.lease_duration, now) {
        let side = if beat.stopping {
            &mut resting
        } else {
            &mut taking
        };
        side.push(beat.worker.clone());
    }
    (taking, resting)
}
