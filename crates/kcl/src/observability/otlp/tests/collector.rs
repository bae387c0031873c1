//! An OTLP/HTTP collector on a local port, and readers of the
//! `ExportMetricsServiceRequest`s it receives (through the OTLP crate's
//! generated types, as a real collector reads them). The OTLP unit tests
//! use it, and so does the end-to-end test of a worker's export
//! (`tests/tests/observability/otlp.rs` includes this file by path), so
//! both read an export the same way.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use kcl_core::metric_names::{MetricKind, MetricSpec, MetricUnit};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, HistogramDataPoint, Metric, NumberDataPoint, metric, number_data_point,
};
use prost::Message;

/// One request the collector received, and the status it answered.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) path: String,
    pub(crate) content_type: Option<String>,
    pub(crate) tenant: Option<String>,
    pub(crate) status: u16,
    pub(crate) body: ExportMetricsServiceRequest,
}

/// A scripted answer: status, content type, body.
pub(crate) type Answer = (u16, &'static str, Vec<u8>);

/// The answer of an overloaded collector, which the exporter retries.
pub(crate) fn unavailable() -> Answer {
    (503, "text/plain", b"overloaded".to_vec())
}

/// A collector on a local port that answers from a script (then 200 with
/// an empty `ExportMetricsServiceResponse`) and keeps what it received.
pub(crate) struct Collector {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    /// Listens on a free local port; answers the requests with `script`
    /// in order, then with 200.
    pub(crate) async fn start(script: Vec<Answer>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let addr = listener.local_addr().expect("the bound address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let task = tokio::spawn({
            let received = Arc::clone(&received);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (received, script) = (Arc::clone(&received), Arc::clone(&script));
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            let (received, script) = (Arc::clone(&received), Arc::clone(&script));
                            async move { answer(request, &received, &script).await }
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
            received,
            task,
        }
    }

    /// The endpoint to configure an exporter with.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in the order received.
    pub(crate) fn received(&self) -> MutexGuard<'_, Vec<Received>> {
        self.received.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    request: Request<Incoming>,
    received: &Mutex<Vec<Received>>,
    script: &Mutex<VecDeque<Answer>>,
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
    let body = ExportMetricsServiceRequest::decode(body).expect("an OTLP metrics request");
    let next = script.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
    let (status, answer_type, answer_body) = next.unwrap_or_else(|| {
        let ok = ExportMetricsServiceResponse::default().encode_to_vec();
        (200, "application/x-protobuf", ok)
    });
    received
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Received {
            path,
            content_type,
            tenant,
            status,
            body,
        });
    let mut response = Response::new(Full::new(Bytes::from(answer_body)));
    *response.status_mut() = hyper::StatusCode::from_u16(status).expect("a status");
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static(answer_type),
    );
    Ok(response)
}

/// The metrics of an export's one resource and scope.
pub(crate) fn metrics_of(request: &ExportMetricsServiceRequest) -> &[Metric] {
    &request.resource_metrics[0].scope_metrics[0].metrics
}

/// Metric `name` of an export, if it has it.
pub(crate) fn find<'a>(request: &'a ExportMetricsServiceRequest, name: &str) -> Option<&'a Metric> {
    metrics_of(request).iter().find(|m| m.name == name)
}

/// Metric `name` of an export, which must have it.
pub(crate) fn exported<'a>(request: &'a ExportMetricsServiceRequest, name: &str) -> &'a Metric {
    find(request, name).unwrap_or_else(|| panic!("no metric {name}"))
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
pub(crate) fn sum_points(metric: &Metric) -> &[NumberDataPoint] {
    match &metric.data {
        Some(metric::Data::Sum(sum)) => {
            assert!(sum.is_monotonic, "{} is not monotonic", metric.name);
            assert_cumulative(metric, sum.aggregation_temporality);
            &sum.data_points
        }
        other => panic!("{} is not a sum: {other:?}", metric.name),
    }
}

/// A gauge's points.
pub(crate) fn gauge_points(metric: &Metric) -> &[NumberDataPoint] {
    match &metric.data {
        Some(metric::Data::Gauge(gauge)) => &gauge.data_points,
        other => panic!("{} is not a gauge: {other:?}", metric.name),
    }
}

/// A histogram's points, checked to be cumulative.
pub(crate) fn histogram_points(metric: &Metric) -> &[HistogramDataPoint] {
    match &metric.data {
        Some(metric::Data::Histogram(histogram)) => {
            assert_cumulative(metric, histogram.aggregation_temporality);
            &histogram.data_points
        }
        other => panic!("{} is not a histogram: {other:?}", metric.name),
    }
}

/// A counter's value.
pub(crate) fn int(point: &NumberDataPoint) -> i64 {
    match point.value {
        Some(number_data_point::Value::AsInt(v)) => v,
        other => panic!("a counter's value is an integer, not {other:?}"),
    }
}

/// A gauge's value.
pub(crate) fn double(point: &NumberDataPoint) -> f64 {
    match point.value {
        Some(number_data_point::Value::AsDouble(v)) => v,
        other => panic!("a gauge's value is a double, not {other:?}"),
    }
}

/// Attributes as (key, string value) pairs, in their order.
pub(crate) fn pairs(attributes: &[KeyValue]) -> Vec<(String, String)> {
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

/// Checks that `metric` is exported as `spec` declares it: its
/// description, its unit in OTLP's notation and its kind. Returns how many
/// points it has.
pub(crate) fn check_declared(metric: &Metric, spec: &MetricSpec) -> usize {
    assert_eq!(metric.description, spec.help, "{}", spec.name);
    let unit = match spec.unit {
        None => "",
        Some(MetricUnit::Bytes) => "By",
        Some(MetricUnit::Seconds) => "s",
        Some(MetricUnit::Milliseconds) => "ms",
    };
    assert_eq!(metric.unit, unit, "{}", spec.name);
    match spec.kind {
        MetricKind::Counter => sum_points(metric).len(),
        MetricKind::Gauge => gauge_points(metric).len(),
        MetricKind::Histogram => histogram_points(metric).len(),
    }
}
