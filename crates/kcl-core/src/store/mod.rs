//! The `LeaseStore` trait: conditional operations on the lease table.
//!
//! Every mutating operation is a conditional write. A write whose condition
//! does not hold fails with [`StoreError::ConditionFailed`], carrying the item
//! as the store saw it so that callers (and the store itself, see
//! [`Intent::applied_in`]) can tell a lost race from a write of their own whose
//! response was lost.

use std::fmt;

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::lease::{Checkpoint, Lease};

#[cfg(any(test, feature = "test-util"))]
pub mod conformance;
#[cfg(any(test, feature = "test-util"))]
pub mod memory;
pub mod metered;

/// One page of a scan.
pub type Page = Vec<Lease>;

/// What a checkpoint write stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointUpdate {
    /// The new checkpoint.
    pub checkpoint: Checkpoint,
    /// The prepared checkpoint to leave behind, if any (`None` clears it).
    pub pending: Option<Checkpoint>,
    /// Application state stored with the pending checkpoint.
    pub pending_state: Option<Vec<u8>>,
}

impl CheckpointUpdate {
    /// A plain checkpoint that clears any pending one.
    pub fn to(checkpoint: Checkpoint) -> Self {
        CheckpointUpdate {
            checkpoint,
            pending: None,
            pending_state: None,
        }
    }
}

/// Conditional operations on a lease table.
///
/// Implementations must be exactly as strict as the in-memory store (the
/// conformance suite in `conformance`, feature `test-util`, checks it). On success a mutating
/// call returns the lease as it now stands in the table.
#[async_trait]
pub trait LeaseStore: Send + Sync + fmt::Debug {
    /// Creates `lease` unless an item with its key exists.
    async fn create_if_absent(&self, lease: &Lease) -> Result<Lease, StoreError>;

    /// Scans the whole table, one page per stream item, following the
    /// store's continuation tokens to the end.
    fn scan(&self) -> BoxStream<'_, Result<Page, StoreError>>;

    /// Reads one lease with a strongly consistent read.
    async fn get(&self, key: &str) -> Result<Option<Lease>, StoreError>;

    /// Takes `seen` for `new_owner`. Condition: the counter and owner are
    /// still those of `seen`. Bumps the counter, clears a handoff in
    /// progress, and counts an owner switch when the owner changes.
    async fn take(&self, seen: &Lease, new_owner: &str) -> Result<Lease, StoreError>;

    /// Renews a held lease. Condition: `owner` owns it at `counter`.
    async fn renew(&self, key: &str, owner: &str, counter: u64) -> Result<Lease, StoreError>;

    /// Removes the owner so that any worker may take the lease at once.
    /// Condition: `owner` owns it. Used for graceful release and, with the
    /// observed owner, for evicting a lease by hand. A handoff in progress
    /// is kept: the previous owner may still checkpoint and complete it,
    /// and nobody takes the lease before that (or before it expires).
    async fn release(&self, key: &str, owner: &str) -> Result<Lease, StoreError>;

    /// Writes a checkpoint. Condition: `owner` may checkpoint the lease: it
    /// is the checkpoint owner of a handoff in progress, or the owner when
    /// no handoff runs. Does not bump the counter, so it never races renewal.
    async fn checkpoint(
        &self,
        key: &str,
        owner: &str,
        update: &CheckpointUpdate,
    ) -> Result<Lease, StoreError>;

    /// Starts a graceful handoff of a lease from `from` to `to`: `to`
    /// becomes the owner and `from` the checkpoint owner until it calls
    /// [`LeaseStore::complete_handoff`]. Condition: `from` owns it at
    /// `counter` and no handoff runs.
    async fn start_handoff(
        &self,
        key: &str,
        from: &str,
        counter: u64,
        to: &str,
    ) -> Result<Lease, StoreError>;

    /// Ends a handoff: clears the checkpoint owner. Condition: `from` is
    /// the checkpoint owner.
    async fn complete_handoff(&self, key: &str, from: &str) -> Result<Lease, StoreError>;

    /// Deletes a lease. Condition: its counter is still `counter`.
    async fn delete(&self, key: &str, counter: u64) -> Result<(), StoreError>;
}

