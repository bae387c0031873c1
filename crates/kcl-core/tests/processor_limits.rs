//! Processor calls under time limits, on a whole worker over the in-memory
//! store and source under a paused clock: a call that never returns is
//! warned about once; with `processor_timeout` set, it is cancelled (its
//! future dropped while the lease is still held) and the shard given back,
//! to be read again from its last checkpoint; without one, it keeps its
//! lease. Each test installs its own log and metrics capture on its thread,
//! where the worker's tasks run.
#![allow(clippy::unwrap_used)]

// Every test of this binary captures its logs: tracing caches whether a
// log line is wanted across threads, and a thread with no subscriber
// would have another test's warning dropped.
mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::processing::{STREAM, Texts, take_one, until};
use common::{Lines, capture_warnings, single_stream_config};
use kcl_core::checkpointer::{CheckpointPolicy, Checkpointer};
use kcl_core::observe::{Event, Observer};
use kcl_core::processor::{
    InitializeInput, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
};
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::test_util::fleet;
use kcl_core::test_util::metrics::Recorded;
use kcl_core::worker::{Worker, WorkerConfigBuilder, WorkerHandle};
use kcl_core::{Checkpoint, EndReason, LeaseConfig};
use tokio::task::JoinHandle;
use tokio::time::sleep;

/// The record whose batch hangs.
const HANGS_ON: &str = "2";

/// The record whose batch blocks its thread.
const BLOCKS_ON: &str = "7";

/// How long a blocking call blocks its thread: past the shutdown timeout
/// (1 s in the test), the grace after the cut (2 s) and the wait for the
/// lease's last handle (2 s), with room for a slow machine.
const BLOCKS_FOR: Duration = Duration::from_secs(12);

/// Whether `batch` holds the record `data`.
fn holds(batch: &RecordBatch, data: &str) -> bool {
    batch
        .records
        .iter()
        .any(|r| r.data.as_ref() == data.as_bytes())
}

/// What the processors and the worker did.
#[derive(Default)]
struct Log {
    /// Records processed (their batch returned), in order.
    processed: Texts,
    initialized: AtomicU32,
    /// How many `initialize` calls still hang (none unless a test sets it).
    initialize_hangs: AtomicU32,
    /// How many `shard_ended` calls still hang.
    shard_ended_hangs: AtomicU32,
    /// How many `shutdown_requested` calls still hang.
    shutdown_hangs: AtomicU32,
    /// How many batches holding [`BLOCKS_ON`] still block their thread for
    /// [`BLOCKS_FOR`] (a synchronous call no cancellation reaches).
    blocks: AtomicU32,
    lease_lost: AtomicU32,
    shutdown_requested: AtomicU32,
    /// The hung call's drop, with the lease's owner then, and the lease's
    /// release, in the order they happened.
    events: Mutex<Vec<String>>,
}

impl Log {
    fn event(&self, what: String) {
        self.events.lock().unwrap().push(what);
    }
}

/// Dropped with the hung call's future: notes the lease's owner then.
struct DropGuard {
    log: Arc<Log>,
    store: InMemoryLeaseStore,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        let owner = self.store.snapshot()[0].owner.clone();
        self.log.event(format!("call dropped, owner {owner:?}"));
    }
}

/// Checkpoints after every batch; hangs (the first `hangs` times) on a
/// batch holding [`HANGS_ON`], awaiting a future that never completes.
struct Processor {
    log: Arc<Log>,
    store: InMemoryLeaseStore,
    hangs: Arc<AtomicU32>,
}

impl Processor {
    /// Never returns; dropping it notes the lease's owner then.
    async fn hang(&self) {
        let _guard = DropGuard {
            log: Arc::clone(&self.log),
            store: self.store.clone(),
        };
        std::future::pending::<()>().await;
    }

    fn hangs_now(&self, batch: &RecordBatch) -> bool {
        holds(batch, HANGS_ON) && take_one(&self.hangs)
    }
}

