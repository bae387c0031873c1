//! Liveness of worker processes, from their liveness records (the
//! worker-liveness renewal mode), judged on this worker's monotonic clock
//! exactly as lease expiry is (invariant 3).
//!
//! An instance is alive while this worker has seen its beat counter move within
//! the instance's lease duration (the one its record states). A lease is kept
//! alive by the instance named in its tenure (or in the tenure of a handoff's
//! previous owner): a lease item that no one rewrote for minutes is still held
//! while its holder beats. What this module remembers also tells the taker
//! whether the fleet changed since its last read of the lease table, which is
//! what lets it skip that read on quiet ticks.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::{Lease, instance_of};
use crate::store::Beat;

/// The entry a thief leaves in its victim's record: the lease key and the
/// thief's tenure, so that a victim answering one request never erases a
/// later one for the same lease.
pub(crate) fn ask_entry(key: &str, thief_tenure: &str) -> String {
    format!("{key}\u{1f}{thief_tenure}")
}

/// The lease key of an entry of [`crate::store::Beat::asked`].
pub(crate) fn asked_lease(entry: &str) -> &str {
    entry.split('\u{1f}').next().unwrap_or(entry)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Seen {
    beat: Beat,
    since: Instant,
    /// The counter moved at least once while watched here.
    moved: bool,
}

/// Remembers, per instance, its last record and when its counter last moved.
///
/// Every judgment is made as of the last read, never later: an instance
/// counts as dead only if a read asked for at least a lease duration after
/// its counter was first seen still showed that counter. A judgment made
/// later (after the lease scan that follows the read, which can take
/// seconds under throttling) would miss a beat that landed in between, and
/// the instance that sent it keeps its leases for a lease duration from
/// that beat.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LivenessTracker {
    // Ordered, so that the model checker can hash a tracker as a state.
    seen: BTreeMap<String, Seen>,
    /// When the last read was asked for.
    read_at: Option<Instant>,
}

/// What changed between two reads of the liveness records that a taker
/// should act on: an instance that stopped or died frees its leases; one
/// that released, created or finished leases bumped its change counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FleetDigest(Vec<(String, bool, u64, u64, bool)>);

impl LivenessTracker {
    /// Records one read of every liveness record, asked for at `asked` and
    /// answered at `answered`. A counter seen for the first time counts
    /// from the answer (it landed no later), the read as a whole from the
    /// ask (what it shows held no earlier). Records gone from the table are
    /// forgotten (a stopped instance).
    pub(crate) fn observe(&mut self, beats: Vec<Beat>, asked: Instant, answered: Instant) {
        let mut next = BTreeMap::new();
        for beat in beats {
            let (since, moved) = match self.seen.remove(&beat.instance) {
                Some(s) if s.beat.counter == beat.counter => (s.since, s.moved),
                before => (answered, before.is_some()),
            };
            next.insert(beat.instance.clone(), Seen { beat, since, moved });
        }
        self.seen = next;
        self.read_at = Some(asked);
    }

    /// The moment a judgment at `now` is made as of: the last read.
    fn as_of(&self, now: Instant) -> Instant {
        self.read_at.map_or(now, |r| r.min(now))
    }

    /// How long the counter of `seen` had stood still at the last read.
    fn still_for(&self, seen: &Seen, now: Instant) -> Duration {
        self.as_of(now).saturating_duration_since(seen.since)
    }

    /// True if the instance of `seen` beat within its lease duration of the
    /// last read (made no later than `now`).
    fn beats_in_time(&self, seen: &Seen, own: Duration, now: Instant) -> bool {
        self.still_for(seen, now) < window(&seen.beat, own)
    }

    /// True if `instance` beat within its lease duration of the last read
    /// (made no later than `now`), as seen here. `own` is this worker's
    /// lease duration, used only for a record that does not state one.
    pub(crate) fn is_alive(&self, instance: &str, own: Duration, now: Instant) -> bool {
        self.seen
            .get(instance)
            .is_some_and(|s| self.beats_in_time(s, own, now))
    }

