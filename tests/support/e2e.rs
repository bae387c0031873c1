//! The acceptance scenarios' shared parts: what a processor records about
//! each batch, the verdict over all of them (loss, duplicates, per-key
//! order, two workers on one shard at once), and worker processes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::{TestEnv, TestRecord, create_stream, put_records, unique_name};

/// One batch as a processor handled it. Times are wall-clock nanoseconds:
/// every worker of a test runs on this host, so they share the clock.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BatchLog {
    /// The worker id.
    pub worker: String,
    /// The shard id.
    pub shard: String,
    /// When `process_records` started.
    pub start_ns: u128,
    /// When it returned.
    pub end_ns: u128,
    /// The lease tenure the batch ran under (two processes with one worker
    /// id hold different tenures).
    #[serde(default)]
    pub tenure: String,
    /// `(key, counter)` of each record, in delivery order.
    pub records: Vec<(u32, u64)>,
}

/// Wall-clock nanoseconds since the epoch.
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

impl BatchLog {
    /// A log entry for `records` of `ctx`'s shard processed under `cp`'s
    /// tenure (payloads that do not parse are dropped).
    pub fn new(
        ctx: &kcl::ShardContext,
        start_ns: u128,
        cp: &kcl::Checkpointer,
        records: &[kcl::Record],
    ) -> Self {
        BatchLog {
            worker: ctx.worker_id.clone(),
            shard: ctx.shard_id.clone(),
            start_ns,
            end_ns: now_ns(),
            tenure: cp.lease_tenure().to_owned(),
            records: records
                .iter()
                .filter_map(|r| TestRecord::parse(&r.data))
                .map(|t| (t.key, t.counter))
                .collect(),
        }
    }

    /// Appends this entry to a batch log as one JSON line, in one write:
    /// every shard's processor of a process appends to the same file, and
    /// the text and its newline written apart could interleave with
    /// another shard's line into one that does not parse.
    pub fn append_to(&self, log: &mut impl std::io::Write) -> std::io::Result<()> {
        let line = serde_json::to_string(self)?;
        log.write_all(format!("{line}\n").as_bytes())?;
        log.flush()
    }
}

/// When `shard`'s first batch started and its last one ended, in
/// nanoseconds (`None` if it had no batch).
pub fn shard_span_ns(batches: &[BatchLog], shard: &str) -> Option<(u128, u128)> {
    let of_shard = batches.iter().filter(|b| b.shard == shard);
    let first_start = of_shard.clone().map(|b| b.start_ns).min()?;
    let last_end = of_shard.map(|b| b.end_ns).max()?;
    Some((first_start, last_end))
}

/// What the batches of a run show.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Records produced and never processed.
    pub missing: Vec<(u32, u64)>,
    /// Deliveries of records already processed.
    pub duplicates: usize,
    /// Records first processed out of order within their key.
    pub order_violations: Vec<String>,
    /// Moments two workers processed the same shard at once.
    pub overlaps: Vec<String>,
    /// Records processed per worker.
    pub per_worker: BTreeMap<String, usize>,
}

/// The summary a test prints: duplicates, and records per worker.
impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "duplicates {}, per worker {:?}",
            self.duplicates, self.per_worker
        )
    }
}

impl Verdict {
    /// Fails with the details unless nothing was lost, order held and no
    /// shard was processed by two workers at once.
    pub fn assert_correct(&self) {
        self.assert_complete_in_order();
        assert!(
            self.overlaps.is_empty(),
            "shards processed by two workers at once: {:?}",
            self.overlaps
        );
    }

    /// Fails with the details unless nothing was lost and order held (what
    /// [`assert_correct`](Self::assert_correct) checks but the overlaps).
    pub fn assert_complete_in_order(&self) {
        assert!(
            self.missing.is_empty(),
            "{} records lost, first: {:?}",
            self.missing.len(),
            &self.missing[..self.missing.len().min(10)]
        );
        assert!(
            self.order_violations.is_empty(),
            "per-key order broken: {:?}",
            &self.order_violations[..self.order_violations.len().min(10)]
        );
    }
}

