//! An in-memory stand-in for the fan-out calls, on top of
//! [`FakeKinesis`]: a subscription reads the fake's shard with
//! its `GetRecords`, so records, splits and children come from one place.
//!
//! Like Kinesis, an event is pushed as soon as records are there, and an
//! empty one every second otherwise; one subscription per shard may be
//! active at a time (another one gets `ResourceInUse`). Scripts make the
//! service end subscriptions, fail them, or behave like kinesis-mock (never
//! announce a shard's end; restart at TRIM_HORIZON once).

// Built for the benchmarks too (feature `test-util`), which use the
// subscriptions but none of the unit tests' scripts.
#![cfg_attr(not(test), allow(dead_code))]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_kinesis::error::{ErrorMetadata, SdkError};
use aws_sdk_kinesis::operation::deregister_stream_consumer::{
    DeregisterStreamConsumerError, DeregisterStreamConsumerOutput,
};
use aws_sdk_kinesis::operation::describe_stream_consumer::{
    DescribeStreamConsumerError, DescribeStreamConsumerOutput,
};
use aws_sdk_kinesis::operation::describe_stream_summary::{
    DescribeStreamSummaryError, DescribeStreamSummaryOutput,
};
use aws_sdk_kinesis::operation::get_shard_iterator::GetShardIteratorError;
use aws_sdk_kinesis::operation::register_stream_consumer::{
    RegisterStreamConsumerError, RegisterStreamConsumerOutput,
};
use aws_sdk_kinesis::operation::subscribe_to_shard::SubscribeToShardError;
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::error::{
    AccessDeniedException, InternalFailureException, InvalidArgumentException,
    KmsDisabledException, LimitExceededException, ResourceInUseException,
    ResourceNotFoundException, SubscribeToShardEventStreamError,
};
use aws_sdk_kinesis::types::{
    Consumer, ConsumerDescription, ConsumerStatus, StreamDescriptionSummary, StreamStatus,
    SubscribeToShardEvent, SubscribeToShardEventStream,
};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::event_stream::RawMessage;

use super::fake::FakeKinesis;
use crate::calls::{IteratorStart, KinesisApi, ListShardsPage};
use crate::fanout::{EventStream, FanOutApi, StreamError};

/// How often an open subscription looks for new records.
const POLL: Duration = Duration::from_millis(50);
/// An empty event goes out after this long without records.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// A failure of a `SubscribeToShard` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubscribeFault {
    InUse,
    LimitExceeded,
    NotFound,
    InternalFailure,
    AccessDenied,
}

/// A failure inside an open event stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamFault {
    InternalFailure,
    ConnectionReset,
    /// The stream's KMS key is disabled.
    KmsDisabled,
    /// The connection died without a reset: no event, no error, ever.
    Silent,
}

#[derive(Debug)]
struct FakeConsumer {
    arn: String,
    name: String,
    status: ConsumerStatus,
    /// Describe calls it stays CREATING for.
    creating_for: u32,
}

#[derive(Debug, Default)]
struct State {
    /// By (stream ARN, name).
    consumers: HashMap<(String, String), FakeConsumer>,
    next_consumer: u64,
    creating_for: u32,
    /// Register calls that find the name taken by a concurrent registration.
    register_races: u32,
    registrations: u32,
    deregistrations: u32,
    /// Shards with an open subscription.
    active: HashSet<String>,
    subscribe_faults: VecDeque<SubscribeFault>,
    /// Per subscription to come: a fault after this many events.
    stream_faults: VecDeque<(usize, StreamFault)>,
    /// The service ends each subscription after this many events.
    end_after_events: Option<usize>,
    /// Like kinesis-mock: the last event never names the children.
    silent_end: bool,
    /// Events leave ContinuationSequenceNumber out (the SDK reads it as
    /// empty, which from Kinesis means the shard's end).
    no_continuation: bool,
    /// Events with records before the shard's end announce these children
    /// and keep their continuation (an event Kinesis never sends), each
    /// with at most `records_per_event` records.
    early_children: Option<Vec<aws_sdk_kinesis::types::ChildShard>>,
    records_per_event: Option<i32>,
    /// Like kinesis-mock with an unknown sequence number: the next
    /// subscription starts at TRIM_HORIZON whatever it asked for.
    restart_from_trim_horizon: bool,
    subscriptions: Vec<(tokio::time::Instant, IteratorStart)>,
    events: u64,
    /// The shard of each event sent, in the order sent.
    event_shards: Vec<String>,
}

