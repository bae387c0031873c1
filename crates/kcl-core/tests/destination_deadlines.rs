//! A failure destination that never answers, on a whole worker over the
//! in-memory store and source under a paused clock: each send is cut by the
//! poison policy's attempt timeout, the shard is given back once its
//! deadline passed (its checkpoint still before the poison record), and the
//! record reaches the destination once it answers again. A destination that
//! can never store the record keeps the shard instead, retried until it
//! changes.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::processing::{Collect, STREAM, Texts, until};
use common::single_stream_config;
use kcl_core::checkpointer::Checkpointer;
use kcl_core::poison::PoisonPolicy;
use kcl_core::processor::{
    FailurePolicy, InitializeInput, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
};
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::test_util::fleet;
use kcl_core::worker::WorkerHandle;
use kcl_core::{Checkpoint, LeaseConfig, LeaseStore};
use tokio::task::JoinHandle;
use tokio::time::sleep;

const POISON: &[u8] = b"2";

/// What the processors of the shard did.
#[derive(Default)]
struct Log {
    processed: Texts,
    initialized: AtomicU32,
    lease_lost: AtomicU32,
}

/// Fails on the record `POISON`, checkpoints after every batch.
struct Processor(Arc<Log>);

#[async_trait]
impl RecordProcessor for Processor {
    async fn initialize(&mut self, _: &InitializeInput) -> Result<(), ProcessorError> {
        self.0.initialized.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        if batch.records.iter().any(|r| r.data.as_ref() == POISON) {
            return Err("poison record".into());
        }
        self.0.processed.extend(batch);
        cp.checkpoint().await?;
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.0.lease_lost.fetch_add(1, Ordering::SeqCst);
    }
}

struct Setup {
    store: InMemoryLeaseStore,
    /// Sequence numbers of the records "0".."4", in order.
    seqs: Vec<String>,
    log: Arc<Log>,
    worker: WorkerHandle,
    task: JoinHandle<Result<(), kcl_core::worker::WorkerError>>,
}

/// One worker over one shard holding the records "0".."4", "2" poison.
fn start(policy: PoisonPolicy) -> Setup {
    let source = InMemoryShardSource::new();
    source.create_stream(STREAM, 1);
    let seqs = (0..5)
        .map(|n| source.put(STREAM, "pk", n.to_string()).unwrap().1)
        .collect();
    let store = InMemoryLeaseStore::new();
    let lease = LeaseConfig::builder("w-a")
        .taker_interval(Duration::from_secs(5))
        .build()
        .unwrap();
    let config = fleet::one_stream(lease, STREAM)
        .failure_policy(FailurePolicy::Isolate(policy))
        .max_backoff(Duration::from_secs(1))
        .build()
        .unwrap();
    let log = Arc::new(Log::default());
    let made = Arc::clone(&log);
    let factory = move |_: &ShardContext| Processor(Arc::clone(&made));
    let (worker, task) =
        fleet::spawn_worker(config, Arc::new(store.handle()), Arc::new(source), factory);
    Setup {
        store,
        seqs,
        log,
        worker,
        task,
    }
}

impl Setup {
    async fn checkpoint(&self) -> Checkpoint {
        let leases = self.store.snapshot();
        let lease = self.store.get(&leases[0].key).await.unwrap().unwrap();
        lease.checkpoint
    }

    fn processed(&self) -> Vec<String> {
        self.log.processed.all()
    }

    async fn stop(self) {
        self.worker.shutdown();
        self.task.await.unwrap().unwrap();
    }
}

/// Waits until the shard's records but the poison one (2) are processed,
/// and checks that each was processed once, in order.
async fn until_the_rest_processed(s: &Setup) {
    until("the rest of the shard processed", || {
        s.processed().len() == 4
    })
    .await;
    assert_eq!(s.processed(), ["0", "1", "3", "4"]);
}

