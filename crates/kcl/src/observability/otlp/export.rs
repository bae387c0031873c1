//! [`OtlpExporter`]: posts the registry's state to the collector every
//! interval, retries a failed export with backoff until the next one is
//! due, and exports once more when stopped.
//!
//! Every export carries cumulative values, so a lost or repeated export
//! loses or doubles nothing: a retry just sends the state as it is then,
//! and the next export supersedes a failed one.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER, USER_AGENT};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kcl_core::ConfigError;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use prost::Message;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::encode;
use super::registry::{Registry, unix_nanos};
use super::settings::Validated;

/// The first retry of a failed export waits about this long; each next
/// one twice as long, up to the interval.
const INITIAL_BACKOFF: Duration = Duration::from_secs(1);

/// The most of a collector's answer read (an OTLP answer is a few bytes;
/// an error page is cut here).
const MAX_RESPONSE: usize = 64 * 1024;

/// How much of an error answer a log line or error quotes.
const MAX_QUOTED: usize = 300;

/// Pushes what an [`OtlpRecorder`](super::OtlpRecorder) aggregated to the
/// collector. Made with the recorder by
/// [`OtlpMetrics::build`](super::OtlpMetrics::build); cheap to clone (the
/// clones share one exporter).
#[derive(Clone)]
pub struct OtlpExporter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("url", &self.inner.url)
            .field("interval", &self.inner.interval)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Counts of an [`OtlpExporter`]'s work, from [`OtlpExporter::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OtlpStats {
    /// Exports the collector accepted.
    pub exports: u64,
    /// Export attempts that failed (each retry counts).
    pub failed_exports: u64,
    /// Series held (at most `max_series`).
    pub series: usize,
    /// Measurements dropped because `max_series` series were held.
    pub measurements_dropped: u64,
}

/// Why one export failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtlpExportError {
    /// The collector did not answer within the timeout.
    #[error("the collector did not answer within {0:?}")]
    Timeout(Duration),
    /// The request could not be made or its answer not read (connection
    /// refused or reset, TLS handshake failed, ...).
    #[error("cannot reach the collector: {0}")]
    Transport(String),
    /// The collector answered with an error status.
    #[error("the collector answered {status}: {message}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The collector's reason (its `google.rpc.Status` message, or
        /// the start of its answer).
        message: String,
        /// How long the collector asked to wait (`Retry-After`), if it did.
        retry_after: Option<Duration>,
    },
}

