//! A fault-injecting HTTP/1.1 proxy for DynamoDB, written for the chaos
//! tests: it listens on 127.0.0.1 (a free port), forwards every request to
//! an upstream (DynamoDB Local) and, by configurable probabilities drawn
//! from a seeded RNG, delays the answer, answers `500 InternalServerError`,
//! answers `400 ProvisionedThroughputExceededException`, or forwards the
//! request and then closes the connection without answering (the write
//! applied, the client sees a lost response). A "blackhole" on one lease
//! key accepts every request naming that key and never answers nor
//! forwards it (a request stuck on a dead connection). Every decision is
//! counted.
//!
//! # Concurrency model
//!
//! [`FaultProxy::start`] spawns one accept task that owns a `JoinSet` of
//! connection tasks. Dropping the [`FaultProxy`] aborts the accept task,
//! which drops the `JoinSet` and so aborts every connection: nothing
//! outlives the proxy. Each connection task serves one client connection
//! and opens one upstream connection per request, driven inside the same
//! task (no detached tasks). The RNG and the fault settings sit behind
//! short-lived mutexes, never held across an await.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

/// Most client connections served at once; more are closed at accept.
const MAX_CONNECTIONS: usize = 256;

/// How long forwarding one request to the upstream may take before the
/// proxy answers 502 (which the SDK retries like a 500).
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);

/// The DynamoDB JSON protocol's content type; the SDK maps the `__type` of
/// an error body sent with it to the modelled error.
const AMZ_JSON: &str = "application/x-amz-json-1.0";

/// Fault probabilities, each in `0.0..=1.0`. The error kinds are exclusive
/// (one draw picks at most one of them, so their sum must not exceed 1);
/// latency is drawn independently. A delayed request that is forwarded is
/// applied at once and answered late (or its answer dropped late); an
/// injected error is answered late.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// Chance of a `500 InternalServerError` instead of forwarding.
    pub internal_error: f64,
    /// Chance of a `400 ProvisionedThroughputExceededException` instead of
    /// forwarding.
    pub throttle: f64,
    /// Chance of forwarding the request and then closing the connection
    /// without answering.
    pub drop_response: f64,
    /// Chance of a delay (see above).
    pub latency: f64,
    /// The delay is uniform in `0..=max_latency`.
    pub max_latency: Duration,
}

impl Faults {
    /// No faults: a plain forwarding proxy.
    pub const NONE: Faults = Faults {
        internal_error: 0.0,
        throttle: 0.0,
        drop_response: 0.0,
        latency: 0.0,
        max_latency: Duration::ZERO,
    };

    /// Every request answered with `500 InternalServerError` (an outage).
    pub const OUTAGE: Faults = Faults {
        internal_error: 1.0,
        throttle: 0.0,
        drop_response: 0.0,
        latency: 0.0,
        max_latency: Duration::ZERO,
    };
}

/// What the proxy did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultCounts {
    /// Requests received.
    pub requests: u64,
    /// Requests forwarded upstream and answered.
    pub forwarded: u64,
    /// Requests answered late.
    pub delayed: u64,
    /// `500 InternalServerError` answers.
    pub internal_errors: u64,
    /// `400 ProvisionedThroughputExceededException` answers.
    pub throttles: u64,
    /// Requests forwarded whose response was dropped.
    pub dropped_responses: u64,
    /// Requests the upstream did not answer (the proxy answered 502).
    pub upstream_failures: u64,
    /// Requests swallowed by the blackhole.
    pub blackholed: u64,
    /// `TransactionCanceledException` answers with a `TransactionConflict`.
    pub conflicts: u64,
}

