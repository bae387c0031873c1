//! Chaos: several `e2e-worker` processes under continuous production, their
//! DynamoDB traffic through a fault proxy (latency, 500s, throttling, lost
//! responses, outages, and a "blackhole" that swallows every request on one
//! lease's key), while a seeded driver SIGKILLs, SIGSTOPs/SIGCONTs,
//! SIGTERMs and restarts them. Two of the processes share one worker id
//! (as two pods given one StatefulSet name would). Then the faults stop,
//! the fleet settles, and the run is judged:
//!
//! - nothing lost: every produced record was processed at least once, and
//!   each key's records were first processed in order;
//! - no shard processed by a worker that did not hold its lease: every
//!   batch started while its worker, in the tenure it ran under, was the
//!   lease's effective holder (the `checkpointOwner` and its tenure during
//!   a graceful handoff, else the `leaseOwner` and its tenure), as the
//!   lease table sampled every 100 ms shows: two processes under one id
//!   are told apart by their tenures. So the only overlap
//!   between two workers is a batch that started before the peer took over
//!   (a SIGSTOPped process's batch can stay "in flight" for seconds); the
//!   largest such overlap is reported;
//! - checkpoints never go backwards while the lease exists (the test never
//!   resets one).
//!
//! Short by default (75 s of chaos); `KCL_CHAOS_SECONDS=1800` runs the long
//! mode, `KCL_CHAOS_SEED` replays a seed (the driver's choices; process
//! timing still varies), `KCL_CHAOS_WORKER_LOG` sets the workers' RUST_LOG
//! (default `error`). Run with `--nocapture` to see the report.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_tests::e2e::{
    self, BatchLog, CheckpointMode, Scenario, WorkerProcess, WorkerProcessConfig, now_ns, out_dir,
    read_logs, verify,
};
use kcl_tests::fault_proxy::{FaultCounts, FaultProxy, Faults};
use kcl_tests::{TestEnv, TestRecord, delete_stream, delete_table, dynamodb_endpoint, put_records};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::E2E_WORKER;

/// Worker processes: four ids, and a second process under the first id.
const WORKERS: usize = 5;
const SHARDS: i32 = 8;
/// Partition keys: enough that every shard gets some.
const KEYS: u32 = 48;
/// The e2e-worker's lease duration.
const LEASE: Duration = Duration::from_secs(6);
/// The faults while the chaos runs. The SDK retries 500s, throttling and
/// lost responses (3 attempts); what gets through reaches the engine as
/// store errors, late renewals, and conditional writes whose first attempt
/// applied.
const CHAOS_FAULTS: Faults = Faults {
    internal_error: 0.05,
    throttle: 0.05,
    drop_response: 0.03,
    latency: 0.15,
    max_latency: Duration::from_millis(1200),
};
/// Consecutive lease-table samples further apart than this are not used to
/// prove who owned a lease between them.
const MAX_SAMPLE_GAP_NS: u128 = 1_000_000_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}"))
    })
}

/// Produces one record per key every `every` until stopped.
struct Producer {
    stop: Arc<AtomicBool>,
    task: JoinHandle<u64>,
}

impl Producer {
    fn start(s: &Scenario, every: Duration) -> Producer {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (kinesis, stream) = (s.env.kinesis().clone(), s.stream.clone());
        let task = tokio::spawn(async move {
            let mut next = 0;
            while !flag.load(Ordering::Relaxed) {
                let records: Vec<TestRecord> = (0..KEYS)
                    .map(|key| TestRecord { key, counter: next })
                    .collect();
                put_records(&kinesis, &stream, &records).await.unwrap();
                next += 1;
                tokio::time::sleep(every).await;
            }
            next
        });
        Producer { stop, task }
    }

