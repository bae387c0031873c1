//! [`WorkerHandle`], a running worker's cloneable handle (shutdown,
//! status, shard progress), and the [`WorkerStatus`] it reads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::shutdown::{ReportHold, Stopped};
use super::{ShardProgress, ShutdownReport};
use crate::leases::{CoordinatorSnapshot, CoordinatorStats};
use crate::progress::ProgressRegistry;

/// What a running worker is doing, for probes and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerStatus {
    /// True once the startup checks and first shard sync succeeded.
    pub ready: bool,
    /// While not ready: what the startup is waiting for (a lease table
    /// that throttles, a stream that cannot be listed yet), for readiness
    /// probes.
    pub starting: Option<String>,
    /// Lease keys with a running consumer.
    pub consuming: Vec<String>,
    /// The lease coordinator's counters.
    pub leases: CoordinatorSnapshot,
    /// Shards whose records were all processed by this worker.
    pub shards_finished: u64,
}

/// A cloneable handle to a running worker: asks for a graceful shutdown and
/// reads its status.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    pub(super) shutdown: CancellationToken,
    status: Arc<Mutex<WorkerStatus>>,
    /// The running coordinator's counters, read live by `status()`.
    pub(super) leases: Arc<Mutex<Option<Arc<CoordinatorStats>>>>,
    /// Consumers per lease key, kept by the worker as they start and end
    /// and read by `status()`: a cost per change of O(log S), where
    /// publishing a sorted list at every change made a cold start of S
    /// shards quadratic.
    pub(super) consuming: Arc<Mutex<BTreeMap<String, usize>>>,
    /// Each held shard's progress, kept by its consumer.
    pub(super) progress: ProgressRegistry,
    /// The shutdown's report, published once the worker stopped.
    pub(super) stopped: Stopped,
}

impl Default for WorkerHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerHandle {
    /// A handle not yet attached to a worker (see
    /// [`Worker::with_handle`](super::Worker::with_handle)), for callers
    /// that need it before the worker exists.
    pub fn new() -> Self {
        WorkerHandle {
            shutdown: CancellationToken::new(),
            status: Arc::default(),
            leases: Arc::default(),
            consuming: Arc::default(),
            progress: ProgressRegistry::default(),
            stopped: Stopped::default(),
        }
    }

    /// The progress of every shard this worker consumes, by lease key:
    /// its last batch processed and checkpoint written, how far behind
    /// the tip it is, and any processor call running.
    pub fn shards(&self) -> Vec<ShardProgress> {
        self.progress.snapshot()
    }

    /// The consumers that have had work waiting (records behind the tip
    /// or read and not processed, a processor call running, a full lanes'
    /// window) for longer than `bound` without processing a batch or
    /// writing a checkpoint in that time ([`ShardProgress::is_stalled`]):
    /// what a liveness check fails on. Those of [`Self::shards`], and one
    /// whose processor call hung past its tenure, while the call runs:
    /// [`Self::shards`] shows the newer consumer of its lease instead (or,
    /// once that one ended too, nothing), so a stalled lease key may be
    /// missing from it or shown there moving.
    pub fn stalled(&self, bound: Duration) -> Vec<ShardProgress> {
        self.progress.stalled(bound, Instant::now())
    }

    /// Asks the worker to stop gracefully: stop taking leases, let every
    /// processor checkpoint in `shutdown_requested`, release every lease.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Asks the worker to stop gracefully (see [`Self::shutdown`]) and
    /// waits until it has: what became of its shards and leases. Waits
    /// forever for a handle of a worker that never runs.
    pub async fn shutdown_and_wait(&self) -> ShutdownReport {
        self.shutdown();
        self.stopped().await
    }

    /// For a wrapper whose run can end before the worker's starts (the
    /// `kcl` facade's startup checks): publishes an empty report, graceful
    /// or not, unless the worker published its own, so that
    /// [`Self::stopped`] and [`Self::shutdown_and_wait`] return.
    #[doc(hidden)]
    pub fn stopped_before_running(&self, graceful: bool) {
        self.stopped.publish_unless_published(ShutdownReport {
            graceful,
            ..ShutdownReport::default()
        });
    }

    /// For a wrapper with work to do after the worker stops (the `kcl`
    /// facade deregisters its fan-out consumers and flushes its metrics):
    /// the worker's report reaches [`Self::stopped`] and
    /// [`Self::shutdown_and_wait`] only once the returned hold drops, so
    /// that a `main` returning after them cuts none of that work short.
    /// The last hold to drop with no report published or held back (the
    /// wrapper's run dropped before the worker ran) publishes the default
    /// report, not graceful.
    #[doc(hidden)]
    pub fn hold_report(&self) -> ReportHold {
        self.stopped.hold()
    }

    /// Waits until the worker has stopped, however it stopped, and
    /// returns its shutdown's report.
    pub async fn stopped(&self) -> ShutdownReport {
        self.stopped.wait().await
    }

    /// True once a shutdown was asked for (the worker may still be
    /// draining): readiness probes report "not ready" from then on.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// The worker's current status.
    pub fn status(&self) -> WorkerStatus {
        let mut status = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(live) = self
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            status.leases = live.snapshot();
        }
        status.consuming = self
            .consuming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        status
    }

    /// Records what the startup is waiting for (see
    /// [`WorkerStatus::starting`]), for wrappers that run startup steps of
    /// their own before the worker's (the `kcl` facade checks the streams
    /// and the lease table).
    pub fn report_starting(&self, why: impl Into<String>) {
        let why = why.into();
        self.update(|s| s.starting = Some(why));
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut WorkerStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
    }
}
