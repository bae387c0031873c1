//! [`OtlpMetrics`]: where and how the metrics are pushed, validated into
//! what the recorder and the exporter are built from.

use std::time::Duration;

use hyper::Uri;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use kcl_core::ConfigError;

use super::registry::Buckets;

/// The path OTLP/HTTP collectors take metrics at, below their base URL.
const METRICS_PATH: &str = "/v1/metrics";

/// Pushes the process's metrics (kcl's and any other recorded through the
/// [`metrics`](https://docs.rs/metrics) facade) to an OpenTelemetry
/// collector over OTLP/HTTP with protobuf encoding (feature `otlp`):
/// every [`interval`](Self::interval), and once more when the worker (or
/// [`OtlpExporter::run_until`](super::OtlpExporter::run_until)) stops.
///
/// Counters are exported as cumulative monotonic sums, gauges as gauges
/// with their last value, histograms as cumulative explicit-bucket
/// histograms (kcl's `*_seconds` histograms from 1 ms to 30 s,
/// `kcl_records_per_batch` from 1 to 10,000, as the Prometheus recorder
/// buckets them). Each metric carries its unit and description from
/// [`crate::metric_names`], each data point its labels as attributes, and
/// the resource `service.name` and `service.instance.id`.
///
/// ```
/// use std::time::Duration;
/// use kcl::observability::OtlpMetrics;
///
/// let otlp = OtlpMetrics::new("http://otel-collector:4318") // POSTs to /v1/metrics
///     .interval(Duration::from_secs(30))
///     .header("authorization", "Bearer secret")
///     .resource_attribute("deployment.environment", "production");
/// let builder = kcl::Worker::builder("orders-counter").export_otlp_metrics(otlp);
/// ```
///
/// An application that installs the recorder itself calls
/// [`build`](Self::build).
#[derive(Clone, PartialEq, derive_more::Debug)]
pub struct OtlpMetrics {
    pub(super) endpoint: String,
    pub(super) interval: Duration,
    pub(super) timeout: Duration,
    // Header values are often credentials: their names only.
    #[debug("{:?}", headers.iter().map(|(name, _)| name).collect::<Vec<_>>())]
    pub(super) headers: Vec<(String, String)>,
    pub(super) service_name: Option<String>,
    pub(super) service_instance_id: Option<String>,
    pub(super) resource_attributes: Vec<(String, String)>,
    pub(super) max_series: usize,
    pub(super) histogram_buckets: Vec<(String, Vec<f64>)>,
}

impl OtlpMetrics {
    /// How often the metrics are exported unless [`Self::interval`] says
    /// otherwise (the OpenTelemetry SDKs' default too).
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
    /// How long one export may take unless [`Self::timeout`] says
    /// otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
    /// How many series are kept unless [`Self::max_series`] says
    /// otherwise: a worker records about 15 per shard it holds, so this
    /// covers well over 1,000 shards.
    pub const DEFAULT_MAX_SERIES: usize = 20_000;

