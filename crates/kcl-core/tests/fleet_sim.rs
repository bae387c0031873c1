//! Deterministic fleet simulations: several lease coordinators share one
//! in-memory table under a paused tokio clock. Times below are simulated.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use kcl_core::LeaseRenewal;
use kcl_core::store::memory::{Fault, RandomFaults};
use kcl_core::store::{StoreErrorKind, StoreOp};
use tokio::time::{Instant, sleep};

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("worker-{i}")).collect()
}

/// Invariant 7: the lease table is read (one paginated scan) at most once
/// per tick: every tick renewing per lease, only the ticks that found the
/// fleet changed in the liveness mode. The liveness records are the
/// watcher's to read (see `idle_reads_follow_peers_beats`).
fn assert_one_scan_per_tick(mode: LeaseRenewal, workers: &[SimWorker]) {
    for w in workers {
        let Some(c) = &w.coordinator else { continue };
        let stats = c.stats();
        assert!(stats.ticks > 0);
        // A tick without a recent read of the records goes no further.
        let scanning = match mode {
            LeaseRenewal::PerLease => stats.ticks - stats.scan_failures,
            _ => stats.ticks - stats.quiet_ticks - stats.scan_failures,
        };
        assert_eq!(w.stats.scans(), scanning, "{}: scans per tick", w.id);
    }
}

/// [`assert_one_scan_per_tick`] under faults: a call abandoned at its
/// timeout is never counted, so the counts are upper bounds.
fn assert_at_most_one_scan_per_tick(mode: LeaseRenewal, workers: &[SimWorker]) {
    for w in workers {
        let Some(c) = &w.coordinator else { continue };
        let stats = c.stats();
        let scanning = match mode {
            LeaseRenewal::PerLease => stats.ticks,
            _ => stats.ticks - stats.quiet_ticks,
        };
        assert!(w.stats.scans() <= scanning, "{}: scans per tick", w.id);
    }
}

/// Renewal writes per minute follow the workers with liveness records (one
/// beat per worker every 5 s, no lease renewed) and the leases when every
/// lease is renewed (one write per lease every 3.33 s, and a beat per
/// worker).
async fn renewal_writes_follow_workers_not_leases(mode: LeaseRenewal) {
    const SHARDS: usize = 40;
    let table = table_with(SHARDS).await;
    let names = ids(4);
    let workers = start_all(&table, &names, |id, i| {
        in_mode(mode, id, 50 + i).build().unwrap()
    });
    run_until_balanced(&table, &workers, &names, Duration::from_millis(100)).await;
    sleep(TICK * 2).await;
    let before: Vec<_> = workers.iter().map(|w| w.stats.snapshot()).collect();
    sleep(Duration::from_secs(60)).await;
    let (mut beats, mut renewals) = (0, 0);
    for (w, b) in workers.iter().zip(&before) {
        let d = w.stats.snapshot().since(b);
        beats += d.op(StoreOp::Beat).calls;
        renewals += d.op(StoreOp::Renew).calls;
    }
    println!(
        "{mode:?}: {beats} beats and {renewals} renewals a minute for 4 workers x {SHARDS} leases"
    );
    match mode {
        LeaseRenewal::PerLease => {
            // Every lease renewed (for Java KCL workers), and every worker
            // beats its record too, at the same 3.33 s.
            assert!((68..=76).contains(&beats), "{beats} beats: 4 workers x 18");
            assert!((680..=730).contains(&renewals), "{renewals} renewals");
        }
        _ => {
            assert_eq!(renewals, 0, "no lease item renewed");
            assert!((44..=52).contains(&beats), "{beats} beats: 4 workers x 12");
        }
    }
}

/// The idle cost of reading the liveness records just after peers' beats:
/// with one peer, one read per beat interval (12 a minute at the
/// defaults); with three, at most two per interval (24 a minute). An idle
/// 2 x 8 fleet makes at most 50 requests a minute in all (beats, reads and
/// the odd scan), and reads the lease table no more.
#[tokio::test(start_paused = true)]
async fn idle_reads_follow_peers_beats() {
    // Every call answered in up to 40 ms, as DynamoDB's own: reads that
    // drift a little later than the beats they follow must not add reads.
    let latency = RandomFaults {
        seed: 0,
        error_rate: 0.0,
        lost_response_rate: 0.0,
        max_latency: Duration::from_millis(40),
    };
    for (workers_n, reads_max) in [(2usize, 12u64), (4, 25)] {
        let table = table_with(8).await;
        let names = ids(workers_n);
        let workers = start_all(&table, &names, |id, i| config(id, 90 + i).build().unwrap());
        for (i, w) in workers.iter().enumerate() {
            w.store.set_random_faults(Some(RandomFaults {
                seed: i as u64,
                ..latency
            }));
        }
        run_until_balanced(&table, &workers, &names, Duration::from_millis(100)).await;
        sleep(TICK * 3).await;
        let before: Vec<_> = workers.iter().map(|w| w.stats.snapshot()).collect();
        sleep(Duration::from_secs(60)).await;
        let mut fleet_requests = 0;
        for (w, b) in workers.iter().zip(&before) {
            let d = w.stats.snapshot().since(b);
            let reads = d.op(StoreOp::ReadBeats).calls;
            println!(
                "{workers_n} workers: {} reads, {} beats, {} requests a minute ({})",
                reads,
                d.op(StoreOp::Beat).calls,
                d.total_calls(),
                w.id
            );
            assert!(
                (11..=reads_max).contains(&reads),
                "{}: {reads} liveness reads a minute with {} peers",
                w.id,
                workers_n - 1
            );
            fleet_requests += d.total_calls();
        }
        if workers_n == 2 {
            assert!(
                fleet_requests <= 50,
                "{fleet_requests} requests a minute for 2 x 8 idle"
            );
        }
    }
}

/// Runs a simulation in both renewal modes, as two tests.
macro_rules! in_both_modes {
    ($($name:ident),* $(,)?) => {
        mod per_lease {
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    super::$name(kcl_core::LeaseRenewal::PerLease).await
                }
            )*
        }
        mod worker_liveness {
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    super::$name(kcl_core::LeaseRenewal::WorkerLiveness).await
                }
            )*
        }
    };
}

in_both_modes!(
    renewal_writes_follow_workers_not_leases,
    cold_start_claims_everything_in_one_tick_then_balances,
    a_killed_workers_leases_are_taken_within_lease_duration_plus_one_tick,
    failover_stays_within_its_bound_at_every_kill_phase,
    failover_stays_within_its_bound_when_calls_take_varying_time,
    a_worker_killed_before_it_beat_about_its_leases_loses_them_within_the_bound,
    faults_never_make_two_workers_believe_in_one_lease,
    scans_stay_one_per_tick_balanced_or_not,
    two_processes_with_one_worker_id_never_share_a_lease,
    a_lost_take_is_reclaimed_by_its_own_process_not_by_another_under_the_same_id,
    a_worker_that_stopped_before_this_one_started_has_its_leases_within_a_lease_duration,
    a_previous_owner_renews_while_it_drains_and_the_handoff_completes,
    a_stuck_previous_owner_lets_go_only_after_the_handoff_timeout,
    a_previous_owner_killed_mid_handoff_loses_its_lease_within_the_bound
);

async fn cold_start_claims_everything_in_one_tick_then_balances(mode: LeaseRenewal) {
    const SHARDS: usize = 64;
    let table = table_with(SHARDS).await;
    let names = ids(4);
    let workers = start_all(&table, &names, |id, i| {
        in_mode(mode, id, i).build().unwrap()
    });

    // Every first tick runs at start; nothing waits for a second tick.
    sleep(Duration::from_millis(50)).await;
    let owned: usize = table_counts(&table).values().sum();
    assert_eq!(owned, SHARDS, "all shards claimed within the first tick");

    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let started = Instant::now();
    let mut log = OverlapLog::default();
    run_until(
        &workers,
        &mut log,
        Duration::from_millis(100),
        Duration::from_millis(10),
        || balanced(&table, &refs),
        || started.elapsed() < tick_max() * 12,
        || format!("not balanced: {:?}", table_counts(&table)),
    )
    .await;
    let took = started.elapsed();
    println!(
        "cold start {SHARDS} shards / 4 workers: balanced after {took:?} ({:.1} ticks), counts {:?}, max steal overlap {:?}",
        took.as_secs_f64() / TICK.as_secs_f64(),
        table_counts(&table),
        log.max()
    );
    // Stays balanced: no further ownership changes.
    let changes = table.owner_changes().len();
    run_for(&workers, &mut log, TICK * 5, Duration::from_millis(50)).await;
    assert_eq!(
        table.owner_changes().len(),
        changes,
        "a balanced fleet kept moving leases"
    );
    // Steals are graceful handoffs: never two believers at once.
    assert_eq!(log.max(), Duration::ZERO, "steal overlap");
    let handoffs: u64 = workers
        .iter()
        .map(|w| w.coordinator().stats().handoffs_completed)
        .sum();
    let stolen: u64 = workers.iter().map(|w| w.coordinator().stats().stolen).sum();
    assert_eq!(handoffs, stolen, "every handoff completed without forcing");
    assert_one_scan_per_tick(mode, &workers);
}

async fn a_killed_workers_leases_are_taken_within_lease_duration_plus_one_tick(mode: LeaseRenewal) {
    const SHARDS: usize = 32;
    let table = table_with(SHARDS).await;
    let names = ids(4);
    let mut workers = start_all(&table, &names, |id, i| {
        in_mode(mode, id, 10 + i).build().unwrap()
    });
    run_until_balanced(&table, &workers, &names, Duration::from_millis(50)).await;
    // Let a few renew rounds pass so the kill lands at a random phase.
    sleep(Duration::from_millis(7_777)).await;

    let victim_keys: Vec<String> = workers[3].coordinator().held_keys();
    assert!(!victim_keys.is_empty());
    let killed_at = Instant::now();
    workers[3].kill().await;
    // From here on every change is an expiry take, which must not overlap.
    let mut log = OverlapLog::default();

    let bound = LEASE + tick_max();
    loop {
        let snapshot = table.snapshot();
        let orphaned = snapshot
            .iter()
            .filter(|l| victim_keys.contains(&l.key) && l.owner.as_deref() == Some("worker-3"))
            .count();
        if orphaned == 0 {
            break;
        }
        assert!(
            killed_at.elapsed() <= bound,
            "{orphaned} leases still orphaned after {:?}",
            killed_at.elapsed()
        );
        run_for(
            &workers,
            &mut log,
            Duration::from_millis(100),
            Duration::from_millis(20),
        )
        .await;
    }
    println!(
        "failover: {} leases of a killed worker taken {:?} after the kill (bound {bound:?})",
        victim_keys.len(),
        killed_at.elapsed()
    );
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "expiry takes never overlap a live holder"
    );
    assert_one_scan_per_tick(mode, &workers);
}

