//! Parallel lanes inside a shard and poison records, on whole workers over
//! the in-memory store and source under a paused clock: each key's records
//! in order whatever the lanes and delays, a checkpoint that never passes
//! an unfinished record (kill anywhere, restart, nothing lost), handoff and
//! shutdown mid-lane without loss or repeats, and poison records bisected
//! out to a destination before the checkpoint passes them.
#![allow(clippy::unwrap_used)]

// Only the processors' shared pieces, not the coordinator simulation of
// `common`, which this binary does not use.
#[allow(dead_code, unreachable_pub)]
#[path = "common/processing.rs"]
mod processing;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use kcl_core::checkpointer::{CheckpointPolicy, Checkpointer};
use kcl_core::poison::{FailureReason, PoisonPolicy};
use kcl_core::processor::{
    FailurePolicy, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
};
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::test_util::fleet::{self, parse};
use kcl_core::worker::{StreamSpec, WorkerConfig};
use kcl_core::{Checkpoint, LeaseConfig, LeaseLayout, LeaseStore};
use processing::{Collect, Processed, STREAM, take_one};
use proptest::prelude::*;
use tokio::time::{Instant, sleep};

/// What the processors saw.
#[derive(Default)]
struct Log {
    processed: Processed,
    running: AtomicUsize,
    most_running: AtomicUsize,
    /// Failed calls of process_records (poison present).
    failures: AtomicU32,
    /// (worker, when) of each process_records call that went to work.
    starts: Mutex<Vec<(String, Instant)>>,
    lease_lost_calls: AtomicU32,
    /// Endings given to a processor whose initialize was never called.
    endings_without_initialize: AtomicU32,
    /// Endings (`shard_ended`, `shutdown_requested`, `lease_lost`) that
    /// reached a processor which had had one already.
    second_endings: AtomicU32,
    /// Failures left to inject (shard_ended of lane 1, initialize of lane
    /// 2), fleet-wide.
    shard_ended_failures_left: AtomicU32,
    /// Panics left to inject in `shard_ended` (any lane), fleet-wide.
    shard_ended_panics_left: AtomicU32,
    initialize_failures_left: AtomicU32,
    /// When lane 1's shard_ended first checkpointed, per shard, as a
    /// place in `order` (paused time puts many steps in one instant).
    lane_one_ended_at: Mutex<BTreeMap<String, u64>>,
    /// When each shard's first record was processed, as a place in
    /// `order`.
    first_record_at: Mutex<BTreeMap<String, u64>>,
    /// Orders the events above.
    order: AtomicU64,
}

/// How long the processor works on record `(pk, n)`.
type Delay = Arc<dyn Fn(&str, u64) -> Duration + Send + Sync>;

#[derive(Clone)]
struct Behaviour {
    /// Per-record work: `(pk, n) -> delay`.
    delay: Delay,
    checkpoint_each_batch: bool,
    /// Records (pk, n) the processor always fails on; a batch holding one
    /// fails before anything of it is processed.
    poison: Arc<HashSet<(String, u64)>>,
    /// The processor panics on this record, once fleet-wide.
    panic_on: Option<(&'static str, u64)>,
    /// Lanes other than 0 keep their records in memory and make them
    /// durable (log them) only when they checkpoint, at shutdown.
    buffering_lanes: bool,
}

impl Behaviour {
    fn work(ms: u64) -> Self {
        Behaviour {
            delay: Arc::new(move |_, _| Duration::from_millis(ms)),
            checkpoint_each_batch: true,
            poison: Arc::default(),
            panic_on: None,
            buffering_lanes: false,
        }
    }
}

struct Recorder {
    log: Arc<Log>,
    b: Behaviour,
    ctx: ShardContext,
    initialized: bool,
    buffer: Vec<(String, u64)>,
    /// Whether an ending returned (a `shard_ended` that failed is retried,
    /// not ended).
    ended: bool,
    /// Whether `shard_ended` reached this processor: that is its ending.
    shard_ended_reached: bool,
}

static PANICS_LEFT: AtomicU32 = AtomicU32::new(1);

impl Recorder {
    /// An ending begins: a second one if an ending returned before, or
    /// (for another than a retried `shard_ended`) if `shard_ended` had
    /// reached this processor.
    fn ending(&mut self, shard_ended: bool) {
        if !self.initialized {
            self.log
                .endings_without_initialize
                .fetch_add(1, Ordering::SeqCst);
        }
        if self.ended || (!shard_ended && self.shard_ended_reached) {
            self.log.second_endings.fetch_add(1, Ordering::SeqCst);
        }
        self.shard_ended_reached |= shard_ended;
    }
    fn lane(&self) -> usize {
        self.ctx.lane.map_or(0, |l| l.index)
    }
}

#[async_trait]
impl RecordProcessor for Recorder {
    async fn initialize(
        &mut self,
        _: &kcl_core::processor::InitializeInput,
    ) -> Result<(), ProcessorError> {
        self.initialized = true;
        if self.lane() == 2 && take_one(&self.log.initialize_failures_left) {
            return Err("injected initialize failure".into());
        }
        Ok(())
    }

    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let parsed: Vec<(String, u64)> = batch.records.iter().map(|r| parse(&r.data)).collect();
        if parsed.iter().any(|r| self.b.poison.contains(r)) {
            self.log.failures.fetch_add(1, Ordering::Relaxed);
            return Err("poison record".into());
        }
        if let Some((pk, n)) = self.b.panic_on
            && parsed.iter().any(|(p, m)| p == pk && *m == n)
            && take_one(&PANICS_LEFT)
        {
            panic!("injected processor panic");
        }
        self.log
            .starts
            .lock()
            .unwrap()
            .push((self.ctx.worker_id.clone(), Instant::now()));
        {
            let mut first = self.log.first_record_at.lock().unwrap();
            if !first.contains_key(&self.ctx.shard_id) {
                let at = self.log.order.fetch_add(1, Ordering::SeqCst);
                first.insert(self.ctx.shard_id.clone(), at);
            }
        }
        if self.b.buffering_lanes && self.lane() != 0 {
            self.buffer.extend(parsed);
            return Ok(());
        }
        let now = self.log.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.log.most_running.fetch_max(now, Ordering::SeqCst);
        for (pk, n) in parsed {
            sleep((self.b.delay)(&pk, n)).await;
            self.log.processed.push(pk, n);
        }
        self.log.running.fetch_sub(1, Ordering::SeqCst);
        if self.b.checkpoint_each_batch {
            cp.checkpoint().await?;
        }
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        self.ending(false);
        self.ended = true;
        let flushed = std::mem::take(&mut self.buffer);
        self.log.processed.extend(flushed);
        cp.checkpoint().await?;
        Ok(())
    }

