use super::*;
use crate::error::ErrorKind;
use crate::test_support::{NoOp, offline_sdk};
use kcl_core::LeaseLayout;
use kcl_core::worker::StreamSpec;

fn offline_builder() -> WorkerBuilder {
    Worker::builder("facade-app")
        .stream("orders")
        .sdk_config(&offline_sdk())
        .processor(|_: &kcl_core::processor::ShardContext| NoOp)
}

#[test]
fn every_setting_given_to_the_facade_reaches_the_engine() {
    let worker = offline_builder()
        .worker_id("w-1")
        .lease_duration(Duration::from_secs(20))
        .renew_interval(Duration::from_secs(4))
        .renewal(LeaseRenewal::PerLease)
        .taker_interval(Duration::from_secs(3))
        .max_leases_per_worker(9)
        .max_leases_to_steal(2)
        .handoff_timeout(Duration::from_secs(40))
        .initial_position(InitialPosition::TrimHorizon)
        .parallelism_per_shard(7)
        .shard_sync_interval(Duration::from_secs(11))
        .parent_poll_interval(Duration::from_secs(12))
        .shutdown_timeout(Duration::from_secs(13))
        .completed_lease_retention(Duration::from_secs(14))
        .removed_stream_policy(RemovedStreamPolicy::DeleteAfter(Duration::from_secs(15)))
        .max_records(77)
        .idle_time_between_reads(Duration::from_millis(1500))
        .time_between_reads(Duration::from_millis(700))
        .build()
        .expect("valid settings");
    let lease = &worker.lease;
    assert_eq!(lease.worker_id(), "w-1");
    assert_eq!(lease.lease_duration(), Duration::from_secs(20));
    assert_eq!(lease.renew_interval(), Duration::from_secs(4));
    assert_eq!(lease.renewal(), LeaseRenewal::PerLease);
    assert_eq!(lease.taker_interval(), Duration::from_secs(3));
    assert_eq!(lease.max_leases_per_worker(), 9);
    assert_eq!(lease.max_leases_to_steal(), 2);
    assert_eq!(lease.handoff_timeout(), Duration::from_secs(40));
    let polling = worker.source.polling_config();
    assert_eq!(polling.max_records(), 77);
    assert_eq!(
        polling.idle_time_between_reads(),
        Duration::from_millis(1500)
    );
    assert_eq!(polling.time_between_reads(), Duration::from_millis(700));
    let engine = worker
        .engine
        .clone()
        .stream(StreamSpec {
            name: "orders".into(),
            layout: LeaseLayout::SingleStream,
        })
        .build()
        .expect("the streams were all that was left");
    assert_eq!(
        engine.lease(),
        lease,
        "the engine runs the lease settings built here"
    );
    let shown = format!("{engine:?}");
    for expected in [
        "initial_position: TrimHorizon",
        "parallelism_per_shard: 7",
        "shard_sync_interval: 11s",
        "parent_poll_interval: 12s",
        "shutdown_timeout: 13s",
        "completed_lease_retention: 14s",
        "removed_stream_policy: DeleteAfter(15s)",
    ] {
        assert!(shown.contains(expected), "{expected} in {shown}");
    }
}

#[test]
fn build_names_the_field_of_an_engine_setting_it_rejects() {
    let cases: Vec<(WorkerBuilder, &str)> = vec![
        (offline_builder().worker_id(" "), "worker_id"),
        (
            offline_builder().renew_interval(Duration::from_secs(60)),
            "renew_interval",
        ),
        (
            offline_builder().parallelism_per_shard(0),
            "parallelism_per_shard",
        ),
        (
            offline_builder().shard_sync_interval(Duration::ZERO),
            "shard_sync_interval",
        ),
        (offline_builder().max_records(0), "max_records"),
        (offline_builder().prefetch_budget(10), "prefetch_budget"),
        // More than a budget can count: it panicked in `build()`.
        (
            offline_builder().prefetch_budget(usize::MAX),
            "prefetch_budget",
        ),
        (offline_builder().stream("orders"), "streams"),
        (offline_builder().stream(" "), "streams"),
        (
            offline_builder()
                .enhanced_fan_out()
                .time_between_reads(Duration::from_secs(1)),
            "time_between_reads",
        ),
    ];
    for (builder, field) in cases {
        match builder.build() {
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Config, "{field}: {e}");
                assert_eq!(e.config().map(|c| c.field), Some(field), "{e}");
            }
            Ok(_) => panic!("{field}: accepted"),
        }
    }
}

