//! The polling reader and its fetch task: the first iterator, the
//! `GetRecords` loop with its pacing and prefetch budgets, expired-iterator
//! recovery and the shard's end (see the module above for the model).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_kinesis::operation::get_records::GetRecordsOutput;
use kcl_core::leases::LeaseHandle;
use kcl_core::metric_names::{
    KINESIS_BYTES_FETCHED, KINESIS_EXPIRED_ITERATORS, KINESIS_GET_RECORDS_CALLS,
    KINESIS_MILLIS_BEHIND_LATEST, KINESIS_RECORDS_FETCHED,
};
use kcl_core::source::{AnswerClock, Batch, ChildShard, OpenShard, SourceError};
use metrics::{Counter, Gauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use super::config::{MIN_TIME_BETWEEN_READS, PollingConfig};
use crate::budget::{HeldBudget, Reservation};
use crate::calls::IteratorStart;
use crate::calls::Shared;
use crate::calls::classify::{Class, classify};
use crate::calls::retry::{Failure, ForReader, Op, retryable, retrying_holding};
use crate::discovery::{EndSeen, closed_shard_children};
use crate::gone::{Missing, past_trim_horizon, why_missing};
use crate::records::{Records, Start, Taken, held_bytes};
use crate::task_reader::{self, Delivery, TaskReader, run_task};

/// Batches the fetch task may have waiting for the reader. The record and
/// byte budgets are the real bound; this only caps how many small batches
/// queue up.
pub(crate) const PREFETCH_BATCHES: usize = 4;

/// The prefetch budget a fetched batch holds until handed out: this
/// reader's records and bytes, and the worker's bytes.
type Held = (OwnedSemaphorePermit, OwnedSemaphorePermit, HeldBudget);

/// What the fetch task hands the reader.
type Message = task_reader::Message<Held>;

/// A [`ShardReader`](kcl_core::source::ShardReader) on one shard, fed by a
/// background `GetRecords` loop.
pub(crate) type PollingReader = TaskReader<Held>;

impl PollingReader {
    /// Gets the first shard iterator (so a missing shard or stream fails
    /// here) and starts the fetch task.
    pub(crate) async fn open(
        shared: Shared,
        polling: PollingConfig,
        request: OpenShard,
    ) -> Result<Self, SourceError> {
        let OpenShard {
            stream,
            shard_id,
            position,
            lease,
            answers,
        } = request;
        let start = Start::of(position);
        let records = Records::new(&stream, &shard_id, &lease, &start);
        let meters = Meters::new(&stream, &shard_id);
        let ctx = Ctx {
            shared,
            polling,
            stream,
            shard_id,
            lease,
            answers,
            meters,
        };
        let mut from = start.iterator.clone();
        let next = ctx.first_iterator(&mut from).await?;
        debug!(stream = %ctx.stream, shard = %ctx.shard_id, "polling reader started");
        Ok(TaskReader::spawn(
            ctx.stream.clone(),
            ctx.shard_id.clone(),
            ctx.lease.clone(),
            PREFETCH_BATCHES,
            "fetch task",
            |tx, stop| {
                let fetcher = Fetcher {
                    records: Arc::new(Semaphore::new(ctx.polling.max_prefetch_records)),
                    bytes: Arc::new(Semaphore::new(ctx.polling.max_prefetch_bytes)),
                    tx,
                    start: from,
                    pipeline: records,
                    next,
                    last_call: None,
                    ctx,
                };
                // The fetch task logs under the consumer's span (worker,
                // stream, shard).
                fetcher.run(stop).in_current_span()
            },
        ))
    }
}

/// Metric handles of one reader, registered once.
#[derive(Debug, Clone)]
struct Meters {
    get_records: Counter,
    records: Counter,
    bytes: Counter,
    expired_iterators: Counter,
    millis_behind_latest: Gauge,
}

impl Meters {
    fn new(stream: &str, shard: &str) -> Self {
        let s = || stream.to_owned();
        let sh = || shard.to_owned();
        Meters {
            get_records: metrics::counter!(
                KINESIS_GET_RECORDS_CALLS, "stream" => s(), "shard" => sh()
            ),
            records: metrics::counter!(
                KINESIS_RECORDS_FETCHED, "stream" => s(), "shard" => sh()
            ),
            bytes: metrics::counter!(
                KINESIS_BYTES_FETCHED, "stream" => s(), "shard" => sh()
            ),
            expired_iterators: metrics::counter!(
                KINESIS_EXPIRED_ITERATORS, "stream" => s(), "shard" => sh()
            ),
            millis_behind_latest: metrics::gauge!(
                KINESIS_MILLIS_BEHIND_LATEST, "stream" => s(), "shard" => shard.to_owned()
            ),
        }
    }
}

/// What the reader and its fetch task both know.
#[derive(Debug, Clone)]
struct Ctx {
    shared: Shared,
    /// The source's polling settings.
    polling: PollingConfig,
    stream: String,
    shard_id: String,
    lease: LeaseHandle,
    /// Told of each answer to this reader's calls.
    answers: AnswerClock,
    meters: Meters,
}

impl Ctx {
    /// On whose behalf this reader's calls are made.
    fn reader(&self) -> ForReader<'_> {
        ForReader {
            lease: &self.lease,
            answers: &self.answers,
        }
    }
}

