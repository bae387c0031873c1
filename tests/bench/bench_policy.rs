//! What a checkpoint policy saves under load: the DynamoDB requests of a
//! busy fleet whose processor calls `checkpoint()` after every batch, once
//! with `CheckpointPolicy::every(5 s)` and once writing every call.
//!
//! With polling's fast pacing a shard at 5 records/s is read in small
//! batches, a couple a second, and a checkpoint per batch is a lease-table
//! write per batch: the bulk of a busy fleet's bill. The policy bounds that
//! to one write per shard per period; this measures both, on whole workers
//! (the `kcl` facade at its defaults) reading the Kinesis emulator, on a
//! lease table in DynamoDB Local.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use futures::TryStreamExt;
use kcl::{
    CheckpointPolicy, Checkpointer, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
    Worker,
};
use kcl_core::Lease;
use kcl_core::store::metered::{StoreSnapshot, StoreStats};
use kcl_core::store::{LeaseStore, StoreOp};
use kcl_dynamodb::DynamoDbLeaseStore;
use kcl_tests::{
    TestEnv, create_stream, delete_stream, delete_table, list_all_shards, put_entries, unique_name,
};
use tokio::time::Instant;

use crate::Section;
use crate::bench_cost::{ops_per_min, worker_index};

const WORKERS: usize = 2;
const SHARDS: usize = 8;
/// Records a second over the whole stream, spread evenly over the shards.
const RATE: u64 = 40;
const POLICY: Duration = Duration::from_secs(5);
/// A longer period, for comparison: half the writes of [`POLICY`].
const POLICY_LONG: Duration = Duration::from_secs(10);
/// After the fleet is balanced: the handoffs' new tenures (whose first
/// write goes at once) and the taker's view settle within a tick, and the
/// watchers learn when each peer's beats land (a read in the middle of a
/// halving window each beat interval, about 6 extra reads over 30 s once
/// per peer; counted in the window, they made 16 reads a worker a minute
/// instead of the steady 12).
const SETTLE: Duration = Duration::from_secs(40);
const WINDOW: Duration = Duration::from_secs(60);
/// What the policy promises: at most one checkpoint write per shard per
/// period, and the writes of a worker's shards due together go in one
/// request (a `BatchExecuteStatement`), so the busy fleet costs the idle
/// fleet's requests (at most 50 a minute for 2 x 8) plus one request per
/// worker per period (24 a minute): under 100, the bound the run fails
/// above.
const LIMIT: f64 = 100.0;

/// Asks for a checkpoint after every batch: the processor a policy is for.
struct CheckpointEveryBatch {
    records: Arc<AtomicU64>,
    batches: Arc<AtomicU64>,
}

#[kcl::async_trait]
impl RecordProcessor for CheckpointEveryBatch {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        self.records
            .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        cp.checkpoint().await?;
        Ok(())
    }
}

