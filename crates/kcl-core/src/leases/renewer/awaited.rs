//! Awaited handoffs, the thief's side: tell the previous owner through its
//! liveness record, read the lease until the previous owner completed the
//! handoff (or its deadline came), then activate or force it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::lease::{Lease, instance_of};
use crate::leases::handoff::{Ours, Verdict, judge};
use crate::leases::held::{AskState, EndReason, Held, Phase};
use crate::leases::liveness::{LivenessTracker, ask_entry};
use crate::leases::shared::{Shared, each_unblocked};
use crate::observe::Event;

/// How often a thief checks whether a handoff it asked for completed: a
/// cheap read of each lease it awaits, only while it awaits any.
const HANDOFF_POLL: Duration = Duration::from_millis(250);

/// How often a thief tries again to tell a previous owner it did not reach.
const ASK_RETRY: Duration = Duration::from_secs(1);

/// Tells the previous owner of an awaited handoff, through its liveness
/// record, that the lease is asked of it (it renews nothing per lease, so
/// it would not learn from a failed renewal), and starts the handoff's
/// deadline once it was told. A previous owner without a record (it renews
/// per lease, or stopped) has nothing to be told. Retried from the handoff
/// poller, at most once a second, until it answers.
pub(crate) async fn tell_previous_owner(shared: &Shared, key: &str, held: &Arc<Held>) {
    let timeout = shared.config.handoff_timeout;
    let lease = held.lease();
    let Some(victim) = lease.checkpoint_owner_tenure.as_deref() else {
        held.ask_told(Instant::now(), timeout);
        return;
    };
    held.ask_tried(Instant::now());
    let entry = ask_entry(key, held.holder().tenure.unwrap_or_default());
    match shared.store.poke(instance_of(victim), Some(&entry)).await {
        Ok(()) => held.ask_told(Instant::now(), timeout),
        Err(e) if e.is_condition_failed() => held.ask_told(Instant::now(), timeout),
        Err(e) => {
            debug!(lease = %key, error = %e, "telling the previous owner of a handoff failed; retrying")
        }
    }
}

/// The handoff poller: moves every awaited handoff forward, telling the
/// previous owner first where it was not told yet.
pub(super) async fn handoff_loop(shared: &Shared) {
    loop {
        tokio::time::sleep(HANDOFF_POLL).await;
        let awaited = shared
            .held_snapshot()
            .into_iter()
            .filter(|(_, h)| matches!(h.phase(), Phase::Awaiting { .. }))
            .collect();
        // Each awaited lease is read on its own: one slow read does not hold
        // back the others.
        each_unblocked(
            awaited,
            shared.config.renew_concurrency,
            |(key, held)| async move {
                let retry = match held.ask_state() {
                    AskState::Told => false,
                    AskState::Untold => true,
                    AskState::Tried(at) => at.elapsed() >= ASK_RETRY,
                };
                if retry {
                    tell_previous_owner(shared, &key, &held).await;
                }
                progress_handoff(shared, &key, &held).await;
            },
        )
        .await;
    }
}

/// One step of an awaited handoff: read the lease, judge, and activate it
/// once its previous owner completed the handoff, or force it at the
/// deadline.
async fn progress_handoff(shared: &Shared, key: &str, held: &Arc<Held>) {
    let Some((lease, sent, forced)) = advance_handoff(shared, key, held).await else {
        return;
    };
    let from = match held.phase() {
        Phase::Awaiting { from, .. } => from,
        _ => String::new(),
    };
    // The write lock is released before the event is sent: a full event
    // channel must not hold up this lease's renewals.
    shared.emit(Event::HandoffEnded { key, forced });
    if forced {
        warn!(lease = %key, from, "previous owner did not hand over in time; handoff forced");
    } else {
        info!(lease = %key, from, "handoff completed");
    }
    shared.activate(key, held, lease, sent).await;
}

