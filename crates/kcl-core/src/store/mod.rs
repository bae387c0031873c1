//! The `LeaseStore` trait: conditional operations on the lease table.
//!
//! Every mutating operation is a conditional write. A write whose condition
//! does not hold fails with [`StoreError::ConditionFailed`], carrying the item
//! as the store saw it so that callers (and the store itself, see
//! [`Intent::applied_in`]) can tell a lost race from a write of their own whose
//! response was lost.

use std::collections::BTreeSet;
use std::fmt;

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::lease::{Checkpoint, Lease, Throughput};

#[cfg(any(test, feature = "test-util"))]
pub mod conformance;
#[cfg(any(test, feature = "test-util"))]
pub mod cost;
#[cfg(any(test, feature = "test-util"))]
pub mod memory;
pub mod metered;
pub(crate) mod retry;
pub mod timeout;

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

/// One worker process's liveness record (the worker-liveness renewal mode):
/// renewed every renew interval instead of every lease, so that a fleet's
/// idle cost grows with its workers, not its shards.
///
/// The record is keyed by the process's instance id, the prefix of every
/// tenure it writes (`<instance>.<n>`): a lease whose tenure names a live
/// instance is alive, whatever its own item says. Peers write into it only
/// to ask something of its owner ([`LeaseStore::poke`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Beat {
    /// The instance id (the record's key).
    pub instance: String,
    /// The worker id the instance runs under.
    pub worker: String,
    /// Bumped by every beat: peers judge liveness by seeing it move, on
    /// their own monotonic clocks (invariant 3).
    pub counter: u64,
    /// Leases the instance held at its last beat (peers balance from it
    /// without reading the lease table).
    pub held: u64,
    /// Bumped by the instance when it changed the lease table in a way
    /// peers should look at (leases created, released or finished).
    pub changes: u64,
    /// Bumped by peers that want the instance to read the lease table now
    /// (a worker that released its leases on its way out).
    pub wake: u64,
    /// Lease keys peers asked the instance to hand over (steals), until
    /// the instance answers them in a later beat.
    pub asked: std::collections::BTreeSet<String>,
    /// True once the instance stopped taking leases (a graceful shutdown
    /// is under way): its leases will be released soon.
    pub stopping: bool,
    /// True if the instance renews every lease it holds too (the
    /// per-lease mode): its tenures last no longer than its last renewal
    /// allows either, so peers also judge its leases by their counters.
    pub per_lease: bool,
    /// The instance's lease duration, so tools can judge its leases
    /// without being told the application's settings (`None` in records
    /// written before it was recorded).
    pub lease_duration: Option<std::time::Duration>,
    /// When the record was last written, on the writer's wall clock: for
    /// operators' tools, which have one sample to judge from; never for
    /// the engine's judgement of expiry, which is by the counter moving on
    /// its own clock (invariant 3).
    pub written_at: Option<std::time::SystemTime>,
    /// How long before the read the record was written, as far as the
    /// reading store can tell (DynamoDB: the reader's wall clock against
    /// [`Beat::written_at`], so off by the hosts' clock skew). The engine
    /// uses it only as a hint that cannot break an invariant: proof that a
    /// holder runs before stealing from it (a wrong proof costs a handoff
    /// forced a lease duration later, as the holder's leases expire).
    pub age: Option<std::time::Duration>,
    /// How often the instance beats (`None` in records written before it
    /// was recorded): peers read the records just after its beats land.
    pub beat_interval: Option<std::time::Duration>,
}

/// What one beat writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeatUpdate<'a> {
    /// The instance id.
    pub instance: &'a str,
    /// Its worker id.
    pub worker: &'a str,
    /// Leases held now.
    pub held: u64,
    /// The instance's change counter (see [`Beat::changes`]).
    pub changes: u64,
    /// Handoff requests (from [`Beat::asked`]) this beat answers: removed
    /// from the record.
    pub answered: &'a [String],
    /// See [`Beat::stopping`].
    pub stopping: bool,
    /// See [`Beat::per_lease`].
    pub per_lease: bool,
    /// See [`Beat::lease_duration`].
    pub lease_duration: std::time::Duration,
    /// See [`Beat::beat_interval`].
    pub beat_interval: std::time::Duration,
}

/// The tenure an operator's eviction ([`LeaseStore::hand_back`] without
/// draining) records for the evicted holder of `tenure`: in the holder's
/// instance, so that peers judge the lease by that instance's liveness
/// record and the instance completes the handoff once it stopped, but
/// never one of its tenures (those end in hex digits), so that it may
/// write nothing more to the lease.
pub fn evicted_tenure(tenure: &str) -> String {
    format!("{}.evicted", crate::leases::tenure::instance_of(tenure))
}

