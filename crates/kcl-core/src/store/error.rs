//! What can go wrong in a [`LeaseStore`](super::LeaseStore) call: the
//! [`StoreError`], the [`StoreErrorKind`] callers branch on, and the
//! [`StoreOp`] each error and metric names.

use std::fmt;

use crate::lease::Lease;

/// What a caller can do about a store error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The write's condition did not hold: someone else changed the lease.
    ConditionFailed,
    /// Worth retrying soon: a timeout, a 5xx, a lost connection.
    Retryable,
    /// The store asks callers to slow down.
    Throttled,
    /// Retrying will not help: missing table, access denied, bad item.
    Fatal,
}

/// An error from a [`LeaseStore`](super::LeaseStore).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The write's condition did not hold. `current` is the item as the
    /// store saw it, when the store returned it.
    #[error("condition failed on lease {key:?}")]
    ConditionFailed {
        /// The lease key written.
        key: String,
        /// The item as it stood when the condition was checked.
        current: Option<Box<Lease>>,
    },
    /// A transient failure; the write may or may not have been applied.
    #[error("lease store unavailable during {op}")]
    Retryable {
        /// The operation that failed.
        op: StoreOp,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store throttled the request.
    #[error("lease store throttled {op}")]
    Throttled {
        /// The operation that was throttled.
        op: StoreOp,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A failure that retrying will not fix.
    #[error("lease store failed during {op}: {message}")]
    Fatal {
        /// The operation that failed.
        op: StoreOp,
        /// What went wrong, in words that name the table or item.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl StoreError {
    /// What the caller can do about it.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::ConditionFailed { .. } => StoreErrorKind::ConditionFailed,
            StoreError::Retryable { .. } => StoreErrorKind::Retryable,
            StoreError::Throttled { .. } => StoreErrorKind::Throttled,
            StoreError::Fatal { .. } => StoreErrorKind::Fatal,
        }
    }

    /// True for errors worth retrying (transient or throttled).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            StoreErrorKind::Retryable | StoreErrorKind::Throttled
        )
    }

    /// True when the write's condition did not hold.
    pub fn is_condition_failed(&self) -> bool {
        self.kind() == StoreErrorKind::ConditionFailed
    }

    /// The item as the store saw it when a condition failed.
    pub fn current(&self) -> Option<&Lease> {
        match self {
            StoreError::ConditionFailed { current, .. } => current.as_deref(),
            _ => None,
        }
    }

    /// A failed condition on `seen`, for a write whose condition the
    /// caller's own view already rules out (a handoff of an unowned lease).
    pub fn lost_race(seen: &Lease) -> Self {
        StoreError::ConditionFailed {
            key: seen.key.clone(),
            current: Some(Box::new(seen.clone())),
        }
    }

    /// A retryable error wrapping `source`.
    pub fn retryable(
        op: StoreOp,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StoreError::Retryable {
            op,
            source: source.into(),
        }
    }
}

/// The store operations, for errors and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum StoreOp {
    Create,
    ScanPage,
    Get,
    Take,
    Reclaim,
    Renew,
    Release,
    Checkpoint,
    /// Several leases' checkpoints in one request
    /// ([`LeaseStore::checkpoint_many`](super::LeaseStore::checkpoint_many)).
    CheckpointMany,
    StartHandoff,
    CompleteHandoff,
    Delete,
    Beat,
    ReadBeats,
    Poke,
    Forget,
    ReadJavaWorkers,
    ReportLoad,
}

impl StoreOp {
    /// Every operation, in a stable order.
    pub const ALL: [StoreOp; 18] = [
        StoreOp::Create,
        StoreOp::ScanPage,
        StoreOp::Get,
        StoreOp::Take,
        StoreOp::Reclaim,
        StoreOp::Renew,
        StoreOp::Release,
        StoreOp::Checkpoint,
        StoreOp::CheckpointMany,
        StoreOp::StartHandoff,
        StoreOp::CompleteHandoff,
        StoreOp::Delete,
        StoreOp::Beat,
        StoreOp::ReadBeats,
        StoreOp::Poke,
        StoreOp::Forget,
        StoreOp::ReadJavaWorkers,
        StoreOp::ReportLoad,
    ];

    /// A short snake_case name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Create => "create",
            StoreOp::ScanPage => "scan_page",
            StoreOp::Get => "get",
            StoreOp::Take => "take",
            StoreOp::Reclaim => "reclaim",
            StoreOp::Renew => "renew",
            StoreOp::Release => "release",
            StoreOp::Checkpoint => "checkpoint",
            StoreOp::CheckpointMany => "checkpoint_many",
            StoreOp::StartHandoff => "start_handoff",
            StoreOp::CompleteHandoff => "complete_handoff",
            StoreOp::Delete => "delete",
            StoreOp::Beat => "beat",
            StoreOp::ReadBeats => "read_beats",
            StoreOp::Poke => "poke",
            StoreOp::Forget => "forget",
            StoreOp::ReadJavaWorkers => "read_java_workers",
            StoreOp::ReportLoad => "report_load",
        }
    }
}

impl fmt::Display for StoreOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
