use std::sync::Arc;
use std::time::Duration;

use kcl_core::source::{OpenShard, ShardSource, SourceError, StartPosition};

use super::api::FanOutApi;
use super::{DeregisterConsumer, FanOutConfig, FanOutConfigBuilder};
use crate::KinesisShardSource;
use crate::calls::{IteratorStart, KinesisApi};
use crate::fake::FakeKinesis;
use crate::test_util::fanout::{FakeFanOut, StreamFault, SubscribeFault};
use crate::test_util::logs::warnings_while;
use crate::test_util::readers;
pub(super) use crate::test_util::readers::{
    STREAM, after, assert_elapsed, assert_lease_expiry_stops_the_reader, assert_reads_in_order,
    caught_up_past_three, expected, held, open, open_at, payloads, put_plain, read_n, read_plain,
    read_shard_end,
};

pub(super) fn config() -> FanOutConfigBuilder {
    FanOutConfig::builder()
        .consumer_name("app")
        .retry_min_delay(Duration::from_millis(10))
        .retry_max_delay(Duration::from_millis(100))
        .closed_shard_check_interval(None)
}

/// A source that subscribes through a fake fan-out API.
pub(super) type Setup = readers::Setup<FakeFanOut>;

/// A setup with the tests' `config()`.
pub(super) fn setup() -> Setup {
    setup_with(|c| c)
}

impl readers::Retrieval for FakeFanOut {
    fn setup() -> Setup {
        setup()
    }

    fn open_subscriptions(&self) -> Option<usize> {
        Some(self.active())
    }

    fn subscription_starts(&self) -> Option<Vec<IteratorStart>> {
        Some(self.subscriptions().into_iter().map(|(_, at)| at).collect())
    }
}

/// A setup whose config is the tests' `config()` changed by `configure`.
pub(super) fn setup_with(
    configure: impl FnOnce(FanOutConfigBuilder) -> FanOutConfigBuilder,
) -> Setup {
    setup_shards(configure(config()).build().expect("config"), 1)
}

/// Asserts that every subscription after the first continued after the
/// last event delivered.
fn assert_renewals_continue(s: &Setup) {
    let subscriptions = s.fake.subscriptions();
    assert!(
        subscriptions[1..]
            .iter()
            .all(|(_, start)| matches!(start, IteratorStart::AfterSequence(_))),
        "{subscriptions:?}"
    );
}

pub(super) fn setup_shards(config: FanOutConfig, shards: usize) -> Setup {
    let kinesis = Arc::new(FakeKinesis::default());
    let shard = kinesis.create_stream(STREAM, shards).remove(0);
    let fake = FakeFanOut::new(Arc::clone(&kinesis));
    let source = KinesisShardSource::with_fan_out(
        Arc::clone(&kinesis) as Arc<dyn KinesisApi>,
        Arc::new(fake.clone()),
        config,
    );
    Setup {
        kinesis,
        fake,
        source,
        shard,
    }
}