    /// The lease duration `instance`'s tenures are judged by (see
    /// [`window`]), if it has a record.
    pub(crate) fn duration_of(&self, instance: &str, own: Duration) -> Option<Duration> {
        self.seen.get(instance).map(|s| window(&s.beat, own))
    }

    /// The instances `lease`'s tenures name (owner's, then previous
    /// owner's in a handoff), each only while it names the worker the
    /// lease gives it to. A Java KCL take leaves the last kcl holder's
    /// tenure in place: that instance, live or dead, says nothing about the
    /// Java worker that owns the lease now.
    pub(crate) fn named<'l>(&self, lease: &'l Lease) -> [Option<&'l str>; 2] {
        let current = |tenure: Option<&'l str>, worker: Option<&str>| {
            tenure.map(instance_of).filter(|i| {
                self.seen
                    .get(*i)
                    .is_none_or(|s| Some(s.beat.worker.as_str()) == worker)
            })
        };
        [
            current(lease.tenure.as_deref(), lease.owner.as_deref()),
            current(
                lease.checkpoint_owner_tenure.as_deref(),
                lease.checkpoint_owner.as_deref(),
            ),
        ]
    }

    /// True if this worker has seen a beat of an instance `lease`'s tenures
    /// name since it started watching: proof that the holder runs.
    pub(crate) fn has_moved(&self, lease: &Lease) -> bool {
        self.named(lease)
            .into_iter()
            .flatten()
            .any(|i| self.seen.get(i).is_some_and(|s| s.moved))
    }

    /// How many instances read last were seen beating (their counter moved
    /// while watched here).
    pub(crate) fn moved_instances(&self) -> usize {
        self.seen.values().filter(|s| s.moved).count()
    }

    /// True if an instance `lease`'s tenures name is known to run: seen
    /// beating here, or its record written within about a beat interval of
    /// the last read by its age (a hint off by the hosts' clock skew, good
    /// enough for what it decides: whether a steal from it may start now).
    pub(crate) fn runs(&self, lease: &Lease, own: Duration) -> bool {
        self.has_moved(lease)
            || self.named(lease).into_iter().flatten().any(|i| {
                self.seen.get(i).is_some_and(|s| {
                    let interval = s.beat.beat_interval.unwrap_or(window(&s.beat, own) / 2);
                    s.beat.age.is_some_and(|age| age <= interval + RECENT_SLACK)
                })
            })
    }

    /// The lease duration of the instance renewing `lease`, if its record
    /// says it renews every lease too: its tenures then also lapse once the
    /// lease's counter stood still that long, whatever its beats. That is
    /// the owner, except mid-steal: the thief renews nothing it awaits,
    /// while the previous owner drains with a validity of its own lease
    /// duration. Judged by a 10 s thief's record, a lease whose 20 s
    /// victim drained (its renewals failing) was taken by a third worker
    /// 10 s after the steal (simulator seed 5340163516996700958).
    pub(crate) fn per_lease_owner(&self, lease: &Lease, own: Duration) -> Option<Duration> {
        let renewing = match self.named(lease) {
            [Some(_), previous] if lease.in_handoff() => previous,
            [owner, _] => owner,
        };
        renewing
            .and_then(|i| self.seen.get(i))
            .filter(|s| s.beat.per_lease)
            .map(|s| window(&s.beat, own))
    }

    /// True if `instance` had a record at the last read.
    pub(crate) fn has_record(&self, instance: &str) -> bool {
        self.seen.contains_key(instance)
    }

    /// How long `instance`'s counter had stood still at the last read.
    pub(crate) fn unchanged_for(&self, instance: &str, now: Instant) -> Option<Duration> {
        self.seen.get(instance).map(|s| self.still_for(s, now))
    }

    /// When `instance` counts as dead if it beats no more.
    pub(crate) fn expires_at(&self, instance: &str, own: Duration) -> Option<Instant> {
        self.seen
            .get(instance)
            .map(|s| s.since + window(&s.beat, own))
    }

    /// Whether `lease` is held by a live instance, if its liveness records
    /// can tell: `Some(true)` if an instance it names beats, `Some(false)`
    /// if every instance it names has a record and none beats (their
    /// tenures have all lapsed: see `Shared::valid_from`), `None` if it
    /// names an instance without a record (it renews per lease, or was not
    /// read yet) or names none (a Java KCL lease).
    pub(crate) fn judge(&self, lease: &Lease, own: Duration, now: Instant) -> Option<bool> {
        // Called for every lease of a scan: no allocation.
        let named = self.named(lease);
        let mut instances = named.iter().flatten();
        if instances.clone().any(|i| self.is_alive(i, own, now)) {
            return Some(true);
        }
        if named.iter().all(Option::is_none) || instances.any(|i| !self.has_record(i)) {
            return None;
        }
        Some(false)
    }

    /// Every record last read.
    pub(crate) fn beats(&self) -> impl Iterator<Item = &Beat> {
        self.seen.values().map(|s| &s.beat)
    }

    /// The live instances' records.
    pub(crate) fn alive(&self, own: Duration, now: Instant) -> Vec<&Beat> {
        self.seen
            .values()
            .filter(|s| self.beats_in_time(s, own, now))
            .map(|s| &s.beat)
            .collect()
    }

    /// The state of the fleet as far as taking leases goes: who is alive,
    /// how many leases each holds, their change counters, who is stopping.
    /// `me` is left out: this worker knows its own changes.
    pub(crate) fn digest(&self, me: &str, own: Duration, now: Instant) -> FleetDigest {
        let mut rows: Vec<_> = self
            .seen
            .values()
            .filter(|s| s.beat.instance != me)
            .map(|s| {
                (
                    s.beat.instance.clone(),
                    self.beats_in_time(s, own, now),
                    s.beat.held,
                    s.beat.changes,
                    s.beat.stopping,
                )
            })
            .collect();
        rows.sort();
        FleetDigest(rows)
    }
}

