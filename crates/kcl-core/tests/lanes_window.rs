//! The lanes' watermark window at its edges, on whole workers over the
//! in-memory store and source under a paused clock: a shard's end waits
//! for every lane to checkpoint its last record (so its children start
//! after the last flush), a lane that holds its records stops the shard's
//! fetching at the window's bound instead of growing it, and a lane that
//! flushes on a timer checked in `process_records` gets empty batches
//! while it holds a full window, so the shard is never frozen.
#![allow(clippy::unwrap_used)]

// Only the processors' shared pieces, not the coordinator simulation of
// `common`, which this binary does not use.
#[allow(dead_code, unreachable_pub)]
#[path = "common/processing.rs"]
mod processing;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use kcl_core::checkpointer::{Checkpointer, MAX_LANE_RECORDS_IN_FLIGHT};
use kcl_core::processor::{
    FailurePolicy, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
};
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::test_util::fleet;
use kcl_core::worker::{WorkerError, WorkerHandle};
use kcl_core::{Checkpoint, LeaseConfig, Record};
use processing::{Processed, STREAM};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

/// What the processors did.
#[derive(Default)]
struct Log {
    processed: Processed,
    /// Records handed to any processor.
    delivered: AtomicU64,
    /// Checkpoints a processor was refused.
    refused: AtomicU64,
    /// Empty batches handed to any processor.
    empty_batches: AtomicU64,
}

/// How a worker's processors treat their records.
#[derive(Clone, Copy)]
enum Mode {
    /// Records of `shard` are held in memory and flushed in `shard_ended`,
    /// `chunk` at a time, each chunk written (a second's work) and then
    /// checkpointed; other shards' records are written at once.
    FlushAtShardEnd { chunk: usize },
    /// The lane of the shard's first record (`pk-0:0`) holds everything it
    /// gets and checkpoints only in `shutdown_requested`; the other lanes
    /// checkpoint every batch.
    OneLaneHolds,
    /// Every lane checkpoints every batch.
    CheckpointEachBatch,
    /// Every lane buffers its records and writes and checkpoints them only
    /// in a call that comes at least `every` after its last flush (or its
    /// creation), as a sink batching its writes to S3 does.
    FlushOnTimer { every: Duration },
}

struct Lane {
    log: Arc<Log>,
    mode: Mode,
    /// The shard whose records are held (FlushAtShardEnd).
    held_shard: String,
    ctx: ShardContext,
    buffer: Vec<Record>,
    holds: bool,
    last_flush: Instant,
}

fn parse(record: &Record) -> (String, u64) {
    fleet::parse(&record.data)
}

/// The shard's first record in [`Mode::OneLaneHolds`].
fn first_record() -> (String, u64) {
    ("pk-0".to_owned(), 0)
}

impl Lane {
    fn write(&self, records: &[Record]) {
        self.log.processed.extend(records.iter().map(parse));
    }

    async fn checkpoint_record(
        &self,
        cp: &mut Checkpointer,
        record: &Record,
    ) -> Result<(), ProcessorError> {
        if let Err(e) = cp.checkpoint_record(record).await {
            self.log.refused.fetch_add(1, Ordering::SeqCst);
            return Err(e.into());
        }
        Ok(())
    }
}

impl Lane {
    async fn flush_if_due(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
        every: Duration,
    ) -> Result<(), ProcessorError> {
        self.buffer.extend(batch.records.iter().cloned());
        if self.last_flush.elapsed() < every {
            return Ok(());
        }
        let held = std::mem::take(&mut self.buffer);
        self.write(&held);
        cp.checkpoint().await?;
        self.last_flush = Instant::now();
        Ok(())
    }
}

#[async_trait]
impl RecordProcessor for Lane {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        self.log
            .delivered
            .fetch_add(batch.records.len() as u64, Ordering::SeqCst);
        if batch.records.is_empty() {
            self.log.empty_batches.fetch_add(1, Ordering::SeqCst);
        }
        match self.mode {
            Mode::FlushOnTimer { every } => return self.flush_if_due(batch, cp, every).await,
            Mode::FlushAtShardEnd { .. } if self.ctx.shard_id == self.held_shard => {
                self.buffer.extend(batch.records.iter().cloned());
                return Ok(());
            }
            Mode::OneLaneHolds if batch.records.iter().any(|r| parse(r) == first_record()) => {
                self.holds = true;
            }
            _ => {}
        }
        self.write(&batch.records);
        if !self.holds {
            cp.checkpoint().await?;
        }
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        let held = std::mem::take(&mut self.buffer);
        self.write(&held);
        cp.checkpoint().await?;
        Ok(())
    }

    async fn shard_ended(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        let chunk = match self.mode {
            Mode::FlushAtShardEnd { chunk } => chunk,
            _ => usize::MAX,
        };
        while !self.buffer.is_empty() {
            let part: Vec<Record> = self.buffer.drain(..chunk.min(self.buffer.len())).collect();
            sleep(Duration::from_secs(1)).await;
            self.write(&part);
            if let Some(last) = part.last() {
                self.checkpoint_record(cp, last).await?;
            }
        }
        cp.checkpoint().await?;
        Ok(())
    }
}

