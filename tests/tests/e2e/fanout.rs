//! Enhanced fan-out against the emulators: what kinesis-mock's
//! `SubscribeToShard` does, then whole workers in fan-out mode (every
//! record of several shards, resubscriptions mid-stream, a split followed
//! from parent to children), checked with the acceptance verifier.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use aws_sdk_kinesis::types::{
    ConsumerStatus, ShardIteratorType, StartingPosition, SubscribeToShardEventStream,
};
use kcl::{DeregisterConsumer, FanOutConfig, Retrieval, SourceStats, Worker};
use kcl_tests::e2e::{
    BatchLog, KEYS, RecordedBatches, Running, Scenario, complete_then_shut_down, shard_span_ns,
    start,
};
use kcl_tests::{
    TestEnv, create_stream, delete_stream, list_all_shards, put_sequenced_records, stream_arn,
    unique_name, until_active,
};

// ---------------------------------------------------------------------------
// The emulator
// ---------------------------------------------------------------------------

/// Subscribes to `shard` from `position`.
async fn subscribe(
    kinesis: &aws_sdk_kinesis::Client,
    consumer_arn: &str,
    shard: &str,
    position: ShardIteratorType,
) -> anyhow::Result<aws_sdk_kinesis::operation::subscribe_to_shard::SubscribeToShardOutput> {
    Ok(kinesis
        .subscribe_to_shard()
        .consumer_arn(consumer_arn)
        .shard_id(shard)
        .starting_position(StartingPosition::builder().r#type(position).build()?)
        .send()
        .await?)
}

/// What kcl's fan-out reader relies on, and the ways kinesis-mock differs
/// from AWS (see the comments): if this fails, fix the emulator setup
/// before debugging kcl.
#[tokio::test]
async fn the_emulator_serves_subscribe_to_shard_over_plain_http() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("fo-probe");
    create_stream(kinesis, &stream, 1).await?;
    put_sequenced_records(kinesis, &stream, 2, 5).await?;
    let arn = stream_arn(kinesis, &stream).await?;

    // Registration: CREATING, then ACTIVE; a second one is ResourceInUse.
    let registered = kinesis
        .register_stream_consumer()
        .stream_arn(&arn)
        .consumer_name("probe")
        .send()
        .await?;
    let consumer_arn = registered
        .consumer()
        .context("consumer")?
        .consumer_arn()
        .to_owned();
    let stream_arn = arn.as_str();
    until_active(
        "consumer probe",
        Duration::from_secs(10),
        move || async move {
            let d = kinesis
                .describe_stream_consumer()
                .stream_arn(stream_arn)
                .consumer_name("probe")
                .send()
                .await?;
            Ok(d.consumer_description().map(|c| c.consumer_status())
                == Some(&ConsumerStatus::Active))
        },
    )
    .await?;
    let again = kinesis
        .register_stream_consumer()
        .stream_arn(&arn)
        .consumer_name("probe")
        .send()
        .await;
    ensure!(
        again
            .as_ref()
            .err()
            .and_then(|e| e.as_service_error())
            .is_some_and(|e| e.is_resource_in_use_exception()),
        "registering twice: {again:?}"
    );

    let shard = list_all_shards(kinesis, &stream).await?.remove(0);
    let shard = shard.shard_id();
    let started = tokio::time::Instant::now();
    let mut first = subscribe(
        kinesis,
        &consumer_arn,
        shard,
        ShardIteratorType::TrimHorizon,
    )
    .await?;
    // kinesis-mock sends no initial-response: `send()` returns with its
    // first event, a tick (1 s) after the call. AWS answers at once.
    println!("subscribed after {:?}", started.elapsed());

    // A second subscription of the same consumer and shard fails with
    // ResourceInUse, sent as an exception *inside* an HTTP 200 event
    // stream (AWS: HTTP 400 within 5 s of the first, a takeover after).
    let mut second = subscribe(
        kinesis,
        &consumer_arn,
        shard,
        ShardIteratorType::TrimHorizon,
    )
    .await?;
    match second.event_stream.recv().await {
        Err(e)
            if e.as_service_error()
                .is_some_and(|e| e.is_resource_in_use_exception()) => {}
        other => bail!("second subscription: {other:?}"),
    }

    // Events: records, a continuation sequence number, one per second
    // even when empty; never child shards (see the split test).
    let mut records = 0;
    let mut continuation = String::new();
    for _ in 0..3 {
        match first.event_stream.recv().await? {
            Some(SubscribeToShardEventStream::SubscribeToShardEvent(e)) => {
                records += e.records().len();
                ensure!(!e.continuation_sequence_number().is_empty(), "{e:?}");
                ensure!(e.child_shards().is_empty(), "{e:?}");
                continuation = e.continuation_sequence_number().to_owned();
            }
            other => bail!("unexpected event {other:?}"),
        }
    }
    ensure!(records == 10, "read {records} of 10 records");

    // The subscription is released when the client goes away, but only
    // once the emulator next writes to the dead connection (within about
    // a second): until then a new one is ResourceInUse.
    drop(first);
    let after = async {
        loop {
            let mut out = kinesis
                .subscribe_to_shard()
                .consumer_arn(&consumer_arn)
                .shard_id(shard)
                .starting_position(
                    StartingPosition::builder()
                        .r#type(ShardIteratorType::AfterSequenceNumber)
                        .sequence_number(&continuation)
                        .build()?,
                )
                .send()
                .await?;
            match out.event_stream.recv().await {
                Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(e))) => {
                    return anyhow::Ok(e.records().len());
                }
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|e| e.is_resource_in_use_exception()) => {}
                other => bail!("resubscribing: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let released = tokio::time::Instant::now();
    let repeated = tokio::time::timeout(Duration::from_secs(10), after).await??;
    println!(
        "resubscribed {:?} after dropping the first",
        released.elapsed()
    );
    ensure!(
        repeated == 0,
        "AFTER the continuation repeated {repeated} records"
    );

    delete_stream(kinesis, &stream).await
}

// ---------------------------------------------------------------------------
// Workers in fan-out mode
// ---------------------------------------------------------------------------

/// Starts worker `id` reading in fan-out mode with `fan_out` and logging
/// into `log`: its source's statistics, and the running worker.
fn start_fan_out_worker(
    s: &Scenario,
    id: &str,
    log: &RecordedBatches,
    fan_out: FanOutConfig,
) -> (Arc<SourceStats>, Vec<Running>) {
    let worker = s
        .worker(id)
        .parent_poll_interval(Duration::from_secs(1))
        .retrieval(Retrieval::FanOut(fan_out))
        .processor(log.factory())
        .build()
        .unwrap();
    (worker.source_stats(), vec![start(worker)])
}

/// The application's consumer as the emulator lists it.
async fn consumer_status(s: &Scenario) -> Option<ConsumerStatus> {
    let arn = stream_arn(s.env.kinesis(), &s.stream).await.unwrap();
    let out = s
        .env
        .kinesis()
        .describe_stream_consumer()
        .stream_arn(arn)
        .consumer_name(&s.app)
        .send()
        .await
        .ok()?;
    out.consumer_description()
        .map(|c| c.consumer_status().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fan_out_worker_processes_every_record_of_several_shards() {
    let mut s = Scenario::new(4).await;
    s.produce(30).await;
    let log = RecordedBatches::default();
    // No closed-shard checks: they would be the only GetRecords calls.
    let fan_out = FanOutConfig::builder()
        .closed_shard_check_interval(None)
        .build()
        .unwrap();
    let (stats, running) = start_fan_out_worker(&s, "f-1", &log, fan_out);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        s.produce(20).await;
    }
    let per_key = s.produced;
    let (_, verdict) = complete_then_shut_down(&s, &log, running, Duration::from_secs(90)).await;
    let stats = stats.snapshot();
    println!(
        "fan-out, 4 shards: {} records, duplicates {}, {stats:?}",
        per_key * u64::from(KEYS),
        verdict.duplicates
    );
    verdict.assert_correct();
    assert_eq!(verdict.duplicates, 0);
    assert!(stats.subscribe_calls >= 4, "{stats:?}");
    assert_eq!(stats.get_records_calls, 0, "fan-out reads no GetRecords");
    assert!(stats.records >= per_key * u64::from(KEYS));
    // Named after the application, and left registered for the other
    // workers.
    assert_eq!(consumer_status(&s).await, Some(ConsumerStatus::Active));
    assert!(s.owners().await.iter().all(Option::is_none));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forced_resubscribe_mid_stream_loses_and_repeats_nothing() {
    let mut s = Scenario::new(2).await;
    let log = RecordedBatches::default();
    let fan_out = FanOutConfig::builder()
        .subscription_lifetime(Duration::from_secs(3))
        .build()
        .unwrap();
    let (stats, running) = start_fan_out_worker(&s, "r-1", &log, fan_out);
    // Produce for about four lifetimes, so subscriptions end mid-stream.
    s.produce_paced(24, 1, Duration::from_millis(500)).await;
    let (_, verdict) = complete_then_shut_down(&s, &log, running, Duration::from_secs(90)).await;
    let stats = stats.snapshot();
    println!(
        "resubscribing every 3 s: duplicates {}, {stats:?}",
        verdict.duplicates
    );
    verdict.assert_correct();
    assert_eq!(verdict.duplicates, 0, "a resubscription repeats nothing");
    assert!(stats.resubscribes > 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_during_fan_out_is_followed_from_parent_to_children() {
    let mut s = Scenario::new(1).await;
    let log = RecordedBatches::default();
    // kinesis-mock never announces a shard's end in an event: the
    // closed-shard check finds it.
    let fan_out = FanOutConfig::builder()
        .closed_shard_check_interval(Some(Duration::from_secs(1)))
        .build()
        .unwrap();
    let (stats, running) = start_fan_out_worker(&s, "x-1", &log, fan_out);
    s.produce_paced(4, 5, Duration::from_millis(500)).await;
    let (parent, children) = s.split_first_shard().await;
    assert_eq!(children.len(), 2);
    s.produce_paced(4, 5, Duration::from_millis(500)).await;
    let (batches, verdict) =
        complete_then_shut_down(&s, &log, running, Duration::from_secs(120)).await;
    println!(
        "fan-out split: duplicates {}, {:?}",
        verdict.duplicates,
        stats.snapshot()
    );
    verdict.assert_correct();
    assert_eq!(verdict.duplicates, 0);

    // Parent first: no child batch starts before the parent's last one.
    let (_, parent_last) = shard_span_ns(&batches, &parent).unwrap();
    let child_batches: Vec<&BatchLog> = batches
        .iter()
        .filter(|b| children.contains(&b.shard) && !b.records.is_empty())
        .collect();
    assert!(!child_batches.is_empty(), "the children were read");
    assert!(
        child_batches.iter().all(|b| b.start_ns >= parent_last),
        "a child was processed before its parent's end"
    );
}

/// With [`DeregisterConsumer::OnShutdown`], `shutdown_and_wait` returns
/// only once the stream consumer is deregistered, so a `main` that
/// returns then leaves none behind. The run is polled here beside the
/// wait, on one thread, and dropped the moment the wait returns, as a
/// returning `main` drops it. The report used to come first: the run was
/// dropped before its deregistration and the consumer stayed ACTIVE.
#[tokio::test]
async fn shutdown_and_wait_returns_after_the_stream_consumer_is_deregistered() {
    let mut s = Scenario::new(1).await;
    s.produce(5).await;
    let log = RecordedBatches::default();
    let fan_out = FanOutConfig::builder()
        .closed_shard_check_interval(None)
        .deregister(DeregisterConsumer::OnShutdown)
        .build()
        .unwrap();
    let worker = s
        .worker("d-1")
        .retrieval(Retrieval::FanOut(fan_out))
        .processor(log.factory())
        .build()
        .unwrap();
    let handle = worker.handle();
    let mut run = Box::pin(worker.run());
    let read = async {
        while log.all().is_empty() || consumer_status(&s).await != Some(ConsumerStatus::Active) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        ended = &mut run => panic!("the worker ended before reading: {ended:?}"),
        () = read => {}
    }
    let report = tokio::select! {
        biased;
        report = handle.shutdown_and_wait() => report,
        ended = &mut run => {
            ended.unwrap();
            handle.stopped().await
        }
    };
    drop(run);
    assert!(report.graceful, "{report:?}");
    let status = consumer_status(&s).await;
    assert_ne!(
        status,
        Some(ConsumerStatus::Active),
        "the stream consumer is still registered once shutdown_and_wait returned"
    );
}

#[test]
fn fan_out_settings_are_validated_at_build() {
    let conf = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .build();
    let builder = |app: &str| {
        Worker::builder(app)
            .stream("s")
            .sdk_config(&conf)
            .processor(RecordedBatches::default().factory())
    };
    let cases: Vec<(kcl::WorkerBuilder, &str)> = vec![
        // A polling knob next to fan-out would be silently ignored.
        (
            builder("ok-app").enhanced_fan_out().max_records(10),
            "max_records",
        ),
        (
            builder("ok-app")
                .retrieval(Retrieval::Polling(kcl::PollingConfig::default()))
                .idle_time_between_reads(Duration::from_millis(10)),
            "idle_time_between_reads",
        ),
        // The consumer is named after the application by default; a table
        // name may be longer than a consumer name.
        (
            builder(&"a".repeat(200)).enhanced_fan_out(),
            "consumer_name",
        ),
    ];
    for (builder, field) in cases {
        let err = builder.build().unwrap_err().to_string();
        assert!(err.contains(field), "error should name `{field}`: {err}");
    }
    let worker = builder("ok-app").enhanced_fan_out().build().unwrap();
    assert_eq!(worker.source_stats().snapshot().subscribe_calls, 0);
}
