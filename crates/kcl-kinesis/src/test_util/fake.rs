//! An in-memory stand-in for the Kinesis calls polling retrieval makes
//! (`ListShards`, `GetShardIterator`, `GetRecords`), with the faults the
//! emulator never produces: shards past retention, trimmed records, pages
//! cut short while far behind. For unit tests of the source and its
//! readers, and (feature `test-util`) for benchmarks that need thousands
//! of shards without an emulator: see [`crate::KinesisShardSource::on_fake`].
//!
//! Iterators are `stream|shard|position`; sequence numbers are zero-padded
//! so that string and numeric order agree, as with Kinesis.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

use async_trait::async_trait;
use aws_sdk_kinesis::error::SdkError;
use aws_sdk_kinesis::operation::get_records::{GetRecordsError, GetRecordsOutput};
use aws_sdk_kinesis::operation::get_shard_iterator::{
    GetShardIteratorError, GetShardIteratorOutput,
};
use aws_sdk_kinesis::operation::list_shards::{ListShardsError, ListShardsOutput};
use aws_sdk_kinesis::primitives::{Blob, DateTime};
use aws_sdk_kinesis::types::error::{InvalidArgumentException, ResourceNotFoundException};
use aws_sdk_kinesis::types::{
    ChildShard, HashKeyRange, Record, SequenceNumberRange, Shard, ShardFilterType,
};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use bytes::Bytes;

use kcl_core::checkpointer::sequence::SequenceNumber;

use crate::calls::{IteratorStart, KinesisApi, ListShardsPage};

#[derive(Debug)]
struct FakeShard {
    shard: Shard,
    records: Vec<Record>,
    closed: bool,
    children: Vec<ChildShard>,
    /// Whether the final GetRecords names the children (Kinesis does; the
    /// reader must cope when it does not).
    report_children: bool,
    /// Past the stream's retention: no longer listed, and every call on it
    /// answers ResourceNotFound.
    expired: bool,
    /// Records before this index were trimmed: a sequence-number start
    /// before it answers InvalidArgument.
    trim_horizon: usize,
    /// Whether GetShardIterator past the shard's last record answers with
    /// no iterator (the Java KCL takes that as the shard's end) rather than
    /// one whose GetRecords ends the shard or waits for records.
    no_iterator_at_end: bool,
    /// Most records one GetRecords returns, whatever the limit (as when
    /// Kinesis stops at its 10 MiB response limit, or returns an empty
    /// page while far behind: then 0).
    page_cap: Option<usize>,
}

/// One `ListShards` request as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListRequest {
    pub(crate) stream: Option<String>,
    pub(crate) after_shard: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) max_results: Option<i32>,
}

#[derive(Debug, Default)]
struct State {
    streams: HashMap<String, Vec<FakeShard>>,
    next_sequence: u64,
    list_requests: Vec<ListRequest>,
    get_records_calls: u64,
}

/// The fake service. Share it with `Arc`; every method takes `&self`.
#[derive(Debug, Default)]
pub struct FakeKinesis {
    state: Mutex<State>,
}

fn range(lo: u128, hi: u128) -> HashKeyRange {
    HashKeyRange::builder()
        .starting_hash_key(lo.to_string())
        .ending_hash_key(hi.to_string())
        .build()
        .expect("range")
}

fn bad_request<E>(err: E) -> SdkError<E> {
    let status = StatusCode::try_from(400).expect("status");
    SdkError::service_error(err, HttpResponse::new(status, SdkBody::empty()))
}