/// The fake. Clones share everything.
#[derive(Debug, Clone)]
pub(crate) struct FakeFanOut {
    kinesis: Arc<FakeKinesis>,
    state: Arc<Mutex<State>>,
}

fn status(code: u16) -> StatusCode {
    StatusCode::try_from(code).expect("status")
}

fn service<E>(err: E, code: u16) -> SdkError<E> {
    SdkError::service_error(err, HttpResponse::new(status(code), SdkBody::empty()))
}

/// The service error `$error::$exception`, answered with status 400.
macro_rules! rejected {
    ($error:ident :: $exception:ident) => {
        service($error::$exception($exception::builder().build()), 400)
    };
}

impl FakeFanOut {
    pub(crate) fn new(kinesis: Arc<FakeKinesis>) -> Self {
        FakeFanOut {
            kinesis,
            state: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("fake lock")
    }

    /// New consumers stay CREATING for this many describe calls.
    pub(crate) fn creating_for(&self, describes: u32) {
        self.lock().creating_for = describes;
    }

    /// The next `n` registrations lose a race: another worker registered
    /// the name just before.
    pub(crate) fn register_races(&self, n: u32) {
        self.lock().register_races = n;
    }

    pub(crate) fn registrations(&self) -> u32 {
        self.lock().registrations
    }

    pub(crate) fn deregistrations(&self) -> u32 {
        self.lock().deregistrations
    }

    pub(crate) fn consumers(&self) -> usize {
        self.lock().consumers.len()
    }

    pub(crate) fn fail_subscribe(&self, fault: SubscribeFault) {
        self.lock().subscribe_faults.push_back(fault);
    }

    /// The next subscription fails after `events` events.
    pub(crate) fn fail_stream_after(&self, events: usize, fault: StreamFault) {
        self.lock().stream_faults.push_back((events, fault));
    }

    pub(crate) fn end_after_events(&self, n: usize) {
        self.lock().end_after_events = Some(n);
    }

    pub(crate) fn silent_end(&self) {
        self.lock().silent_end = true;
    }

    /// Every event from now on (of open subscriptions too) leaves its
    /// continuation out.
    pub(crate) fn no_continuation(&self) {
        self.lock().no_continuation = true;
    }

    /// Events carry one record each, and those before the shard's end
    /// announce `kids` (children of `parent`) while keeping their
    /// continuation: the end announced early, records still to come.
    pub(crate) fn children_before_the_end(&self, parent: &str, kids: &[String]) {
        let range = aws_sdk_kinesis::types::HashKeyRange::builder()
            .starting_hash_key("0")
            .ending_hash_key("1")
            .build()
            .expect("range");
        let children = (kids.iter())
            .map(|id| {
                aws_sdk_kinesis::types::ChildShard::builder()
                    .shard_id(id)
                    .parent_shards(parent)
                    .hash_key_range(range.clone())
                    .build()
                    .expect("child")
            })
            .collect();
        let mut s = self.lock();
        s.early_children = Some(children);
        s.records_per_event = Some(1);
    }

    pub(crate) fn restart_from_trim_horizon(&self) {
        self.lock().restart_from_trim_horizon = true;
    }

    /// When each subscription was made, and where it asked to start.
    pub(crate) fn subscriptions(&self) -> Vec<(tokio::time::Instant, IteratorStart)> {
        self.lock().subscriptions.clone()
    }

    pub(crate) fn active(&self) -> usize {
        self.lock().active.len()
    }

    pub(crate) fn events(&self) -> u64 {
        self.lock().events
    }

    /// The shard of each event sent so far, in the order they were read.
    pub(crate) fn event_shards(&self) -> Vec<String> {
        self.lock().event_shards.clone()
    }

    fn description(c: &FakeConsumer, stream_arn: &str) -> ConsumerDescription {
        ConsumerDescription::builder()
            .consumer_name(&c.name)
            .consumer_arn(&c.arn)
            .consumer_status(c.status.clone())
            .consumer_creation_timestamp(DateTime::from_secs(0))
            .stream_arn(stream_arn)
            .build()
            .expect("description")
    }

    /// The sequence number of the record before the iterator's position,
    /// or "0" at the start of the shard.
    async fn before(&self, iterator: &str) -> String {
        let mut parts = iterator.split('|');
        let (stream, shard, pos) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts
                .next()
                .and_then(|p| p.parse::<usize>().ok())
                .unwrap_or(0),
        );
        if pos == 0 {
            return "0".to_owned();
        }
        let out = self
            .kinesis
            .get_records(stream, &format!("{stream}|{shard}|{}", pos - 1), 1)
            .await
            .expect("record before");
        out.records
            .first()
            .map_or_else(|| "0".to_owned(), |r| r.sequence_number.clone())
    }
}

