//! Who writes and what a write means: the [`Holder`] every conditional
//! write names, the [`CheckpointUpdate`] a checkpoint stores, the
//! operator's hand-back tenures, and the [`Intent`] a store reconciles a
//! lost answer against.

use std::collections::BTreeSet;

use crate::lease::{Checkpoint, Lease};

/// What a checkpoint write stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointUpdate {
    /// The new checkpoint.
    pub checkpoint: Checkpoint,
    /// The prepared checkpoint to leave behind, if any (`None` clears it).
    pub pending: Option<Checkpoint>,
    /// Application state stored with the pending checkpoint.
    pub pending_state: Option<Vec<u8>>,
    /// The checkpoint this one follows, when the writer knows it: the write
    /// is then conditional on it too, so an earlier write of the same
    /// tenure that answered late (its attempt given up, the request still
    /// on its way) fails instead of moving the checkpoint back.
    pub replacing: Option<Checkpoint>,
    /// The shard's children, recorded on the lease with its SHARD_END
    /// checkpoint (`childShardIds`, as the Java KCL records them); empty
    /// leaves the lease's list as it is.
    pub children: BTreeSet<String>,
}

/// One lease's checkpoint among several written together
/// ([`LeaseStore::checkpoint_many`](super::LeaseStore::checkpoint_many)).
#[derive(Debug, Clone, Copy)]
pub struct CheckpointWrite<'a> {
    /// The lease key.
    pub key: &'a str,
    /// Who writes, under the same condition as a single checkpoint.
    pub by: Holder<'a>,
    /// What is written.
    pub update: &'a CheckpointUpdate,
}

impl CheckpointUpdate {
    /// A plain checkpoint that clears any pending one.
    pub fn to(checkpoint: Checkpoint) -> Self {
        CheckpointUpdate {
            checkpoint,
            pending: None,
            pending_state: None,
            replacing: None,
            children: BTreeSet::new(),
        }
    }

    /// The same update, recording `children` as the shard's children.
    pub fn with_children(mut self, children: impl IntoIterator<Item = String>) -> Self {
        self.children = children.into_iter().collect();
        self
    }

    /// The same update, conditional on the table's checkpoint being
    /// `previous` (see [`CheckpointUpdate::replacing`]).
    pub fn replacing(mut self, previous: Checkpoint) -> Self {
        self.replacing = Some(previous);
        self
    }

    /// True if `lease` already shows this update (a replay of a write
    /// that applied, whose answer was lost).
    pub fn applied_in(&self, lease: &Lease) -> bool {
        lease.checkpoint == self.checkpoint
            && lease.pending_checkpoint == self.pending
            && lease.pending_checkpoint_state == self.pending_state
            && (self.children.is_empty() || lease.child_shard_ids == self.children)
    }
}

/// The tenure an operator's eviction
/// ([`LeaseStore::hand_back`](super::LeaseStore::hand_back) without
/// draining) records for the evicted holder of `tenure`: in the holder's
/// instance, so that peers judge the lease by that instance's liveness
/// record and the instance completes the handoff once it stopped, but never
/// one of its tenures (those end in hex digits), so that it may write
/// nothing more to the lease.
pub fn evicted_tenure(tenure: &str) -> String {
    format!("{}.evicted", crate::lease::instance_of(tenure))
}

/// Whose processing a
/// [`LeaseStore::hand_back`](super::LeaseStore::hand_back) of `seen` ends,
/// and the tenure it records for that holder as the checkpoint owner: the
/// owner in its tenure when no handoff runs; without `drain`, the previous
/// owner of a running handoff in its recorded tenure. `None` when the write
/// cannot apply (no such holder, or one without a tenure: a Java KCL worker
/// would checkpoint over an eviction, since it ignores kcl's tenures), and
/// stores then fail it as a lost race.
pub fn handed_back_by(seen: &Lease, drain: bool) -> Option<(Holder<'_>, String)> {
    let from = match (seen.checkpoint_owner.as_deref(), drain) {
        (None, _) => Holder::owner_of(seen)?,
        (Some(_), false) => Holder::checkpoint_owner_of(seen)?,
        (Some(_), true) => return None,
    };
    let tenure = from.tenure?;
    let previous = if drain {
        tenure.to_owned()
    } else {
        evicted_tenure(tenure)
    };
    Some((from, previous))
}

/// True if `tenure` is one [`evicted_tenure`] made (an operator's reset
/// evicted the previous owner of the handoff that records it).
pub fn is_evicted_tenure(tenure: &str) -> bool {
    tenure.ends_with(".evicted")
}

/// Who writes: a worker id and the tenure it holds the lease under.
///
/// Every take writes a fresh tenure into the lease; every later write of
/// that holder (renewal, checkpoint, handoff steps, release) is conditional
/// on it, so a second process running under the same worker id, or a
/// delayed write from an earlier tenure, fails its condition instead of
/// landing. `tenure: None` names a lease that carries no tenure (written by
/// a Java KCL worker or by kcl before tenures): the condition is then that
/// the item has none either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holder<'a> {
    /// The worker id, as written in `leaseOwner` / `checkpointOwner`.
    pub owner: &'a str,
    /// The tenure, as written by the take that started it.
    pub tenure: Option<&'a str>,
}

impl<'a> Holder<'a> {
    /// `owner` under `tenure`.
    pub fn new(owner: &'a str, tenure: &'a str) -> Self {
        Holder {
            owner,
            tenure: Some(tenure),
        }
    }

