//! The mapping, aggregation, bounds, batching, levels and dimensions, and
//! the flush loop against a recording sink (no network).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use aws_sdk_cloudwatch::types::MetricDatum;
use kcl_core::metric_names::{
    self as names, KINESIS_THROTTLES, LEASE_RENEWAL_FAILURES, LEASE_RENEWALS, LEASES_ENDED,
    LEASES_HELD, MILLIS_BEHIND_LATEST, RECORDS_PROCESSED, SHARD_LAST_DELIVERY_TIMESTAMP,
};

use super::aggregate::{MAX_DATUMS_PER_REQUEST, MAX_REQUEST_BYTES, Stat, batches};
use super::publish::SendError;
use super::*;

/// Records every batch; fails the first calls with the errors queued
/// (`None`: a call that never answers).
#[derive(Debug, Default)]
struct FakeSink {
    batches: Mutex<Vec<(String, Vec<MetricDatum>)>>,
    failures: Mutex<VecDeque<Option<SendError>>>,
}

impl FakeSink {
    fn failing_with(errors: impl IntoIterator<Item = SendError>) -> Arc<Self> {
        Self::answering(errors.into_iter().map(Some))
    }

    fn answering(failures: impl IntoIterator<Item = Option<SendError>>) -> Arc<Self> {
        Arc::new(FakeSink {
            failures: Mutex::new(failures.into_iter().collect()),
            ..FakeSink::default()
        })
    }

    fn batches(&self) -> Vec<(String, Vec<MetricDatum>)> {
        self.batches.lock().expect("not poisoned").clone()
    }
}

#[async_trait::async_trait]
impl Sink for FakeSink {
    async fn put(&self, namespace: &str, data: Vec<MetricDatum>) -> Result<(), SendError> {
        let failure = self.failures.lock().expect("not poisoned").pop_front();
        match failure {
            Some(Some(error)) => return Err(error),
            Some(None) => std::future::pending().await,
            None => {}
        }
        self.batches
            .lock()
            .expect("not poisoned")
            .push((namespace.to_owned(), data));
        Ok(())
    }
}

/// The publisher's `run_until` in a task of its own, and what stops it.
fn run_until_stopped(
    publisher: &CloudWatchPublisher,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let publisher = publisher.clone();
    let run = tokio::spawn(async move {
        publisher
            .run_until(async {
                let _ = stopped.await;
            })
            .await;
    });
    (stop, run)
}

/// Counts `n` records processed on shard "shardId-1" of stream "s".
fn records_processed(recorder: &CloudWatchRecorder, n: u64) {
    metrics::with_local_recorder(recorder, || {
        metrics::counter!(RECORDS_PROCESSED, "stream" => "s", "shard" => "shardId-1").increment(n);
    });
}

/// Counts one record processed on shard "shardId-1" of stream "s".
fn one_record_processed(recorder: &CloudWatchRecorder) {
    records_processed(recorder, 1);
}

fn build(
    metrics: CloudWatchMetrics,
    sink: Arc<FakeSink>,
    several_streams: bool,
) -> (CloudWatchRecorder, CloudWatchPublisher) {
    metrics
        .build_with("orders-app".into(), sink, several_streams)
        .expect("valid settings")
}

fn recorder(metrics: CloudWatchMetrics) -> CloudWatchRecorder {
    build(metrics, Arc::default(), false).0
}

/// What a flush would publish, as `Name{Dim=value,...}` → statistic set.
fn drained(recorder: &CloudWatchRecorder) -> BTreeMap<String, Stat> {
    recorder
        .buffer
        .drain()
        .into_iter()
        .map(|(key, stat)| {
            let dims: Vec<String> = key
                .dimensions
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            (format!("{}{{{}}}", key.name, dims.join(",")), stat)
        })
        .collect()
}

fn stat(count: f64, sum: f64, min: f64, max: f64) -> Stat {
    Stat {
        count,
        sum,
        min,
        max,
    }
}

fn names_of(map: &BTreeMap<String, Stat>) -> Vec<&str> {
    map.keys().map(String::as_str).collect()
}

