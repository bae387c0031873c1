//! The lease renewer: renews every held tenure each renew interval, in
//! parallel and each inside its own deadline, fences tenures it could not
//! renew in time (invariant 4), and moves awaited handoffs forward.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::config::LeaseConfig;
use crate::lease::{Lease, Throughput};
use crate::leases::handoff::{Ours, Verdict, judge};
use crate::leases::held::{EndReason, Held, Phase};
use crate::leases::liveness::asked_lease;
use crate::leases::meter::{Reading, moved};
use crate::leases::shared::{Shared, each_unblocked};
use crate::observe::Event;
use crate::store::retry::{RetryPolicy, retry_until};
use crate::store::{Beat, BeatUpdate, Holder, StoreError, StoreErrorKind, StoreOp};

pub(crate) mod awaited;

use awaited::handoff_loop;
pub(crate) use awaited::tell_previous_owner;

pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    // Fencing runs beside renewal, not after it: a round stuck on a hung
    // store must not delay a fence deadline.
    // Both modes beat: with liveness records the beat renews every tenure
    // but those handing off (a previous owner renews those per lease while
    // it drains, see `renew_all`); renewing per lease, every tenure is
    // renewed per lease too, for Java KCL workers, which judge by counters,
    // and its validity needs both (see `Held::extend`).
    // Polled in this order whenever several are ready at one instant, not
    // in a random one, so that a seeded simulation replays exactly.
    tokio::select! {
        biased;
        _ = stop.cancelled() => {}
        _ = beat_loop(&shared) => {}
        _ = renew_loop(&shared) => {}
        _ = fence_loop(&shared) => {}
        _ = handoff_loop(&shared) => {}
        _ = report_loop(&shared) => {}
    }
}

/// With liveness records no renewal writes the lease items, so what each
/// lease carries is written on its own: at most once a
/// `load_report_interval` per lease and only when it moved by more than a
/// fifth (see `leases::meter`). When what this worker's leases carry in
/// all moved by more than a fifth since peers were last told, the next
/// beat tells them (its change counter), so they read the figures:
/// otherwise a peer whose own fleet view did not change would never look.
/// Renewing per lease, renewals carry the figures and every tick scans.
async fn report_loop(shared: &Shared) {
    let mut told = 0.0;
    loop {
        tokio::time::sleep(shared.config.renew_interval).await;
        if !shared.liveness_mode() {
            continue;
        }
        let now = Instant::now();
        let due: Vec<(String, Arc<Held>, Reading)> = shared
            .held_snapshot()
            .into_iter()
            .filter(|(_, h)| h.phase() == Phase::Active && !h.is_ended())
            .filter_map(|(k, h)| {
                let reading = h.meter.report_due(h.lease().throughput, now)?;
                Some((k, h, reading))
            })
            .collect();
        each_unblocked(
            due,
            shared.config.renew_concurrency,
            |(key, held, reading)| async move {
                report_one(shared, &key, &held, reading).await;
            },
        )
        .await;
        let total: f64 = shared
            .held_snapshot()
            .iter()
            .filter_map(|(_, h)| h.lease().throughput)
            .map(Throughput::kbps)
            .sum();
        if moved(told, total) {
            debug!(
                from = told,
                to = total,
                "what this worker carries moved; telling peers"
            );
            told = total;
            shared.table_changed();
        }
    }
}

/// Writes one lease's figure, under its write lock.
async fn report_one(shared: &Shared, key: &str, held: &Arc<Held>, reading: Reading) {
    let load = reading.load;
    let limit = shared.config.store_timeout;
    let Ok(_writing) = tokio::time::timeout(limit, held.writing.lock()).await else {
        return;
    };
    if held.phase() != Phase::Active || held.is_ended() {
        return;
    }
    let sent = Instant::now();
    match shared.store.report_load(key, held.holder(), load).await {
        Ok(lease) => {
            held.meter.published(sent);
            held.adopt(lease);
            debug!(
                lease = %key,
                %load,
                bytes_per_sec = reading.bytes_per_sec,
                records_per_sec = reading.records_per_sec,
                lag_growth = reading.lag_growth,
                "published what the lease carries"
            );
        }
        // A lease lost or asked for is the renewer's and taker's to judge;
        // the figure waits for the next window.
        Err(e) => debug!(lease = %key, error = %e, "publishing what the lease carries failed"),
    }
}

