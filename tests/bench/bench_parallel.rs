//! Parallel lanes inside a shard: records a second through one shard when
//! the processor spends 10 ms on each record (a database or HTTP call), in
//! 1, 2, 5 and 10 lanes over many keys, and in 10 lanes over one key (which
//! must change nothing, and keep the key's order).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use kcl::{
    Checkpointer, InitialPosition, ProcessorError, ProcessorFactory, RecordBatch, RecordProcessor,
    ShardContext,
};
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::worker::{StreamSpec, Worker, WorkerConfig};
use kcl_core::{LeaseConfig, LeaseLayout};

use crate::Section;

const STREAM: &str = "parallel";
/// Per-record work of the processor.
const WORK: Duration = Duration::from_millis(10);
/// Keys of the many-keys runs, round-robin.
const KEYS: usize = 1000;
/// Each run processes about this many seconds' worth at the ideal rate.
const SECONDS: u64 = 4;

/// Sleeps `WORK` per record, logs each record's (key, number).
struct Sleeper {
    done: Arc<AtomicU64>,
    order: Arc<Mutex<Vec<(usize, u64)>>>,
}

#[kcl::async_trait]
impl RecordProcessor for Sleeper {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        for r in &batch.records {
            tokio::time::sleep(WORK).await;
            let text = std::str::from_utf8(&r.data)?;
            let (key, n) = text.split_once(':').context("payload key:n")?;
            self.order
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((key.parse()?, n.parse()?));
            self.done.fetch_add(1, Ordering::Relaxed);
        }
        cp.checkpoint().await?;
        Ok(())
    }
}

/// Records a second through one shard in `lanes` lanes over `keys` keys,
/// and whether every key's records kept their order.
/// A worker of application `app` in `lanes` lanes per shard over
/// `source`'s `stream` (read from the trim horizon) and a fresh in-memory
/// lease table.
pub(crate) fn lanes_worker(
    app: &str,
    stream: &str,
    lanes: usize,
    source: InMemoryShardSource,
    factory: impl ProcessorFactory,
) -> anyhow::Result<Worker> {
    let lease = LeaseConfig::builder(app).build()?;
    let config = WorkerConfig::builder(lease)
        .stream(StreamSpec {
            name: stream.into(),
            layout: LeaseLayout::SingleStream,
        })
        .initial_position(InitialPosition::TrimHorizon)
        .parallelism_per_shard(lanes)
        .build()?;
    Ok(Worker::new(
        config,
        Arc::new(InMemoryLeaseStore::new()),
        Arc::new(source),
        Arc::new(factory),
    ))
}

async fn run(lanes: usize, keys: usize) -> anyhow::Result<(f64, bool)> {
    let total = (lanes.min(keys) as u64 * 100 * SECONDS).max(200);
    let source = InMemoryShardSource::new().with_max_records(500);
    source.create_stream(STREAM, 1);
    for i in 0..total {
        let key = (i as usize) % keys;
        let n = i / keys as u64;
        source
            .put(STREAM, &format!("k{key}"), format!("{key}:{n}"))
            .context("putting a record")?;
    }
    let done = Arc::new(AtomicU64::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let factory = {
        let (done, order) = (Arc::clone(&done), Arc::clone(&order));
        move |_: &ShardContext| Sleeper {
            done: Arc::clone(&done),
            order: Arc::clone(&order),
        }
    };
    let worker = lanes_worker("bench-parallel", STREAM, lanes, source, factory)?;
    let handle = worker.handle();
    let task = tokio::spawn(worker.run());
    // Timed from the first record done, so the lease take is not counted.
    let wait = |target: u64| {
        let done = Arc::clone(&done);
        async move {
            let limit = Instant::now() + Duration::from_secs(120);
            while done.load(Ordering::Relaxed) < target {
                ensure!(
                    Instant::now() < limit,
                    "only {} of {target} records in 120 s",
                    done.load(Ordering::Relaxed)
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok(Instant::now())
        }
    };
    let first = wait(1).await?;
    let last = wait(total).await?;
    handle.shutdown();
    task.await??;
    let rate = (total - 1) as f64 / (last - first).as_secs_f64();
    let order = order.lock().unwrap_or_else(|e| e.into_inner());
    let mut next = vec![0u64; keys];
    let in_order = order.iter().all(|(key, n)| {
        let ok = *n == next[*key];
        next[*key] += 1;
        ok
    });
    Ok((rate, in_order))
}

pub(crate) async fn lanes() -> anyhow::Result<Section> {
    let mut s = Section::new("Parallel lanes inside a shard");
    s.what = format!(
        "One shard of the in-memory source, a processor that sleeps {} ms per record \
         (a call to a database or an HTTP service) and checkpoints each batch, batches of \
         up to 500. Records a second from the first record done to the last, with \
         `parallelism_per_shard(n)`: {KEYS} partition keys round-robin, then one key. \
         The ideal is n x 100/s with many keys, and 100/s with one.",
        WORK.as_millis()
    );
    let mut rates = Vec::new();
    for (lanes, name) in [
        (1, "parallel_records_per_s_n1"),
        (2, "parallel_records_per_s_n2"),
        (5, "parallel_records_per_s_n5"),
        (10, "parallel_records_per_s_n10"),
    ] {
        let (rate, in_order) = run(lanes, KEYS).await?;
        ensure!(in_order, "{lanes} lanes broke a key's order");
        s.row(
            &format!("n = {lanes}, {KEYS} keys"),
            format!(
                "{rate:.0} records/s ({:.0}% of n x 100/s)",
                rate / lanes as f64
            ),
        );
        s.figure(name, rate.round(), "records/s");
        rates.push(rate);
    }
    let (one_key, in_order) = run(10, 1).await?;
    ensure!(in_order, "10 lanes over one key broke its order");
    s.row(
        "n = 10, 1 key",
        format!("{one_key:.0} records/s, order kept (one key has one lane)"),
    );
    s.figure(
        "parallel_records_per_s_one_key_n10",
        one_key.round(),
        "records/s",
    );
    s.headline = format!(
        "{:.0} records/s in 10 lanes against {:.0} in 1 ({:.1}x) for a 10 ms/record processor on one shard; one key stays at {one_key:.0}/s, in order",
        rates[3],
        rates[0],
        rates[3] / rates[0]
    );
    s.settings = "Defaults otherwise (lease 10 s, taker 10 s); multi-threaded tokio runtime; \
                  release build; in-memory store and source, so the figure is kcl's \
                  scheduling, not the network."
        .into();
    s.java = "The Java KCL has no per-shard parallelism: one record processor per shard, \
              one batch at a time, so the n = 1 row is its ceiling for this processor \
              (AWS Lambda's parallelization factor, up to 10, is the nearest feature)."
        .into();
    s.limits = "A key always goes to the lane its hash picks, so lanes get unequal shares \
                of 1000 keys and the busiest lane sets the pace; the fetch stops while \
                any lane has two batches waiting. Tokio's timer rounds each sleep up to \
                the next millisecond."
        .into();
    Ok(s)
}
