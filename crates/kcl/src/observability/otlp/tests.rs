//! The OTLP recorder's aggregation and encoding, read back through the
//! generated OTLP types, and the exporter against a scripted collector
//! on a local port. Recording goes through `metrics::with_local_recorder`:
//! nothing here installs a global recorder.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kcl_core::metric_names::{
    self, BATCH_PROCESSING_SECONDS, MetricKind, OTLP_MEASUREMENTS_DROPPED, RECORDS_PER_BATCH,
};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use prost::Message;
use tokio::time::Instant;

use super::registry::unix_nanos;
use super::settings::metrics_url;
use super::{OtlpExportError, OtlpExporter, OtlpMetrics, OtlpRecorder, encode};
use crate::observability::{BATCH_BUCKETS, SECONDS_BUCKETS};

mod collector;

use collector::{
    Collector, check_declared, double, exported, gauge_points, histogram_points, int, metrics_of,
    pairs, sum_points, unavailable,
};

/// An endpoint nothing listens on (the exporter is not used).
const NOWHERE: &str = "http://127.0.0.1:9";

fn pair(settings: OtlpMetrics) -> (OtlpRecorder, OtlpExporter) {
    settings.build().expect("valid settings")
}

/// What the exporter would send now.
fn encoded(recorder: &OtlpRecorder) -> ExportMetricsServiceRequest {
    let registry = &recorder.registry;
    let now = unix_nanos(std::time::SystemTime::now());
    let request = encode::request(registry, registry.snapshot(), &[], 1, now);
    // Through the wire format, as a collector reads it.
    ExportMetricsServiceRequest::decode(request.encode_to_vec().as_slice())
        .expect("the request decodes")
}

/// The names of the metrics `request` exports, in its order.
fn names_of(request: &ExportMetricsServiceRequest) -> Vec<&str> {
    metrics_of(request)
        .iter()
        .map(|m| m.name.as_str())
        .collect()
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn counters_are_cumulative_monotonic_sums_across_exports() {
    let (recorder, _) = pair(OtlpMetrics::new(NOWHERE));
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("app_events_total", "kind" => "a").increment(3);
        metrics::counter!("app_events_total", "kind" => "b").increment(1);
    });
    let first = encoded(&recorder);
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("app_events_total", "kind" => "a").increment(2);
        // An absolute value below the total does not move it back.
        metrics::counter!("app_events_total", "kind" => "b").absolute(0);
    });
    let second = encoded(&recorder);

    // Each point's attributes, value and start.
    type Points = Vec<(Vec<(String, String)>, i64, u64)>;
    let values = |request: &ExportMetricsServiceRequest| -> Points {
        sum_points(exported(request, "app_events_total"))
            .iter()
            .map(|p| (pairs(&p.attributes), int(p), p.start_time_unix_nano))
            .collect()
    };
    let (first, second) = (values(&first), values(&second));
    let kinds: Vec<_> = second.iter().map(|(a, v, _)| (a.clone(), *v)).collect();
    assert_eq!(
        kinds,
        [(owned(&[("kind", "a")]), 5), (owned(&[("kind", "b")]), 1)]
    );
    assert_eq!(first[0].1, 3);
    // The same series, so the same start: a backend sees one growing sum.
    assert_eq!(first[0].2, second[0].2);
    assert!(first[0].2 > 0);
}

#[test]
fn gauges_export_their_last_value() {
    let (recorder, _) = pair(OtlpMetrics::new(NOWHERE));
    metrics::with_local_recorder(&recorder, || {
        let gauge = metrics::gauge!("app_queue_depth");
        gauge.set(10.0);
        gauge.increment(2.5);
        gauge.decrement(0.5);
    });
    let request = encoded(&recorder);
    let points = gauge_points(exported(&request, "app_queue_depth"));
    assert_eq!(points.len(), 1);
    assert_eq!(double(&points[0]), 12.0);
    assert!(points[0].attributes.is_empty());
}

