//! What each held shard has done lately, kept by its consumer and read
//! through [`WorkerHandle::shards`](crate::worker::WorkerHandle::shards) and
//! [`WorkerHandle::stalled`](crate::worker::WorkerHandle::stalled).
//!
//! A lease renewed on time says nothing about whether its shard moves: a
//! processor that hangs, or a reader cut off from the stream, keeps every
//! lease while the records stand unread. The registry is what tells the
//! two apart: per shard, when a batch was last processed and a checkpoint
//! last written, and whether records are waiting meanwhile.

use crate::metric_names::{
    SHARD_LAST_CHECKPOINT_TIMESTAMP, SHARD_LAST_DELIVERY_TIMESTAMP, SHARD_RECORDS_WAITING,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// One held shard's progress, as its consumer last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardProgress {
    /// The lease key.
    pub lease_key: String,
    /// The stream.
    pub stream: String,
    /// The shard.
    pub shard_id: String,
    /// Lanes the shard is processed in (1 without parallelism).
    pub lanes: usize,
    /// When this worker's consumer of the shard started.
    pub consuming_since: Instant,
    /// The last batch a processor finished with (processed or set aside).
    pub last_delivery: Option<Delivery>,
    /// The last checkpoint written.
    pub last_checkpoint: Option<CheckpointMark>,
    /// How far behind the stream's tip the last successful read was
    /// (`None` before the first one).
    pub millis_behind_latest: Option<u64>,
    /// Records read and not yet processed.
    pub records_waiting: usize,
    /// The oldest processor call still running, if any.
    pub processor_call: Option<ProcessorCall>,
    /// True while the lanes' window is full and no lane is called: the
    /// shard fetches nothing until the lane holding its oldest record
    /// checkpoints.
    pub window_full: bool,
    /// Since when work has waited without a break ([`Self::has_work_waiting`]
    /// true all along); `None` while none waits.
    pub waiting_since: Option<Instant>,
}

/// A batch a processor finished with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// When the processor returned.
    pub at: Instant,
    /// Records in the batch.
    pub records: usize,
}

/// A checkpoint written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointMark {
    /// The checkpoint: `SHARD_END`, or `<sequence number>/<sub-sequence
    /// number>`.
    pub value: String,
    /// When the write succeeded.
    pub at: Instant,
}

/// A processor call in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessorCall {
    /// The processor method (`initialize`, `process_records`, ...).
    pub stage: &'static str,
    /// When it was called.
    pub since: Instant,
}

impl ShardProgress {
    /// True while the shard has work this worker has not done: records
    /// behind the tip or read and not processed, a processor call
    /// running, or records held in a full window.
    pub fn has_work_waiting(&self) -> bool {
        self.millis_behind_latest.is_some_and(|ms| ms > 0)
            || self.records_waiting > 0
            || self.processor_call.is_some()
            || self.window_full
    }

    /// The last time the shard moved: a batch processed, a checkpoint
    /// written, or (before either) its consumer starting.
    pub fn last_progress(&self) -> Instant {
        let delivered = self.last_delivery.map(|d| d.at);
        let checkpointed = self.last_checkpoint.as_ref().map(|c| c.at);
        [Some(self.consuming_since), delivered, checkpointed]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(self.consuming_since)
    }

    /// Since when the shard has stood still with work waiting: its last
    /// progress, or, if later, when the work now waiting began to wait (a
    /// shard idle for an hour that just read a record has not stood still
    /// for an hour).
    pub fn still_since(&self) -> Instant {
        self.last_progress()
            .max(self.waiting_since.unwrap_or(self.consuming_since))
    }

    /// True when work has been waiting and nothing moved for longer than
    /// `bound`, as of `now`.
    pub fn is_stalled(&self, bound: Duration, now: Instant) -> bool {
        self.has_work_waiting() && now.saturating_duration_since(self.still_since()) > bound
    }
}

/// Every held shard's progress; cloning shares it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProgressRegistry {
    shards: Arc<Mutex<Consumers>>,
}

#[derive(Debug, Default)]
struct Consumers {
    /// The newest consumer of each lease, by lease key.
    newest: BTreeMap<String, Arc<Mutex<Shard>>>,
    /// Consumers a newer one of their lease replaced, still running: a
    /// call hung past its tenure (no `processor_timeout` cuts it) stays in
    /// sight of [`ProgressRegistry::stalled`] while the lease is read anew.
    replaced: Vec<Arc<Mutex<Shard>>>,
}