/// Under the lease's write lock: the lease to activate with its validity
/// base, and whether it was forced.
async fn advance_handoff(
    shared: &Shared,
    key: &str,
    held: &Arc<Held>,
) -> Option<(Lease, Instant, bool)> {
    let limit = shared.config.store_timeout;
    let writing = tokio::time::timeout(limit, held.writing.lock())
        .await
        .ok()?;
    let phase = held.phase();
    if !matches!(phase, Phase::Awaiting { .. }) || held.is_ended() {
        return None;
    }
    let asked = Instant::now();
    let item = match shared.store.get(key).await {
        Ok(item) => item,
        Err(e) => {
            debug!(lease = %key, error = %e, "reading an awaited lease failed; retrying");
            return None;
        }
    };
    let now = Instant::now();
    watch_previous_owner(shared, held, item.as_ref(), asked, now);
    let (current, forced) = judge_awaited(shared, key, held, item, asked).await?;
    let step = Advance {
        current,
        forced,
        now,
    };
    write_advance(shared, key, held, writing, step).await
}

/// Starts or moves the clock on the previous owner of an awaited handoff.
/// A previous owner renews the lease while it drains (a Java worker and
/// kcl in either mode): the handoff is forced only once it stopped,
/// judged like expiry by the previous owner's lease duration. One with a
/// liveness record is also never forced before the deadline telling it
/// set (an older kcl renews nothing while it drains). A previous owner
/// shown dead lets the handoff be forced as of this poll's ask (`asked`),
/// the instant `judge` weighs the answer at; a force from the answer
/// (`now`) would never be due for a poll whose `get` took any time.
fn watch_previous_owner(
    shared: &Shared,
    held: &Held,
    item: Option<&Lease>,
    asked: Instant,
    now: Instant,
) {
    if let Some(item) = item
        && item.checkpoint_owner.is_some()
    {
        let (window, told) = previous_owner_window(shared, item);
        let seen_since = held.watch_previous_owner(item.counter, now, window, told);
        let read = *shared.last_read.lock().unwrap_or_else(|e| e.into_inner());
        let dead = previous_owner_dead(&shared.liveness(), item, shared.config.lease_duration, now);
        if forced_by_death(dead, seen_since, read) {
            held.force_now(asked);
        }
    }
}

/// Whether an awaited handoff is forced now because its previous owner is
/// `dead` by the last liveness read, asked at `read_asked`: a previous
/// owner its record shows dead processes nothing, since every tenure of
/// its, the one draining included, lapsed with its last beat (invariant
/// 4). Only as a read asked strictly after this worker first saw the item
/// as it stands (`seen_since`) shows it: one asked before, or at that very
/// instant, may have missed the beat the previous owner wrote its tenure
/// on (back from a pause, it reclaimed the lease as this worker stole it),
/// as a take judges a lease free (`taker::free_by_liveness`). The model
/// checker runs the same rule.
pub(crate) fn forced_by_death(
    dead: bool,
    seen_since: Instant,
    read_asked: Option<Instant>,
) -> bool {
    dead && read_asked.is_some_and(|r| seen_since < r)
}

/// Judges the read of an awaited lease, asked for at `asked`: the lease
/// to write and whether the handoff is forced, or `None` when there is
/// nothing to write (the tenure kept waiting, adopted a counter, or lost).
async fn judge_awaited(
    shared: &Shared,
    key: &str,
    held: &Arc<Held>,
    item: Option<Lease>,
    asked: Instant,
) -> Option<(Lease, bool)> {
    let phase = held.phase();
    let ours = Ours {
        holder: held.holder(),
        counter: held.counter(),
        phase: &phase,
    };
    // Judged as of the read: a renewal that landed after it says nothing
    // about what the read showed.
    let forced = match judge(ours, item.as_ref(), asked) {
        Verdict::Activate => false,
        Verdict::Force => true,
        Verdict::Adopt => {
            held.adopt(item?);
            return None;
        }
        Verdict::Lost { same_id } => {
            if same_id {
                shared.same_id_conflict(key);
            }
            shared.ended(key, held, EndReason::Lost).await;
            return None;
        }
        Verdict::Keep | Verdict::Drain => return None,
    };
    Some((item?, forced))
}

