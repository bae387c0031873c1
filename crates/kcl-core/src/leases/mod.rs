//! The lease engine: which worker processes which shard, and for how long.
//!
//! Follow one lease from the table to a consumer and back:
//!
//! 1. `taker` (one task per worker) scans the table once per tick and
//!    feeds `expiry` (expiry on this worker's monotonic clock) and
//!    `balance::decide` (pure: what to take, reclaim or steal).
//! 2. Every take writes a fresh tenure (`tenure`) into the lease; a steal
//!    is a graceful handoff (the victim drains and checkpoints first).
//! 3. The tenure is a `held::Held`: its validity, its place in a handoff,
//!    and the [`LeaseHandle`] its consumer watches.
//! 4. `renewer` renews every tenure each renew interval, each inside its
//!    own deadline; fences what it could not renew in time; and moves
//!    awaited handoffs forward.
//! 5. Every observation of a held lease (a renewal's failed condition, a
//!    read of an awaited handoff, the taker's scan) is judged by
//!    `handoff::judge`, the one pure place where a handoff's steps and a
//!    lost tenure are decided (its table of cases is the handoff's spec).
//! 6. [`LeaseCoordinator`] (in `coordinator`) is the public face: it
//!    starts the two tasks and releases, hands off and shuts down tenures.
//! 7. Each tenure's `meter` measures what its shard carries (fed by the
//!    consumer through [`LeaseHandle::record_read`]); the renewer publishes
//!    it on the lease item (`throughputKBps`), and `balance::load` weighs
//!    the leases by it.
//!
//! Beside the engine: its events and counters ([`LeaseEvent`],
//! [`CoordinatorStats`], and [`observe`], where each event feeds its
//! counter, metric and observer; the crate root re-exports `observe`).
//! The lease model it works on is [`crate::lease`], below every layer; what
//! the stream's shards mean for the table (shard sync, cleanup) is in
//! `crate::shards`, above the engine and the shard source.
//!
//! Every write of a tenure is conditional on it (invariant 10): a second
//! process under the same worker id, or a delayed write of an earlier
//! tenure, fails its condition instead of landing.

pub(crate) mod balance;
pub(crate) mod cadence;
pub(crate) mod coordinator;
mod events;
pub(crate) mod expiry;
pub(crate) mod handoff;
pub(crate) mod held;
pub(crate) mod java_fleet;
pub(crate) mod liveness;
pub(crate) mod meter;
#[cfg(test)]
mod model;
pub mod observe;
pub mod operator;
pub(crate) mod renewer;
pub(crate) mod shared;
pub(crate) mod taker;
pub(crate) mod tenure;
pub(crate) mod watcher;

pub use coordinator::{FleetSignals, LeaseCoordinator, Released, ShutdownMode};
pub use events::{CoordinatorSnapshot, CoordinatorStats, LeaseEvent};
pub use held::{EndReason, LeaseHandle, LetGo};
pub use shared::LeaseFilter;
