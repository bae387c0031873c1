//! Step 7 of a tick: the decision's takes, reclaims and steals, each in a
//! fresh tenure under the counter guard, up to [`TAKE_CONCURRENCY`] in
//! flight; and its gifts to a Java KCL worker.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{TAKE_CONCURRENCY, written_here};
use crate::lease::Lease;
use crate::leases::balance::Decision;
use crate::leases::held::{Held, Phase};
use crate::leases::renewer::tell_previous_owner;
use crate::leases::shared::Shared;
use crate::observe::{Acquisition, Event};
use crate::store::retry::counted_as_throttling;
use crate::store::{Holder, StoreError, StoreOp};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reclaim,
    Take,
    Steal,
}

/// How one take, reclaim or steal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claimed {
    Written,
    /// The lease moved on from what was seen: the reasoning is over.
    Conflict,
    /// No answer, or an error: tried again at a later tick.
    Failed,
}

/// Applies `decision`: takes, reclaims and steals at once, then gifts one
/// at a time.
pub(super) async fn apply(
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
        .for_each_concurrent(TAKE_CONCURRENCY, |(kind, seen)| async move {
            let read_from = asked_at
                .get(&seen.key)
                .copied()
                .unwrap_or_else(Instant::now);
            take_one(shared, kind, seen, read_from).await;
        })
        .await;
    if let Some(to) = &decision.give_to {
        for key in &decision.give {
            give_one(shared, key, to).await;
        }
    }
}

/// Hands one of our leases to a Java KCL worker by the handoff the Java
/// KCL's leader would write: it becomes the owner, we the checkpoint owner
/// while our processor drains; then we complete the handoff and the Java
/// worker finds the lease at its next discovery.
async fn give_one(shared: &Shared, key: &str, to: &str) {
    let Some(held) = shared.held(key) else {
        return;
    };
    if held.phase() != Phase::Active || held.is_ended() {
        return;
    }
    let Ok(_writing) = tokio::time::timeout(shared.config.store_timeout, held.writing.lock()).await
    else {
        return;
    };
    let mut seen = held.lease();
    for attempt in 0..2 {
        match shared
            .store
            .start_handoff(
                &seen,
                Holder {
                    owner: to,
                    tenure: None,
                },
            )
            .await
        {
            Ok(_) => {
                if held.request_handoff() {
                    info!(lease = %key, to, "handing a lease to a Java KCL worker; draining the shard");
                    shared.emit(Event::HandoffGiven { key });
                }
                return;
            }
            // Our own renewal moved the counter since: once more from it.
            Err(StoreError::ConditionFailed { current, .. }) => match current {
                Some(cur)
                    if attempt == 0
                        && held.holder().owns(&cur)
                        && cur.checkpoint_owner.is_none() =>
                {
                    seen = *cur;
                }
                _ => return,
            },
            Err(e) => {
                debug!(lease = %key, error = %e, "handing a lease to a Java KCL worker failed");
                return;
            }
        }
    }
}

/// Reclaims, when this tick can neither judge peers nor scan, the tenures
/// this process gave up that the table may still name (see
/// `shared::GivenUp`): from the lease as each last knew it, since
/// reclaiming its own lease needs neither. Only once this instance's
/// beats land again; a tenure the table moved on from (a peer took the
/// lease, an operator released it) is forgotten.
pub(super) async fn reclaim_given_up(shared: &Shared) {
    if !shared.can_hold(Instant::now()) {
        return;
    }
    let given_up = shared.given_up().entries();
    futures::stream::iter(given_up)
        .for_each_concurrent(TAKE_CONCURRENCY, |(key, held)| async move {
            let seen = held.lease();
            let claimed = if shared.is_held(&key) || seen.is_finished() {
                Claimed::Conflict
            } else {
                take_one(shared, Kind::Reclaim, &seen, Instant::now()).await
            };
            if claimed != Claimed::Failed {
                shared.given_up().remove(&key, &held);
            }
        })
        .await;
}

