//! The lease taker: one task per worker, one paginated scan per tick.
//!
//! Each tick scans the table once (invariant 7); that one result feeds the
//! expiry tracker, the per-worker counts and the steal candidates, and is
//! also an observation of the tenures this worker holds (a lease lost or
//! asked for is noticed here if the renewer has not noticed it yet). The
//! decision itself is [`crate::leases::balance::decide`]; this module
//! gathers its input and applies its output with conditional writes, each
//! starting a fresh tenure.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::lease::Lease;
use crate::leases::balance::{BalanceInput, Decision, LeaseView, decide};
use crate::leases::expiry::ExpiryTracker;
use crate::leases::handoff::{Ours, Verdict, judge};
use crate::leases::held::{EndReason, Phase};
use crate::leases::shared::{Shared, bump, each_unblocked};
use crate::store::{Holder, StoreError};

/// Writes issued at once when a tick takes many leases (a cold start).
const TAKE_CONCURRENCY: usize = 16;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut rng = match shared.config.seed {
        Some(seed) => SmallRng::seed_from_u64(seed),
        None => SmallRng::from_rng(&mut rand::rng()),
    };
    let mut taker = Taker {
        tracker: ExpiryTracker::new(),
    };
    loop {
        let next_wake = taker.tick(&shared).await;
        let interval = shared
            .config
            .taker_interval
            .mul_f64(1.0 + shared.config.jitter * rng.random_range(-1.0..=1.0));
        let mut wake = Instant::now() + interval;
        if let Some(at) = next_wake {
            wake = wake.min(at);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// What the taker remembers between ticks.
struct Taker {
    tracker: ExpiryTracker,
}

impl Taker {
    /// One tick. Returns when the next tick should come early: the moment a
    /// lease whose owner has missed renewals will expire, so that failover
    /// takes the lease duration plus at most one tick rather than two.
    async fn tick(&mut self, shared: &Shared) -> Option<Instant> {
        bump(&shared.stats.ticks);
        // Validity of what this tick takes counts from when the scan asked
        // for the page that held the lease: a take the store reconciles as
        // applied may be an older write of ours that landed after that page
        // was read, never before it was asked for.
        let (leases, asked_at) = match scan_timed(shared).await {
            Ok(scanned) => scanned,
            Err(e) => {
                bump(&shared.stats.scan_failures);
                metrics::counter!("kcl_lease_taker_scan_failures_total", "worker" => shared.config.worker_id.clone()).increment(1);
                warn!(error = %e, "lease scan failed; retrying next tick");
                return None;
            }
        };
        let now = Instant::now();
        self.tracker.observe(&leases, now);
        observe_held(shared, &leases, now).await;
        let config = &shared.config;
        let me = shared.me();

        // Finished shards need no owner; they stay in the table for lineage.
        let active: Vec<&Lease> = leases
            .iter()
            .filter(|l| !l.is_finished() && shared.accepts(l))
            .collect();
        let views = active
            .iter()
            .map(|l| {
                let held_here = shared.is_held(&l.key);
                LeaseView {
                    key: &l.key,
                    owner: l.owner.as_deref(),
                    expired: self.tracker.is_expired(l, config.lease_duration, now),
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
                }
            })
            .collect();
        let decision = decide(&BalanceInput {
            me,
            leases: views,
            max_leases_per_worker: config.max_leases_per_worker,
            max_leases_to_steal: config.max_leases_to_steal,
        });
        if !decision.take.is_empty() || !decision.steal.is_empty() || !decision.reclaim.is_empty() {
            debug!(?decision, "lease taker decision");
        }
        apply(shared, &leases, &decision, &asked_at).await;
        finish_orphaned_handoffs(shared, &leases).await;

        // A renewing owner moves the counter every renew interval; one that
        // missed two renewals is suspect: look again right when it would
        // expire.
        let suspect_after = config.renew_interval * 2;
        active
            .iter()
            .filter(|l| l.owner.is_some() && !shared.is_held(&l.key))
            .filter(|l| self.tracker.unchanged_for(l, now) >= suspect_after)
            .filter_map(|l| self.tracker.expires_at(l, config.lease_duration))
            .filter(|at| *at > now)
            .min()
            .map(|at| at + Duration::from_millis(1))
    }
}

/// True if `tenure` was written by this process.
fn written_here(shared: &Shared, tenure: Option<&str>) -> bool {
    tenure.is_some_and(|t| shared.tenures.is_ours(t))
}

/// The scan is an observation of every tenure held here: one lost to
/// another holder ends now, one a peer asked for starts draining now,
/// rather than at the next renewal.
async fn observe_held(shared: &Shared, leases: &[Lease], now: Instant) {
    for lease in leases {
        let Some(held) = shared.held(&lease.key) else {
            continue;
        };
        let phase = held.phase();
        if phase != Phase::Active {
            // Awaited handoffs are the renewer's to move forward.
            continue;
        }
        let ours = Ours {
            holder: held.holder(),
            counter: held.counter(),
            phase: &phase,
        };
        match judge(ours, Some(lease), now) {
            Verdict::Lost { same_id } => {
                if same_id {
                    shared.same_id_conflict(&lease.key);
                }
                info!(lease = %lease.key, owner = ?lease.owner, "the scan shows the lease held by another; stopping");
                shared.ended(&lease.key, &held, EndReason::Lost).await;
            }
            Verdict::Drain => {
                if held.request_handoff() {
                    info!(lease = %lease.key, to = ?lease.owner, "handoff requested; draining the shard");
                }
            }
            Verdict::Keep | Verdict::Adopt | Verdict::Activate | Verdict::Force => {}
        }
    }
}

/// Leases another worker asked this one for, in a tenure of this process
/// that no longer runs (its completion failed, or it ended while draining):
/// nothing here is processing them, so the handoff completes at once
/// instead of waiting to be forced. Each completion is pinned to the
/// tenure the handoff recorded. A tenure another process wrote under this
/// id is left alone (that process may still be draining; the thief forces
/// it at the timeout if not). A handoff recorded without a tenure (of a
/// lease held before tenures, or started by a Java KCL leader) is completed
/// as before tenures: the one case where a second process under this id,
/// still draining, could have its handoff completed under it.
async fn finish_orphaned_handoffs(shared: &Shared, leases: &[Lease]) {
    let me = shared.me();
    let orphaned: Vec<&Lease> = leases
        .iter()
        .filter(|l| l.checkpoint_owner.as_deref() == Some(me) && !shared.is_held(&l.key))
        .filter(|l| {
            let tenure = l.checkpoint_owner_tenure.as_deref();
            tenure.is_none() || written_here(shared, tenure)
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
                bump(&shared.stats.take_conflicts);
                debug!(lease = %seen.key, "lost the race for a lease");
                return;
            }
            Err(e) => {
                bump(&shared.stats.take_failures);
                warn!(lease = %seen.key, error = %e, "taking a lease failed; retrying next tick");
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
    let (counter, how) = match kind {
        Kind::Reclaim => (&shared.stats.reclaimed, "reclaimed"),
        Kind::Take => (&shared.stats.taken, "taken"),
        Kind::Steal => (&shared.stats.stolen, "stolen"),
    };
    bump(counter);
    metrics::counter!("kcl_leases_acquired_total", "worker" => shared.config.worker_id.clone(), "how" => how)
        .increment(1);
    // A steal, or a reclaim of a lease whose handoff from another worker is
    // still running (our handoff start applied, its answer lost): wait for
    // that worker's processor to checkpoint rather than start under it.
    let from = match kind {
        Kind::Steal => seen.owner.clone(),
        _ => lease.checkpoint_owner.clone().filter(|f| f != me),
    };
    match from {
        Some(from) => {
            info!(lease = %lease.key, from = %from, how, "handoff started");
            shared.awaiting(lease, from, read_from, sent);
        }
        None => {
            info!(lease = %lease.key, from = ?seen.owner, how, "lease acquired");
            shared.acquired(lease, read_from).await;
        }
    }
}
