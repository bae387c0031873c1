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
//!   `ParentShardId` / `AdjacentParentShardId`; `open` starts a polling reader.
//! - `polling`: the polling reader and its fetch task (`GetShardIterator`,
//!   `GetRecords`, expired-iterator recovery, throttling backoff, bounded
//!   prefetch, shard end with the children).
//! - [`PollingConfig`] (`config`): polling settings, validated at `build()`.
//! - [`SourceStats`] (`stats`): call, retry and record counters for tests
//!   and tools (the same events go to `metrics`).
//! - `api`: the three Kinesis calls behind a crate-private trait, the seam
//!   where `faults` (feature `test-util`) injects the service's real
//!   error variants.
//!
//! Enhanced fan-out retrieval is not written yet.
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
#![warn(missing_docs)]

pub mod kpl;

mod api;
mod config;
mod error;
#[cfg(test)]
mod fake;
#[cfg(any(test, feature = "test-util"))]
pub mod faults;
mod polling;
mod source;
mod stats;

pub use config::{MAX_GET_RECORDS_LIMIT, PollingConfig, PollingConfigBuilder};
pub use error::ConfigError;
pub use source::{KinesisShardSource, KinesisShardSourceBuilder, MAX_LIST_SHARDS_RESULTS};
pub use stats::{SourceStats, StatsSnapshot};
