//! The lease renewer: renews every held lease each renew interval, in
//! parallel, and fences leases it could not renew in time (invariant 4).

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::coordinator::{EndReason, Held, Phase, Shared, bump};
use crate::lease::Lease;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    // Fencing runs beside renewal, not after it: a round stuck on a hung
    // store must not delay a fence deadline.
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = renew_loop(&shared) => {}
        _ = fence_loop(&shared) => {}
        _ = handoff_loop(&shared) => {}
    }
}

/// How often a thief checks whether a handoff it asked for completed: a
/// cheap read of each lease it awaits, only while it awaits any.
const HANDOFF_POLL: Duration = Duration::from_millis(250);

async fn handoff_loop(shared: &Shared) {
    loop {
        tokio::time::sleep(HANDOFF_POLL).await;
        for (key, held) in shared.held_snapshot() {
            if let Phase::Awaiting { from, force_at } = held.phase() {
                progress_handoff(shared, &key, &held, &from, force_at).await;
            }
        }
    }
}

/// Activates an awaited lease once its previous owner completed the
/// handoff, or forces it at the deadline.
async fn progress_handoff(
    shared: &Shared,
    key: &str,
    held: &Arc<Held>,
    from: &str,
    force_at: Instant,
) {
    let Some((lease, sent, forced)) = advance_handoff(shared, key, held, force_at).await else {
        return;
    };
    // The write lock is released before the event is sent: a full event
    // channel must not hold up this lease's renewals.
    let (counter, outcome) = if forced {
        (&shared.stats.handoffs_forced, "forced")
    } else {
        (&shared.stats.handoffs_completed, "completed")
    };
    bump(counter);
    metrics::counter!("kcl_handoffs_total", "worker" => shared.config.worker_id.clone(), "outcome" => outcome)
        .increment(1);
    if forced {
        warn!(lease = %key, from, "previous owner did not hand over in time; handoff forced");
    } else {
        info!(lease = %key, from, "handoff completed");
    }
    shared.activate(key, held, lease, sent).await;
}

/// One step of an awaited handoff under the lease's write lock: the lease
/// to activate with its validity base, and whether it was forced.
async fn advance_handoff(
    shared: &Shared,
    key: &str,
    held: &Arc<Held>,
    force_at: Instant,
) -> Option<(Lease, Instant, bool)> {
    let _writing = held.writing.lock().await;
    if !matches!(held.phase(), Phase::Awaiting { .. }) {
        return None;
    }
    let me = shared.config.worker_id.as_str();
    let current = match shared.store.get(key).await {
        Ok(Some(current)) => current,
        Ok(None) => {
            shared.ended(key, held, EndReason::Lost).await;
            return None;
        }
        Err(e) => {
            debug!(lease = %key, error = %e, "reading an awaited lease failed; retrying");
            return None;
        }
    };
    if !current.is_owned_by(me) {
        shared.ended(key, held, EndReason::Lost).await;
        return None;
    }
    held.adopt(current.clone());
    let completed = current.checkpoint_owner.is_none();
    if !completed && Instant::now() < force_at {
        return None;
    }
    // Completed: a fresh renewal gives the new owner its validity; past the
    // deadline: a take clears the previous owner's right to checkpoint.
    let sent = held.write_base(current.counter, Instant::now());
    let written = if completed {
        shared.store.renew(key, me, current.counter).await
    } else {
        shared.store.take(&current, me).await
    };
    match written {
        Ok(lease) => Some((lease, sent, !completed)),
        Err(e) => {
            debug!(lease = %key, error = %e, "advancing a handoff failed; retrying");
            None
        }
    }
}

async fn renew_loop(shared: &Shared) {
    let mut next_round = Instant::now() + shared.config.renew_interval;
    loop {
        tokio::time::sleep_until(next_round).await;
        next_round += shared.config.renew_interval;
        renew_all(shared, next_round).await;
        // A round that overran (a slow store) does not cause a burst of
        // catch-up rounds.
        next_round = next_round.max(Instant::now());
    }
}