#[async_trait]
impl RecordProcessor for Processor {
    async fn initialize(&mut self, _: &InitializeInput) -> Result<(), ProcessorError> {
        self.log.initialized.fetch_add(1, Ordering::SeqCst);
        if take_one(&self.log.initialize_hangs) {
            self.hang().await;
        }
        Ok(())
    }

    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        if self.hangs_now(batch) {
            self.hang().await;
        }
        if holds(batch, BLOCKS_ON) && take_one(&self.log.blocks) {
            std::thread::sleep(BLOCKS_FOR);
            let owner = self.store.snapshot()[0].owner.clone();
            self.log
                .event(format!("blocking call returned, owner {owner:?}"));
        }
        self.log.processed.extend(batch);
        cp.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(&mut self, _: &mut Checkpointer) -> Result<(), ProcessorError> {
        self.log.shutdown_requested.fetch_add(1, Ordering::SeqCst);
        if take_one(&self.log.shutdown_hangs) {
            self.hang().await;
        }
        Ok(())
    }

    async fn shard_ended(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        if take_one(&self.log.shard_ended_hangs) {
            self.hang().await;
        }
        cp.checkpoint().await?;
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.log.lease_lost.fetch_add(1, Ordering::SeqCst);
        self.log.event("lease_lost".into());
    }
}

/// Notes each release of a lease in the log, beside the processors'
/// events.
struct Releases(Arc<Log>);

impl std::fmt::Debug for Releases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Releases")
    }
}

impl Observer for Releases {
    fn observe(&self, _: &str, event: &Event<'_>) {
        if let Event::Ended {
            reason: EndReason::Released,
            ..
        } = event
        {
            self.0.event("lease released".into());
        }
    }
}

/// Counters by name and `stage` label, recorded on this thread.
#[derive(Default)]
struct Counters(Recorded);

impl Counters {
    fn get(&self, name: &str, stage: &str) -> u64 {
        self.0.counter(name, &[("stage", stage)])
    }
}

/// Records the test's counters into `$counters` and its warnings into
/// `$lines`, on its thread (where the worker's tasks run), until the end
/// of the calling block.
macro_rules! capture {
    ($counters:ident, $lines:ident) => {
        let $counters = Counters::default();
        let _metrics = metrics::set_default_local_recorder(&$counters.0);
        let $lines = Lines::default();
        let _logs = capture_warnings(&$lines);
    };
}

struct Setup {
    store: InMemoryLeaseStore,
    source: InMemoryShardSource,
    /// Sequence numbers of the records put, in order.
    seqs: Vec<String>,
    log: Arc<Log>,
    worker: WorkerHandle,
    task: JoinHandle<Result<(), kcl_core::worker::WorkerError>>,
}

/// One worker over one shard holding the records "0" and "1"; the first
/// batch holding [`HANGS_ON`] hangs once. `limits` sets the call limits.
fn start(limits: impl FnOnce(WorkerConfigBuilder) -> WorkerConfigBuilder) -> Setup {
    let source = InMemoryShardSource::new();
    source.create_stream(STREAM, 1);
    let store = InMemoryLeaseStore::new();
    let lease = LeaseConfig::builder("w-a")
        .taker_interval(Duration::from_secs(5))
        .build()
        .unwrap();
    let config = fleet::one_stream(lease, STREAM).max_backoff(Duration::from_secs(1));
    let config = limits(config).build().unwrap();
    let log = Arc::new(Log::default());
    let (made, table) = (Arc::clone(&log), store.clone());
    let hangs = Arc::new(AtomicU32::new(1));
    let factory = move |_: &ShardContext| Processor {
        log: Arc::clone(&made),
        store: table.clone(),
        hangs: Arc::clone(&hangs),
    };
    let worker = Worker::new(
        config,
        Arc::new(store.handle()),
        Arc::new(source.clone()),
        Arc::new(factory),
    )
    .with_observer(Arc::new(Releases(Arc::clone(&log))));
    let handle = worker.handle();
    let mut s = Setup {
        store,
        source,
        seqs: Vec::new(),
        log,
        worker: handle,
        task: tokio::spawn(worker.run()),
    };
    s.put(&["0", "1"]);
    s
}

