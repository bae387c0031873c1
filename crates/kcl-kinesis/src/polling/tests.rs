use std::sync::Arc;
use std::time::Duration;

use kcl_core::source::{ShardReader, StartPosition};

use crate::calls::KinesisApi;
use crate::fake::FakeKinesis;
use crate::faults::{Call, Fault, FaultInjector, Faulty};
use crate::test_util::logs::warnings_while;
use crate::test_util::readers;
pub(super) use crate::test_util::readers::{
    STREAM, after, assert_elapsed, assert_lease_expiry_stops_the_reader, assert_reads_in_order,
    caught_up_past_three, expected, held, open, open_at, payloads, put_plain, read_n, read_plain,
    read_shard_end,
};
use crate::{KinesisShardSource, PollingConfig};

pub(super) fn polling() -> crate::PollingConfigBuilder {
    PollingConfig::builder()
        .max_records(10)
        .idle_time_between_reads(Duration::from_millis(200))
        .time_between_reads(Duration::from_millis(200))
        .retry_min_delay(Duration::from_millis(10))
        .retry_max_delay(Duration::from_millis(100))
}

/// A source that polls through a fault injector.
pub(super) type Setup = readers::Setup<FaultInjector>;

/// A setup whose source polls with `config`.
pub(super) fn setup_config(config: PollingConfig) -> Setup {
    let kinesis = Arc::new(FakeKinesis::default());
    let shard = kinesis.create_stream(STREAM, 1).remove(0);
    let faults = FaultInjector::new();
    let api: Arc<dyn KinesisApi> = Arc::new(Faulty {
        inner: Arc::clone(&kinesis) as Arc<dyn KinesisApi>,
        faults: faults.clone(),
    });
    Setup {
        source: KinesisShardSource::with_api(api, config),
        kinesis,
        shard,
        fake: faults,
    }
}

/// A setup with the tests' `polling()` config.
pub(super) fn setup() -> Setup {
    setup_with(|c| c)
}

impl readers::Retrieval for FaultInjector {
    fn setup() -> Setup {
        setup()
    }
}

/// A setup whose config is the tests' `polling()` changed by `configure`.
pub(super) fn setup_with(
    configure: impl FnOnce(crate::PollingConfigBuilder) -> crate::PollingConfigBuilder,
) -> Setup {
    setup_config(configure(polling()).build().expect("config"))
}

#[tokio::test(start_paused = true)]
async fn reads_every_record_in_order_across_batches() {
    let s = setup();
    let mut reader = assert_reads_in_order(&s, 0..25).await;
    // Caught up: an empty batch that says so.
    let batch = reader.next_batch().await.expect("empty batch");
    assert!(batch.records.is_empty());
    assert_eq!(batch.millis_behind_latest, Some(0));
    assert_eq!(batch.shard_end, None);
}

/// Puts the plain records `0..n`, reads the first batch (`0..10`) and
/// injects `faults` into the next `GetRecords` calls. A prefetch budget of
/// one batch keeps the fetcher from running ahead, so the faults land in
/// the middle of the shard. `configure` changes the tests' config further.
async fn faults_after_one_batch(
    n: usize,
    configure: impl FnOnce(crate::PollingConfigBuilder) -> crate::PollingConfigBuilder,
    faults: impl IntoIterator<Item = Fault>,
) -> (Setup, Box<dyn ShardReader>) {
    let s = setup_with(|c| configure(c.max_prefetch_records(10)));
    put_plain(&s, 0..n);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_plain(reader.as_mut(), 0..10).await;
    for fault in faults {
        s.fake.inject(Call::GetRecords, fault);
    }
    (s, reader)
}

#[tokio::test(start_paused = true)]
async fn expired_iterator_mid_read_loses_and_repeats_nothing() {
    let (s, mut reader) = faults_after_one_batch(45, |c| c, [Fault::ExpiredIterator]).await;
    assert_eq!(read_plain(reader.as_mut(), 10..45).await, 0);
    assert_eq!(s.fake.injected(Call::GetRecords), 1);
    let stats = s.source.stats();
    assert_eq!(stats.expired_iterators, 1);
    // One iterator to open, one to replace the expired one.
    assert_eq!(stats.get_shard_iterator_calls, 2);
}

#[tokio::test(start_paused = true)]
async fn expired_iterator_before_any_record_restarts_at_the_checkpoint() {
    let s = setup();
    let seqs = put_plain(&s, 0..6);
    s.fake.inject(Call::GetRecords, Fault::ExpiredIterator);
    let mut reader = open(&s, after(&seqs[2])).await;
    read_plain(reader.as_mut(), 3..6).await;
}

