//! Handing one batch to a processor under the failure policy: retried,
//! skipped, given back, or (under `Isolate`) bisected until the records the
//! processor keeps failing on stand alone and go to their destination.

use std::collections::VecDeque;
use std::ops::Range;

use tracing::warn;

use super::{Call, Consumer, Stop, limited, processor_error};
use crate::checkpointer::Checkpointer;
use crate::metric_names::PROCESSOR_BATCHES_SKIPPED;
use crate::poison::{FailedRecord, FailureReason, PoisonPolicy};
use crate::processor::{FailurePolicy, ProcessorError, RecordBatch, RecordProcessor};
use crate::record::Record;

mod set_aside;
use set_aside::set_aside;

/// Hands one batch to the processor (of lane `lane`, if any), applying the
/// failure policy. `Ok` once every record of it is processed or set aside.
/// A call cut at its timeout is no failure the policy judges: the shard is
/// given back ([`Stop::TimedOut`]).
pub(super) async fn deliver(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    checkpointer: &mut Checkpointer,
    batch: &RecordBatch,
    lane: Option<usize>,
) -> Result<(), Stop> {
    let call = Call::new("process_records", lane);
    // A stalled lane's empty batch has no record to isolate: its failure
    // is retried as under `Retry`.
    if let FailurePolicy::Isolate(policy) = &c.setup.policy
        && !batch.records.is_empty()
    {
        return isolate(c, processor, checkpointer, batch, policy, call).await;
    }
    let mut backoff = c.setup.backoff.pauses();
    let before = checkpointer.delivered_position();
    loop {
        // A lane's queued batch can start long after it was fetched (a
        // drain at a handoff): nothing reaches the processor once the
        // lease ended or lapsed (invariant 1).
        c.may_finish()?;
        if let Some(last) = batch.records.last() {
            checkpointer.delivered(last);
        }
        let called = limited(c, call, processor.process_records(batch, checkpointer)).await;
        match called.inspect_err(|_| checkpointer.rewind(before.clone()))? {
            Ok(()) => return c.still_ours_after_checkpoint(),
            Err(e) => {
                processor_error("process_records", &c.ctx, &*e);
                // Not processed: a checkpoint taken before the retry succeeds
                // (in shutdown_requested, at a handoff) must not cover it.
                checkpointer.rewind(before.clone());
                c.still_ours()?;
                match c.setup.policy {
                    FailurePolicy::Skip => {
                        if let Some(last) = batch.records.last() {
                            checkpointer.delivered(last);
                        }
                        checkpointer.set_aside(&batch.records);
                        metrics::counter!(
                            PROCESSOR_BATCHES_SKIPPED,
                            "stream" => c.ctx.stream.clone(),
                            "shard" => c.ctx.shard_id.clone()
                        )
                        .increment(1);
                        warn!(
                            records = batch.records.len(),
                            "skipping the failed batch, as configured"
                        );
                        return Ok(());
                    }
                    FailurePolicy::ReleaseShard => return Err(Stop::Release),
                    _ => c.pause(backoff.next_or_max()).await?,
                }
            }
        }
    }
}

/// `FailurePolicy::Isolate`: the batch is a queue of ranges, first the
/// whole batch. A failing range is split in halves (with bisection) until
/// it is one record; a range that cannot be split is retried until its
/// records run out of attempts or age, then set aside. Ranges run in shard
/// order, so everything before the range being tried is done and the
/// checkpointer's "last delivered" is always a safe checkpoint.
async fn isolate(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    checkpointer: &mut Checkpointer,
    batch: &RecordBatch,
    policy: &PoisonPolicy,
    call: Call,
) -> Result<(), Stop> {
    let records = &batch.records;
    let mut ranges: VecDeque<Range<usize>> = VecDeque::new();
    ranges.push_back(0..records.len());
    let mut attempts = vec![0u32; records.len()];
    let mut backoff = c.setup.backoff.pauses();
    while let Some(range) = ranges.pop_front() {
        if range.is_empty() {
            continue;
        }
        let Some(e) = try_range(c, processor, checkpointer, batch, &range, call).await? else {
            backoff.reset();
            continue;
        };
        if policy.bisect && range.len() > 1 {
            // The halves are tried at once, as Lambda does: backing off at
            // each of log2(n) levels would hold a shard for minutes behind
            // one bad record of a full batch.
            let mid = range.start + range.len() / 2;
            ranges.push_front(mid..range.end);
            ranges.push_front(range.start..mid);
            continue;
        }
        let tried = Tried {
            records,
            range: range.clone(),
            error: &e,
        };
        if give_up(c, checkpointer, policy, &mut attempts, tried).await? {
            backoff.reset();
            continue;
        }
        ranges.push_front(range);
        c.pause(backoff.next_or_max()).await?;
    }
    Ok(())
}

/// One call of the processor with the records of `range`: `None` once
/// they are processed, or the processor's error (the delivery taken back,
/// the lease still ours).
async fn try_range(
    c: &Consumer,
    processor: &mut dyn RecordProcessor,
    checkpointer: &mut Checkpointer,
    batch: &RecordBatch,
    range: &Range<usize>,
    call: Call,
) -> Result<Option<ProcessorError>, Stop> {
    let records = &batch.records;
    c.may_finish()?;
    let before = checkpointer.delivered_position();
    checkpointer.delivered(&records[range.end - 1]);
    let part;
    let sub = if range.len() == records.len() {
        batch
    } else {
        part = RecordBatch {
            records: records[range.clone()].to_vec(),
            millis_behind_latest: batch.millis_behind_latest,
        };
        &part
    };
    let called = limited(c, call, processor.process_records(sub, checkpointer)).await;
    let e = match called.inspect_err(|_| checkpointer.rewind(before.clone()))? {
        Ok(()) => {
            c.still_ours_after_checkpoint()?;
            return Ok(None);
        }
        Err(e) => e,
    };
    processor_error("process_records", &c.ctx, &*e);
    checkpointer.rewind(before);
    c.still_ours()?;
    Ok(Some(e))
}

/// A range of a batch the processor just failed on, as a whole.
struct Tried<'a> {
    records: &'a [Record],
    range: Range<usize>,
    error: &'a ProcessorError,
}

/// Counts an attempt on each record of the range, and sets the range aside
/// if any of its records is to be given up on; `true` if it was.
async fn give_up(
    c: &Consumer,
    checkpointer: &mut Checkpointer,
    policy: &PoisonPolicy,
    attempts: &mut [u32],
    tried: Tried<'_>,
) -> Result<bool, Stop> {
    let Tried {
        records,
        range,
        error: e,
    } = tried;
    for a in &mut attempts[range.clone()] {
        *a += 1;
    }
    let verdicts: Vec<Option<FailureReason>> = range
        .clone()
        .map(|i| policy.verdict(&records[i], attempts[i]))
        .collect();
    let Some(reason) = verdicts.iter().flatten().next().copied() else {
        return Ok(false);
    };
    // Given up on together: they were tried together.
    let failed: Vec<FailedRecord> = range
        .clone()
        .map(|i| {
            FailedRecord::new(
                c.ctx.clone(),
                records[i].clone(),
                e.to_string(),
                attempts[i],
                verdicts[i - range.start].unwrap_or(reason),
            )
        })
        .collect();
    set_aside(c, policy, &failed).await?;
    checkpointer.delivered(&records[range.end - 1]);
    checkpointer.set_aside(&records[range.clone()]);
    Ok(true)
}
