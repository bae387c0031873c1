//! Whole workers sharing one in-memory lease table, for tests under a
//! paused clock: start them over any [`ShardSource`], stop or kill them,
//! read who holds which lease, and wait for a condition in paused time.
//! Also the pieces the fleet tests share: the worker configuration of one
//! stream, records numbered per partition key (`"pk-3:17"`), and a
//! processor that keeps every payload it is given.
//!
//! A test keeps its own processor and log next to a [`Fleet`] (its type
//! derefs to it with [`deref_fleet!`](crate::deref_fleet)): what each
//! test watches differs, how the workers run does not.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use crate::checkpointer::Checkpointer;
use crate::processor::{
    ProcessorError, ProcessorFactory, RecordBatch, RecordProcessor, ShardContext,
};
use crate::source::memory::InMemoryShardSource;
use crate::source::{InitialPosition, ShardSource};
use crate::store::memory::InMemoryLeaseStore;
use crate::worker::{
    StreamSpec, Worker, WorkerConfig, WorkerConfigBuilder, WorkerError, WorkerHandle,
};
use crate::{LeaseConfig, LeaseLayout, LeaseStore};

/// A running worker: its handle, and the task running it.
pub type Running = (WorkerHandle, JoinHandle<Result<(), WorkerError>>);

/// Runs a worker of `config` over `store` and `source`, its processors
/// made by `factory`, in a task of its own.
pub fn spawn_worker(
    config: WorkerConfig,
    store: Arc<dyn LeaseStore>,
    source: Arc<dyn ShardSource>,
    factory: impl ProcessorFactory,
) -> Running {
    let worker = Worker::new(config, store, source, Arc::new(factory));
    let handle = worker.handle();
    (handle, tokio::spawn(worker.run()))
}

/// Workers sharing one in-memory lease table, each run in a task of its
/// own, by the index [`Fleet::run_worker`] returned.
#[derive(Debug, Default)]
pub struct Fleet {
    /// The lease table, as the tests read it.
    pub store: InMemoryLeaseStore,
    /// Each worker's handle on the table ([`Fleet::table_for_worker`]),
    /// for its own faults.
    pub stores: Vec<InMemoryLeaseStore>,
    /// Each worker's handle and run task.
    pub workers: Vec<Running>,
}

impl Fleet {
    /// No worker yet, over an empty table.
    pub fn new() -> Self {
        Fleet::default()
    }

    /// A handle on the table for the next worker, with a fault plan of its
    /// own (kept in [`Fleet::stores`]).
    pub fn table_for_worker(&mut self) -> InMemoryLeaseStore {
        let store = self.store.handle();
        self.stores.push(store.clone());
        store
    }

    /// Runs a worker of `config` over `store` and `source`, its processors
    /// made by `factory`, in a task of its own; returns its index.
    pub fn run_worker(
        &mut self,
        config: WorkerConfig,
        store: Arc<dyn LeaseStore>,
        source: Arc<dyn ShardSource>,
        factory: impl ProcessorFactory,
    ) -> usize {
        self.workers
            .push(spawn_worker(config, store, source, factory));
        self.workers.len() - 1
    }

    /// Shuts worker `i` down gracefully and waits until its run ends;
    /// panics if the run failed.
    pub async fn stop(&mut self, i: usize) {
        let (handle, task) = &mut self.workers[i];
        handle.shutdown();
        expect_clean_exit(task.await);
    }

    /// A crash: worker `i`'s run future is dropped; nothing is released
    /// unless the worker releases on drop.
    pub async fn kill(&mut self, i: usize) {
        let (_, task) = &mut self.workers[i];
        task.abort();
        let _ = task.await;
    }

    /// Shuts every worker down at once, then waits for each run to end;
    /// panics if one failed.
    pub async fn stop_all(&mut self) {
        for (handle, _) in &self.workers {
            handle.shutdown();
        }
        for (_, task) in self.workers.drain(..) {
            expect_clean_exit(task.await);
        }
    }

    /// How many shards worker `i` consumes now.
    pub fn consuming(&self, i: usize) -> usize {
        self.workers[i].0.status().consuming.len()
    }

    /// Leases the workers gave back unfinished (a failure policy, an
    /// unreadable shard), fleet-wide: released, but not at SHARD_END.
    pub fn given_back(&self) -> u64 {
        self.workers
            .iter()
            .map(|(handle, _)| {
                let status = handle.status();
                status.leases.released - status.shards_finished
            })
            .sum()
    }

    /// Each lease's owner in the table, by lease key.
    pub fn owners(&self) -> BTreeMap<String, Option<String>> {
        self.store
            .snapshot()
            .into_iter()
            .map(|l| (l.key.clone(), l.owner.clone()))
            .collect()
    }

