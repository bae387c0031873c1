//! kcl's metrics pushed over OTLP/HTTP: a worker built with
//! `export_otlp_metrics` consumes a stream of the emulators and exports
//! to a collector on a local port (a hyper server that decodes each
//! `ExportMetricsServiceRequest` with the OTLP crate's generated types and
//! keeps it), which then holds kcl's metrics with their kinds, units,
//! descriptions, labels and resource, and the records-processed counter
//! sums to the records put.
//!
//! Each test runs in a process of its own (this test binary again, with
//! only that test selected): the builder installs the process's `metrics`
//! recorder, and the other tests of this binary install Prometheus's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kcl::metric_names;
use kcl::observability::OtlpMetrics;
use kcl::{InitialPosition, Worker};
use kcl_tests::{TestEnv, create_stream, http_get, put_sequenced_records, unique_name};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use tokio::time::Instant;

use crate::Counting;
use crate::fleet::ran_in_own_process;

/// The collector and the export readers of kcl's own OTLP tests.
#[path = "../../../crates/kcl/src/observability/otlp/tests/collector.rs"]
mod collector;

use collector::{
    Collector, Received, check_declared, double, exported, find, gauge_points, histogram_points,
    int, metrics_of, pairs, sum_points, unavailable,
};

const KEYS: u32 = 4;
const PER_KEY: u64 = 5;
const RECORDS: i64 = KEYS as i64 * PER_KEY as i64;

/// kcl's buckets for its `*_seconds` histograms and for records per batch.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const BATCH_BUCKETS: &[f64] = &[
    1.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

/// The exports the collector accepted.
fn accepted(collector: &Collector) -> Vec<Received> {
    let received = collector.received();
    received
        .iter()
        .filter(|r| r.status == 200)
        .cloned()
        .collect()
}

/// Attributes by key.
fn attributes(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    pairs(attributes).into_iter().collect()
}

fn has(attributes_: &[KeyValue], key: &str, value: &str) -> bool {
    attributes(attributes_).get(key).map(String::as_str) == Some(value)
}

