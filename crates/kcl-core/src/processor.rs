//! The application's side: `RecordProcessor`, one per shard, made by a
//! `ProcessorFactory`.

use async_trait::async_trait;

use crate::checkpointer::Checkpointer;
use crate::lease::Checkpoint;
use crate::poison::PoisonPolicy;
use crate::record::Record;

pub use crate::context::{Lane, ProcessorError, ShardContext};

/// What [`RecordProcessor::initialize`] is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitializeInput {
    /// The shard.
    pub shard: ShardContext,
    /// Where processing resumes: records after this one are delivered.
    pub checkpoint: Checkpoint,
    /// A checkpoint prepared but not committed by a previous owner, if
    /// any; the processor decides whether its side effects happened.
    pub pending_checkpoint: Option<Checkpoint>,
}

/// One batch of records for [`RecordProcessor::process_records`].
#[derive(Debug, Clone, PartialEq)]
pub struct RecordBatch {
    /// User records in shard order (KPL aggregates already split). Empty
    /// only in the case [`RecordProcessor::process_records`] describes.
    pub records: Vec<Record>,
    /// How far behind the tip of the shard this batch is, when known.
    pub millis_behind_latest: Option<u64>,
}

/// The application's code for one shard.
///
/// The worker calls these methods from one task per shard, never
/// concurrently, in this order: `initialize`, then `process_records` for
/// each batch, then exactly one of `shard_ended`, `shutdown_requested` or
/// `lease_lost` as its ending. A `shard_ended` or `shutdown_requested`
/// cancelled before it returned (see [`RecordProcessor::lease_lost`]) is
/// no ending: `lease_lost` follows it.
///
/// Delivery is at-least-once: after a crash or a lost lease, records after
/// the last checkpoint are delivered again, possibly to another worker.
#[async_trait]
pub trait RecordProcessor: Send {
    /// Called once before the first batch. Return an error to let the
    /// failure policy decide (the default retries).
    async fn initialize(&mut self, input: &InitializeInput) -> Result<(), ProcessorError> {
        let _ = input;
        Ok(())
    }

    /// Processes one batch. Checkpoint with `checkpointer` when the batch's
    /// effects are durable; an error leaves the batch to the failure
    /// policy (by default the same batch is retried with backoff, so
    /// nothing is ever skipped silently).
    ///
    /// It may be called with an empty batch only when the shard runs in
    /// parallel lanes (`parallelism_per_shard` above 1), its fetching has
    /// stopped because the lanes hold
    /// [`MAX_LANE_RECORDS_IN_FLIGHT`](crate::checkpointer::MAX_LANE_RECORDS_IN_FLIGHT)
    /// records past its checkpoint, and this lane holds the oldest of them
    /// and has no batch to run. It then gets an empty batch after 1 s, and
    /// again at pauses doubling up to 30 s for as long as that lasts, so
    /// that a processor that buffers records and flushes on a timer it
    /// checks here can flush and checkpoint (`checkpoint()` covers every
    /// record the lane was given). The call comes like any other, never
    /// beside another call of this processor, and its error goes to the
    /// failure policy as a batch's would (under `Isolate`, with no record
    /// to set aside, it is retried as under [`FailurePolicy::Retry`]). A
    /// processor with nothing to flush returns `Ok`.
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError>;

    /// Every record of a closed shard was delivered. The processor MUST
    /// checkpoint here (`checkpointer.checkpoint()` records SHARD_END), or
    /// the shard's children never start; the default does exactly that.
    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), ProcessorError> {
        checkpointer.checkpoint().await?;
        Ok(())
    }

    /// The worker is shutting down gracefully, or handing the shard to
    /// another worker: checkpoint what is done so the next owner resumes
    /// right after it. Keep it short; the worker waits up to its shutdown
    /// timeout. The default does not checkpoint.
    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let _ = checkpointer;
        Ok(())
    }

    /// Another worker owns the shard now (or this worker could not renew
    /// its lease in time), or this worker gives the shard back: the failure
    /// policy released it, or a call ran past `processor_timeout`, or was
    /// still running at the worker's shutdown timeout, and was cancelled
    /// (`shutdown_requested` and `shard_ended` included: a call cut short
    /// is no ending). Checkpointing is no longer possible; release resources
    /// and stop side effects. The processor is dropped after.
    async fn lease_lost(&mut self) {}
}

/// Makes one processor per shard.
pub trait ProcessorFactory: Send + Sync + 'static {
    /// A processor for `shard`.
    fn create(&self, shard: &ShardContext) -> Box<dyn RecordProcessor>;
}

impl<F, P> ProcessorFactory for F
where
    F: Fn(&ShardContext) -> P + Send + Sync + 'static,
    P: RecordProcessor + 'static,
{
    fn create(&self, shard: &ShardContext) -> Box<dyn RecordProcessor> {
        Box::new(self(shard))
    }
}

/// What the worker does when a processor returns an error.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Deliver the same batch again after a backoff (capped exponential),
    /// until it succeeds or the lease is lost. Nothing is skipped. The
    /// default.
    #[default]
    Retry,
    /// Log the error, count it (`kcl_processor_batches_skipped_total`) and
    /// move on to the next batch.
    Skip,
    /// Stop processing the shard and release its lease, so that another
    /// worker (or this one, later) starts again from the last checkpoint.
    ReleaseShard,
    /// Find the records the processor keeps failing on and set them aside
    /// (to a [`FailureDestination`](crate::poison::FailureDestination), or
    /// dropped and counted), so that one bad record never stalls the
    /// shard; see [`crate::poison`]. Failures outside `process_records`
    /// (in `initialize`, `shard_ended`) are retried as under `Retry`.
    Isolate(PoisonPolicy),
}

impl FailurePolicy {
    pub(crate) fn releases(&self) -> bool {
        matches!(self, FailurePolicy::ReleaseShard)
    }
}