    /// How many leases `worker` holds in the table.
    pub fn held_by(&self, worker: &str) -> usize {
        self.owners()
            .values()
            .filter(|o| o.as_deref() == Some(worker))
            .count()
    }
}

/// A worker's run ended without a panic or an error.
fn expect_clean_exit(joined: Result<Result<(), WorkerError>, tokio::task::JoinError>) {
    match joined {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the worker failed: {e}"),
        Err(e) => panic!("the worker's task failed: {e}"),
    }
}

/// A worker's configuration over `lease`, reading the one stream `stream`
/// (single-stream layout) from TRIM_HORIZON: what every fleet test starts
/// from before its own settings.
pub fn one_stream(lease: LeaseConfig, stream: &str) -> WorkerConfigBuilder {
    WorkerConfig::builder(lease)
        .stream(StreamSpec {
            name: stream.into(),
            layout: LeaseLayout::SingleStream,
        })
        .initial_position(InitialPosition::TrimHorizon)
}

/// Polls `done` every `poll` (in paused time, a jump of the clock) until
/// it holds; panics with `failure()` once `limit` has passed first.
pub async fn wait_until(
    limit: Duration,
    poll: Duration,
    mut done: impl FnMut() -> bool,
    failure: impl Fn() -> String,
) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{}", failure());
        sleep(poll).await;
    }
}

/// Waits (polling every `poll`) until `processed()` records reach
/// `count`; panics saying how many were processed once `limit` has passed.
pub async fn wait_for_records(
    limit: Duration,
    poll: Duration,
    count: usize,
    processed: impl Fn() -> usize,
) {
    wait_until(
        limit,
        poll,
        || processed() >= count,
        || format!("only {} of {count} records processed", processed()),
    )
    .await;
}

/// Implements `Deref` and `DerefMut` to [`Fleet`] for a test's own fleet
/// type `$ty` that holds one in its field `$field`: the test then reads
/// the table and the workers (`fleet.store`, `fleet.workers[i]`,
/// `fleet.stop(i)`) as if its type were a [`Fleet`], next to its own
/// processors and settings.
#[macro_export]
macro_rules! deref_fleet {
    ($ty:ty, $field:ident) => {
        impl ::std::ops::Deref for $ty {
            type Target = $crate::test_util::fleet::Fleet;
            fn deref(&self) -> &Self::Target {
                &self.$field
            }
        }

        impl ::std::ops::DerefMut for $ty {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.$field
            }
        }
    };
}

/// Puts `per_key` records for each of `keys` partition keys (`pk-0`,
/// `pk-1`, ...) into `stream`, numbering each key's records from `from`:
/// record `n` of `pk-k` reads `"pk-k:n"` (see [`parse`]).
pub fn produce(source: &InMemoryShardSource, stream: &str, keys: usize, from: u64, per_key: u64) {
    for n in from..from + per_key {
        for k in 0..keys {
            let pk = format!("pk-{k}");
            source
                .put(stream, &pk, format!("{pk}:{n}"))
                .expect("the stream has an open shard");
        }
    }
}

/// The partition key and number of a record [`produce`] wrote.
pub fn parse(data: &[u8]) -> (String, u64) {
    let s = std::str::from_utf8(data).expect("a produced record is UTF-8");
    let (pk, n) = s.split_once(':').expect("a produced record reads pk:n");
    (
        pk.to_owned(),
        n.parse().expect("a produced record's number"),
    )
}

/// Each partition key's record numbers, in the order given.
pub fn by_key<'a>(records: impl IntoIterator<Item = (&'a str, u64)>) -> BTreeMap<String, Vec<u64>> {
    let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (pk, n) in records {
        m.entry(pk.to_owned()).or_default().push(n);
    }
    m
}

/// What [`Payloads`] processors saw: (shard, payload), in the order
/// processed, fleet-wide.
pub type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A processor that keeps every payload it is given with its shard, and
/// checkpoints after each batch, at the shard's end and at shutdown.
#[derive(Debug)]
pub struct Payloads {
    shard: String,
    seen: Seen,
}

impl Payloads {
    /// A factory of processors keeping what they see in `seen`.
    pub fn factory(seen: &Seen) -> impl Fn(&ShardContext) -> Payloads + Send + Sync + 'static {
        let seen = Arc::clone(seen);
        move |ctx: &ShardContext| Payloads {
            shard: ctx.shard_id.clone(),
            seen: Arc::clone(&seen),
        }
    }
}

#[async_trait]
impl RecordProcessor for Payloads {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        {
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            for r in &batch.records {
                seen.push((
                    self.shard.clone(),
                    String::from_utf8_lossy(&r.data).into_owned(),
                ));
            }
        }
        cp.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        cp.checkpoint().await?;
        Ok(())
    }
}
