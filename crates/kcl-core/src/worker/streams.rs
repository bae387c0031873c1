//! Stream tracking: the streams a worker consumes ([`StreamSpec`]), the
//! [`StreamTracker`] that changes them while it runs, the live list the
//! run loop reads, and what happens to a removed stream's leases.

use std::collections::HashMap;
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
    /// Delete them this long after the removal was seen, once released;
    /// a lease a dead worker still holds, once the sync leader judges its
    /// holder gone (as for a take).
    DeleteAfter(Duration),
}

pub(super) type LiveStreams = Arc<RwLock<Vec<StreamSpec>>>;

pub(super) fn read(live: &LiveStreams) -> std::sync::RwLockReadGuard<'_, Vec<StreamSpec>> {
    live.read().unwrap_or_else(|e| e.into_inner())
}

/// Replaces the live streams; returns the removed ones and whether any
/// was added.
pub(super) fn update_streams(
    live: &LiveStreams,
    wanted: Vec<StreamSpec>,
) -> (Vec<StreamSpec>, bool) {
    let mut current = live.write().unwrap_or_else(|e| e.into_inner());
    let removed: Vec<StreamSpec> = current
        .iter()
        .filter(|s| !wanted.contains(s))
        .cloned()
        .collect();
    let mut added = false;
    for spec in wanted.iter().filter(|s| !current.contains(s)) {
        info!(stream = %spec.name, "stream added");
        added = true;
    }
    *current = wanted;
    (removed, added)
}

/// What one round's deletion of removed streams' leases did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Deletion {
    /// Leases deleted.
    pub(super) deleted: usize,
    /// Held leases due for deletion that the taker has not judged yet.
    pub(super) unjudged: usize,
}

/// Deletes the released leases of streams removed at least `delay` ago
/// (each guarded by its counter), from `leases`, a scan of this round.
/// Leases still held are left for their holder to release first, unless
/// `judged` says the holder is gone (the lease is one a taker would take).
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
        let mut left = 0;
        for lease in leases.iter().filter(|l| layout.owns(l)) {
            if lease.owner.is_some() || lease.in_handoff() {
                match judged(lease) {
                    HolderJudged::Gone => {}
                    HolderJudged::Holding => {
                        left += 1;
                        continue;
                    }
                    HolderJudged::NotYet => {
                        done.unjudged += 1;
                        left += 1;
                        continue;
                    }
                }
            }
            match store.delete(&lease.key, lease.counter).await {
                Ok(()) => {
                    done.deleted += 1;
                    info!(stream = %name, lease = %lease.key, "deleted a lease of a removed stream")
                }
                Err(_) => left += 1,
            }
        }
        if left == 0 {
            removed_at.remove(&layout);
        }
    }
    done
}
