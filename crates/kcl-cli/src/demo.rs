//! The demo: three kcl workers sharing one stream, in one process. `kcl
//! demo` and `make demo` (the `demo` example, a thin `main` around
//! [`run`]) both run it.
//!
//! It creates a 4-shard stream `kcl-demo-<random>`, produces about 100
//! records a second for a minute, and starts three `kcl::Worker`s of the
//! same application a few seconds apart, so you can watch the leases move:
//! worker-1 takes every shard, then worker-2 and worker-3 take shards from
//! it until each holds its share. Every second it prints what each worker
//! consumes. At the end (after about a minute, or on Ctrl-C) it stops the
//! producer, waits until every record was processed, shuts the workers down
//! gracefully, checks that every produced record was processed, and deletes
//! the stream and the lease table.
//!
//! `make demo` starts the local emulators first; `kcl demo` uses the
//! environment as it is. It refuses to run against real AWS unless
//! `KCL_DEMO_ALLOW_REAL_AWS=1`. `RUST_LOG=info` (default `warn`) shows the
//! workers' logs.
//!
//! # Concurrency model
//!
//! [`run`] owns every task: the producer and the three workers, each
//! spawned once and joined before the summary. The per-second report runs
//! in [`run`] itself. The producer stops through a `watch` channel, the workers
//! through their `WorkerHandle`s. The processors of all three workers share
//! one `Tracker` (a mutex taken once per batch, plus atomic counters).

use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use aws_config::{BehaviorVersion, SdkConfig};
use kcl::core::source::ShardSource as _;
use kcl::{
    Checkpointer, InitialPosition, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
    Worker, WorkerHandle, WorkerStatus,
};
use kcl_kinesis::KinesisShardSource;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

const SHARDS: i32 = 4;
const WORKERS: usize = 3;
/// worker-1 starts at once, worker-2 this much later, worker-3 twice that.
const WORKER_STAGGER: Duration = Duration::from_secs(10);
const PRODUCE_FOR: Duration = Duration::from_secs(60);
const PARTITION_KEYS: u64 = 8;
/// 10 records every 100 ms: about 100 records/s.
const RECORDS_PER_PUT: u64 = 10;
const PUT_EVERY: Duration = Duration::from_millis(100);
/// How long the demo waits for the workers to process the last records.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// The workers' graceful-shutdown budget, and how long `main` waits for it.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
const JOIN_TIMEOUT: Duration = Duration::from_secs(20);

mod producer;
pub mod resources;

use producer::{parse_payload, payload, produce};
use resources::{create_stream, delete_stream, delete_table};

/// Runs the demo and returns its exit status: success when every produced
/// record was processed. The per-second lines go to stdout; logs (if the
/// caller set up logging, see [`crate::init_logging`]) to stderr.
pub async fn run() -> ExitCode {
    match setup_run_and_clean_up().await {
        Ok(Verdict::Ok) => ExitCode::SUCCESS,
        Ok(Verdict::Mismatch) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Mismatch,
}

/// Whether both services the demo uses have a local endpoint (`set` says
/// whether a variable is set): with Kinesis's alone, the lease table was
/// created (and billed) on real DynamoDB.
fn runs_locally(set: impl Fn(&str) -> bool) -> bool {
    set("AWS_ENDPOINT_URL") || (set("AWS_ENDPOINT_URL_KINESIS") && set("AWS_ENDPOINT_URL_DYNAMODB"))
}

async fn setup_run_and_clean_up() -> anyhow::Result<Verdict> {
    let set = |v: &str| std::env::var_os(v).is_some_and(|v| !v.is_empty());
    if !runs_locally(set) && !set("KCL_DEMO_ALLOW_REAL_AWS") {
        bail!(
            "no AWS_ENDPOINT_URL, nor both AWS_ENDPOINT_URL_KINESIS and \
             AWS_ENDPOINT_URL_DYNAMODB: this would run against real AWS (a 4-shard stream \
             and a DynamoDB table, billed). Run `make demo`, which starts the local \
             emulators, or set KCL_DEMO_ALLOW_REAL_AWS=1."
        );
    }
    let sdk = aws_config::load_defaults(BehaviorVersion::latest()).await;
    let kinesis = aws_sdk_kinesis::Client::new(&sdk);
    let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);

    // One random suffix names the stream and the application (hence the
    // lease table), so runs never see each other's data or leases.
    let name = format!("kcl-demo-{:08x}", rand::random::<u32>());
    say!("creating stream {name} ({SHARDS} shards); lease table {name}");
    create_stream(&kinesis, &name, SHARDS).await?;

    let result = produce_and_consume(&sdk, &kinesis, &name).await;

    // Best effort, whatever happened: a leftover stream in the emulator is
    // harmless, so a failure here is reported, not fatal.
    if let Err(e) = delete_stream(&kinesis, &name).await {
        eprintln!("could not delete stream {name}: {e:#}");
    }
    if let Err(e) = delete_table(&dynamodb, &name).await {
        eprintln!("could not delete table {name}: {e:#}");
    }
    if result.is_ok() {
        say!("deleted stream and table {name}");
    }
    result
}

