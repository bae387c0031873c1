//! The worker's metrics endpoint against the emulators: `/metrics` carries
//! the per-shard lag and the leases held with their labels, `/healthz`
//! answers, and `/readyz` follows the worker's life: 503 while starting,
//! 200 once ready, 503 while draining, gone once stopped.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kcl::{
    Checkpointer, InitialPosition, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
    Worker,
};
use kcl_tests::{TestEnv, create_stream, http_get as get, put_sequenced_records, unique_name};
use tokio::time::Instant;

// The deploy/ alert rules and dashboard, and a hung processor seen through
// the probes, the metrics and a real Prometheus (in their own files).
mod alert_rules;
mod fleet;
mod hung_processor;
mod prometheus_alerts;

mod cloudwatch;
mod otlp;

/// Shuts the worker down and waits for its run to end without an error,
/// within 60 s: the exporters' final flush is part of that.
async fn stop_within_60s(
    handle: &kcl::WorkerHandle,
    run: tokio::task::JoinHandle<Result<(), kcl::Error>>,
) {
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the worker stops within 60 s")
        .unwrap()
        .unwrap();
}

/// One sample of the text exposition format.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses `name{a="x",b="y"} value` lines (label values here never hold
/// quotes or commas).
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|p| !p.is_empty())
                .filter_map(|pair| {
                    let (k, v) = pair.split_once('=')?;
                    Some((k.to_owned(), v.trim_matches('"').to_owned()))
                })
                .collect();
            Some(Sample {
                name: name.to_owned(),
                labels,
                value: value.parse().ok()?,
            })
        })
        .collect()
}

fn find<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// Counts records once their batch is checkpointed (every batch is); with
/// a `drain`, takes that long in `shutdown_requested` so the drain can be
/// observed. Shared by this binary's tests.
struct Counting {
    processed: Arc<AtomicU64>,
    drain: Duration,
}

impl Counting {
    /// A processor factory: every shard's processor counts into `processed`.
    fn factory(
        processed: &Arc<AtomicU64>,
        drain: Duration,
    ) -> impl Fn(&ShardContext) -> Counting + Send + Sync + 'static {
        let processed = Arc::clone(processed);
        move |_: &ShardContext| Counting {
            processed: Arc::clone(&processed),
            drain,
        }
    }
}

