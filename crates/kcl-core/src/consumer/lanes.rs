//! A shard processed in parallel lanes (`parallelism_per_shard(n)`, n > 1).
//!
//! Each lane has its own processor instance, made by the application's
//! factory with [`Lane`] in its context. A record goes to the lane its
//! partition key hashes to, so a key always meets the same instance, in
//! shard order, and per-key state needs no locking. Each lane runs one
//! batch at a time in a task of its own; the consumer task fetches the
//! next batch meanwhile, and stops fetching while any lane has
//! [`QUEUE_DEPTH`] batches waiting. The shard's checkpoint follows the low
//! watermark (see [`Window`]), and the consumer also stops fetching while
//! [`MAX_LANE_RECORDS_IN_FLIGHT`] records are between the watermark and
//! the newest record: a lane that holds its records without checkpointing
//! stalls the shard rather than growing the window without bound. While
//! the lane holding the oldest record idles then, it gets an empty batch
//! now and then (see [`stall`]), so that a lane flushing on a timer it
//! checks in `process_records` gets the call it needs to checkpoint.
//!
//! At a shutdown or handoff, each lane works through the batches it was
//! given (at most [`QUEUE_DEPTH`] besides the running one; a lane whose
//! retries see the shutdown stops and drops its queue), then each lane's
//! processor gets `shutdown_requested` to checkpoint: the watermark then
//! covers everything fetched, and the next owner repeats nothing. At a
//! lost lease, running calls finish (a call is never cut off), queued
//! batches are dropped, and each processor gets `lease_lost`. A call cut
//! at its timeout ends the shard's tenure the same way: the other lanes'
//! calls finish (each under its own limit), and every processor gets
//! `lease_lost`. A lane whose `shard_ended` was called had its ending, and
//! gets neither. The worker's shutdown timeout cuts every lane's call under
//! way, and every call made after it, but `lease_lost`: a drain cut so
//! ends like a call cut at its timeout, and a lane whose
//! `shutdown_requested` is cut gets `lease_lost` after it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::task::{JoinError, JoinSet};
use tracing::{Instrument as _, info};

mod stall;
use stall::wait_for_room;

use super::{
    Consumer, ConsumerExit, Fetch, Stop, deliver, exit_without_processor, finish_shard,
    graceful_exit, initialize, lease_lost, shard_labels, shutdown_requested, write_held_back,
};
use crate::checkpointer::{Checkpointer, MAX_LANE_RECORDS_IN_FLIGHT, Position, Window};
use crate::lease::{Checkpoint, Lease};
use crate::metric_names::{BATCH_PROCESSING_SECONDS, LANE_RECORDS_IN_FLIGHT};
use crate::processor::{InitializeInput, Lane, RecordBatch, RecordProcessor, ShardContext};
use crate::record::Record;

/// Batches a lane may have waiting before the consumer stops fetching.
const QUEUE_DEPTH: usize = 2;

type Processor = Box<dyn RecordProcessor>;
type LaneDone = (usize, Processor, Checkpointer, Result<(), Stop>);

/// The lane of a partition key: FNV-1a, stable across processes and
/// releases (std's hasher promises neither), so a key stays in its lane
/// from one owner of the shard to the next.
pub(crate) fn lane_of(partition_key: &str, lanes: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in partition_key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    usize::try_from(h % lanes as u64).unwrap_or(0)
}

struct Lanes {
    /// Each lane's processor and checkpointer while it is idle.
    idle: Vec<Option<(Processor, Checkpointer)>>,
    queues: Vec<VecDeque<RecordBatch>>,
    running: JoinSet<LaneDone>,
    window: Arc<Mutex<Window>>,
    /// How far behind the tip the last batch fetched was, for the empty
    /// batches of a stalled lane.
    behind: Option<u64>,
    /// A lane processor's panic, resumed once the other lanes stopped and
    /// had their ending.
    panic: Option<Box<dyn std::any::Any + Send>>,
}