/// Produces, runs the three workers and checks what they processed: the
/// demo's three phases, then its summary.
async fn produce_and_consume(
    sdk: &SdkConfig,
    kinesis: &aws_sdk_kinesis::Client,
    name: &str,
) -> anyhow::Result<Verdict> {
    let hash_keys = shard_hash_keys(kinesis, name).await?;
    let tracker = Arc::new(Tracker::new(WORKERS));
    let produced = Arc::new(AtomicU64::new(0));
    let (stop_producer, stop_rx) = watch::channel(false);
    let producer = tokio::spawn(produce(
        kinesis.clone(),
        name.to_owned(),
        hash_keys,
        Arc::clone(&produced),
        stop_rx,
    ));

    let started = Instant::now();
    let workers: Vec<Slot> = (0..WORKERS)
        .map(|i| Slot {
            id: format!("worker-{}", i + 1),
            starts_at: started + WORKER_STAGGER * i as u32,
            running: None,
        })
        .collect();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut demo = Demo {
        sdk,
        name,
        tracker,
        produced,
        started,
        workers,
        report: Report::new(WORKERS),
        ticker,
    };

    let interrupted = demo.run_workers().await?;

    for slot in &mut demo.workers {
        // Interrupted early: those not started yet will not start.
        slot.starts_at = slot.starts_at.min(Instant::now());
    }

    // Phase 2: stop the producer, then wait (bounded) until every record
    // it put was processed.
    say!(
        "       {}stopping the producer; waiting for the workers to catch up",
        if interrupted { "interrupted: " } else { "" }
    );
    let _ = stop_producer.send(true);
    let produced_set = producer.await.context("the producer panicked")??;
    demo.catch_up(&produced_set).await?;

    let statuses = demo.shut_down().await?;
    Ok(demo.summary(&produced_set, &statuses))
}

/// The state the demo's phases share: the workers, what they processed,
/// what was produced, and the per-second report.
struct Demo<'a> {
    sdk: &'a SdkConfig,
    name: &'a str,
    tracker: Arc<Tracker>,
    /// Records Kinesis accepted so far (the producer's running count).
    produced: Arc<AtomicU64>,
    started: Instant,
    workers: Vec<Slot>,
    report: Report,
    ticker: tokio::time::Interval,
}

