//! The shipped alert rules in a real Prometheus scraping two workers on the
//! emulators, one of whose processors hangs on one shard (no
//! `processor_timeout`, so the stall lasts): the stalled-shard alert fires
//! for that shard, and no other alert fires. The dashboard's queries run
//! against the same Prometheus.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_tests::e2e::{
    CheckpointMode, Producer, Scenario, WorkerProcess, out_dir, read_logs, wait_all_owned_by,
    wait_complete,
};
use kcl_tests::http_get;
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::alert_rules::{dashboard_queries, read_deploy_file};
use super::fleet::{E2E_WORKER, endpoint, produce, spawn};

/// The rules run 60 times faster than shipped, so that a stall is seen
/// within seconds: every range and offset in minutes becomes the same
/// number of seconds (hours become minutes), and so do the thresholds that
/// are durations. `for:` becomes 3 s for every alert, shorter than the
/// scaled rule (so that another alert whose condition held even briefly
/// would fire and be seen). The expressions are otherwise the shipped
/// ones.
fn rules_at_test_speed(shipped: &str) -> String {
    let mut rules = String::with_capacity(shipped.len());
    for line in shipped.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("for:") {
            let indent = &line[..line.len() - trimmed.len()];
            rules.push_str(&format!("{indent}for: 3s\n"));
        } else {
            rules.push_str(&scale_durations(line));
            rules.push('\n');
        }
    }
    // Thresholds that are durations: (shipped, at test speed). The stalled
    // shard rule has none: its ranges say how long records waited.
    let thresholds: &[(&str, &str)] = &[(
        "(kcl_millis_behind_latest) > 300000",
        "(kcl_millis_behind_latest) > 5000",
    )];
    for (from, to) in thresholds {
        assert_eq!(
            rules.matches(from).count(),
            1,
            "the shipped rules no longer hold {from:?}: update this test's scaling"
        );
        rules = rules.replace(from, to);
    }
    rules
}

