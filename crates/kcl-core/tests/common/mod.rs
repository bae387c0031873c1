//! A fleet of lease coordinators sharing one in-memory table, for tests
//! under a paused tokio clock, and what the whole-worker tests share
//! around their processors.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl_core::checkpointer::Checkpointer;
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::store::metered::{MeteredStore, StoreStats};
use kcl_core::worker::{StreamSpec, WorkerConfig, WorkerConfigBuilder};
use kcl_core::{
    Checkpoint, Lease, LeaseConfig, LeaseCoordinator, LeaseEvent, LeaseHandle, LeaseLayout,
    LeaseStore, ShutdownMode,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub mod processing;

pub const LEASE: Duration = Duration::from_secs(10);
pub const TICK: Duration = Duration::from_secs(10);

/// The config of a worker `w` reading `stream` alone, a lease per shard,
/// to build with the settings under test.
pub fn single_stream_config(stream: &str) -> WorkerConfigBuilder {
    let lease = LeaseConfig::builder("w").build().unwrap();
    WorkerConfig::builder(lease).stream(StreamSpec {
        name: stream.into(),
        layout: LeaseLayout::SingleStream,
    })
}

/// The latest a jittered tick can come (jitter 0.25).
pub fn tick_max() -> Duration {
    TICK.mul_f64(1.25)
}

pub fn config(id: &str, seed: u64) -> kcl_core::config::LeaseConfigBuilder {
    LeaseConfig::builder(id)
        .lease_duration(LEASE)
        .taker_interval(TICK)
        .seed(seed)
}

/// [`config`] renewing every lease, as the Java KCL does.
#[allow(dead_code)]
pub fn per_lease(id: &str, seed: u64) -> kcl_core::config::LeaseConfigBuilder {
    config(id, seed).renewal(kcl_core::LeaseRenewal::PerLease)
}

/// [`config`] in the given renewal mode.
#[allow(dead_code)]
pub fn in_mode(
    mode: kcl_core::LeaseRenewal,
    id: &str,
    seed: u64,
) -> kcl_core::config::LeaseConfigBuilder {
    config(id, seed).renewal(mode)
}

/// What a simulated worker's stand-in consumers do with a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandIn {
    /// Nothing but hand it over when asked.
    Idle,
    /// Checkpoint an advancing position every 500 ms (by a random 1-3
    /// records, so two consumers of one shard would write interleaved,
    /// diverging positions), and once more when handing over.
    Checkpointing,
    /// Hand the lease over this long after being asked (a processor that
    /// takes its time in `shutdown_requested`).
    SlowHandoff(Duration),
    /// Never hand it over (a processor stuck in `shutdown_requested`).
    NeverHandsOff,
}

/// One simulated worker process.
pub struct SimWorker {
    pub id: String,
    pub store: InMemoryLeaseStore,
    pub stats: Arc<StoreStats>,
    pub coordinator: Option<Arc<LeaseCoordinator>>,
    drain: Option<JoinHandle<()>>,
}

impl SimWorker {
    pub fn start(table: &InMemoryLeaseStore, config: LeaseConfig) -> Self {
        Self::start_with(table, config, StandIn::Idle)
    }

    pub fn start_with(table: &InMemoryLeaseStore, config: LeaseConfig, stand_in: StandIn) -> Self {
        Self::start_observed(table, config, stand_in, None)
    }

    /// Like `start_with`, telling `observer` of every lease event.
    pub fn start_observed(
        table: &InMemoryLeaseStore,
        config: LeaseConfig,
        stand_in: StandIn,
        observer: Option<Arc<dyn kcl_core::observe::Observer>>,
    ) -> Self {
        Self::start_full(table, config, stand_in, observer, None)
    }

    /// Like `start_with`, its stand-in consumers reading `load(key)` bytes
    /// of each lease every 500 ms while they hold it, as a worker's
    /// consumer reads its shard: what the leases carry is measured and
    /// published, and the fleet balances by it.
    pub fn start_loaded(
        table: &InMemoryLeaseStore,
        config: LeaseConfig,
        stand_in: StandIn,
        load: Load,
    ) -> Self {
        Self::start_full(table, config, stand_in, None, Some(load))
    }

