//! A processor that hangs on one shard, end to end on the emulators: it is
//! warned about once `processor_warn_after` passed, `/healthz` of its worker
//! (liveness check on) fails naming the shard while the call hangs, and at
//! `processor_timeout` the call is cancelled and the shard given back, to be
//! taken and processed by the other worker with nothing lost.

use std::collections::BTreeSet;
use std::time::Duration;

use kcl_tests::e2e::{
    CheckpointMode, KEYS, Scenario, TICK_MAX, out_dir, process_stats, read_logs, stat, verify,
    wait_all_owned_by, wait_complete,
};
use kcl_tests::http_get;
use tokio::time::Instant;

use super::fleet::{E2E_WORKER, endpoint, log_lines, metric, produce, spawn, wait_ok};

const WARN_AFTER: Duration = Duration::from_millis(1000);
const TIMEOUT: Duration = Duration::from_millis(6000);
const STALL_BOUND: Duration = Duration::from_millis(2000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_processor_is_warned_about_fails_healthz_and_its_shard_goes_to_the_other_worker() {
    let mut s = Scenario::new(4).await;
    let out = out_dir("kcl-e2e-hung-timeout");
    let logs = out_dir("kcl-e2e-hung-timeout-logs");
    // Two rounds before any worker runs; the processor of w-1 will hang on
    // the batch of pk-0's shard holding counter 2.
    let first = produce(&mut s, 2).await;
    let hung_shard = first
        .iter()
        .find(|r| r.record.key == 0)
        .map(|r| r.shard_id.clone())
        .expect("pk-0 was put");
    let hung_keys: BTreeSet<u32> = first
        .iter()
        .filter(|r| r.shard_id == hung_shard)
        .map(|r| r.record.key)
        .collect();
    let hang_file = logs.join("hang-shard");
    std::fs::write(&hang_file, &hung_shard).expect("writing the hang file");

    // No stealing: w-1 starts alone and keeps all four leases, more than its
    // share once w-2 runs. Giving the hung shard back leaves it three, all it
    // is owed, so the lease goes to w-2 (owed two) at w-2's next balancing
    // round. With stealing the fleet would be balanced two and two, and
    // either worker could take the shard back (kcl lets the next owner be
    // the same worker).
    let mut hung_cfg = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    let mut healthy_cfg = hung_cfg.clone();
    for (k, v) in [
        ("KCL_E2E_MAX_STEAL", "0".to_owned()),
        ("KCL_E2E_METRICS_ADDR", "127.0.0.1:0".to_owned()),
    ] {
        hung_cfg.extra_env.push((k.into(), v.clone()));
        healthy_cfg.extra_env.push((k.into(), v));
    }
    hung_cfg.extra_env.extend([
        ("KCL_E2E_HANG_AT".into(), "2".into()),
        (
            "KCL_E2E_HANG_SHARD_FILE".into(),
            hang_file.display().to_string(),
        ),
        (
            "KCL_E2E_PROCESSOR_WARN_MS".into(),
            WARN_AFTER.as_millis().to_string(),
        ),
        (
            "KCL_E2E_PROCESSOR_TIMEOUT_MS".into(),
            TIMEOUT.as_millis().to_string(),
        ),
        (
            "KCL_E2E_LIVENESS_STALL_MS".into(),
            STALL_BOUND.as_millis().to_string(),
        ),
    ]);

    let mut w1 = spawn(&hung_cfg, "w-1", &logs);
    let w1_addr = endpoint(&out, &mut w1).await;
    wait_all_owned_by(&s, &["w-1"].into(), 4).await;
    wait_complete(
        || read_logs(&out).expect("batch logs"),
        2,
        Duration::from_secs(60),
    )
    .await;
    let mut w2 = spawn(&healthy_cfg, "w-2", &logs);
    let w2_addr = endpoint(&out, &mut w2).await;
    wait_ok(w2_addr, "/readyz", "w-2").await;
    assert_eq!(
        http_get(w1_addr, "/healthz").await.expect("w-1 answers"),
        (200, "ok\n".to_owned()),
        "w-1 is live before the hang"
    );

    // Counter 2 of every key: w-1's processor hangs on the hung shard's batch.
    produce(&mut s, 2).await;
    let marker = out.join("w-1.jsonl.hang");
    // Probe w-1 until w-2 processed the hung shard and w-1 is live again.
    let mut unhealthy: Vec<String> = Vec::new();
    let mut status_when_stalled: Option<serde_json::Value> = None;
    let mut metrics_when_stalled = String::new();
    let mut live_again = false;
    let started = Instant::now();
    let taken_over = loop {
        match http_get(w1_addr, "/healthz").await {
            Ok((503, body)) => {
                if status_when_stalled.is_none()
                    && let Ok((200, doc)) = http_get(w1_addr, "/status").await
                {
                    let doc: serde_json::Value =
                        serde_json::from_str(&doc).expect("/status is JSON");
                    if !doc["stalled"].is_null() {
                        status_when_stalled = Some(doc);
                        metrics_when_stalled =
                            http_get(w1_addr, "/metrics").await.expect("w-1 /metrics").1;
                    }
                }
                unhealthy.push(body);
            }
            Ok((200, _)) => live_again = !unhealthy.is_empty(),
            other => panic!("w-1 /healthz: {other:?}"),
        }
        let by_w2 = read_logs(&out)
            .expect("batch logs")
            .into_iter()
            .filter(|b| b.worker == "w-2" && b.shard == hung_shard)
            .min_by_key(|b| b.start_ns);
        if let Some(first) = &by_w2
            && live_again
        {
            break first.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "no takeover within 90s: /healthz 503 seen {} times, live again: {live_again}, \
             w-2 on {hung_shard}: {by_w2:?}",
            unhealthy.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let hung_since: u128 = {
        let text = std::fs::read_to_string(&marker).expect("w-1 wrote its hang marker");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a marker line"))
            .collect();
        assert_eq!(lines.len(), 1, "w-1 hung once, on one shard: {lines:?}");
        assert_eq!(lines[0]["shard"], hung_shard.as_str());
        lines[0]["start_ns"]
            .as_str()
            .and_then(|n| n.parse().ok())
            .expect("start_ns")
    };
    let per_key = s.produced;
    let batches = wait_complete(
        || read_logs(&out).expect("batch logs"),
        per_key,
        Duration::from_secs(60),
    )
    .await;
    let w1_metrics = http_get(w1_addr, "/metrics").await.expect("w-1 /metrics").1;
    assert_eq!(
        http_get(w1_addr, "/healthz").await.expect("w-1 /healthz"),
        (200, "ok\n".to_owned()),
        "w-1 is live again once the hung call was cut"
    );
    w2.terminate(Duration::from_secs(30))
        .await
        .expect("w-2 stops");
    w1.terminate(Duration::from_secs(30))
        .await
        .expect("w-1 stops");

    // Warned about, for that shard, then cut at the timeout, in that
    // order. Only the hung call's warning is sure to come: a healthy call
    // on a busy machine (of that shard too) can run past the 1 s warning.
    let log = log_lines(&logs, "w-1");
    let on_hung = |line: &str| {
        line.contains(&format!("shard={hung_shard}")) && line.contains("process_records")
    };
    let warned: Vec<usize> = (0..log.len())
        .filter(|&i| log[i].contains("a processor call is running long") && on_hung(&log[i]))
        .collect();
    let cut: Vec<usize> = (0..log.len())
        .filter(|&i| log[i].contains("ran past processor_timeout"))
        .collect();
    assert!(!warned.is_empty(), "no warning for the hung shard");
    assert_eq!(cut.len(), 1, "one cancellation: {:?}", pick(&log, &cut));
    for i in warned.iter().chain(&cut) {
        assert!(
            log[*i].contains(&format!("shard={hung_shard}")) && log[*i].contains("process_records"),
            "names the shard and the call: {}",
            log[*i]
        );
    }
    assert!(
        warned.iter().any(|w| *w < cut[0]),
        "warned before it was cut"
    );
    let calls = |name| {
        metric(
            &w1_metrics,
            name,
            &[("shard", &hung_shard), ("stage", "process_records")],
        )
    };
    assert!(calls("kcl_processor_calls_slow_total") >= 1.0);
    assert_eq!(calls("kcl_processor_timeouts_total"), 1.0);

    // /healthz failed while the call hung, naming the shard and the call,
    // and /status named the stalled shard and its running call.
    assert!(
        !unhealthy.is_empty(),
        "/healthz never failed during the stall"
    );
    for body in &unhealthy {
        assert!(
            body.contains("stalled")
                && body.contains(&hung_shard)
                && body.contains("in process_records"),
            "{body}"
        );
    }
    let status = status_when_stalled.expect("a /status document during the stall");
    assert!(
        status["stalled"]
            .as_str()
            .is_some_and(|why| why.contains(&hung_shard)),
        "{status}"
    );
    let shard = status["shards"]
        .as_array()
        .and_then(|shards| shards.iter().find(|s| s["shard_id"] == hung_shard.as_str()))
        .unwrap_or_else(|| panic!("the hung shard in /status: {status}"));
    assert_eq!(shard["processor_call"], "process_records", "{shard}");
    // The records-waiting gauge held the hung batch while the call ran,
    // and went to 0 once the tenure was cut.
    let waiting = shard["records_waiting"].as_f64().expect("records_waiting");
    assert!(waiting > 0.0, "{shard}");
    let waiting_gauge =
        |text: &str| metric(text, "kcl_shard_records_waiting", &[("shard", &hung_shard)]);
    assert_eq!(waiting_gauge(&metrics_when_stalled), waiting);
    assert_eq!(waiting_gauge(&w1_metrics), 0.0);

    // Given back once (before the shutdowns, which release the rest),
    // taken by w-2 (no steal), and processed there from the hung batch on:
    // nothing lost, per-key order kept, no overlap.
    assert_eq!(
        metric(
            &w1_metrics,
            "kcl_leases_ended_total",
            &[("worker", "w-1"), ("reason", "released")]
        ),
        1.0,
        "w-1 gave one lease back"
    );
    assert_eq!(
        metric(&w1_metrics, "kcl_leases_ended_total", &[("worker", "w-1")]),
        1.0,
        "w-1 ended no other lease"
    );
    let w2_stats = process_stats(&out, "w-2");
    assert_eq!(stat(&w2_stats, "taken"), 1, "{w2_stats}");
    assert_eq!(stat(&w2_stats, "stolen"), 0, "{w2_stats}");
    assert!(
        !batches
            .iter()
            .any(|b| b.worker == "w-1" && b.shard == hung_shard && b.start_ns > hung_since),
        "w-1 processed the hung shard again"
    );
    let after_hang: BTreeSet<(u32, u64)> = batches
        .iter()
        .filter(|b| b.worker == "w-2" && b.shard == hung_shard)
        .flat_map(|b| b.records.iter().copied())
        .collect();
    for key in &hung_keys {
        for counter in 2..per_key {
            assert!(
                after_hang.contains(&(*key, counter)),
                "pk-{key}:{counter} of the hung shard was not processed by w-2"
            );
        }
    }
    verify(&batches, KEYS, per_key).assert_correct();
    let waited = Duration::from_nanos((taken_over.start_ns - hung_since) as u64);
    println!(
        "hung processor on {hung_shard}: w-2 processed it {waited:?} after the call hung \
         (processor_timeout {TIMEOUT:?} + one taker tick, at most {TICK_MAX:?}: {:?}); \
         /healthz failed {} times meanwhile",
        TIMEOUT + TICK_MAX,
        unhealthy.len()
    );
}

fn pick<'a>(lines: &'a [String], at: &[usize]) -> Vec<&'a str> {
    at.iter().map(|&i| lines[i].as_str()).collect()
}