#[test]
fn histogram_values_fall_into_otlp_explicit_buckets() {
    let (recorder, _) = pair(OtlpMetrics::new(NOWHERE));
    metrics::with_local_recorder(&recorder, || {
        let h = metrics::histogram!(BATCH_PROCESSING_SECONDS, "stream" => "s", "shard" => "0");
        // Below the first bound, on it (bounds are inclusive), just above
        // it, in the middle, above the last bound; and a NaN, ignored.
        for v in [0.0005, 0.001, 0.0011, 0.3, 45.0, f64::NAN] {
            h.record(v);
        }
        h.record_many(0.3, 2);
    });
    let request = encoded(&recorder);
    let metric = exported(&request, BATCH_PROCESSING_SECONDS);
    assert_eq!(metric.unit, "s");
    let points = histogram_points(metric);
    assert_eq!(points.len(), 1);
    let point = &points[0];
    assert_eq!(point.explicit_bounds, SECONDS_BUCKETS);
    let mut expected = vec![0_u64; SECONDS_BUCKETS.len() + 1];
    expected[0] = 2; // 0.0005 and 0.001
    expected[1] = 1; // 0.0011 <= 0.0025
    expected[8] = 3; // 0.3 <= 0.5, three times
    expected[SECONDS_BUCKETS.len()] = 1; // 45 > 30
    assert_eq!(point.bucket_counts, expected);
    assert_eq!(point.count, 7);
    let sum = 0.0005 + 0.001 + 0.0011 + 0.3 * 3.0 + 45.0;
    assert!((point.sum.expect("a sum") - sum).abs() < 1e-9, "{point:?}");
    assert_eq!(point.min, Some(0.0005));
    assert_eq!(point.max, Some(45.0));
    assert_eq!(
        pairs(&point.attributes),
        owned(&[("stream", "s"), ("shard", "0")])
    );
}

#[test]
fn histograms_get_kcls_buckets_the_configured_ones_or_the_otel_defaults() {
    let (recorder, _) = pair(
        OtlpMetrics::new(NOWHERE)
            .histogram_buckets("app_payload_size", &[100.0, 1000.0])
            // An application's `_seconds` histogram overridden too.
            .histogram_buckets("app_wait_seconds", &[1.0]),
    );
    metrics::with_local_recorder(&recorder, || {
        metrics::histogram!(RECORDS_PER_BATCH).record(7.0);
        metrics::histogram!("app_payload_size").record(7.0);
        metrics::histogram!("app_wait_seconds").record(7.0);
        metrics::histogram!("app_lock_seconds").record(7.0);
        metrics::histogram!("app_other").record(7.0);
    });
    let request = encoded(&recorder);
    let bounds = |name: &str| {
        histogram_points(exported(&request, name))[0]
            .explicit_bounds
            .clone()
    };
    assert_eq!(bounds(RECORDS_PER_BATCH), BATCH_BUCKETS);
    assert_eq!(bounds("app_payload_size"), [100.0, 1000.0]);
    assert_eq!(bounds("app_wait_seconds"), [1.0]);
    assert_eq!(bounds("app_lock_seconds"), SECONDS_BUCKETS);
    assert_eq!(
        bounds("app_other"),
        [
            0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0,
            7500.0, 10000.0
        ]
    );
    // The configured bounds are used for the counts too.
    assert_eq!(
        histogram_points(exported(&request, "app_payload_size"))[0].bucket_counts,
        [1, 0, 0]
    );
}

#[test]
fn series_beyond_max_series_are_dropped_and_counted() {
    let (recorder, exporter) = pair(OtlpMetrics::new(NOWHERE).max_series(2));
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("app_kept_total", "n" => "1").increment(1);
        metrics::gauge!("app_kept").set(1.0);
        // The cap is reached: a third series of any kind is dropped,
        // each measurement counted.
        metrics::counter!("app_kept_total", "n" => "2").increment(5);
        metrics::gauge!("app_dropped").set(1.0);
        let h = metrics::histogram!("app_dropped_seconds");
        h.record(1.0);
        h.record_many(1.0, 3);
        // The series held still record.
        metrics::counter!("app_kept_total", "n" => "1").increment(1);
    });
    let request = encoded(&recorder);
    let names = names_of(&request);
    assert_eq!(
        names,
        ["app_kept", "app_kept_total", OTLP_MEASUREMENTS_DROPPED]
    );
    let kept = sum_points(exported(&request, "app_kept_total"));
    assert_eq!(kept.len(), 1);
    assert_eq!(int(&kept[0]), 2);
    let dropped = sum_points(exported(&request, OTLP_MEASUREMENTS_DROPPED));
    assert_eq!(dropped.len(), 1);
    assert_eq!(int(&dropped[0]), 6);
    let stats = exporter.stats();
    assert_eq!((stats.series, stats.measurements_dropped), (2, 6));
}

