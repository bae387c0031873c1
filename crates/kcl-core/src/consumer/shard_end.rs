//! ShuttingDown at SHARD_END: the children's leases first, then every
//! processor's `shard_ended` until one checkpoints SHARD_END.

use tracing::{error, info, warn};

use super::call_limit::{Call, limited};
use super::{Consumer, Stop, processor_error};
use crate::checkpointer::Checkpointer;
use crate::lease::Checkpoint;
use crate::metric_names::SHARD_END_NOT_CHECKPOINTED;
use crate::processor::RecordProcessor;
use crate::source::ChildShard;

/// ShuttingDown at SHARD_END: create the children's leases (so they start
/// without waiting for a shard sync), then let the processors (one, or one
/// per lane, every lane drained) checkpoint SHARD_END, retrying until one
/// does. `shard` is the shard's own checkpointer when the processors have
/// lane checkpointers.
pub(super) async fn finish_shard(
    c: &Consumer,
    processors: &mut [(&mut dyn RecordProcessor, &mut Checkpointer)],
    shard: Option<&tokio::sync::Mutex<Checkpointer>>,
    children: &[ChildShard],
) -> Result<(), Stop> {
    if children.is_empty() {
        // The end named no children (a listing that does not show a
        // split's children yet): only shard sync can lease them, and not
        // before its next round, which on a worker that does not lead the
        // fleet's rounds never comes on its own.
        c.setup.sync_now.notify_one();
    }
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
        let mut failed = false;
        if let Some(shard) = shard.filter(|_| every_lane_ended(processors)) {
            // Every lane checkpointed its end and only the SHARD_END write
            // failed: written again here, with no processor asked again.
            if let Err(e) = shard.lock().await.checkpoint_delivered().await {
                warn!(error = %e, "writing SHARD_END failed; retrying");
                c.still_ours()?;
            }
        } else {
            failed = ask_processors(c, processors, shard.is_some()).await?;
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
        // Every lane ended (the last lane's checkpoint, or this round's
        // write), but the SHARD_END write failed: the next round writes it,
        // and no processor is to blame (nor is the shard given back for it).
        let write_failed = shard.is_some() && every_lane_ended(processors);
        failed &= !write_failed;
        if failed && c.setup.policy.releases() {
            return Err(Stop::Release);
        }
        if !failed && !write_failed {
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

/// With lanes: whether every lane checkpointed its end (false without).
fn every_lane_ended(processors: &[(&mut dyn RecordProcessor, &mut Checkpointer)]) -> bool {
    processors.iter().all(|(_, cp)| cp.lane_ended())
}

/// One round of `shard_ended` calls; whether one failed. Every processor
/// gets its call in each round, so that a lane's failure does not keep the
/// others from theirs, but a lane that checkpointed its end: it is done,
/// and not asked again while another lane's call is retried.
async fn ask_processors(
    c: &Consumer,
    processors: &mut [(&mut dyn RecordProcessor, &mut Checkpointer)],
    lanes: bool,
) -> Result<bool, Stop> {
    let mut failed = false;
    for (i, (processor, checkpointer)) in processors.iter_mut().enumerate() {
        if checkpointer.lane_ended() {
            continue;
        }
        // With lanes, each lane is in the slice at its index.
        let call = Call::new("shard_ended", lanes.then_some(i));
        let answer = limited(c, call, processor.shard_ended(checkpointer)).await?;
        // Its ending, unless cut short above: then `lease_lost` follows.
        c.shard_ended_told(i);
        match answer {
            Ok(()) => c.still_ours_after_checkpoint()?,
            Err(e) => {
                processor_error("shard_ended", &c.ctx, &*e);
                c.still_ours()?;
                failed = true;
            }
        }
    }
    Ok(failed)
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