/// The liveness mode's renewal: one beat of this instance's record per
/// round, which renews every tenure it holds at once. The first beat goes
/// out at once, before the taker's first tick, so peers see this instance
/// before any lease names it.
async fn beat_loop(shared: &Shared) {
    let mut next_round = Instant::now();
    loop {
        tokio::time::sleep_until(next_round).await;
        *shared.beat_round.lock().unwrap_or_else(|e| e.into_inner()) = Some(next_round);
        next_round += shared.config.renew_interval;
        beat_once(shared, next_round).await;
        shared.first_beat.set();
        next_round = next_round.max(Instant::now());
    }
}

/// One beat, retried until the next round or, when that is later, until the
/// earliest validity of a tenure it renews: a beat is the renewal of every
/// lease at once, so it keeps trying as long as trying can still help.
async fn beat_once(shared: &Shared, next_round: Instant) {
    // A lease being handed off is extended only as far as its own
    // renewals allow (see `Held::extend`).
    let renewed: Vec<(String, Arc<Held>)> = shared.held_snapshot();
    let deadline = renewed
        .iter()
        .map(|(_, h)| h.valid_until())
        .min()
        .map_or(next_round, |v| v.max(next_round));
    let (result, sent, answered) = send_beat(shared, deadline).await;
    let beat = match result {
        Ok(beat) => beat,
        Err(e) => {
            shared.emit(Event::RenewalFailed);
            warn!(error = %e, leases = renewed.len(), "liveness beat failed; the leases are fenced if this persists");
            return;
        }
    };
    shared.beat_landed(sent);
    note_beat(shared, &beat, &answered);
    // The leases no peer asked for are renewed at once: judging the asked
    // ones reads the lease table, and slow reads (a throttled table) let
    // every tenure lapse while they waited.
    let asked: HashSet<&str> = beat.asked.iter().map(|e| asked_lease(e)).collect();
    let (others, asked_held): (Vec<_>, Vec<_>) = renewed
        .iter()
        .partition(|(key, _)| !asked.contains(key.as_str()));
    for (key, held) in others {
        shared.extended(key, held, sent).await;
    }
    let unjudged = judge_asked(shared, &beat).await;
    for (key, held) in asked_held {
        if !unjudged.contains(key.as_str()) {
            shared.extended(key, held, sent).await;
        }
    }
}