    async fn shard_ended(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        self.ending(true);
        if take_one(&self.log.shard_ended_panics_left) {
            panic!("injected shard_ended panic");
        }
        // Lane 1's, or the one processor's of a shard without lanes.
        let injected = self.lane() == 1 || self.ctx.lane.is_none();
        if injected && take_one(&self.log.shard_ended_failures_left) {
            return Err("injected shard_ended failure".into());
        }
        cp.checkpoint().await?;
        if self.lane() == 1 {
            let at = self.log.order.fetch_add(1, Ordering::SeqCst);
            self.log
                .lane_one_ended_at
                .lock()
                .unwrap()
                .entry(self.ctx.shard_id.clone())
                .or_insert(at);
        }
        self.ended = true;
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.ending(false);
        self.ended = true;
        self.log.lease_lost_calls.fetch_add(1, Ordering::SeqCst);
    }
}

/// The shared fleet (table, workers) with this file's processors and
/// settings.
struct Fleet {
    base: fleet::Fleet,
    source: InMemoryShardSource,
    log: Arc<Log>,
    parent_poll: Duration,
    checkpoint_policy: CheckpointPolicy,
}

impl Fleet {
    fn new(shards: usize) -> Self {
        let source = InMemoryShardSource::new().with_max_records(40);
        source.create_stream(STREAM, shards);
        Fleet {
            base: fleet::Fleet::new(),
            source,
            log: Arc::default(),
            parent_poll: Duration::from_secs(10),
            checkpoint_policy: CheckpointPolicy::default(),
        }
    }

    /// One shard holding records `0..per_key` of `keys` keys.
    fn with_records(keys: usize, per_key: u64) -> Self {
        let fleet = Fleet::new(1);
        fleet.produce(keys, 0, per_key);
        fleet
    }

    fn start(&mut self, id: &str, lanes: usize, b: Behaviour, policy: FailurePolicy) -> usize {
        let lease = LeaseConfig::builder(id)
            .taker_interval(Duration::from_secs(5))
            .seed(id.len() as u64 * 31)
            .build()
            .unwrap();
        let config = fleet::one_stream(lease, STREAM)
            .failure_policy(policy)
            .parallelism_per_shard(lanes)
            .max_backoff(Duration::from_secs(1))
            .parent_poll_interval(self.parent_poll)
            .checkpoint_policy(self.checkpoint_policy)
            .build()
            .unwrap();
        let log = Arc::clone(&self.log);
        let factory = move |ctx: &ShardContext| Recorder {
            log: Arc::clone(&log),
            b: b.clone(),
            ctx: ctx.clone(),
            initialized: false,
            buffer: Vec::new(),
            ended: false,
            shard_ended_reached: false,
        };
        let store = Arc::new(self.base.table_for_worker());
        let source = Arc::new(self.source.clone());
        self.base.run_worker(config, store, source, factory)
    }

    fn produce(&self, keys: usize, from: u64, per_key: u64) {
        fleet::produce(&self.source, STREAM, keys, from, per_key);
    }

    async fn wait_for(&self, count: usize, limit: Duration) {
        fleet::wait_for_records(limit, Duration::from_millis(50), count, || {
            self.log.processed.count()
        })
        .await;
    }

    /// Waits until worker `i` consumes a shard; fails with `never` after
    /// two minutes.
    async fn wait_consuming(&self, i: usize, never: &str) {
        fleet::wait_until(
            Duration::from_secs(120),
            Duration::from_millis(100),
            || self.consuming(i) >= 1,
            || never.to_owned(),
        )
        .await;
    }

    /// Waits until each of `keys` had its record `per_key - 1` processed.
    async fn wait_for_last(&self, keys: usize, per_key: u64, limit: Duration) {
        fleet::wait_until(
            limit,
            Duration::from_millis(100),
            || self.missing_last(keys, per_key) == 0,
            || {
                let missing = self.missing_last(keys, per_key);
                format!("{missing} keys never got to record {}", per_key - 1)
            },
        )
        .await;
    }

    /// How many of `keys` have not had their record `per_key - 1`
    /// processed yet.
    fn missing_last(&self, keys: usize, per_key: u64) -> usize {
        let by_key = self.log.processed.by_key();
        (0..keys)
            .filter(|k| {
                !by_key
                    .get(&format!("pk-{k}"))
                    .is_some_and(|v| v.contains(&(per_key - 1)))
            })
            .count()
    }

    async fn checkpoint_of_only_shard(&self) -> Checkpoint {
        let leases = self.store.snapshot();
        assert_eq!(leases.len(), 1);
        self.store
            .get(&leases[0].key)
            .await
            .unwrap()
            .unwrap()
            .checkpoint
    }
}

// The table and the workers (`stop`, `kill`, `consuming`).
kcl_core::deref_fleet!(Fleet, base);

