//! One shard consumer per held lease:
//! WaitingOnParents -> Initializing -> Processing -> ShuttingDown -> Done.
//!
//! The consumer owns the shard's processor and reader. It stops fetching
//! the moment the lease ends (lost, fenced, released) or a checkpoint is
//! rejected; the batch already in the processor's hands is the only
//! overlap with a new owner (invariant 1).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::checkpointer::{CheckpointError, CheckpointPacer, Checkpointer};
use crate::lease::{Checkpoint, Lease, LeaseLayout};
use crate::leases::LeaseHandle;
use crate::metric_names::{
    BATCH_PROCESSING_SECONDS, LANE_RECORDS_IN_FLIGHT, MILLIS_BEHIND_LATEST, PROCESSOR_ERRORS,
};
use crate::processor::{
    FailurePolicy, InitializeInput, ProcessorFactory, RecordBatch, RecordProcessor, ShardContext,
};

mod call_limit;
mod delivery;
mod fetch;
mod lanes;
mod read_errors;
mod shard_end;
mod slots;

use crate::progress::{ProgressRegistry, ShardTracker};
use crate::source::{InitialPosition, ShardSource};
use crate::store::LeaseStore;
pub(crate) use call_limit::CallLimits;
use call_limit::{Call, LEASE_LOST, limited};
use delivery::deliver;
use fetch::{Fetch, shard_labels};
use shard_end::finish_shard;
pub(crate) use slots::ShardSlots;

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
    /// How often the shard's checkpoint is written, and how.
    pub(crate) checkpoints: CheckpointPacer,
    pub(crate) parent_poll_interval: Duration,
    /// How long a shard may go without a successful read before it is
    /// given back (see [`read_errors::ReadFailures`]).
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
    /// A processor call was still running when the worker's shutdown
    /// timeout cut it: the position asked for before it is written, the
    /// processor told `lease_lost`; the worker releases the lease.
    CutOff,
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
    /// The worker's shutdown ran past its timeout and cut the processor
    /// call under way: the shard ends as under [`Stop::TimedOut`].
    Cut,
}

#[derive(Clone)]
struct Consumer {
    setup: Arc<ConsumerSetup>,
    lease: LeaseHandle,
    shutdown: CancellationToken,
    /// Cancelled when the worker's shutdown timeout is up: the processor
    /// call then under way is cancelled (see [`call_limit`]).
    cut: CancellationToken,
    /// Set once this consumer got past waiting for its shard's slot.
    past_slot: Arc<std::sync::atomic::AtomicBool>,
    /// Cancelled by the checkpointer when a checkpoint is rejected.
    lost: CancellationToken,
    /// Cancelled when a shard processed in lanes stops, for the lanes still
    /// retrying: the consumer already knows why it stops.
    halt: CancellationToken,
    ctx: ShardContext,
    /// This consumer's shard in the worker's progress registry.
    progress: ShardTracker,
    /// How many processors (lanes, in order) `shard_ended` reached: that
    /// was their ending, and a stop while it is retried gives no other.
    shard_ended_told: Arc<AtomicUsize>,
}

impl Consumer {
    /// `shard_ended` is about to reach the processor of `lane` (0 without
    /// lanes): that is its ending.
    fn shard_ended_told(&self, lane: usize) {
        self.shard_ended_told.fetch_max(lane + 1, Ordering::Relaxed);
    }

    /// Whether `shard_ended` reached the processor of `lane`.
    fn had_shard_ended(&self, lane: usize) -> bool {
        lane < self.shard_ended_told.load(Ordering::Relaxed)
    }

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

/// How the worker stops a consumer: `shutdown` asks it to end gracefully,
/// `cut` (the shutdown timeout) cancels the processor call it is waiting on.
/// `past_slot` is set by the consumer once it got past waiting for its
/// shard's slot (it holds it, or gave up waiting for an older consumer):
/// from then on it may have processed beside whatever else runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stops {
    pub(crate) shutdown: CancellationToken,
    pub(crate) cut: CancellationToken,
    pub(crate) past_slot: Arc<std::sync::atomic::AtomicBool>,
}

