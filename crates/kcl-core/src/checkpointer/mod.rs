//! The checkpointer handed to processors: every write conditional on the
//! lease's tenure (the worker id alone would let a write of an earlier
//! tenure, or of another process under the same id, land), every position
//! validated.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::backoff::{Backoff, mix_seed};
use crate::lease::Checkpoint;
use crate::leases::LeaseHandle;
use crate::metric_names::CHECKPOINTS;
use crate::progress::ShardTracker;
use crate::record::Record;
use crate::store::{CheckpointUpdate, LeaseStore, StoreError};

mod batch;
mod catch_up;
mod commit;
pub mod policy;
pub mod sequence;
mod window;

use batch::InFlight;
pub(crate) use batch::{Batcher, CheckpointPacer};
use catch_up::moves_forward;
pub use commit::{CommitFailure, PreparedCheckpoint};
pub use policy::CheckpointPolicy;
use policy::Pacing;
pub use sequence::{Position, SequenceNumber, covers};

/// A checkpoint write that failed retryably is tried 5 more times, from
/// 50 ms up to 1 s apart.
const CHECKPOINT_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1)).retries(5);
pub use window::MAX_LANE_RECORDS_IN_FLIGHT;
pub(crate) use window::Window;

/// Why a checkpoint was not written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// This worker no longer owns the shard; the shard's consumer stops.
    #[error("lease {key:?} is no longer held by this worker")]
    LeaseLost {
        /// The lease key.
        key: String,
    },
    /// The position is not between the last checkpoint and the last record
    /// delivered.
    #[error(
        "checkpoint {requested} is out of range: it must be after the last checkpoint \
         ({last_checkpoint}) and at or before the last delivered record ({last_delivered})"
    )]
    OutOfRange {
        /// The position asked for.
        requested: String,
        /// The last checkpoint written.
        last_checkpoint: String,
        /// The last record delivered, or "nothing".
        last_delivered: String,
    },
    /// The lease store failed even after retries.
    #[error("checkpoint could not be written")]
    Store(#[source] StoreError),
    /// The call does not apply to a shard processed in parallel lanes.
    #[error("{call} is not available in a shard processed in parallel lanes: {why}")]
    NotInLanes {
        /// The method called.
        call: &'static str,
        /// Why it does not apply.
        why: &'static str,
    },
}

/// Writes checkpoints for one shard. Given to the processor with each batch.
///
/// In a shard processed in parallel lanes, each lane's processor has its
/// own checkpointer, and a checkpoint means "this lane is done up to
/// here": the shard's checkpoint moves to the low watermark, the highest
/// position below which every lane is done, so a restart never skips a
/// record a slower lane had not finished.
pub struct Checkpointer {
    store: Arc<dyn LeaseStore>,
    lease: LeaseHandle,
    last_checkpoint: Checkpoint,
    last_delivered: Option<Position>,
    shard_ended: bool,
    /// The children recorded with SHARD_END.
    children: Vec<String>,
    lost: CancellationToken,
    /// `stream` and `shard` labels of this shard's metrics.
    labels: [(&'static str, String); 2],
    /// Set for a lane's checkpointer: where its writes go.
    lane: Option<LaneLink>,
    /// How often writes go out (the shard's checkpointer's counts; a
    /// lane's writes go through it).
    pacing: Pacing,
    /// Where a checkpoint written is reported (a lane's writes go through
    /// the shard's checkpointer, which reports them).
    progress: Option<ShardTracker>,
    /// Where positions the policy held back go when due, to be written
    /// with the worker's other shards' (see [`Batcher`]).
    batcher: Option<Batcher>,
    /// A held-back position handed to the batcher, not answered yet.
    in_flight: Option<InFlight>,
}

/// A lane's tie to its shard: the window of records handed to the lanes,
/// and the one checkpointer that writes the shard's checkpoint (one, so
/// that each write is conditional on the checkpoint before it).
struct LaneLink {
    index: usize,
    window: Arc<std::sync::Mutex<Window>>,
    shard: Arc<tokio::sync::Mutex<Checkpointer>>,
}

impl LaneLink {
    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpointer")
            .field("lease", &self.lease.key())
            .field("last_checkpoint", &self.last_checkpoint)
            .field("last_delivered", &self.last_delivered)
            .field("shard_ended", &self.shard_ended)
            .finish()
    }
}

impl Checkpointer {
    pub(crate) fn new(
        store: Arc<dyn LeaseStore>,
        lease: LeaseHandle,
        starting: Checkpoint,
        lost: CancellationToken,
    ) -> Self {
        let held = lease.lease();
        Checkpointer {
            labels: [
                ("stream", held.stream.unwrap_or_default()),
                ("shard", held.shard_id),
            ],
            store,
            lease,
            last_checkpoint: starting,
            last_delivered: None,
            shard_ended: false,
            children: Vec::new(),
            lost,
            lane: None,
            pacing: Pacing::default(),
            progress: None,
            batcher: None,
            in_flight: None,
        }
    }