/// How much older than its beat interval a record may be and still prove
/// that its instance runs (a beat retried, clocks a little apart).
const RECENT_SLACK: Duration = Duration::from_secs(1);

/// How long after its last beat an instance's tenures may still be valid:
/// the lease duration its record states, which is the one it counts its
/// own validity with. Judging it by this worker's own duration instead
/// would take the leases of a live holder with a longer one (a fleet in
/// the middle of a rolling change of `lease_duration`). `own` stands in
/// for records written before the duration was recorded.
fn window(beat: &Beat, own: Duration) -> Duration {
    beat.lease_duration.unwrap_or(own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Checkpoint;

    fn beat(instance: &str, counter: u64) -> Beat {
        Beat {
            instance: instance.into(),
            worker: "w".into(),
            counter,
            ..Beat::default()
        }
    }

    /// One read answered at once (asked and answered at `at`).
    fn read(t: &mut LivenessTracker, beats: Vec<Beat>, at: Instant) {
        t.observe(beats, at, at);
    }

    #[tokio::test(start_paused = true)]
    async fn an_instance_is_alive_while_its_counter_moves_and_its_leases_with_it() {
        let d = Duration::from_secs(10);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut t = LivenessTracker::default();
        read(&mut t, vec![beat("a", 1)], t0);
        let mut lease = Lease::new("s", Checkpoint::TrimHorizon);
        lease.owner = Some("w".into());
        lease.tenure = Some("a.1".into());
        assert_eq!(t.judge(&lease, d, t0 + s(9)), Some(true));
        read(&mut t, vec![beat("a", 2)], t0 + s(9));
        read(&mut t, vec![beat("a", 2)], t0 + s(18));
        assert_eq!(t.judge(&lease, d, t0 + s(18)), Some(true));
        read(&mut t, vec![beat("a", 2)], t0 + s(19));
        assert_eq!(t.judge(&lease, d, t0 + s(19)), Some(false));
        assert_eq!(t.expires_at("a", d), Some(t0 + s(19)));
        // The previous owner of a handoff keeps it alive too.
        read(&mut t, vec![beat("a", 3)], t0 + s(20));
        lease.owner = Some("peer".into());
        lease.tenure = Some("b.7".into());
        lease.checkpoint_owner = Some("w".into());
        lease.checkpoint_owner_tenure = Some("a.1".into());
        assert_eq!(t.judge(&lease, d, t0 + s(20)), Some(true));
        // An instance without a record cannot be judged from records.
        lease.checkpoint_owner_tenure = None;
        assert_eq!(t.judge(&lease, d, t0 + s(20)), None);
        lease.tenure = None;
        assert_eq!(t.judge(&lease, d, t0 + s(20)), None);
    }

    /// A Java KCL take leaves the last kcl holder's tenure on the lease:
    /// that instance's record (its worker another) judges nothing, and the
    /// lease falls back to its counter.
    #[tokio::test(start_paused = true)]
    async fn a_tenure_left_by_a_java_take_does_not_judge_the_java_workers_lease() {
        let d = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut t = LivenessTracker::default();
        read(&mut t, vec![beat("a", 1)], t0);
        read(&mut t, vec![beat("a", 1)], t0 + Duration::from_secs(11));
        let mut lease = Lease::new("s", Checkpoint::TrimHorizon);
        lease.owner = Some("w".into());
        lease.tenure = Some("a.1".into());
        assert_eq!(
            t.judge(&lease, d, t0 + Duration::from_secs(11)),
            Some(false)
        );
        lease.owner = Some("java-worker".into());
        assert_eq!(t.judge(&lease, d, t0 + Duration::from_secs(11)), None);
        assert!(!t.has_moved(&lease));
        assert_eq!(t.named(&lease), [None, None]);
    }

    /// A beat may land after a read and before the judgment that uses it
    /// (the lease scan in between can take seconds): death is judged as of
    /// the read, so a later clock alone never kills an instance.
    #[tokio::test(start_paused = true)]
    async fn death_is_judged_as_of_the_last_read_not_the_moment_of_judgment() {
        let d = Duration::from_secs(10);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut lease = Lease::new("s", Checkpoint::TrimHorizon);
        lease.owner = Some("w".into());
        lease.tenure = Some("a.1".into());
        let mut t = LivenessTracker::default();
        read(&mut t, vec![beat("a", 1)], t0);
        // Read at 6 s, judged after a 6 s scan: the read showed it alive.
        read(&mut t, vec![beat("a", 1)], t0 + s(6));
        assert_eq!(t.judge(&lease, d, t0 + s(12)), Some(true));
        assert!(t.is_alive("a", d, t0 + s(12)));
        assert_eq!(t.alive(d, t0 + s(12)).len(), 1);
        assert_eq!(t.unchanged_for("a", t0 + s(12)), Some(s(6)));
        // A read asked for a lease duration after the counter was first
        // seen, still showing it: dead, however late its answer came.
        t.observe(vec![beat("a", 1)], t0 + s(10), t0 + s(11));
        assert_eq!(t.judge(&lease, d, t0 + s(11)), Some(false));
        // A new counter counts from when the read answered: it landed no
        // later, perhaps just before.
        t.observe(vec![beat("a", 2)], t0 + s(12), t0 + s(14));
        read(&mut t, vec![beat("a", 2)], t0 + s(23));
        assert_eq!(t.judge(&lease, d, t0 + s(23)), Some(true));
        read(&mut t, vec![beat("a", 2)], t0 + s(24));
        assert_eq!(t.judge(&lease, d, t0 + s(24)), Some(false));
    }

    /// A holder is judged by the lease duration its record states: the one
    /// its tenures' validity counts with, whatever this worker's own is.
    #[tokio::test(start_paused = true)]
    async fn a_holder_is_judged_by_the_lease_duration_in_its_record() {
        let own = Duration::from_secs(10);
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut long = beat("a", 1);
        long.lease_duration = Some(s(30));
        let mut short = beat("b", 1);
        short.lease_duration = Some(s(4));
        let mut t = LivenessTracker::default();
        read(&mut t, vec![long.clone(), short.clone(), beat("c", 1)], t0);
        read(&mut t, vec![long, short, beat("c", 1)], t0 + s(12));
        let mut lease = Lease::new("s", Checkpoint::TrimHorizon);
        lease.owner = Some("w".into());
        lease.tenure = Some("a.1".into());
        // 12 s still: dead by this worker's 10 s, alive by the holder's 30 s.
        assert_eq!(t.judge(&lease, own, t0 + s(12)), Some(true));
        assert!(t.is_alive("a", own, t0 + s(12)));
        assert!(!t.is_alive("b", own, t0 + s(12)));
        assert!(
            !t.is_alive("c", own, t0 + s(12)),
            "no duration recorded: own"
        );
        assert_eq!(t.expires_at("a", own), Some(t0 + s(30)));
        assert_eq!(t.expires_at("b", own), Some(t0 + s(4)));
        assert_eq!(t.duration_of("c", own), Some(own));
        assert_eq!(t.alive(own, t0 + s(12)).len(), 1);
    }

    /// Mid-steal a lease lapses by its previous owner's renewals, not by
    /// the thief's record: the thief renews nothing it awaits.
    #[tokio::test(start_paused = true)]
    async fn a_lease_mid_steal_lapses_by_its_previous_owners_record() {
        let own = Duration::from_secs(10);
        let s = Duration::from_secs;
        let mut thief = beat("t", 1);
        thief.worker = "thief".into();
        (thief.per_lease, thief.lease_duration) = (true, Some(s(10)));
        let mut victim = beat("v", 1);
        victim.lease_duration = Some(s(20));
        let mut t = LivenessTracker::default();
        read(&mut t, vec![thief, victim.clone()], Instant::now());
        let mut lease = Lease::new("s", Checkpoint::TrimHorizon);
        lease.owner = Some("thief".into());
        lease.tenure = Some("t.1".into());
        assert_eq!(t.per_lease_owner(&lease, own), Some(s(10)));
        lease.checkpoint_owner = Some("w".into());
        lease.checkpoint_owner_tenure = Some("v.1".into());
        assert_eq!(t.per_lease_owner(&lease, own), None, "the victim beats");
        victim.per_lease = true;
        read(&mut t, vec![victim], Instant::now());
        assert_eq!(t.per_lease_owner(&lease, own), Some(s(20)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_digest_changes_when_an_instance_dies_stops_or_changes_the_table() {
        let d = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut t = LivenessTracker::default();
        read(&mut t, vec![beat("a", 1), beat("b", 1)], t0);
        let quiet = t.digest("me", d, t0);
        // Beating alone changes nothing.
        read(
            &mut t,
            vec![beat("a", 2), beat("b", 2)],
            t0 + Duration::from_secs(1),
        );
        assert_eq!(t.digest("me", d, t0 + Duration::from_secs(1)), quiet);
        // "b" stops beating: once it counts as dead, the digest differs.
        read(
            &mut t,
            vec![beat("a", 3), beat("b", 2)],
            t0 + Duration::from_secs(5),
        );
        assert_eq!(t.digest("me", d, t0 + Duration::from_secs(5)), quiet);
        read(
            &mut t,
            vec![beat("a", 4), beat("b", 2)],
            t0 + Duration::from_secs(11),
        );
        assert_ne!(t.digest("me", d, t0 + Duration::from_secs(11)), quiet);
        // A change counter, or a record that goes away, changes it too.
        let mut changed = beat("a", 4);
        changed.changes = 1;
        let mut t2 = LivenessTracker::default();
        read(&mut t2, vec![beat("a", 1), beat("b", 1)], t0);
        read(&mut t2, vec![changed, beat("b", 2)], t0);
        assert_ne!(t2.digest("me", d, t0), quiet);
        read(&mut t2, vec![beat("a", 5)], t0);
        assert_eq!(t2.digest("me", d, t0).0.len(), 1);
    }
}
