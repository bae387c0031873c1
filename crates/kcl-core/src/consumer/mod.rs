//! One shard consumer per held lease:
//! WaitingOnParents -> Initializing -> Processing -> ShuttingDown -> Done.
//!
//! The consumer owns the shard's processor and reader. It stops fetching
//! the moment the lease ends (lost, fenced, released) or a checkpoint is
//! rejected; the batch already in the processor's hands is the only
//! overlap with a new owner (invariant 1).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::checkpointer::{CheckpointError, CheckpointPolicy, Checkpointer};
use crate::lease::{Checkpoint, LeaseLayout};
use crate::leases::LeaseHandle;
use crate::metric_names::{
    BATCH_PROCESSING_SECONDS, BYTES_PROCESSED, MILLIS_BEHIND_LATEST, PROCESSOR_ERRORS,
    RECORDS_PER_BATCH, RECORDS_PROCESSED, SHARD_END_NOT_CHECKPOINTED,
};
use crate::processor::{
    FailurePolicy, InitializeInput, ProcessorFactory, RecordBatch, RecordProcessor, ShardContext,
};

mod call_limit;
mod delivery;
mod lanes;
mod read_errors;

use crate::source::{
    Batch, ChildShard, InitialPosition, OpenShard, ShardReader, ShardSource, SourceError,
    StartPosition,
};
use crate::store::LeaseStore;
use crate::worker::{ProgressRegistry, ShardTracker};
pub(crate) use call_limit::CallLimits;
use call_limit::{Call, limited};
use delivery::deliver;
use read_errors::{ReadFailures, Retry, Stage};

/// Everything a consumer needs besides its lease; shared by all consumers
/// of one stream.
#[derive(Clone)]
pub(crate) struct ConsumerSetup {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) source: Arc<dyn ShardSource>,
    pub(crate) factory: Arc<dyn ProcessorFactory>,
    pub(crate) stream: String,
    pub(crate) layout: LeaseLayout,
    pub(crate) worker_id: String,
    pub(crate) initial: InitialPosition,
    pub(crate) policy: FailurePolicy,
    /// Lanes per shard; 1 processes a shard in one task, batch by batch.
    pub(crate) parallelism: usize,
    /// How often the shard's checkpoint is written.
    pub(crate) checkpoint_policy: CheckpointPolicy,
    pub(crate) parent_poll_interval: Duration,
    /// How long a shard may go without a successful read before it is
    /// given back (see [`ReadFailures`]).
    pub(crate) max_read_failure_time: Duration,
    /// Where each consumer reports its shard's progress.
    pub(crate) progress: ProgressRegistry,
    /// When a processor call is warned about, and when it is cancelled.
    pub(crate) call_limits: CallLimits,
    /// Pauses of loops that go on until the lease or the worker stops
    /// them: a failing processor, read, checkpoint or parent check.
    pub(crate) backoff: Backoff,
    /// One consumer per shard at a time in this worker (see [`ShardSlots`]).
    pub(crate) slots: Arc<ShardSlots>,
    /// Asks the worker's shard sync to run now (a merge child waits for a
    /// lease only the sync can create).
    pub(crate) sync_now: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for ConsumerSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerSetup")
            .field("stream", &self.stream)
            .field("layout", &self.layout)
            .field("worker_id", &self.worker_id)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// How long a new consumer waits for the previous consumer of its shard in
/// this worker to finish before it starts anyway (a processor that never
/// returns must not stall the shard forever).
const PREVIOUS_CONSUMER_GRACE: Duration = Duration::from_secs(30);