    /// Reports each checkpoint written to the worker's shard progress.
    pub(crate) fn with_progress(mut self, progress: ShardTracker) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Writes at most as often as `policy` says (see [`CheckpointPolicy`]).
    pub(crate) fn with_policy(mut self, policy: CheckpointPolicy) -> Self {
        self.pacing = Pacing::new(policy);
        self
    }

    /// Writes positions the policy held back through `batcher`, together
    /// with the worker's other shards', due on its period's boundaries.
    pub(crate) fn with_batcher(mut self, batcher: Option<Batcher>) -> Self {
        if let Some(b) = &batcher {
            self.pacing.align_to(b.epoch());
        }
        self.batcher = batcher;
        self
    }

    /// The checkpointer of lane `index` of the shard whose checkpointer is
    /// `shard` (locked by the caller while it builds the lanes).
    pub(crate) fn for_lane(
        template: &Checkpointer,
        index: usize,
        window: Arc<std::sync::Mutex<Window>>,
        shard: Arc<tokio::sync::Mutex<Checkpointer>>,
    ) -> Self {
        Checkpointer {
            store: Arc::clone(&template.store),
            lease: template.lease.clone(),
            last_checkpoint: template.last_checkpoint.clone(),
            last_delivered: None,
            shard_ended: false,
            children: Vec::new(),
            lost: template.lost.clone(),
            labels: template.labels.clone(),
            lane: Some(LaneLink {
                index,
                window,
                shard,
            }),
            pacing: Pacing::default(),
            progress: None,
            batcher: None,
            in_flight: None,
        }
    }

    /// `records` were set aside (skipped, or sent to a failure
    /// destination) and count as done: in a lane, they no longer hold the
    /// shard's watermark back, while the lane's earlier records its
    /// processor has not checkpointed still do. Nothing is written.
    pub(crate) fn set_aside(&mut self, records: &[Record]) {
        if let Some(link) = &self.lane {
            let positions: Vec<Position> = records.iter().map(Position::of).collect();
            link.window().done_exactly(link.index, &positions);
        }
    }

    /// Labels this shard's metrics with its stream and shard.
    pub(crate) fn for_shard(mut self, stream: &str, shard: &str) -> Self {
        self.labels = [("stream", stream.to_owned()), ("shard", shard.to_owned())];
        self
    }

    /// A checkpointer not tied to a running worker, for testing processors
    /// (its writes are conditional on `lease`'s owner and tenure).
    #[cfg(any(test, feature = "test-util"))]
    pub fn for_test(store: Arc<dyn LeaseStore>, lease: LeaseHandle) -> Self {
        let starting = lease.lease().checkpoint;
        Self::new(store, lease, starting, CancellationToken::new())
    }

    /// Records that `record` was handed to the processor: the position a
    /// checkpoint covers. The policy's record count is kept apart
    /// ([`Self::count_dispatched`]): a batch retried, bisected or skipped
    /// is delivered again, but read once.
    pub(crate) fn delivered(&mut self, record: &Record) {
        self.last_delivered = Some(Position::of(record));
    }

    /// `n` records were read for this shard's processor, or its lanes (the
    /// policy's record count), once per batch read.
    pub(crate) fn count_dispatched(&mut self, n: usize) {
        self.pacing.count(n as u64);
    }

