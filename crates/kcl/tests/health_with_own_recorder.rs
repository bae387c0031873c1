//! The health endpoint of a worker whose application installed its own
//! `metrics` recorder: `serve_health` never installs one, so `build()`
//! succeeds and the probes answer over HTTP, with or without the
//! `prometheus` feature. Its own test binary: it sets the global recorder.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use kcl::{ShardContext, Worker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "../src/test_support.rs"]
mod test_support;

use test_support::{NoOp, offline_sdk};

/// One GET over HTTP/1.1: the status code and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: kcl\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").unwrap().1.to_owned();
    (code, body)
}

#[tokio::test]
async fn the_probes_answer_beside_a_recorder_the_application_installed() {
    // The application's own recorder, which drops everything.
    metrics::set_global_recorder(metrics::NoopRecorder).unwrap();
    // A Kinesis endpoint that accepts and never answers: the worker stays
    // in its startup checks, which the probes report.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    let sdk = offline_sdk().to_builder().endpoint_url(endpoint).build();
    let worker = Worker::builder("health-app")
        .stream("orders")
        .sdk_config(&sdk)
        .processor(|_: &ShardContext| NoOp)
        .serve_health("127.0.0.1:0".parse().unwrap())
        .liveness_stall_bound(Duration::from_secs(60))
        .build()
        .unwrap();
    let addr = worker.health_addr().unwrap();
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());

    assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(code, 503);
    assert!(body.starts_with("not ready: starting"), "{body}");
    let (code, body) = get(addr, "/status").await;
    assert_eq!(code, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["ready"], false);
    assert_eq!(doc["shards"], serde_json::json!([]));
    assert_eq!(get(addr, "/metrics").await.0, 404);

    handle.shutdown();
    run.await.unwrap().unwrap();
    held.abort();
}
