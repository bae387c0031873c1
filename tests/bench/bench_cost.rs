//! What a fleet costs in DynamoDB requests and capacity units: an idle
//! fleet of real workers on DynamoDB Local in both renewal modes, and a
//! simulation of fleets too large for DynamoDB Local (100 workers on 1,000
//! and on 10,000 shards) on the in-memory store with DynamoDB's billing
//! model (`kcl_core::store::cost`), under a paused clock.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use futures::TryStreamExt;
use kcl_core::leases::ShutdownMode;
use kcl_core::processor::{RecordBatch, RecordProcessor, ShardContext};
use kcl_core::source::InitialPosition;
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::store::LeaseStore;
use kcl_core::store::StoreOp;
use kcl_core::store::cost::{Bill, CostedStore};
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::store::metered::{MeteredStore, StoreStats};
use kcl_core::worker::{StreamSpec, Worker, WorkerConfig, WorkerHandle};
use kcl_core::{
    Checkpoint, Lease, LeaseConfig, LeaseCoordinator, LeaseLayout, LeaseRenewal,
    checkpointer::Checkpointer, processor::ProcessorError,
};
use kcl_dynamodb::{Capacity, DynamoDbLeaseStore, ensure_table, ensure_workers_table};
use kcl_tests::{TestEnv, delete_table, unique_name};
use tokio::time::Instant;

use crate::Section;

/// A processor with nothing to do: the streams are idle.
struct Idle;

#[kcl::async_trait]
impl RecordProcessor for Idle {
    async fn process_records(
        &mut self,
        _: &RecordBatch,
        _: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        Ok(())
    }
}

fn mode_name(mode: LeaseRenewal) -> &'static str {
    match mode {
        LeaseRenewal::PerLease => "per-lease",
        _ => "liveness",
    }
}

// ---------------------------------------------------------------------------
// The idle fleet on DynamoDB Local
// ---------------------------------------------------------------------------

const IDLE_WINDOW: Duration = Duration::from_secs(60);

struct IdleCost {
    mode: LeaseRenewal,
    workers: usize,
    shards: usize,
    requests_per_min: f64,
    units_per_min: f64,
    by_op: Vec<(StoreOp, f64)>,
    settled_after: Duration,
}