    /// From now on every checkpoint call writes at once: the tenure is
    /// ending (a graceful shutdown, a handoff, SHARD_END).
    pub(crate) fn write_every_call(&mut self) {
        self.pacing.write_every_call();
    }

    /// Writes the latest position the processor asked for, if the policy
    /// held it back and its period (or record count) is up now. With a
    /// batcher, the position is handed to it and this returns at once; its
    /// answer is taken in at a later call.
    pub(crate) async fn flush_due(&mut self) -> Result<(), CheckpointError> {
        if self.batcher.is_some() {
            self.settle(false).await?;
            return self.submit_if_due();
        }
        if self.pacing.deferred().is_none() || self.pacing.defers(Instant::now()) {
            return Ok(());
        }
        self.flush().await
    }

    /// Writes the latest position the processor asked for, if the policy
    /// held it back.
    pub(crate) async fn flush(&mut self) -> Result<(), CheckpointError> {
        self.settle_before_writing().await?;
        let Some(checkpoint) = self.pacing.deferred().cloned() else {
            return Ok(());
        };
        self.write_held(CheckpointUpdate::to(checkpoint)).await
    }

    /// Writes plain `update`, held back as the latest position asked for
    /// until it lands: a write that fails (not a lost lease), or whose
    /// caller is cut off while it waits (a processor's call past its
    /// timeout), leaves it for the next flush or the end of the tenure.
    async fn write_held(&mut self, update: CheckpointUpdate) -> Result<(), CheckpointError> {
        let checkpoint = update.checkpoint.clone();
        self.pacing.defer(checkpoint.clone());
        let result = self.write_now(update).await;
        if result.is_ok() && self.pacing.deferred() == Some(&checkpoint) {
            self.pacing.take_deferred();
        }
        result
    }

    /// The checkpoint as the processor asked for it: the last one written,
    /// or one its policy holds back or the batcher is writing.
    fn asked(&self) -> &Checkpoint {
        self.pacing
            .deferred()
            .or(self.in_flight.as_ref().map(|f| &f.checkpoint))
            .unwrap_or(&self.last_checkpoint)
    }

    /// The last record handed to the processor, if any.
    pub(crate) fn delivered_position(&self) -> Option<Position> {
        self.last_delivered.clone()
    }

    /// Takes back a delivery the processor failed: `checkpoint()` must not
    /// cover records that were not processed.
    pub(crate) fn rewind(&mut self, to: Option<Position>) {
        self.last_delivered = to;
    }

    /// Records that `(seq, sub)` was handed to the processor.
    #[cfg(any(test, feature = "test-util"))]
    pub fn delivered_for_test(&mut self, seq: &str, sub: u64) {
        self.last_delivered = Some(Position::new(seq, sub));
    }

    /// The shard ended, its children being `children`: the next
    /// `checkpoint` records SHARD_END, and the children with it.
    pub(crate) fn set_shard_ended(&mut self, children: Vec<String>) {
        // A lane's checkpoint at the end writes through the shard's
        // checkpointer, which the consumer marks ended too.
        self.shard_ended = true;
        self.children = children;
    }

    /// The shards a split or merge made of this one, in `shard_ended`
    /// (empty before the shard ends): they start once SHARD_END is
    /// checkpointed, and a processor may record them (for example to
    /// follow a key's order across the reshard).
    pub fn child_shards(&self) -> &[String] {
        &self.children
    }

    /// The tenure this worker holds the shard's lease under: every
    /// checkpoint is conditional on it, and a later take of the same lease
    /// (by any process, this worker's id included) starts another. Useful
    /// in logs, and to fence the application's own writes.
    pub fn lease_tenure(&self) -> &str {
        self.lease.tenure()
    }

    /// The last checkpoint written (or the one processing started from).
    pub fn last_checkpoint(&self) -> &Checkpoint {
        &self.last_checkpoint
    }

    /// True if the last checkpoint covers `record`: a batch redelivered
    /// after a failure may hold records a commit inside it already
    /// checkpointed (see [`Checkpointer::commit_with`]), whose effects must
    /// not be applied again. The rule is the reader's ([`covers`]): a
    /// record delivered whole at a checkpoint inside it is not covered.
    pub fn is_checkpointed(&self, record: &Record) -> bool {
        match &self.last_checkpoint {
            Checkpoint::ShardEnd => true,
            last => covers(last, record),
        }
    }