    /// Stops and returns the records produced per key.
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// One lease as a sample saw it.
#[derive(Debug, Clone)]
struct LeaseState {
    /// The worker that may process the shard: the previous owner while a
    /// graceful handoff runs (it processes until it checkpoints and lets
    /// go), else the owner.
    effective_owner: Option<String>,
    /// The effective owner's tenure.
    effective_tenure: Option<String>,
    checkpoint: String,
    sub: u64,
}

/// A consistent scan of the lease table; the states it shows held at some
/// moment between `sent_ns` and `received_ns`.
#[derive(Debug, Clone)]
struct Sample {
    sent_ns: u128,
    received_ns: u128,
    leases: HashMap<String, LeaseState>,
}

async fn scan_leases(env: &TestEnv, table: &str) -> Option<HashMap<String, LeaseState>> {
    let mut leases = HashMap::new();
    let mut start: Option<HashMap<String, AttributeValue>> = None;
    loop {
        let out = env
            .dynamodb()
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .ok()?;
        for item in out.items() {
            let s = |name: &str| match item.get(name) {
                Some(AttributeValue::S(v)) => Some(v.clone()),
                _ => None,
            };
            let Some(key) = s("leaseKey") else { continue };
            let sub = match item.get("checkpointSubSequenceNumber") {
                Some(AttributeValue::N(n)) => n.parse().unwrap_or(0),
                _ => 0,
            };
            leases.insert(
                key,
                LeaseState {
                    effective_owner: s("checkpointOwner").or_else(|| s("leaseOwner")),
                    effective_tenure: if item.contains_key("checkpointOwner") {
                        s("kclCheckpointOwnerTenure")
                    } else {
                        s("kclTenure")
                    },
                    checkpoint: s("checkpoint").unwrap_or_default(),
                    sub,
                },
            );
        }
        match out.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => return Some(leases),
        }
    }
}

/// Scans the lease table (directly, not through the proxy) every 100 ms.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(env: TestEnv, table: String) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let sent_ns = now_ns();
                if let Some(leases) = scan_leases(&env, &table).await {
                    samples.push(Sample {
                        sent_ns,
                        received_ns: now_ns(),
                        leases,
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            samples
        });
        Sampler { stop, task }
    }

    async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// A checkpoint's position: sentinels before every sequence number
/// (TRIM_HORIZON, LATEST, AT_TIMESTAMP) or after (SHARD_END); sequence
/// numbers compare as numbers (they exceed u128, so by length, then text).
fn position(checkpoint: &str, sub: u64) -> (u8, usize, String, u64) {
    match checkpoint {
        "SHARD_END" => (2, 0, String::new(), 0),
        c if !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()) => {
            let digits = c.trim_start_matches('0');
            (1, digits.len(), digits.to_owned(), sub)
        }
        _ => (0, 0, String::new(), 0),
    }
}

/// Checkpoints that went backwards between consecutive samples.
fn checkpoint_regressions(samples: &[Sample]) -> Vec<String> {
    let mut last: HashMap<&str, (&LeaseState, u128)> = HashMap::new();
    let mut regressions = Vec::new();
    for sample in samples {
        // A lease missing from a sample no longer exists; a new lease with
        // the same key starts over.
        last.retain(|key, _| sample.leases.contains_key(*key));
        for (key, state) in &sample.leases {
            if let Some((before, at)) = last.get(key.as_str())
                && position(&state.checkpoint, state.sub) < position(&before.checkpoint, before.sub)
            {
                regressions.push(format!(
                    "{key}: checkpoint {}/{} (owner {:?}, sampled at {at}) went back to {}/{} (owner {:?}, at {})",
                    before.checkpoint,
                    before.sub,
                    before.effective_owner,
                    state.checkpoint,
                    state.sub,
                    state.effective_owner,
                    sample.sent_ns
                ));
            }
            last.insert(key, (state, sample.sent_ns));
        }
    }
    regressions
}

