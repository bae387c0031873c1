//! The demo's producer: about 100 records a second over eight partition
//! keys, each payload naming its key and counter so that the consumer
//! side can tell what was processed, twice, or never.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, ensure};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use super::{PARTITION_KEYS, PUT_EVERY, RECORDS_PER_PUT};

/// The payload of record `counter` of partition key `key`.
pub(super) fn payload(key: u64, counter: u64) -> String {
    format!("pk-{key}:{counter}")
}

/// The key and counter of a payload written by [`payload`].
pub(super) fn parse_payload(data: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(data).ok()?;
    let (key, counter) = text.strip_prefix("pk-")?.split_once(':')?;
    Some((key.parse().ok()?, counter.parse().ok()?))
}

/// Puts `RECORDS_PER_PUT` records every `PUT_EVERY` until stopped, then
/// retries what is still rejected a few times. Returns every record
/// Kinesis accepted. Entries Kinesis rejects (throttling) are put again
/// with the same payload, so each payload is in the stream once (twice only
/// if a call failed after the service applied it; the consumer side counts
/// that as a duplicate).
pub(super) async fn produce(
    kinesis: aws_sdk_kinesis::Client,
    stream: String,
    hash_keys: Vec<String>,
    produced: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<HashSet<(u64, u64)>> {
    let mut accepted = HashSet::new();
    let mut pending: Vec<(u64, u64)> = Vec::new();
    let mut next: u64 = 0;
    let mut ticker = tokio::time::interval(PUT_EVERY);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
        pending.extend(
            (next..next + RECORDS_PER_PUT).map(|n| (n % PARTITION_KEYS, n / PARTITION_KEYS)),
        );
        next += RECORDS_PER_PUT;
        pending = put(&kinesis, &stream, &hash_keys, pending, &mut accepted).await?;
        produced.store(accepted.len() as u64, Ordering::Relaxed);
    }
    for attempt in 1..=10u32 {
        if pending.is_empty() {
            break;
        }
        tokio::time::sleep(PUT_EVERY * attempt).await;
        pending = put(&kinesis, &stream, &hash_keys, pending, &mut accepted).await?;
        produced.store(accepted.len() as u64, Ordering::Relaxed);
    }
    if !pending.is_empty() {
        eprintln!(
            "       {} records were never accepted by Kinesis",
            pending.len()
        );
    }
    Ok(accepted)
}

/// One PutRecords call; returns the records to put again.
async fn put(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    hash_keys: &[String],
    records: Vec<(u64, u64)>,
    accepted: &mut HashSet<(u64, u64)>,
) -> anyhow::Result<Vec<(u64, u64)>> {
    let entries = records
        .iter()
        .map(|&(key, counter)| {
            PutRecordsRequestEntry::builder()
                .partition_key(format!("pk-{key}"))
                // Eight partition keys hash unevenly over four shards (one
                // shard often gets none); an explicit hash key places key k
                // on shard k mod 4, so every shard carries the same load.
                .explicit_hash_key(&hash_keys[key as usize % hash_keys.len()])
                .data(Blob::new(payload(key, counter)))
                .build()
                .context("building a PutRecords entry")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let out = match kinesis
        .put_records()
        .stream_name(stream)
        .set_records(Some(entries))
        .send()
        .await
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!(
                "       PutRecords failed ({}); retrying",
                aws_sdk_kinesis::error::DisplayErrorContext(&e)
            );
            return Ok(records);
        }
    };
    ensure!(
        out.records().len() == records.len(),
        "PutRecords returned {} results for {} entries",
        out.records().len(),
        records.len()
    );
    let mut rejected = Vec::new();
    for (record, result) in records.into_iter().zip(out.records()) {
        if result.error_code().is_none() && result.sequence_number().is_some() {
            accepted.insert(record);
        } else {
            rejected.push(record);
        }
    }
    Ok(rejected)
}