impl ProgressRegistry {
    fn map(&self) -> MutexGuard<'_, Consumers> {
        self.shards.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts tracking a consumer of `lease_key`. A consumer of a later
    /// tenure replaces an earlier one still finishing: what is shown is
    /// the newest consumer's progress.
    pub(crate) fn track(&self, lease_key: &str, stream: &str, shard_id: &str) -> ShardTracker {
        let shard = Arc::new(Mutex::new(Shard::new(lease_key, stream, shard_id)));
        let mut consumers = self.map();
        if let Some(old) = consumers
            .newest
            .insert(lease_key.to_owned(), Arc::clone(&shard))
        {
            consumers.replaced.push(old);
        }
        drop(consumers);
        ShardTracker(Arc::new(Tracked {
            registry: self.clone(),
            shard,
        }))
    }

    /// Every tracked shard, by lease key.
    pub(crate) fn snapshot(&self) -> Vec<ShardProgress> {
        let shards: Vec<Arc<Mutex<Shard>>> = self.map().newest.values().cloned().collect();
        shards.iter().map(|s| lock(s).view()).collect()
    }

    /// The consumers stalled for longer than `bound` as of `now` (see
    /// [`ShardProgress::is_stalled`]): the newest of each lease, and a
    /// replaced one whose processor call still runs.
    pub(crate) fn stalled(&self, bound: Duration, now: Instant) -> Vec<ShardProgress> {
        let shards: Vec<Arc<Mutex<Shard>>> = {
            let consumers = self.map();
            consumers
                .newest
                .values()
                .chain(&consumers.replaced)
                .cloned()
                .collect()
        };
        shards
            .iter()
            .map(|s| lock(s).view())
            .filter(|s| s.is_stalled(bound, now))
            .collect()
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug)]
struct Shard {
    progress: ShardProgress,
    /// Running processor calls (lanes call at once): id, stage, start.
    calls: Vec<(u64, &'static str, Instant)>,
    next_call: u64,
}

impl Shard {
    fn new(lease_key: &str, stream: &str, shard_id: &str) -> Self {
        Shard {
            progress: ShardProgress {
                lease_key: lease_key.to_owned(),
                stream: stream.to_owned(),
                shard_id: shard_id.to_owned(),
                lanes: 1,
                consuming_since: Instant::now(),
                last_delivery: None,
                last_checkpoint: None,
                millis_behind_latest: None,
                records_waiting: 0,
                processor_call: None,
                window_full: false,
                waiting_since: None,
            },
            calls: Vec::new(),
            next_call: 0,
        }
    }

    /// Notes when work began to wait, after every change.
    fn note_work(&mut self) {
        let waiting = !self.calls.is_empty() || self.progress.has_work_waiting();
        let since = &mut self.progress.waiting_since;
        match (waiting, *since) {
            (true, None) => *since = Some(Instant::now()),
            (false, Some(_)) => *since = None,
            _ => {}
        }
    }

    fn view(&self) -> ShardProgress {
        let mut view = self.progress.clone();
        view.processor_call = self
            .calls
            .iter()
            .min_by_key(|(_, _, since)| *since)
            .map(|&(_, stage, since)| ProcessorCall { stage, since });
        view
    }
}

/// One consumer's handle on its shard's progress; the consumer leaves the
/// registry when the last clone drops.
#[derive(Debug, Clone)]
pub(crate) struct ShardTracker(Arc<Tracked>);

#[derive(Debug)]
struct Tracked {
    registry: ProgressRegistry,
    shard: Arc<Mutex<Shard>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let key = lock(&self.shard).progress.lease_key.clone();
        let mut consumers = self.registry.map();
        if consumers
            .newest
            .get(&key)
            .is_some_and(|s| Arc::ptr_eq(s, &self.shard))
        {
            consumers.newest.remove(&key);
        }
        consumers.replaced.retain(|s| !Arc::ptr_eq(s, &self.shard));
    }
}

impl ShardTracker {
    fn update(&self, f: impl FnOnce(&mut ShardProgress)) {
        let mut s = lock(&self.0.shard);
        f(&mut s.progress);
        s.note_work();
    }

