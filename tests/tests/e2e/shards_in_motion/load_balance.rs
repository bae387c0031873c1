//! Load-aware balance on the emulators: eight shards, two of them carrying
//! 80 % of the bytes, two then three worker processes.
//!
//! The two workers start on an idle stream and split it by count (no
//! figures yet); the test then makes hot two shards that the same worker
//! holds, the worst case of count balance, and measures it. Once the
//! holders publish what their leases carry, the fleet moves a hot shard by
//! graceful handoff; a third worker joins and takes the cold shards.
//! Every figure is read from the batch logs (bytes each worker processed
//! over a window), every verdict is by counts: the most loaded worker
//! within 25 % of the fleet's mean once settled, with two workers and with
//! three (count balance started it at about 1.7 times), no lease moved in
//! the final 60 s steady window, no record lost or repeated, no handoff
//! forced. `make bench` runs the same fleet for five minutes
//! (`load_balance_*`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kcl_tests::e2e::{
    CheckpointMode, KEYS, Scenario, now_ns, out_dir, process_stats as stats, read_logs, stat,
    verify, wait_all_owned_by, wait_complete,
};
use kcl_tests::skew::{Skew, SkewedProducer, max_over_mean};
use tokio::time::Instant;

use crate::E2E_WORKER;

/// The lease table's owner of each unfinished lease, by shard.
async fn owners_by_shard(s: &Scenario) -> BTreeMap<String, Option<String>> {
    s.lease_items()
        .await
        .iter()
        .filter_map(|item| {
            let shard = item.get("leaseKey")?.as_s().ok()?.clone();
            let owner = item.get("leaseOwner").and_then(|o| o.as_s().ok()).cloned();
            Some((shard, owner))
        })
        .collect()
}

/// Waits until no lease changed hands for `quiet` (polling every 500 ms),
/// within `limit`; returns the owners and when they last changed.
async fn settled(
    s: &Scenario,
    quiet: Duration,
    limit: Duration,
) -> (BTreeMap<String, Option<String>>, u128) {
    let started = Instant::now();
    let mut last = owners_by_shard(s).await;
    let mut since = (Instant::now(), now_ns());
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = owners_by_shard(s).await;
        if now != last {
            last = now;
            since = (Instant::now(), now_ns());
        } else if since.0.elapsed() >= quiet && last.values().all(Option::is_some) {
            return (last, since.1);
        }
        assert!(
            started.elapsed() < limit,
            "leases still moving after {limit:?}: {last:?}"
        );
    }
}

