//! The fan-out reader and its subscription task: subscribing, reading a
//! subscription with room for each event, and pacing; what the task does
//! with each event is in `event`, with each failed subscription in
//! `failure`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_kinesis::types::SubscribeToShardEventStream;
use kcl_core::backoff::Pauses;
use kcl_core::leases::LeaseHandle;
use kcl_core::metric_names::{
    KINESIS_BYTES_FETCHED, KINESIS_FANOUT_CLOSED_SHARD_CHECKS, KINESIS_FANOUT_ERRORS,
    KINESIS_FANOUT_EVENTS, KINESIS_FANOUT_REPEATED_RECORDS, KINESIS_FANOUT_RESUBSCRIBES,
    KINESIS_FANOUT_SILENT_SUBSCRIPTIONS, KINESIS_FANOUT_SUBSCRIPTIONS,
    KINESIS_MILLIS_BEHIND_LATEST, KINESIS_RECORDS_FETCHED,
};
use kcl_core::source::{AnswerClock, OpenShard, SourceError};
use metrics::{Counter, Gauge};
use tokio::sync::mpsc::{self, OwnedPermit};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::FanOut;
use super::api::{EventStream, IN_USE, classify_stream};
use crate::budget::{EventEstimate, HeldBudget, Reservation};
use crate::calls::IteratorStart;
use crate::calls::Shared;
use crate::calls::classify::{Class, Classified, classify};
use crate::records::{Records, Start};
use crate::task_reader::{self, TaskReader, run_task};

mod event;
mod failure;

use event::StalledBatch;
use failure::InUse;

/// Kinesis accepts one `SubscribeToShard` per second per consumer and
/// shard; a reader never subscribes faster.
pub(crate) const SUBSCRIBE_INTERVAL: Duration = Duration::from_secs(1);

/// How long a `SubscribeToShard` call may take to answer. AWS answers at
/// once (the initial response); an endpoint that holds the call longer is
/// treated as a dropped connection and the call is made again.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often, at most, events that end the shard without naming its
/// children (no continuation) make the closed-shard check run, when
/// `closed_shard_check_interval` does not say.
pub(super) const UNANNOUNCED_END_CHECK: Duration = Duration::from_secs(30);

/// How long a subscription may wait for room of its reader's own (a
/// channel slot, free byte budget; before an event, or with an event
/// larger than the free budget, whose batch is then kept and queued first)
/// before it is let go. While it waits,
/// its unread data holds HTTP/2 flow-control window, of its stream and of
/// the connection all subscriptions to the endpoint share: a few shards
/// whose processors are behind must not starve the others. Ending it
/// releases the window; a new subscription resumes once there is room.
///
/// The wait for the worker-wide budget after that is not timed. It is a
/// queue whose turns come as other readers' events arrive (each holds a
/// reservation of about one event until then): ending the subscription
/// would only put the reader back at the end of it, and with many quiet
/// shards would end every busy one over and over. Should others' unread
/// data hold up the events a reservation waits for, that reader ends at its
/// event timeout and gives its reservation back to the queue.
const MAX_STALL: Duration = Duration::from_secs(10);

/// What the subscription task hands the reader.
type Message = task_reader::Message<Held>;

/// What a subscriber waits for before it reads an event: a slot for the
/// batch and the worker-wide budget reserved for it.
#[derive(Debug)]
struct Room {
    slot: OwnedPermit<Message>,
    worker: Reservation,
}

/// The byte budget a received batch holds until handed out: this
/// reader's and the worker's.
type Held = (OwnedSemaphorePermit, HeldBudget);

/// A [`ShardReader`](kcl_core::source::ShardReader) on one shard, fed by
/// `SubscribeToShard` events.
pub(crate) type FanOutReader = TaskReader<Held>;

