//! The lease taker: one task per worker, one paginated scan per tick.
//!
//! Each tick scans the table once (invariant 7); that one result feeds the
//! expiry tracker, the per-worker counts and the steal candidates. The
//! decision itself is [`crate::balance::decide`]; this module gathers its
//! input and applies its output with conditional writes.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
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
    let leases: Vec<Lease> = match shared.store.scan().try_concat().await {
        Ok(leases) => leases,
        Err(e) => {
            bump(&shared.stats.scan_failures);
            metrics::counter!("kcl_lease_taker_scan_failures_total").increment(1);
            warn!(error = %e, "lease scan failed; retrying next tick");
            return None;
        }
    };
    let now = Instant::now();
    tracker.observe(&leases, now);
    let config = &shared.config;
    let me = config.worker_id.as_str();

    // Finished shards need no owner; they stay in the table for lineage.
    let active: Vec<&Lease> = leases.iter().filter(|l| !l.is_finished()).collect();
    let views = active
        .iter()
        .map(|l| LeaseView {
            key: &l.key,
            owner: l.owner.as_deref(),
            expired: tracker.is_expired(l, config.lease_duration, now),
            unrenewed_for: tracker.unchanged_for(l, now),
            held_here: shared.is_held(&l.key),
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
    apply(shared, &leases, &decision).await;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reclaim,
    Take,
    Steal,
}

async fn apply(shared: &Shared, leases: &[Lease], decision: &Decision) {
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
            take_one(shared, kind, seen)
        })
        .await;
}

async fn take_one(shared: &Shared, kind: Kind, seen: &Lease) {
    let me = shared.config.worker_id.as_str();
    let mut seen = seen.clone();
    for attempt in 0..2 {
        let sent = Instant::now();
        match shared.store.take(&seen, me).await {
            Ok(lease) => {
                let (counter, what) = match kind {
                    Kind::Reclaim => (&shared.stats.reclaimed, "reclaimed"),
                    Kind::Take => (&shared.stats.taken, "taken"),
                    Kind::Steal => (&shared.stats.stolen, "stolen"),
                };
                bump(counter);
                metrics::counter!("kcl_leases_acquired_total", "how" => what).increment(1);
                info!(lease = %lease.key, from = ?seen.owner, how = what, "lease acquired");
                shared.acquired(lease, sent).await;
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
