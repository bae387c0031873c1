//! The HTTP endpoint: `/metrics`, `/healthz`, `/readyz` on hyper's
//! HTTP/1.1 server.

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
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::readiness::Probe;
use super::recorder;
use crate::Error;

/// Connections served at once; more are closed at accept. Probes and
/// scrapes are a handful per period, so this only bounds a misbehaving
/// client.
const MAX_CONNECTIONS: usize = 64;

/// How long a client may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How often histogram samples are drained even when nobody scrapes, so
/// they never pile up.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// A bound listening socket and the recorder it serves, made at `build()`
/// so that a taken port fails there and the bound address (port 0 picks a
/// free one) is known before `run`.
#[derive(Debug)]
pub(crate) struct Endpoint {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    metrics: PrometheusHandle,
}

impl Endpoint {
    /// Installs (or reuses) the Prometheus recorder and binds `addr`.
    pub(crate) fn bind(addr: SocketAddr) -> Result<Self, Error> {
        let metrics = recorder::handle()?;
        let bind = || {
            let listener = std::net::TcpListener::bind(addr)?;
            // Required by tokio's from_std.
            listener.set_nonblocking(true)?;
            let bound = listener.local_addr()?;
            Ok::<_, std::io::Error>((listener, bound))
        };
        let (listener, bound) =
            bind().map_err(|source| crate::builder::Repr::MetricsBind { addr, source })?;
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
    pub(crate) async fn serve(self, probe: Probe, stop: CancellationToken) {
        let listener = match tokio::net::TcpListener::from_std(self.listener) {
            Ok(listener) => listener,
            Err(e) => {
                warn!(addr = %self.addr, error = %e, "cannot serve metrics; continuing without them");
                return;
            }
        };
        info!(addr = %self.addr, "serving /metrics, /healthz and /readyz");
        let state = Arc::new(State {
            metrics: self.metrics,
            probe,
        });
        let mut connections = JoinSet::new();
        let mut upkeep = tokio::time::interval(UPKEEP_INTERVAL);
        upkeep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = upkeep.tick() => state.metrics.run_upkeep(),
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

struct State {
    metrics: PrometheusHandle,
    probe: Probe,
}

async fn serve_connection(stream: tokio::net::TcpStream, state: Arc<State>) {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(respond(&request, &state)) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        debug!(error = %e, "metrics connection ended with an error");
    }
}

fn respond(request: &Request<Incoming>, state: &State) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".into());
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match request.uri().path() {
        "/metrics" => {
            let mut response = text(StatusCode::OK, state.metrics.render());
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match state.probe.check() {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; this endpoint serves /metrics, /healthz and /readyz\n".into(),
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