/// The failover bound at the defaults, for kills spread evenly over one
/// taker tick (and so over two beat intervals): 2 workers, 8 leases, the
/// worker holding the most killed at each of 12 phases. With liveness
/// records a holder's death is seen a lease duration after the watcher's
/// read just after its last beat, and its leases are taken then: the
/// bound is the lease duration plus the cadence's precision and a beat's
/// jitter (`LIVENESS_SLACK`), whatever the phase, in both renewal modes
/// (a worker renewing per lease beats its record too).
async fn failover_stays_within_its_bound_at_every_kill_phase(mode: LeaseRenewal) {
    failover_at_every_kill_phase(mode, Duration::ZERO).await;
}

/// The same with every store call taking up to `latency`, drawn per call
/// as a real table's answers vary: a beat then lands a little later than
/// the one before it.
async fn failover_stays_within_its_bound_when_calls_take_varying_time(mode: LeaseRenewal) {
    failover_at_every_kill_phase(mode, Duration::from_millis(200)).await;
}

async fn failover_at_every_kill_phase(mode: LeaseRenewal, latency: Duration) {
    const SHARDS: usize = 8;
    const PHASES: u32 = 12;
    // Every kcl worker beats, so a holder renewing per lease is judged by
    // its record as well: one bound for both modes. A store that takes
    // time adds it to the read that proves the death, the scan and the
    // take.
    let bound = LEASE + LIVENESS_SLACK + latency * 3;
    let mut took = Vec::new();
    for phase in 0..PHASES {
        let table = table_with(SHARDS).await;
        let mut workers = start_all(&table, &["a", "b"], |id, i| {
            in_mode(mode, id, 70 + i).build().unwrap()
        });
        if !latency.is_zero() {
            for (i, w) in workers.iter().enumerate() {
                w.store.set_random_faults(Some(RandomFaults {
                    seed: 1000 * u64::from(phase) + i as u64,
                    error_rate: 0.0,
                    lost_response_rate: 0.0,
                    max_latency: latency,
                }));
            }
        }
        let mut log = OverlapLog::default();
        let step = Duration::from_millis(20);
        while !balanced(&table, &["a", "b"]) {
            run_for(&workers, &mut log, Duration::from_secs(1), step).await;
        }
        // Past the cadence's learning, then at this phase of a tick.
        run_for(&workers, &mut log, TICK * 3 + TICK * phase / PHASES, step).await;
        let victim = (0..2)
            .max_by_key(|&i| workers[i].processing_keys().len())
            .unwrap();
        let case = format!("phase {phase}");
        let fine = Duration::from_millis(10);
        let (_, after) =
            kill_and_wait_for_takeover(&mut workers, &mut log, victim, fine, bound + TICK, &case)
                .await;
        took.push(after);
        assert_eq!(log.max(), Duration::ZERO, "phase {phase}: overlap");
    }
    let mut sorted = took.clone();
    sorted.sort();
    println!(
        "failover ({mode:?}) over {PHASES} kill phases, calls up to {latency:?}: min {:?}, median {:?}, max {:?} (bound {bound:?})",
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    );
    assert!(
        sorted[sorted.len() - 1] <= bound,
        "failover past its bound {bound:?}: {took:?}"
    );
}

/// A worker killed right after its first takes, before the beat that
/// would tell how many leases it holds: its record still says none, and
/// its leases are taken within the same bound as any holder's. (Peers
/// read at the deadline only of records saying they hold leases: these
/// waited for the taker's next tick, up to 14.5 s after the kill in a
/// real two-process run at the defaults.)
async fn a_worker_killed_before_it_beat_about_its_leases_loses_them_within_the_bound(
    mode: LeaseRenewal,
) {
    const SHARDS: usize = 8;
    let bound = LEASE + LIVENESS_SLACK;
    for seed in 0..6_u64 {
        let table = table_with(SHARDS).await;
        let mut workers = start_all(&table, &["a", "b"], |id, i| {
            in_mode(mode, id, 90 + 2 * seed + i).build().unwrap()
        });
        let mut log = OverlapLog::default();
        // The first moment both hold leases: each just took its first.
        let step = Duration::from_millis(10);
        while ["a", "b"]
            .iter()
            .any(|w| !table_counts(&table).contains_key(*w))
        {
            run_for(&workers, &mut log, step, step).await;
        }
        // The one that took last, killed at a phase before its next beat.
        let victim = (0..2)
            .min_by_key(|&i| workers[i].coordinator().held_keys().len())
            .unwrap();
        run_for(
            &workers,
            &mut log,
            Duration::from_millis(500) * seed as u32,
            step,
        )
        .await;
        let case = format!("seed {seed}");
        let (keys, after) =
            kill_and_wait_for_takeover(&mut workers, &mut log, victim, step, bound + TICK, &case)
                .await;
        assert!(
            after <= bound,
            "seed {seed}: {} leases taken {after:?} after the kill, past the bound {bound:?}",
            keys.len(),
        );
        assert_eq!(log.max(), Duration::ZERO, "seed {seed}: overlap");
    }
}

/// Kills `victim`, one of two workers, and runs the fleet `step` at a
/// time until the other processes every lease it held, failing (naming
/// `case`) once `limit` has passed since the kill. Returns those leases
/// and how long after the kill the last was taken over.
async fn kill_and_wait_for_takeover(
    workers: &mut [SimWorker],
    log: &mut OverlapLog,
    victim: usize,
    step: Duration,
    limit: Duration,
    case: &str,
) -> (Vec<String>, Duration) {
    let keys = workers[victim].coordinator().held_keys();
    let killed_at = Instant::now();
    workers[victim].kill().await;
    let survivor = &workers[1 - victim];
    run_until(
        workers,
        log,
        step,
        step,
        || keys.iter().all(|k| survivor.processing_keys().contains(k)),
        || killed_at.elapsed() <= limit,
        || {
            format!(
                "{case}: leases still unread {:?} after the kill",
                killed_at.elapsed()
            )
        },
    )
    .await;
    (keys, killed_at.elapsed())
}

/// How long past a holder's lease duration its leases may stand unread
/// with liveness records: the watcher sees a beat within the cadence's
/// precision (100 ms at the default 5 s beat interval), and reads at the
/// deadline; the take follows at once.
const LIVENESS_SLACK: Duration = Duration::from_millis(500);

/// Random store errors, lost responses and latency on every worker, a
/// worker paused for 30 s, a worker killed and restarted under its id:
/// no lease is ever believed valid by two workers. Stealing is off so that
/// every ownership change goes through expiry or release, which must never
/// overlap; the steal window is bounded separately above.
async fn faults_never_make_two_workers_believe_in_one_lease(mode: LeaseRenewal) {
    const SHARDS: usize = 24;
    let table = table_with(SHARDS).await;
    let names = ids(4);
    let build = |i: usize| {
        in_mode(mode, &names[i], 100 + i as u64)
            .max_leases_to_steal(0)
            .max_leases_per_worker(8)
            .build()
            .unwrap()
    };
    let faults = |seed| RandomFaults {
        seed,
        error_rate: 0.1,
        lost_response_rate: 0.05,
        max_latency: Duration::from_millis(300),
    };
    let mut workers: Vec<SimWorker> = (0..4).map(|i| SimWorker::start(&table, build(i))).collect();
    for (i, w) in workers.iter().enumerate() {
        w.store.set_random_faults(Some(faults(i as u64)));
    }
    let mut log = OverlapLog::default();
    let step = Duration::from_millis(10);
    run_for(&workers, &mut log, Duration::from_secs(60), step).await;

    // The busiest worker pauses (with a quiet table it may be any of them).
    let busiest = (0..workers.len())
        .max_by_key(|&i| workers[i].coordinator().held_keys().len())
        .unwrap();
    assert!(!workers[busiest].coordinator().held_keys().is_empty());
    workers[busiest]
        .store
        .pause_until(Instant::now() + Duration::from_secs(30));
    run_for(&workers, &mut log, Duration::from_secs(60), step).await;

    // What the killed worker fenced or lost counts too.
    let before_kill = workers[1].coordinator().stats();
    let fenced_before_kill = before_kill.fenced + before_kill.lost;
    workers[1].kill().await;
    run_for(&workers, &mut log, Duration::from_secs(20), step).await;
    workers[1] = SimWorker::start(&table, build(1));
    workers[1].store.set_random_faults(Some(faults(11)));
    run_for(&workers, &mut log, Duration::from_secs(120), step).await;

    // Calm down and check everything is owned by someone who knows it.
    for w in &workers {
        w.store.set_random_faults(None);
    }
    run_for(&workers, &mut log, LEASE * 3, step).await;

    let stats: Vec<_> = workers.iter().map(|w| w.coordinator().stats()).collect();
    let injected: u64 = workers
        .iter()
        .map(|w| {
            w.stats
                .snapshot()
                .ops
                .values()
                .map(|o| o.errors)
                .sum::<u64>()
        })
        .sum();
    println!(
        "faults: {injected} failed store calls, {} overlap samples, max overlap {:?}",
        log.samples,
        log.max()
    );
    for s in &stats {
        println!("  {s:?}");
    }
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "two workers believed one lease valid"
    );
    // The liveness mode makes far fewer calls, so it meets fewer faults.
    assert!(injected > 50, "the faults were real: {injected}");
    assert!(
        fenced_before_kill + stats.iter().map(|s| s.fenced + s.lost).sum::<u64>() > 0,
        "fencing was exercised"
    );

    let mut held: Vec<String> = workers.iter().flat_map(SimWorker::valid_keys).collect();
    held.sort();
    let before = held.len();
    held.dedup();
    assert_eq!(before, held.len(), "a lease held twice");
    assert_eq!(held.len(), SHARDS, "every lease held once the faults stop");
    for l in table.snapshot() {
        let owner = l.owner.expect("owned");
        let w = workers.iter().find(|w| w.id == owner).unwrap();
        assert!(
            w.valid_keys().contains(&l.key),
            "{owner} owns {} in the table but does not hold it",
            l.key
        );
    }
    assert_at_most_one_scan_per_tick(mode, &workers);
}

