//! Which renewal this worker runs: liveness records as configured, or
//! every lease per lease once a worker that judges leases by their
//! counters (a Java KCL worker) showed up on the table (see
//! [`Shared::switch_to_per_lease`]).

use tokio::time::Instant;
use tracing::error;

use super::Shared;
use crate::config::LeaseRenewal;
use crate::lease::Lease;
use crate::leases::held::Phase;
use crate::observe::Event;

impl Shared {
    /// True in the worker-liveness renewal mode (configured, and not
    /// switched to per-lease renewal since).
    pub(crate) fn liveness_mode(&self) -> bool {
        self.config.renewal == LeaseRenewal::WorkerLiveness && self.switched_at().is_none()
    }

    fn switched_at(&self) -> Option<Instant> {
        *self.switched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How often every lease is renewed per lease: the configured interval,
    /// or after a switch from liveness records (whose interval, half the
    /// lease duration, leaves no room for a failed renewal per lease) the
    /// per-lease default, a third of the lease duration.
    pub(crate) fn lease_renew_interval(&self) -> std::time::Duration {
        match self.switched_at() {
            Some(_) => self
                .config
                .renew_interval
                .min(self.config.lease_duration / 3),
            None => self.config.renew_interval,
        }
    }

    /// What this instance's beats say of its renewal (see
    /// [`crate::store::Beat::per_lease`]): peers that read it judge its
    /// leases by their counters too. After a switch, only once every lease
    /// it holds was written since: a peer that had watched a lease's
    /// counter stand still for minutes (it renewed by beats) would judge it
    /// expired at once.
    pub(crate) fn beats_per_lease(&self) -> bool {
        match self.switched_at() {
            None => !self.liveness_mode(),
            Some(at) => self
                .held_snapshot()
                .iter()
                .filter(|(_, h)| h.phase() == Phase::Active && !h.is_ended())
                .all(|(_, h)| h.item_written_at().is_some_and(|w| w >= at)),
        }
    }

    /// True if `owner` judges leases by their counters, as far as this
    /// worker can tell: a worker (not this one) that no liveness record
    /// names. A Java KCL worker writes none; nor does kcl renewing per
    /// lease whose beats never landed.
    pub(crate) fn judges_by_counters(&self, owner: &str) -> bool {
        owner != self.me() && !self.liveness().beats().any(|b| b.worker == owner)
    }

    /// A lease of ours went to `item`'s owner: if that is a worker that
    /// judges by counters, it took the lease because our beats never move
    /// its counter, and it will take every other.
    pub(crate) fn lost_to(&self, item: Option<&Lease>) {
        if !self.liveness_mode() {
            return;
        }
        if let Some(owner) = item.and_then(|l| l.owner.as_deref())
            && self.judges_by_counters(owner)
        {
            self.switch_to_per_lease(owner, "took a lease from this worker");
        }
    }

    /// Renews every lease per lease from now on, as if configured
    /// `PerLease`: a worker that judges leases by their counters (`owner`,
    /// which `evidence` showed) shares this table, and to it this worker's
    /// leases, renewed only by beats, look expired. It takes them while
    /// this worker still processes them, and renewing per lease is what
    /// makes them look alive. Every held lease is renewed at once, and the
    /// taker reads the table (and the Java workers' reports) from now on
    /// at every tick. Once per process; an error, because the table should
    /// be configured for it.
    pub(crate) fn switch_to_per_lease(&self, owner: &str, evidence: &str) {
        if self.config.renewal != LeaseRenewal::WorkerLiveness {
            return;
        }
        {
            let mut switched = self.switched.lock().unwrap_or_else(|e| e.into_inner());
            if switched.is_some() {
                return;
            }
            *switched = Some(Instant::now());
        }
        error!(
            worker = %self.config.worker_id,
            other = %owner,
            "{owner} {evidence} and writes no liveness record: it judges leases by their \
             counters (a Java KCL worker, or kcl renewing per lease without a workers table), \
             and took or would take every lease renewed only by liveness records; this worker \
             renews every lease from now on. Configure LeaseRenewal::PerLease for tables \
             shared with the Java KCL"
        );
        self.emit(Event::SwitchedToPerLease { owner });
        self.renew_now.notify_one();
        self.want_rescan();
    }
}