impl Ctx {
    fn error(&self, failure: Failure) -> SourceError {
        failure.into_source_error(&self.stream, &self.shard_id)
    }

    /// An iterator at `start`, or the shard's end if the shard expired.
    /// A start behind the trim horizon is moved to `TRIM_HORIZON`, and a
    /// `LATEST` start, at the first answer (an iterator or none), to
    /// `AT_TIMESTAMP` of when it was asked for (both in `start`, where a
    /// replacement starts while nothing was fetched): "latest" is fixed by
    /// the first answer, and a later one (after an iterator expired in an
    /// outage longer than it lives) must not move it on past what was
    /// written meanwhile.
    async fn first_iterator(&self, start: &mut IteratorStart) -> Result<Next, SourceError> {
        loop {
            let asked = SystemTime::now();
            let iterator = self
                .shared
                .shard_iterator(&self.stream, &self.shard_id, start, Some(self.reader()))
                .await;
            // "Latest" is fixed by the first answer, an iterator or none:
            // asked again, LATEST would always be past what came meanwhile.
            if iterator.is_ok() && matches!(start, IteratorStart::Latest) {
                *start = IteratorStart::AtTimestamp(asked);
            }
            match iterator {
                // No iterator: the shard is closed and read to its end (as
                // the Java KCL takes it) if ListShards names its children.
                Ok(None) => return Ok(Next::Closed),
                Ok(Some(it)) => return Ok(Next::Read(it)),
                Err(Failure::Classified(c)) if c.class == Class::NotFound => {
                    return self.missing(c.error).await;
                }
                Err(Failure::Classified(c)) if c.class == Class::InvalidArgument => {
                    let trimmed = past_trim_horizon(
                        &self.shared,
                        &self.stream,
                        &self.shard_id,
                        start,
                        self.reader(),
                    )
                    .await?;
                    match trimmed {
                        Some(horizon) => *start = horizon,
                        None => return Err(self.error(Failure::Classified(c))),
                    }
                }
                Err(f) => return Err(self.error(f)),
            }
        }
    }

    /// What a `ResourceNotFound` for the shard means (see [`why_missing`]).
    async fn missing(
        &self,
        error: Box<dyn std::error::Error + Send + Sync>,
    ) -> Result<Next, SourceError> {
        match why_missing(&self.shared, &self.stream, &self.shard_id).await? {
            Missing::Expired(children) => Ok(Next::End(children)),
            Missing::Stream => Err(SourceError::StreamNotFound {
                stream: self.stream.clone(),
            }),
            Missing::Listed => Err(retryable(&self.stream, &self.shard_id, error)),
        }
    }
}

/// Where the fetch task goes on.
#[derive(Debug)]
enum Next {
    /// `GetRecords` with this iterator.
    Read(String),
    /// The shard is over (it expired): deliver its end with these children.
    End(Vec<ChildShard>),
    /// No iterator: the shard is closed and nothing is left to read if
    /// `ListShards` names its children; deliver its end with them.
    Closed,
}

/// What the fetch loop does after a batch.
enum Flow {
    Continue,
    Stop,
}

/// The state of the fetch task.
#[derive(Debug)]
struct Fetcher {
    ctx: Ctx,
    tx: mpsc::Sender<Message>,
    records: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    /// Where the reader started (`LATEST` as the `AT_TIMESTAMP` it was
    /// fixed at), for a new iterator before any record.
    start: IteratorStart,
    pipeline: Records,
    next: Next,
    /// When the last `GetRecords` started, for pacing.
    last_call: Option<Instant>,
}

impl Fetcher {
    async fn run(mut self, stop: CancellationToken) {
        let tx = self.tx.clone();
        let lag = self.ctx.meters.millis_behind_latest.clone();
        run_task(stop, tx, lag, self.fetch()).await;
    }