struct Fleet {
    store: InMemoryLeaseStore,
    source: InMemoryShardSource,
    shard: String,
    log: Arc<Log>,
}

impl Fleet {
    fn new(batch: usize) -> Self {
        let source = InMemoryShardSource::new().with_max_records(batch);
        let shard = source.create_stream(STREAM, 1).remove(0);
        Fleet {
            store: InMemoryLeaseStore::new(),
            source,
            shard,
            log: Arc::default(),
        }
    }

    fn start(
        &self,
        id: &str,
        lanes: usize,
        mode: Mode,
    ) -> (WorkerHandle, JoinHandle<Result<(), WorkerError>>) {
        let lease = LeaseConfig::builder(id)
            .taker_interval(Duration::from_secs(5))
            .build()
            .unwrap();
        let config = fleet::one_stream(lease, STREAM)
            .failure_policy(FailurePolicy::Retry)
            .parallelism_per_shard(lanes)
            .max_backoff(Duration::from_secs(1))
            .parent_poll_interval(Duration::from_millis(100))
            .build()
            .unwrap();
        let (log, held_shard) = (Arc::clone(&self.log), self.shard.clone());
        let factory = move |ctx: &ShardContext| Lane {
            log: Arc::clone(&log),
            mode,
            held_shard: held_shard.clone(),
            ctx: ctx.clone(),
            buffer: Vec::new(),
            holds: false,
            last_flush: Instant::now(),
        };
        fleet::spawn_worker(
            config,
            Arc::new(self.store.handle()),
            Arc::new(self.source.clone()),
            factory,
        )
    }

    /// Records `from..from + per_key` of keys `pk-0..pk-{keys - 1}`, key by
    /// key in each round; the sequence number of the last.
    fn produce(&self, keys: usize, from: u64, per_key: u64) -> Option<String> {
        let mut last = None;
        for n in from..from + per_key {
            for k in 0..keys {
                let pk = format!("pk-{k}");
                last = Some(self.source.put(STREAM, &pk, format!("{pk}:{n}")).unwrap().1);
            }
        }
        last
    }

