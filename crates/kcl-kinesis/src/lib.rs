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
//!
//! Shard discovery, polling and fan-out retrieval are not written yet; only
//! the [`kpl`] module exists so far.
//!
//! # Concurrency model
//!
//! [`kpl`] is synchronous and pure apart from its log lines and metrics: it
//! owns no task and never blocks. The shard consumer calls it on each fetched
//! batch before handing the records to the processor.
#![warn(missing_docs)]

pub mod kpl;
