//! What the lease engine does, as typed events: one path from each event to
//! its counter ([`CoordinatorStats`], which tests and tools read), its
//! metric (the `metrics` facade, the `worker` label set here once) and any
//! observer the application adds. A call site emits the event; it does not
//! bump a counter and emit a metric by hand, so the two cannot drift apart.
//!
//! | event | counter | metric |
//! |---|---|---|
//! | [`Event::Tick`] | `ticks` | [`LEASE_TAKER_TICKS`] `{worker}` |
//! | [`Event::QuietTick`] | `quiet_ticks` | [`LEASE_TAKER_QUIET_TICKS`] `{worker}` |
//! | [`Event::ScanFailed`] | `scan_failures` | [`LEASE_TAKER_SCAN_FAILURES`] `{worker}` |
//! | [`Event::LivenessReadFailed`] | `liveness_read_failures` | [`LIVENESS_READ_FAILURES`] `{worker}` |
//! | [`Event::Acquired`] | `taken`, `stolen`, `reclaimed` | [`LEASES_ACQUIRED`] `{worker,how}` |
//! | [`Event::TakeConflict`] | `take_conflicts` | [`LEASE_TAKE_CONFLICTS`] `{worker}` |
//! | [`Event::TakeFailed`] | `take_failures` | [`LEASE_TAKE_FAILURES`] `{worker}` |
//! | [`Event::Renewed`] | `renewals` | [`LEASE_RENEWALS`] `{worker}` |
//! | [`Event::RenewalFailed`] | `renew_failures` | [`LEASE_RENEWAL_FAILURES`] `{worker}` |
//! | [`Event::HandoffRequested`] | | [`HANDOFFS_REQUESTED`] `{worker}` |
//! | [`Event::HandoffGiven`] | | [`HANDOFFS_GIVEN`] `{worker}` |
//! | [`Event::HandoffEnded`] | `handoffs_completed`, `handoffs_forced` | [`HANDOFFS`] `{worker,outcome}` |
//! | [`Event::Ended`] | `lost`, `fenced`, `released`, `handed_off` | [`LEASES_ENDED`] `{worker,reason}` |
//! | [`Event::SameIdConflict`] | `same_id_conflicts` | [`WORKER_ID_CONFLICTS`] `{worker}` |
//! | [`Event::SwitchedToPerLease`] | `switched_to_per_lease` | [`RENEWAL_SWITCHED_TO_PER_LEASE`] `{worker}` |
//! | [`Event::Held`] | | [`LEASES_HELD`] `{worker}` (gauge) |

use std::fmt;
use std::sync::atomic::Ordering::Relaxed;

use crate::leases::{CoordinatorStats, EndReason};
use crate::metric_names::{
    HANDOFFS, HANDOFFS_GIVEN, HANDOFFS_REQUESTED, LEASE_RENEWAL_FAILURES, LEASE_RENEWALS,
    LEASE_TAKE_CONFLICTS, LEASE_TAKE_FAILURES, LEASE_TAKER_QUIET_TICKS, LEASE_TAKER_SCAN_FAILURES,
    LEASE_TAKER_TICKS, LEASES_ACQUIRED, LEASES_ENDED, LEASES_HELD, LIVENESS_READ_FAILURES,
    RENEWAL_SWITCHED_TO_PER_LEASE, WORKER_ID_CONFLICTS,
};

/// How a lease was acquired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Acquisition {
    /// Taken: nobody held it, or its holder's lease had expired.
    Taken,
    /// Stolen for balance: a graceful handoff from its holder started.
    Stolen,
    /// Taken back in a new tenure: the table said it was this worker's.
    Reclaimed,
}

impl Acquisition {
    /// The `how` label of `kcl_leases_acquired_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Acquisition::Taken => "taken",
            Acquisition::Stolen => "stolen",
            Acquisition::Reclaimed => "reclaimed",
        }
    }
}

/// Something the lease engine of one worker did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A lease-taker tick began.
    Tick,
    /// The tick read only the liveness records: nothing in the fleet had
    /// changed, so the lease table was not read (liveness mode).
    QuietTick,
    /// A tick whose read of the table failed (or that had no recent read
    /// of the liveness records to judge from).
    ScanFailed,
    /// A read of the liveness records failed (the liveness watcher's).
    LivenessReadFailed,
    /// A lease acquired.
    Acquired {
        /// The lease key.
        key: &'a str,
        /// How.
        how: Acquisition,
    },
    /// A take that lost its race to another writer.
    TakeConflict {
        /// The lease key.
        key: &'a str,
    },
    /// A take that failed otherwise (it is tried again at a later tick).
    TakeFailed {
        /// The lease key.
        key: &'a str,
    },
    /// A held lease renewed (by its own write, or by a liveness beat).
    Renewed {
        /// The lease key.
        key: &'a str,
    },
    /// A renewal round that did not succeed (the lease or the beat).
    RenewalFailed,
    /// A peer asked this worker to hand over a lease.
    HandoffRequested {
        /// The lease key.
        key: &'a str,
    },
    /// This worker let a Java KCL worker that asked for a lease have it
    /// (the Java-compatible mode's handoff to the Java leader's choice).
    HandoffGiven {
        /// The lease key.
        key: &'a str,
    },
    /// A handoff this worker waited for ended, and the lease is its own.
    HandoffEnded {
        /// The lease key.
        key: &'a str,
        /// The previous owner did not hand over in time.
        forced: bool,
    },
    /// This worker stopped holding a lease.
    Ended {
        /// The lease key.
        key: &'a str,
        /// Why.
        reason: EndReason,
    },
    /// Another process runs under this worker's id and holds the lease.
    SameIdConflict {
        /// The lease key.
        key: &'a str,
    },
    /// A worker configured to renew through its liveness record found a
    /// worker that judges leases by their counters on its table (a Java
    /// KCL worker, or kcl renewing per lease without a liveness record)
    /// and renews every lease from now on, as if configured `PerLease`.
    SwitchedToPerLease {
        /// The worker whose leases showed it.
        owner: &'a str,
    },
    /// Leases held now.
    Held {
        /// How many.
        leases: usize,
    },
}