/// Checks `batches` against the records produced: `keys` keys with
/// counters `0..per_key`.
pub fn verify(batches: &[BatchLog], keys: u32, per_key: u64) -> Verdict {
    verify_skipping(batches, keys, per_key, &HashSet::new())
}

/// [`verify`], where the records `skipped` (set aside as poison) are not
/// expected in any batch.
pub fn verify_skipping(
    batches: &[BatchLog],
    keys: u32,
    per_key: u64,
    skipped: &HashSet<(u32, u64)>,
) -> Verdict {
    let mut verdict = Verdict::default();
    let mut ordered: Vec<&BatchLog> = batches.iter().collect();
    ordered.sort_by_key(|b| (b.start_ns, b.end_ns));

    // Per key: each record's first delivery must be the next expected one;
    // a replay after a crash (from the last checkpoint) counts as duplicates.
    let mut next: HashMap<u32, u64> = HashMap::new();
    for b in &ordered {
        *verdict.per_worker.entry(b.worker.clone()).or_default() += b.records.len();
        for &(key, counter) in &b.records {
            let expected = next.entry(key).or_default();
            while skipped.contains(&(key, *expected)) {
                *expected += 1;
            }
            if counter == *expected {
                *expected += 1;
            } else if counter < *expected {
                verdict.duplicates += 1;
            } else {
                verdict.order_violations.push(format!(
                    "pk-{key}: {counter} before {expected} (worker {}, shard {})",
                    b.worker, b.shard
                ));
                *expected = counter + 1;
            }
        }
    }
    for key in 0..keys {
        let done = next.get(&key).copied().unwrap_or(0);
        verdict.missing.extend(
            (done..per_key)
                .map(|c| (key, c))
                .filter(|r| !skipped.contains(r)),
        );
    }

    let mut by_shard: HashMap<&str, Vec<&BatchLog>> = HashMap::new();
    for b in &ordered {
        by_shard.entry(&b.shard).or_default().push(b);
    }
    for (shard, list) in by_shard {
        let mut busy_until: Option<(&str, u128)> = None;
        for b in list {
            if let Some((worker, until)) = busy_until
                && worker != b.worker
                && b.start_ns < until
            {
                verdict.overlaps.push(format!(
                    "{shard}: {} started {} ms before {worker} finished",
                    b.worker,
                    (until - b.start_ns) / 1_000_000
                ));
            }
            if busy_until.is_none_or(|(_, until)| b.end_ns > until) {
                busy_until = Some((&b.worker, b.end_ns));
            }
        }
    }
    verdict
}

/// Opens the batch log at `path` for appending (created if missing): a
/// worker process's processors all append to it. Panics when it cannot,
/// as a processor factory has no error to return.
pub fn open_log(path: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {path}: {e}"))
}

/// A worker running in this process: its handle and its task.
pub type Running = (
    kcl::WorkerHandle,
    tokio::task::JoinHandle<Result<(), kcl::Error>>,
);

/// Shuts every worker of `running` down, then waits for each to end
/// without an error.
pub async fn shutdown_all(running: Vec<Running>) {
    for (h, _) in &running {
        h.shutdown();
    }
    for (_, t) in running {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("a worker ended with an error: {e:?}"),
            Err(e) => panic!("a worker's task failed: {e}"),
        }
    }
}

/// Starts `worker` on a task of its own.
pub fn start(worker: kcl::Worker) -> Running {
    (worker.handle(), tokio::spawn(worker.run()))
}

/// The end of most in-process scenarios: waits until `log` holds every
/// record `s` produced (at most `limit`), shuts `running` down and checks
/// the batches; the batches and the verdict.
pub async fn complete_then_shut_down(
    s: &Scenario,
    log: &RecordedBatches,
    running: Vec<Running>,
    limit: Duration,
) -> (Vec<BatchLog>, Verdict) {
    let batches = wait_complete(|| log.all(), s.produced, limit).await;
    shutdown_all(running).await;
    let verdict = verify(&batches, KEYS, s.produced);
    (batches, verdict)
}

