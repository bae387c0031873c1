//! Lease faults the emulators never produce, injected end to end: a
//! DynamoDB request that never answers, an unreadable lease item, a SIGTERM
//! right after a peer's steal, a lease table that throttles every call at
//! startup. Each test asserts what the workers counted (renewals, handoffs
//! completed or forced, throttled calls), never a tight wall-clock bound.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use kcl::WorkerHandle;
use kcl_tests::e2e::{
    CheckpointMode, KEYS, LEASE, RecordedBatches, Scenario, WorkerProcess, out_dir, process_stats,
    read_logs, stat, verify, wait_complete,
};
use kcl_tests::fault_proxy::{FaultProxy, Faults};
use kcl_tests::{TestEnv, dynamodb_endpoint, http_get};
use tokio::time::Instant;

use crate::E2E_WORKER;

/// A DynamoDB client through `proxy`, with no SDK timeouts of its own: only
/// kcl's bounds stand between a hung request and the worker.
fn client_through(env: &TestEnv, proxy: &FaultProxy) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(env.sdk_config())
            .endpoint_url(proxy.url())
            .build(),
    )
}

fn worker_on(
    s: &Scenario,
    id: &str,
    dynamodb: aws_sdk_dynamodb::Client,
    log: &RecordedBatches,
) -> kcl::WorkerBuilder {
    // The scenario's worker, with its lease-table client replaced.
    s.worker(id)
        .clients(s.env.kinesis().clone(), dynamodb)
        .idle_time_between_reads(Duration::from_millis(200))
        .processor(log.factory())
}