async fn scans_stay_one_per_tick_balanced_or_not(mode: LeaseRenewal) {
    let table = table_with(40).await;
    let names = ids(3);
    let mut workers = vec![SimWorker::start(
        &table,
        in_mode(mode, &names[0], 7).build().unwrap(),
    )];
    sleep(TICK * 3).await;
    // Unbalanced: two newcomers steal over several ticks.
    workers.push(SimWorker::start(
        &table,
        in_mode(mode, &names[1], 8).build().unwrap(),
    ));
    workers.push(SimWorker::start(
        &table,
        in_mode(mode, &names[2], 9).build().unwrap(),
    ));
    sleep(TICK * 10).await;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    assert!(balanced(&table, &refs), "{:?}", table_counts(&table));
    // Balanced: many idle ticks.
    sleep(TICK * 10).await;
    assert_one_scan_per_tick(mode, &workers);
    for w in &workers {
        let snap = w.stats.snapshot();
        // 40 leases in pages of 25: two pages per scan.
        assert_eq!(
            snap.op(StoreOp::ScanPage).calls,
            w.stats.scans() * 2,
            "{}",
            w.id
        );
    }
}

/// Two live processes under one worker id (a StatefulSet pod name given to
/// two processes, say). The second finds the first's leases under a tenure
/// it did not write and leaves them alone: the two never both believe in a
/// lease. When the first is paused past the lease duration it fences
/// itself, the second takes its leases once they expire, and the first,
/// back, loses each to the second's tenure instead of sharing it (its
/// renewals and checkpoints fail their tenure condition). The checkpoints
/// their consumers write never go backwards.
async fn two_processes_with_one_worker_id_never_share_a_lease(mode: LeaseRenewal) {
    const SHARDS: usize = 8;
    let table = table_with(SHARDS).await;
    let build = |id: &str, seed| in_mode(mode, id, seed).build().unwrap();
    let mut workers = vec![
        SimWorker::start_with(&table, build("a", 1), StandIn::Checkpointing),
        SimWorker::start_with(&table, build("b", 2), StandIn::Checkpointing),
    ];
    let (mut overlap, mut checkpoints) = (OverlapLog::default(), CheckpointLog::default());
    let mut run = async |workers: &[SimWorker], total| {
        run_checking(workers, &table, &mut overlap, &mut checkpoints, total).await;
    };
    run(&workers, TICK * 4).await;
    assert!(balanced(&table, &["a", "b"]), "{:?}", table_counts(&table));
    let a_held = workers[0].coordinator().held_keys().len();

    // The same worker id, in another process: it takes nothing from a live
    // holder.
    workers.push(SimWorker::start_with(
        &table,
        build("a", 3),
        StandIn::Checkpointing,
    ));
    run(&workers, TICK * 3).await;
    let second = workers[2].coordinator().stats();
    assert_eq!(
        (second.taken, second.reclaimed, second.stolen),
        (0, 0, 0),
        "the second process took from a live holder: {second:?}"
    );
    assert_eq!(workers[0].valid_keys().len(), a_held);

    // The first process stops answering for longer than the lease (a GC
    // pause, SIGSTOP): it fences itself; its leases expire and go to the
    // second process (the fleet sees them as "a"'s, so "b" does not need
    // them).
    workers[0]
        .store
        .pause_until(Instant::now() + LEASE + tick_max() * 2);
    run(&workers, LEASE + tick_max() * 3).await;
    let (first, second) = (
        workers[0].coordinator().stats(),
        workers[2].coordinator().stats(),
    );
    assert_eq!(first.fenced as usize, a_held, "{first:?}");
    assert_eq!(second.taken as usize, a_held, "{second:?}");
    assert_eq!(
        first.same_id_conflicts as usize, 0,
        "fenced before it could lose them: {first:?}"
    );
    assert!(workers[0].valid_keys().is_empty());

    // Settled: nobody takes from anybody any more.
    let moves = |w: &SimWorker| {
        let s = w.coordinator().stats();
        s.taken + s.reclaimed + s.stolen
    };
    let before: Vec<u64> = workers.iter().map(moves).collect();
    run(&workers, TICK * 6).await;
    let after: Vec<u64> = workers.iter().map(moves).collect();
    assert_eq!(
        before, after,
        "ownership kept moving between the two processes"
    );
    assert_eq!(workers[2].valid_keys().len(), a_held);

    // The second process dies: the first takes its leases once they expire.
    workers[2].kill().await;
    run(&workers, LEASE + tick_max() * 2).await;
    assert_eq!(
        workers[0].valid_keys().len(),
        a_held,
        "{:?}",
        workers[0].coordinator().stats()
    );

    println!(
        "same id: overlap max {:?}, {} checkpoint writes seen, regressions {:?}",
        overlap.max(),
        checkpoints.writes_seen,
        checkpoints.regressions
    );
    assert_eq!(
        overlap.max(),
        Duration::ZERO,
        "two processes believed in one lease"
    );
    assert!(
        checkpoints.writes_seen > 100,
        "the consumers checkpointed: {}",
        checkpoints.writes_seen
    );
    assert!(
        checkpoints.regressions.is_empty(),
        "checkpoints went backwards: {:?}",
        checkpoints.regressions
    );
    let mut held: Vec<String> = workers.iter().flat_map(SimWorker::valid_keys).collect();
    let all = held.len();
    held.sort();
    held.dedup();
    assert_eq!((all, held.len()), (SHARDS, SHARDS), "every lease held once");
}

/// The same pair, but the second process arrives while the first one's
/// take of a lease lost its answer (so the table shows "a" under the
/// first's tenure and the first does not hold it yet): the first reclaims
/// its own tenure at once; the second never touches it.
async fn a_lost_take_is_reclaimed_by_its_own_process_not_by_another_under_the_same_id(
    mode: LeaseRenewal,
) {
    let table = table_with(1).await;
    // Ticking faster than the lease expires: the reclaim comes before the
    // unrenewed lease could expire for anyone.
    let first = SimWorker::start(
        &table,
        in_mode(mode, "a", 1)
            .taker_interval(Duration::from_secs(3))
            .build()
            .unwrap(),
    );
    first
        .store
        .inject(StoreOp::Take, kcl_core::store::memory::Fault::LostResponse);
    sleep(Duration::from_millis(10)).await;
    assert!(first.coordinator().held_keys().is_empty());
    let second = SimWorker::start(&table, in_mode(mode, "a", 2).build().unwrap());
    sleep(tick_max() * 2).await;
    assert_eq!(first.coordinator().stats().reclaimed, 1);
    assert_eq!(first.valid_keys().len(), 1);
    let s = second.coordinator().stats();
    assert_eq!((s.taken, s.reclaimed), (0, 0), "{s:?}");
}

/// A steal whose request never reaches the victim's liveness record (the
/// thief's pokes fail, the victim cannot read the table either) is never
/// forced: the victim renews the lease by its beats and knows nothing, so
/// forcing would make two workers believe in it. Once the request lands,
/// the handoff completes.
#[tokio::test(start_paused = true)]
async fn a_steal_the_victim_never_heard_of_is_never_forced() {
    let (table, mut log, mut workers) =
        first_holder(4, config("a", 1).build().unwrap(), StandIn::Idle).await;
    let step = Duration::from_millis(50);
    assert_eq!(workers[0].valid_keys().len(), 4);
    let cut_off = Instant::now() + LEASE * 4;
    workers[0]
        .store
        .fail_until(Some(StoreOp::ScanPage), StoreErrorKind::Retryable, cut_off);
    let thief = SimWorker::start(&table, config("b", 2).build().unwrap());
    thief
        .store
        .fail_until(Some(StoreOp::Poke), StoreErrorKind::Retryable, cut_off);
    workers.push(thief);
    run_for(&workers, &mut log, LEASE * 4, step).await;
    let b = workers[1].coordinator().stats();
    assert!(b.stolen > 0, "{b:?}");
    assert_eq!(
        b.handoffs_forced, 0,
        "forced while the victim never heard: {b:?}"
    );
    assert_eq!(log.max(), Duration::ZERO, "two workers believed one lease");
    // The requests land: the victim hands over.
    run_for(&workers, &mut log, LEASE * 2, step).await;
    let b = workers[1].coordinator().stats();
    assert!(balanced(&table, &["a", "b"]), "{:?}", table_counts(&table));
    assert_eq!((b.handoffs_forced, log.max()), (0, Duration::ZERO), "{b:?}");
}

/// A victim that is told of a steal but cannot read the lease item stops
/// renewing it by its beats, so the handoff forced at the deadline (the
/// victim cannot complete it) never overlaps it.
#[tokio::test(start_paused = true)]
async fn a_victim_that_cannot_judge_an_asked_lease_stops_renewing_it() {
    let (table, mut log, mut workers) =
        first_holder(4, config("a", 1).build().unwrap(), StandIn::Idle).await;
    let step = Duration::from_millis(50);
    let cut_off = Instant::now() + LEASE * 4;
    for op in [StoreOp::ScanPage, StoreOp::Get] {
        workers[0]
            .store
            .fail_until(Some(op), StoreErrorKind::Retryable, cut_off);
    }
    workers.push(SimWorker::start(&table, config("b", 2).build().unwrap()));
    run_for(&workers, &mut log, LEASE * 4, step).await;
    let (a, b) = (
        workers[0].coordinator().stats(),
        workers[1].coordinator().stats(),
    );
    println!("victim {a:?}\nthief {b:?}");
    assert!(b.stolen > 0, "{b:?}");
    assert!(a.fenced > 0, "the asked leases lapsed on the victim: {a:?}");
    assert_eq!(
        b.handoffs_forced, b.stolen,
        "the victim cannot complete: every handoff forced at its deadline: {b:?}"
    );
    assert_eq!(log.max(), Duration::ZERO, "two workers believed one lease");
}