/// Leases keep moving: a shard no consumer reads any more gives its
/// series' room back, so `max_series` bounds what the process holds now,
/// not every shard it ever read.
#[test]
fn a_forgotten_shards_series_give_their_room_back() {
    let (recorder, exporter) = pair(OtlpMetrics::new(NOWHERE).max_series(2));
    let waiting = |shard: &'static str| {
        metrics::gauge!(metric_names::SHARD_RECORDS_WAITING, "stream" => "s", "shard" => shard)
            .set(1.0);
    };
    metrics::with_local_recorder(&recorder, || {
        waiting("shard-1");
        waiting("shard-2");
    });
    let forgotten = ("s".to_owned(), "shard-1".to_owned());
    recorder.registry.forget_shards(&[&forgotten]);
    metrics::with_local_recorder(&recorder, || waiting("shard-3"));
    let request = encoded(&recorder);
    let shards: Vec<_> = gauge_points(exported(&request, metric_names::SHARD_RECORDS_WAITING))
        .iter()
        .map(|point| pairs(&point.attributes))
        .collect();
    let labelled = |shard: &str| {
        vec![
            ("stream".to_owned(), "s".to_owned()),
            ("shard".to_owned(), shard.to_owned()),
        ]
    };
    assert_eq!(shards, [labelled("shard-2"), labelled("shard-3")]);
    assert_eq!(exporter.stats().measurements_dropped, 0);
}

#[test]
fn every_kcl_metric_is_exported_as_its_kind_with_its_unit_and_description() {
    let (recorder, _) = pair(OtlpMetrics::new(NOWHERE));
    let recorded = || {
        metric_names::ALL
            .iter()
            .filter(|spec| spec.name != OTLP_MEASUREMENTS_DROPPED)
    };
    metrics::with_local_recorder(&recorder, || {
        for spec in recorded() {
            match spec.kind {
                MetricKind::Counter => metrics::counter!(spec.name).increment(1),
                MetricKind::Gauge => metrics::gauge!(spec.name).set(1.0),
                MetricKind::Histogram => metrics::histogram!(spec.name).record(1.0),
            }
        }
    });
    let request = encoded(&recorder);
    let names = names_of(&request);
    let mut expected: Vec<&str> = metric_names::ALL.iter().map(|s| s.name).collect();
    expected.sort_unstable();
    assert_eq!(names, expected, "one metric per name, sorted");
    for spec in metric_names::ALL {
        let points = check_declared(exported(&request, spec.name), spec);
        assert_eq!(points, 1, "{}", spec.name);
    }
}

#[test]
fn an_applications_description_and_unit_are_exported() {
    let (recorder, _) = pair(OtlpMetrics::new(NOWHERE));
    metrics::with_local_recorder(&recorder, || {
        metrics::describe_histogram!("app_payload", metrics::Unit::Bytes, "Payload sizes");
        metrics::describe_counter!("app_things_total", "Things");
        metrics::histogram!("app_payload").record(1.0);
        metrics::counter!("app_things_total").increment(1);
    });
    let request = encoded(&recorder);
    let payload = exported(&request, "app_payload");
    assert_eq!(
        (payload.unit.as_str(), payload.description.as_str()),
        ("By", "Payload sizes")
    );
    let things = exported(&request, "app_things_total");
    assert_eq!(
        (things.unit.as_str(), things.description.as_str()),
        ("", "Things")
    );
}