impl FanOutReader {
    /// Makes sure the stream consumer exists and is ACTIVE (registering it
    /// if needed, so a missing stream or a consumer that never becomes
    /// ACTIVE fails here), then starts the subscription task.
    pub(crate) async fn open(
        shared: Shared,
        fanout: Arc<FanOut>,
        request: OpenShard,
    ) -> Result<Self, SourceError> {
        let OpenShard {
            stream,
            shard_id,
            position,
            lease,
            answers,
        } = request;
        if !lease.is_valid() {
            return Err(SourceError::LeaseLost { shard: shard_id });
        }
        let consumer_arn = fanout.consumer_arn(&shared, &stream).await?;
        let start = Start::of(position);
        let floor = start.resume.as_ref().map(|c| c.as_str().to_owned());
        let pipeline = Records::new(&stream, &shard_id, &lease, &start);
        let config = &fanout.config;
        let bytes = config.max_buffered_bytes;
        let reader = TaskReader::spawn(
            stream.clone(),
            shard_id.clone(),
            lease.clone(),
            config.max_buffered_batches,
            "subscription task",
            |tx, stop| {
                let subscriber = Subscriber {
                    meters: Meters::new(&stream, &shard_id),
                    bytes: Arc::new(Semaphore::new(bytes)),
                    estimate: EventEstimate::new(bytes),
                    carried: None,
                    transient_failures: 0,
                    stalled_batch: None,
                    in_use: InUse::default(),
                    received_event: false,
                    tx,
                    start: start.iterator,
                    floor,
                    continuation: None,
                    last_subscribe: None,
                    // The first check waits an interval too: a reader that just
                    // caught up on an open shard (the usual case) need not ask.
                    last_closed_check: Instant::now(),
                    unannounced_end_checked: None,
                    subscriptions: 0,
                    restart_at: None,
                    pipeline,
                    consumer_arn,
                    stream: stream.clone(),
                    shard_id: shard_id.clone(),
                    lease,
                    answers,
                    shared,
                    fanout,
                };
                subscriber.run(stop)
            },
        );
        debug!(%stream, shard = %shard_id, "fan-out reader started");
        Ok(reader)
    }
}

/// Metric handles of one reader, registered once.
#[derive(Debug, Clone)]
struct Meters {
    subscriptions: Counter,
    resubscribes: Counter,
    events: Counter,
    records: Counter,
    bytes: Counter,
    repeated: Counter,
    closed_checks: Counter,
    millis_behind_latest: Gauge,
    stream: String,
}

impl Meters {
    fn new(stream: &str, shard: &str) -> Self {
        let s = || stream.to_owned();
        Meters {
            subscriptions: metrics::counter!(KINESIS_FANOUT_SUBSCRIPTIONS, "stream" => s()),
            resubscribes: metrics::counter!(KINESIS_FANOUT_RESUBSCRIBES, "stream" => s()),
            events: metrics::counter!(KINESIS_FANOUT_EVENTS, "stream" => s()),
            records: metrics::counter!(KINESIS_RECORDS_FETCHED, "stream" => s()),
            bytes: metrics::counter!(KINESIS_BYTES_FETCHED, "stream" => s()),
            repeated: metrics::counter!(
                KINESIS_FANOUT_REPEATED_RECORDS, "stream" => s()
            ),
            closed_checks: metrics::counter!(
                KINESIS_FANOUT_CLOSED_SHARD_CHECKS, "stream" => s()
            ),
            millis_behind_latest: metrics::gauge!(
                KINESIS_MILLIS_BEHIND_LATEST, "stream" => s(), "shard" => shard.to_owned()
            ),
            stream: s(),
        }
    }

    fn error(&self, c: &Classified) {
        let kind = match c.class {
            Class::Throttled => "throttled",
            Class::Transient if c.code.as_deref() == Some(IN_USE) => "in_use",
            Class::Transient => "transient",
            Class::NotFound => "not_found",
            Class::AccessDenied => "access_denied",
            Class::InvalidArgument => "invalid_argument",
            _ => "fatal",
        };
        metrics::counter!(
            KINESIS_FANOUT_ERRORS,
            "stream" => self.stream.clone(),
            "kind" => kind
        )
        .increment(1);
    }
}

/// Why a subscription ended.
enum Ended {
    /// The configured lifetime passed.
    Lifetime,
    /// The processor was behind for [`MAX_STALL`].
    Stalled,
    /// The service closed the event stream (every 5 minutes on AWS).
    ByService,
    /// No event arrived within the event timeout: the connection is dead.
    Silent,
    /// The call or the stream failed.
    Failed(Classified),
    /// The shard-end batch was queued.
    ShardEnd,
    /// The reader was dropped.
    ReaderGone,
}

/// What the read loop does after an event.
enum Flow {
    Continue,
    ShardEnd,
    ReaderGone,
    /// The event waited [`MAX_STALL`] for the reader's bytes; its batch is
    /// kept in [`Subscriber::stalled_batch`], the subscription let go.
    Stalled,
}