    async fn fetch(&mut self) -> Result<(), SourceError> {
        // Iterators that expired with no successful read in between. A fresh
        // iterator should not expire; if they keep doing so (a skewed clock,
        // a misbehaving endpoint), back off instead of spinning.
        let mut expired_in_a_row: u32 = 0;
        loop {
            let Some(iterator) = self.next_iterator().await? else {
                return Ok(());
            };
            let Some(limit) = self.wait_for_budget().await else {
                return Ok(());
            };
            let (out, reservation) = match self.get_records(&iterator, limit).await {
                Ok(answer) => {
                    expired_in_a_row = 0;
                    answer
                }
                Err(Failure::Classified(c)) if c.class == Class::ExpiredIterator => {
                    if expired_in_a_row > 0 {
                        let delay = self
                            .ctx
                            .polling
                            .retry_policy()
                            .backoff
                            .pauses()
                            .nth(expired_in_a_row.min(16) as usize)
                            .unwrap_or(self.ctx.polling.retry.max_delay);
                        tokio::time::sleep(delay).await;
                    }
                    expired_in_a_row = expired_in_a_row.saturating_add(1);
                    self.replace_iterator().await?;
                    continue;
                }
                Err(Failure::Classified(c)) if c.class == Class::NotFound => {
                    // The shard aged out while being read (or the stream was
                    // deleted): decide as at open. A stale answer is
                    // reported and tried again after a pause; the task goes
                    // on.
                    match self.ctx.missing(c.error).await {
                        Ok(next) => self.next = next,
                        Err(e) if e.is_retryable() => {
                            if !self.report(e).await {
                                return Ok(());
                            }
                            self.pause_after_failure().await;
                        }
                        Err(e) => return Err(e),
                    }
                    continue;
                }
                Err(Failure::Exhausted(c)) => {
                    // Tell the consumer and keep trying from the same place,
                    // after the longest pause: the retries' backoff starts
                    // over with the next call, and without this pause a
                    // failure the service answers at once (every one, under
                    // `max_transient_retries(0)`) made the next call at once.
                    let e = retryable(&self.ctx.stream, &self.ctx.shard_id, c.error);
                    if !self.report(e).await {
                        return Ok(());
                    }
                    self.pause_after_failure().await;
                    continue;
                }
                Err(f) => return Err(self.ctx.error(f)),
            };
            let pause = self.pause_after(&out, limit);
            match self.deliver(out, reservation).await? {
                Flow::Continue => {}
                Flow::Stop => return Ok(()),
            }
            self.pace(pause).await;
        }
    }

    /// How long after the start of the call that returned `out` the next
    /// one may start (the pacing table on [`crate::PollingConfig`]).
    fn pause_after(&self, out: &GetRecordsOutput, limit: i32) -> Duration {
        let polling = &self.ctx.polling;
        let got = out.records.len();
        // Full means all a call may return (max_records): more is waiting,
        // read it at once. A call that only filled the smaller limit a
        // nearly full prefetch budget left may have more waiting too, but
        // following it at once would spin against the shard's quota.
        if got >= usize::try_from(polling.max_records).unwrap_or(usize::MAX) {
            Duration::ZERO
        } else if got >= usize::try_from(limit).unwrap_or(usize::MAX)
            || out.millis_behind_latest.is_some_and(|ms| ms > 0)
        {
            // Behind, or cut short by the prefetch budget: more is
            // waiting, at the shard's floor.
            MIN_TIME_BETWEEN_READS
        } else if got > 0 {
            polling.time_between_reads
        } else {
            polling.idle_time_between_reads
        }
    }

    /// The iterator to read with next; `None` once the shard's end was
    /// sent, or the reader went away while its children were looked up.
    async fn next_iterator(&mut self) -> Result<Option<String>, SourceError> {
        loop {
            let children = match &self.next {
                Next::Read(it) => return Ok(Some(it.clone())),
                Next::End(children) => Some(children.clone()),
                Next::Closed => match self.children(EndSeen::NoIterator).await? {
                    // A missing iterator alone is no proof: an open shard
                    // taken for ended would never be read again. Its
                    // children are.
                    Some(children) if children.is_empty() => {
                        if !self.no_end_after_all().await? {
                            return Ok(None);
                        }
                        continue;
                    }
                    children => children,
                },
            };
            if let Some(children) = children {
                self.end(children).await;
            }
            return Ok(None);
        }
    }

