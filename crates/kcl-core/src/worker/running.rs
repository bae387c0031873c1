//! The worker's running consumers, and the handle's count of consumers
//! per lease key.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::WorkerHandle;
use crate::consumer::Stops;
use crate::lease::LeaseLayout;
use crate::leases::{LeaseCoordinator, LeaseHandle};

/// The running consumers: task id to lease key, stream, and stop token.
#[derive(Debug)]
pub(super) struct Running {
    by_task: HashMap<tokio::task::Id, RunningConsumer>,
    /// The handle's consumer counts per lease key.
    keys: Arc<Mutex<BTreeMap<String, usize>>>,
}

#[derive(Debug)]
pub(super) struct RunningConsumer {
    pub(super) lease: LeaseHandle,
    layout: LeaseLayout,
    stop: CancellationToken,
    /// Set once the consumer got past waiting for its shard's slot.
    past_slot: Arc<AtomicBool>,
}

impl RunningConsumer {
    /// Whether the consumer got past waiting for its shard's slot: it may
    /// have processed, beside an older consumer of its lease or not.
    pub(super) fn got_past_slot(&self) -> bool {
        self.past_slot.load(Ordering::Relaxed)
    }
}

impl Running {
    pub(super) fn new(handle: &WorkerHandle) -> Self {
        Running {
            by_task: HashMap::new(),
            keys: Arc::clone(&handle.consuming),
        }
    }
    pub(super) fn insert(
        &mut self,
        id: tokio::task::Id,
        lease: LeaseHandle,
        layout: LeaseLayout,
        stops: &Stops,
    ) {
        *self
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(lease.key().to_owned())
            .or_default() += 1;
        self.by_task.insert(
            id,
            RunningConsumer {
                lease,
                layout,
                stop: stops.shutdown.clone(),
                past_slot: Arc::clone(&stops.past_slot),
            },
        );
    }
    pub(super) fn remove(&mut self, id: tokio::task::Id) -> Option<RunningConsumer> {
        let removed = self.by_task.remove(&id)?;
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = keys.get_mut(removed.lease.key()) {
            *n -= 1;
            if *n == 0 {
                keys.remove(removed.lease.key());
            }
        }
        Some(removed)
    }
    /// Whether a consumer of lease `key` still runs.
    pub(super) fn has_key(&self, key: &str) -> bool {
        self.keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(key)
    }

    /// The lease keys whose current tenure's consumer still runs (not an
    /// older tenure's beside a newer one), each once.
    pub(super) fn current_keys(&self, coordinator: &LeaseCoordinator) -> BTreeSet<&str> {
        self.by_task
            .values()
            .filter(|c| {
                coordinator
                    .handle(c.lease.key())
                    .is_none_or(|current| current.tenure() == c.lease.tenure())
            })
            .map(|c| c.lease.key())
            .collect()
    }
    pub(super) fn stop_all(&self) {
        for c in self.by_task.values() {
            c.stop.cancel();
        }
    }
    /// Stops the consumers of one stream (their leases are released as
    /// each ends); returns how many.
    pub(super) fn retire(&self, layout: &LeaseLayout) -> usize {
        let mut n = 0;
        for c in self.by_task.values().filter(|c| &c.layout == layout) {
            c.stop.cancel();
            n += 1;
        }
        n
    }
}