#[test]
fn the_resource_names_the_service_and_the_instance() {
    let resource = |settings: OtlpMetrics| {
        settings
            .with_worker_defaults("orders", "worker-1")
            .validate()
            .expect("valid")
            .resource
    };
    assert_eq!(
        resource(OtlpMetrics::new(NOWHERE).resource_attribute("deployment.environment", "prod")),
        owned(&[
            ("service.name", "orders"),
            ("service.instance.id", "worker-1"),
            ("deployment.environment", "prod"),
        ])
    );
    // Explicit settings win over the worker's defaults and over a
    // resource attribute of the same key.
    assert_eq!(
        resource(
            OtlpMetrics::new(NOWHERE)
                .resource_attribute("service.name", "ignored")
                .service_name("billing")
                .service_instance_id("pod-7")
        ),
        owned(&[
            ("service.name", "billing"),
            ("service.instance.id", "pod-7")
        ])
    );
    // A resource attribute stands in for a default it names.
    assert_eq!(
        resource(OtlpMetrics::new(NOWHERE).resource_attribute("service.name", "from-attribute")),
        owned(&[
            ("service.instance.id", "worker-1"),
            ("service.name", "from-attribute"),
        ])
    );
    // Built by the application: no instance id, OTel's unknown service.
    let validated = OtlpMetrics::new(NOWHERE).validate().expect("valid");
    assert_eq!(
        validated.resource,
        owned(&[("service.name", "unknown_service")])
    );
}

#[test]
fn the_metrics_url_is_the_endpoint_with_v1_metrics() {
    let url = |e: &str| metrics_url(e).map(|u| u.to_string());
    for (endpoint, metrics) in [
        ("http://collector:4318", "http://collector:4318/v1/metrics"),
        ("http://collector:4318/", "http://collector:4318/v1/metrics"),
        (
            "https://otlp.example.com/otlp/",
            "https://otlp.example.com/otlp/v1/metrics",
        ),
        (
            "http://collector:4318/v1/metrics",
            "http://collector:4318/v1/metrics",
        ),
    ] {
        assert_eq!(url(endpoint).as_deref(), Ok(metrics), "{endpoint}");
    }
    for (endpoint, says) in [
        ("collector:4318", "scheme"),
        ("grpc://collector:4317", "gRPC is not supported"),
        ("http://collector:4318/?x=1", "query"),
        ("http://", "not a URL"),
    ] {
        let error = url(endpoint).expect_err(endpoint);
        assert!(error.contains(says), "{endpoint}: {error}");
    }
}

#[test]
fn invalid_settings_fail_naming_the_setting() {
    let field = |settings: OtlpMetrics| settings.build().map(|_| ()).expect_err("invalid").field;
    assert_eq!(field(OtlpMetrics::new("collector:4318")), "endpoint");
    assert_eq!(
        field(OtlpMetrics::new(NOWHERE).interval(Duration::ZERO)),
        "interval"
    );
    assert_eq!(
        field(OtlpMetrics::new(NOWHERE).timeout(Duration::ZERO)),
        "timeout"
    );
    assert_eq!(field(OtlpMetrics::new(NOWHERE).max_series(0)), "max_series");
    assert_eq!(
        field(OtlpMetrics::new(NOWHERE).header("bad name", "v")),
        "header"
    );
    assert_eq!(
        field(OtlpMetrics::new(NOWHERE).header("x-ok", "bad\nvalue")),
        "header"
    );
    assert_eq!(
        field(OtlpMetrics::new(NOWHERE).resource_attribute("", "v")),
        "resource_attribute"
    );
    for bounds in [&[][..], &[1.0, 1.0], &[2.0, 1.0], &[f64::INFINITY]] {
        assert_eq!(
            field(OtlpMetrics::new(NOWHERE).histogram_buckets("h", bounds)),
            "histogram_buckets",
            "{bounds:?}"
        );
    }
}

#[test]
fn header_values_stay_out_of_debug_output() {
    let settings = OtlpMetrics::new(NOWHERE).header("authorization", "Bearer s3cr3t");
    let debug = format!("{settings:?}");
    assert!(debug.contains("authorization"), "{debug}");
    assert!(!debug.contains("s3cr3t"), "{debug}");
}

