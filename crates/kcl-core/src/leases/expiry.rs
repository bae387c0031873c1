//! Expiry judged on this worker's own monotonic clock (invariant 3).
//!
//! A lease is expired when this worker has seen its counter stand still for
//! the lease duration. Wall clocks of different hosts are never compared: a
//! peer's clock could be minutes off. The price is that a worker that just
//! started must watch a lease for one lease duration before judging it.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::Lease;

#[derive(Debug, Clone)]
struct Seen {
    counter: u64,
    owner: Option<String>,
    since: Instant,
    /// The lease changed at least once while watched here.
    moved: bool,
}

/// Remembers, per lease, when this worker last saw its counter change.
#[derive(Debug, Default)]
pub(crate) struct ExpiryTracker {
    seen: HashMap<String, Seen>,
}

impl ExpiryTracker {
    /// An empty tracker.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Records one scan's leases, observed at `now`, and forgets leases that
    /// are gone from the table.
    pub(crate) fn observe(&mut self, leases: &[Lease], now: Instant) {
        let mut next = HashMap::with_capacity(leases.len());
        for lease in leases {
            let seen = match self.seen.remove(&lease.key) {
                Some(s) if s.counter == lease.counter && s.owner == lease.owner => s,
                before => Seen {
                    counter: lease.counter,
                    owner: lease.owner.clone(),
                    since: now,
                    moved: before.is_some(),
                },
            };
            next.insert(lease.key.clone(), seen);
        }
        self.seen = next;
    }

    /// If `lease` (as just read, before [`ExpiryTracker::observe`] records
    /// it) shows the same owner at a later counter than the last scan did,
    /// when this worker first saw it at the earlier one: the owner held the
    /// lease since then at the latest.
    pub(crate) fn renewed_in_place(&self, lease: &Lease) -> Option<Instant> {
        lease.owner.as_ref()?;
        self.seen
            .get(&lease.key)
            .filter(|s| s.owner == lease.owner && s.counter < lease.counter)
            .map(|s| s.since)
    }

    /// How long this worker has seen `lease` unchanged, as of `now`.
    pub(crate) fn unchanged_for(&self, lease: &Lease, now: Instant) -> Duration {
        match self.seen.get(&lease.key) {
            Some(s) if s.counter == lease.counter && s.owner == lease.owner => {
                now.saturating_duration_since(s.since)
            }
            _ => Duration::ZERO,
        }
    }

    /// When this worker first saw `lease` as it stands (`None` for a lease
    /// never observed in this state).
    pub(crate) fn seen_since(&self, lease: &Lease) -> Option<Instant> {
        self.seen
            .get(&lease.key)
            .filter(|s| s.counter == lease.counter && s.owner == lease.owner)
            .map(|s| s.since)
    }

    /// True if this worker has seen `lease` change (a renewal, a take)
    /// since it started watching it: proof that someone writes it, where a
    /// lease seen only standing still may belong to a worker that stopped
    /// before this one started.
    pub(crate) fn has_moved(&self, lease: &Lease) -> bool {
        self.seen.get(&lease.key).is_some_and(|s| s.moved)
    }

    /// When `lease` will count as expired if its counter keeps standing
    /// still; `None` for a lease never observed.
    pub(crate) fn expires_at(&self, lease: &Lease, lease_duration: Duration) -> Option<Instant> {
        self.seen
            .get(&lease.key)
            .filter(|s| s.counter == lease.counter && s.owner == lease.owner)
            .map(|s| s.since + lease_duration)
    }

    /// True if `lease` has an owner (or a previous owner still handing it
    /// off) and this worker has not seen its counter move for
    /// `lease_duration`.
    pub(crate) fn is_expired(&self, lease: &Lease, lease_duration: Duration, now: Instant) -> bool {
        (lease.owner.is_some() || lease.checkpoint_owner.is_some())
            && self.unchanged_for(lease, now) >= lease_duration
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Checkpoint;

    fn owned(counter: u64) -> Lease {
        let mut l = Lease::new("s", Checkpoint::TrimHorizon);
        l.owner = Some("peer".into());
        l.counter = counter;
        l
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_restarts_whenever_the_counter_moves() {
        let d = Duration::from_secs(10);
        let mut t = ExpiryTracker::new();
        let t0 = Instant::now();
        t.observe(&[owned(1)], t0);
        assert!(!t.is_expired(&owned(1), d, t0 + Duration::from_secs(9)));
        t.observe(&[owned(2)], t0 + Duration::from_secs(9));
        assert!(!t.is_expired(&owned(2), d, t0 + Duration::from_secs(18)));
        assert!(t.is_expired(&owned(2), d, t0 + Duration::from_secs(19)));
        assert_eq!(
            t.expires_at(&owned(2), d),
            Some(t0 + Duration::from_secs(19))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn first_sight_is_never_expired_and_unowned_never_expires() {
        let d = Duration::from_secs(10);
        let t = ExpiryTracker::new();
        assert!(!t.is_expired(&owned(7), d, Instant::now()));
        let mut t = ExpiryTracker::new();
        let free = Lease::new("s", Checkpoint::TrimHorizon);
        t.observe(std::slice::from_ref(&free), Instant::now());
        assert!(!t.is_expired(&free, d, Instant::now() + d * 5));
    }
}