/// Receives a worker's lease events, in addition to its counters and
/// metrics: for an application's own telemetry or audit. Called on the
/// engine's tasks, so it must return quickly and never block.
pub trait Observer: Send + Sync + fmt::Debug {
    /// `worker` had `event`.
    fn observe(&self, worker: &str, event: &Event<'_>);
}

impl Observer for CoordinatorStats {
    fn observe(&self, _worker: &str, event: &Event<'_>) {
        let counter = match event {
            Event::Tick => &self.ticks,
            Event::QuietTick => &self.quiet_ticks,
            Event::ScanFailed => &self.scan_failures,
            Event::LivenessReadFailed => &self.liveness_read_failures,
            Event::Acquired { how, .. } => match how {
                Acquisition::Taken => &self.taken,
                Acquisition::Stolen => &self.stolen,
                Acquisition::Reclaimed => &self.reclaimed,
            },
            Event::TakeConflict { .. } => &self.take_conflicts,
            Event::TakeFailed { .. } => &self.take_failures,
            Event::Renewed { .. } => &self.renewals,
            Event::RenewalFailed => &self.renew_failures,
            Event::HandoffEnded { forced: true, .. } => &self.handoffs_forced,
            Event::HandoffEnded { forced: false, .. } => &self.handoffs_completed,
            Event::Ended { reason, .. } => match reason {
                EndReason::Lost => &self.lost,
                EndReason::Fenced => &self.fenced,
                EndReason::Released => &self.released,
                EndReason::HandedOff => &self.handed_off,
                EndReason::Abandoned => return,
            },
            Event::SameIdConflict { .. } => &self.same_id_conflicts,
            Event::SwitchedToPerLease { .. } => &self.switched_to_per_lease,
            Event::HandoffRequested { .. } | Event::HandoffGiven { .. } | Event::Held { .. } => {
                return;
            }
        };
        counter.fetch_add(1, Relaxed);
    }
}

/// The `metrics` facade's view of an event (see the module's table).
pub(crate) fn record_metric(worker: &str, event: &Event<'_>) {
    let worker = worker.to_owned();
    match event {
        Event::Tick => metrics::counter!(LEASE_TAKER_TICKS, "worker" => worker).increment(1),
        Event::QuietTick => {
            metrics::counter!(LEASE_TAKER_QUIET_TICKS, "worker" => worker).increment(1)
        }
        Event::ScanFailed => {
            metrics::counter!(LEASE_TAKER_SCAN_FAILURES, "worker" => worker).increment(1)
        }
        Event::LivenessReadFailed => {
            metrics::counter!(LIVENESS_READ_FAILURES, "worker" => worker).increment(1)
        }
        Event::Acquired { how, .. } => {
            metrics::counter!(LEASES_ACQUIRED, "worker" => worker, "how" => how.as_str())
                .increment(1)
        }
        Event::TakeConflict { .. } => {
            metrics::counter!(LEASE_TAKE_CONFLICTS, "worker" => worker).increment(1)
        }
        Event::TakeFailed { .. } => {
            metrics::counter!(LEASE_TAKE_FAILURES, "worker" => worker).increment(1)
        }
        Event::Renewed { .. } => metrics::counter!(LEASE_RENEWALS, "worker" => worker).increment(1),
        Event::RenewalFailed => {
            metrics::counter!(LEASE_RENEWAL_FAILURES, "worker" => worker).increment(1)
        }
        Event::HandoffRequested { .. } => {
            metrics::counter!(HANDOFFS_REQUESTED, "worker" => worker).increment(1)
        }
        Event::HandoffGiven { .. } => {
            metrics::counter!(HANDOFFS_GIVEN, "worker" => worker).increment(1)
        }
        Event::HandoffEnded { forced, .. } => metrics::counter!(
            HANDOFFS,
            "worker" => worker,
            "outcome" => if *forced { "forced" } else { "completed" }
        )
        .increment(1),
        Event::Ended { reason, .. } => {
            if *reason != EndReason::Abandoned {
                metrics::counter!(
                    LEASES_ENDED,
                    "worker" => worker,
                    "reason" => reason.to_string()
                )
                .increment(1)
            }
        }
        Event::SameIdConflict { .. } => {
            metrics::counter!(WORKER_ID_CONFLICTS, "worker" => worker).increment(1)
        }
        Event::SwitchedToPerLease { .. } => {
            metrics::counter!(RENEWAL_SWITCHED_TO_PER_LEASE, "worker" => worker).increment(1)
        }
        Event::Held { leases } => {
            metrics::gauge!(LEASES_HELD, "worker" => worker).set(*leases as f64)
        }
    }
}