/// In a fleet halfway through a roll between the modes, a worker that
/// renews per lease dies: its leases have no liveness record to show it,
/// so the liveness worker's taker reads the table again when they could
/// expire, and takes them within the lease duration plus a tick or two.
#[tokio::test(start_paused = true)]
async fn a_dead_per_lease_worker_in_a_mixed_fleet_loses_its_leases() {
    let table = table_with(8).await;
    let mut log = OverlapLog::default();
    let step = Duration::from_millis(50);
    let mut workers = vec![
        SimWorker::start(&table, config("l", 1).build().unwrap()),
        SimWorker::start(&table, per_lease("p", 2).build().unwrap()),
    ];
    while !balanced(&table, &["l", "p"]) {
        run_for(&workers, &mut log, Duration::from_secs(1), step).await;
    }
    run_for(&workers, &mut log, TICK * 3, step).await;
    let theirs = workers[1].coordinator().held_keys();
    workers[1].kill().await;
    let killed_at = Instant::now();
    loop {
        run_for(&workers, &mut log, Duration::from_millis(500), step).await;
        let snapshot = table.snapshot();
        if theirs.iter().all(|k| {
            snapshot
                .iter()
                .any(|l| &l.key == k && l.owner.as_deref() == Some("l"))
        }) {
            break;
        }
        assert!(
            killed_at.elapsed() <= LEASE + tick_max() * 2,
            "the dead per-lease worker's leases still not taken after {:?}: {:?}; {:?}",
            killed_at.elapsed(),
            table_counts(&table),
            workers[0].coordinator().stats()
        );
    }
    assert_eq!(log.max(), Duration::ZERO);
}

/// A victim whose handoff completion failed (its tenure already over) and
/// whose thief died while it waited: the victim finishes the orphaned
/// handoff at its next read of the table and the lease, now owned by a dead
/// worker, moves on. Nothing in the liveness records changes after the
/// completion, so without looking again the lease stayed held and unread.
#[tokio::test(start_paused = true)]
async fn a_handoff_whose_thief_died_and_whose_completion_failed_still_moves_the_lease() {
    let (table, mut log, mut workers) =
        first_holder(4, config("a", 1).build().unwrap(), StandIn::Idle).await;
    let step = Duration::from_millis(50);
    for _ in 0..2 {
        workers[0].store.inject(
            StoreOp::CompleteHandoff,
            Fault::Error(StoreErrorKind::Retryable),
        );
    }
    workers.push(SimWorker::start(&table, config("b", 2).build().unwrap()));
    // The victim hands over (its completion write fails); the thief dies
    // before forcing.
    while workers[0].coordinator().stats().handed_off == 0 {
        run_for(&workers, &mut log, Duration::from_millis(100), step).await;
    }
    assert_eq!(workers[1].coordinator().stats().handoffs_forced, 0);
    workers[1].kill().await;
    let killed_at = Instant::now();
    run_until(
        &workers,
        &mut log,
        Duration::from_millis(500),
        step,
        || workers[0].valid_keys().len() >= 4,
        || killed_at.elapsed() <= LEASE + tick_max() * 3,
        || {
            format!(
                "after {:?}: {:?} held, table {:?}, {:?}",
                killed_at.elapsed(),
                workers[0].valid_keys(),
                table.snapshot(),
                workers[0].coordinator().stats()
            )
        },
    )
    .await;
    assert_eq!(log.max(), Duration::ZERO);
}

/// A handoff is the Java KCL's in both renewal modes: the previous owner
/// keeps renewing the lease while it drains (its counter moves), the thief
/// renews nothing it awaits, and the handoff completes, never forced, with
/// no moment two workers may process one lease. With liveness records the
/// victim's beats renew nothing it hands off: without its per-lease
/// renewals it was fenced a lease duration after its last beat (4 to 9 s
/// into a drain at the defaults), its handoff checkpoint refused.
async fn a_previous_owner_renews_while_it_drains_and_the_handoff_completes(mode: LeaseRenewal) {
    // Within the handoff timeout (a lease duration by default), long
    // enough for two renewals per lease and one with liveness records.
    let drain = LEASE.mul_f64(0.75);
    let (table, mut log, mut workers) = first_holder(
        4,
        in_mode(mode, "a", 1).build().unwrap(),
        StandIn::SlowHandoff(drain),
    )
    .await;
    let step = Duration::from_millis(50);
    workers.push(SimWorker::start(
        &table,
        in_mode(mode, "b", 2).build().unwrap(),
    ));
    // Watch the first lease handed off: its counter while in handoff.
    let mut in_handoff: Option<(String, u64, u64)> = None;
    let started = Instant::now();
    while workers[1].coordinator().stats().handoffs_completed == 0 {
        run_for(&workers, &mut log, Duration::from_millis(100), step).await;
        for l in table.snapshot() {
            if l.checkpoint_owner.as_deref() != Some("a") {
                continue;
            }
            match &mut in_handoff {
                Some((key, _, last)) if *key == l.key => *last = l.counter,
                Some(_) => {}
                None => in_handoff = Some((l.key.clone(), l.counter, l.counter)),
            }
        }
        assert!(
            started.elapsed() < TICK * 10,
            "no handoff completed: {:?} {:?} {:?}",
            workers[0].coordinator().stats(),
            workers[1].coordinator().stats(),
            table.snapshot()
        );
    }
    let thief_renewals = workers[1].stats.snapshot().op(StoreOp::Renew).calls;
    assert!(
        thief_renewals <= workers[1].coordinator().stats().handoffs_completed,
        "the thief renewed what it awaited ({thief_renewals} renewals; one per activation expected)"
    );
    let (key, first, last) = in_handoff.expect("a handoff was seen");
    let renewals = match mode {
        LeaseRenewal::PerLease => 2,
        _ => 1,
    };
    assert!(
        last >= first + renewals,
        "{key}: the previous owner renews while it drains for {drain:?}: counter {first} -> {last}"
    );
    let b = workers[1].coordinator().stats();
    assert_eq!(b.handoffs_forced, 0, "{b:?}");
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "two workers may process one lease"
    );
    run_for(&workers, &mut log, TICK * 4, step).await;
    assert!(balanced(&table, &["a", "b"]), "{:?}", table_counts(&table));
    let (a, b) = (
        workers[0].coordinator().stats(),
        workers[1].coordinator().stats(),
    );
    assert_eq!(a.fenced, 0, "the draining victim was fenced: {a:?}");
    assert_eq!(b.handoffs_forced, 0, "{b:?}");
    assert_eq!(log.max(), Duration::ZERO);
}

/// A previous owner whose processor never finishes draining renews the
/// lease until the handoff timeout, then lets it lapse (fenced) and
/// completes the handoff it no longer drains; the thief starts only then,
/// never while the previous owner could still process the lease.
async fn a_stuck_previous_owner_lets_go_only_after_the_handoff_timeout(mode: LeaseRenewal) {
    let (table, mut log, mut workers) = first_holder(
        4,
        in_mode(mode, "a", 1).build().unwrap(),
        StandIn::NeverHandsOff,
    )
    .await;
    let step = Duration::from_millis(50);
    let timeout = in_mode(mode, "a", 1).build().unwrap().handoff_timeout();
    workers.push(SimWorker::start(
        &table,
        in_mode(mode, "b", 2).build().unwrap(),
    ));
    let joined = Instant::now();
    run_until(
        &workers,
        &mut log,
        Duration::from_millis(100),
        step,
        || !workers[1].valid_keys().is_empty(),
        || joined.elapsed() < timeout + LEASE * 3 + TICK * 2,
        || {
            format!(
                "the thief never started: {:?}",
                workers[1].coordinator().stats()
            )
        },
    )
    .await;
    assert!(
        joined.elapsed() >= timeout,
        "the thief started after {:?}, before the previous owner's renewals stopped",
        joined.elapsed()
    );
    let (a, b) = (
        workers[0].coordinator().stats(),
        workers[1].coordinator().stats(),
    );
    assert!(a.fenced > 0, "the stuck drain lapsed on the victim: {a:?}");
    assert!(b.handoffs_completed + b.handoffs_forced > 0, "{b:?}");
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "two workers may process one lease"
    );
}

/// A previous owner stuck draining a stolen lease (its processor never
/// hands over, handoff timeout 40 s) is killed 2 s after the steal: the
/// thief forces the handoff once a liveness read shows it dead, within the
/// failover bound of its last beat, not at the handoff's deadline, also
/// when every store call takes up to 20 ms. The force was set to the
/// poll's answer and judged against its ask, so it came only at the
/// deadline (38 s) unless a call took no time at all.
async fn a_previous_owner_killed_mid_handoff_loses_its_lease_within_the_bound(mode: LeaseRenewal) {
    for latency in [Duration::ZERO, Duration::from_millis(20)] {
        let bound = LEASE + LIVENESS_SLACK + latency * 3;
        let settings = |id, seed| {
            in_mode(mode, id, seed)
                .handoff_timeout(Duration::from_secs(40))
                .build()
                .unwrap()
        };
        let (table, mut log, mut workers) =
            first_holder(4, settings("a", 1), StandIn::NeverHandsOff).await;
        workers.push(SimWorker::start(&table, settings("b", 2)));
        if !latency.is_zero() {
            workers[1].store.set_random_faults(Some(RandomFaults {
                seed: 7,
                error_rate: 0.0,
                lost_response_rate: 0.0,
                max_latency: latency,
            }));
        }
        let step = Duration::from_millis(50);
        let joined = Instant::now();
        let stolen = loop {
            run_for(&workers, &mut log, step, step).await;
            if let Some(l) = table.snapshot().into_iter().find(|l| {
                l.owner.as_deref() == Some("b") && l.checkpoint_owner.as_deref() == Some("a")
            }) {
                break l.key;
            }
            assert!(joined.elapsed() < TICK * 4, "b never stole");
        };
        // b told a, and a renews while it drains.
        run_for(&workers, &mut log, Duration::from_secs(2), step).await;
        let killed = Instant::now();
        workers[0].kill().await;
        run_until(
            &workers,
            &mut log,
            step,
            step,
            || workers[1].processing_keys().contains(&stolen),
            || killed.elapsed() <= bound,
            || {
                format!(
                    "calls up to {latency:?}: b did not process {stolen} within {bound:?} of the kill: {:?}",
                    workers[1].coordinator().stats()
                )
            },
        )
        .await;
        assert!(workers[1].coordinator().stats().handoffs_forced > 0);
        assert_eq!(log.max(), Duration::ZERO, "two workers processed one lease");
    }
}