/// Writes this instance's record until `deadline`: what the beat says of
/// this worker, then the write. Returns the answer, when the first attempt
/// was sent, and the handoff requests the beat cleared.
async fn send_beat(
    shared: &Shared,
    deadline: Instant,
) -> (Result<Beat, StoreError>, Instant, Vec<String>) {
    let (changes, answered, stopping) = {
        let state = shared.beat_state();
        (
            state.changes,
            state.answered.clone(),
            // A worker sitting out, or cut off from the lease table, says
            // so too: peers leave it out of their targets and take what it
            // gave back or cannot take.
            state.stopping
                || shared.sitting_out(Instant::now())
                || shared.cut_off_from_table(Instant::now()),
        )
    };
    let held = shared.held_count() as u64;
    let update = BeatUpdate {
        instance: shared.instance(),
        worker: shared.me(),
        held,
        changes,
        answered: &answered,
        stopping,
        lease_duration: shared.config.lease_duration,
        beat_interval: shared.config.renew_interval,
        per_lease: shared.beats_per_lease(),
    };
    // Validity counts from the first attempt: a later attempt may succeed
    // only because peers already saw an earlier one land.
    let sent = Instant::now();
    shared.beat_sending(sent);
    // Attempts sent, and those refused outright (not applied, for sure).
    let (tried, refused) = (AtomicU32::new(0), AtomicU32::new(0));
    let result = retry_until(
        StoreOp::Beat,
        deadline,
        renew_policy(&shared.config),
        || {
            tried.fetch_add(1, Ordering::Relaxed);
            let (update, refused) = (&update, &refused);
            async move {
                let answer = shared.store.beat(update).await;
                if answer
                    .as_ref()
                    .is_err_and(|e| e.kind() != StoreErrorKind::Retryable)
                {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                answer
            }
        },
    )
    .await;
    if result.is_err() && tried.load(Ordering::Relaxed) == refused.load(Ordering::Relaxed) {
        shared.beat_refused(sent);
    }
    (result, sent, answered)
}

/// Records what a landed beat answered: the handoff requests it cleared
/// leave the next beat, and a peer's wake makes the taker read the table.
fn note_beat(shared: &Shared, beat: &Beat, answered: &[String]) {
    let mut state = shared.beat_state();
    state.answered.retain(|k| !answered.contains(k));
    if state.wake_seen.is_some_and(|w| w != beat.wake) {
        shared.want_rescan();
    }
    state.wake_seen = Some(beat.wake);
}

/// Judges each lease peers asked for in our record, and returns those that
/// could not be read: the beat renews none of them.
async fn judge_asked<'a>(shared: &Shared, beat: &'a Beat) -> HashSet<&'a str> {
    // Peers that stole a lease from us asked in our record. Each is judged
    // from the lease item before this beat renews it: a lease asked for is
    // never renewed by a beat until it was judged (still ours, or handing
    // off), so a thief that forces the handoff a timeout after its request
    // landed never overlaps us, even when we could not read the item. Read
    // side by side, as renewals are: at most `renew_concurrency` starting
    // at once, and a slow read gives its place back, so that reads hung on
    // a throttled table hold back no other.
    let entries: Vec<&String> = beat.asked.iter().collect();
    let unjudged = std::sync::Mutex::new(HashSet::new());
    each_unblocked(entries, shared.config.renew_concurrency, |entry| {
        let unjudged = &unjudged;
        async move {
            if let Some(key) = judge_one_asked(shared, entry.as_str()).await {
                unjudged
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key);
            }
        }
    })
    .await;
    unjudged.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// Judges one lease a peer asked for (`entry` of our record); the lease,
/// if it could not be read.
async fn judge_one_asked<'a>(shared: &Shared, entry: &'a str) -> Option<&'a str> {
    let key = asked_lease(entry);
    if let Some(held) = shared.held(key) {
        match shared.store.get(key).await {
            Ok(item) => observe_one(shared, key, &held, item.as_ref()).await,
            Err(e) => {
                debug!(lease = %key, error = %e, "reading a lease a peer asked for failed; not renewing it until it is read");
                return Some(key);
            }
        }
    }
    shared.beat_state().answered.push(entry.to_owned());
    None
}

/// Applies the judgement of one read of a held, active lease: lost to
/// another holder ends it now, asked for by a peer starts draining now.
pub(crate) async fn observe_one(
    shared: &Shared,
    key: &str,
    held: &Arc<Held>,
    item: Option<&Lease>,
) {
    let phase = held.phase();
    if phase != Phase::Active {
        // Awaited handoffs are the handoff poller's to move forward.
        return;
    }
    let ours = Ours {
        holder: held.holder(),
        counter: held.counter(),
        phase: &phase,
    };
    match judge(ours, item, Instant::now()) {
        Verdict::Lost { same_id } => {
            if same_id {
                shared.same_id_conflict(key);
            }
            info!(lease = %key, owner = ?item.and_then(|l| l.owner.as_deref()), "the table shows the lease held by another; stopping");
            shared.ended(key, held, EndReason::Lost).await;
            shared.lost_to(item);
            // Evicted by an operator (a handoff to nobody in a tenure we
            // never wrote): no peer takes the lease before this instance
            // completes that handoff, which the taker's read of the table
            // does, now rather than at the next tick.
            if item.is_some_and(|l| l.checkpoint_owner.as_deref() == Some(shared.me())) {
                shared.want_rescan();
            }
        }
        Verdict::Drain => {
            if held.request_handoff() {
                info!(lease = %key, to = ?item.and_then(|l| l.owner.as_deref()), "handoff requested; draining the shard");
                shared.emit(Event::HandoffRequested { key });
                // With liveness records the lease item is renewed from now
                // on, the first time at once (see `renew_all`).
                if shared.liveness_mode() {
                    shared.renew_now.notify_one();
                }
            }
        }
        Verdict::Keep | Verdict::Adopt | Verdict::Activate | Verdict::Force => {}
    }
}