/// Every record of `keys` x `0..per_key` except `skip` was processed, each
/// key's in order (a replay after a crash restarts from a checkpoint, so
/// order holds within each delivery); returns the number of repeats.
fn check_complete(log: &Log, keys: usize, per_key: u64, skip: &HashSet<(String, u64)>) -> usize {
    let by_key = log.processed.by_key();
    let mut repeats = 0;
    for k in 0..keys {
        let pk = format!("pk-{k}");
        let seen = by_key.get(&pk).cloned().unwrap_or_default();
        let mut expected = 0;
        let mut last: Option<u64> = None;
        for n in seen {
            while skip.contains(&(pk.clone(), expected)) {
                expected += 1;
            }
            if n == expected {
                expected += 1;
            } else {
                // A repeat: a replay starts again at or before the last
                // record seen, then goes on in order.
                let in_order = last.is_some_and(|l| n <= l || n == l + 1);
                assert!(
                    n < expected && in_order,
                    "{pk}: {n} processed after {last:?} when {expected} was next (order broken or record lost)"
                );
                repeats += 1;
            }
            last = Some(n);
        }
        while skip.contains(&(pk.clone(), expected)) {
            expected += 1;
        }
        assert_eq!(
            expected, per_key,
            "{pk}: records from {expected} on were never processed"
        );
    }
    repeats
}

