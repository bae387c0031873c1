//! The probes over a running engine worker (in-memory store and source,
//! paused clock), asked through the endpoint's router; no recorder is
//! installed in this binary.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use kcl_core::checkpointer::Checkpointer;
use kcl_core::processor::{ProcessorError, RecordBatch, RecordProcessor, ShardContext};
use kcl_core::source::InitialPosition;
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::worker::{StreamSpec, Worker, WorkerConfig, WorkerHandle};
use kcl_core::{LeaseConfig, LeaseLayout};
use tokio::sync::Notify;
use tokio::time::sleep;

use super::server::{State, respond, serve_connection};
use super::{Liveness, Probe, Probes};

/// Processes batches once `go` is notified; counts the records.
struct Gated {
    go: Arc<Notify>,
    open: Arc<Mutex<bool>>,
    done: Arc<Mutex<usize>>,
}

#[async_trait::async_trait]
impl RecordProcessor for Gated {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let open = { *self.open.lock().unwrap_or_else(|e| e.into_inner()) };
        if !open {
            self.go.notified().await;
        }
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) += batch.records.len();
        cp.checkpoint().await?;
        Ok(())
    }
}

async fn ask(state: &State, path: &str) -> (StatusCode, String) {
    let response = respond(&Method::GET, path, state);
    let status = response.status();
    let body: Bytes = match response.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(never) => match never {},
    };
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn start(source: &InMemoryShardSource, processor: Gated) -> WorkerHandle {
    let lease = LeaseConfig::builder("w-health")
        .build()
        .expect("lease settings");
    let config = WorkerConfig::builder(lease)
        .stream(StreamSpec {
            name: "orders".into(),
            layout: LeaseLayout::SingleStream,
        })
        .initial_position(InitialPosition::TrimHorizon)
        .build()
        .expect("worker settings");
    let (go, open, done) = (processor.go, processor.open, processor.done);
    let factory = move |_: &ShardContext| Gated {
        go: Arc::clone(&go),
        open: Arc::clone(&open),
        done: Arc::clone(&done),
    };
    let worker = Worker::new(
        config,
        Arc::new(InMemoryLeaseStore::new()),
        Arc::new(source.clone()),
        Arc::new(factory),
    );
    let handle = worker.handle();
    tokio::spawn(worker.run());
    handle
}

#[tokio::test(start_paused = true)]
async fn healthz_fails_naming_the_shard_while_it_stalls_and_passes_once_it_moves() {
    let source = InMemoryShardSource::new();
    let shard = source.create_stream("orders", 1).remove(0);
    for i in 0..3 {
        source.put("orders", "pk", format!("r{i}"));
    }
    let (go, open, done) = (Arc::new(Notify::new()), Arc::default(), Arc::default());
    let gated = Gated {
        go: Arc::clone(&go),
        open: Arc::clone(&open),
        done: Arc::clone(&done),
    };
    let worker = start(&source, gated);
    let bound = Duration::from_secs(30);
    let state = State::probes_only(Arc::new(Probes {
        worker: worker.clone(),
        worker_id: "w-health".into(),
        readiness: Probe::new(worker.clone(), Arc::default(), bound),
        liveness: Liveness::new(worker.clone(), Some(bound)),
    }));
    while worker.shards().is_empty() {
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ask(&state, "/healthz").await.0, StatusCode::OK);
    sleep(bound + Duration::from_secs(5)).await;
    let (status, body) = ask(&state, "/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains(&shard), "{body}");
    assert!(body.contains("3 records waiting"), "{body}");

    let (status, body) = ask(&state, "/status").await;
    assert_eq!(status, StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(doc["worker_id"], "w-health");
    assert_eq!(doc["shards"][0]["shard_id"], shard.as_str());
    assert_eq!(doc["shards"][0]["records_waiting"], 3);
    assert_eq!(doc["shards"][0]["processor_call"], "process_records");
    assert!(doc["stalled"].as_str().is_some_and(|s| s.contains(&shard)));

    *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
    go.notify_waiters();
    while *done.lock().unwrap_or_else(|e| e.into_inner()) < 3 {
        sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = ask(&state, "/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let doc: serde_json::Value =
        serde_json::from_str(&ask(&state, "/status").await.1).expect("JSON");
    assert_eq!(doc["shards"][0]["last_delivery_records"], 3);
    assert!(doc["stalled"].is_null());
    worker.shutdown();
}

#[tokio::test(start_paused = true)]
async fn without_a_stall_bound_healthz_passes_and_metrics_are_not_served_here() {
    let worker = WorkerHandle::new();
    let state = State::probes_only(Arc::new(Probes {
        worker: worker.clone(),
        worker_id: "w".into(),
        readiness: Probe::new(worker.clone(), Arc::default(), Duration::from_secs(30)),
        liveness: Liveness::new(worker, None),
    }));
    assert_eq!(ask(&state, "/healthz").await.0, StatusCode::OK);
    let (status, body) = ask(&state, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with("not ready: starting"), "{body}");
    let (status, body) = ask(&state, "/metrics").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("serve_metrics"), "{body}");
}

/// A client that asks for a response and never reads it holds its
/// connection (one of the 64 served at once) only until the connection's
/// deadline. Before, it held it for as long as the write blocked: for good
/// here, about 15 minutes for a peer gone behind a partition.
#[tokio::test(start_paused = true)]
async fn a_client_that_never_reads_its_response_is_cut_off() {
    use tokio::io::AsyncWriteExt;
    let worker = WorkerHandle::new();
    let state = Arc::new(State::probes_only(Arc::new(Probes {
        worker: worker.clone(),
        worker_id: "w".into(),
        readiness: Probe::new(worker.clone(), Arc::default(), Duration::from_secs(30)),
        liveness: Liveness::new(worker, None),
    })));
    // Less room than the response's headers take.
    let (mut client, server) = tokio::io::duplex(64);
    let served = tokio::spawn(serve_connection(server, state));
    client
        .write_all(b"GET /status HTTP/1.1\r\nhost: kcl\r\n\r\n")
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(600), served).await;
    assert!(ended.is_ok(), "still serving a client that reads nothing");
}
