//! Two `e2e-worker` processes with their endpoints and logs, for the
//! hung-processor scenarios: spawning with the worker's stderr kept in a
//! file, the bound endpoint address each process publishes, production
//! that reports where records landed, and the worker's log lines; and a
//! test run alone in a process of its own (this test binary again), for
//! the tests that install the process's global metrics recorder.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kcl_tests::e2e::{KEYS, Scenario, WorkerProcess, WorkerProcessConfig};
use kcl_tests::{SentRecord, TestRecord, http_get, put_records};
use tokio::process::Command;
use tokio::time::Instant;

pub(crate) const E2E_WORKER: &str = env!("CARGO_BIN_EXE_e2e-worker");

/// Set in a process that [`ran_in_own_process`] starts.
const OWN_PROCESS: &str = "KCL_TESTS_OWN_PROCESS";

/// Whether this is a process [`ran_in_own_process`] started, where the
/// test's body is to run.
pub(crate) fn in_own_process() -> bool {
    std::env::var_os(OWN_PROCESS).is_some()
}

/// Runs `test` (the test of that name in `module`, as `module_path!()`
/// gives it) alone in a new process of this binary with `envs` set, and
/// checks that it ran and passed. Returns false at once in that process,
/// where the test's body is to run.
pub(crate) async fn ran_in_own_process(module: &str, test: &str, envs: &[(&str, &str)]) -> bool {
    if in_own_process() {
        return false;
    }
    // libtest names a test by its path below the crate root.
    let name = format!("{}::{test}", module.split_once("::").map_or("", |(_, m)| m));
    let child = Command::new(std::env::current_exe().expect("this test binary's path"))
        .args([&name, "--exact", "--nocapture", "--test-threads=1"])
        .env(OWN_PROCESS, "1")
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("this test binary starts again");
    let output = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .expect("the test's process finished within 3 minutes")
        .expect("the test's output");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{name} failed in its process:\n{printed}"
    );
    assert!(
        printed.contains("1 passed"),
        "{name} did not run in its process:\n{printed}"
    );
    true
}

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