/// A worker that joins a running fleet steals at its first tick: the
/// records it reads then were written within a beat interval (their age),
/// proof enough that their holders run, so it does not wait a tick to see
/// a counter move (it did: its first lease 10 s and more after its start).
/// The lone holder learns of the steal at its next beat or read of the
/// records, which it spreads at thirds of its beat interval, and the
/// handoff completes within the thief's poll: the first lease within a
/// third of a beat interval and half a second, at every phase of the
/// join against the holder's beats. With the requests answered at beats
/// only, or the reads right after the beats, the first lease came up to a
/// beat interval after the start.
#[tokio::test(start_paused = true)]
async fn a_late_joiner_processes_its_first_lease_within_a_third_of_a_beat_interval() {
    const PHASES: u32 = 6;
    let beat_interval = LEASE / 2;
    let bound = beat_interval / 3 + Duration::from_millis(500);
    let step = Duration::from_millis(10);
    let mut took = Vec::new();
    for phase in 0..PHASES {
        let table = table_with(8).await;
        let mut log = OverlapLog::default();
        let mut workers = vec![SimWorker::start(
            &table,
            config("first", 1).build().unwrap(),
        )];
        let alone = Duration::from_secs(20) + beat_interval * phase / PHASES;
        run_for(&workers, &mut log, alone, step).await;
        assert_eq!(workers[0].valid_keys().len(), 8);
        workers.push(SimWorker::start(&table, config("late", 2).build().unwrap()));
        let joined = Instant::now();
        while workers[1].valid_keys().is_empty() {
            run_for(&workers, &mut log, step, step).await;
            assert!(
                joined.elapsed() <= TICK * 3,
                "phase {phase}: {:?}",
                workers[1].coordinator().stats()
            );
        }
        took.push(joined.elapsed());
        // Run on past the handoffs' completion: the first worker's scans
        // then show the joiner's leases at the counters its own
        // completions wrote, before its reads show the joiner's record;
        // that is no evidence of a Java worker.
        run_for(&workers, &mut log, TICK * 2, step).await;
        let late = workers[1].coordinator().stats();
        assert_eq!((late.handoffs_forced, late.taken), (0, 0), "{late:?}");
        for w in &workers {
            assert_eq!(
                w.coordinator().stats().switched_to_per_lease,
                0,
                "phase {phase}"
            );
        }
        assert_eq!(
            log.max(),
            Duration::ZERO,
            "phase {phase}: two workers may process one lease"
        );
    }
    println!("late joiner: its first lease after {took:?} (bound {bound:?})");
    assert!(
        took.iter().all(|t| *t <= bound),
        "first lease past {bound:?}: {took:?}"
    );
}

/// A rolling change of `lease_duration` (liveness records): a worker with
/// a 30 s lease beats every 15 s and keeps its tenures for 27 s after a
/// beat. A peer with a 10 s lease judges it by the duration its record
/// states, not by its own: it never takes a lease of a live holder (judged
/// by its own 10 s, it took every lease at each gap between beats), and the
/// two share the leases by handoff.
#[tokio::test(start_paused = true)]
async fn workers_with_different_lease_durations_never_process_one_lease_at_once() {
    let long = LEASE * 3;
    let (table, mut log, mut workers) = first_holder(
        4,
        config("old", 1).lease_duration(long).build().unwrap(),
        StandIn::Checkpointing,
    )
    .await;
    assert_eq!(workers[0].valid_keys().len(), 4);
    workers.push(SimWorker::start_with(
        &table,
        config("new", 2).build().unwrap(),
        StandIn::Checkpointing,
    ));
    let mut checkpoints = CheckpointLog::default();
    run_checking(&workers, &table, &mut log, &mut checkpoints, long * 6).await;
    let (old, new) = (
        workers[0].coordinator().stats(),
        workers[1].coordinator().stats(),
    );
    assert_one_processor_and_no_regression(&log, &checkpoints);
    assert_eq!((new.taken, old.lost), (0, 0), "{new:?} {old:?}");
    assert_eq!(new.handoffs_forced, 0, "{new:?}");
    assert!(
        balanced(&table, &["old", "new"]),
        "{:?}",
        table_counts(&table)
    );
}

/// A worker whose beats fail while its lease-table writes work (only the
/// workers table throttled, down or write-denied) lets its leases go: its
/// tenures lapse a lease duration after its last beat, it takes and
/// reclaims nothing while no beat lands (each reclaim was fenced at once,
/// and moved the lease's counter so that peers never judged it free), and
/// a peer takes every lease. Once its beats land again it takes its share
/// back by handoff.
#[tokio::test(start_paused = true)]
async fn a_worker_whose_beats_fail_gives_its_leases_to_peers_until_they_land() {
    use kcl_core::store::StoreErrorKind;
    const SHARDS: usize = 8;
    let step = Duration::from_millis(50);
    let (table, mut log, workers) = balanced_pair(SHARDS, 30).await;
    let outage = Duration::from_secs(120);
    let started = Instant::now();
    let before = workers[0].coordinator().stats();
    workers[0].store.fail_until(
        Some(StoreOp::Beat),
        StoreErrorKind::Throttled,
        started + outage,
    );
    // The last beat landed at most a renew interval before; the peer sees
    // the record stand still at its next read and takes a lease duration
    // after that, at its next tick.
    let bound = LEASE + tick_max() * 2;
    while workers[1].processing_keys().len() < SHARDS {
        run_for(&workers, &mut log, Duration::from_millis(100), step).await;
        assert!(
            started.elapsed() <= bound,
            "after {:?} a peer processes {} of {SHARDS} shards: {:?} {:?}",
            started.elapsed(),
            workers[1].processing_keys().len(),
            workers[0].coordinator().stats(),
            workers[1].coordinator().stats()
        );
    }
    println!(
        "beats failing: a peer processes every shard {:?} after the outage began",
        started.elapsed()
    );
    run_for(&workers, &mut log, outage - started.elapsed() - LEASE, step).await;
    let during = workers[0].coordinator().stats();
    assert_eq!(workers[0].processing_keys(), Vec::<String>::new());
    assert_eq!(
        (during.taken, during.reclaimed, during.stolen),
        (before.taken, before.reclaimed, before.stolen),
        "took or reclaimed while no beat landed: {during:?}"
    );
    run_for(&workers, &mut log, LEASE * 2 + tick_max() * 4, step).await;
    assert!(balanced(&table, &["a", "b"]), "{:?}", table_counts(&table));
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "two workers may process one lease"
    );
}

/// A thief that cannot read the liveness records (its reads of the
/// workers table throttled, its beats still landing) and whose handoffs
/// never activate (its lease writes of that kind fail) gives the stolen
/// tenures up after the handoff timeout. The table still names its
/// instance, which peers see beating, so no peer takes those leases: the
/// thief reclaims them at its next tick, from what each tenure last knew,
/// although it can judge no peer. (Simulator seed 13917891215581910180
/// left a shard unread for 104 s this way.)
#[tokio::test(start_paused = true)]
async fn a_thief_that_cannot_read_beats_reclaims_the_tenures_it_gave_up() {
    const SHARDS: usize = 4;
    let holder = config("a", 1).build().unwrap();
    let (table, mut log, mut workers) = first_holder(SHARDS, holder, StandIn::Checkpointing).await;
    workers.push(SimWorker::start(&table, config("b", 2).build().unwrap()));
    let far = Instant::now() + Duration::from_secs(900);
    let thief = &workers[1];
    thief
        .store
        .fail_until(Some(StoreOp::Renew), StoreErrorKind::Throttled, far);
    let stolen = || thief.coordinator().stats().stolen;
    until(&workers, &mut log, || stolen() > 0).await;
    // Its first tick read the records and stole; no read lands from now on.
    thief
        .store
        .fail_until(Some(StoreOp::ReadBeats), StoreErrorKind::Throttled, far);
    let started = Instant::now();
    // The victim drains and completes the handoff at once; the thief's
    // activation fails for a handoff timeout (the lease duration), and
    // its next tick after that reclaims.
    let fenced = || thief.coordinator().stats().fenced;
    until(&workers, &mut log, || fenced() == stolen()).await;
    let bound = LEASE + tick_max() * 2;
    every_shard_processed_within(&workers, &mut log, SHARDS, started + bound, thief).await;
    assert_eq!(thief.processing_keys().len() as u64, stolen());
}

/// A worker whose beats fail long enough to fence its tenures, but not for
/// long enough that a peer judges it dead (the peer paused meanwhile),
/// finds its leases still naming it once its beats land again, and peers
/// see it beating: nobody else takes them. Its scans fail throughout (the
/// lease table's reads throttled), so it reclaims them from what each
/// tenure last knew, without a scan. (Simulator seed
/// 13917891215581910790 left its shards unread for 88 s this way.)
#[tokio::test(start_paused = true)]
async fn a_worker_that_cannot_scan_reclaims_the_tenures_its_failed_beats_fenced() {
    reclaimed_without_a_scan(None, 2).await;
}

/// As above, but the answer to each reclaim without a scan is lost (the
/// write applies): the next tick meets the tenure it wrote itself, one it
/// does not hold, and reclaims from that, as a scan's reclaim would (two
/// ticks later than without the fault).
#[tokio::test(start_paused = true)]
async fn a_reclaim_whose_answer_was_lost_is_made_again_without_a_scan() {
    reclaimed_without_a_scan(Some(Fault::LostResponse), 4).await;
}