/// [`check_complete`] with no record skipped.
fn check_every_record(log: &Log, keys: usize, per_key: u64) -> usize {
    check_complete(log, keys, per_key, &HashSet::new())
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// A delay in `0..max` ms per record, fixed by `seed`.
fn random_delays(seed: u64, max_ms: u64) -> Delay {
    Arc::new(move |pk: &str, n: u64| {
        let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
        for b in pk.as_bytes().iter().chain(&n.to_le_bytes()) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        Duration::from_millis(h % max_ms.max(1))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Per-key order holds in 1..10 lanes whatever the mix of keys and
    /// per-record delays, and every record is processed exactly once.
    #[test]
    fn each_keys_records_stay_in_order_in_any_number_of_lanes(
        lanes in 1usize..=10,
        keys in 1usize..24,
        per_key in 1u64..12,
        seed in any::<u64>(),
        max_delay_ms in 1u64..40,
    ) {
        paused_runtime().block_on(async {
            let mut fleet = Fleet::with_records(keys, per_key);
            let b = Behaviour { delay: random_delays(seed, max_delay_ms), ..Behaviour::work(0) };
            let w = fleet.start("w-a", lanes, b, FailurePolicy::Retry);
            let total = keys * per_key as usize;
            fleet.wait_for(total, Duration::from_secs(600)).await;
            fleet.stop(w).await;
            assert_eq!(check_every_record(&fleet.log, keys, per_key), 0);
        });
    }

    /// A worker killed at any moment and replaced: every record is
    /// processed at least once and each key's in order, so the checkpoint
    /// never passed a record a slower lane had not finished.
    #[test]
    fn a_kill_at_any_moment_loses_no_record_of_any_lane(
        lanes in 2usize..=10,
        keys in 2usize..24,
        seed in any::<u64>(),
        kill_after_ms in 0u64..3_000,
    ) {
        paused_runtime().block_on(async {
            let per_key = 10;
            let mut fleet = Fleet::with_records(keys, per_key);
            let b = Behaviour { delay: random_delays(seed, 60), ..Behaviour::work(0) };
            let a = fleet.start("w-a", lanes, b.clone(), FailurePolicy::Retry);
            sleep(Duration::from_millis(kill_after_ms)).await;
            fleet.kill(a).await;
            let done_before = fleet.log.processed.count();
            let rest = fleet.start("w-b", lanes, b, FailurePolicy::Retry);
            fleet.wait_for_last(keys, per_key, Duration::from_secs(600)).await;
            fleet.stop(rest).await;
            let repeats = check_every_record(&fleet.log, keys, per_key);
            assert!(repeats <= done_before, "{repeats} repeats of {done_before} done before the kill");
        });
    }
}

/// Puts `keys` (with record number `n`) as one aggregate; returns its
/// sequence number.
fn put_aggregate(fleet: &Fleet, shard_id: &str, keys: &[usize], n: u64) -> String {
    let records: Vec<(String, Bytes)> = keys
        .iter()
        .map(|k| (format!("pk-{k}"), Bytes::from(format!("pk-{k}:{n}"))))
        .collect();
    let refs: Vec<(&str, Bytes)> = records
        .iter()
        .map(|(pk, d)| (pk.as_str(), d.clone()))
        .collect();
    fleet.source.put_aggregate(STREAM, shard_id, &refs).unwrap()
}

#[tokio::test(start_paused = true)]
async fn records_of_an_aggregate_spread_over_lanes_resume_at_their_sub_sequence() {
    let mut fleet = Fleet::new(1);
    // Of 4 lanes, pk-3 and pk-7 go to lane 0 (FNV-1a of the key), pk-0 to
    // lane 1. Aggregate A's first two sub-records are lane 0's, its third
    // is not: with only lane 0 checkpointing, the watermark stops inside A.
    let (shard_id, _) = fleet.source.put(STREAM, "pk-3", "pk-3:0").unwrap();
    let a = put_aggregate(&fleet, &shard_id, &[7, 3, 0, 1, 2, 4, 5, 6], 1);
    put_aggregate(&fleet, &shard_id, &[0, 1, 2, 3, 4, 5, 6, 7], 2);
    let mut last = String::new();
    for k in 0..8 {
        last = fleet
            .source
            .put(STREAM, &format!("pk-{k}"), format!("pk-{k}:3"))
            .unwrap()
            .1;
    }
    // Lanes other than 0 never checkpoint (they would at a shutdown): a
    // kill leaves the checkpoint at lane 0's watermark.
    let lane_zero_only = Behaviour {
        buffering_lanes: true,
        ..Behaviour::work(10)
    };
    let w = fleet.start("w-a", 4, lane_zero_only, FailurePolicy::Retry);
    let lane_zero: Vec<(String, u64)> = [(3, 0), (7, 1), (3, 1), (3, 2), (7, 2), (3, 3), (7, 3)]
        .map(|(k, n)| (format!("pk-{k}"), n))
        .to_vec();
    fleet
        .wait_for(lane_zero.len(), Duration::from_secs(60))
        .await;
    let started = Instant::now();
    while fleet.checkpoint_of_only_shard().await == Checkpoint::TrimHorizon {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "lane 0 never checkpointed"
        );
        sleep(Duration::from_millis(50)).await;
    }
    fleet.kill(w).await;
    assert_eq!(
        fleet.log.processed.all(),
        lane_zero,
        "lane 0 alone made records durable"
    );
    assert_eq!(
        fleet.checkpoint_of_only_shard().await,
        Checkpoint::at(a.clone(), 1),
        "the watermark stops after A's second sub-record"
    );

    let before = fleet.log.processed.count();
    let w = fleet.start("w-b", 4, Behaviour::work(10), FailurePolicy::Retry);
    // After A/1: A/2..7 (keys 0, 1, 2, 4, 5, 6 at 1), all of B, all at 3.
    let mut expected: Vec<(String, u64)> = [0, 1, 2, 4, 5, 6]
        .into_iter()
        .map(|k| (format!("pk-{k}"), 1))
        .chain((0..8).flat_map(|k| [(format!("pk-{k}"), 2), (format!("pk-{k}"), 3)]))
        .collect();
    fleet
        .wait_for(before + expected.len(), Duration::from_secs(60))
        .await;
    fleet.stop(w).await;
    let mut resumed = fleet.log.processed.all().split_off(before);
    // Per key, the resumed worker goes on in shard order.
    let mut firsts: BTreeMap<String, u64> = BTreeMap::new();
    for (pk, n) in &resumed {
        firsts.entry(pk.clone()).or_insert(*n);
    }
    assert_eq!(firsts["pk-0"], 1, "pk-0 resumes at A's third sub-record");
    assert_eq!(firsts["pk-3"], 2, "A/1 (pk-3:1) was checkpointed");
    assert_eq!(firsts["pk-7"], 2, "A/0 (pk-7:1) was checkpointed");
    resumed.sort();
    expected.sort();
    assert_eq!(
        resumed, expected,
        "w-b delivers exactly the records after A/1, each once"
    );
    assert_eq!(
        fleet.checkpoint_of_only_shard().await,
        Checkpoint::at(last, 0),
        "a shutdown checkpointed everything"
    );
}

#[tokio::test(start_paused = true)]
async fn lanes_process_different_keys_at_the_same_time() {
    let mut fleet = Fleet::with_records(16, 20);
    let w = fleet.start("w-a", 8, Behaviour::work(10), FailurePolicy::Retry);
    let started = Instant::now();
    fleet.wait_for(16 * 20, Duration::from_secs(60)).await;
    let took = started.elapsed();
    fleet.stop(w).await;
    assert_eq!(check_every_record(&fleet.log, 16, 20), 0);
    let most = fleet.log.most_running.load(Ordering::SeqCst);
    assert!(most >= 4, "at most {most} lanes ran at once");
    // One lane would take 320 x 10 ms = 3.2 s of (paused) time.
    println!("8 lanes: {took:?} for 320 records of 10 ms, {most} at once");
    assert!(took < Duration::from_millis(3200), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_handoff_and_a_shutdown_in_the_middle_of_lane_work_lose_and_repeat_nothing() {
    let mut fleet = Fleet::new(2);
    // Checkpoints only in shutdown_requested: no repeats can only come
    // from the watermark written at the handoff and at the shutdown.
    let lazy = Behaviour {
        checkpoint_each_batch: false,
        ..Behaviour::work(50)
    };
    fleet.produce(12, 0, 100);
    let a = fleet.start("w-a", 4, lazy.clone(), FailurePolicy::Retry);
    sleep(Duration::from_secs(2)).await;
    assert_eq!(fleet.consuming(a), 2);
    assert!(
        fleet.log.processed.count() < 12 * 100,
        "still working when b joins"
    );
    // b steals one shard from a: a hands it over mid-work.
    let b = fleet.start("w-b", 4, lazy.clone(), FailurePolicy::Retry);
    fleet.wait_consuming(b, "b never got a shard").await;
    assert!(
        fleet.log.processed.count() < 12 * 100,
        "the handoff came mid-work"
    );
    // a shuts down mid-work: b takes the rest.
    fleet.stop(a).await;
    assert!(
        fleet.log.processed.count() < 12 * 100,
        "the shutdown came mid-work"
    );
    fleet.produce(12, 100, 10);
    fleet.wait_for_last(12, 110, Duration::from_secs(600)).await;
    fleet.stop(b).await;
    assert_eq!(
        check_every_record(&fleet.log, 12, 110),
        0,
        "handoff and shutdown must not repeat records"
    );
    assert!(fleet.workers[1].0.status().leases.taken >= 1);
}

fn poison(pk: &str, n: u64) -> Arc<HashSet<(String, u64)>> {
    Arc::new(HashSet::from([(pk.to_owned(), n)]))
}

#[tokio::test(start_paused = true)]
async fn a_poison_record_is_bisected_out_to_the_destination_and_the_shard_goes_on() {
    let mut fleet = Fleet::with_records(4, 10);
    // The last of one 40-record batch: only its being set aside can carry
    // the checkpoint past it.
    let bad = poison("pk-3", 9);
    let dest = Arc::new(Collect {
        unavailable: AtomicU32::new(3),
        ..Collect::default()
    });
    let isolate =
        || FailurePolicy::Isolate(PoisonPolicy::send_to(Arc::clone(&dest)).max_attempts(3));
    let b = Behaviour {
        poison: Arc::clone(&bad),
        ..Behaviour::work(1)
    };
    let w = fleet.start("w-a", 1, b.clone(), isolate());
    fleet.wait_for(4 * 10 - 1, Duration::from_secs(120)).await;
    let started = Instant::now();
    while dest.got.lock().unwrap().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(120), "never sent");
        sleep(Duration::from_millis(50)).await;
    }
    fleet.stop(w).await;
    let got = dest.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "only the poison record: {got:?}");
    assert_eq!(parse(&got[0].record.data), ("pk-3".to_owned(), 9));
    assert_eq!(got[0].attempts, 3);
    assert_eq!(got[0].reason, FailureReason::MaxAttempts);
    assert_eq!(got[0].error, "poison record");
    assert_eq!(
        check_complete(&fleet.log, 4, 10, &bad),
        0,
        "every other record exactly once"
    );
    // A restart on the same poison goes on after it: were the checkpoint
    // short of it, it would fail on it again and send it again.
    let failures = fleet.log.failures.load(Ordering::Relaxed);
    let again = fleet.start("w-b", 1, b, isolate());
    fleet.produce(4, 10, 2);
    fleet.wait_for(4 * 12 - 1, Duration::from_secs(120)).await;
    fleet.stop(again).await;
    assert_eq!(
        fleet.log.failures.load(Ordering::Relaxed),
        failures,
        "the poison record was not tried again"
    );
    assert_eq!(dest.got.lock().unwrap().len(), 1, "nor sent again");
    assert_eq!(
        check_complete(&fleet.log, 4, 12, &bad),
        0,
        "the shard went on after it, each record once"
    );
}

#[tokio::test(start_paused = true)]
async fn the_checkpoint_passes_a_poison_record_only_after_its_destination_accepted_it() {
    let mut fleet = Fleet::new(1);
    let seqs: Vec<String> = (0..6)
        .map(|n| {
            fleet
                .source
                .put(STREAM, "pk-0", format!("pk-0:{n}"))
                .unwrap()
                .1
        })
        .collect();
    let dest = Arc::new(Collect {
        unavailable: AtomicU32::new(u32::MAX),
        ..Collect::default()
    });
    let b = Behaviour {
        poison: poison("pk-0", 3),
        ..Behaviour::work(1)
    };
    let isolate =
        || FailurePolicy::Isolate(PoisonPolicy::send_to(Arc::clone(&dest)).max_attempts(2));
    let w = fleet.start("w-a", 1, b.clone(), isolate());
    fleet.wait_for(3, Duration::from_secs(60)).await;
    sleep(Duration::from_secs(30)).await;
    // 0..2 done, 3 refused by its destination: nothing after it processed,
    // the checkpoint at record 2, before the poison record.
    assert_eq!(fleet.log.processed.count(), 3);
    assert_eq!(
        fleet.checkpoint_of_only_shard().await,
        Checkpoint::at(seqs[2].clone(), 0)
    );
    assert!(dest.got.lock().unwrap().is_empty());
    // A shutdown now checkpoints no further.
    fleet.stop(w).await;
    assert_eq!(
        fleet.checkpoint_of_only_shard().await,
        Checkpoint::at(seqs[2].clone(), 0)
    );
    dest.unavailable.store(0, Ordering::SeqCst);
    let again = fleet.start("w-b", 1, b, isolate());
    fleet.wait_for(5, Duration::from_secs(60)).await;
    fleet.stop(again).await;
    let got = dest.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(parse(&got[0].record.data), ("pk-0".to_owned(), 3));
    assert_eq!(
        check_complete(&fleet.log, 1, 6, &poison("pk-0", 3)),
        0,
        "the first worker's checkpoint stopped before the poison record"
    );
}

#[tokio::test(start_paused = true)]
async fn without_bisection_the_whole_failing_batch_goes_to_the_destination() {
    let mut fleet = Fleet::with_records(1, 5);
    let dest = Arc::new(Collect::default());
    let policy = PoisonPolicy::send_to(Arc::clone(&dest))
        .max_attempts(2)
        .bisect(false);
    let b = Behaviour {
        poison: poison("pk-0", 2),
        ..Behaviour::work(1)
    };
    let w = fleet.start("w-a", 1, b, FailurePolicy::Isolate(policy));
    let started = Instant::now();
    while dest.got.lock().unwrap().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(60));
        sleep(Duration::from_millis(100)).await;
    }
    fleet.stop(w).await;
    let got = dest.got.lock().unwrap().clone();
    let numbers: Vec<u64> = got.iter().map(|f| parse(&f.record.data).1).collect();
    assert_eq!(numbers, vec![0, 1, 2, 3, 4], "the batch, whole");
    assert!(got.iter().all(|f| f.attempts == 2));
    assert_eq!(fleet.log.failures.load(Ordering::Relaxed), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failing_record_older_than_the_age_limit_is_set_aside_at_once() {
    let mut fleet = Fleet::new(1);
    // pk-0:0 arrived two hours ago, pk-0:1 just now: both fail, one limit.
    let two_hours_ago = SystemTime::now() - Duration::from_secs(2 * 3600);
    fleet
        .source
        .put_arrived(STREAM, "pk-0", "pk-0:0", two_hours_ago)
        .unwrap();
    fleet.produce(1, 1, 2);
    let dest = Arc::new(Collect::default());
    let policy = PoisonPolicy::send_to(Arc::clone(&dest))
        .max_attempts(3)
        .max_record_age(Duration::from_secs(3600));
    let b = Behaviour {
        poison: Arc::new(HashSet::from([
            ("pk-0".to_owned(), 0),
            ("pk-0".to_owned(), 1),
        ])),
        ..Behaviour::work(1)
    };
    let w = fleet.start("w-a", 1, b, FailurePolicy::Isolate(policy));
    fleet.wait_for(1, Duration::from_secs(60)).await;
    fleet.stop(w).await;
    let got: Vec<(u64, FailureReason, u32)> = dest
        .got
        .lock()
        .unwrap()
        .iter()
        .map(|f| (parse(&f.record.data).1, f.reason, f.attempts))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, FailureReason::MaxRecordAge, 1),
            (1, FailureReason::MaxAttempts, 3),
        ],
        "the old record at its first failure, the fresh one after its attempts"
    );
}