/// Reads every batch log line from the files in `dir`.
pub fn read_logs(dir: &Path) -> anyhow::Result<Vec<BatchLog>> {
    let mut batches = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            // A process killed mid-write leaves at most one torn last line.
            if let Ok(b) = serde_json::from_str(line) {
                batches.push(b);
            }
        }
    }
    Ok(batches)
}

/// How an `e2e-worker` process checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointMode {
    /// After every batch (and on shutdown).
    EveryBatch,
    /// Only in `shutdown_requested` (and at shard end).
    OnShutdown,
}

/// Settings of the `e2e-worker` processes of one test.
#[derive(Debug, Clone)]
pub struct WorkerProcessConfig {
    /// The path of the `e2e-worker` binary.
    pub binary: PathBuf,
    /// Application (and lease table) name.
    pub app: String,
    /// The stream.
    pub stream: String,
    /// Where each process writes its batch log.
    pub out_dir: PathBuf,
    /// Checkpointing.
    pub checkpoint: CheckpointMode,
    /// More environment for the processes (`KCL_E2E_HANG_AT`, ...).
    pub extra_env: Vec<(String, String)>,
}

/// A running `e2e-worker` process.
#[derive(Debug)]
pub struct WorkerProcess {
    /// The worker id.
    pub id: String,
    /// The child process.
    pub child: Child,
}

impl WorkerProcessConfig {
    /// The environment of worker `id` (an `e2e-worker`, or the Java KCL
    /// worker of `java_kcl`, which reads the same variables).
    pub fn env_for(&self, id: &str) -> Vec<(String, std::ffi::OsString)> {
        let checkpoint = match self.checkpoint {
            CheckpointMode::EveryBatch => "batch",
            CheckpointMode::OnShutdown => "shutdown",
        };
        [
            ("KCL_E2E_APP", self.app.clone().into()),
            ("KCL_E2E_STREAM", self.stream.clone().into()),
            ("KCL_E2E_WORKER_ID", id.into()),
            (
                "KCL_E2E_OUT",
                self.out_dir.join(format!("{id}.jsonl")).into_os_string(),
            ),
            ("KCL_E2E_CHECKPOINT", checkpoint.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(
            self.extra_env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().into())),
        )
        .collect()
    }

    /// Starts a worker process with id `id`.
    pub fn spawn(&self, id: &str) -> anyhow::Result<WorkerProcess> {
        let child = Command::new(&self.binary)
            .envs(self.env_for(id))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        Ok(WorkerProcess {
            id: id.to_owned(),
            child,
        })
    }

    /// Starts a worker process for each of `ids`, in order.
    pub fn spawn_all(&self, ids: &[&str]) -> Vec<WorkerProcess> {
        ids.iter()
            .map(|id| {
                self.spawn(id)
                    .unwrap_or_else(|e| panic!("worker process {id}: {e:#}"))
            })
            .collect()
    }
}

/// Sends `child` the signal `sig` (`kill`'s flag: `-TERM`, `-STOP`, ...).
pub fn signal(child: &Child, sig: &str) -> anyhow::Result<()> {
    let pid = child.id().context("process already reaped")?;
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("kill {sig} {pid} failed");
    }
    Ok(())
}

impl WorkerProcess {
    /// Sends SIGTERM and waits for a clean exit (bounded).
    pub async fn terminate(&mut self, within: Duration) -> anyhow::Result<()> {
        signal(&self.child, "-TERM")?;
        self.exited_cleanly(within).await
    }

    /// Waits, up to `within`, for the process told to stop (a SIGTERM) to
    /// exit, and checks that it exited cleanly.
    pub async fn exited_cleanly(&mut self, within: Duration) -> anyhow::Result<()> {
        let exit = tokio::time::timeout(within, self.child.wait())
            .await
            .with_context(|| format!("{} did not exit within {within:?} of SIGTERM", self.id))??;
        if !exit.success() {
            bail!("{} exited with {exit} after SIGTERM", self.id);
        }
        Ok(())
    }

