//! What the polling and the fan-out reader tests share: the stream they
//! read, the fake Kinesis and source under test, leases, opening a
//! reader, and reading it until enough records arrived; and the tests
//! both readers pass alike, each run once per retrieval.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kcl_core::leases::{EndReason, LeaseHandle};
use kcl_core::metric_names::KINESIS_MILLIS_BEHIND_LATEST;
use kcl_core::source::{OpenShard, ShardReader, ShardSource, SourceError, StartPosition};
use kcl_core::test_util::metrics::Recorded;
use kcl_core::{Checkpoint, Lease, Record};
use rstest::rstest;

use super::fake::FakeKinesis;
use super::fanout::FakeFanOut;
use super::faults::FaultInjector;
use crate::calls::IteratorStart;
use crate::kpl::{UserRecord, aggregate};
use crate::{KinesisShardSource, SourceSnapshot};

/// The stream every reader test reads.
pub(crate) const STREAM: &str = "orders";

/// What a reader test reads, whichever retrieval it tests: the fake
/// Kinesis holding [`STREAM`], the source under test, the shard the test
/// reads, and the fake `T` the test drives the retrieval's own calls with.
pub(crate) struct Setup<T> {
    pub(crate) kinesis: Arc<FakeKinesis>,
    pub(crate) source: KinesisShardSource,
    pub(crate) shard: String,
    /// Polling's fault injector, or the fake fan-out API.
    pub(crate) fake: T,
}

/// A retrieval the shared reader tests run on, implemented by the fake
/// each suite drives it with: how the suite sets a source up, and what of
/// the retrieval's own work a test can see.
pub(crate) trait Retrieval: Sized {
    /// A setup with the suite's default config.
    fn setup() -> Setup<Self>;

    /// The subscriptions open at the service, for a retrieval that holds
    /// them (fan-out); `None` for one that holds nothing between its calls
    /// (polling).
    fn open_subscriptions(&self) -> Option<usize> {
        None
    }

    /// Where each subscription started, in order, for a retrieval that
    /// subscribes (fan-out); `None` for one that does not (polling).
    fn subscription_starts(&self) -> Option<Vec<IteratorStart>> {
        None
    }
}

/// Checks that the retrieval holds `n` subscriptions open, where it holds
/// any.
fn assert_subscriptions<T: Retrieval>(s: &Setup<T>, n: usize, why: &str) {
    if let Some(open) = s.fake.open_subscriptions() {
        assert_eq!(open, n, "{why}");
    }
}

/// Opens `shard` of [`STREAM`] at `position` under `lease`.
pub(crate) async fn open_at<T>(
    s: &Setup<T>,
    shard: &str,
    position: StartPosition,
    lease: LeaseHandle,
) -> Result<Box<dyn ShardReader>, SourceError> {
    s.source
        .open(OpenShard::new(STREAM, shard, position, lease))
        .await
}

/// Opens the test's shard at `position` under a lease that outlasts the
/// test.
pub(crate) async fn open<T>(s: &Setup<T>, position: StartPosition) -> Box<dyn ShardReader> {
    open_at(s, &s.shard, position, held(&s.shard))
        .await
        .expect("open")
}

/// The test's shard with records 0..3 put, opened at TRIM_HORIZON and
/// read past them: a reader caught up, for a test to go on from.
pub(crate) async fn caught_up_past_three<T>(s: &Setup<T>) -> Box<dyn ShardReader> {
    put_plain(s, 0..3);
    let mut reader = open(s, StartPosition::TrimHorizon).await;
    read_plain(reader.as_mut(), 0..3).await;
    reader
}

/// The calls to Kinesis a reader makes, whatever its retrieval: shard
/// iterators, records, consumer look-ups and subscriptions.
pub(crate) fn reader_calls(stats: &SourceSnapshot) -> u64 {
    stats.get_shard_iterator_calls
        + stats.get_records_calls
        + stats.consumer_calls
        + stats.subscribe_calls
}

/// Puts the plain records `range` on the test's shard, opens it at
/// TRIM_HORIZON and checks they are read in order, with their sequence
/// numbers and no error; returns the reader.
pub(crate) async fn assert_reads_in_order<T>(
    s: &Setup<T>,
    range: std::ops::Range<usize>,
) -> Box<dyn ShardReader> {
    let seqs = put_plain(s, range.clone());
    let mut reader = open(s, StartPosition::TrimHorizon).await;
    let (records, errors) = read_n(reader.as_mut(), range.len()).await;
    assert_eq!(errors, 0);
    assert_eq!(payloads(&records), expected(range));
    let got: Vec<&str> = records.iter().map(|r| r.sequence_number.as_str()).collect();
    assert_eq!(got, seqs.iter().map(String::as_str).collect::<Vec<_>>());
    reader
}

