//! The call layer: the Kinesis calls the source makes, behind a small
//! trait, how their errors are classified ([`classify`]) and how a call is
//! retried ([`retry`]).
//!
//! The trait is the seam where tests inject the service's real error
//! variants (expired iterators, throttling) that the emulator never
//! produces; see `crate::faults`. It takes and returns the SDK's own types so
//! the fault wrapper and the production path go through exactly the same
//! classification code.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use aws_sdk_kinesis::error::SdkError;
use aws_sdk_kinesis::operation::get_records::{GetRecordsError, GetRecordsOutput};
use aws_sdk_kinesis::operation::get_shard_iterator::{
    GetShardIteratorError, GetShardIteratorOutput,
};
use aws_sdk_kinesis::operation::list_shards::{ListShardsError, ListShardsOutput};
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::{ShardFilter, ShardIteratorType};

use self::classify::classify;
use self::retry::{Failure, ForReader, Op, RetryPolicy, retrying};
use crate::arn::stream_fields;
use crate::budget::Budget;
use crate::stats::SourceStats;

pub(crate) mod classify;
pub(crate) mod retry;

/// What the source, its readers and its calls share.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub(crate) api: Arc<dyn KinesisApi>,
    /// How the calls outside a reader's `GetRecords` loop are retried
    /// (`ListShards`, `GetShardIterator`, a short look with `GetRecords`):
    /// the polling settings' policy, whatever the retrieval. The polling
    /// settings themselves stay with the source and its polling readers,
    /// so the call layer does not depend on the polling module.
    pub(crate) retry: RetryPolicy,
    pub(crate) max_results: Option<i32>,
    pub(crate) stats: Arc<SourceStats>,
    /// The worker-wide prefetch budget of every reader of the source.
    pub(crate) budget: Arc<Budget>,
}

impl Shared {
    /// What a source on `api` shares, its calls retried with `retry`,
    /// with a worker-wide budget of `budget` bytes.
    pub(crate) fn new(
        api: Arc<dyn KinesisApi>,
        retry: RetryPolicy,
        max_results: Option<i32>,
        budget: usize,
    ) -> Self {
        let stats = Arc::<SourceStats>::default();
        Shared {
            api,
            retry,
            max_results,
            budget: Arc::new(Budget::new(budget, Arc::clone(&stats))),
            stats,
        }
    }
}

impl Shared {
    /// A shard iterator at `start`, retried with the polling policy
    /// (`None` if the answer holds none). For a reader, its lease is
    /// checked before every attempt and its clock told of each answer.
    pub(crate) async fn shard_iterator(
        &self,
        stream: &str,
        shard: &str,
        start: &IteratorStart,
        reader: Option<ForReader<'_>>,
    ) -> Result<Option<String>, Failure> {
        let attempt = || {
            self.stats.get_shard_iterator_call();
            async {
                self.api
                    .get_shard_iterator(stream, shard, start)
                    .await
                    .map_err(classify)
            }
        };
        let out = retrying(
            self,
            &self.retry,
            Op::GetShardIterator,
            stream,
            reader,
            attempt,
        )
        .await?;
        Ok(out.shard_iterator.filter(|it| !it.is_empty()))
    }

    /// One `GetRecords` of at most `limit` records, retried with the
    /// polling policy: for the short looks a reader takes aside from its
    /// reading (the oldest record, whether a shard is closed).
    pub(crate) async fn peek_records(
        &self,
        stream: &str,
        iterator: &str,
        limit: i32,
        reader: Option<ForReader<'_>>,
    ) -> Result<GetRecordsOutput, Failure> {
        let attempt = || {
            self.stats.get_records_call();
            async {
                self.api
                    .get_records(stream, iterator, limit)
                    .await
                    .map_err(classify)
            }
        };
        retrying(self, &self.retry, Op::GetRecords, stream, reader, attempt).await
    }
}

/// One `ListShards` request.
#[derive(Debug, Clone)]
pub(crate) enum ListShardsPage<'a> {
    /// The first page: names the stream (and an optional filter).
    First {
        stream: &'a str,
        filter: Option<ShardFilter>,
    },
    /// A later page. Kinesis rejects a request that names the stream (or a
    /// filter) together with a `NextToken`, so this variant cannot.
    Next { token: &'a str },
}

/// Where a shard iterator starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IteratorStart {
    TrimHorizon,
    Latest,
    AtTimestamp(SystemTime),
    AtSequence(String),
    AfterSequence(String),
}

/// The Kinesis operations a [`crate::KinesisShardSource`] uses.
#[async_trait]
pub(crate) trait KinesisApi: Send + Sync + fmt::Debug {
    async fn list_shards(
        &self,
        page: ListShardsPage<'_>,
        max_results: Option<i32>,
    ) -> Result<ListShardsOutput, SdkError<ListShardsError>>;

    async fn get_shard_iterator(
        &self,
        stream: &str,
        shard_id: &str,
        start: &IteratorStart,
    ) -> Result<GetShardIteratorOutput, SdkError<GetShardIteratorError>>;

    /// `stream` (a name or an ARN) is sent as the `StreamARN` when it is an
    /// ARN: a resource policy of another account is checked against it.
    async fn get_records(
        &self,
        stream: &str,
        iterator: &str,
        limit: i32,
    ) -> Result<GetRecordsOutput, SdkError<GetRecordsError>>;
}

#[async_trait]
impl KinesisApi for aws_sdk_kinesis::Client {
    async fn list_shards(
        &self,
        page: ListShardsPage<'_>,
        max_results: Option<i32>,
    ) -> Result<ListShardsOutput, SdkError<ListShardsError>> {
        let request = match page {
            ListShardsPage::First { stream, filter } => {
                let (name, arn) = stream_fields(stream);
                self.list_shards()
                    .set_stream_name(name)
                    .set_stream_arn(arn)
                    .set_shard_filter(filter)
            }
            ListShardsPage::Next { token } => self.list_shards().next_token(token),
        };
        request.set_max_results(max_results).send().await
    }

    async fn get_shard_iterator(
        &self,
        stream: &str,
        shard_id: &str,
        start: &IteratorStart,
    ) -> Result<GetShardIteratorOutput, SdkError<GetShardIteratorError>> {
        let (name, arn) = stream_fields(stream);
        let request = self
            .get_shard_iterator()
            .set_stream_name(name)
            .set_stream_arn(arn)
            .shard_id(shard_id);
        let request = match start {
            IteratorStart::TrimHorizon => {
                request.shard_iterator_type(ShardIteratorType::TrimHorizon)
            }
            IteratorStart::Latest => request.shard_iterator_type(ShardIteratorType::Latest),
            IteratorStart::AtTimestamp(t) => request
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(DateTime::from(*t)),
            IteratorStart::AtSequence(seq) => request
                .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                .starting_sequence_number(seq),
            IteratorStart::AfterSequence(seq) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(seq),
        };
        request.send().await
    }

    async fn get_records(
        &self,
        stream: &str,
        iterator: &str,
        limit: i32,
    ) -> Result<GetRecordsOutput, SdkError<GetRecordsError>> {
        let (_, arn) = stream_fields(stream);
        self.get_records()
            .set_stream_arn(arn)
            .shard_iterator(iterator)
            .limit(limit)
            .send()
            .await
    }
}
