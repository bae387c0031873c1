//! The HTTP endpoint: `/healthz`, `/readyz`, `/status` and (with the
//! `prometheus` feature, when asked for) `/metrics`, on hyper's HTTP/1.1
//! server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use kcl_core::worker::WorkerHandle;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::liveness::Liveness;
use super::readiness::Probe;
use super::status;
use crate::Error;

/// The metrics an endpoint renders at `/metrics`.
#[cfg(feature = "prometheus")]
type Metrics = Arc<super::registry::Registry>;
/// Without the `prometheus` feature no endpoint has metrics.
#[cfg(not(feature = "prometheus"))]
#[derive(Debug, Clone)]
enum Metrics {}

#[cfg(feature = "prometheus")]
fn render(metrics: &Metrics) -> String {
    super::prometheus::render(metrics)
}
#[cfg(not(feature = "prometheus"))]
fn render(metrics: &Metrics) -> String {
    match *metrics {}
}

/// Connections served at once; more are closed at accept. Probes and
/// scrapes are a handful per period, so this only bounds a misbehaving
/// client.
const MAX_CONNECTIONS: usize = 64;

/// How long a client may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest one connection is served. Reading a request is bounded
/// above, writing its response is not: a client that stops reading (or a
/// peer gone behind a partition, which TCP gives up on only after about
/// 15 minutes) held its slot while the write blocked, and 64 of them
/// turned every probe away at accept. A scrape, probe or status read takes
/// well under a second; a client that keeps its connection longer
/// connects again.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);

/// A bound listening socket and the recorder it serves, if any, made at
/// `build()` so that a taken port fails there and the bound address (port
/// 0 picks a free one) is known before `run`.
#[derive(Debug)]
pub(crate) struct Endpoint {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    metrics: Option<Metrics>,
}

/// What every endpoint of one worker answers from.
#[derive(Debug)]
pub(crate) struct Probes {
    pub(crate) worker: WorkerHandle,
    pub(crate) worker_id: String,
    pub(crate) readiness: Probe,
    pub(crate) liveness: Liveness,
}

impl Endpoint {
    /// Binds `addr` for the probes alone; no metrics recorder is touched,
    /// so this works whatever recorder the application installed.
    pub(crate) fn health(addr: SocketAddr) -> Result<Self, Error> {
        Self::bind(addr, "serve_health", None)
    }

    /// Installs (or reuses) the Prometheus recorder and binds `addr`.
    #[cfg(feature = "prometheus")]
    pub(crate) fn metrics(addr: SocketAddr) -> Result<Self, Error> {
        let metrics = super::prometheus::registry()?;
        Self::bind(addr, "serve_metrics", Some(metrics))
    }

    fn bind(
        addr: SocketAddr,
        setting: &'static str,
        metrics: Option<Metrics>,
    ) -> Result<Self, Error> {
        let bind = || {
            let listener = std::net::TcpListener::bind(addr)?;
            // Required by tokio's from_std.
            listener.set_nonblocking(true)?;
            let bound = listener.local_addr()?;
            Ok::<_, std::io::Error>((listener, bound))
        };
        let (listener, bound) = bind().map_err(|source| crate::error::Repr::MetricsBind {
            addr,
            setting,
            source,
        })?;
        Ok(Endpoint {
            listener,
            addr: bound,
            metrics,
        })
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `stop` is cancelled, then closes the listener and every
    /// connection.
    pub(crate) async fn serve(self, probes: Arc<Probes>, stop: CancellationToken) {
        let listener = match tokio::net::TcpListener::from_std(self.listener) {
            Ok(listener) => listener,
            Err(e) => {
                warn!(addr = %self.addr, error = %e, "cannot serve metrics; continuing without them");
                return;
            }
        };
        match &self.metrics {
            Some(_) => info!(addr = %self.addr, "serving /metrics, /healthz, /readyz and /status"),
            None => info!(addr = %self.addr, "serving /healthz, /readyz and /status"),
        }
        let state = Arc::new(State {
            metrics: self.metrics,
            probes,
        });
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        if connections.len() >= MAX_CONNECTIONS {
                            debug!(%peer, "too many metrics connections; closing this one");
                            continue;
                        }
                        connections.spawn(serve_connection(stream, Arc::clone(&state)));
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: wait, retry.
                        warn!(error = %e, "accepting a metrics connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        connections.shutdown().await;
        debug!(addr = %self.addr, "metrics endpoint stopped");
    }
}

pub(super) struct State {
    metrics: Option<Metrics>,
    probes: Arc<Probes>,
}

impl State {
    /// The state of an endpoint without metrics.
    #[cfg(test)]
    pub(super) fn probes_only(probes: Arc<Probes>) -> Self {
        State {
            metrics: None,
            probes,
        }
    }
}

pub(super) async fn serve_connection<S>(stream: S, state: Arc<State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let state = Arc::clone(&state);
        async move {
            let response = respond(request.method(), request.uri().path(), &state);
            Ok::<_, Infallible>(response)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_DEADLINE, served).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(error = %e, "metrics connection ended with an error"),
        Err(_) => debug!("metrics connection open past its deadline; closed"),
    }
}

pub(super) fn respond(method: &Method, path: &str, state: &State) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".into());
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let probes = &state.probes;
    match path {
        "/metrics" => match &state.metrics {
            Some(metrics) => {
                let mut response = text(StatusCode::OK, render(metrics));
                response.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                response
            }
            None => text(
                StatusCode::NOT_FOUND,
                "no metrics here: this address serves /healthz, /readyz and /status \
                 (serve_metrics, feature `prometheus`, serves /metrics)\n"
                    .into(),
            ),
        },
        "/healthz" => match probes.liveness.check() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("stalled: {why}\n")),
        },
        "/readyz" => match probes.readiness.check() {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        "/status" => {
            let body = status::render(
                &probes.worker,
                &probes.worker_id,
                probes.readiness.check(),
                probes.liveness.check(),
            );
            let mut response = text(StatusCode::OK, body);
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; this endpoint serves /healthz, /readyz, /status and, with metrics, /metrics\n"
                .into(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