    /// The owner of `lease` as the table shows it, pinned to its tenure
    /// (for writes made on the strength of one observation, such as an
    /// operator's eviction). `None` for an unowned lease.
    pub fn owner_of(lease: &'a Lease) -> Option<Self> {
        Some(Holder {
            owner: lease.owner.as_deref()?,
            tenure: lease.tenure.as_deref(),
        })
    }

    /// The previous owner of a lease in a graceful handoff, pinned to its
    /// tenure. `None` when no handoff runs.
    pub fn checkpoint_owner_of(lease: &'a Lease) -> Option<Self> {
        Some(Holder {
            owner: lease.checkpoint_owner.as_deref()?,
            tenure: lease.checkpoint_owner_tenure.as_deref(),
        })
    }

    /// True if `lease` is owned by this holder, in this tenure.
    pub fn owns(&self, lease: &Lease) -> bool {
        lease.is_owned_by(self.owner) && lease.tenure.as_deref() == self.tenure
    }

    /// True if this holder is the previous owner of `lease` in a graceful
    /// handoff. A handoff written without the previous owner's tenure (by a
    /// Java KCL leader, or of a lease that had none) counts for any tenure
    /// of that worker.
    pub fn hands_off(&self, lease: &Lease) -> bool {
        lease.checkpoint_owner.as_deref() == Some(self.owner)
            && (lease.checkpoint_owner_tenure.is_none()
                || lease.checkpoint_owner_tenure.as_deref() == self.tenure)
    }

    /// True if this holder may checkpoint `lease`: it hands it off, or it
    /// owns it and no handoff runs.
    pub fn may_checkpoint(&self, lease: &Lease) -> bool {
        match &lease.checkpoint_owner {
            Some(_) => self.hands_off(lease),
            None => self.owns(lease),
        }
    }
}

/// The state a counter-guarded write meant to leave behind, used to recognise
/// a write of our own whose response was lost.
///
/// When a store retries a write that was applied but whose response never
/// arrived, the retry fails its condition. If the item the store returns is
/// exactly what our write would have produced, the write was applied: the
/// store reports success instead of a lost race (invariant 2). No other
/// writer produces these states: only this holder writes its own fresh
/// tenure into a lease with the counter it read plus one. (Comparing the
/// owner alone is not enough: a second process with the same worker id
/// leaves `(owner, counter + 1)` too, and would be taken for our own write.)
///
/// Writes without an intent need none: a release or handoff completion
/// that fails its condition means the lease is no longer the caller's,
/// which is what it wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent<'a> {
    /// A take: `by` holds the lease at `counter`, and no handoff runs (a
    /// take ends one). A forced handoff takes in the thief's own tenure,
    /// so without the last part a renewal of that tenure at the same
    /// counter would pass for it.
    Taken {
        /// The worker and the tenure it writes.
        by: Holder<'a>,
        /// The counter the write leaves.
        counter: u64,
    },
    /// A reclaim or renewal: `by` holds the lease at `counter`.
    Own {
        /// The worker and the tenure it writes or renews.
        by: Holder<'a>,
        /// The counter the write leaves.
        counter: u64,
    },
    /// A checkpoint: `by` may still checkpoint, and the item shows `update`.
    Checkpointed {
        /// The worker and tenure checkpointing.
        by: Holder<'a>,
        /// What the write stores.
        update: &'a CheckpointUpdate,
    },
    /// A handoff start: `to` owns (in its new tenure), `from` checkpoints,
    /// at `counter` or later.
    HandoffStarted {
        /// The previous owner.
        from: &'a str,
        /// The next owner and its new tenure.
        to: Holder<'a>,
        /// The counter the write leaves.
        counter: u64,
    },
    /// An operator's hand-back
    /// ([`LeaseStore::hand_back`](super::LeaseStore::hand_back)): nobody
    /// owns, `from` is the previous owner in exactly the tenure the write
    /// recorded, at `counter`. Only that write leaves the lease unowned
    /// with a handoff at the counter the holder had (or a steal from that
    /// tenure whose thief released at once: the same state, to the same
    /// effect), so a replay that finds this state applied. Without it a
    /// replay after a lost answer reported "nothing was written" and the
    /// operator never told the holder.
    HandedBack {
        /// The previous owner and the tenure recorded for it.
        from: Holder<'a>,
        /// The counter the write leaves (the one it read).
        counter: u64,
    },
}

impl Intent<'_> {
    /// True if `current` is the state this write would have produced.
    pub fn applied_in(&self, current: &Lease) -> bool {
        match *self {
            Intent::Taken { by, counter } => {
                by.owns(current) && current.counter == counter && !current.in_handoff()
            }
            // Not for a holder handing off: anyone renewing the lease while
            // it drains (an older kcl's thief) leaves the same state, and a
            // renewal taken for ours would extend validity from a write we
            // never made. Our own lost answer then reads as someone else's
            // renewal: we stop renewing, which is only slower.
            Intent::Own { by, counter } => by.owns(current) && current.counter == counter,
            Intent::Checkpointed { by, update } => {
                by.may_checkpoint(current) && update.applied_in(current)
            }
            // The previous owner renews on during the handoff; the new
            // tenure alone says the write was ours.
            Intent::HandoffStarted { from, to, counter } => {
                to.owns(current)
                    && current.checkpoint_owner.as_deref() == Some(from)
                    && current.counter >= counter
            }
            Intent::HandedBack { from, counter } => {
                current.owner.is_none()
                    && Holder::checkpoint_owner_of(current) == Some(from)
                    && current.counter == counter
            }
        }
    }
}