/// `workers` in-process workers (the whole worker: lease engine, shard
/// sync and cleanup, consumers of an idle in-memory stream) on one lease
/// table in DynamoDB Local, settled and balanced, then measured for a
/// minute.
async fn idle_cost(
    env: &TestEnv,
    mode: LeaseRenewal,
    workers: usize,
    shards: usize,
) -> anyhow::Result<IdleCost> {
    let table = unique_name("kcl-bench-idle");
    ensure_table(env.dynamodb(), &table, Capacity::OnDemand).await?;
    let base = DynamoDbLeaseStore::new(env.dynamodb().clone(), &table);
    ensure_workers_table(env.dynamodb(), base.workers_table(), Capacity::OnDemand).await?;
    let source = InMemoryShardSource::new();
    source.create_stream("s", shards);
    let mut fleet: Vec<(WorkerHandle, tokio::task::JoinHandle<()>, Arc<StoreStats>)> = Vec::new();
    for w in 0..workers {
        let stats = Arc::new(StoreStats::default());
        let store = MeteredStore::with_stats(
            base.clone().with_stats(Arc::clone(&stats)),
            Arc::clone(&stats),
        );
        let lease = LeaseConfig::builder(format!("w-{w}"))
            .renewal(mode)
            .build()?;
        let config = WorkerConfig::builder(lease)
            .stream(StreamSpec {
                name: "s".into(),
                layout: LeaseLayout::SingleStream,
            })
            .initial_position(InitialPosition::TrimHorizon)
            .build()?;
        let worker = Worker::new(
            config,
            Arc::new(store),
            Arc::new(source.clone()),
            Arc::new(|_: &ShardContext| Idle),
        );
        let handle = worker.handle();
        let task = tokio::spawn(async move {
            let _ = worker.run().await;
        });
        fleet.push((handle, task, stats));
    }
    let started = Instant::now();
    loop {
        let leases: Vec<Lease> = base.scan().try_concat().await?;
        let counts = owner_counts(&leases, workers);
        let settled = counts.iter().sum::<usize>() == shards
            && counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1
            && leases.iter().all(|l| l.checkpoint_owner.is_none());
        if settled {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(300),
            "{} x {shards} ({}) did not settle: {counts:?}",
            workers,
            mode_name(mode)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled_after = started.elapsed();
    // Past the last acquisition, and past the liveness watchers' learning
    // of their peers' cadences: a worker's reads narrow each peer's beat
    // window by halves over its first six beats or so (30 s at the
    // defaults), a read or two more than the steady state's one a beat.
    // Measured from 25 s after settling, 2 x 8 cost 50 and 51 requests a
    // minute in six runs (25 and 26 reads); from 50 s, 49 (24 reads).
    tokio::time::sleep(Duration::from_secs(45)).await;
    let before: Vec<_> = fleet.iter().map(|(_, _, s)| s.snapshot()).collect();
    let window = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let per_min = 60.0 / window.elapsed().as_secs_f64();
    let mut by_op: Vec<(StoreOp, f64)> = Vec::new();
    let (mut requests, mut units) = (0.0, 0.0);
    for ((_, _, s), s0) in fleet.iter().zip(&before) {
        let d = s.snapshot().since(s0);
        for op in StoreOp::ALL {
            let o = d.op(op);
            requests += o.calls as f64 * per_min;
            units += o.capacity * per_min;
            match by_op.iter_mut().find(|r| r.0 == op) {
                Some(r) => r.1 += o.calls as f64 * per_min,
                None => by_op.push((op, o.calls as f64 * per_min)),
            }
        }
    }
    by_op.retain(|r| r.1 > 0.0);
    for (handle, task, _) in fleet {
        handle.shutdown();
        let _ = task.await;
    }
    let _ = delete_table(env.dynamodb(), base.workers_table()).await;
    let _ = delete_table(env.dynamodb(), &table).await;
    Ok(IdleCost {
        mode,
        workers,
        shards,
        requests_per_min: requests,
        units_per_min: units,
        by_op,
        settled_after,
    })
}

pub(crate) async fn idle_fleet_cost() -> anyhow::Result<Section> {
    let env = TestEnv::connect().await?;
    let configs = [
        (LeaseRenewal::WorkerLiveness, 2, 8),
        (LeaseRenewal::WorkerLiveness, 4, 100),
        (LeaseRenewal::PerLease, 2, 8),
        (LeaseRenewal::PerLease, 4, 100),
    ];
    // All four at once: the counts follow from the settings, not from the
    // machine's speed, and this keeps the scenario near two minutes.
    let runs = futures::future::try_join_all(
        configs
            .iter()
            .map(|&(mode, w, s)| idle_cost(&env, mode, w, s)),
    )
    .await?;
    let mut s = Section::new("DynamoDB cost of an idle fleet, in both renewal modes");
    s.what = format!(
        "Whole workers (lease engine, shard sync and finished-lease cleanup, consumers of an \
         idle in-memory stream) on a lease table in DynamoDB Local at the production \
         defaults, settled and balanced, then measured for {:.0} s: requests and consumed \
         capacity units per minute as the SDK reports them. 2 workers x 8 shards and 4 \
         workers x 100 shards, in each renewal mode, all four fleets at once.",
        IDLE_WINDOW.as_secs_f64()
    );
    for r in &runs {
        s.row(
            &format!("{} x {} ({})", r.workers, r.shards, mode_name(r.mode)),
            format!(
                "{:.0} req/min, {:.0} CU/min ({}); settled {:.0} s after start",
                r.requests_per_min,
                r.units_per_min,
                ops_per_min(&r.by_op),
                r.settled_after.as_secs_f64()
            ),
        );
        let (req, cu) = match (r.mode, r.shards) {
            (LeaseRenewal::PerLease, 8) => (
                "idle_requests_per_min_2x8_per_lease",
                "idle_capacity_units_per_min_2x8_per_lease",
            ),
            (LeaseRenewal::PerLease, _) => (
                "idle_requests_per_min_4x100_per_lease",
                "idle_capacity_units_per_min_4x100_per_lease",
            ),
            (_, 8) => (
                "idle_requests_per_min_2x8",
                "idle_capacity_units_per_min_2x8",
            ),
            _ => (
                "idle_requests_per_min_4x100",
                "idle_capacity_units_per_min_4x100",
            ),
        };
        s.figure(req, r.requests_per_min.round(), "requests/min");
        s.figure(cu, r.units_per_min.round(), "capacity units/min");
        // 2 x 8: 12 beats and 12 reads of the records per worker, the
        // sync's scan and the odd Java probe; reading just after peers'
        // beats (failover within the lease duration) costs 11 more than a
        // read per taker tick did.
        let limit = match (r.mode, r.shards) {
            (LeaseRenewal::WorkerLiveness, 8) => Some(50.0),
            (LeaseRenewal::WorkerLiveness, _) => Some(200.0),
            _ => None,
        };
        if let Some(limit) = limit
            && r.requests_per_min > limit
        {
            s.failed = Some(format!(
                "{} x {}: {:.0} requests/min, above {limit}",
                r.workers, r.shards, r.requests_per_min
            ));
        }
    }
    let get = |mode, shards| {
        runs.iter()
            .find(|r| r.mode == mode && r.shards == shards)
            .map_or(0.0, |r| r.requests_per_min)
    };
    s.headline = format!(
        "idle requests/min, liveness records (default) vs per lease: 2 x 8: {:.0} vs {:.0}; 4 x 100: {:.0} vs {:.0}",
        get(LeaseRenewal::WorkerLiveness, 8),
        get(LeaseRenewal::PerLease, 8),
        get(LeaseRenewal::WorkerLiveness, 100),
        get(LeaseRenewal::PerLease, 100),
    );
    s.settings = "Production defaults: lease 10 s; liveness records beat every 5 s (per-lease \
                  renewal every 3.33 s); a taker tick every 10 s +/-25 % reading the liveness \
                  records and, only when the fleet changed, the lease table; shard sync every \
                  60 s on one worker of the fleet."
        .into();
    s.java = "The Java KCL renews every lease every 3.33 s and scans the whole lease table \
              every taker run: the per-lease rows are its cost structure. Measured side by \
              side before this change (2 consumers x 8 shards): kcl 158, the Java KCL 3.1.3 \
              178, async-kinesis 140, lifion-kinesis 71 requests/min."
        .into();
    s.limits = "Nothing machine-bound: the counts follow from the settings. Capacity units \
                are DynamoDB Local's figures (strongly consistent reads)."
        .into();
    Ok(s)
}

// ---------------------------------------------------------------------------
// The fleet simulation: 100 workers on 1,000 and 10,000 shards
// ---------------------------------------------------------------------------

const SIM_WORKERS: usize = 100;
const SIM_TICK: Duration = Duration::from_secs(10);
const SIM_IDLE: Duration = Duration::from_secs(300);
const SIM_SYNC: Duration = Duration::from_secs(60);

struct SimResult {
    shards: usize,
    leased_after_ticks: usize,
    balanced_after_ticks: usize,
    idle_requests_per_min: f64,
    idle_read_units_per_min: f64,
    idle_write_units_per_min: f64,
    killed_requests_per_min: f64,
    killed_read_units_per_min: f64,
    failover: Duration,
    cold_cpu_per_tick: Duration,
    idle_cpu_per_tick: Duration,
}

struct SimWorker {
    coordinator: Option<LeaseCoordinator>,
    sync: tokio::task::JoinHandle<()>,
}

fn counts(table: &InMemoryLeaseStore) -> Vec<usize> {
    owner_counts(&table.snapshot(), SIM_WORKERS)
}

/// Leases held per worker `w-0` .. `w-{workers - 1}`.
fn owner_counts(leases: &[Lease], workers: usize) -> Vec<usize> {
    let mut counts = vec![0usize; workers];
    for w in leases.iter().filter_map(worker_index) {
        counts[w] += 1;
    }
    counts
}

/// `n` for a lease owned by worker `w-{n}` (the benches' worker ids).
pub(crate) fn worker_index(lease: &Lease) -> Option<usize> {
    lease
        .owner
        .as_deref()
        .and_then(|o| o.strip_prefix("w-"))
        .and_then(|n| n.parse::<usize>().ok())
}

/// Requests per minute by operation, as a row shows them: "renew 12, beat 4".
pub(crate) fn ops_per_min(by_op: &[(StoreOp, f64)]) -> String {
    by_op
        .iter()
        .map(|(op, n)| format!("{op} {n:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ticks(fleet: &[SimWorker]) -> u64 {
    fleet
        .iter()
        .filter_map(|w| w.coordinator.as_ref())
        .map(|c| c.stats().ticks)
        .sum()
}

/// One fleet: cold start, an idle stretch, then one worker killed.
async fn simulate(shards: usize) -> anyhow::Result<SimResult> {
    // DynamoDB pages a scan at 1 MB: about 3,000 of these items.
    let table = InMemoryLeaseStore::new().with_page_size(3000);
    for i in 0..shards {
        table
            .create_if_absent(&Lease::new(
                format!("shardId-{i:012}"),
                Checkpoint::TrimHorizon,
            ))
            .await?;
    }
    let bill = Arc::new(Bill::default());
    let mut fleet = Vec::new();
    let cold_started = std::time::Instant::now();
    for w in 0..SIM_WORKERS {
        let store: Arc<dyn LeaseStore> =
            Arc::new(CostedStore::new(table.handle(), Arc::clone(&bill)));
        let config = LeaseConfig::builder(format!("w-{w}"))
            .seed(w as u64)
            .release_on_drop(false)
            .build()?;
        let (coordinator, mut events) = LeaseCoordinator::start(Arc::clone(&store), config);
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        // The worker's shard sync: one full read per round, on the leader.
        let signals = coordinator.signals();
        let sync = tokio::spawn(async move {
            loop {
                tokio::time::sleep(SIM_SYNC.mul_f64(0.75 + 0.5 * rand::random::<f64>())).await;
                if signals.is_sync_leader() {
                    let leases: Vec<Lease> = store.scan().try_concat().await.unwrap_or_default();
                    signals.saw_table(&leases);
                }
            }
        });
        fleet.push(SimWorker {
            coordinator: Some(coordinator),
            sync,
        });
    }
    // Cold start, tick by tick.
    let (mut leased, mut balanced) = (None, None);
    for tick in 1..=20 {
        tokio::time::sleep(SIM_TICK).await;
        let c = counts(&table);
        if leased.is_none() && c.iter().sum::<usize>() == shards {
            leased = Some(tick);
        }
        if balanced.is_none()
            && c.iter().sum::<usize>() == shards
            && c.iter().max().unwrap_or(&0) - c.iter().min().unwrap_or(&0) <= 1
        {
            balanced = Some(tick);
            break;
        }
    }
    let cold_ticks = ticks(&fleet);
    let cold_cpu = cold_started.elapsed();
    let leased = leased.context("never all leased")?;
    let balanced = balanced.context("never balanced")?;
    // Idle.
    tokio::time::sleep(SIM_TICK * 3).await;
    let b0 = bill.snapshot();
    let t0 = ticks(&fleet);
    let wall = std::time::Instant::now();
    tokio::time::sleep(SIM_IDLE).await;
    let idle_cpu = wall.elapsed();
    let idle = bill.snapshot().since(&b0);
    let idle_ticks = ticks(&fleet) - t0;
    let per_min = 60.0 / SIM_IDLE.as_secs_f64();
    // One worker killed: its leases expire and move.
    let victim = SIM_WORKERS - 1;
    let victim_id = format!("w-{victim}");
    if let Some(c) = fleet[victim].coordinator.take() {
        drop(c);
    }
    fleet[victim].sync.abort();
    let killed_at = Instant::now();
    let b1 = bill.snapshot();
    let failover = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let orphans = table
            .snapshot()
            .iter()
            .filter(|l| l.owner.as_deref() == Some(victim_id.as_str()))
            .count();
        if orphans == 0 {
            break killed_at.elapsed();
        }
        ensure!(
            killed_at.elapsed() < Duration::from_secs(120),
            "{orphans} leases of the killed worker still owned by it"
        );
    };
    let window = Duration::from_secs(120).max(failover);
    tokio::time::sleep(window.saturating_sub(killed_at.elapsed())).await;
    let killed = bill.snapshot().since(&b1);
    let killed_per_min = 60.0 / killed_at.elapsed().as_secs_f64();
    for w in &mut fleet {
        w.sync.abort();
        if let Some(c) = w.coordinator.take() {
            c.shutdown(ShutdownMode::Abandon).await;
        }
    }
    Ok(SimResult {
        shards,
        leased_after_ticks: leased,
        balanced_after_ticks: balanced,
        idle_requests_per_min: idle.requests as f64 * per_min,
        idle_read_units_per_min: idle.read_units as f64 * per_min,
        idle_write_units_per_min: idle.write_units as f64 * per_min,
        killed_requests_per_min: killed.requests as f64 * killed_per_min,
        killed_read_units_per_min: killed.read_units as f64 * killed_per_min,
        failover,
        cold_cpu_per_tick: cold_cpu / (cold_ticks.max(1) as u32),
        idle_cpu_per_tick: idle_cpu / (idle_ticks.max(1) as u32),
    })
}

pub(crate) fn fleet_simulation() -> anyhow::Result<Section> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let small = rt.block_on(simulate(1_000))?;
    let large = rt.block_on(simulate(10_000))?;
    let mut s = Section::new("Fleet simulation: 100 workers on 1,000 and 10,000 shards");
    s.what = "100 lease coordinators at the production defaults (worker-liveness renewal), \
              each with its share of shard sync (one full read per 60 s round on the fleet's \
              leader), on the in-memory store billed as DynamoDB bills (item sizes of the Java \
              KCL layout, 4 KB read units for strongly consistent reads, 1 KB write units, 1 MB \
              scan pages), under a paused clock: a cold start on a fresh table, 5 minutes idle, \
              then one worker killed."
        .into();
    for r in [&small, &large] {
        s.row(
            &format!("{} shards: cold start", r.shards),
            format!(
                "all leased after {} tick(s), balanced (max - min <= 1) after {}",
                r.leased_after_ticks, r.balanced_after_ticks
            ),
        );
        s.row(
            &format!("{} shards: idle", r.shards),
            format!(
                "{:.0} requests/min, {:.0} read units/min, {:.0} write units/min",
                r.idle_requests_per_min, r.idle_read_units_per_min, r.idle_write_units_per_min
            ),
        );
        s.row(
            &format!("{} shards: one worker killed", r.shards),
            format!(
                "its leases moved after {:.1} s; {:.0} requests/min, {:.0} read units/min over the following 2 min",
                r.failover.as_secs_f64(),
                r.killed_requests_per_min,
                r.killed_read_units_per_min
            ),
        );
        s.row(
            &format!("{} shards: CPU per taker tick per worker", r.shards),
            format!(
                "cold start {:.2} ms (a full read and decision), idle {:.3} ms",
                r.cold_cpu_per_tick.as_secs_f64() * 1e3,
                r.idle_cpu_per_tick.as_secs_f64() * 1e3
            ),
        );
    }
    let ratio = large.idle_requests_per_min / small.idle_requests_per_min.max(1.0);
    s.row(
        "idle requests/min, 10,000 / 1,000 shards",
        format!("{ratio:.2}"),
    );
    s.figure(
        "sim_idle_requests_per_min_100x10000",
        large.idle_requests_per_min.round(),
        "requests/min",
    );
    s.figure(
        "sim_idle_read_units_per_min_100x10000",
        large.idle_read_units_per_min.round(),
        "read units/min",
    );
    s.figure(
        "sim_idle_write_units_per_min_100x10000",
        large.idle_write_units_per_min.round(),
        "write units/min",
    );
    s.figure("sim_requests_ratio_10000_vs_1000", ratio, "ratio");
    s.figure(
        "sim_cold_start_leased_ticks_100x10000",
        large.leased_after_ticks as f64,
        "ticks",
    );
    s.figure(
        "sim_cold_start_balanced_ticks_100x10000",
        large.balanced_after_ticks as f64,
        "ticks",
    );
    s.figure(
        "sim_cpu_per_tick_ms_cold_100x10000",
        large.cold_cpu_per_tick.as_secs_f64() * 1e3,
        "ms per worker tick",
    );
    s.fail_if(
        ratio > 1.2,
        format!("requests grow {ratio:.2}x from 1,000 to 10,000 shards"),
    );
    s.fail_if(
        large.idle_requests_per_min > 5_000.0,
        format!("{:.0} requests/min idle", large.idle_requests_per_min),
    );
    s.fail_if(
        large.idle_read_units_per_min > 20_000.0,
        format!("{:.0} read units/min idle", large.idle_read_units_per_min),
    );
    s.fail_if(
        large.leased_after_ticks > 2 || large.balanced_after_ticks > 5,
        format!(
            "cold start: leased after {} ticks, balanced after {}",
            large.leased_after_ticks, large.balanced_after_ticks
        ),
    );
    s.headline = format!(
        "100 x 10,000 idle: {:.0} requests/min, {:.0} read units/min ({ratio:.2}x the requests of 100 x 1,000); cold start leased in {} tick(s), balanced in {}",
        large.idle_requests_per_min,
        large.idle_read_units_per_min,
        large.leased_after_ticks,
        large.balanced_after_ticks
    );
    s.settings = "Production defaults; the clock is simulated, the CPU time is real (this \
                  machine's, one core, debug-free release build of the bench)."
        .into();
    s.java = "Renewing every lease (the Java KCL's way, and kcl's PerLease mode) costs 18 \
              writes per lease per minute: 180,000 writes/min for 10,000 idle shards, before \
              any scan."
        .into();
    s.limits = "A model: DynamoDB's latency, throttling and partition limits are not \
                simulated; the requests and units follow from the code and the item sizes."
        .into();
    Ok(s)
}