/// The scenario of the two tests above, each reclaim of the worker that
/// cannot scan meeting `fault`: every shard is processed within `ticks`
/// taker ticks of the peer's return.
async fn reclaimed_without_a_scan(fault: Option<Fault>, ticks: u32) {
    const SHARDS: usize = 4;
    let (_table, mut log, workers) = balanced_pair(SHARDS, 40).await;
    let started = Instant::now();
    let (a, b) = (&workers[0], &workers[1]);
    beats_fail_while_scans_fail(a, started, Duration::from_secs(15));
    if let Some(fault) = &fault {
        for key in a.coordinator().held_keys() {
            a.store.inject_on(StoreOp::Reclaim, &key, fault.clone());
        }
    }
    b.store.pause_until(started + Duration::from_secs(20));
    let fenced = || a.coordinator().stats().fenced;
    until(&workers, &mut log, || fenced() > 0).await;
    let bound = Duration::from_secs(20) + tick_max() * ticks;
    every_shard_processed_within(&workers, &mut log, SHARDS, started + bound, a).await;
    assert_eq!(a.processing_keys().len() as u64, fenced());
}

/// Reclaims without a scan on a slow table (each answers in 1 s) that
/// answer after the validity they count from are fenced at once, and so
/// given up again: they are made again at the next tick, not forgotten.
#[tokio::test(start_paused = true)]
async fn a_reclaim_fenced_as_it_answers_is_made_again_without_a_scan() {
    const SHARDS: usize = 16;
    let table = table_with(SHARDS).await;
    let workers = vec![SimWorker::start(&table, config("a", 80).build().unwrap())];
    let mut log = run_until_balanced(&table, &workers, &["a"], Duration::from_millis(50)).await;
    let a = &workers[0];
    let started = Instant::now();
    beats_fail_while_scans_fail(a, started, Duration::from_secs(15));
    for key in a.coordinator().held_keys() {
        a.store
            .inject_on(StoreOp::Reclaim, &key, Fault::Delay(Duration::from_secs(1)));
    }
    until(&workers, &mut log, || {
        a.coordinator().stats().fenced >= SHARDS as u64
    })
    .await;
    let bound = Duration::from_secs(15) + tick_max() * 4;
    every_shard_processed_within(&workers, &mut log, SHARDS, started + bound, a).await;
}

/// A tenure fenced just before its shard's SHARD_END checkpoint landed (a
/// checkpoint leaves the counter, so a reclaim from what the tenure knew
/// passes): the reclaim without a scan starts no consumer on the finished
/// shard, as a scan, which shows it finished, would not reclaim it.
#[tokio::test(start_paused = true)]
async fn a_reclaim_without_a_scan_starts_nothing_on_a_finished_shard() {
    use kcl_core::store::CheckpointUpdate;
    use kcl_core::{Checkpoint, Holder, LeaseStore};
    let table = table_with(2).await;
    let workers = vec![SimWorker::start(&table, config("a", 70).build().unwrap())];
    let mut log = run_until_balanced(&table, &workers, &["a"], Duration::from_millis(50)).await;
    let a = &workers[0];
    let key = "shardId-000000000000";
    let lease = || table.snapshot().into_iter().find(|l| l.key == key).unwrap();
    let tenure = lease().tenure.unwrap();
    beats_fail_while_scans_fail(a, Instant::now(), Duration::from_secs(15));
    until(&workers, &mut log, || a.coordinator().stats().fenced >= 2).await;
    // The fenced tenure's last checkpoint, sent while it was valid, lands.
    let counter = lease().counter;
    table
        .checkpoint(
            key,
            Holder::new("a", &tenure),
            &CheckpointUpdate::to(Checkpoint::ShardEnd),
        )
        .await
        .unwrap();
    assert_eq!(lease().counter, counter, "a checkpoint leaves the counter");
    until(&workers, &mut log, || a.processing_keys().len() == 1).await;
    run_for(&workers, &mut log, TICK * 3, Duration::from_millis(50)).await;
    assert_eq!(a.coordinator().held_keys(), ["shardId-000000000001"]);
}

/// A release that fails (the consumer gave its shard back; the table's
/// writes of that kind throttled) leaves the table naming this instance,
/// which peers see beating: with its scans failing too, it is reclaimed
/// without a scan, and its shard read again.
#[tokio::test(start_paused = true)]
async fn a_release_that_failed_is_reclaimed_without_a_scan() {
    const SHARDS: usize = 4;
    let (_table, mut log, workers) = balanced_pair(SHARDS, 40).await;
    let a = &workers[0];
    let started = Instant::now();
    let far = started + Duration::from_secs(900);
    for op in [StoreOp::ScanPage, StoreOp::Release] {
        a.store.fail_until(Some(op), StoreErrorKind::Throttled, far);
    }
    let key = a.coordinator().held_keys()[0].clone();
    let handle = a.coordinator().handle(&key).unwrap();
    assert!(a.coordinator().release(&handle).await.is_err());
    drop(handle);
    let bound = tick_max() * 2;
    every_shard_processed_within(&workers, &mut log, SHARDS, started + bound, a).await;
}

/// Two of three workers die while the third cannot scan the lease table
/// (its scans throttled, its beats landing). A worker that joins then
/// takes every lease of the dead as they expire, not only its share of the
/// table: the third's beats say it takes no lease, so it is no share.
/// Counted in, it left the joiner a target of 3 of 6, and the fourth
/// orphaned lease only turned stale two lease durations after the joiner
/// first saw it. (Simulator seed 8080808001383, where the joiner restarted
/// before that, left two shards unread for 88 s.)
#[tokio::test(start_paused = true)]
async fn a_worker_that_cannot_scan_is_no_share_of_the_leases_it_cannot_take() {
    const SHARDS: usize = 6;
    let table = table_with(SHARDS).await;
    let names = ids(3);
    let mut workers = start_all(&table, &names, |id, i| config(id, 60 + i).build().unwrap());
    let step = Duration::from_millis(50);
    let mut log = run_until_balanced(&table, &workers, &names, step).await;
    let blind = Instant::now();
    workers[0].store.fail_until(
        Some(StoreOp::ScanPage),
        StoreErrorKind::Throttled,
        blind + Duration::from_secs(900),
    );
    // Its ticks fail to scan for a lease duration, then its beats say so.
    run_for(&workers, &mut log, LEASE + tick_max() * 2, step).await;
    let kept = workers[0].processing_keys().len();
    workers[1].kill().await;
    workers[2].kill().await;
    workers.push(SimWorker::start(
        &table,
        config("worker-3", 63).build().unwrap(),
    ));
    let joined = Instant::now();
    // Judged dead a lease duration after the joiner first read their
    // records; taken at the tick that follows.
    let bound = LEASE + TICK / 2;
    every_shard_processed_within(&workers, &mut log, SHARDS, joined + bound, &workers[0]).await;
    println!(
        "every shard processed {:?} after the join",
        joined.elapsed()
    );
    assert_eq!(workers[0].processing_keys().len(), kept);
    assert_eq!(workers[3].processing_keys().len(), SHARDS - kept);
}

/// A worker whose reads of the liveness records fail for three lease
/// durations says in its beats that it takes no lease, and stops saying
/// so once its reads come back: its next tick scans, though nothing in
/// the fleet changed, rather than being quiet and leaving the record
/// claiming it takes nothing for as long as the fleet stays quiet.
#[tokio::test(start_paused = true)]
async fn a_worker_whose_reads_came_back_stops_saying_it_takes_no_lease() {
    let (table, mut log, workers) = balanced_pair(4, 40).await;
    let step = Duration::from_millis(50);
    run_for(&workers, &mut log, LEASE * 4, step).await;
    let outage = LEASE * 3;
    let a = &workers[0];
    a.store.fail_until(
        Some(StoreOp::ReadBeats),
        StoreErrorKind::Throttled,
        Instant::now() + outage,
    );
    let says_none = || {
        table
            .beats_snapshot()
            .iter()
            .any(|b| b.worker == a.id && b.stopping)
    };
    let mut said = Vec::new();
    for _ in 0..outage.as_secs() {
        run_for(&workers, &mut log, Duration::from_secs(1), step).await;
        said.push(says_none());
    }
    assert!(said.contains(&true), "never said it takes no lease");
    run_for(&workers, &mut log, tick_max() * 2, step).await;
    assert!(
        !says_none(),
        "still says it takes no lease after its reads came back"
    );
    assert_eq!(log.max(), Duration::ZERO);
}

/// `worker`'s beats fail from `from` for `outage`, long enough to fence its
/// tenures, and its scans for the rest of the test.
fn beats_fail_while_scans_fail(worker: &SimWorker, from: Instant, outage: Duration) {
    let store = &worker.store;
    store.fail_until(
        Some(StoreOp::ScanPage),
        StoreErrorKind::Throttled,
        from + Duration::from_secs(900),
    );
    store.fail_until(
        Some(StoreOp::Beat),
        StoreErrorKind::Throttled,
        from + outage,
    );
}

/// Runs `workers` until `done` holds, overlaps sampled every 50 ms: the
/// wait for a fault to take effect, failing after five simulated minutes.
async fn until(workers: &[SimWorker], log: &mut OverlapLog, done: impl Fn() -> bool) {
    let (step, deadline) = (Duration::from_millis(50), Instant::now() + TICK * 30);
    let in_time = || Instant::now() <= deadline;
    let stuck = || "the awaited state never came".to_owned();
    run_until(workers, log, step, step, done, in_time, stuck).await;
}

/// Runs `workers` until the `shards` leases are all processed, failing
/// after `deadline` with how many are and `faulty`'s coordinator stats;
/// then that no two workers ever processed one lease at once.
async fn every_shard_processed_within(
    workers: &[SimWorker],
    log: &mut OverlapLog,
    shards: usize,
    deadline: Instant,
    faulty: &SimWorker,
) {
    let processed = || {
        workers
            .iter()
            .map(|w| w.processing_keys().len())
            .sum::<usize>()
    };
    run_until(
        workers,
        log,
        Duration::from_millis(100),
        Duration::from_millis(50),
        || processed() == shards,
        || Instant::now() <= deadline,
        || {
            format!(
                "{} of {shards} shards processed at the deadline; {}: {:?}",
                processed(),
                faulty.id,
                faulty.coordinator().stats()
            )
        },
    )
    .await;
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "two workers may process one lease"
    );
}