/// Renewals retry inside their round, at most twice, starting at a tenth
/// of the renew interval: the next round is a retry too, and the store's
/// SDK already retries inside each attempt. Retrying from a few tens of
/// milliseconds would multiply a throttled table's load just when it has
/// the least to spare.
fn renew_policy(config: &LeaseConfig) -> RetryPolicy {
    let backoff = Backoff::new(config.renew_interval / 10, config.renew_interval / 2).retries(2);
    RetryPolicy {
        attempt_timeout: config.store_timeout,
        // A seeded simulation replays its retries exactly.
        backoff: config.seed.map_or(backoff, |seed| backoff.seeded(seed)),
    }
}

async fn renew_loop(shared: &Shared) {
    let mut next_round = Instant::now() + shared.lease_renew_interval();
    loop {
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(next_round) => {
                next_round += shared.lease_renew_interval();
            }
            // A tenure started handing off: renew it now, not a round later.
            _ = shared.renew_now.notified() => {}
        }
        renew_all(shared, next_round).await;
        // A round that overran does not cause a burst of catch-up rounds.
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
        // Renewals only push deadlines later; a tenure added meanwhile may
        // have an earlier one (takes count validity from the scan), so it
        // wakes the loop to look again.
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(next) => {}
            _ = shared.held_added.notified() => {}
        }
    }
}

/// One round: every tenure renewed on its own, none past `next_round`, and
/// a hung one gives its place among the renewals in flight back, so a lease
/// whose calls hang costs its own round and no other lease's.
async fn renew_all(shared: &Shared, next_round: Instant) {
    // With liveness records a beat renews every tenure but one handing off:
    // that one the previous owner renews per lease while its processor
    // drains, so the thief (which forces the handoff only once the counter
    // stands still) gives it the handoff timeout, not what is left of the
    // validity of its last beat.
    let liveness = shared.liveness_mode();
    let due: Vec<_> = shared
        .held_snapshot()
        .into_iter()
        .filter(|(_, h)| !liveness || h.phase() == Phase::HandingOff)
        .collect();
    if due.is_empty() {
        return;
    }
    each_unblocked(
        due,
        shared.config.renew_concurrency,
        |(key, held)| async move {
            renew_one(shared, &key, &held, next_round).await;
        },
    )
    .await;
}

