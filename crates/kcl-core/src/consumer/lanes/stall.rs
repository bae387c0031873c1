//! Fetching waits for room: for a lane's queue, or for the watermark when
//! the window is full.
//!
//! A full window waits for the lane holding the oldest record to
//! checkpoint it. A lane that buffers records and flushes on a timer it
//! checks inside `process_records` (common for S3 or Firehose sinks) only
//! gets to flush when it gets a call, and once its keys go quiet and the
//! fetching stops, it gets none: without a call, the shard would wait
//! forever while its lease kept being renewed. So while that lane is idle,
//! it gets an empty batch now and then, with backoff, through its own task
//! like any batch.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tracing::{debug, warn};

use super::{Lanes, MAX_LANE_RECORDS_IN_FLIGHT, Stop};
use crate::backoff::{Backoff, Pauses};
use crate::checkpointer::{CheckpointError, Checkpointer, Position};
use crate::consumer::Consumer;
use crate::processor::RecordBatch;

/// How long the lane holding a full window may sit idle before its first
/// empty batch; each one that does not move the watermark doubles the
/// pause up to [`LAST_NUDGE_PAUSE`].
pub(super) const FIRST_NUDGE_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause between two empty batches to the same record's lane:
/// a lane that never checkpoints costs a call per this period, no more.
pub(super) const LAST_NUDGE_PAUSE: Duration = Duration::from_secs(30);

const NUDGES: Backoff = Backoff::new(FIRST_NUDGE_PAUSE, LAST_NUDGE_PAUSE).without_jitter();

/// One wait for room, from the moment the fetching stopped.
struct Stall {
    pauses: Pauses,
    /// The lane due an empty batch, and when.
    due: Option<(usize, Instant)>,
    /// The oldest record when the last empty batch was planned: a new one
    /// means the watermark moved, and the pauses start over.
    oldest: Option<Position>,
    /// Whether the stall was announced (warned, held-back checkpoint
    /// written).
    announced: bool,
}

impl Stall {
    fn new() -> Self {
        Stall {
            pauses: NUDGES.pauses(),
            due: None,
            oldest: None,
            announced: false,
        }
    }

    /// The idle lane holding the full window, and when it gets its next
    /// empty batch; `None` while no lane needs one.
    fn plan(&mut self, lanes: &Lanes) -> Option<(usize, Instant)> {
        let Some((lane, oldest)) = lanes.idle_holder() else {
            self.due = None;
            return None;
        };
        if self.oldest.as_ref() != Some(&oldest) {
            self.pauses.reset();
            self.oldest = Some(oldest);
            self.due = None;
        }
        match self.due {
            Some((due_lane, at)) if due_lane == lane => Some((lane, at)),
            _ => {
                let at = Instant::now() + self.pauses.next_or_max();
                self.due = Some((lane, at));
                self.due
            }
        }
    }
}

/// Waits until every lane has room in its queue and the window room for
/// another batch, taking the lanes' results as they come, and giving the
/// lane holding a full window an empty batch now and then while it idles.
pub(super) async fn wait_for_room(
    c: &Arc<Consumer>,
    lanes: &mut Lanes,
    shard: &tokio::sync::Mutex<Checkpointer>,
) -> Result<(), Stop> {
    let mut stall = Stall::new();
    while !lanes.has_room() {
        let due = stall.plan(lanes);
        if due.is_some() && lanes.running.is_empty() && !stall.announced {
            stall.announced = true;
            lanes.warn_stalled();
            // Nothing else shows it: every batch was delivered, and the
            // shard may be caught up.
            c.progress.window_full(true);
            flush_held_back(shard).await?;
        }
        let at = due.map_or_else(Instant::now, |(_, at)| at);
        tokio::select! {
            biased;
            stop = c.stopped() => return Err(stop),
            joined = lanes.running.join_next(), if !lanes.running.is_empty() => {
                lanes.finished(c, joined)?;
            }
            () = sleep_until(at), if due.is_some() => {
                if let Some((lane, _)) = due {
                    stall.due = None;
                    nudge(c, lanes, lane);
                }
            }
        }
    }
    if stall.announced {
        c.progress.window_full(false);
    }
    Ok(())
}

/// The window is full and no lane runs: what the checkpoint policy held
/// back is written now, as no fetch comes to write it meanwhile.
async fn flush_held_back(shard: &tokio::sync::Mutex<Checkpointer>) -> Result<(), Stop> {
    match shard.lock().await.flush().await {
        Err(CheckpointError::LeaseLost { .. }) => Err(Stop::LeaseLost),
        Err(e) => {
            warn!(error = %e, "writing a held-back checkpoint failed");
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

/// Gives `lane` an empty batch through its task, as any batch: it runs
/// after the lane's previous call, never beside it, and counts no record.
fn nudge(c: &Arc<Consumer>, lanes: &mut Lanes, lane: usize) {
    debug!(
        lane,
        "the lane holds the full window and is idle: an empty batch lets it flush"
    );
    lanes.queues[lane].push_back(RecordBatch {
        records: Vec::new(),
        millis_behind_latest: lanes.behind,
    });
    lanes.start(c, lane);
}

impl Lanes {
    /// The lane holding the oldest record of a full window, with that
    /// record, when the lane is idle with nothing queued: only a call can
    /// let it checkpoint, and no batch will come.
    fn idle_holder(&self) -> Option<(usize, Position)> {
        let window = self.window();
        if !window.is_full() {
            return None;
        }
        let (lane, oldest) = window.holder()?;
        let idle = self.idle[lane].is_some() && self.queues[lane].is_empty();
        idle.then(|| (lane, oldest.clone()))
    }

    /// Says which lane holds the shard up.
    fn warn_stalled(&self) {
        let window = self.window();
        if let Some((lane, oldest)) = window.holder() {
            warn!(
                lane,
                %oldest,
                records = window.in_flight(),
                limit = MAX_LANE_RECORDS_IN_FLIGHT,
                "fetching stopped: the lanes hold the most records the shard allows between its \
                 checkpoint and its newest record; a lane's records are done only once it \
                 checkpoints them, and this lane has not checkpointed the oldest. It gets an \
                 empty batch now and then (every 1 s to 30 s) to flush and checkpoint"
            );
        }
    }
}