    /// Checkpoints the last record delivered; in `shard_ended`, records
    /// SHARD_END so the shard's children can start. In a lane: this lane is
    /// done up to its last delivered record, and the shard's checkpoint
    /// moves to the low watermark of all lanes; in `shard_ended`, SHARD_END
    /// is written once every lane has checkpointed its last record (with
    /// this call, [`Checkpointer::checkpoint_at`] or
    /// [`Checkpointer::checkpoint_record`]).
    pub async fn checkpoint(&mut self) -> Result<(), CheckpointError> {
        if let (Some(link), Some(through)) = (&self.lane, &self.last_delivered) {
            link.window().done_through(link.index, through);
        }
        if self.lane.is_some() {
            return self.write_watermark().await;
        }
        self.checkpoint_delivered().await
    }

    /// Moves the shard's checkpoint to the lanes' low watermark. Once the
    /// shard ended, SHARD_END is written when the last lane owing records
    /// checkpoints its last one in `shard_ended`, so that no lane is still
    /// flushing when the children start; until then the watermark moves
    /// with each lane's flushed chunks.
    async fn write_watermark(&mut self) -> Result<(), CheckpointError> {
        let Some(link) = &self.lane else {
            return Ok(());
        };
        let mut shard = link.shard.lock().await;
        let (watermark, every_lane_ended) = {
            let mut window = link.window();
            let ended = shard.shard_ended && window.end_lane(link.index);
            (window.watermark().cloned(), ended)
        };
        let result = match watermark {
            _ if every_lane_ended => shard.checkpoint_delivered().await,
            Some(position) => {
                shard.last_delivered = Some(position);
                shard.checkpoint_position().await
            }
            None => Ok(()),
        };
        self.last_checkpoint = shard.last_checkpoint.clone();
        result
    }

    /// Checkpoints the last record delivered, or SHARD_END once the shard
    /// ended.
    pub(crate) async fn checkpoint_delivered(&mut self) -> Result<(), CheckpointError> {
        if !self.shard_ended {
            return self.checkpoint_position().await;
        }
        let update =
            CheckpointUpdate::to(Checkpoint::ShardEnd).with_children(self.children.clone());
        self.write(update).await
    }

    /// Checkpoints the last record delivered, if that moves the checkpoint
    /// forward.
    async fn checkpoint_position(&mut self) -> Result<(), CheckpointError> {
        let asked = self.asked();
        let covered = |delivered: &Position| {
            *asked == Checkpoint::ShardEnd
                || Position::of_checkpoint(asked).is_some_and(|at| *delivered <= at)
        };
        let target = match &self.last_delivered {
            // Already covered (a failed batch was taken back after the
            // processor checkpointed part of it): never move backwards.
            Some(delivered) if covered(delivered) => return Ok(()),
            Some(delivered) => delivered.to_checkpoint(),
            // Nothing delivered: nothing new to record.
            None => return Ok(()),
        };
        self.write(CheckpointUpdate::to(target)).await
    }

    /// Checkpoints `record`: it and everything before it are done.
    pub async fn checkpoint_record(&mut self, record: &Record) -> Result<(), CheckpointError> {
        self.checkpoint_at(&record.sequence_number, record.sub_sequence_number)
            .await
    }

    /// Checkpoints at `(seq, sub)`, which must lie after the last checkpoint
    /// and at or before the last record delivered.
    ///
    /// In a lane: this lane's records up to `(seq, sub)` are done, and the
    /// shard's checkpoint moves to the low watermark of all lanes.
    pub async fn checkpoint_at(&mut self, seq: &str, sub: u64) -> Result<(), CheckpointError> {
        let target = self.validate(seq, sub)?;
        if let Some(link) = &self.lane {
            link.window()
                .done_through(link.index, &Position::new(seq, sub));
            return self.write_watermark().await;
        }
        self.write(CheckpointUpdate::to(target)).await
    }