/// Reads records under a lease, then ends it: the next read fails with
/// `LeaseLost`, no call to Kinesis follows, the subscription (if any)
/// ends, and the reader stays stopped.
#[rstest]
#[case::polling(FaultInjector::setup())]
#[case::fan_out(FakeFanOut::setup())]
#[tokio::test(start_paused = true)]
async fn lease_loss_stops_the_reader<T: Retrieval>(#[case] s: Setup<T>) {
    put_plain(&s, 0..5);
    let lease = held(&s.shard);
    let mut reader = open_at(&s, &s.shard, StartPosition::TrimHorizon, lease.clone())
        .await
        .expect("open");
    read_n(reader.as_mut(), 5).await;
    assert_subscriptions(&s, 1, "reading");
    lease.end_for_test(EndReason::Lost);
    let calls = reader_calls(&s.source.stats());
    let err = reader.next_batch().await.expect_err("lease lost");
    assert!(matches!(err, SourceError::LeaseLost { .. }), "{err:?}");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_subscriptions(&s, 0, "the subscription ended with the lease");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        reader_calls(&s.source.stats()),
        calls,
        "no call after the lease ended"
    );
    assert!(
        reader.next_batch().await.is_err(),
        "the reader stays stopped"
    );
}

/// Reads records, then drops the reader: its task stops, so does its
/// subscription (if any), and it makes no call to Kinesis from then on.
#[rstest]
#[case::polling(FaultInjector::setup())]
#[case::fan_out(FakeFanOut::setup())]
#[tokio::test(start_paused = true)]
async fn dropping_the_reader_stops_its_task<T: Retrieval>(#[case] s: Setup<T>) {
    put_plain(&s, 0..3);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_n(reader.as_mut(), 3).await;
    assert_subscriptions(&s, 1, "reading");
    drop(reader);
    tokio::time::sleep(Duration::from_millis(10)).await;
    // With no subscription left and none made again, no event can come.
    assert_subscriptions(&s, 0, "the subscription ended with the reader");
    let calls = reader_calls(&s.source.stats());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        reader_calls(&s.source.stats()),
        calls,
        "no call after the drop"
    );
}

/// A reader that stops (dropped here; a lost lease or the shard's end stop
/// it the same way) leaves its shard's lag gauge at 0, not at the last
/// value it read: the shard is no longer read here, and a frozen lag would
/// hold the fleet's max() up long after the next owner caught up.
#[rstest]
#[case::polling(FaultInjector::setup())]
#[case::fan_out(FakeFanOut::setup())]
#[tokio::test(start_paused = true)]
async fn a_stopped_reader_leaves_no_lag_behind<T: Retrieval>(#[case] s: Setup<T>) {
    let recorded = Recorded::new();
    let _local = metrics::set_default_local_recorder(&recorded);
    let lag = || recorded.gauge(KINESIS_MILLIS_BEHIND_LATEST, &[("shard", s.shard.as_str())]);
    // Pages of 2 from 100 records: far behind for the whole test.
    put_plain(&s, 0..100);
    s.kinesis.cap_pages(STREAM, &s.shard, Some(2));
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_n(reader.as_mut(), 2).await;
    assert!(
        lag().is_some_and(|behind| behind > 0.0),
        "while reading: {:?}",
        lag()
    );
    drop(reader);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(lag(), Some(0.0), "once the reader stopped");
}

/// Reads records under a lease that runs out 2 s later and is never
/// renewed: `stopped` checks, given time past the expiry, that the
/// retrieval stopped by itself; the next read then fails with `LeaseLost`.
pub(crate) async fn assert_lease_expiry_stops_the_reader<T>(
    s: &Setup<T>,
    stopped: impl AsyncFnOnce(),
) {
    put_plain(s, 0..3);
    let lease = handle(&s.shard, Duration::from_secs(2));
    let mut reader = open_at(s, &s.shard, StartPosition::TrimHorizon, lease)
        .await
        .expect("open");
    read_n(reader.as_mut(), 3).await;
    stopped().await;
    let err = reader.next_batch().await.expect_err("lease expired");
    assert!(matches!(err, SourceError::LeaseLost { .. }), "{err:?}");
}

