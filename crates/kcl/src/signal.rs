//! Turning the signals an orchestrator sends into a graceful shutdown.

use tracing::{info, warn};

/// Completes on SIGTERM (what ECS and Kubernetes send before stopping a
/// container) or SIGINT (Ctrl-C). Pass it to [`crate::Worker::run_until`]
/// and give the container a stop timeout longer than the worker's
/// `shutdown_timeout`.
///
/// A second SIGTERM or SIGINT after that ends the process at once (exit
/// status 143 or 130), as the first would have without a handler: the
/// drain is cut, and the leases it did not release expire. Once a handler
/// is installed the signals no longer end the process by themselves, so
/// an operator's second Ctrl-C waited for the whole drain.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return ctrl_c().await;
        };
        let first = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        info!("{first} received; shutting down gracefully (a second signal stops at once)");
        // The same listeners: a signal that comes before a new one would be
        // registered is not missed.
        tokio::spawn(async move {
            let (again, status) = tokio::select! {
                _ = term.recv() => ("SIGTERM", 143),
                _ = int.recv() => ("SIGINT", 130),
            };
            warn!(
                "{again} received during the shutdown; exiting at once (leases not released expire)"
            );
            std::process::exit(status);
        });
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
