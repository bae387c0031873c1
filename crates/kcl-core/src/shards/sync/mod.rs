//! Shard sync: one lease per shard that needs processing.
//!
//! [`plan`] is a pure decision over one snapshot (the listed shards and the
//! leases in the table): which leases to create, at which checkpoint, in
//! which order, and which hash keys no open shard covers. [`sync_shards`]
//! gathers the snapshot (one `ListShards` walk, one paginated scan) and
//! applies the plan with conditional creates, so any number of workers can
//! run it at once: each lease is created exactly once, by whoever wins.
//!
//! # Where a new lease starts
//!
//! - A shard with a lease is never touched.
//! - A **root** (none of its parents is leased, about to be leased, or
//!   finished) starts at the application's initial position. With `LATEST`
//!   a closed root gets no lease at all: nothing in it is newer than
//!   "now".
//! - Any other shard starts at `TRIM_HORIZON`: it is processed only after
//!   its parents reached `SHARD_END` (invariant 5), and from its first
//!   record, so nothing between the parents' end and the child's start is
//!   skipped. With `LATEST` this includes closed shards that descend from a
//!   leased shard: they sit between processed records and the open
//!   descendants, and skipping them would lose records (invariant 8).
//! - A closed shard without a lease but with a leased descendant (a child,
//!   or further down once cleanup deleted the children too) is
//!   **finished**: its lease was processed to `SHARD_END` and cleaned up.
//!   It is not re-created (that would re-process it), and its children
//!   count it as processed.

use std::collections::{HashMap, HashSet};
use std::fmt;

use futures::TryStreamExt;
use tracing::{debug, warn};

use crate::lease::{Checkpoint, HashKeyRange, Lease, LeaseLayout};
use crate::metric_names::{
    SHARD_SYNC_HASH_KEY_HOLES, SHARD_SYNC_LEASES_ALREADY_EXISTED, SHARD_SYNC_LEASES_CREATED,
};
use crate::source::{InitialPosition, ShardInfo, ShardSource, SourceError};
use crate::store::{LeaseStore, StoreError};

/// A new, unowned lease for `shard` at `checkpoint` in `layout`, with the
/// shard's parents and hash-key range.
pub fn new_lease(layout: &LeaseLayout, shard: &ShardInfo, checkpoint: Checkpoint) -> Lease {
    // Parents are shard ids in both layouts, as in the Java KCL: the
    // consumer maps them to keys with `LeaseLayout::key`.
    let mut lease = layout
        .new_lease(&shard.shard_id, checkpoint)
        .with_parents(shard.parents());
    lease.hash_key_range = Some(shard.hash_key_range.clone());
    lease
}

/// A run of hash keys, inclusive at both ends, that no open shard covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashKeyHole {
    /// First uncovered hash key.
    pub start: u128,
    /// Last uncovered hash key.
    pub end: u128,
}

impl fmt::Display for HashKeyHole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.start, self.end)
    }
}

/// What [`plan`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncPlan {
    /// Leases to create, every parent before its children.
    pub create: Vec<Lease>,
    /// Hash-key ranges no open shard covers, in ascending order. Normally
    /// empty; a hole means the listing is incomplete or inconsistent.
    pub coverage_holes: Vec<HashKeyHole>,
}

/// Where a shard stands, from the plan's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// It has a lease in the table.
    Leased,
    /// The plan creates its lease.
    Planned,
    /// Closed, no lease, a child leased: processed and cleaned up.
    Finished,
    /// It gets no lease (a closed root under `LATEST`).
    Skipped,
}

impl State {
    /// True if records of the shard are (or were) processed, so its
    /// children must start at their first record.
    fn processed(self) -> bool {
        matches!(self, State::Leased | State::Planned | State::Finished)
    }
}