    /// SIGKILL: no shutdown code runs.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Scenarios against the emulators
// ---------------------------------------------------------------------------

pub const LEASE: Duration = Duration::from_secs(6);
pub const TICK_MAX: Duration = Duration::from_millis(2500); // 2 s taker interval + 25 % jitter
pub const KEYS: u32 = 8;

/// One scenario's stream, application name and production counter.
#[derive(Debug)]
pub struct Scenario {
    /// Clients.
    pub env: TestEnv,
    /// Application (and lease table) name.
    pub app: String,
    /// The stream.
    pub stream: String,
    /// Records produced per key so far.
    pub produced: u64,
}

impl Scenario {
    /// A fresh stream with `shards` shards and a fresh application name.
    pub async fn new(shards: i32) -> Scenario {
        let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
        let stream = unique_name("kcl-e2e");
        if let Err(e) = create_stream(env.kinesis(), &stream, shards).await {
            panic!("creating stream {stream}: {e:#}");
        }
        Scenario {
            env,
            app: unique_name("kcl-e2e-app"),
            stream,
            produced: 0,
        }
    }

    /// Puts the next `per_key` records of every key.
    pub async fn produce(&mut self, per_key: u64) {
        let records: Vec<TestRecord> = (self.produced..self.produced + per_key)
            .flat_map(|counter| (0..KEYS).map(move |key| TestRecord { key, counter }))
            .collect();
        if let Err(e) = put_records(self.env.kinesis(), &self.stream, &records).await {
            panic!("producing to {}: {e:#}", self.stream);
        }
        self.produced += per_key;
    }

    /// Settings for `e2e-worker` processes (`binary`: its path, from
    /// `env!("CARGO_BIN_EXE_e2e-worker")` in the test).
    pub fn processes(
        &self,
        binary: &str,
        out: &std::path::Path,
        checkpoint: CheckpointMode,
    ) -> WorkerProcessConfig {
        WorkerProcessConfig {
            binary: binary.into(),
            app: self.app.clone(),
            stream: self.stream.clone(),
            out_dir: out.to_owned(),
            checkpoint,
            extra_env: Vec::new(),
        }
    }

    /// Every item of the lease table, from one consistent scan (none while
    /// the workers have not created the table yet).
    pub async fn lease_items(&self) -> Vec<HashMap<String, AttributeValue>> {
        match self
            .env
            .dynamodb()
            .scan()
            .table_name(&self.app)
            .consistent_read(true)
            .send()
            .await
        {
            Ok(out) => out.items().to_vec(),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                vec![]
            }
            Err(e) => panic!("scanning the lease table: {e:?}"),
        }
    }

    /// A worker `id` of the application on the stream, from the trim
    /// horizon, with the tests' short lease and a 2 s taker tick; the
    /// rest (retrieval, processor) is the caller's.
    pub fn worker(&self, id: &str) -> kcl::WorkerBuilder {
        kcl::Worker::builder(&self.app)
            .stream(&self.stream)
            .sdk_config(self.env.sdk_config())
            .worker_id(id)
            .initial_position(kcl::InitialPosition::TrimHorizon)
            .lease_duration(LEASE)
            .taker_interval(Duration::from_secs(2))
    }

    /// `rounds` times: puts the next `per_key` records of every key, then
    /// sleeps `every`.
    pub async fn produce_paced(&mut self, rounds: u32, per_key: u64, every: Duration) {
        for _ in 0..rounds {
            self.produce(per_key).await;
            tokio::time::sleep(every).await;
        }
    }

    /// Splits the stream's first listed shard in half: its id and its
    /// children's.
    pub async fn split_first_shard(&self) -> (String, Vec<String>) {
        let kinesis = self.env.kinesis();
        let split = async {
            let shards = crate::list_all_shards(kinesis, &self.stream).await?;
            let parent = shards.first().context("no shard")?.shard_id().to_owned();
            let children = crate::split_shard_in_half(kinesis, &self.stream, &parent).await?;
            anyhow::Ok((parent, children))
        };
        split
            .await
            .unwrap_or_else(|e| panic!("splitting a shard of {}: {e:#}", self.stream))
    }

