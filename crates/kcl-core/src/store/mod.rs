//! The `LeaseStore` trait: conditional operations on the lease table.
//!
//! Every mutating operation is a conditional write. A write whose condition
//! does not hold fails with [`StoreError::ConditionFailed`], carrying the item
//! as the store saw it so that callers (and the store itself, see
//! [`Intent::applied_in`]) can tell a lost race from a write of their own whose
//! response was lost.
//!
//! Layout: this file holds the [`LeaseStore`] trait; `condition` who writes
//! ([`Holder`]) and what a write means ([`CheckpointUpdate`], [`Intent`],
//! the hand-back tenures); `liveness` the liveness records ([`Beat`]);
//! `error` [`StoreError`] and [`StoreOp`]; `delegate` the delegation
//! through an `Arc` and the decorators' `decorate!`, used by `metered`,
//! `timeout` and `cost`; `retry` the retry loop of the engine's writes.
//! With feature `test-util`: `memory`, the in-memory store, and
//! `conformance`, the suite every store passes.

use std::fmt;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::lease::{Lease, Throughput};

mod condition;
#[cfg(any(test, feature = "test-util"))]
pub mod conformance;
#[cfg(any(test, feature = "test-util"))]
pub mod cost;
mod delegate;
mod error;
mod liveness;
#[cfg(any(test, feature = "test-util"))]
pub mod memory;
pub mod metered;
pub(crate) mod retry;
pub mod timeout;

pub use condition::{
    CheckpointUpdate, CheckpointWrite, Holder, Intent, evicted_tenure, handed_back_by,
    is_evicted_tenure,
};
pub(crate) use delegate::decorate;
pub use error::{StoreError, StoreErrorKind, StoreOp};
pub use liveness::{Beat, BeatUpdate, JavaWorker};

/// One page of a scan.
pub type Page = Vec<Lease>;

/// Conditional operations on a lease table.
///
/// Implementations must be exactly as strict as the in-memory store (the
/// conformance suite in `conformance`, feature `test-util`, checks it). On
/// success a mutating call returns the lease as it now stands in the table.
#[async_trait]
pub trait LeaseStore: Send + Sync + fmt::Debug {
    /// Creates `lease` unless an item with its key exists.
    async fn create_if_absent(&self, lease: &Lease) -> Result<Lease, StoreError>;

    /// Scans the whole table, one page per stream item, following the
    /// store's continuation tokens to the end.
    fn scan(&self) -> BoxStream<'_, Result<Page, StoreError>>;

    /// Reads one lease with a strongly consistent read.
    async fn get(&self, key: &str) -> Result<Option<Lease>, StoreError>;

