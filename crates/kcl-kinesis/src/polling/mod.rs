//! Polling retrieval: `GetShardIterator` once, then `GetRecords` in a loop,
//! in a background task owned by the reader.
//!
//! # Concurrency model
//!
//! Each [`PollingReader`] owns one fetch task (its `JoinHandle` and a
//! `CancellationToken`; dropping the reader cancels and aborts it). The task
//! sends batches on a bounded channel of [`PREFETCH_BATCHES`](reader::PREFETCH_BATCHES); each batch
//! carries permits of two semaphores, one counting user records and one
//! counting payload bytes, which the reader releases when it hands the
//! batch out. The task waits for free permits before each `GetRecords` and
//! asks for no more records than are free, so a stalled processor stops
//! the fetching: per shard, memory stays within the prefetch budget plus
//! the one response being admitted.
//!
//! The lease is checked before every `GetRecords` (and `GetShardIterator`)
//! call; when it is no longer valid the task sends
//! [`SourceError::LeaseLost`](kcl_core::source::SourceError::LeaseLost) and ends. The reader also checks it before
//! handing out each batch and wakes the moment the lease ends, so a batch
//! prefetched under a lease is never delivered after it.
//!
//! # Layout
//!
//! - [`PollingConfig`] (`config`): the settings, validated at `build()`.
//! - `reader`: the [`PollingReader`] and its fetch task.

mod config;
mod reader;

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod tests;

pub use config::{
    ConfigError, MAX_GET_RECORDS_LIMIT, MIN_TIME_BETWEEN_READS, PollingConfig, PollingConfigBuilder,
};
pub(crate) use reader::PollingReader;
