//! The acceptance suite: whole workers against the emulators, with payloads
//! carrying (partition key, counter) so loss, duplicates, order and overlap
//! can be checked. Each scenario is written against `Scenario`, so later
//! retrieval modes and fault layers run the same checks.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use kcl::{InitialPosition, Worker};
use kcl_tests::e2e::{
    CheckpointMode, KEYS, LEASE, Producer, RecordedBatches, Running, Scenario, Verdict,
    WorkerProcess, complete_then_shut_down, out_dir, process_stats, read_logs, start, stat, verify,
    wait_all_owned_by, wait_complete, wait_complete_then_terminate, wait_taken_over,
};
use kcl_tests::{TestEnv, unique_name};
use rstest::rstest;

use crate::E2E_WORKER;

/// How the in-process workers read their shards.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Polling,
    FanOut,
}

fn in_process_worker(s: &Scenario, id: &str, log: &RecordedBatches, mode: Mode) -> Worker {
    let builder = s.worker(id).parent_poll_interval(Duration::from_secs(1));
    let builder = match mode {
        Mode::Polling => builder.idle_time_between_reads(Duration::from_millis(200)),
        Mode::FanOut => builder.enhanced_fan_out(),
    };
    builder.processor(log.factory()).build().unwrap()
}

#[rstest]
#[case::polling(Mode::Polling)]
#[case::fan_out(Mode::FanOut)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_in_one_process_process_everything_in_order(#[case] mode: Mode) {
    let mut s = Scenario::new(4).await;
    s.produce(40).await;
    let log = RecordedBatches::default();
    let mut running: Vec<Running> = Vec::new();
    for id in ["w-1", "w-2", "w-3"] {
        let w = in_process_worker(&s, id, &log, mode);
        running.push(start(w));
    }
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        s.produce(20).await;
    }
    let (_, verdict) = complete_then_shut_down(&s, &log, running, Duration::from_secs(90)).await;
    println!("in-process ({mode:?}): {verdict}");
    verdict.assert_correct();
    assert_eq!(
        verdict.duplicates, 0,
        "no failure happened, so no record may repeat"
    );
    assert!(
        s.owners().await.iter().all(Option::is_none),
        "graceful shutdown released every lease"
    );
}

#[rstest]
#[case::polling(Mode::Polling)]
#[case::fan_out(Mode::FanOut)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_process_everything_in_order(#[case] mode: Mode) {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-procs");
    let mut cfg = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    if let Mode::FanOut = mode {
        cfg.extra_env
            .push(("KCL_E2E_RETRIEVAL".into(), "fanout".into()));
    }
    let mut procs = cfg.spawn_all(&["p-1", "p-2", "p-3"]);
    s.produce(25).await;
    // Production goes on while the fleet balances and after.
    wait_all_owned_by(&s, &["p-1", "p-2", "p-3"].into(), 1).await;
    s.produce_paced(3, 25, Duration::from_secs(1)).await;
    let per_key = s.produced;
    let (_, verdict) =
        wait_complete_then_terminate(&out, per_key, Duration::from_secs(90), &mut procs).await;
    println!("3 processes: {verdict}");
    verdict.assert_correct();
    assert_eq!(verdict.duplicates, 0);
    // Every process held shards (checked in the table above); with eight
    // hashed keys a shard may carry none, so records per process may not.
}

/// Liveness limits only: wide enough that a loaded machine (CI shares two
/// cores with the emulators) cannot trip them. The failover and pickup
/// times are figures, printed here and measured in `make bench`.
const TAKEOVER_LIMIT: Duration = Duration::from_secs(60);

/// Spawns worker processes `ids` and produces 30 records per key; returns
/// once each process holds a lease.
async fn spawn_holding(
    s: &mut Scenario,
    out: &Path,
    checkpoint: CheckpointMode,
    ids: &[&str],
) -> Vec<WorkerProcess> {
    let procs = s.processes(E2E_WORKER, out, checkpoint).spawn_all(ids);
    s.produce(30).await;
    wait_all_owned_by(s, &ids.iter().copied().collect(), 1).await;
    procs
}

