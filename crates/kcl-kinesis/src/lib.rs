//! kcl's `ShardSource` on Amazon Kinesis.
//!
//! When complete, this crate connects the engine in `kcl-core` to Kinesis:
//! shard discovery (paginated `ListShards` with parent/child lineage),
//! polling retrieval (`GetShardIterator` + `GetRecords`), enhanced fan-out
//! retrieval (`SubscribeToShard`), and de-aggregation of records written by
//! the Kinesis Producer Library (KPL).
//!
//! # Layout
//!
//! - [`kpl`]: the KPL aggregated-record format. Splits an aggregated Kinesis
//!   record into its user records (zero-copy), passes malformed aggregates
//!   through as plain records (logged and counted, never a panic), skips the
//!   sub-records a checkpoint already covers on resume, checks sub-records
//!   against the shard's hash-key range, and encodes aggregates for tests
//!   and benchmarks.
//! - [`KinesisShardSource`] (`source`): the `ShardSource` on Kinesis.
//!   `ListShards` following `NextToken` to the end, with lineage from
//!   `ParentShardId` / `AdjacentParentShardId`; `open` starts a polling or
//!   a fan-out reader, as [`Retrieval`] says.
//! - `polling`: the polling reader and its fetch task (`GetShardIterator`,
//!   `GetRecords`, expired-iterator recovery, throttling backoff, bounded
//!   prefetch, shard end with the children).
//! - [`PollingConfig`] (`config`): polling settings, validated at `build()`.
//! - [`SourceStats`] (`stats`): call, retry and record counters for tests
//!   and tools (the same events go to `metrics`).
//! - `api`: the three Kinesis calls behind a crate-private trait, the seam
//!   where `faults` (feature `test-util`) injects the service's real
//!   error variants.
//! - `fanout`: enhanced fan-out retrieval ([`FanOutConfig`]): the stream
//!   consumer (found or registered once per stream, waited for until
//!   ACTIVE, deregistered at shutdown only if [`DeregisterConsumer`] says
//!   so), and the reader whose task holds one `SubscribeToShard`
//!   subscription at a time and renews it from the continuation sequence
//!   number.
//!
//! # Concurrency model
//!
//! [`kpl`] is synchronous and pure apart from its log lines and metrics: it
//! owns no task and never blocks. The shard consumer calls it on each fetched
//! batch before handing the records to the processor.
//!
//! Each polling reader owns one fetch task (a `JoinHandle` and a
//! `CancellationToken`, both stopped when the reader is dropped). The task
//! fills a bounded channel whose batches hold permits of a per-reader
//! record budget and byte budget, so a stalled processor stops fetching.
//! See `polling` for the details. Listing shards spawns nothing.
//!
//! Each fan-out reader likewise owns one subscription task; it stops
//! reading the event stream while its channel or byte budget is full, so
//! the transport's flow control pushes back on the service. See `fanout`.
#![warn(missing_docs)]

pub mod kpl;

mod arn;
mod budget;
mod calls;
mod config;
mod discovery;
#[cfg(test)]
mod fake;
mod fanout;
#[cfg(any(test, feature = "test-util"))]
pub mod faults;
#[cfg(test)]
mod fleet_tests;
mod gone;
mod polling;
mod records;
mod source;
mod stats;
mod task_reader;

pub use arn::StreamArn;
pub use budget::DEFAULT_PREFETCH_BUDGET;
pub use config::{
    ConfigError, MAX_GET_RECORDS_LIMIT, MIN_TIME_BETWEEN_READS, PollingConfig, PollingConfigBuilder,
};
pub use fanout::{DeregisterConsumer, FanOutConfig, FanOutConfigBuilder, MAX_CONSUMER_NAME_LEN};
pub use source::{
    KinesisShardSource, KinesisShardSourceBuilder, MAX_LIST_SHARDS_RESULTS, Retrieval,
};
pub use stats::{SourceStats, StatsSnapshot};