/// Releases again, after a scan, the given-up tenures of leases this
/// worker's filter turns down (a removed stream's whose release failed):
/// the taker reclaims only leases it may take, so such a lease, naming
/// this instance, which beats, was held and read by nobody for as long as
/// this process ran, and held its stream's deletion back.
///
/// Not while the consumer of an ended tenure of the lease still runs a
/// call (up to the handoff timeout), as a handoff left behind waits:
/// released, the lease went to a peer still reading the stream, beside
/// that call. Those tenures are returned, for the taker to look again as
/// soon as one stops.
pub(super) async fn release_turned_down(shared: &Shared, leases: &[Lease]) -> Vec<Arc<Held>> {
    let now = Instant::now();
    let mut running = Vec::new();
    let turned_down: Vec<(String, Arc<Held>)> = shared
        .given_up()
        .entries()
        .into_iter()
        .filter(|(key, _)| leases.iter().any(|l| l.key == *key && !shared.accepts(l)))
        .filter(|(key, _)| {
            let still = shared.still_processing(key, now);
            let done = still.is_empty();
            running.extend(still);
            done
        })
        .collect();
    futures::stream::iter(turned_down)
        .for_each_concurrent(TAKE_CONCURRENCY, |(key, held)| async move {
            if shared.release_in_table(&key, held.holder()).await.is_ok() {
                shared.given_up().remove(&key, &held);
            }
        })
        .await;
    running
}

/// One take, reclaim or steal, in a fresh tenure. A write whose outcome is
/// unknown (an error) leaves that tenure in the table or not; the next
/// tick's scan tells, and a tenure written here is reclaimed.
async fn take_one(shared: &Shared, kind: Kind, seen: &Lease, read_from: Instant) -> Claimed {
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
            // Its shard ended under the tenure given up (a SHARD_END
            // checkpoint leaves the counter, so a reclaim from what the
            // tenure knew passes): nothing to process.
            Ok(lease) if kind == Kind::Reclaim && lease.is_finished() => {
                debug!(lease = %lease.key, "reclaimed a finished lease; nothing to process");
                return Claimed::Written;
            }
            Ok(lease) => {
                acquired(shared, kind, &seen, lease, read_from, sent).await;
                return Claimed::Written;
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
                // Still ours to reclaim, by the rule a scan's reclaims
                // follow: in the tenure seen at another counter, or in a
                // tenure this process wrote and does not hold (a reclaim
                // of ours whose answer was lost).
                if let (Kind::Reclaim, 0, Some(cur)) = (kind, attempt, current.as_deref())
                    && cur.owner == seen.owner
                    && (cur.tenure == seen.tenure
                        || (written_here(shared, cur.tenure.as_deref())
                            && !shared.is_held(&cur.key)))
                    && !cur.is_finished()
                    && shared.accepts(cur)
                {
                    seen = cur.clone();
                    continue;
                }
                shared.emit(Event::TakeConflict { key: &seen.key });
                debug!(lease = %seen.key, "lost the race for a lease");
                return Claimed::Conflict;
            }
            Err(e) => {
                shared.emit(Event::TakeFailed { key: &seen.key });
                let op = match kind {
                    Kind::Take => StoreOp::Take,
                    Kind::Steal => StoreOp::StartHandoff,
                    Kind::Reclaim => StoreOp::Reclaim,
                };
                if !counted_as_throttling(op, &e) {
                    warn!(lease = %seen.key, error = %e, "taking a lease failed; retrying next tick");
                }
                return Claimed::Failed;
            }
        }
    }
    Claimed::Conflict
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
    let how = match kind {
        Kind::Reclaim => Acquisition::Reclaimed,
        Kind::Take => Acquisition::Taken,
        Kind::Steal => Acquisition::Stolen,
    };
    shared.emit(Event::Acquired {
        key: &lease.key,
        how,
    });
    // A steal, or a reclaim of a lease whose handoff from another worker is
    // still running (our handoff start applied, its answer lost): wait for
    // that worker's processor to checkpoint rather than start under it.
    let from = match kind {
        Kind::Steal => seen.owner.clone(),
        _ => lease.checkpoint_owner.clone().filter(|f| f != me),
    };
    match from {
        Some(from) => {
            info!(lease = %lease.key, from = %from, how = how.as_str(), "handoff started");
            let key = lease.key.clone();
            let held = shared.awaiting(lease, from, read_from, sent);
            tell_previous_owner(shared, &key, &held).await;
        }
        None => {
            info!(lease = %lease.key, from = ?seen.owner, how = how.as_str(), "lease acquired");
            shared.acquired(lease, read_from).await;
        }
    }
}