/// After the third of `procs` left: 30 more records per key, then waits
/// until every record was processed and terminates the other two; the
/// verdict on all the batches.
async fn survivors_complete(s: &mut Scenario, out: &Path, procs: &mut [WorkerProcess]) -> Verdict {
    s.produce(30).await;
    let per_key = s.produced;
    let (_, verdict) = wait_complete_then_terminate(
        out,
        per_key,
        Duration::from_secs(90),
        procs.iter_mut().take(2),
    )
    .await;
    verdict
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_process_loses_nothing_and_survivors_take_over_its_leases() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-kill");
    let ids = ["k-1", "k-2", "k-3"];
    let mut procs = spawn_holding(&mut s, &out, CheckpointMode::EveryBatch, &ids).await;

    let killed_leases = s
        .owners()
        .await
        .iter()
        .filter(|o| o.as_deref() == Some("k-3"))
        .count();
    procs[2].kill().await.unwrap();
    let took = wait_taken_over(&s, "k-3", TAKEOVER_LIMIT).await;
    println!("SIGKILL: survivors took the killed worker's {killed_leases} leases after {took:?}");
    let verdict = survivors_complete(&mut s, &out, &mut procs).await;
    println!("SIGKILL (at-least-once): {verdict}");
    verdict.assert_correct();
    // The killed worker's leases went to the survivors by expiry takes.
    let taken: u64 = ["k-1", "k-2"]
        .iter()
        .map(|id| stat(&process_stats(&out, id), "taken"))
        .sum();
    assert!(
        killed_leases >= 1 && taken >= killed_leases as u64,
        "survivors took {taken} leases in all; the killed worker held {killed_leases}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigtermed_process_releases_its_shards_and_nothing_repeats() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-term");
    // Checkpoints only in shutdown_requested: no duplicate may appear, so
    // every move (balancing handoffs and the SIGTERM) must be graceful.
    let ids = ["t-1", "t-2", "t-3"];
    let mut procs = spawn_holding(&mut s, &out, CheckpointMode::OnShutdown, &ids).await;

    procs[2].terminate(Duration::from_secs(30)).await.unwrap();
    let took = wait_taken_over(&s, "t-3", TAKEOVER_LIMIT).await;
    println!("SIGTERM: shards picked up {took:?} after the process exited");
    let verdict = survivors_complete(&mut s, &out, &mut procs).await;
    println!("SIGTERM: {verdict}");
    verdict.assert_correct();
    assert_eq!(
        verdict.duplicates, 0,
        "a graceful handover must not repeat records"
    );
    // Released, not left to expire: what made the pickup take one tick.
    let gone = process_stats(&out, "t-3");
    assert!(
        stat(&gone, "released") + stat(&gone, "handed_off") >= 1
            && stat(&gone, "lost") + stat(&gone, "fenced") == 0,
        "t-3 released its leases at SIGTERM: {gone}"
    );
}

/// A second SIGTERM during a drain stuck in a hung processor call ends the
/// process at once, with SIGTERM's status (143), as without a handler: the
/// first installed one for good, and the second was swallowed, the process
/// waiting out the drain (25 s) and exiting 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_cuts_a_drain_stuck_in_a_hung_call() {
    let mut s = Scenario::new(1).await;
    let out = out_dir("kcl-e2e-twice");
    let mut cfg = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    cfg.extra_env.push(("KCL_E2E_HANG_AT".into(), "1".into()));
    let mut hung = cfg.spawn("twice-1").unwrap();
    s.produce(5).await;
    let marker = out.join("twice-1.jsonl.hang");
    let started = tokio::time::Instant::now();
    while !marker.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "twice-1 never hung"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Again each second until it exits: two signals sent close together
    // may reach the handler as one.
    let exit = loop {
        kcl_tests::e2e::signal(&hung.child, "-TERM").unwrap();
        match tokio::time::timeout(Duration::from_secs(1), hung.child.wait()).await {
            Ok(exit) => break exit.unwrap(),
            Err(_) => assert!(
                started.elapsed() < Duration::from_secs(120),
                "twice-1 never exited"
            ),
        }
    };
    assert_eq!(exit.code(), Some(143), "{exit}");
}