/// Whose processing a [`LeaseStore::hand_back`] of `seen` ends, and the
/// tenure it records for that holder as the checkpoint owner: the owner
/// in its tenure when no handoff runs; without `drain`, the previous
/// owner of a running handoff in its recorded tenure. `None` when the
/// write cannot apply (no such holder, or one without a tenure: a Java
/// KCL worker would checkpoint over an eviction, since it ignores kcl's
/// tenures), and stores then fail it as a lost race.
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
    /// lease at once. Condition: `by` owns it (worker and tenure). A
    /// handoff in progress is kept: the previous owner may still
    /// checkpoint and complete it, and nobody takes the lease before that
    /// (or before it expires).
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

    /// Reads the Java KCL 3.x workers that share this lease table: their
    /// entries in the application's `WorkerMetricStats` table (written by
    /// the Java workers, only read here). None where there is no such
    /// table.
    async fn java_workers(&self) -> Result<Vec<JavaWorker>, StoreError> {
        Ok(Vec::new())
    }
}

/// A Java KCL 3.x worker, from its `WorkerMetricStats` entry: it reports
/// every 30 s, and its leader assigns leases only to workers that report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JavaWorker {
    /// Its worker id (the `leaseOwner` it writes).
    pub id: String,
    /// When it last reported (`lut`: epoch seconds, on its own clock).
    pub last_update_secs: u64,
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
    async fn take(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).take(seen, by).await
    }
    async fn reclaim(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).reclaim(seen, by).await
    }
    async fn renew(&self, key: &str, by: Holder<'_>, counter: u64) -> Result<Lease, StoreError> {
        (**self).renew(key, by, counter).await
    }
    async fn renew_with(
        &self,
        key: &str,
        by: Holder<'_>,
        counter: u64,
        load: Option<Throughput>,
    ) -> Result<Lease, StoreError> {
        (**self).renew_with(key, by, counter, load).await
    }
    async fn report_load(
        &self,
        key: &str,
        by: Holder<'_>,
        load: Throughput,
    ) -> Result<Lease, StoreError> {
        (**self).report_load(key, by, load).await
    }
    async fn release(&self, key: &str, by: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).release(key, by).await
    }
    async fn hand_back(&self, seen: &Lease, drain: bool) -> Result<Lease, StoreError> {
        (**self).hand_back(seen, drain).await
    }
    async fn checkpoint(
        &self,
        key: &str,
        by: Holder<'_>,
        update: &CheckpointUpdate,
    ) -> Result<Lease, StoreError> {
        (**self).checkpoint(key, by, update).await
    }
    async fn start_handoff(&self, seen: &Lease, to: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).start_handoff(seen, to).await
    }
    async fn complete_handoff(&self, key: &str, from: Holder<'_>) -> Result<Lease, StoreError> {
        (**self).complete_handoff(key, from).await
    }
    async fn delete(&self, key: &str, counter: u64) -> Result<(), StoreError> {
        (**self).delete(key, counter).await
    }
    async fn beat(&self, update: &BeatUpdate<'_>) -> Result<Beat, StoreError> {
        (**self).beat(update).await
    }
    async fn beats(&self) -> Result<Vec<Beat>, StoreError> {
        (**self).beats().await
    }
    async fn poke(&self, instance: &str, ask: Option<&str>) -> Result<(), StoreError> {
        (**self).poke(instance, ask).await
    }
    async fn forget(&self, instance: &str, counter: Option<u64>) -> Result<(), StoreError> {
        (**self).forget(instance, counter).await
    }
    async fn java_workers(&self) -> Result<Vec<JavaWorker>, StoreError> {
        (**self).java_workers().await
    }
}