/// The value of counter `name` in an export.
fn counter_value(request: &ExportMetricsServiceRequest, name: &str) -> i64 {
    sum_points(exported(request, name)).iter().map(int).sum()
}

#[tokio::test]
async fn an_export_posts_protobuf_to_v1_metrics_with_the_resource_and_headers() {
    let collector = Collector::start(Vec::new()).await;
    let (recorder, exporter) = pair(
        OtlpMetrics::new(collector.endpoint())
            .header("x-tenant", "team-a")
            .service_name("orders")
            .service_instance_id("worker-1"),
    );
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("app_events_total").increment(4);
    });
    exporter.export_now().await.expect("accepted");
    let received = collector.received();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.path, "/v1/metrics");
    assert_eq!(
        request.content_type.as_deref(),
        Some("application/x-protobuf")
    );
    assert_eq!(request.tenant.as_deref(), Some("team-a"));
    let resource = request.body.resource_metrics[0]
        .resource
        .as_ref()
        .expect("a resource");
    assert_eq!(
        pairs(&resource.attributes),
        owned(&[
            ("service.name", "orders"),
            ("service.instance.id", "worker-1")
        ])
    );
    let scope = request.body.resource_metrics[0].scope_metrics[0]
        .scope
        .as_ref()
        .expect("a scope");
    assert_eq!(scope.name, "kcl");
    assert_eq!(counter_value(&request.body, "app_events_total"), 4);
    assert_eq!(exporter.stats().exports, 1);
}

#[tokio::test]
async fn retryable_failures_are_retried_until_the_collector_accepts() {
    let collector = Collector::start(vec![unavailable(), unavailable()]).await;
    let (_, exporter) = pair(OtlpMetrics::new(collector.endpoint()));
    let exporter = exporter.with_initial_backoff(Duration::from_millis(10));
    exporter
        .export_with_retries(Instant::now() + Duration::from_secs(600))
        .await
        .expect("accepted at the third attempt");
    let statuses: Vec<u16> = collector.received().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 503, 200]);
    let stats = exporter.stats();
    assert_eq!((stats.exports, stats.failed_exports), (1, 2));
}

#[tokio::test]
async fn a_rejected_export_is_not_retried_and_says_why() {
    #[derive(Clone, PartialEq, prost::Message)]
    struct Status {
        #[prost(int32, tag = "1")]
        code: i32,
        #[prost(string, tag = "2")]
        message: String,
    }
    let status = Status {
        code: 3,
        message: "metric name invalid".into(),
    };
    let collector = Collector::start(vec![(
        400,
        "application/x-protobuf",
        status.encode_to_vec(),
    )])
    .await;
    let (_, exporter) = pair(OtlpMetrics::new(collector.endpoint()));
    let exporter = exporter.with_initial_backoff(Duration::from_millis(10));
    let error = exporter
        .export_with_retries(Instant::now() + Duration::from_secs(600))
        .await
        .expect_err("rejected");
    assert!(!error.is_retryable());
    match error {
        OtlpExportError::Rejected {
            status, message, ..
        } => assert_eq!((status, message.as_str()), (400, "metric name invalid")),
        other => panic!("{other:?}"),
    }
    assert_eq!(collector.received().len(), 1);
}

#[tokio::test]
async fn no_retry_starts_once_the_next_export_is_due() {
    let collector = Collector::start(vec![unavailable(), unavailable()]).await;
    let (_, exporter) = pair(OtlpMetrics::new(collector.endpoint()));
    let exporter = exporter.with_initial_backoff(Duration::from_millis(10));
    let error = exporter
        .export_with_retries(Instant::now())
        .await
        .expect_err("unavailable");
    assert!(error.is_retryable(), "{error}");
    assert_eq!(collector.received().len(), 1);
}

#[tokio::test]
async fn an_unreachable_collector_is_a_retryable_transport_error() {
    // A port that was just free: connecting is refused.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let (_, exporter) = pair(OtlpMetrics::new(format!("http://{addr}")));
    let error = exporter.export_now().await.expect_err("nothing listens");
    assert!(matches!(error, OtlpExportError::Transport(_)), "{error:?}");
    assert!(error.is_retryable());
    assert_eq!(exporter.stats().failed_exports, 1);
}

