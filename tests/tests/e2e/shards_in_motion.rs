//! Shards in motion against the emulators: scale-out under load with
//! graceful handoffs, a handoff forced past a hung processor, splits and
//! merges during production, and two streams on one fleet.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl::{InitialPosition, Worker};
use kcl_tests::e2e::{
    CheckpointMode, KEYS, LEASE, Producer, RecordedBatches, Scenario, TICK_MAX, now_ns, out_dir,
    process_stats as stats, read_logs, shard_span_ns, shutdown_all, stat, verify,
    wait_all_owned_by, wait_complete, wait_complete_then_terminate,
};
use kcl_tests::{TestRecord, create_stream, merge_shards, put_records, unique_name};
use rstest::rstest;
use tokio::time::Instant;

use crate::E2E_WORKER;

// Hot shards spread by load-aware balance, two then three processes.
mod load_balance;

fn owner_counts(owners: &[Option<String>]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for o in owners.iter().flatten() {
        *m.entry(o.clone()).or_default() += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_from_one_to_three_processes_under_load_loses_and_repeats_nothing() {
    let mut s = Scenario::new(8).await;
    let out = out_dir("kcl-e2e-scale");
    // Checkpoints only in shutdown_requested: every shard that moves must
    // move by graceful handoff, or records repeat.
    let cfg = s.processes(E2E_WORKER, &out, CheckpointMode::OnShutdown);
    let mut procs = vec![cfg.spawn("s-1").unwrap()];
    s.produce(5).await;
    let producer = Producer::start(&s, 2, Duration::from_millis(500));
    wait_all_owned_by(&s, &["s-1"].into(), 8).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let joined = Instant::now();
    procs.push(cfg.spawn("s-2").unwrap());
    procs.push(cfg.spawn("s-3").unwrap());
    let names = ["s-1", "s-2", "s-3"];
    // Only a liveness limit, wide enough that a loaded machine cannot trip
    // it; the time itself is a figure (printed here, measured in `make bench`).
    let bound = Duration::from_secs(90);
    let balanced_after = loop {
        let counts = owner_counts(&s.owners().await);
        let per: Vec<usize> = names
            .iter()
            .map(|n| counts.get(*n).copied().unwrap_or(0))
            .collect();
        if per.iter().sum::<usize>() == 8
            && per.iter().max().unwrap() - per.iter().min().unwrap() <= 1
        {
            break joined.elapsed();
        }
        assert!(
            joined.elapsed() < bound,
            "not balanced within {bound:?}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let per_key = producer.stop(&mut s).await;
    let (_, verdict) =
        wait_complete_then_terminate(&out, per_key, Duration::from_secs(90), &mut procs).await;
    let (mut completed, mut forced) = (0, 0);
    for id in names {
        let st = stats(&out, id);
        completed += stat(&st, "handoffs_completed");
        forced += stat(&st, "handoffs_forced");
    }
    println!(
        "scale-out 1 -> 3 on 8 shards: balanced {balanced_after:?} after the newcomers started; \
         handoffs completed {completed}, forced {forced}; {verdict}"
    );
    verdict.assert_correct();
    assert_eq!(
        verdict.duplicates, 0,
        "graceful handoffs must not repeat records"
    );
    assert!(
        completed >= 4,
        "newcomers got their shards by handoff: {completed}"
    );
    assert_eq!(forced, 0);
}

/// A fleet moves between the renewal modes with a rolling restart, one
/// process at a time, under load: per lease to liveness records, then back.
/// While the modes are mixed each side keeps the other's leases alive (a
/// lease of a beating instance is judged by its beats, one of an instance
/// without a record by its renewals), so no shard is taken from a live
/// holder: nothing lost, order kept, no shard processed by two workers at
/// once, no handoff forced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_between_the_renewal_modes_never_shares_a_shard() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-modes");
    let base = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    let in_mode = |mode: &str| {
        let mut cfg = base.clone();
        cfg.extra_env
            .push(("KCL_E2E_RENEWAL".into(), mode.to_owned()));
        cfg
    };
    let names = ["m-1", "m-2"];
    let mut procs: Vec<_> = names
        .iter()
        .map(|id| in_mode("per-lease").spawn(id).unwrap())
        .collect();
    s.produce(5).await;
    let producer = Producer::start(&s, 2, Duration::from_millis(500));
    wait_all_owned_by(&s, &names.into(), 1).await;
    let mut mixed_for = Duration::ZERO;
    for mode in ["liveness", "per-lease"] {
        for (i, id) in names.iter().enumerate() {
            procs[i].terminate(Duration::from_secs(30)).await.unwrap();
            procs[i] = in_mode(mode).spawn(id).unwrap();
            wait_all_owned_by(&s, &names.into(), 1).await;
            // Mixed (or, after the second, uniform) for longer than a lease:
            // long enough for either side to take what it judged expired.
            let started = Instant::now();
            tokio::time::sleep(LEASE * 2).await;
            if i == 0 {
                mixed_for += started.elapsed();
            }
        }
    }
    let per_key = producer.stop(&mut s).await;
    let (_, verdict) =
        wait_complete_then_terminate(&out, per_key, Duration::from_secs(90), &mut procs).await;
    let forced: u64 = names
        .iter()
        .map(|id| stat(&stats(&out, id), "handoffs_forced"))
        .sum();
    println!(
        "renewal modes rolled per-lease -> liveness -> per-lease: {mixed_for:?} mixed; \
         forced handoffs {forced}; {verdict}"
    );
    verdict.assert_correct();
    assert_eq!(forced, 0, "a handoff was forced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_past_a_hung_processor_is_forced_at_the_deadline_with_bounded_overlap() {
    let mut s = Scenario::new(2).await;
    let out = out_dir("kcl-e2e-hung");
    let mut hung_cfg = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    hung_cfg
        .extra_env
        .push(("KCL_E2E_HANG_AT".into(), "5".into()));
    let mut hung = hung_cfg.spawn("h-1").unwrap();
    s.produce(20).await;
    let marker_path = out.join("h-1.jsonl.hang");
    let started = Instant::now();
    while std::fs::read_to_string(&marker_path)
        .map(|m| m.lines().count())
        .unwrap_or(0)
        < 2
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "h-1 never hung on both shards"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let markers: Vec<serde_json::Value> = std::fs::read_to_string(&marker_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let hung_since: HashMap<String, u128> = markers
        .iter()
        .map(|m| {
            (
                m["shard"].as_str().unwrap().to_owned(),
                m["start_ns"].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();

    let joined = now_ns();
    let mut healthy = s
        .processes(E2E_WORKER, &out, CheckpointMode::EveryBatch)
        .spawn("h-2")
        .unwrap();
    // h-2 asks for one shard; h-1's processor never answers, so the
    // handoff is forced after the handoff timeout (the lease duration).
    // The limit only keeps the test from waiting forever: wide enough that
    // a loaded machine cannot trip it.
    let limit = LEASE + TICK_MAX + Duration::from_secs(60);
    let taken = loop {
        let batches = read_logs(&out).unwrap();
        if let Some(b) = batches
            .iter()
            .filter(|b| b.worker == "h-2")
            .min_by_key(|b| b.start_ns)
        {
            break b.clone();
        }
        assert!(
            Duration::from_nanos((now_ns() - joined) as u64) < limit,
            "h-2 never processed a shard"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let waited = Duration::from_nanos((taken.start_ns - joined) as u64);
    let overlap = Duration::from_nanos((taken.start_ns - hung_since[&taken.shard]) as u64);
    println!(
        "hung processor: h-2 started on {} {waited:?} after joining (forced at the {LEASE:?} handoff timeout, or once \
         the stuck owner fenced itself); h-1's batch there had hung for {overlap:?} and is the only overlap",
        taken.shard
    );
    // Two safe ways out: h-1 (which no longer renews) fences itself when its
    // validity runs out, at lease duration - margin after its last renewal,
    // and then completes the handoff itself; or h-2 forces it at the
    // handoff timeout. Either way h-2 never starts while h-1 could still
    // believe in the lease: no earlier than lease - margin - renew interval.
    let earliest = LEASE - LEASE / 10 - LEASE / 3;
    assert!(
        waited >= earliest,
        "h-2 started {waited:?} after joining, before h-1's validity could end"
    );
    // h-1 fetched nothing more on that shard after its processor hung.
    let batches = read_logs(&out).unwrap();
    assert!(
        !batches.iter().any(|b| b.worker == "h-1"
            && b.shard == taken.shard
            && b.start_ns > hung_since[&taken.shard]),
        "the stuck owner kept processing"
    );
    // Let h-2 take the other shard too: the hung worker is killed.
    hung.kill().await.unwrap();
    let batches = wait_complete(
        || read_logs(&out).unwrap(),
        s.produced,
        Duration::from_secs(60),
    )
    .await;
    healthy.terminate(Duration::from_secs(30)).await.unwrap();
    let st = stats(&out, "h-2");
    println!("hung processor: h-2 stats {st}");
    assert!(
        stat(&st, "handoffs_forced") + stat(&st, "handoffs_completed") >= 1,
        "the handoff ended by force or after the stuck owner fenced itself: {st}"
    );
    let verdict = verify(&batches, KEYS, s.produced);
    assert!(
        verdict.missing.is_empty() && verdict.order_violations.is_empty(),
        "{verdict:?}"
    );
}

#[rstest]
#[case::polling("polling")]
#[case::fan_out("fanout")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_and_merge_during_production_keep_order_and_parents_first(#[case] retrieval: &str) {
    let mut s = Scenario::new(2).await;
    let out = out_dir("kcl-e2e-reshard");
    let mut cfg = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    cfg.extra_env
        .push(("KCL_E2E_RETRIEVAL".into(), retrieval.into()));
    let mut procs = vec![cfg.spawn("r-1").unwrap(), cfg.spawn("r-2").unwrap()];
    s.produce(5).await;
    let producer = Producer::start(&s, 2, Duration::from_millis(300));
    wait_all_owned_by(&s, &["r-1", "r-2"].into(), 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (parent, children) = s.split_first_shard().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let merged = merge_shards(s.env.kinesis(), &s.stream, &children[0], &children[1])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let per_key = producer.stop(&mut s).await;
    let (batches, verdict) =
        wait_complete_then_terminate(&out, per_key, Duration::from_secs(120), &mut procs).await;
    println!("split + merge ({retrieval}): {verdict}");
    verdict.assert_correct();

    // No child record before every parent record.
    let first = |shard: &str| shard_span_ns(&batches, shard).map(|(start, _)| start);
    let last = |shard: &str| shard_span_ns(&batches, shard).map(|(_, end)| end);
    for (child, parents) in [
        (&children[0], vec![&parent]),
        (&children[1], vec![&parent]),
        (&merged, vec![&children[0], &children[1]]),
    ] {
        let Some(started) = first(child) else {
            continue;
        };
        for p in parents {
            if let Some(ended) = last(p) {
                assert!(
                    ended <= started,
                    "{child} processed before its parent {p} finished"
                );
            }
        }
    }
    assert!(first(&merged).is_some(), "the merged child was consumed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_streams_on_one_fleet_are_both_consumed_and_balanced() {
    let a = Scenario::new(3).await;
    let b_stream = unique_name("kcl-e2e-b");
    create_stream(a.env.kinesis(), &b_stream, 3).await.unwrap();
    let per_key = 20;
    let records: Vec<TestRecord> = (0..per_key)
        .flat_map(|counter| (0..KEYS).map(move |key| TestRecord { key, counter }))
        .collect();
    put_records(a.env.kinesis(), &a.stream, &records)
        .await
        .unwrap();
    put_records(a.env.kinesis(), &b_stream, &records)
        .await
        .unwrap();

    let log = RecordedBatches::default();
    let mut running = Vec::new();
    for id in ["m-1", "m-2"] {
        let w = a
            .worker(id)
            .stream(&b_stream)
            .idle_time_between_reads(Duration::from_millis(200))
            .processor(log.factory())
            .build()
            .unwrap();
        running.push((w.handle(), tokio::spawn(w.run())));
    }
    let for_stream = |name: &str| log.of_stream(name);
    wait_complete(|| for_stream(&a.stream), per_key, Duration::from_secs(60)).await;
    wait_complete(|| for_stream(&b_stream), per_key, Duration::from_secs(60)).await;
    // Balanced across both streams: 6 leases, 3 each.
    let started = Instant::now();
    let counts = loop {
        let counts = owner_counts(&a.owners().await);
        if counts.values().copied().collect::<Vec<_>>() == vec![3, 3] {
            break counts;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not balanced: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    shutdown_all(running).await;
    for name in [&a.stream, &b_stream] {
        let verdict = verify(&for_stream(name), KEYS, per_key);
        verdict.assert_correct();
        assert_eq!(verdict.duplicates, 0);
    }
    println!("two streams: leases per worker {counts:?}");
    let processed: u64 = log.all().iter().map(|b| b.records.len() as u64).sum();
    assert_eq!(processed, 2 * u64::from(KEYS) * per_key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_added_at_runtime_is_picked_up_by_the_tracker() {
    let a = Scenario::new(1).await;
    let b_stream = unique_name("kcl-e2e-late");
    let wanted = Arc::new(Mutex::new(vec![a.stream.clone()]));
    let log = RecordedBatches::default();
    let names = Arc::clone(&wanted);
    let w = Worker::builder(&a.app)
        .stream(&a.stream)
        .stream_tracker(move || names.lock().unwrap().clone())
        .sdk_config(a.env.sdk_config())
        .worker_id("t-1")
        .initial_position(InitialPosition::TrimHorizon)
        .shard_sync_interval(Duration::from_secs(1))
        .taker_interval(Duration::from_secs(1))
        .idle_time_between_reads(Duration::from_millis(200))
        .processor(log.factory())
        .build()
        .unwrap();
    let handle = w.handle();
    let task = tokio::spawn(w.run());
    // Created and added while the worker runs.
    create_stream(a.env.kinesis(), &b_stream, 1).await.unwrap();
    let records: Vec<TestRecord> = (0..10)
        .flat_map(|counter| (0..KEYS).map(move |key| TestRecord { key, counter }))
        .collect();
    put_records(a.env.kinesis(), &b_stream, &records)
        .await
        .unwrap();
    wanted.lock().unwrap().push(b_stream.clone());
    let for_b = || log.of_stream(&b_stream);
    let batches = wait_complete(for_b, 10, Duration::from_secs(60)).await;
    handle.shutdown();
    task.await.unwrap().unwrap();
    verify(&batches, KEYS, 10).assert_correct();
}