/// Batches that started while the lease table showed another effective
/// owner, both in the sample before and in the sample after the start.
fn batches_without_the_lease(batches: &[BatchLog], samples: &[Sample]) -> Vec<String> {
    let mut found = Vec::new();
    for b in batches {
        // The last sample received before the batch started.
        let i = samples.partition_point(|s| s.received_ns <= b.start_ns);
        if i == 0 || i >= samples.len() {
            continue;
        }
        let (before, after) = (&samples[i - 1], &samples[i]);
        if after.sent_ns < b.start_ns || after.sent_ns - before.received_ns > MAX_SAMPLE_GAP_NS {
            continue;
        }
        let holder = |s: &Sample| {
            s.leases
                .get(&b.shard)
                .map(|l| (l.effective_owner.clone(), l.effective_tenure.clone()))
        };
        let (Some(h1), Some(h2)) = (holder(before), holder(after)) else {
            continue;
        };
        // The same holder at both ends of a gap under a second: nobody else
        // held the lease in between (a take and a take-back need a taker
        // tick and a handoff or an expiry each).
        let ours = (Some(b.worker.clone()), Some(b.tenure.clone()));
        if h1 == h2 && h1 != ours {
            found.push(format!(
                "{} (tenure {}) started a batch on {} at {} while the table showed {:?} as its \
                 holder (samples at {} and {})",
                b.worker, b.tenure, b.shard, b.start_ns, h1, before.received_ns, after.sent_ns
            ));
        }
    }
    found
}

/// Two workers processing one shard at once: the later batch started
/// while the earlier one (of another worker) was still running.
#[derive(Debug, Default)]
struct Overlaps {
    count: usize,
    max_ns: u128,
    max_detail: String,
}

fn overlaps(batches: &[BatchLog]) -> Overlaps {
    let mut by_shard: BTreeMap<&str, Vec<&BatchLog>> = BTreeMap::new();
    for b in batches {
        by_shard.entry(&b.shard).or_default().push(b);
    }
    let mut result = Overlaps::default();
    for (shard, mut list) in by_shard {
        list.sort_by_key(|b| (b.start_ns, b.end_ns));
        let mut busy: Option<&BatchLog> = None;
        for b in list {
            if let Some(earlier) = busy
                && (earlier.worker != b.worker || earlier.tenure != b.tenure)
                && b.start_ns < earlier.end_ns
            {
                let ns = earlier.end_ns.min(b.end_ns) - b.start_ns;
                result.count += 1;
                if ns > result.max_ns {
                    result.max_ns = ns;
                    result.max_detail = format!(
                        "{shard}: {}'s batch ran {} ms (started {} ms before {} started)",
                        earlier.worker,
                        (earlier.end_ns - earlier.start_ns) / 1_000_000,
                        (b.start_ns - earlier.start_ns) / 1_000_000,
                        b.worker
                    );
                }
            }
            if busy.is_none_or(|e| b.end_ns > e.end_ns) {
                busy = Some(b);
            }
        }
    }
    result
}

/// One worker id's process, across incarnations.
enum Slot {
    Running(WorkerProcess),
    Stopped {
        process: WorkerProcess,
        resume_at: Instant,
    },
    Exiting {
        process: WorkerProcess,
        since: Instant,
        restart_after: Duration,
    },
    Dead {
        restart_at: Instant,
    },
}

#[derive(Debug, Default)]
struct DriverCounts {
    kills: u64,
    stops: u64,
    terms: u64,
    unclean_term_exits: u64,
    /// Processes that exited by themselves (a worker whose startup finds
    /// DynamoDB unavailable exits with an error, like a crash-looping pod).
    exited_on_their_own: u64,
    restarts: u64,
    outages: u64,
    /// Lease keys blackholed (requests swallowed, never answered).
    blackholes: u64,
}

/// Sends `process` the signal `sig`; one that already exited on its own
/// (counted apart) has nothing left to signal.
fn signal(process: &WorkerProcess, sig: &str) {
    let _ = e2e::signal(&process.child, sig);
}

/// Starts, stops and restarts the worker processes.
struct Driver {
    cfg: WorkerProcessConfig,
    out: std::path::PathBuf,
    log_level: String,
    /// Worker ids, one per slot (two slots share one).
    ids: Vec<String>,
    /// Slot names, unique: for logs and batch files.
    labels: Vec<String>,
    slots: Vec<Slot>,
    incarnations: Vec<u32>,
    rng: SmallRng,
    counts: DriverCounts,
    outage_until: Option<Instant>,
    blackhole_until: Option<Instant>,
    /// `(wall-clock ns, what happened)`, kept for diagnosis.
    events: Vec<(u128, String)>,
}