#[test]
fn records_processed_becomes_the_java_metric_with_its_operation_and_shard() {
    let recorder = recorder(CloudWatchMetrics::new());
    metrics::with_local_recorder(&recorder, || {
        let labels = [("stream", "orders"), ("shard", "shardId-000000000001")];
        metrics::counter!(RECORDS_PROCESSED, &labels).increment(3);
        metrics::counter!(RECORDS_PROCESSED, &labels).increment(4);
    });
    let published = drained(&recorder);
    assert_eq!(
        published,
        BTreeMap::from([(
            "RecordsProcessed{Operation=ProcessTask,ShardId=shardId-000000000001}".to_owned(),
            stat(2.0, 7.0, 3.0, 4.0)
        )]),
        "one datum per batch, as the Java KCL's ProcessTask adds; no StreamId for one stream"
    );
    assert!(drained(&recorder).is_empty(), "a flush takes what it sends");
}

#[test]
fn lag_goes_to_the_shard_and_to_the_application_tracker() {
    let recorder = recorder(CloudWatchMetrics::new());
    metrics::with_local_recorder(&recorder, || {
        metrics::gauge!(MILLIS_BEHIND_LATEST, "stream" => "orders", "shard" => "shardId-1")
            .set(500.0);
        metrics::gauge!(MILLIS_BEHIND_LATEST, "stream" => "orders", "shard" => "shardId-2")
            .set(2000.0);
    });
    let published = drained(&recorder);
    assert_eq!(
        published.get("MillisBehindLatest{Operation=ApplicationTracker}"),
        Some(&stat(2.0, 2500.0, 500.0, 2000.0)),
        "{published:?}"
    );
    assert_eq!(
        published.get("MillisBehindLatest{Operation=ProcessTask,ShardId=shardId-2}"),
        Some(&stat(1.0, 2000.0, 2000.0, 2000.0))
    );
    assert_eq!(published.len(), 3, "{published:?}");
}

#[test]
fn success_metrics_count_one_per_success_and_zero_per_failure() {
    let recorder = recorder(CloudWatchMetrics::new());
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!(LEASE_RENEWALS, "worker" => "w-1").increment(3);
        metrics::counter!(LEASE_RENEWAL_FAILURES, "worker" => "w-1").increment(1);
    });
    let published = drained(&recorder);
    assert_eq!(
        published.get("RenewLease.Success{Operation=RenewAllLeases,WorkerIdentifier=w-1}"),
        Some(&stat(4.0, 3.0, 0.0, 1.0)),
        "{published:?}"
    );
}

#[test]
fn lost_leases_count_only_leases_lost_or_fenced_and_the_reasons_keep_their_own_name() {
    let recorder = recorder(CloudWatchMetrics::new());
    metrics::with_local_recorder(&recorder, || {
        for (reason, n) in [("lost", 1), ("fenced", 2), ("released", 5)] {
            metrics::counter!(LEASES_ENDED, "worker" => "w-1", "reason" => reason).increment(n);
        }
    });
    let published = drained(&recorder);
    assert_eq!(
        published.get("LostLeases{Operation=RenewAllLeases,WorkerIdentifier=w-1}"),
        Some(&stat(2.0, 3.0, 1.0, 2.0))
    );
    assert_eq!(
        published.get("kcl_leases_ended_total{WorkerIdentifier=w-1,reason=released}"),
        Some(&stat(1.0, 5.0, 5.0, 5.0)),
        "{published:?}"
    );
    assert_eq!(published.len(), 4, "{published:?}");
}

