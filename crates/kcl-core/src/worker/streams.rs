//! Stream tracking: the streams a worker consumes ([`StreamSpec`]), the
//! [`StreamTracker`] that changes them while it runs, the live list the
//! run loop reads, and what happens to a removed stream's leases.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use crate::lease::{Lease, LeaseLayout};
use crate::leases::shared::HolderJudged;
use crate::source::SourceError;
use crate::store::LeaseStore;

/// One stream a worker consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// The stream name.
    pub name: String,
    /// How its lease keys are formed.
    pub layout: LeaseLayout,
}

/// Supplies the streams a multi-stream worker consumes; polled at every
/// shard sync, so streams can be added and removed while it runs (the Java
/// KCL's `MultiStreamTracker`).
#[async_trait::async_trait]
pub trait StreamTracker: Send + Sync + fmt::Debug {
    /// The streams to consume now. An error keeps the current list, and so
    /// does a call that takes longer than 30 s: it is given up, so that
    /// shard sync goes on.
    async fn streams(&self) -> Result<Vec<StreamSpec>, SourceError>;
}

/// What happens to the leases of a stream that is no longer consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovedStreamPolicy {
    /// Keep them (with their checkpoints) in the table.
    Keep,
    /// Delete them this long after the removal was seen, all together
    /// once none is held (a lease a dead worker still holds counts as
    /// released once the sync leader judges its holder gone, as for a
    /// take).
    DeleteAfter(Duration),
}

pub(super) type LiveStreams = Arc<RwLock<Vec<StreamSpec>>>;

pub(super) fn read(live: &LiveStreams) -> std::sync::RwLockReadGuard<'_, Vec<StreamSpec>> {
    live.read().unwrap_or_else(|e| e.into_inner())
}

/// Replaces the live streams; returns the removed ones and whether any
/// was added. A multi-stream stream is its lease layout: listed twice, or
/// under another name (its ARN for its name), it is one stream, read once
/// under the name it has been read by, and not removed. Compared by name
/// too, a stream listed by its ARN instead had every consumer stopped and
/// every lease released, fleet-wide. (Single-stream specs share a layout:
/// their names tell them apart.)
pub(super) fn update_streams(
    live: &LiveStreams,
    wanted: Vec<StreamSpec>,
) -> (Vec<StreamSpec>, bool) {
    let mut current = live.write().unwrap_or_else(|e| e.into_inner());
    let listed =
        |specs: &[StreamSpec], spec: &StreamSpec| specs.iter().any(|s| same_stream(s, spec));
    let mut once: Vec<StreamSpec> = Vec::with_capacity(wanted.len());
    for spec in wanted {
        if listed(&once, &spec) {
            continue;
        }
        let read_as = current.iter().find(|s| same_stream(s, &spec));
        once.push(read_as.cloned().unwrap_or(spec));
    }
    let removed: Vec<StreamSpec> = current
        .iter()
        .filter(|s| !listed(&once, s))
        .cloned()
        .collect();
    let mut added = false;
    for spec in once.iter().filter(|s| !listed(&current, s)) {
        info!(stream = %spec.name, "stream added");
        added = true;
    }
    *current = once;
    (removed, added)
}

/// Whether `a` and `b` are one stream: one multi-stream layout (its
/// identifier names the stream), or one name in the single-stream layout.
fn same_stream(a: &StreamSpec, b: &StreamSpec) -> bool {
    a.layout == b.layout
        && (matches!(a.layout, LeaseLayout::MultiStream { .. }) || a.name == b.name)
}

/// What one round's deletion of removed streams' leases did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Deletion {
    /// Leases deleted.
    pub(super) deleted: usize,
    /// Held leases due for deletion that the taker has not judged yet.
    pub(super) unjudged: usize,
}

/// Deletes the leases of streams removed at least `delay` ago (each
/// guarded by its counter), from `leases`, a scan of this round. A stream's
/// leases go together once none is held: a lease still held waits for its
/// holder to release it, unless `judged` says the holder is gone (the
/// lease is one a taker would take).
pub(super) async fn delete_removed_leases(
    store: &dyn LeaseStore,
    removed_at: &mut HashMap<LeaseLayout, (String, Instant)>,
    delay: Duration,
    leases: &[Lease],
    judged: impl Fn(&Lease) -> HolderJudged,
) -> Deletion {
    let mut done = Deletion::default();
    let due: Vec<(LeaseLayout, String)> = removed_at
        .iter()
        .filter(|(_, (_, at))| at.elapsed() >= delay)
        .map(|(layout, (name, _))| (layout.clone(), name.clone()))
        .collect();
    for (layout, name) in due {
        let mut stream: Vec<&Lease> = leases.iter().filter(|l| layout.owns(l)).collect();
        // All or none: a stream added back with some of its leases gone
        // found a parent missing under a leased child, took it for
        // finished and skipped what the parent had left.
        let mut held = 0;
        for lease in stream
            .iter()
            .filter(|l| l.owner.is_some() || l.in_handoff())
        {
            match judged(lease) {
                HolderJudged::Gone => {}
                HolderJudged::Holding => held += 1,
                HolderJudged::NotYet => {
                    done.unjudged += 1;
                    held += 1;
                }
            }
        }
        if held > 0 {
            continue;
        }
        // Children first, and no lease whose child is left: should a delete
        // fail (the lease moved) and the stream come back, a parent is left
        // to read again before its children, never a child without its
        // parent (taken for finished, its unread records skipped).
        children_first(&mut stream);
        let mut left: HashSet<&str> = HashSet::new();
        for lease in &stream {
            let child_left = stream.iter().any(|child| {
                left.contains(child.shard_id.as_str())
                    && child.parent_shard_ids.contains(&lease.shard_id)
            });
            if child_left {
                left.insert(&lease.shard_id);
                continue;
            }
            match store.delete(&lease.key, lease.counter).await {
                Ok(()) => {
                    done.deleted += 1;
                    info!(stream = %name, lease = %lease.key, "deleted a lease of a removed stream")
                }
                Err(_) => {
                    left.insert(&lease.shard_id);
                }
            }
        }
        if left.is_empty() {
            removed_at.remove(&layout);
        }
    }
    done
}