/// The state of the subscription task.
#[derive(Debug)]
struct Subscriber {
    shared: Shared,
    fanout: Arc<FanOut>,
    stream: String,
    shard_id: String,
    lease: LeaseHandle,
    /// Told of each answer: a subscription, an event, an error sent.
    answers: AnswerClock,
    consumer_arn: String,
    tx: mpsc::Sender<Message>,
    bytes: Arc<Semaphore>,
    /// What the next event reserves of the worker-wide budget.
    estimate: EventEstimate,
    /// Room won while no subscription was open (after a stall), for the
    /// next subscription's first event.
    carried: Option<Room>,
    /// Where the reader started, for a subscription before any event.
    start: IteratorStart,
    /// Until a record arrives: records before this sequence number (the
    /// resume checkpoint's) are not delivered, whatever the endpoint sends.
    floor: Option<String>,
    /// The continuation sequence number of the last event.
    continuation: Option<String>,
    /// De-aggregation, the resume checkpoint's covered sub-records, and the
    /// last Kinesis record received (and queued for the reader).
    pipeline: Records,
    meters: Meters,
    transient_failures: u32,
    /// An event's batch that waited [`MAX_STALL`] for the reader's bytes,
    /// to queue before anything else once there are.
    stalled_batch: Option<StalledBatch>,
    /// Subscriptions answered `ResourceInUse` since the last event.
    in_use: InUse,
    /// Set by each event, so the loop knows the last subscription worked.
    received_event: bool,
    last_subscribe: Option<Instant>,
    /// When the closed-shard check last ran (or the reader started).
    last_closed_check: Instant,
    /// When an event without continuation or children last made the
    /// closed-shard check run (see `Subscriber::shard_end`).
    unannounced_end_checked: Option<Instant>,
    /// Subscriptions this reader opened.
    subscriptions: u64,
    /// Where the next subscription starts instead of after the last event:
    /// `TRIM_HORIZON` once that position was found trimmed.
    restart_at: Option<IteratorStart>,
}

impl Subscriber {
    async fn run(mut self, stop: CancellationToken) {
        let tx = self.tx.clone();
        let lag = self.meters.millis_behind_latest.clone();
        run_task(stop, tx, lag, self.subscribe_loop()).await;
    }

    fn lease_lost(&self) -> SourceError {
        SourceError::LeaseLost {
            shard: self.shard_id.clone(),
        }
    }

    fn fatal(&self, c: Classified, what: &str) -> SourceError {
        SourceError::Fatal {
            stream: self.stream.clone(),
            message: format!(
                "{}: {what} ({})",
                self.shard_id,
                c.code.as_deref().unwrap_or("no error code")
            ),
            source: Some(c.error),
        }
    }