    fn start_full(
        table: &InMemoryLeaseStore,
        config: LeaseConfig,
        stand_in: StandIn,
        observer: Option<Arc<dyn kcl_core::observe::Observer>>,
        load: Option<Load>,
    ) -> Self {
        let store = table.handle();
        let metered = MeteredStore::new(store.clone());
        let stats = Arc::clone(metered.stats());
        let id = config.worker_id().to_owned();
        let (coordinator, events) =
            LeaseCoordinator::start_filtered(Arc::new(metered), config, None, observer);
        let coordinator = Arc::new(coordinator);
        let consumers = Consumers {
            coordinator: Arc::clone(&coordinator),
            store: Arc::new(store.clone()),
            stand_in,
            load,
        };
        SimWorker {
            id,
            store,
            stats,
            drain: Some(tokio::spawn(drain(events, consumers))),
            coordinator: Some(coordinator),
        }
    }

    pub fn coordinator(&self) -> &LeaseCoordinator {
        self.coordinator.as_ref().expect("running")
    }

    /// Keys this worker may be processing right now: held and valid, or
    /// handing off (a draining victim processes until its last call
    /// returns, and may checkpoint until the handoff completes or it is
    /// fenced).
    pub fn processing_keys(&self) -> Vec<String> {
        self.keys_where(LeaseHandle::may_checkpoint)
    }

    /// Keys this worker holds and believes valid right now.
    pub fn valid_keys(&self) -> Vec<String> {
        self.keys_where(LeaseHandle::is_valid)
    }

    fn keys_where(&self, pred: fn(&LeaseHandle) -> bool) -> Vec<String> {
        let Some(c) = &self.coordinator else {
            return vec![];
        };
        c.held_keys()
            .into_iter()
            .filter(|k| c.handle(k).is_some_and(|h| pred(&h)))
            .collect()
    }

    async fn stop(&mut self, mode: ShutdownMode) {
        if let Some(d) = self.drain.take() {
            d.abort();
            let _ = d.await;
        }
        if let Some(c) = self.coordinator.take() {
            let Ok(c) = Arc::try_unwrap(c) else {
                panic!("the drain task held the last other reference");
            };
            c.shutdown(mode).await;
        }
    }

    /// Stops like a SIGKILL: no release, leases left to expire.
    pub async fn kill(&mut self) {
        self.stop(ShutdownMode::Abandon).await;
    }

    pub async fn stop_gracefully(&mut self) {
        self.stop(ShutdownMode::Release).await;
    }
}

/// Bytes a stand-in consumer reads from a lease (by key) every 500 ms.
pub type Load = Arc<dyn Fn(&str) -> u64 + Send + Sync>;

struct Consumers {
    coordinator: Arc<LeaseCoordinator>,
    store: Arc<dyn LeaseStore>,
    stand_in: StandIn,
    load: Option<Load>,
}

/// Plays the worker's part: every acquired lease gets a stand-in consumer
/// that hands the lease over as soon as another worker asks for it.
async fn drain(mut events: mpsc::Receiver<LeaseEvent>, consumers: Consumers) {
    let mut running = tokio::task::JoinSet::new();
    while let Some(e) = events.recv().await {
        if let LeaseEvent::Acquired(handle) = e {
            let coordinator = Arc::clone(&consumers.coordinator);
            let store = Arc::clone(&consumers.store);
            let stand_in = consumers.stand_in;
            let load = consumers.load.clone();
            running.spawn(consume(handle, coordinator, store, stand_in, load));
        }
        while running.try_join_next().is_some() {}
    }
}

async fn consume(
    handle: LeaseHandle,
    coordinator: Arc<LeaseCoordinator>,
    store: Arc<dyn LeaseStore>,
    stand_in: StandIn,
    load: Option<Load>,
) {
    let mut cp = Checkpointer::for_test(store, handle.clone());
    let periodic = stand_in == StandIn::Checkpointing || load.is_some();
    let mut position: u64 = match cp.last_checkpoint() {
        Checkpoint::Sequence { seq, .. } => seq.parse().unwrap_or(0),
        _ => 0,
    };
    let mut rng = SmallRng::seed_from_u64(position ^ handle.tenure().len() as u64);
    loop {
        tokio::select! {
            // A handoff asked for is seen before the next checkpoint, as
            // the worker's consumer sees it before its next fetch.
            biased;
            _ = handle.handoff_requested() => {
                match stand_in {
                    StandIn::Checkpointing => {
                        let _ = cp.checkpoint().await;
                    }
                    StandIn::SlowHandoff(d) => {
                        tokio::select! {
                            biased;
                            _ = tokio::time::sleep(d) => {}
                            _ = handle.ended() => return,
                        }
                    }
                    StandIn::NeverHandsOff => {
                        handle.ended().await;
                        return;
                    }
                    StandIn::Idle => {}
                }
                let _ = coordinator.complete_handoff(&handle).await;
                return;
            }
            _ = handle.ended() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)), if periodic => {
                // As the worker's consumer: it stops when the lease is not
                // valid any more or a checkpoint is rejected, and tells the
                // coordinator.
                if !handle.is_valid() {
                    coordinator.consumer_stopped(&handle).await;
                    return;
                }
                if let Some(load) = &load {
                    handle.record_read(load(handle.key()), 1, None);
                }
                if stand_in != StandIn::Checkpointing {
                    continue;
                }
                position += rng.random_range(1..=3);
                cp.delivered_for_test(&position.to_string(), 0);
                if cp.checkpoint().await.is_err() {
                    coordinator.consumer_stopped(&handle).await;
                    return;
                }
            }
        }
    }
}