fn stream_of(arn: &str) -> &str {
    arn.rsplit('/').next().unwrap_or(arn)
}

#[async_trait]
impl FanOutApi for FakeFanOut {
    async fn describe_stream_summary(
        &self,
        stream: &str,
    ) -> Result<DescribeStreamSummaryOutput, SdkError<DescribeStreamSummaryError>> {
        let listed = self
            .kinesis
            .list_shards(
                ListShardsPage::First {
                    stream,
                    filter: None,
                },
                None,
            )
            .await;
        if listed.is_err() {
            return Err(rejected!(
                DescribeStreamSummaryError::ResourceNotFoundException
            ));
        }
        let summary = StreamDescriptionSummary::builder()
            .stream_name(stream)
            .stream_arn(format!(
                "arn:aws:kinesis:us-east-1:123456789012:stream/{stream}"
            ))
            .stream_status(StreamStatus::Active)
            .retention_period_hours(24)
            .stream_creation_timestamp(DateTime::from_secs(0))
            .set_enhanced_monitoring(Some(vec![]))
            .open_shard_count(1)
            .build()
            .expect("summary");
        Ok(DescribeStreamSummaryOutput::builder()
            .stream_description_summary(summary)
            .build())
    }

    async fn describe_stream_consumer(
        &self,
        stream_arn: &str,
        consumer_name: &str,
    ) -> Result<DescribeStreamConsumerOutput, SdkError<DescribeStreamConsumerError>> {
        let mut s = self.lock();
        let Some(c) = s
            .consumers
            .get_mut(&(stream_arn.to_owned(), consumer_name.to_owned()))
        else {
            return Err(rejected!(
                DescribeStreamConsumerError::ResourceNotFoundException
            ));
        };
        if c.status == ConsumerStatus::Creating {
            if c.creating_for == 0 {
                c.status = ConsumerStatus::Active;
            } else {
                c.creating_for -= 1;
            }
        }
        Ok(DescribeStreamConsumerOutput::builder()
            .consumer_description(Self::description(c, stream_arn))
            .build())
    }

    async fn register_stream_consumer(
        &self,
        stream_arn: &str,
        consumer_name: &str,
    ) -> Result<RegisterStreamConsumerOutput, SdkError<RegisterStreamConsumerError>> {
        let mut s = self.lock();
        let key = (stream_arn.to_owned(), consumer_name.to_owned());
        let race = s.register_races > 0;
        if s.consumers.contains_key(&key) && !race {
            return Err(rejected!(
                RegisterStreamConsumerError::ResourceInUseException
            ));
        }
        s.next_consumer += 1;
        let c = FakeConsumer {
            arn: format!("{stream_arn}/consumer/{consumer_name}:{}", s.next_consumer),
            name: consumer_name.to_owned(),
            status: ConsumerStatus::Creating,
            creating_for: s.creating_for,
        };
        let consumer = Consumer::builder()
            .consumer_name(&c.name)
            .consumer_arn(&c.arn)
            .consumer_status(ConsumerStatus::Creating)
            .consumer_creation_timestamp(DateTime::from_secs(0))
            .build()
            .expect("consumer");
        s.consumers.insert(key, c);
        if race {
            // Someone else's registration won: theirs exists, ours fails.
            s.register_races -= 1;
            return Err(rejected!(
                RegisterStreamConsumerError::ResourceInUseException
            ));
        }
        s.registrations += 1;
        Ok(RegisterStreamConsumerOutput::builder()
            .consumer(consumer)
            .build())
    }

    async fn deregister_stream_consumer(
        &self,
        consumer_arn: &str,
    ) -> Result<DeregisterStreamConsumerOutput, SdkError<DeregisterStreamConsumerError>> {
        let mut s = self.lock();
        let before = s.consumers.len();
        s.consumers.retain(|_, c| c.arn != consumer_arn);
        if s.consumers.len() == before {
            return Err(rejected!(
                DeregisterStreamConsumerError::ResourceNotFoundException
            ));
        }
        s.deregistrations += 1;
        Ok(DeregisterStreamConsumerOutput::builder().build())
    }