impl Demo<'_> {
    /// Phase 1: produce, start the workers one by one, report every
    /// second, until the production time is over. True if Ctrl-C cut it
    /// short.
    async fn run_workers(&mut self) -> anyhow::Result<bool> {
        let signal = kcl::shutdown_signal();
        tokio::pin!(signal);
        Ok(loop {
            tokio::select! {
                _ = self.ticker.tick() => {}
                () = &mut signal => break true,
            }
            for (index, slot) in self.workers.iter_mut().enumerate() {
                if slot.running.is_none() && Instant::now() >= slot.starts_at {
                    slot.start(self.sdk, self.name, index, &self.tracker)?;
                    say!("       {} started", slot.id);
                }
            }
            self.check_and_report().await?;
            if self.started.elapsed() >= PRODUCE_FOR {
                break false;
            }
        })
    }

    /// Phase 2's wait, bounded: until every record in `produced_set` was
    /// processed, reporting every second.
    async fn catch_up(&mut self, produced_set: &HashSet<(u64, u64)>) -> anyhow::Result<()> {
        let deadline = Instant::now() + CATCH_UP_TIMEOUT;
        let signal = kcl::shutdown_signal();
        tokio::pin!(signal);
        while self.tracker.missing(produced_set) > 0 && Instant::now() < deadline {
            tokio::select! {
                _ = self.ticker.tick() => {}
                // A second Ctrl-C skips the wait; the summary says what is missing.
                () = &mut signal => break,
            }
            self.check_and_report().await?;
        }
        Ok(())
    }

    /// Fails if a worker stopped on its own; otherwise prints this second's
    /// line.
    async fn check_and_report(&mut self) -> anyhow::Result<()> {
        check_workers(&mut self.workers).await?;
        self.report.line(
            self.started,
            &self.workers,
            &self.tracker,
            self.produced.load(Ordering::Relaxed),
        );
        Ok(())
    }

    /// Phase 3: graceful shutdown of every worker: processors checkpoint,
    /// leases are released. Each worker's last status (`None` for one that
    /// never started), in worker order.
    async fn shut_down(&mut self) -> anyhow::Result<Vec<Option<WorkerStatus>>> {
        say!("       shutting the workers down");
        for slot in &self.workers {
            if let Some(running) = &slot.running {
                running.handle.shutdown();
            }
        }
        let deadline = Instant::now() + JOIN_TIMEOUT;
        let mut statuses = Vec::new();
        for slot in &mut self.workers {
            let Some(mut running) = slot.running.take() else {
                statuses.push(None);
                continue;
            };
            match tokio::time::timeout_at(deadline, &mut running.task).await {
                Ok(joined) => joined
                    .with_context(|| format!("{} panicked", slot.id))?
                    .with_context(|| format!("{} failed", slot.id))?,
                Err(_) => bail!("{} did not shut down within {JOIN_TIMEOUT:?}", slot.id),
            }
            statuses.push(Some(running.handle.status()));
        }
        Ok(statuses)
    }

    /// The summary: what was produced and processed, by whom, and whether
    /// every produced record was processed.
    fn summary(
        &self,
        produced_set: &HashSet<(u64, u64)>,
        statuses: &[Option<WorkerStatus>],
    ) -> Verdict {
        let tracker = &self.tracker;
        let processed = tracker.distinct();
        let missing = tracker.missing(produced_set);
        let duplicates = tracker.duplicates.load(Ordering::Relaxed);
        let unexpected = tracker.unexpected.load(Ordering::Relaxed);
        say!();
        say!("summary after {}s", self.started.elapsed().as_secs());
        say!(
            "  produced   {:>6} records over {PARTITION_KEYS} partition keys",
            produced_set.len()
        );
        say!("  processed  {processed:>6} distinct");
        say!("  duplicates {duplicates:>6} (redelivered after a lease moved; at-least-once)");
        for ((slot, total), status) in self.workers.iter().zip(&tracker.per_worker).zip(statuses) {
            let total = total.load(Ordering::Relaxed);
            match status.as_ref().map(|status| &status.leases) {
                Some(s) => say!(
                    "  {}   {total:>6} records; leases taken {}, stolen {}, handed off {}",
                    slot.id,
                    s.taken,
                    s.stolen,
                    s.handed_off
                ),
                None => say!("  {}   never started", slot.id),
            }
        }
        let mut verdict = Verdict::Ok;
        if missing > 0 {
            let examples = tracker.missing_examples(produced_set, 5);
            say!(
                "MISMATCH: {missing} produced records were never processed (for example {examples})"
            );
            verdict = Verdict::Mismatch;
        }
        if unexpected > 0 {
            say!("MISMATCH: {unexpected} processed records were not produced by this run");
            verdict = Verdict::Mismatch;
        }
        if verdict == Verdict::Ok {
            say!("OK: produced = processed ({processed})");
        }
        verdict
    }
}

// ---------------------------------------------------------------------------
// The workers and their processor
// ---------------------------------------------------------------------------

/// A worker of the demo, started when its time comes.
struct Slot {
    id: String,
    starts_at: Instant,
    running: Option<Running>,
}

struct Running {
    handle: WorkerHandle,
    task: JoinHandle<Result<(), kcl::Error>>,
}