impl Setup {
    fn put(&mut self, records: &[&str]) {
        for r in records {
            let seq = self
                .source
                .put(STREAM, &format!("pk-{r}"), r.to_string())
                .unwrap()
                .1;
            self.seqs.push(seq);
        }
    }

    fn checkpoint(&self) -> Checkpoint {
        self.store.snapshot()[0].checkpoint.clone()
    }

    fn owner(&self) -> Option<String> {
        self.store.snapshot()[0].owner.clone()
    }

    fn processed(&self) -> Vec<String> {
        self.log.processed.all()
    }

    fn events(&self) -> Vec<String> {
        self.log.events.lock().unwrap().clone()
    }

    /// "0" and "1" processed and checkpointed, then "2" to "4" put: the
    /// batch of "2" hangs.
    async fn checkpoint_then_hang(&mut self) {
        until("the first records processed", || {
            self.processed().len() == 2
        })
        .await;
        until_checkpoint(self, Checkpoint::at(self.seqs[1].clone(), 0)).await;
        self.put(&["2", "3", "4"]);
    }

    async fn stop(self) {
        self.worker.shutdown();
        self.task.await.unwrap().unwrap();
    }
}

/// Asserts that `events` begin with the hung call dropped while the lease
/// was held, then `lanes` lanes' lease_lost, then the lease released.
fn assert_dropped_then_released(events: &[String], lanes: usize) {
    let mut expected = vec!["call dropped, owner Some(\"w-a\")"];
    expected.extend(std::iter::repeat_n("lease_lost", lanes));
    expected.push("lease released");
    assert_eq!(
        events[..expected.len()],
        expected,
        "the call is cancelled while the lease is held, and the lease released after"
    );
}

async fn until_checkpoint(s: &Setup, want: Checkpoint) {
    let what = format!("the checkpoint at {want:?}");
    until(&what, || s.checkpoint() == want).await;
}

const SLOW: &str = "kcl_processor_calls_slow_total";
const TIMEOUTS: &str = "kcl_processor_timeouts_total";

/// The limits most of these tests set: a call is warned about after 10 s
/// and cut at 30 s.
fn warn_then_cut(c: WorkerConfigBuilder) -> WorkerConfigBuilder {
    c.processor_warn_after(Duration::from_secs(10))
        .processor_timeout(Duration::from_secs(30))
}