/// The records-processed counter of `stream` in an export, summed over
/// its shards (0 if absent).
fn records_processed(request: &ExportMetricsServiceRequest, stream: &str) -> i64 {
    find(request, metric_names::RECORDS_PROCESSED).map_or(0, |m| {
        sum_points(m)
            .iter()
            .filter(|p| has(&p.attributes, "stream", stream))
            .map(int)
            .sum()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_pushes_its_metrics_to_an_otlp_collector() {
    if ran_in_own_process(
        module_path!(),
        "a_worker_pushes_its_metrics_to_an_otlp_collector",
        &[],
    )
    .await
    {
        return;
    }
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    // The first export is refused: the exporter retries it.
    let collector = Collector::start(vec![unavailable()]).await;
    let stream = unique_name("kcl-otlp");
    let app = unique_name("kcl-otlp-app");
    let worker_id = unique_name("otlp-worker");
    create_stream(env.kinesis(), &stream, 2).await.unwrap();
    let otlp = OtlpMetrics::new(collector.endpoint())
        .interval(Duration::from_millis(500))
        .header("x-tenant", "team-a")
        .resource_attribute("deployment.environment", "test");
    let processed = Arc::new(AtomicU64::new(0));
    let builder = || {
        let processed = Arc::clone(&processed);
        Worker::builder(&app)
            .stream(&stream)
            .sdk_config(env.sdk_config())
            .processor(Counting::factory(&processed, Duration::ZERO))
    };
    let worker = builder()
        .worker_id(&worker_id)
        .initial_position(InitialPosition::TrimHorizon)
        .lease_duration(Duration::from_secs(6))
        .taker_interval(Duration::from_secs(1))
        .idle_time_between_reads(Duration::from_millis(200))
        .serve_health("127.0.0.1:0".parse().unwrap())
        .export_otlp_metrics(otlp.clone())
        .build()
        .unwrap();
    let exporter = worker.otlp_exporter().expect("the worker exports");
    assert_eq!(exporter.url().path(), "/v1/metrics");

    // One recorder per process: another worker of it shares the exporter
    // if it asks for the same export, and fails to build otherwise.
    let same = builder().export_otlp_metrics(otlp.clone()).build().unwrap();
    assert_eq!(
        same.otlp_exporter().map(|e| e.url().clone()),
        Some(exporter.url().clone())
    );
    let other = builder()
        .export_otlp_metrics(OtlpMetrics::new("http://127.0.0.1:9"))
        .build()
        .expect_err("other export settings");
    assert_eq!(
        other.config().map(|c| c.field),
        Some("export_otlp_metrics"),
        "{other}"
    );
    let prometheus = builder()
        .serve_metrics("127.0.0.1:0".parse().unwrap())
        .build()
        .expect_err("a second recorder");
    assert_eq!(
        prometheus.config().map(|c| c.field),
        Some("serve_metrics"),
        "{prometheus}"
    );
    drop(same);

    let health = worker.health_addr().unwrap();
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    // The probes answer beside the OTLP recorder.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(health, "/readyz").await, Ok((200, _))) {
        assert!(Instant::now() < deadline, "not ready within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    put_sequenced_records(env.kinesis(), &stream, KEYS, PER_KEY)
        .await
        .unwrap();
    // A periodic export (not only the final one) carries every record.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let exported = collector
            .received()
            .iter()
            .rfind(|r| r.status == 200)
            .map_or(0, |e| records_processed(&e.body, &stream));
        if exported == RECORDS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "within 60 s: {} processed, {exported} exported",
            processed.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exports_while_running = accepted(&collector).len();
    crate::stop_within_60s(&handle, run).await;

    let accepted = accepted(&collector);
    // The final export, after the worker stopped.
    assert!(
        accepted.len() > exports_while_running,
        "no export at shutdown"
    );
    let refused = collector.received().len() - accepted.len();
    assert_eq!(refused, 1);
    let stats = exporter.stats();
    assert_eq!(stats.failed_exports, 1, "{stats:?}");
    // An export in flight when the worker stopped is abandoned (the final
    // one supersedes it), whether or not the collector got it.
    assert!(
        stats.exports >= 2 && stats.exports <= accepted.len() as u64,
        "{stats:?}, {} accepted",
        accepted.len()
    );
    assert_eq!(stats.measurements_dropped, 0, "{stats:?}");
    for export in accepted.iter() {
        assert_eq!(export.path, "/v1/metrics");
        assert_eq!(
            export.content_type.as_deref(),
            Some("application/x-protobuf")
        );
        assert_eq!(export.tenant.as_deref(), Some("team-a"));
    }

    let last = &accepted.last().expect("exports").body;
    assert_eq!(last.resource_metrics.len(), 1);
    let resource = last.resource_metrics[0]
        .resource
        .as_ref()
        .expect("a resource");
    assert_eq!(
        attributes(&resource.attributes),
        BTreeMap::from([
            ("service.name".to_owned(), app.clone()),
            ("service.instance.id".to_owned(), worker_id.clone()),
            ("deployment.environment".to_owned(), "test".to_owned()),
        ])
    );
    let scope = last.resource_metrics[0].scope_metrics[0]
        .scope
        .as_ref()
        .expect("a scope");
    assert_eq!(scope.name, "kcl");

    // Every kcl metric exported is of its declared kind, with its unit
    // and description.
    let mut checked = 0;
    for metric in metrics_of(last) {
        let Some(spec) = metric_names::ALL.iter().find(|s| s.name == metric.name) else {
            continue;
        };
        checked += 1;
        assert!(check_declared(metric, spec) > 0, "{}", spec.name);
    }
    assert!(checked >= 10, "only {checked} kcl metrics exported");

    // The records-processed counter: per shard, summing to what was put.
    let processed_points = sum_points(exported(last, metric_names::RECORDS_PROCESSED));
    let ours: Vec<_> = processed_points
        .iter()
        .filter(|p| has(&p.attributes, "stream", &stream))
        .collect();
    assert!(!ours.is_empty());
    for point in &ours {
        assert!(
            attributes(&point.attributes).contains_key("shard"),
            "{point:?}"
        );
        assert!(
            point.start_time_unix_nano > 0 && point.start_time_unix_nano <= point.time_unix_nano
        );
    }
    assert_eq!(ours.iter().map(|p| int(p)).sum::<i64>(), RECORDS);
    assert_eq!(records_processed(last, &stream), RECORDS);
    let bytes = exported(last, metric_names::BYTES_PROCESSED);
    assert_eq!(bytes.unit, "By");

    // Cumulative across exports: a series never goes down and keeps its
    // start time.
    let mut seen: BTreeMap<BTreeMap<String, String>, (i64, u64)> = BTreeMap::new();
    for export in accepted.iter() {
        let Some(metric) = find(&export.body, metric_names::RECORDS_PROCESSED) else {
            continue;
        };
        for point in sum_points(metric) {
            let key = attributes(&point.attributes);
            let now = (int(point), point.start_time_unix_nano);
            if let Some(before) = seen.insert(key.clone(), now) {
                assert!(
                    before.0 <= now.0,
                    "{key:?} went down: {before:?} then {now:?}"
                );
                assert_eq!(before.1, now.1, "{key:?} changed its start time");
            }
        }
    }

    // Gauges: the leases held, with the worker label; 2 while it ran,
    // 0 once it released them.
    let held = |export: &Received| -> Option<f64> {
        let metric = find(&export.body, metric_names::LEASES_HELD)?;
        gauge_points(metric)
            .iter()
            .find(|p| has(&p.attributes, "worker", &worker_id))
            .map(double)
    };
    assert!(
        accepted.iter().any(|e| held(e) == Some(2.0)),
        "no export saw both leases held"
    );
    assert_eq!(held(accepted.last().expect("exports")), Some(0.0));
    let lag = exported(last, metric_names::MILLIS_BEHIND_LATEST);
    assert_eq!(lag.unit, "ms");

    // Histograms with kcl's buckets; the records per batch sum to the
    // records put.
    let batch_seconds = histogram_points(exported(last, metric_names::BATCH_PROCESSING_SECONDS));
    let per_batch = histogram_points(exported(last, metric_names::RECORDS_PER_BATCH));
    for (points, bounds) in [(batch_seconds, SECONDS_BUCKETS), (per_batch, BATCH_BUCKETS)] {
        for point in points
            .iter()
            .filter(|p| has(&p.attributes, "stream", &stream))
        {
            assert_eq!(point.explicit_bounds, bounds);
            assert_eq!(point.bucket_counts.len(), bounds.len() + 1);
            assert_eq!(point.bucket_counts.iter().sum::<u64>(), point.count);
        }
    }
    let batches: u64 = per_batch
        .iter()
        .filter(|p| has(&p.attributes, "stream", &stream))
        .map(|p| p.count)
        .sum();
    assert!(batches >= 1);
    let records_in_batches: f64 = per_batch
        .iter()
        .filter(|p| has(&p.attributes, "stream", &stream))
        .filter_map(|p| p.sum)
        .sum();
    assert_eq!(records_in_batches, RECORDS as f64);

    // The exporter's own counter, present and zero.
    let dropped = sum_points(exported(last, metric_names::OTLP_MEASUREMENTS_DROPPED));
    assert_eq!(dropped.iter().map(int).collect::<Vec<_>>(), [0]);
}

#[tokio::test]
async fn export_otlp_metrics_fails_beside_another_recorder() {
    if ran_in_own_process(
        module_path!(),
        "export_otlp_metrics_fails_beside_another_recorder",
        &[],
    )
    .await
    {
        return;
    }
    // The application's own recorder.
    metrics::set_global_recorder(metrics::NoopRecorder).unwrap();
    // Nothing is called at build(): any endpoint does.
    let sdk = aws_config::SdkConfig::builder()
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url("http://127.0.0.1:9")
        .behavior_version(aws_config::BehaviorVersion::latest())
        .build();
    let error = Worker::builder("otlp-beside-another")
        .stream("orders")
        .sdk_config(&sdk)
        .processor(Counting::factory(&Arc::default(), Duration::ZERO))
        .export_otlp_metrics(OtlpMetrics::new("http://127.0.0.1:4318"))
        .build()
        .expect_err("the recorder cannot be installed");
    let config = error.config().expect("a configuration error");
    assert_eq!(config.field, "export_otlp_metrics");
    assert!(
        config.reason.contains("another `metrics` recorder"),
        "{}",
        config.reason
    );
}
