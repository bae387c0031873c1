//! The lease taker: one task per worker, one paginated scan per tick.
//!
//! Each tick scans the table once (invariant 7); that one result feeds the
//! expiry tracker, the per-worker counts and the steal candidates. The
//! decision itself is [`crate::balance::decide`]; this module gathers its
//! input and applies its output with conditional writes.

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::balance::{BalanceInput, Decision, LeaseView, decide};
use crate::coordinator::{Shared, bump};
use crate::expiry::ExpiryTracker;
use crate::lease::Lease;
use crate::store::StoreError;

/// Writes issued at once when a tick takes many leases (a cold start).
const TAKE_CONCURRENCY: usize = 16;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut rng = match shared.config.seed {
        Some(seed) => SmallRng::seed_from_u64(seed),
        None => SmallRng::from_rng(&mut rand::rng()),
    };
    let mut tracker = ExpiryTracker::new();
    loop {
        let next_wake = tick(&shared, &mut tracker).await;
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

/// One tick. Returns when the next tick should come early: the moment a
/// lease whose owner has missed renewals will expire, so that failover
/// takes the lease duration plus at most one tick rather than two.
async fn tick(shared: &Shared, tracker: &mut ExpiryTracker) -> Option<Instant> {
    bump(&shared.stats.ticks);
    // Validity of what this tick takes counts from when the scan asked for
    // the page that held the lease: a take the store reconciles as applied
    // may be an older write of ours that landed after that page was read,
    // never before it was asked for.
    let scanned = scan_timed(shared).await;
    let (leases, asked_at) = match scanned {
        Ok(scanned) => scanned,
        Err(e) => {
            bump(&shared.stats.scan_failures);
            metrics::counter!("kcl_lease_taker_scan_failures_total", "worker" => shared.config.worker_id.clone()).increment(1);
            warn!(error = %e, "lease scan failed; retrying next tick");
            return None;
        }
    };
    let now = Instant::now();
    tracker.observe(&leases, now);
    let config = &shared.config;
    let me = config.worker_id.as_str();

    // Finished shards need no owner; they stay in the table for lineage.
    let active: Vec<&Lease> = leases
        .iter()
        .filter(|l| !l.is_finished() && shared.accepts(l))
        .collect();
    let views = active
        .iter()
        .map(|l| LeaseView {
            key: &l.key,
            owner: l.owner.as_deref(),
            expired: tracker.is_expired(l, config.lease_duration, now),
            unrenewed_for: tracker.unchanged_for(l, now),
            held_here: shared.is_held(&l.key),
            in_handoff: l.in_handoff(),
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
    // missed two renewals is suspect: look again right when it would expire.
    let suspect_after = config.renew_interval * 2;
    active
        .iter()
        .filter(|l| l.owner.is_some() && !l.is_owned_by(me))
        .filter(|l| tracker.unchanged_for(l, now) >= suspect_after)
        .filter_map(|l| tracker.expires_at(l, config.lease_duration))
        .filter(|at| *at > now)
        .min()
        .map(|at| at + Duration::from_millis(1))
}

/// Leases another worker asked this one for, that this worker does not
/// hold (it restarted since): nothing here is processing them, so the
/// handoff completes at once instead of waiting to be forced.
async fn finish_orphaned_handoffs(shared: &Shared, leases: &[Lease]) {
    let me = shared.config.worker_id.as_str();
    for lease in leases {
        if lease.checkpoint_owner.as_deref() == Some(me) && !shared.is_held(&lease.key) {
            match shared.store.complete_handoff(&lease.key, me).await {
                Ok(_) => info!(lease = %lease.key, "completed a handoff left over from a restart"),
                Err(e) => {
                    debug!(lease = %lease.key, error = %e, "completing a leftover handoff failed")
                }
            }
        }
    }
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
    let find = |key: &String| leases.iter().find(|l| &l.key == key);
    let work = decision
        .reclaim
        .iter()
        .map(|k| (Kind::Reclaim, k))
        .chain(decision.take.iter().map(|k| (Kind::Take, k)))
        .chain(decision.steal.iter().map(|k| (Kind::Steal, k)))
        .filter_map(|(kind, key)| find(key).map(|l| (kind, l)));
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

async fn take_one(shared: &Shared, kind: Kind, seen: &Lease, read_from: Instant) {
    let me = shared.config.worker_id.as_str();
    let mut seen = seen.clone();
    // Ours in the table but mid-handoff from another worker (our handoff
    // start applied, its response lost): keep waiting for that worker
    // rather than take it from under its processor.
    if kind == Kind::Reclaim
        && let Some(from) = seen.checkpoint_owner.clone().filter(|f| f != me)
    {
        bump(&shared.stats.reclaimed);
        shared.awaiting(seen, from, read_from, Instant::now());
        return;
    }
    for attempt in 0..2 {
        let sent = Instant::now();
        // A steal is a graceful handoff: the victim drains and checkpoints
        // before this worker starts, so no two workers process the shard.
        let write = match (kind, seen.owner.as_deref()) {
            (Kind::Steal, Some(victim)) => {
                shared
                    .store
                    .start_handoff(&seen.key, victim, seen.counter, me)
                    .await
            }
            _ => shared.store.take(&seen, me).await,
        };
        match write {
            Ok(lease) if kind == Kind::Steal => {
                bump(&shared.stats.stolen);
                metrics::counter!("kcl_leases_acquired_total", "worker" => shared.config.worker_id.clone(), "how" => "stolen")
                    .increment(1);
                let from = seen.owner.clone().unwrap_or_default();
                info!(lease = %lease.key, from = %from, "handoff started");
                shared.awaiting(lease, from, read_from, sent);
                return;
            }
            Ok(lease) => {
                let (counter, what) = match kind {
                    Kind::Reclaim => (&shared.stats.reclaimed, "reclaimed"),
                    Kind::Take => (&shared.stats.taken, "taken"),
                    Kind::Steal => (&shared.stats.stolen, "stolen"),
                };
                bump(counter);
                metrics::counter!("kcl_leases_acquired_total", "worker" => shared.config.worker_id.clone(), "how" => what)
                    .increment(1);
                info!(lease = %lease.key, from = ?seen.owner, how = what, "lease acquired");
                shared.acquired(lease, read_from).await;
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