    /// Owners of the unfinished leases (none while the workers have not
    /// created the table yet).
    pub async fn owners(&self) -> Vec<Option<String>> {
        self.lease_items()
            .await
            .iter()
            .filter(|i| i.get("checkpoint") != Some(&AttributeValue::S("SHARD_END".into())))
            .map(|i| match i.get("leaseOwner") {
                Some(AttributeValue::S(o)) => Some(o.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Produces the next round of every key every `every` until stopped (a
/// failed put panics the task, and [`Producer::stop`] with it).
#[derive(Debug)]
pub struct Producer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Producer {
    /// Starts producing `per_round` records of every key each `every`,
    /// after what `s` produced so far.
    pub fn start(s: &Scenario, per_round: u64, every: Duration) -> Producer {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (kinesis, stream, mut next) = (s.env.kinesis().clone(), s.stream.clone(), s.produced);
        let flag = std::sync::Arc::clone(&stop);
        let task = tokio::spawn(async move {
            while !flag.load(Ordering::Relaxed) {
                let records: Vec<TestRecord> = (next..next + per_round)
                    .flat_map(|counter| (0..KEYS).map(move |key| TestRecord { key, counter }))
                    .collect();
                if let Err(e) = put_records(&kinesis, &stream, &records).await {
                    panic!("producing to {stream}: {e:#}");
                }
                next += per_round;
                tokio::time::sleep(every).await;
            }
            next
        });
        Producer { stop, task }
    }

    /// Stops and returns the records produced per key in total (also
    /// recorded in `s`).
    pub async fn stop(self, s: &mut Scenario) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let produced = match self.task.await {
            Ok(n) => n,
            Err(e) => panic!("the producer failed: {e}"),
        };
        s.produced = produced;
        produced
    }
}

/// The environment variable `name`, which a worker process cannot do
/// without.
pub fn required_var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set"))
}

/// The environment variable `name` parsed as a `T`, if set; an error
/// naming the variable and its value when it does not parse.
pub fn env_parsed<T>(name: &str) -> anyhow::Result<Option<T>>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    std::env::var(name)
        .ok()
        .map(|v| v.parse().with_context(|| format!("{name}={v}")))
        .transpose()
}

/// A duration given in milliseconds by the environment variable `name`,
/// if set.
pub fn env_millis(name: &str) -> anyhow::Result<Option<Duration>> {
    Ok(env_parsed(name)?.map(Duration::from_millis))
}

/// Writes the lease counters of `handle`'s worker to `path` as the JSON
/// object that [`process_stats`] reads: what the worker processes of the
/// tests and the benchmarks leave at their graceful exit.
pub fn write_lease_stats(handle: &kcl::WorkerHandle, path: &str) -> std::io::Result<()> {
    let s = handle.status().leases;
    let stats = serde_json::json!({
        "taken": s.taken, "stolen": s.stolen, "handoffs_completed": s.handoffs_completed,
        "handoffs_forced": s.handoffs_forced, "handed_off": s.handed_off, "lost": s.lost,
        "fenced": s.fenced, "released": s.released, "reclaimed": s.reclaimed,
        "same_id_conflicts": s.same_id_conflicts,
    });
    std::fs::write(path, stats.to_string())
}

/// The lease counters an `e2e-worker` process wrote at its graceful exit
/// (`{id}.jsonl.stats` in `out`); `Null` if it never exited gracefully.
pub fn process_stats(out: &Path, id: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(out.join(format!("{id}.jsonl.stats"))).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

/// One counter of [`process_stats`], 0 when absent.
pub fn stat(v: &serde_json::Value, key: &str) -> u64 {
    v.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0)
}

/// A fresh directory for batch logs.
pub fn out_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique_name(name));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("creating {}: {e}", dir.display());
    }
    dir
}

