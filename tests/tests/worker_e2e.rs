//! The acceptance suite: whole workers against the emulators, with payloads
//! carrying (partition key, counter) so loss, duplicates, order and overlap
//! can be checked. Each scenario is written against `Scenario`, so later
//! retrieval modes and fault layers run the same checks.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kcl::{
    Checkpointer, InitialPosition, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
    Worker, WorkerHandle,
};
use kcl_tests::e2e::{
    BatchLog, CheckpointMode, KEYS, LEASE, Scenario, TICK_MAX, WorkerProcess, now_ns, out_dir,
    read_logs, verify, wait_all_owned_by, wait_complete, wait_taken_over,
};
use kcl_tests::{TestEnv, unique_name};

struct Recorder {
    ctx: ShardContext,
    log: Arc<Mutex<Vec<BatchLog>>>,
}

#[kcl::async_trait]
impl RecordProcessor for Recorder {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let start = now_ns();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let entry = BatchLog::new(
            &self.ctx.worker_id,
            &self.ctx.shard_id,
            start,
            &batch.records,
        );
        self.log.lock().unwrap().push(entry);
        cp.checkpoint().await?;
        Ok(())
    }
    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        cp.checkpoint().await?;
        Ok(())
    }
}

fn in_process_worker(s: &Scenario, id: &str, log: &Arc<Mutex<Vec<BatchLog>>>) -> Worker {
    let log = Arc::clone(log);
    Worker::builder(&s.app)
        .stream(&s.stream)
        .sdk_config(s.env.sdk_config())
        .worker_id(id)
        .initial_position(InitialPosition::TrimHorizon)
        .lease_duration(LEASE)
        .taker_interval(Duration::from_secs(2))
        .idle_time_between_reads(Duration::from_millis(200))
        .parent_poll_interval(Duration::from_secs(1))
        .processor(move |ctx: &ShardContext| Recorder {
            ctx: ctx.clone(),
            log: Arc::clone(&log),
        })
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_in_one_process_process_everything_in_order() {
    let mut s = Scenario::new(4).await;
    s.produce(40).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut running: Vec<(
        WorkerHandle,
        tokio::task::JoinHandle<Result<(), kcl::Error>>,
    )> = Vec::new();
    for id in ["w-1", "w-2", "w-3"] {
        let w = in_process_worker(&s, id, &log);
        running.push((w.handle(), tokio::spawn(w.run())));
    }
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        s.produce(20).await;
    }
    let per_key = s.produced;
    let batches = wait_complete(
        || log.lock().unwrap().clone(),
        per_key,
        Duration::from_secs(90),
    )
    .await;
    for (h, _) in &running {
        h.shutdown();
    }
    for (_, t) in running {
        t.await.unwrap().unwrap();
    }
    let verdict = verify(&batches, KEYS, per_key);
    println!(
        "in-process: per worker {:?}, duplicates {}",
        verdict.per_worker, verdict.duplicates
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_process_everything_in_order() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-procs");
    let cfg = s.processes(
        env!("CARGO_BIN_EXE_e2e-worker"),
        &out,
        CheckpointMode::EveryBatch,
    );
    let mut procs: Vec<WorkerProcess> = ["p-1", "p-2", "p-3"]
        .iter()
        .map(|id| cfg.spawn(id).unwrap())
        .collect();
    s.produce(25).await;
    // Production goes on while the fleet balances and after.
    wait_all_owned_by(&s, &["p-1", "p-2", "p-3"].into(), 1).await;
    for _ in 0..3 {
        s.produce(25).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let per_key = s.produced;
    let batches = wait_complete(
        || read_logs(&out).unwrap(),
        per_key,
        Duration::from_secs(90),
    )
    .await;
    for p in &mut procs {
        p.terminate(Duration::from_secs(30)).await.unwrap();
    }
    let verdict = verify(&batches, KEYS, per_key);
    println!(
        "3 processes: per worker {:?}, duplicates {}",
        verdict.per_worker, verdict.duplicates
    );
    verdict.assert_correct();
    assert_eq!(verdict.duplicates, 0);
    // Every process held shards (checked in the table above); with eight
    // hashed keys a shard may carry none, so records per process may not.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_process_loses_nothing_and_survivors_take_over_within_lease_plus_tick() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-kill");
    let cfg = s.processes(
        env!("CARGO_BIN_EXE_e2e-worker"),
        &out,
        CheckpointMode::EveryBatch,
    );
    let mut procs: Vec<WorkerProcess> = ["k-1", "k-2", "k-3"]
        .iter()
        .map(|id| cfg.spawn(id).unwrap())
        .collect();
    s.produce(30).await;
    wait_all_owned_by(&s, &["k-1", "k-2", "k-3"].into(), 1).await;

    procs[2].kill().await.unwrap();
    let took = wait_taken_over(&s, "k-3", LEASE + TICK_MAX + Duration::from_secs(2)).await;
    println!(
        "SIGKILL: survivors took the killed worker's leases after {took:?} (bound {:?})",
        LEASE + TICK_MAX
    );
    s.produce(30).await;
    let per_key = s.produced;
    let batches = wait_complete(
        || read_logs(&out).unwrap(),
        per_key,
        Duration::from_secs(90),
    )
    .await;
    for p in procs.iter_mut().take(2) {
        p.terminate(Duration::from_secs(30)).await.unwrap();
    }
    let verdict = verify(&batches, KEYS, per_key);
    println!(
        "SIGKILL: duplicates {} (at-least-once), per worker {:?}",
        verdict.duplicates, verdict.per_worker
    );
    verdict.assert_correct();
    assert!(
        took <= LEASE + TICK_MAX + Duration::from_secs(1),
        "failover took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigtermed_process_hands_over_within_a_tick_without_duplicates() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-term");
    // Checkpoints only in shutdown_requested: no duplicate may appear, so
    // every move (balancing handoffs and the SIGTERM) must be graceful.
    let cfg = s.processes(
        env!("CARGO_BIN_EXE_e2e-worker"),
        &out,
        CheckpointMode::OnShutdown,
    );
    let mut procs: Vec<WorkerProcess> = ["t-1", "t-2", "t-3"]
        .iter()
        .map(|id| cfg.spawn(id).unwrap())
        .collect();
    s.produce(30).await;
    wait_all_owned_by(&s, &["t-1", "t-2", "t-3"].into(), 1).await;

    procs[2].terminate(Duration::from_secs(30)).await.unwrap();
    let took = wait_taken_over(&s, "t-3", TICK_MAX + Duration::from_secs(2)).await;
    println!(
        "SIGTERM: shards picked up {took:?} after the process exited (one tick is at most {TICK_MAX:?})"
    );
    s.produce(30).await;
    let per_key = s.produced;
    let batches = wait_complete(
        || read_logs(&out).unwrap(),
        per_key,
        Duration::from_secs(90),
    )
    .await;
    for p in procs.iter_mut().take(2) {
        p.terminate(Duration::from_secs(30)).await.unwrap();
    }
    let verdict = verify(&batches, KEYS, per_key);
    println!(
        "SIGTERM: duplicates {}, per worker {:?}",
        verdict.duplicates, verdict.per_worker
    );
    verdict.assert_correct();
    assert_eq!(
        verdict.duplicates, 0,
        "a graceful handover must not repeat records"
    );
    assert!(
        took <= TICK_MAX + Duration::from_millis(500),
        "pickup took {took:?}"
    );
}

#[tokio::test]
async fn bad_configuration_and_a_missing_stream_are_clear_errors() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let factory = |ctx: &ShardContext| Recorder {
        ctx: ctx.clone(),
        log: Arc::default(),
    };
    let cases: Vec<(kcl::WorkerBuilder, &str)> = vec![
        (
            Worker::builder("ok-app")
                .sdk_config(env.sdk_config())
                .processor(factory),
            "stream",
        ),
        (
            Worker::builder("ok-app").stream("s").processor(factory),
            "sdk_config",
        ),
        (
            Worker::builder("ok-app")
                .stream("s")
                .sdk_config(env.sdk_config()),
            "processor",
        ),
        (
            Worker::builder("a b")
                .stream("s")
                .sdk_config(env.sdk_config())
                .processor(factory),
            "application_name",
        ),
        (
            Worker::builder("ok-app")
                .stream("s")
                .sdk_config(env.sdk_config())
                .processor(factory)
                .renew_interval(Duration::from_secs(60)),
            "renew_interval",
        ),
        (
            Worker::builder("ok-app")
                .stream("s")
                .sdk_config(env.sdk_config())
                .processor(factory)
                .max_records(0),
            "max_records",
        ),
        (
            Worker::builder("ok-app")
                .stream("s")
                .stream("s")
                .sdk_config(env.sdk_config())
                .processor(factory),
            "streams",
        ),
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
        .processor(factory)
        .build()
        .unwrap();
    let err = worker.run().await.unwrap_err();
    assert!(matches!(err, kcl::Error::StreamNotFound { .. }), "{err:?}");
    assert!(err.to_string().contains(&missing), "{err}");
    let table = env
        .dynamodb()
        .describe_table()
        .table_name(&app)
        .send()
        .await;
    assert!(
        table.is_err(),
        "a misspelt stream must not leave a lease table behind"
    );
}