#[test]
fn each_level_publishes_what_the_java_kcl_publishes_at_it() {
    let record = |recorder: &CloudWatchRecorder| {
        metrics::with_local_recorder(recorder, || {
            metrics::counter!(RECORDS_PROCESSED, "stream" => "s", "shard" => "shardId-1")
                .increment(1);
            metrics::counter!(LEASE_RENEWALS, "worker" => "w").increment(1);
            metrics::counter!(KINESIS_THROTTLES, "stream" => "s", "call" => "get_records")
                .increment(1);
            metrics::gauge!(SHARD_LAST_DELIVERY_TIMESTAMP, "stream" => "s", "shard" => "shardId-1")
                .set(1.7e9);
            metrics::counter!("app_orders_total", "region" => "eu").increment(2);
        });
    };
    let detailed = recorder(CloudWatchMetrics::new());
    record(&detailed);
    assert_eq!(
        names_of(&drained(&detailed)),
        [
            "RecordsProcessed{Operation=ProcessTask,ShardId=shardId-1}",
            "RenewLease.Success{Operation=RenewAllLeases,WorkerIdentifier=w}",
            "app_orders_total{region=eu}",
            "kcl_kinesis_throttles_total{call=get_records}",
        ],
        "everything but the timestamps; the application's own metric as it is"
    );
    let summary = recorder(CloudWatchMetrics::new().level(MetricsLevel::Summary));
    record(&summary);
    assert_eq!(
        names_of(&drained(&summary)),
        [
            "RecordsProcessed{Operation=ProcessTask,ShardId=shardId-1}",
            "app_orders_total{region=eu}",
        ]
    );
    let none = recorder(CloudWatchMetrics::new().level(MetricsLevel::None));
    record(&none);
    assert!(drained(&none).is_empty());
}

#[test]
fn a_dimension_turned_off_merges_the_series_it_told_apart() {
    let merged =
        recorder(CloudWatchMetrics::new().enabled_dimensions([Dimension::WorkerIdentifier]));
    metrics::with_local_recorder(&merged, || {
        metrics::counter!(RECORDS_PROCESSED, "stream" => "s", "shard" => "shardId-1").increment(2);
        metrics::counter!(RECORDS_PROCESSED, "stream" => "s", "shard" => "shardId-2").increment(5);
        metrics::gauge!(LEASES_HELD, "worker" => "w-1").set(2.0);
    });
    assert_eq!(
        drained(&merged),
        BTreeMap::from([
            (
                "CurrentLeases{Operation=RenewAllLeases,WorkerIdentifier=w-1}".to_owned(),
                stat(1.0, 2.0, 2.0, 2.0)
            ),
            (
                "RecordsProcessed{Operation=ProcessTask}".to_owned(),
                stat(2.0, 7.0, 2.0, 5.0)
            ),
        ])
    );
    let without_worker = recorder(CloudWatchMetrics::new().enabled_dimensions([]));
    metrics::with_local_recorder(&without_worker, || {
        metrics::gauge!(LEASES_HELD, "worker" => "w-1").set(2.0);
    });
    assert_eq!(
        names_of(&drained(&without_worker)),
        ["CurrentLeases{Operation=RenewAllLeases}"],
        "Operation cannot be turned off"
    );
}

#[test]
fn stream_id_is_a_dimension_for_a_worker_of_several_streams_only() {
    let labels = [("stream", "orders"), ("shard", "shardId-1")];
    let (several, _) = build(CloudWatchMetrics::new(), Arc::default(), true);
    let (one, _) = build(CloudWatchMetrics::new(), Arc::default(), false);
    let (forced, _) = build(
        CloudWatchMetrics::new().stream_dimension(true),
        Arc::default(),
        false,
    );
    for recorder in [&several, &one, &forced] {
        metrics::with_local_recorder(recorder, || {
            metrics::counter!(RECORDS_PROCESSED, &labels).increment(1);
        });
    }
    let with = ["RecordsProcessed{Operation=ProcessTask,ShardId=shardId-1,StreamId=orders}"];
    assert_eq!(names_of(&drained(&several)), with);
    assert_eq!(names_of(&drained(&forced)), with);
    assert_eq!(
        names_of(&drained(&one)),
        ["RecordsProcessed{Operation=ProcessTask,ShardId=shardId-1}"]
    );
}

