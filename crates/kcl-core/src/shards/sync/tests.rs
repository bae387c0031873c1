use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::*;
use crate::source::memory::InMemoryShardSource;
use crate::source::{OpenShard, ShardReader};
use crate::store::memory::{Fault, InMemoryLeaseStore, RandomFaults};
use crate::store::{StoreErrorKind, StoreOp};

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
    // p -> (a, b) -> (a1, a2, b1, b2): two generations of resharding.
    let generations = vec![
        shard("p", &[], ALL, true),
        shard("a", &["p"], LOW, true),
        shard("b", &["p"], HIGH, true),
        shard("a1", &["a"], (0, HALF / 2), false),
        shard("a2", &["a"], (HALF / 2 + 1, HALF), false),
        shard("b1", &["b"], (HALF + 1, HALF + HALF / 2), false),
        shard("b2", &["b"], (HALF + HALF / 2 + 1, u128::MAX), false),
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
        // Cleanup deleted `p` once `a` and `b` were leased, then `a` and
        // `b` once theirs were: `p` is finished, not a root to read again
        // (it was re-created at the initial position, its records and its
        // children's replayed after the grandchildren's).
        ("two generations finished", &generations, leased(&["a1", "a2", "b1", "b2"]), TH, vec![]),
        ("two generations finished, AT_TIMESTAMP", &generations, leased(&["a1", "a2", "b1", "b2"]), at_ts(), vec![]),
        ("two generations, half finished", &generations, leased(&["a1", "a2", "b"]), TH, vec![("b1", T), ("b2", T)]),
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

    let ours = Lease::new_multi_stream("123456789012:orders:1700000000", "p", Checkpoint::Latest);
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

/// A stream `STREAM` of `shards` shards (their ids) and an empty lease
/// table.
fn fresh(shards: usize) -> (InMemoryShardSource, Vec<String>, InMemoryLeaseStore) {
    let source = InMemoryShardSource::new();
    let ids = source.create_stream(STREAM, shards);
    (source, ids, InMemoryLeaseStore::new())
}

/// [`sync_shards`] of `STREAM`, single-stream.
async fn sync(
    source: &dyn ShardSource,
    store: &dyn LeaseStore,
    initial: InitialPosition,
) -> Result<SyncReport, SyncError> {
    sync_shards(source, store, STREAM, &LeaseLayout::SingleStream, initial).await
}

#[tokio::test]
async fn sync_fresh_stream_at_each_initial_position() {
    for (initial, cp) in [
        (TH, Checkpoint::TrimHorizon),
        (LATEST, Checkpoint::Latest),
        (at_ts(), Checkpoint::AtTimestamp),
    ] {
        let (source, ids, store) = fresh(3);
        let report = sync(&source, &store, initial).await.expect("sync");
        assert_eq!(report.created, 3);
        assert_eq!(report.already_existed, 0);
        assert!(report.holes.is_empty());
        let want: Vec<_> = ids.into_iter().map(|id| (id, cp.clone())).collect();
        assert_eq!(keys(&store), want, "{initial:?}");
    }
}

#[tokio::test]
async fn sync_after_split_and_merge() {
    let (source, ids, store) = fresh(2);
    sync(&source, &store, LATEST).await.expect("first sync");

    let [a, b] = source.split(STREAM, &ids[0]).expect("split");
    let report = sync(&source, &store, LATEST)
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
    let report = sync(&source, &store, LATEST)
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
    let (source, ids, store) = fresh(1);
    source.split(STREAM, &ids[0]).expect("split");
    sync(&source, &store, TH).await.expect("sync");
    assert_eq!(store.snapshot().len(), 3);
    // The parent is processed to SHARD_END and its lease cleaned up.
    let parent = store.get(&ids[0]).await.expect("get").expect("parent");
    store
        .delete(&parent.key, parent.counter)
        .await
        .expect("delete");

    let report = sync(&source, &store, TH).await.expect("sync again");
    assert_eq!(
        (report.created, report.already_existed, report.holes.len()),
        (0, 0, 0)
    );
    assert_eq!(store.snapshot().len(), 2);
}

#[tokio::test]
async fn sync_twice_creates_nothing_new() {
    let (source, ids, store) = fresh(2);
    source.split(STREAM, &ids[1]).expect("split");
    let first = sync(&source, &store, TH).await.expect("first");
    assert_eq!(first.created, 4);
    let before = store.snapshot();
    let second = sync(&source, &store, TH).await.expect("second");
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
        let (source, ids, table) = fresh(4);
        source.split(STREAM, &ids[0]).expect("split");
        source.merge(STREAM, &ids[2], &ids[3]).expect("merge");
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
        let (r1, r2) = tokio::join!(sync(&source, &one, TH), sync(&source, &two, TH));
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
    let (source, ids, store) = fresh(1);
    source.split(STREAM, &ids[0]).expect("split");
    store.inject(StoreOp::Create, Fault::Error(StoreErrorKind::Retryable));
    let err = sync(&source, &store, TH).await.expect_err("create fails");
    assert!(err.is_retryable(), "{err}");
    assert!(matches!(&err, SyncError::Store(_)), "{err:?}");
    assert!(store.snapshot().is_empty(), "no child without its parent");
    // The next sync finishes the job.
    let report = sync(&source, &store, TH).await.expect("retry");
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
    let report = sync(&source, &store, TH).await.expect("sync");
    assert_eq!(report.created, 2);
    assert_eq!(
        report.holes,
        vec![HashKeyHole {
            start: 100,
            end: 199
        }]
    );
}

/// A source listing fixed shards that, once it has answered, lets the
/// table move on: `then` runs on the store after the listing is taken.
#[derive(Debug)]
struct ListedThen {
    shards: Vec<ShardInfo>,
    store: InMemoryLeaseStore,
    then: Vec<Lease>,
}

#[async_trait]
impl ShardSource for ListedThen {
    async fn list_shards(&self, _stream: &str) -> Result<Vec<ShardInfo>, SourceError> {
        // Meanwhile the shard split, was read to its end and cleaned up:
        // its lease is gone, its children's are there.
        self.store.delete("p", 0).await.expect("delete");
        for lease in &self.then {
            self.store.put_raw(lease.clone());
        }
        Ok(self.shards.clone())
    }
    async fn open(&self, request: OpenShard) -> Result<Box<dyn ShardReader>, SourceError> {
        Fixed(Vec::new()).open(request).await
    }
}

/// The sync plans from a scan no newer than its listing. A listing taken
/// before the scan may show a shard still open that the scan shows split,
/// finished and cleaned up (its children leased, its own lease gone):
/// planned from both, the shard was leased again at the initial position
/// and read a second time, after its children.
#[tokio::test]
async fn the_sync_scans_before_it_lists() {
    let store = InMemoryLeaseStore::new();
    store.put_raw(Lease::new("p", Checkpoint::TrimHorizon));
    let source = ListedThen {
        shards: vec![shard("p", &[], ALL, false)],
        store: store.clone(),
        then: vec![
            Lease::new("a", Checkpoint::TrimHorizon).with_parents(["p"]),
            Lease::new("b", Checkpoint::TrimHorizon).with_parents(["p"]),
        ],
    };
    let report = sync(&source, &store, TH).await.expect("sync");
    assert_eq!(report.created, 0);
    assert!(
        store.get("p").await.unwrap().is_none(),
        "p is not leased again"
    );
}
