//! A skewed stream for the load-balance scenarios (the e2e test and
//! `make bench`'s `load-balance`): one key per shard, put to that shard by
//! its explicit hash key, every key the same number of records, two hot
//! shards' records twelve times the others' size, so that two of eight
//! shards carry 80 % of the bytes. What each worker processed is measured
//! from its batch log, in bytes a second over a window.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;

use crate::TestRecord;
use crate::e2e::{BatchLog, KEYS};

/// Bytes of a cold shard's record.
pub const COLD_BYTES: usize = 200;
/// Bytes of a hot shard's record: with two hot shards among eight, each
/// round puts 2 x 2400 of 2 x 2400 + 6 x 200 bytes, 80 % on the hot two.
pub const HOT_BYTES: usize = 12 * COLD_BYTES;

/// Which keys (shard indexes) are hot, and the explicit hash key that puts
/// each key on its shard.
#[derive(Debug, Clone)]
pub struct Skew {
    /// The two hot keys.
    pub hot: [u32; 2],
    /// Per key, the starting hash key of its shard.
    pub hash_keys: Vec<String>,
    /// Per key, the shard id.
    pub shards: Vec<String>,
}

impl Skew {
    /// Keys `0..8` put on the stream's 8 shards in shard-id order; `hot`
    /// picks the two hot shards by id.
    pub async fn of_stream(
        kinesis: &aws_sdk_kinesis::Client,
        stream: &str,
        hot: [&str; 2],
    ) -> anyhow::Result<Skew> {
        Skew::of_shards(&crate::shard_hash_keys(kinesis, stream).await?, hot)
    }

    /// [`Skew::of_stream`] from the listing: `(shard id, starting hash
    /// key)` of every shard.
    pub fn of_shards(shards: &[(String, String)], hot: [&str; 2]) -> anyhow::Result<Skew> {
        let mut shards = shards.to_vec();
        shards.sort();
        anyhow::ensure!(
            shards.len() == KEYS as usize,
            "{} shards: the skew needs one per key ({KEYS})",
            shards.len()
        );
        let ids: Vec<String> = shards.iter().map(|(id, _)| id.clone()).collect();
        let key_of = |shard: &str| {
            ids.iter()
                .position(|id| id == shard)
                .map(|i| i as u32)
                .with_context(|| format!("{shard} is not one of the shards {ids:?}"))
        };
        Ok(Skew {
            hot: [key_of(hot[0])?, key_of(hot[1])?],
            hash_keys: shards.iter().map(|(_, hash)| hash.clone()).collect(),
            shards: ids,
        })
    }

    /// The size of `key`'s records.
    pub fn bytes(&self, key: u32) -> usize {
        if self.hot.contains(&key) {
            HOT_BYTES
        } else {
            COLD_BYTES
        }
    }

    /// The hot shards' ids.
    pub fn hot_shards(&self) -> HashSet<String> {
        self.hot
            .iter()
            .map(|k| self.shards[*k as usize].clone())
            .collect()
    }

    /// Bytes a second each of `workers` processed in batches that started
    /// within `[from_ns, to_ns)`.
    pub fn rates(
        &self,
        batches: &[BatchLog],
        workers: &[&str],
        from_ns: u128,
        to_ns: u128,
    ) -> BTreeMap<String, f64> {
        let secs = (to_ns.saturating_sub(from_ns)) as f64 / 1e9;
        let mut rates: BTreeMap<String, f64> =
            workers.iter().map(|w| ((*w).to_owned(), 0.0)).collect();
        for b in batches
            .iter()
            .filter(|b| b.start_ns >= from_ns && b.start_ns < to_ns)
        {
            let bytes: usize = b.records.iter().map(|(k, _)| self.bytes(*k)).sum();
            *rates.entry(b.worker.clone()).or_default() += bytes as f64 / secs;
        }
        rates
    }
}

/// The most loaded worker's rate over the fleet's mean.
pub fn max_over_mean(rates: &BTreeMap<String, f64>) -> f64 {
    let mean = rates.values().sum::<f64>() / rates.len().max(1) as f64;
    let max = rates.values().copied().fold(0.0, f64::max);
    if mean > 0.0 { max / mean } else { 0.0 }
}

/// Puts one record of every key, each on its own shard, every `every`,
/// until stopped.
#[derive(Debug)]
pub struct SkewedProducer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<u64>>,
}

impl SkewedProducer {
    /// Starts with round `first` (each key's counter).
    pub fn start(
        kinesis: &aws_sdk_kinesis::Client,
        stream: &str,
        skew: &Skew,
        first: u64,
        every: Duration,
    ) -> SkewedProducer {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (kinesis, stream, skew) = (kinesis.clone(), stream.to_owned(), skew.clone());
        let task = tokio::spawn(async move {
            let mut next = first;
            while !flag.load(Ordering::Relaxed) {
                let round: Vec<TestRecord> = (0..KEYS)
                    .map(|key| TestRecord { key, counter: next })
                    .collect();
                put(&kinesis, &stream, &skew, &round).await?;
                next += 1;
                tokio::time::sleep(every).await;
            }
            Ok(next)
        });
        SkewedProducer { stop, task }
    }

    /// Stops; returns the rounds produced in all (each key's records).
    pub async fn stop(self) -> anyhow::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("the skewed producer panicked")?
    }
}

/// Puts `records`, each on its key's shard, retrying rejected entries.
async fn put(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    skew: &Skew,
    records: &[TestRecord],
) -> anyhow::Result<()> {
    let mut pending: Vec<&TestRecord> = records.iter().collect();
    for attempt in 1..=10u64 {
        let entries = pending
            .iter()
            .map(|r| {
                PutRecordsRequestEntry::builder()
                    .partition_key(r.partition_key())
                    .explicit_hash_key(&skew.hash_keys[r.key as usize])
                    .data(Blob::new(r.padded(skew.bytes(r.key))))
                    .build()
                    .context("building a PutRecords entry")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let out = crate::put_entries(kinesis, stream, entries).await?;
        // Only rejected entries go again (as `put_records` does): each key
        // has one record a round, so a retry lands before the next round.
        let again: Vec<&TestRecord> = pending
            .iter()
            .zip(out.records())
            .filter(|(_, result)| result.error_code().is_some())
            .map(|(r, _)| *r)
            .collect();
        if again.is_empty() {
            return Ok(());
        }
        pending = again;
        tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
    }
    anyhow::bail!("PutRecords {stream}: records still rejected after 10 attempts")
}
