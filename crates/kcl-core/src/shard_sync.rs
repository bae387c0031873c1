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
//! - A closed shard without a lease but with a leased child is
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
    let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
    for shard in shards {
        for parent in shard.parents() {
            children
                .entry(parent)
                .or_default()
                .push(shard.shard_id.as_str());
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
            shard.is_closed()
                && children
                    .get(shard.shard_id.as_str())
                    .is_some_and(|kids| kids.iter().any(|k| has_lease(k)))
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

/// Lists `stream`'s shards, scans the lease table once, and creates the
/// leases [`plan`] asks for, parents first.
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
    let shards = source
        .list_shards(stream)
        .await
        .map_err(SyncError::Source)?;
    let pages: Vec<Vec<Lease>> = store.scan().try_collect().await.map_err(SyncError::Store)?;
    let existing: Vec<Lease> = pages.into_iter().flatten().collect();
    create_planned(store, stream, layout, initial, shards, existing).await
}

/// [`sync_shards`] from a scan the caller already made: a worker of several
/// streams reads the lease table once for all of them.
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
mod tests {
    use std::time::{Duration, SystemTime};

    use async_trait::async_trait;

    use super::*;
    use crate::source::memory::InMemoryShardSource;
    use crate::source::{OpenShard, ShardReader};
    use crate::store::memory::{Fault, InMemoryLeaseStore, RandomFaults};
    use crate::store::{ErrorKind, StoreOp};

    const TH: InitialPosition = InitialPosition::TrimHorizon;
    const LATEST: InitialPosition = InitialPosition::Latest;
    const STREAM: &str = "orders";

    fn at_ts() -> InitialPosition {
        InitialPosition::AtTimestamp(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
    }

    /// A shard covering `lo..=hi`, with parents; closed when `closed`.
    fn shard(id: &str, parents: &[&str], (lo, hi): (u128, u128), closed: bool) -> ShardInfo {
        ShardInfo {
            shard_id: id.to_owned(),
            parent_shard_id: parents.first().map(|p| (*p).to_owned()),
            adjacent_parent_shard_id: parents.get(1).map(|p| (*p).to_owned()),
            hash_key_range: HashKeyRange {
                starting: lo.to_string(),
                ending: hi.to_string(),
            },
            starting_sequence_number: "1".to_owned(),
            ending_sequence_number: closed.then(|| "2".to_owned()),
        }
    }

    const HALF: u128 = u128::MAX / 2;
    const ALL: (u128, u128) = (0, u128::MAX);
    const LOW: (u128, u128) = (0, HALF);
    const HIGH: (u128, u128) = (HALF + 1, u128::MAX);

    fn leased(ids: &[&str]) -> Vec<Lease> {
        ids.iter()
            .map(|id| Lease::new(*id, Checkpoint::TrimHorizon))
            .collect()
    }

    /// (shard id, checkpoint) of each planned lease, in plan order.
    fn created(plan: &SyncPlan) -> Vec<(String, Checkpoint)> {
        plan.create
            .iter()
            .map(|l| (l.shard_id.clone(), l.checkpoint.clone()))
            .collect()
    }

    fn assert_parents_first(plan: &SyncPlan) {
        for (i, lease) in plan.create.iter().enumerate() {
            for parent in &lease.parent_shard_ids {
                if let Some(j) = plan.create.iter().position(|l| &l.shard_id == parent) {
                    assert!(
                        j < i,
                        "parent {parent} planned after child {}",
                        lease.shard_id
                    );
                }
            }
        }
    }

    #[test]
    fn plan_table() {
        use Checkpoint::{AtTimestamp as AT, Latest as L, TrimHorizon as T};
        let single = vec![shard("s0", &[], LOW, false), shard("s1", &[], HIGH, false)];
        let split = vec![
            shard("p", &[], ALL, true),
            shard("a", &["p"], LOW, false),
            shard("b", &["p"], HIGH, false),
        ];
        let merge = vec![
            shard("a", &[], LOW, true),
            shard("b", &[], HIGH, true),
            shard("c", &["a", "b"], ALL, false),
        ];
        // p -> (a, b); a -> (a1, a2): `a` is closed between leased `p` and
        // the open grandchildren.
        let chain = vec![
            shard("p", &[], ALL, true),
            shard("a", &["p"], LOW, true),
            shard("b", &["p"], HIGH, false),
            shard("a1", &["a"], (0, HALF / 2), false),
            shard("a2", &["a"], (HALF / 2 + 1, HALF), false),
        ];
        type Case<'a> = (
            &'a str,
            &'a [ShardInfo],
            Vec<Lease>,
            InitialPosition,
            Vec<(&'a str, Checkpoint)>,
        );
        // One line per case reads as a table.
        #[rustfmt::skip]
        let cases: Vec<Case<'_>> = vec![
            ("fresh, TRIM_HORIZON", &single, vec![], TH, vec![("s0", T), ("s1", T)]),
            ("fresh, LATEST", &single, vec![], LATEST, vec![("s0", L), ("s1", L)]),
            ("fresh, AT_TIMESTAMP", &single, vec![], at_ts(), vec![("s0", AT), ("s1", AT)]),
            ("all leased", &single, leased(&["s0", "s1"]), TH, vec![]),
            ("one leased", &single, leased(&["s1"]), LATEST, vec![("s0", L)]),
            ("split, fresh, TRIM_HORIZON", &split, vec![], TH, vec![("p", T), ("a", T), ("b", T)]),
            ("split, fresh, LATEST", &split, vec![], LATEST, vec![("a", L), ("b", L)]),
            ("split, fresh, AT_TIMESTAMP", &split, vec![], at_ts(), vec![("p", AT), ("a", T), ("b", T)]),
            ("split, parent leased, LATEST", &split, leased(&["p"]), LATEST, vec![("a", T), ("b", T)]),
            ("split, parent leased, AT_TIMESTAMP", &split, leased(&["p"]), at_ts(), vec![("a", T), ("b", T)]),
            ("split, parent finished", &split, leased(&["a", "b"]), TH, vec![]),
            ("split, parent finished, LATEST", &split, leased(&["a"]), LATEST, vec![("b", T)]),
            ("merge, fresh, TRIM_HORIZON", &merge, vec![], TH, vec![("a", T), ("b", T), ("c", T)]),
            ("merge, fresh, LATEST", &merge, vec![], LATEST, vec![("c", L)]),
            ("merge, fresh, AT_TIMESTAMP", &merge, vec![], at_ts(), vec![("a", AT), ("b", AT), ("c", T)]),
            ("merge, one parent leased, LATEST", &merge, leased(&["a"]), LATEST, vec![("c", T)]),
            ("merge, parents finished", &merge, leased(&["c"]), TH, vec![]),
            ("chain, root leased, LATEST", &chain, leased(&["p"]), LATEST, vec![("a", T), ("a1", T), ("a2", T), ("b", T)]),
            ("chain, fresh, LATEST", &chain, vec![], LATEST, vec![("b", L), ("a1", L), ("a2", L)]),
            ("chain, a finished", &chain, leased(&["p", "a1", "a2"]), TH, vec![("b", T)]),
            // The parent's lease outlived its listing (trimmed): the child
            // still waits for it and starts at its first record.
            ("parent trimmed but leased", &split[1..], leased(&["p"]), LATEST, vec![("a", T), ("b", T)]),
            ("parent trimmed, no lease", &split[1..], vec![], LATEST, vec![("a", L), ("b", L)]),
        ];
        for (name, shards, existing, initial, want) in cases {
            let plan = plan(&LeaseLayout::SingleStream, shards, &existing, initial);
            let mut got = created(&plan);
            let mut want: Vec<(String, Checkpoint)> =
                want.into_iter().map(|(s, c)| (s.to_owned(), c)).collect();
            assert_parents_first(&plan);
            got.sort_by(|a, b| a.0.cmp(&b.0));
            want.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(got, want, "{name}");
            assert!(
                plan.coverage_holes.is_empty(),
                "{name}: {:?}",
                plan.coverage_holes
            );
        }
    }

    #[test]
    fn planned_leases_carry_lineage_and_range() {
        let shards = vec![
            shard("a", &[], LOW, true),
            shard("b", &[], HIGH, true),
            shard("c", &["a", "b"], ALL, false),
        ];
        let plan = plan(&LeaseLayout::SingleStream, &shards, &[], TH);
        let c = plan
            .create
            .iter()
            .find(|l| l.shard_id == "c")
            .expect("c planned");
        assert_eq!(c.key, "c");
        assert_eq!(
            c.parent_shard_ids
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(c.hash_key_range, Some(shards[2].hash_key_range.clone()));
        assert_eq!(c.owner, None);
        assert_eq!(c.counter, 0);
    }

    #[test]
    fn multi_stream_keys_and_existing_leases_of_other_streams() {
        let layout = LeaseLayout::MultiStream {
            identifier: "123456789012:orders:1700000000".to_owned(),
        };
        let shards = vec![shard("p", &[], ALL, true), shard("a", &["p"], ALL, false)];
        // A lease for "p" of another stream must not count as ours.
        let other = Lease::new_multi_stream("123456789012:other:1", "p", Checkpoint::TrimHorizon);
        let plan = plan(&layout, &shards, &[other], LATEST);
        assert_eq!(created(&plan), vec![("a".to_owned(), Checkpoint::Latest)]);
        assert_eq!(plan.create[0].key, "123456789012:orders:1700000000:a");
        assert_eq!(
            plan.create[0].stream.as_deref(),
            Some("123456789012:orders:1700000000")
        );
        assert!(plan.create[0].parent_shard_ids.contains("p"));

        let ours =
            Lease::new_multi_stream("123456789012:orders:1700000000", "p", Checkpoint::Latest);
        let plan = super::plan(&layout, &shards, &[ours], LATEST);
        assert_eq!(
            created(&plan),
            vec![("a".to_owned(), Checkpoint::TrimHorizon)]
        );
    }

    #[test]
    fn coverage_holes_are_reported() {
        let hole = |start, end| HashKeyHole { start, end };
        let cases: Vec<(&str, Vec<ShardInfo>, Vec<HashKeyHole>)> = vec![
            (
                "full",
                vec![shard("a", &[], LOW, false), shard("b", &[], HIGH, false)],
                vec![],
            ),
            (
                "overlap is no hole",
                vec![
                    shard("a", &[], (0, HALF + 5), false),
                    shard("b", &[], HIGH, false),
                ],
                vec![],
            ),
            ("no shards", vec![], vec![hole(0, u128::MAX)]),
            (
                "low end",
                vec![shard("b", &[], HIGH, false)],
                vec![hole(0, HALF)],
            ),
            (
                "high end",
                vec![shard("a", &[], LOW, false)],
                vec![hole(HALF + 1, u128::MAX)],
            ),
            (
                "middle, closed shards do not count",
                vec![
                    shard("a", &[], (0, 9), false),
                    shard("x", &[], (10, 19), true),
                    shard("b", &[], (20, u128::MAX), false),
                ],
                vec![hole(10, 19)],
            ),
            (
                "unparsable range covers nothing",
                vec![shard("a", &[], LOW, false), {
                    let mut s = shard("b", &[], HIGH, false);
                    s.hash_key_range.ending = "not a number".to_owned();
                    s
                }],
                vec![hole(HALF + 1, u128::MAX)],
            ),
        ];
        for (name, shards, want) in cases {
            let plan = plan(&LeaseLayout::SingleStream, &shards, &[], TH);
            assert_eq!(plan.coverage_holes, want, "{name}");
        }
    }

    #[test]
    fn parent_cycles_do_not_loop_or_panic() {
        let shards = vec![
            shard("a", &["b"], LOW, true),
            shard("b", &["a"], HIGH, true),
            shard("c", &["c"], ALL, false),
        ];
        for initial in [TH, LATEST, at_ts()] {
            let plan = plan(&LeaseLayout::SingleStream, &shards, &[], initial);
            let ids: HashSet<String> = plan.create.iter().map(|l| l.shard_id.clone()).collect();
            assert!(ids.contains("c"), "{initial:?}: {ids:?}");
            assert_eq!(ids.len(), plan.create.len(), "each shard at most once");
        }
    }

    fn keys(store: &InMemoryLeaseStore) -> Vec<(String, Checkpoint)> {
        let mut v: Vec<_> = store
            .snapshot()
            .into_iter()
            .map(|l| (l.key, l.checkpoint))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[tokio::test]
    async fn sync_fresh_stream_at_each_initial_position() {
        for (initial, cp) in [
            (TH, Checkpoint::TrimHorizon),
            (LATEST, Checkpoint::Latest),
            (at_ts(), Checkpoint::AtTimestamp),
        ] {
            let source = InMemoryShardSource::new();
            let ids = source.create_stream(STREAM, 3);
            let store = InMemoryLeaseStore::new();
            let report = sync_shards(&source, &store, STREAM, &LeaseLayout::SingleStream, initial)
                .await
                .expect("sync");
            assert_eq!(report.created, 3);
            assert_eq!(report.already_existed, 0);
            assert!(report.holes.is_empty());
            let want: Vec<_> = ids.into_iter().map(|id| (id, cp.clone())).collect();
            assert_eq!(keys(&store), want, "{initial:?}");
        }
    }

    #[tokio::test]
    async fn sync_after_split_and_merge() {
        let source = InMemoryShardSource::new();
        let ids = source.create_stream(STREAM, 2);
        let store = InMemoryLeaseStore::new();
        let layout = LeaseLayout::SingleStream;
        sync_shards(&source, &store, STREAM, &layout, LATEST)
            .await
            .expect("first sync");

        let [a, b] = source.split(STREAM, &ids[0]).expect("split");
        let report = sync_shards(&source, &store, STREAM, &layout, LATEST)
            .await
            .expect("sync after split");
        assert_eq!(report.created, 2);
        let snapshot = store.snapshot();
        for child in [&a, &b] {
            let lease = snapshot
                .iter()
                .find(|l| &l.key == child)
                .expect("child lease");
            assert_eq!(
                lease.checkpoint,
                Checkpoint::TrimHorizon,
                "children wait for the parent"
            );
            assert!(lease.parent_shard_ids.contains(&ids[0]));
        }

        let c = source.merge(STREAM, &b, &ids[1]).expect("merge");
        let report = sync_shards(&source, &store, STREAM, &layout, LATEST)
            .await
            .expect("sync after merge");
        assert_eq!(report.created, 1);
        let lease = store
            .snapshot()
            .into_iter()
            .find(|l| l.key == c)
            .expect("merged child lease");
        assert_eq!(lease.checkpoint, Checkpoint::TrimHorizon);
        assert_eq!(
            lease.parent_shard_ids,
            [b.clone(), ids[1].clone()].into_iter().collect()
        );
    }

    #[tokio::test]
    async fn finished_parent_is_not_recreated() {
        let source = InMemoryShardSource::new();
        let ids = source.create_stream(STREAM, 1);
        let store = InMemoryLeaseStore::new();
        let layout = LeaseLayout::SingleStream;
        source.split(STREAM, &ids[0]).expect("split");
        sync_shards(&source, &store, STREAM, &layout, TH)
            .await
            .expect("sync");
        assert_eq!(store.snapshot().len(), 3);
        // The parent is processed to SHARD_END and its lease cleaned up.
        let parent = store.get(&ids[0]).await.expect("get").expect("parent");
        store
            .delete(&parent.key, parent.counter)
            .await
            .expect("delete");

        let report = sync_shards(&source, &store, STREAM, &layout, TH)
            .await
            .expect("sync again");
        assert_eq!(
            (report.created, report.already_existed, report.holes.len()),
            (0, 0, 0)
        );
        assert_eq!(store.snapshot().len(), 2);
    }

    #[tokio::test]
    async fn sync_twice_creates_nothing_new() {
        let source = InMemoryShardSource::new();
        let ids = source.create_stream(STREAM, 2);
        source.split(STREAM, &ids[1]).expect("split");
        let store = InMemoryLeaseStore::new();
        let layout = LeaseLayout::SingleStream;
        let first = sync_shards(&source, &store, STREAM, &layout, TH)
            .await
            .expect("first");
        assert_eq!(first.created, 4);
        let before = store.snapshot();
        let second = sync_shards(&source, &store, STREAM, &layout, TH)
            .await
            .expect("second");
        assert_eq!(
            (second.created, second.already_existed, second.holes.len()),
            (0, 0, 0)
        );
        assert_eq!(store.snapshot(), before);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_syncs_create_each_lease_once() {
        let mut races = 0;
        for seed in 0..20 {
            let source = InMemoryShardSource::new();
            let ids = source.create_stream(STREAM, 4);
            source.split(STREAM, &ids[0]).expect("split");
            source.merge(STREAM, &ids[2], &ids[3]).expect("merge");
            let table = InMemoryLeaseStore::new();
            let (one, two) = (table.handle(), table.handle());
            // Random latency interleaves the two workers' creates.
            for (i, store) in [&one, &two].into_iter().enumerate() {
                store.set_random_faults(Some(RandomFaults {
                    seed: seed * 2 + i as u64,
                    error_rate: 0.0,
                    lost_response_rate: 0.0,
                    max_latency: Duration::from_millis(5),
                }));
            }
            let layout = LeaseLayout::SingleStream;
            let (r1, r2) = tokio::join!(
                sync_shards(&source, &one, STREAM, &layout, TH),
                sync_shards(&source, &two, STREAM, &layout, TH),
            );
            let (r1, r2) = (r1.expect("worker one"), r2.expect("worker two"));
            let shards = source.list_shards(STREAM).await.expect("list").len();
            assert_eq!(r1.created + r2.created, shards, "seed {seed}");
            assert_eq!(table.snapshot().len(), shards);
            // A worker whose scan came after some of its peer's creates
            // plans fewer; none plans more than every shard.
            assert!(r1.created + r1.already_existed <= shards);
            assert!(r2.created + r2.already_existed <= shards);
            races += r1.already_existed + r2.already_existed;
        }
        assert!(races > 0, "the workers never raced for a create");
    }

    #[tokio::test]
    async fn a_failed_create_stops_before_the_children() {
        let source = InMemoryShardSource::new();
        let ids = source.create_stream(STREAM, 1);
        source.split(STREAM, &ids[0]).expect("split");
        let store = InMemoryLeaseStore::new();
        store.inject(StoreOp::Create, Fault::Error(ErrorKind::Retryable));
        let err = sync_shards(&source, &store, STREAM, &LeaseLayout::SingleStream, TH)
            .await
            .expect_err("create fails");
        assert!(err.is_retryable(), "{err}");
        assert!(matches!(&err, SyncError::Store(_)), "{err:?}");
        assert!(store.snapshot().is_empty(), "no child without its parent");
        // The next sync finishes the job.
        let report = sync_shards(&source, &store, STREAM, &LeaseLayout::SingleStream, TH)
            .await
            .expect("retry");
        assert_eq!(report.created, 3);
    }

    #[tokio::test]
    async fn missing_stream_is_a_list_error() {
        let source = InMemoryShardSource::new();
        let store = InMemoryLeaseStore::new();
        let err = sync_shards(&source, &store, "nope", &LeaseLayout::SingleStream, TH)
            .await
            .expect_err("no stream");
        assert!(
            matches!(err, SyncError::Source(SourceError::StreamNotFound { .. })),
            "{err:?}"
        );
        assert!(!err.is_retryable());
    }

    /// A source listing fixed shards, for shapes the in-memory source
    /// cannot produce.
    #[derive(Debug)]
    struct Fixed(Vec<ShardInfo>);

    #[async_trait]
    impl ShardSource for Fixed {
        async fn list_shards(&self, _stream: &str) -> Result<Vec<ShardInfo>, SourceError> {
            Ok(self.0.clone())
        }
        async fn open(&self, request: OpenShard) -> Result<Box<dyn ShardReader>, SourceError> {
            Err(SourceError::Fatal {
                stream: request.stream,
                message: "not readable".to_owned(),
                source: None,
            })
        }
    }

    #[tokio::test]
    async fn sync_reports_holes_and_still_creates() {
        let source = Fixed(vec![
            shard("a", &[], (0, 99), false),
            shard("b", &[], (200, u128::MAX), false),
        ]);
        let store = InMemoryLeaseStore::new();
        let report = sync_shards(&source, &store, STREAM, &LeaseLayout::SingleStream, TH)
            .await
            .expect("sync");
        assert_eq!(report.created, 2);
        assert_eq!(
            report.holes,
            vec![HashKeyHole {
                start: 100,
                end: 199
            }]
        );
    }
}