/// Puts `RATE` records a second, one round over every shard at a time
/// (explicit hash keys: each shard gets its share), until `stop`.
async fn produce(
    kinesis: aws_sdk_kinesis::Client,
    stream: String,
    hashes: Vec<String>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<u64> {
    let every = Duration::from_secs(1) * hashes.len() as u32 / RATE as u32;
    let started = Instant::now();
    let mut put = 0u64;
    for round in 0u32.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let entries = hashes
            .iter()
            .enumerate()
            .map(|(i, hash)| {
                PutRecordsRequestEntry::builder()
                    .partition_key(format!("pk-{i}"))
                    .explicit_hash_key(hash)
                    .data(Blob::new(format!("{round}")))
                    .build()
                    .context("PutRecordsRequestEntry")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let out = put_entries(&kinesis, &stream, entries).await?;
        put += hashes.len() as u64 - u64::try_from(out.failed_record_count().unwrap_or(0))?;
        // Paced from the start, so a slow put does not lower the rate.
        tokio::time::sleep_until(started + every * (round + 1)).await;
    }
    Ok(put)
}

/// A worker of the fleet: its handle, its task and its lease-table counters.
type Running = (
    kcl::WorkerHandle,
    tokio::task::JoinHandle<Result<(), kcl::Error>>,
    Arc<StoreStats>,
);

/// One measured fleet.
struct Busy {
    requests_per_min: f64,
    checkpoints_per_min: f64,
    records_per_s: f64,
    batches_per_s: f64,
    by_op: Vec<(StoreOp, f64)>,
    balanced_after: Duration,
    /// Shards whose checkpoint moved during the window.
    shards_checkpointed: usize,
}

/// True when the `WORKERS` workers hold every shard, evenly, with no
/// handoff running.
fn balanced(leases: &[Lease]) -> bool {
    let mut counts = [0usize; WORKERS];
    for w in leases.iter().filter_map(worker_index) {
        if w < WORKERS {
            counts[w] += 1;
        }
    }
    leases.len() == SHARDS
        && counts.iter().sum::<usize>() == SHARDS
        && counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1
        && leases.iter().all(|l| l.checkpoint_owner.is_none())
}

/// `WORKERS` facade workers at their defaults (but `policy`) on a fresh
/// `SHARDS`-shard stream under `RATE` records/s, balanced and settled, then
/// their lease-table requests counted for `WINDOW`.
async fn busy_fleet(env: &TestEnv, policy: Option<Duration>) -> anyhow::Result<Busy> {
    let stream = unique_name("kcl-bench-policy");
    let app = unique_name("kcl-bench-policy-app");
    create_stream(env.kinesis(), &stream, SHARDS as i32).await?;
    let hashes: Vec<String> = list_all_shards(env.kinesis(), &stream)
        .await?
        .iter()
        .filter_map(|s| s.hash_key_range().map(|r| r.starting_hash_key().to_owned()))
        .collect();
    ensure!(hashes.len() == SHARDS, "{} shards listed", hashes.len());
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce(
        env.kinesis().clone(),
        stream.clone(),
        hashes,
        Arc::clone(&stop),
    ));
    let (records, batches) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut fleet: Vec<Running> = Vec::new();
    for w in 0..WORKERS {
        let (records, batches) = (Arc::clone(&records), Arc::clone(&batches));
        let builder = Worker::builder(&app)
            .stream(&stream)
            .sdk_config(env.sdk_config())
            .worker_id(format!("w-{w}"));
        let builder = match policy {
            Some(period) => builder.checkpoint_policy(CheckpointPolicy::every(period)),
            None => builder,
        };
        let worker = builder
            .processor(move |_: &ShardContext| CheckpointEveryBatch {
                records: Arc::clone(&records),
                batches: Arc::clone(&batches),
            })
            .build()?;
        let (handle, stats) = (worker.handle(), worker.store_stats());
        fleet.push((handle, tokio::spawn(worker.run()), stats));
    }
    // Read the way the workers read it; missing until a worker made it.
    let table = DynamoDbLeaseStore::new(env.dynamodb().clone(), &app);
    let started = Instant::now();
    let balanced_after = loop {
        let leases: Vec<Lease> = table.scan().try_concat().await.unwrap_or_default();
        if balanced(&leases) {
            break started.elapsed();
        }
        ensure!(
            started.elapsed() < Duration::from_secs(300),
            "{WORKERS} x {SHARDS} did not balance within 300 s"
        );
        ensure!(!producer.is_finished(), "the producer stopped");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    tokio::time::sleep(SETTLE).await;
    let snapshot = |fleet: &[Running]| -> Vec<StoreSnapshot> {
        fleet.iter().map(|(_, _, s)| s.snapshot()).collect()
    };
    // A failed scan fails the run: an empty "before" would count every
    // shard as moved.
    let checkpoints = || async {
        let leases: Vec<Lease> = table.scan().try_concat().await?;
        anyhow::Ok(
            leases
                .into_iter()
                .map(|l| (l.key, l.checkpoint))
                .collect::<std::collections::HashMap<_, _>>(),
        )
    };
    let checkpoints_before = checkpoints().await?;
    let before = snapshot(&fleet);
    let (records0, batches0) = (
        records.load(Ordering::Relaxed),
        batches.load(Ordering::Relaxed),
    );
    let window = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let after = snapshot(&fleet);
    let checkpoints_after = checkpoints().await?;
    let shards_checkpointed = checkpoints_after
        .iter()
        .filter(|(key, cp)| checkpoints_before.get(*key) != Some(cp))
        .count();
    let secs = window.elapsed().as_secs_f64();
    let (records1, batches1) = (
        records.load(Ordering::Relaxed),
        batches.load(Ordering::Relaxed),
    );
    ensure!(!producer.is_finished(), "the producer stopped");
    let per_min = 60.0 / secs;
    let mut by_op: Vec<(StoreOp, f64)> = StoreOp::ALL.iter().map(|&op| (op, 0.0)).collect();
    for (a, b) in after.iter().zip(&before) {
        let d = a.since(b);
        for (op, n) in &mut by_op {
            *n += d.op(*op).calls as f64 * per_min;
        }
    }
    for (handle, _, _) in &fleet {
        handle.shutdown();
    }
    for (_, task, _) in fleet {
        task.await??;
    }
    stop.store(true, Ordering::Relaxed);
    producer.await??;
    let _ = delete_stream(env.kinesis(), &stream).await;
    let _ = delete_table(env.dynamodb(), table.workers_table()).await;
    let _ = delete_table(env.dynamodb(), &app).await;
    let requests_per_min = by_op.iter().map(|(_, n)| n).sum();
    let checkpoints_per_min = by_op
        .iter()
        .find(|(op, _)| *op == StoreOp::Checkpoint)
        .map_or(0.0, |(_, n)| *n);
    by_op.retain(|(_, n)| *n > 0.0);
    Ok(Busy {
        requests_per_min,
        checkpoints_per_min,
        records_per_s: (records1 - records0) as f64 / secs,
        batches_per_s: (batches1 - batches0) as f64 / secs,
        by_op,
        balanced_after,
        shards_checkpointed,
    })
}

pub(crate) async fn checkpoint_policy_cost() -> anyhow::Result<Section> {
    let env = TestEnv::connect().await?;
    // One after the other: how many batches the processors see, so how
    // many checkpoint() calls there are, depends on the pacing, which a
    // second fleet loading the same cores and emulators would change.
    let with = busy_fleet(&env, Some(POLICY)).await?;
    let long = busy_fleet(&env, Some(POLICY_LONG)).await?;
    let without = busy_fleet(&env, None).await?;
    let mut s = Section::new("DynamoDB cost under load, with and without a checkpoint policy");
    s.what = format!(
        "{WORKERS} workers (the `kcl` facade at its defaults) on a {SHARDS}-shard stream of \
         the Kinesis emulator receiving {RATE} records/s (spread evenly over the shards), a \
         processor that calls `checkpoint()` after every batch, the lease table in DynamoDB \
         Local: once with `CheckpointPolicy::every({} s)`, once with every({} s), once \
         writing every call. Each \
         fleet is balanced, left {:.0} s to settle, then every lease-table request of both \
         workers counted for {:.0} s.",
        POLICY.as_secs(),
        POLICY_LONG.as_secs(),
        SETTLE.as_secs_f64(),
        WINDOW.as_secs_f64()
    );
    for (name, figure, r) in [
        (
            format!("policy every {} s", POLICY.as_secs()),
            "ddb_requests_per_min_2x8_40rps_policy_5s",
            &with,
        ),
        (
            format!("policy every {} s", POLICY_LONG.as_secs()),
            "ddb_requests_per_min_2x8_40rps_policy_10s",
            &long,
        ),
        (
            "no policy (every call writes)".to_owned(),
            "ddb_requests_per_min_2x8_40rps_no_policy",
            &without,
        ),
    ] {
        s.row(
            &name,
            format!(
                "{:.0} req/min ({}); {:.0} single checkpoint writes/min for {:.1} batches/s, \
                 {:.1} records/s; balanced {:.0} s after start",
                r.requests_per_min,
                ops_per_min(&r.by_op),
                r.checkpoints_per_min,
                r.batches_per_s,
                r.records_per_s,
                r.balanced_after.as_secs_f64()
            ),
        );
        s.figure(figure, r.requests_per_min.round(), "requests/min");
    }
    s.fail_if(
        with.requests_per_min > LIMIT,
        format!(
            "{:.0} requests/min under the policy, above {LIMIT}",
            with.requests_per_min
        ),
    );
    // A fleet that fell behind reads bigger batches: its figures would not
    // be those of 40 records/s.
    for (name, r) in [
        ("with the policy", &with),
        ("with the longer policy", &long),
        ("without", &without),
    ] {
        s.fail_if(
            r.shards_checkpointed < SHARDS,
            format!(
                "{name}: {} of {SHARDS} shards checkpointed during the window",
                r.shards_checkpointed
            ),
        );
        s.fail_if(
            r.records_per_s < RATE as f64 * 0.9,
            format!(
                "{name}: the fleet processed {:.1} records/s of {RATE}",
                r.records_per_s
            ),
        );
    }
    s.headline = format!(
        "2 x 8 at {RATE} records/s, a checkpoint() per batch: {:.0} DynamoDB requests/min \
         with a policy of {} s, {:.0} with {} s, {:.0} without",
        with.requests_per_min,
        POLICY.as_secs(),
        long.requests_per_min,
        POLICY_LONG.as_secs(),
        without.requests_per_min
    );
    s.settings = format!(
        "Production defaults (lease 10 s, a taker tick every 10 s +/-25 %, worker-liveness \
         renewal, polling pacing) but the checkpoint policy; the policy writes at most once \
         per shard per {} s (at most {} item writes/min for {SHARDS} busy shards, billed as single \
         writes), and a worker's writes due together go in one request: about {} \
         requests/min on top of the idle fleet's, whatever the batch rate.",
        POLICY.as_secs(),
        SHARDS as u64 * 60 / POLICY.as_secs(),
        WORKERS as u64 * 60 / POLICY.as_secs()
    );
    s.java = "The Java KCL has no checkpoint policy: it writes every checkpoint() call, as \
              kcl does without one."
        .into();
    s.limits = "Without the policy, the batch rate: faster pacing or a busier machine changes \
                how many batches (so checkpoint() calls) there are. With it, nothing \
                machine-bound: the item writes follow from the period and the shard count, the \
                requests from the period and the worker count (a shard whose consumer is \
                busy in its processor at the boundary joins the batch late, or goes in a \
                request of its own)."
        .into();
    Ok(s)
}