/// Implements [`LeaseStore`] for a decorator `$ty<S> { inner: S, .. }`
/// whose every call but `scan` runs as `self.$around(op, inner_call)`, and
/// whose `scan` is the given body (with `$this` bound to `&self`). Keeps the
/// decorators free of fifteen copies of the same delegation.
macro_rules! decorate {
    ($ty:ident, around: $around:ident, scan: |$this:ident| $scan:block) => {
        #[async_trait::async_trait]
        impl<S: $crate::store::LeaseStore> $crate::store::LeaseStore for $ty<S> {
            async fn create_if_absent(
                &self,
                lease: &$crate::lease::Lease,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::Create,
                    self.inner.create_if_absent(lease),
                )
                .await
            }
            fn scan(
                &self,
            ) -> futures::stream::BoxStream<
                '_,
                Result<$crate::store::Page, $crate::store::StoreError>,
            > {
                let $this = self;
                $scan
            }
            async fn get(
                &self,
                key: &str,
            ) -> Result<Option<$crate::lease::Lease>, $crate::store::StoreError> {
                self.$around($crate::store::StoreOp::Get, self.inner.get(key))
                    .await
            }
            async fn take(
                &self,
                seen: &$crate::lease::Lease,
                by: $crate::store::Holder<'_>,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around($crate::store::StoreOp::Take, self.inner.take(seen, by))
                    .await
            }
            async fn reclaim(
                &self,
                seen: &$crate::lease::Lease,
                by: $crate::store::Holder<'_>,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::Reclaim,
                    self.inner.reclaim(seen, by),
                )
                .await
            }
            async fn renew_with(
                &self,
                key: &str,
                by: $crate::store::Holder<'_>,
                counter: u64,
                load: Option<$crate::lease::Throughput>,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::Renew,
                    self.inner.renew_with(key, by, counter, load),
                )
                .await
            }
            async fn report_load(
                &self,
                key: &str,
                by: $crate::store::Holder<'_>,
                load: $crate::lease::Throughput,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::ReportLoad,
                    self.inner.report_load(key, by, load),
                )
                .await
            }
            async fn release(
                &self,
                key: &str,
                by: $crate::store::Holder<'_>,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around($crate::store::StoreOp::Release, self.inner.release(key, by))
                    .await
            }
            async fn hand_back(
                &self,
                seen: &$crate::lease::Lease,
                drain: bool,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::Release,
                    self.inner.hand_back(seen, drain),
                )
                .await
            }
            async fn checkpoint(
                &self,
                key: &str,
                by: $crate::store::Holder<'_>,
                update: &$crate::store::CheckpointUpdate,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::Checkpoint,
                    self.inner.checkpoint(key, by, update),
                )
                .await
            }
            async fn start_handoff(
                &self,
                seen: &$crate::lease::Lease,
                to: $crate::store::Holder<'_>,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::StartHandoff,
                    self.inner.start_handoff(seen, to),
                )
                .await
            }
            async fn complete_handoff(
                &self,
                key: &str,
                from: $crate::store::Holder<'_>,
            ) -> Result<$crate::lease::Lease, $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::CompleteHandoff,
                    self.inner.complete_handoff(key, from),
                )
                .await
            }
            async fn delete(
                &self,
                key: &str,
                counter: u64,
            ) -> Result<(), $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::Delete,
                    self.inner.delete(key, counter),
                )
                .await
            }
            async fn beat(
                &self,
                update: &$crate::store::BeatUpdate<'_>,
            ) -> Result<$crate::store::Beat, $crate::store::StoreError> {
                self.$around($crate::store::StoreOp::Beat, self.inner.beat(update))
                    .await
            }
            async fn beats(&self) -> Result<Vec<$crate::store::Beat>, $crate::store::StoreError> {
                self.$around($crate::store::StoreOp::ReadBeats, self.inner.beats())
                    .await
            }
            async fn poke(
                &self,
                instance: &str,
                ask: Option<&str>,
            ) -> Result<(), $crate::store::StoreError> {
                self.$around($crate::store::StoreOp::Poke, self.inner.poke(instance, ask))
                    .await
            }
            async fn forget(
                &self,
                instance: &str,
                counter: Option<u64>,
            ) -> Result<(), $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::Forget,
                    self.inner.forget(instance, counter),
                )
                .await
            }
            async fn java_workers(
                &self,
            ) -> Result<Vec<$crate::store::JavaWorker>, $crate::store::StoreError> {
                self.$around(
                    $crate::store::StoreOp::ReadJavaWorkers,
                    self.inner.java_workers(),
                )
                .await
            }
        }
    };
}
pub(crate) use decorate;

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
    pub const ALL: [StoreOp; 17] = [
        StoreOp::Create,
        StoreOp::ScanPage,
        StoreOp::Get,
        StoreOp::Take,
        StoreOp::Reclaim,
        StoreOp::Renew,
        StoreOp::Release,
        StoreOp::Checkpoint,
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
    /// An operator's hand-back ([`LeaseStore::hand_back`]): nobody owns,
    /// `from` is the previous owner in exactly the tenure the write
    /// recorded, at `counter`. Only that write leaves the lease unowned
    /// with a handoff at the counter the holder had (a thief's release
    /// bumps it), so a replay that finds this state applied. Without it a
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
