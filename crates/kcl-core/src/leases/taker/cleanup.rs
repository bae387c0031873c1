//! What earlier tenures and stopped instances left behind: handoffs
//! nobody here drains any more, and liveness records of dead workers.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info};

use super::{TAKE_CONCURRENCY, written_here};
use crate::lease::Lease;
use crate::leases::held::Held;
use crate::leases::shared::{Shared, each_unblocked};
use crate::store::Holder;

/// Leases another worker asked this one for (or an operator evicted it
/// from), in a tenure of this process that no longer runs (its completion
/// failed, or it ended while draining, or an eviction ended it): the
/// handoff completes as soon as nothing here is processing them instead of
/// waiting to be forced. A tenure ends before its consumer stops (the
/// processor's call in flight returns first), so a lease whose ended
/// tenure's consumer still runs waits for it (invariant 1: a draining
/// victim counts as processing until its last call returns), up to the
/// handoff timeout after that tenure ended; those tenures are returned,
/// for the taker to look again as soon as one stops. Each completion is
/// pinned to the tenure the handoff recorded. A tenure another process
/// wrote under this id is left alone (that process may still be draining;
/// the thief forces it at the timeout if not). A handoff recorded without
/// a tenure (of a lease held before tenures, or started by a Java KCL
/// leader) is completed as before tenures: the one case where a second
/// process under this id, still draining, could have its handoff completed
/// under it.
pub(super) async fn finish_orphaned_handoffs(shared: &Shared, leases: &[Lease]) -> Vec<Arc<Held>> {
    let me = shared.me();
    let now = Instant::now();
    let mut stopping = Vec::new();
    let orphaned: Vec<&Lease> = leases
        .iter()
        .filter(|l| l.checkpoint_owner.as_deref() == Some(me) && !shared.is_held(&l.key))
        .filter(|l| {
            let tenure = l.checkpoint_owner_tenure.as_deref();
            tenure.is_none() || written_here(shared, tenure)
        })
        .filter(|l| {
            let running = shared.still_processing(&l.key, now);
            if !running.is_empty() {
                debug!(lease = %l.key, "a handoff left behind waits for this worker's consumer to stop");
            }
            let done = running.is_empty();
            stopping.extend(running);
            done
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
    stopping
}

/// When the next record of an instance already judged dead will have been
/// so for three lease durations, so that [`forget_the_dead`] deletes it:
/// the sync leader's taker scans then. Once a crash's leases are taken the
/// fleet goes quiet, and no scan came for any other reason to delete the
/// record, read at every read of the records from then on. A live
/// instance's record moves on with every beat and asks for nothing.
pub(super) fn forgettable_at(shared: &Shared, now: Instant) -> Option<Instant> {
    let own = shared.config.lease_duration;
    let liveness = shared.liveness();
    liveness
        .beats()
        .filter_map(|b| {
            let window = liveness.duration_of(&b.instance, own).unwrap_or(own);
            let still = liveness.unchanged_for(&b.instance, now)?;
            (still >= window).then(|| forget_after(window).checked_sub(still))?
        })
        .filter(|left| !left.is_zero())
        .min()
        .map(|left| now + left + Duration::from_millis(1))
}

/// How long the record of an instance whose beats last `window` must stand
/// still before it is deleted.
fn forget_after(window: Duration) -> Duration {
    window * 3
}

/// Liveness records of instances dead for three lease durations that no
/// lease names any more (they crashed, and their leases moved on) are
/// deleted, each only if it has not beaten since, so the records read every
/// tick stay as many as the live workers.
pub(super) async fn forget_the_dead(shared: &Shared, leases: &[Lease]) {
    let now = Instant::now();
    let own = shared.config.lease_duration;
    let dead: Vec<(String, u64)> = {
        let liveness = shared.liveness();
        // A tenure left on a lease another worker took since (a Java KCL
        // take) does not keep its instance's record.
        let named: HashSet<&str> = leases
            .iter()
            .flat_map(|l| liveness.named(l))
            .flatten()
            .collect();
        liveness
            .beats()
            .filter(|b| {
                let gone_for = forget_after(liveness.duration_of(&b.instance, own).unwrap_or(own));
                liveness.unchanged_for(&b.instance, now) >= Some(gone_for)
            })
            .filter(|b| !named.contains(b.instance.as_str()))
            .map(|b| (b.instance.clone(), b.counter))
            .collect()
    };
    for (instance, counter) in dead {
        match shared.store.forget(&instance, Some(counter)).await {
            Ok(()) => {
                info!(%instance, "deleted the liveness record of a worker that stopped beating")
            }
            Err(e) => {
                debug!(%instance, error = %e, "deleting a dead worker's liveness record failed")
            }
        }
    }
}