#[tokio::test]
async fn run_until_exports_once_more_when_stopped() {
    let collector = Collector::start(Vec::new()).await;
    // No periodic export within the test: only the final one.
    let (recorder, exporter) =
        pair(OtlpMetrics::new(collector.endpoint()).interval(Duration::from_secs(3600)));
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("app_events_total").increment(7);
    });
    exporter.run_until(std::future::ready(())).await;
    let received = collector.received();
    assert_eq!(received.len(), 1);
    assert_eq!(counter_value(&received[0].body, "app_events_total"), 7);
}

#[tokio::test]
async fn run_until_exports_every_interval_then_the_final_state() {
    let collector = Collector::start(Vec::new()).await;
    let (recorder, exporter) =
        pair(OtlpMetrics::new(collector.endpoint()).interval(Duration::from_millis(20)));
    let counter = metrics::with_local_recorder(&recorder, || metrics::counter!("app_events_total"));
    counter.increment(1);
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn({
        let (exporter, stop) = (exporter.clone(), stop.clone());
        async move { exporter.run_until(stop.cancelled_owned()).await }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while collector.received().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "fewer than 3 periodic exports in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    counter.increment(1);
    stop.cancel();
    run.await.expect("the exporter ends");
    let received = collector.received();
    assert!(received.len() >= 4, "{}", received.len());
    let values: Vec<i64> = received
        .iter()
        .map(|r| counter_value(&r.body, "app_events_total"))
        .collect();
    // Cumulative: never decreasing, and the last export has the final
    // count.
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "{values:?}");
    assert_eq!(values.last(), Some(&2), "{values:?}");
}

/// Warn and info events counted.
#[derive(Default)]
struct LogCounts {
    warnings: AtomicUsize,
    infos: AtomicUsize,
}

/// Counts events on the thread it is the default of.
struct LogCounter(Arc<LogCounts>);

impl tracing::Subscriber for LogCounter {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        match *event.metadata().level() {
            tracing::Level::WARN => self.0.warnings.fetch_add(1, Ordering::Relaxed),
            tracing::Level::INFO => self.0.infos.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test(flavor = "current_thread")]
async fn a_failure_streak_is_logged_once_and_its_end_once() {
    let logs = Arc::new(LogCounts::default());
    // The current-thread runtime polls this test on this thread.
    let _default = tracing::subscriber::set_default(LogCounter(Arc::clone(&logs)));
    // With one dispatcher alive, tracing asks only the registering
    // thread's default whether a callsite is of interest, so a log line
    // first reached by another test's thread would be disabled here for
    // good. A second one makes it ask every dispatcher.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let collector = Collector::start(vec![
        unavailable(),
        unavailable(),
        unavailable(),
        (200, "application/x-protobuf", Vec::new()),
        unavailable(),
    ])
    .await;
    let (_, exporter) = pair(OtlpMetrics::new(collector.endpoint()));
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        outcomes.push(exporter.export_now().await.is_ok());
    }
    assert_eq!(outcomes, [false, false, false, true, false]);
    // Two streaks: each logged at its first failure; one recovery.
    assert_eq!(logs.warnings.load(Ordering::Relaxed), 2);
    assert_eq!(logs.infos.load(Ordering::Relaxed), 1);
    let stats = exporter.stats();
    assert_eq!((stats.exports, stats.failed_exports), (1, 4));
}

/// A collector's `Retry-After` longer than the clock can add is a wait
/// past the next export (the error is reported), not a panic of the
/// exporter.
#[test]
fn a_retry_after_past_the_clock_is_a_wait_past_the_next_export() {
    let now = tokio::time::Instant::now();
    let until = now + Duration::from_secs(60);
    let forever = Duration::from_secs(u64::MAX);
    assert_eq!(super::export::retry_at(now, forever, until), None);
    let soon = Duration::from_secs(10);
    assert_eq!(super::export::retry_at(now, soon, until), Some(now + soon));
}
