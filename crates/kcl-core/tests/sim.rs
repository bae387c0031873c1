//! The seeded fleet simulator: the lease engine that production runs
//! (coordinators, their stand-in consumers checkpointing, the in-memory
//! table) under a paused clock, with a fault schedule drawn from a seed.
//!
//! Each seed draws a fleet (2 to 4 workers, each with its own lease
//! duration, renewal mode and drain time, as during a rolling change of
//! settings) and a schedule over three simulated minutes: kills, restarts
//! under the same id, pauses past the lease, per-operation outages of one
//! worker (its beats only, its renewals only, its scans only, everything),
//! random errors, lost answers and latency, and workers joining late. The
//! invariants are checked every 10 ms of simulated time:
//!
//! - no two workers may process one lease at once (a draining victim
//!   counts until its handoff completes or it is fenced);
//! - no checkpoint moves back;
//! - no lease stands unprocessed past the failover bound while a worker
//!   that can take it runs (`ORPHAN_BOUND`);
//! - once the faults stop, every lease is processed by exactly one worker;
//! - in a calm seed (no store faults, no kill, no pause), no handoff is
//!   forced: every victim drains within the handoff timeout and hands over.
//!
//! The stand-in consumers read what each shard carries (two hot shards, a
//! hundred times the others), so every worker measures and publishes its
//! leases' load and the fleet balances by load (the default), with load
//! steals and their handoffs among the faults. In a calm seed, the two hot
//! shards end on different workers.
//!
//! `cargo test -p kcl-core --test sim` runs the fixed seeds and a short
//! budget of random ones; `make sim SEEDS=N` runs N random seeds. A failing
//! seed prints the command that replays its schedule (with `SIM_TRACE=1`,
//! the table every 5 s of it; with `SIM_LOG=kcl_core=debug`, the engine's
//! log lines, stamped with the simulated time). A seed replays exactly,
//! the interleaving of the engine's tasks too: each worker's config
//! carries a seed, from which its instance id, tick jitter and retry
//! jitter are drawn; the engine walks its held leases in key order and
//! polls its loops in a fixed order,
//! and no two of its tasks wait on one `tokio::sync::watch` (which wakes
//! its waiters in an order drawn from the runtime's random generator,
//! seeded per process: seed 1053 diverged in some replays from the order
//! the taker and the watcher woke at the first beat). (With random
//! instance ids, thread-random jitter and unbiased selects, a failing seed
//! failed three replays in four.)
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kcl_core::LeaseRenewal;
use kcl_core::store::memory::{InMemoryLeaseStore, RandomFaults};
use kcl_core::store::{StoreErrorKind, StoreOp};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::{Instant, sleep};

const SHARDS: usize = 6;
/// Bytes a stand-in consumer reads every 500 ms from a hot shard (the
/// first two) and from any other: 200 KB/s against 2 KB/s.
const HOT_BYTES: u64 = 100 * 1024;
const COLD_BYTES: u64 = 1024;
/// Load figures measured over, and written at most every, 20 s, so that
/// load balance acts within the run.
const LOAD_WINDOW: Duration = Duration::from_secs(20);

fn hot(key: &str) -> bool {
    key.ends_with("-000000000000") || key.ends_with("-000000000001")
}
const RUN: Duration = Duration::from_secs(180);
const STEP: Duration = Duration::from_millis(10);
/// The longest a lease may stand unprocessed while a healthy worker runs:
/// a holder's outage seen after its lease duration (at most 30 s here), a
/// same-id restart's old tenure expiring a lease duration and a tick after
/// that, a stuck victim's handoff forced a handoff timeout after it stops
/// renewing. Twice the longest lease and two ticks covers each.
const ORPHAN_BOUND: Duration = Duration::from_secs(2 * 30 + 25);

/// One worker of a seed's fleet.
#[derive(Debug, Clone)]
struct Spec {
    id: String,
    lease: Duration,
    mode: LeaseRenewal,
    drain: Duration,
    /// When it starts (0 for the first workers).
    joins_at: Duration,
}

#[derive(Debug, Clone)]
enum Fault {
    Kill,
    Restart,
    Pause(Duration),
    /// Every call of these operations of the worker fails for a while.
    Outage(Vec<StoreOp>, Duration),
    Random(Duration),
}

