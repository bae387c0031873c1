//! Checkpoints the caller writes itself, together with its own writes in
//! one atomic operation: [`Checkpointer::commit_with`], the way to apply a
//! batch's effects exactly once.

use tracing::warn;

use super::sequence::Position;
use super::{CheckpointError, Checkpointer};
use crate::lease::Checkpoint;
use crate::metric_names::CHECKPOINTS;
use crate::store::{CheckpointUpdate, Holder};

/// A checkpoint the caller writes itself, together with its own writes in
/// one atomic operation (a DynamoDB transaction): see
/// [`Checkpointer::commit_with`]. Its condition must be the store's own
/// checkpoint condition for `holder()` and `update` (owner, tenure, and the
/// checkpoint it replaces).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PreparedCheckpoint {
    /// The lease key.
    pub key: String,
    /// The worker id checkpointing.
    pub owner: String,
    /// Its tenure of the lease.
    pub tenure: Option<String>,
    /// What to write, `replacing` the last checkpoint.
    pub update: CheckpointUpdate,
}

impl PreparedCheckpoint {
    /// The holder the write is conditional on.
    pub fn holder(&self) -> Holder<'_> {
        Holder {
            owner: &self.owner,
            tenure: self.tenure.as_deref(),
        }
    }
}

/// How a caller-written checkpoint ([`Checkpointer::commit_with`]) failed.
#[derive(Debug)]
pub enum CommitFailure<E> {
    /// Its lease condition failed and it was not applied: the lease is
    /// someone else's, the consumer stops.
    LeaseLost,
    /// It was not applied because the lease, still held in this tenure,
    /// shows the checkpoint at `to` rather than the one it replaced: an
    /// earlier write of this tenure (a plain checkpoint, or a commit whose
    /// outcome was unknown) landed though its answer was lost. The
    /// checkpointer moves on to `to`, so the records it covers count as
    /// checkpointed ([`Checkpointer::is_checkpointed`]); `error` is the
    /// caller's to report.
    CheckpointMoved {
        /// The checkpoint the lease shows.
        to: Checkpoint,
        /// What the caller reports.
        error: E,
    },
    /// Anything else, the caller's to handle; the checkpoint did not move.
    Other(E),
}

impl Checkpointer {
    /// Checkpoints at `(seq, sub)` (validated as for
    /// [`Checkpointer::checkpoint_at`], and strictly after the last
    /// checkpoint) through `write`, which writes the
    /// checkpoint and the caller's own changes in one atomic operation: the
    /// way to apply a batch's effects exactly once. `write` gets the
    /// checkpoint to write and must make it conditional exactly as the
    /// lease store's checkpoint write is, reconciling a lost response
    /// itself by a marker only its own write stores: the checkpoint value
    /// alone proves nothing, since a plain checkpoint of this tenure at the
    /// same position may have landed with its answer lost (then `write`
    /// reports [`CommitFailure::CheckpointMoved`]). On success the
    /// checkpointer moves on; `Ok(Err(e))` is a failure `write` reports
    /// (the checkpoint did not move, unless it was found moved);
    /// [`CommitFailure::LeaseLost`] stops the consumer as a rejected
    /// checkpoint does.
    ///
    /// Not available in parallel lanes: the shard's checkpoint there is a
    /// watermark that may not cover this lane's records, and their effects
    /// would then be applied again after a restart.
    pub async fn commit_with<E, F, Fut>(
        &mut self,
        seq: &str,
        sub: u64,
        write: F,
    ) -> Result<Result<(), E>, CheckpointError>
    where
        F: FnOnce(PreparedCheckpoint) -> Fut,
        Fut: std::future::Future<Output = Result<(), CommitFailure<E>>>,
    {
        if self.lane.is_some() {
            return Err(CheckpointError::NotInLanes {
                call: "commit_with",
                why: "the shard's checkpoint follows the slowest lane, so a transaction's \
                      checkpoint could not cover its own records",
            });
        }
        let target = self.validate(seq, sub)?;
        // The transaction is conditional on the checkpoint written last:
        // a position the policy held back is written first.
        self.flush().await?;
        // A commit must move the checkpoint forward: its condition is the
        // checkpoint it replaces, and a second commit at the same position
        // would still pass it after the first landed, applying its writes
        // twice. Compared by value: `checkpoint()` stores a record's
        // number as its source gave it, perhaps with leading zeros.
        let last = Position::of_checkpoint(&self.last_checkpoint);
        if last.is_some() && Position::of_checkpoint(&target) == last {
            return Err(self.out_of_range(seq, sub));
        }
        self.ensure_may_checkpoint()?;
        let key = self.lease.key().to_owned();
        let holder = self.lease.holder();
        let prepared = PreparedCheckpoint {
            key: key.clone(),
            owner: holder.owner.to_owned(),
            tenure: holder.tenure.map(str::to_owned),
            update: CheckpointUpdate::to(target.clone()).replacing(self.last_checkpoint.clone()),
        };
        match write(prepared).await {
            Ok(()) => {
                metrics::counter!(CHECKPOINTS, &self.labels).increment(1);
                self.last_checkpoint = target;
                self.report_progress();
                Ok(Ok(()))
            }
            Err(CommitFailure::LeaseLost) => {
                warn!(lease = %key, "transactional checkpoint rejected: another worker owns the shard; stopping");
                self.lost.cancel();
                Err(CheckpointError::LeaseLost { key })
            }
            Err(CommitFailure::CheckpointMoved { to, error }) => {
                self.caught_up(to);
                Ok(Err(error))
            }
            Err(CommitFailure::Other(e)) => Ok(Err(e)),
        }
    }
}
