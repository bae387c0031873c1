//! One held lease: its tenure, its validity, where it stands in a handoff,
//! and the [`LeaseHandle`] its consumer watches.
//!
//! A [`Held`] is one tenure. It never comes back to life: once it ends
//! (lost, fenced, released, handed off) a later take of the same lease is a
//! new `Held` with a new tenure and a new consumer. Its validity only moves
//! forward while it is still running; a validity that lapsed is terminal
//! (the consumer may already have stopped because of it).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::config::LeaseConfig;
use crate::lease::Lease;
use crate::leases::meter::Meter;
use crate::store::Holder;

/// Why this worker stopped holding a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndReason {
    /// Another worker (or another process under this worker's id) owns the
    /// lease now.
    Lost,
    /// Renewals did not succeed in time, so peers may soon judge the lease
    /// expired; the worker stopped using it first.
    Fenced,
    /// This worker released the lease (graceful shutdown or hand-back).
    Released,
    /// This worker handed the lease to the worker that asked for it, after
    /// its processor had the chance to checkpoint.
    HandedOff,
    /// The coordinator shut down without releasing (the lease will expire).
    Abandoned,
}

/// What [`LeaseCoordinator::let_go`](super::LeaseCoordinator::let_go) did
/// with a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LetGo {
    /// Released in the table, for peers to take.
    Released,
    /// Handed to the worker that asked for it.
    HandedOff,
    /// This worker no longer held that tenure: nothing was written.
    NotHeld,
}

impl LetGo {
    /// What [`LeaseCoordinator::complete_handoff`](super::LeaseCoordinator::complete_handoff)'s
    /// answer means.
    pub(crate) fn handed_off(done: bool) -> Self {
        if done {
            LetGo::HandedOff
        } else {
            LetGo::NotHeld
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndReason::Lost => "lost",
            EndReason::Fenced => "fenced",
            EndReason::Released => "released",
            EndReason::HandedOff => "handed_off",
            EndReason::Abandoned => "abandoned",
        })
    }
}

/// Where a held lease stands in a graceful handoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Ours to process.
    Active,
    /// We asked `from` to hand the lease over: we own it in the table, but
    /// do not process until `from` completes the handoff (its processor
    /// checkpoints first) or until `force_at`. A previous owner that renews
    /// per lease keeps renewing it meanwhile (the Java KCL's protocol), so
    /// we do not; one with a liveness record does not, so our beats do.
    Awaiting {
        /// The previous owner, still the checkpoint owner.
        from: String,
        /// When the handoff is forced if `from` has not completed it.
        force_at: Instant,
    },
    /// Another worker asked for the lease: stop fetching, let the processor
    /// checkpoint, then complete the handoff. Renewing per lease, we keep
    /// renewing it until then (or until the handoff timeout), as the Java
    /// KCL's previous owner does.
    HandingOff,
}

#[derive(Debug)]
struct HeldInner {
    lease: Lease,
    valid_until: Instant,
    ended: Option<EndReason>,
    phase: Phase,
    /// When we first sent a write expecting the current counter. A later
    /// write that the store reconciles as applied may in fact be that first
    /// one, landed late: validity counts from here, never from the retry.
    first_write: Option<(u64, Instant)>,
    /// While awaiting a handoff: whether the previous owner was told (its
    /// liveness record holds our request, or it has none), and when we last
    /// tried.
    ask: AskState,
    /// While awaiting a handoff: the counter last read and when a read
    /// first showed it (a previous owner renews the lease while it drains).
    victim: Option<(u64, Instant)>,
    /// While awaiting a handoff: when the previous owner was told, and the
    /// earliest the handoff may be forced because of it (see
    /// [`Held::ask_told`]).
    told: Option<(Instant, Instant)>,
    /// While handing off: when draining started.
    draining_since: Option<Instant>,
    /// While handing off: the renewals of this tenure stopped (the handoff
    /// timeout passed, or the new owner renews it: an older kcl).
    renewals_over: bool,
    /// While handing off: when the last renewal of the lease item that
    /// succeeded was sent. Beats extend a tenure handing off no further
    /// than from here: the thief forces the handoff once it has seen that
    /// renewal's counter stand still for a lease duration.
    drain_renewed: Option<Instant>,
    /// When the last write of the lease item in this tenure (its take, a
    /// renewal) that succeeded was sent. Renewing per lease, beats extend
    /// the tenure no further than from here: Java KCL workers judge it by
    /// its counter alone.
    item_written: Option<Instant>,
    /// While awaiting: since when writes advancing the handoff fail.
    advance_failing_since: Option<Instant>,
    /// When the tenure ended.
    ended_at: Option<Instant>,
}