impl FakeKinesis {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("fake lock")
    }

    /// A stream of `n` open shards splitting the hash keys evenly; returns
    /// their ids.
    pub fn create_stream(&self, stream: &str, n: usize) -> Vec<String> {
        let width = u128::MAX / n as u128;
        let ids: Vec<String> = (0..n).map(|i| format!("shardId-{i:012}")).collect();
        let shards = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let lo = width * i as u128;
                let hi = if i + 1 == n {
                    u128::MAX
                } else {
                    lo + width - 1
                };
                self.new_shard(id, &[], range(lo, hi))
            })
            .collect();
        self.lock().streams.insert(stream.to_owned(), shards);
        ids
    }

    fn new_shard(&self, id: &str, parents: &[&str], r: HashKeyRange) -> FakeShard {
        FakeShard {
            shard: Shard::builder()
                .shard_id(id)
                .set_parent_shard_id(parents.first().map(|p| (*p).to_owned()))
                .set_adjacent_parent_shard_id(parents.get(1).map(|p| (*p).to_owned()))
                .hash_key_range(r)
                .sequence_number_range(
                    SequenceNumberRange::builder()
                        .starting_sequence_number("0")
                        .build()
                        .expect("seq range"),
                )
                .build()
                .expect("shard"),
            records: Vec::new(),
            closed: false,
            children: Vec::new(),
            report_children: true,
            expired: false,
            trim_horizon: 0,
            no_iterator_at_end: false,
            page_cap: None,
        }
    }

    /// Appends a record to `shard`; returns its sequence number.
    pub fn put(&self, stream: &str, shard: &str, pk: &str, data: impl Into<Bytes>) -> String {
        let mut s = self.lock();
        s.next_sequence += 1;
        let seq = format!("{:030}", s.next_sequence);
        let shard = s
            .streams
            .get_mut(stream)
            .and_then(|v| v.iter_mut().find(|f| f.shard.shard_id == shard))
            .expect("shard");
        assert!(!shard.closed, "put to a closed shard");
        shard.records.push(
            Record::builder()
                .sequence_number(&seq)
                .partition_key(pk)
                .data(Blob::new(data.into().to_vec()))
                // For `AT_TIMESTAMP` starts: the wall clock, as Kinesis's.
                .approximate_arrival_timestamp(DateTime::from(SystemTime::now()))
                .build()
                .expect("record"),
        );
        seq
    }

    /// Splits `shard` into two children; `report_children` decides whether
    /// the final GetRecords names them.
    pub fn split(&self, stream: &str, shard: &str, report_children: bool) -> [String; 2] {
        let mut s = self.lock();
        s.next_sequence += 1;
        let end = format!("{:030}", s.next_sequence);
        let shards = s.streams.get_mut(stream).expect("stream");
        let n = shards.len();
        let ids = [format!("shardId-{n:012}"), format!("shardId-{:012}", n + 1)];
        let parent = shards
            .iter_mut()
            .find(|f| f.shard.shard_id == shard)
            .expect("parent");
        let r = parent.shard.hash_key_range.clone().expect("range");
        let lo: u128 = r.starting_hash_key.parse().expect("lo");
        let hi: u128 = r.ending_hash_key.parse().expect("hi");
        let mid = lo + (hi - lo) / 2;
        let ranges = [range(lo, mid), range(mid + 1, hi)];
        parent.closed = true;
        parent.report_children = report_children;
        parent.shard.sequence_number_range = Some(
            SequenceNumberRange::builder()
                .starting_sequence_number("0")
                .ending_sequence_number(end)
                .build()
                .expect("seq range"),
        );
        parent.children = ids
            .iter()
            .zip(&ranges)
            .map(|(id, r)| {
                ChildShard::builder()
                    .shard_id(id)
                    .parent_shards(shard)
                    .hash_key_range(r.clone())
                    .build()
                    .expect("child")
            })
            .collect();
        let kids: Vec<FakeShard> = ids
            .iter()
            .zip(ranges)
            .map(|(id, r)| self.new_shard(id, &[shard], r))
            .collect();
        s.streams.get_mut(stream).expect("stream").extend(kids);
        ids
    }

    fn shard_mut<'a>(s: &'a mut State, stream: &str, shard: &str) -> &'a mut FakeShard {
        s.streams
            .get_mut(stream)
            .and_then(|v| v.iter_mut().find(|f| f.shard.shard_id == shard))
            .expect("shard")
    }

    /// Ages `shard` out of the retention period: its unread records are
    /// gone, ListShards no longer returns it, and calls on it answer
    /// ResourceNotFound.
    pub fn expire(&self, stream: &str, shard: &str) {
        Self::shard_mut(&mut self.lock(), stream, shard).expired = true;
    }

    /// Deletes `stream`.
    pub fn delete_stream(&self, stream: &str) {
        self.lock().streams.remove(stream);
    }

    /// Trims the first `n` records of `shard`: TRIM_HORIZON starts after
    /// them, and a sequence-number start among them answers
    /// InvalidArgument.
    pub fn trim(&self, stream: &str, shard: &str, n: usize) {
        Self::shard_mut(&mut self.lock(), stream, shard).trim_horizon = n;
    }

    /// Makes GetShardIterator on `shard` answer with no iterator for a
    /// position past its last record, open or closed.
    pub fn no_iterator_at_end(&self, stream: &str, shard: &str) {
        Self::shard_mut(&mut self.lock(), stream, shard).no_iterator_at_end = true;
    }

    /// An iterator past the last record of `shard`, whatever
    /// GetShardIterator answers there.
    pub(crate) fn end_iterator(&self, stream: &str, shard: &str) -> String {
        let len = Self::shard_mut(&mut self.lock(), stream, shard)
            .records
            .len();
        format!("{stream}|{shard}|{len}")
    }

    /// Makes each GetRecords on `shard` return at most `cap` records (0:
    /// empty pages), with MillisBehindLatest saying how far behind.
    pub fn cap_pages(&self, stream: &str, shard: &str, cap: Option<usize>) {
        Self::shard_mut(&mut self.lock(), stream, shard).page_cap = cap;
    }

    #[cfg(test)]
    pub(crate) fn list_requests(&self) -> Vec<ListRequest> {
        self.lock().list_requests.clone()
    }

    /// `GetRecords` calls answered so far.
    pub fn get_records_calls(&self) -> u64 {
        self.lock().get_records_calls
    }
}