async fn fence_loop(shared: &Shared) {
    loop {
        let now = Instant::now();
        let mut next = now + shared.config.renew_interval;
        for (key, held) in shared.held_snapshot() {
            let deadline = held.valid_until();
            if deadline <= now {
                warn!(lease = %key, "no successful renewal in time; fencing the shard off");
                shared.ended(&key, &held, EndReason::Fenced).await;
            } else {
                next = next.min(deadline);
            }
        }
        // Leases acquired meanwhile have later deadlines than any held now,
        // and renewals only push deadlines later: sleeping until the
        // earliest one (or one renew interval) misses none.
        tokio::time::sleep_until(next).await;
    }
}

async fn renew_all(shared: &Shared, deadline: Instant) {
    let held = shared.held_snapshot();
    futures::stream::iter(held)
        .for_each_concurrent(shared.config.renew_concurrency, |(key, held)| async move {
            renew_one(shared, &key, &held, deadline).await;
        })
        .await;
}

/// Renews one lease, retrying transient failures with backoff until the
/// next round is due or the lease's fence deadline passes.
async fn renew_one(shared: &Shared, key: &str, held: &Arc<Held>, next_round: Instant) {
    // A lease being handed off is no longer ours to renew: the new owner
    // renews it while our processor checkpoints.
    if held.phase() == Phase::HandingOff {
        return;
    }
    let _writing = held.writing.lock().await;
    let me = shared.config.worker_id.as_str();
    let counter = held.lease().counter;
    let give_up_at = next_round.min(held.valid_until());
    let budget = give_up_at.saturating_duration_since(Instant::now());
    // Validity counts from the first write expecting this counter, in this
    // call or an earlier one: a retry may succeed only because an earlier
    // attempt applied late (its response lost), and peers saw the counter
    // move when that attempt landed.
    let sent = held.write_base(counter, Instant::now());
    let result = (|| shared.store.renew(key, me, counter))
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_delay(budget / 4)
                .with_total_delay(Some(budget))
                .without_max_times()
                .with_jitter(),
        )
        .sleep(tokio::time::sleep)
        .when(|e| e.is_retryable())
        .notify(|e, after| debug!(lease = %key, error = %e, ?after, "renewal failed; retrying"))
        .await;
    match result {
        Ok(lease) => {
            bump(&shared.stats.renewals);
            held.renewed(lease, sent, &shared.config);
        }
        Err(e) if e.is_condition_failed() => match e.current() {
            // Still ours while we await a handoff, the counter moved by the
            // previous owner's completion: renew from it. (While active, a
            // counter moved under us means another process with our worker
            // id took the lease: lost.)
            Some(current)
                if current.is_owned_by(me) && matches!(held.phase(), Phase::Awaiting { .. }) =>
            {
                held.adopt(current.clone());
                debug!(lease = %key, "lease counter moved under us; renewing from the new value");
            }
            // Another worker asked for it gracefully: drain and hand over.
            Some(current) if current.checkpoint_owner.as_deref() == Some(me) => {
                if held.request_handoff() {
                    info!(lease = %key, to = ?current.owner, "handoff requested; draining the shard");
                    metrics::counter!("kcl_handoffs_requested_total", "worker" => shared.config.worker_id.clone()).increment(1);
                }
            }
            current => {
                warn!(lease = %key, owner = ?current.and_then(|l| l.owner.clone()), "lease lost: renewal failed its condition");
                shared.ended(key, held, EndReason::Lost).await;
            }
        },
        Err(e) => {
            bump(&shared.stats.renew_failures);
            metrics::counter!("kcl_lease_renewal_failures_total", "worker" => shared.config.worker_id.clone()).increment(1);
            warn!(lease = %key, error = %e, "renewal failed; the lease is fenced if this persists");
        }
    }
}