/// Puts records `r0` to `r{n-1}` one per event: each while the
/// subscription polls, 200 ms apart.
pub(super) async fn put_one_per_event(s: &Setup, n: usize) {
    for i in 0..n {
        s.kinesis.put(STREAM, &s.shard, "pk", format!("r{i}"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn reads_every_record_in_order_through_one_subscription() {
    let s = setup();
    let mut reader = assert_reads_in_order(&s, 0..25).await;
    // Records pushed later arrive on the same subscription.
    put_plain(&s, 25..30);
    read_plain(reader.as_mut(), 25..30).await;
    let stats = s.source.stats();
    assert_eq!((stats.subscribe_calls, stats.resubscribes), (1, 0));
    assert_eq!(stats.records, 30);
    assert!(stats.events >= 2, "{stats:?}");
    assert_eq!(s.fake.registrations(), 1);
}

#[tokio::test(start_paused = true)]
async fn concurrent_opens_register_the_consumer_once_and_later_sources_reuse_it() {
    let s = setup_shards(config().build().expect("config"), 3);
    let shards: Vec<String> = (0..3).map(|i| format!("shardId-{i:012}")).collect();
    s.fake.creating_for(3);
    let opens = shards
        .iter()
        .map(|shard| open_at(&s, shard, StartPosition::TrimHorizon, held(shard)));
    let readers = futures::future::join_all(opens).await;
    assert!(readers.iter().all(Result::is_ok));
    assert_eq!(s.fake.registrations(), 1);

    // Another worker (another source) finds the consumer and registers
    // nothing.
    let other = KinesisShardSource::with_fan_out(
        Arc::clone(&s.kinesis) as Arc<dyn KinesisApi>,
        Arc::new(s.fake.clone()),
        config().build().expect("config"),
    );
    let reader = other
        .open(OpenShard::new(
            STREAM,
            shards[0].clone(),
            StartPosition::TrimHorizon,
            held(&shards[0]),
        ))
        .await;
    assert!(reader.is_ok());
    assert_eq!(s.fake.registrations(), 1);
    assert_eq!(s.fake.consumers(), 1);
}

#[tokio::test(start_paused = true)]
async fn losing_the_registration_race_is_not_an_error() {
    let s = setup();
    s.fake.register_races(1);
    let _reader = caught_up_past_three(&s).await;
    assert_eq!(s.fake.registrations(), 0, "the other worker registered it");
    assert_eq!(s.fake.consumers(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_consumer_that_never_becomes_active_fails_open_with_a_clear_error() {
    let s = setup_with(|c| c.consumer_active_timeout(Duration::from_secs(5)));
    s.fake.creating_for(u32::MAX);
    let started = tokio::time::Instant::now();
    let err = open_at(&s, &s.shard, StartPosition::TrimHorizon, held(&s.shard))
        .await
        .expect_err("never active");
    let text = err.to_string();
    assert!(matches!(err, SourceError::Fatal { .. }), "{err:?}");
    assert!(
        text.contains("not ACTIVE") && text.contains("CREATING"),
        "{text}"
    );
    assert_elapsed(started, Duration::from_secs(5)..Duration::from_secs(8));
}

/// Opens waiting on one registration that never becomes ACTIVE all fail
/// with it, at its timeout: they failed one after the other, the third
/// after three timeouts.
#[tokio::test(start_paused = true)]
async fn concurrent_opens_share_a_failed_registration() {
    let s = setup_with(|c| c.consumer_active_timeout(Duration::from_secs(5)));
    s.fake.creating_for(u32::MAX);
    let started = tokio::time::Instant::now();
    let open_one = || async {
        let err = open_at(&s, &s.shard, StartPosition::TrimHorizon, held(&s.shard))
            .await
            .expect_err("never active");
        assert!(err.to_string().contains("not ACTIVE"), "{err}");
        started.elapsed()
    };
    let (a, b, c) = tokio::join!(open_one(), open_one(), open_one());
    for took in [a, b, c] {
        assert!(took < Duration::from_secs(8), "failed after {took:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_missing_stream_is_stream_not_found() {
    let s = setup();
    let err = s
        .source
        .open(OpenShard::new(
            "nope",
            "shardId-000000000000",
            StartPosition::TrimHorizon,
            held("shardId-000000000000"),
        ))
        .await
        .expect_err("missing");
    assert!(matches!(err, SourceError::StreamNotFound { stream } if stream == "nope"));
}

#[tokio::test(start_paused = true)]
async fn the_subscription_is_renewed_after_its_lifetime_without_loss_or_repeat() {
    let s = setup_with(|c| c.subscription_lifetime(Duration::from_secs(2)));
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let mut records = Vec::new();
    // Produce while reading, across several lifetimes.
    for round in 0..8 {
        put_plain(&s, round * 10..round * 10 + 10);
        let (got, errors) = read_n(reader.as_mut(), 10).await;
        assert_eq!(errors, 0);
        records.extend(got);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert_eq!(payloads(&records), expected(0..80));
    let stats = s.source.stats();
    assert!(stats.resubscribes >= 2, "{stats:?}");
    // Every renewal continues after the last event.
    assert_renewals_continue(&s);
    let subscriptions = s.fake.subscriptions();
    // At most one subscription per second.
    for pair in subscriptions.windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= Duration::from_secs(1),
            "{subscriptions:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_subscription_the_service_ends_is_renewed() {
    let s = setup();
    s.fake.end_after_events(1);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let mut records = Vec::new();
    for round in 0..4 {
        put_plain(&s, round * 5..round * 5 + 5);
        let (got, _) = read_n(reader.as_mut(), 5).await;
        records.extend(got);
    }
    assert_eq!(payloads(&records), expected(0..20));
    assert!(s.source.stats().resubscribes >= 3);
}

#[tokio::test(start_paused = true)]
async fn in_use_and_throttling_are_waited_out_without_errors() {
    let s = setup();
    for fault in [
        SubscribeFault::InUse,
        SubscribeFault::InUse,
        SubscribeFault::LimitExceeded,
        SubscribeFault::InUse,
    ] {
        s.fake.fail_subscribe(fault);
    }
    put_plain(&s, 0..5);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    assert_eq!(read_plain(reader.as_mut(), 0..5).await, 0);
    let stats = s.source.stats();
    assert_eq!((stats.subscribe_calls, stats.subscription_errors), (5, 4));
    assert_eq!(stats.throttles, 1);
    assert_eq!(stats.resubscribes, 0, "one subscription was ever opened");
}

#[tokio::test(start_paused = true)]
async fn stream_failures_resume_after_the_last_event_and_are_reported_past_the_limit() {
    let s = setup_with(|c| c.max_transient_retries(2));
    put_plain(&s, 0..10);
    // The first subscription fails after one event (a reset connection),
    // then two calls fail: three failures in a row exceed the limit of
    // two. The next subscription fails at once (an exception event), and
    // the one after works.
    s.fake.fail_stream_after(1, StreamFault::ConnectionReset);
    s.fake.fail_stream_after(0, StreamFault::InternalFailure);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    assert_eq!(read_plain(reader.as_mut(), 0..10).await, 0);
    for _ in 0..2 {
        s.fake.fail_subscribe(SubscribeFault::InternalFailure);
    }
    put_plain(&s, 10..20);
    let errors = read_plain(reader.as_mut(), 10..20).await;
    assert_eq!(errors, 1, "reported once, after max_transient_retries");
    let stats = s.source.stats();
    assert_eq!((stats.subscribe_calls, stats.subscription_errors), (5, 4));
    assert_renewals_continue(&s);
}

/// From `LATEST`, a subscription lost before its first event (the
/// connection died without a word) is made again at the time the first
/// was asked for: what was written meanwhile is read, nothing from before.
/// A new `LATEST` skipped it.
#[tokio::test(start_paused = true)]
async fn a_latest_subscription_lost_before_its_first_event_resumes_at_its_time() {
    let s = setup();
    put_plain(&s, 0..3);
    s.fake.fail_stream_after(0, StreamFault::Silent);
    let mut reader = open(&s, StartPosition::Latest).await;
    // The subscription is made after `open`.
    tokio::time::sleep(Duration::from_millis(500)).await;
    put_plain(&s, 3..6);
    read_plain(reader.as_mut(), 3..6).await;
    let starts: Vec<IteratorStart> = s
        .fake
        .subscriptions()
        .into_iter()
        .map(|(_, at)| at)
        .collect();
    assert_eq!(starts[0], IteratorStart::Latest, "{starts:?}");
    assert!(
        matches!(starts[1], IteratorStart::AtTimestamp(_)),
        "{starts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn records_sent_again_are_dropped() {
    let s = setup_with(|c| c.subscription_lifetime(Duration::from_secs(2)));
    put_plain(&s, 0..10);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_plain(reader.as_mut(), 0..10).await;
    // The next subscription starts over at TRIM_HORIZON (as kinesis-mock
    // does for a sequence number it does not know).
    s.fake.restart_from_trim_horizon();
    tokio::time::sleep(Duration::from_secs(3)).await;
    put_plain(&s, 10..15);
    read_plain(reader.as_mut(), 10..15).await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_consumer_is_fatal_and_looked_up_again_on_the_next_open() {
    let s = setup();
    put_plain(&s, 0..3);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_n(reader.as_mut(), 3).await;
    drop(reader);
    // Deregistered behind the reader's back: its ARN is no longer known.
    let stream_arn = format!("arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}");
    let arn = s
        .fake
        .describe_stream_consumer(&stream_arn, "app")
        .await
        .expect("described")
        .consumer_description
        .expect("consumer")
        .consumer_arn;
    s.fake
        .deregister_stream_consumer(&arn)
        .await
        .expect("deregistered");
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let err = loop {
        match reader.next_batch().await {
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    assert!(matches!(err, SourceError::Fatal { .. }), "{err:?}");
    let before = s.source.stats().consumer_calls;
    let _reader = open(&s, StartPosition::TrimHorizon).await;
    assert!(
        s.source.stats().consumer_calls > before,
        "the consumer is looked up again"
    );
    assert_eq!(s.fake.registrations(), 2, "and registered again");
}

#[tokio::test(start_paused = true)]
async fn lease_expiry_stops_the_task_by_itself() {
    let s = setup();
    assert_lease_expiry_stops_the_reader(&s, async || {
        // Empty events arrive every second; the first one after the lease
        // ran out stops the task.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(s.fake.active(), 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_stalled_processor_stops_the_event_stream() {
    let s = setup_with(|c| c.max_buffered_batches(2));
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    put_one_per_event(&s, 20).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Two batches wait in the channel, and one more event was read and
    // waits for room; the rest stay unread at the service.
    let events = s.fake.events();
    assert!(events <= 3, "{events} events read while nobody consumed");
    read_plain(reader.as_mut(), 0..20).await;
}

#[tokio::test(start_paused = true)]
async fn a_long_stall_lets_the_subscription_go_and_resumes_after_it() {
    let s = setup_with(|c| c.max_buffered_batches(1));
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    put_one_per_event(&s, 10).await;
    // Nobody reads: after the stall limit the subscription is let go, so
    // its unread data no longer holds the connection's window.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(s.fake.active(), 0, "the stalled subscription ended");
    let calls = s.source.stats().subscribe_calls;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        s.source.stats().subscribe_calls,
        calls,
        "no new subscription while there is no room"
    );
    put_plain(&s, 10..15);
    read_plain(reader.as_mut(), 0..15).await;
    assert!(s.source.stats().resubscribes >= 1);
}

#[tokio::test(start_paused = true)]
async fn the_byte_budget_bounds_what_is_buffered() {
    let s = setup_with(|c| c.max_buffered_bytes(3000));
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    for i in 0..5 {
        s.kinesis.put(STREAM, &s.shard, "pk", vec![b'x'; 2000 + i]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The first 2 kB event fits, the second waits for budget holding its
    // slot: two events read, the rest unread.
    let events = s.fake.events();
    assert!(events <= 2, "{events} events read");
    let (records, _) = read_n(reader.as_mut(), 5).await;
    assert_eq!(records.len(), 5);
}

/// An event larger than the reader's free bytes waits for them with its
/// subscription unread, which holds the connection's window: past the
/// stall limit the subscription is let go, the event's records kept and
/// delivered first once read.
#[tokio::test(start_paused = true)]
async fn a_stall_waiting_for_bytes_lets_the_subscription_go() {
    let s = setup_with(|c| c.max_buffered_bytes(3000));
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    for i in 0..3 {
        s.kinesis.put(STREAM, &s.shard, "pk", vec![b'x'; 2000 + i]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(s.fake.active(), 0, "the stalled subscription ended");
    let (records, _) = read_n(reader.as_mut(), 3).await;
    let sizes: Vec<usize> = records.iter().map(|r| r.data.len()).collect();
    assert_eq!(sizes, [2000, 2001, 2002]);
}

/// A lease that ends while an event waits for the reader's bytes stops the
/// subscription at once, not when the processor next reads.
#[tokio::test(start_paused = true)]
async fn a_lease_ending_while_an_event_waits_for_bytes_ends_the_subscription() {
    let s = setup_with(|c| c.max_buffered_bytes(3000));
    let lease = held(&s.shard);
    let _reader = open_at(&s, &s.shard, StartPosition::TrimHorizon, lease.clone())
        .await
        .expect("open");
    for i in 0..2 {
        s.kinesis.put(STREAM, &s.shard, "pk", vec![b'x'; 2000 + i]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(s.fake.active(), 1, "the second event waits for bytes");
    lease.end_for_test(kcl_core::leases::EndReason::Lost);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(s.fake.active(), 0, "no subscription past the lease");
}

#[tokio::test(start_paused = true)]
async fn records_before_the_resume_checkpoint_are_never_delivered() {
    let s = setup();
    let seqs = put_plain(&s, 0..6);
    // An endpoint that starts over at TRIM_HORIZON for the first
    // subscription still delivers nothing before the checkpoint.
    s.fake.restart_from_trim_horizon();
    let mut reader = open(&s, after(&seqs[2])).await;
    read_plain(reader.as_mut(), 3..6).await;
}

#[tokio::test(start_paused = true)]
async fn an_announced_shard_end_names_the_children() {
    let s = setup();
    put_plain(&s, 0..3);
    let kids = s.kinesis.split(STREAM, &s.shard, true);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_shard_end(reader.as_mut(), &s.shard, &kids, 0..3).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(s.fake.active(), 0);
}

/// Reads until the shard ends, within `limit`: the records are `range`'s
/// and the children `kids`.
async fn read_to_the_end(
    reader: &mut dyn kcl_core::source::ShardReader,
    limit: Duration,
    range: std::ops::Range<usize>,
    kids: &[String],
) {
    let read = async {
        let mut records = Vec::new();
        loop {
            let batch = reader.next_batch().await.expect("batch");
            records.extend(batch.records);
            if let Some(children) = batch.shard_end {
                return (records, children);
            }
        }
    };
    let (records, children) = tokio::time::timeout(limit, read)
        .await
        .expect("the shard ended");
    assert_eq!(payloads(&records), expected(range));
    let ids: Vec<String> = children.into_iter().map(|c| c.shard_id).collect();
    assert_eq!(ids, kids);
}

/// A shard of records 0..3 read to its end through a subscription that
/// never announces a shard's end, closed-shard checks every 2 s.
async fn caught_up_with_silent_ends() -> (Setup, Box<dyn kcl_core::source::ShardReader>) {
    let s = setup_with(|c| c.closed_shard_check_interval(Some(Duration::from_secs(2))));
    s.fake.silent_end();
    put_plain(&s, 0..3);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let (records, _) = read_n(reader.as_mut(), 3).await;
    assert_eq!(payloads(&records), expected(0..3));
    (s, reader)
}

#[tokio::test(start_paused = true)]
async fn an_unannounced_shard_end_is_found_by_the_closed_shard_check() {
    let (s, mut reader) = caught_up_with_silent_ends().await;
    // While the shard is open the checks find nothing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    put_plain(&s, 3..5);
    let kids = s.kinesis.split(STREAM, &s.shard, false);
    read_to_the_end(reader.as_mut(), Duration::from_secs(30), 3..5, &kids).await;
    let stats = s.source.stats();
    assert!(stats.get_records_calls >= 2, "{stats:?}");
}

/// The closed-shard check takes a GetShardIterator answered with no
/// iterator as the shard's end, its children from ListShards (as the Java
/// KCL takes it): it took that for an open shard, and the shard was never
/// finished.
#[tokio::test(start_paused = true)]
async fn the_closed_shard_check_takes_no_iterator_as_the_end() {
    let (s, mut reader) = caught_up_with_silent_ends().await;
    let kids = s.kinesis.split(STREAM, &s.shard, false);
    s.kinesis.no_iterator_at_end(STREAM, &s.shard);
    read_to_the_end(reader.as_mut(), Duration::from_secs(30), 3..3, &kids).await;
}

/// The closed-shard check does not take an open shard for ended when
/// GetShardIterator answers with no iterator: ListShards names no child,
/// and the records written after are delivered. Nor is it warned of as a
/// closed shard without children.
#[test]
fn the_closed_shard_check_ends_no_open_shard_without_an_iterator() {
    let text = "closed shard has no children";
    let ((), warned) = warnings_while(text, no_iterator_for_an_open_shard());
    assert_eq!(warned, 0, "an open shard was warned of as closed");
}

async fn no_iterator_for_an_open_shard() {
    let (s, mut reader) = caught_up_with_silent_ends().await;
    s.kinesis.no_iterator_at_end(STREAM, &s.shard);
    // Several checks find no iterator meanwhile.
    tokio::time::sleep(Duration::from_secs(7)).await;
    put_plain(&s, 3..5);
    let read = async {
        let mut records = Vec::new();
        while records.len() < 2 {
            let batch = reader.next_batch().await.expect("batch");
            assert!(batch.shard_end.is_none(), "the shard is open");
            records.extend(batch.records);
        }
        records
    };
    let records = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the later records");
    assert_eq!(payloads(&records), expected(3..5));
}

/// An event without a continuation sequence number and without children
/// (Kinesis never sends one on an open shard; another endpoint may) is no
/// shard end until the shard is found closed: the records after it are
/// delivered. It used to end the shard with no children, leaving its hash
/// range unread for good.
#[tokio::test(start_paused = true)]
async fn an_event_without_a_continuation_on_an_open_shard_ends_nothing() {
    let s = setup();
    s.fake.no_continuation();
    put_plain(&s, 0..3);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let read = async {
        let mut records = Vec::new();
        while records.len() < 5 {
            let batch = reader.next_batch().await.expect("batch");
            assert!(batch.shard_end.is_none(), "the shard is open");
            records.extend(batch.records);
            if records.len() == 3 {
                put_plain(&s, 3..5);
            }
        }
        records
    };
    let records = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("every record");
    assert_eq!(payloads(&records), expected(0..5));
}

/// A shard whose last events bring records but neither a continuation nor
/// children ends, with its children, once the closed-shard check finds it
/// closed after those records (not after the last continuation received,
/// which lies before them: checked from there it would look open for good).
#[tokio::test(start_paused = true)]
async fn a_closed_shard_whose_last_events_have_no_continuation_ends_after_their_records() {
    let s = setup();
    let mut reader = caught_up_past_three(&s).await;
    s.fake.no_continuation();
    put_plain(&s, 3..5);
    let kids = s.kinesis.split(STREAM, &s.shard, false);
    read_to_the_end(reader.as_mut(), Duration::from_secs(120), 3..5, &kids).await;
}

/// Children announced on an event that still has a continuation do not
/// end the shard (Kinesis announces them only on the last event, without
/// one; the Java KCL refuses such an event): the records after it are
/// read, then the end.
#[tokio::test(start_paused = true)]
async fn children_announced_before_the_last_record_do_not_end_the_shard() {
    let s = setup();
    let mut reader = caught_up_past_three(&s).await;
    put_plain(&s, 3..6);
    let kids = s.kinesis.split(STREAM, &s.shard, true);
    s.fake.children_before_the_end(&s.shard, &kids);
    read_to_the_end(reader.as_mut(), Duration::from_secs(120), 3..6, &kids).await;
}

/// An endpoint that leaves the continuation out of every event costs at
/// most one closed-shard check (two polling calls) per interval, not one
/// per event.
#[tokio::test(start_paused = true)]
async fn events_without_continuation_check_the_shard_at_most_once_per_interval() {
    let s = setup();
    let mut reader = caught_up_past_three(&s).await;
    s.fake.no_continuation();
    let before = s.source.stats().get_records_calls;
    for i in 3..23 {
        put_plain(&s, i..i + 1);
        read_plain(reader.as_mut(), i..i + 1).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // 20 events over about a minute: two or three checks (30 s apart).
    let checks = s.source.stats().get_records_calls - before;
    assert!((1..=3).contains(&checks), "{checks} checks for 20 events");
}

#[tokio::test(start_paused = true)]
async fn without_the_check_an_unannounced_end_is_never_reported() {
    let s = setup();
    s.fake.silent_end();
    put_plain(&s, 0..3);
    s.kinesis.split(STREAM, &s.shard, true);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let watch = async {
        loop {
            let batch = reader.next_batch().await.expect("batch");
            assert!(batch.shard_end.is_none());
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(20), watch)
            .await
            .is_err()
    );
    assert_eq!(s.source.stats().get_records_calls, 0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_deregisters_only_when_asked() {
    for (deregister, expected) in [
        (DeregisterConsumer::Never, 0),
        (DeregisterConsumer::OnShutdown, 1),
    ] {
        let s = setup_with(|c| c.deregister(deregister));
        let reader = open(&s, StartPosition::TrimHorizon).await;
        drop(reader);
        let done = s.source.shutdown().await.expect("shutdown");
        assert_eq!(done, expected, "{deregister:?}");
        assert_eq!(s.fake.deregistrations() as usize, expected);
        assert_eq!(s.fake.consumers(), 1 - expected);
    }
}

#[test]
fn a_fan_out_source_needs_a_consumer_name() {
    let client = crate::test_util::offline_client();
    let err = KinesisShardSource::builder(client.clone())
        .retrieval(crate::Retrieval::FanOut(FanOutConfig::default()))
        .build()
        .expect_err("no name");
    assert_eq!(err.field, "consumer_name");
    let source = KinesisShardSource::builder(client)
        .retrieval(crate::Retrieval::FanOut(config().build().expect("config")))
        .build()
        .expect("named");
    assert!(matches!(source.retrieval(), crate::Retrieval::FanOut(_)));
}