fn parse_iterator(it: &str) -> Option<(String, String, usize)> {
    let mut parts = it.split('|');
    let stream = parts.next()?.to_owned();
    let shard = parts.next()?.to_owned();
    let pos = parts.next()?.parse().ok()?;
    Some((stream, shard, pos))
}

#[async_trait]
impl KinesisApi for FakeKinesis {
    async fn list_shards(
        &self,
        page: ListShardsPage<'_>,
        max_results: Option<i32>,
    ) -> Result<ListShardsOutput, SdkError<ListShardsError>> {
        let mut s = self.lock();
        // Token: stream|after|offset.
        let (stream, after, offset) = match page {
            ListShardsPage::First { stream, filter } => {
                let after = filter.and_then(|f| {
                    assert_eq!(f.r#type, ShardFilterType::AfterShardId);
                    f.shard_id
                });
                s.list_requests.push(ListRequest {
                    stream: Some(stream.to_owned()),
                    after_shard: after.clone(),
                    token: None,
                    max_results,
                });
                (stream.to_owned(), after.unwrap_or_default(), 0)
            }
            ListShardsPage::Next { token } => {
                s.list_requests.push(ListRequest {
                    stream: None,
                    after_shard: None,
                    token: Some(token.to_owned()),
                    max_results,
                });
                let mut parts = token.split('|');
                let mut parse = || -> Option<(String, String, usize)> {
                    let stream = parts.next()?.to_owned();
                    let after = parts.next()?.to_owned();
                    let offset = parts.next()?.parse().ok()?;
                    Some((stream, after, offset))
                };
                parse().ok_or_else(|| {
                    bad_request(ListShardsError::InvalidArgumentException(
                        InvalidArgumentException::builder().build(),
                    ))
                })?
            }
        };
        let Some(shards) = s.streams.get(&stream) else {
            return Err(bad_request(ListShardsError::ResourceNotFoundException(
                ResourceNotFoundException::builder().build(),
            )));
        };
        let all: Vec<Shard> = shards
            .iter()
            .filter(|f| !f.expired && (after.is_empty() || f.shard.shard_id > after))
            .map(|f| f.shard.clone())
            .collect();
        let size = max_results.map_or(1000, |m| m as usize);
        let end = (offset + size).min(all.len());
        let next = (end < all.len()).then(|| format!("{stream}|{after}|{end}"));
        Ok(ListShardsOutput::builder()
            .set_shards(Some(all[offset..end].to_vec()))
            .set_next_token(next)
            .build())
    }

    async fn get_shard_iterator(
        &self,
        stream: &str,
        shard_id: &str,
        start: &IteratorStart,
    ) -> Result<GetShardIteratorOutput, SdkError<GetShardIteratorError>> {
        let s = self.lock();
        let Some(shard) = s.streams.get(stream).and_then(|v| {
            v.iter()
                .find(|f| f.shard.shard_id == shard_id && !f.expired)
        }) else {
            return Err(bad_request(
                GetShardIteratorError::ResourceNotFoundException(
                    ResourceNotFoundException::builder().build(),
                ),
            ));
        };
        // By value, as Kinesis compares them: a checkpoint keeps no
        // leading zeros, and this fake's numbers are padded.
        let order = |r: &Record, seq: &str| SequenceNumber::order(&r.sequence_number, seq);
        let trimmed = |seq: &str| {
            shard.trim_horizon > 0 && order(&shard.records[shard.trim_horizon - 1], seq).is_ge()
        };
        if let IteratorStart::AtSequence(seq) | IteratorStart::AfterSequence(seq) = start
            && trimmed(seq)
        {
            return Err(bad_request(
                GetShardIteratorError::InvalidArgumentException(
                    InvalidArgumentException::builder()
                        .message(format!(
                            "StartingSequenceNumber {seq} used in GetShardIterator on shard \
                         {shard_id} in stream {stream} is invalid because it is trimmed"
                        ))
                        .build(),
                ),
            ));
        }
        let pos = match start {
            IteratorStart::TrimHorizon => shard.trim_horizon,
            // The first record that arrived at or after `t` (the trim
            // horizon if that one was trimmed).
            IteratorStart::AtTimestamp(t) => {
                let t = DateTime::from(*t);
                let at = shard
                    .records
                    .iter()
                    .position(|r| r.approximate_arrival_timestamp.is_some_and(|a| a >= t))
                    .unwrap_or(shard.records.len());
                at.max(shard.trim_horizon)
            }
            IteratorStart::Latest => shard.records.len(),
            IteratorStart::AtSequence(seq) => shard
                .records
                .iter()
                .position(|r| order(r, seq).is_ge())
                .unwrap_or(shard.records.len()),
            IteratorStart::AfterSequence(seq) => shard
                .records
                .iter()
                .position(|r| order(r, seq).is_gt())
                .unwrap_or(shard.records.len()),
        };
        if shard.no_iterator_at_end && pos == shard.records.len() {
            return Ok(GetShardIteratorOutput::builder().build());
        }
        Ok(GetShardIteratorOutput::builder()
            .shard_iterator(format!("{stream}|{shard_id}|{pos}"))
            .build())
    }

    async fn get_records(
        &self,
        _stream: &str,
        iterator: &str,
        limit: i32,
    ) -> Result<GetRecordsOutput, SdkError<GetRecordsError>> {
        let mut s = self.lock();
        s.get_records_calls += 1;
        let invalid = || {
            bad_request(GetRecordsError::InvalidArgumentException(
                InvalidArgumentException::builder().build(),
            ))
        };
        let (stream, shard_id, pos) = parse_iterator(iterator).ok_or_else(invalid)?;
        let shard = s
            .streams
            .get(&stream)
            .and_then(|v| v.iter().find(|f| f.shard.shard_id == shard_id))
            .ok_or_else(|| {
                bad_request(GetRecordsError::ResourceNotFoundException(
                    ResourceNotFoundException::builder().build(),
                ))
            })?;
        if shard.expired {
            return Err(bad_request(GetRecordsError::ResourceNotFoundException(
                ResourceNotFoundException::builder().build(),
            )));
        }
        let pos = pos.max(shard.trim_horizon);
        let take = (limit.max(0) as usize).min(shard.page_cap.unwrap_or(usize::MAX));
        let end = (pos + take).min(shard.records.len());
        let records = shard.records[pos.min(end)..end].to_vec();
        let at_end = end == shard.records.len();
        let mut out = GetRecordsOutput::builder()
            .set_records(Some(records))
            .millis_behind_latest((shard.records.len() - end) as i64);
        if at_end && shard.closed {
            if shard.report_children {
                out = out.set_child_shards(Some(shard.children.clone()));
            }
        } else {
            out = out.next_shard_iterator(format!("{stream}|{shard_id}|{end}"));
        }
        Ok(out.build().expect("output"))
    }
}