    /// Takes `seen` for `by`, starting `by`'s tenure. Condition: the
    /// counter and owner are still those of `seen`. Bumps the counter,
    /// clears a handoff in progress, and counts an owner switch when the
    /// owner changes.
    async fn take(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError>;

    /// Starts a new tenure of `by` on a lease the table already says
    /// `by.owner` owns (a take whose response was lost, a restart under the
    /// same worker id). Condition: `by.owner` owns it at `seen`'s counter.
    /// Bumps the counter; keeps a handoff in progress, unlike a take.
    async fn reclaim(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError>;

    /// Renews a held lease. Condition: `by` owns it (worker and tenure), or
    /// hands it off ([`Holder::hands_off`]: the previous owner keeps a
    /// lease in a graceful handoff alive until it completes, as the Java
    /// KCL 3.x does), at `counter`.
    async fn renew(&self, key: &str, by: Holder<'_>, counter: u64) -> Result<Lease, StoreError> {
        self.renew_with(key, by, counter, None).await
    }

    /// [`LeaseStore::renew`], also writing what the lease carries
    /// (`throughputKBps`) when `load` is given, as the Java KCL 3.x's
    /// renewals do: the figure costs no request of its own.
    async fn renew_with(
        &self,
        key: &str,
        by: Holder<'_>,
        counter: u64,
        load: Option<Throughput>,
    ) -> Result<Lease, StoreError>;

    /// Publishes what the lease carries (`throughputKBps`) on its own.
    /// Condition: `by` owns the lease in its tenure. Leaves the counter
    /// (it renews nothing, so it never races a renewal) and every other
    /// attribute. A replay after a lost answer applies again, harmlessly.
    async fn report_load(
        &self,
        key: &str,
        by: Holder<'_>,
        load: Throughput,
    ) -> Result<Lease, StoreError>;

    /// Removes the owner and its tenure so that any worker may take the
    /// lease at once, and adds one to the counter (as the Java KCL's
    /// eviction does). Condition: `by` owns it (worker and tenure). A
    /// handoff in progress is kept, counter and all: the previous owner
    /// may still checkpoint and complete it, and nobody takes the lease
    /// before that (or before it expires). A Java KCL previous owner's
    /// renewals and final checkpoint are conditioned on the counter alone:
    /// one more would refuse them, and the records since its last
    /// checkpoint would be processed again.
    async fn release(&self, key: &str, by: Holder<'_>) -> Result<Lease, StoreError>;

    /// An operator's release of a lease a kcl instance holds (`seen`:
    /// owned in a tenure, no handoff running): a graceful handoff to
    /// nobody. Removes the owner and its tenure and records the owner as
    /// the checkpoint owner: in its tenure when `drain` (it checkpoints
    /// once more and completes the handoff, as after a steal), in
    /// [`evicted_tenure`] of it when not (an operator's reset: it may
    /// write nothing more, and completes the handoff once it stopped).
    /// Without `drain`, a lease `seen` in a handoff (a steal, its previous
    /// owner still draining, recorded in a tenure) is evicted the same
    /// way from that previous owner, and the new owner removed: the
    /// previous owner may still be processing the shard. Either way no
    /// peer takes the lease before that instance completes or stops
    /// beating, so none processes it while the holder still may; the
    /// operator then tells the holder through its liveness record
    /// ([`LeaseStore::poke`]). Leaves the counter, as a handoff does: a
    /// holder renewing per lease renews from the counter it knows while it
    /// drains. Condition: the owner and tenure, the handoff (previous
    /// owner and tenure, or none) and the counter are those of `seen`. A
    /// replay that finds the state its first attempt wrote succeeds
    /// ([`Intent::HandedBack`]). Counted as a release. See
    /// [`handed_back_by`] for what `seen` must show.
    async fn hand_back(&self, seen: &Lease, drain: bool) -> Result<Lease, StoreError>;

    /// Writes a checkpoint. Condition: `by` may checkpoint the lease: it
    /// is the checkpoint owner of a handoff in progress (in the tenure the
    /// handoff recorded), or the owner in its tenure when no handoff runs;
    /// and, when the update names the checkpoint it replaces, the table
    /// still shows that one. A failed condition whose item already shows
    /// the update (by a holder that may checkpoint) is a replay and
    /// succeeds. Does not bump the counter, so it never races renewal.
    async fn checkpoint(
        &self,
        key: &str,
        by: Holder<'_>,
        update: &CheckpointUpdate,
    ) -> Result<Lease, StoreError>;

    /// Writes several leases' checkpoints, each under the condition
    /// [`LeaseStore::checkpoint`] puts on it, in as few requests as the
    /// store can send them (DynamoDB: 25 to a `BatchExecuteStatement`,
    /// billed per item as single writes are). The answers are in the order
    /// of `writes`. Unlike `checkpoint`, a failed condition need not be
    /// reconciled (told apart from a replay of a write that landed): the
    /// caller writes each failure again through `checkpoint`, which does.
    /// `Err` when the request as a whole failed: any of the writes may
    /// have landed. The default writes them side by side, one request
    /// each (so that one slow write holds no other's answer back).
    async fn checkpoint_many(
        &self,
        writes: &[CheckpointWrite<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let each = writes
            .iter()
            .map(|w| async move { self.checkpoint(w.key, w.by, w.update).await.map(drop) });
        Ok(futures::future::join_all(each).await)
    }

    /// Starts a graceful handoff of `seen` from its owner to `to`: `to`
    /// becomes the owner in a new tenure, the previous owner the checkpoint
    /// owner (with its tenure) until it calls
    /// [`LeaseStore::complete_handoff`]. Condition: the owner and counter
    /// are still those of `seen` and no handoff runs. Leaves the counter
    /// (and the owner-switch count) alone, exactly as the Java KCL 3.x's
    /// `initiateGracefulLeaseHandoff`: the previous owner's renewals go on
    /// while it drains, and a Java previous owner treats a moved counter as
    /// a lost lease.
    async fn start_handoff(&self, seen: &Lease, to: Holder<'_>) -> Result<Lease, StoreError>;

    /// Ends a handoff: clears the checkpoint owner. Condition: `from` is
    /// the checkpoint owner, in the tenure the handoff recorded.
    async fn complete_handoff(&self, key: &str, from: Holder<'_>) -> Result<Lease, StoreError>;

    /// Deletes a lease. Condition: its counter is still `counter`.
    async fn delete(&self, key: &str, counter: u64) -> Result<(), StoreError>;

    /// Writes one beat of `update.instance`'s liveness record, creating it
    /// if absent: bumps its counter, sets the fields the update carries and
    /// removes the answered handoff requests. Condition: the record is
    /// absent or names the same worker. Returns the record as it now
    /// stands (peers' pokes included).
    async fn beat(&self, update: &BeatUpdate<'_>) -> Result<Beat, StoreError>;

    /// Reads every liveness record (one paginated read, strongly
    /// consistent). A store without liveness records returns none.
    async fn beats(&self) -> Result<Vec<Beat>, StoreError>;

    /// Asks `instance` to look at the lease table (bumps its
    /// [`Beat::wake`]) and, with `ask`, to hand over that lease. Condition:
    /// the record exists (a stopped instance is not brought back).
    async fn poke(&self, instance: &str, ask: Option<&str>) -> Result<(), StoreError>;

    /// Deletes `instance`'s liveness record. Condition: with `counter`, its
    /// counter is still that (a record that beat since is alive).
    async fn forget(&self, instance: &str, counter: Option<u64>) -> Result<(), StoreError>;

    /// Reads the Java KCL 3.x workers that share this lease table and
    /// whose leader assigns them leases: their reports (written by the
    /// Java workers, only read here). None where there are none, or while
    /// their fleet runs 2.x-compatible (its workers take leases
    /// themselves, as any owner does).
    async fn java_workers(&self) -> Result<Vec<JavaWorker>, StoreError> {
        Ok(Vec::new())
    }
}