impl OtlpExportError {
    /// Whether trying again can help: OTLP/HTTP's retryable statuses
    /// (429, 502, 503, 504), timeouts and transport errors. Any other
    /// answer is a request the collector will keep refusing.
    pub fn is_retryable(&self) -> bool {
        match self {
            OtlpExportError::Timeout(_) | OtlpExportError::Transport(_) => true,
            OtlpExportError::Rejected { status, .. } => matches!(status, 429 | 502 | 503 | 504),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            OtlpExportError::Rejected { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

struct Inner {
    registry: Arc<Registry>,
    url: Uri,
    headers: HeaderMap,
    resource: Vec<(String, String)>,
    interval: Duration,
    timeout: Duration,
    client: Client,
    /// When the exporter was made: the start of its own counter.
    started: u64,
    /// Held by the one `run_until` that exports periodically; others
    /// (a second worker sharing the exporter) wait for their turn.
    turn: tokio::sync::Mutex<()>,
    exports: AtomicU64,
    failed_exports: AtomicU64,
    /// Failed attempts since the last success: the streak that is logged
    /// once, at its first failure.
    streak: AtomicU64,
    /// Whether a partial success (points the collector rejected) was
    /// logged in this run of them.
    partial_logged: AtomicBool,
    /// The first retry's wait (tests shorten it).
    initial_backoff: Duration,
}

/// The HTTP client, plain or with TLS, as the endpoint's scheme says.
enum Client {
    Http(HyperClient<HttpConnector, Full<Bytes>>),
    Https(HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>),
}

impl Client {
    fn new(url: &Uri, timeout: Duration) -> Result<Self, ConfigError> {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        http.set_nodelay(true);
        let mut builder = HyperClient::builder(TokioExecutor::new());
        builder.pool_timer(TokioTimer::new());
        if url.scheme_str() == Some("https") {
            http.enforce_http(false);
            let provider = rustls::crypto::aws_lc_rs::default_provider();
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_native_roots(provider)
                .map_err(|e| ConfigError {
                    field: "endpoint",
                    reason: format!(
                        "{url} is https, but the platform's root certificates cannot be loaded: {e}"
                    ),
                })?
                .https_only()
                .enable_http1()
                .wrap_connector(http);
            Ok(Client::Https(builder.build(https)))
        } else {
            Ok(Client::Http(builder.build(http)))
        }
    }

    async fn request(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        match self {
            Client::Http(client) => client.request(request).await,
            Client::Https(client) => client.request(request).await,
        }
    }
}

impl OtlpExporter {
    pub(super) fn new(registry: Arc<Registry>, settings: Validated) -> Result<Self, ConfigError> {
        let client = Client::new(&settings.url, settings.timeout)?;
        Ok(OtlpExporter {
            inner: Arc::new(Inner {
                registry,
                url: settings.url,
                headers: settings.headers,
                resource: settings.resource,
                interval: settings.interval,
                timeout: settings.timeout,
                client,
                started: unix_nanos(SystemTime::now()),
                turn: tokio::sync::Mutex::new(()),
                exports: AtomicU64::new(0),
                failed_exports: AtomicU64::new(0),
                streak: AtomicU64::new(0),
                partial_logged: AtomicBool::new(false),
                initial_backoff: INITIAL_BACKOFF,
            }),
        })
    }

    /// The same exporter with a shorter first retry, for tests.
    #[cfg(test)]
    pub(super) fn with_initial_backoff(self, backoff: Duration) -> Self {
        let inner = Arc::try_unwrap(self.inner)
            .unwrap_or_else(|_| panic!("with_initial_backoff on a shared exporter"));
        OtlpExporter {
            inner: Arc::new(Inner {
                initial_backoff: backoff,
                ..inner
            }),
        }
    }

    /// The URL the metrics are POSTed to.
    pub fn url(&self) -> &Uri {
        &self.inner.url
    }

    /// What the exporter did so far.
    pub fn stats(&self) -> OtlpStats {
        OtlpStats {
            exports: self.inner.exports.load(Ordering::Relaxed),
            failed_exports: self.inner.failed_exports.load(Ordering::Relaxed),
            series: self.inner.registry.series_count(),
            measurements_dropped: self.inner.registry.dropped(),
        }
    }

    /// Exports every interval until `signal` completes, then once more
    /// (bounded by the timeout), so that the last counts reach the
    /// collector. A failed export is retried with exponential backoff
    /// (honouring the collector's `Retry-After`) until the next one is
    /// due; the first failure of a streak is logged at warn level, its
    /// end at info. Never returns early and never panics on a collector's
    /// failure.
    ///
    /// If several run at once (workers of one process sharing the
    /// exporter), one exports periodically and the others wait for their
    /// turn; each exports once at its end.
    pub async fn run_until(&self, signal: impl Future<Output = ()>) {
        let mut signal = std::pin::pin!(signal);
        let turn = tokio::select! {
            turn = self.inner.turn.lock() => Some(turn),
            () = &mut signal => None,
        };
        if let Some(_turn) = turn {
            self.periodic(&mut signal).await;
        }
        // The final export: the state at the end, tried once.
        let _ = self.export_now().await;
    }

    /// Exports every interval until `signal` completes.
    async fn periodic(&self, mut signal: impl Future<Output = ()> + Unpin) {
        let mut next = Instant::now() + self.inner.interval;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = &mut signal => return,
            }
            next = Instant::now() + self.inner.interval;
            tokio::select! {
                _ = self.export_with_retries(next) => {}
                () = &mut signal => return,
            }
        }
    }

    /// Exports now, retrying a retryable failure with backoff while the
    /// retry would start before `until` (when the next regular export
    /// carries the same, newer, state).
    pub(super) async fn export_with_retries(&self, until: Instant) -> Result<(), OtlpExportError> {
        let mut backoff = self.inner.initial_backoff;
        loop {
            let error = match self.export_now().await {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            if !error.is_retryable() {
                return Err(error);
            }
            // Jittered so that a fleet restarted together does not retry
            // in step.
            let wait = backoff.mul_f64(rand::random_range(0.5..1.0));
            let wait = error.retry_after().map_or(wait, |asked| asked.max(wait));
            let Some(retry_at) = retry_at(Instant::now(), wait, until) else {
                return Err(error);
            };
            tokio::time::sleep_until(retry_at).await;
            backoff = (backoff * 2).min(self.inner.interval);
        }
    }

    /// Exports the current state once, counting and logging the outcome.
    pub async fn export_now(&self) -> Result<(), OtlpExportError> {
        let result = self.send().await;
        let inner = &self.inner;
        match &result {
            Ok(()) => {
                inner.exports.fetch_add(1, Ordering::Relaxed);
                let failed = inner.streak.swap(0, Ordering::Relaxed);
                if failed > 0 {
                    info!(
                        url = %inner.url,
                        failed_attempts = failed,
                        "OTLP metrics export succeeded again"
                    );
                }
            }
            Err(error) => {
                inner.failed_exports.fetch_add(1, Ordering::Relaxed);
                if inner.streak.fetch_add(1, Ordering::Relaxed) == 0 {
                    warn!(
                        url = %inner.url,
                        %error,
                        "OTLP metrics export failed; retrying (not logged again until an export succeeds)"
                    );
                } else {
                    debug!(url = %inner.url, %error, "OTLP metrics export failed again");
                }
            }
        }
        result
    }

    /// One POST of the current state.
    async fn send(&self) -> Result<(), OtlpExportError> {
        let inner = &self.inner;
        let snapshot = inner.registry.snapshot();
        let now = unix_nanos(SystemTime::now());
        let body = encode::request(
            &inner.registry,
            snapshot,
            &inner.resource,
            inner.started,
            now,
        )
        .encode_to_vec();
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(inner.url.clone())
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-protobuf"),
            )
            .header(
                USER_AGENT,
                HeaderValue::from_static(concat!("kcl-rs/", env!("CARGO_PKG_VERSION"))),
            )
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| OtlpExportError::Transport(e.to_string()))?;
        request.headers_mut().extend(inner.headers.clone());
        let exchange = async {
            let response = inner
                .client
                .request(request)
                .await
                .map_err(|e| OtlpExportError::Transport(error_chain(&e)))?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| OtlpExportError::Transport(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok::<_, OtlpExportError>((parts, body))
        };
        let (parts, body) = tokio::time::timeout(inner.timeout, exchange)
            .await
            .map_err(|_| OtlpExportError::Timeout(inner.timeout))??;
        if !parts.status.is_success() {
            return Err(OtlpExportError::Rejected {
                status: parts.status.as_u16(),
                message: error_message(&parts.headers, &body),
                retry_after: retry_after(parts.status, &parts.headers),
            });
        }
        self.check_partial_success(&body);
        Ok(())
    }

    /// Logs (once per run of them) the data points a collector accepted
    /// the request but rejected.
    fn check_partial_success(&self, body: &Bytes) {
        let partial = ExportMetricsServiceResponse::decode(body.clone())
            .ok()
            .and_then(|r| r.partial_success)
            .filter(|p| p.rejected_data_points > 0 || !p.error_message.is_empty());
        match partial {
            Some(partial) => {
                if !self.inner.partial_logged.swap(true, Ordering::Relaxed) {
                    warn!(
                        url = %self.inner.url,
                        rejected_data_points = partial.rejected_data_points,
                        message = %partial.error_message,
                        "the OTLP collector rejected part of an export (not logged again while it does)"
                    );
                }
            }
            None => self.inner.partial_logged.store(false, Ordering::Relaxed),
        }
    }
}

/// OTLP's error answer, a `google.rpc.Status`, as far as it is read here.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// The reason in an error answer: the status message of a protobuf
/// answer, else the start of the answer as text.
fn error_message(headers: &HeaderMap, body: &Bytes) -> String {
    let protobuf = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-protobuf"));
    if protobuf && let Ok(status) = RpcStatus::decode(body.clone()) {
        return quoted(&status.message);
    }
    quoted(&String::from_utf8_lossy(body))
}

fn quoted(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(MAX_QUOTED) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None if text.is_empty() => "(no reason given)".to_owned(),
        None => text.to_owned(),
    }
}

/// The wait a throttling collector asks for, in seconds (an HTTP date is
/// not honoured: the backoff applies).
fn retry_after(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if !matches!(status.as_u16(), 429 | 503) {
        return None;
    }
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

/// An error and its causes, on one line ("connection refused" hides
/// behind hyper-util's "client error (Connect)").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// When to retry after waiting `wait` from `now`, if before `until` (the
/// next export). A collector may ask for any wait: a `Retry-After` of
/// `u64::MAX` seconds overflowed the clock.
pub(super) fn retry_at(now: Instant, wait: Duration, until: Instant) -> Option<Instant> {
    now.checked_add(wait).filter(|at| *at < until)
}
