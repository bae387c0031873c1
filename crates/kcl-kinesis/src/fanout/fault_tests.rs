//! What real Kinesis does to a subscription and the emulator never: a
//! connection that dies without a reset, KMS and access errors, stale
//! not-found answers for new shards. A shard past retention and a checkpoint
//! behind the trim horizon, which polling meets alike, are tested for
//! both readers in `test_util::readers`.

use std::time::Duration;

use kcl_core::source::StartPosition;
use tokio::time::Instant;

use super::reader::SUBSCRIBE_INTERVAL;
use super::tests::{
    STREAM, assert_elapsed, caught_up_past_three, held, open, open_at, payloads, put_plain, read_n,
    read_plain, setup, setup_with,
};
use crate::calls::IteratorStart;
use crate::test_util::fanout::{StreamFault, SubscribeFault};

#[tokio::test(start_paused = true)]
async fn a_silent_subscription_is_replaced_within_the_event_timeout() {
    let timeout = Duration::from_secs(5);
    let s = setup_with(|c| c.event_timeout(timeout));
    put_plain(&s, 0..5);
    // One event, then nothing: no records, no heartbeat, no error.
    s.fake.fail_stream_after(1, StreamFault::Silent);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_plain(reader.as_mut(), 0..5).await;
    put_plain(&s, 5..10);
    let waiting = Instant::now();
    assert_eq!(read_plain(reader.as_mut(), 5..10).await, 0);
    let stats = s.source.stats();
    assert_eq!((stats.silent_subscriptions, stats.resubscribes), (1, 1));
    // The bound: the event timeout, then at most the subscribe pacing.
    assert_elapsed(waiting, ..=timeout + SUBSCRIBE_INTERVAL);
    // The new subscription started right after the last record received.
    let subs = s.fake.subscriptions();
    assert!(
        matches!(&subs[1].1, IteratorStart::AfterSequence(_)),
        "{subs:?}"
    );
}

/// Subscriptions that the endpoint ends before their first event are
/// failures: counted, backed off, and reported to the reader once they
/// pass the transient limit. They used to pass for ordinary ends, the
/// shard resubscribed every second, silently, for good.
#[tokio::test(start_paused = true)]
async fn subscriptions_ended_before_any_event_are_reported_as_failures() {
    let s = setup();
    s.fake.end_after_events(0);
    put_plain(&s, 0..3);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let reported = tokio::time::timeout(Duration::from_secs(120), reader.next_batch())
        .await
        .expect("a failure reported");
    let e = reported.expect_err("no event, no batch");
    assert!(e.is_retryable(), "{e}");
    assert!(
        s.source.stats().subscription_errors > 10,
        "{:?}",
        s.source.stats()
    );
}

#[tokio::test(start_paused = true)]
async fn kms_and_access_errors_keep_the_shard_and_resubscribe() {
    // Fewer transient retries than failures: these do not count.
    let s = setup_with(|c| c.max_transient_retries(1));
    put_plain(&s, 0..3);
    s.fake.fail_subscribe(SubscribeFault::AccessDenied);
    s.fake.fail_subscribe(SubscribeFault::AccessDenied);
    s.fake.fail_stream_after(0, StreamFault::KmsDisabled);
    s.fake.fail_stream_after(0, StreamFault::KmsDisabled);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let errors = read_plain(reader.as_mut(), 0..3).await;
    assert_eq!(errors, 0, "nothing reported: the reader keeps the shard");
    assert_eq!(s.source.stats().access_denied, 4);
}

/// Subscriptions denied access are warned about once per interval (the
/// limit is process-wide, shared with every other denied call), not once
/// per subscription.
#[test]
fn denied_subscriptions_warn_once_per_interval() {
    let denied = async {
        let s = setup_with(|c| c.max_transient_retries(1));
        put_plain(&s, 0..3);
        for _ in 0..20 {
            s.fake.fail_subscribe(SubscribeFault::AccessDenied);
        }
        let mut reader = open(&s, StartPosition::TrimHorizon).await;
        read_plain(reader.as_mut(), 0..3).await;
        s.source.stats().access_denied
    };
    let (calls, warnings) = crate::test_util::logs::warnings_while("is denied", denied);
    assert_eq!(calls, 20);
    assert!(
        warnings <= 1,
        "{warnings} warnings for 20 denied subscriptions"
    );
}

/// A shard whose subscriptions are answered `ResourceInUse` for longer
/// than a takeover takes is warned about once (another application under
/// the same consumer name); a few such answers, a previous subscription
/// being torn down, are not.
#[test]
fn a_shard_held_by_another_subscriber_is_warned_about_once() {
    let held = |answers: usize| async move {
        let s = setup();
        put_plain(&s, 0..3);
        for _ in 0..answers {
            s.fake.fail_subscribe(SubscribeFault::InUse);
        }
        let mut reader = open(&s, StartPosition::TrimHorizon).await;
        let errors = read_plain(reader.as_mut(), 0..3).await;
        (errors, s.source.stats().subscription_errors)
    };
    let text = "has held the shard's subscription";
    let (answered, warnings) = crate::test_util::logs::warnings_while(text, held(3));
    assert_eq!((answered, warnings), ((0, 3), 0));
    let (answered, warnings) = crate::test_util::logs::warnings_while(text, held(40));
    assert_eq!(
        answered,
        (0, 40),
        "waited out, never reported to the reader"
    );
    assert_eq!(warnings, 1);
}