/// A worker that starts after another stopped sees the stopped worker's
/// leases unexpired for a lease duration, but never sees them renewed. It
/// takes them once they expire; a steal started because the stopped
/// worker's record was written moments before (a hint of life that a
/// crash just after a beat fakes) is forced as the worker is judged dead,
/// no later than the others expire.
async fn a_worker_that_stopped_before_this_one_started_has_its_leases_within_a_lease_duration(
    mode: LeaseRenewal,
) {
    let (table, mut log, mut workers) =
        first_holder(4, in_mode(mode, "a", 1).build().unwrap(), StandIn::Idle).await;
    let step = Duration::from_millis(50);
    workers[0].kill().await;
    workers.push(SimWorker::start(
        &table,
        in_mode(mode, "b", 2).build().unwrap(),
    ));
    let started = Instant::now();
    while workers[1].valid_keys().len() < 4 {
        run_for(&workers, &mut log, Duration::from_millis(100), step).await;
        assert!(
            started.elapsed() < LEASE + tick_max() * 3,
            "{:?}",
            workers[1].coordinator().stats()
        );
    }
    let b = workers[1].coordinator().stats();
    assert_eq!(b.stolen + b.taken, 4, "{b:?}");
    assert_eq!(b.stolen, b.handoffs_forced, "{b:?}");
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "two workers may process one lease"
    );
}

/// Three leases, two workers whose processors take `drain` to hand a shard
/// over; returns them (the one holding two leases first) and one lease of
/// the first's.
async fn fleet_for_an_operator(
    table: &kcl_core::store::memory::InMemoryLeaseStore,
    log: &mut OverlapLog,
    drain: Duration,
) -> (Vec<SimWorker>, String) {
    let mut workers = vec![
        SimWorker::start_with(
            table,
            config("a", 1).build().unwrap(),
            StandIn::SlowHandoff(drain),
        ),
        SimWorker::start_with(
            table,
            config("b", 2).build().unwrap(),
            StandIn::SlowHandoff(drain),
        ),
    ];
    let step = Duration::from_millis(50);
    while !balanced(table, &["a", "b"]) {
        run_for(&workers, log, Duration::from_secs(1), step).await;
    }
    run_for(&workers, log, TICK * 2, step).await;
    if workers[0].valid_keys().len() < 2 {
        workers.swap(0, 1);
    }
    assert_eq!(
        workers[0].valid_keys().len(),
        2,
        "{:?}",
        table_counts(table)
    );
    let key = workers[0].valid_keys()[0].clone();
    (workers, key)
}

/// Runs the fleet while the peer keeps reading the table (a shard sync
/// each half second, which also wakes the holder through its beats), until
/// the lease, its handoff over, is processed again.
async fn until_processed_again(
    workers: &[SimWorker],
    table: &kcl_core::store::memory::InMemoryLeaseStore,
    log: &mut OverlapLog,
    key: &str,
) {
    let step = Duration::from_millis(50);
    for _ in 0..(LEASE * 6).as_millis() / 500 {
        workers[1].coordinator().signals().leases_created();
        run_for(workers, log, Duration::from_millis(500), step).await;
        let settled = table
            .snapshot()
            .iter()
            .any(|l| l.key == key && l.owner.is_some() && l.checkpoint_owner.is_none());
        if settled
            && workers
                .iter()
                .any(|w| w.valid_keys().iter().any(|k| k == key))
        {
            return;
        }
    }
    panic!("{key} not processed again: {:?}", table.snapshot());
}

/// Defect 4 of the explored protocol: an operator's `kcl leases release`
/// of a lease whose holder renews through its liveness record. Its holder
/// writes no lease item per round, so a plain release went unnoticed until
/// its next checkpoint or read of the table while a peer took the shard at
/// once: both processed it. Released as a handoff to nobody and told
/// through its record, the holder drains and hands over first, and no peer
/// processes the shard before.
#[tokio::test(start_paused = true)]
async fn an_operators_release_is_drained_by_its_holder_before_any_peer_processes_the_shard() {
    use kcl_core::leases::operator::{Released, release};
    let table = table_with(3).await;
    let mut log = OverlapLog::default();
    let (workers, key) = fleet_for_an_operator(&table, &mut log, LEASE / 2).await;
    let handed_off = workers[0].coordinator().stats().handed_off;
    let lease = table.snapshot().into_iter().find(|l| l.key == key).unwrap();
    let released = release(&table, &lease, &table.beats_snapshot())
        .await
        .unwrap();
    until_processed_again(&workers, &table, &mut log, &key).await;
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "two workers may process the released shard"
    );
    assert!(
        matches!(released, Released::HandedBack { told: true, .. }),
        "{released:?}"
    );
    let a = workers[0].coordinator().stats();
    assert_eq!(
        a.handed_off,
        handed_off + 1,
        "the holder drained and handed the shard over: {a:?}"
    );
}

/// `kcl leases reset --force` of `lease` (as just read) to `to`, written
/// as the CLI writes it: the eviction of any kcl instance that may be
/// processing it, then the checkpoint (keeping an eviction's handoff,
/// removing anything else), then the evicted instance told.
async fn reset_as_the_cli_does(
    table: &kcl_core::store::memory::InMemoryLeaseStore,
    lease: &kcl_core::Lease,
    to: kcl_core::Checkpoint,
) {
    use kcl_core::leases::operator::{evict, tell};
    let evicted = evict(table, lease, &table.beats_snapshot()).await.unwrap();
    let mut reset = evicted.as_ref().map_or(lease.clone(), |(l, _)| l.clone());
    reset.checkpoint = to;
    reset.counter += 1;
    reset.owner = None;
    reset.tenure = None;
    let keep = reset
        .checkpoint_owner_tenure
        .as_deref()
        .is_some_and(kcl_core::store::is_evicted_tenure);
    if !keep {
        reset.checkpoint_owner = None;
        reset.checkpoint_owner_tenure = None;
    }
    table.put_raw(reset);
    if let Some((_, instance)) = &evicted {
        assert!(tell(table, instance, &lease.key).await);
    }
}

/// Resets `lease` (as just read) as the CLI does and runs the fleet until
/// the shard is processed again, from the reset checkpoint: it stands, no
/// handoff left on the lease.
async fn reset_until_processed_again(
    workers: &[SimWorker],
    table: &kcl_core::store::memory::InMemoryLeaseStore,
    log: &mut OverlapLog,
    lease: &kcl_core::Lease,
) {
    let to = kcl_core::Checkpoint::at("777", 0);
    reset_as_the_cli_does(table, lease, to.clone()).await;
    until_processed_again(workers, table, log, &lease.key).await;
    let now = table
        .snapshot()
        .into_iter()
        .find(|l| l.key == lease.key)
        .unwrap();
    assert_eq!(
        (&now.checkpoint, &now.checkpoint_owner),
        (&to, &None),
        "{now:?}"
    );
}

/// Defect 4, for `kcl leases reset --force`: the holder is evicted by a
/// handoff to nobody in a tenure it never wrote, so it stops without
/// writing (its checkpoint would undo the reset), no peer takes the shard
/// while it may still process it, and it lets the lease go once it
/// stopped; the shard then starts from the reset checkpoint.
#[tokio::test(start_paused = true)]
async fn an_operators_reset_evicts_a_liveness_holder_before_any_peer_processes_the_shard() {
    let table = table_with(3).await;
    let mut log = OverlapLog::default();
    let (workers, key) = fleet_for_an_operator(&table, &mut log, LEASE / 2).await;
    let (lost, handed_off) = {
        let a = workers[0].coordinator().stats();
        (a.lost, a.handed_off)
    };
    let lease = table.snapshot().into_iter().find(|l| l.key == key).unwrap();
    reset_until_processed_again(&workers, &table, &mut log, &lease).await;
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "two workers may process the reset shard"
    );
    let a = workers[0].coordinator().stats();
    assert_eq!(
        (a.lost, a.handed_off),
        (lost + 1, handed_off),
        "the holder stopped without a handoff checkpoint: {a:?}"
    );
}

/// A Java KCL 3.x worker and its leader, as they behave toward the lease
/// table: it reports to `WorkerMetricStats`, renews its own leases every
/// third of the lease duration by their counters (leaving any kcl tenure in
/// place), completes at once a handoff asked of it, and takes every other
/// lease it has seen stand still for the lease duration (its failover
/// time). Counts its takes of leases `victim` owned.
async fn java_worker(
    table: kcl_core::store::memory::InMemoryLeaseStore,
    id: &'static str,
    victim: &'static str,
    takes: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use std::collections::HashMap;
    let mut seen: HashMap<String, (u64, Option<String>, Instant)> = HashMap::new();
    let mut renewed = Instant::now();
    let mut reported: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if reported.is_none_or(|r| now - r >= Duration::from_secs(30)) {
            reported = Some(now);
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            table.set_java_workers(vec![kcl_core::store::JavaWorker {
                id: id.into(),
                last_update_secs: wall,
            }]);
        }
        let renew = now - renewed >= LEASE / 3;
        if renew {
            renewed = now;
        }
        // No await from the read to the writes: nothing else runs between.
        for mut l in table.snapshot() {
            let state = (l.counter, l.owner.clone());
            let since = match seen.get(&l.key) {
                Some((c, o, since)) if (*c, o) == (state.0, &state.1) => *since,
                _ => now,
            };
            seen.insert(l.key.clone(), (state.0, state.1.clone(), since));
            if l.is_owned_by(id) {
                if l.checkpoint_owner.is_none() && renew {
                    l.counter += 1;
                    table.put_raw(l);
                }
            } else if l.checkpoint_owner.as_deref() == Some(id) {
                l.checkpoint_owner = None;
                l.checkpoint_owner_tenure = None;
                l.counter += 1;
                table.put_raw(l);
            } else if l.checkpoint_owner.is_none() && now - since >= LEASE {
                if l.owner.as_deref() == Some(victim) {
                    takes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                l.owner = Some(id.into());
                l.counter += 1;
                table.put_raw(l);
            }
        }
        sleep(Duration::from_millis(250)).await;
    }
}