/// One consumer per shard at a time in this worker. When the worker takes a
/// lease again (a fence during a store outage, then a reclaim), the
/// consumer of its previous tenure may still be inside a processor call.
/// Its checkpoints can no longer land (they are conditional on its tenure),
/// but its side effects would overlap the new tenure's: the new consumer
/// waits for the old one, reads the checkpoint after it, and two processors
/// of one shard never run in one worker.
#[derive(Debug, Default)]
pub(crate) struct ShardSlots {
    slots: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl ShardSlots {
    /// The slot of `key`, held by the returned value until it drops.
    fn slot(self: &Arc<Self>, key: &str) -> SlotRef {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        SlotRef {
            slots: Arc::clone(self),
            key: key.to_owned(),
            slot: Some(Arc::clone(slots.entry(key.to_owned()).or_default())),
        }
    }
}

/// A consumer's reference to its shard's slot. When the last one goes, so
/// does the slot: the map stays as small as the set of shards in use, at a
/// constant cost per consumer (a sweep over every slot at each start made
/// a cold start of many shards quadratic).
struct SlotRef {
    slots: Arc<ShardSlots>,
    key: String,
    slot: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl SlotRef {
    fn mutex(&self) -> Arc<tokio::sync::Mutex<()>> {
        self.slot.clone().unwrap_or_default()
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        let mut slots = self.slots.slots.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.slot.take());
        if slots
            .get(&self.key)
            .is_some_and(|slot| Arc::strong_count(slot) == 1)
        {
            slots.remove(&self.key);
        }
    }
}

/// How a consumer ended; the worker acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConsumerExit {
    /// Every record was processed and SHARD_END checkpointed: release the
    /// lease, nobody needs to own it.
    ShardEnded,
    /// The lease ended under the consumer.
    LeaseLost,
    /// Graceful shutdown completed (the processor had its chance to
    /// checkpoint); the worker releases the lease.
    ShutDown,
    /// The failure policy gave the shard up: release the lease.
    Release,
    /// No read of the shard succeeded, and the stream service answered
    /// none of its calls, for `max_read_failure_time`: release the lease
    /// and sit out (see `LeaseCoordinator::give_back_unreadable`).
    Unreadable,
    /// Another worker asked for the shard; the processor had its chance to
    /// checkpoint: complete the handoff.
    HandedOff,
}

#[derive(Debug, Clone, Copy)]
enum Stop {
    LeaseLost,
    Shutdown,
    Release,
    Handoff,
    /// A processor call ran past its timeout and was cancelled: the shard
    /// is given back as under [`Stop::Release`].
    TimedOut,
    /// The shard could not be read (see [`ConsumerExit::Unreadable`]): it
    /// is given back as under [`Stop::Release`], and the worker sits out.
    Unreadable,
}

#[derive(Clone)]
struct Consumer {
    setup: Arc<ConsumerSetup>,
    lease: LeaseHandle,
    shutdown: CancellationToken,
    /// Cancelled by the checkpointer when a checkpoint is rejected.
    lost: CancellationToken,
    /// Cancelled when a shard processed in lanes stops, for the lanes still
    /// retrying: the consumer already knows why it stops.
    halt: CancellationToken,
    ctx: ShardContext,
    /// This consumer's shard in the worker's progress registry.
    progress: ShardTracker,
}

impl Consumer {
    /// Waits `d` unless the lease ends or shutdown is requested first.
    async fn pause(&self, d: Duration) -> Result<(), Stop> {
        tokio::select! {
            stop = self.stopped() => Err(stop),
            _ = self.halt.cancelled() => Err(Stop::Release),
            _ = tokio::time::sleep(d) => Ok(()),
        }
    }

    /// Completes when the consumer must stop, saying why.
    async fn stopped(&self) -> Stop {
        tokio::select! {
            biased;
            _ = self.lease.ended() => Stop::LeaseLost,
            _ = self.lost.cancelled() => Stop::LeaseLost,
            _ = self.lease.handoff_requested() => Stop::Handoff,
            _ = self.shutdown.cancelled() => Stop::Shutdown,
        }
    }

    /// Whether a batch already fetched may still go to the processor: the
    /// lease has not ended or lapsed. Unlike [`Consumer::still_ours`], this
    /// holds while handing the lease off, when the owner finishes what it
    /// fetched (it renews the lease until it lets go).
    fn may_finish(&self) -> Result<(), Stop> {
        if self.lost.is_cancelled() || !self.lease.may_checkpoint() {
            Err(Stop::LeaseLost)
        } else {
            Ok(())
        }
    }

    fn still_ours(&self) -> Result<(), Stop> {
        if self.lost.is_cancelled() {
            Err(Stop::LeaseLost)
        } else if self.lease.may_checkpoint() && !self.lease.is_valid() {
            Err(Stop::Handoff)
        } else if !self.lease.is_valid() {
            Err(Stop::LeaseLost)
        } else {
            Ok(())
        }
    }
}

