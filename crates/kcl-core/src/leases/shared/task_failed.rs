//! The worker's own tasks that ended in a panic.
//!
//! The lease taker, the liveness watcher, the renewer and the shard sync
//! run as tasks of their own: one that panicked (a fault of kcl's, or of
//! an application's `Observer` called from it) ended in silence, and the
//! worker ran on without taking leases, without renewing them, or without
//! syncing, its probes healthy. Each task is run [`guarded`]: the first
//! panic is noted here, and the worker stops on it with an error.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

use futures::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tracing::error;

/// The first of the worker's tasks that panicked, once one has.
#[derive(Debug, Default)]
pub(crate) struct TaskFailed {
    task: OnceLock<&'static str>,
    failed: CancellationToken,
}

impl TaskFailed {
    /// Notes that `task` panicked (only the first is kept).
    fn fail(&self, task: &'static str) {
        let _ = self.task.set(task);
        self.failed.cancel();
    }

    /// The task that panicked, if one did.
    pub(crate) fn task(&self) -> Option<&'static str> {
        self.task.get().copied()
    }

    /// Completes with the task's name once one of them panicked.
    pub(crate) async fn wait(&self) -> &'static str {
        self.failed.cancelled().await;
        self.task.get().copied().unwrap_or("unknown")
    }
}

/// Runs `work` as the task `task`, noting a panic in `failed` (the panic
/// hook has already printed its message and place).
pub(crate) async fn guarded(
    failed: &TaskFailed,
    task: &'static str,
    work: impl Future<Output = ()>,
) {
    if AssertUnwindSafe(work).catch_unwind().await.is_err() {
        error!(task, "a task of the worker panicked; the worker stops");
        failed.fail(task);
    }
}
