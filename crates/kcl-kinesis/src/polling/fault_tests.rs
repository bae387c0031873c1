//! What real Kinesis does and the emulator never: shards past retention,
//! deleted streams, calls that never answer, denied access, and partial
//! pages while far behind. Each under paused time. A trimmed checkpoint
//! and an expired split parent, which fan-out meets alike, are tested for
//! both readers in `test_util::readers`.

use std::time::Duration;

use kcl_core::source::{SourceError, StartPosition};
use tokio::time::Instant;

use super::tests::{
    STREAM, Setup, after, assert_elapsed, caught_up_past_three, expected, held, open, open_at,
    payloads, put_plain, read_n, read_plain, setup, setup_config, setup_with,
};
use crate::MIN_TIME_BETWEEN_READS;
use crate::faults::{Call, Fault};

async fn try_open(s: &Setup, position: StartPosition) -> Result<(), SourceError> {
    open_at(s, &s.shard, position, held(&s.shard))
        .await
        .map(drop)
}

/// Every record `shard` holds from its start, read until a batch comes
/// back empty (caught up).
async fn read_all(s: &Setup, shard: &str) -> Vec<String> {
    let mut reader = open_at(s, shard, StartPosition::TrimHorizon, held(shard))
        .await
        .expect("open");
    let mut records = Vec::new();
    loop {
        let batch = reader.next_batch().await.expect("batch");
        if batch.records.is_empty() {
            return payloads(&records);
        }
        records.extend(batch.records);
    }
}

