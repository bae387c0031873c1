//! Poison records end to end, on the emulators: a record the processor
//! always fails on, in the middle of a batch, is bisected out, retried
//! three times alone, and written with its error to a dead-letter Kinesis
//! stream; every other record is processed once; the shard keeps going;
//! and the checkpoint passes the poison record only once the destination
//! accepted it: the test holds the destination refusing, reads the
//! checkpoint meanwhile, and only then lets it accept. Then the same in
//! four lanes per shard, over polling and over enhanced fan-out.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::cmp::Ordering;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use aws_sdk_kinesis::types::Record;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kcl_tests::e2e::{CheckpointMode, KEYS, Scenario, out_dir, read_logs, verify_skipping};
use kcl_tests::{TestRecord, create_stream, list_all_shards, read_shard, unique_name};
use tokio::time::Instant;

use crate::E2E_WORKER;

// A 1 MiB failed record through the dead-letter stream, in parts.
mod dead_letters;

/// Orders two decimal sequence numbers.
fn compare(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Every record of `stream`'s one shard, from its start.
async fn one_shard_records(s: &Scenario, stream: &str) -> Vec<Record> {
    let kinesis = s.env.kinesis();
    let shards = list_all_shards(kinesis, stream).await.unwrap();
    read_shard(kinesis, stream, shards[0].shard_id())
        .await
        .unwrap()
}

/// Every record in `stream` (one shard), from its start, as JSON.
async fn read_stream(s: &Scenario, stream: &str) -> Vec<serde_json::Value> {
    one_shard_records(s, stream)
        .await
        .iter()
        .map(|r| serde_json::from_slice(r.data().as_ref()).unwrap())
        .collect()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The checkpoint of the stream's one shard, as the lease table holds it.
async fn checkpoint(s: &Scenario) -> Option<String> {
    s.lease_items()
        .await
        .iter()
        .find_map(|i| i.get("checkpoint")?.as_s().ok().cloned())
}

/// True if `checkpoint` is a sequence number at or past `seq`.
fn at_or_past(checkpoint: &str, seq: &str) -> bool {
    checkpoint.chars().all(|ch| ch.is_ascii_digit()) && compare(checkpoint, seq) != Ordering::Less
}

/// The sequence numbers of `record` and of the record before it in the
/// stream's one shard.
async fn sequence_and_previous(s: &Scenario, record: (u32, u64)) -> (String, String) {
    let records = one_shard_records(s, &s.stream).await;
    let at = records
        .iter()
        .position(|r| {
            TestRecord::parse(r.data().as_ref()).is_some_and(|t| (t.key, t.counter) == record)
        })
        .unwrap();
    assert!(at > 0, "{record:?} is not the shard's first record");
    let seq = |i: usize| records[i].sequence_number().to_owned();
    (seq(at), seq(at - 1))
}

/// What the test saw while it held the destination.
struct Held {
    samples: usize,
    refusals: usize,
}

/// While the test holds the destination (it refuses every send), reads
/// the checkpoint until it stands at the record before the poison record
/// and the destination refused twice more after the shard was given newer
/// records (which, in lanes, the other lanes process meanwhile): it must
/// never be at or past the poison record.
async fn watch_while_held(
    s: &mut Scenario,
    out: &Path,
    lanes: usize,
    poison_seq: &str,
    previous_seq: &str,
) -> Held {
    let refused_log = out.join("w-1.jsonl.dlq.refused");
    let first_rounds = s.produced;
    let started = Instant::now();
    let mut samples = 0;
    let mut refused_when_produced = None;
    loop {
        let checkpoint = checkpoint(s).await;
        samples += 1;
        if let Some(c) = &checkpoint {
            assert!(
                !at_or_past(c, poison_seq),
                "checkpoint {c} at or past the poison record {poison_seq} while its destination refused"
            );
        }
        let refusals = lines(&refused_log).len();
        let newer_processed = || {
            read_logs(out)
                .unwrap_or_default()
                .iter()
                .any(|b| b.records.iter().any(|(_, n)| *n >= first_rounds))
        };
        match refused_when_produced {
            None if refusals > 0 => {
                s.produce(5).await;
                refused_when_produced = Some(refusals);
            }
            Some(then)
                if refusals >= then + 2
                    && checkpoint.as_deref() == Some(previous_seq)
                    && (lanes == 1 || newer_processed()) =>
            {
                return Held { samples, refusals };
            }
            _ => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "not settled while held after 180 s: checkpoint {checkpoint:?} (want {previous_seq}), {refusals} refusals"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every record but the poison one was processed and the
/// destination accepted once.
async fn wait_done(s: &Scenario, out: &Path, skipped: &HashSet<(u32, u64)>) {
    let dlq_log = out.join("w-1.jsonl.dlq");
    let started = Instant::now();
    loop {
        let batches = read_logs(out).unwrap_or_default();
        let missing = verify_skipping(&batches, KEYS, s.produced, skipped).missing;
        if missing.is_empty() && !lines(&dlq_log).is_empty() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "not done after 180 s: {} missing, dlq {:?}",
            missing.len(),
            lines(&dlq_log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn poison_goes_to_the_failure_stream(lanes: usize, retrieval: &str) {
    let mut s = Scenario::new(1).await;
    let dlq = unique_name("kcl-e2e-dlq");
    create_stream(s.env.kinesis(), &dlq, 1).await.unwrap();
    // 8 keys x 10 records in one PutRecords: one batch, the poison record
    // (key 3, counter 5) in its middle.
    s.produce(10).await;
    let poison = (3u32, 5u64);
    let (poison_seq, previous_seq) = sequence_and_previous(&s, poison).await;
    let out = out_dir("kcl-e2e-poison");
    // The destination refuses every send until the test removes this.
    let hold = out.join("dlq.hold");
    std::fs::write(&hold, "").unwrap();
    let mut config = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    config.extra_env = vec![
        (
            "KCL_E2E_POISON".into(),
            format!("{}:{}", poison.0, poison.1),
        ),
        ("KCL_E2E_DLQ_STREAM".into(), dlq.clone()),
        ("KCL_E2E_MAX_ATTEMPTS".into(), "3".into()),
        ("KCL_E2E_DLQ_HOLD".into(), hold.display().to_string()),
        ("KCL_E2E_LANES".into(), lanes.to_string()),
        ("KCL_E2E_RETRIEVAL".into(), retrieval.into()),
    ];
    let mut worker = config.spawn("w-1").unwrap();
    let held = watch_while_held(&mut s, &out, lanes, &poison_seq, &previous_seq).await;
    std::fs::remove_file(&hold).unwrap();
    let skipped = HashSet::from([poison]);
    wait_done(&s, &out, &skipped).await;
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
    assert_eq!(doc["sequence_number"], poison_seq.as_str());
    assert_eq!(lines(&out.join("w-1.jsonl.dlq")).len(), 1, "accepted once");
    let failures = lines(&out.join("w-1.jsonl.failures"));
    let alone = failures
        .iter()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["size"] == 1)
        .count();
    assert_eq!(
        alone, 3,
        "three attempts alone after bisection: {failures:?}"
    );
    let last = checkpoint(&s).await.unwrap();
    assert_eq!(
        compare(&last, &poison_seq),
        Ordering::Greater,
        "the checkpoint moved past the poison record once the destination accepted it"
    );
    println!(
        "poison ({lanes} lanes, {retrieval}): {} failed calls, {} checkpoint samples over {} refusals while held, {} batches",
        failures.len(),
        held.samples,
        held.refusals,
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