/// Runs one shard to its end, its lease's end, or shutdown.
pub(crate) async fn run(
    setup: Arc<ConsumerSetup>,
    lease: LeaseHandle,
    shutdown: CancellationToken,
) -> ConsumerExit {
    let held = lease.lease();
    let ctx = ShardContext {
        stream: setup.stream.clone(),
        shard_id: held.shard_id.clone(),
        lease_key: held.key.clone(),
        worker_id: setup.worker_id.clone(),
        lane: None,
    };
    let c = Consumer {
        progress: setup
            .progress
            .track(&ctx.lease_key, &ctx.stream, &ctx.shard_id),
        setup,
        lease,
        shutdown,
        lost: CancellationToken::new(),
        halt: CancellationToken::new(),
        ctx,
    };
    // Held until this consumer returns: the next consumer of the shard in
    // this worker starts after it (see ShardSlots).
    let slot = c.setup.slots.slot(&c.ctx.lease_key);
    let _slot = tokio::select! {
        guard = slot.mutex().lock_owned() => Some(guard),
        _ = tokio::time::sleep(PREVIOUS_CONSUMER_GRACE) => {
            warn!(grace = ?PREVIOUS_CONSUMER_GRACE, "the previous consumer of this shard has not finished; starting anyway");
            None
        }
        _ = c.lease.ended() => return ConsumerExit::LeaseLost,
        _ = c.lease.handoff_requested() => return ConsumerExit::HandedOff,
        _ = c.shutdown.cancelled() => return ConsumerExit::ShutDown,
    };
    // WaitingOnParents: no processor exists yet, so nothing to tell it.
    match wait_for_parents(&c).await {
        Ok(()) => {}
        Err(Stop::Shutdown) => return ConsumerExit::ShutDown,
        Err(stop) => return exit_without_processor(stop),
    }
    // Initializing: the checkpoint is read fresh, not from the acquisition
    // snapshot: a previous owner may have checkpointed since.
    let current = loop {
        match c.setup.store.get(&c.ctx.lease_key).await {
            Ok(Some(l)) => break l,
            Ok(None) => {
                warn!("lease vanished from the table; stopping");
                return ConsumerExit::LeaseLost;
            }
            Err(e) => {
                warn!(error = %e, "reading the lease failed; retrying");
                if let Err(stop) = c.pause(Duration::from_millis(500)).await {
                    return exit_without_processor(stop);
                }
            }
        }
    };
    if current.checkpoint == Checkpoint::ShardEnd {
        debug!("shard already finished");
        return ConsumerExit::ShardEnded;
    }
    if c.setup.parallelism > 1 {
        let exit = lanes::run(&c, &current, c.setup.parallelism).await;
        forget_lag(&c);
        return exit;
    }
    let mut processor = c.setup.factory.create(&c.ctx);
    let mut checkpointer = Checkpointer::new(
        Arc::clone(&c.setup.store),
        c.lease.clone(),
        current.checkpoint.clone(),
        c.lost.clone(),
    )
    .for_shard(&c.ctx.stream, &c.ctx.shard_id)
    .with_policy(c.setup.checkpoint_policy)
    .with_progress(c.progress.clone());
    let input = InitializeInput {
        shard: c.ctx.clone(),
        checkpoint: current.checkpoint.clone(),
        pending_checkpoint: current.pending_checkpoint.clone(),
    };
    let outcome = match initialize(&c, processor.as_mut(), &input).await {
        Ok(()) => {
            process(
                &c,
                processor.as_mut(),
                &mut checkpointer,
                &current.checkpoint,
            )
            .await
        }
        Err(stop) => Err(stop),
    };
    forget_lag(&c);
    // ShuttingDown: exactly one of the three endings reaches the processor.
    match outcome {
        Ok(()) => ConsumerExit::ShardEnded,
        Err(Stop::LeaseLost) => {
            info!("lease lost; stopping the processor");
            lease_lost(&c, processor.as_mut(), None).await;
            ConsumerExit::LeaseLost
        }
        Err(Stop::Shutdown) => {
            last_checkpoints(&c, processor.as_mut(), &mut checkpointer).await;
            ConsumerExit::ShutDown
        }
        Err(Stop::Handoff) => {
            info!("handing the shard over; the processor may checkpoint");
            last_checkpoints(&c, processor.as_mut(), &mut checkpointer).await;
            ConsumerExit::HandedOff
        }
        Err(stop @ (Stop::Release | Stop::TimedOut | Stop::Unreadable)) => {
            lease_lost(&c, processor.as_mut(), None).await;
            exit_without_processor(stop)
        }
    }
}

