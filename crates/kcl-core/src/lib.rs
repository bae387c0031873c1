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
//!   lease-key layouts.
//! - [`record`]: the user records handed to processors.
//! - [`store`]: the `LeaseStore` trait and its typed errors; the metering
//!   decorator; with `test-util`, the in-memory store with fault injection
//!   and the conformance suite every store must pass.
//! - [`source`]: the `ShardSource` trait (shards, lineage, readers); with
//!   `test-util`, an in-memory source with splits, merges and read faults.
//! - [`shard_sync`]: which shards get a lease, at which position (a pure
//!   plan over one listing and one scan), and the sync that creates them.
//! - [`cleanup`]: deleting finished leases after a retention period.
//! - [`balance`]: the pure balancing decision over one scan's view.
//! - [`expiry`]: expiry judged on this worker's monotonic clock.
//! - [`config`]: lease settings, validated at `build()`.
//! - [`coordinator`]: the held leases, graceful handoffs, and the tasks
//!   that keep them.
//! - [`processor`]: the application's `RecordProcessor` and its factory.
//! - [`checkpointer`]: ownership-guarded, validated checkpoints.
//! - `consumer` (private): one shard's state machine, WaitingOnParents ->
//!   Initializing -> Processing -> ShuttingDown.
//! - [`worker`]: the `Worker` engine and its configuration.
//!
//! # Concurrency model
//!
//! A [`worker::Worker`] runs in the caller's task and owns everything else:
//!
//! - a [`coordinator::LeaseCoordinator`] with two tasks, tracked by a
//!   `TaskTracker` and stopped by their own `CancellationToken`s (dropping
//!   the coordinator stops them, as a crash would):
//!   - the **lease taker** ticks on a jittered interval; each tick makes one
//!     paginated scan, decides, and takes or starts handoffs with
//!     conditional writes (several in flight at once);
//!   - the **lease renewer** renews every held lease each renew interval,
//!     in parallel, fences a lease when its last successful renewal gets too
//!     old, notices handoff requests, and polls handoffs it awaits;
//! - the **shard sync** task (abort-on-drop), which lists shards, creates
//!   leases, cleans up finished ones and polls the stream tracker;
//! - one **consumer** task per held lease in a `JoinSet`, each with its own
//!   stop token; its processor is called from that task only.
//!
//! The coordinator's tasks share the map of held leases (a mutex never held
//! across an `.await`). Acquisitions reach the worker on a bounded channel of
//! [`coordinator::LeaseEvent`]s; each consumer holds a
//! [`coordinator::LeaseHandle`] whose `ended()` and `handoff_requested()`
//! futures complete the moment the lease is lost, fenced, released or asked
//! for, and whose `is_valid()` it checks before every fetch.
//!
//! All timing uses `tokio::time`, so the whole engine runs under a paused
//! clock in tests.
#![warn(missing_docs)]

pub mod balance;
pub mod checkpointer;
pub mod cleanup;
pub mod config;
pub mod coordinator;
pub mod expiry;
pub mod lease;
pub mod processor;
pub mod record;
pub mod shard_sync;
pub mod source;
pub mod store;
pub mod worker;

mod consumer;

mod renewer;
mod taker;

pub use config::{ConfigError, LeaseConfig};
pub use coordinator::{EndReason, LeaseCoordinator, LeaseEvent, LeaseHandle, ShutdownMode};
pub use lease::{Checkpoint, HashKeyRange, Lease, LeaseLayout};
pub use record::Record;
pub use store::{ErrorKind, LeaseStore, StoreError};