/// A checkpoint policy changes only what a crash repeats: the processor
/// here asks for a checkpoint after every batch, the policy writes at most
/// one every 5 s per shard, and `shutdown_requested` does not checkpoint,
/// so the only thing that keeps a graceful move from repeating up to 5 s of
/// records is kcl writing the held-back position at the end of the tenure.
/// Both graceful moves happen while records flow: a second worker joins
/// and steals half the shards (handoffs), then the first is SIGTERMed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_checkpoint_policy_a_handoff_and_a_sigterm_repeat_no_record() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-policy");
    let mut cfg = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    cfg.extra_env.extend([
        ("KCL_E2E_CHECKPOINT_EVERY_MS".into(), "5000".into()),
        ("KCL_E2E_SHUTDOWN_CHECKPOINT".into(), "none".into()),
    ]);
    let mut first = cfg.spawn("c-1").unwrap();
    s.produce(5).await;
    // Records keep coming, so that at each move the policy holds back
    // positions newer than the last write.
    let producer = Producer::start(&s, 1, Duration::from_millis(250));
    wait_all_owned_by(&s, &["c-1"].into(), 4).await;
    // Past each tenure's first write (which goes at once): from here on
    // the policy holds positions back.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut second = cfg.spawn("c-2").unwrap();
    wait_all_owned_by(&s, &["c-1", "c-2"].into(), 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.terminate(Duration::from_secs(30)).await.unwrap();
    wait_taken_over(&s, "c-1", TAKEOVER_LIMIT).await;
    // The survivor reads the released shards while production goes on.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per_key = producer.stop(&mut s).await;
    let batches = wait_complete(
        || read_logs(&out).unwrap(),
        per_key,
        Duration::from_secs(90),
    )
    .await;
    second.terminate(Duration::from_secs(30)).await.unwrap();

    let (joiner, gone) = (process_stats(&out, "c-2"), process_stats(&out, "c-1"));
    let verdict = verify(&batches, KEYS, per_key);
    println!("policy every 5 s: {verdict}; joiner {joiner}; SIGTERMed {gone}");
    verdict.assert_correct();
    assert_eq!(
        verdict.duplicates, 0,
        "a handoff and a SIGTERM must write the position the policy held back"
    );
    // The moves the test is about happened, and gracefully: a forced
    // handoff or an expiry take may repeat records by design.
    assert!(
        stat(&joiner, "stolen") >= 1 && stat(&joiner, "handoffs_completed") >= 1,
        "c-2 got shards by graceful handoff: {joiner}"
    );
    assert_eq!(stat(&joiner, "handoffs_forced"), 0, "{joiner}");
    assert!(
        stat(&gone, "handed_off") >= 1 && stat(&gone, "released") >= 1,
        "c-1 handed shards off, then released the rest at SIGTERM: {gone}"
    );
    assert_eq!(
        stat(&gone, "lost")
            + stat(&gone, "fenced")
            + stat(&joiner, "lost")
            + stat(&joiner, "fenced"),
        0,
        "no lease was lost: c-1 {gone}, c-2 {joiner}"
    );
}

#[tokio::test]
async fn bad_configuration_and_a_missing_stream_are_clear_errors() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let factory = RecordedBatches::default().factory();
    // Each case is a valid builder with one thing wrong.
    let valid = |app: &str, stream: &str| {
        Worker::builder(app)
            .stream(stream)
            .sdk_config(env.sdk_config())
            .processor(factory.clone())
    };
    let cases: Vec<(kcl::WorkerBuilder, &str)> = vec![
        (
            Worker::builder("ok-app")
                .sdk_config(env.sdk_config())
                .processor(factory.clone()),
            "stream",
        ),
        (
            Worker::builder("ok-app")
                .stream("s")
                .processor(factory.clone()),
            "sdk_config",
        ),
        (
            Worker::builder("ok-app")
                .stream("s")
                .sdk_config(env.sdk_config()),
            "processor",
        ),
        (valid("a b", "s"), "application_name"),
        (
            valid("ok-app", "s").renew_interval(Duration::from_secs(60)),
            "renew_interval",
        ),
        (valid("ok-app", "s").max_records(0), "max_records"),
        (
            valid("ok-app", "arn:aws:kinesis:us-east-1:1234:stream/s"),
            "stream",
        ),
        // The test configuration is in us-east-1.
        (
            valid("ok-app", "arn:aws:kinesis:ap-south-2:123456789012:stream/s"),
            "stream",
        ),
        (
            valid("ok-app", "s").idle_time_between_reads(Duration::from_millis(50)),
            "idle_time_between_reads",
        ),
        (valid("ok-app", "s").stream("s"), "streams"),
    ];
    for (builder, field) in cases {
        let err = builder.build().unwrap_err().to_string();
        assert!(err.contains(field), "error should name `{field}`: {err}");
    }

    let missing = unique_name("kcl-missing");
    let app = unique_name("kcl-e2e-app");
    let worker = Worker::builder(&app)
        .stream(&missing)
        .sdk_config(env.sdk_config())
        .processor(factory.clone())
        .build()
        .unwrap();
    let err = worker.run().await.unwrap_err();
    assert_eq!(err.kind(), kcl::ErrorKind::StreamNotFound, "{err:?}");
    assert_eq!(err.stream(), Some(missing.as_str()));
    assert!(err.to_string().contains(&missing), "{err}");
    assert!(
        !kcl_tests::table_exists(env.dynamodb(), &app).await.unwrap(),
        "a misspelt stream must not leave a lease table behind"
    );
}

