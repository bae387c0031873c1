//! Two `e2e-worker` processes with their endpoints and logs, for the
//! hung-processor scenarios: spawning with the worker's stderr kept in a
//! file, the bound endpoint address each process publishes, production
//! that reports where records landed, and the worker's log lines.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kcl_tests::e2e::{KEYS, Scenario, WorkerProcess, WorkerProcessConfig};
use kcl_tests::{SentRecord, TestRecord, http_get, put_records};
use tokio::process::Command;
use tokio::time::Instant;

pub(crate) const E2E_WORKER: &str = env!("CARGO_BIN_EXE_e2e-worker");

/// Starts worker `id` of `cfg` with its stderr (the worker's log) in
/// `<logs>/<id>.log`.
pub(crate) fn spawn(cfg: &WorkerProcessConfig, id: &str, logs: &Path) -> WorkerProcess {
    let log = std::fs::File::create(log_path(logs, id))
        .unwrap_or_else(|e| panic!("creating the log of {id} in {}: {e}", logs.display()));
    let child = Command::new(&cfg.binary)
        .envs(cfg.env_for(id))
        // Plain log lines: the tests search them for a shard id.
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", cfg.binary.display()));
    WorkerProcess {
        id: id.to_owned(),
        child,
    }
}

pub(crate) fn log_path(logs: &Path, id: &str) -> PathBuf {
    logs.join(format!("{id}.log"))
}

/// The lines of worker `id`'s log, without terminal colour codes.
pub(crate) fn log_lines(logs: &Path, id: &str) -> Vec<String> {
    let text = std::fs::read_to_string(log_path(logs, id))
        .unwrap_or_else(|e| panic!("reading the log of {id}: {e}"));
    text.lines().map(strip_ansi).collect()
}

/// Removes ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The endpoint address worker `id` bound (its `<out>/<id>.jsonl.addr`),
/// once it wrote it; fails after 60 s, or at once if the process exited.
pub(crate) async fn endpoint(out: &Path, worker: &mut WorkerProcess) -> SocketAddr {
    let path = out.join(format!("{}.jsonl.addr", worker.id));
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            return text
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("{}: {text:?}: {e}", path.display()));
        }
        if let Ok(Some(exit)) = worker.child.try_wait() {
            panic!("{} exited ({exit}) before serving its endpoint", worker.id);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} published no endpoint address in 60s",
            worker.id
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `GET path` on `addr` answers 200 (bounded).
pub(crate) async fn wait_ok(addr: SocketAddr, path: &str, what: &str) {
    let started = Instant::now();
    loop {
        let answer = http_get(addr, path).await;
        if matches!(answer, Ok((200, _))) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: {path} not 200 within 60s: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Puts the next `per_key` records of every key (as `Scenario::produce`)
/// and returns where each landed.
pub(crate) async fn produce(s: &mut Scenario, per_key: u64) -> Vec<SentRecord> {
    let records: Vec<TestRecord> = (s.produced..s.produced + per_key)
        .flat_map(|counter| (0..KEYS).map(move |key| TestRecord { key, counter }))
        .collect();
    let sent = put_records(s.env.kinesis(), &s.stream, &records)
        .await
        .unwrap_or_else(|e| panic!("producing to {}: {e:#}", s.stream));
    s.produced += per_key;
    sent
}

/// The value of `name{labels}` in a `/metrics` text (summed over the
/// series that match), 0 when absent.
pub(crate) fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    super::find(&super::parse(text), name, labels)
        .iter()
        .map(|s| s.value)
        .sum()
}