#[test]
fn a_gauge_is_published_again_until_a_per_shard_gauge_goes_back_to_zero() {
    let recorder = recorder(CloudWatchMetrics::new().level(MetricsLevel::Summary));
    let shard = [("stream", "s"), ("shard", "shardId-1")];
    metrics::with_local_recorder(&recorder, || {
        metrics::gauge!(LEASES_HELD, "worker" => "w").set(2.0);
        metrics::gauge!(MILLIS_BEHIND_LATEST, &shard).set(40.0);
    });
    let lag = "MillisBehindLatest{Operation=ProcessTask,ShardId=shardId-1}";
    let held = "CurrentLeases{Operation=RenewAllLeases,WorkerIdentifier=w}";
    assert_eq!(
        drained(&recorder).get(lag),
        Some(&stat(1.0, 40.0, 40.0, 40.0))
    );
    // No new value: the last one again, once per flush.
    let again = drained(&recorder);
    assert_eq!(again.get(lag), Some(&stat(1.0, 40.0, 40.0, 40.0)));
    assert_eq!(again.get(held), Some(&stat(1.0, 2.0, 2.0, 2.0)));
    // The worker stops consuming the shard: 0 once, then nothing.
    metrics::with_local_recorder(&recorder, || {
        metrics::gauge!(MILLIS_BEHIND_LATEST, &shard).set(0.0);
        metrics::gauge!(LEASES_HELD, "worker" => "w").set(0.0);
    });
    assert_eq!(drained(&recorder).get(lag), Some(&stat(1.0, 0.0, 0.0, 0.0)));
    assert_eq!(recorder.buffer.gauge_count(), 2);
    let later = drained(&recorder);
    assert_eq!(later.get(lag), None, "{later:?}");
    assert_eq!(
        later.get(held),
        Some(&stat(1.0, 0.0, 0.0, 0.0)),
        "a worker's lease count stays published at 0"
    );
    assert_eq!(
        recorder.buffer.gauge_count(),
        1,
        "the shard's gauge is forgotten"
    );
}

#[test]
fn a_full_buffer_drops_and_counts_samples_of_new_metrics_and_keeps_merging_known_ones() {
    let (recorder, publisher) = build(
        CloudWatchMetrics::new()
            .level(MetricsLevel::Summary)
            .max_buffered_datums(3),
        Arc::default(),
        false,
    );
    metrics::with_local_recorder(&recorder, || {
        for shard in 1..=5 {
            metrics::counter!(RECORDS_PROCESSED, "stream" => "s", "shard" => format!("shardId-{shard}"))
                .increment(1);
        }
        metrics::counter!(RECORDS_PROCESSED, "stream" => "s", "shard" => "shardId-1").increment(9);
        metrics::histogram!(names::RECORDS_PER_BATCH, "stream" => "s", "shard" => "shardId-1")
            .record(f64::NAN);
    });
    assert_eq!(
        publisher.stats().samples_dropped,
        2,
        "shards 4 and 5 found the buffer full (the batch-size histogram is not published at SUMMARY)"
    );
    let published = drained(&recorder);
    assert_eq!(published.len(), 3);
    assert_eq!(
        published.get("RecordsProcessed{Operation=ProcessTask,ShardId=shardId-1}"),
        Some(&stat(2.0, 10.0, 1.0, 9.0))
    );
    // The flush emptied the buffer: room again.
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!(RECORDS_PROCESSED, "stream" => "s", "shard" => "shardId-5").increment(1);
        metrics::gauge!(MILLIS_BEHIND_LATEST, "stream" => "s", "shard" => "shardId-5")
            .set(f64::INFINITY);
    });
    assert_eq!(drained(&recorder).len(), 1);
    assert_eq!(
        publisher.stats().samples_dropped,
        4,
        "a value that is not finite is dropped and counted (two targets)"
    );
}

#[test]
fn a_full_gauge_table_drops_and_counts_new_gauges() {
    let (recorder, publisher) = build(
        CloudWatchMetrics::new().max_buffered_datums(2),
        Arc::default(),
        false,
    );
    metrics::with_local_recorder(&recorder, || {
        for worker in ["a", "b", "c"] {
            metrics::gauge!(LEASES_HELD, "worker" => worker).set(1.0);
        }
    });
    assert_eq!(recorder.buffer.gauge_count(), 2);
    assert_eq!(publisher.stats().samples_dropped, 1);
}