    async fn subscribe_to_shard(
        &self,
        consumer_arn: &str,
        shard_id: &str,
        start: &IteratorStart,
    ) -> Result<Box<dyn EventStream>, SdkError<SubscribeToShardError>> {
        let admitted = self.admit(consumer_arn, shard_id, start)?;
        let stream = stream_of(consumer_arn.split("/consumer/").next().unwrap_or_default());
        let iterator = self
            .first_iterator(stream, shard_id, &admitted.start)
            .await?;
        let continuation = self.before(&iterator).await;
        Ok(Box::new(FakeEvents {
            fake: self.clone(),
            shard_id: shard_id.to_owned(),
            iterator: Some(iterator),
            continuation,
            sent: 0,
            stream_fault: admitted.stream_fault,
            end_after: admitted.end_after,
            silent_end: admitted.silent_end,
            done: false,
        }))
    }
}

/// What a subscription the fake admitted is scripted to do.
#[derive(Debug)]
struct Admitted {
    stream_fault: Option<(usize, StreamFault)>,
    end_after: Option<usize>,
    silent_end: bool,
    /// Where it starts (TRIM_HORIZON if the script says so).
    start: IteratorStart,
}

impl FakeFanOut {
    /// Records a `SubscribeToShard` and admits it (the shard then has an
    /// active subscription), or fails it: as scripted, for an unknown
    /// consumer, or while another subscription to the shard is active.
    // The error is the one `subscribe_to_shard` answers with, as the SDK
    // types it; boxing it here would only be undone there.
    #[allow(clippy::result_large_err)]
    fn admit(
        &self,
        consumer_arn: &str,
        shard_id: &str,
        start: &IteratorStart,
    ) -> Result<Admitted, SdkError<SubscribeToShardError>> {
        let mut s = self.lock();
        s.subscriptions
            .push((tokio::time::Instant::now(), start.clone()));
        if let Some(fault) = s.subscribe_faults.pop_front() {
            return Err(subscribe_error(fault));
        }
        let known = s.consumers.values().any(|c| c.arn == consumer_arn);
        if !known {
            return Err(rejected!(SubscribeToShardError::ResourceNotFoundException));
        }
        if !s.active.insert(shard_id.to_owned()) {
            return Err(rejected!(SubscribeToShardError::ResourceInUseException));
        }
        let start = if std::mem::take(&mut s.restart_from_trim_horizon) {
            IteratorStart::TrimHorizon
        } else {
            start.clone()
        };
        Ok(Admitted {
            stream_fault: s.stream_faults.pop_front(),
            end_after: s.end_after_events,
            silent_end: s.silent_end,
            start,
        })
    }

    /// The admitted subscription's first iterator on the fake Kinesis; on
    /// failure the shard's subscription ends, with the error Kinesis gives
    /// for a bad start (`InvalidArgument`) or a missing shard.
    async fn first_iterator(
        &self,
        stream: &str,
        shard_id: &str,
        start: &IteratorStart,
    ) -> Result<String, SdkError<SubscribeToShardError>> {
        match self
            .kinesis
            .get_shard_iterator(stream, shard_id, start)
            .await
        {
            // A subscription past the last record starts there, whether
            // GetShardIterator answers with an iterator or none.
            Ok(out) => Ok(out
                .shard_iterator
                .unwrap_or_else(|| self.kinesis.end_iterator(stream, shard_id))),
            Err(e) => {
                self.lock().active.remove(shard_id);
                let invalid = matches!(
                    e.as_service_error(),
                    Some(GetShardIteratorError::InvalidArgumentException(_))
                );
                Err(if invalid {
                    rejected!(SubscribeToShardError::InvalidArgumentException)
                } else {
                    rejected!(SubscribeToShardError::ResourceNotFoundException)
                })
            }
        }
    }
}

/// The error a scripted `SubscribeToShard` failure answers.
fn subscribe_error(fault: SubscribeFault) -> SdkError<SubscribeToShardError> {
    match fault {
        SubscribeFault::InUse => rejected!(SubscribeToShardError::ResourceInUseException),
        SubscribeFault::LimitExceeded => rejected!(SubscribeToShardError::LimitExceededException),
        SubscribeFault::NotFound => rejected!(SubscribeToShardError::ResourceNotFoundException),
        SubscribeFault::InternalFailure => service(
            SubscribeToShardError::generic(
                ErrorMetadata::builder().code("InternalFailure").build(),
            ),
            500,
        ),
        SubscribeFault::AccessDenied => rejected!(SubscribeToShardError::AccessDeniedException),
    }
}

