//! Turning the signals an orchestrator sends into a graceful shutdown.

use tracing::info;

/// Completes on SIGTERM (what ECS and Kubernetes send before stopping a
/// container) or SIGINT (Ctrl-C). Pass it to [`crate::Worker::run_until`]
/// and give the container a stop timeout longer than the worker's
/// `shutdown_timeout`.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => info!("SIGTERM received; shutting down gracefully"),
                    _ = ctrl_c() => {}
                }
            }
            Err(_) => ctrl_c().await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c().await;
}

async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_ok() {
        info!("SIGINT received; shutting down gracefully");
    } else {
        // No signal handling available: never complete, rather than shut
        // down at once.
        std::future::pending::<()>().await;
    }
}
