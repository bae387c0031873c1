//! Poison records end to end, on the emulators: a record the processor
//! always fails on, in the middle of a batch, is bisected out, retried
//! three times alone, and written with its error to a dead-letter Kinesis
//! stream; every other record is processed once; the shard keeps going;
//! and the checkpoint passes the poison record only once the destination
//! accepted it. Then the same in four lanes per shard, over polling and
//! over enhanced fan-out.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::cmp::Ordering;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use aws_sdk_kinesis::types::ShardIteratorType;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kcl_tests::e2e::{CheckpointMode, KEYS, Scenario, now_ns, out_dir, read_logs, verify_skipping};
use kcl_tests::{create_stream, unique_name};
use tokio::time::Instant;

/// Orders two decimal sequence numbers.
fn compare(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Every record in `stream` (one shard), from its start.
async fn read_stream(s: &Scenario, stream: &str) -> Vec<serde_json::Value> {
    let kinesis = s.env.kinesis();
    let shards = kinesis
        .list_shards()
        .stream_name(stream)
        .send()
        .await
        .unwrap();
    let shard = shards.shards()[0].shard_id().to_owned();
    let mut iterator = kinesis
        .get_shard_iterator()
        .stream_name(stream)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .unwrap()
        .shard_iterator
        .unwrap();
    let mut docs = Vec::new();
    for _ in 0..5 {
        let out = kinesis
            .get_records()
            .shard_iterator(&iterator)
            .send()
            .await
            .unwrap();
        for r in out.records() {
            docs.push(serde_json::from_slice(r.data().as_ref()).unwrap());
        }
        match out.next_shard_iterator {
            Some(next) if !out.records().is_empty() => iterator = next,
            _ => break,
        }
    }
    docs
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn poison_goes_to_the_failure_stream(lanes: usize, retrieval: &str) {
    let mut s = Scenario::new(1).await;
    let dlq = unique_name("kcl-e2e-dlq");
    create_stream(s.env.kinesis(), &dlq, 1).await.unwrap();
    // 8 keys x 10 records in one PutRecords: one batch, the poison record
    // (key 3, counter 5) in its middle.
    s.produce(10).await;
    let poison = (3u32, 5u64);
    let out = out_dir("kcl-e2e-poison");
    let mut config = s.processes(
        env!("CARGO_BIN_EXE_e2e-worker"),
        &out,
        CheckpointMode::EveryBatch,
    );
    config.extra_env = vec![
        (
            "KCL_E2E_POISON".into(),
            format!("{}:{}", poison.0, poison.1),
        ),
        ("KCL_E2E_DLQ_STREAM".into(), dlq.clone()),
        ("KCL_E2E_MAX_ATTEMPTS".into(), "3".into()),
        // The destination refuses its first 3 sends: the checkpoint must
        // wait for it meanwhile.
        ("KCL_E2E_DLQ_REFUSE".into(), "3".into()),
        ("KCL_E2E_LANES".into(), lanes.to_string()),
        ("KCL_E2E_RETRIEVAL".into(), retrieval.into()),
    ];
    let mut worker = config.spawn("w-1").unwrap();
    let skipped = HashSet::from([poison]);
    let dlq_log = out.join("w-1.jsonl.dlq");
    // The checkpoint as read at a moment (ns before the read was sent).
    let mut samples: Vec<(u128, Option<String>)> = Vec::new();
    let started = Instant::now();
    let mut produced_more = false;
    loop {
        let asked = now_ns();
        let checkpoint = s
            .lease_items()
            .await
            .first()
            .and_then(|i| i.get("checkpoint"))
            .and_then(|v| v.as_s().ok())
            .cloned();
        samples.push((asked, checkpoint));
        let batches = read_logs(&out).unwrap_or_default();
        let done = verify_skipping(&batches, KEYS, s.produced, &skipped)
            .missing
            .is_empty();
        if done && !lines(&dlq_log).is_empty() {
            if produced_more {
                break;
            }
            // The shard keeps going after the poison record.
            s.produce(5).await;
            produced_more = true;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "not done after 180 s: {} batches, dlq {:?}",
            batches.len(),
            lines(&dlq_log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.terminate(Duration::from_secs(30)).await.unwrap();

    let batches = read_logs(&out).unwrap();
    let verdict = verify_skipping(&batches, KEYS, s.produced, &skipped);
    verdict.assert_correct();
    assert_eq!(verdict.duplicates, 0, "every other record processed once");
    assert!(
        batches.iter().all(|b| !b.records.contains(&poison)),
        "the poison record was never logged as processed"
    );

    let docs = read_stream(&s, &dlq).await;
    assert_eq!(docs.len(), 1, "the poison record alone: {docs:?}");
    let doc = &docs[0];
    assert_eq!(doc["partition_key"], "pk-3");
    assert_eq!(
        STANDARD
            .decode(doc["data_base64"].as_str().unwrap())
            .unwrap(),
        b"pk-3:5"
    );
    assert_eq!(doc["error"], "a poison record");
    assert_eq!(doc["attempts"], 3);
    assert_eq!(doc["reason"], "max_attempts");
    assert_eq!(doc["stream"], s.stream.as_str());
    let failures = lines(&out.join("w-1.jsonl.failures"));
    let alone = failures
        .iter()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["size"] == 1)
        .count();
    assert_eq!(
        alone, 3,
        "three attempts alone after bisection: {failures:?}"
    );

    let poison_seq = doc["sequence_number"].as_str().unwrap();
    let accepted: u128 = lines(&dlq_log)[0].parse().unwrap();
    let before: Vec<&(u128, Option<String>)> =
        samples.iter().filter(|(at, _)| *at < accepted).collect();
    assert!(
        !before.is_empty(),
        "the checkpoint was sampled while the destination refused"
    );
    for (at, checkpoint) in &samples {
        let passed = checkpoint.as_deref().is_some_and(|c| {
            c.chars().all(|ch| ch.is_ascii_digit()) && compare(c, poison_seq) != Ordering::Less
        });
        assert!(
            !passed || *at > accepted,
            "checkpoint {checkpoint:?} at or past the poison record {poison_seq} was read {} ms before the destination accepted it",
            (accepted - at) / 1_000_000
        );
    }
    let last = s
        .lease_items()
        .await
        .first()
        .and_then(|i| i.get("checkpoint"))
        .and_then(|v| v.as_s().ok())
        .cloned()
        .unwrap();
    assert_eq!(
        compare(&last, poison_seq),
        Ordering::Greater,
        "the checkpoint moved past the poison record in the end"
    );
    println!(
        "poison ({lanes} lanes, {retrieval}): {} failed calls, {} checkpoint samples ({} before the destination accepted), {} batches",
        failures.len(),
        samples.len(),
        before.len(),
        batches.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_goes_to_the_failure_stream_and_the_shard_keeps_going() {
    poison_goes_to_the_failure_stream(1, "polling").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_in_one_of_four_lanes_goes_to_the_failure_stream() {
    poison_goes_to_the_failure_stream(4, "polling").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_in_lanes_over_enhanced_fan_out_goes_to_the_failure_stream() {
    poison_goes_to_the_failure_stream(4, "fanout").await;
}
