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

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use kcl::metric_names::{self, MetricKind, MetricUnit};
use kcl::observability::OtlpMetrics;
use kcl::{InitialPosition, Worker};
use kcl_tests::{TestEnv, create_stream, http_get, put_sequenced_records, unique_name};

use crate::Counting;
use crate::fleet::ran_in_own_process;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, HistogramDataPoint, Metric, NumberDataPoint, metric, number_data_point,
};
use prost::Message;
use tokio::time::Instant;

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

/// One export the collector received.
#[derive(Debug)]
struct Export {
    path: String,
    content_type: Option<String>,
    tenant: Option<String>,
    body: ExportMetricsServiceRequest,
}

/// An OTLP/HTTP collector on a local port: answers the first requests
/// with 503 as scripted, then accepts everything, keeping what it
/// accepted (and counting what it refused).
struct Collector {
    addr: SocketAddr,
    accepted: Arc<Mutex<Vec<Export>>>,
    refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    async fn start(refuse_first: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let addr = listener.local_addr().expect("the bound address");
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(AtomicU64::new(0));
        let to_refuse = Arc::new(Mutex::new(VecDeque::from(vec![(); refuse_first as usize])));
        let task = tokio::spawn({
            let (accepted, refused) = (Arc::clone(&accepted), Arc::clone(&refused));
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let state = (
                        Arc::clone(&accepted),
                        Arc::clone(&refused),
                        Arc::clone(&to_refuse),
                    );
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            let state = state.clone();
                            async move { receive(request, &state.0, &state.1, &state.2).await }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        Collector {
            addr,
            accepted,
            refused,
            task,
        }
    }

    fn accepted(&self) -> std::sync::MutexGuard<'_, Vec<Export>> {
        self.accepted.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(
    request: Request<Incoming>,
    accepted: &Mutex<Vec<Export>>,
    refused: &AtomicU64,
    to_refuse: &Mutex<VecDeque<()>>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (content_type, tenant) = (header("content-type"), header("x-tenant"));
    let path = request.uri().path().to_owned();
    let body = request.into_body().collect().await?.to_bytes();
    let refuse = to_refuse
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop_front()
        .is_some();
    if refuse {
        refused.fetch_add(1, Ordering::Relaxed);
        let mut response = Response::new(Full::new(Bytes::from_static(b"busy")));
        *response.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
        return Ok(response);
    }
    let body = ExportMetricsServiceRequest::decode(body).expect("an OTLP metrics request");
    accepted
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Export {
            path,
            content_type,
            tenant,
            body,
        });
    let mut response = Response::new(Full::new(Bytes::from(
        ExportMetricsServiceResponse::default().encode_to_vec(),
    )));
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/x-protobuf"),
    );
    Ok(response)
}

fn metrics_of(request: &ExportMetricsServiceRequest) -> &[Metric] {
    &request.resource_metrics[0].scope_metrics[0].metrics
}

fn find<'a>(request: &'a ExportMetricsServiceRequest, name: &str) -> Option<&'a Metric> {
    metrics_of(request).iter().find(|m| m.name == name)
}

fn attributes(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                other => panic!("attribute {} is not a string: {other:?}", kv.key),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn has(attributes_: &[KeyValue], key: &str, value: &str) -> bool {
    attributes(attributes_).get(key).map(String::as_str) == Some(value)
}

/// Fails unless `temporality`, `metric`'s aggregation temporality, is
/// cumulative.
fn assert_cumulative(metric: &Metric, temporality: i32) {
    assert_eq!(
        temporality,
        i32::from(AggregationTemporality::Cumulative),
        "{}",
        metric.name
    );
}

/// A counter's points, checked to be a cumulative monotonic sum.
fn sum_points(metric: &Metric) -> &[NumberDataPoint] {
    match &metric.data {
        Some(metric::Data::Sum(sum)) => {
            assert!(sum.is_monotonic, "{} is not monotonic", metric.name);
            assert_cumulative(metric, sum.aggregation_temporality);
            &sum.data_points
        }
        other => panic!("{} is not a sum: {other:?}", metric.name),
    }
}

fn gauge_points(metric: &Metric) -> &[NumberDataPoint] {
    match &metric.data {
        Some(metric::Data::Gauge(gauge)) => &gauge.data_points,
        other => panic!("{} is not a gauge: {other:?}", metric.name),
    }
}

fn histogram_points(metric: &Metric) -> &[HistogramDataPoint] {
    match &metric.data {
        Some(metric::Data::Histogram(histogram)) => {
            assert_cumulative(metric, histogram.aggregation_temporality);
            &histogram.data_points
        }
        other => panic!("{} is not a histogram: {other:?}", metric.name),
    }
}

fn int(point: &NumberDataPoint) -> i64 {
    match point.value {
        Some(number_data_point::Value::AsInt(v)) => v,
        other => panic!("a counter's value is an integer, not {other:?}"),
    }
}

fn double(point: &NumberDataPoint) -> f64 {
    match point.value {
        Some(number_data_point::Value::AsDouble(v)) => v,
        other => panic!("a gauge's value is a double, not {other:?}"),
    }
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
    let collector = Collector::start(1).await;
    let stream = unique_name("kcl-otlp");
    let app = unique_name("kcl-otlp-app");
    let worker_id = unique_name("otlp-worker");
    create_stream(env.kinesis(), &stream, 2).await.unwrap();
    let otlp = OtlpMetrics::new(format!("http://{}", collector.addr))
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
            .accepted()
            .last()
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
    let exports_while_running = collector.accepted().len();
    crate::stop_within_60s(&handle, run).await;

    let accepted = collector.accepted();
    // The final export, after the worker stopped.
    assert!(
        accepted.len() > exports_while_running,
        "no export at shutdown"
    );
    assert_eq!(collector.refused.load(Ordering::Relaxed), 1);
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
        assert_eq!(metric.description, spec.help, "{}", spec.name);
        let unit = match spec.unit {
            None => "",
            Some(MetricUnit::Bytes) => "By",
            Some(MetricUnit::Seconds) => "s",
            Some(MetricUnit::Milliseconds) => "ms",
        };
        assert_eq!(metric.unit, unit, "{}", spec.name);
        match spec.kind {
            MetricKind::Counter => assert!(!sum_points(metric).is_empty(), "{}", spec.name),
            MetricKind::Gauge => assert!(!gauge_points(metric).is_empty(), "{}", spec.name),
            MetricKind::Histogram => {
                assert!(!histogram_points(metric).is_empty(), "{}", spec.name)
            }
        }
    }
    assert!(checked >= 10, "only {checked} kcl metrics exported");

    // The records-processed counter: per shard, summing to what was put.
    let processed_points =
        sum_points(find(last, metric_names::RECORDS_PROCESSED).expect("exported"));
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
    let bytes = find(last, metric_names::BYTES_PROCESSED).expect("bytes processed");
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
    let held = |export: &Export| -> Option<f64> {
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
    let lag = find(last, metric_names::MILLIS_BEHIND_LATEST).expect("the lag");
    assert_eq!(lag.unit, "ms");

    // Histograms with kcl's buckets; the records per batch sum to the
    // records put.
    let batch_seconds = histogram_points(
        find(last, metric_names::BATCH_PROCESSING_SECONDS).expect("batch processing time"),
    );
    let per_batch =
        histogram_points(find(last, metric_names::RECORDS_PER_BATCH).expect("records per batch"));
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
    let dropped = sum_points(find(last, metric_names::OTLP_MEASUREMENTS_DROPPED).expect("dropped"));
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