/// Opened at LATEST, a reader reads only what is written after it
/// opened, and subscribes (if it does) at LATEST.
#[rstest]
#[case::polling(FaultInjector::setup())]
#[case::fan_out(FakeFanOut::setup())]
#[tokio::test(start_paused = true)]
async fn latest_reads_only_new_records<T: Retrieval>(#[case] s: Setup<T>) {
    put_plain(&s, 0..5);
    let mut reader = open(&s, StartPosition::Latest).await;
    // A retrieval that subscribes does so after `open`: let it before the
    // new record is written. One that polls fixed LATEST within `open`.
    if s.fake.subscription_starts().is_some() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    s.kinesis.put(STREAM, &s.shard, "pk", "new");
    let (records, _) = read_n(reader.as_mut(), 1).await;
    assert_eq!(payloads(&records), ["new"]);
    if let Some(starts) = s.fake.subscription_starts() {
        assert_eq!(starts[0], IteratorStart::Latest, "{starts:?}");
    }
}

/// Opens the test's shard after a checkpoint the trim horizon has
/// passed: the reader resumes at the horizon (its last subscription, if
/// it subscribes, starts there), reads what is left without an error, and
/// counts the trimmed start.
#[rstest]
#[case::polling(FaultInjector::setup())]
#[case::fan_out(FakeFanOut::setup())]
#[tokio::test(start_paused = true)]
async fn a_trimmed_checkpoint_resumes_at_the_horizon_and_is_counted<T: Retrieval>(
    #[case] s: Setup<T>,
) {
    let seqs = put_plain(&s, 0..10);
    s.kinesis.trim(STREAM, &s.shard, 6);
    let mut reader = open(&s, after(&seqs[2])).await;
    assert_eq!(read_plain(reader.as_mut(), 6..10).await, 0);
    assert_eq!(s.source.stats().trimmed_starts, 1);
    if let Some(starts) = s.fake.subscription_starts() {
        assert_eq!(starts.last(), Some(&IteratorStart::TrimHorizon));
    }
}

/// Opening the test's shard under a lease that already ended fails with
/// `LeaseLost` before any call to Kinesis.
#[rstest]
#[case::polling(FaultInjector::setup())]
#[case::fan_out(FakeFanOut::setup())]
#[tokio::test(start_paused = true)]
async fn opening_with_a_lost_lease_makes_no_call<T>(#[case] s: Setup<T>) {
    let lease = held(&s.shard);
    lease.end_for_test(EndReason::Lost);
    let err = open_at(&s, &s.shard, StartPosition::TrimHorizon, lease)
        .await
        .expect_err("lease lost");
    assert!(matches!(err, SourceError::LeaseLost { .. }), "{err:?}");
    assert_eq!(reader_calls(&s.source.stats()), 0);
}

