//! Writes of this tenure that landed though their answer was lost: the
//! lease shows a checkpoint the checkpointer never saw confirmed. Taken
//! for another worker's, it stopped the shard and its records since were
//! processed again; the checkpointer catches up with it instead.

use super::{Checkpointer, Position};
use crate::lease::Checkpoint;
use crate::store::{CheckpointUpdate, StoreError};
use tracing::warn;

impl Checkpointer {
    /// The checkpoint a refused write found, when this tenure wrote it:
    /// the lease shows this holder (owner, or previous owner in this very
    /// tenure) at a checkpoint other than the one the write replaced.
    pub(super) fn landed_unanswered(&self, e: &StoreError) -> Option<Checkpoint> {
        let StoreError::ConditionFailed {
            current: Some(current),
            ..
        } = e
        else {
            return None;
        };
        let me = self.lease.holder();
        let mine = me.owns(current)
            || (current.checkpoint_owner.as_deref() == Some(me.owner)
                && current.checkpoint_owner_tenure.as_deref() == me.tenure);
        (mine && current.checkpoint != self.last_checkpoint).then(|| current.checkpoint.clone())
    }

    /// `update` again, after the checkpointer caught up with a write of its
    /// own: replacing that checkpoint (a prepared one keeps it).
    pub(super) fn replayed(&self, mut update: CheckpointUpdate) -> CheckpointUpdate {
        if update.pending.is_some() {
            update.checkpoint = self.last_checkpoint.clone();
        }
        update.replacing(self.last_checkpoint.clone())
    }

    /// Takes `to`, which this tenure wrote though its answer was lost, as
    /// the last checkpoint, never moving backwards: a redelivered batch
    /// then skips what it covers instead of committing those records' writes
    /// under a checkpoint that already passed them.
    pub(super) fn caught_up(&mut self, to: Checkpoint) {
        if moves_forward(&self.last_checkpoint, &to) {
            warn!(lease = %self.lease.key(), checkpoint = %to, "the lease shows a checkpoint this tenure wrote though its answer was lost: the checkpointer moves on to it");
            self.last_checkpoint = to;
        }
    }
}

/// Whether `to` is past `from`: SHARD_END is past everything, a position
/// past every sentinel start.
pub(super) fn moves_forward(from: &Checkpoint, to: &Checkpoint) -> bool {
    match (to, Position::of_checkpoint(from)) {
        (Checkpoint::ShardEnd, _) => *from != Checkpoint::ShardEnd,
        (_, _) if *from == Checkpoint::ShardEnd => false,
        (to, None) => Position::of_checkpoint(to).is_some(),
        (to, Some(last)) => Position::of_checkpoint(to).is_some_and(|at| at > last),
    }
}