impl Drop for Running {
    /// On an error path the worker is stopped, not left running detached
    /// while the stream and table are deleted under it. (A no-op once the
    /// task finished.)
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Slot {
    fn start(
        &mut self,
        sdk: &SdkConfig,
        name: &str,
        index: usize,
        tracker: &Arc<Tracker>,
    ) -> anyhow::Result<()> {
        let tracker = Arc::clone(tracker);
        let worker = Worker::builder(name)
            .stream(name)
            .sdk_config(sdk)
            .worker_id(&self.id)
            .initial_position(InitialPosition::TrimHorizon)
            // Short settings so that leases visibly move within a minute.
            // Production keeps the defaults (10 s): every lease is renewed
            // every lease_duration / 3, and each taker tick scans the table.
            .lease_duration(Duration::from_secs(6))
            .taker_interval(Duration::from_secs(2))
            // One steal per tick, as the Java KCL: shards move one at a
            // time, which is gentler on a real fleet and easier to watch.
            .max_leases_to_steal(1)
            .idle_time_between_reads(Duration::from_millis(200))
            .shard_sync_interval(Duration::from_secs(10))
            .shutdown_timeout(SHUTDOWN_TIMEOUT)
            .processor(move |_: &ShardContext| DemoProcessor {
                worker: index,
                tracker: Arc::clone(&tracker),
            })
            .build()
            .with_context(|| format!("building {}", self.id))?;
        let handle = worker.handle();
        self.running = Some(Running {
            handle,
            task: tokio::spawn(worker.run()),
        });
        Ok(())
    }
}

/// A worker that stops before it is told to has failed; say why.
async fn check_workers(workers: &mut [Slot]) -> anyhow::Result<()> {
    for slot in workers {
        if let Some(mut running) = slot.running.take_if(|r| r.task.is_finished()) {
            match (&mut running.task).await {
                Ok(Ok(())) => bail!("{} stopped on its own", slot.id),
                Ok(Err(e)) => return Err(e).with_context(|| format!("{} failed", slot.id)),
                Err(e) => return Err(e).with_context(|| format!("{} panicked", slot.id)),
            }
        }
    }
    Ok(())
}

/// What every processor saw, across the three workers.
struct Tracker {
    /// Payloads processed, as (partition key index, counter).
    seen: Mutex<HashSet<(u64, u64)>>,
    /// Records delivered again (a lease moved before its checkpoint).
    duplicates: AtomicU64,
    /// Records whose payload this run did not write.
    unexpected: AtomicU64,
    /// Records each worker processed, duplicates included.
    per_worker: Vec<AtomicU64>,
}

impl Tracker {
    fn new(workers: usize) -> Self {
        Tracker {
            seen: Mutex::default(),
            duplicates: AtomicU64::new(0),
            unexpected: AtomicU64::new(0),
            per_worker: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashSet<(u64, u64)>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn distinct(&self) -> usize {
        self.seen().len()
    }

    fn missing(&self, produced: &HashSet<(u64, u64)>) -> usize {
        let seen = self.seen();
        produced.iter().filter(|r| !seen.contains(r)).count()
    }

    fn missing_examples(&self, produced: &HashSet<(u64, u64)>, n: usize) -> String {
        let seen = self.seen();
        let mut missing: Vec<&(u64, u64)> = produced.iter().filter(|r| !seen.contains(r)).collect();
        missing.sort_unstable();
        missing
            .iter()
            .take(n)
            .map(|(key, counter)| payload(*key, *counter))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Records what it sees in the shared [`Tracker`] and checkpoints after
/// every batch, as a real application would once a batch's effects are
/// durable.
struct DemoProcessor {
    worker: usize,
    tracker: Arc<Tracker>,
}

#[kcl::async_trait]
impl RecordProcessor for DemoProcessor {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        {
            let mut seen = self.tracker.seen();
            for record in &batch.records {
                match parse_payload(&record.data) {
                    Some(id) => {
                        if !seen.insert(id) {
                            self.tracker.duplicates.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    None => {
                        self.tracker.unexpected.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        self.tracker.per_worker[self.worker]
            .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
        checkpointer.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        // Shutdown or a handoff to another worker: everything delivered is
        // recorded, so the next owner starts right after it.
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The per-second report
// ---------------------------------------------------------------------------

struct Report {
    last_counts: Vec<u64>,
    /// The last worker seen consuming each shard, to announce moves.
    owners: BTreeMap<String, String>,
}

impl Report {
    fn new(workers: usize) -> Self {
        Report {
            last_counts: vec![0; workers],
            owners: BTreeMap::new(),
        }
    }

    fn line(&mut self, started: Instant, workers: &[Slot], tracker: &Tracker, produced: u64) {
        let mut columns = Vec::new();
        for (i, slot) in workers.iter().enumerate() {
            let count = tracker.per_worker[i].load(Ordering::Relaxed);
            let rate = count - self.last_counts[i];
            self.last_counts[i] = count;
            let Some(running) = &slot.running else {
                // Rounded up: "starts in 0s" would read as "now".
                let wait = slot.starts_at.saturating_duration_since(Instant::now());
                let wait = wait.as_millis().div_ceil(1000);
                columns.push(if wait == 0 {
                    format!("{}: not started        ", slot.id)
                } else {
                    format!("{}: starts in {wait:>2}s      ", slot.id)
                });
                continue;
            };
            let consuming = running.handle.status().consuming;
            for key in &consuming {
                let shard = short(key);
                match self.owners.insert(shard.clone(), slot.id.clone()) {
                    Some(previous) if previous != slot.id => {
                        say!("       shard {shard} moved: {previous} -> {}", slot.id);
                    }
                    Some(_) => {}
                    None => say!("       shard {shard} taken by {}", slot.id),
                }
            }
            let shards: Vec<String> = consuming.iter().map(|k| short(k)).collect();
            columns.push(format!(
                "{}: {} [{:<7}] {rate:>3}/s",
                slot.id,
                consuming.len(),
                shards.join(" ")
            ));
        }
        say!(
            "[{:>3}s] {} | produced {produced:>5}, processed {:>5}",
            started.elapsed().as_secs(),
            columns.join(" | "),
            tracker.distinct()
        );
    }
}

/// "shardId-000000000003" -> "3".
fn short(lease_key: &str) -> String {
    let digits = lease_key
        .rsplit('-')
        .next()
        .unwrap_or(lease_key)
        .trim_start_matches('0');
    if digits.is_empty() {
        "0".to_owned()
    } else {
        digits.to_owned()
    }
}

// ---------------------------------------------------------------------------
// Stream and table
// ---------------------------------------------------------------------------

/// The starting hash key of every shard, in shard order, as kcl's own
/// shard listing (paged, throttling retried) reads them.
async fn shard_hash_keys(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
) -> anyhow::Result<Vec<String>> {
    let mut shards = KinesisShardSource::new(kinesis.clone())
        .list_shards(stream)
        .await
        .with_context(|| format!("ListShards {stream}"))?;
    ensure!(!shards.is_empty(), "stream {stream} has no shards");
    shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
    Ok(shards
        .into_iter()
        .map(|shard| shard.hash_key_range.starting)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        assert_eq!(parse_payload(payload(3, 17).as_bytes()), Some((3, 17)));
        assert_eq!(parse_payload(b"pk-3"), None);
        assert_eq!(parse_payload(&[0xff]), None);
    }

    /// Only Kinesis local would create the lease table on real DynamoDB.
    #[test]
    fn the_demo_runs_locally_only_with_both_endpoints_local() {
        let with = |vars: &'static [&'static str]| move |v: &str| vars.contains(&v);
        assert!(runs_locally(with(&["AWS_ENDPOINT_URL"])));
        assert!(runs_locally(with(&[
            "AWS_ENDPOINT_URL_KINESIS",
            "AWS_ENDPOINT_URL_DYNAMODB"
        ])));
        assert!(!runs_locally(with(&["AWS_ENDPOINT_URL_KINESIS"])));
        assert!(!runs_locally(with(&["AWS_ENDPOINT_URL_DYNAMODB"])));
        assert!(!runs_locally(with(&[])));
    }

    #[test]
    fn short_shard_names() {
        assert_eq!(short("shardId-000000000003"), "3");
        assert_eq!(short("shardId-000000000000"), "0");
        assert_eq!(short("shardId-000000000012"), "12");
    }
}