#[tokio::test(start_paused = true)]
async fn a_shard_that_expires_while_read_ends_where_it_was() {
    let s = setup();
    put_plain(&s, 0..5);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let (records, _) = read_n(reader.as_mut(), 5).await;
    assert_eq!(payloads(&records), expected(0..5));
    // Split while read: the next records go to the children; then the
    // parent ages out.
    let kids = s.kinesis.split(STREAM, &s.shard, true);
    for (i, kid) in kids.iter().enumerate() {
        s.kinesis
            .put(STREAM, kid, &format!("pk-{}", 5 + i), format!("r{}", 5 + i));
    }
    s.kinesis.expire(STREAM, &s.shard);
    let mut after = Vec::new();
    let end = loop {
        let batch = reader.next_batch().await.expect("batch");
        after.extend(batch.records);
        if let Some(children) = batch.shard_end {
            break children;
        }
    };
    assert!(
        after.is_empty(),
        "the parent delivered {:?} after what it had read",
        payloads(&after)
    );
    let mut from_children = Vec::new();
    for child in &end {
        from_children.extend(read_all(&s, &child.shard_id).await);
    }
    assert_eq!(
        from_children,
        expected(5..7),
        "the children named at the end hold the records put after the split, once"
    );
    let ids: Vec<&str> = end.iter().map(|c| c.shard_id.as_str()).collect();
    assert_eq!(ids, kids.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(s.source.stats().expired_shards, 1);
}

#[tokio::test(start_paused = true)]
async fn a_shard_too_new_for_the_listing_is_not_taken_for_expired() {
    // Right after a reshard a child can answer ResourceNotFound while
    // ListShards does not list it yet: nothing newer is listed, so it is a
    // stale answer, not an aged-out shard (which a reshard closed, so
    // newer shards exist).
    let s = setup();
    let shard = "shardId-000000000099";
    let err = open_at(&s, shard, StartPosition::TrimHorizon, held(shard))
        .await
        .expect_err("not readable yet");
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(s.source.stats().expired_shards, 0);
}

#[tokio::test(start_paused = true)]
async fn a_stale_not_found_while_reading_is_reported_and_reading_goes_on() {
    let s = setup();
    let mut reader = caught_up_past_three(&s).await;
    s.fake.inject(Call::GetRecords, Fault::ResourceNotFound);
    put_plain(&s, 3..5);
    let errors = read_plain(reader.as_mut(), 3..5).await;
    assert_eq!(errors, 1, "reported once, and the fetch task went on");
    assert_eq!(s.source.stats().expired_shards, 0);
}

/// An expired iterator whose replacement keeps meeting a stale not-found
/// (the shard still listed) is retried after a pause each time, as a
/// stale not-found of GetRecords is: the replacement used to go straight
/// back to GetShardIterator and a full ListShards, as fast as the reader
/// took the reported errors.
#[tokio::test(start_paused = true)]
async fn a_stale_not_found_while_replacing_an_iterator_is_retried_after_a_pause() {
    let s = setup();
    let mut reader = caught_up_past_three(&s).await;
    s.fake.inject(Call::GetRecords, Fault::ExpiredIterator);
    s.fake
        .fail_all(Call::GetShardIterator, Fault::ResourceNotFound);
    let before = s.fake.calls(Call::GetShardIterator);
    let window = Duration::from_secs(10);
    let calls = || s.fake.calls(Call::GetShardIterator) - before;
    let started = Instant::now();
    // Until the window is over, or (a busy loop never lets paused time
    // move) the calls are far past the bound.
    while started.elapsed() < window && calls() <= 1_000 {
        if let Ok(batch) = reader.next_batch().await {
            assert!(batch.records.is_empty(), "no iterator, no records");
        }
    }
    let calls = calls();
    // One per pause (the longest retry delay, 100 ms here): about 100.
    assert!(calls <= 120, "{calls} GetShardIterator calls in {window:?}");
    s.fake.clear(Call::GetShardIterator);
    put_plain(&s, 3..5);
    read_plain(reader.as_mut(), 3..5).await;
}

#[tokio::test(start_paused = true)]
async fn a_deleted_stream_is_stream_not_found_not_an_expired_shard() {
    let s = setup();
    put_plain(&s, 0..2);
    s.kinesis.delete_stream(STREAM);
    let err = try_open(&s, StartPosition::TrimHorizon)
        .await
        .expect_err("no stream");
    assert!(matches!(err, SourceError::StreamNotFound { .. }), "{err:?}");
    assert_eq!(s.source.stats().expired_shards, 0);
}

#[tokio::test(start_paused = true)]
async fn not_found_for_a_shard_still_listed_is_retryable() {
    let s = setup();
    s.fake
        .inject(Call::GetShardIterator, Fault::ResourceNotFound);
    let err = try_open(&s, StartPosition::TrimHorizon)
        .await
        .expect_err("stale answer");
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(s.source.stats().expired_shards, 0);
    try_open(&s, StartPosition::TrimHorizon)
        .await
        .expect("the retry opens");
}

#[tokio::test(start_paused = true)]
async fn an_invalid_checkpoint_that_is_not_trimmed_is_an_error_not_a_replay() {
    // Kinesis answers InvalidArgument for a sequence number of another
    // shard too: the oldest record is before the checkpoint, so nothing
    // was trimmed, and re-reading the shard from TRIM_HORIZON would be a
    // guess.
    let s = setup();
    let seqs = put_plain(&s, 0..5);
    s.fake
        .inject(Call::GetShardIterator, Fault::InvalidArgument);
    let err = try_open(&s, after(&seqs[3])).await.expect_err("rejected");
    assert!(matches!(err, SourceError::Fatal { .. }), "{err:?}");
    assert_eq!(s.source.stats().trimmed_starts, 0);
}

/// A refused checkpoint whose shard's oldest record lies behind more
/// empty pages than are read looking for it (a sparse shard of long
/// retention): whether it was trimmed is unknown, so the shard is read
/// again from its start (never left unread) and counted as trimmed for
/// the alert, but not logged as certain DATA LOSS: it may have been
/// another shard's number. It was.
#[test]
fn an_invalid_checkpoint_behind_many_empty_pages_is_no_certain_data_loss() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let (trimmed, logs) = crate::test_util::logs::captured(|| {
        runtime.block_on(async {
            let s = setup();
            let seqs = put_plain(&s, 0..5);
            s.kinesis.cap_pages(STREAM, &s.shard, Some(0));
            s.fake
                .inject(Call::GetShardIterator, Fault::InvalidArgument);
            try_open(&s, after(&seqs[3]))
                .await
                .expect("read again from the start");
            s.source.stats().trimmed_starts
        })
    });
    assert_eq!(trimmed, 1, "counted for the alert");
    assert!(!logs.contains("DATA LOSS"), "{logs}");
    assert!(logs.contains("whether it was trimmed is unknown"), "{logs}");
}