    /// Subscribes, reads, and subscribes again from where the last event
    /// left off, until the shard ends, the lease is lost or the reader
    /// goes away.
    async fn subscribe_loop(&mut self) -> Result<(), SourceError> {
        let mut backoff = self.fanout.config.backoff();
        loop {
            if !self.lease.is_valid() {
                return Err(self.lease_lost());
            }
            self.pace().await?;
            let asked = SystemTime::now();
            let ended = match self.subscribe().await? {
                Ok(events) => {
                    self.subscribed(asked);
                    self.read(events).await?
                }
                Err(c) => {
                    // A backoff must not sit on budget others can use.
                    self.carried = None;
                    Ended::Failed(c)
                }
            };
            let got_event = std::mem::take(&mut self.received_event);
            if got_event {
                // The subscription worked: failures before it no longer
                // count.
                backoff.reset();
                self.transient_failures = 0;
                self.in_use = InUse::default();
            }
            let ended = match ended {
                // Kinesis sends a first event at once, records or not: a
                // subscription ended before any failed. Taken for an
                // ordinary end, an endpoint that closes each at once had
                // the shard resubscribed every second, silently, for good.
                Ended::ByService if !got_event => Ended::Failed(Classified {
                    class: Class::Transient,
                    code: None,
                    answered: true,
                    error: "the subscription ended before its first event".into(),
                }),
                ended => ended,
            };
            match ended {
                Ended::ShardEnd | Ended::ReaderGone => return Ok(()),
                Ended::Lifetime | Ended::ByService => {
                    debug!(stream = %self.stream, shard = %self.shard_id,
                        continuation = ?self.continuation, "subscription ended; subscribing again");
                }
                Ended::Silent => self.went_silent(),
                Ended::Stalled => {
                    debug!(stream = %self.stream, shard = %self.shard_id,
                        "processor behind; subscribing again once it catches up");
                    match self.queue_stalled().await? {
                        Flow::Continue => {}
                        _ => return Ok(()),
                    }
                    let room = tokio::select! {
                        biased;
                        () = self.lease.ended() => return Err(self.lease_lost()),
                        room = self.room() => room,
                    };
                    let Some(room) = room else {
                        return Ok(());
                    };
                    // Won without holding a subscription's window: the next
                    // subscription reads with it instead of queueing again.
                    self.carried = Some(room);
                }
                Ended::Failed(c) => {
                    if !self.failed(c, &mut backoff).await? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Counts and logs a subscription that sent no event within the event
    /// timeout.
    fn went_silent(&self) {
        self.shared.stats.silent_subscription();
        metrics::counter!(
            KINESIS_FANOUT_SILENT_SUBSCRIPTIONS,
            "stream" => self.stream.clone()
        )
        .increment(1);
        warn!(stream = %self.stream, shard = %self.shard_id,
            timeout = ?self.fanout.config.event_timeout,
            continuation = ?self.continuation,
            "no event within the event timeout: the connection is taken for dead; \
             subscribing again after the last event");
    }

    /// Waits until a subscription is allowed: one per second per shard.
    async fn pace(&mut self) -> Result<(), SourceError> {
        if let Some(last) = self.last_subscribe {
            self.sleep_until(last + SUBSCRIBE_INTERVAL).await?;
        }
        self.last_subscribe = Some(Instant::now());
        Ok(())
    }

    /// Sleeps, waking early (with an error) if the lease ends.
    async fn sleep_until(&self, at: Instant) -> Result<(), SourceError> {
        tokio::select! {
            biased;
            () = self.lease.ended() => Err(self.lease_lost()),
            () = tokio::time::sleep_until(at) => Ok(()),
        }
    }

    /// Where the next subscription starts: after the last event, or where
    /// the reader started if no event arrived yet.
    fn position(&self) -> IteratorStart {
        if let Some(start) = &self.restart_at {
            return start.clone();
        }
        match (self.continuation.as_deref(), self.pipeline.last_sequence()) {
            (Some(seq), _) | (None, Some(seq)) => IteratorStart::AfterSequence(seq.to_owned()),
            (None, None) => self.start.clone(),
        }
    }

    /// One `SubscribeToShard` call. The outer error ends the reader (the
    /// lease ended); the inner one is a failed call to handle.
    async fn subscribe(&self) -> Result<Result<Box<dyn EventStream>, Classified>, SourceError> {
        let position = self.position();
        self.shared.stats.subscribe_call();
        debug!(stream = %self.stream, shard = %self.shard_id, ?position, "subscribing");
        let call =
            self.fanout
                .api
                .subscribe_to_shard(&self.consumer_arn, &self.shard_id, &position);
        let answer = tokio::select! {
            biased;
            () = self.lease.ended() => return Err(self.lease_lost()),
            answer = tokio::time::timeout(SUBSCRIBE_TIMEOUT, call) => answer,
        };
        let subscribed = match answer {
            Ok(Ok(events)) => Ok(events),
            Ok(Err(e)) => Err(classify(e)),
            Err(_) => Err(Classified {
                class: Class::Transient,
                code: None,
                answered: false,
                error: format!("SubscribeToShard did not answer within {SUBSCRIBE_TIMEOUT:?}")
                    .into(),
            }),
        };
        if subscribed.as_ref().map_or_else(|c| c.answered, |_| true) {
            self.answers.answered();
        } else {
            self.answers.silent();
        }
        Ok(subscribed)
    }

    /// Counts a subscription asked for at `asked` that the service took.
    /// One at `LATEST` fixed "latest": a subscription made again before
    /// any event (the first died silent, or failed) starts at that time,
    /// not at a new `LATEST` that skips what was written meanwhile.
    fn subscribed(&mut self, asked: SystemTime) {
        if matches!(self.start, IteratorStart::Latest) {
            self.start = IteratorStart::AtTimestamp(asked);
        }
        self.meters.subscriptions.increment(1);
        if self.subscriptions > 0 {
            self.shared.stats.resubscribe();
            self.meters.resubscribes.increment(1);
        }
        self.subscriptions += 1;
    }

    async fn back_off(&self, backoff: &mut Pauses) -> Result<(), SourceError> {
        let delay = backoff.next_or_max();
        self.sleep_until(Instant::now() + delay).await
    }

    /// Reads one subscription until it ends.
    async fn read(&mut self, mut events: Box<dyn EventStream>) -> Result<Ended, SourceError> {
        let lifetime = self.fanout.config.subscription_lifetime;
        let silence = self.fanout.config.event_timeout;
        let expired = async move {
            match lifetime {
                Some(lifetime) => tokio::time::sleep(lifetime).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        loop {
            // Room first: while the processor is behind, the event stream
            // is not read, so the transport's flow control (HTTP/2 windows,
            // TCP) holds the service back instead of our memory.
            let room = match self.next_room(&mut expired).await? {
                Ok(room) => room,
                Err(ended) => return Ok(ended),
            };
            if !self.lease.is_valid() {
                return Err(self.lease_lost());
            }
            let next = tokio::select! {
                biased;
                () = self.lease.ended() => return Err(self.lease_lost()),
                () = &mut expired => return Ok(Ended::Lifetime),
                next = events.recv() => next,
                // Kinesis sends an event every few seconds, records or not;
                // this long without one, the connection died unnoticed.
                () = tokio::time::sleep(silence) => {
                    self.answers.silent();
                    return Ok(Ended::Silent);
                }
            };
            match next {
                Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(event))) => {
                    match self.on_event(event, room).await? {
                        Flow::Continue => {}
                        Flow::ShardEnd => return Ok(Ended::ShardEnd),
                        Flow::ReaderGone => return Ok(Ended::ReaderGone),
                        Flow::Stalled => return Ok(Ended::Stalled),
                    }
                }
                Ok(Some(other)) => {
                    debug!(stream = %self.stream, shard = %self.shard_id, ?other,
                        "ignoring an event type this version does not know");
                }
                Ok(None) => return Ok(Ended::ByService),
                Err(e) => {
                    let failed = classify_stream(e);
                    if failed.answered {
                        self.answers.answered();
                    } else {
                        self.answers.silent();
                    }
                    return Ok(Ended::Failed(failed));
                }
            }
        }
    }

    /// The room for the next event of an open subscription: the one
    /// carried over from a stall, or waited for. Only the wait for the
    /// reader's own room counts toward [`MAX_STALL`]. The inner error is
    /// why the subscription ends instead.
    async fn next_room<F: Future<Output = ()>>(
        &mut self,
        expired: &mut Pin<&mut F>,
    ) -> Result<Result<Room, Ended>, SourceError> {
        if let Some(room) = self.carried.take() {
            return Ok(Ok(room));
        }
        let slot = tokio::select! {
            biased;
            () = self.lease.ended() => return Err(self.lease_lost()),
            () = expired.as_mut() => return Ok(Err(Ended::Lifetime)),
            slot = self.own_room() => slot,
            () = tokio::time::sleep(MAX_STALL) => return Ok(Err(Ended::Stalled)),
        };
        let Some(slot) = slot else {
            return Ok(Err(Ended::ReaderGone));
        };
        let worker = tokio::select! {
            biased;
            () = self.lease.ended() => return Err(self.lease_lost()),
            () = expired.as_mut() => return Ok(Err(Ended::Lifetime)),
            worker = self.reserve() => worker,
        };
        Ok(worker
            .map(|worker| Room { slot, worker })
            .ok_or(Ended::ReaderGone))
    }

    /// Waits for the reader's own room and then the worker-wide budget
    /// for the next event. `None` once the reader is gone.
    async fn room(&self) -> Option<Room> {
        let slot = self.own_room().await?;
        let worker = self.reserve().await?;
        Some(Room { slot, worker })
    }

    /// Waits for a free slot in the channel and some free byte budget of
    /// the reader's own. `None` once the reader is gone.
    async fn own_room(&self) -> Option<OwnedPermit<Message>> {
        let slot = self.tx.clone().reserve_owned().await.ok()?;
        // Taking and returning one permit waits for free budget without
        // holding any.
        drop(self.bytes.acquire().await.ok()?);
        Some(slot)
    }

    /// Reserves the worker-wide budget for the next event, once the rest
    /// of the room is there, so that it is held the shortest. The event's
    /// size is known only once it is read: the estimate follows the
    /// shard's recent events (see the budget module). `None` only if the
    /// budget was closed (never).
    async fn reserve(&self) -> Option<Reservation> {
        let bytes = self.estimate.reservation();
        self.shared.budget.reserve(bytes).await
    }
}