#[tokio::test(start_paused = true)]
async fn a_childs_stale_not_found_after_a_split_is_retried_and_the_consumer_kept() {
    let s = setup();
    put_plain(&s, 0..2);
    let kids = s.kinesis.split(STREAM, &s.shard, true);
    let child = kids[0].as_str();
    for i in 0..3 {
        s.kinesis
            .put(STREAM, child, &format!("pk-{i}"), format!("c{i}"));
    }
    // Right after the split the child answers ResourceNotFound, though
    // ListShards lists it and the consumer exists.
    for _ in 0..3 {
        s.fake.fail_subscribe(SubscribeFault::NotFound);
    }
    let mut reader = open_at(&s, child, StartPosition::TrimHorizon, held(child))
        .await
        .expect("open");
    let (records, errors) = read_n(reader.as_mut(), 3).await;
    assert_eq!(payloads(&records), ["c0", "c1", "c2"]);
    assert_eq!(errors, 3, "each stale answer is reported as retryable");
    assert_eq!(
        s.fake.registrations(),
        1,
        "the consumer is not registered again"
    );
    let calls = s.source.stats().consumer_calls;
    let _sibling = open_at(&s, &kids[1], StartPosition::TrimHorizon, held(&kids[1]))
        .await
        .expect("open");
    assert_eq!(
        s.source.stats().consumer_calls,
        calls,
        "the consumer's ARN was kept: the next open looks nothing up"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shard_too_new_for_the_listing_is_retried_not_taken_for_a_missing_consumer() {
    let s = setup();
    let shard = "shardId-000000000099";
    let mut reader = open_at(&s, shard, StartPosition::TrimHorizon, held(shard))
        .await
        .expect("open");
    let err = reader.next_batch().await.expect_err("not readable yet");
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(s.fake.registrations(), 1);
    assert_eq!(s.fake.consumers(), 1);
}

/// With room for one batch, a shard end whose children have to be looked
/// up while ListShards keeps failing still reaches the reader: the
/// failures are reported in the slot the last event held (given back
/// meanwhile), and the end follows once ListShards answers. The lookup
/// used to wait for good on room its own event held, and the reader on it.
#[tokio::test(start_paused = true)]
async fn a_shard_end_whose_children_listing_fails_reaches_a_one_batch_reader() {
    use std::sync::Arc;

    use crate::KinesisShardSource;
    use crate::calls::KinesisApi;
    use crate::test_util::fake::FakeKinesis;
    use crate::test_util::fanout::FakeFanOut;
    use crate::test_util::faults::{Call, Fault, FaultInjector, Faulty};

    let kinesis = Arc::new(FakeKinesis::default());
    let shard = kinesis.create_stream(STREAM, 1).remove(0);
    let fake = FakeFanOut::new(Arc::clone(&kinesis));
    let faults = FaultInjector::new();
    let api = Faulty {
        inner: Arc::clone(&kinesis) as Arc<dyn KinesisApi>,
        faults: faults.clone(),
    };
    let config = super::tests::config().max_buffered_batches(1);
    let source = KinesisShardSource::with_fan_out(
        Arc::new(api),
        Arc::new(fake.clone()),
        config.build().unwrap(),
    );
    let s = super::tests::Setup {
        kinesis,
        fake,
        source,
        shard,
    };
    let mut reader = caught_up_past_three(&s).await;
    // The shard ends without naming its children, and listing them fails
    // for 200 s: long enough for the lookup to give up and report.
    faults.fail_all(Call::ListShards, Fault::InternalFailure);
    let kids = s.kinesis.split(STREAM, &s.shard, false);
    let read = async {
        let mut reported = 0;
        loop {
            match reader.next_batch().await {
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    reported += 1;
                }
                Ok(batch) => {
                    if let Some(children) = batch.shard_end {
                        return (reported, children);
                    }
                }
            }
        }
    };
    let clear = async {
        tokio::time::sleep(Duration::from_secs(200)).await;
        faults.clear(Call::ListShards);
        std::future::pending::<()>().await
    };
    let (reported, children) = tokio::select! {
        done = tokio::time::timeout(Duration::from_secs(300), read) => done.expect("the shard end reached the reader"),
        () = clear => unreachable!(),
    };
    assert!(reported >= 1, "the failing lookup was reported");
    let ids: Vec<String> = children.into_iter().map(|c| c.shard_id).collect();
    assert_eq!(ids, kids);
}
