//! Whole workers (lease coordinator, shard sync, consumers) on the
//! in-memory store and source, under a paused clock: every record
//! processed, per-key order, no two workers on one shard at once, graceful
//! handoff without duplicates, crashes without loss, parents before
//! children, failure policies.
#![allow(clippy::unwrap_used)]

// Only the processors' shared pieces, not the coordinator simulation of
// `common`, which this binary does not use.
#[allow(dead_code, unreachable_pub)]
#[path = "common/processing.rs"]
mod processing;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kcl_core::checkpointer::CheckpointPolicy;
use kcl_core::checkpointer::Checkpointer;
use kcl_core::processor::{
    FailurePolicy, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
};
use kcl_core::source::InitialPosition;
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::store::StoreOp;
use kcl_core::store::memory::{Fault, InMemoryLeaseStore};
use kcl_core::store::metered::{MeteredStore, StoreStats};
use kcl_core::test_util::fleet;
use kcl_core::worker::{StreamSpec, Worker, WorkerConfig, WorkerError};
use kcl_core::{Checkpoint, LeaseConfig, LeaseLayout, LeaseStore};
use processing::{STREAM, take_one};
use tokio::time::{Instant, sleep};

const TICK: Duration = Duration::from_secs(10);

/// Everything every processor saw, shared by the whole fleet.
#[derive(Default)]
struct Log {
    processed: Mutex<Vec<(String, String, String, u64)>>, // worker, shard, pk, n
    in_flight: Mutex<HashMap<String, String>>,            // shard -> worker
    overlaps: AtomicU64,
    shard_ended_at: Mutex<HashMap<String, Instant>>,
    first_record_at: Mutex<HashMap<String, Instant>>,
    /// Injected failures and panics left, fleet-wide: a fresh processor
    /// after a release must not fail again, or nothing would ever progress.
    failures_left: AtomicU32,
    panics_left: AtomicU32,
}

impl Log {
    fn by_key(&self) -> BTreeMap<String, Vec<u64>> {
        let processed = self.processed.lock().unwrap();
        fleet::by_key(processed.iter().map(|(_, _, pk, n)| (pk.as_str(), *n)))
    }
    fn count(&self) -> usize {
        self.processed.lock().unwrap().len()
    }
}

#[derive(Clone, Copy)]
struct Behaviour {
    checkpoint_each_batch: bool,
    checkpoint_on_shutdown: bool,
    work: Duration,
    /// Fail this many times on the first batch that contains record n == 7.
    failures: u32,
    panic_on: Option<u64>,
    /// Each batch of this shard takes this long instead of `work`.
    slow_shard: Option<(&'static str, Duration)>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            checkpoint_each_batch: true,
            checkpoint_on_shutdown: true,
            work: Duration::from_millis(5),
            failures: 0,
            panic_on: None,
            slow_shard: None,
        }
    }
}

struct Recorder {
    ctx: ShardContext,
    log: Arc<Log>,
    b: Behaviour,
}

impl Behaviour {
    /// Checkpoints only in `shutdown_requested`.
    fn lazy() -> Self {
        Behaviour {
            checkpoint_each_batch: false,
            ..Behaviour::default()
        }
    }

    /// Fails `failures` times on the first batch holding record 7.
    fn failing(failures: u32) -> Self {
        Behaviour {
            failures,
            ..Behaviour::default()
        }
    }
}

#[async_trait]
impl RecordProcessor for Recorder {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let parsed: Vec<(String, u64)> = batch
            .records
            .iter()
            .map(|r| fleet::parse(&r.data))
            .collect();
        if parsed.iter().any(|(_, n)| *n == 7) && take_one(&self.log.failures_left) {
            return Err("injected processor failure".into());
        }
        if let Some(p) = self.b.panic_on
            && parsed.iter().any(|(_, n)| *n == p)
            && take_one(&self.log.panics_left)
        {
            panic!("injected processor panic");
        }
        {
            let mut f = self.log.in_flight.lock().unwrap();
            if f.get(&self.ctx.shard_id)
                .is_some_and(|w| *w != self.ctx.worker_id)
            {
                self.log.overlaps.fetch_add(1, Ordering::Relaxed);
            }
            f.insert(self.ctx.shard_id.clone(), self.ctx.worker_id.clone());
        }
        self.log
            .first_record_at
            .lock()
            .unwrap()
            .entry(self.ctx.shard_id.clone())
            .or_insert_with(Instant::now);
        let work = match self.b.slow_shard {
            Some((shard, d)) if shard == self.ctx.shard_id => d,
            _ => self.b.work,
        };
        sleep(work).await;
        {
            let mut p = self.log.processed.lock().unwrap();
            for (pk, n) in parsed {
                p.push((self.ctx.worker_id.clone(), self.ctx.shard_id.clone(), pk, n));
            }
        }
        {
            let mut f = self.log.in_flight.lock().unwrap();
            if f.get(&self.ctx.shard_id) == Some(&self.ctx.worker_id) {
                f.remove(&self.ctx.shard_id);
            }
        }
        if self.b.checkpoint_each_batch {
            cp.checkpoint().await?;
        }
        Ok(())
    }

    async fn shard_ended(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        self.log
            .shard_ended_at
            .lock()
            .unwrap()
            .insert(self.ctx.shard_id.clone(), Instant::now());
        cp.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        if self.b.checkpoint_on_shutdown {
            cp.checkpoint().await?;
        }
        Ok(())
    }
}

/// The shared fleet (table, workers) with this file's processors and
/// settings.
struct Fleet {
    base: fleet::Fleet,
    source: InMemoryShardSource,
    log: Arc<Log>,
    retention: Duration,
    sync_interval: Duration,
    /// Whether a killed (dropped) worker releases its leases; off by
    /// default, so that `kill` is a crash.
    release_on_drop: bool,
    /// Every worker's checkpoint policy.
    checkpoint_policy: CheckpointPolicy,
    /// Each worker's calls on the table, counted.
    metered: Vec<Arc<StoreStats>>,
    /// Every worker's handoff timeout (the lease duration when `None`).
    handoff_timeout: Option<Duration>,
}

impl Fleet {
    fn new(shards: usize) -> Self {
        let source = InMemoryShardSource::new().with_max_records(50);
        source.create_stream(STREAM, shards);
        Fleet {
            base: fleet::Fleet::new(),
            source,
            log: Arc::default(),
            retention: Duration::from_secs(300),
            sync_interval: Duration::from_secs(5),
            release_on_drop: false,
            checkpoint_policy: CheckpointPolicy::every_call(),
            metered: Vec::new(),
            handoff_timeout: None,
        }
    }

    fn config(&self, id: &str, policy: FailurePolicy) -> WorkerConfig {
        let mut lease = LeaseConfig::builder(id)
            .taker_interval(TICK)
            .seed(id.len() as u64 * 31)
            .release_on_drop(self.release_on_drop);
        if let Some(d) = self.handoff_timeout {
            lease = lease.handoff_timeout(d);
        }
        let lease = lease.build().unwrap();
        fleet::one_stream(lease, STREAM)
            .failure_policy(policy)
            .checkpoint_policy(self.checkpoint_policy)
            .parent_poll_interval(Duration::from_secs(1))
            .shard_sync_interval(self.sync_interval)
            .completed_lease_retention(self.retention)
            .build()
            .unwrap()
    }

    fn start(&mut self, id: &str, b: Behaviour, policy: FailurePolicy) -> usize {
        self.log
            .failures_left
            .fetch_add(b.failures, Ordering::Relaxed);
        self.log
            .panics_left
            .fetch_add(u32::from(b.panic_on.is_some()), Ordering::Relaxed);
        let log = Arc::clone(&self.log);
        let factory = move |ctx: &ShardContext| Recorder {
            ctx: ctx.clone(),
            log: Arc::clone(&log),
            b,
        };
        let metered = MeteredStore::new(self.base.table_for_worker());
        self.metered.push(Arc::clone(metered.stats()));
        let config = self.config(id, policy);
        let source = Arc::new(self.source.clone());
        self.base
            .run_worker(config, Arc::new(metered), source, factory)
    }

    /// Puts `per_key` records for each of `keys` partition keys, numbering
    /// each key's records from `from`.
    fn produce(&self, keys: usize, from: u64, per_key: u64) {
        fleet::produce(&self.source, STREAM, keys, from, per_key);
    }

    /// Puts records 0..5 of one key, and 5..10 a second later: record 7,
    /// where a failing processor fails, comes after a batch that succeeded.
    async fn produce_ten_in_two_batches(&self) {
        self.produce(1, 0, 5);
        sleep(Duration::from_secs(1)).await;
        self.produce(1, 5, 5);
    }

    /// Checkpoint requests worker `i` made: single writes, and batches of
    /// several shards' writes.
    fn checkpoint_requests(&self, i: usize) -> u64 {
        let snap = self.metered[i].snapshot();
        snap.op(StoreOp::Checkpoint).calls + snap.op(StoreOp::CheckpointMany).calls
    }

    async fn wait_for(&self, count: usize, limit: Duration) {
        fleet::wait_for_records(limit, Duration::from_millis(100), count, || {
            self.log.count()
        })
        .await;
    }
}

// The table and the workers (`stop`, `kill`, `consuming`).
kcl_core::deref_fleet!(Fleet, base);

/// One shard with worker `w-a` on it, processors behaving as `b`, and
/// records 0..20 of four keys processed; the fleet, and the worker's index.
async fn one_worker_past_its_first_records(b: Behaviour) -> (Fleet, usize) {
    let mut fleet = Fleet::new(1);
    let i = fleet.start("w-a", b, FailurePolicy::Retry);
    fleet.produce(4, 0, 20);
    fleet.wait_for(4 * 20, Duration::from_secs(60)).await;
    (fleet, i)
}

/// Every record of `keys` x `0..per_key` was processed at least once; returns
/// the number of duplicates. Each key's records arrive in order (a replay
/// after a crash restarts from a checkpoint, so order holds per delivery).
fn check_complete(log: &Log, keys: usize, per_key: u64) -> usize {
    let by_key = log.by_key();
    let mut duplicates = 0;
    for k in 0..keys {
        let seen = by_key.get(&format!("pk-{k}")).cloned().unwrap_or_default();
        let mut expected = 0;
        for n in &seen {
            if *n == expected {
                expected += 1;
            } else {
                assert!(
                    *n < expected,
                    "pk-{k}: {n} processed before {expected} (order broken or record lost)"
                );
                duplicates += 1;
            }
        }
        assert_eq!(
            expected, per_key,
            "pk-{k}: records from {expected} on were never processed"
        );
    }
    duplicates
}