/// Waits until the logs in `dir` (or `batches`) hold every produced record.
pub async fn wait_complete(
    load: impl Fn() -> Vec<BatchLog>,
    per_key: u64,
    limit: Duration,
) -> Vec<BatchLog> {
    let started = Instant::now();
    loop {
        let batches = load();
        if verify(&batches, KEYS, per_key).missing.is_empty() {
            return batches;
        }
        assert!(
            started.elapsed() < limit,
            "not every record processed after {limit:?}: {} missing",
            verify(&batches, KEYS, per_key).missing.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until the batch logs in `out` hold every produced record (at
/// most `limit`), then stops `procs` with SIGTERM (each within 30 s), and
/// checks the batches: the end of most process scenarios, as
/// [`complete_then_shut_down`] is of the in-process ones. The batches and
/// the verdict.
pub async fn wait_complete_then_terminate<'a>(
    out: &Path,
    per_key: u64,
    limit: Duration,
    procs: impl IntoIterator<Item = &'a mut WorkerProcess>,
) -> (Vec<BatchLog>, Verdict) {
    let batches = wait_complete(
        || read_logs(out).expect("the batch logs are readable"),
        per_key,
        limit,
    )
    .await;
    for p in procs {
        p.terminate(Duration::from_secs(30))
            .await
            .expect("the worker process stops on SIGTERM");
    }
    let verdict = verify(&batches, KEYS, per_key);
    (batches, verdict)
}

/// Waits until no lease is owned by `gone` and every lease has an owner.
pub async fn wait_taken_over(s: &Scenario, gone: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let owners = s.owners().await;
        if owners
            .iter()
            .all(|o| o.as_deref().is_some_and(|o| o != gone))
        {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "{gone}'s leases not taken over after {limit:?}: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until each of `workers` owns at least `min_each` leases and every lease has an owner.
pub async fn wait_all_owned_by(s: &Scenario, workers: &HashSet<&str>, min_each: usize) {
    let started = Instant::now();
    loop {
        let owners = s.owners().await;
        let ok = !owners.is_empty()
            && workers
                .iter()
                .all(|w| owners.iter().filter(|o| o.as_deref() == Some(*w)).count() >= min_each)
            && owners.iter().all(|o| o.is_some());
        if ok {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "fleet never balanced: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------------------
// An in-process recording processor
// ---------------------------------------------------------------------------

/// Batches recorded by [`Recorder`]s of one test, with their stream.
#[derive(Debug, Clone, Default)]
pub struct RecordedBatches(std::sync::Arc<std::sync::Mutex<Vec<(String, BatchLog)>>>);

impl RecordedBatches {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, BatchLog)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every batch recorded so far.
    pub fn all(&self) -> Vec<BatchLog> {
        self.lock().iter().map(|(_, b)| b.clone()).collect()
    }

    /// The batches of one stream.
    pub fn of_stream(&self, stream: &str) -> Vec<BatchLog> {
        self.lock()
            .iter()
            .filter(|(s, _)| s == stream)
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// A processor factory whose processors record here.
    pub fn factory(
        &self,
    ) -> impl Fn(&kcl::ShardContext) -> Recorder + Clone + Send + Sync + 'static {
        let log = self.clone();
        move |ctx: &kcl::ShardContext| Recorder {
            ctx: ctx.clone(),
            log: log.clone(),
        }
    }
}

/// A processor that records every batch after 20 ms of "work" (so two
/// workers on one shard would overlap visibly), checkpointing after each
/// batch and in `shutdown_requested`.
#[derive(Debug)]
pub struct Recorder {
    ctx: kcl::ShardContext,
    log: RecordedBatches,
}

#[kcl::async_trait]
impl kcl::RecordProcessor for Recorder {
    async fn process_records(
        &mut self,
        batch: &kcl::RecordBatch,
        cp: &mut kcl::Checkpointer,
    ) -> Result<(), kcl::ProcessorError> {
        let start = now_ns();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let entry = BatchLog::new(&self.ctx, start, cp, &batch.records);
        self.log.lock().push((self.ctx.stream.clone(), entry));
        cp.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        cp: &mut kcl::Checkpointer,
    ) -> Result<(), kcl::ProcessorError> {
        cp.checkpoint().await?;
        Ok(())
    }
}