impl FaultCounts {
    /// Faults injected, all kinds together (delays included).
    pub fn injected(&self) -> u64 {
        self.delayed
            + self.internal_errors
            + self.throttles
            + self.dropped_responses
            + self.blackholed
            + self.conflicts
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    forwarded: AtomicU64,
    delayed: AtomicU64,
    internal_errors: AtomicU64,
    throttles: AtomicU64,
    dropped_responses: AtomicU64,
    upstream_failures: AtomicU64,
    blackholed: AtomicU64,
    conflicts: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    faults: Mutex<Faults>,
    /// The JSON fragment naming the blackholed lease key.
    blackhole: Mutex<Option<String>>,
    /// Faults go only to requests of this operation (`X-Amz-Target`
    /// suffix), when set; the rest are forwarded untouched.
    only: Mutex<Option<String>>,
    /// Chance that a TransactWriteItems is answered with a conflict.
    conflicts: Mutex<f64>,
    rng: Mutex<SmallRng>,
    counters: Counters,
}

impl Shared {
    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One request's fate, drawn under the RNG lock.
    fn decide(&self) -> (Fate, Option<Duration>) {
        let f = *self.faults();
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let roll: f64 = rng.random();
        let fate = if roll < f.internal_error {
            Fate::InternalError
        } else if roll < f.internal_error + f.throttle {
            Fate::Throttle
        } else if roll < f.internal_error + f.throttle + f.drop_response {
            Fate::DropResponse
        } else {
            Fate::Forward
        };
        let delay = (f.latency > 0.0 && rng.random::<f64>() < f.latency)
            .then(|| Duration::from_micros(rng.random_range(0..=f.max_latency.as_micros() as u64)));
        (fate, delay)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Forward,
    InternalError,
    Throttle,
    DropResponse,
}

/// A running proxy; it stops (closing every connection) when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (an `http://host:port` URL,
    /// such as `AWS_ENDPOINT_URL_DYNAMODB`) with the given faults, drawing
    /// them from an RNG seeded with `seed`. Needs a tokio runtime.
    pub async fn start(upstream: &str, faults: Faults, seed: u64) -> anyhow::Result<FaultProxy> {
        let authority = upstream
            .strip_prefix("http://")
            .with_context(|| format!("the fault proxy speaks plain HTTP; upstream {upstream:?}"))?
            .trim_end_matches('/');
        let upstream = tokio::net::lookup_host(authority)
            .await
            .with_context(|| format!("resolving {authority}"))?
            .next()
            .with_context(|| format!("{authority} resolves to no address"))?;
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the fault proxy")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            faults: Mutex::new(faults),
            blackhole: Mutex::new(None),
            only: Mutex::new(None),
            conflicts: Mutex::new(0.0),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
            counters: Counters::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(FaultProxy {
            addr,
            shared,
            accept,
        })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy as an endpoint URL, for `AWS_ENDPOINT_URL_DYNAMODB`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes the fault probabilities from the next request on.
    pub fn set_faults(&self, faults: Faults) {
        *self.shared.faults() = faults;
    }

    /// Swallows every later request that names lease key `key` (a GetItem,
    /// UpdateItem, PutItem or DeleteItem of that lease, or a scan page
    /// starting after it): accepted, never forwarded, never answered, as a
    /// request on a dead connection. `None` lifts it (requests already
    /// swallowed stay unanswered).
    pub fn set_blackhole(&self, key: Option<&str>) {
        // As the SDK serialises a key: `"leaseKey":{"S":"<key>"}`.
        let fragment =
            key.map(|k| format!("\"leaseKey\":{{\"S\":{}}}", serde_json::Value::from(k)));
        *self
            .shared
            .blackhole
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = fragment;
    }

    /// Swallows every later request, as [`Self::set_blackhole`] does those
    /// of one lease: an endpoint that stopped answering.
    pub fn set_blackhole_all(&self) {
        // Every request's body contains the empty fragment.
        *self
            .shared
            .blackhole
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(String::new());
    }

    /// Injects faults only into requests of `operation` (as in
    /// `X-Amz-Target: DynamoDB_20120810.<operation>`); `None` into all.
    pub fn set_only(&self, operation: Option<&str>) {
        *self.shared.only.lock().unwrap_or_else(|e| e.into_inner()) =
            operation.map(|o| format!(".{o}"));
    }

    /// Answers this share of `TransactWriteItems` requests (before the
    /// other faults are drawn) with `TransactionCanceledException` whose
    /// every reason is `TransactionConflict`, as DynamoDB answers a
    /// transaction that raced another on one of its items.
    pub fn set_transaction_conflicts(&self, chance: f64) {
        *self
            .shared
            .conflicts
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = chance;
    }

    /// The current fault probabilities.
    pub fn faults(&self) -> Faults {
        *self.shared.faults()
    }

    /// What the proxy did so far.
    pub fn counts(&self) -> FaultCounts {
        let c = &self.shared.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultCounts {
            requests: l(&c.requests),
            forwarded: l(&c.forwarded),
            delayed: l(&c.delayed),
            internal_errors: l(&c.internal_errors),
            throttles: l(&c.throttles),
            dropped_responses: l(&c.dropped_responses),
            upstream_failures: l(&c.upstream_failures),
            blackholed: l(&c.blackholed),
            conflicts: l(&c.conflicts),
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Dropped with this task when the proxy is: every connection ends too.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if connections.len() < MAX_CONNECTIONS {
                        connections.spawn(serve_connection(stream, Arc::clone(&shared)));
                    }
                }
                // Out of file descriptors and the like: wait, retry.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    // Set by a request whose response is to be dropped: the connection is
    // then dropped mid-request, so the client reads EOF instead of an answer.
    let drop_now = Arc::new(Notify::new());
    let signal = Arc::clone(&drop_now);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let shared = Arc::clone(&shared);
        let drop_now = Arc::clone(&drop_now);
        async move { Ok::<_, Infallible>(handle(&shared, &drop_now, request).await) }
    });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = connection => {}
        () = signal.notified() => {}
    }
}