impl Driver {
    fn event(&mut self, i: usize, what: &str) {
        let text = format!("{}#{} {what}", self.labels[i], self.incarnations[i]);
        self.events.push((now_ns(), text));
    }

    fn spawn(&mut self, i: usize) -> WorkerProcess {
        self.incarnations[i] += 1;
        self.event(i, "started");
        let mut cfg = self.cfg.clone();
        // One log per incarnation: a SIGKILL can leave a torn last line,
        // which a restarted process must not append to.
        let file = self
            .out
            .join(format!("{}-{}.jsonl", self.labels[i], self.incarnations[i]));
        cfg.extra_env
            .push(("KCL_E2E_OUT".into(), file.display().to_string()));
        cfg.extra_env
            .push(("RUST_LOG".into(), self.log_level.clone()));
        cfg.spawn(&self.ids[i]).unwrap()
    }

    fn not_running(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !matches!(s, Slot::Running(_)))
            .count()
    }

    /// Timed transitions: resume, restart, reap.
    async fn step(&mut self, proxy: &FaultProxy) {
        let now = Instant::now();
        if self.outage_until.is_some_and(|t| now >= t) {
            self.outage_until = None;
            proxy.set_faults(CHAOS_FAULTS);
        }
        if self.blackhole_until.is_some_and(|t| now >= t) {
            self.blackhole_until = None;
            proxy.set_blackhole(None);
            self.events.push((now_ns(), "blackhole lifted".into()));
        }
        for i in 0..self.slots.len() {
            let slot = std::mem::replace(&mut self.slots[i], Slot::Dead { restart_at: now });
            self.slots[i] = match slot {
                Slot::Running(mut process) => match process.child.try_wait() {
                    Ok(Some(_)) => {
                        self.counts.exited_on_their_own += 1;
                        self.event(i, "exited on its own");
                        Slot::Dead {
                            restart_at: now + Duration::from_secs(1),
                        }
                    }
                    _ => Slot::Running(process),
                },
                Slot::Stopped { process, resume_at } if now >= resume_at => {
                    signal(&process, "-CONT");
                    self.event(i, "SIGCONT");
                    Slot::Running(process)
                }
                Slot::Dead { restart_at } if now >= restart_at => {
                    self.counts.restarts += 1;
                    Slot::Running(self.spawn(i))
                }
                Slot::Exiting {
                    mut process,
                    since,
                    restart_after,
                } => match process.child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            self.counts.unclean_term_exits += 1;
                        }
                        self.event(i, &format!("exited after SIGTERM: {status}"));
                        Slot::Dead {
                            restart_at: now + restart_after,
                        }
                    }
                    _ if now - since > Duration::from_secs(40) => {
                        self.counts.unclean_term_exits += 1;
                        process.kill().await.unwrap();
                        Slot::Dead {
                            restart_at: now + restart_after,
                        }
                    }
                    _ => Slot::Exiting {
                        process,
                        since,
                        restart_after,
                    },
                },
                other => other,
            };
        }
    }

    /// A random one of the `running` slots' process, its slot left `Dead`
    /// until the disruption says what comes next.
    fn take_running(&mut self, running: &[usize], now: Instant) -> (usize, WorkerProcess) {
        let i = running[self.rng.random_range(0..running.len())];
        let Slot::Running(process) =
            std::mem::replace(&mut self.slots[i], Slot::Dead { restart_at: now })
        else {
            unreachable!()
        };
        (i, process)
    }

    /// One random disruption.
    async fn disrupt(&mut self, proxy: &FaultProxy) {
        let running: Vec<usize> = (0..self.slots.len())
            .filter(|&i| matches!(self.slots[i], Slot::Running(_)))
            .collect();
        // At most two of four processes down at once, so the fleet keeps
        // making progress between disruptions.
        let may_take_one = self.not_running() < 2 && !running.is_empty();
        let roll: f64 = self.rng.random();
        let now = Instant::now();
        if roll < 0.3 && may_take_one {
            let (i, mut process) = self.take_running(&running, now);
            process.kill().await.unwrap();
            self.counts.kills += 1;
            self.event(i, "SIGKILL");
            self.slots[i] = Slot::Dead {
                restart_at: now + Duration::from_millis(self.rng.random_range(0..4_000)),
            };
        } else if roll < 0.6 && may_take_one {
            let (i, process) = self.take_running(&running, now);
            signal(&process, "-STOP");
            self.counts.stops += 1;
            self.event(i, "SIGSTOP");
            // Up to twice the lease duration: long stops let peers take
            // the leases while the process still believes in its batch.
            let pause =
                Duration::from_millis(self.rng.random_range(500..2 * LEASE.as_millis() as u64));
            self.slots[i] = Slot::Stopped {
                process,
                resume_at: now + pause,
            };
        } else if roll < 0.75 && may_take_one {
            let (i, process) = self.take_running(&running, now);
            signal(&process, "-TERM");
            self.counts.terms += 1;
            self.event(i, "SIGTERM");
            self.slots[i] = Slot::Exiting {
                process,
                since: now,
                restart_after: Duration::from_millis(self.rng.random_range(0..3_000)),
            };
        } else if roll < 0.82 && self.blackhole_until.is_none() {
            let shard = self.rng.random_range(0..SHARDS);
            let length = Duration::from_millis(self.rng.random_range(2_000..10_000));
            self.blackhole(proxy, shard, length);
        } else if roll < 0.9 && self.outage_until.is_none() {
            // DynamoDB unavailable for everyone, up to beyond the lease
            // duration: every worker fences itself, then all take again.
            let length = Duration::from_millis(self.rng.random_range(1_000..8_000));
            proxy.set_faults(Faults::OUTAGE);
            self.outage_until = Some(now + length);
            self.counts.outages += 1;
            self.events
                .push((now_ns(), format!("DynamoDB outage for {length:?}")));
        }
    }

    /// Every request naming one lease's key is swallowed for `length`.
    fn blackhole(&mut self, proxy: &FaultProxy, shard: i32, length: Duration) {
        let key = format!("shardId-{shard:012}");
        proxy.set_blackhole(Some(&key));
        self.blackhole_until = Some(Instant::now() + length);
        self.counts.blackholes += 1;
        self.events
            .push((now_ns(), format!("blackhole on {key} for {length:?}")));
    }

    /// Ends the chaos: every process running, no faults.
    async fn heal(&mut self, proxy: &FaultProxy) {
        proxy.set_faults(Faults::NONE);
        proxy.set_blackhole(None);
        self.outage_until = None;
        self.blackhole_until = None;
        for i in 0..self.slots.len() {
            let now = Instant::now();
            let slot = std::mem::replace(&mut self.slots[i], Slot::Dead { restart_at: now });
            self.slots[i] = match slot {
                Slot::Stopped { process, .. } => {
                    signal(&process, "-CONT");
                    Slot::Running(process)
                }
                Slot::Exiting { mut process, .. } => {
                    let exited =
                        tokio::time::timeout(Duration::from_secs(40), process.child.wait()).await;
                    if !matches!(exited, Ok(Ok(status)) if status.success()) {
                        self.counts.unclean_term_exits += 1;
                        process.kill().await.unwrap();
                    }
                    self.counts.restarts += 1;
                    Slot::Running(self.spawn(i))
                }
                Slot::Dead { .. } => {
                    self.counts.restarts += 1;
                    Slot::Running(self.spawn(i))
                }
                Slot::Running(mut process) => match process.child.try_wait() {
                    Ok(Some(_)) => {
                        self.counts.exited_on_their_own += 1;
                        self.counts.restarts += 1;
                        Slot::Running(self.spawn(i))
                    }
                    _ => Slot::Running(process),
                },
            };
        }
    }
}