/// A lease-table client given with `.clients()` gets kcl's timeouts where
/// its own leave them unset, and keeps those it sets. Before, such a
/// client was used as it came, and with the SDK's defaults (no attempt
/// timeout) a startup check of the tables stuck on a dead connection held
/// the worker for good.
#[test]
fn a_given_lease_table_client_gets_the_timeouts_it_leaves_unset() {
    use aws_config::timeout::TimeoutConfig;
    let sdk = offline_sdk();
    let with = |dynamodb: aws_sdk_dynamodb::Client| {
        Worker::builder("facade-app")
            .stream("orders")
            .clients(aws_sdk_kinesis::Client::new(&sdk), dynamodb)
            .processor(|_: &kcl_core::processor::ShardContext| NoOp)
            .build()
            .unwrap()
    };
    let bare = with(aws_sdk_dynamodb::Client::new(&sdk));
    let timeouts = bare.dynamodb.config().timeout_config().cloned().unwrap();
    let half = bare.lease.store_timeout() / 2;
    assert_eq!(timeouts.operation_attempt_timeout(), Some(half));
    assert_eq!(timeouts.connect_timeout(), Some(Duration::from_secs(2)));
    let own = TimeoutConfig::builder()
        .operation_attempt_timeout(Duration::from_secs(7))
        .build();
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk)
        .timeout_config(own)
        .build();
    let set = with(aws_sdk_dynamodb::Client::from_conf(config));
    let timeouts = set.dynamodb.config().timeout_config().cloned().unwrap();
    assert_eq!(
        timeouts.operation_attempt_timeout(),
        Some(Duration::from_secs(7))
    );
}

/// A worker run in a task of its own against endpoints nobody answers,
/// once its startup checks retry: its handle and its task.
async fn retrying_startup() -> (
    WorkerHandle,
    tokio::task::JoinHandle<Result<(), crate::Error>>,
) {
    let sdk = offline_sdk()
        .into_builder()
        .endpoint_url("http://127.0.0.1:9")
        .build();
    let worker = offline_builder().sdk_config(&sdk).build().expect("valid");
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    while handle.status().starting.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (handle, run)
}

/// A shutdown asked for while the startup checks still retry (no endpoint
/// answers) ends the run, and its waiters get a report: only the engine
/// published one, so `shutdown_and_wait` waited forever.
#[tokio::test]
async fn a_shutdown_during_startup_is_reported_to_its_waiters() {
    let (handle, run) = retrying_startup().await;
    // A guard against a hang, not a bound on how long it takes.
    let report = tokio::time::timeout(Duration::from_secs(120), handle.shutdown_and_wait())
        .await
        .expect("the waiter is told the worker stopped");
    assert!(report.graceful);
    assert_eq!((report.drained, report.released), (0, 0));
    run.await
        .expect("no panic")
        .expect("a shutdown, not an error");
}

/// A run dropped while its startup checks still retry (an aborted task,
/// an outer timeout) still tells its waiters it stopped, not gracefully:
/// neither the engine nor the startup's end published a report, and
/// `stopped` waited forever.
#[tokio::test]
async fn a_run_dropped_during_startup_is_reported_to_its_waiters() {
    let (handle, run) = retrying_startup().await;
    run.abort();
    // A guard against a hang, not a bound on how long it takes.
    let report = tokio::time::timeout(Duration::from_secs(120), handle.stopped())
        .await
        .expect("the waiter is told the worker stopped");
    assert!(!report.graceful, "{report:?}");
}