/// Defect 5 of the explored protocol: a worker renewing through its
/// liveness record on a table a Java KCL worker shares. The Java worker
/// judges leases by their counters, which beats never move, so it took
/// the kcl worker's leases while it still processed them, again and
/// again. The kcl worker sees a lease renewed in place (or lost) by an
/// owner without a liveness record and switches to per-lease renewal:
/// the Java worker takes nothing from it after that, and the two never
/// process one shard at once.
#[tokio::test(start_paused = true)]
async fn a_liveness_worker_sharing_its_table_with_java_switches_to_per_lease_renewal() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let (table, mut log, workers) =
        first_holder(8, config("a", 1).build().unwrap(), StandIn::Checkpointing).await;
    let step = Duration::from_millis(50);
    assert_eq!(workers[0].valid_keys().len(), 8);
    let takes = Arc::new(AtomicU64::new(0));
    let java = tokio::spawn(java_worker(
        table.clone(),
        "java-1",
        "a",
        Arc::clone(&takes),
    ));
    // The Java worker takes what looks expired to it; the kcl worker
    // notices and switches, then balances with it.
    run_for(&workers, &mut log, LEASE * 6, step).await;
    let switched = workers[0].coordinator().stats().switched_to_per_lease;
    let taken_before = takes.load(Ordering::Relaxed);
    let mut both = 0u64;
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        run_for(&workers, &mut log, Duration::from_millis(250), step).await;
        let java_processes: Vec<String> = table
            .snapshot()
            .into_iter()
            .filter(|l| l.is_owned_by("java-1") && l.checkpoint_owner.is_none())
            .map(|l| l.key)
            .collect();
        both += workers[0]
            .processing_keys()
            .iter()
            .filter(|k| java_processes.contains(k))
            .count() as u64;
    }
    java.abort();
    let later = takes.load(Ordering::Relaxed) - taken_before;
    let a = workers[0].coordinator().stats();
    println!("{a:?}; Java takes {taken_before} then {later}");
    assert_eq!(
        later, 0,
        "the Java worker kept taking the kcl worker's leases"
    );
    assert_eq!(
        both, 0,
        "the kcl and the Java worker processed one shard at once"
    );
    assert_eq!(
        switched, 1,
        "the kcl worker switched to per-lease renewal: {a:?}"
    );
    assert!(
        !workers[0].valid_keys().is_empty() && table_counts(&table).contains_key("java-1"),
        "the two share the shards: {:?}",
        table_counts(&table)
    );
}

/// Defect 5, before any lease moved: a worker renewing through its
/// liveness record that finds Java KCL workers reporting on its table at
/// its first tick renews per lease from the start.
#[tokio::test(start_paused = true)]
async fn a_liveness_worker_that_finds_java_reports_renews_per_lease_from_its_first_tick() {
    let table = table_with(4).await;
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    table.set_java_workers(vec![kcl_core::store::JavaWorker {
        id: "java-1".into(),
        last_update_secs: wall,
    }]);
    let mut log = OverlapLog::default();
    let workers = vec![SimWorker::start(&table, config("a", 1).build().unwrap())];
    run_for(&workers, &mut log, TICK * 3, Duration::from_millis(50)).await;
    let a = workers[0].coordinator().stats();
    assert_eq!(a.switched_to_per_lease, 1, "{a:?}");
    assert!(
        workers[0].stats.snapshot().op(StoreOp::Renew).calls >= 4 * 3,
        "every lease renewed per lease: {:?}",
        workers[0].stats.snapshot().op(StoreOp::Renew)
    );
    assert!(
        table.beats_snapshot().iter().all(|b| b.per_lease),
        "its record says so, for kcl peers"
    );
}

/// An operator's `kcl leases reset --force` of a lease a steal is moving:
/// its previous owner (renewing through its liveness record) may still be
/// processing or draining it. Written as a plain reset (no owner, no
/// handoff), the lease was free at once: the thief, its awaited handoff
/// lost, took it back at its next look at the table while the previous
/// owner still processed the shard, and the previous owner's last
/// checkpoint would land over the reset. Evicted instead (the running
/// handoff kept, recorded in a tenure the previous owner never wrote), the
/// previous owner may write nothing more and no worker takes the shard
/// before it let go.
#[tokio::test(start_paused = true)]
async fn an_operators_reset_during_a_steal_evicts_the_draining_previous_owner_first() {
    let (table, mut log, mut workers) = first_holder(
        4,
        config("a", 1).build().unwrap(),
        StandIn::SlowHandoff(LEASE / 2),
    )
    .await;
    assert_eq!(workers[0].valid_keys().len(), 4);
    workers.push(SimWorker::start_with(
        &table,
        config("b", 2).build().unwrap(),
        StandIn::SlowHandoff(LEASE / 2),
    ));
    // The first steal's write: the lease now names the thief as owner and
    // the previous owner as checkpoint owner.
    let end = Instant::now() + LEASE * 3;
    let lease = loop {
        sleep(Duration::from_millis(10)).await;
        log.sample(&workers);
        if let Some(l) = table
            .snapshot()
            .into_iter()
            .find(|l| l.is_owned_by("b") && l.checkpoint_owner.as_deref() == Some("a"))
        {
            break l;
        }
        assert!(Instant::now() < end, "no steal: {:?}", table.snapshot());
    };
    reset_until_processed_again(&workers, &table, &mut log, &lease).await;
    assert_eq!(
        log.longest.get(&lease.key).copied().unwrap_or_default(),
        Duration::ZERO,
        "two workers may process the reset shard"
    );
}

/// A worker renewing per lease whose first beat landed unanswered (the
/// beats after it throttled) holds nothing past a lease duration after
/// that beat: peers judge its leases by the record they see, and it must
/// too. Before, knowing of no landed beat, it took its per-lease renewals
/// alone for validity, as a worker without a workers table does, and went
/// on processing after a peer judged its record dead and took its leases.
#[tokio::test(start_paused = true)]
async fn a_per_lease_worker_whose_first_beat_landed_unanswered_holds_no_longer_than_it() {
    const SHARDS: usize = 4;
    let table = table_with(SHARDS).await;
    let lone = SimWorker::start_with(
        &table,
        per_lease("n", 1).build().unwrap(),
        StandIn::Checkpointing,
    );
    lone.store.inject(StoreOp::Beat, Fault::LostResponse);
    for _ in 0..10_000 {
        lone.store
            .inject(StoreOp::Beat, Fault::Error(StoreErrorKind::Throttled));
    }
    let peer = SimWorker::start_with(
        &table,
        config("p", 2).build().unwrap(),
        StandIn::Checkpointing,
    );
    let workers = [lone, peer];
    let mut log = OverlapLog::default();
    let mut checkpoints = CheckpointLog::default();
    run_checking(&workers, &table, &mut log, &mut checkpoints, LEASE * 9).await;
    println!(
        "{:?} {:?}",
        workers[0].coordinator().stats(),
        workers[1].coordinator().stats()
    );
    assert_one_processor_and_no_regression(&log, &checkpoints);
    assert_eq!(workers[1].processing_keys().len(), SHARDS);
}

/// An operator's repair (`kcl leases release`, `reset --force`) judged
/// without the liveness records (the workers table unreadable: a role
/// allowed only the lease table, throttling) is refused for a lease a kcl
/// instance holds or drains: it may renew through a record the read did not
/// see, and the plain release the CLI fell back to let a peer process the
/// shard while it still did. A lease whose owner has no kcl tenure (a Java
/// KCL worker, renewing per lease) is still repaired without records.
#[tokio::test(start_paused = true)]
async fn an_operators_repair_without_the_liveness_records_is_refused_for_a_kcl_holder() {
    use kcl_core::leases::operator::records_for;
    let table = table_with(1).await;
    let mut held = table.snapshot().remove(0);
    held.owner = Some("w".into());
    held.tenure = Some("i-w.1".into());
    let mut java = held.clone();
    java.tenure = None;
    let mut draining = java.clone();
    draining.owner = Some("thief".into());
    draining.checkpoint_owner = Some("w".into());
    draining.checkpoint_owner_tenure = held.tenure.clone();
    let unreadable = || {
        table.inject(StoreOp::ReadBeats, Fault::Error(StoreErrorKind::Retryable));
    };
    for lease in [&held, &draining] {
        unreadable();
        let refused = records_for(&table, std::slice::from_ref(lease)).await;
        assert!(refused.is_err(), "{lease:?}: {refused:?}");
    }
    unreadable();
    let java_only = records_for(&table, std::slice::from_ref(&java)).await;
    assert!(java_only.is_ok_and(|beats| beats.is_empty()));
    assert!(records_for(&table, &[held, draining]).await.is_ok());
}

/// No two workers processed one lease at once, and no checkpoint moved
/// back.
fn assert_one_processor_and_no_regression(log: &OverlapLog, checkpoints: &CheckpointLog) {
    assert_eq!(
        log.max(),
        Duration::ZERO,
        "two workers may process one lease"
    );
    assert!(
        checkpoints.regressions.is_empty(),
        "{:?}",
        checkpoints.regressions
    );
}

/// A killed worker's liveness record is deleted three lease durations
/// after its last beat, although the fleet went quiet once its leases were
/// taken: the sync leader scans when a dead record becomes deletable.
/// Before, only a scan for another reason deleted it, and each record left
/// behind by a crash was read (and its cadence learnt) at every read of
/// the records for as long as the fleet stayed quiet.
#[tokio::test(start_paused = true)]
async fn a_killed_workers_record_is_deleted_although_the_fleet_went_quiet() {
    let (table, mut log, mut workers) = balanced_pair(4, 40).await;
    let dead: Vec<String> = table
        .beats_snapshot()
        .into_iter()
        .filter(|b| b.worker == "b")
        .map(|b| b.instance)
        .collect();
    assert_eq!(dead.len(), 1);
    workers[1].kill().await;
    let killed = Instant::now();
    let bound = LEASE * 3 + tick_max() * 3;
    while table.beats_snapshot().iter().any(|b| b.instance == dead[0]) {
        run_for(
            &workers[..1],
            &mut log,
            Duration::from_secs(1),
            Duration::from_millis(100),
        )
        .await;
        assert!(
            killed.elapsed() <= bound,
            "the killed worker's record is still there after {:?}",
            killed.elapsed()
        );
    }
    println!("record deleted {:?} after the kill", killed.elapsed());
    assert_eq!(workers[0].processing_keys().len(), 4);
}