/// A `shard_ended` cut at the timeout is followed by `lease_lost`, as the
/// processor docs promise: a call cut short is no ending. (Taken for one
/// as it was made, it was followed by nothing.) The shard is taken again
/// and finished.
#[tokio::test(start_paused = true)]
async fn a_shard_ended_cut_at_the_timeout_is_followed_by_lease_lost() {
    let s = start(warn_then_cut);
    s.log.shard_ended_hangs.store(1, Ordering::SeqCst);
    until("the first records", || !s.processed().is_empty()).await;
    let shard = s.store.snapshot()[0].shard_id.clone();
    s.source.split(STREAM, &shard).unwrap();
    until("lease_lost after the cut", || {
        s.log.lease_lost.load(Ordering::SeqCst) == 1
    })
    .await;
    until("the shard finished", || {
        let leases = s.store.snapshot();
        let parent = leases.iter().find(|l| l.shard_id == shard);
        parent.is_some_and(|l| l.checkpoint == Checkpoint::ShardEnd)
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_call_is_warned_about_once_then_cancelled_before_its_shard_is_given_back() {
    capture!(counters, lines);
    let mut s = start(warn_then_cut);
    s.checkpoint_then_hang().await;
    until("the shard given back", || {
        s.log.lease_lost.load(Ordering::SeqCst) == 1
    })
    .await;
    until("the rest of the shard processed", || {
        s.processed().len() == 5
    })
    .await;
    assert_eq!(
        s.processed(),
        ["0", "1", "2", "3", "4"],
        "nothing lost or repeated"
    );
    assert_dropped_then_released(&s.events(), 1);
    assert_eq!(s.log.initialized.load(Ordering::SeqCst), 2, "a new tenure");
    until_checkpoint(&s, Checkpoint::at(s.seqs[4].clone(), 0)).await;
    assert_eq!(
        counters.get(SLOW, "process_records"),
        1,
        "one warning per call"
    );
    assert_eq!(counters.get(TIMEOUTS, "process_records"), 1);
    assert_eq!(lines.count("a processor call is running long"), 1);
    assert_eq!(lines.count("ran past processor_timeout"), 1);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_a_timeout_a_hung_call_is_only_warned_about_and_keeps_its_lease() {
    capture!(counters, lines);
    let mut s = start(|c| c.processor_warn_after(Duration::from_secs(10)));
    s.checkpoint_then_hang().await;
    until("the hung call warned about", || {
        counters.get(SLOW, "process_records") == 1
    })
    .await;
    // Ten minutes on, the call still hangs and the shard is still held.
    sleep(Duration::from_secs(600)).await;
    assert_eq!(
        counters.get(SLOW, "process_records"),
        1,
        "one warning per call"
    );
    assert_eq!(counters.get(TIMEOUTS, "process_records"), 0);
    assert_eq!(lines.count("a processor call is running long"), 1);
    assert_eq!(s.owner().as_deref(), Some("w-a"));
    assert_eq!(s.log.lease_lost.load(Ordering::SeqCst), 0);
    assert_eq!(s.log.initialized.load(Ordering::SeqCst), 1, "one tenure");
    assert!(s.events().is_empty(), "{:?}", s.events());
    assert_eq!(s.processed(), ["0", "1"]);
    assert_eq!(s.checkpoint(), Checkpoint::at(s.seqs[1].clone(), 0));
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_lane_call_is_cancelled_and_every_lane_gives_the_shard_back() {
    capture!(counters, lines);
    let mut s = start(|c| warn_then_cut(c.parallelism_per_shard(2)));
    s.checkpoint_then_hang().await;
    until("both lanes given back", || {
        s.log.lease_lost.load(Ordering::SeqCst) == 2
    })
    .await;
    until_checkpoint(&s, Checkpoint::at(s.seqs[4].clone(), 0)).await;
    let events = s.events();
    assert_dropped_then_released(&events, 2);
    let processed = s.processed();
    let mut first = processed[..2].to_vec();
    first.sort();
    assert_eq!(first, ["0", "1"], "lanes order records of one key only");
    for r in ["0", "1", "2"] {
        let times = processed.iter().filter(|p| *p == r).count();
        assert_eq!(times, 1, "{r} processed once: {processed:?}");
    }
    for r in ["3", "4"] {
        assert!(processed.iter().any(|p| p == r), "{r} lost: {processed:?}");
    }
    assert_eq!(
        s.log.initialized.load(Ordering::SeqCst),
        4,
        "two tenures of two lanes"
    );
    assert_eq!(counters.get(SLOW, "process_records"), 1);
    assert_eq!(counters.get(TIMEOUTS, "process_records"), 1);
    s.stop().await;
}

#[test]
fn call_limits_that_cannot_work_are_refused_naming_the_field() {
    let builder = || single_stream_config(STREAM);
    let cases = [
        (
            builder().processor_warn_after(Duration::ZERO),
            "processor_warn_after",
        ),
        (
            builder().processor_timeout(Duration::from_secs(60)),
            "processor_timeout",
        ),
        (
            builder()
                .processor_warn_after(Duration::from_secs(5))
                .processor_timeout(Duration::from_secs(2)),
            "processor_timeout",
        ),
        // "Never warn": every processor call panicked on its deadline.
        (
            builder().processor_warn_after(Duration::MAX),
            "processor_warn_after",
        ),
        (
            builder().shard_sync_interval(Duration::MAX),
            "shard_sync_interval",
        ),
    ];
    for (builder, named) in cases {
        let e = builder.build().unwrap_err();
        assert_eq!(e.field, named, "{e}");
    }
    builder()
        .processor_warn_after(Duration::from_secs(5))
        .processor_timeout(Duration::from_secs(6))
        .build()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_hung_initialize_is_cancelled_and_the_shard_read_in_the_next_tenure() {
    capture!(counters, lines);
    let s = start(warn_then_cut);
    s.log.initialize_hangs.store(1, Ordering::SeqCst);
    until("the shard processed", || s.processed().len() == 2).await;
    assert_dropped_then_released(&s.events(), 1);
    assert_eq!(s.processed(), ["0", "1"]);
    assert_eq!(s.log.initialized.load(Ordering::SeqCst), 2, "a new tenure");
    assert_eq!(counters.get(SLOW, "initialize"), 1);
    assert_eq!(counters.get(TIMEOUTS, "initialize"), 1);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_lane_call_cut_during_a_shutdown_drain_ends_every_lane_with_lease_lost() {
    capture!(counters, lines);
    let mut s = start(|c| {
        warn_then_cut(c.parallelism_per_shard(2)).shutdown_timeout(Duration::from_secs(120))
    });
    s.checkpoint_then_hang().await;
    until("the hung call warned about", || {
        counters.get(SLOW, "process_records") == 1
    })
    .await;
    // The shutdown drains the lanes; the hung call is cut meanwhile.
    let events = Arc::clone(&s.log);
    s.stop().await;
    assert_eq!(counters.get(TIMEOUTS, "process_records"), 1);
    assert_eq!(
        events.shutdown_requested.load(Ordering::SeqCst),
        0,
        "no lane checkpoints beside a call that was cut off"
    );
    assert_eq!(events.lease_lost.load(Ordering::SeqCst), 2);
    assert_dropped_then_released(&events.events.lock().unwrap(), 2);
}

/// A worker whose checkpoints the policy holds back for ten minutes, with
/// `lanes` lanes and a shutdown timeout of 20 s: "0" and "1" processed
/// (the period's first checkpoint written), then "9" (its checkpoint held
/// back).
async fn held_back(lanes: usize) -> Setup {
    let mut s = start(|c| {
        c.parallelism_per_shard(lanes)
            .checkpoint_policy(CheckpointPolicy::every(Duration::from_secs(600)))
            .shutdown_timeout(Duration::from_secs(20))
    });
    until("0 and 1 processed", || s.processed().len() == 2).await;
    s.put(&["9"]);
    until("9 processed", || s.processed().len() == 3).await;
    assert_ne!(s.checkpoint(), Checkpoint::at(s.seqs[2].clone(), 0));
    s
}

/// [`held_back`], then "2", whose batch hangs.
async fn held_back_then_hung(lanes: usize) -> Setup {
    let mut s = held_back(lanes).await;
    s.put(&["2"]);
    until("the hung call under way", || {
        s.worker.shards().iter().any(|p| p.processor_call.is_some())
    })
    .await;
    s
}

/// With two lanes whose `shutdown_requested` both hang, the first is cut
/// at the shutdown timeout and the second, called after the cut, is cut at
/// once: the position asked for is written and both lanes get
/// `lease_lost`. The second ran on until the worker stopped waiting, and
/// the position was never written.
#[tokio::test(start_paused = true)]
async fn a_lanes_shutdown_requested_called_after_the_cut_is_cut_at_once() {
    let mut s = held_back(2).await;
    s.log.shutdown_hangs.store(2, Ordering::SeqCst);
    let report = s.worker.shutdown_and_wait().await;
    (&mut s.task).await.unwrap().unwrap();
    assert_eq!((report.drained, report.cut_off), (0, 1), "{report:?}");
    assert_eq!(s.checkpoint(), Checkpoint::at(s.seqs[2].clone(), 0));
    assert_eq!(s.log.shutdown_requested.load(Ordering::SeqCst), 2);
    assert_eq!(s.log.lease_lost.load(Ordering::SeqCst), 2);
}

/// A processor call still under way at the shutdown timeout is cut: its
/// future is dropped while the lease is held, the position the processor
/// asked for before it (held back by the policy) is written, the
/// processor is told `lease_lost`, and the lease is released after. The
/// drain used to abort the consumer instead: the held-back position was
/// never written (the next owner repeated "9") and no ending reached the
/// processor.
#[tokio::test(start_paused = true)]
async fn a_call_under_way_at_the_shutdown_timeout_is_cut_and_its_asked_position_written() {
    for lanes in [1, 2] {
        let mut s = held_back_then_hung(lanes).await;
        let held_back = Checkpoint::at(s.seqs[2].clone(), 0);
        let report = s.worker.shutdown_and_wait().await;
        (&mut s.task).await.unwrap().unwrap();
        assert_eq!(
            (report.drained, report.cut_off, report.released),
            (0, 1, 1),
            "{lanes} lanes: {report:?}"
        );
        assert_eq!(
            s.checkpoint(),
            held_back,
            "{lanes} lanes: the position asked for before the cut call"
        );
        let events = s.log.events.lock().unwrap().clone();
        assert_dropped_then_released(&events, lanes);
        assert_eq!(s.log.lease_lost.load(Ordering::SeqCst), lanes as u32);
        assert_eq!(s.log.shutdown_requested.load(Ordering::SeqCst), 0);
    }
}

/// A `shutdown_requested` still running at the shutdown timeout is cut,
/// and, as a call cut short is no ending, `lease_lost` follows; the shard
/// counts as cut off, not drained.
#[tokio::test(start_paused = true)]
async fn a_shutdown_requested_cut_at_the_shutdown_timeout_is_followed_by_lease_lost() {
    let mut s = start(|c| c.shutdown_timeout(Duration::from_secs(20)));
    s.log.shutdown_hangs.store(1, Ordering::SeqCst);
    until("the first records", || s.processed().len() == 2).await;
    let report = s.worker.shutdown_and_wait().await;
    (&mut s.task).await.unwrap().unwrap();
    assert_eq!((report.drained, report.cut_off), (0, 1), "{report:?}");
    assert_eq!(s.log.shutdown_requested.load(Ordering::SeqCst), 1);
    assert_eq!(s.log.lease_lost.load(Ordering::SeqCst), 1);
    assert_dropped_then_released(&s.log.events.lock().unwrap(), 1);
}

/// A lane call that blocks its thread through the shutdown (no
/// cancellation reaches it) keeps the lease held until it returns: the
/// worker stopped the shard's consumer where it was, which left the lane's
/// task running, and released the lease beside it. The shutdown now waits
/// a while for the lease's last handle, then leaves the lease to expire,
/// and keeps the worker's liveness record (its last beat), by which peers
/// judge the lease: deleted, a peer would take the lease at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_call_blocking_its_thread_through_the_shutdown_keeps_its_lease_held() {
    let mut s = start(|c| {
        c.parallelism_per_shard(2)
            .shutdown_timeout(Duration::from_secs(1))
    });
    s.log.blocks.store(1, Ordering::SeqCst);
    until("0 and 1 processed", || s.processed().len() == 2).await;
    s.put(&[BLOCKS_ON]);
    until("the blocking call under way", || {
        s.worker.shards().iter().any(|p| p.processor_call.is_some())
    })
    .await;
    let report = s.worker.shutdown_and_wait().await;
    (&mut s.task).await.unwrap().unwrap();
    assert_eq!(
        (report.released, report.release_failures),
        (0, 1),
        "{report:?}"
    );
    assert_eq!(s.owner().as_deref(), Some("w-a"), "left to expire");
    let beats = s.store.beats_snapshot();
    assert!(beats.iter().any(|b| b.worker == "w-a"), "{beats:?}");
    let returned =
        |events: &[String]| (events.iter()).position(|e| e.starts_with("blocking call returned"));
    until("the blocking call returned", || {
        returned(&s.events()).is_some()
    })
    .await;
    let events = s.events();
    let returned = returned(&events).unwrap();
    assert_eq!(
        events[returned], "blocking call returned, owner Some(\"w-a\")",
        "{events:?}"
    );
}