#[tokio::test(start_paused = true)]
async fn three_workers_process_every_record_once_in_order_without_overlap() {
    let mut fleet = Fleet::new(6);
    fleet.produce(12, 0, 100);
    for id in ["w-a", "w-b", "w-c"] {
        fleet.start(id, Behaviour::default(), FailurePolicy::Retry);
    }
    // Keep producing while the fleet balances.
    for round in 1..=5u64 {
        sleep(TICK).await;
        fleet.produce(12, round * 100, 100);
    }
    fleet.wait_for(12 * 600, Duration::from_secs(600)).await;
    let counts: Vec<usize> = (0..3).map(|i| fleet.consuming(i)).collect();
    // Status reads the coordinator's counters live, not as of the last
    // lease event.
    let ticks = fleet.workers[0].0.status().leases.ticks;
    sleep(TICK * 3).await;
    let later = fleet.workers[0].0.status().leases.ticks;
    assert!(
        later >= ticks + 2,
        "status counters are stale: {ticks} then {later}"
    );
    for i in 0..3 {
        fleet.stop(i).await;
    }
    assert_eq!(
        fleet.log.overlaps.load(Ordering::Relaxed),
        0,
        "two workers processed one shard at once"
    );
    assert_eq!(
        check_complete(&fleet.log, 12, 600),
        0,
        "duplicates without any failure"
    );
    assert_eq!(counts.iter().sum::<usize>(), 6);
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "balanced: {counts:?}"
    );
    // Graceful shutdown released every lease.
    assert!(fleet.store.snapshot().iter().all(|l| l.owner.is_none()));
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_hands_over_within_a_tick_without_duplicates() {
    let mut fleet = Fleet::new(4);
    // Checkpoints only in shutdown_requested: zero duplicates must come from
    // the graceful handoff, not from frequent checkpoints.
    let lazy = Behaviour::lazy();
    let a = fleet.start("w-a", lazy, FailurePolicy::Retry);
    let b = fleet.start("w-b", lazy, FailurePolicy::Retry);
    fleet.produce(8, 0, 50);
    sleep(TICK * 4).await;
    assert_eq!((fleet.consuming(a), fleet.consuming(b)), (2, 2));
    fleet.produce(8, 50, 50);
    fleet.wait_for(8 * 100, Duration::from_secs(120)).await;

    let stopped_at = Instant::now();
    fleet.stop(b).await;
    fleet.produce(8, 100, 50);
    while fleet.consuming(a) < 4 {
        assert!(
            stopped_at.elapsed() <= TICK.mul_f64(1.25) + Duration::from_secs(1),
            "peers must pick up within one tick"
        );
        sleep(Duration::from_millis(100)).await;
    }
    let picked_up = stopped_at.elapsed();
    fleet.wait_for(8 * 150, Duration::from_secs(120)).await;
    fleet.stop(a).await;
    println!("graceful stop: shards picked up {picked_up:?} after shutdown");
    assert_eq!(
        check_complete(&fleet.log, 8, 150),
        0,
        "graceful shutdown must not repeat records"
    );
    assert_eq!(fleet.log.overlaps.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_crashed_worker_loses_nothing_and_its_shards_move_within_lease_duration_plus_a_tick() {
    let mut fleet = Fleet::new(4);
    let a = fleet.start("w-a", Behaviour::default(), FailurePolicy::Retry);
    let b = fleet.start("w-b", Behaviour::default(), FailurePolicy::Retry);
    fleet.produce(8, 0, 50);
    sleep(TICK * 4).await;
    assert_eq!(fleet.consuming(b), 2);
    fleet.kill(b).await;
    let killed_at = Instant::now();
    fleet.produce(8, 50, 50);
    while fleet.consuming(a) < 4 {
        assert!(
            killed_at.elapsed() <= Duration::from_secs(10) + TICK.mul_f64(1.25),
            "failover too slow: {:?} after the kill, {} consuming",
            killed_at.elapsed(),
            fleet.consuming(a)
        );
        sleep(Duration::from_millis(100)).await;
    }
    println!(
        "crash: shards moved {:?} after the kill",
        killed_at.elapsed()
    );
    fleet.wait_for(8 * 100, Duration::from_secs(120)).await;
    fleet.stop(a).await;
    let dups = check_complete(&fleet.log, 8, 100);
    println!("crash: {dups} duplicates (at-least-once)");
    assert_eq!(fleet.log.overlaps.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn children_start_only_after_their_parents_end() {
    let mut fleet = Fleet::new(2);
    fleet.start("w-a", Behaviour::default(), FailurePolicy::Retry);
    fleet.start("w-b", Behaviour::default(), FailurePolicy::Retry);
    fleet.produce(8, 0, 40);
    sleep(Duration::from_secs(2)).await;
    let shards: Vec<String> = {
        use kcl_core::source::ShardSource;
        fleet
            .source
            .list_shards(STREAM)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.shard_id)
            .collect()
    };
    let [c1, c2] = fleet.source.split(STREAM, &shards[0]).unwrap();
    fleet.produce(8, 40, 40);
    let merged = fleet.source.merge(STREAM, &c1, &c2).unwrap();
    fleet.produce(8, 80, 40);
    fleet.wait_for(8 * 120, Duration::from_secs(300)).await;
    for i in 0..2 {
        fleet.stop(i).await;
    }
    assert_eq!(check_complete(&fleet.log, 8, 120), 0);
    let ended = fleet.log.shard_ended_at.lock().unwrap().clone();
    let first = fleet.log.first_record_at.lock().unwrap().clone();
    for (child, parents) in [
        (&c1, vec![&shards[0]]),
        (&c2, vec![&shards[0]]),
        (&merged, vec![&c1, &c2]),
    ] {
        let Some(started) = first.get(child.as_str()) else {
            continue;
        };
        for p in parents {
            let done = ended
                .get(p.as_str())
                .unwrap_or_else(|| panic!("{p} never ended but {child} started"));
            assert!(
                done <= started,
                "{child} started before its parent {p} reached SHARD_END"
            );
        }
    }
    assert!(
        first.contains_key(merged.as_str()),
        "the merged child was consumed"
    );
}

/// After a split, the children's first records follow the parent's
/// SHARD_END within a beat interval, with one worker or two: the consumer
/// that ends the parent creates the children's leases and tells its own
/// taker, and its peers through its record's change counter. Without that
/// the children waited for the next shard sync (a minute at the default).
#[tokio::test(start_paused = true)]
async fn a_split_shards_children_start_within_a_beat_of_its_shard_end() {
    for workers in [1, 2] {
        let mut fleet = Fleet::new(2);
        fleet.sync_interval = Duration::from_secs(60);
        for i in 0..workers {
            fleet.start(
                &format!("w-{i}"),
                Behaviour::default(),
                FailurePolicy::Retry,
            );
        }
        fleet.produce(8, 0, 20);
        fleet.wait_for(8 * 20, Duration::from_secs(120)).await;
        // Settled: the takers' ticks are quiet, the next sync far off.
        sleep(TICK * 2).await;
        let parent = {
            use kcl_core::source::ShardSource;
            fleet.source.list_shards(STREAM).await.unwrap()[0]
                .shard_id
                .clone()
        };
        let [c1, c2] = fleet.source.split(STREAM, &parent).unwrap();
        fleet.produce(8, 20, 20);
        fleet.wait_for(8 * 40, Duration::from_secs(300)).await;
        let ended = fleet.log.shard_ended_at.lock().unwrap()[parent.as_str()];
        let first = fleet.log.first_record_at.lock().unwrap().clone();
        let last_child = [&c1, &c2].iter().map(|c| first[c.as_str()]).max().unwrap();
        let waited = last_child - ended;
        println!("{workers} worker(s): the last child's first record {waited:?} after SHARD_END");
        assert!(
            waited <= Duration::from_secs(7),
            "{workers} worker(s): the children started {waited:?} after their parent's SHARD_END"
        );
        for i in 0..workers {
            fleet.stop(i).await;
        }
        assert_eq!(check_complete(&fleet.log, 8, 40), 0);
    }
}

/// A shard's metric series may go once no consumer of the process reads
/// it (recorders keep about fifteen per shard, and leases keep moving):
/// the recorders subscribed hear of a split parent once its consumer has
/// ended, of its children only when the worker stops, and of no shard
/// while it is still read.
#[tokio::test(start_paused = true)]
async fn recorders_forget_a_shard_once_no_consumer_reads_it() {
    // A stream of this test's own: the counts of consumers per shard are
    // the process's, and the other tests read `STREAM` meanwhile.
    const SERIES: &str = "series";
    let forgotten = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = Arc::clone(&forgotten);
    let _subscription = kcl_core::shard_series::subscribe(move |stream, shard| {
        if stream == SERIES {
            sink.lock().unwrap().push(shard.to_owned());
        }
    });
    let source = InMemoryShardSource::new().with_max_records(50);
    let parent = source.create_stream(SERIES, 1).remove(0);
    let mut base = fleet::Fleet::new();
    // The defaults: a split's children start within the waits below.
    let lease = LeaseConfig::builder("w-a").build().unwrap();
    let config = fleet::one_stream(lease, SERIES).build().unwrap();
    let log = Arc::<Log>::default();
    let factory_log = Arc::clone(&log);
    let factory = move |ctx: &ShardContext| Recorder {
        ctx: ctx.clone(),
        log: Arc::clone(&factory_log),
        b: Behaviour::default(),
    };
    let store = Arc::new(base.table_for_worker());
    base.run_worker(config, store, Arc::new(source.clone()), factory);
    fleet::produce(&source, SERIES, 4, 0, 10);
    fleet::wait_for_records(Duration::from_secs(60), TICK / 100, 40, || log.count()).await;
    assert!(
        forgotten.lock().unwrap().is_empty(),
        "the shard is still read"
    );

    let [c1, c2] = source.split(SERIES, &parent).unwrap();
    fleet::produce(&source, SERIES, 4, 10, 10);
    fleet::wait_for_records(Duration::from_secs(120), TICK / 100, 80, || log.count()).await;
    assert_eq!(*forgotten.lock().unwrap(), std::slice::from_ref(&parent));

    base.stop_all().await;
    let mut after_stop = forgotten.lock().unwrap().clone();
    after_stop.sort();
    let mut expected = vec![parent, c1, c2];
    expected.sort();
    assert_eq!(after_stop, expected);
}

/// A processor that checkpoints every batch, under a policy of one write
/// per 5 s per shard: a steal's handoff and a graceful shutdown repeat no
/// record, although the processor does not checkpoint in
/// `shutdown_requested` (the position it asked for last is written as the
/// tenure ends), and the checkpoint writes fall to about one per shard per
/// period and one per tenure's end (from one per batch).
#[tokio::test(start_paused = true)]
async fn a_checkpoint_policy_repeats_no_record_on_handoff_or_graceful_shutdown() {
    let mut writes = Vec::new();
    for policy in [
        CheckpointPolicy::every_call(),
        CheckpointPolicy::every(Duration::from_secs(5)),
    ] {
        let mut fleet = Fleet::new(4);
        fleet.checkpoint_policy = policy;
        // One record per batch's worth of time: a shard's 300 records take
        // a minute, so the policy holds positions back all along.
        let b = Behaviour {
            checkpoint_on_shutdown: false,
            work: Duration::from_millis(1_000),
            ..Behaviour::default()
        };
        fleet.start("w-a", b, FailurePolicy::Retry);
        // Records keep coming, so a handoff and the shutdown each fall
        // while a position is held back.
        fleet.produce(8, 0, 100);
        sleep(TICK * 2).await;
        fleet.produce(8, 100, 100);
        // A second worker steals half the shards by handoff.
        fleet.start("w-b", b, FailurePolicy::Retry);
        sleep(TICK * 2).await;
        fleet.produce(8, 200, 100);
        sleep(Duration::from_secs(3)).await;
        // The first leaves gracefully: its shards move by release.
        fleet.stop(0).await;
        fleet.wait_for(8 * 300, Duration::from_secs(900)).await;
        // Repeats count towards the 2,400: let the rest finish too.
        sleep(TICK * 3).await;
        fleet.stop(1).await;
        let duplicates = check_complete(&fleet.log, 8, 300);
        assert_eq!(duplicates, 0, "{policy:?}: records repeated");
        let checkpoints: u64 = (0..fleet.metered.len())
            .map(|i| fleet.checkpoint_requests(i))
            .sum();
        writes.push(checkpoints);
    }
    println!(
        "checkpoint requests: every call {}, every 5 s {}",
        writes[0], writes[1]
    );
    assert!(
        writes[1] * 2 <= writes[0],
        "the policy coalesces writes: {} with it, {} without",
        writes[1],
        writes[0]
    );
}

/// `every_records(n)` counts the records handed to a processor, on a
/// shard of one lane as in lanes: 400 records in batches of up to 50,
/// under a policy of one write per 100, make about 4 writes while the
/// shard is read. The one-lane path counted batches, so the policy held
/// every position back until 100 batches had gone by.
#[tokio::test(start_paused = true)]
async fn a_record_count_policy_counts_records_not_batches() {
    let mut fleet = Fleet::new(1);
    fleet.checkpoint_policy = CheckpointPolicy::every_records(100);
    fleet.start("w-a", Behaviour::default(), FailurePolicy::Retry);
    fleet.produce(8, 0, 50);
    fleet.wait_for(8 * 50, Duration::from_secs(120)).await;
    sleep(TICK).await;
    let writes = fleet.checkpoint_requests(0);
    assert!(
        (3..=5).contains(&writes),
        "{writes} checkpoint writes for 400 records"
    );
    fleet.stop(0).await;
}

#[tokio::test(start_paused = true)]
async fn retry_policy_redelivers_the_same_batch_and_skips_nothing() {
    let mut fleet = Fleet::new(1);
    fleet.start("w-a", Behaviour::failing(3), FailurePolicy::Retry);
    fleet.produce(2, 0, 30);
    fleet.wait_for(60, Duration::from_secs(60)).await;
    fleet.stop(0).await;
    assert_eq!(check_complete(&fleet.log, 2, 30), 0);
}

#[tokio::test(start_paused = true)]
async fn skip_policy_moves_on_and_release_policy_hands_the_shard_back() {
    let mut fleet = Fleet::new(1);
    let failing = Behaviour::failing(1);
    fleet.start("w-a", failing, FailurePolicy::Skip);
    fleet.produce_ten_in_two_batches().await;
    sleep(Duration::from_secs(1)).await;
    fleet.stop(0).await;
    let seen = fleet.log.by_key().remove("pk-0").unwrap();
    assert!(!seen.contains(&7), "the failed batch was skipped: {seen:?}");
    assert!(
        seen.contains(&0) && seen.contains(&9) || seen.len() >= 5,
        "{seen:?}"
    );

    let mut fleet = Fleet::new(1);
    fleet.start("w-a", failing, FailurePolicy::ReleaseShard);
    fleet.produce(1, 0, 10);
    // Released, then re-taken on a later tick by a fresh processor, which
    // succeeds: nothing lost.
    fleet.wait_for(10, Duration::from_secs(60)).await;
    fleet.stop(0).await;
    assert_eq!(check_complete(&fleet.log, 1, 10), 0);
    assert!(fleet.workers[0].0.status().leases.released >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_processor_releases_its_shard_and_nothing_is_lost() {
    let mut fleet = Fleet::new(2);
    let fragile = Behaviour {
        panic_on: Some(20),
        ..Behaviour::default()
    };
    fleet.start("w-a", fragile, FailurePolicy::Retry);
    fleet.produce(4, 0, 40);
    fleet.wait_for(4 * 40, Duration::from_secs(120)).await;
    fleet.stop(0).await;
    check_complete(&fleet.log, 4, 40);
    assert!(
        fleet.workers[0].0.status().leases.released >= 1,
        "the panicked shard was released"
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_stream_is_a_clear_error() {
    let fleet = Fleet::new(1);
    let lease = LeaseConfig::builder("w").build().unwrap();
    let config = WorkerConfig::builder(lease)
        .stream(StreamSpec {
            name: "nope".into(),
            layout: LeaseLayout::SingleStream,
        })
        .build()
        .unwrap();
    let worker = Worker::new(
        config,
        Arc::new(fleet.store.clone()),
        Arc::new(fleet.source.clone()),
        Arc::new(|ctx: &ShardContext| Recorder {
            ctx: ctx.clone(),
            log: Arc::default(),
            b: Behaviour::default(),
        }),
    );
    let err = worker.run().await.unwrap_err();
    assert!(matches!(err, WorkerError::StreamNotFound { .. }));
    assert!(err.to_string().contains("\"nope\""), "{err}");
}

#[test]
fn invalid_worker_config_names_the_field() {
    let lease = || LeaseConfig::builder("w").build().unwrap();
    let spec = |name: &str, layout| StreamSpec {
        name: name.into(),
        layout,
    };
    let cases = [
        (WorkerConfig::builder(lease()), "streams"),
        (
            WorkerConfig::builder(lease())
                .stream(spec("a", LeaseLayout::SingleStream))
                .stream(spec("a", LeaseLayout::SingleStream)),
            "streams",
        ),
        (
            WorkerConfig::builder(lease())
                .stream(spec("a", LeaseLayout::SingleStream))
                .stream(spec("b", LeaseLayout::SingleStream)),
            "streams",
        ),
        (
            WorkerConfig::builder(lease())
                .stream(spec("a", LeaseLayout::SingleStream))
                .shard_sync_interval(Duration::ZERO),
            "shard_sync_interval",
        ),
    ];
    for (builder, field) in cases {
        let e = builder.build().unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.to_string().contains(field));
    }
}

/// The store each worker uses is a handle on one shared table.
#[tokio::test(start_paused = true)]
async fn leases_end_released_after_every_worker_stops() {
    let mut fleet = Fleet::new(3);
    fleet.start("w-a", Behaviour::default(), FailurePolicy::Retry);
    sleep(Duration::from_secs(1)).await;
    fleet.stop(0).await;
    for l in fleet.store.snapshot() {
        assert_eq!(l.owner, None, "{l:?}");
    }
    let _: &dyn LeaseStore = &fleet.store;
}

#[tokio::test(start_paused = true)]
async fn finished_parents_are_deleted_after_retention_and_never_reread() {
    let mut fleet = Fleet::new(1);
    fleet.retention = Duration::from_secs(30);
    fleet.start("w-a", Behaviour::default(), FailurePolicy::Retry);
    fleet.produce(4, 0, 20);
    sleep(Duration::from_secs(2)).await;
    let parent = fleet.store.snapshot()[0].shard_id.clone();
    let [c1, c2] = fleet.source.split(STREAM, &parent).unwrap();
    fleet.produce(4, 20, 20);
    fleet.wait_for(4 * 40, Duration::from_secs(60)).await;
    let keys = |f: &Fleet| {
        f.store
            .snapshot()
            .into_iter()
            .map(|l| l.key)
            .collect::<Vec<_>>()
    };
    assert!(keys(&fleet).contains(&parent), "kept during retention");
    sleep(Duration::from_secs(45)).await;
    let left = keys(&fleet);
    assert!(!left.contains(&parent), "deleted after retention: {left:?}");
    assert!(left.contains(&c1) && left.contains(&c2));
    // Later syncs do not recreate it, so nothing is read twice.
    sleep(Duration::from_secs(30)).await;
    assert!(!keys(&fleet).contains(&parent));
    fleet.stop(0).await;
    assert_eq!(check_complete(&fleet.log, 4, 40), 0);
}

/// The streams to consume, as a test sets them; with `hangs` set, a call
/// never answers.
#[derive(Debug, Default)]
struct Tracker(Mutex<Vec<kcl_core::worker::StreamSpec>>, AtomicBool);

#[async_trait]
impl kcl_core::worker::StreamTracker for Tracker {
    async fn streams(&self) -> Result<Vec<StreamSpec>, kcl_core::source::SourceError> {
        if self.1.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        Ok(self.0.lock().unwrap().clone())
    }
}

/// A running worker consuming stream "a" of `source` (multi-stream
/// layout) on its own table, following a tracker that lists "a".
struct Tracked {
    store: InMemoryLeaseStore,
    /// The worker's calls on `store`.
    stats: Arc<StoreStats>,
    /// The source as the worker was given it: whatever the worker keeps
    /// per stream holds a reference.
    shared_source: Arc<dyn kcl_core::source::ShardSource>,
    log: Arc<Log>,
    tracker: Arc<Tracker>,
    handle: kcl_core::worker::WorkerHandle,
    task: tokio::task::JoinHandle<Result<(), WorkerError>>,
}

impl Tracked {
    /// Shuts the worker down and waits for it to stop, cleanly.
    async fn stop(self) {
        self.handle.shutdown();
        self.task.await.unwrap().unwrap();
    }
}

fn start_tracked(source: &InMemoryShardSource) -> Tracked {
    start_tracked_with(source, Behaviour::default())
}

/// [`start_tracked`], its processors behaving as `b` says.
fn start_tracked_with(source: &InMemoryShardSource, b: Behaviour) -> Tracked {
    use kcl_core::worker::RemovedStreamPolicy;
    let (store, log) = (InMemoryLeaseStore::new(), Arc::<Log>::default());
    let tracker = Arc::new(Tracker(
        Mutex::new(vec![multi("a")]),
        AtomicBool::new(false),
    ));
    let lease = LeaseConfig::builder("w")
        .taker_interval(TICK)
        .seed(3)
        .build()
        .unwrap();
    let config = WorkerConfig::builder(lease)
        .stream(multi("a"))
        .initial_position(InitialPosition::TrimHorizon)
        .shard_sync_interval(Duration::from_secs(5))
        .removed_stream_policy(RemovedStreamPolicy::DeleteAfter(Duration::from_secs(20)))
        .build()
        .unwrap();
    let factory_log = Arc::clone(&log);
    let metered = MeteredStore::new(store.clone());
    let stats = Arc::clone(metered.stats());
    let shared_source: Arc<dyn kcl_core::source::ShardSource> = Arc::new(source.clone());
    let worker = Worker::new(
        config,
        Arc::new(metered),
        Arc::clone(&shared_source),
        Arc::new(move |ctx: &ShardContext| Recorder {
            ctx: ctx.clone(),
            log: Arc::clone(&factory_log),
            b,
        }),
    )
    .with_stream_tracker(Arc::clone(&tracker) as Arc<dyn kcl_core::worker::StreamTracker>);
    let handle = worker.handle();
    let task = tokio::spawn(worker.run());
    Tracked {
        store,
        stats,
        shared_source,
        log,
        tracker,
        handle,
        task,
    }
}

/// A run dropped before it ends (its task aborted) publishes a report,
/// not graceful, so that `stopped` and `shutdown_and_wait` return: they
/// waited for good.
#[tokio::test(start_paused = true)]
async fn a_dropped_run_still_tells_its_waiters_it_stopped() {
    let source = InMemoryShardSource::new();
    source.create_stream("a", 2);
    let t = start_tracked(&source);
    sleep(Duration::from_secs(5)).await;
    t.task.abort();
    let report = tokio::time::timeout(Duration::from_secs(600), t.handle.clone().stopped())
        .await
        .expect("a report");
    assert!(!report.graceful, "{report:?}");
}

/// Streams may come and go for as long as a worker runs: once a removed
/// stream's consumers have stopped, the worker keeps nothing of it (its
/// consumers' shared setup went with them). Before, each stream ever
/// consumed kept its setup for the life of the worker.
#[tokio::test(start_paused = true)]
async fn a_removed_stream_leaves_no_consumer_setup_behind() {
    let (source, _) = streams_a_and_b();
    let worker = start_tracked(&source);
    sleep(TICK * 2).await;
    let before = Arc::strong_count(&worker.shared_source);
    worker.tracker.0.lock().unwrap().push(multi("b"));
    source.put("b", "pk-b", "pk-b:0").unwrap();
    let consumed = || worker.log.count();
    fleet::wait_for_records(Duration::from_secs(120), TICK / 100, 1, consumed).await;
    assert!(
        Arc::strong_count(&worker.shared_source) > before,
        "b is consumed"
    );
    worker
        .tracker
        .0
        .lock()
        .unwrap()
        .retain(|spec| spec.name == "a");
    sleep(TICK * 3).await;
    assert_eq!(Arc::strong_count(&worker.shared_source), before);
    worker.handle.shutdown();
    worker.task.await.unwrap().unwrap();
}

/// Streams "a" and "b" of one shard each, and the id of b's.
fn streams_a_and_b() -> (InMemoryShardSource, String) {
    let source = InMemoryShardSource::new().with_max_records(50);
    source.create_stream("a", 1);
    let b = source.create_stream("b", 1).remove(0);
    (source, b)
}

/// The lease-table scans `t`'s worker makes in the next two minutes, and
/// the sync rounds it runs meanwhile (one listing of stream "a" each).
async fn scans_and_rounds(t: &Tracked, source: &InMemoryShardSource) -> (u64, u64) {
    let (scans, listings) = (t.stats.scans(), source.listings());
    sleep(Duration::from_secs(120)).await;
    let scans = t.stats.scans() - scans;
    let rounds = source.listings() - listings;
    println!("{scans} scans in {rounds} sync rounds");
    (scans, rounds)
}

/// Lists stream "b" in `tracker` for one round, then removes it: its
/// deletion is due 20 s after that.
async fn list_b_then_remove_it(tracker: &Tracker) {
    tracker.0.lock().unwrap().push(multi("b"));
    sleep(Duration::from_secs(7)).await;
    tracker.0.lock().unwrap().retain(|spec| spec.name == "a");
}

/// A removed stream's leases that live workers still hold (one renewing
/// per lease, as the Java KCL does, one beating a liveness record, as a
/// kcl worker of an older deploy still consuming the stream does) are left
/// to their holders to release, and waiting for that costs the sync leader
/// nothing: the deletion works from the round's own scan. Before, every
/// round scanned the whole table a second time for them, for as long as
/// the worker ran.
#[tokio::test(start_paused = true)]
async fn a_removed_streams_leases_live_workers_hold_stay_and_cost_no_second_scan() {
    let source = InMemoryShardSource::new().with_max_records(50);
    source.create_stream("a", 1);
    let b = source.create_stream("b", 2);
    let t = start_tracked(&source);
    // The first rounds and ticks are over.
    sleep(TICK * 2).await;
    let mut by_counter = multi("b").layout.new_lease(&b[0], Checkpoint::TrimHorizon);
    by_counter.owner = Some("w-live".into());
    let mut by_beats = multi("b").layout.new_lease(&b[1], Checkpoint::TrimHorizon);
    by_beats.owner = Some("w-beating".into());
    by_beats.tenure = Some("i-beating.1".into());
    for lease in [&by_counter, &by_beats] {
        t.store.create_if_absent(lease).await.unwrap();
    }
    let live = {
        let (store, key) = (t.store.clone(), by_counter.key.clone());
        tokio::spawn(async move {
            let by = kcl_core::store::Holder {
                owner: "w-live",
                tenure: None,
            };
            let mut counter = 0;
            loop {
                store
                    .beat(&beat_of("i-beating", "w-beating"))
                    .await
                    .unwrap();
                counter = store.renew(&key, by, counter).await.unwrap().counter;
                sleep(Duration::from_secs(3)).await;
            }
        })
    };
    list_b_then_remove_it(&t.tracker).await;
    sleep(Duration::from_secs(40)).await;
    let (scans, rounds) = scans_and_rounds(&t, &source).await;
    // A round lists stream "a" once and scans once. The taker scans at
    // each tick (every 10 s: a holder renewing per lease turns this worker
    // to per-lease renewal too) and when that holder's counter could
    // expire: about 13 more. A second scan per round would add about 24.
    assert!(
        scans <= rounds + 16,
        "{scans} scans in {rounds} sync rounds"
    );
    for key in [&by_counter.key, &by_beats.key] {
        let left = t.store.get(key).await.unwrap();
        assert!(left.is_some(), "a lease its live holder keeps: {key}");
    }
    live.abort();
    t.stop().await;
}

/// Streams "a" and "b" tracked, "b" removed while its processor hangs in
/// a call on its first record; the id of b's shard.
async fn b_removed_during_a_hung_call() -> (InMemoryShardSource, String, Tracked) {
    let (source, b) = streams_a_and_b();
    let hung = Behaviour {
        slow_shard: Some((b.clone().leak(), Duration::from_secs(100_000))),
        ..Behaviour::default()
    };
    let t = start_tracked_with(&source, hung);
    sleep(TICK * 2).await;
    source.put("b", "pk-b", "pk-b:0").unwrap();
    t.tracker.0.lock().unwrap().push(multi("b"));
    let in_call = || usize::from(t.log.first_record_at.lock().unwrap().contains_key(&b));
    fleet::wait_for_records(Duration::from_secs(120), TICK / 100, 1, in_call).await;
    t.tracker.0.lock().unwrap().retain(|spec| spec.name == "a");
    (source, b, t)
}

/// A removed stream's lease the sync leader itself still holds (its
/// processor hangs in a call, so its consumer cannot stop yet) is left to
/// that consumer, at no cost. Before, each sync round found it unjudged
/// (the taker judges only leases other workers hold) and asked the taker
/// for a scan of the whole table, for as long as the call hung.
#[tokio::test(start_paused = true)]
async fn a_removed_streams_lease_the_leader_still_holds_costs_no_scan() {
    let (source, b, t) = b_removed_during_a_hung_call().await;
    // Past the deletion's delay (20 s).
    sleep(Duration::from_secs(40)).await;
    let (scans, rounds) = scans_and_rounds(&t, &source).await;
    // A round lists stream "a" once and scans once; the taker, renewing by
    // beats, has nothing to scan for. A look asked each round would add
    // about 24.
    assert!(scans <= rounds + 4, "{scans} scans in {rounds} sync rounds");
    let key = multi("b").layout.new_lease(&b, Checkpoint::TrimHorizon).key;
    let lease = t.store.get(&key).await.unwrap().expect("still held");
    assert_eq!(lease.owner.as_deref(), Some("w"));
    t.handle.shutdown();
    t.task.abort();
}

/// A fenced tenure of a removed stream's lease is not released, nor
/// deleted, while its consumer's call still runs (up to the handoff
/// timeout): released at the taker's next scan, or deleted by the leader
/// (this worker, whose failing beats made it look gone: 15 runs in 200), a
/// peer still reading the stream took the shard while the call ran on.
/// The lease stays this worker's meanwhile.
#[tokio::test(start_paused = true)]
async fn a_fenced_removed_streams_lease_waits_for_its_running_call() {
    let (_source, b, t) = b_removed_during_a_hung_call().await;
    sleep(TICK).await;
    // The beats go unanswered past the tenures' validity: fenced.
    for _ in 0..10 {
        t.store.inject(StoreOp::Beat, Fault::Hang);
    }
    let fenced = || usize::from(t.handle.status().leases.fenced > 0);
    fleet::wait_for_records(Duration::from_secs(120), TICK / 100, 1, fenced).await;
    let key = multi("b").layout.new_lease(&b, Checkpoint::TrimHorizon).key;
    // Past the taker's next scan (about 4 s here), inside the handoff
    // timeout (a lease duration, 10 s), while the call still runs.
    sleep(Duration::from_secs(7)).await;
    let lease = t.store.get(&key).await.unwrap().expect("not deleted");
    assert_eq!(lease.owner.as_deref(), Some("w"), "released under the call");
    // Past the handoff timeout it goes all the same: a hung call keeps no
    // shard unread for good.
    // (Released, then deleted as the removed stream's.)
    sleep(Duration::from_secs(10)).await;
    let owner = t.store.get(&key).await.unwrap().and_then(|l| l.owner);
    assert_eq!(owner, None, "released once the handoff timeout passed");
    t.handle.shutdown();
    t.task.abort();
}

/// A removed stream's leases are deleted together, once none is held: its
/// released parent stays while a live worker still holds the child. Before,
/// the parent went at once, and the stream, added back meanwhile, found
/// the child leased and the parent gone, took the parent for finished and
/// skipped what it had left.
#[tokio::test(start_paused = true)]
async fn a_removed_streams_leases_go_together_once_none_is_held() {
    let (source, b) = streams_a_and_b();
    let t = start_tracked(&source);
    sleep(TICK * 2).await;
    let mut child = multi("b")
        .layout
        .new_lease("shardId-child", Checkpoint::TrimHorizon)
        .with_parents([b.as_str()]);
    child.owner = Some("w-live".into());
    t.store.create_if_absent(&child).await.unwrap();
    let by = kcl_core::store::Holder {
        owner: "w-live",
        tenure: None,
    };
    let live = {
        let (store, key) = (t.store.clone(), child.key.clone());
        tokio::spawn(async move {
            let mut counter = 0;
            loop {
                counter = store.renew(&key, by, counter).await.unwrap().counter;
                sleep(Duration::from_secs(3)).await;
            }
        })
    };
    list_b_then_remove_it(&t.tracker).await;
    let parent = multi("b").layout.new_lease(&b, Checkpoint::TrimHorizon).key;
    let present = async |key: &str| t.store.get(key).await.unwrap().is_some();
    // Well past the deletion's delay (20 s): the parent waits for the child.
    sleep(Duration::from_secs(60)).await;
    assert!(
        present(&parent).await,
        "the parent went while its child is held"
    );
    assert!(present(&child.key).await);
    live.abort();
    t.store.release(&child.key, by).await.unwrap();
    sleep(Duration::from_secs(20)).await;
    assert!(!present(&parent).await && !present(&child.key).await);
    t.stop().await;
}

/// A removed stream's lease that a worker which died still holds is
/// deleted once due, as soon as the sync leader's taker judges its holder
/// gone (as it would judge a lease it could take): a holder renewing per
/// lease by its counter, a holder with a liveness record by that record.
/// Before, only a released lease was deleted: a lease left held by a
/// worker killed after the stream's removal stayed in the table for good,
/// and kept its holder's liveness record with it.
#[tokio::test(start_paused = true)]
async fn a_removed_streams_lease_a_dead_worker_holds_is_deleted_once_due() {
    let source = InMemoryShardSource::new().with_max_records(50);
    source.create_stream("a", 1);
    let b = source.create_stream("b", 2);
    let t = start_tracked(&source);
    // One lease held by a worker that renewed per lease, one by a worker
    // that beat a liveness record once: both died.
    t.store.beat(&beat_of("i-gone", "w-gone")).await.unwrap();
    sleep(TICK * 2).await;
    let mut by_counter = multi("b").layout.new_lease(&b[0], Checkpoint::TrimHorizon);
    by_counter.owner = Some("w-dead".into());
    let mut by_beats = multi("b").layout.new_lease(&b[1], Checkpoint::TrimHorizon);
    by_beats.owner = Some("w-gone".into());
    by_beats.tenure = Some("i-gone.1".into());
    for lease in [&by_counter, &by_beats] {
        t.store.create_if_absent(lease).await.unwrap();
    }
    list_b_then_remove_it(&t.tracker).await;
    let present = async |key: &str| t.store.get(key).await.unwrap().is_some();
    // Not before the deletion is due.
    sleep(Duration::from_secs(15)).await;
    assert!(present(&by_counter.key).await && present(&by_beats.key).await);
    sleep(Duration::from_secs(30)).await;
    assert!(
        !present(&by_counter.key).await,
        "the counter's holder is gone"
    );
    assert!(!present(&by_beats.key).await, "the record's holder is gone");
    // Nothing names the dead instance now: its record goes too.
    sleep(TICK).await;
    let beats = t.store.beats().await.unwrap();
    assert!(beats.iter().all(|b| b.instance != "i-gone"), "{beats:?}");
    t.stop().await;
}

/// A liveness record of `instance` (of worker `worker`) holding one lease.
fn beat_of<'a>(instance: &'a str, worker: &'a str) -> kcl_core::store::BeatUpdate<'a> {
    kcl_core::store::BeatUpdate {
        instance,
        worker,
        held: 1,
        changes: 1,
        answered: &[],
        stopping: false,
        per_lease: false,
        lease_duration: Duration::from_secs(10),
        beat_interval: Duration::from_secs(3),
    }
}

/// A stream tracker whose call never answers holds back neither shard sync
/// nor shutdown: the call is given up after 30 s and the round goes on
/// with the current streams (it lists the shards). Before, the sync task
/// waited on the call for good: no round listed shards again, and the
/// worker's shutdown never completed.
#[tokio::test(start_paused = true)]
async fn a_stream_tracker_that_never_answers_holds_back_no_sync_round_nor_shutdown() {
    let source = InMemoryShardSource::new().with_max_records(50);
    source.create_stream("a", 1);
    let t = start_tracked(&source);
    source.put("a", "pk-0", "pk-0:0").unwrap();
    sleep(TICK * 2).await;
    assert_eq!(t.log.by_key().get("pk-0").map(Vec::len), Some(1));
    t.tracker.1.store(true, Ordering::Relaxed);
    sleep(Duration::from_secs(10)).await;
    let listed = source.listings();
    // 30 s per unanswered call, a round every 5 s or so: at least 3.
    sleep(Duration::from_secs(120)).await;
    assert!(
        source.listings() >= listed + 3,
        "shard sync went on: {} listings, {listed} before",
        source.listings()
    );
    t.handle.shutdown();
    tokio::time::timeout(Duration::from_secs(600), t.task)
        .await
        .expect("the worker stops")
        .unwrap()
        .unwrap();
}

fn multi(name: &str) -> StreamSpec {
    StreamSpec {
        name: name.into(),
        layout: LeaseLayout::MultiStream {
            identifier: format!("123456789012:{name}:1700000000"),
        },
    }
}

#[tokio::test(start_paused = true)]
async fn streams_added_and_removed_at_runtime() {
    let source = InMemoryShardSource::new().with_max_records(50);
    source.create_stream("a", 2);
    source.create_stream("b", 2);
    let t = start_tracked(&source);
    for n in 0..10 {
        source.put("a", "pk-0", format!("pk-0:{n}")).unwrap();
        source.put("b", "pk-1", format!("pk-1:{n}")).unwrap();
    }
    sleep(TICK * 2).await;
    let keys = |store: &InMemoryLeaseStore| {
        store
            .snapshot()
            .into_iter()
            .map(|l| (l.key, l.owner))
            .collect::<Vec<_>>()
    };
    assert!(
        keys(&t.store).iter().all(|(k, _)| k.contains(":a:")),
        "only a is leased: {:?}",
        keys(&t.store)
    );
    assert_eq!(t.log.by_key().get("pk-0").map(Vec::len), Some(10));

    // b added at runtime: leased and consumed.
    t.tracker.0.lock().unwrap().push(multi("b"));
    sleep(TICK * 3).await;
    assert_eq!(
        t.log.by_key().get("pk-1").map(Vec::len),
        Some(10),
        "b consumed after it was added"
    );

    // a removed: its consumers stop, its leases are released, then deleted.
    t.tracker.0.lock().unwrap().retain(|s| s.name != "a");
    sleep(Duration::from_secs(8)).await;
    let a_leases: Vec<_> = keys(&t.store)
        .into_iter()
        .filter(|(k, _)| k.contains(":a:"))
        .collect();
    assert!(
        !a_leases.is_empty() && a_leases.iter().all(|(_, o)| o.is_none()),
        "released, kept for now: {a_leases:?}"
    );
    assert!(
        t.handle
            .status()
            .consuming
            .iter()
            .all(|k| k.contains(":b:"))
    );
    sleep(Duration::from_secs(30)).await;
    assert!(
        keys(&t.store).iter().all(|(k, _)| !k.contains(":a:")),
        "deleted after the delay: {:?}",
        keys(&t.store)
    );
    assert_eq!(t.handle.status().consuming.len(), 2);
    t.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_during_retries_never_checkpoints_past_the_failing_batch() {
    let mut fleet = Fleet::new(1);
    // Fails on the batch holding record 7 until the budget runs out, and
    // checkpoints in shutdown_requested as the docs recommend.
    fleet.start("w-a", Behaviour::failing(1_000), FailurePolicy::Retry);
    fleet.produce_ten_in_two_batches().await;
    sleep(Duration::from_secs(5)).await;
    fleet.stop(0).await;
    assert!(
        !fleet.log.by_key()["pk-0"].contains(&7),
        "the failing batch never succeeded"
    );

    fleet.log.failures_left.store(0, Ordering::Relaxed);
    fleet.start("w-b", Behaviour::default(), FailurePolicy::Retry);
    fleet.wait_for(10, Duration::from_secs(60)).await;
    fleet.stop(1).await;
    assert_eq!(
        check_complete(&fleet.log, 1, 10),
        0,
        "the batch that failed is processed by the next owner"
    );
}

/// A merge child whose other parent has no lease yet: shard S1's processor
/// is slow, so S1's child B0 is not leased when A1 (S0's child) reaches its
/// end, merged with B0 into C; and B0's first creates fail. C must not be
/// created from A1 alone (it would be read before B0, and the next sync
/// would take the unleased, closed B0 for finished: its records never
/// read). A1 waits, the sync it asks for creates B0 (retrying the failed
/// create), then C: every record arrives, in order, parents before children.
#[tokio::test(start_paused = true)]
async fn a_merge_child_waits_for_its_other_parents_lease_and_nothing_is_lost() {
    // Enough keys that every quarter of the hash range gets records.
    const KEYS: usize = 32;
    let mut fleet = Fleet::new(2);
    // Only the startup sync, and syncs a consumer asks for, run in this test.
    fleet.sync_interval = Duration::from_secs(600);
    let slow = Behaviour {
        slow_shard: Some(("shardId-000000000001", Duration::from_secs(5))),
        ..Behaviour::default()
    };
    fleet.start("w-a", slow, FailurePolicy::Retry);
    fleet.produce(KEYS, 0, 40);
    sleep(Duration::from_secs(2)).await;
    let s0 = "shardId-000000000000";
    let s1 = "shardId-000000000001";
    let [_a0, a1] = fleet.source.split(STREAM, s0).unwrap();
    let [b0, _b1] = fleet.source.split(STREAM, s1).unwrap();
    for _ in 0..3 {
        fleet.stores[0].inject_on(
            kcl_core::store::StoreOp::Create,
            &b0,
            kcl_core::store::memory::Fault::Error(kcl_core::StoreErrorKind::Retryable),
        );
    }
    fleet.produce(KEYS, 40, 40);
    let c = fleet.source.merge(STREAM, &a1, &b0).unwrap();
    fleet.produce(KEYS, 80, 40);
    fleet.wait_for(KEYS * 120, Duration::from_secs(900)).await;
    fleet.stop(0).await;
    check_complete(&fleet.log, KEYS, 120);
    let ended = fleet.log.shard_ended_at.lock().unwrap().clone();
    let first = fleet.log.first_record_at.lock().unwrap().clone();
    for (child, parents) in [(&b0, vec![s1]), (&c, vec![a1.as_str(), b0.as_str()])] {
        let started = first
            .get(child.as_str())
            .unwrap_or_else(|| panic!("{child} was never read"));
        for p in parents {
            let done = ended
                .get(p)
                .unwrap_or_else(|| panic!("{p} never ended but {child} started"));
            assert!(
                done <= started,
                "{child} started before its parent {p} ended"
            );
        }
    }
}

/// A peer starts stealing a lease (its handoff write lands) and, before
/// this worker's renewer notices, this worker is told to stop (a rolling
/// restart). Its release then finds the thief owning the lease: instead of
/// ignoring that, it completes the handoff it is the checkpoint owner of,
/// after its processor checkpointed, so the thief starts at once rather
/// than after the handoff timeout.
#[tokio::test(start_paused = true)]
async fn a_shutdown_right_after_a_peers_steal_completes_the_handoff() {
    let (mut fleet, a) = one_worker_past_its_first_records(Behaviour::lazy()).await;
    let key = "shardId-000000000000";
    let seen = fleet.store.get(key).await.unwrap().unwrap();
    assert_eq!(
        seen.checkpoint,
        Checkpoint::TrimHorizon,
        "nothing checkpointed yet"
    );
    fleet
        .store
        .start_handoff(&seen, kcl_core::Holder::new("w-b", "t-b"))
        .await
        .unwrap();
    fleet.stop(a).await;
    let after = fleet.store.get(key).await.unwrap().unwrap();
    assert_eq!(
        after.checkpoint_owner, None,
        "the handoff was completed, not left to be forced: {after:?}"
    );
    assert_eq!(after.owner.as_deref(), Some("w-b"));
    assert!(
        matches!(after.checkpoint, Checkpoint::Sequence { .. }),
        "the processor checkpointed in shutdown_requested first: {after:?}"
    );
}

/// A worker whose run future is dropped without a graceful shutdown (a
/// panic unwinding the application, a runtime shut down under it) releases
/// its leases, best effort, instead of leaving every shard idle for a lease
/// duration.
#[tokio::test(start_paused = true)]
async fn a_worker_dropped_without_a_shutdown_releases_its_leases() {
    let mut fleet = Fleet::new(3);
    fleet.release_on_drop = true;
    fleet.start("w-a", Behaviour::default(), FailurePolicy::Retry);
    sleep(Duration::from_secs(1)).await;
    assert!(
        fleet
            .store
            .snapshot()
            .iter()
            .all(|l| l.owner.as_deref() == Some("w-a"))
    );
    fleet.kill(0).await;
    for l in fleet.store.snapshot() {
        assert_eq!(
            (l.owner.as_deref(), l.tenure.as_deref()),
            (None, None),
            "{l:?}"
        );
    }
}

/// Startup against a lease table that throttles every call for 20 s: the
/// worker retries (it does not exit), says why it is not ready meanwhile,
/// and becomes ready and processes once the throttling stops.
#[tokio::test(start_paused = true)]
async fn startup_under_throttling_retries_until_ready() {
    let mut fleet = Fleet::new(2);
    let i = fleet.start("w-a", Behaviour::default(), FailurePolicy::Retry);
    fleet.stores[i].fail_until(
        None,
        kcl_core::StoreErrorKind::Throttled,
        Instant::now() + Duration::from_secs(20),
    );
    sleep(Duration::from_secs(5)).await;
    let status = fleet.workers[i].0.status();
    assert!(!status.ready, "{status:?}");
    let why = status.starting.expect("the reason it is not ready");
    assert!(why.contains("throttled"), "{why}");
    assert!(
        !fleet.workers[i].1.is_finished(),
        "the worker exited instead of retrying"
    );
    // Retries back off to at most 10 s (up to twice that with jitter).
    let throttled_until = Instant::now() + Duration::from_secs(15);
    while !fleet.workers[i].0.status().ready {
        assert!(
            Instant::now() < throttled_until + Duration::from_secs(21),
            "not ready long after the throttling ended: {:?}",
            fleet.workers[i].0.status()
        );
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(fleet.workers[i].0.status().starting, None);
    fleet.produce(4, 0, 10);
    fleet.wait_for(4 * 10, Duration::from_secs(60)).await;
    fleet.stop(i).await;
    assert_eq!(check_complete(&fleet.log, 4, 10), 0);
}

/// A consumer stopped by a rejected checkpoint (here an injected failed
/// condition while the table still says the lease is this worker's) must
/// not leave its shard held and renewed with nobody reading it: the tenure
/// ends, the next tick reclaims the lease in a new tenure, and a new
/// consumer reads on from the last checkpoint.
#[tokio::test(start_paused = true)]
async fn a_consumer_stopped_by_a_rejected_checkpoint_resumes_in_a_new_tenure() {
    let (mut fleet, i) = one_worker_past_its_first_records(Behaviour::default()).await;
    fleet.stores[i].inject(
        kcl_core::store::StoreOp::Checkpoint,
        kcl_core::store::memory::Fault::Error(kcl_core::StoreErrorKind::ConditionFailed),
    );
    fleet.produce(4, 20, 20);
    fleet.wait_for(4 * 40, Duration::from_secs(120)).await;
    let leases = fleet.workers[i].0.status().leases;
    fleet.stop(i).await;
    check_complete(&fleet.log, 4, 40);
    assert_eq!((leases.lost, leases.reclaimed), (1, 1), "{leases:?}");
}

/// Shard sync runs once per round for the whole fleet, on the worker the
/// lease table names as leader, not once per worker: three workers syncing
/// every 5 s list the stream about as often as one would.
#[tokio::test(start_paused = true)]
async fn shard_sync_runs_once_per_round_for_the_fleet() {
    let mut fleet = Fleet::new(6);
    for id in ["w-a", "w-b", "w-c"] {
        fleet.start(id, Behaviour::default(), FailurePolicy::Retry);
    }
    sleep(TICK * 3).await;
    let before = fleet.source.listings();
    let window = Duration::from_secs(120);
    sleep(window).await;
    let syncs = fleet.source.listings() - before;
    // One worker, a round every 5 s +/-25 %: 24 rounds, at most 32; every
    // worker syncing would make about 72.
    println!("{syncs} shard listings in {window:?} for 3 workers");
    assert!((16..=33).contains(&syncs), "{syncs} listings in {window:?}");
    for i in 0..3 {
        fleet.stop(i).await;
    }
}

/// An operator's `kcl leases reset --force` evicts a holder whose
/// processor is inside a long `process_records` call. The holder judges
/// the lease lost at once, but that call runs on (its consumer learns of
/// the loss when it returns), so the handoff to nobody the eviction left
/// is completed only once the consumer stopped, and at once then: no peer
/// processes the shard while the batch is in flight (invariant 1), and the
/// shard does not stand unread after it. The holder's next scan used to
/// complete it while the batch still ran, freeing the shard for any peer
/// (here the holder itself raced w-b to it and won, so the failure shows as
/// the completion's order, not as an overlap).
#[tokio::test(start_paused = true)]
async fn an_evicted_holders_batch_in_flight_returns_before_a_peer_processes_the_shard() {
    use kcl_core::leases::operator::{evict, tell};
    const SHARD: &str = "shardId-000000000000";
    let mut fleet = Fleet::new(1);
    // Far beyond the batch: only the batch's return may let the lease go.
    fleet.handoff_timeout = Some(Duration::from_secs(300));
    let slow = Behaviour {
        slow_shard: Some((SHARD, Duration::from_secs(60))),
        ..Behaviour::default()
    };
    let a = fleet.start("w-a", slow, FailurePolicy::Retry);
    fleet.produce(1, 0, 1);
    let in_flight = |fleet: &Fleet, w: &str| {
        fleet
            .log
            .in_flight
            .lock()
            .unwrap()
            .get(SHARD)
            .map(String::as_str)
            == Some(w)
    };
    while !in_flight(&fleet, "w-a") {
        sleep(Duration::from_millis(100)).await;
    }
    let b = fleet.start("w-b", Behaviour::default(), FailurePolicy::Retry);
    sleep(TICK).await;
    assert!(in_flight(&fleet, "w-a"), "the batch is still in flight");

    // As `kcl leases reset --force` writes it: the eviction, the reset
    // checkpoint (keeping the eviction's handoff), then the holder told.
    let lease = fleet.store.get(SHARD).await.unwrap().unwrap();
    let (mut reset, instance) = evict(&fleet.store, &lease, &fleet.store.beats_snapshot())
        .await
        .unwrap()
        .expect("w-a beats its liveness record: evicted");
    reset.checkpoint = Checkpoint::TrimHorizon;
    reset.counter += 1;
    fleet.store.put_raw(reset);
    assert!(tell(&fleet.store, &instance, SHARD).await);

    // Polled in order: the batch's return, the handoff's completion, the
    // shard processed again from the reset checkpoint (by w-b, or by w-a
    // in a new tenure); w-a's taker ticks counted in between.
    let ticks = |fleet: &Fleet| fleet.workers[a].0.status().leases.ticks;
    let batches = |fleet: &Fleet| {
        fleet
            .log
            .processed
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, shard, _, _)| shard == SHARD)
            .count()
    };
    let mut returned: Option<u64> = None;
    let mut completed: Option<(bool, u64)> = None;
    let started = Instant::now();
    while batches(&fleet) < 2 {
        sleep(Duration::from_millis(50)).await;
        if returned.is_none() && batches(&fleet) > 0 {
            returned = Some(ticks(&fleet));
        }
        let item = fleet.store.get(SHARD).await.unwrap().unwrap();
        if completed.is_none() && item.checkpoint_owner.is_none() {
            completed = Some((returned.is_some(), ticks(&fleet)));
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "the shard was not processed again: {item:?}"
        );
    }
    assert_eq!(
        fleet.log.overlaps.load(Ordering::Relaxed),
        0,
        "w-b processed the shard while w-a's batch was in flight"
    );
    let (after_return, at_tick) = completed.expect("the handoff was completed");
    assert!(
        after_return,
        "the eviction's handoff was completed while w-a's batch was in flight"
    );
    let returned = returned.unwrap();
    assert!(
        at_tick - returned <= 1,
        "completed {} ticks after the batch returned, not at the scan its consumer's stop asked for",
        at_tick - returned
    );
    fleet.stop(b).await;
    fleet.stop(a).await;
}

/// The shard [`one_slow_shard`] slows down.
const SLOW_SHARD: &str = "shardId-000000000001";

/// Worker w-a on `shards` shards, each batch of [`SLOW_SHARD`] taking
/// `batch`, consuming all of them `settle` after 80 records: the fleet and
/// w-a's index.
async fn one_slow_shard(shards: usize, batch: Duration, settle: Duration) -> (Fleet, usize) {
    let mut fleet = Fleet::new(shards);
    let slow = Behaviour {
        slow_shard: Some((SLOW_SHARD, batch)),
        ..Behaviour::default()
    };
    let a = fleet.start("w-a", slow, FailurePolicy::Retry);
    fleet.produce(8, 0, 10);
    sleep(settle).await;
    assert_eq!(fleet.consuming(a), shards);
    (fleet, a)
}

#[tokio::test(start_paused = true)]
async fn shutdown_and_wait_reports_drained_cut_off_and_released_shards() {
    // One shard's batches outlast the shutdown timeout (25 s): it is cut
    // off; the other three drain.
    let (mut fleet, a) = one_slow_shard(4, Duration::from_secs(600), TICK * 3).await;
    let (handle, task) = &mut fleet.workers[a];
    let report = handle.shutdown_and_wait().await;
    task.await.unwrap().unwrap();
    assert!(report.graceful);
    assert_eq!((report.drained, report.cut_off), (3, 1), "{report:?}");
    assert_eq!(
        (report.released, report.handed_off, report.release_failures),
        (4, 0, 0),
        "{report:?}"
    );
    // Every handle sees the same report, however late it asks.
    assert_eq!(handle.clone().stopped().await, report);
    assert!(
        fleet.store.snapshot().iter().all(|l| l.owner.is_none()),
        "every lease released"
    );
}

/// A shard whose processor finished draining has its lease released at
/// once, while a slower shard still drains: peers take it at their next
/// tick. Every lease used to wait for the slowest shard (up to the
/// shutdown timeout), and so did a handoff a peer asked for meanwhile.
#[tokio::test(start_paused = true)]
async fn a_drained_shards_lease_is_released_while_a_slower_shard_still_drains() {
    let (mut fleet, a) = one_slow_shard(4, Duration::from_secs(600), TICK * 3).await;
    let (handle, _) = &fleet.workers[a];
    handle.shutdown();
    sleep(Duration::from_secs(5)).await;
    let owners: BTreeMap<String, Option<String>> = fleet
        .store
        .snapshot()
        .into_iter()
        .map(|l| (l.shard_id, l.owner))
        .collect();
    for (shard, owner) in &owners {
        let draining = shard == SLOW_SHARD;
        assert_eq!(owner.is_some(), draining, "{shard}: {owners:?}");
    }
    let (handle, task) = &mut fleet.workers[a];
    let report = handle.stopped().await;
    task.await.unwrap().unwrap();
    assert_eq!(
        (report.drained, report.cut_off, report.released),
        (3, 1, 4),
        "{report:?}"
    );
}

/// Leases are let go beside each other as their shards drain, and beside
/// the wait for the rest: releases the table answers slowly delay neither
/// each other nor the cut at the shutdown timeout. Awaited one by one in
/// the drain's loop, 39 releases of 1.5 s (each within the store's call
/// timeout) held the cut back by a minute.
#[tokio::test(start_paused = true)]
async fn slow_releases_during_the_drain_delay_no_cut() {
    let (mut fleet, a) = one_slow_shard(40, Duration::from_secs(600), TICK * 3).await;
    // Records on every shard, the slow one's batch under way.
    fleet.produce(400, 100, 1);
    sleep(Duration::from_secs(2)).await;
    for lease in fleet.store.snapshot() {
        if lease.shard_id != SLOW_SHARD {
            let slow = Fault::Delay(Duration::from_millis(1500));
            fleet.stores[a].inject_on(StoreOp::Release, &lease.key, slow);
        }
    }
    let started = Instant::now();
    let (handle, task) = &mut fleet.workers[a];
    let report = handle.shutdown_and_wait().await;
    task.await.unwrap().unwrap();
    let took = started.elapsed();
    assert_eq!(
        (report.drained, report.cut_off, report.released),
        (39, 1, 40),
        "{report:?}"
    );
    // The cut at 25 s, 2 s of grace, then the last release.
    assert!(took < Duration::from_secs(35), "{took:?}");
}

/// A shard whose lease a peer takes while it drains counts as lost, not
/// drained: its checkpoints are refused, and the peer resumes from the
/// last one written. Every consumer that ended in the drain counted as
/// drained.
#[tokio::test(start_paused = true)]
async fn a_lease_lost_while_draining_is_reported_lost_not_drained() {
    let (mut fleet, a) = one_slow_shard(4, Duration::from_secs(15), TICK * 6).await;
    // A batch of the slow shard under way.
    fleet.produce(8, 10, 10);
    sleep(Duration::from_secs(2)).await;
    fleet.workers[a].0.shutdown();
    steal_for(&fleet.store, SLOW_SHARD, "ghost");
    let (handle, task) = &mut fleet.workers[a];
    let report = handle.stopped().await;
    task.await.unwrap().unwrap();
    assert_eq!(
        (report.drained, report.lost, report.cut_off),
        (3, 1, 0),
        "{report:?}"
    );
    assert_eq!(
        (report.released, report.release_failures),
        (3, 0),
        "{report:?}"
    );
}

/// A shutdown asked for while the lease taker's pass takes thousands of
/// leases completes, and releases them all: the pass reports each take on
/// the worker's event channel, which the worker reads until the
/// coordinator has stopped. Before, the worker stopped reading once its
/// consumers drained; the pass filled the channel (1,024 events), waited
/// on it for good, and so did the shutdown.
#[tokio::test(start_paused = true)]
async fn a_shutdown_during_a_pass_taking_thousands_of_leases_completes() {
    use kcl_core::store::memory::RandomFaults;
    const SHARDS: usize = 2_000;
    let source = InMemoryShardSource::new();
    let shards = source.create_stream(STREAM, SHARDS);
    let table = InMemoryLeaseStore::new();
    for shard in &shards {
        let lease = LeaseLayout::SingleStream.new_lease(shard, Checkpoint::TrimHorizon);
        table.create_if_absent(&lease).await.unwrap();
    }
    // Each call up to 50 ms: the pass takes seconds.
    let slow = table.handle();
    slow.set_random_faults(Some(RandomFaults {
        seed: 7,
        error_rate: 0.0,
        lost_response_rate: 0.0,
        max_latency: Duration::from_millis(50),
    }));
    let lease = LeaseConfig::builder("w").seed(3).build().unwrap();
    let config = fleet::one_stream(lease, STREAM).build().unwrap();
    let seen = fleet::Seen::default();
    let (handle, task) = fleet::spawn_worker(
        config,
        Arc::new(slow),
        Arc::new(source),
        fleet::Payloads::factory(&seen),
    );
    let owned = || {
        table
            .snapshot()
            .iter()
            .filter(|l| l.owner.is_some())
            .count()
    };
    while owned() < 50 {
        sleep(Duration::from_millis(10)).await;
    }
    assert!(owned() < SHARDS / 2, "the pass is under way");
    handle.shutdown();
    let stopped = tokio::time::timeout(Duration::from_secs(3600), task).await;
    stopped
        .expect("the shutdown never completed")
        .unwrap()
        .unwrap();
    assert_eq!(owned(), 0, "every lease taken was released");
}

/// Lists `specs` once; at its next call shuts the worker down and lists
/// none, so that the round removes every stream while the worker stops.
#[derive(Debug)]
struct RemovesAllAtShutdown {
    specs: Vec<StreamSpec>,
    handle: std::sync::OnceLock<kcl_core::worker::WorkerHandle>,
    calls: AtomicU32,
}

#[async_trait]
impl kcl_core::worker::StreamTracker for RemovesAllAtShutdown {
    async fn streams(&self) -> Result<Vec<StreamSpec>, kcl_core::source::SourceError> {
        if self.calls.fetch_add(1, Ordering::Relaxed) == 0 {
            return Ok(self.specs.clone());
        }
        self.handle.get().unwrap().shutdown();
        Ok(Vec::new())
    }
}

/// A shutdown whose last sync round removes more streams than the channel
/// to the run loop holds (64) completes: the run loop reads it no more,
/// and the sends that found no room waited for good, and the shutdown
/// with them.
#[tokio::test(start_paused = true)]
async fn a_shutdown_while_a_round_removes_a_hundred_streams_completes() {
    let source = InMemoryShardSource::new();
    let specs: Vec<StreamSpec> = (0..100).map(|i| multi(&format!("s{i}"))).collect();
    for spec in &specs {
        source.create_stream(&spec.name, 1);
    }
    let lease = LeaseConfig::builder("w").seed(3).build().unwrap();
    let mut config = WorkerConfig::builder(lease).shard_sync_interval(Duration::from_secs(5));
    for spec in &specs {
        config = config.stream(spec.clone());
    }
    let tracker = Arc::new(RemovesAllAtShutdown {
        specs,
        handle: std::sync::OnceLock::new(),
        calls: AtomicU32::new(0),
    });
    let seen = fleet::Seen::default();
    let worker = Worker::new(
        config.build().unwrap(),
        Arc::new(InMemoryLeaseStore::new()),
        Arc::new(source),
        Arc::new(fleet::Payloads::factory(&seen)),
    )
    .with_stream_tracker(Arc::clone(&tracker) as Arc<dyn kcl_core::worker::StreamTracker>);
    tracker.handle.set(worker.handle()).unwrap();
    let task = tokio::spawn(worker.run());
    let stopped = tokio::time::timeout(Duration::from_secs(3600), task).await;
    stopped
        .expect("the shutdown never completed")
        .unwrap()
        .unwrap();
    assert!(tracker.calls.load(Ordering::Relaxed) >= 2);
}

/// A removed stream's lease whose release failed is released again after
/// the taker's next scan, and then deleted when due. Before, the taker
/// reclaimed only leases it may take: the lease, naming this worker,
/// which beats, was held and read by nobody for as long as the worker ran,
/// and held its stream's deletion back.
#[tokio::test(start_paused = true)]
async fn a_removed_streams_lease_whose_release_failed_is_released_again() {
    use kcl_core::store::StoreErrorKind;
    use kcl_core::store::memory::Fault;
    let (source, b) = streams_a_and_b();
    let t = start_tracked(&source);
    sleep(TICK * 2).await;
    t.tracker.0.lock().unwrap().push(multi("b"));
    let key = multi("b").layout.new_lease(&b, Checkpoint::TrimHorizon).key;
    let owner = async || t.store.get(&key).await.unwrap().and_then(|l| l.owner);
    while owner().await.is_none() {
        sleep(Duration::from_millis(100)).await;
    }
    t.store
        .inject(StoreOp::Release, Fault::Error(StoreErrorKind::Retryable));
    t.tracker.0.lock().unwrap().retain(|spec| spec.name == "a");
    sleep(Duration::from_secs(60)).await;
    assert_eq!(
        owner().await,
        None,
        "still held by the worker that let it go"
    );
    sleep(Duration::from_secs(30)).await;
    assert!(
        t.store.get(&key).await.unwrap().is_none(),
        "deleted once due"
    );
    t.stop().await;
}

/// A stream of one shard holding one record, a fleet with no worker yet
/// and the table handle of its first worker.
fn one_record_stream() -> (
    InMemoryShardSource,
    String,
    fleet::Fleet,
    InMemoryLeaseStore,
) {
    let source = InMemoryShardSource::new();
    let shard = source.create_stream(STREAM, 1).remove(0);
    source.put(STREAM, "pk", "r0").unwrap();
    let mut fleet = fleet::Fleet::new();
    let store = fleet.table_for_worker();
    (source, shard, fleet, store)
}

/// A processor whose every call waits for good, and which notes, when the
/// call is dropped, who the table says holds its lease.
struct Hangs {
    store: InMemoryLeaseStore,
    entered: Arc<tokio::sync::Notify>,
    owner_when_dropped: Arc<Mutex<Vec<Option<String>>>>,
}

/// Notes the lease's owner in the table when a call ends.
struct OwnerAtDrop {
    store: InMemoryLeaseStore,
    owners: Arc<Mutex<Vec<Option<String>>>>,
}

impl Drop for OwnerAtDrop {
    fn drop(&mut self) {
        let owner = self.store.snapshot().pop().and_then(|l| l.owner);
        self.owners.lock().unwrap().push(owner);
    }
}

/// Who the table said held the lease as each hung call was dropped.
type OwnersAtDrop = Arc<Mutex<Vec<Option<String>>>>;

impl Hangs {
    /// A factory of [`Hangs`] over `store`, the notice of a call entered,
    /// and the owners noted as calls were dropped.
    fn factory(
        store: &InMemoryLeaseStore,
    ) -> (
        impl Fn(&ShardContext) -> Hangs + Send + Sync + 'static,
        Arc<tokio::sync::Notify>,
        OwnersAtDrop,
    ) {
        let entered = Arc::new(tokio::sync::Notify::new());
        let owners = OwnersAtDrop::default();
        let factory = {
            let (store, entered, owners) =
                (store.clone(), Arc::clone(&entered), Arc::clone(&owners));
            move |_: &ShardContext| Hangs {
                store: store.clone(),
                entered: Arc::clone(&entered),
                owner_when_dropped: Arc::clone(&owners),
            }
        };
        (factory, entered, owners)
    }
}

#[async_trait]
impl RecordProcessor for Hangs {
    async fn process_records(
        &mut self,
        _: &RecordBatch,
        _: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let _noted = OwnerAtDrop {
            store: self.store.clone(),
            owners: Arc::clone(&self.owner_when_dropped),
        };
        self.entered.notify_one();
        std::future::pending().await
    }
}

/// A worker dropped while a processor call runs (its run task aborted on a
/// multi-threaded runtime) releases the lease only once the call has
/// ended: released first, a peer took the shard while the call still ran.
/// One worker thread is the hardest case: the aborted consumer task is
/// dropped by the thread the drop itself runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_dropped_worker_releases_a_lease_only_after_its_processor_call_ended() {
    let (source, _, mut fleet, store) = one_record_stream();
    let (factory, entered, owners) = Hangs::factory(&fleet.store);
    let lease = LeaseConfig::builder("w-a")
        .release_on_drop(true)
        .build()
        .unwrap();
    let config = fleet::one_stream(lease, STREAM)
        .initial_position(InitialPosition::TrimHorizon)
        .build()
        .unwrap();
    fleet.run_worker(config, Arc::new(store), Arc::new(source), factory);
    entered.notified().await;
    fleet.kill(0).await;
    let released = fleet.store.snapshot().pop().unwrap();
    assert_eq!(released.owner, None, "released on drop: {released:?}");
    assert_eq!(
        *owners.lock().unwrap(),
        [Some("w-a".to_owned())],
        "the call ended while the lease was still held"
    );
}

/// The owner of the only lease in `fleet`'s table.
fn owner(fleet: &fleet::Fleet) -> Option<String> {
    fleet.owners().into_values().next().flatten()
}

/// Ends the tenure of w-a's hung consumer of `shard` (a ghost takes the
/// lease and never renews it), waits until w-a takes the lease back, and
/// a second more: its new consumer waits for the hung one's slot.
async fn taken_back_beside_the_hung_call(fleet: &fleet::Fleet, shard: &str) {
    steal_for(&fleet.store, shard, "ghost-1");
    fleet::wait_until(
        Duration::from_secs(120),
        Duration::from_millis(100),
        || owner(fleet).as_deref() == Some("w-a"),
        || format!("not taken back: {:?}", owner(fleet)),
    )
    .await;
    sleep(Duration::from_secs(1)).await;
}

/// One worker (renewing per lease) on one shard whose first call hangs,
/// its lease then taken back beside the hung call (see
/// [`taken_back_beside_the_hung_call`]): the fleet, the shard, and the
/// owners noted as hung calls were dropped.
async fn hung_then_taken_back() -> (fleet::Fleet, String, OwnersAtDrop) {
    let (source, shard, mut fleet, store) = one_record_stream();
    let (factory, entered, owners) = Hangs::factory(&fleet.store);
    let lease = LeaseConfig::builder("w-a")
        .renewal(kcl_core::config::LeaseRenewal::PerLease)
        .build()
        .unwrap();
    let config = fleet::one_stream(lease, STREAM).build().unwrap();
    fleet.run_worker(config, Arc::new(store), Arc::new(source), factory);
    entered.notified().await;
    taken_back_beside_the_hung_call(&fleet, &shard).await;
    (fleet, shard, owners)
}

/// A shard counts once in the shutdown report: here the newer tenure's
/// consumer ends at the shutdown (drained), its lease is then lost during
/// the drain, and the older consumer's hung call is cut at the timeout.
/// That older consumer, no longer superseded by a held tenure, was counted
/// again (cut off).
#[tokio::test(start_paused = true)]
async fn a_shard_whose_consumers_end_apart_counts_once_in_the_report() {
    let (mut fleet, shard, _) = hung_then_taken_back().await;
    let (handle, task) = fleet.workers.pop().unwrap();
    handle.shutdown();
    sleep(Duration::from_secs(1)).await;
    steal_for(&fleet.store, &shard, "ghost-2");
    let report = handle.stopped().await;
    task.await.unwrap().unwrap();
    assert_eq!(
        (report.drained, report.cut_off, report.lost),
        (1, 0, 0),
        "{report:?}"
    );
}

/// A shutdown lets a lease go only once every consumer of it ended: with
/// an older tenure's call still hung (its tenure ended, the lease taken
/// back, the newer consumer waiting for the shard's slot), the newer
/// consumer's end at the shutdown used to release the lease at once, and a
/// peer could take the shard beside the hung call. The call is cut at the
/// shutdown timeout, and the lease released after.
#[tokio::test(start_paused = true)]
async fn a_shutdown_frees_a_lease_only_once_an_older_consumers_hung_call_ended() {
    let (mut fleet, _, owners) = hung_then_taken_back().await;
    let (handle, task) = fleet.workers.pop().unwrap();
    let report = handle.shutdown_and_wait().await;
    task.await.unwrap().unwrap();
    assert_eq!(
        *owners.lock().unwrap(),
        [Some("w-a".to_owned())],
        "the hung call ended while the lease was still held"
    );
    assert_eq!(owner(&fleet), None, "released after: {report:?}");
    assert_eq!((report.drained, report.released), (1, 1), "{report:?}");
}

/// The first processor hangs (a [`Hangs`]), every later one fails each
/// batch.
struct FirstHangs<F> {
    hangs: F,
    made: AtomicU32,
}

/// Fails every batch.
struct Fails;

#[async_trait]
impl RecordProcessor for Fails {
    async fn process_records(
        &mut self,
        _: &RecordBatch,
        _: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        Err("injected processor failure".into())
    }
}

impl<F: Fn(&ShardContext) -> Hangs + Send + Sync + 'static> kcl_core::processor::ProcessorFactory
    for FirstHangs<F>
{
    fn create(&self, ctx: &ShardContext) -> Box<dyn RecordProcessor> {
        if self.made.fetch_add(1, Ordering::SeqCst) == 0 {
            Box::new((self.hangs)(ctx))
        } else {
            Box::new(Fails)
        }
    }
}

/// A consumer that gave up waiting for an older consumer's hung call and
/// ran beside it lets its lease go as it ends (here given back by the
/// `ReleaseShard` policy): put off until the hung call ended, the lease
/// stood held and read by nobody for as long as that call hung.
#[tokio::test(start_paused = true)]
async fn a_consumer_that_ran_beside_a_hung_one_lets_its_lease_go_as_it_ends() {
    let (source, shard, mut fleet, store) = one_record_stream();
    let (hangs, entered, owners) = Hangs::factory(&fleet.store);
    let factory = FirstHangs {
        hangs,
        made: AtomicU32::new(0),
    };
    let lease = LeaseConfig::builder("w-a")
        .renewal(kcl_core::config::LeaseRenewal::PerLease)
        .build()
        .unwrap();
    let config = fleet::one_stream(lease, STREAM)
        .failure_policy(FailurePolicy::ReleaseShard)
        .build()
        .unwrap();
    fleet.run_worker(config, Arc::new(store), Arc::new(source), factory);
    entered.notified().await;
    taken_back_beside_the_hung_call(&fleet, &shard).await;
    let released = || {
        let changes = fleet.store.owner_changes();
        changes
            .iter()
            .any(|c| c.from.as_deref() == Some("w-a") && c.to.is_none())
    };
    fleet::wait_until(
        Duration::from_secs(120),
        Duration::from_millis(100),
        released,
        || format!("never released: {:?}", fleet.store.owner_changes()),
    )
    .await;
    assert!(
        owners.lock().unwrap().is_empty(),
        "the first call still hangs"
    );
    for (_, task) in fleet.workers.drain(..) {
        task.abort();
    }
}

/// A source whose shard ends name no children, as when ListShards does not
/// show a split's children yet.
#[derive(Debug)]
struct ChildrenUnlisted(InMemoryShardSource);

/// A reader of [`ChildrenUnlisted`].
#[derive(Debug)]
struct EndWithoutChildren(Box<dyn kcl_core::source::ShardReader>);

#[async_trait]
impl kcl_core::source::ShardReader for EndWithoutChildren {
    async fn next_batch(
        &mut self,
    ) -> Result<kcl_core::source::Batch, kcl_core::source::SourceError> {
        let mut batch = self.0.next_batch().await?;
        if batch.shard_end.is_some() {
            batch.shard_end = Some(Vec::new());
        }
        Ok(batch)
    }
}

#[async_trait]
impl kcl_core::source::ShardSource for ChildrenUnlisted {
    async fn list_shards(
        &self,
        stream: &str,
    ) -> Result<Vec<kcl_core::source::ShardInfo>, kcl_core::source::SourceError> {
        self.0.list_shards(stream).await
    }

    async fn open(
        &self,
        request: kcl_core::source::OpenShard,
    ) -> Result<Box<dyn kcl_core::source::ShardReader>, kcl_core::source::SourceError> {
        Ok(Box::new(EndWithoutChildren(self.0.open(request).await?)))
    }
}

/// A shard that ends without naming its children (the listing did not show
/// them yet) asks for a shard sync at once: the children are leased and
/// read then, not at the next periodic sync (an hour here).
#[tokio::test(start_paused = true)]
async fn a_shard_ending_without_its_children_named_syncs_at_once() {
    let source = InMemoryShardSource::new();
    let parent = source.create_stream(STREAM, 1).remove(0);
    source.put(STREAM, "pk", "before").unwrap();
    let mut fleet = fleet::Fleet::new();
    let store = fleet.table_for_worker();
    let seen = fleet::Seen::default();
    let lease = LeaseConfig::builder("w-a")
        .taker_interval(TICK)
        .build()
        .unwrap();
    let config = fleet::one_stream(lease, STREAM)
        .shard_sync_interval(Duration::from_secs(3600))
        .parent_poll_interval(Duration::from_secs(1))
        .build()
        .unwrap();
    let wrapped = Arc::new(ChildrenUnlisted(source.clone()));
    fleet.run_worker(
        config,
        Arc::new(store),
        wrapped,
        fleet::Payloads::factory(&seen),
    );
    fleet::wait_for_records(Duration::from_secs(60), Duration::from_secs(1), 1, || {
        seen.lock().unwrap().len()
    })
    .await;
    source.split(STREAM, &parent).unwrap();
    source.put(STREAM, "pk", "after").unwrap();
    fleet::wait_for_records(Duration::from_secs(600), Duration::from_secs(1), 2, || {
        seen.lock().unwrap().len()
    })
    .await;
    let payloads: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, p)| p.clone())
        .collect();
    assert_eq!(payloads, ["before", "after"]);
    fleet.stop_all().await;
}

/// Panics in its first call, after which it processes.
struct PanicsOnce(Arc<AtomicBool>);

#[async_trait]
impl RecordProcessor for PanicsOnce {
    async fn process_records(
        &mut self,
        _: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        if !self.0.swap(true, Ordering::SeqCst) {
            panic!("injected processor panic");
        }
        cp.checkpoint().await?;
        Ok(())
    }
}

/// A processor's panic leaves none of its shard's gauges at their last
/// values: the records it was given stood "waiting" for a shard this
/// worker no longer read (and in CloudWatch, which forgets a series only at
/// 0, for good).
#[tokio::test(start_paused = true)]
async fn a_panicking_processor_leaves_its_shards_gauges_at_zero() {
    let recorded = kcl_core::test_util::metrics::Recorded::new();
    let _local = metrics::set_default_local_recorder(&recorded);
    let (source, shard, mut fleet, store) = one_record_stream();
    let panicked = Arc::new(AtomicBool::new(false));
    let lease = LeaseConfig::builder("w-a")
        .taker_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let config = fleet::one_stream(lease, STREAM).build().unwrap();
    let factory = {
        let panicked = Arc::clone(&panicked);
        move |_: &ShardContext| PanicsOnce(Arc::clone(&panicked))
    };
    fleet.run_worker(config, Arc::new(store), Arc::new(source), factory);
    let waiting = || {
        recorded.gauge(
            kcl_core::metric_names::SHARD_RECORDS_WAITING,
            &[("shard", shard.as_str())],
        )
    };
    fleet::wait_until(
        Duration::from_secs(30),
        Duration::from_millis(10),
        || panicked.load(Ordering::SeqCst),
        || "the processor was never called".into(),
    )
    .await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(
        fleet.workers[0].0.status().consuming.len(),
        0,
        "not retaken yet"
    );
    assert_eq!(waiting(), Some(0.0));
    fleet.stop_all().await;
}

/// An application's observer that panics when the lease taker ticks once
/// it has taken a lease.
#[derive(Debug, Default)]
struct PanicsOnTick {
    acquired: AtomicBool,
}

impl kcl_core::observe::Observer for PanicsOnTick {
    fn observe(&self, _: &str, event: &kcl_core::observe::Event<'_>) {
        use kcl_core::observe::Event;
        match event {
            Event::Acquired { .. } => self.acquired.store(true, Ordering::SeqCst),
            Event::Tick if self.acquired.load(Ordering::SeqCst) => {
                panic!("injected observer panic")
            }
            _ => {}
        }
    }
}

/// A panic in one of the worker's own tasks (here the lease taker, through
/// the application's observer) stops the worker with an error naming the
/// task, its leases released: the task ended in silence and the worker ran
/// on taking no lease, its run never ending.
#[tokio::test(start_paused = true)]
async fn a_panic_in_a_task_of_the_worker_stops_it_with_an_error() {
    let source = InMemoryShardSource::new();
    source.create_stream(STREAM, 2);
    let store = InMemoryLeaseStore::new();
    let lease = LeaseConfig::builder("w-a")
        .taker_interval(TICK)
        .build()
        .unwrap();
    let config = fleet::one_stream(lease, STREAM).build().unwrap();
    let seen = fleet::Seen::default();
    let worker = Worker::new(
        config,
        Arc::new(store.clone()),
        Arc::new(source),
        Arc::new(fleet::Payloads::factory(&seen)),
    )
    .with_observer(Arc::new(PanicsOnTick::default()));
    let handle = worker.handle();
    let run = tokio::time::timeout(Duration::from_secs(3600), worker.run())
        .await
        .expect("the worker stops");
    assert!(
        matches!(
            run,
            Err(WorkerError::TaskFailed {
                task: "lease taker"
            })
        ),
        "{run:?}"
    );
    let leases = store.snapshot();
    assert!(
        leases.iter().all(|l| l.counter > 1),
        "taken first: {leases:?}"
    );
    assert!(
        leases.iter().all(|l| l.owner.is_none()),
        "then released: {leases:?}"
    );
    // The report tells what the shutdown still did, not graceful; it
    // was the default one, as if nothing had been drained or released.
    let report = handle.stopped().await;
    assert!(!report.graceful, "{report:?}");
    assert_eq!((report.drained, report.released), (2, 2), "{report:?}");
}

/// The lease of `key` taken from under its holder by `ghost`, a worker
/// that never renews: the holder's next renewal fails, and the lease
/// expires a lease duration later.
fn steal_for(store: &InMemoryLeaseStore, key: &str, ghost: &str) {
    let mut lease = store.snapshot().into_iter().find(|l| l.key == key).unwrap();
    lease.owner = Some(ghost.into());
    lease.tenure = None;
    lease.counter += 1;
    store.put_raw(lease);
}

/// A consumer that gives up waiting for its shard's slot (its lease ended
/// while the previous consumer's call still hung) leaves the shard's gauges
/// alone: they are the hung consumer's, whose records waiting are what a
/// hung call shows by. It zeroed them.
#[tokio::test(start_paused = true)]
async fn a_consumer_that_gives_up_waiting_for_its_slot_leaves_the_gauges_alone() {
    let recorded = kcl_core::test_util::metrics::Recorded::new();
    let _local = metrics::set_default_local_recorder(&recorded);
    let (source, shard, mut fleet, store) = one_record_stream();
    let entered = Arc::new(tokio::sync::Notify::new());
    let factory = {
        let (store, entered) = (fleet.store.clone(), Arc::clone(&entered));
        move |_: &ShardContext| Hangs {
            store: store.clone(),
            entered: Arc::clone(&entered),
            owner_when_dropped: Arc::default(),
        }
    };
    let lease = LeaseConfig::builder("w-a")
        .renewal(kcl_core::config::LeaseRenewal::PerLease)
        .build()
        .unwrap();
    let config = fleet::one_stream(lease, STREAM).build().unwrap();
    fleet.run_worker(config, Arc::new(store), Arc::new(source), factory);
    entered.notified().await;
    let waiting = || {
        recorded.gauge(
            kcl_core::metric_names::SHARD_RECORDS_WAITING,
            &[("shard", shard.as_str())],
        )
    };
    assert_eq!(waiting(), Some(1.0), "the hung call's record waits");
    // The hung consumer's tenure ends; the worker takes the lease again
    // once it expires, and its new consumer waits for the hung one's slot.
    taken_back_beside_the_hung_call(&fleet, &shard).await;
    // Its lease ends too while it waits: it gives up.
    steal_for(&fleet.store, &shard, "ghost-2");
    sleep(Duration::from_secs(10)).await;
    assert_eq!(waiting(), Some(1.0), "the hung call's record still waits");
    for (_, task) in fleet.workers.drain(..) {
        task.abort();
    }
}