    /// Exports to the collector at `endpoint`, its OTLP/HTTP base URL
    /// (`http://` or `https://`, such as `http://localhost:4318`): the
    /// metrics are POSTed to `<endpoint>/v1/metrics`, or to `endpoint`
    /// itself if its path already ends in `/v1/metrics`. `https://` trusts
    /// the platform's root certificates. Checked at `build()`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        OtlpMetrics {
            endpoint: endpoint.into(),
            interval: Self::DEFAULT_INTERVAL,
            timeout: Self::DEFAULT_TIMEOUT,
            headers: Vec::new(),
            service_name: None,
            service_instance_id: None,
            resource_attributes: Vec::new(),
            max_series: Self::DEFAULT_MAX_SERIES,
            histogram_buckets: Vec::new(),
        }
    }

    kcl_core::setters!(self {
        /// How often to export (default [`Self::DEFAULT_INTERVAL`]). A failed
        /// export is retried with backoff until the next one is due.
        interval(interval: Duration),

        /// How long one export (connecting, sending, reading the answer) may
        /// take before it counts as failed (default
        /// [`Self::DEFAULT_TIMEOUT`]). Also bounds the final export at
        /// shutdown.
        timeout(timeout: Duration),
    });

    /// Sends an HTTP header with every export, such as `authorization`
    /// for a collector that wants credentials (the value is never
    /// logged).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The resource's `service.name` (default: the application name given
    /// to [`crate::Worker::builder`]; `unknown_service` when the
    /// application builds the recorder itself).
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = Some(name.into());
        self
    }

    /// The resource's `service.instance.id` (default: the worker id; none
    /// when the application builds the recorder itself).
    pub fn service_instance_id(mut self, id: impl Into<String>) -> Self {
        self.service_instance_id = Some(id.into());
        self
    }

    /// Adds a resource attribute, such as `deployment.environment` or
    /// `cloud.region`. A `service.name` or `service.instance.id` given
    /// here gives way to [`Self::service_name`] and
    /// [`Self::service_instance_id`].
    pub fn resource_attribute(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.resource_attributes.push((key.into(), value.into()));
        self
    }

    /// The most series (one per metric name and label set) kept in memory
    /// and exported (default [`Self::DEFAULT_MAX_SERIES`]). Measurements of
    /// a new series beyond it are dropped and counted: the
    /// `kcl_otlp_measurements_dropped_total` counter and
    /// [`OtlpStats::measurements_dropped`](super::OtlpStats) say how many,
    /// and the first drop is logged.
    pub fn max_series(mut self, max: usize) -> Self {
        self.max_series = max;
        self
    }

    /// The upper bounds of the buckets of histogram `name`, strictly
    /// increasing (default: kcl's buckets for its own histograms and for
    /// every `*_seconds` one, the OpenTelemetry SDKs' defaults, 0 to
    /// 10,000, for any other).
    pub fn histogram_buckets(mut self, name: impl Into<String>, bounds: &[f64]) -> Self {
        self.histogram_buckets.push((name.into(), bounds.to_vec()));
        self
    }

    /// The recorder, to install with `metrics::set_global_recorder` (or
    /// to combine with others), and the exporter that pushes what it
    /// records: run [`OtlpExporter::run_until`](super::OtlpExporter::run_until)
    /// for as long as the application runs. A worker given these settings
    /// through [`crate::WorkerBuilder::export_otlp_metrics`] does both
    /// itself. Fails with an error naming the setting if one is invalid.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let (recorder, exporter) = kcl::observability::OtlpMetrics::new("http://localhost:4318")
    ///     .service_name("orders-counter")
    ///     .build()?;
    /// metrics::set_global_recorder(recorder)?;
    /// let stop = tokio_util::sync::CancellationToken::new();
    /// let export = tokio::spawn({
    ///     let stop = stop.clone();
    ///     async move { exporter.run_until(stop.cancelled_owned()).await }
    /// });
    /// // ... the application runs its workers ...
    /// stop.cancel();
    /// export.await?; // after a final export
    /// # Ok(())
    /// # }
    /// ```
    pub fn build(self) -> Result<(super::OtlpRecorder, super::OtlpExporter), ConfigError> {
        let validated = self.validate()?;
        super::pair(validated)
    }

    /// These settings with the worker's defaults filled in.
    pub(super) fn with_worker_defaults(mut self, application: &str, worker_id: &str) -> Self {
        let given = |key: &str| self.resource_attributes.iter().any(|(k, _)| k == key);
        if self.service_name.is_none() && !given("service.name") {
            self.service_name = Some(application.to_owned());
        }
        if self.service_instance_id.is_none() && !given("service.instance.id") {
            self.service_instance_id = Some(worker_id.to_owned());
        }
        self
    }

    /// Checks every setting, naming the first one that cannot work.
    pub(super) fn validate(self) -> Result<Validated, ConfigError> {
        let invalid = |field: &'static str, reason: String| ConfigError { field, reason };
        let url = metrics_url(&self.endpoint).map_err(|reason| invalid("endpoint", reason))?;
        if self.interval.is_zero() {
            return Err(invalid("interval", "must be above zero".into()));
        }
        kcl_core::config::at_most_max("interval", self.interval)?;
        kcl_core::config::at_most_max("timeout", self.timeout)?;
        if self.timeout.is_zero() {
            return Err(invalid("timeout", "must be above zero".into()));
        }
        if self.max_series == 0 {
            return Err(invalid(
                "max_series",
                "must be at least 1 (every measurement would be dropped)".into(),
            ));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| invalid("header", format!("{name:?} is not a header name: {e}")))?;
            let mut value = HeaderValue::from_str(value).map_err(|e| {
                invalid(
                    "header",
                    format!("the value of {name:?} is not a header value: {e}"),
                )
            })?;
            value.set_sensitive(true);
            headers.append(header, value);
        }
        for (key, _) in &self.resource_attributes {
            if key.is_empty() {
                return Err(invalid(
                    "resource_attribute",
                    "an attribute key is empty".into(),
                ));
            }
        }
        for (name, bounds) in &self.histogram_buckets {
            check_bounds(bounds)
                .map_err(|reason| invalid("histogram_buckets", format!("of {name:?}: {reason}")))?;
        }
        let mut resource: Vec<(String, String)> = self
            .resource_attributes
            .into_iter()
            .filter(|(key, _)| {
                !(key == "service.name" && self.service_name.is_some()
                    || key == "service.instance.id" && self.service_instance_id.is_some())
            })
            .collect();
        if let Some(id) = self.service_instance_id {
            resource.insert(0, ("service.instance.id".into(), id));
        }
        if !resource.iter().any(|(key, _)| key == "service.name") {
            let name = self
                .service_name
                .unwrap_or_else(|| "unknown_service".to_owned());
            resource.insert(0, ("service.name".into(), name));
        }
        Ok(Validated {
            url,
            interval: self.interval,
            timeout: self.timeout,
            headers,
            resource,
            max_series: self.max_series,
            buckets: Buckets {
                configured: self.histogram_buckets,
            },
        })
    }
}

