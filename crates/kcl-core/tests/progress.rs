//! Per-shard progress through the worker's handle, the stall it reveals,
//! and shards whose reads all fail given back: whole workers on the
//! in-memory store and source under a paused clock.
#![allow(clippy::unwrap_used)]

// Only the processors' shared pieces, not the coordinator simulation of
// `common`, which this binary does not use.
#[allow(dead_code, unreachable_pub)]
#[path = "common/processing.rs"]
mod processing;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kcl_core::checkpointer::Checkpointer;
use kcl_core::processor::{ProcessorError, RecordBatch, RecordProcessor, ShardContext};
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::source::{Batch, OpenShard, ShardInfo, ShardReader, ShardSource, SourceError};
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::test_util::fleet;
use kcl_core::worker::{StreamSpec, WorkerConfig, WorkerConfigBuilder, WorkerHandle};
use kcl_core::{LeaseConfig, LeaseLayout};
use processing::STREAM;
use tokio::sync::Notify;
use tokio::time::sleep;

/// Records `(worker, data)` of every batch, and hangs in
/// `process_records` on the shard named in `hang_on` until `go` is set.
#[derive(Clone, Default)]
struct Shared {
    seen: Arc<Mutex<Vec<(String, String)>>>,
    hang_on: Arc<Mutex<Option<String>>>,
    go: Arc<Notify>,
}

struct Recorder {
    worker: String,
    shard: String,
    shared: Shared,
}

#[async_trait]
impl RecordProcessor for Recorder {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let hangs = { self.shared.hang_on.lock().unwrap().as_deref() == Some(&self.shard) };
        if hangs {
            self.shared.go.notified().await;
        }
        let data = batch.records.iter().map(|r| {
            (
                self.worker.clone(),
                String::from_utf8_lossy(&r.data).into_owned(),
            )
        });
        self.shared.seen.lock().unwrap().extend(data);
        cp.checkpoint().await?;
        Ok(())
    }
}

/// How a worker's reads of every shard go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reads {
    Answered,
    /// Every fetch fails with a retryable error (throttled, 5xx).
    Fail,
    /// Every fetch waits forever: a GetRecords held unanswered.
    Hang,
}

/// The shared in-memory source, as one worker reaches it.
#[derive(Debug)]
struct Reach {
    inner: InMemoryShardSource,
    reads: Reads,
}

#[async_trait]
impl ShardSource for Reach {
    async fn list_shards(&self, stream: &str) -> Result<Vec<ShardInfo>, SourceError> {
        self.inner.list_shards(stream).await
    }

    async fn open(&self, request: OpenShard) -> Result<Box<dyn ShardReader>, SourceError> {
        let shard = request.shard_id.clone();
        Ok(Box::new(CutOff {
            inner: self.inner.open(request).await?,
            reads: self.reads,
            shard,
        }))
    }
}

#[derive(Debug)]
struct CutOff {
    inner: Box<dyn ShardReader>,
    reads: Reads,
    shard: String,
}

#[async_trait]
impl ShardReader for CutOff {
    async fn next_batch(&mut self) -> Result<Batch, SourceError> {
        match self.reads {
            Reads::Answered => self.inner.next_batch().await,
            Reads::Fail => {
                // A reader's own retries take their time before it answers.
                sleep(Duration::from_secs(1)).await;
                Err(SourceError::Retryable {
                    stream: STREAM.into(),
                    shard: self.shard.clone(),
                    source: "injected: the endpoint cannot be reached".into(),
                })
            }
            Reads::Hang => std::future::pending().await,
        }
    }
}

fn start(
    id: &str,
    source: &InMemoryShardSource,
    table: &InMemoryLeaseStore,
    reads: Reads,
    shared: &Shared,
    tune: impl FnOnce(WorkerConfigBuilder) -> WorkerConfigBuilder,
) -> WorkerHandle {
    let lease = LeaseConfig::builder(id)
        .taker_interval(Duration::from_secs(5))
        .seed(id.len() as u64)
        .build()
        .unwrap();
    let config = tune(fleet::one_stream(lease, STREAM)).build().unwrap();
    let (worker_id, shared) = (id.to_owned(), shared.clone());
    let factory = move |ctx: &ShardContext| Recorder {
        worker: worker_id.clone(),
        shard: ctx.shard_id.clone(),
        shared: shared.clone(),
    };
    let reach = Reach {
        inner: source.clone(),
        reads,
    };
    let (handle, _) =
        fleet::spawn_worker(config, Arc::new(table.clone()), Arc::new(reach), factory);
    handle
}

async fn wait_until(what: &str, done: impl FnMut() -> bool) {
    let (limit, poll) = (Duration::from_secs(900), Duration::from_millis(100));
    fleet::wait_until(limit, poll, done, || what.to_owned()).await;
}

#[tokio::test(start_paused = true)]
async fn the_handle_reports_each_shards_last_delivery_and_checkpoint() {
    let source = InMemoryShardSource::new();
    let shard = source.create_stream(STREAM, 1).remove(0);
    let seqs: Vec<String> = (0..5)
        .map(|i| source.put(STREAM, "pk", format!("r{i}")).unwrap().1)
        .collect();
    let shared = Shared::default();
    let table = InMemoryLeaseStore::new();
    let handle = start("w-a", &source, &table, Reads::Answered, &shared, |b| b);
    wait_until("records processed", || {
        shared.seen.lock().unwrap().len() == 5
    })
    .await;
    sleep(Duration::from_secs(1)).await;
    let shards = handle.shards();
    assert_eq!(shards.len(), 1, "{shards:?}");
    let progress = &shards[0];
    assert_eq!(progress.shard_id, shard);
    assert_eq!(progress.lanes, 1);
    assert_eq!(progress.records_waiting, 0);
    assert_eq!(progress.millis_behind_latest, Some(0));
    assert_eq!(progress.last_delivery.map(|d| d.records), Some(5));
    let checkpoint = progress.last_checkpoint.as_ref().map(|c| c.value.clone());
    assert_eq!(checkpoint, seqs.last().map(|seq| format!("{seq}/0")));
    assert!(progress.processor_call.is_none());
    handle.shutdown();
}

