//! An in-memory [`LeaseStore`](super::LeaseStore) with the same semantics as the DynamoDB one,
//! plus fault injection, for tests, benchmarks and deterministic simulation.
//!
//! Several workers share one table by holding [`InMemoryLeaseStore::handle`]s
//! of it; each handle has its own fault plan, so one worker can be made slow,
//! paused or unlucky while its peers are not.
//!
//! Layout: this file holds the table and its handles; `faults` the fault
//! plan and the runner that applies it around each call; `ops` the
//! [`LeaseStore`](super::LeaseStore) operations themselves.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

use super::{Beat, Intent, JavaWorker, StoreError, StoreOp};
use crate::lease::{Checkpoint, Lease};

mod faults;
mod ops;

use faults::FaultPlan;
pub use faults::{Fault, RandomFaults};

/// A change of owner, as recorded by the store for later checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerChange {
    /// When the change was applied.
    pub at: Instant,
    /// The lease.
    pub key: String,
    /// The owner before.
    pub from: Option<String>,
    /// The owner after.
    pub to: Option<String>,
}

#[derive(Debug, Default)]
struct Table {
    leases: BTreeMap<String, Lease>,
    owner_changes: Vec<OwnerChange>,
    /// Every checkpoint written, with its lease key, in order.
    checkpoints: Vec<(String, Checkpoint)>,
    /// Liveness records by instance id (a table of their own in DynamoDB).
    beats: BTreeMap<String, Beat>,
    /// When each record was last written, on the (possibly paused) tokio
    /// clock every handle shares: what [`Beat::age`] is read from.
    beats_written: HashMap<String, Instant>,
    /// Liveness records created so far (what a new one's counter is drawn
    /// from).
    beats_created: u64,
    /// Java KCL workers' `WorkerMetricStats` entries, as a test sets them.
    java_workers: Vec<JavaWorker>,
}

/// The in-memory lease table. Cloning shares the table and the fault plan;
/// [`InMemoryLeaseStore::handle`] shares the table with a fresh fault plan.
#[derive(Debug, Clone)]
pub struct InMemoryLeaseStore {
    table: Arc<Mutex<Table>>,
    faults: Arc<Mutex<FaultPlan>>,
    page_size: usize,
}

impl Default for InMemoryLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryLeaseStore {
    /// An empty table with scan pages of 100 leases.
    pub fn new() -> Self {
        InMemoryLeaseStore {
            table: Arc::default(),
            faults: Arc::default(),
            page_size: 100,
        }
    }

    /// Sets the number of leases per scan page (at least 1).
    pub fn with_page_size(mut self, page_size: usize) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// Another view of the same table, with its own (empty) fault plan.
    pub fn handle(&self) -> Self {
        InMemoryLeaseStore {
            table: Arc::clone(&self.table),
            faults: Arc::default(),
            page_size: self.page_size,
        }
    }

    /// Replaces a lease as a writer outside kcl would (a Java KCL worker,
    /// a hand edit), without conditions.
    pub fn put_raw(&self, lease: Lease) {
        self.lock().leases.insert(lease.key.clone(), lease);
    }

    /// Sets the Java KCL workers' `WorkerMetricStats` entries (as Java
    /// workers reporting would).
    pub fn set_java_workers(&self, workers: Vec<JavaWorker>) {
        self.lock().java_workers = workers;
    }

    /// A copy of every lease, in key order.
    pub fn snapshot(&self) -> Vec<Lease> {
        self.lock().leases.values().cloned().collect()
    }

    /// A copy of every liveness record, in instance order.
    pub fn beats_snapshot(&self) -> Vec<Beat> {
        self.lock().beats.values().cloned().collect()
    }

    /// Every owner change applied so far, in order.
    pub fn owner_changes(&self) -> Vec<OwnerChange> {
        self.lock().owner_changes.clone()
    }

    /// Every checkpoint written (plain checkpoints; SHARD_END included),
    /// with its lease key, in the order they landed.
    pub fn checkpoints_written(&self) -> Vec<(String, Checkpoint)> {
        self.lock().checkpoints.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock can only come from a test assertion;
        // the table is still consistent, so keep going.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn plan(&self) -> MutexGuard<'_, FaultPlan> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs [`InMemoryLeaseStore::update`] of the lease at `key` as one call
    /// of `op`, with its faults: what every guarded write but the
    /// checkpoint (which also records what it wrote) does.
    async fn guarded(
        &self,
        op: StoreOp,
        key: &str,
        intent: Option<Intent<'_>>,
        guard: impl FnOnce(&Lease) -> bool,
        update: impl FnOnce(&mut Lease),
    ) -> Result<Lease, StoreError> {
        self.call(op, Some(key), |t| {
            Self::update(t, key, intent, guard, update)
        })
        .await
    }

    /// Applies a guarded update of one lease: `guard` decides whether the
    /// condition holds, `update` changes the lease. On a failed condition a
    /// state matching `intent` counts as success (a retried write whose
    /// first attempt applied).
    fn update(
        table: &mut Table,
        key: &str,
        intent: Option<Intent<'_>>,
        guard: impl FnOnce(&Lease) -> bool,
        update: impl FnOnce(&mut Lease),
    ) -> Result<Lease, StoreError> {
        let Some(lease) = table.leases.get_mut(key) else {
            return Err(StoreError::ConditionFailed {
                key: key.to_owned(),
                current: None,
            });
        };
        if !guard(lease) {
            if intent.is_some_and(|i| i.applied_in(lease)) {
                return Ok(lease.clone());
            }
            return Err(StoreError::ConditionFailed {
                key: key.to_owned(),
                current: Some(Box::new(lease.clone())),
            });
        }
        let before = lease.owner.clone();
        update(lease);
        let after = lease.clone();
        if before != after.owner {
            table.owner_changes.push(OwnerChange {
                at: Instant::now(),
                key: key.to_owned(),
                from: before,
                to: after.owner.clone(),
            });
        }
        Ok(after)
    }
}

#[cfg(test)]
mod conformance_tests {
    use super::InMemoryLeaseStore;

    async fn new_store() -> InMemoryLeaseStore {
        InMemoryLeaseStore::new().with_page_size(10)
    }

    crate::lease_store_conformance!(new_store);
}