/// Where telling the previous owner of an awaited handoff stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum AskState {
    /// Not tried yet (or not an awaited handoff).
    #[default]
    Untold,
    /// Tried at this instant without an answer.
    Tried(Instant),
    /// Told (or nothing to tell): the handoff may be forced at its deadline.
    Told,
}

/// Whether this tenure's consumer may still be processing: the handles
/// given out for it (to the worker and its consumer), and whether the
/// worker handled the consumer's exit.
#[derive(Debug, Clone, Copy, Default)]
struct Consumer {
    handles: usize,
    exited: bool,
}

impl Consumer {
    fn running(self) -> bool {
        self.handles > 0 && !self.exited
    }
}

/// The shared state behind a [`LeaseHandle`]: one tenure of one lease.
#[derive(Debug)]
pub(crate) struct Held {
    owner: String,
    tenure: String,
    inner: Mutex<HeldInner>,
    /// A tenure ends before its consumer stops: the consumer learns of the
    /// end only once the processor's call in flight returns, and until
    /// then this process still processes the shard (see
    /// [`Held::consumer_running`]).
    consumer: tokio::sync::watch::Sender<Consumer>,
    ended: CancellationToken,
    handoff: CancellationToken,
    /// Serialises this tenure's writes (renewal, handoff progress, force).
    pub(crate) writing: tokio::sync::Mutex<()>,
    /// What the shard carries in this tenure, fed by its consumer.
    pub(crate) meter: Meter,
}