#[tokio::test(start_paused = true)]
async fn poison_records_in_lanes_are_set_aside_and_the_other_lanes_complete() {
    let mut fleet = Fleet::with_records(8, 10);
    let bad = Arc::new(HashSet::from([
        ("pk-1".to_owned(), 4),
        ("pk-6".to_owned(), 7),
    ]));
    let dest = Arc::new(Collect::default());
    let b = Behaviour {
        poison: Arc::clone(&bad),
        ..Behaviour::work(5)
    };
    let w = fleet.start(
        "w-a",
        4,
        b,
        FailurePolicy::Isolate(PoisonPolicy::send_to(Arc::clone(&dest))),
    );
    fleet.wait_for(8 * 10 - 2, Duration::from_secs(120)).await;
    fleet.stop(w).await;
    let mut sent: Vec<(String, u64)> = dest
        .got
        .lock()
        .unwrap()
        .iter()
        .map(|f| parse(&f.record.data))
        .collect();
    sent.sort();
    assert_eq!(sent, vec![("pk-1".to_owned(), 4), ("pk-6".to_owned(), 7)]);
    assert_eq!(check_complete(&fleet.log, 8, 10, &bad), 0);
    // Everything, the poison records included, is behind the checkpoint.
    let before = fleet.log.processed.count();
    let again = fleet.start("w-b", 4, Behaviour::work(1), FailurePolicy::Retry);
    sleep(Duration::from_secs(20)).await;
    fleet.stop(again).await;
    assert_eq!(fleet.log.processed.count(), before);
}

