//! An in-memory [`ShardSource`]: streams of shards held in memory, with
//! splits, merges and injected read errors, for tests and benchmarks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Notify;

use super::{
    Batch, ChildShard, OpenShard, ShardInfo, ShardReader, ShardSource, SourceError, StartPosition,
};
use crate::checkpointer::sequence::Position;
use crate::lease::HashKeyRange;
use crate::leases::LeaseHandle;
use crate::record::Record;

const MAX_HASH: u128 = u128::MAX;

#[derive(Debug)]
struct Shard {
    info: ShardInfo,
    records: Vec<Record>,
    children: Vec<ChildShard>,
}

#[derive(Debug, Default)]
struct Streams {
    streams: HashMap<String, Vec<Shard>>,
    next_shard: u64,
    /// Reads of these shards fail this many more times.
    failures: HashMap<String, u32>,
}

/// Shared state of an in-memory source; cloning shares it.
#[derive(Debug, Clone)]
pub struct InMemoryShardSource {
    state: Arc<Mutex<Streams>>,
    appended: Arc<Notify>,
    sequence: Arc<AtomicU64>,
    max_records: usize,
    wait_for_records: Duration,
    reads: Arc<AtomicU64>,
    listings: Arc<AtomicU64>,
}

impl Default for InMemoryShardSource {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryShardSource {
    /// An empty source; readers return at most 1000 records per batch and
    /// wait up to 50 ms for new records before returning an empty batch.
    pub fn new() -> Self {
        InMemoryShardSource {
            state: Arc::default(),
            appended: Arc::new(Notify::new()),
            sequence: Arc::new(AtomicU64::new(1)),
            max_records: 1000,
            wait_for_records: Duration::from_millis(50),
            reads: Arc::default(),
            listings: Arc::default(),
        }
    }