/// Builds `builder` serving its metrics on a free local port and starts
/// it: its handle, the endpoint's address and its task.
fn start_serving_metrics(
    builder: kcl::WorkerBuilder,
) -> (
    WorkerHandle,
    std::net::SocketAddr,
    tokio::task::JoinHandle<Result<(), kcl::Error>>,
) {
    let worker = builder
        .serve_metrics("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let addr = worker.metrics_addr().unwrap();
    (worker.handle(), addr, tokio::spawn(worker.run()))
}

/// Every lease's counter in the table, read directly (not through a proxy).
async fn counters(s: &Scenario) -> HashMap<String, u64> {
    s.lease_items()
        .await
        .iter()
        .filter_map(|i| {
            let key = i.get("leaseKey")?.as_s().ok()?.clone();
            let n = i.get("leaseCounter")?.as_n().ok()?.parse().ok()?;
            Some((key, n))
        })
        .collect()
}

async fn wait_ready(handle: &WorkerHandle, limit: Duration) {
    let started = Instant::now();
    while !handle.status().ready {
        assert!(
            started.elapsed() < limit,
            "not ready after {limit:?}: {:?}",
            handle.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One lease's DynamoDB requests hang on a dead connection (the proxy
/// accepts them and never answers). That lease's tenure fences; every other
/// lease of the worker keeps renewing, round after round, and its shards
/// keep delivering. (Per-lease renewal: with liveness records no lease item
/// is renewed, so there is no per-lease round to hold back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_lease_never_holds_back_the_others() {
    let mut s = Scenario::new(4).await;
    let proxy = FaultProxy::start(&dynamodb_endpoint(), Faults::NONE, 7)
        .await
        .unwrap();
    let log = RecordedBatches::default();
    let worker = worker_on(&s, "bh-1", client_through(&s.env, &proxy), &log)
        .renewal(kcl::LeaseRenewal::PerLease)
        .build()
        .unwrap();
    let handle = worker.handle();
    let task = tokio::spawn(worker.run());
    wait_ready(&handle, Duration::from_secs(60)).await;
    s.produce(10).await;
    let batches = wait_complete(|| log.all(), 10, Duration::from_secs(60)).await;
    verify(&batches, KEYS, 10).assert_correct();

    let hung = "shardId-000000000000";
    proxy.set_blackhole(Some(hung));
    let before = counters(&s).await;
    // Six renew intervals (2 s each at a 6 s lease).
    tokio::time::sleep(LEASE * 2).await;
    s.produce(10).await;
    tokio::time::sleep(LEASE).await;
    let after = counters(&s).await;
    let status = handle.status();
    println!(
        "blackhole on {hung}: {} requests swallowed; renewals per lease over {:?}: {:?}; lease counters {:?}",
        proxy.counts().blackholed,
        LEASE * 3,
        after
            .iter()
            .map(|(k, v)| (k.clone(), v - before[k]))
            .collect::<std::collections::BTreeMap<_, _>>(),
        status.leases
    );
    assert!(
        proxy.counts().blackholed > 0,
        "the blackhole swallowed nothing"
    );
    assert_eq!(
        after[hung], before[hung],
        "nothing of the hung lease applied"
    );
    for (key, n) in &after {
        if key != hung {
            // 18 s of 2 s rounds: 9 renewals; a wide margin for a busy machine.
            assert!(
                n - before[key] >= 4,
                "{key}: only {} renewals while another lease hung",
                n - before[key]
            );
        }
    }
    assert!(
        status.leases.fenced >= 1,
        "the hung tenure fenced: {:?}",
        status.leases
    );
    assert_eq!(status.consuming.len(), 3, "{:?}", status.consuming);

    proxy.set_blackhole(None);
    let batches = wait_complete(|| log.all(), 20, Duration::from_secs(90)).await;
    handle.shutdown();
    task.await.unwrap().unwrap();
    verify(&batches, KEYS, 20).assert_correct();
}

/// A lease item nobody can read (its counter stored as a string, a hand
/// edit) is skipped with a metric naming the key: the worker still starts,
/// syncs and consumes every other shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_lease_item_never_fails_startup_or_sync() {
    let mut s = Scenario::new(2).await;
    kcl_tests::create_lease_table(s.env.dynamodb(), &s.app)
        .await
        .unwrap();
    let bad = "shardId-000000000000";
    s.env
        .dynamodb()
        .put_item()
        .table_name(&s.app)
        .item("leaseKey", AttributeValue::S(bad.into()))
        .item("leaseCounter", AttributeValue::S("seven".into()))
        .item("checkpoint", AttributeValue::S("TRIM_HORIZON".into()))
        .send()
        .await
        .unwrap();
    s.produce(10).await;
    let log = RecordedBatches::default();
    let (handle, addr, task) = start_serving_metrics(
        worker_on(&s, "bad-1", s.env.dynamodb().clone(), &log)
            .shard_sync_interval(Duration::from_secs(2)),
    );
    wait_ready(&handle, Duration::from_secs(60)).await;
    // Several periodic syncs pass over the bad item too; the readable
    // shard is read by then, or soon after on a busy machine.
    let synced = Instant::now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    while handle.status().consuming.is_empty() || log.all().is_empty() {
        assert!(
            synced.elapsed() < Duration::from_secs(60),
            "the readable shard is never read: {:?}",
            handle.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !task.is_finished(),
        "the worker stopped: {:?}",
        handle.status()
    );
    assert_eq!(handle.status().consuming, ["shardId-000000000001"]);
    let batches = log.all();
    assert!(
        batches.iter().all(|b| b.shard == "shardId-000000000001") && !batches.is_empty(),
        "the readable shard is consumed"
    );
    let (status, metrics) = http_get(addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    let malformed = metrics
        .lines()
        .find(|l| l.starts_with("kcl_lease_items_malformed_total") && l.contains(bad))
        .unwrap_or_else(|| panic!("no metric names the bad item:\n{metrics}"));
    println!("unreadable item: {malformed}");
    handle.shutdown();
    task.await.unwrap().unwrap();
}

/// A peer starts stealing leases from a process that is told to stop right
/// then, before its renewer notices (a rolling restart: the new pod steals
/// while the old one stops). The stopping process's releases find the
/// thief owning the leases; it completes the handoffs it is the checkpoint
/// owner of, after its processor checkpointed, so the thief starts at once
/// (a completed handoff, not one forced at the timeout) and nothing repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_right_after_a_peers_steal_completes_the_handoff() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-steal-term");
    // Checkpoints only in shutdown_requested: a forced handoff would repeat
    // the victim's records; a completed one repeats none.
    let cfg = s.processes(E2E_WORKER, &out, CheckpointMode::OnShutdown);
    let mut victim = cfg.spawn("st-1").unwrap();
    s.produce(20).await;
    kcl_tests::e2e::wait_all_owned_by(&s, &["st-1"].into(), 4).await;
    s.produce(10).await;
    let mut thief = cfg.spawn("st-2").unwrap();
    // The moment the thief's first handoff write lands, the victim gets
    // SIGTERM: its renewer (every 2 s) has almost surely not seen it yet.
    let started = Instant::now();
    loop {
        if checkpoint_owners(&s).await.iter().any(|o| o == "st-1") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the newcomer never started a handoff"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let termed = Instant::now();
    victim.terminate(Duration::from_secs(30)).await.unwrap();
    let stats = process_stats(&out, "st-1");
    kcl_tests::e2e::wait_all_owned_by(&s, &["st-2"].into(), 4).await;
    let picked_up = termed.elapsed();
    s.produce(10).await;
    let per_key = s.produced;
    let batches = wait_complete(
        || read_logs(&out).unwrap(),
        per_key,
        Duration::from_secs(90),
    )
    .await;
    terminate(&mut thief).await;
    let thief_stats = process_stats(&out, "st-2");
    let verdict = verify(&batches, KEYS, per_key);
    println!(
        "SIGTERM after a steal: the thief owned every lease {picked_up:?} after the SIGTERM; \
         victim {stats}; thief {thief_stats}; duplicates {}",
        verdict.duplicates
    );
    verdict.assert_correct();
    assert!(stat(&thief_stats, "stolen") >= 1, "{thief_stats}");
    assert_eq!(
        stat(&thief_stats, "handoffs_forced"),
        0,
        "a handoff was left to its timeout: {thief_stats}"
    );
    assert_eq!(
        stat(&thief_stats, "handoffs_completed"),
        stat(&thief_stats, "stolen"),
        "{thief_stats}"
    );
    assert_eq!(verdict.duplicates, 0, "a completed handoff repeats nothing");
}

async fn terminate(p: &mut WorkerProcess) {
    p.terminate(Duration::from_secs(30)).await.unwrap();
}

/// The `checkpointOwner` of every lease in a handoff.
async fn checkpoint_owners(s: &Scenario) -> Vec<String> {
    s.lease_items()
        .await
        .iter()
        .filter_map(|i| i.get("checkpointOwner")?.as_s().ok().cloned())
        .collect()
}

/// The lease table throttles every call while a worker starts (a fleet
/// restarting on a provisioned table). The worker does not exit: it
/// retries with capped backoff while `/readyz` says why, becomes ready
/// once the throttling stops, and consumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_under_injected_throttling_reaches_ready() {
    let mut s = Scenario::new(2).await;
    let proxy = FaultProxy::start(
        &dynamodb_endpoint(),
        Faults {
            throttle: 1.0,
            ..Faults::NONE
        },
        11,
    )
    .await
    .unwrap();
    let log = RecordedBatches::default();
    let (handle, addr, task) =
        start_serving_metrics(worker_on(&s, "thr-1", client_through(&s.env, &proxy), &log));
    let started = Instant::now();
    let reason = loop {
        let (status, body) = http_get(addr, "/readyz").await.unwrap();
        assert_eq!(status, 503, "ready while every call is throttled: {body}");
        if body.contains("throttl") {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "/readyz never said why: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!task.is_finished(), "the worker exited under throttling");
    let throttled = proxy.counts().throttles;
    proxy.set_faults(Faults::NONE);
    wait_ready(&handle, Duration::from_secs(60)).await;
    let (status, _) = http_get(addr, "/readyz").await.unwrap();
    assert_eq!(status, 200);
    s.produce(10).await;
    let batches = wait_complete(|| log.all(), 10, Duration::from_secs(60)).await;
    handle.shutdown();
    task.await.unwrap().unwrap();
    verify(&batches, KEYS, 10).assert_correct();
    println!(
        "startup under throttling: {throttled} calls throttled before it healed; /readyz said: {reason}"
    );
    assert!(throttled >= 3, "the startup retried: {throttled}");
}
