//! What the coordinator tells the worker and what it counts: the
//! [`LeaseEvent`]s of its channel and the [`CoordinatorStats`] that every
//! lease event feeds (see `observe`). Public types, kept apart from the
//! state the coordinator's tasks share (`shared`).

use crate::leases::held::{EndReason, LeaseHandle};

/// A change to the set of leases this worker holds.
#[derive(Debug)]
#[non_exhaustive]
pub enum LeaseEvent {
    /// This worker now holds a lease; start consuming its shard.
    Acquired(LeaseHandle),
    /// This worker no longer holds a lease; its handle's `ended` completed.
    Ended {
        /// The lease key.
        key: String,
        /// Why.
        reason: EndReason,
    },
}

crate::counters! {
    /// Counters of the coordinator's work, for tests, benchmarks and logs.
    pub struct CoordinatorStats => CoordinatorSnapshot {
        counts {
            /// Lease-taker ticks.
            ticks,
            /// Ticks that read only the liveness records: nothing in the fleet had
            /// changed, so the lease table was not read (liveness mode).
            quiet_ticks,
            /// Ticks whose scan failed.
            scan_failures,
            /// Reads of the liveness records that failed.
            liveness_read_failures,
            /// Unowned or expired leases taken.
            taken,
            /// Handoffs started from another worker (steals).
            stolen,
            /// Awaited handoffs the previous owner completed.
            handoffs_completed,
            /// Awaited handoffs forced at their deadline.
            handoffs_forced,
            /// Leases this worker handed to a worker that asked for them.
            handed_off,
            /// Leases the table said were this worker's, taken back in a new tenure.
            reclaimed,
            /// Takes that lost their race.
            take_conflicts,
            /// Takes that failed otherwise.
            take_failures,
            /// Successful renewals.
            renewals,
            /// Renewal rounds of a lease that did not succeed.
            renew_failures,
            /// Tenures lost to another holder.
            lost,
            /// Tenures fenced (renewals did not succeed in time).
            fenced,
            /// Leases released.
            released,
            /// Tenures lost to another process running under this worker's id.
            same_id_conflicts,
            /// Switches from liveness records to per-lease renewal (at most one):
            /// workers that judge leases by their counters share the table.
            switched_to_per_lease,
        }
    }
}
