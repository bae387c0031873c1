//! Put -> process latency, for the benchmarks: a processor that reads the
//! put time each payload carries (`lat:<unix ns>`), and counts warm-up
//! records (`warm...`) apart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use aws_sdk_kinesis::primitives::Blob;
use kcl::{Checkpointer, ProcessorError, RecordBatch, RecordProcessor};

/// Wall-clock nanoseconds since the epoch (the batch logs' clock): put and
/// process run on one host, so they share the clock.
pub use crate::e2e::now_ns;

/// What the processors saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Put -> process latency of each `lat:` record.
    pub latencies: Vec<Duration>,
    /// Warm-up records seen.
    pub warm: usize,
}

/// The latencies `seen` recorded so far, sorted, taken out of it.
pub fn take_sorted(seen: &Mutex<Seen>) -> Vec<Duration> {
    let mut latencies =
        std::mem::take(&mut seen.lock().unwrap_or_else(|e| e.into_inner()).latencies);
    latencies.sort();
    latencies
}

/// A measured record's payload: `lat:` and the put time, now.
pub fn timed_payload() -> String {
    format!("lat:{}", now_ns())
}

/// Puts `payload` under `key` alone, with `PutRecord`: a record batched
/// with others would wait for them, and its latency with it.
pub async fn put_one(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    key: &str,
    payload: String,
) -> anyhow::Result<()> {
    kinesis
        .put_record()
        .stream_name(stream)
        .partition_key(key)
        .data(Blob::new(payload))
        .send()
        .await
        .with_context(|| format!("PutRecord {stream}"))?;
    Ok(())
}

/// Records latencies into a shared [`Seen`]; checkpoints every batch.
#[derive(Debug)]
pub struct LatencyProcessor {
    /// Shared by every shard's processor.
    pub seen: Arc<Mutex<Seen>>,
}

#[kcl::async_trait]
impl RecordProcessor for LatencyProcessor {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let now = now_ns();
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            for record in &batch.records {
                let text = std::str::from_utf8(&record.data).unwrap_or_default();
                if text.starts_with("warm") {
                    seen.warm += 1;
                } else if let Some(Ok(put)) = text.strip_prefix("lat:").map(str::parse::<u128>) {
                    let ns = u64::try_from(now.saturating_sub(put)).unwrap_or(u64::MAX);
                    seen.latencies.push(Duration::from_nanos(ns));
                }
            }
        }
        cp.checkpoint().await?;
        Ok(())
    }
}

/// A worker of a fresh application (named from `app`) on `stream`, from
/// the trim horizon with a 6 s lease and a 1 s taker tick, whose
/// processors record into `seen`: the latency benchmarks' worker, but for
/// its retrieval.
pub fn latency_worker(
    app: &str,
    stream: &str,
    sdk: &aws_config::SdkConfig,
    seen: &Arc<Mutex<Seen>>,
) -> kcl::WorkerBuilder {
    let seen = Arc::clone(seen);
    kcl::Worker::builder(crate::unique_name(app))
        .stream(stream)
        .sdk_config(sdk)
        .initial_position(kcl::InitialPosition::TrimHorizon)
        .lease_duration(Duration::from_secs(6))
        .taker_interval(Duration::from_secs(1))
        .processor(move |_: &kcl::ShardContext| LatencyProcessor {
            seen: Arc::clone(&seen),
        })
}

/// Waits until `seen` holds `records` latencies, for up to `limit`;
/// `Err` with how many it held when `limit` passed first.
pub async fn wait_latencies(
    seen: &Mutex<Seen>,
    records: usize,
    limit: Duration,
) -> Result<(), usize> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let n = seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .latencies
            .len();
        if n >= records {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(n);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `p`th percentile of `sorted` (nearest rank); zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