#[tokio::test(start_paused = true)]
async fn a_send_that_never_answers_is_cut_and_the_shard_given_back_after_the_deadline() {
    let dest = Arc::new(Collect {
        hang: AtomicU32::new(u32::MAX),
        ..Collect::default()
    });
    let policy = PoisonPolicy::send_to(Arc::clone(&dest))
        .max_attempts(1)
        .send_attempt_timeout(Duration::from_secs(10))
        .send_deadline(Duration::from_secs(60));
    let s = start(policy);
    until("the shard given back", || {
        s.log.lease_lost.load(Ordering::SeqCst) >= 1
    })
    .await;
    // Six sends fit in the minute (10 s each, 0.1 s to 1 s apart); one
    // that hung for good would have been the only one.
    assert!(
        dest.calls.load(Ordering::SeqCst) >= 5,
        "each hung send was cut and retried: {} calls",
        dest.calls.load(Ordering::SeqCst)
    );
    assert!(dest.got.lock().unwrap().is_empty());
    assert_eq!(s.processed(), ["0", "1"], "nothing after the poison record");
    assert_eq!(
        s.checkpoint().await,
        Checkpoint::at(s.seqs[1].clone(), 0),
        "the checkpoint stays before the record not stored"
    );
    // The destination answers again: the worker takes the shard back,
    // reads the records again and sets the poison record aside.
    dest.hang.store(0, Ordering::SeqCst);
    until("the rest of the shard processed", || {
        s.processed().ends_with(&["3".to_owned(), "4".to_owned()])
    })
    .await;
    let got = dest.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].record.data.as_ref(), POISON);
    assert_eq!(s.log.initialized.load(Ordering::SeqCst), 2, "a new tenure");
    assert_eq!(s.checkpoint().await, Checkpoint::at(s.seqs[4].clone(), 0));
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_send_is_cut_and_retried_without_giving_the_shard_back() {
    let dest = Arc::new(Collect {
        hang: AtomicU32::new(1),
        ..Collect::default()
    });
    let policy = PoisonPolicy::send_to(Arc::clone(&dest))
        .max_attempts(1)
        .send_attempt_timeout(Duration::from_secs(10));
    let s = start(policy);
    until_the_rest_processed(&s).await;
    assert_eq!(
        dest.calls.load(Ordering::SeqCst),
        2,
        "one cut, one accepted"
    );
    assert_eq!(dest.got.lock().unwrap().len(), 1);
    assert_eq!(s.log.lease_lost.load(Ordering::SeqCst), 0);
    assert_eq!(s.log.initialized.load(Ordering::SeqCst), 1, "one tenure");
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_record_the_destination_can_never_store_keeps_the_shard_and_is_retried() {
    let dest = Arc::new(Collect {
        cannot_store: AtomicBool::new(true),
        ..Collect::default()
    });
    let deadline = Duration::from_secs(60);
    let policy = PoisonPolicy::send_to(Arc::clone(&dest))
        .max_attempts(1)
        .send_deadline(deadline);
    let s = start(policy);
    until("a first refusal", || dest.calls.load(Ordering::SeqCst) >= 1).await;
    // Ten deadlines go by: the sends go on in each, about one a second
    // (the worker's max_backoff), and the shard is never given back.
    let mut per_deadline = Vec::new();
    for _ in 0..10 {
        let before = dest.calls.load(Ordering::SeqCst);
        sleep(deadline).await;
        per_deadline.push(dest.calls.load(Ordering::SeqCst) - before);
    }
    assert!(
        per_deadline.iter().all(|n| *n >= 50),
        "sends per deadline: {per_deadline:?}"
    );
    assert_eq!(
        s.log.lease_lost.load(Ordering::SeqCst),
        0,
        "the shard was never given back"
    );
    assert_eq!(s.log.initialized.load(Ordering::SeqCst), 1, "one tenure");
    assert_eq!(s.processed(), ["0", "1"], "nothing after the record");
    assert_eq!(
        s.checkpoint().await,
        Checkpoint::at(s.seqs[1].clone(), 0),
        "the checkpoint stays before the record not stored"
    );
    // The destination is changed to take it: the shard goes on.
    dest.cannot_store.store(false, Ordering::SeqCst);
    until_the_rest_processed(&s).await;
    let got = dest.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].record.data.as_ref(), POISON);
    assert_eq!(
        s.log.initialized.load(Ordering::SeqCst),
        1,
        "still one tenure"
    );
    assert_eq!(s.checkpoint().await, Checkpoint::at(s.seqs[4].clone(), 0));
    s.stop().await;
}

#[test]
fn a_poison_policy_without_time_for_its_sends_is_refused() {
    let cases = [
        (
            PoisonPolicy::drop_failed().send_attempt_timeout(Duration::ZERO),
            "send_attempt_timeout",
        ),
        (
            PoisonPolicy::drop_failed().send_deadline(Duration::ZERO),
            "send_deadline",
        ),
    ];
    for (policy, named) in cases {
        let e = single_stream_config(STREAM)
            .failure_policy(FailurePolicy::Isolate(policy))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains(named), "{e}");
    }
}