async fn handle(
    shared: &Shared,
    drop_now: &Notify,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let c = &shared.counters;
    c.requests.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = request.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return amz_error(
            StatusCode::BAD_REQUEST,
            "SerializationException",
            "unreadable request body",
        );
    };
    let blackhole = shared
        .blackhole
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(fragment) = blackhole
        && String::from_utf8_lossy(&body).contains(&fragment)
    {
        c.blackholed.fetch_add(1, Ordering::Relaxed);
        std::future::pending::<()>().await;
    }
    let target = parts
        .headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let only = shared
        .only
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if only.as_ref().is_some_and(|o| !target.ends_with(o.as_str())) {
        return match tokio::time::timeout(UPSTREAM_TIMEOUT, forward(shared.upstream, parts, body))
            .await
        {
            Ok(Ok(response)) => {
                c.forwarded.fetch_add(1, Ordering::Relaxed);
                response
            }
            _ => {
                c.upstream_failures.fetch_add(1, Ordering::Relaxed);
                amz_error(
                    StatusCode::BAD_GATEWAY,
                    "InternalServerError",
                    "the fault proxy could not reach DynamoDB",
                )
            }
        };
    }
    if target.ends_with(".TransactWriteItems") {
        let chance = *shared.conflicts.lock().unwrap_or_else(|e| e.into_inner());
        let roll: f64 = shared
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .random();
        if roll < chance {
            c.conflicts.fetch_add(1, Ordering::Relaxed);
            return conflict(&body);
        }
    }
    let (fate, delay) = shared.decide();
    if let Some(delay) = delay {
        c.delayed.fetch_add(1, Ordering::Relaxed);
        if fate != Fate::Forward && fate != Fate::DropResponse {
            tokio::time::sleep(delay).await;
        }
    }
    match fate {
        Fate::InternalError => {
            c.internal_errors.fetch_add(1, Ordering::Relaxed);
            return amz_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "internal server error injected by the fault proxy",
            );
        }
        Fate::Throttle => {
            c.throttles.fetch_add(1, Ordering::Relaxed);
            return amz_error(
                StatusCode::BAD_REQUEST,
                "ProvisionedThroughputExceededException",
                "throttling injected by the fault proxy",
            );
        }
        Fate::Forward | Fate::DropResponse => {}
    }
    let response =
        match tokio::time::timeout(UPSTREAM_TIMEOUT, forward(shared.upstream, parts, body)).await {
            Ok(Ok(response)) => response,
            Ok(Err(_)) | Err(_) => {
                c.upstream_failures.fetch_add(1, Ordering::Relaxed);
                return amz_error(
                    StatusCode::BAD_GATEWAY,
                    "InternalServerError",
                    "the fault proxy could not reach DynamoDB",
                );
            }
        };
    // Latency on the way back: the request applied at once, the answer is
    // late. (Holding the request instead would let a killed process's
    // write land seconds after its death, which no real network does: a
    // dead client's unsent bytes are reset with its socket.)
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    if fate == Fate::DropResponse {
        c.dropped_responses.fetch_add(1, Ordering::Relaxed);
        drop_now.notify_one();
        // The connection is dropped before this resolves.
        std::future::pending::<()>().await;
    }
    c.forwarded.fetch_add(1, Ordering::Relaxed);
    response
}

/// A `TransactionCanceledException` with one `TransactionConflict` reason
/// per item of the transaction in `body`.
fn conflict(body: &[u8]) -> Response<Full<Bytes>> {
    let items = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("TransactItems")?.as_array().map(Vec::len))
        .unwrap_or(1);
    let reasons: Vec<serde_json::Value> = (0..items)
        .map(|_| serde_json::json!({ "Code": "TransactionConflict", "Message": "Transaction is ongoing for the item" }))
        .collect();
    amz_json(
        StatusCode::BAD_REQUEST,
        &serde_json::json!({
            "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
            "message": "Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict] (injected by the fault proxy)",
            "CancellationReasons": reasons,
        }),
    )
}