    /// Waits until the shard's checkpoint in the lease table is `seq`.
    async fn wait_checkpoint(&self, seq: &str) {
        let want = Checkpoint::at(seq.to_owned(), 0);
        let started = Instant::now();
        loop {
            let now = self.store.snapshot().remove(0).checkpoint;
            if now == want {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "the checkpoint stays at {now:?}, not at the last record {seq}"
            );
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `count` records were handed to processors.
    async fn wait_delivered(&self, count: u64) {
        fleet::wait_until(
            Duration::from_secs(600),
            Duration::from_millis(100),
            || delivered(&self.log) >= count,
            || format!("only {} of {count} records delivered", delivered(&self.log)),
        )
        .await;
    }

    /// Waits until `count` records were written.
    async fn wait_written(&self, count: usize) {
        fleet::wait_until(
            Duration::from_secs(600),
            Duration::from_millis(100),
            || written(&self.log) >= count as u64,
            || format!("only {} of {count} records written", written(&self.log)),
        )
        .await;
    }

    /// Waits until `count` (records delivered, or written) stays the same
    /// for a minute, and returns it.
    async fn wait_until_still(&self, count: impl Fn(&Log) -> u64) -> u64 {
        let mut last = u64::MAX;
        loop {
            sleep(Duration::from_secs(60)).await;
            let now = count(&self.log);
            if now == last {
                return now;
            }
            last = now;
        }
    }
}

fn delivered(log: &Log) -> u64 {
    log.delivered.load(Ordering::SeqCst)
}

fn written(log: &Log) -> u64 {
    log.processed.count() as u64
}

async fn stop(worker: (WorkerHandle, JoinHandle<Result<(), WorkerError>>)) {
    worker.0.shutdown();
    worker.1.await.unwrap().unwrap();
}

/// Each key's records were written exactly once, in order, `0..per_key`.
fn assert_each_key_in_order(log: &Log, keys: usize, per_key: u64) {
    let by_key = log.processed.by_key();
    let expected: Vec<u64> = (0..per_key).collect();
    for k in 0..keys {
        let pk = format!("pk-{k}");
        assert_eq!(
            by_key.get(&pk).cloned().unwrap_or_default(),
            expected,
            "{pk}: records lost, repeated or out of order"
        );
    }
}

/// Lanes that hold a shard's records and flush them chunk by chunk in
/// `shard_ended`: the children start only after every chunk of every lane
/// was written, so each key's records stay in order across the split, and
/// no chunk's checkpoint is refused.
#[tokio::test(start_paused = true)]
async fn children_start_only_after_every_lane_flushed_its_last_chunk() {
    let fleet = Fleet::new(100);
    fleet.produce(8, 0, 5);
    let worker = fleet.start("w-a", 4, Mode::FlushAtShardEnd { chunk: 2 });
    fleet.wait_delivered(8 * 5).await;
    fleet.source.split(STREAM, &fleet.shard).unwrap();
    fleet.produce(8, 5, 5);
    fleet.wait_until_still(written).await;
    stop(worker).await;
    assert_each_key_in_order(&fleet.log, 8, 10);
    assert_eq!(fleet.log.refused.load(Ordering::SeqCst), 0);
}

/// Records per batch in the tests of the window's bound: a few batches
/// fill it.
const BATCH: usize = 3_000;
/// Keys those tests' records are spread over.
const KEYS: usize = 64;

/// A fleet whose shard holds `batches` batches more than the window's
/// bound, spread evenly over `KEYS` keys; returns it with the records put
/// per key.
fn past_the_window(batches: usize) -> (Fleet, u64) {
    let per_key = ((MAX_LANE_RECORDS_IN_FLIGHT + batches * BATCH) / KEYS) as u64;
    let fleet = Fleet::new(BATCH);
    fleet.produce(KEYS, 0, per_key);
    (fleet, per_key)
}

/// One lane that never checkpoints (until `shutdown_requested`) holds the
/// watermark at the shard's first record: the consumer stops fetching
/// once the window holds `MAX_LANE_RECORDS_IN_FLIGHT` records, so it never
/// holds more than that and one batch, however many empty batches the
/// lane gets meanwhile. A shutdown then checkpoints
/// everything delivered, and the next owner goes on from there: nothing
/// lost, nothing repeated.
#[tokio::test(start_paused = true)]
async fn a_lane_that_never_checkpoints_stops_fetching_at_the_window_bound() {
    let (fleet, per_key) = past_the_window(4);
    let total = KEYS as u64 * per_key;
    let a = fleet.start("w-a", 4, Mode::OneLaneHolds);
    let stalled = fleet.wait_until_still(delivered).await;
    let bound = (MAX_LANE_RECORDS_IN_FLIGHT + BATCH - 1) as u64;
    assert!(
        (MAX_LANE_RECORDS_IN_FLIGHT as u64..=bound).contains(&stalled),
        "{stalled} of {total} records delivered before the fetching stopped; \
         expected {MAX_LANE_RECORDS_IN_FLIGHT}..={bound}"
    );
    assert!(
        fleet.log.empty_batches.load(Ordering::SeqCst) > 0,
        "the holding lane was called with empty batches, and still holds"
    );
    stop(a).await;
    let b = fleet.start("w-b", 4, Mode::CheckpointEachBatch);
    fleet.wait_written(total as usize).await;
    stop(b).await;
    assert_each_key_in_order(&fleet.log, KEYS, per_key);
}

/// Lanes that buffer their records and flush them only in a call at least
/// 10 s after their last flush, as a sink batching its writes does. The
/// window fills before any flush is due, and then no batch comes: every
/// lane is idle, and only a call can let one checkpoint. The lane holding
/// the oldest record gets empty batches until it flushes, the watermark
/// moves, and the worker fetches again. Every record is delivered and
/// written once, in order per key, and checkpointed; an empty batch
/// counts no record.
#[tokio::test(start_paused = true)]
async fn a_lane_that_flushes_on_a_timer_is_called_while_it_holds_a_full_window() {
    let (fleet, per_key) = past_the_window(2);
    let first = KEYS as u64 * per_key;
    let every = Duration::from_secs(10);
    let worker = fleet.start("w-a", 4, Mode::FlushOnTimer { every });
    // Past the window's bound: the fetching went on after the stall.
    fleet.wait_delivered(first).await;
    assert!(
        fleet.log.empty_batches.load(Ordering::SeqCst) > 0,
        "the window was passed without a stall"
    );
    // One more record of every key, after every lane's timer is due: each
    // lane gets a call and flushes what it holds.
    sleep(6 * every).await;
    let last = fleet.produce(KEYS, per_key, 1).unwrap();
    let total = first + KEYS as u64;
    fleet.wait_written(total as usize).await;
    fleet.wait_checkpoint(&last).await;
    stop(worker).await;
    assert_each_key_in_order(&fleet.log, KEYS, per_key + 1);
    assert_eq!(
        fleet.log.delivered.load(Ordering::SeqCst),
        total,
        "each record delivered once, empty batches counting none"
    );
    assert_eq!(fleet.log.refused.load(Ordering::SeqCst), 0);
}

/// A shard whose lanes' window is full while a lane holds its records
/// counts as stalled once nothing moved for the bound, even caught up
/// with the stream. Before, nothing waited by the progress registry's
/// measures (every batch delivered, no lag, no call running), so a
/// liveness check passed while the shard stood still for good.
#[tokio::test(start_paused = true)]
async fn a_shard_stopped_by_a_full_window_counts_as_stalled() {
    // Just past the window: the batch that fills it is the shard's last.
    let fleet = Fleet::new(BATCH);
    fleet.produce(KEYS, 0, (MAX_LANE_RECORDS_IN_FLIGHT / KEYS + 1) as u64);
    let a = fleet.start("w-a", 4, Mode::OneLaneHolds);
    fleet.wait_until_still(delivered).await;
    sleep(Duration::from_secs(120)).await;
    let shards = a.0.shards();
    let stalled = a.0.stalled(Duration::from_secs(60));
    assert_eq!(stalled.len(), 1, "{shards:?}");
    stop(a).await;
}
