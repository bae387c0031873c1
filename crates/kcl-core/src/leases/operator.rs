//! An operator's repairs of a running fleet's leases (`kcl leases release`
//! and `kcl leases reset --force`), written so that no two workers ever
//! process one shard because of them.
//!
//! A kcl instance that renews through its liveness record writes no lease
//! item per round, so a lease whose owner an operator simply removed was
//! never noticed by its holder until its next checkpoint or read of the
//! table, while peers were free to take it at once: two workers processed
//! the shard. So a lease held by a kcl instance with a liveness record is
//! handed back instead ([`LeaseStore::hand_back`]): a graceful handoff to
//! nobody, which no peer takes before the holder completes it or stops
//! beating, and the holder is told through its record, as a thief tells
//! its victim. A lease whose owner has no record (a Java KCL worker, or
//! kcl renewing per lease without one) is released outright: its holder
//! renews the item and learns from the failed renewal.

use crate::lease::{Lease, instance_of};
use crate::leases::liveness::ask_entry;
use crate::store::{Beat, Holder, LeaseStore, StoreError, is_evicted_tenure};

/// What an operator's release did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// Nobody owned the lease: nothing was written.
    Unowned,
    /// Handed back by a graceful handoff to nobody (see
    /// [`LeaseStore::hand_back`]): the holder stops fetching, lets its
    /// processor checkpoint and completes the handoff; peers take the
    /// lease only then (or once the holder stops beating).
    HandedBack {
        /// The lease as written.
        lease: Lease,
        /// The holder's instance (its liveness record's key).
        instance: String,
        /// The request reached the holder's record: it learns at its next
        /// beat or read of the records. False if telling it failed: it
        /// learns at its next read of the table, and until then the shard
        /// stays its own (no peer takes it meanwhile).
        told: bool,
    },
    /// The owner has no liveness record: released outright. It renews
    /// the lease item (a Java KCL worker, or kcl renewing per lease) and
    /// stops at its next renewal.
    Released {
        /// The lease as written.
        lease: Lease,
    },
}

/// The liveness records a repair of `leases` is judged with ([`release`],
/// [`evict`]), as `store` answers them. When they cannot be read and a
/// kcl instance may hold or drain one of the leases (it carries a kcl
/// tenure), the read's error: that holder may renew through a record the
/// read did not see, and a plain release or reset would let a peer take
/// the shard while it still processes. Otherwise, failing, no records:
/// an owner without a tenure (a Java KCL worker) renews per lease and
/// learns from its next renewal. (A missing workers table is no failure:
/// it holds no records.)
pub async fn records_for(
    store: &dyn LeaseStore,
    leases: &[Lease],
) -> Result<Vec<Beat>, StoreError> {
    match store.beats().await {
        Ok(beats) => Ok(beats),
        Err(e) if leases.iter().any(kcl_tenured) => Err(e),
        Err(_) => Ok(Vec::new()),
    }
}

/// Whether a kcl instance may hold or drain `lease`: an owner or a
/// running handoff's previous owner under a tenure kcl wrote.
fn kcl_tenured(lease: &Lease) -> bool {
    let owner = lease.owner.is_some() && lease.tenure.is_some();
    let draining = lease.checkpoint_owner.is_some()
        && lease
            .checkpoint_owner_tenure
            .as_deref()
            .is_some_and(|t| !is_evicted_tenure(t));
    owner || draining
}

/// The instance holding `lease` if it is a kcl instance with a liveness
/// record among `beats`: the instance its tenure names, while that record
/// names the lease's owner (a Java KCL take leaves the last kcl tenure
/// behind, which says nothing of the Java owner).
pub fn kcl_holder<'l>(lease: &'l Lease, beats: &[Beat]) -> Option<&'l str> {
    kcl_instance(lease.owner.as_deref()?, lease.tenure.as_deref()?, beats)
}

