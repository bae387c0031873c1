//! The kcl engine: leases, balancing, the lease taker and renewer, shard
//! consumers and the `Worker` that runs them.
//!
//! This crate has no AWS dependency: the lease table is reached through the
//! [`store::LeaseStore`] trait (DynamoDB in `kcl-dynamodb`, in memory here
//! with the `test-util` feature) and records through the
//! [`source::ShardSource`] trait (Kinesis in `kcl-kinesis`, in memory here).
//!
//! # Layout
//!
//! - [`lease`]: the lease model (owner, counter, checkpoint, lineage) and
//!   lease-key layouts; the bottom layer, depending on no other module.
//! - [`record`]: the user records handed to processors.
//! - [`store`]: the `LeaseStore` trait, the [`Holder`] (worker id and
//!   tenure) every holder's write is conditional on, and its typed errors;
//!   the metering and call-timeout decorators and deadline-bounded retries;
//!   with `test-util`, the in-memory store with fault injection and the
//!   conformance suite every store must pass.
//! - [`source`]: the `ShardSource` trait (shards, lineage, readers); with
//!   `test-util`, an in-memory source with splits, merges and read faults.
//! - [`shard_sync`] (`shards/sync`, re-exported here): which shards get a
//!   lease, at which position (a pure plan over one listing and one scan),
//!   and the sync that creates them; `shards::cleanup` (private) deletes
//!   finished leases after a retention period.
//! - [`leases`]: the lease engine, the part to read first: the taker and
//!   its pure balancing decision, expiry on the monotonic clock, tenures,
//!   held-lease state, the handoff judgement, the renewer, and the
//!   [`LeaseCoordinator`] that runs them (its module docs follow one lease
//!   from the scan to a take to its renewal).
//! - [`config`]: lease settings, validated at `build()`.
//! - [`processor`]: the application's `RecordProcessor` and its factory.
//! - [`poison`]: setting aside records a processor keeps failing on
//!   (bisection, attempts, age) and the destinations they go to.
//! - [`checkpointer`]: ownership-guarded, validated checkpoints, and the
//!   low watermark of a shard processed in parallel lanes.
//! - `consumer` (private): one shard's state machine, WaitingOnParents ->
//!   Initializing -> Processing -> ShuttingDown; the delivery of a batch
//!   under the failure policy; the parallel lanes of a shard.
//! - [`worker`]: the `Worker` engine and its configuration.
//! - [`observe`] (in `leases/`, re-exported here): the lease engine's
//!   typed events, feeding its counters, its metrics and the application's
//!   observer through one path.
//! - [`shard_series`]: when a recorder may forget a shard's metric
//!   series (no consumer of the process reads it any more).
//! - [`backoff`]: the one backoff policy of every retry loop.
//! - [`counters!`]: counter sets and their snapshots, declared once.
//! - [`warn_limit`]: warnings about recurring conditions (throttling,
//!   retries), at most once per interval, with their counts.
//!
//! # Concurrency model
//!
//! A [`worker::Worker`] runs in the caller's task and owns everything else:
//!
//! - a [`LeaseCoordinator`] with two tasks, tracked by a `TaskTracker` and
//!   stopped by their own `CancellationToken`s (dropping the coordinator
//!   stops them and releases its leases, best effort):
//!   - the **lease taker** ticks on a jittered interval; each tick makes one
//!     paginated scan, decides, and takes or starts handoffs with
//!     conditional writes (several in flight at once);
//!   - the **lease renewer** renews every held lease each renew interval,
//!     in parallel and each within its own deadline (a hung call holds
//!     back no other lease), fences a lease when its last successful
//!     renewal gets too old, notices handoff requests, and polls handoffs
//!     it awaits;
//! - the **shard sync** task (abort-on-drop), which lists shards, creates
//!   leases, cleans up finished ones and polls the stream tracker;
//! - one **consumer** task per held lease in a `JoinSet`, each with its own
//!   stop token; its processor is called from that task only. With
//!   `parallelism_per_shard(n)`, n > 1, the consumer task owns n lane
//!   processors and runs each lane's batch in a task of its own (a
//!   `JoinSet` it joins before it ends), one batch per lane at a time.
//!
//! The coordinator's tasks share the map of held leases (a mutex never held
//! across an `.await`). Acquisitions reach the worker on a bounded channel of
//! [`LeaseEvent`]s; each consumer holds a [`LeaseHandle`] whose `ended()`
//! and `handoff_requested()`
//! futures complete the moment the lease is lost, fenced, released or asked
//! for, and whose `is_valid()` it checks before every fetch.
//!
//! All timing uses `tokio::time`, so the whole engine runs under a paused
//! clock in tests.
#![deny(missing_docs)]

pub mod backoff;
pub mod checkpointer;
pub mod config;
mod context;
mod counters;
pub mod lease;
pub mod leases;
pub mod metric_names;
pub mod poison;
pub mod processor;
mod progress;
pub mod record;
mod setters;
pub mod shard_series;
pub mod source;
pub mod store;
#[cfg(feature = "test-util")]
pub mod test_util;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod warn_limit;
pub mod worker;

mod consumer;
mod shards;

// The engine's events live in `leases/` and shard sync in `shards/`; their
// crate-root paths are the ones every other module and crate uses.
pub use leases::observe;
pub use shards::sync as shard_sync;

pub use config::{Balance, ConfigError, LeaseConfig, LeaseRenewal};
pub use lease::{Checkpoint, HashKeyRange, Lease, LeaseLayout, Throughput};
pub use leases::{EndReason, LeaseCoordinator, LeaseEvent, LeaseHandle, ShutdownMode};
pub use record::Record;
pub use store::{Holder, LeaseStore, StoreError, StoreErrorKind};