/// Decides which leases to create for `shards` given the `existing` leases
/// (any subset of the table; leases of other streams are ignored by key).
/// See the [module docs](self) for the rules. Pure and total: malformed
/// input (parent cycles, unparsable ranges) never panics.
pub fn plan(
    layout: &LeaseLayout,
    shards: &[ShardInfo],
    existing: &[Lease],
    initial: InitialPosition,
) -> SyncPlan {
    let keys: HashSet<&str> = existing.iter().map(|l| l.key.as_str()).collect();
    let has_lease = |shard_id: &str| keys.contains(layout.key(shard_id).as_str());

    let by_id: HashMap<&str, &ShardInfo> =
        shards.iter().map(|s| (s.shard_id.as_str(), s)).collect();

    // The shards with a leased descendant. A lease below a shard is made
    // only once the shard has one (or was skipped), and cleanup deletes
    // only finished leases, so a closed shard with no lease but one below
    // was finished. After two generations of resharding cleanup leaves
    // only the grandchildren's leases: judged by its children alone, such
    // a shard was read again from its start, after its descendants.
    let mut leased_below: HashSet<&str> = HashSet::new();
    let mut up: Vec<&str> = shards
        .iter()
        .map(|s| s.shard_id.as_str())
        .filter(|id| has_lease(id))
        .collect();
    while let Some(id) = up.pop() {
        for parent in by_id.get(id).into_iter().flat_map(|s| s.parents()) {
            if leased_below.insert(parent) {
                up.push(parent);
            }
        }
    }

    let mut planner = Planner {
        layout,
        initial,
        by_id: &by_id,
        states: HashMap::new(),
        visiting: HashSet::new(),
        create: Vec::new(),
        has_lease: &has_lease,
        finished: &|shard: &ShardInfo| {
            shard.is_closed() && leased_below.contains(shard.shard_id.as_str())
        },
    };
    for shard in shards {
        planner.visit(&shard.shard_id);
    }
    SyncPlan {
        create: planner.create,
        coverage_holes: coverage_holes(shards),
    }
}

/// Depth-first walk from children to parents, so a parent's state is
/// decided (and its lease queued) before any of its children's.
struct Planner<'a> {
    layout: &'a LeaseLayout,
    initial: InitialPosition,
    by_id: &'a HashMap<&'a str, &'a ShardInfo>,
    states: HashMap<String, State>,
    /// Shards on the current path; a parent found here is a cycle.
    visiting: HashSet<String>,
    create: Vec<Lease>,
    has_lease: &'a dyn Fn(&str) -> bool,
    finished: &'a dyn Fn(&ShardInfo) -> bool,
}

impl Planner<'_> {
    /// The state of `shard_id`; `None` for a shard that is neither listed
    /// nor leased (trimmed away long ago), or that closes a parent cycle.
    fn visit(&mut self, shard_id: &str) -> Option<State> {
        if let Some(state) = self.states.get(shard_id) {
            return Some(*state);
        }
        if (self.has_lease)(shard_id) {
            self.states.insert(shard_id.to_owned(), State::Leased);
            return Some(State::Leased);
        }
        let shard = *self.by_id.get(shard_id)?;
        if !self.visiting.insert(shard_id.to_owned()) {
            // A listing that claims a shard is its own ancestor: treat the
            // edge as absent rather than loop.
            return None;
        }
        let parent_processed = shard
            .parents()
            .map(|p| self.visit(p))
            .collect::<Vec<_>>()
            .into_iter()
            .any(|s| s.is_some_and(State::processed));
        self.visiting.remove(shard_id);

        let state = if (self.finished)(shard) {
            State::Finished
        } else if parent_processed {
            self.create
                .push(new_lease(self.layout, shard, Checkpoint::TrimHorizon));
            State::Planned
        } else if shard.is_closed() && self.initial == InitialPosition::Latest {
            State::Skipped
        } else {
            self.create
                .push(new_lease(self.layout, shard, self.initial.checkpoint()));
            State::Planned
        };
        self.states.insert(shard_id.to_owned(), state);
        Some(state)
    }
}

/// The hash keys the open shards leave uncovered. Overlaps are not holes;
/// an open shard whose range does not parse covers nothing (and is
/// warned about).
fn coverage_holes(shards: &[ShardInfo]) -> Vec<HashKeyHole> {
    let mut ranges: Vec<(u128, u128)> = shards
        .iter()
        .filter(|s| !s.is_closed())
        .filter_map(|s| match parse_range(&s.hash_key_range) {
            Some(r) => Some(r),
            None => {
                warn!(
                    shard = %s.shard_id,
                    starting = %s.hash_key_range.starting,
                    ending = %s.hash_key_range.ending,
                    "shard has an invalid hash-key range"
                );
                None
            }
        })
        .collect();
    ranges.sort_unstable();
    let mut holes = Vec::new();
    // The first key not yet known to be covered; `None` once u128::MAX is.
    let mut next: Option<u128> = Some(0);
    for (start, end) in ranges {
        let Some(expected) = next else { break };
        if start > expected {
            holes.push(HashKeyHole {
                start: expected,
                end: start - 1,
            });
        }
        if end >= expected {
            next = end.checked_add(1);
        }
    }
    if let Some(start) = next {
        holes.push(HashKeyHole {
            start,
            end: u128::MAX,
        });
    }
    holes
}

fn parse_range(range: &HashKeyRange) -> Option<(u128, u128)> {
    let start: u128 = range.starting.parse().ok()?;
    let end: u128 = range.ending.parse().ok()?;
    (start <= end).then_some((start, end))
}