/// `[5m]` -> `[5s]`, `[1h]` -> `[1m]`, `offset 15m` -> `offset 15s`.
fn scale_durations(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find(['[', 'o']) {
        let (head, tail) = rest.split_at(at);
        out.push_str(head);
        let prefix = if tail.starts_with('[') {
            "["
        } else if tail.starts_with("offset ") {
            "offset "
        } else {
            out.push_str(&tail[..1]);
            rest = &tail[1..];
            continue;
        };
        let after = &tail[prefix.len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        let unit = after[digits..].chars().next();
        match unit {
            Some(u @ ('m' | 'h')) if digits > 0 => {
                out.push_str(prefix);
                out.push_str(&after[..digits]);
                out.push(if u == 'm' { 's' } else { 'm' });
                rest = &after[digits + 1..];
            }
            _ => {
                out.push_str(prefix);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A Prometheus server of this test, stopped when dropped.
struct Prometheus {
    addr: SocketAddr,
    _child: Child,
}

impl Prometheus {
    /// Starts Prometheus with `rules`, scraping `targets` every second,
    /// and waits until it is ready.
    async fn start(dir: &Path, rules: &str, targets: &[SocketAddr]) -> Prometheus {
        let version = std::process::Command::new("prometheus")
            .arg("--version")
            .output();
        assert!(
            version.as_ref().is_ok_and(|o| o.status.success()),
            "cannot run prometheus ({version:?}): install it with localstack/install (it runs \
             apt-get install prometheus), or put Prometheus >= 2.42 on PATH"
        );
        std::fs::write(dir.join("kcl-alerts.yml"), rules).expect("writing the rules");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: kcl\n    static_configs:\n      - targets: [{}]\n",
            dir.join("kcl-alerts.yml").display(),
            targets.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("writing the config");
        // A free port: bound, then released for Prometheus (it does not
        // report a port it picked itself).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("the log file");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting prometheus");
        let prometheus = Prometheus {
            addr,
            _child: child,
        };
        let started = Instant::now();
        while !matches!(http_get(addr, "/-/ready").await, Ok((200, _))) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "prometheus not ready in 60s; its log: {}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        prometheus
    }

    /// `GET /api/v1/<path>`'s `data`, failing on any error.
    async fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(self.addr, &format!("/api/v1/{path}"))
            .await
            .unwrap_or_else(|e| panic!("prometheus /api/v1/{path}: {e}"));
        let answer: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("/api/v1/{path}: {e}: {body}"));
        assert!(
            status == 200 && answer["status"] == "success",
            "/api/v1/{path}: {status} {body}"
        );
        answer["data"].clone()
    }

    async fn query(&self, promql: &str) -> Vec<Value> {
        self.api(&format!("query?query={}", percent_encode(promql)))
            .await["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Every alert pending or firing: (name, shard label, state).
    async fn alerts(&self) -> Vec<(String, String, String)> {
        let data = self.api("alerts").await;
        data["alerts"]
            .as_array()
            .expect("alerts")
            .iter()
            .map(|a| {
                let label = |k: &str| a["labels"][k].as_str().unwrap_or("").to_owned();
                (
                    label("alertname"),
                    label("shard"),
                    a["state"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    /// When each rule group was last evaluated.
    async fn last_evaluations(&self) -> Vec<String> {
        self.api("rules").await["groups"]
            .as_array()
            .expect("rule groups")
            .iter()
            .map(|g| g["lastEvaluation"].as_str().unwrap_or("").to_owned())
            .collect()
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn the_test_speed_rules_scale_ranges_offsets_and_for_only() {
    assert_eq!(
        scale_durations("increase(x[5m]) or y offset 15m and z[1h] and w[30s] and on (a) b"),
        "increase(x[5s]) or y offset 15s and z[1m] and w[30s] and on (a) b"
    );
    let shipped = read_deploy_file("prometheus/kcl-alerts.yml");
    let fast = rules_at_test_speed(&shipped);
    let fors = |rules: &str| {
        rules
            .lines()
            .filter(|l| l.trim_start().starts_with("for:"))
            .count()
    };
    assert_eq!(fast.matches("for: 3s").count(), fors(&shipped));
    assert_eq!(fors(&fast), fors(&shipped));
    assert!(!fast.contains("[5m]") && fast.contains("[5s]"), "{fast}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_fires_only_the_stalled_shard_alert_for_a_hung_shard() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-prometheus");
    let dir = out_dir("kcl-e2e-prometheus-server");
    let first = produce(&mut s, 2).await;
    let hang_file = dir.join("hang-shard");
    let mut cfg = {
        let mut cfg = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
        cfg.extra_env
            .push(("KCL_E2E_METRICS_ADDR".into(), "127.0.0.1:0".into()));
        cfg
    };
    let mut hung_cfg = cfg.clone();
    hung_cfg.extra_env.extend([
        ("KCL_E2E_HANG_AT".into(), "3".into()),
        (
            "KCL_E2E_HANG_SHARD_FILE".into(),
            hang_file.display().to_string(),
        ),
        ("KCL_E2E_PROCESSOR_WARN_MS".into(), "1000".into()),
    ]);
    // Balance by count on both: a load figure written during a slow run
    // could have a lease stolen for load while the stall is observed.
    for cfg in [&mut cfg, &mut hung_cfg] {
        cfg.extra_env
            .push(("KCL_E2E_BALANCE".into(), "by-count".into()));
    }
    let mut w1 = spawn(&hung_cfg, "w-1", &dir);
    let mut w2 = spawn(&cfg, "w-2", &dir);
    let addrs = [endpoint(&out, &mut w1).await, endpoint(&out, &mut w2).await];
    wait_all_owned_by(&s, &["w-1", "w-2"].into(), 2).await;
    // The hang comes once the leases stopped moving (a lease that moved
    // would end the hung tenure before the alert fires) and every shard's
    // current owner finished a batch of counter 2.
    let settled = owners_once_settled(&s).await;
    produce(&mut s, 1).await;
    wait_complete(
        || read_logs(&out).expect("batch logs"),
        3,
        Duration::from_secs(60),
    )
    .await;

    let shipped = read_deploy_file("prometheus/kcl-alerts.yml");
    let prometheus = Prometheus::start(&dir, &rules_at_test_speed(&shipped), &addrs).await;
    let started = Instant::now();
    while prometheus.query("up == 1").await.len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "prometheus does not scrape both workers: {:?}",
            prometheus.query("up").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The hung shard: one w-1 holds that receives records, and whose last
    // batch w-1 processed under its current lease.
    assert_eq!(s.owners().await, settled, "the leases moved after settling");
    let batches = read_logs(&out).expect("batch logs");
    let hung_shard = s
        .lease_items()
        .await
        .iter()
        .filter(|item| owner(item) == Some("w-1"))
        .filter_map(|item| item.get("leaseKey").and_then(|k| k.as_s().ok()))
        .find(|key| {
            first.iter().any(|r| &r.shard_id == *key)
                && batches
                    .iter()
                    .filter(|b| &b.shard == *key)
                    .max_by_key(|b| b.start_ns)
                    .is_some_and(|b| b.worker == "w-1" && b.records.iter().any(|r| r.1 == 2))
        })
        .cloned()
        .expect("w-1 holds a shard that receives records");
    std::fs::write(&hang_file, &hung_shard).expect("writing the hang file");
    // Records keep coming on every shard: w-1's processor hangs on the hung
    // shard's batch with counter 3, the others keep up.
    let producer = Producer::start(&s, 1, Duration::from_millis(500));

    let started = Instant::now();
    let mut seen: Vec<(String, String, String)> = Vec::new();
    let fired_after = loop {
        let alerts = prometheus.alerts().await;
        for alert in &alerts {
            if !seen.contains(alert) {
                seen.push(alert.clone());
            }
        }
        if alerts.iter().any(|(name, shard, state)| {
            name == "KclShardStalled" && *shard == hung_shard && state == "firing"
        }) {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(90) {
            let mut evidence = Vec::new();
            for series in [
                "min_over_time(kcl_shard_records_waiting{SHARD}[5s])",
                "min_over_time(kcl_millis_behind_latest{SHARD}[5s])",
                "changes(kcl_shard_last_delivery_timestamp_seconds{SHARD}[5s])",
                "changes(kcl_shard_last_checkpoint_timestamp_seconds{SHARD}[5s])",
            ] {
                let promql = series.replace("SHARD", &format!("shard=\"{hung_shard}\""));
                let found = prometheus.query(&promql).await;
                evidence.push(format!("{promql}: {found:?}"));
            }
            panic!(
                "KclShardStalled did not fire for {hung_shard} within 90s; alerts seen: {seen:?}; \
                 hang marker: {:?}; the rule's inputs for the shard: {evidence:#?}",
                std::fs::read_to_string(out.join("w-1.jsonl.hang"))
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Ten more evaluations of every group (10 s at test speed, three times
    // any alert's `for:`) with the stall going on: still nothing else.
    let mut before = prometheus.last_evaluations().await;
    let mut rounds = 0;
    while rounds < 10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for alert in prometheus.alerts().await {
            if !seen.contains(&alert) {
                seen.push(alert);
            }
        }
        let now = prometheus.last_evaluations().await;
        if now.iter().zip(&before).all(|(a, b)| a != b) {
            rounds += 1;
            before = now;
        }
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "the rules stopped being evaluated"
        );
    }
    let firing: Vec<&(String, String, String)> = seen
        .iter()
        .filter(|(_, _, state)| state == "firing")
        .collect();
    assert_eq!(
        firing,
        [&(
            "KclShardStalled".to_owned(),
            hung_shard.clone(),
            "firing".to_owned()
        )],
        "only the stalled-shard alert fires, for {hung_shard} only; every alert seen: {seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|(name, shard, _)| name == "KclShardStalled" && *shard != hung_shard),
        "a healthy shard was taken for stalled: {seen:?}"
    );
    let alerts = prometheus.api("alerts").await;
    let stalled = alerts["alerts"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|a| a["labels"]["alertname"] == "KclShardStalled")
        })
        .cloned()
        .expect("the firing alert");
    assert_eq!(stalled["labels"]["severity"], "critical");
    assert_eq!(stalled["labels"]["stream"], s.stream.as_str());
    let summary = stalled["annotations"]["summary"].as_str().unwrap_or("");
    assert!(
        summary.contains(&hung_shard) && summary.contains(&s.stream),
        "{summary}"
    );
    // Every rule evaluates without error.
    let groups = prometheus.api("rules").await;
    let rules: Vec<&Value> = groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
        .collect();
    assert_eq!(rules.len(), shipped.matches("- alert:").count());
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }

    // The dashboard's queries run here too, and its lag and leases panels
    // show the two workers' shards.
    for (panel, expr) in dashboard_queries() {
        let promql = expr
            .replace("$__rate_interval", "1m")
            .replace("$job", ".*")
            .replace("$stream", ".*");
        let (status, body) = http_get(
            prometheus.addr,
            &format!("/api/v1/query?query={}", percent_encode(&promql)),
        )
        .await
        .expect("prometheus answers");
        assert!(
            status == 200 && body.contains("\"status\":\"success\""),
            "panel {panel:?}: {promql}: {status} {body}"
        );
    }
    let lag = prometheus
        .query(&format!(
            "max by (stream, shard) (kcl_millis_behind_latest{{stream=\"{}\"}})",
            s.stream
        ))
        .await;
    let held = prometheus.query("sum by (worker) (kcl_leases_held)").await;
    let mut held: Vec<(String, String)> = held
        .iter()
        .map(|r| {
            (
                r["metric"]["worker"].as_str().unwrap_or("").to_owned(),
                r["value"][1].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    held.sort();
    assert_eq!(
        held,
        [
            ("w-1".to_owned(), "2".to_owned()),
            ("w-2".to_owned(), "2".to_owned())
        ],
        "leases held per worker"
    );
    assert!(
        lag.len() >= 3,
        "lag of the shards that received records: {lag:?}"
    );

    println!(
        "prometheus: KclShardStalled fired for {hung_shard} {fired_after:?} after the hang \
         started (rules at 60x speed: no progress for 5 s, for 3 s); alerts seen: {seen:?}"
    );
    producer.stop(&mut s).await;
    drop(prometheus);
    stop(&mut w1).await;
    w2.terminate(Duration::from_secs(30))
        .await
        .expect("w-2 stops");
}

fn owner(item: &HashMap<String, AttributeValue>) -> Option<&str> {
    item.get("leaseOwner")
        .and_then(|o| o.as_s().ok())
        .map(String::as_str)
}

/// The lease owners once two scans three seconds apart (longer than a
/// balancing round) found them the same.
async fn owners_once_settled(s: &Scenario) -> Vec<Option<String>> {
    let started = Instant::now();
    let mut last = s.owners().await;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = s.owners().await;
        if now == last {
            return now;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the leases kept moving for 60s: {now:?}"
        );
        last = now;
    }
}

/// The hung worker: its processor call never returns, so a graceful
/// shutdown would wait for it; it is killed.
async fn stop(worker: &mut WorkerProcess) {
    worker.kill().await.expect("killing the hung worker");
}