    /// No iterator, and no child of the shard listed: reported, and after
    /// a pause an iterator is asked for again, the task reading on (ended,
    /// it made the consumer reopen the shard, and give it back after a few
    /// rounds). False if the reader is gone.
    async fn no_end_after_all(&mut self) -> Result<bool, SourceError> {
        let (stream, shard) = (&self.ctx.stream, &self.ctx.shard_id);
        let why = "GetShardIterator answered with no iterator, but ListShards names no \
                   child of the shard: not taken for its end";
        if !self.report(retryable(stream, shard, why.into())).await {
            return Ok(false);
        }
        self.pause_after_failure().await;
        self.new_iterator().await?;
        Ok(true)
    }

    /// Sends the shard's end (it expired, or it is closed and read to its
    /// end: no records are left).
    async fn end(&mut self, children: Vec<ChildShard>) {
        let worker = self.ctx.shared.budget.nothing();
        let batch = Batch {
            records: Vec::new(),
            millis_behind_latest: Some(0),
            shard_end: Some(children),
        };
        self.queue(batch, 0, worker).await;
    }

    /// Takes this reader's budget for `batch` (which holds `bytes`, and
    /// `worker` of the worker-wide budget) and queues it for the reader.
    /// False if the reader is gone.
    async fn queue(&self, batch: Batch, bytes: usize, worker: HeldBudget) -> bool {
        let Some((records, bytes)) = self.reserve(batch.records.len(), bytes).await else {
            return false;
        };
        let held = (records, bytes, worker);
        self.tx.send(Ok(Delivery::new(batch, held))).await.is_ok()
    }

    /// Waits until some prefetch budget is free; returns how many records
    /// to ask for. `None` if the budget was closed (never, in practice).
    async fn wait_for_budget(&self) -> Option<i32> {
        // Taking and returning one permit of each waits for free budget
        // without holding any.
        drop(self.records.acquire().await.ok()?);
        drop(self.bytes.acquire().await.ok()?);
        let free = self.records.available_permits().max(1);
        let max = self.ctx.polling.max_records;
        Some(i32::try_from(free).map_or(max, |free| free.min(max)))
    }

    /// One `GetRecords`, retried; each attempt first reserves room for its
    /// response in the worker-wide budget (given back before a retry
    /// pause, so a throttled shard holds none of it while it waits).
    async fn get_records(
        &mut self,
        iterator: &str,
        limit: i32,
    ) -> Result<(GetRecordsOutput, Reservation), Failure> {
        let ctx = &self.ctx;
        let prepare = || async move {
            tokio::select! {
                reservation = ctx.shared.budget.reserve_call(limit) => reservation,
                () = ctx.lease.ended() => None,
            }
        };
        // A lock only to keep the future Send; never contended.
        let started = std::sync::Mutex::new(Instant::now());
        let attempt = || {
            *started.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            ctx.shared.stats.get_records_call();
            ctx.meters.get_records.increment(1);
            async move {
                ctx.shared
                    .api
                    .get_records(&ctx.stream, iterator, limit)
                    .await
                    .map_err(classify)
            }
        };
        let out = retrying_holding(
            &ctx.shared,
            &ctx.polling.retry_policy(),
            Op::GetRecords,
            &ctx.stream,
            Some(ctx.reader()),
            prepare,
            attempt,
        )
        .await;
        self.last_call = Some(*started.lock().unwrap_or_else(|e| e.into_inner()));
        out
    }

    /// Replaces an expired iterator: right after the last record fetched,
    /// or where the reader started if none was. Nothing is lost or
    /// repeated. (From `LATEST` with nothing fetched yet, at the time the
    /// first iterator was asked for: records written meanwhile are read,
    /// where the Java KCL asks for `LATEST` again and skips them. To within
    /// the skew between this host's clock and Kinesis's.)
    async fn replace_iterator(&mut self) -> Result<(), SourceError> {
        self.ctx.shared.stats.expired_iterator();
        self.ctx.meters.expired_iterators.increment(1);
        debug!(stream = %self.ctx.stream, shard = %self.ctx.shard_id,
            "shard iterator expired; getting a new one");
        self.new_iterator().await
    }

