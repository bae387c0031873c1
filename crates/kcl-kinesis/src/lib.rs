//! kcl's `ShardSource` on Amazon Kinesis.
//!
//! This crate connects the engine in `kcl-core` to Kinesis: shard
//! discovery (paginated `ListShards` with parent/child lineage), polling
//! retrieval (`GetShardIterator` + `GetRecords`), enhanced fan-out
//! retrieval (`SubscribeToShard`), and de-aggregation of records written by
//! the Kinesis Producer Library (KPL), under the faults real Kinesis
//! produces and the emulator does not.
//!
//! # Layout
//!
//! - [`kpl`]: the KPL aggregated-record format. Splits an aggregated Kinesis
//!   record into its user records (zero-copy), passes malformed aggregates
//!   through as plain records (logged and counted, never a panic), skips the
//!   sub-records a checkpoint already covers on resume, checks sub-records
//!   against the shard's hash-key range, and encodes aggregates for tests
//!   and benchmarks.
//! - [`KinesisShardSource`] (`source`): the `ShardSource` on Kinesis; `open`
//!   starts a polling or a fan-out reader, as [`Retrieval`] says.
//! - `calls`: the call layer. The Kinesis calls behind a crate-private
//!   trait (the seam where [`faults`], feature `test-util`, injects the
//!   service's real errors), their classification by what retrying can fix
//!   (`classify`), and the one retry layer with a policy per kind of call
//!   (`retry`: attempt timeouts, jittered backoff, lease checks).
//! - `discovery`: `ListShards` to the end, lineage, a closed shard's
//!   children.
//! - `records`: the record pipeline both readers feed (start positions,
//!   de-aggregation, resume skipping, what a batch holds in memory).
//! - `gone`: what `ResourceNotFound` and a trimmed start mean (an expired
//!   shard, a deleted stream, data loss behind the trim horizon).
//! - `budget`: the worker-wide prefetch budget.
//! - `arn`: streams named by ARN ([`StreamArn`]).
//! - `polling`: polling retrieval, beside `fanout`: its settings
//!   ([`PollingConfig`], `polling::config`, validated at `build()`) and the
//!   reader and its fetch task (`polling::reader`: pacing from
//!   `MillisBehindLatest`, expired-iterator recovery, bounded prefetch,
//!   shard end with the children).
//! - [`SourceStats`] (`stats`): call, retry, fault and memory counters for
//!   tests and tools (the same events go to `metrics`).
//! - `fanout`: enhanced fan-out retrieval ([`FanOutConfig`], `fanout::config`): the stream
//!   consumer (found or registered once per stream, waited for until
//!   ACTIVE, deregistered at shutdown only if [`DeregisterConsumer`] says
//!   so), and the reader whose task holds one `SubscribeToShard`
//!   subscription at a time, renews it from the continuation sequence
//!   number and replaces it when it falls silent.
//! - [`KinesisDestination`] (`destination`): a dead-letter stream for
//!   records a processor keeps failing on (`FailurePolicy::Isolate`), and
//!   [`reassemble_dead_letters`] to read them back whole.
//! - `test_util` (feature `test-util`): what tests and benchmarks run on
//!   instead of Kinesis, re-exported as [`fake`] (an in-memory Kinesis for
//!   tests and benchmarks with thousands of shards, and its fan-out calls)
//!   and [`faults`] (the fault injector).
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
#![deny(missing_docs)]

pub mod kpl;

mod arn;
mod budget;
mod calls;
mod destination;
mod discovery;
mod fanout;
#[cfg(test)]
mod fleet_tests;
mod gone;
mod polling;
mod records;
mod source;
mod stats;
mod task_reader;
#[cfg(any(test, feature = "test-util"))]
mod test_util;

pub use arn::StreamArn;
pub use budget::DEFAULT_PREFETCH_BUDGET;
pub use destination::{
    DeadLetter, DeadLetterError, DeadLetterReassembler, KinesisDestination, reassemble_dead_letters,
};
pub use fanout::{DeregisterConsumer, FanOutConfig, FanOutConfigBuilder, MAX_CONSUMER_NAME_LEN};
pub use polling::{
    ConfigError, MAX_GET_RECORDS_LIMIT, MIN_TIME_BETWEEN_READS, PollingConfig, PollingConfigBuilder,
};
pub use source::{
    KinesisShardSource, KinesisShardSourceBuilder, MAX_LIST_SHARDS_RESULTS, Retrieval,
};
pub use stats::{SourceSnapshot, SourceStats};
#[cfg(any(test, feature = "test-util"))]
pub use test_util::{batches, fake, faults, held_bytes, passed_through};