/// Headers that describe one hop's connection, not the message.
fn hop_by_hop(name: &header::HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::CONTENT_LENGTH
        || name == header::TE
        || name == header::UPGRADE
        || name == header::PROXY_AUTHORIZATION
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Sends `request` to `addr` on a fresh HTTP/1 connection, as it is, and
/// reads the whole response.
pub async fn exchange(
    addr: impl tokio::net::ToSocketAddrs,
    request: Request<Full<Bytes>>,
) -> anyhow::Result<(hyper::http::response::Parts, Bytes)> {
    let io = TcpStream::connect(addr).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    let exchange = async move {
        let response = sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        // Dropping the sender lets the connection future finish.
        drop(sender);
        anyhow::Ok((parts, body))
    };
    // The connection is driven here, next to the exchange, not spawned.
    let (_, exchanged) = tokio::join!(connection, exchange);
    exchanged
}

/// Sends one request upstream on a fresh connection and reads the whole
/// response.
async fn forward(
    upstream: SocketAddr,
    parts: hyper::http::request::Parts,
    body: Bytes,
) -> anyhow::Result<Response<Full<Bytes>>> {
    let mut outgoing = Request::builder().method(parts.method).uri(parts.uri);
    for (name, value) in parts.headers.iter().filter(|(n, _)| !hop_by_hop(n)) {
        outgoing = outgoing.header(name, value);
    }
    let outgoing = outgoing.body(Full::new(body))?;
    let (parts, body) = exchange(upstream, outgoing).await?;
    let mut response = Response::builder().status(parts.status);
    for (name, value) in parts.headers.iter().filter(|(n, _)| !hop_by_hop(n)) {
        response = response.header(name, value);
    }
    Ok(response.body(Full::new(body))?)
}

/// An error as DynamoDB sends it: the JSON protocol's `__type` names the
/// modelled error, which the SDK maps (and retries when it is transient or
/// throttling).
fn amz_error(status: StatusCode, kind: &str, message: &str) -> Response<Full<Bytes>> {
    amz_json(
        status,
        &serde_json::json!({
            "__type": format!("com.amazonaws.dynamodb.v20120810#{kind}"),
            "message": message,
        }),
    )
}

/// A DynamoDB JSON-protocol answer with `body`.
fn amz_json(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(AMZ_JSON));
    response.headers_mut().insert(
        "x-amzn-requestid",
        HeaderValue::from_static("fault-proxy-injected"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(faults: Faults) -> Shared {
        Shared {
            upstream: SocketAddr::from(([127, 0, 0, 1], 1)),
            faults: Mutex::new(faults),
            blackhole: Mutex::new(None),
            only: Mutex::new(None),
            conflicts: Mutex::new(0.0),
            rng: Mutex::new(SmallRng::seed_from_u64(7)),
            counters: Counters::default(),
        }
    }

    #[test]
    fn draws_follow_the_probabilities() {
        let s = shared(Faults {
            internal_error: 0.1,
            throttle: 0.2,
            drop_response: 0.3,
            latency: 0.5,
            max_latency: Duration::from_millis(100),
        });
        let n = 20_000;
        let mut kinds = [0usize; 4];
        let mut delayed = 0;
        for _ in 0..n {
            let (fate, delay) = s.decide();
            kinds[fate as usize] += 1;
            if let Some(d) = delay {
                assert!(d <= Duration::from_millis(100));
                delayed += 1;
            }
        }
        for (fate, expected) in [
            (Fate::Forward, 0.4),
            (Fate::InternalError, 0.1),
            (Fate::Throttle, 0.2),
            (Fate::DropResponse, 0.3),
        ] {
            let share = kinds[fate as usize] as f64 / n as f64;
            assert!((share - expected).abs() < 0.02, "{fate:?}: {kinds:?}");
        }
        assert!((delayed as f64 / n as f64 - 0.5).abs() < 0.02, "{delayed}");
    }

    #[test]
    fn no_faults_always_forwards() {
        let s = shared(Faults::NONE);
        for _ in 0..1000 {
            assert_eq!(s.decide(), (Fate::Forward, None));
        }
    }
}