/// Tells the processor its tenure ended without a graceful end (`lane` its
/// lane, if any); the processor is dropped after. A call that hangs is cut
/// at the timeout like any other: the shard goes back either way.
async fn lease_lost(c: &Consumer, processor: &mut dyn RecordProcessor, lane: Option<usize>) {
    let _ = limited(c, Call::new("lease_lost", lane), processor.lease_lost()).await;
}

/// A graceful end of the tenure: every checkpoint call writes from now on,
/// the processor's `shutdown_requested` may checkpoint, and the latest
/// position it asked for before is written if the policy held it back.
async fn last_checkpoints(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    checkpointer: &mut Checkpointer,
) {
    checkpointer.write_every_call();
    shutdown_requested(c, processor, checkpointer, None).await;
    if let Err(e) = checkpointer.flush().await {
        warn!(error = %e, "writing the last checkpoint asked for failed");
    }
}

/// The processor's `shutdown_requested` under the call limits. Cut at the
/// timeout, it checkpointed what it did before: the positions it asked
/// for in earlier calls are still written after it.
async fn shutdown_requested(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    checkpointer: &mut Checkpointer,
    lane: Option<usize>,
) {
    let call = Call::new("shutdown_requested", lane);
    if let Ok(Err(e)) = limited(c, call, processor.shutdown_requested(checkpointer)).await {
        warn!(error = %e, "processor failed in shutdown_requested");
    }
}

/// This worker no longer reads the shard: its lag drops out of the fleet's
/// max(), where the new owner's own gauge counts instead of a stale value
/// frozen at the moment the lease moved.
fn forget_lag(c: &Consumer) {
    c.progress.stopped();
    metrics::gauge!(
        MILLIS_BEHIND_LATEST,
        "stream" => c.ctx.stream.clone(),
        "shard" => c.ctx.shard_id.clone()
    )
    .set(0.0);
}

fn exit_without_processor(stop: Stop) -> ConsumerExit {
    match stop {
        Stop::LeaseLost => ConsumerExit::LeaseLost,
        Stop::Shutdown => ConsumerExit::ShutDown,
        Stop::Release | Stop::TimedOut => ConsumerExit::Release,
        Stop::Unreadable => ConsumerExit::Unreadable,
        Stop::Handoff => ConsumerExit::HandedOff,
    }
}