/// Orders one stream's `leases` so that every lease comes before those of
/// its parents (by how many ancestors each has among them).
fn children_first(leases: &mut [&Lease]) {
    let by_shard: HashMap<&str, &Lease> =
        leases.iter().map(|l| (l.shard_id.as_str(), *l)).collect();
    let mut depths: HashMap<&str, usize> = HashMap::new();
    for lease in leases.iter() {
        depth(&lease.shard_id, &by_shard, &mut depths, &mut Vec::new());
    }
    leases.sort_by_key(|l| std::cmp::Reverse(depths.get(l.shard_id.as_str()).copied()));
}

/// How many generations of `shard`'s ancestors `by_shard` holds; a parent
/// cycle (a malformed table) is cut where it closes.
fn depth<'a>(
    shard: &'a str,
    by_shard: &HashMap<&'a str, &'a Lease>,
    depths: &mut HashMap<&'a str, usize>,
    path: &mut Vec<&'a str>,
) -> usize {
    if let Some(d) = depths.get(shard) {
        return *d;
    }
    let Some(lease) = by_shard.get(shard) else {
        return 0;
    };
    if path.contains(&shard) {
        return 0;
    }
    path.push(shard);
    let d = lease
        .parent_shard_ids
        .iter()
        .filter(|p| by_shard.contains_key(p.as_str()))
        .map(|p| depth(p, by_shard, depths, path) + 1)
        .max()
        .unwrap_or(0);
    path.pop();
    depths.insert(shard, d);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Checkpoint;

    fn lease(shard: &str, parents: &[&str]) -> Lease {
        LeaseLayout::SingleStream
            .new_lease(shard, Checkpoint::TrimHorizon)
            .with_parents(parents.iter().copied())
    }

    /// Every lease is deleted before its parents' (a merge's two, a
    /// parent whose lease is already gone, a malformed cycle): a deletion
    /// cut short leaves parents, never a child without its parent.
    /// A child whose delete fails keeps its ancestors (a merge's two
    /// parents, a grandparent), not the rest of the stream; the stream
    /// stays due, for the next round to finish.
    #[tokio::test]
    async fn a_parent_is_kept_while_a_childs_delete_fails() {
        use crate::store::memory::{Fault, InMemoryLeaseStore};
        use crate::store::{StoreErrorKind, StoreOp};
        let store = InMemoryLeaseStore::new();
        let leases = [
            lease("gp", &[]),
            lease("p", &["gp"]),
            lease("q", &[]),
            lease("c1", &["p", "q"]),
            lease("c2", &["p"]),
            lease("other", &[]),
        ];
        for l in &leases {
            store.put_raw(l.clone());
        }
        store.inject_on(
            StoreOp::Delete,
            "c1",
            Fault::Error(StoreErrorKind::Retryable),
        );
        let mut removed_at =
            HashMap::from([(LeaseLayout::SingleStream, ("s".to_owned(), Instant::now()))]);
        let done = delete_removed_leases(&store, &mut removed_at, Duration::ZERO, &leases, |_| {
            HolderJudged::Gone
        })
        .await;
        let mut kept: Vec<String> = store.snapshot().into_iter().map(|l| l.shard_id).collect();
        kept.sort();
        assert_eq!(kept, ["c1", "gp", "p", "q"]);
        assert_eq!(done.deleted, 2);
        assert_eq!(removed_at.len(), 1, "due again next round");
    }

    #[test]
    fn a_streams_leases_are_deleted_children_first() {
        let leases = [
            lease("p", &[]),
            lease("q", &[]),
            lease("x", &["gone"]),
            lease("m", &["p", "q"]),
            lease("g", &["m"]),
            lease("c1", &["c2"]),
            lease("c2", &["c1"]),
        ];
        let mut order: Vec<&Lease> = leases.iter().collect();
        children_first(&mut order);
        let at = |shard: &str| order.iter().position(|l| l.shard_id == shard).unwrap();
        assert!(at("g") < at("m") && at("m") < at("p") && at("m") < at("q"));
        assert_eq!(order.len(), leases.len());
    }
}