    /// Prepares a checkpoint at `(seq, sub)` with optional application
    /// state, without moving the checkpoint: the next owner sees it in
    /// [`crate::processor::InitializeInput::pending_checkpoint`]. Commit it
    /// with a later `checkpoint_at`.
    pub async fn prepare_checkpoint(
        &mut self,
        seq: &str,
        sub: u64,
        state: Option<Vec<u8>>,
    ) -> Result<(), CheckpointError> {
        if self.lane.is_some() {
            return Err(CheckpointError::NotInLanes {
                call: "prepare_checkpoint",
                why: "a pending checkpoint names one position of the shard, and lanes finish \
                      out of order; commit each lane's work with checkpoint() instead",
            });
        }
        let pending = self.validate(seq, sub)?;
        // A position the policy held back goes first: the prepared one
        // follows it.
        self.flush().await?;
        let update = CheckpointUpdate {
            pending: Some(pending),
            pending_state: state,
            ..CheckpointUpdate::to(self.last_checkpoint.clone())
        };
        self.write(update).await
    }

    /// The error for `(seq, sub)`, naming the range it must lie in.
    fn out_of_range(&self, seq: &str, sub: u64) -> CheckpointError {
        CheckpointError::OutOfRange {
            requested: format!("{seq}/{sub}"),
            last_checkpoint: self.last_checkpoint.to_string(),
            last_delivered: self
                .last_delivered
                .as_ref()
                .map_or("nothing".to_owned(), Position::to_string),
        }
    }

    fn validate(&self, seq: &str, sub: u64) -> Result<Checkpoint, CheckpointError> {
        let out_of_range = || self.out_of_range(seq, sub);
        // Stored as Kinesis writes it: "0123" orders as 123 but is text
        // Kinesis refuses to resume at (every later owner would fail to
        // open the shard), and a commit's "not at the same position again"
        // compares the text.
        let target =
            Checkpoint::parse(sequence::canonical(seq), sub).map_err(|_| out_of_range())?;
        if target.is_sentinel() {
            return Err(out_of_range());
        }
        let Some(delivered) = &self.last_delivered else {
            return Err(out_of_range());
        };
        let requested = Position::new(seq, sub);
        if requested > *delivered {
            return Err(out_of_range());
        }
        match self.asked() {
            Checkpoint::ShardEnd => Err(out_of_range()),
            last if Position::of_checkpoint(last).is_some_and(|at| requested < at) => {
                Err(out_of_range())
            }
            _ => Ok(target),
        }
    }

    /// Writes `update`, unless the policy holds a plain position back (see
    /// [`CheckpointPolicy`]): then it is remembered, the latest one
    /// replacing any earlier, until [`Checkpointer::flush_due`] or the end
    /// of the tenure writes it. SHARD_END and prepared checkpoints always
    /// go at once (a prepared one after the held-back position).
    async fn write(&mut self, update: CheckpointUpdate) -> Result<(), CheckpointError> {
        let plain = update.pending.is_none()
            && update.pending_state.is_none()
            && update.children.is_empty()
            && update.checkpoint != Checkpoint::ShardEnd;
        // Under a batcher every plain position goes through it, unless the
        // tenure is ending.
        if plain && self.batcher.is_some() && !self.pacing.writes_every_call() {
            return self.hold_for_batch(update.checkpoint).await;
        }
        if plain && self.pacing.defers(Instant::now()) {
            self.ensure_may_checkpoint()?;
            self.pacing.defer(update.checkpoint);
            return Ok(());
        }
        self.settle_before_writing().await?;
        // This write is the latest position, or SHARD_END: it supersedes
        // what was held back.
        if plain {
            return self.write_held(update).await;
        }
        if update.checkpoint == Checkpoint::ShardEnd {
            // Superseded once SHARD_END lands; until then it is still the
            // position the tenure's end writes.
            let held = self.pacing.take_deferred();
            let result = self.write_now(update).await;
            if let (Err(_), Some(held)) = (&result, held)
                && self.pacing.deferred().is_none()
            {
                self.pacing.defer(held);
            }
            return result;
        }
        self.write_now(update).await
    }