impl Lanes {
    fn window(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn has_room(&self) -> bool {
        self.queues.iter().all(|q| q.len() < QUEUE_DEPTH) && !self.window().is_full()
    }

    fn drained(&self) -> bool {
        self.running.is_empty() && self.queues.iter().all(VecDeque::is_empty)
    }

    /// Splits `records` by lane, in shard order within each, and starts
    /// the idle lanes that got some.
    fn dispatch(&mut self, c: &Arc<Consumer>, records: Vec<Record>, behind: Option<u64>) {
        let count = self.queues.len();
        self.behind = behind;
        let mut parts: Vec<Vec<Record>> = vec![Vec::new(); count];
        {
            let mut window = self.window();
            for record in records {
                let lane = lane_of(&record.partition_key, count);
                window.dispatch(lane, Position::of(&record));
                parts[lane].push(record);
            }
            in_flight_gauge(c, window.in_flight());
        }
        for (lane, records) in parts.into_iter().enumerate() {
            if !records.is_empty() {
                self.queues[lane].push_back(RecordBatch {
                    records,
                    millis_behind_latest: behind,
                });
                self.start(c, lane);
            }
        }
    }

    /// Starts lane `lane` on its next batch if it is idle and has one.
    fn start(&mut self, c: &Arc<Consumer>, lane: usize) {
        if self.idle[lane].is_none() || self.queues[lane].is_empty() {
            return;
        }
        let (Some((mut processor, mut checkpointer)), Some(batch)) =
            (self.idle[lane].take(), self.queues[lane].pop_front())
        else {
            return;
        };
        let c = Arc::clone(c);
        let work = async move {
            let started = tokio::time::Instant::now();
            let result = deliver(
                &c,
                processor.as_mut(),
                &mut checkpointer,
                &batch,
                Some(lane),
            )
            .await;
            // A stalled lane's empty batch is no batch of the shard's.
            if !batch.records.is_empty() {
                if result.is_ok() {
                    c.progress.delivered(batch.records.len());
                }
                metrics::histogram!(BATCH_PROCESSING_SECONDS, &shard_labels(&c))
                    .record(started.elapsed().as_secs_f64());
            }
            (lane, processor, checkpointer, result)
        };
        self.running.spawn(work.in_current_span());
    }

    /// A lane finished its batch: it takes the next one, or the consumer
    /// stops if the lane had to.
    fn finished(
        &mut self,
        c: &Arc<Consumer>,
        joined: Option<Result<LaneDone, JoinError>>,
    ) -> Result<(), Stop> {
        let Some(joined) = joined else {
            return Ok(());
        };
        let (lane, processor, checkpointer, result) = self.rejoin(joined)?;
        self.idle[lane] = Some((processor, checkpointer));
        in_flight_gauge(c, self.window().in_flight());
        result?;
        self.start(c, lane);
        Ok(())
    }

    /// A lane task's result. A processor's panic is kept, and the shard
    /// stops as if given back; `run` resumes the panic after the other
    /// lanes finished their calls and had their ending, so it then does
    /// what a panic of a one-lane shard does.
    fn rejoin(&mut self, joined: Result<LaneDone, JoinError>) -> Result<LaneDone, Stop> {
        match joined {
            Ok(done) => Ok(done),
            Err(e) if e.is_panic() => {
                self.panic.get_or_insert(e.into_panic());
                Err(Stop::Release)
            }
            Err(_) => Err(Stop::LeaseLost),
        }
    }

    /// Lets every lane work through the batches it was given, so that the
    /// watermark covers everything fetched and the next owner repeats
    /// nothing. A lane that stops (its retries see the shutdown) drops its
    /// queue; if the lease ends meanwhile, so does every lane's queue.
    async fn drain(&mut self, c: &Arc<Consumer>) -> Result<(), Stop> {
        loop {
            let joined = tokio::select! {
                biased;
                _ = c.lease.ended() => return Err(Stop::LeaseLost),
                _ = c.lost.cancelled() => return Err(Stop::LeaseLost),
                joined = self.running.join_next() => joined,
            };
            let Some(joined) = joined else {
                return Ok(());
            };
            let Ok((lane, processor, checkpointer, result)) = self.rejoin(joined) else {
                return Err(Stop::Release);
            };
            self.idle[lane] = Some((processor, checkpointer));
            match result {
                Ok(()) => self.start(c, lane),
                // The shard goes back: no lane's processor is asked to
                // checkpoint beside a call that was cut off.
                Err(stop @ (Stop::TimedOut | Stop::Cut)) => return Err(stop),
                Err(_) => self.queues[lane].clear(),
            }
        }
    }

    /// Waits for every running lane to give its processor back; queued
    /// batches are dropped.
    async fn settle(&mut self) {
        while let Some(joined) = self.running.join_next().await {
            if let Ok((lane, processor, checkpointer, _)) = self.rejoin(joined) {
                self.idle[lane] = Some((processor, checkpointer));
            }
        }
        for q in &mut self.queues {
            q.clear();
        }
    }
}

/// Runs a shard in `count` lanes, from `start` to the shard's end, its
/// lease's end, or shutdown; each lane's processor gets one ending.
pub(super) async fn run(c: &Consumer, current: &Lease, count: usize) -> ConsumerExit {
    let c = Arc::new(c.clone());
    let start = &current.checkpoint;
    let shard = Checkpointer::new(
        Arc::clone(&c.setup.store),
        c.lease.clone(),
        start.clone(),
        c.lost.clone(),
    )
    .for_shard(&c.ctx.stream, &c.ctx.shard_id)
    .paced_by(&c.setup.checkpoints)
    .with_progress(c.progress.clone());
    let window = Arc::new(Mutex::new(Window::new(count)));
    let shard = Arc::new(tokio::sync::Mutex::new(shard));
    let lane_checkpointers: Vec<Checkpointer> = {
        let template = shard.lock().await;
        (0..count)
            .map(|i| Checkpointer::for_lane(&template, i, Arc::clone(&window), Arc::clone(&shard)))
            .collect()
    };
    let mut lanes = Lanes {
        idle: Vec::with_capacity(count),
        queues: vec![VecDeque::new(); count],
        running: JoinSet::new(),
        window,
        behind: None,
        panic: None,
    };
    let mut outcome = Ok(());
    for (index, checkpointer) in lane_checkpointers.into_iter().enumerate() {
        let ctx = ShardContext {
            lane: Some(Lane { index, count }),
            ..c.ctx.clone()
        };
        let mut processor = c.setup.factory.create(&ctx);
        let input = InitializeInput {
            shard: ctx,
            checkpoint: start.clone(),
            pending_checkpoint: current.pending_checkpoint.clone(),
        };
        outcome = initialize(&c, processor.as_mut(), &input).await;
        lanes.idle.push(Some((processor, checkpointer)));
        if outcome.is_err() {
            // Lanes after it are never made: nothing to end.
            lanes.idle.resize_with(count, || None);
            break;
        }
    }
    if outcome.is_ok() {
        info!(lanes = count, "processing the shard in parallel lanes");
        c.progress.lanes(count);
        outcome = process(&c, &mut lanes, &shard, start).await;
    }
    // A graceful end: what was fetched is processed first.
    if let Err(Stop::Shutdown | Stop::Handoff) = outcome
        && let Err(stop) = lanes.drain(&c).await
    {
        outcome = Err(stop);
    }
    // Lanes still retrying stop now; running calls finish.
    c.halt.cancel();
    lanes.settle().await;
    // This worker no longer reads the shard: no stale figure stays behind.
    in_flight_gauge(&c, 0);
    let panic = lanes.panic.take();
    let mut processors: Vec<(usize, Processor, Checkpointer)> = (lanes.idle.into_iter())
        .enumerate()
        .filter_map(|(lane, idle)| idle.map(|(p, cp)| (lane, p, cp)))
        .collect();
    let exit = end_lanes(&c, &mut processors, &shard, outcome).await;
    if let Some(panic) = panic {
        std::panic::resume_unwind(panic);
    }
    exit
}

/// Gives each lane's processor (with its lane) its ending.
async fn end_lanes(
    c: &Consumer,
    processors: &mut [(usize, Processor, Checkpointer)],
    shard: &tokio::sync::Mutex<Checkpointer>,
    outcome: Result<(), Stop>,
) -> ConsumerExit {
    let Err(stop) = outcome else {
        return ConsumerExit::ShardEnded;
    };
    if matches!(stop, Stop::Shutdown | Stop::Handoff) {
        // Every lane's checkpoint writes from now on (through the shard's
        // checkpointer), and what the policy held back is written last.
        shard.lock().await.write_every_call();
        // The lanes whose `shutdown_requested` was cut short, and whether
        // the worker's shutdown timeout cut one.
        let (mut cut, mut at_timeout) = (Vec::new(), false);
        for (lane, processor, checkpointer) in processors.iter_mut() {
            // A lane `shard_ended` reached had its ending.
            if c.had_shard_ended(*lane) {
                continue;
            }
            if let Err(stop) =
                shutdown_requested(c, processor.as_mut(), checkpointer, Some(*lane)).await
            {
                cut.push(*lane);
                at_timeout |= matches!(stop, Stop::Cut);
            }
        }
        write_held_back(&mut *shard.lock().await).await;
        // A call cut short is no ending.
        for (lane, processor, _) in processors.iter_mut() {
            if cut.contains(lane) {
                lease_lost(c, processor.as_mut(), Some(*lane)).await;
            }
        }
        return match graceful_exit(c, at_timeout) {
            ConsumerExit::ShutDown => exit_without_processor(stop),
            other => other,
        };
    } else {
        info!("lease lost or given back; stopping the lanes' processors");
        if !matches!(stop, Stop::LeaseLost) {
            // Still held: as without lanes, what was held back is written.
            write_held_back(&mut *shard.lock().await).await;
        }
        for (lane, processor, _) in processors.iter_mut() {
            if !c.had_shard_ended(*lane) {
                lease_lost(c, processor.as_mut(), Some(*lane)).await;
            }
        }
    }
    exit_without_processor(stop)
}

/// Fetches and dispatches to the lanes until the shard ends (`Ok` once
/// SHARD_END is checkpointed) or the consumer stops.
async fn process(
    c: &Arc<Consumer>,
    lanes: &mut Lanes,
    shard: &tokio::sync::Mutex<Checkpointer>,
    start: &Checkpoint,
) -> Result<(), Stop> {
    let Some(mut fetch) = Fetch::open(c, start).await? else {
        return Ok(());
    };
    loop {
        wait_for_room(c, lanes, shard).await?;
        let fetched = beside_lanes(c, lanes, fetch.next_batch(c)).await?;
        let Some(batch) = beside_lanes(c, lanes, fetch.judge(c, fetched)).await? else {
            continue;
        };
        if !batch.records.is_empty() {
            shard.lock().await.count_dispatched(batch.records.len());
            lanes.dispatch(c, batch.records, batch.millis_behind_latest);
        }
        if batch.shard_end.is_none() {
            super::flush_due(c, &mut *shard.lock().await).await?;
        }
        if let Some(children) = batch.shard_end {
            while !lanes.drained() {
                tokio::select! {
                    biased;
                    stop = c.stopped() => return Err(stop),
                    joined = lanes.running.join_next() => lanes.finished(c, joined)?,
                }
            }
            let mut refs: Vec<(&mut dyn RecordProcessor, &mut Checkpointer)> = lanes
                .idle
                .iter_mut()
                .flatten()
                .map(|(p, cp)| (p.as_mut() as &mut dyn RecordProcessor, cp))
                .collect();
            return finish_shard(c, &mut refs, Some(shard), &children).await;
        }
    }
}

/// Runs `work` (a fetch, or the judging of a failed one: pauses and
/// reopens that last as long as a read outage) while taking the lanes'
/// results as they come: a lane that frees up starts its next queued
/// batch, and one that ended the tenure (cut at the processor timeout,
/// past a poison deadline) is seen at once. `work` is never cut off and
/// restarted.
async fn beside_lanes<T>(
    c: &Arc<Consumer>,
    lanes: &mut Lanes,
    work: impl std::future::Future<Output = Result<T, Stop>>,
) -> Result<T, Stop> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            stop = c.stopped() => return Err(stop),
            joined = lanes.running.join_next(), if !lanes.running.is_empty() => {
                lanes.finished(c, joined)?;
            }
            done = &mut work => return done,
        }
    }
}

/// Records handed to the shard's lanes and not yet passed by its
/// checkpoint: near [`MAX_LANE_RECORDS_IN_FLIGHT`], a lane is holding
/// records without checkpointing them.
fn in_flight_gauge(c: &Consumer, records: usize) {
    metrics::gauge!(LANE_RECORDS_IN_FLIGHT, &shard_labels(c)).set(records as f64);
}

#[cfg(test)]
mod tests {
    use super::lane_of;

    #[test]
    fn a_key_has_one_lane_and_keys_spread_over_all() {
        assert_eq!(lane_of("order-17", 10), lane_of("order-17", 10));
        let mut used = [0usize; 10];
        for k in 0..1000 {
            used[lane_of(&format!("key-{k}"), 10)] += 1;
        }
        assert!(used.iter().all(|n| *n > 50), "{used:?}");
    }
}
