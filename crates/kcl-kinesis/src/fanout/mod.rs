//! Enhanced fan-out retrieval: records pushed through `SubscribeToShard`
//! instead of polled with `GetRecords`.
//!
//! # Layout
//!
//! - [`FanOutConfig`] (`config`): settings, validated at `build()`; the
//!   consumer name, an optional subscription lifetime, buffering, retry
//!   delays, the closed-shard check, [`DeregisterConsumer`].
//! - `consumer`: the stream consumer, one per stream and source. Looked up
//!   with `DescribeStreamConsumer` (stream ARN from
//!   `DescribeStreamSummary`), registered if missing (a concurrent
//!   registration by another worker answers `ResourceInUse`, which means
//!   "it exists"), waited for until ACTIVE within a bound, deregistered at
//!   shutdown only when configured.
//! - `reader`: the `ShardReader` and its subscription task; what the task
//!   does with each event (`reader::event`) and with each failed
//!   subscription (`reader::failure`).
//! - `api`: the calls behind a crate-private trait (the seam for the unit
//!   tests' fake) and the classification of event-stream errors.
//!
//! # Concurrency model
//!
//! Each reader owns one subscription task (a `JoinHandle` and a
//! `CancellationToken`; dropping the reader cancels and aborts it, which
//! drops the subscription and so ends it at the service). The task holds
//! one subscription at a time and
//!
//! 1. waits for room: a free slot of a small channel of batches
//!    (`max_buffered_batches`), free byte budget (`max_buffered_bytes`),
//!    and a reservation of the worker-wide budget for the event it reads
//!    next (its size is known only once it is read: an estimate from the
//!    shard's recent events, see the budget module; the batch keeps what
//!    it holds and gives the rest back).
//!    Until then it does not read the event stream, so the transport's flow
//!    control (HTTP/2 stream windows; TCP with an HTTP/1.1 endpoint) pushes
//!    back on the service while the processor is behind. After 10 s
//!    without room of its own it lets the subscription go: unread data
//!    holds window of the HTTP/2 connection every shard's subscription
//!    shares, and a few stalled shards must not starve the rest. It
//!    subscribes again once there is room, and reads with the room it won;
//! 2. checks the lease, reads one event, drops records it already received,
//!    de-aggregates the rest, drops sub-records a resume checkpoint covers,
//!    and queues the batch with its budget;
//! 3. when the subscription ends (the service's 5 minutes, the configured
//!    lifetime, or an error), subscribes again after the last event's
//!    continuation sequence number (`AFTER_SEQUENCE_NUMBER`), at most once a
//!    second per shard, with jittered exponential backoff after failures;
//! 4. at the shard's end (an event with child shards and no continuation)
//!    queues the last batch with `shard_end` set and stops.
//!
//! The reader checks the lease before handing out each batch and wakes the
//! moment it ends, so nothing received under a lease is delivered after it.
//! Consumer registration runs in the caller of `open` (the shard consumer);
//! concurrent opens of one stream's shards share one registration through a
//! `OnceCell`.

mod api;
mod config;
mod consumer;
mod reader;

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod tests;

pub(crate) use api::FanOutApi;
#[cfg(any(test, feature = "test-util"))]
pub(crate) use api::{EventStream, StreamError};
pub use config::{DeregisterConsumer, FanOutConfig, FanOutConfigBuilder, MAX_CONSUMER_NAME_LEN};
pub(crate) use consumer::FanOut;
pub(crate) use reader::FanOutReader;