/// A handoff step judged due: the lease as read, whether it is forced, and
/// when it was read.
struct Advance {
    current: Lease,
    forced: bool,
    now: Instant,
}

/// Writes the step, still under the write lock (`writing`): a completed
/// handoff gets a fresh renewal, which gives the new owner its validity;
/// one past its deadline a take (in the same tenure), which clears the
/// previous owner's right to checkpoint.
async fn write_advance(
    shared: &Shared,
    key: &str,
    held: &Arc<Held>,
    writing: tokio::sync::MutexGuard<'_, ()>,
    step: Advance,
) -> Option<(Lease, Instant, bool)> {
    let Advance {
        current,
        forced,
        now,
    } = step;
    let holder = held.holder();
    held.adopt(current.clone());
    let sent = held.write_base(current.counter, now);
    let written = if forced {
        shared.store.take(&current, holder).await
    } else {
        shared.store.renew(key, holder, current.counter).await
    };
    match written {
        Ok(lease) => Some((lease, sent, forced)),
        Err(e) => {
            // A failed condition is judged again at the next poll. A write
            // that keeps failing for a handoff timeout gives the tenure up:
            // while it awaits, this instance's beats keep the lease alive
            // to peers with nobody reading it; ended, the taker takes it
            // back in a new tenure (a write of another kind) or, failing,
            // lets it stand free of this tenure.
            debug!(lease = %key, error = %e, "advancing a handoff failed; retrying");
            if !e.is_condition_failed()
                && held.advance_failing(now) >= shared.config.handoff_timeout
            {
                warn!(lease = %key, error = %e, "activating the handoff kept failing; giving the tenure up");
                drop(writing);
                shared.ended(key, held, EndReason::Fenced).await;
            }
            None
        }
    }
}

/// True if the previous owner of `lease`'s handoff has a liveness record
/// that the last read judged dead (`own`: this worker's lease duration,
/// for a record that states none). The model checker runs the same rule.
pub(crate) fn previous_owner_dead(
    liveness: &LivenessTracker,
    lease: &Lease,
    own: Duration,
    now: Instant,
) -> bool {
    // Only a tenure that names the previous owner's own instance: a Java
    // KCL take leaves the last kcl holder's tenure behind, whose dead
    // record says nothing of the Java worker handing the lease over.
    let [_, previous] = liveness.named(lease);
    previous.is_some_and(|instance| {
        liveness.has_record(instance) && !liveness.is_alive(instance, own, now)
    })
}

/// How long the counter of `lease`'s handoff must stand still before the
/// previous owner's validity is surely over (its own lease duration, from
/// its liveness record, else this worker's), and whether it has a record
/// (it was told through it). A Java KCL previous owner names no tenure.
fn previous_owner_window(shared: &Shared, lease: &Lease) -> (Duration, bool) {
    let own = shared.config.lease_duration;
    let liveness = shared.liveness();
    let [_, previous] = liveness.named(lease);
    previous
        .and_then(|instance| liveness.duration_of(instance, own))
        .map_or((own, false), |d| (d, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An awaited handoff is forced on its previous owner's death only by
    /// a read asked strictly after this worker first saw the item as it
    /// stands: one asked at that instant or before may have missed the
    /// beat the previous owner reclaimed the lease on, just before this
    /// worker stole it (simulator seed 13917891215581911684).
    #[tokio::test(start_paused = true)]
    async fn a_handoff_is_forced_on_death_only_by_a_read_asked_after_the_item_was_seen() {
        let seen = Instant::now();
        let ms = Duration::from_millis;
        assert!(forced_by_death(true, seen, Some(seen + ms(1))));
        assert!(!forced_by_death(true, seen, Some(seen)));
        assert!(!forced_by_death(true, seen, Some(seen - ms(1))));
        assert!(!forced_by_death(true, seen, None));
        assert!(!forced_by_death(false, seen, Some(seen + ms(1))));
    }
}