#[test]
fn batches_hold_at_most_1000_data_and_stay_under_the_request_size() {
    let counts = |sizes: Vec<usize>| -> Vec<usize> {
        batches(sizes.into_iter().map(|s| ((), s)).collect())
            .iter()
            .map(Vec::len)
            .collect()
    };
    assert_eq!(MAX_DATUMS_PER_REQUEST, 1000);
    assert_eq!(counts(vec![500; 2500]), [1000, 1000, 500]);
    assert_eq!(counts(vec![500; 1000]), [1000]);
    assert_eq!(counts(vec![500; 1001]), [1000, 1]);
    let third = MAX_REQUEST_BYTES / 3;
    assert_eq!(counts(vec![third; 7]), [3, 3, 1]);
    assert_eq!(
        counts(vec![MAX_REQUEST_BYTES + 1, 10]),
        [1, 1],
        "an oversize datum goes alone"
    );
    assert!(counts(Vec::new()).is_empty());
    // In order, nothing lost.
    let items: Vec<(usize, usize)> = (0..2100).map(|i| (i, 400)).collect();
    let flat: Vec<usize> = batches(items).into_iter().flatten().collect();
    assert_eq!(flat, (0..2100).collect::<Vec<_>>());
}

#[test]
fn the_size_estimate_keeps_the_largest_possible_data_under_the_request_limit() {
    // 30 dimensions of 1024 characters: the largest datum CloudWatch takes.
    let key = mapping::DatumKey {
        name: "m".repeat(255).into(),
        dimensions: (0..30)
            .map(|i| (format!("dimension-{i}").into(), "v".repeat(1024)))
            .collect(),
        unit: UnitKey::Count,
    };
    let size = aggregate::estimated_size(&key);
    assert!(size > 30 * 1024, "{size}");
    let per_request = batches(vec![((), size); 100])[0].len();
    assert!(
        per_request * size <= MAX_REQUEST_BYTES && per_request >= 1,
        "{per_request} × {size}"
    );
}