/// Runs one shard to its end, its lease's end, or shutdown.
pub(crate) async fn run(
    setup: Arc<ConsumerSetup>,
    lease: LeaseHandle,
    stops: Stops,
) -> ConsumerExit {
    let c = Consumer::new(setup, lease, stops);
    // Held until this consumer returns: the next consumer of the shard in
    // this worker starts after it (see ShardSlots).
    let _slot = match take_slot(&c).await {
        Ok(held) => held,
        Err(exit) => return exit,
    };
    // However the consumer ends once it holds the shard's slot, its
    // shard's gauges of this tenure go to 0 (dropped before the slot): a
    // processor's panic unwinds through here past the calls below, and
    // left them at their last values (a lag, records waiting) for a shard
    // another worker now reads. Not before the slot: a consumer that gave
    // up waiting for it would zero the gauges of the one still holding it.
    let _forget = ForgetLag(&c);
    let current = match start(&c).await {
        Ok(current) => current,
        Err(exit) => return exit,
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
    run_processor(&c, &current).await
}

impl Consumer {
    /// The consumer of `lease`'s shard, registered in the worker's
    /// progress registry.
    fn new(setup: Arc<ConsumerSetup>, lease: LeaseHandle, stops: Stops) -> Self {
        let held = lease.lease();
        let ctx = ShardContext {
            stream: setup.stream.clone(),
            shard_id: held.shard_id.clone(),
            lease_key: held.key.clone(),
            worker_id: setup.worker_id.clone(),
            lane: None,
        };
        Consumer {
            progress: setup
                .progress
                .track(&ctx.lease_key, &ctx.stream, &ctx.shard_id),
            setup,
            lease,
            shutdown: stops.shutdown,
            cut: stops.cut,
            past_slot: stops.past_slot,
            lost: CancellationToken::new(),
            halt: CancellationToken::new(),
            ctx,
            shard_ended_told: Arc::default(),
        }
    }
}

/// A consumer's hold on its shard's slot (see [`ShardSlots`]). The fields
/// drop in their order: the lock first, then the reference, so that the
/// slot leaves the map when no consumer needs it.
struct HeldSlot {
    _guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    _slot: slots::SlotRef,
}

/// Waits for the previous consumer of the shard in this worker to finish,
/// for [`PREVIOUS_CONSUMER_GRACE`] at most (a processor that never returns
/// must not stall the shard), unless the lease ends, is asked for, or the
/// worker stops first.
async fn take_slot(c: &Consumer) -> Result<HeldSlot, ConsumerExit> {
    let slot = c.setup.slots.slot(&c.ctx.lease_key);
    let guard = tokio::select! {
        guard = slot.mutex().lock_owned() => Some(guard),
        _ = tokio::time::sleep(PREVIOUS_CONSUMER_GRACE) => {
            warn!(grace = ?PREVIOUS_CONSUMER_GRACE, "the previous consumer of this shard has not finished; starting anyway");
            None
        }
        _ = c.lease.ended() => return Err(ConsumerExit::LeaseLost),
        _ = c.lease.handoff_requested() => return Err(ConsumerExit::HandedOff),
        _ = c.shutdown.cancelled() => return Err(ConsumerExit::ShutDown),
    };
    c.past_slot.store(true, Ordering::Relaxed);
    Ok(HeldSlot {
        _guard: guard,
        _slot: slot,
    })
}

/// WaitingOnParents, then the lease as Initializing starts from; the exit
/// if the consumer stops before it has a processor.
async fn start(c: &Consumer) -> Result<Lease, ConsumerExit> {
    // WaitingOnParents: no processor exists yet, so nothing to tell it.
    match wait_for_parents(c).await {
        Ok(()) => {}
        Err(Stop::Shutdown) => return Err(ConsumerExit::ShutDown),
        Err(stop) => return Err(exit_without_processor(stop)),
    }
    // Initializing: the checkpoint is read fresh, not from the acquisition
    // snapshot: a previous owner may have checkpointed since.
    loop {
        match c.setup.store.get(&c.ctx.lease_key).await {
            Ok(Some(l)) => return Ok(l),
            Ok(None) => {
                warn!("lease vanished from the table; stopping");
                return Err(ConsumerExit::LeaseLost);
            }
            Err(e) => {
                warn!(error = %e, "reading the lease failed; retrying");
                if let Err(stop) = c.pause(Duration::from_millis(500)).await {
                    return Err(exit_without_processor(stop));
                }
            }
        }
    }
}

/// One processor for the whole shard: Initializing from `current`, then
/// Processing, then ShuttingDown.
async fn run_processor(c: &Consumer, current: &Lease) -> ConsumerExit {
    let mut processor = c.setup.factory.create(&c.ctx);
    let mut checkpointer = Checkpointer::new(
        Arc::clone(&c.setup.store),
        c.lease.clone(),
        current.checkpoint.clone(),
        c.lost.clone(),
    )
    .for_shard(&c.ctx.stream, &c.ctx.shard_id)
    .paced_by(&c.setup.checkpoints)
    .with_progress(c.progress.clone());
    let input = InitializeInput {
        shard: c.ctx.clone(),
        checkpoint: current.checkpoint.clone(),
        pending_checkpoint: current.pending_checkpoint.clone(),
    };
    let outcome = match initialize(c, processor.as_mut(), &input).await {
        Ok(()) => {
            process(
                c,
                processor.as_mut(),
                &mut checkpointer,
                &current.checkpoint,
            )
            .await
        }
        Err(stop) => Err(stop),
    };
    forget_lag(c);
    shut_down(c, processor.as_mut(), &mut checkpointer, outcome).await
}

/// ShuttingDown: exactly one of the three endings reaches the processor
/// (none more if `shard_ended` reached it).
async fn shut_down(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    checkpointer: &mut Checkpointer,
    outcome: Result<(), Stop>,
) -> ConsumerExit {
    let ended = c.had_shard_ended(0);
    match outcome {
        Ok(()) => ConsumerExit::ShardEnded,
        Err(Stop::LeaseLost) => {
            info!("lease lost; stopping the processor");
            if !ended {
                lease_lost(c, processor, None).await;
            }
            ConsumerExit::LeaseLost
        }
        Err(Stop::Shutdown) => last_checkpoints(c, processor, checkpointer, ended).await,
        Err(Stop::Handoff) => {
            info!("handing the shard over; the processor may checkpoint");
            match last_checkpoints(c, processor, checkpointer, ended).await {
                ConsumerExit::ShutDown => ConsumerExit::HandedOff,
                other => other,
            }
        }
        Err(stop @ (Stop::Release | Stop::TimedOut | Stop::Unreadable | Stop::Cut)) => {
            write_held_back(checkpointer).await;
            if !ended {
                lease_lost(c, processor, None).await;
            }
            exit_without_processor(stop)
        }
    }
}

/// Before a shard still held is given back: the position the policy held
/// back (asked for before the failure, so done) is written, or the next
/// owner repeats up to a policy period of records.
async fn write_held_back(checkpointer: &mut Checkpointer) {
    if let Err(e) = checkpointer.flush().await {
        warn!(error = %e, "writing the last checkpoint asked for failed");
    }
}

/// Tells the processor its tenure ended without a graceful end (`lane` its
/// lane, if any); the processor is dropped after. A call that hangs is cut
/// at the timeout like any other: the shard goes back either way.
async fn lease_lost(c: &Consumer, processor: &mut dyn RecordProcessor, lane: Option<usize>) {
    let _ = limited(c, Call::new(LEASE_LOST, lane), processor.lease_lost()).await;
}

/// A graceful end of the tenure: every checkpoint call writes from now on,
/// the processor's `shutdown_requested` may checkpoint (unless `ended`:
/// `shard_ended` was its ending), and the latest position it asked for
/// before is written if the policy held it back. See [`graceful_exit`]
/// for its exit.
async fn last_checkpoints(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    checkpointer: &mut Checkpointer,
    ended: bool,
) -> ConsumerExit {
    checkpointer.write_every_call();
    let stopped = if ended {
        Ok(())
    } else {
        shutdown_requested(c, processor, checkpointer, None).await
    };
    write_held_back(checkpointer).await;
    if stopped.is_err() {
        lease_lost(c, processor, None).await;
    }
    graceful_exit(c, matches!(stopped, Err(Stop::Cut)))
}

/// How a graceful end went: the lease was lost if a checkpoint found it
/// gone (a peer took it meanwhile), the shard was cut off if the worker's
/// shutdown timeout `cut` a call, else it shut down.
fn graceful_exit(c: &Consumer, cut: bool) -> ConsumerExit {
    if c.lost.is_cancelled() {
        ConsumerExit::LeaseLost
    } else if cut {
        ConsumerExit::CutOff
    } else {
        ConsumerExit::ShutDown
    }
}

/// The processor's `shutdown_requested` under the call limits. Cut at the
/// timeout (or the worker's shutdown timeout), it checkpointed what it did
/// before: the positions it asked for in earlier calls are still written
/// after it, and, as a call cut short is no ending, `lease_lost` follows.
/// `Err` if it was cut.
async fn shutdown_requested(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    checkpointer: &mut Checkpointer,
    lane: Option<usize>,
) -> Result<(), Stop> {
    let call = Call::new("shutdown_requested", lane);
    if let Err(e) = limited(c, call, processor.shutdown_requested(checkpointer)).await? {
        warn!(error = %e, "processor failed in shutdown_requested");
    }
    Ok(())
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
    if c.setup.parallelism > 1 {
        // A panic in `shard_ended` unwinds past the lanes' own reset.
        metrics::gauge!(LANE_RECORDS_IN_FLIGHT, &shard_labels(c)).set(0.0);
    }
}

/// Calls [`forget_lag`] when dropped (setting the gauges to 0 twice is
/// harmless).
struct ForgetLag<'c>(&'c Consumer);

impl Drop for ForgetLag<'_> {
    fn drop(&mut self) {
        forget_lag(self.0);
    }
}

fn exit_without_processor(stop: Stop) -> ConsumerExit {
    match stop {
        Stop::LeaseLost => ConsumerExit::LeaseLost,
        Stop::Shutdown => ConsumerExit::ShutDown,
        Stop::Release | Stop::TimedOut => ConsumerExit::Release,
        Stop::Unreadable => ConsumerExit::Unreadable,
        Stop::Handoff => ConsumerExit::HandedOff,
        Stop::Cut => ConsumerExit::CutOff,
    }
}

/// Invariant 5: a child starts only once every parent reached SHARD_END.
///
/// A parent with no lease counts as done. That is sound because a child's
/// lease is only ever created once each of its parents has a lease or is
/// deliberately never read: shard sync creates parents first (and skips
/// only closed roots under LATEST and shards trimmed away), and a parent's
/// consumer creates a merge child only once the other parent's lease
/// exists (see [`shard_end::create_children`]). So a parent missing now was finished
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
            checkpointer.count_dispatched(records.records.len());
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
