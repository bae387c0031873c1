//! The kcl engine: leases, balancing, the lease taker and renewer.
//!
//! This crate has no AWS dependency: the lease table is reached through the
//! [`store::LeaseStore`] trait (DynamoDB in `kcl-dynamodb`, in memory here
//! with the `test-util` feature).
//!
//! # Layout
//!
//! - [`lease`]: the lease model (owner, counter, checkpoint, lineage).
//! - [`record`]: the user records handed to processors.
//! - [`store`]: the `LeaseStore` trait and its typed errors; the metering
//!   decorator; with `test-util`, the in-memory store with fault injection
//!   and the conformance suite every store must pass.
//! - [`source`]: the `ShardSource` trait (shards, lineage, readers); with
//!   `test-util`, an in-memory source with splits, merges and read faults.
//! - [`shard_sync`]: which shards get a lease, at which position (a pure
//!   plan over one listing and one scan), and the sync that creates them.
//! - [`balance`]: the pure balancing decision over one scan's view.
//! - [`expiry`]: expiry judged on this worker's monotonic clock.
//! - [`cleanup`]: deleting finished leases after a retention period.
//! - [`config`]: lease settings, validated at `build()`.
//! - [`coordinator`]: the held leases and the tasks that keep them.
//!
//! # Concurrency model
//!
//! A [`coordinator::LeaseCoordinator`] owns two tasks, both tracked by a
//! `TaskTracker` and stopped by their own `CancellationToken`:
//!
//! - the **lease taker** ticks on a jittered interval; each tick makes one
//!   paginated scan, decides, and takes/steals with conditional writes
//!   (several in flight at once);
//! - the **lease renewer** renews every held lease each renew interval, in
//!   parallel, and fences a lease when its last successful renewal gets too
//!   old.
//!
//! Both share the map of held leases (a mutex never held across an
//! `.await`). Acquisitions and endings are sent to the worker on a bounded
//! channel of [`coordinator::LeaseEvent`]s; each held lease's consumer also
//! gets a [`coordinator::LeaseHandle`] whose `ended()` future completes the
//! moment the lease is lost, fenced or released.
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