/// What one [`sync_shards`] run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Leases this run created.
    pub created: usize,
    /// Planned leases a peer created first (their create lost the race to
    /// ours, or ours to theirs): fine, counted for visibility.
    pub already_existed: usize,
    /// Hash-key ranges no open shard covers.
    pub holes: Vec<HashKeyHole>,
    /// The shards listed, for work that follows a sync (lease cleanup)
    /// without listing again.
    pub shards: Vec<ShardInfo>,
    /// The leases the sync's scan saw (before its own creations).
    pub leases: Vec<Lease>,
}

/// Why a shard sync stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SyncError {
    /// Listing the stream's shards failed.
    #[error("shard sync could not list the stream's shards")]
    Source(#[source] SourceError),
    /// Scanning the lease table or creating a lease failed (other than by
    /// losing a race). Leases after a failed create were not attempted, so
    /// no child exists without its parent; the next sync continues.
    #[error("shard sync could not read or write the lease table")]
    Store(#[source] StoreError),
}

impl SyncError {
    /// True when running the sync again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            SyncError::Source(source) => source.is_retryable(),
            SyncError::Store(source) => source.is_retryable(),
        }
    }
}

/// Scans the lease table once, lists `stream`'s shards, and creates the
/// leases [`plan`] asks for, parents first.
///
/// The scan comes first: a listing older than the scan (ListShards is
/// eventually consistent too) may show a shard still open that the scan
/// shows split, finished and cleaned up, its children leased and its own
/// lease gone; planned from both, the shard was leased again at the
/// initial position and read a second time. A listing newer than the scan
/// only shows what the scan's leases lead to.
///
/// Safe to run from many workers at once: creates are conditional, and a
/// create that finds the lease already there counts as
/// [`SyncReport::already_existed`]. Stops at the first other error, so a
/// child lease is never created without its parent's.
pub async fn sync_shards(
    source: &dyn ShardSource,
    store: &dyn LeaseStore,
    stream: &str,
    layout: &LeaseLayout,
    initial: InitialPosition,
) -> Result<SyncReport, SyncError> {
    let pages: Vec<Vec<Lease>> = store.scan().try_collect().await.map_err(SyncError::Store)?;
    let existing: Vec<Lease> = pages.into_iter().flatten().collect();
    let shards = source
        .list_shards(stream)
        .await
        .map_err(SyncError::Source)?;
    create_planned(store, stream, layout, initial, shards, existing).await
}

/// [`sync_shards`] from a scan the caller already made (before this call,
/// so that the listing is the newer): a worker of several streams reads
/// the lease table once for all of them.
pub async fn sync_shards_from(
    source: &dyn ShardSource,
    store: &dyn LeaseStore,
    stream: &str,
    layout: &LeaseLayout,
    initial: InitialPosition,
    existing: &[Lease],
) -> Result<SyncReport, SyncError> {
    let shards = source
        .list_shards(stream)
        .await
        .map_err(SyncError::Source)?;
    create_planned(store, stream, layout, initial, shards, existing.to_vec()).await
}

async fn create_planned(
    store: &dyn LeaseStore,
    stream: &str,
    layout: &LeaseLayout,
    initial: InitialPosition,
    shards: Vec<ShardInfo>,
    existing: Vec<Lease>,
) -> Result<SyncReport, SyncError> {
    let plan = plan(layout, &shards, &existing, initial);

    for hole in &plan.coverage_holes {
        warn!(stream, hole = %hole, "no open shard covers these hash keys");
    }
    metrics::counter!(SHARD_SYNC_HASH_KEY_HOLES, "stream" => stream.to_owned())
        .increment(plan.coverage_holes.len() as u64);

    let mut report = SyncReport {
        holes: plan.coverage_holes,
        ..SyncReport::default()
    };
    let create = plan.create;
    for lease in &create {
        match store.create_if_absent(lease).await {
            Ok(_) => {
                debug!(stream, key = %lease.key, checkpoint = %lease.checkpoint, "created lease");
                report.created += 1;
            }
            Err(e) if e.is_condition_failed() => report.already_existed += 1,
            Err(e) => {
                warn!(
                    stream,
                    key = %lease.key,
                    created = report.created,
                    error = %e,
                    "shard sync stopped: creating a lease failed"
                );
                record_metrics(stream, &report);
                return Err(SyncError::Store(e));
            }
        }
    }
    record_metrics(stream, &report);
    report.shards = shards;
    report.leases = existing;
    Ok(report)
}

fn record_metrics(stream: &str, report: &SyncReport) {
    metrics::counter!(SHARD_SYNC_LEASES_CREATED, "stream" => stream.to_owned())
        .increment(report.created as u64);
    metrics::counter!(SHARD_SYNC_LEASES_ALREADY_EXISTED, "stream" => stream.to_owned())
        .increment(report.already_existed as u64);
}

#[cfg(test)]
mod tests;