/// The settings, checked, in the form the recorder and exporter use.
#[derive(Debug)]
pub(super) struct Validated {
    pub(super) url: Uri,
    pub(super) interval: Duration,
    pub(super) timeout: Duration,
    pub(super) headers: HeaderMap,
    /// `service.name` first, then `service.instance.id` if any, then the
    /// application's attributes.
    pub(super) resource: Vec<(String, String)>,
    pub(super) max_series: usize,
    pub(super) buckets: Buckets,
}

fn check_bounds(bounds: &[f64]) -> Result<(), String> {
    if bounds.is_empty() {
        return Err("no bounds given".into());
    }
    if let Some(b) = bounds.iter().find(|b| !b.is_finite()) {
        return Err(format!("{b} is not a finite bound"));
    }
    if let Some(pair) = bounds.windows(2).find(|pair| pair[0] >= pair[1]) {
        return Err(format!(
            "bounds must increase strictly, {} then {} do not",
            pair[0], pair[1]
        ));
    }
    Ok(())
}

/// The URL the metrics are POSTed to, from the collector's base URL.
pub(super) fn metrics_url(endpoint: &str) -> Result<Uri, String> {
    let uri: Uri = endpoint
        .parse()
        .map_err(|e| format!("{endpoint:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => {
            return Err(format!(
                "{endpoint:?}: the scheme must be http or https, not {other} (OTLP/HTTP; gRPC is not supported)"
            ));
        }
        None => {
            return Err(format!(
                "{endpoint:?} has no scheme; write http://{endpoint} or https://{endpoint}"
            ));
        }
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("{endpoint:?} names no host"));
    };
    if uri.query().is_some() {
        return Err(format!("{endpoint:?}: a query string is not supported"));
    }
    let path = uri.path().trim_end_matches('/');
    let path = if path.ends_with(METRICS_PATH) {
        path.to_owned()
    } else {
        format!("{path}{METRICS_PATH}")
    };
    Uri::builder()
        .scheme(uri.scheme_str().unwrap_or("http"))
        .authority(authority.as_str())
        .path_and_query(path)
        .build()
        .map_err(|e| format!("{endpoint:?}: {e}"))
}
