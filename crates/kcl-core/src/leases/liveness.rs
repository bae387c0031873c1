//! Liveness of worker processes, from their liveness records (the
//! worker-liveness renewal mode), judged on this worker's monotonic clock
//! exactly as lease expiry is (invariant 3).
//!
//! An instance is alive while this worker has seen its beat counter move
//! within the lease duration. A lease is kept alive by the instance named in
//! its tenure (or in the tenure of a handoff's previous owner): a lease
//! item that no one rewrote for minutes is still held while its holder
//! beats. What this module remembers also tells the taker whether the
//! fleet changed since its last read of the lease table, which is what lets
//! it skip that read on quiet ticks.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::Lease;
use crate::leases::tenure::instance_of;
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

#[derive(Debug, Clone)]
struct Seen {
    beat: Beat,
    since: Instant,
}

/// Remembers, per instance, its last record and when its counter last moved.
#[derive(Debug, Default)]
pub(crate) struct LivenessTracker {
    seen: HashMap<String, Seen>,
}

/// What changed between two reads of the liveness records that a taker
/// should act on: an instance that stopped or died frees its leases; one
/// that released, created or finished leases bumped its change counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FleetDigest(Vec<(String, bool, u64, u64, bool)>);

impl LivenessTracker {
    /// Records one read of every liveness record, made at `now`. Records
    /// gone from the table are forgotten (a stopped instance).
    pub(crate) fn observe(&mut self, beats: Vec<Beat>, now: Instant) {
        let mut next = HashMap::with_capacity(beats.len());
        for beat in beats {
            let since = match self.seen.remove(&beat.instance) {
                Some(s) if s.beat.counter == beat.counter => s.since,
                _ => now,
            };
            next.insert(beat.instance.clone(), Seen { beat, since });
        }
        self.seen = next;
    }

    /// True if `instance` beat within `lease_duration` of `now`, as seen here.
    pub(crate) fn is_alive(&self, instance: &str, lease_duration: Duration, now: Instant) -> bool {
        self.seen
            .get(instance)
            .is_some_and(|s| now.saturating_duration_since(s.since) < lease_duration)
    }

    /// True if `instance` had a record at the last read.
    pub(crate) fn has_record(&self, instance: &str) -> bool {
        self.seen.contains_key(instance)
    }

    /// How long `instance`'s counter has stood still, as seen here.
    pub(crate) fn unchanged_for(&self, instance: &str, now: Instant) -> Option<Duration> {
        self.seen
            .get(instance)
            .map(|s| now.saturating_duration_since(s.since))
    }

    /// When `instance` counts as dead if it beats no more.
    pub(crate) fn expires_at(&self, instance: &str, lease_duration: Duration) -> Option<Instant> {
        self.seen.get(instance).map(|s| s.since + lease_duration)
    }

    /// Whether `lease` is held by a live instance, if its liveness records
    /// can tell: `Some(true)` if an instance it names beats, `Some(false)`
    /// if every instance it names has a record and none beats (their
    /// tenures have all lapsed: see `Shared::valid_from`), `None` if it
    /// names an instance without a record (it renews per lease, or was not
    /// read yet) or names none (a Java KCL lease).
    pub(crate) fn judge(
        &self,
        lease: &Lease,
        lease_duration: Duration,
        now: Instant,
    ) -> Option<bool> {
        // Called for every lease of a scan: no allocation.
        let named = [
            lease.tenure.as_deref(),
            lease.checkpoint_owner_tenure.as_deref(),
        ]
        .map(|t| t.map(instance_of));
        let mut instances = named.iter().flatten();
        if instances
            .clone()
            .any(|i| self.is_alive(i, lease_duration, now))
        {
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
    pub(crate) fn alive(&self, lease_duration: Duration, now: Instant) -> Vec<&Beat> {
        self.seen
            .values()
            .filter(|s| now.saturating_duration_since(s.since) < lease_duration)
            .map(|s| &s.beat)
            .collect()
    }

    /// The state of the fleet as far as taking leases goes: who is alive,
    /// how many leases each holds, their change counters, who is stopping.
    /// `me` is left out: this worker knows its own changes.
    pub(crate) fn digest(&self, me: &str, lease_duration: Duration, now: Instant) -> FleetDigest {
        let mut rows: Vec<_> = self
            .seen
            .values()
            .filter(|s| s.beat.instance != me)
            .map(|s| {
                (
                    s.beat.instance.clone(),
                    now.saturating_duration_since(s.since) < lease_duration,
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

    #[tokio::test(start_paused = true)]
    async fn an_instance_is_alive_while_its_counter_moves_and_its_leases_with_it() {
        let d = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut t = LivenessTracker::default();
        t.observe(vec![beat("a", 1)], t0);
        let mut lease = Lease::new("s", Checkpoint::TrimHorizon);
        lease.owner = Some("w".into());
        lease.tenure = Some("a.1".into());
        assert_eq!(t.judge(&lease, d, t0 + Duration::from_secs(9)), Some(true));
        t.observe(vec![beat("a", 2)], t0 + Duration::from_secs(9));
        assert_eq!(t.judge(&lease, d, t0 + Duration::from_secs(18)), Some(true));
        assert_eq!(
            t.judge(&lease, d, t0 + Duration::from_secs(19)),
            Some(false)
        );
        assert_eq!(t.expires_at("a", d), Some(t0 + Duration::from_secs(19)));
        // The previous owner of a handoff keeps it alive too.
        lease.tenure = Some("b.7".into());
        lease.checkpoint_owner_tenure = Some("a.1".into());
        assert_eq!(t.judge(&lease, d, t0 + Duration::from_secs(10)), Some(true));
        // An instance without a record cannot be judged from records.
        lease.checkpoint_owner_tenure = None;
        assert_eq!(t.judge(&lease, d, t0), None);
        lease.tenure = None;
        assert_eq!(t.judge(&lease, d, t0), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_digest_changes_when_an_instance_dies_stops_or_changes_the_table() {
        let d = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut t = LivenessTracker::default();
        t.observe(vec![beat("a", 1), beat("b", 1)], t0);
        let quiet = t.digest("me", d, t0);
        // Beating alone changes nothing.
        t.observe(
            vec![beat("a", 2), beat("b", 2)],
            t0 + Duration::from_secs(1),
        );
        assert_eq!(t.digest("me", d, t0 + Duration::from_secs(1)), quiet);
        // "b" stops beating: once it counts as dead, the digest differs.
        t.observe(
            vec![beat("a", 3), beat("b", 2)],
            t0 + Duration::from_secs(5),
        );
        assert_eq!(t.digest("me", d, t0 + Duration::from_secs(5)), quiet);
        assert_ne!(t.digest("me", d, t0 + Duration::from_secs(11)), quiet);
        // A change counter, or a record that goes away, changes it too.
        let mut changed = beat("a", 4);
        changed.changes = 1;
        let mut t2 = LivenessTracker::default();
        t2.observe(vec![beat("a", 1), beat("b", 1)], t0);
        t2.observe(vec![changed, beat("b", 2)], t0);
        assert_ne!(t2.digest("me", d, t0), quiet);
        t2.observe(vec![beat("a", 5)], t0);
        assert_eq!(t2.digest("me", d, t0).0.len(), 1);
    }
}