    /// Sets the largest batch a reader returns.
    pub fn with_max_records(mut self, n: usize) -> Self {
        self.max_records = n.max(1);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Streams> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads made so far (every `next_batch` call).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Shard listings made so far (every `list_shards` call: one per shard
    /// sync of a stream).
    pub fn listings(&self) -> u64 {
        self.listings.load(Ordering::Relaxed)
    }

    /// Creates `stream` with `shards` open shards splitting the hash-key
    /// space evenly. Returns their ids.
    pub fn create_stream(&self, stream: &str, shards: usize) -> Vec<String> {
        let mut s = self.lock();
        let width = MAX_HASH / shards.max(1) as u128;
        let mut created = Vec::new();
        for i in 0..shards {
            let start = width * i as u128;
            let end = if i + 1 == shards {
                MAX_HASH
            } else {
                start + width - 1
            };
            let id = format!("shardId-{:012}", s.next_shard);
            s.next_shard += 1;
            created.push(id.clone());
            let shard = self.open_shard(id, None, None, range(start, end));
            s.streams.entry(stream.to_owned()).or_default().push(shard);
        }
        created
    }

    fn next_sequence(&self) -> String {
        format!("{:030}", self.sequence.fetch_add(1, Ordering::Relaxed))
    }

    /// A new open shard with no records, starting at the next sequence number.
    fn open_shard(
        &self,
        shard_id: String,
        parent: Option<&str>,
        adjacent_parent: Option<&str>,
        hash_key_range: HashKeyRange,
    ) -> Shard {
        let info = ShardInfo {
            shard_id,
            parent_shard_id: parent.map(str::to_owned),
            adjacent_parent_shard_id: adjacent_parent.map(str::to_owned),
            hash_key_range,
            starting_sequence_number: self.next_sequence(),
            ending_sequence_number: None,
        };
        Shard {
            info,
            records: Vec::new(),
            children: Vec::new(),
        }
    }

    /// Appends a plain record to the open shard whose range holds the
    /// partition key's hash (a simple stand-in for Kinesis's MD5 routing).
    /// Returns the shard id and sequence number.
    pub fn put(
        &self,
        stream: &str,
        partition_key: &str,
        data: impl Into<Bytes>,
    ) -> Option<(String, String)> {
        self.put_arrived(stream, partition_key, data, SystemTime::now())
    }

    /// As [`put`](Self::put), for a record that arrived at `arrived`: one
    /// written long ago, for age limits.
    pub fn put_arrived(
        &self,
        stream: &str,
        partition_key: &str,
        data: impl Into<Bytes>,
        arrived: SystemTime,
    ) -> Option<(String, String)> {
        let hash = fnv128(partition_key);
        let mut s = self.lock();
        let shards = s.streams.get_mut(stream)?;
        let shard = shards
            .iter_mut()
            .find(|sh| !sh.info.is_closed() && in_range(&sh.info.hash_key_range, hash))?;
        let seq = self.next_sequence();
        shard.records.push(Record {
            data: data.into(),
            partition_key: partition_key.to_owned(),
            explicit_hash_key: None,
            sequence_number: seq.clone(),
            sub_sequence_number: 0,
            approximate_arrival: Some(arrived),
            aggregated: false,
        });
        let id = shard.info.shard_id.clone();
        drop(s);
        self.appended.notify_waiters();
        Some((id, seq))
    }

    /// Appends user records sharing one sequence number, as a KPL aggregate
    /// would deliver them, to `shard`.
    pub fn put_aggregate(
        &self,
        stream: &str,
        shard_id: &str,
        records: &[(&str, Bytes)],
    ) -> Option<String> {
        let mut s = self.lock();
        let shard = s
            .streams
            .get_mut(stream)?
            .iter_mut()
            .find(|sh| sh.info.shard_id == shard_id && !sh.info.is_closed())?;
        let seq = self.next_sequence();
        for (i, (pk, data)) in records.iter().enumerate() {
            shard.records.push(Record {
                data: data.clone(),
                partition_key: (*pk).to_owned(),
                explicit_hash_key: None,
                sequence_number: seq.clone(),
                sub_sequence_number: i as u64,
                approximate_arrival: Some(SystemTime::now()),
                aggregated: true,
            });
        }
        drop(s);
        self.appended.notify_waiters();
        Some(seq)
    }

    /// Splits an open shard in two at the middle of its range. Returns the
    /// children's ids.
    pub fn split(&self, stream: &str, shard_id: &str) -> Option<[String; 2]> {
        let mut s = self.lock();
        let first = format!("shardId-{:012}", s.next_shard);
        let second = format!("shardId-{:012}", s.next_shard + 1);
        s.next_shard += 2;
        let shards = s.streams.get_mut(stream)?;
        let parent = shards
            .iter_mut()
            .find(|sh| sh.info.shard_id == shard_id && !sh.info.is_closed())?;
        let (lo, hi) = bounds(&parent.info.hash_key_range);
        let mid = lo + (hi - lo) / 2;
        let kids = [
            (first.clone(), range(lo, mid)),
            (second.clone(), range(mid + 1, hi)),
        ];
        parent.info.ending_sequence_number = Some(self.next_sequence());
        parent.children = kids
            .iter()
            .map(|(id, r)| ChildShard {
                shard_id: id.clone(),
                parent_shard_ids: vec![shard_id.to_owned()],
                hash_key_range: r.clone(),
            })
            .collect();
        for (id, r) in kids {
            shards.push(self.open_shard(id, Some(shard_id), None, r));
        }
        drop(s);
        self.appended.notify_waiters();
        Some([first, second])
    }

    /// Merges two adjacent open shards. Returns the child's id.
    pub fn merge(&self, stream: &str, a: &str, b: &str) -> Option<String> {
        let mut s = self.lock();
        let child = format!("shardId-{:012}", s.next_shard);
        s.next_shard += 1;
        let shards = s.streams.get_mut(stream)?;
        let bounds_of = |id: &str| {
            let shard = shards.iter().find(|sh| sh.info.shard_id == id)?;
            Some(bounds(&shard.info.hash_key_range))
        };
        let ra = bounds_of(a)?;
        let rb = bounds_of(b)?;
        let r = range(ra.0.min(rb.0), ra.1.max(rb.1));
        let kid = ChildShard {
            shard_id: child.clone(),
            parent_shard_ids: vec![a.to_owned(), b.to_owned()],
            hash_key_range: r.clone(),
        };
        for sh in shards
            .iter_mut()
            .filter(|sh| sh.info.shard_id == a || sh.info.shard_id == b)
        {
            sh.info.ending_sequence_number = Some(self.next_sequence());
            sh.children = vec![kid.clone()];
        }
        shards.push(self.open_shard(child.clone(), Some(a), Some(b), r));
        drop(s);
        self.appended.notify_waiters();
        Some(child)
    }

    /// Makes the next `times` reads of `shard_id` fail with a retryable error.
    pub fn fail_reads(&self, shard_id: &str, times: u32) {
        self.lock().failures.insert(shard_id.to_owned(), times);
    }
}

fn range(start: u128, end: u128) -> HashKeyRange {
    HashKeyRange {
        starting: start.to_string(),
        ending: end.to_string(),
    }
}

fn bounds(r: &HashKeyRange) -> (u128, u128) {
    (
        r.starting.parse().unwrap_or(0),
        r.ending.parse().unwrap_or(MAX_HASH),
    )
}

fn in_range(r: &HashKeyRange, hash: u128) -> bool {
    let (lo, hi) = bounds(r);
    lo <= hash && hash <= hi
}

/// A partition key's hash key: FNV-1a, then mixed, because FNV's high bits
/// barely differ between short similar keys ("pk-0", "pk-1", ...) and
/// shards split the range by its high bits (eight such keys would all land
/// in one quarter). Kinesis uses MD5, which spreads them evenly.
fn fnv128(key: &str) -> u128 {
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for b in key.bytes() {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    h ^= h >> 64;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
    h ^= h >> 67;
    h = h.wrapping_mul(0xD6E8_FEB8_6659_FD93_C13C_1B8B_9D73_E5B5);
    h ^= h >> 59;
    h
}

#[async_trait]
impl ShardSource for InMemoryShardSource {
    async fn list_shards(&self, stream: &str) -> Result<Vec<ShardInfo>, SourceError> {
        self.listings.fetch_add(1, Ordering::Relaxed);
        match self.lock().streams.get(stream) {
            Some(shards) => Ok(shards.iter().map(|s| s.info.clone()).collect()),
            None => Err(SourceError::StreamNotFound {
                stream: stream.to_owned(),
            }),
        }
    }

    async fn open(&self, request: OpenShard) -> Result<Box<dyn ShardReader>, SourceError> {
        let s = self.lock();
        let shard = s
            .streams
            .get(&request.stream)
            .ok_or_else(|| SourceError::StreamNotFound {
                stream: request.stream.clone(),
            })?
            .iter()
            .find(|sh| sh.info.shard_id == request.shard_id)
            .ok_or_else(|| SourceError::Fatal {
                stream: request.stream.clone(),
                message: format!("shard {} not found", request.shard_id),
                source: None,
            })?;
        let next = match &request.position {
            StartPosition::TrimHorizon => 0,
            StartPosition::AtTimestamp(t) => shard
                .records
                .iter()
                .position(|r| r.approximate_arrival.is_some_and(|a| a >= *t))
                .unwrap_or(shard.records.len()),
            StartPosition::Latest => shard.records.len(),
            // By value: the checkpointer stores sequence numbers without
            // this source's leading zeros.
            StartPosition::AfterCheckpoint { seq, sub } => {
                let after = Position::new(seq.as_str(), *sub);
                shard
                    .records
                    .iter()
                    .position(|r| Position::of(r) > after)
                    .unwrap_or(shard.records.len())
            }
        };
        Ok(Box::new(MemoryReader {
            source: self.clone(),
            stream: request.stream,
            shard_id: request.shard_id,
            lease: request.lease,
            next,
            ended: false,
        }))
    }
}

#[derive(Debug)]
struct MemoryReader {
    source: InMemoryShardSource,
    stream: String,
    shard_id: String,
    lease: LeaseHandle,
    next: usize,
    ended: bool,
}

impl MemoryReader {
    fn read(&mut self) -> Result<Option<Batch>, SourceError> {
        let mut s = self.source.lock();
        if let Some(n) = s.failures.get_mut(&self.shard_id).filter(|n| **n > 0) {
            *n -= 1;
            return Err(SourceError::Retryable {
                stream: self.stream.clone(),
                shard: self.shard_id.clone(),
                source: "injected read failure".into(),
            });
        }
        let shard = s
            .streams
            .get(&self.stream)
            .and_then(|shards| shards.iter().find(|sh| sh.info.shard_id == self.shard_id))
            .ok_or_else(|| SourceError::Fatal {
                stream: self.stream.clone(),
                message: format!("shard {} vanished", self.shard_id),
                source: None,
            })?;
        let end = (self.next + self.source.max_records).min(shard.records.len());
        let records = shard.records[self.next..end].to_vec();
        self.next = end;
        let at_end = self.next == shard.records.len();
        if at_end && shard.info.is_closed() {
            self.ended = true;
            return Ok(Some(Batch {
                records,
                millis_behind_latest: Some(0),
                shard_end: Some(shard.children.clone()),
            }));
        }
        if records.is_empty() {
            return Ok(None);
        }
        let behind = (shard.records.len() - self.next) as u64;
        Ok(Some(Batch {
            records,
            millis_behind_latest: Some(behind),
            shard_end: None,
        }))
    }
}

#[async_trait]
impl ShardReader for MemoryReader {
    async fn next_batch(&mut self) -> Result<Batch, SourceError> {
        if self.ended {
            return Err(SourceError::Fatal {
                stream: self.stream.clone(),
                message: format!("shard {} already ended", self.shard_id),
                source: None,
            });
        }
        if !self.lease.is_valid() {
            return Err(SourceError::LeaseLost {
                shard: self.shard_id.clone(),
            });
        }
        self.source.reads.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::clone(&self.source.appended);
        // Registered before reading, so an append between the read and the
        // wait is not missed.
        let appended = notify.notified();
        if let Some(batch) = self.read()? {
            return Ok(batch);
        }
        // Nothing new: wait a little for an append instead of spinning.
        let _ = tokio::time::timeout(self.source.wait_for_records, appended).await;
        Ok(self.read()?.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{Checkpoint, Lease};
    use crate::source::{OpenShard, ShardSource};

    /// A checkpoint written without the source's leading zeros, as the
    /// checkpointer stores sequence numbers, resumes after its record:
    /// compared as text, "17" sorted after every zero-padded number, and
    /// the reader started at the shard's end, skipping every later record.
    #[tokio::test]
    async fn a_checkpoint_without_leading_zeros_resumes_after_its_record() {
        let source = InMemoryShardSource::new();
        let shard = source.create_stream("s", 1).remove(0);
        let seqs: Vec<String> = (0..5)
            .map(|i| source.put("s", "pk", format!("r{i}")).unwrap().1)
            .collect();
        let seq = seqs[2].trim_start_matches('0').to_owned();
        let lease = Lease::new(&shard, Checkpoint::TrimHorizon);
        let position = StartPosition::AfterCheckpoint { seq, sub: 0 };
        let open = OpenShard::new(
            "s",
            &shard,
            position,
            LeaseHandle::detached(lease, Duration::from_secs(60)),
        );
        let mut reader = source.open(open).await.unwrap();
        let batch = reader.next_batch().await.unwrap();
        let read: Vec<&str> = batch
            .records
            .iter()
            .map(|r| r.sequence_number.as_str())
            .collect();
        assert_eq!(read, seqs[3..]);
    }
}