/// Keeps the driver's events and the lease-table samples next to the
/// batch logs, for diagnosing a failed run (the directory is removed when
/// the run passes).
fn dump(out: &std::path::Path, events: &[(u128, String)], samples: &[Sample]) {
    let events: String = events.iter().map(|(t, e)| format!("{t} {e}\n")).collect();
    std::fs::write(out.join("driver.log"), events).unwrap();
    let mut text = String::new();
    for s in samples {
        let leases: serde_json::Map<String, serde_json::Value> = s
            .leases
            .iter()
            .map(|(k, l)| {
                (
                    k.clone(),
                    serde_json::json!([l.effective_owner, l.checkpoint, l.sub]),
                )
            })
            .collect();
        text.push_str(
            &serde_json::json!({
                "sent_ns": s.sent_ns.to_string(),
                "received_ns": s.received_ns.to_string(),
                "leases": leases,
            })
            .to_string(),
        );
        text.push('\n');
    }
    std::fs::write(out.join("samples.txt"), text).unwrap();
}

/// Sums a counter over every incarnation's `.stats` file (written at a
/// graceful exit only).
fn lease_stats(out: &std::path::Path) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    for entry in std::fs::read_dir(out).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "stats") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(&text) {
                for (k, v) in map {
                    *sums.entry(k).or_default() += v.as_u64().unwrap_or(0);
                }
            }
        }
    }
    sums
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_under_process_and_dynamodb_chaos_loses_nothing_and_never_shares_a_shard() {
    chaos_run("liveness").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_renewing_per_lease_under_chaos_loses_nothing_and_never_shares_a_shard() {
    chaos_run("per-lease").await;
}

/// One chaos run with the workers renewing as `renewal` says
/// (`KCL_E2E_RENEWAL` of the worker processes).
async fn chaos_run(renewal: &str) {
    let chaos = Duration::from_secs(env_u64("KCL_CHAOS_SECONDS").unwrap_or(75));
    let seed = env_u64("KCL_CHAOS_SEED").unwrap_or_else(|| u64::from(rand::random::<u32>()));
    let log_level = std::env::var("KCL_CHAOS_WORKER_LOG").unwrap_or_else(|_| "error".into());
    // kinesis-mock's PutRecords slows as a shard fills: long runs produce
    // more slowly, to about 12,000 records at most.
    let every = Duration::from_millis(500).max(Duration::from_secs_f64(
        chaos.as_secs_f64() * f64::from(KEYS) / 12_000.0,
    ));
    println!(
        "chaos ({renewal} renewal): seed {seed} (KCL_CHAOS_SEED), {chaos:?} of chaos, {WORKERS} \
         processes, {SHARDS} shards, {KEYS} keys, one record per key every {every:?}"
    );

    let s = Scenario::new(SHARDS).await;
    let upstream = dynamodb_endpoint();
    let proxy = FaultProxy::start(&upstream, Faults::NONE, seed ^ 0x9e37_79b9)
        .await
        .unwrap();
    let out = out_dir("kcl-chaos");
    let mut cfg = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    cfg.extra_env
        .push(("AWS_ENDPOINT_URL_DYNAMODB".into(), proxy.url()));
    cfg.extra_env
        .push(("KCL_E2E_RENEWAL".into(), renewal.to_owned()));
    let mut driver = Driver {
        cfg,
        out: out.clone(),
        log_level,
        // The last slot runs under the first slot's worker id.
        ids: (0..WORKERS)
            .map(|i| format!("c-{}", i % (WORKERS - 1)))
            .collect(),
        labels: (0..WORKERS)
            .map(|i| {
                if i == WORKERS - 1 {
                    "c-0-twin".to_owned()
                } else {
                    format!("c-{i}")
                }
            })
            .collect(),
        slots: Vec::new(),
        incarnations: vec![0; WORKERS],
        rng: SmallRng::seed_from_u64(seed),
        counts: DriverCounts::default(),
        outage_until: None,
        blackhole_until: None,
        events: Vec::new(),
    };
    for i in 0..WORKERS {
        let p = driver.spawn(i);
        driver.slots.push(Slot::Running(p));
    }
    let producer = Producer::start(&s, every);
    // The workers create the table; sample it from the moment it exists.
    let started = Instant::now();
    while s.owners().await.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the workers never created their leases"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sampler = Sampler::start(s.env.clone(), s.app.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Chaos.
    proxy.set_faults(CHAOS_FAULTS);
    let chaos_started = Instant::now();
    let mut next_disruption = Instant::now() + Duration::from_secs(1);
    let mut last_report = Instant::now();
    // Every run, however short, blackholes a lease for longer than the
    // lease duration once (more come at random).
    let mut sure_blackhole = Some(chaos_started + chaos / 4);
    while chaos_started.elapsed() < chaos {
        driver.step(&proxy).await;
        if sure_blackhole.is_some_and(|at| Instant::now() >= at) && driver.blackhole_until.is_none()
        {
            sure_blackhole = None;
            let shard = driver.rng.random_range(0..SHARDS);
            driver.blackhole(&proxy, shard, LEASE * 2);
        }
        if Instant::now() >= next_disruption {
            driver.disrupt(&proxy).await;
            next_disruption =
                Instant::now() + Duration::from_millis(driver.rng.random_range(1_000..4_000));
        }
        if last_report.elapsed() >= Duration::from_secs(60) {
            last_report = Instant::now();
            println!(
                "  [{:>5.0} s] {:?}; proxy {:?}",
                chaos_started.elapsed().as_secs_f64(),
                driver.counts,
                proxy.counts()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Settle: no faults, every process up; production ends.
    driver.heal(&proxy).await;
    let faults = proxy.counts();
    let per_key = producer.stop().await;
    let settle_started = Instant::now();
    loop {
        let missing = verify(&read_logs(&out).unwrap(), KEYS, per_key)
            .missing
            .len();
        if missing == 0 {
            break;
        }
        assert!(
            settle_started.elapsed() < Duration::from_secs(180),
            "{missing} records still unprocessed 180 s after the chaos ended"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled_after = settle_started.elapsed();
    // A few more samples of the calm fleet, then stop everything.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let samples = sampler.stop().await;
    let mut clean_exits = 0;
    for slot in &mut driver.slots {
        if let Slot::Running(p) = slot {
            p.terminate(Duration::from_secs(30)).await.unwrap();
            clean_exits += 1;
        }
    }
    let batches_after_stop = read_logs(&out).unwrap();
    assert_eq!(
        clean_exits, WORKERS,
        "every process was running after healing"
    );

    dump(&out, &driver.events, &samples);
    let verdict = verify(&batches_after_stop, KEYS, per_key);
    let without_lease = batches_without_the_lease(&batches_after_stop, &samples);
    let regressions = checkpoint_regressions(&samples);
    let ov = overlaps(&batches_after_stop);
    let stats = lease_stats(&out);
    let total_records = u64::from(KEYS) * per_key;
    let fc: FaultCounts = faults;
    println!(
        "chaos report ({renewal} renewal, seed {seed}; run data in {}, removed if the run passes):",
        out.display()
    );
    println!(
        "  produced {total_records} records ({per_key} per key); all processed {settled_after:.1?} after the chaos ended; \
         {} batches, {} deliveries, duplicates {} ({:.1} %)",
        batches_after_stop.len(),
        verdict.per_worker.values().sum::<usize>(),
        verdict.duplicates,
        100.0 * verdict.duplicates as f64 / total_records as f64
    );
    println!(
        "  processes ({WORKERS}, two under one worker id): kills {}, stops {}, graceful terms {} (unclean exits {}), exited on their own {}, restarts {}; DynamoDB outages {}, blackholed leases {}",
        driver.counts.kills,
        driver.counts.stops,
        driver.counts.terms,
        driver.counts.unclean_term_exits,
        driver.counts.exited_on_their_own,
        driver.counts.restarts,
        driver.counts.outages,
        driver.counts.blackholes
    );
    println!(
        "  proxy: {} requests; injected: latency {}, 500 {}, throttling {}, dropped responses {}, swallowed by a blackhole {}; upstream failures {}",
        fc.requests,
        fc.delayed,
        fc.internal_errors,
        fc.throttles,
        fc.dropped_responses,
        fc.blackholed,
        fc.upstream_failures
    );
    println!("  lease counters of the graceful exits: {stats:?}");
    println!(
        "  overlaps: {} (verify() reports {}), max {} ms{}",
        ov.count,
        verdict.overlaps.len(),
        ov.max_ns / 1_000_000,
        if ov.count > 0 {
            format!(": {}", ov.max_detail)
        } else {
            String::new()
        }
    );
    println!(
        "  lease-table samples: {}; batches started without the lease: {}; checkpoint regressions: {}",
        samples.len(),
        without_lease.len(),
        regressions.len()
    );

    verdict.assert_complete_in_order();
    assert!(
        without_lease.is_empty(),
        "batches processed by a worker that did not hold the lease (only a batch in flight at a takeover may overlap): {:?}",
        &without_lease[..without_lease.len().min(10)]
    );
    assert!(
        regressions.is_empty(),
        "checkpoints went backwards: {regressions:?}"
    );
    assert!(
        samples.len() as f64 > chaos.as_secs_f64() * 3.0,
        "too few lease-table samples to judge ownership: {}",
        samples.len()
    );
    assert!(
        fc.injected() > 0 && driver.counts.kills + driver.counts.stops > 0,
        "the chaos did nothing"
    );
    assert!(
        driver.counts.blackholes > 0 && fc.blackholed > 0,
        "no request was blackholed"
    );
    let _ = delete_stream(s.env.kinesis(), &s.stream).await;
    let _ = delete_table(s.env.dynamodb(), &s.app).await;
    let _ = delete_table(s.env.dynamodb(), &format!("{}-workers", s.app)).await;
    let _ = std::fs::remove_dir_all(&out);
}

/// The proxy's answers are what the SDK expects from DynamoDB: its errors
/// map to the modelled ones, a lost response is a dispatch failure, and
/// the write behind a lost response applied.
#[tokio::test]
async fn the_fault_proxy_injects_what_the_sdk_understands() {
    use aws_config::retry::RetryConfig;
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let table = kcl_tests::unique_name("kcl-chaos-proxy");
    kcl_tests::create_lease_table(env.dynamodb(), &table)
        .await
        .unwrap();
    let upstream = dynamodb_endpoint();
    let proxy = FaultProxy::start(&upstream, Faults::NONE, 1).await.unwrap();
    let client = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(env.sdk_config())
            .endpoint_url(proxy.url())
            .retry_config(RetryConfig::disabled())
            .build(),
    );
    let put = |key: &str| {
        client
            .put_item()
            .table_name(&table)
            .item("leaseKey", AttributeValue::S(key.into()))
            .send()
    };
    put("plain").await.unwrap();

    proxy.set_faults(Faults {
        throttle: 1.0,
        ..Faults::NONE
    });
    let err = put("throttled").await.unwrap_err();
    let se = err.as_service_error().expect("a modelled error");
    assert!(se.is_provisioned_throughput_exceeded_exception(), "{se:?}");

    proxy.set_faults(Faults::OUTAGE);
    let err = put("failed").await.unwrap_err();
    let se = err.as_service_error().expect("a modelled error");
    assert!(se.is_internal_server_error(), "{se:?}");

    proxy.set_faults(Faults {
        drop_response: 1.0,
        ..Faults::NONE
    });
    let err = put("lost").await.unwrap_err();
    assert!(
        err.as_service_error().is_none(),
        "a lost response is not a service answer: {err:?}"
    );

    proxy.set_faults(Faults {
        latency: 1.0,
        max_latency: Duration::from_millis(50),
        ..Faults::NONE
    });
    put("slow").await.unwrap();

    let keys: Vec<String> = env
        .dynamodb()
        .scan()
        .table_name(&table)
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .items()
        .iter()
        .filter_map(|i| i.get("leaseKey")?.as_s().ok().cloned())
        .collect();
    let mut keys = keys;
    keys.sort();
    assert_eq!(
        keys,
        ["lost", "plain", "slow"],
        "the throttled and failed writes never reached DynamoDB; the lost one did"
    );
    let c = proxy.counts();
    assert_eq!(
        (
            c.requests,
            c.throttles,
            c.internal_errors,
            c.dropped_responses,
            c.delayed
        ),
        (5, 1, 1, 1, 1),
        "{c:?}"
    );
    delete_table(env.dynamodb(), &table).await.unwrap();
}