#[tokio::test(start_paused = true)]
async fn calls_cut_short_by_the_prefetch_budget_keep_the_200_ms_floor() {
    // Room for 5 records ahead of the processor: every call asks for (and
    // gets) at most 5 of the 100 waiting, never a full max_records batch.
    let s = setup_with(|c| c.max_records(1000).max_prefetch_records(5));
    put_plain(&s, 0..100);
    let started = Instant::now();
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_plain(reader.as_mut(), 0..100).await;
    let calls = s.kinesis.get_records_calls();
    assert!(calls >= 20, "{calls} calls");
    assert!(
        started.elapsed() >= MIN_TIME_BETWEEN_READS * u32::try_from(calls - 1).unwrap_or(0),
        "{calls} calls in {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_hung_get_records_is_abandoned_after_the_call_timeout() {
    let timeout = Duration::from_secs(2);
    let s = setup_with(|c| c.call_timeout(timeout));
    put_plain(&s, 0..3);
    s.fake.inject(Call::GetRecords, Fault::Hang);
    let started = Instant::now();
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    assert_eq!(read_plain(reader.as_mut(), 0..3).await, 0);
    let stats = s.source.stats();
    assert_eq!((stats.call_timeouts, stats.get_records_calls), (1, 2));
    // The bound: the timeout plus one retry pause (at most 2 x 10 ms).
    assert_elapsed(started, ..=timeout + Duration::from_millis(20));
}

#[tokio::test(start_paused = true)]
async fn a_hung_get_shard_iterator_is_abandoned_too() {
    let s = setup_with(|c| c.call_timeout(Duration::from_secs(1)));
    put_plain(&s, 0..2);
    s.fake.inject(Call::GetShardIterator, Fault::Hang);
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_plain(reader.as_mut(), 0..2).await;
    assert_eq!(s.source.stats().call_timeouts, 1);
}

#[tokio::test(start_paused = true)]
async fn kms_and_access_errors_are_retried_without_giving_the_shard_up() {
    // Far more failures than max_transient_retries: access errors do not
    // count toward it while the lease lasts.
    let s = setup_with(|c| c.max_transient_retries(2));
    put_plain(&s, 0..4);
    for fault in Fault::ACCESS {
        s.fake.inject(Call::GetShardIterator, Fault::AccessDenied);
        s.fake.inject(Call::GetRecords, fault);
    }
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    let errors = read_plain(reader.as_mut(), 0..4).await;
    assert_eq!(errors, 0, "nothing reported: the reader keeps the shard");
    let stats = s.source.stats();
    assert_eq!(stats.access_denied, 12);
    assert_eq!(s.fake.pending(Call::GetRecords), 0);
}

#[tokio::test(start_paused = true)]
async fn catching_up_through_partial_pages_is_not_held_back_by_the_idle_pause() {
    // Pauses of a minute when caught up; pages of 10 records from a
    // shard 100 behind (a response cut short by its size limit).
    let minute = Duration::from_secs(60);
    let s = setup_with(|c| {
        c.max_records(1000)
            .idle_time_between_reads(minute)
            .time_between_reads(minute)
    });
    put_plain(&s, 0..100);
    s.kinesis.cap_pages(STREAM, &s.shard, Some(10));
    let started = Instant::now();
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    read_plain(reader.as_mut(), 0..100).await;
    assert_eq!(s.kinesis.get_records_calls(), 10);
    // Nine pauses of 200 ms (the per-shard floor), none of a minute.
    assert_elapsed(started, ..=Duration::from_millis(9 * 200 + 50));
}

#[tokio::test(start_paused = true)]
async fn empty_pages_while_behind_are_followed_at_the_floor_not_the_idle_time() {
    let s = setup_with(|c| c.idle_time_between_reads(Duration::from_secs(60)));
    put_plain(&s, 0..5);
    s.kinesis.cap_pages(STREAM, &s.shard, Some(0));
    let _reader = open(&s, StartPosition::TrimHorizon).await;
    tokio::time::sleep(Duration::from_millis(1990)).await;
    // One call every 200 ms: 10 in the first two seconds.
    assert_eq!(s.kinesis.get_records_calls(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_trickling_shard_costs_time_between_reads_and_an_idle_one_the_idle_time() {
    // The default pacing (only retries made quick).
    let s = setup_config(
        crate::PollingConfig::builder()
            .retry_min_delay(Duration::from_millis(10))
            .build()
            .expect("the defaults are valid"),
    );
    let mut reader = open(&s, StartPosition::TrimHorizon).await;
    // Idle: one call a second.
    let mut batches = 0;
    let until = Instant::now() + Duration::from_millis(9_990);
    while Instant::now() < until {
        tokio::select! {
            b = reader.next_batch() => { b.expect("batch"); batches += 1; }
            () = tokio::time::sleep_until(until) => {}
        }
    }
    assert_eq!(s.kinesis.get_records_calls(), 10, "{batches} batches");
    // Trickling (a record every 100 ms): two calls a second.
    let calls = s.kinesis.get_records_calls();
    let mut got = 0;
    for i in 0..100 {
        s.kinesis.put(STREAM, &s.shard, "pk", format!("t{i}"));
        let tick = Instant::now() + Duration::from_millis(100);
        while Instant::now() < tick {
            tokio::select! {
                b = reader.next_batch() => got += b.expect("batch").records.len(),
                () = tokio::time::sleep_until(tick) => {}
            }
        }
    }
    let trickle_calls = s.kinesis.get_records_calls() - calls;
    assert!(
        (19..=21).contains(&trickle_calls),
        "{trickle_calls} calls in 10 s"
    );
    assert!(got >= 95, "{got} of 100 records read");
}