/// A stream named by its ARN is read through `StreamARN` on every call, and
/// its multi-stream lease keys name the account from the ARN, as the Java
/// KCL writes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_named_by_arn_is_consumed_with_java_compatible_lease_keys() {
    for multi_stream in [false, true] {
        let mut s = Scenario::new(2).await;
        s.produce(10).await;
        let summary = s
            .env
            .kinesis()
            .describe_stream_summary()
            .stream_name(&s.stream)
            .send()
            .await
            .unwrap();
        let summary = summary.stream_description_summary().unwrap();
        let arn = summary.stream_arn().to_owned();
        let account = arn.split(':').nth(4).unwrap().to_owned();
        let log = RecordedBatches::default();
        let mut builder = Worker::builder(&s.app)
            .stream(&arn)
            .sdk_config(s.env.sdk_config())
            .worker_id("arn-1")
            .initial_position(InitialPosition::TrimHorizon)
            .lease_duration(LEASE)
            .taker_interval(Duration::from_secs(2));
        builder = builder.multi_stream(multi_stream);
        let worker = builder.processor(log.factory()).build().unwrap();
        let handle = worker.handle();
        let running = tokio::spawn(worker.run());
        let per_key = s.produced;
        let batches = wait_complete(|| log.all(), per_key, Duration::from_secs(90)).await;
        let keys: Vec<String> = s
            .lease_items()
            .await
            .iter()
            .filter_map(|i| i.get("leaseKey")?.as_s().ok().cloned())
            .collect();
        handle.shutdown();
        running.await.unwrap().unwrap();
        verify(&batches, KEYS, per_key).assert_correct();
        assert_eq!(keys.len(), 2, "{keys:?}");
        for key in &keys {
            if multi_stream {
                let epoch = summary.stream_creation_timestamp().secs();
                let prefix = format!("{account}:{}:{epoch}:shardId-", s.stream);
                assert!(
                    key.starts_with(&prefix),
                    "{key} does not start with {prefix}"
                );
            } else {
                assert!(key.starts_with("shardId-"), "{key}");
            }
        }
    }
}

/// A single-stream lease table keeps the checkpoints of one stream: a
/// worker of the same application on another stream is refused at
/// startup, naming both streams and the table, before it reads a record.
#[tokio::test]
async fn a_lease_table_of_one_stream_is_refused_for_another() {
    let env = TestEnv::connect().await.unwrap();
    let first = unique_name("kcl-first");
    let second = unique_name("kcl-second");
    kcl_tests::create_stream(env.kinesis(), &first, 1)
        .await
        .unwrap();
    kcl_tests::create_stream(env.kinesis(), &second, 1)
        .await
        .unwrap();
    let app = unique_name("kcl-one-stream");
    let log = RecordedBatches::default();
    let worker = Worker::builder(&app)
        .stream(&first)
        .sdk_config(env.sdk_config())
        .processor(log.factory())
        .build()
        .unwrap();
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    while !handle.status().ready {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.shutdown();
    run.await.unwrap().unwrap();

    let other = Worker::builder(&app)
        .stream(&second)
        .sdk_config(env.sdk_config())
        .processor(log.factory())
        .build()
        .unwrap();
    // Bounded only so that a worker wrongly let run fails the test
    // instead of hanging it.
    let err = tokio::time::timeout(Duration::from_secs(120), other.run())
        .await
        .expect("a worker on another stream is refused at startup, not run")
        .unwrap_err();
    assert_eq!(err.kind(), kcl::ErrorKind::LeaseTable, "{err:?}");
    let mut message = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    assert!(
        message.contains(&first) && message.contains(&second) && message.contains(&app),
        "{message}"
    );
}