#[tokio::test(start_paused = true)]
async fn a_poison_sub_record_of_an_aggregate_is_set_aside_alone_in_any_lanes() {
    for lanes in [1, 3] {
        let mut fleet = Fleet::new(1);
        let (shard_id, _) = fleet.source.put(STREAM, "pk-0", "pk-0:0").unwrap();
        let seq = put_aggregate(&fleet, &shard_id, &[0, 1, 2, 3, 4, 5], 1);
        let dest = Arc::new(Collect::default());
        let b = Behaviour {
            poison: poison("pk-3", 1),
            ..Behaviour::work(1)
        };
        let w = fleet.start(
            "w-a",
            lanes,
            b,
            FailurePolicy::Isolate(PoisonPolicy::send_to(Arc::clone(&dest))),
        );
        fleet.wait_for(6, Duration::from_secs(60)).await;
        fleet.stop(w).await;
        let got = dest.got.lock().unwrap().clone();
        assert_eq!(got.len(), 1, "{lanes} lanes: {got:?}");
        assert_eq!(
            (
                got[0].record.sequence_number.as_str(),
                got[0].record.sub_sequence_number
            ),
            (seq.as_str(), 3)
        );
        // The checkpoint covers the whole aggregate, set-aside sub-record
        // included.
        assert_eq!(
            fleet.checkpoint_of_only_shard().await,
            Checkpoint::at(seq.clone(), 5),
            "{lanes} lanes"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropping_policy_moves_past_the_poison_record() {
    let mut fleet = Fleet::with_records(2, 5);
    let b = Behaviour {
        poison: poison("pk-1", 2),
        ..Behaviour::work(1)
    };
    let w = fleet.start(
        "w-a",
        1,
        b,
        FailurePolicy::Isolate(PoisonPolicy::drop_failed().max_attempts(1)),
    );
    fleet.wait_for(2 * 5 - 1, Duration::from_secs(60)).await;
    fleet.stop(w).await;
    assert_eq!(check_complete(&fleet.log, 2, 5, &poison("pk-1", 2)), 0);
}

#[tokio::test(start_paused = true)]
async fn lanes_and_the_poison_policy_are_validated() {
    let lease = LeaseConfig::builder("w").build().unwrap();
    let spec = StreamSpec {
        name: STREAM.into(),
        layout: LeaseLayout::SingleStream,
    };
    for n in [0, 101] {
        let e = WorkerConfig::builder(lease.clone())
            .stream(spec.clone())
            .parallelism_per_shard(n)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("parallelism_per_shard"), "{e}");
    }
    let e = WorkerConfig::builder(lease)
        .stream(spec)
        .failure_policy(FailurePolicy::Isolate(
            PoisonPolicy::drop_failed().max_attempts(0),
        ))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("max_attempts"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_during_a_drain_starts_no_more_queued_batches() {
    // 40-record batches over 4 lanes, 1 s a record: a drain of three
    // batches a lane would take about half a minute.
    let mut fleet = Fleet::with_records(16, 20);
    let a = fleet.start("w-a", 4, Behaviour::work(1000), FailurePolicy::Retry);
    // w-a takes the shard before w-b starts.
    sleep(Duration::from_millis(100)).await;
    let b = fleet.start("w-b", 4, Behaviour::work(1), FailurePolicy::Retry);
    sleep(Duration::from_secs(3)).await;
    assert_eq!(fleet.consuming(a), 1);
    // a's table goes away and a shuts down: its drain outlives its lease.
    fleet.stores[a].fail_until(
        None,
        kcl_core::StoreErrorKind::Retryable,
        Instant::now() + Duration::from_secs(600),
    );
    fleet.workers[a].0.shutdown();
    fleet.wait_consuming(b, "b never took over").await;
    let b_from = Instant::now();
    let (_, task) = &mut fleet.workers[a];
    task.await.unwrap().unwrap();
    let late: Vec<Instant> = fleet
        .log
        .starts
        .lock()
        .unwrap()
        .iter()
        .filter(|(w, at)| w == "w-a" && *at >= b_from)
        .map(|(_, at)| *at)
        .collect();
    assert!(
        late.is_empty(),
        "w-a started {} batches after w-b took the shard over",
        late.len()
    );
    assert!(fleet.log.lease_lost_calls.load(Ordering::SeqCst) >= 4);
    fleet.wait_for_last(16, 20, Duration::from_secs(600)).await;
    fleet.stop(b).await;
    check_every_record(&fleet.log, 16, 20);
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_one_lane_lets_the_others_finish_and_end_before_the_shard_is_given_back() {
    let mut fleet = Fleet::with_records(8, 10);
    let b = Behaviour {
        panic_on: Some(("pk-5", 4)),
        ..Behaviour::work(20)
    };
    let w = fleet.start("w-a", 4, b, FailurePolicy::Retry);
    fleet.wait_for_last(8, 10, Duration::from_secs(120)).await;
    fleet.stop(w).await;
    // The three other lanes of the first consumer had lease_lost; the
    // panicking lane's processor unwound with its task.
    assert_eq!(fleet.log.lease_lost_calls.load(Ordering::SeqCst), 3);
    assert!(fleet.workers[w].0.status().leases.released >= 1);
    check_every_record(&fleet.log, 8, 10);
}

#[tokio::test(start_paused = true)]
async fn shard_end_is_written_only_once_every_lane_checkpointed_it() {
    let mut fleet = Fleet::with_records(8, 5);
    fleet.parent_poll = Duration::from_millis(100);
    fleet
        .log
        .shard_ended_failures_left
        .store(3, Ordering::SeqCst);
    let w = fleet.start("w-a", 4, Behaviour::work(1), FailurePolicy::Retry);
    fleet.wait_for_last(8, 5, Duration::from_secs(60)).await;
    let parent = fleet.store.snapshot()[0].shard_id.clone();
    let children = fleet.source.split(STREAM, &parent).unwrap();
    fleet.produce(8, 5, 5);
    fleet.wait_for_last(8, 10, Duration::from_secs(120)).await;
    fleet.stop(w).await;
    let ended = fleet.log.lane_one_ended_at.lock().unwrap()[&parent];
    let first = fleet.log.first_record_at.lock().unwrap();
    for child in &children {
        let at = first[child];
        assert!(
            at > ended,
            "{child} started before lane 1 of its parent checkpointed the end"
        );
    }
    assert_eq!(
        fleet.log.shard_ended_failures_left.load(Ordering::SeqCst),
        0
    );
    check_every_record(&fleet.log, 8, 10);
}

/// A failed `shard_ended` is its processor's one ending, with lanes or
/// without: when the failure gives the shard back (ReleaseShard), or a
/// shutdown comes while it is retried (Retry), no `lease_lost` or
/// `shutdown_requested` follows it, and while one lane's is retried the
/// lanes that ended are not asked again. Each was, against the promise of
/// exactly one ending.
#[tokio::test(start_paused = true)]
async fn a_failed_shard_ended_is_the_processors_only_ending() {
    for (lanes, policy) in [
        (1, FailurePolicy::ReleaseShard),
        (4, FailurePolicy::ReleaseShard),
        (1, FailurePolicy::Retry),
        (4, FailurePolicy::Retry),
    ] {
        let what = format!("{lanes} lanes, {policy:?}");
        let mut fleet = Fleet::with_records(8, 5);
        fleet.parent_poll = Duration::from_millis(100);
        let retried = matches!(policy, FailurePolicy::Retry);
        // Under Retry, shard_ended fails until the worker stops.
        let failures = if retried { u32::MAX } else { 1 };
        let left = &fleet.log.shard_ended_failures_left;
        left.store(failures, Ordering::SeqCst);
        let w = fleet.start("w-a", lanes, Behaviour::work(1), policy);
        fleet.wait_for_last(8, 5, Duration::from_secs(60)).await;
        let parent = fleet.store.snapshot()[0].shard_id.clone();
        fleet.source.split(STREAM, &parent).unwrap();
        if retried {
            // Retried twice: the lanes that ended are not asked again.
            while fleet.log.shard_ended_failures_left.load(Ordering::SeqCst) > failures - 2 {
                sleep(Duration::from_millis(10)).await;
            }
            fleet.stop(w).await;
        } else {
            fleet.produce(8, 5, 5);
            fleet.wait_for_last(8, 10, Duration::from_secs(120)).await;
            fleet.stop(w).await;
            check_every_record(&fleet.log, 8, 10);
        }
        let left = fleet.log.shard_ended_failures_left.load(Ordering::SeqCst);
        assert!(left < failures, "{what}: no failure was injected");
        assert_eq!(fleet.log.second_endings.load(Ordering::SeqCst), 0, "{what}");
    }
}

/// A SHARD_END write that fails after every lane checkpointed its end is
/// written again, and the children start: the lanes, all ended, were
/// asked no more, nothing wrote it again, and the children never started.
/// Nor is the shard given back for it under ReleaseShard (the last lane's
/// `shard_ended` returned the write's error): no processor failed.
#[tokio::test(start_paused = true)]
async fn a_failed_shard_end_write_after_every_lane_ended_is_written_again() {
    for policy in [FailurePolicy::Retry, FailurePolicy::ReleaseShard] {
        shard_end_write_fails_under(policy).await;
    }
}

async fn shard_end_write_fails_under(policy: FailurePolicy) {
    use kcl_core::store::memory::Fault;
    use kcl_core::store::{StoreErrorKind, StoreOp};
    let mut fleet = Fleet::with_records(8, 5);
    fleet.parent_poll = Duration::from_millis(100);
    let what = format!("{policy:?}");
    let w = fleet.start("w-a", 4, Behaviour::work(1), policy);
    fleet.wait_for_last(8, 5, Duration::from_secs(60)).await;
    let parent = fleet.store.snapshot()[0].shard_id.clone();
    // Every checkpoint from here fails until the faults run out: the
    // lanes' last ones, and the SHARD_END write with its retries.
    for _ in 0..12 {
        fleet.base.stores[w].inject(StoreOp::Checkpoint, Fault::Error(StoreErrorKind::Retryable));
    }
    fleet.source.split(STREAM, &parent).unwrap();
    fleet.produce(8, 5, 5);
    fleet.wait_for_last(8, 10, Duration::from_secs(300)).await;
    assert_eq!(fleet.base.given_back(), 0, "{what}");
    fleet.stop(w).await;
    check_every_record(&fleet.log, 8, 10);
}

/// A panic in a lane's `shard_ended` leaves the shard's lane gauge at 0:
/// it unwound past the lanes' own reset, and the records buffering lanes
/// held in flight stayed on the gauge of a shard the worker no longer
/// read.
#[tokio::test(start_paused = true)]
async fn a_panic_in_shard_ended_leaves_the_lane_gauge_at_zero() {
    let recorded = kcl_core::test_util::metrics::Recorded::new();
    let _local = metrics::set_default_local_recorder(&recorded);
    let mut fleet = Fleet::with_records(8, 5);
    fleet.parent_poll = Duration::from_millis(100);
    fleet.log.shard_ended_panics_left.store(1, Ordering::SeqCst);
    let b = Behaviour {
        buffering_lanes: true,
        ..Behaviour::work(1)
    };
    let w = fleet.start("w-a", 4, b, FailurePolicy::Retry);
    sleep(Duration::from_secs(5)).await;
    let parent = fleet.store.snapshot()[0].shard_id.clone();
    fleet.source.split(STREAM, &parent).unwrap();
    fleet::wait_until(
        Duration::from_secs(60),
        Duration::from_millis(10),
        || fleet.log.shard_ended_panics_left.load(Ordering::SeqCst) == 0,
        || "shard_ended was never called".into(),
    )
    .await;
    sleep(Duration::from_millis(10)).await;
    let status = fleet.workers[w].0.status();
    assert!(
        !status.consuming.contains(&parent),
        "not taken again yet: {status:?}"
    );
    let labels = [("shard", parent.as_str())];
    assert_eq!(
        recorded.gauge(kcl_core::metric_names::LANE_RECORDS_IN_FLIGHT, &labels),
        Some(0.0)
    );
    fleet.stop(w).await;
}

/// A shard given back while still held (a failing record under
/// ReleaseShard) first writes the position its checkpoint policy held
/// back, asked for before the failure: the next owner began at the
/// checkpoint written before, and processed those records again.
#[tokio::test(start_paused = true)]
async fn a_shard_given_back_writes_the_checkpoint_its_policy_held_back() {
    for lanes in [1, 4] {
        let mut fleet = Fleet::with_records(2, 3);
        fleet.checkpoint_policy = CheckpointPolicy::every(Duration::from_secs(3600));
        let b = Behaviour {
            poison: poison("pk-0", 6),
            ..Behaviour::work(1)
        };
        let w = fleet.start("w-a", lanes, b, FailurePolicy::ReleaseShard);
        fleet.wait_for(6, Duration::from_secs(60)).await;
        // Asked for, and held back by the policy.
        fleet.produce(2, 3, 3);
        fleet.wait_for(12, Duration::from_secs(60)).await;
        // Fails, is given back, is taken again, fails again.
        fleet.produce(1, 6, 1);
        fleet::wait_until(
            Duration::from_secs(120),
            Duration::from_millis(100),
            || fleet.log.failures.load(Ordering::SeqCst) >= 2,
            || "the shard was not taken again".into(),
        )
        .await;
        // Nothing was written before: the policy held every call back.
        let stored = fleet.store.snapshot()[0].checkpoint.clone();
        assert!(
            matches!(stored, Checkpoint::Sequence { .. }),
            "lanes={lanes}: {stored:?}"
        );
        fleet.stop(w).await;
        assert_eq!(check_every_record(&fleet.log, 2, 6), 0, "lanes={lanes}");
    }
}

#[tokio::test(start_paused = true)]
async fn lanes_after_one_whose_initialize_failed_are_never_made_or_ended() {
    let mut fleet = Fleet::with_records(8, 5);
    fleet
        .log
        .initialize_failures_left
        .store(1, Ordering::SeqCst);
    let w = fleet.start("w-a", 4, Behaviour::work(1), FailurePolicy::ReleaseShard);
    fleet.wait_for_last(8, 5, Duration::from_secs(120)).await;
    fleet.stop(w).await;
    assert_eq!(
        fleet.log.endings_without_initialize.load(Ordering::SeqCst),
        0,
        "an ending reached a processor never initialized"
    );
    // Lanes 0-2 of the first consumer ended with lease_lost.
    assert_eq!(fleet.log.lease_lost_calls.load(Ordering::SeqCst), 3);
    check_every_record(&fleet.log, 8, 5);
}

#[tokio::test(start_paused = true)]
async fn a_lanes_records_count_as_done_only_once_that_lane_checkpoints() {
    let mut fleet = Fleet::with_records(12, 10);
    let buffering = Behaviour {
        buffering_lanes: true,
        ..Behaviour::work(5)
    };
    // Lane 0 checkpoints each batch; the other lanes hold their records
    // in memory. A crash loses what they hold, so the watermark must not
    // have passed it for lane 0's checkpoints.
    let a = fleet.start("w-a", 3, buffering, FailurePolicy::Retry);
    sleep(Duration::from_secs(5)).await;
    fleet.kill(a).await;
    let b = fleet.start("w-b", 3, Behaviour::work(5), FailurePolicy::Retry);
    fleet.wait_for_last(12, 10, Duration::from_secs(120)).await;
    fleet.stop(b).await;
    check_every_record(&fleet.log, 12, 10);
}