/// Waits until some lease changes hands (within `limit`); returns when.
async fn first_move(s: &Scenario, limit: Duration) -> u128 {
    let started = Instant::now();
    let before = owners_by_shard(s).await;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if owners_by_shard(s).await != before {
            return now_ns();
        }
        assert!(
            started.elapsed() < limit,
            "no lease moved within {limit:?}: {before:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_shards_spread_over_two_then_three_workers_and_settle_without_moves() {
    let s = Scenario::new(KEYS as i32).await;
    let out = out_dir("kcl-e2e-load");
    // Checkpoints only in shutdown_requested: a shard that moves other
    // than by graceful handoff repeats records.
    let mut cfg = s.processes(E2E_WORKER, &out, CheckpointMode::OnShutdown);
    cfg.extra_env.extend([
        ("KCL_E2E_BALANCE".to_owned(), "by-load".to_owned()),
        ("KCL_E2E_LOAD_REPORT_MS".to_owned(), "6000".to_owned()),
    ]);
    let mut procs = vec![cfg.spawn("l-1").unwrap(), cfg.spawn("l-2").unwrap()];
    wait_all_owned_by(&s, &["l-1", "l-2"].into(), 4).await;

    // Count balance's worst case: both hot shards on one worker.
    let owners = owners_by_shard(&s).await;
    let held_by_first: Vec<&str> = owners
        .iter()
        .filter(|(_, o)| o.as_deref() == Some("l-1"))
        .map(|(shard, _)| shard.as_str())
        .collect();
    let skew = Skew::of_stream(
        s.env.kinesis(),
        &s.stream,
        [held_by_first[0], held_by_first[1]],
    )
    .await
    .unwrap();
    let producing = now_ns();
    let producer = SkewedProducer::start(
        s.env.kinesis(),
        &s.stream,
        &skew,
        0,
        Duration::from_millis(250),
    );

    // Until the first figures are published and a lease moves, the fleet
    // is balanced by count.
    let moved = first_move(&s, Duration::from_secs(60)).await;
    let batches = read_logs(&out).unwrap();
    let by_count = skew.rates(&batches, &["l-1", "l-2"], producing + 2_000_000_000, moved);
    let by_count_ratio = max_over_mean(&by_count);

    // Two workers, balanced by load.
    let (two, since) = settled(&s, Duration::from_secs(10), Duration::from_secs(90)).await;
    let measured_until = now_ns();
    let batches = read_logs(&out).unwrap();
    // From a little after the last move: a victim drains what it fetched.
    let two_rates = skew.rates(
        &batches,
        &["l-1", "l-2"],
        since + 2_000_000_000,
        measured_until,
    );
    let two_ratio = max_over_mean(&two_rates);
    let hot_holders: Vec<&Option<String>> = skew.hot_shards().iter().map(|h| &two[h]).collect();

    // A third worker joins.
    procs.push(cfg.spawn("l-3").unwrap());
    let (three, _) = settled(&s, Duration::from_secs(10), Duration::from_secs(120)).await;

    // The steady window: nothing moves, and the load stays spread.
    let steady = Duration::from_secs(60);
    let from = now_ns();
    let started = Instant::now();
    let mut moves_in_steady = 0;
    let mut last = three.clone();
    while started.elapsed() < steady {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = owners_by_shard(&s).await;
        moves_in_steady += now
            .iter()
            .filter(|(shard, owner)| last.get(*shard) != Some(owner))
            .count();
        last = now;
    }
    let to = now_ns();
    let per_key = producer.stop().await.unwrap();
    let batches = wait_complete(
        || read_logs(&out).unwrap(),
        per_key,
        Duration::from_secs(90),
    )
    .await;
    let three_rates = skew.rates(&batches, &["l-1", "l-2", "l-3"], from, to);
    let three_ratio = max_over_mean(&three_rates);
    for p in &mut procs {
        p.terminate(Duration::from_secs(30)).await.unwrap();
    }
    let (mut completed, mut forced) = (0, 0);
    for id in ["l-1", "l-2", "l-3"] {
        let st = stats(&out, id);
        completed += stat(&st, "handoffs_completed");
        forced += stat(&st, "handoffs_forced");
    }
    let verdict = verify(&batches, KEYS, per_key);
    let counts = |owners: &BTreeMap<String, Option<String>>| {
        let mut c: HashMap<String, usize> = HashMap::new();
        for o in owners.values().flatten() {
            *c.entry(o.clone()).or_default() += 1;
        }
        c
    };
    println!(
        "load balance on 8 shards, 2 hot (80 % of the bytes): by count {by_count_ratio:.2} x the \
         mean ({by_count:.0?} B/s); by load, 2 workers {two_ratio:.2} ({two_rates:.0?}), 3 workers \
         {three_ratio:.2} ({three_rates:.0?}, counts {:?}); moves in the last {steady:?}: \
         {moves_in_steady}; handoffs completed {completed}, forced {forced}; duplicates {}",
        counts(&three),
        verdict.duplicates
    );
    verdict.assert_correct();
    assert_eq!(verdict.duplicates, 0, "moves are graceful handoffs");
    assert_eq!(forced, 0, "no handoff forced");
    assert!(
        by_count_ratio >= 1.5,
        "both hot shards on one worker: count balance leaves it far above the mean"
    );
    assert!(
        hot_holders[0] != hot_holders[1],
        "with two workers the hot shards end on different workers: {two:?}"
    );
    assert!(
        two_ratio <= 1.25,
        "two workers: the most loaded is {two_ratio:.2} x the mean"
    );
    assert!(
        three_ratio <= 1.25,
        "three workers: the most loaded is {three_ratio:.2} x the mean"
    );
    assert_eq!(moves_in_steady, 0, "leases moved in the steady window");
}