/// Invariant 5: a child starts only once every parent reached SHARD_END.
///
/// A parent with no lease counts as done. That is sound because a child's
/// lease is only ever created once each of its parents has a lease or is
/// deliberately never read: shard sync creates parents first (and skips
/// only closed roots under LATEST and shards trimmed away), and a parent's
/// consumer creates a merge child only once the other parent's lease
/// exists (see [`create_children`]). So a parent missing now was finished
/// and cleaned up (cleanup needs every child leased), or was never to be
/// read.
async fn wait_for_parents(c: &Consumer) -> Result<(), Stop> {
    let parents = c.lease.lease().parent_shard_ids;
    if parents.is_empty() {
        return Ok(());
    }
    let mut logged = false;
    loop {
        let mut waiting = Vec::new();
        for parent in &parents {
            match c.setup.store.get(&c.setup.layout.key(parent)).await {
                Ok(None) => {}
                Ok(Some(l)) if l.is_finished() => {}
                Ok(Some(_)) => waiting.push(parent.as_str()),
                Err(e) => {
                    debug!(error = %e, parent, "reading a parent lease failed; retrying");
                    waiting.push(parent.as_str());
                }
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if !logged {
            info!(?waiting, "waiting for parent shards to finish");
            logged = true;
        }
        c.pause(c.setup.parent_poll_interval).await?;
    }
}

async fn initialize(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    input: &InitializeInput,
) -> Result<(), Stop> {
    let mut backoff = c.setup.backoff.pauses();
    let call = Call::new("initialize", input.shard.lane.map(|l| l.index));
    loop {
        match limited(c, call, processor.initialize(input)).await? {
            Ok(()) => return Ok(()),
            Err(e) => {
                processor_error("initialize", &c.ctx, &*e);
                if c.setup.policy.releases() {
                    return Err(Stop::Release);
                }
                c.pause(backoff.next_or_max()).await?;
            }
        }
    }
}

fn processor_error(
    stage: &'static str,
    ctx: &ShardContext,
    e: &(dyn std::error::Error + Send + Sync),
) {
    error!(stage, error = %e, "processor failed");
    metrics::counter!(PROCESSOR_ERRORS, "stream" => ctx.stream.clone(), "shard" => ctx.shard_id.clone(), "stage" => stage)
        .increment(1);
}

/// Opens a reader at `position`, judging each failure as a failed read
/// (see [`ReadFailures::judge`]): the attempts count with the reads'.
async fn open_reader(
    c: &Consumer,
    position: StartPosition,
    failures: &mut ReadFailures,
) -> Result<Box<dyn ShardReader>, Stop> {
    loop {
        c.still_ours()?;
        let request = OpenShard {
            answers: failures.answers().clone(),
            ..OpenShard::new(
                c.setup.stream.clone(),
                c.ctx.shard_id.clone(),
                position.clone(),
                c.lease.clone(),
            )
        };
        // An open left unanswered counts against the read deadline too.
        let open = c.setup.source.open(request);
        tokio::pin!(open);
        let opened = loop {
            tokio::select! {
                opened = &mut open => break opened,
                () = tokio::time::sleep_until(failures.next_check()) => {
                    // The deadline moves while the service answers.
                    if failures.expired() {
                        return Err(failures.unanswered(c, Stage::Open));
                    }
                }
            }
        };
        match opened {
            Ok(reader) => return Ok(reader),
            Err(e) => {
                failures.judge(c, Stage::Open, e).await?;
            }
        }
    }
}

/// Processing: fetch, de-aggregated by the reader, hand to the processor.
/// `Ok` once SHARD_END is checkpointed.
async fn process(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    checkpointer: &mut Checkpointer,
    start: &Checkpoint,
) -> Result<(), Stop> {
    let Some(mut fetch) = Fetch::open(c, start).await? else {
        return Ok(());
    };
    loop {
        let fetched = tokio::select! {
            biased;
            stop = c.stopped() => return Err(stop),
            fetched = fetch.next_batch(c) => fetched?,
        };
        let Some(batch) = fetch.judge(c, fetched).await? else {
            continue;
        };
        if !batch.records.is_empty() {
            let records = RecordBatch {
                records: batch.records,
                millis_behind_latest: batch.millis_behind_latest,
            };
            let started = Instant::now();
            deliver(c, processor, checkpointer, &records, None).await?;
            c.progress.delivered(records.records.len());
            metrics::histogram!(BATCH_PROCESSING_SECONDS, &fetch.labels)
                .record(started.elapsed().as_secs_f64());
        }
        if let Some(children) = batch.shard_end {
            return finish_shard(c, &mut [(processor, checkpointer)], None, &children).await;
        }
        flush_due(c, checkpointer).await?;
    }
}

fn shard_labels(c: &Consumer) -> [(&'static str, String); 2] {
    [
        ("stream", c.ctx.stream.clone()),
        ("shard", c.ctx.shard_id.clone()),
    ]
}

/// The metrics of one fetched batch with records.
fn count_batch(labels: &[(&'static str, String); 2], batch: &Batch) {
    let bytes: usize = batch.records.iter().map(|r| r.data.len()).sum();
    metrics::counter!(RECORDS_PROCESSED, labels).increment(batch.records.len() as u64);
    metrics::counter!(BYTES_PROCESSED, labels).increment(bytes as u64);
    metrics::histogram!(RECORDS_PER_BATCH, labels).record(batch.records.len() as f64);
    if let Some(ms) = batch.millis_behind_latest {
        metrics::gauge!(MILLIS_BEHIND_LATEST, labels).set(ms as f64);
    }
}

/// The reading side of a consumer: its reader, the position after the
/// last batch it handed on (where a reopened reader resumes), and the
/// failures since that batch (see [`ReadFailures`]).
struct Fetch {
    reader: Box<dyn ShardReader>,
    position: StartPosition,
    /// `stream` and `shard` labels of the shard's metrics.
    labels: [(&'static str, String); 2],
    failures: ReadFailures,
}

impl Fetch {
    /// Opens the shard after `start`; `None` when there is nothing to read
    /// (the checkpoint is at the shard's end).
    async fn open(c: &Consumer, start: &Checkpoint) -> Result<Option<Fetch>, Stop> {
        let Some(position) = StartPosition::from_checkpoint(start, c.setup.initial) else {
            return Ok(None);
        };
        let mut failures = ReadFailures::new(c);
        Ok(Some(Fetch {
            reader: open_reader(c, position.clone(), &mut failures).await?,
            position,
            labels: shard_labels(c),
            failures,
        }))
    }

    /// The reader's next answer, or why the consumer stops: no read
    /// succeeded within the read deadline (see [`ReadFailures`]), the
    /// answer to this one included. A fetch cut at the deadline is
    /// dropped, which a reader must take (it is cancel-safe).
    async fn next_batch(&mut self, c: &Consumer) -> Result<Result<Batch, SourceError>, Stop> {
        let fetch = self.reader.next_batch();
        tokio::pin!(fetch);
        loop {
            tokio::select! {
                biased;
                fetched = &mut fetch => return Ok(fetched),
                () = tokio::time::sleep_until(self.failures.next_check()) => {
                    // The deadline moves while the service answers (errors
                    // a reader retries by itself, for one).
                    if self.failures.expired() {
                        return Err(self.failures.unanswered(c, Stage::Read));
                    }
                }
            }
        }
    }

    /// The batch to hand on (counted, and the position moved past it),
    /// `None` to fetch again (after a pause or a reopen from the
    /// position), or why the consumer stops.
    async fn judge(
        &mut self,
        c: &Consumer,
        fetched: Result<Batch, SourceError>,
    ) -> Result<Option<Batch>, Stop> {
        match fetched {
            Ok(batch) => {
                self.failures.reset();
                // The reader checked the lease when it was asked for this
                // batch, but the batch can arrive much later (the process
                // was paused with the batch prefetched, and resumes after a
                // peer took the lease): nothing reaches the processor unless
                // the lease is still ours (invariant 1).
                c.still_ours()?;
                c.progress
                    .fetched(batch.records.len(), batch.millis_behind_latest);
                // What the shard carries, published on its lease for peers
                // to balance by.
                let bytes: usize = batch.records.iter().map(|r| r.data.len()).sum();
                c.lease.record_read(
                    bytes as u64,
                    batch.records.len() as u64,
                    batch.millis_behind_latest,
                );
                if let Some(last) = batch.records.last() {
                    self.position = StartPosition::AfterCheckpoint {
                        seq: last.sequence_number.clone(),
                        sub: last.sub_sequence_number,
                    };
                    count_batch(&self.labels, &batch);
                } else if let Some(ms) = batch.millis_behind_latest {
                    metrics::gauge!(MILLIS_BEHIND_LATEST, &self.labels).set(ms as f64);
                }
                Ok(Some(batch))
            }
            Err(e) => match self.failures.judge(c, Stage::Read, e).await? {
                Retry::Fetch => Ok(None),
                Retry::Reopen => {
                    self.reader = open_reader(c, self.position.clone(), &mut self.failures).await?;
                    Ok(None)
                }
            },
        }
    }
}

impl Consumer {
    /// After a processor returns: a checkpoint it attempted may have found
    /// the lease gone, in which case the consumer stops at once.
    fn still_ours_after_checkpoint(&self) -> Result<(), Stop> {
        if self.lost.is_cancelled() {
            Err(Stop::LeaseLost)
        } else {
            Ok(())
        }
    }
}

/// Writes a checkpoint the policy held back once its period is up, at the
/// first fetch after that; a rejected one stops the consumer.
async fn flush_due(c: &Consumer, checkpointer: &mut Checkpointer) -> Result<(), Stop> {
    match checkpointer.flush_due().await {
        Ok(()) => Ok(()),
        Err(CheckpointError::LeaseLost { .. }) => Err(Stop::LeaseLost),
        Err(e) => {
            // Tried again at the next fetch.
            warn!(shard = %c.ctx.shard_id, error = %e, "writing a held-back checkpoint failed; retrying");
            Ok(())
        }
    }
}

/// ShuttingDown at SHARD_END: create the children's leases (so they start
/// without waiting for a shard sync), then let the processors (one, or one
/// per lane, every lane drained) checkpoint SHARD_END, retrying until one
/// does. `shard` is the shard's own checkpointer when the processors have
/// lane checkpointers.
async fn finish_shard(
    c: &Consumer,
    processors: &mut [(&mut dyn RecordProcessor, &mut Checkpointer)],
    shard: Option<&tokio::sync::Mutex<Checkpointer>>,
    children: &[ChildShard],
) -> Result<(), Stop> {
    create_children(c, children).await?;
    let ids: Vec<String> = children.iter().map(|c| c.shard_id.clone()).collect();
    if let Some(shard) = shard {
        let mut shard = shard.lock().await;
        shard.write_every_call();
        shard.set_shard_ended(ids.clone());
    }
    for (_, checkpointer) in processors.iter_mut() {
        checkpointer.write_every_call();
        checkpointer.set_shard_ended(ids.clone());
    }
    let mut backoff = c.setup.backoff.pauses();
    loop {
        // Every processor gets its call in each round, so that a lane's
        // failure does not keep the others from theirs.
        let mut failed = false;
        for (i, (processor, checkpointer)) in processors.iter_mut().enumerate() {
            // With lanes, each lane is in the slice at its index.
            let call = Call::new("shard_ended", shard.is_some().then_some(i));
            match limited(c, call, processor.shard_ended(checkpointer)).await? {
                Ok(()) => c.still_ours_after_checkpoint()?,
                Err(e) => {
                    processor_error("shard_ended", &c.ctx, &*e);
                    c.still_ours()?;
                    failed = true;
                }
            }
        }
        let ended = match shard {
            Some(shard) => *shard.lock().await.last_checkpoint() == Checkpoint::ShardEnd,
            None => processors
                .iter()
                .any(|(_, cp)| *cp.last_checkpoint() == Checkpoint::ShardEnd),
        };
        if ended {
            info!("shard finished");
            return Ok(());
        }
        if failed && c.setup.policy.releases() {
            return Err(Stop::Release);
        }
        if !failed {
            error!(
                "the processor returned from shard_ended without checkpointing; the shard's children cannot start until it does"
            );
            metrics::counter!(
                SHARD_END_NOT_CHECKPOINTED,
                "stream" => c.ctx.stream.clone(),
                "shard" => c.ctx.shard_id.clone()
            )
            .increment(1);
        }
        c.pause(backoff.next_or_max()).await?;
    }
}

/// Creates the children's leases, retrying failures until each exists.
/// SHARD_END is checkpointed only after: a child created later by shard
/// sync alone would still be correct, but cleanup and the next owner rely
/// on a finished parent's children being leased.
async fn create_children(c: &Consumer, children: &[ChildShard]) -> Result<(), Stop> {
    let mut backoff = c.setup.backoff.pauses();
    let mut pending: Vec<&ChildShard> = children.iter().collect();
    loop {
        let mut left = Vec::new();
        for child in pending {
            match create_child(c, child).await {
                Ok(()) => {}
                Err(why) => {
                    warn!(child = %child.shard_id, why, "the child shard's lease is not created yet; retrying");
                    left.push(child);
                }
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        c.setup.sync_now.notify_one();
        c.pause(backoff.next_or_max()).await?;
        pending = left;
    }
}

/// Creates one child's lease unless it exists. A merge child waits until
/// its other parent has a lease: created from this parent alone, it would
/// be read before the other parent, and the next shard sync would take
/// that parent (closed, no lease, a child leased) for finished and never
/// read it. Shard sync, which knows the other parent's lineage, creates
/// its lease (and then the child's), or the child's alone when the other
/// parent is never to be read.
async fn create_child(c: &Consumer, child: &ChildShard) -> Result<(), String> {
    let key = c.setup.layout.key(&child.shard_id);
    match c.setup.store.get(&key).await {
        Ok(Some(_)) => return Ok(()),
        Ok(None) => {}
        Err(e) => return Err(format!("reading its lease failed: {e}")),
    }
    for other in child
        .parent_shard_ids
        .iter()
        .filter(|p| **p != c.ctx.shard_id)
    {
        match c.setup.store.get(&c.setup.layout.key(other)).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(format!(
                    "its other parent {other} has no lease yet (shard sync creates it first)"
                ));
            }
            Err(e) => return Err(format!("reading its other parent {other} failed: {e}")),
        }
    }
    let mut lease = c
        .setup
        .layout
        .new_lease(&child.shard_id, Checkpoint::TrimHorizon);
    lease.parent_shard_ids = child.parent_shard_ids.iter().cloned().collect();
    lease.hash_key_range = Some(child.hash_key_range.clone());
    match c.setup.store.create_if_absent(&lease).await {
        Ok(_) => {
            info!(child = %child.shard_id, "created the child shard's lease");
            Ok(())
        }
        Err(e) if e.is_condition_failed() => Ok(()),
        Err(e) => Err(format!("creating it failed: {e}")),
    }
}