    fn report_progress(&self) {
        if let Some(progress) = &self.progress {
            progress.checkpointed(self.last_checkpoint.to_string());
        }
    }

    async fn write_now(&mut self, update: CheckpointUpdate) -> Result<(), CheckpointError> {
        // Conditional on the checkpoint it follows: an attempt of ours
        // given up on (timed out) may still land later, after a newer one,
        // and must then fail rather than move the checkpoint back.
        let update = update.replacing(self.last_checkpoint.clone());
        self.ensure_may_checkpoint()?;
        let at = self.pacing.written_at(Instant::now());
        let result = write_retrying(self.store.as_ref(), &self.lease, &update).await;
        match self.landed(&update, result.map(drop), at) {
            // Caught up with an earlier write of this tenure (see
            // `landed`): once more, replacing it.
            Err(CheckpointError::Store(e)) if e.is_condition_failed() => {
                let update = self.replayed(update);
                let result = write_retrying(self.store.as_ref(), &self.lease, &update).await;
                self.landed(&update, result.map(drop), at)
            }
            outcome => outcome,
        }
    }

    /// `Ok` while this worker may still checkpoint the lease; else the
    /// consumer is told to stop (another worker owns the shard).
    fn ensure_may_checkpoint(&self) -> Result<(), CheckpointError> {
        if self.lease.may_checkpoint() {
            return Ok(());
        }
        self.lost.cancel();
        Err(CheckpointError::LeaseLost {
            key: self.lease.key().to_owned(),
        })
    }

    /// Takes in the outcome of writing `update`.
    /// `at` is the instant the write counts as made at (see
    /// [`Pacing::written_at`]).
    fn landed(
        &mut self,
        update: &CheckpointUpdate,
        result: Result<(), StoreError>,
        at: Instant,
    ) -> Result<(), CheckpointError> {
        let key = self.lease.key().to_owned();
        match result {
            Ok(()) => {
                metrics::counter!(CHECKPOINTS, &self.labels).increment(1);
                self.pacing.wrote(at);
                if update.pending.is_none() {
                    self.last_checkpoint = update.checkpoint.clone();
                    self.report_progress();
                }
                Ok(())
            }
            Err(e) if e.is_condition_failed() => {
                if let Some(to) = self.landed_unanswered(&e) {
                    // An earlier write of this tenure landed though every
                    // attempt of it failed: the checkpoint found is ours,
                    // not another worker's. Caught up, the position is
                    // written again (replacing it), unless that covers it.
                    self.caught_up(to);
                    if update.pending.is_some()
                        || moves_forward(&self.last_checkpoint, &update.checkpoint)
                    {
                        return Err(CheckpointError::Store(e));
                    }
                    self.pacing.wrote(at);
                    return Ok(());
                }
                warn!(lease = %key, "checkpoint rejected: another worker owns the shard; stopping");
                // The consumer stops at once: the new owner is processing.
                self.lost.cancel();
                Err(CheckpointError::LeaseLost { key })
            }
            Err(e) => Err(CheckpointError::Store(e)),
        }
    }
}

/// Writes `update` of `lease`, retrying what is worth retrying: the one way
/// every checkpoint reaches the store alone.
pub(crate) async fn write_retrying(
    store: &dyn LeaseStore,
    lease: &LeaseHandle,
    update: &CheckpointUpdate,
) -> Result<crate::lease::Lease, StoreError> {
    let key = lease.key();
    (|| async {
        // No attempt once this worker stopped believing in the lease: the
        // tenure condition keeps a late write out of a later tenure, and
        // this keeps one out of a handoff's thief as well.
        if !lease.may_checkpoint() {
            return Err(StoreError::ConditionFailed {
                key: key.to_owned(),
                current: None,
            });
        }
        store.checkpoint(key, lease.holder(), update).await
    })
    // Jittered by the tenure: one per take, under an instance id drawn per
    // process (or from a simulation's seed, which then replays).
    .retry(
        CHECKPOINT_BACKOFF
            .seeded(mix_seed(0, lease.tenure()))
            .pauses(),
    )
    .sleep(tokio::time::sleep)
    .when(StoreError::is_retryable)
    .await
}

#[cfg(test)]
mod tests;