/// Watches every lease's checkpoint in the table and records each time one
/// went backwards.
#[derive(Debug, Default)]
pub struct CheckpointLog {
    last: HashMap<String, u64>,
    pub writes_seen: u64,
    pub regressions: Vec<String>,
}

impl CheckpointLog {
    pub fn sample(&mut self, table: &InMemoryLeaseStore) {
        for lease in table.snapshot() {
            let Checkpoint::Sequence { seq, .. } = &lease.checkpoint else {
                continue;
            };
            let now: u64 = seq.parse().unwrap();
            match self.last.insert(lease.key.clone(), now) {
                Some(before) if now < before => self
                    .regressions
                    .push(format!("{}: {before} -> {now}", lease.key)),
                Some(before) if now > before => self.writes_seen += 1,
                _ => {}
            }
        }
    }
}

pub async fn table_with(n: usize) -> InMemoryLeaseStore {
    table_paged(n, 25).await
}

/// A table of `n` unowned leases, scanned in pages of `page`.
pub async fn table_paged(n: usize, page: usize) -> InMemoryLeaseStore {
    let table = InMemoryLeaseStore::new().with_page_size(page);
    for i in 0..n {
        table
            .create_if_absent(&Lease::new(
                format!("shardId-{i:012}"),
                Checkpoint::TrimHorizon,
            ))
            .await
            .unwrap();
    }
    table
}

/// Starts a worker for each of `names`, with the config
/// `config(name, index)`.
pub fn start_all(
    table: &InMemoryLeaseStore,
    names: &[impl AsRef<str>],
    config: impl Fn(&str, u64) -> LeaseConfig,
) -> Vec<SimWorker> {
    names
        .iter()
        .enumerate()
        .map(|(i, id)| SimWorker::start(table, config(id.as_ref(), i as u64)))
        .collect()
}

/// Runs `workers` a second at a time, sampling overlaps every `step`,
/// until the table is [`balanced`] among `names`; returns the overlaps.
pub async fn run_until_balanced(
    table: &InMemoryLeaseStore,
    workers: &[SimWorker],
    names: &[impl AsRef<str>],
    step: Duration,
) -> OverlapLog {
    let refs: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    let mut log = OverlapLog::default();
    while !balanced(table, &refs) {
        run_for(workers, &mut log, Duration::from_secs(1), step).await;
    }
    log
}

/// A table of `leases` unowned leases and a first worker (`config`,
/// `stand_in`) that had two ticks alone to take them, overlaps sampled
/// every 50 ms from its start: where the handoff scenarios begin before
/// a second worker joins.
pub async fn first_holder(
    leases: usize,
    config: LeaseConfig,
    stand_in: StandIn,
) -> (InMemoryLeaseStore, OverlapLog, Vec<SimWorker>) {
    let table = table_with(leases).await;
    let mut log = OverlapLog::default();
    let workers = vec![SimWorker::start_with(&table, config, stand_in)];
    run_for(&workers, &mut log, TICK * 2, Duration::from_millis(50)).await;
    (table, log, workers)
}

/// A table of `leases` unowned leases shared by workers `a` and `b` (the
/// default config, seeded `seed` and `seed + 1`) until it is balanced,
/// overlaps sampled every 50 ms from their start: where the fault
/// scenarios of a two-worker fleet begin.
#[allow(dead_code)]
pub async fn balanced_pair(
    leases: usize,
    seed: u64,
) -> (InMemoryLeaseStore, OverlapLog, Vec<SimWorker>) {
    let table = table_with(leases).await;
    let workers = start_all(&table, &["a", "b"], |id, i| {
        config(id, seed + i).build().unwrap()
    });
    let log = run_until_balanced(&table, &workers, &["a", "b"], Duration::from_millis(50)).await;
    (table, log, workers)
}