/// One subscription of the fake.
#[derive(Debug)]
struct FakeEvents {
    fake: FakeFanOut,
    shard_id: String,
    /// `None` once the shard's end was reached.
    iterator: Option<String>,
    continuation: String,
    sent: usize,
    stream_fault: Option<(usize, StreamFault)>,
    end_after: Option<usize>,
    silent_end: bool,
    done: bool,
}

impl Drop for FakeEvents {
    fn drop(&mut self) {
        self.fake.lock().active.remove(&self.shard_id);
    }
}

impl FakeEvents {
    fn event(
        &mut self,
        records: Vec<aws_sdk_kinesis::types::Record>,
        behind: i64,
        children: Option<Vec<aws_sdk_kinesis::types::ChildShard>>,
    ) -> SubscribeToShardEventStream {
        if let Some(last) = records.last() {
            self.continuation = last.sequence_number.clone();
        }
        self.sent += 1;
        {
            let mut s = self.fake.lock();
            s.events += 1;
            s.event_shards.push(self.shard_id.clone());
        }
        let (no_continuation, early) = {
            let s = self.fake.lock();
            (s.no_continuation, s.early_children.is_some() && !self.done)
        };
        let continuation = if (children.is_some() && !early) || no_continuation {
            String::new()
        } else {
            self.continuation.clone()
        };
        SubscribeToShardEventStream::SubscribeToShardEvent(
            SubscribeToShardEvent::builder()
                .set_records(Some(records))
                .continuation_sequence_number(continuation)
                .millis_behind_latest(behind)
                .set_child_shards(children)
                .build()
                .expect("event"),
        )
    }
}

#[async_trait]
impl EventStream for FakeEvents {
    async fn recv(&mut self) -> Result<Option<SubscribeToShardEventStream>, StreamError> {
        if self.done {
            return Ok(None);
        }
        if let Some((after, fault)) = self.stream_fault
            && self.sent >= after
        {
            self.done = true;
            return Err(match fault {
                StreamFault::InternalFailure => SdkError::service_error(
                    SubscribeToShardEventStreamError::InternalFailureException(
                        InternalFailureException::builder().build(),
                    ),
                    RawMessage::invalid(None),
                ),
                StreamFault::ConnectionReset => {
                    SdkError::response_error("connection reset", RawMessage::invalid(None))
                }
                StreamFault::KmsDisabled => SdkError::service_error(
                    SubscribeToShardEventStreamError::KmsDisabledException(
                        KmsDisabledException::builder().build(),
                    ),
                    RawMessage::invalid(None),
                ),
                StreamFault::Silent => std::future::pending().await,
            });
        }
        if self.end_after.is_some_and(|n| self.sent >= n) {
            self.done = true;
            return Ok(None);
        }
        let Some(iterator) = self.iterator.clone() else {
            // Past the end of a shard whose end was never announced: keep
            // sending empty events, as kinesis-mock does.
            tokio::time::sleep(HEARTBEAT).await;
            return Ok(Some(self.event(vec![], 0, None)));
        };
        let mut waited = Duration::ZERO;
        loop {
            let (limit, early) = {
                let s = self.fake.lock();
                (
                    s.records_per_event.unwrap_or(10_000),
                    s.early_children.clone(),
                )
            };
            let out = self
                .fake
                .kinesis
                .get_records("", &iterator, limit)
                .await
                .expect("get records");
            let at_end = out.next_shard_iterator.is_none();
            if !at_end && !out.records.is_empty() && early.is_some() {
                self.iterator = out.next_shard_iterator;
                return Ok(Some(self.event(out.records, 0, early)));
            }
            if !out.records.is_empty() || at_end || waited >= HEARTBEAT {
                let behind = out.millis_behind_latest.unwrap_or(0);
                self.iterator = out.next_shard_iterator;
                let children =
                    (at_end && !self.silent_end).then(|| out.child_shards.unwrap_or_default());
                if children.is_some() {
                    self.done = true;
                }
                return Ok(Some(self.event(out.records, behind, children)));
            }
            tokio::time::sleep(POLL).await;
            waited += POLL;
        }
    }
}