#[kcl::async_trait]
impl RecordProcessor for Counting {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        checkpointer.checkpoint().await?;
        self.processed
            .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        tokio::time::sleep(self.drain).await;
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

async fn wait_for<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_probes_follow_the_worker() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let stream = unique_name("kcl-obs");
    let app = unique_name("kcl-obs-app");
    create_stream(env.kinesis(), &stream, 2).await.unwrap();
    let processed = Arc::new(AtomicU64::new(0));
    let worker_id = unique_name("obs-worker");
    let worker = Worker::builder(&app)
        .stream(&stream)
        .sdk_config(env.sdk_config())
        .worker_id(&worker_id)
        .initial_position(InitialPosition::TrimHorizon)
        .lease_duration(Duration::from_secs(6))
        .taker_interval(Duration::from_secs(1))
        .idle_time_between_reads(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_secs(10))
        .serve_metrics("127.0.0.1:0".parse().unwrap())
        .processor(Counting::factory(&processed, Duration::from_secs(2)))
        .build()
        .unwrap();
    let addr = worker.metrics_addr().unwrap();
    assert_ne!(addr.port(), 0, "the bound port is reported");
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());

    // Ready once the startup checks pass and the table answers. (Whether
    // the first probe still sees "starting" depends on how fast the
    // emulators are; `a_worker_that_cannot_start_is_not_ready` pins that.)
    let mut statuses = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((status, body)) = get(addr, "/readyz").await {
            statuses.push((status, body));
            if status == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "not ready in 30s: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (status, body) in &statuses {
        assert!(
            *status == 200 || (*status == 503 && body.contains("starting")),
            "{status} {body}"
        );
    }
    assert_eq!(
        get(addr, "/healthz").await.unwrap(),
        (200, "ok\n".to_owned())
    );
    assert_eq!(get(addr, "/nope").await.unwrap().0, 404);

    // Records flow; then the per-shard lag and the leases held show with
    // their labels.
    let sent = put_sequenced_records(env.kinesis(), &stream, 4, 5)
        .await
        .unwrap();
    let shards: Vec<String> = {
        let mut s: Vec<String> = sent.iter().map(|r| r.shard_id.clone()).collect();
        s.sort();
        s.dedup();
        s
    };
    wait_for("every record processed", Duration::from_secs(30), || {
        let processed = Arc::clone(&processed);
        async move { processed.load(Ordering::Relaxed) >= 20 }
    })
    .await;
    // Both leases are held by now (records were processed from every
    // shard that got some). The batch histogram is recorded once
    // `process_records` returned and its checkpoint was written, a moment
    // after the processor counted the record: wait for it too.
    let deadline = Instant::now() + Duration::from_secs(20);
    let samples = loop {
        let (status, body) = get(addr, "/metrics").await.unwrap();
        assert_eq!(status, 200);
        let samples = parse(&body);
        let held = find(&samples, "kcl_leases_held", &[("worker", &worker_id)]);
        let timed = find(
            &samples,
            "kcl_batch_processing_seconds_count",
            &[("stream", &stream)],
        );
        let batches_timed: f64 = timed.iter().map(|s| s.value).sum();
        let batches_with_records = find(
            &samples,
            "kcl_records_per_batch_count",
            &[("stream", &stream)],
        )
        .iter()
        .map(|s| s.value)
        .sum::<f64>();
        if held.first().is_some_and(|s| s.value == 2.0)
            && batches_timed > 0.0
            && batches_timed >= batches_with_records
        {
            break samples;
        }
        assert!(
            Instant::now() < deadline,
            "leases held: {held:?}; batches timed {batches_timed} of {batches_with_records}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for shard in &shards {
        let lag = find(
            &samples,
            "kcl_millis_behind_latest",
            &[("stream", &stream), ("shard", shard)],
        );
        assert_eq!(lag.len(), 1, "one lag gauge for {shard}: {lag:?}");
        assert!(
            (0.0..86_400_000.0).contains(&lag[0].value),
            "plausible lag for {shard}: {}",
            lag[0].value
        );
        let fetched = find(
            &samples,
            "kcl_kinesis_get_records_calls_total",
            &[("stream", &stream), ("shard", shard)],
        );
        assert!(
            fetched.first().is_some_and(|s| s.value >= 1.0),
            "{fetched:?}"
        );
    }
    let records: f64 = find(
        &samples,
        "kcl_records_processed_total",
        &[("stream", &stream)],
    )
    .iter()
    .inspect(|s| assert!(s.labels.contains_key("shard"), "{s:?}"))
    .map(|s| s.value)
    .sum();
    assert_eq!(records, 20.0);
    let acquired = find(
        &samples,
        "kcl_leases_acquired_total",
        &[("worker", &worker_id), ("how", "taken")],
    );
    assert!(
        acquired.first().is_some_and(|s| s.value >= 2.0),
        "{acquired:?}"
    );
    // Histograms are real histograms (aggregatable across a fleet).
    assert!(
        !find(
            &samples,
            "kcl_batch_processing_seconds_bucket",
            &[("stream", &stream)]
        )
        .is_empty()
    );
    assert!(
        !find(
            &samples,
            "kcl_store_operations_total",
            &[("op", "checkpoint"), ("outcome", "ok")]
        )
        .is_empty()
    );

    // Draining: not ready any more, while the processors checkpoint.
    handle.shutdown();
    let deadline = Instant::now() + Duration::from_secs(5);
    let draining = loop {
        if let Ok((503, body)) = get(addr, "/readyz").await {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still 200 after shutdown()"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(draining.contains("shutting down"), "{draining}");
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Stopped with the worker: nothing listens any more.
    assert!(get(addr, "/healthz").await.is_err());
}

/// A worker stuck in its startup checks (its Kinesis endpoint accepts
/// connections and never answers) is alive but not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_start_is_not_ready() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    // The kernel accepts connections into the backlog; nobody answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let kinesis = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(env.sdk_config())
            .endpoint_url(format!("http://{}", silent.local_addr().unwrap()))
            .build(),
    );
    let worker = Worker::builder(unique_name("kcl-obs-stuck"))
        .stream("never-described")
        .clients(kinesis, env.dynamodb().clone())
        .serve_metrics("127.0.0.1:0".parse().unwrap())
        .processor(Counting::factory(&Arc::default(), Duration::ZERO))
        .build()
        .unwrap();
    let addr = worker.metrics_addr().unwrap();
    let run = tokio::spawn(worker.run());
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        if let Ok(answer) = get(addr, "/readyz").await {
            break answer;
        }
        assert!(Instant::now() < deadline, "the endpoint never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("starting"), "{body}");
    assert_eq!(get(addr, "/healthz").await.unwrap().0, 200);
    // Still not ready a while later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(get(addr, "/readyz").await.unwrap().0, 503);
    // Dropping the worker's future stops its endpoint too.
    run.abort();
    let _ = run.await;
    wait_for(
        "the endpoint closes",
        Duration::from_secs(5),
        || async move { get(addr, "/healthz").await.is_err() },
    )
    .await;
    drop(silent);
}