/// Renews one tenure, retrying transient failures until the next round is
/// due or the tenure's validity runs out, whichever comes first.
async fn renew_one(shared: &Shared, key: &str, held: &Arc<Held>, next_round: Instant) {
    // In a handoff the previous owner renews, as the Java KCL 3.x does:
    // its renewals tell every observer (a Java leader included) that the
    // lease is alive while it drains, and a Java previous owner takes a
    // counter moved by anyone else for a lost lease.
    if !held.due_for_renewal(shared.config.handoff_timeout) {
        return;
    }
    let deadline = next_round.min(held.valid_until());
    // Another write of this tenure (a handoff step) may hold the lock; it
    // is bounded too, and this round gives up at its deadline.
    let Ok(_writing) = tokio::time::timeout_at(deadline, held.writing.lock()).await else {
        shared.emit(Event::RenewalFailed);
        return;
    };
    let holder = held.holder();
    let counter = held.counter();
    // Validity counts from the first write expecting this counter, in this
    // call or an earlier one: a retry may succeed only because an earlier
    // attempt applied late (its response lost), and peers saw the counter
    // move when that attempt landed.
    let sent = held.write_base(counter, Instant::now());
    // Every renewal carries what the lease carries, as the Java KCL 3.x's
    // do: a figure at no request of its own.
    let load = held.meter.current(Instant::now());
    let result = retry_until(
        StoreOp::Renew,
        deadline,
        renew_policy(&shared.config),
        || shared.store.renew_with(key, holder, counter, load),
    )
    .await;
    match result {
        Ok(lease) => renew_landed(shared, key, held, lease, load.is_some(), sent).await,
        Err(StoreError::ConditionFailed { current, .. }) => {
            renew_refused(shared, key, held, holder, counter, current).await;
        }
        Err(e) => {
            shared.emit(Event::RenewalFailed);
            warn!(lease = %key, error = %e, "renewal failed; the lease is fenced if this persists");
        }
    }
}

/// A renewal sent at `sent` landed: the tenure is renewed, and a renewal
/// that shows the lease handed off from us starts draining.
async fn renew_landed(
    shared: &Shared,
    key: &str,
    held: &Arc<Held>,
    lease: Lease,
    carried_load: bool,
    sent: Instant,
) {
    if carried_load {
        held.meter.published(sent);
    }
    // Renewals of a lease handed off from us succeed (we keep it
    // alive while draining): the answer is how we learn of it.
    let asked = held.holder().hands_off(&lease) && held.phase() == Phase::Active;
    let to = lease.owner.clone();
    shared.renewed(key, held, lease, sent).await;
    if asked && held.request_handoff() {
        info!(lease = %key, to = ?to, "handoff requested; draining the shard");
        shared.emit(Event::HandoffRequested { key });
    }
}

/// A renewal failed its condition: judges the lease as the table shows it
/// (`current`) against the holder and counter the renewal expected.
async fn renew_refused(
    shared: &Shared,
    key: &str,
    held: &Arc<Held>,
    holder: Holder<'_>,
    counter: u64,
    current: Option<Box<Lease>>,
) {
    let phase = held.phase();
    let ours = Ours {
        holder,
        counter,
        phase: &phase,
    };
    match judge(ours, current.as_deref(), Instant::now()) {
        // Still ours to hand off, at a counter someone else moved:
        // the new owner renews it while it waits (an older kcl).
        // Two renewers would fail each other's conditions every
        // round; we stop, and our validity runs out before it
        // forces the handoff.
        Verdict::Keep
            if phase == Phase::HandingOff
                && current.as_ref().is_some_and(|c| c.counter > counter) =>
        {
            debug!(lease = %key, "the new owner renews the lease we hand off; we stop renewing it");
            held.stop_renewals();
        }
        Verdict::Keep => {}
        // Still ours, at a counter a handoff step (or our own lost
        // write) moved: renew from it next round. While awaiting,
        // the handoff poller activates or forces.
        Verdict::Adopt | Verdict::Activate | Verdict::Force => {
            if let Some(current) = current {
                held.adopt(*current);
            }
            debug!(lease = %key, "lease counter moved under us; renewing from the new value");
        }
        Verdict::Drain => {
            if held.request_handoff() {
                let to = current.and_then(|c| c.owner);
                info!(lease = %key, to = ?to, "handoff requested; draining the shard");
                shared.emit(Event::HandoffRequested { key });
            }
        }
        Verdict::Lost { same_id } => {
            if same_id {
                shared.same_id_conflict(key);
            }
            let owner = current.and_then(|l| l.owner);
            warn!(lease = %key, owner = ?owner, "lease lost: renewal failed its condition");
            shared.ended(key, held, EndReason::Lost).await;
        }
    }
}
