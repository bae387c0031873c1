//! What a worker's graceful shutdown did, for
//! [`WorkerHandle::shutdown_and_wait`](super::WorkerHandle::shutdown_and_wait).

use std::sync::Arc;

use tokio::sync::watch;

/// What a worker's shutdown did with its shards and leases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Shards whose processors finished within the shutdown timeout
    /// (`shutdown_requested` called, lanes drained): the next owner
    /// resumes where they checkpointed.
    pub drained: usize,
    /// Shards whose processors were still running at the shutdown timeout
    /// and were stopped: records since their last checkpoint are delivered
    /// again to the next owner.
    pub cut_off: usize,
    /// Leases released in the table, for peers to take at once.
    pub released: usize,
    /// Handoffs completed to the worker that asked for the lease.
    pub handed_off: usize,
    /// Releases the table refused or did not answer: those leases expire
    /// instead (a lease duration later).
    pub release_failures: usize,
    /// False if the worker stopped with an error rather than a graceful
    /// shutdown. The counts are then zero, but for a task that failed
    /// ([`WorkerError::TaskFailed`](super::WorkerError::TaskFailed)): its
    /// worker still drained and released, and counts what it did.
    pub graceful: bool,
}

/// Where the worker publishes its report, once, for every handle.
#[derive(Debug, Clone)]
pub(crate) struct Stopped(Arc<watch::Sender<Option<ShutdownReport>>>);

impl Default for Stopped {
    fn default() -> Self {
        Stopped(Arc::new(watch::channel(None).0))
    }
}

impl Stopped {
    pub(crate) fn publish(&self, report: ShutdownReport) {
        self.0.send_replace(Some(report));
    }

    /// Publishes `report` unless a report was published already.
    pub(crate) fn publish_unless_published(&self, report: ShutdownReport) {
        self.0.send_if_modified(|published| {
            let first = published.is_none();
            if first {
                *published = Some(report);
            }
            first
        });
    }

    /// The report, once the worker stopped.
    pub(crate) async fn wait(&self) -> ShutdownReport {
        let mut rx = self.0.subscribe();
        loop {
            if let Some(report) = *rx.borrow_and_update() {
                return report;
            }
            // The sender lives as long as any handle, this one included.
            if rx.changed().await.is_err() {
                return ShutdownReport::default();
            }
        }
    }
}

/// Publishes the default report (graceful false) as it drops, unless a
/// report was published already: a run dropped before its end.
pub(crate) struct PublishOnDrop(pub(crate) Stopped);

impl Drop for PublishOnDrop {
    fn drop(&mut self) {
        self.0.publish_unless_published(ShutdownReport::default());
    }
}
