//! Cleanup of finished leases: a shard that reached SHARD_END keeps its
//! lease for a retention period (children check it before starting, and
//! operators see it in `kcl leases`), then the lease is deleted.
//!
//! A finished lease is deleted only when every child shard of it has a
//! lease of its own: shard sync treats "closed, no lease, a descendant
//! leased" as finished, so a deleted parent is never recreated and
//! re-read, even once its children's leases are deleted in turn.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info};

use crate::lease::{Lease, LeaseLayout};
use crate::metric_names::LEASES_CLEANED_UP;
use crate::source::ShardInfo;
use crate::store::LeaseStore;

/// Remembers since when each finished lease was seen finished (on this
/// worker's monotonic clock) and deletes those past the retention.
#[derive(Debug)]
pub(crate) struct LeaseCleanup {
    retention: Duration,
    finished_since: HashMap<String, (u64, Instant)>,
}

impl LeaseCleanup {
    /// Deletes finished leases seen finished for at least `retention`.
    pub(crate) fn new(retention: Duration) -> Self {
        LeaseCleanup {
            retention,
            finished_since: HashMap::new(),
        }
    }

    /// The finished leases of `layout` that may go now, given one listing
    /// and one scan.
    pub(crate) fn due<'a>(
        &mut self,
        layout: &LeaseLayout,
        shards: &[ShardInfo],
        leases: &'a [Lease],
        now: Instant,
    ) -> Vec<&'a Lease> {
        let leased: HashMap<&str, &Lease> = leases
            .iter()
            .filter(|l| layout.owns(l))
            .map(|l| (l.shard_id.as_str(), l))
            .collect();
        let mut due = Vec::new();
        let mut seen = HashMap::new();
        for lease in leases.iter().filter(|l| layout.owns(l) && l.is_finished()) {
            let since = match self.finished_since.get(&lease.key) {
                Some(&(counter, since)) if counter == lease.counter => since,
                _ => now,
            };
            seen.insert(lease.key.clone(), (lease.counter, since));
            if now.saturating_duration_since(since) < self.retention {
                continue;
            }
            let mut children = shards
                .iter()
                .filter(|s| s.parents().any(|p| p == lease.shard_id))
                .map(|s| s.shard_id.as_str())
                .chain(lease.child_shard_ids.iter().map(String::as_str))
                .peekable();
            // A finished shard always has children; none listed means the
            // listing is incomplete: keep the lease.
            if children.peek().is_none() {
                continue;
            }
            if children.all(|c| leased.contains_key(c)) {
                due.push(lease);
            }
        }
        self.finished_since = seen;
        due
    }

    /// Deletes the due leases (each guarded by the counter read); returns
    /// how many this worker deleted. Peers racing to delete the same lease
    /// lose their condition harmlessly.
    pub(crate) async fn run(
        &mut self,
        store: &dyn LeaseStore,
        layout: &LeaseLayout,
        shards: &[ShardInfo],
        leases: &[Lease],
    ) -> usize {
        let mut deleted = 0;
        for lease in self.due(layout, shards, leases, Instant::now()) {
            match store.delete(&lease.key, lease.counter).await {
                Ok(()) => {
                    info!(lease = %lease.key, "deleted a finished lease after its retention period");
                    metrics::counter!(LEASES_CLEANED_UP).increment(1);
                    deleted += 1;
                }
                Err(e) => {
                    debug!(lease = %lease.key, error = %e, "deleting a finished lease failed; retrying next sync")
                }
            }
        }
        deleted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Checkpoint, HashKeyRange};

    fn shard(id: &str, parent: Option<&str>) -> ShardInfo {
        ShardInfo {
            shard_id: id.into(),
            parent_shard_id: parent.map(Into::into),
            adjacent_parent_shard_id: None,
            hash_key_range: HashKeyRange {
                starting: "0".into(),
                ending: "1".into(),
            },
            starting_sequence_number: "1".into(),
            ending_sequence_number: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn finished_leases_go_after_retention_once_every_child_is_leased() {
        let layout = LeaseLayout::SingleStream;
        let shards = vec![
            shard("p", None),
            shard("c1", Some("p")),
            shard("c2", Some("p")),
        ];
        let parent = Lease::new("p", Checkpoint::ShardEnd);
        let c1 = Lease::new("c1", Checkpoint::TrimHorizon);
        let c2 = Lease::new("c2", Checkpoint::TrimHorizon);
        let mut cleanup = LeaseCleanup::new(Duration::from_secs(60));
        let t0 = Instant::now();

        let only_one_child = vec![parent.clone(), c1.clone()];
        assert!(
            cleanup
                .due(&layout, &shards, &only_one_child, t0)
                .is_empty()
        );
        let all = vec![parent.clone(), c1, c2];
        assert!(
            cleanup
                .due(&layout, &shards, &all, t0 + Duration::from_secs(30))
                .is_empty(),
            "within retention"
        );
        let due = cleanup.due(&layout, &shards, &all, t0 + Duration::from_secs(61));
        assert_eq!(
            due.iter().map(|l| l.key.as_str()).collect::<Vec<_>>(),
            vec!["p"]
        );

        // A counter change restarts the clock (someone touched the lease).
        let mut touched = all.clone();
        touched[0].counter += 1;
        assert!(
            cleanup
                .due(&layout, &shards, &touched, t0 + Duration::from_secs(62))
                .is_empty()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unfinished_leases_and_childless_listings_are_kept() {
        let layout = LeaseLayout::SingleStream;
        let mut cleanup = LeaseCleanup::new(Duration::ZERO);
        let leases = vec![
            Lease::new("a", Checkpoint::at("5", 0)),
            Lease::new("b", Checkpoint::ShardEnd),
        ];
        assert!(
            cleanup
                .due(&layout, &[shard("a", None)], &leases, Instant::now())
                .is_empty()
        );
    }
}