#[derive(Debug, Clone)]
struct Schedule {
    seed: u64,
    calm: bool,
    fleet: Vec<Spec>,
    faults: Vec<(Duration, usize, Fault)>,
}

impl Schedule {
    fn draw(seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        // One seed in four is calm: no store faults, no kill, no pause.
        let calm = rng.random_range(0..4) == 0;
        let n = rng.random_range(2..=4);
        let fleet = (0..n)
            .map(|i| Spec {
                id: format!("w{i}"),
                lease: Duration::from_secs([10, 10, 20, 30][rng.random_range(0..4)]),
                mode: if rng.random_bool(0.75) {
                    LeaseRenewal::WorkerLiveness
                } else {
                    LeaseRenewal::PerLease
                },
                // Within the shortest handoff timeout (the lease duration).
                drain: Duration::from_millis(rng.random_range(0..9_000)),
                joins_at: if i < 2 {
                    Duration::ZERO
                } else {
                    Duration::from_secs(rng.random_range(0..90))
                },
            })
            .collect::<Vec<_>>();
        let mut faults = Vec::new();
        if !calm {
            for _ in 0..rng.random_range(1..=4) {
                let at = Duration::from_secs(rng.random_range(20..120));
                let who = rng.random_range(0..n);
                let long = Duration::from_secs(rng.random_range(15..120));
                let fault = match rng.random_range(0..6) {
                    0 => Fault::Kill,
                    1 => Fault::Restart,
                    2 => Fault::Pause(Duration::from_secs(rng.random_range(5..40))),
                    3 => Fault::Outage(vec![StoreOp::Beat], long),
                    4 => Fault::Outage(
                        [
                            vec![StoreOp::Renew],
                            vec![StoreOp::ScanPage],
                            vec![StoreOp::ReadBeats],
                            vec![StoreOp::Checkpoint],
                        ][rng.random_range(0..4)]
                        .clone(),
                        long,
                    ),
                    _ => Fault::Random(long),
                };
                faults.push((at, who, fault));
            }
            faults.sort_by_key(|(at, _, _)| *at);
        }
        Schedule {
            seed,
            calm,
            fleet,
            faults,
        }
    }
}

/// What a run found wrong, if anything.
#[derive(Debug, Default)]
struct Findings {
    overlap: Duration,
    regressions: Vec<String>,
    longest_orphan: Option<(String, Duration)>,
    unheld_at_end: Vec<String>,
    forced_in_calm: u64,
    /// In a calm seed: the worker holding both hot shards at the end,
    /// while another worker runs.
    hot_together: Option<String>,
    /// A digest of the table and of who processed what at every sample:
    /// equal for two runs of a seed that replayed exactly.
    digest: u64,
}