#[tokio::test(start_paused = true)]
async fn stalled_names_a_shard_whose_processor_hangs_while_records_wait_and_not_an_idle_one() {
    let source = InMemoryShardSource::new();
    source.create_stream(STREAM, 2);
    // One key: every record lands in one shard, whose processor hangs;
    // the other shard stays idle.
    let mut hung = String::new();
    for i in 0..3 {
        hung = source.put(STREAM, "pk", format!("r{i}")).unwrap().0;
    }
    let hung = &hung;
    let shared = Shared::default();
    *shared.hang_on.lock().unwrap() = Some(hung.clone());
    let table = InMemoryLeaseStore::new();
    let handle = start("w-a", &source, &table, Reads::Answered, &shared, |b| b);
    let bound = Duration::from_secs(30);
    wait_until("both shards consumed", || handle.shards().len() == 2).await;
    sleep(bound + Duration::from_secs(5)).await;
    let stalled: Vec<String> = handle
        .stalled(bound)
        .into_iter()
        .map(|s| s.shard_id)
        .collect();
    assert_eq!(stalled, vec![hung.clone()]);
    let hanging = handle.shards().into_iter().find(|s| &s.shard_id == hung);
    let hanging = hanging.unwrap();
    assert_eq!(hanging.records_waiting, 3);
    assert_eq!(
        hanging.processor_call.map(|c| c.stage),
        Some("process_records")
    );
    // The processor returns: the shard moves, and nothing is stalled.
    shared.hang_on.lock().unwrap().take();
    shared.go.notify_waiters();
    wait_until("records processed", || {
        shared.seen.lock().unwrap().len() == 3
    })
    .await;
    assert!(
        handle.stalled(bound).is_empty(),
        "{:?}",
        handle.stalled(bound)
    );
    handle.shutdown();
}

/// A worker whose reads of `reads` kind never succeed holds the shard
/// first; a peer that reads fine starts beside it. The shard is given
/// back once the worker's reads failed for `max_read_failure_time`, and
/// the peer processes every record, once, in order.
async fn a_cut_off_worker_gives_its_shard_to_a_peer(reads: Reads) {
    let source = InMemoryShardSource::new();
    source.create_stream(STREAM, 1);
    let put: Vec<String> = (0..5)
        .map(|i| {
            let data = format!("r{i}");
            source.put(STREAM, "pk", data.clone()).unwrap();
            data
        })
        .collect();
    let shared = Shared::default();
    let table = InMemoryLeaseStore::new();
    let limit = Duration::from_secs(20);
    let cut_off = start("w-cut-off", &source, &table, reads, &shared, |b| {
        b.max_read_failure_time(limit)
    });
    wait_until("the shard taken", || cut_off.shards().len() == 1).await;
    let peer = start("w-peer", &source, &table, Reads::Answered, &shared, |b| b);
    wait_until("records processed by the peer", || {
        shared.seen.lock().unwrap().len() == 5
    })
    .await;
    let seen = shared.seen.lock().unwrap().clone();
    let by_peer: Vec<(String, String)> = put.iter().map(|d| ("w-peer".into(), d.clone())).collect();
    assert_eq!(seen, by_peer);
    // Given back at least once (it may have taken the shard again, and
    // given it back again, before the peer's taker came first).
    assert!(cut_off.status().leases.released >= 1);
    assert_eq!(peer.status().leases.released, 0);
    cut_off.shutdown();
    peer.shutdown();
}

#[tokio::test(start_paused = true)]
async fn a_shard_whose_reads_all_hang_unanswered_is_given_back_and_a_peer_processes_it() {
    a_cut_off_worker_gives_its_shard_to_a_peer(Reads::Hang).await;
}

#[tokio::test(start_paused = true)]
async fn a_shard_whose_reads_all_fail_is_given_back_and_a_peer_processes_it() {
    a_cut_off_worker_gives_its_shard_to_a_peer(Reads::Fail).await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_shard_read_successfully_is_kept_however_long_it_stays_empty() {
    let source = InMemoryShardSource::new();
    source.create_stream(STREAM, 1);
    let shared = Shared::default();
    let table = InMemoryLeaseStore::new();
    let handle = start("w-a", &source, &table, Reads::Answered, &shared, |b| {
        b.max_read_failure_time(Duration::from_secs(5))
    });
    wait_until("the shard taken", || handle.shards().len() == 1).await;
    sleep(Duration::from_secs(120)).await;
    assert_eq!(handle.status().leases.released, 0);
    assert_eq!(handle.shards().len(), 1);
    assert!(handle.stalled(Duration::from_secs(5)).is_empty());
    handle.shutdown();
}

#[test]
fn a_read_failure_time_under_a_second_is_refused_by_name() {
    let lease = LeaseConfig::builder("w").build().unwrap();
    let err = WorkerConfig::builder(lease)
        .stream(StreamSpec {
            name: STREAM.into(),
            layout: LeaseLayout::SingleStream,
        })
        .max_read_failure_time(Duration::from_millis(500))
        .build()
        .unwrap_err();
    assert_eq!(err.field, "max_read_failure_time");
}