/// Owners per worker id, from the table.
pub fn table_counts(table: &InMemoryLeaseStore) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for l in table.snapshot() {
        if let Some(o) = l.owner {
            *counts.entry(o).or_default() += 1;
        }
    }
    counts
}

pub fn spread(counts: &BTreeMap<String, usize>, workers: &[&str]) -> usize {
    let per: Vec<usize> = workers
        .iter()
        .map(|w| counts.get(*w).copied().unwrap_or(0))
        .collect();
    per.iter().max().unwrap() - per.iter().min().unwrap()
}

/// Every lease owned, and no worker more than one lease ahead of another.
pub fn balanced(table: &InMemoryLeaseStore, workers: &[&str]) -> bool {
    table.snapshot().iter().all(|l| l.owner.is_some()) && spread(&table_counts(table), workers) <= 1
}

/// Watches a fleet every `step` and records every moment two workers may
/// both process the same lease (see [`SimWorker::processing_keys`]: a
/// draining victim counts).
#[derive(Debug, Default)]
pub struct OverlapLog {
    /// Longest continuous double-validity per lease.
    pub longest: HashMap<String, Duration>,
    open: HashMap<String, Instant>,
    pub samples: u64,
}

impl OverlapLog {
    pub fn sample(&mut self, workers: &[SimWorker]) {
        let refs: Vec<&SimWorker> = workers.iter().collect();
        self.sample_refs(&refs);
    }

    /// [`OverlapLog::sample`] of the workers running among many.
    pub fn sample_refs(&mut self, workers: &[&SimWorker]) {
        self.samples += 1;
        let now = Instant::now();
        let mut believers: HashMap<String, usize> = HashMap::new();
        for w in workers {
            for k in w.processing_keys() {
                *believers.entry(k).or_default() += 1;
            }
        }
        for (k, n) in &believers {
            if *n > 1 {
                self.open.entry(k.clone()).or_insert(now);
            }
        }
        let closed: Vec<String> = self
            .open
            .keys()
            .filter(|k| believers.get(*k).copied().unwrap_or(0) <= 1)
            .cloned()
            .collect();
        for k in closed {
            self.close(&k, now);
        }
        let still: Vec<(String, Instant)> =
            self.open.iter().map(|(k, t)| (k.clone(), *t)).collect();
        for (k, since) in still {
            let d = now - since;
            let e = self.longest.entry(k).or_default();
            *e = (*e).max(d);
        }
    }

    fn close(&mut self, k: &str, now: Instant) {
        if let Some(since) = self.open.remove(k) {
            let e = self.longest.entry(k.to_owned()).or_default();
            *e = (*e).max(now - since);
            // A sampled overlap of zero length still counts as one sample.
            if *e == Duration::ZERO {
                *e = Duration::from_nanos(1);
            }
        }
    }

    pub fn max(&self) -> Duration {
        self.longest.values().copied().max().unwrap_or_default()
    }
}

/// Advances paused time in `step`s for `total`, sampling overlaps.
pub async fn run_for(workers: &[SimWorker], log: &mut OverlapLog, total: Duration, step: Duration) {
    let end = Instant::now() + total;
    while Instant::now() < end {
        tokio::time::sleep(step).await;
        log.sample(workers);
    }
}

/// Runs `workers` a `slice` at a time (overlaps sampled every `step`)
/// until `done` holds, failing with `stuck` when a slice ends and
/// `in_time` does not hold.
pub async fn run_until(
    workers: &[SimWorker],
    log: &mut OverlapLog,
    slice: Duration,
    step: Duration,
    done: impl Fn() -> bool,
    in_time: impl Fn() -> bool,
    stuck: impl Fn() -> String,
) {
    while !done() {
        run_for(workers, log, slice, step).await;
        assert!(in_time(), "{}", stuck());
    }
}

/// As [`run_for`], sampling checkpoints too.
pub async fn run_checking(
    workers: &[SimWorker],
    table: &InMemoryLeaseStore,
    log: &mut OverlapLog,
    checkpoints: &mut CheckpointLog,
    total: Duration,
) {
    let end = Instant::now() + total;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
        log.sample(workers);
        checkpoints.sample(table);
    }
}

/// The log lines written while a test runs, at warn level and above
/// (see [`capture_warnings`]).
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// How many lines written so far contain `containing`.
    pub fn count(&self, containing: &str) -> usize {
        self.text()
            .lines()
            .filter(|l| l.contains(containing))
            .count()
    }
}

/// Writes this thread's log lines at warn level and above into `lines`
/// until the guard drops.
pub fn capture_warnings(lines: &Lines) -> tracing::subscriber::DefaultGuard {
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_default(subscriber)
}