/// From `LATEST`, an iterator that expires before any record was fetched
/// (an outage longer than an iterator lives) is replaced at the time the
/// reader opened: what was written meanwhile is read, nothing from before.
/// A fresh `LATEST` skipped it.
#[tokio::test(start_paused = true)]
async fn expired_iterator_from_latest_reads_what_was_written_meanwhile() {
    let s = setup();
    put_plain(&s, 0..3);
    let mut reader = open(&s, StartPosition::Latest).await;
    s.fake.inject(Call::GetRecords, Fault::ExpiredIterator);
    put_plain(&s, 3..6);
    assert_eq!(read_plain(reader.as_mut(), 3..6).await, 0);
    assert_eq!(s.source.stats().expired_iterators, 1);
}

#[tokio::test(start_paused = true)]
async fn throttling_backs_off_retries_and_is_counted() {
    let throttles = [
        Fault::ProvisionedThroughputExceeded,
        Fault::ProvisionedThroughputExceeded,
        Fault::KmsThrottling,
        Fault::ProvisionedThroughputExceeded,
    ];
    let (s, mut reader) = faults_after_one_batch(30, |c| c, throttles).await;
    let started = tokio::time::Instant::now();
    let errors = read_plain(reader.as_mut(), 10..30).await;
    assert_eq!(errors, 0, "throttling is not an error for the consumer");
    let stats = s.source.stats();
    assert_eq!(stats.throttles, 4);
    assert_eq!(stats.retries, 4);
    // Backed off: at least the minimum delay each time.
    assert_elapsed(started, Duration::from_millis(40)..);
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_reported_after_the_limit_and_reading_goes_on() {
    let failures = [
        Fault::InternalFailure,
        Fault::Timeout,
        Fault::InternalFailure,
    ];
    let (s, mut reader) =
        faults_after_one_batch(20, |c| c.max_transient_retries(2), failures).await;
    let errors = read_plain(reader.as_mut(), 10..20).await;
    assert_eq!(errors, 1, "reported once, after max_transient_retries");
    assert_eq!(s.source.stats().retries, 2);
}

/// Past the limit, a failure is reported and the fetch waits the longest
/// retry pause before it tries again: it tried again at once, so with
/// `max_transient_retries(0)` every fast failure made a call at once and
/// only the consumer's own pause slowed the loop.
#[tokio::test(start_paused = true)]
async fn a_failure_past_the_limit_pauses_before_the_next_call() {
    let (s, mut reader) = faults_after_one_batch(20, |c| c.max_transient_retries(0), []).await;
    s.fake.fail_all(Call::GetRecords, Fault::InternalFailure);
    let started = tokio::time::Instant::now();
    for _ in 0..5 {
        reader.next_batch().await.expect_err("failing");
    }
    let max_delay = s.source.polling_config().retry.max_delay;
    assert!(
        started.elapsed() >= max_delay * 4,
        "5 failures reported within {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn lease_expiry_stops_the_fetcher_by_itself() {
    let s = setup();
    assert_lease_expiry_stops_the_reader(&s, async || {
        // The fetcher polls every 200 ms while the lease lasts, then stops.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let calls = s.kinesis.get_records_calls();
        assert!((8..=12).contains(&calls), "{calls} calls in 2 s");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(s.kinesis.get_records_calls(), calls);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn shard_end_names_the_children() {
    for report_children in [true, false] {
        let s = setup();
        put_plain(&s, 0..3);
        let kids = s.kinesis.split(STREAM, &s.shard, report_children);
        let mut reader = open(&s, StartPosition::TrimHorizon).await;
        read_shard_end(reader.as_mut(), &s.shard, &kids, 0..3).await;
        let lookups = s
            .kinesis
            .list_requests()
            .into_iter()
            .filter(|r| r.after_shard.as_deref() == Some(s.shard.as_str()))
            .count();
        assert_eq!(
            lookups,
            usize::from(!report_children),
            "report_children={report_children}"
        );
    }
}

/// A checkpoint stored without leading zeros (as the checkpointer writes
/// sequence numbers) resumes after its record, numbers compared by value
/// as Kinesis compares them: the fake compared text, against its padded
/// numbers, and started past the shard's last record.
#[tokio::test(start_paused = true)]
async fn a_checkpoint_without_leading_zeros_resumes_after_its_record() {
    let s = setup();
    let seqs = put_plain(&s, 0..5);
    let mut reader = open(&s, after(seqs[2].trim_start_matches('0'))).await;
    read_plain(reader.as_mut(), 3..5).await;
}

/// A closed shard whose GetShardIterator answers with no iterator (here
/// at LATEST, past its last record) is at its end: the reader delivers
/// the end with the children ListShards names, as the Java KCL takes it.
/// It failed the reader as fatal, every time the shard was taken, so its
/// children were never read.
#[tokio::test(start_paused = true)]
async fn no_iterator_for_a_closed_shard_is_its_end() {
    let s = setup();
    put_plain(&s, 0..3);
    let kids = s.kinesis.split(STREAM, &s.shard, true);
    s.kinesis.no_iterator_at_end(STREAM, &s.shard);
    let mut reader = open(&s, StartPosition::Latest).await;
    read_shard_end(reader.as_mut(), &s.shard, &kids, 3..3).await;
}

/// An open shard whose GetShardIterator answers with no iterator is not
/// taken for ended: ListShards names no child of it, so the reader reports
/// a retryable error and no end (which would have finished the shard, its
/// later records never read), and reads on: the records written later
/// come from the same reader, from where LATEST was when first asked.
/// (Its fetch task ended with the error, and the consumer gave the shard
/// back after a few reopens; asked again, LATEST never read them.) Nor is
/// it warned of as a closed shard without children.
#[test]
fn no_iterator_for_an_open_shard_ends_nothing() {
    let ((), warned) = warnings_while(NO_CHILDREN, no_iterator_for_an_open_shard());
    assert_eq!(warned, 0, "an open shard was warned of as closed");
}

/// The warning a closed shard without children gets.
const NO_CHILDREN: &str = "closed shard has no children";

async fn no_iterator_for_an_open_shard() {
    let s = setup();
    put_plain(&s, 0..3);
    s.kinesis.no_iterator_at_end(STREAM, &s.shard);
    let mut reader = open(&s, StartPosition::Latest).await;
    let err = reader.next_batch().await.expect_err("no batch, no end");
    assert!(err.is_retryable(), "{err:?}");
    put_plain(&s, 3..5);
    let read = async {
        let mut records = Vec::new();
        while records.len() < 2 {
            match reader.next_batch().await {
                Ok(batch) => {
                    assert!(batch.shard_end.is_none(), "the shard is open");
                    records.extend(batch.records);
                }
                Err(e) => assert!(e.is_retryable(), "{e:?}"),
            }
        }
        records
    };
    let records = tokio::time::timeout(Duration::from_secs(600), read)
        .await
        .expect("the later records");
    assert_eq!(payloads(&records), expected(3..5));
}

/// Looking a closed shard's children up while ListShards keeps failing
/// backs off between reports: it listed again at once after each.
#[tokio::test(start_paused = true)]
async fn a_failing_children_lookup_backs_off_between_reports() {
    let s = setup_with(|c| c.max_transient_retries(0));
    put_plain(&s, 0..3);
    s.kinesis.split(STREAM, &s.shard, false);
    s.fake.fail_all(Call::ListShards, Fault::InternalFailure);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let started = tokio::time::Instant::now();
    let mut errors = 0;
    while errors < 5 {
        match reader.next_batch().await {
            Err(e) => {
                assert!(e.is_retryable(), "{e:?}");
                errors += 1;
            }
            Ok(batch) => assert!(batch.shard_end.is_none(), "no children listed yet"),
        }
    }
    let first = s.source.polling_config().retry.min_delay;
    assert!(
        started.elapsed() >= first * 4,
        "5 failed lookups reported within {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn prefetch_is_bounded_in_records() {
    let s = setup_with(|c| c.max_prefetch_records(20));
    put_plain(&s, 0..100);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Two 10-record responses fill the budget; the fetcher then waits for
    // free budget before calling again, however long the consumer stalls.
    assert_eq!(s.kinesis.get_records_calls(), 2);
    read_plain(reader.as_mut(), 0..100).await;
}

#[tokio::test(start_paused = true)]
async fn prefetch_is_bounded_in_bytes() {
    let s = setup_with(|c| c.max_prefetch_bytes(3000));
    for i in 0..50 {
        s.kinesis.put(STREAM, &s.shard, "pk", vec![b'x'; 1000 + i]);
    }
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // A 10-record response (>10 kB) takes the whole 3 kB budget; the next
    // call waits for it to be handed out.
    assert_eq!(s.kinesis.get_records_calls(), 1);
    let (records, _) = read_n(reader.as_mut(), 50).await;
    assert_eq!(records.len(), 50);
}

#[tokio::test(start_paused = true)]
async fn iterators_that_keep_expiring_are_replaced_with_backoff() {
    let s = setup();
    put_plain(&s, 0..5);
    for _ in 0..3 {
        s.fake.inject(Call::GetRecords, Fault::ExpiredIterator);
    }
    let started = tokio::time::Instant::now();
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    assert_eq!(read_plain(reader.as_mut(), 0..5).await, 0);
    assert_eq!(s.source.stats().expired_iterators, 3);
    // No wait before the first replacement, then 20 ms and 40 ms.
    assert_elapsed(started, Duration::from_millis(60)..);
}