/// Shared stores are stores: workers and decorators hold `Arc<dyn LeaseStore>`.
#[async_trait]
impl<S: LeaseStore + ?Sized> LeaseStore for Arc<S> {
    async fn create_if_absent(&self, lease: &Lease) -> Result<Lease, StoreError> {
        (**self).create_if_absent(lease).await
    }
    fn scan(&self) -> BoxStream<'_, Result<Page, StoreError>> {
        (**self).scan()
    }
    async fn get(&self, key: &str) -> Result<Option<Lease>, StoreError> {
        (**self).get(key).await
    }
    async fn take(&self, seen: &Lease, new_owner: &str) -> Result<Lease, StoreError> {
        (**self).take(seen, new_owner).await
    }
    async fn renew(&self, key: &str, owner: &str, counter: u64) -> Result<Lease, StoreError> {
        (**self).renew(key, owner, counter).await
    }
    async fn release(&self, key: &str, owner: &str) -> Result<Lease, StoreError> {
        (**self).release(key, owner).await
    }
    async fn checkpoint(
        &self,
        key: &str,
        owner: &str,
        update: &CheckpointUpdate,
    ) -> Result<Lease, StoreError> {
        (**self).checkpoint(key, owner, update).await
    }
    async fn start_handoff(
        &self,
        key: &str,
        from: &str,
        counter: u64,
        to: &str,
    ) -> Result<Lease, StoreError> {
        (**self).start_handoff(key, from, counter, to).await
    }
    async fn complete_handoff(&self, key: &str, from: &str) -> Result<Lease, StoreError> {
        (**self).complete_handoff(key, from).await
    }
    async fn delete(&self, key: &str, counter: u64) -> Result<(), StoreError> {
        (**self).delete(key, counter).await
    }
}

/// What a caller can do about a store error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The write's condition did not hold: someone else changed the lease.
    ConditionFailed,
    /// Worth retrying soon: a timeout, a 5xx, a lost connection.
    Retryable,
    /// The store asks callers to slow down.
    Throttled,
    /// Retrying will not help: missing table, access denied, bad item.
    Fatal,
}

/// An error from a [`LeaseStore`].
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
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::ConditionFailed { .. } => ErrorKind::ConditionFailed,
            StoreError::Retryable { .. } => ErrorKind::Retryable,
            StoreError::Throttled { .. } => ErrorKind::Throttled,
            StoreError::Fatal { .. } => ErrorKind::Fatal,
        }
    }

    /// True for errors worth retrying (transient or throttled).
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Retryable | ErrorKind::Throttled)
    }

    /// True when the write's condition did not hold.
    pub fn is_condition_failed(&self) -> bool {
        self.kind() == ErrorKind::ConditionFailed
    }

    /// The item as the store saw it when a condition failed.
    pub fn current(&self) -> Option<&Lease> {
        match self {
            StoreError::ConditionFailed { current, .. } => current.as_deref(),
            _ => None,
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
    Renew,
    Release,
    Checkpoint,
    StartHandoff,
    CompleteHandoff,
    Delete,
}

impl StoreOp {
    /// Every operation, in a stable order.
    pub const ALL: [StoreOp; 10] = [
        StoreOp::Create,
        StoreOp::ScanPage,
        StoreOp::Get,
        StoreOp::Take,
        StoreOp::Renew,
        StoreOp::Release,
        StoreOp::Checkpoint,
        StoreOp::StartHandoff,
        StoreOp::CompleteHandoff,
        StoreOp::Delete,
    ];

    /// A short snake_case name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Create => "create",
            StoreOp::ScanPage => "scan_page",
            StoreOp::Get => "get",
            StoreOp::Take => "take",
            StoreOp::Renew => "renew",
            StoreOp::Release => "release",
            StoreOp::Checkpoint => "checkpoint",
            StoreOp::StartHandoff => "start_handoff",
            StoreOp::CompleteHandoff => "complete_handoff",
            StoreOp::Delete => "delete",
        }
    }
}

impl fmt::Display for StoreOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state a counter-guarded write meant to leave behind, used to recognise
/// a write of our own whose response was lost.
///
/// When a store retries a write that was applied but whose response never
/// arrived, the retry fails its condition. If the item the store returns is
/// exactly what our write would have produced, the write was applied: the
/// store reports success instead of a lost race (invariant 2). No other
/// writer produces these states: only `owner` writes `owner` into a lease
/// with the counter it read plus one.
///
/// Writes guarded by owner alone need no intent: a checkpoint retried after
/// it applied succeeds again, and a release or handoff completion that fails
/// its condition means the lease is no longer the caller's, which is what it
/// wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent<'a> {
    /// A take or renewal: `owner` holds the lease at `counter`.
    Own {
        /// The worker taking or renewing.
        owner: &'a str,
        /// The counter the write leaves.
        counter: u64,
    },
    /// A handoff start: `to` owns, `from` checkpoints, at `counter`.
    HandoffStarted {
        /// The previous owner.
        from: &'a str,
        /// The next owner.
        to: &'a str,
        /// The counter the write leaves.
        counter: u64,
    },
}

impl Intent<'_> {
    /// True if `current` is the state this write would have produced.
    pub fn applied_in(&self, current: &Lease) -> bool {
        match *self {
            Intent::Own { owner, counter } => {
                current.is_owned_by(owner) && current.counter == counter
            }
            Intent::HandoffStarted { from, to, counter } => {
                current.is_owned_by(to)
                    && current.checkpoint_owner.as_deref() == Some(from)
                    && current.counter == counter
            }
        }
    }
}