/// The instance `tenure` names, if its liveness record among `beats`
/// names `worker`.
fn kcl_instance<'t>(worker: &str, tenure: &'t str, beats: &[Beat]) -> Option<&'t str> {
    let instance = instance_of(tenure);
    beats
        .iter()
        .any(|b| b.instance == instance && b.worker == worker)
        .then_some(instance)
}

/// Releases `lease` (as just read) so that another worker takes it, given
/// the liveness records `beats` read with it. Every write is conditional
/// on the lease as read: a lease that moved since fails with a failed
/// condition and nothing is written.
pub async fn release(
    store: &dyn LeaseStore,
    lease: &Lease,
    beats: &[Beat],
) -> Result<Released, StoreError> {
    let Some(holder) = Holder::owner_of(lease) else {
        return Ok(Released::Unowned);
    };
    // A handoff already runs: a release keeps it (its previous owner may
    // still checkpoint and complete it), and removes the new owner.
    match kcl_holder(lease, beats) {
        Some(instance) if lease.checkpoint_owner.is_none() => {
            let written = store.hand_back(lease, true).await?;
            let told = tell(store, instance, &lease.key).await;
            Ok(Released::HandedBack {
                lease: written,
                instance: instance.to_owned(),
                told,
            })
        }
        _ => {
            let written = store.release(&lease.key, holder).await?;
            Ok(Released::Released { lease: written })
        }
    }
}

/// The instance that may still be processing `lease` as the previous
/// owner of a running handoff (a steal it drains), if it is a kcl instance
/// with a liveness record among `beats`: the instance its recorded tenure
/// names, while that record names the checkpoint owner. `None` for a
/// handoff recorded without a tenure (a Java KCL leader's) or already
/// evicted.
pub fn kcl_previous_owner<'l>(lease: &'l Lease, beats: &[Beat]) -> Option<&'l str> {
    let tenure = lease
        .checkpoint_owner_tenure
        .as_deref()
        .filter(|t| !is_evicted_tenure(t))?;
    kcl_instance(lease.checkpoint_owner.as_deref()?, tenure, beats)
}

/// Evicts the kcl instance that may be processing `lease` (as just read),
/// before an operator's reset rewrites its checkpoint: its owner, or,
/// while a steal moves the lease, the previous owner still draining it
/// (the thief, which processes nothing before the handoff completes, is
/// removed). The handoff to nobody records that instance in a tenure it
/// never wrote ([`crate::store::evicted_tenure`]), so it may write nothing
/// more, and no peer takes the lease before it completes that handoff
/// (once it stopped) or stops beating. Returns the lease as written and
/// the instance, to be told with [`tell`] once the reset is written;
/// `None` (nothing written) when no kcl instance with a liveness record
/// may be processing it (a Java KCL owner or previous owner renews per
/// lease and learns from its next renewal).
pub async fn evict(
    store: &dyn LeaseStore,
    lease: &Lease,
    beats: &[Beat],
) -> Result<Option<(Lease, String)>, StoreError> {
    let instance = match lease.checkpoint_owner {
        None => kcl_holder(lease, beats),
        // Read during a steal: the previous owner may still process the
        // shard while it drains; a plain reset freed the lease at once, and
        // the thief took it back while the previous owner processed it.
        Some(_) => kcl_previous_owner(lease, beats),
    };
    match instance {
        Some(instance) => {
            let written = store.hand_back(lease, false).await?;
            Ok(Some((written, instance.to_owned())))
        }
        None => Ok(None),
    }
}

/// Asks `instance` to look at `key` now, through its liveness record (as a
/// thief asks its victim): it reads the lease at its next beat, and its
/// next read of the records wakes it to read the table. True if the
/// request landed; a record gone (the instance stopped) counts as told.
pub async fn tell(store: &dyn LeaseStore, instance: &str, key: &str) -> bool {
    match store
        .poke(instance, Some(&ask_entry(key, "operator")))
        .await
    {
        Ok(()) => true,
        Err(e) => e.is_condition_failed(),
    }
}