impl Findings {
    fn failed(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.overlap > Duration::ZERO {
            why.push(format!(
                "two workers may process one lease for {:?}",
                self.overlap
            ));
        }
        if !self.regressions.is_empty() {
            why.push(format!("checkpoints moved back: {:?}", self.regressions));
        }
        if let Some((key, d)) = &self.longest_orphan
            && *d > ORPHAN_BOUND
        {
            why.push(format!(
                "{key} stood unprocessed for {d:?} while a worker could take it"
            ));
        }
        if !self.unheld_at_end.is_empty() {
            why.push(format!(
                "not processed by exactly one worker after the faults: {:?}",
                self.unheld_at_end
            ));
        }
        if let Some(worker) = &self.hot_together {
            why.push(format!(
                "{worker} holds both hot shards at the end of a calm run (load balance)"
            ));
        }
        if self.forced_in_calm > 0 {
            why.push(format!(
                "{} handoffs forced in a calm fleet (victims drain within the timeout)",
                self.forced_in_calm
            ));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

struct Fleet {
    table: InMemoryLeaseStore,
    specs: Vec<Spec>,
    workers: Vec<Option<SimWorker>>,
    /// Until when each worker cannot complete calls (paused, an outage of
    /// every operation that matters), as the schedule says.
    impaired_until: Vec<Instant>,
    forced: u64,
}

impl Fleet {
    fn start(&mut self, i: usize, seed: u64) {
        let spec = &self.specs[i];
        let config = in_mode(spec.mode, &spec.id, seed)
            .lease_duration(spec.lease)
            .load_report_interval(LOAD_WINDOW)
            .build()
            .unwrap();
        let stand_in = if spec.drain.is_zero() {
            StandIn::Checkpointing
        } else {
            StandIn::SlowHandoff(spec.drain)
        };
        let load: Load = Arc::new(|key: &str| if hot(key) { HOT_BYTES } else { COLD_BYTES });
        self.workers[i] = Some(SimWorker::start_loaded(&self.table, config, stand_in, load));
    }

    async fn stop(&mut self, i: usize) {
        if let Some(mut w) = self.workers[i].take() {
            self.forced += w.coordinator().stats().handoffs_forced;
            w.kill().await;
        }
    }

    fn running(&self) -> Vec<&SimWorker> {
        self.workers.iter().flatten().collect()
    }

    fn healthy(&self, now: Instant) -> bool {
        self.workers
            .iter()
            .zip(&self.impaired_until)
            .any(|(w, until)| w.is_some() && now >= *until)
    }
}

async fn run(schedule: &Schedule) -> Findings {
    let table = table_with(SHARDS).await;
    let n = schedule.fleet.len();
    let mut fleet = Fleet {
        table: table.clone(),
        specs: schedule.fleet.clone(),
        workers: (0..n).map(|_| None).collect(),
        impaired_until: vec![Instant::now(); n],
        forced: 0,
    };
    let started = Instant::now();
    let mut joined = vec![false; n];
    let mut faults = schedule.faults.iter().peekable();
    let mut watch = Watch::default();
    let mut restarts = 0u64;
    while started.elapsed() < RUN {
        let now = Instant::now();
        for (i, spec) in schedule.fleet.iter().enumerate() {
            if !joined[i] && started.elapsed() >= spec.joins_at {
                joined[i] = true;
                fleet.start(i, schedule.seed ^ i as u64);
            }
        }
        while let Some((at, who, fault)) = faults.peek().copied() {
            if started.elapsed() < *at {
                break;
            }
            faults.next();
            let who = *who;
            if fleet.workers[who].is_none() {
                continue;
            }
            match fault {
                Fault::Kill => fleet.stop(who).await,
                Fault::Restart => {
                    fleet.stop(who).await;
                    restarts += 1;
                    fleet.start(who, schedule.seed ^ (100 + restarts));
                }
                Fault::Pause(d) => {
                    let w = fleet.workers[who].as_ref().unwrap();
                    w.store.pause_until(now + *d);
                    fleet.impaired_until[who] = fleet.impaired_until[who].max(now + *d);
                }
                Fault::Outage(ops, d) => {
                    let w = fleet.workers[who].as_ref().unwrap();
                    for op in ops {
                        w.store
                            .fail_until(Some(*op), StoreErrorKind::Throttled, now + *d);
                    }
                    // A worker missing any of these cannot keep, take or
                    // process leases: not one that can take them over.
                    fleet.impaired_until[who] = fleet.impaired_until[who].max(now + *d);
                }
                Fault::Random(d) => {
                    let w = fleet.workers[who].as_ref().unwrap();
                    w.store.set_random_faults(Some(RandomFaults {
                        seed: schedule.seed ^ 0x5eed,
                        error_rate: 0.1,
                        lost_response_rate: 0.05,
                        max_latency: Duration::from_millis(300),
                    }));
                    fleet.impaired_until[who] = fleet.impaired_until[who].max(now + *d);
                }
            }
        }
        // Random faults end with their window.
        for (i, until) in fleet.impaired_until.iter().enumerate() {
            if now >= *until
                && let Some(w) = &fleet.workers[i]
            {
                w.store.set_random_faults(None);
            }
        }
        sleep(STEP).await;
        watch.sample(&fleet);
        if std::env::var("SIM_TRACE").is_ok() && started.elapsed().as_millis() % 5_000 < 10 {
            trace(&fleet, started.elapsed());
        }
    }
    // Calm down: every fault lifted, and the workers killed started again
    // (as an operator would), so that some worker runs to take every lease.
    for i in 0..n {
        match &fleet.workers[i] {
            Some(w) => w.store.set_random_faults(None),
            None => {
                restarts += 1;
                fleet.start(i, schedule.seed ^ (100 + restarts));
            }
        }
    }
    let settle = Duration::from_secs(2 * 30) + tick_max() * 3;
    let end = Instant::now() + settle;
    let healthy_from = fleet.impaired_until.iter().max().copied().unwrap_or(end);
    while Instant::now() < end.max(healthy_from + settle) {
        sleep(STEP).await;
        watch.sample(&fleet);
    }
    let mut processing: HashMap<String, usize> = HashMap::new();
    for w in fleet.running() {
        for k in w.processing_keys() {
            *processing.entry(k).or_default() += 1;
        }
    }
    let Watch {
        overlap,
        checkpoints,
        mut findings,
        ..
    } = watch;
    findings.unheld_at_end = table
        .snapshot()
        .iter()
        .filter(|l| processing.get(&l.key).copied().unwrap_or(0) != 1)
        .map(|l| l.key.clone())
        .collect();
    findings.overlap = overlap.max();
    findings.regressions = checkpoints.regressions.clone();
    if schedule.calm && fleet.running().len() > 1 {
        let holders: Vec<Option<String>> = table
            .snapshot()
            .into_iter()
            .filter(|l| hot(&l.key))
            .map(|l| l.owner)
            .collect();
        if let [Some(a), Some(b)] = holders.as_slice()
            && a == b
        {
            findings.hot_together = Some(a.clone());
        }
    }
    if schedule.calm {
        let running: u64 = fleet
            .running()
            .iter()
            .map(|w| w.coordinator().stats().handoffs_forced)
            .sum();
        findings.forced_in_calm = fleet.forced + running;
    }
    for i in 0..n {
        fleet.stop(i).await;
    }
    findings
}

/// Prints who owns and who processes each lease (`SIM_TRACE` set): what a
/// failing seed's replay shows.
fn trace(fleet: &Fleet, at: Duration) {
    let mut line = format!("{at:>8.1?}");
    for lease in fleet.table.snapshot() {
        let processing: Vec<&str> = fleet
            .running()
            .into_iter()
            .filter(|w| w.processing_keys().contains(&lease.key))
            .map(|w| w.id.as_str())
            .collect();
        line.push_str(&format!(
            " | {}: {} c{} {:?}",
            &lease.key[lease.key.len() - 1..],
            lease.owner.as_deref().unwrap_or("-"),
            lease.counter,
            processing
        ));
    }
    println!("{line}");
}

/// What the invariants watch over a run.
#[derive(Default)]
struct Watch {
    overlap: OverlapLog,
    checkpoints: CheckpointLog,
    unprocessed_since: HashMap<String, Instant>,
    findings: Findings,
}

impl Watch {
    fn sample(&mut self, fleet: &Fleet) {
        let now = Instant::now();
        let running: Vec<&SimWorker> = fleet.running();
        self.overlap.sample_refs(&running);
        self.checkpoints.sample(&fleet.table);
        let processed: std::collections::HashSet<String> =
            running.iter().flat_map(|w| w.processing_keys()).collect();
        let healthy = fleet.healthy(now);
        self.digest(fleet);
        for lease in fleet.table.snapshot() {
            if processed.contains(&lease.key) || !healthy {
                self.unprocessed_since.remove(&lease.key);
                continue;
            }
            let since = *self
                .unprocessed_since
                .entry(lease.key.clone())
                .or_insert(now);
            let d = now - since;
            if self
                .findings
                .longest_orphan
                .as_ref()
                .is_none_or(|(_, l)| d > *l)
            {
                self.findings.longest_orphan = Some((lease.key.clone(), d));
            }
        }
    }

    /// Folds the table's owners, counters, tenures and checkpoints, and
    /// each worker's leases in process, into the run's digest.
    fn digest(&mut self, fleet: &Fleet) {
        use std::hash::{DefaultHasher, Hash, Hasher};
        // DefaultHasher::new has fixed keys: the same in every process.
        let mut h = DefaultHasher::new();
        self.findings.digest.hash(&mut h);
        for l in fleet.table.snapshot() {
            (&l.key, &l.owner, l.counter, &l.checkpoint, &l.tenure).hash(&mut h);
            (&l.checkpoint_owner, &l.checkpoint_owner_tenure).hash(&mut h);
        }
        for w in fleet.running() {
            (&w.id, w.processing_keys()).hash(&mut h);
        }
        self.findings.digest = h.finish();
    }
}

/// The simulated time since the run began, for the engine's log lines
/// (`SIM_LOG`): the wall clock says nothing under a paused clock.
struct SimClock(Instant);

impl tracing_subscriber::fmt::time::FormatTime for SimClock {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{:>9.3?}", self.0.elapsed())
    }
}

/// Runs one seed; panics with the replay command if it finds anything.
async fn check_seed(seed: u64) {
    let schedule = Schedule::draw(seed);
    let findings = run(&schedule).await;
    if let Some(why) = findings.failed() {
        panic!(
            "seed {seed} failed: {why}\n  schedule: {schedule:?}\n  replay: SIM_SEEDS=1 SIM_BASE={seed} cargo test -p kcl-core --test sim random_seeds -- --nocapture"
        );
    }
}

/// Seeds that found defects (1053: a per-lease holder with a 30 s lease
/// taken by a 10 s peer while its renewals failed; 1079: expired leases
/// left to a restarted worker whose scans failed; 2026: such a lease never
/// looked at again, the taker's ticks quiet; 3221: a per-lease worker
/// whose renewals failed while its beats landed, its leases judged alive
/// by its record; 3261: a thief whose handoff activation kept failing,
/// its beats keeping the lease alive to peers; 5340163516996700958: a
/// third worker taking a lease mid-steal by its 10 s thief's record while
/// the 20 s victim, its renewals failing, still drained;
/// 13917891215581910180: 3261's thief, giving the tenure up, unable to
/// read the liveness records, so that its taker never reclaimed the lease
/// and its beats kept it from peers for 104 s; 13917891215581910790: a
/// worker whose failed beats fenced its tenures, alive again before a peer
/// judged it dead, unable to scan and so to reclaim them for 88 s;
/// 13917891215581911684: a worker back from a 25 s pause reclaimed its
/// lease at the instant a peer, by a read that missed its first beat,
/// judged it dead and took the lease, then stole it and forced the
/// handoff: 2.5 s of two workers on one shard; 8080808001383: a worker
/// whose scans failed while its beats landed counted in the target of a
/// peer that restarted twice, which took only its share of a dead
/// instance's leases: two shards unread for 88 s), and one more: each runs in
/// every `make test`. Seed 5340163516996700958
/// overlapped in three replays in four while replays were not exact; its
/// exact replay now passes with or without the fix, which
/// `a_lease_mid_steal_lapses_by_its_previous_owners_record` holds.
const FIXED_SEEDS: &[u64] = &[
    1,
    1053,
    1079,
    2026,
    3221,
    3261,
    5340163516996700958,
    8080808001383,
    13917891215581910180,
    13917891215581910790,
    13917891215581911684,
];

#[tokio::test(start_paused = true)]
async fn fixed_seeds_hold_every_invariant() {
    for seed in FIXED_SEEDS {
        check_seed(*seed).await;
    }
}

/// A seed replays exactly, its interleaving too: run after run, each in a
/// runtime of its own (as each replay is a process of its own), the table
/// and who processes what are the same at every sample. Seed 1053 ran in
/// three different ways over 12 replays while the taker and the watcher
/// woke from one `tokio::sync::watch` in a random order.
#[test]
fn a_seed_replays_the_same_run_every_time() {
    let digests: Vec<u64> = (0..8)
        .map(|_| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap()
                .block_on(async { run(&Schedule::draw(1053)).await.digest })
        })
        .collect();
    assert!(
        digests.windows(2).all(|w| w[0] == w[1]),
        "seed 1053 ran differently between replays: {digests:x?}"
    );
}

/// A short budget of fresh seeds per run (`SIM_SEEDS`, default 8), from a
/// base that changes every run; `SIM_BASE` fixes it (one seed from the
/// base a failure prints replays its schedule).
#[tokio::test(start_paused = true)]
async fn random_seeds_hold_every_invariant() {
    let count: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let base: u64 = std::env::var("SIM_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("simulating {count} seeds from {base}");
    let _log = std::env::var("SIM_LOG").ok().map(|filter| {
        tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_ansi(false)
                .with_timer(SimClock(Instant::now()))
                .finish(),
        )
    });
    let started = std::time::Instant::now();
    for i in 0..count {
        check_seed(base.wrapping_add(i)).await;
    }
    println!(
        "{count} seeds in {:.1} s ({:.0} seeds/min)",
        started.elapsed().as_secs_f64(),
        count as f64 / started.elapsed().as_secs_f64() * 60.0
    );
}