    /// Changes the shard's progress by `change`, then sets gauges from it
    /// by `publish` (given the `stream` and `shard` labels), both under the
    /// shard's lock: lanes finish batches at once, and a count set outside
    /// the lock could overwrite a newer one and stay wrong until the next
    /// batch.
    fn update_and_publish(
        &self,
        change: impl FnOnce(&mut ShardProgress),
        publish: impl FnOnce(&ShardProgress, &[(&'static str, String); 2]),
    ) {
        let mut s = lock(&self.0.shard);
        change(&mut s.progress);
        s.note_work();
        let labels = [
            ("stream", s.progress.stream.clone()),
            ("shard", s.progress.shard_id.clone()),
        ];
        publish(&s.progress, &labels);
    }

    /// The shard is processed in `n` lanes.
    pub(crate) fn lanes(&self, n: usize) {
        self.update(|p| p.lanes = n);
    }

    /// The lanes' window is full and no lane is called (`true`), or it has
    /// room again.
    pub(crate) fn window_full(&self, full: bool) {
        self.update(|p| p.window_full = full);
    }

    /// A read succeeded: `records` more wait for the processor, and the
    /// tip is `behind` away (if the source says).
    pub(crate) fn fetched(&self, records: usize, behind: Option<u64>) {
        self.update_and_publish(
            |p| {
                p.records_waiting += records;
                if behind.is_some() {
                    p.millis_behind_latest = behind;
                }
            },
            publish_waiting,
        );
    }

    /// A processor finished with a batch of `records` (processed or set
    /// aside).
    pub(crate) fn delivered(&self, records: usize) {
        let now = Instant::now();
        self.update_and_publish(
            |p| {
                p.records_waiting = p.records_waiting.saturating_sub(records);
                p.last_delivery = Some(Delivery { at: now, records });
            },
            |p, labels| {
                publish_waiting(p, labels);
                metrics::gauge!(SHARD_LAST_DELIVERY_TIMESTAMP, labels).set(unix_seconds());
            },
        );
    }

    /// A checkpoint write of `value` succeeded.
    pub(crate) fn checkpointed(&self, value: String) {
        let at = Instant::now();
        self.update_and_publish(
            |p| p.last_checkpoint = Some(CheckpointMark { value, at }),
            |_, labels| {
                metrics::gauge!(SHARD_LAST_CHECKPOINT_TIMESTAMP, labels).set(unix_seconds());
            },
        );
    }

    /// A processor call (`stage`: `process_records`, ...) starts; it ends
    /// when the returned guard drops, so a call cancelled by its caller
    /// ends too.
    pub(crate) fn call_started(&self, stage: &'static str) -> CallGuard {
        let mut s = lock(&self.0.shard);
        let id = s.next_call;
        s.next_call += 1;
        s.calls.push((id, stage, Instant::now()));
        s.note_work();
        CallGuard {
            shard: Arc::clone(&self.0.shard),
            id,
        }
    }

    /// The consumer stops: no figure of this tenure stays behind in the
    /// gauges, where a stale one would read as this worker's.
    pub(crate) fn stopped(&self) {
        self.update_and_publish(
            |_| {},
            |_, labels| {
                for gauge in [
                    SHARD_LAST_DELIVERY_TIMESTAMP,
                    SHARD_LAST_CHECKPOINT_TIMESTAMP,
                    SHARD_RECORDS_WAITING,
                ] {
                    metrics::gauge!(gauge, labels).set(0.0);
                }
            },
        );
    }
}

/// The shard's records waiting, in its gauge: what tells a processor hung
/// on a batch (the count stays above 0) from an idle shard (0), however
/// quiet the shard is afterwards.
fn publish_waiting(p: &ShardProgress, labels: &[(&'static str, String); 2]) {
    metrics::gauge!(SHARD_RECORDS_WAITING, labels).set(p.records_waiting as f64);
}

/// A running processor call (see [`ShardTracker::call_started`]).
#[derive(Debug)]
pub(crate) struct CallGuard {
    shard: Arc<Mutex<Shard>>,
    id: u64,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut s = lock(&self.shard);
        s.calls.retain(|(id, _, _)| *id != self.id);
        s.note_work();
    }
}

/// Wall-clock seconds, for gauges a dashboard subtracts from `time()`.
fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests;