    /// A new iterator, where [`Fetcher::replace_iterator`] says, retried
    /// (each failure reported) until one is had or the reader is gone.
    async fn new_iterator(&mut self) -> Result<(), SourceError> {
        let mut start = match self.pipeline.last_sequence() {
            Some(seq) => IteratorStart::AfterSequence(seq.to_owned()),
            None => self.start.clone(),
        };
        loop {
            match self.ctx.first_iterator(&mut start).await {
                Ok(next) => {
                    if self.pipeline.last_sequence().is_none() {
                        self.start = start;
                    }
                    self.next = next;
                    return Ok(());
                }
                Err(e) if e.is_retryable() => {
                    if !self.report(e).await {
                        return Ok(());
                    }
                    // As after a stale not-found of GetRecords: each round
                    // is a GetShardIterator and a full ListShards.
                    self.pause_after_failure().await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The pause after a failure reported to the reader, cut short if the
    /// lease ends.
    async fn pause_after_failure(&self) {
        let pause = self.ctx.polling.retry.max_delay;
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = self.ctx.lease.ended() => {}
        }
    }

    /// Sends a retryable error to the reader; false if the reader is gone.
    async fn report(&self, e: SourceError) -> bool {
        warn!(stream = %self.ctx.stream, shard = %self.ctx.shard_id, error = %e,
            "Kinesis keeps failing; still retrying");
        self.tx.send(Err(e)).await.is_ok()
    }

    /// De-aggregates a response and queues it for the reader.
    async fn deliver(
        &mut self,
        out: GetRecordsOutput,
        reservation: Reservation,
    ) -> Result<Flow, SourceError> {
        let GetRecordsOutput {
            records,
            next_shard_iterator,
            millis_behind_latest,
            child_shards,
            ..
        } = out;
        let Taken {
            user,
            payload_bytes,
            ..
        } = self.pipeline.take(records);
        self.ctx
            .shared
            .stats
            .fetched(user.len() as u64, payload_bytes as u64);
        self.ctx.meters.records.increment(user.len() as u64);
        self.ctx.meters.bytes.increment(payload_bytes as u64);
        let bytes = held_bytes(&user);
        let behind = millis_behind_latest.map(|m| u64::try_from(m).unwrap_or(0));
        if let Some(ms) = behind {
            self.ctx.meters.millis_behind_latest.set(ms as f64);
        }
        let shard_end = match next_shard_iterator {
            Some(it) if !it.is_empty() => {
                self.next = Next::Read(it);
                None
            }
            // No next iterator: the shard is closed and this was its end.
            _ => match self.children(EndSeen::Response(child_shards)).await? {
                Some(children) => Some(children),
                None => return Ok(Flow::Stop),
            },
        };
        let end = shard_end.is_some();
        if user.is_empty() && !end && self.tx.capacity() < self.tx.max_capacity() {
            // A batch is already waiting; an empty one would say nothing new.
            return Ok(Flow::Continue);
        }
        let worker = self.ctx.shared.budget.keep(reservation, bytes);
        let batch = Batch {
            records: user,
            millis_behind_latest: behind,
            shard_end,
        };
        let sent = self.queue(batch, bytes, worker).await;
        Ok(if !sent || end {
            Flow::Stop
        } else {
            Flow::Continue
        })
    }

    /// Takes budget for a batch, waiting while the reader drains earlier
    /// ones. A batch larger than the whole budget takes all of it.
    async fn reserve(
        &self,
        records: usize,
        bytes: usize,
    ) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let polling = &self.ctx.polling;
        // Both budgets fit in u32 (validated at build()).
        let n = |v: usize, max: usize| u32::try_from(v.min(max)).unwrap_or(u32::MAX);
        let r = Arc::clone(&self.records)
            .acquire_many_owned(n(records, polling.max_prefetch_records))
            .await
            .ok()?;
        let b = Arc::clone(&self.bytes)
            .acquire_many_owned(n(bytes, polling.max_prefetch_bytes))
            .await
            .ok()?;
        Some((r, b))
    }

    /// The children of the closed shard (see [`closed_shard_children`]);
    /// `None` if the reader went away while retrying.
    async fn children(&self, seen: EndSeen) -> Result<Option<Vec<ChildShard>>, SourceError> {
        let ctx = &self.ctx;
        closed_shard_children(
            &ctx.shared,
            &ctx.stream,
            &ctx.shard_id,
            &ctx.lease,
            seen,
            |e| self.report(e),
        )
        .await
    }

    /// Waits until `pause` after the start of the last call. Wakes early if
    /// the lease ends, so the task stops promptly.
    async fn pace(&self, pause: Duration) {
        let Some(last) = self.last_call else { return };
        if pause.is_zero() {
            // A full batch: more is waiting. Still let other tasks run.
            tokio::task::yield_now().await;
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(last + pause) => {}
            () = self.ctx.lease.ended() => {}
        }
    }
}