impl Held {
    /// A tenure of `lease`, whose `owner` and `tenure` fields name it; its
    /// load is measured over `load_window`, starting from the figure the
    /// lease carries.
    pub(crate) fn new(
        lease: Lease,
        valid_until: Instant,
        phase: Phase,
        load_window: std::time::Duration,
    ) -> Self {
        Held {
            meter: Meter::new(load_window, lease.throughput),
            owner: lease.owner.clone().unwrap_or_default(),
            tenure: lease.tenure.clone().unwrap_or_default(),
            inner: Mutex::new(HeldInner {
                lease,
                valid_until,
                ended: None,
                phase,
                first_write: None,
                ask: AskState::Untold,
                victim: None,
                told: None,
                draining_since: None,
                renewals_over: false,
                drain_renewed: None,
                item_written: None,
                advance_failing_since: None,
                ended_at: None,
            }),
            consumer: tokio::sync::watch::Sender::new(Consumer::default()),
            ended: CancellationToken::new(),
            handoff: CancellationToken::new(),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HeldInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This tenure, for the store's conditions.
    pub(crate) fn holder(&self) -> Holder<'_> {
        Holder::new(&self.owner, &self.tenure)
    }

    pub(crate) fn phase(&self) -> Phase {
        self.lock().phase.clone()
    }

    /// The counter of the lease as last written or adopted here.
    pub(crate) fn counter(&self) -> u64 {
        self.lock().lease.counter
    }

    /// The send time to count validity from for a write expecting
    /// `counter`, sent now: the first such write's, if there was one.
    pub(crate) fn write_base(&self, counter: u64, now: Instant) -> Instant {
        let mut inner = self.lock();
        match inner.first_write {
            Some((c, at)) if c == counter => at,
            _ => {
                inner.first_write = Some((counter, now));
                now
            }
        }
    }

    /// Adopts the table's view of a lease that is still ours in this
    /// tenure (a counter moved by a handoff step, or by a write of ours
    /// whose response was lost) without extending validity.
    pub(crate) fn adopt(&self, lease: Lease) {
        let mut inner = self.lock();
        if inner.ended.is_none() && lease.counter >= inner.lease.counter {
            inner.lease = lease;
        }
    }

    /// Another worker asked for this lease; returns false if the lease
    /// already ended or was already handing off.
    pub(crate) fn request_handoff(&self) -> bool {
        let mut inner = self.lock();
        if inner.ended.is_some() || inner.phase == Phase::HandingOff {
            return false;
        }
        inner.phase = Phase::HandingOff;
        inner.draining_since = Some(Instant::now());
        drop(inner);
        self.handoff.cancel();
        true
    }

    /// Whether a renewal round should renew this tenure: not while
    /// awaiting a handoff (the previous owner renews it), and while handing
    /// off only until the handoff timeout (a drain stuck that long lets
    /// the lease expire to the new owner) or until the new owner is seen
    /// renewing it itself.
    pub(crate) fn due_for_renewal(&self, handoff_timeout: std::time::Duration) -> bool {
        let inner = self.lock();
        match inner.phase {
            Phase::Active => true,
            Phase::Awaiting { .. } => false,
            Phase::HandingOff => {
                !inner.renewals_over
                    && inner
                        .draining_since
                        .is_none_or(|since| since.elapsed() < handoff_timeout)
            }
        }
    }

    /// Stops the renewals of a tenure handing off (see
    /// [`Held::due_for_renewal`]).
    pub(crate) fn stop_renewals(&self) {
        self.lock().renewals_over = true;
    }

    /// One read of an awaited lease, answered at `answered`: the handoff
    /// is forced once a read asked for `lease_duration` (the previous
    /// owner's) after its counter was first seen still shows that counter.
    /// By then every renewal the previous owner made while draining has
    /// lapsed (its validity counts from the renewal's send, which was
    /// before that first sight), so the forced take overlaps nothing it
    /// does. With `told` (a previous owner with a liveness record, told
    /// through it), never before the deadline its telling set either (an
    /// older kcl previous owner renews nothing while it drains and counts
    /// its validity from its beats, up to a handoff timeout after it was
    /// told), and never at all before it was told. Returns when the
    /// counter was first seen.
    pub(crate) fn watch_previous_owner(
        &self,
        counter: u64,
        answered: Instant,
        lease_duration: std::time::Duration,
        told: bool,
    ) -> Instant {
        let mut inner = self.lock();
        let since = match inner.victim {
            Some((c, since)) if c == counter => since,
            _ => answered,
        };
        inner.victim = Some((counter, since));
        let by_counter = since + lease_duration;
        let deadline = match (told, inner.told) {
            (false, _) => by_counter,
            // Never before its lease duration from the telling either: a
            // victim that learnt then may hold its last beat's validity
            // that long (its duration may exceed our handoff timeout).
            (true, Some((at, floor))) => floor.max(at + lease_duration).max(by_counter),
            // Not told yet: it may not know, and is never forced.
            (true, None) => return since,
        };
        if let Phase::Awaiting { force_at, .. } = &mut inner.phase {
            *force_at = deadline;
        }
        since
    }

    /// Lets an awaited handoff be forced from `now` on (its previous owner
    /// is known to process nothing).
    pub(crate) fn force_now(&self, now: Instant) {
        if let Phase::Awaiting { force_at, .. } = &mut self.lock().phase {
            *force_at = (*force_at).min(now);
        }
    }

    /// A write advancing an awaited handoff failed at `now`: how long such
    /// writes have failed.
    pub(crate) fn advance_failing(&self, now: Instant) -> std::time::Duration {
        let mut inner = self.lock();
        let since = *inner.advance_failing_since.get_or_insert(now);
        now.saturating_duration_since(since)
    }

    pub(crate) fn activate(&self) {
        self.lock().phase = Phase::Active;
    }

    pub(crate) fn ask_state(&self) -> AskState {
        self.lock().ask
    }

    pub(crate) fn ask_tried(&self, at: Instant) {
        let mut inner = self.lock();
        if inner.ask != AskState::Told {
            inner.ask = AskState::Tried(at);
        }
    }

    /// The previous owner was told at `at` (or has no liveness record to
    /// tell): the handoff may be forced `timeout` after that, when a victim
    /// that learns of it only from its record has stopped renewing it (its
    /// beats renew nothing it was asked for).
    pub(crate) fn ask_told(&self, at: Instant, timeout: std::time::Duration) {
        let mut inner = self.lock();
        if inner.ask == AskState::Told {
            return;
        }
        inner.ask = AskState::Told;
        inner.told = Some((at, at + timeout));
        // `at` is after the handoff's write, so this is never earlier than
        // the deadline that write alone would give.
        if let Phase::Awaiting { force_at, .. } = &mut inner.phase {
            *force_at = at + timeout;
        }
    }

    /// Extends validity from a beat sent at `sent` (the lease item itself
    /// unchanged); false if the tenure ended or lapsed first. A tenure
    /// handing off is extended no further than from its last renewal of
    /// the lease item (see `drain_renewed`), and not at all before one;
    /// renewing `per_lease`, none further than from its last write of the
    /// item (see `item_written`).
    pub(crate) fn extend(&self, sent: Instant, per_lease: bool, config: &LeaseConfig) -> bool {
        let mut inner = self.lock();
        if inner.ended.is_some() || Instant::now() >= inner.valid_until {
            return false;
        }
        let cap = match inner.phase {
            Phase::HandingOff => inner.drain_renewed,
            _ if per_lease => inner.item_written,
            _ => Some(sent),
        };
        let Some(cap) = cap else {
            return true;
        };
        let base = cap.min(sent);
        let until = base + config.lease_duration - config.fence_margin;
        inner.valid_until = inner.valid_until.max(until);
        true
    }

    /// A write of the lease item sent at `sent` succeeded (see
    /// `item_written`, and `drain_renewed` while handing off).
    pub(crate) fn item_written(&self, sent: Instant) {
        let mut inner = self.lock();
        let later = |at: Option<Instant>| Some(at.map_or(sent, |r| r.max(sent)));
        inner.item_written = later(inner.item_written);
        if inner.phase == Phase::HandingOff {
            inner.drain_renewed = later(inner.drain_renewed);
        }
    }

    /// When the last write of the lease item in this tenure that
    /// succeeded was sent.
    pub(crate) fn item_written_at(&self) -> Option<Instant> {
        self.lock().item_written
    }

    /// The lease as last written by this worker.
    pub(crate) fn lease(&self) -> Lease {
        self.lock().lease.clone()
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.lock().valid_until
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.lock().ended.is_some()
    }

    /// Records a successful write sent at `sent`: peers saw the counter
    /// change no earlier than `sent`, so they cannot judge the lease
    /// expired before `sent + lease_duration`; this worker stops
    /// `fence_margin` before that. Returns false, changing nothing, when
    /// the tenure already ended or its validity lapsed before the write's
    /// answer came: a lapsed tenure is over, whatever the table says (its
    /// consumer may have stopped on it), and must end as fenced.
    pub(crate) fn renewed(&self, lease: Lease, sent: Instant, config: &LeaseConfig) -> bool {
        let mut inner = self.lock();
        if inner.ended.is_some() || Instant::now() >= inner.valid_until {
            return false;
        }
        inner.lease = lease;
        inner.valid_until = sent + config.lease_duration - config.fence_margin;
        true
    }

    /// Marks the lease ended; returns false if it already was.
    pub(crate) fn end(&self, reason: EndReason) -> bool {
        let first = {
            let mut inner = self.lock();
            let first = inner.ended.is_none();
            if first {
                inner.ended = Some(reason);
                inner.ended_at = Some(Instant::now());
            }
            first
        };
        self.ended.cancel();
        first
    }

    /// When the tenure ended, once it has.
    pub(crate) fn ended_at(&self) -> Option<Instant> {
        self.lock().ended_at
    }

    /// True while a consumer of this tenure may still be processing the
    /// shard, ended or not: a handle of it is alive and the worker has not
    /// handled its consumer's exit.
    pub(crate) fn consumer_running(&self) -> bool {
        self.consumer.borrow().running()
    }

    /// Completes once no consumer of this tenure may be processing.
    pub(crate) async fn consumer_stopped(&self) {
        let mut consumer = self.consumer.subscribe();
        // The sender lives in `self`, so the wait cannot fail.
        let _ = consumer.wait_for(|c| !c.running()).await;
    }

    /// The worker handled this tenure's consumer's exit: its calls have
    /// returned, whatever handles are still about.
    pub(crate) fn consumer_exited(&self) {
        self.consumer.send_modify(|c| c.exited = true);
    }
}

/// The load window of a [`LeaseHandle::detached`] handle (the default
/// `load_report_interval`).
#[cfg(any(test, feature = "test-util"))]
const DETACHED_LOAD_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// A lease this worker holds, given to the shard's consumer.
///
/// The coordinator counts the handles of each tenure: a tenure that ended
/// while one was alive may still have a processor call in flight, and a
/// handoff it leaves behind is completed only once they are gone (or the
/// worker handled the consumer's exit).
#[derive(Debug)]
pub struct LeaseHandle {
    key: String,
    pub(crate) held: Arc<Held>,
}

impl Clone for LeaseHandle {
    fn clone(&self) -> Self {
        LeaseHandle::new(self.key.clone(), Arc::clone(&self.held))
    }
}

impl Drop for LeaseHandle {
    fn drop(&mut self) {
        self.held.consumer.send_modify(|c| c.handles -= 1);
    }
}

impl LeaseHandle {
    pub(crate) fn new(key: String, held: Arc<Held>) -> Self {
        held.consumer.send_modify(|c| c.handles += 1);
        LeaseHandle { key, held }
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease as this worker last wrote it (owner, counter, tenure,
    /// checkpoint at acquisition).
    pub fn lease(&self) -> Lease {
        self.held.lease()
    }

    /// The tenure this worker holds the lease under: every checkpoint of
    /// this handle is conditional on it.
    pub fn tenure(&self) -> &str {
        &self.held.tenure
    }

    /// This holder (worker id and tenure), for the store's conditions.
    pub fn holder(&self) -> Holder<'_> {
        self.held.holder()
    }

    /// True while this worker may fetch and process the shard: the lease
    /// has not ended, no other worker asked for it, and the last successful
    /// renewal is recent enough that no peer can have judged it expired
    /// (invariant 4).
    pub fn is_valid(&self) -> bool {
        let inner = self.held.lock();
        inner.ended.is_none() && inner.phase == Phase::Active && Instant::now() < inner.valid_until
    }

    /// True while this worker may still checkpoint: as [`Self::is_valid`],
    /// and also while handing the lease off (the previous owner
    /// checkpoints before it lets go).
    pub fn may_checkpoint(&self) -> bool {
        let inner = self.held.lock();
        inner.ended.is_none()
            && !matches!(inner.phase, Phase::Awaiting { .. })
            && Instant::now() < inner.valid_until
    }

    /// Completes when another worker asks for this lease: stop fetching,
    /// let the processor checkpoint, then complete the handoff.
    pub fn handoff_requested(&self) -> WaitForCancellationFutureOwned {
        self.held.handoff.clone().cancelled_owned()
    }

    /// The instant this worker fences itself unless a renewal succeeds.
    pub fn valid_until(&self) -> Instant {
        self.held.valid_until()
    }

    /// Counts one batch read from the shard: `bytes` of record data in
    /// `records` records, the tip `behind` milliseconds ahead. What the
    /// shard carries is published on its lease for peers to balance by.
    pub fn record_read(&self, bytes: u64, records: u64, behind: Option<u64>) {
        self.held
            .meter
            .record(bytes, records, behind, Instant::now());
    }

    /// Why the lease ended, once it has.
    pub fn end_reason(&self) -> Option<EndReason> {
        self.held.lock().ended
    }

    /// Completes when the lease ends for any [`EndReason`].
    pub fn ended(&self) -> WaitForCancellationFutureOwned {
        self.held.ended.clone().cancelled_owned()
    }

    /// True if `other` is this same tenure.
    pub(crate) fn same_tenure(&self, other: &Arc<Held>) -> bool {
        Arc::ptr_eq(&self.held, other)
    }

    /// A handle not backed by a coordinator, valid for `valid_for` from now
    /// or until [`LeaseHandle::end_for_test`], for testing readers and
    /// consumers in isolation. `lease` must carry its owner and tenure (as
    /// a take leaves them) for checkpoints to pass their condition.
    #[cfg(any(test, feature = "test-util"))]
    pub fn detached(lease: Lease, valid_for: std::time::Duration) -> Self {
        LeaseHandle::new(
            lease.key.clone(),
            Arc::new(Held::new(
                lease,
                Instant::now() + valid_for,
                Phase::Active,
                DETACHED_LOAD_WINDOW,
            )),
        )
    }

    /// Ends a [`LeaseHandle::detached`] handle as the coordinator would.
    #[cfg(any(test, feature = "test-util"))]
    pub fn end_for_test(&self, reason: EndReason) {
        self.held.end(reason);
    }

    /// Asks a [`LeaseHandle::detached`] handle to hand off, as the
    /// coordinator would when another worker steals it.
    #[cfg(any(test, feature = "test-util"))]
    pub fn request_handoff_for_test(&self) {
        self.held.request_handoff();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lease::Checkpoint;

    fn awaiting() -> Held {
        let mut lease = Lease::new("s", Checkpoint::TrimHorizon);
        lease.owner = Some("thief".into());
        lease.tenure = Some("t.1".into());
        let far = Instant::now() + Duration::from_secs(3600);
        Held::new(
            lease,
            far,
            Phase::Awaiting {
                from: "victim".into(),
                force_at: far,
            },
            Duration::from_secs(60),
        )
    }

    fn force_at(h: &Held) -> Instant {
        match h.phase() {
            Phase::Awaiting { force_at, .. } => force_at,
            _ => unreachable!(),
        }
    }

    /// A victim with a liveness record is forced no earlier than its own
    /// lease duration after it was told (its last beat's validity may run
    /// that long, past the thief's shorter handoff timeout), and never
    /// before it was told; one without (a Java worker) by its counter alone.
    #[tokio::test(start_paused = true)]
    async fn a_told_victim_is_forced_no_earlier_than_its_own_lease_duration_after_telling() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let h = awaiting();
        // Read before the victim was told: never forced.
        h.watch_previous_owner(7, t0, s(30), true);
        assert!(force_at(&h) > t0 + s(3000));
        // Told at 2 s with a 10 s handoff timeout; the victim's lease is 30 s.
        h.ask_told(t0 + s(2), s(10));
        h.watch_previous_owner(7, t0 + s(3), s(30), true);
        assert_eq!(force_at(&h), t0 + s(32));
        // The counter moving (the victim renews while draining) pushes on.
        h.watch_previous_owner(8, t0 + s(20), s(30), true);
        assert_eq!(force_at(&h), t0 + s(50));
        // Without a record: the counter alone.
        let java = awaiting();
        java.watch_previous_owner(7, t0, s(10), false);
        assert_eq!(force_at(&java), t0 + s(10));
    }
}