#[test]
fn a_datum_carries_the_statistic_set_dimensions_and_unit() {
    let key = mapping::DatumKey {
        name: "DataBytesProcessed".into(),
        dimensions: vec![
            ("Operation".into(), "ProcessTask".into()),
            ("ShardId".into(), "shardId-1".into()),
        ],
        unit: UnitKey::Bytes,
    };
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let datum = aggregate::datum(&key, &stat(2.0, 30.0, 10.0, 20.0), at);
    assert_eq!(datum.metric_name(), Some("DataBytesProcessed"));
    let dims: Vec<(&str, &str)> = datum
        .dimensions()
        .iter()
        .map(|d| (d.name().unwrap_or_default(), d.value().unwrap_or_default()))
        .collect();
    assert_eq!(
        dims,
        [("Operation", "ProcessTask"), ("ShardId", "shardId-1")]
    );
    let set = datum.statistic_values().expect("a statistic set");
    assert_eq!(
        (set.sample_count(), set.sum(), set.minimum(), set.maximum()),
        (Some(2.0), Some(30.0), Some(10.0), Some(20.0))
    );
    assert_eq!(
        datum.unit(),
        Some(&aws_sdk_cloudwatch::types::StandardUnit::Bytes)
    );
    assert_eq!(datum.timestamp().map(|t| t.secs()), Some(1_700_000_000));
    assert!(datum.value().is_none() && datum.values().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_flush_splits_at_1000_data_and_retries_a_throttled_request() {
    let sink = FakeSink::failing_with([SendError::Retryable("Throttling".into())]);
    let (recorder, publisher) = build(CloudWatchMetrics::new(), Arc::clone(&sink), false);
    metrics::with_local_recorder(&recorder, || {
        for shard in 0..1500 {
            metrics::counter!(RECORDS_PROCESSED, "stream" => "s", "shard" => format!("shardId-{shard:04}"))
                .increment(1);
        }
    });
    publisher.flush().await;
    let batches = sink.batches();
    let sizes: Vec<usize> = batches.iter().map(|(_, b)| b.len()).collect();
    assert_eq!(sizes, [1000, 500]);
    assert!(batches.iter().all(|(ns, _)| ns == "orders-app"));
    let stats = publisher.stats();
    assert_eq!(
        (
            stats.requests,
            stats.datums_sent,
            stats.retries,
            stats.datums_failed
        ),
        (2, 1500, 1, 0)
    );
    publisher.flush().await;
    assert_eq!(sink.batches().len(), 2, "nothing new, no request");
}

#[tokio::test(start_paused = true)]
async fn a_request_refused_for_good_or_throttled_too_long_is_dropped_and_counted() {
    let sink = FakeSink::failing_with(
        std::iter::once(SendError::Fatal("InvalidParameterValue".into())).chain(
            std::iter::repeat_n(
                SendError::Retryable("Throttling".into()),
                publish::ATTEMPTS as usize,
            ),
        ),
    );
    let (recorder, publisher) = build(CloudWatchMetrics::new(), Arc::clone(&sink), false);
    let record = || one_record_processed(&recorder);
    record();
    publisher.flush().await;
    assert_eq!(
        (publisher.stats().datums_failed, publisher.stats().retries),
        (1, 0),
        "not retried"
    );
    record();
    let started = tokio::time::Instant::now();
    publisher.flush().await;
    assert_eq!(
        (publisher.stats().datums_failed, publisher.stats().retries),
        (2, u64::from(publish::ATTEMPTS - 1))
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(500 + 1000 + 2000),
        "backing off 0.5 s, 1 s, 2 s"
    );
    record();
    publisher.flush().await;
    assert_eq!(
        sink.batches().len(),
        1,
        "the next flush sends only its own data"
    );
    assert_eq!(publisher.stats().datums_sent, 1);
}

/// A request CloudWatch never answers (a connection that went silent) is
/// given up after the attempt timeout and retried like a throttled one:
/// the flush ends, and so the worker's run can.
#[tokio::test(start_paused = true)]
async fn a_request_never_answered_is_retried_then_dropped_and_the_flush_ends() {
    let sink = FakeSink::answering(std::iter::repeat_n(None, publish::ATTEMPTS as usize));
    let (recorder, publisher) = build(CloudWatchMetrics::new(), Arc::clone(&sink), false);
    let record = || one_record_processed(&recorder);
    record();
    let started = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(3600), publisher.flush())
        .await
        .expect("the flush ends");
    assert_eq!(
        (publisher.stats().datums_failed, publisher.stats().retries),
        (1, u64::from(publish::ATTEMPTS - 1))
    );
    assert_eq!(
        started.elapsed(),
        publish::ATTEMPT_TIMEOUT * publish::ATTEMPTS + Duration::from_millis(500 + 1000 + 2000)
    );
    record();
    publisher.flush().await;
    assert_eq!(
        (sink.batches().len(), publisher.stats().datums_sent),
        (1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn the_publisher_flushes_every_interval_and_once_more_at_the_stop() {
    let sink: Arc<FakeSink> = Arc::default();
    let (recorder, publisher) = build(
        CloudWatchMetrics::new().flush_interval(Duration::from_secs(10)),
        Arc::clone(&sink),
        false,
    );
    let recorder = Arc::new(recorder);
    let record = |n: u64| records_processed(&recorder, n);
    let (stop, run) = run_until_stopped(&publisher);
    record(1);
    tokio::time::sleep(Duration::from_millis(9_900)).await;
    assert!(sink.batches().is_empty(), "not before the interval");
    tokio::time::sleep(Duration::from_millis(200)).await;
    record(2);
    tokio::time::sleep(Duration::from_secs(10)).await;
    record(4);
    stop.send(()).expect("the publisher runs");
    run.await.expect("no panic");
    let sums: Vec<f64> = sink
        .batches()
        .iter()
        .map(|(_, b)| {
            b[0].statistic_values()
                .and_then(|s| s.sum())
                .expect("a sum")
        })
        .collect();
    assert_eq!(sums, [1.0, 2.0, 4.0], "two ticks, then the last flush");
}

/// A stop while CloudWatch does not answer ends the publisher within the
/// final flush's deadline: the flush under way and the last one took
/// about 44 s a batch, past an orchestrator's grace period.
#[tokio::test(start_paused = true)]
async fn a_stop_while_cloudwatch_does_not_answer_ends_within_the_deadline() {
    let sink = FakeSink::answering(std::iter::repeat_n(None, 100));
    let (recorder, publisher) = build(
        CloudWatchMetrics::new().flush_interval(Duration::from_secs(10)),
        Arc::clone(&sink),
        false,
    );
    let recorder = Arc::new(recorder);
    let (stop, run) = run_until_stopped(&publisher);
    one_record_processed(&recorder);
    // The first flush is under way, its request unanswered.
    tokio::time::sleep(Duration::from_secs(11)).await;
    one_record_processed(&recorder);
    let stopping = tokio::time::Instant::now();
    stop.send(()).expect("the publisher runs");
    run.await.expect("no panic");
    assert!(
        stopping.elapsed() <= Duration::from_secs(10),
        "{:?}",
        stopping.elapsed()
    );
    assert!(sink.batches().is_empty());
}

/// Never answers a batch of one record processed; takes the others.
#[derive(Debug, Default)]
struct HangsOnOne {
    sums: Mutex<Vec<f64>>,
}

#[async_trait::async_trait]
impl Sink for HangsOnOne {
    async fn put(&self, _: &str, data: Vec<MetricDatum>) -> Result<(), SendError> {
        let sum = data[0]
            .statistic_values()
            .and_then(|s| s.sum())
            .unwrap_or(0.0);
        if sum == 1.0 {
            std::future::pending::<()>().await;
        }
        self.sums.lock().expect("not poisoned").push(sum);
        Ok(())
    }
}

/// The last flush, with what came up to the stop, is sent beside a flush
/// still under way, not after it: one that used up the deadline (its
/// requests unanswered) left the last none.
#[tokio::test(start_paused = true)]
async fn the_last_flush_is_sent_beside_one_still_under_way() {
    let sink = Arc::new(HangsOnOne::default());
    let (recorder, publisher) = CloudWatchMetrics::new()
        .flush_interval(Duration::from_secs(10))
        .build_with(
            "orders-app".into(),
            Arc::clone(&sink) as Arc<dyn Sink>,
            false,
        )
        .expect("valid settings");
    let recorder = Arc::new(recorder);
    let count = |n: u64| records_processed(&recorder, n);
    let (stop, run) = run_until_stopped(&publisher);
    count(1);
    tokio::time::sleep(Duration::from_secs(11)).await;
    count(5);
    stop.send(()).expect("the publisher runs");
    run.await.expect("no panic");
    assert_eq!(*sink.sums.lock().unwrap(), [5.0], "the last flush was sent");
}

#[tokio::test(start_paused = true)]
async fn running_beside_a_worker_flushes_after_it_returns_and_passes_its_output_on() {
    let sink: Arc<FakeSink> = Arc::default();
    let (recorder, publisher) = build(CloudWatchMetrics::new(), Arc::clone(&sink), false);
    let output = publisher
        .run_beside(async {
            tokio::time::sleep(Duration::from_secs(25)).await;
            metrics::with_local_recorder(&recorder, || {
                metrics::gauge!(LEASES_HELD, "worker" => "w").set(0.0);
            });
            "stopped"
        })
        .await;
    assert_eq!(output, "stopped");
    assert_eq!(
        sink.batches().len(),
        1,
        "the two ticks had nothing to send; the last flush had the gauge"
    );
}

#[test]
fn the_builder_names_the_conflict_when_another_recorder_is_installed() {
    let sdk = crate::test_support::offline_sdk();
    let error = CloudWatchMetrics::new()
        .install_with("orders-app", Some(&sdk), false, |_| {
            Err(
                "attempted to set a recorder after the metrics system was already initialized"
                    .into(),
            )
        })
        .expect_err("another recorder is installed");
    assert_eq!(error.field, "publish_cloudwatch_metrics");
    assert!(error.reason.contains("serve_metrics"), "{}", error.reason);
    assert!(
        error.reason.contains("CloudWatchMetrics::build"),
        "{}",
        error.reason
    );

    let error = CloudWatchMetrics::new()
        .install_with("orders-app", None, false, |_| Ok(()))
        .expect_err("no client");
    assert!(
        error.reason.contains("CloudWatchMetrics::client"),
        "{}",
        error.reason
    );

    let none = CloudWatchMetrics::new()
        .level(MetricsLevel::None)
        .install_with("orders-app", Some(&sdk), false, |_| {
            panic!("NONE installs no recorder")
        })
        .expect("NONE is valid");
    assert!(none.is_none());
}

#[test]
fn invalid_settings_are_refused_naming_the_setting() {
    let client = || {
        aws_sdk_cloudwatch::Client::from_conf(
            aws_sdk_cloudwatch::Config::builder()
                .behavior_version(aws_sdk_cloudwatch::config::BehaviorVersion::latest())
                .region(aws_sdk_cloudwatch::config::Region::new("us-east-1"))
                .build(),
        )
    };
    let cases = [
        (
            CloudWatchMetrics::new().client(client()),
            "cloudwatch_namespace",
        ),
        (
            CloudWatchMetrics::new().namespace("app"),
            "cloudwatch_client",
        ),
        (
            CloudWatchMetrics::new()
                .namespace("AWS/Kinesis")
                .client(client()),
            "cloudwatch_namespace",
        ),
        (
            CloudWatchMetrics::new().namespace("").client(client()),
            "cloudwatch_namespace",
        ),
        (
            CloudWatchMetrics::new()
                .namespace("app")
                .client(client())
                .flush_interval(Duration::ZERO),
            "cloudwatch_flush_interval",
        ),
        (
            CloudWatchMetrics::new()
                .namespace("app")
                .client(client())
                .max_buffered_datums(0),
            "cloudwatch_max_buffered_datums",
        ),
    ];
    for (metrics, field) in cases {
        match metrics.build() {
            Err(e) => assert_eq!(e.field, field, "{e}"),
            Ok(_) => panic!("{field}: accepted"),
        }
    }
    let (_, publisher) = CloudWatchMetrics::new()
        .namespace("app")
        .client(client())
        .build()
        .expect("valid");
    assert_eq!(publisher.namespace(), "app");
}

#[test]
fn every_java_rule_maps_a_declared_kcl_metric() {
    for rule in mapping::JAVA {
        let spec = names::ALL
            .iter()
            .find(|s| s.name == rule.kcl)
            .unwrap_or_else(|| panic!("{} is not a kcl metric", rule.kcl));
        if let Some((label, _)) = rule.only {
            assert!(
                spec.labels.contains(&label),
                "{}: no label {label}",
                rule.kcl
            );
        }
        if rule.per_worker {
            assert!(
                spec.labels.contains(&"worker"),
                "{}: no worker label",
                rule.kcl
            );
        }
        if rule.per_shard {
            assert!(
                spec.labels.contains(&"shard"),
                "{}: no shard label",
                rule.kcl
            );
        }
    }
}

#[test]
fn the_rustdoc_and_the_metrics_doc_show_the_mapping_table_as_the_code_has_it() {
    let table = mapping::markdown_table();
    assert_eq!(
        include_str!("mapping.md"),
        table,
        "regenerate src/observability/cloudwatch/mapping.md from mapping::markdown_table()"
    );
    let doc = include_str!("../../../../../docs/metrics.md");
    assert!(
        doc.contains(&table),
        "the CloudWatch table in docs/metrics.md differs from mapping::markdown_table():\n{table}"
    );
}