/// A split parent that aged out of retention: the first batch is its end,
/// with no record, naming its children, and the expired shard is counted.
#[rstest]
#[case::polling(FaultInjector::setup())]
#[case::fan_out(FakeFanOut::setup())]
#[tokio::test(start_paused = true)]
async fn an_expired_parent_ends_with_its_children<T>(#[case] s: Setup<T>) {
    put_plain(&s, 0..3);
    let kids = s.kinesis.split(STREAM, &s.shard, true);
    s.kinesis.expire(STREAM, &s.shard);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let batch = reader.next_batch().await.expect("the end");
    assert!(batch.records.is_empty(), "its records are gone");
    let children = batch.shard_end.expect("SHARD_END, not an error");
    let ids: Vec<&str> = children.iter().map(|c| c.shard_id.as_str()).collect();
    assert_eq!(ids, kids.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(s.source.stats().expired_shards, 1);
}

/// A lease on `shard`, valid for `valid_for`.
pub(crate) fn handle(shard: &str, valid_for: Duration) -> LeaseHandle {
    LeaseHandle::detached(Lease::new(shard, Checkpoint::TrimHorizon), valid_for)
}

/// A lease on `shard` that outlasts the test.
pub(crate) fn held(shard: &str) -> LeaseHandle {
    handle(shard, Duration::from_secs(3600))
}

/// Just after the whole record `seq`: where a reader resumes after a
/// checkpoint at it.
pub(crate) fn after(seq: &str) -> StartPosition {
    StartPosition::AfterCheckpoint {
        seq: seq.to_owned(),
        sub: 0,
    }
}

/// Checks that readers which nobody consumed from hold no more than the
/// worker-wide `budget`: what they fetched, counted apart from the
/// budget's own accounting (with nothing consumed, all of it is still
/// held), and the most the budget counted held at once.
pub(crate) fn assert_unconsumed_within(stats: &SourceSnapshot, budget: usize) {
    assert!(
        stats.bytes <= budget as u64,
        "{} payload bytes fetched with nothing consumed, over the budget {budget}",
        stats.bytes
    );
    assert!(
        stats.peak_buffered_bytes <= budget as u64,
        "peak {} over the budget {budget}",
        stats.peak_buffered_bytes
    );
}

/// Checks that the (paused) clock moved by an amount in `bounds` since
/// `since`.
pub(crate) fn assert_elapsed(
    since: tokio::time::Instant,
    bounds: impl std::ops::RangeBounds<Duration> + std::fmt::Debug,
) {
    let elapsed = since.elapsed();
    assert!(bounds.contains(&elapsed), "{elapsed:?}, not in {bounds:?}");
}

/// Reads until `n` records arrived; returns them and the retryable errors
/// seen on the way.
pub(crate) async fn read_n(reader: &mut dyn ShardReader, n: usize) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut errors = 0;
    let read = async {
        while records.len() < n {
            match reader.next_batch().await {
                Ok(batch) => records.extend(batch.records),
                Err(e) if e.is_retryable() => errors += 1,
                Err(e) => panic!("read failed: {e}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(600), read)
        .await
        .expect("read timed out");
    (records, errors)
}

/// Reads the tests' plain records `range`, checking they come in order;
/// returns the retryable errors seen on the way.
pub(crate) async fn read_plain(
    reader: &mut dyn ShardReader,
    range: std::ops::Range<usize>,
) -> usize {
    let (records, errors) = read_n(reader, range.len()).await;
    assert_eq!(payloads(&records), expected(range));
    errors
}

/// Reads the last batch of the split shard `parent`: it carries the plain
/// records `range` and names `kids` as the children, and a read after it
/// fails for good.
pub(crate) async fn read_shard_end(
    reader: &mut dyn ShardReader,
    parent: &str,
    kids: &[String],
    range: std::ops::Range<usize>,
) {
    let batch = reader.next_batch().await.expect("last batch");
    assert_eq!(payloads(&batch.records), expected(range));
    let children = batch.shard_end.expect("shard end");
    let ids: Vec<&str> = children.iter().map(|c| c.shard_id.as_str()).collect();
    assert_eq!(ids, kids.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(children.iter().all(|c| c.parent_shard_ids == [parent]));
    let err = reader.next_batch().await.expect_err("after the end");
    assert!(matches!(err, SourceError::Fatal { .. }));
}

/// The records' payloads, as text.
pub(crate) fn payloads(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8_lossy(&r.data).into_owned())
        .collect()
}

/// Puts the tests' plain records `range` on the test's shard (keys
/// `pk-{i}`, payloads `r{i}`); returns their sequence numbers.
pub(crate) fn put_plain<T>(s: &Setup<T>, range: std::ops::Range<usize>) -> Vec<String> {
    range
        .map(|i| {
            s.kinesis
                .put(STREAM, &s.shard, &format!("pk-{i}"), format!("r{i}"))
        })
        .collect()
}

/// The payloads the tests' plain records `range` carry.
pub(crate) fn expected(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("r{i}")).collect()
}

/// `n` user records for an aggregate: keys `pk-{i}`, payloads `sub {i}`.
pub(crate) fn sub_records(n: usize) -> Vec<UserRecord> {
    (0..n)
        .map(|i| UserRecord {
            partition_key: format!("pk-{i}"),
            explicit_hash_key: None,
            data: Bytes::from(format!("sub {i}")),
        })
        .collect()
}

/// Puts a plain record `before`, an aggregate of five [`sub_records`]
/// and a plain record `after` on the test's shard, and opens it after a
/// checkpoint inside the aggregate (after its sub-record 2): the reader
/// (its first subscription, if it subscribes, at the aggregate) delivers
/// the aggregate's last two sub-records, then the record after it.
#[rstest]
#[case::polling(FaultInjector::setup())]
#[case::fan_out(FakeFanOut::setup())]
#[tokio::test(start_paused = true)]
async fn resume_inside_an_aggregate_skips_the_done_sub_records<T: Retrieval>(#[case] s: Setup<T>) {
    let (fake, shard) = (&s.kinesis, s.shard.as_str());
    fake.put(STREAM, shard, "pk", "before");
    let subs = sub_records(5);
    let seq = fake.put(STREAM, shard, "pk-0", aggregate(&subs));
    fake.put(STREAM, shard, "pk", "after");
    let inside = StartPosition::AfterCheckpoint {
        seq: seq.clone(),
        sub: 2,
    };
    let mut reader = open(&s, inside).await;
    let (records, _) = read_n(reader.as_mut(), 3).await;
    assert_eq!(payloads(&records), ["sub 3", "sub 4", "after"]);
    assert_eq!(
        records
            .iter()
            .map(|r| (r.sequence_number.as_str(), r.sub_sequence_number))
            .take(2)
            .collect::<Vec<_>>(),
        [(seq.as_str(), 3), (seq.as_str(), 4)]
    );
    assert!(records[0].aggregated);
    if let Some(starts) = s.fake.subscription_starts() {
        assert_eq!(starts[0], IteratorStart::AtSequence(seq));
    }
}
