//! Fan-out readers under the worker-wide prefetch budget: many shards
//! competing for it, nobody consuming; quiet shards beside busy ones.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kcl_core::Record;
use kcl_core::source::{OpenShard, ShardReader, ShardSource, StartPosition};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::FanOutConfigBuilder;
use super::tests::{STREAM, config, held};
use crate::KinesisShardSource;
use crate::budget::estimate::MIN_EVENT_RESERVATION;
use crate::calls::{KinesisApi, Shared};
use crate::fake::FakeKinesis;
use crate::kpl::{UserRecord, aggregate};
use crate::records::held_bytes;
use crate::test_util::fanout::FakeFanOut;
use crate::test_util::readers::assert_unconsumed_within;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// `shards` shards under one worker-wide budget of `budget` bytes, each
/// reader with its own budget of `per_reader` (what it reserves for its
/// first event).
struct Worker {
    kinesis: Arc<FakeKinesis>,
    fake: FakeFanOut,
    source: KinesisShardSource,
    shards: Vec<String>,
}

fn worker(shards: usize, budget: usize, per_reader: usize) -> Worker {
    worker_with(shards, budget, config().max_buffered_bytes(per_reader))
}

fn worker_with(shards: usize, budget: usize, config: FanOutConfigBuilder) -> Worker {
    let kinesis = Arc::new(FakeKinesis::default());
    let ids = kinesis.create_stream(STREAM, shards);
    let fake = FakeFanOut::new(Arc::clone(&kinesis));
    let config = config.build().expect("config");
    let mut source = KinesisShardSource::with_fan_out(
        Arc::clone(&kinesis) as Arc<dyn KinesisApi>,
        Arc::new(fake.clone()),
        config,
    );
    source.shared = Shared::new(
        Arc::clone(&source.shared.api),
        source.shared.retry,
        None,
        budget,
    );
    Worker {
        kinesis,
        fake,
        source,
        shards: ids,
    }
}

impl Worker {
    async fn open(&self, shard: usize) -> Box<dyn ShardReader> {
        let id = &self.shards[shard];
        let request = OpenShard::new(STREAM, id.clone(), StartPosition::TrimHorizon, held(id));
        self.source.open(request).await.expect("open")
    }

    /// `n` plain records of `size` bytes on `shard`.
    fn put_plain(&self, shard: usize, n: usize, size: usize) {
        for i in 0..n {
            let pk = format!("pk-{i}");
            self.kinesis
                .put(STREAM, &self.shards[shard], &pk, vec![b'x'; size]);
        }
    }

    /// One KPL aggregate of `subs` small sub-records on `shard`: a few kB
    /// that expand to many times that.
    fn put_aggregate(&self, shard: usize, subs: usize) {
        let records: Vec<UserRecord> = (0..subs)
            .map(|i| UserRecord {
                partition_key: format!("{i:0>100}"),
                explicit_hash_key: None,
                data: Bytes::from(format!("{i:0>10}")),
            })
            .collect();
        self.kinesis
            .put(STREAM, &self.shards[shard], "pk", aggregate(&records));
    }
}

/// Hands out a reader's batches as they come, as a processor that keeps
/// up does, until the task is aborted.
fn keep_up(mut reader: Box<dyn ShardReader>) -> JoinHandle<()> {
    tokio::spawn(async move { while reader.next_batch().await.is_ok() {} })
}

/// Reads until `n` records arrived.
async fn drain(reader: &mut dyn ShardReader, n: usize) -> Vec<Record> {
    let mut records = Vec::new();
    while records.len() < n {
        records.extend(reader.next_batch().await.expect("batch").records);
    }
    records
}

#[tokio::test(start_paused = true)]
async fn twenty_undrained_fan_out_shards_hold_no_more_than_the_worker_budget() {
    const SHARDS: usize = 20;
    const PER_SHARD: usize = 10;
    const PAYLOAD: usize = 10 * KIB;
    let budget = 1024 * KIB;
    // Each shard's 10 records (one event, about 104 kB) fit its reader's
    // own 128 kB: only the worker budget can stop 20 of them (2 MB). A
    // reader's first event reserves all 128 kB, so none goes over (the
    // 64 kB floor a quiet shard reserves would not hold it).
    let w = worker(SHARDS, budget, 128 * KIB);
    for shard in 0..SHARDS {
        w.put_plain(shard, PER_SHARD, PAYLOAD);
    }
    let mut readers = Vec::new();
    for shard in 0..SHARDS {
        readers.push(w.open(shard).await);
    }
    // Nobody consumes: every subscriber reads what the budgets allow.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let stats = w.source.stats();
    assert_unconsumed_within(&stats, budget);
    // The budget, not the shards, stopped the reading: a whole event per
    // reservation, of which several fit.
    let events_read = stats.records as usize / PER_SHARD;
    assert!(
        (2..SHARDS).contains(&events_read),
        "{} records of {} read",
        stats.records,
        SHARDS * PER_SHARD
    );
    // Draining every reader at once, as the shards' consumers do, gets
    // every record and gives the budget back.
    let drains = readers
        .iter_mut()
        .map(|reader| drain(reader.as_mut(), PER_SHARD));
    let got: Vec<Vec<Record>> = futures::future::join_all(drains).await;
    assert!(got.iter().all(|records| records.len() == PER_SHARD));
    drop(readers);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = w.source.stats();
    assert_eq!(stats.buffered_bytes, 0);
    assert!(stats.peak_buffered_bytes <= budget as u64);
}

#[tokio::test(start_paused = true)]
async fn a_kpl_expansion_beyond_the_reservation_is_taken_from_the_free_budget() {
    let (budget, reservation) = (256 * KIB, 64 * KIB);
    let w = worker(5, budget, reservation);
    // About 3 kB of aggregate expanding to about 100 kB: more than the
    // 64 kB it reserved, while 192 kB of the budget is free.
    w.put_aggregate(0, 400);
    let mut expanded = w.open(0).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held = w.source.stats().buffered_bytes as usize;
    assert!(held > reservation, "the aggregate holds {held} bytes");
    // Four shards of four 10 kB records (one 40 kB event each) come after.
    for shard in 1..5 {
        w.put_plain(shard, 4, 10 * KIB);
    }
    let mut readers = Vec::new();
    for shard in 1..5 {
        readers.push(w.open(shard).await);
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let stats = w.source.stats();
    // The expansion took its excess from the free budget, so fewer of the
    // others got a reservation: within the budget, one shard unread.
    assert_eq!(stats.records, 400 + 3 * 4, "{stats:?}");
    assert!(
        stats.peak_buffered_bytes <= budget as u64,
        "peak {} over the budget {budget}",
        stats.peak_buffered_bytes
    );
    let records = drain(expanded.as_mut(), 400).await;
    assert_eq!(held_bytes(&records), held);
    for reader in &mut readers {
        assert_eq!(drain(reader.as_mut(), 4).await.len(), 4);
    }
}

/// Four shards, quiet for 10 s, each get an aggregate expanding past the
/// floor reservation F at the same moment. Returns the peak held and the
/// expansion, after checking that only B / F of them were read at once and
/// that nothing was lost.
async fn burst_on_quiet_shards(budget: usize, per_reader: usize) -> (usize, usize) {
    const SHARDS: usize = 4;
    let w = worker(SHARDS, budget, per_reader);
    let mut readers = Vec::new();
    for shard in 0..SHARDS {
        readers.push(w.open(shard).await);
    }
    // Every subscriber has had its first (empty) event, so reserves F, and
    // is waiting for an event or for a reservation when the aggregates
    // come (off the fake's 50 ms polling grid, so no event is half read).
    tokio::time::sleep(Duration::from_millis(10_025)).await;
    for shard in 0..SHARDS {
        w.put_aggregate(shard, 400);
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let stats = w.source.stats();
    let at_once = budget / MIN_EVENT_RESERVATION.min(per_reader);
    assert_eq!(stats.records as usize, at_once * 400, "{stats:?}");
    // The others read once the first ones are drained: nothing is lost.
    let drains = readers.iter_mut().map(|reader| drain(reader.as_mut(), 400));
    let got: Vec<Record> = futures::future::join_all(drains)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(got.len(), SHARDS * 400);
    (
        stats.peak_buffered_bytes as usize,
        held_bytes(&got) / SHARDS,
    )
}

#[tokio::test(start_paused = true)]
async fn expansions_go_over_the_budget_by_at_most_one_excess_per_reservation() {
    // The readers' own budget is the floor: every reservation is R = 64 kB
    // and B / R = 2 of them fit, so at most two events are read at once.
    let (budget, reservation) = (128 * KIB, 64 * KIB);
    let (peak, expansion) = burst_on_quiet_shards(budget, reservation).await;
    // Each of the two held its whole reservation and went over by the
    // rest of its expansion E, none of it free: B + (B / R) x (E - R).
    assert!(expansion > reservation, "{expansion}");
    let worst = budget + (budget / reservation) * (expansion - reservation);
    assert_eq!(peak, worst);
}

#[tokio::test(start_paused = true)]
async fn bursts_on_quiet_shards_go_over_by_at_most_one_excess_per_floor_reservation() {
    // Each reader's own budget (what it reserved for its first event) holds
    // the whole aggregate, but a quiet shard reserves only the floor F: the
    // worst case is in F, B + (B / F) x (E - F), not in the readers' budget.
    let budget = 2 * MIN_EVENT_RESERVATION;
    let (peak, expansion) = burst_on_quiet_shards(budget, 4 * budget).await;
    assert!(
        (MIN_EVENT_RESERVATION..budget).contains(&expansion),
        "{expansion}"
    );
    let floor = MIN_EVENT_RESERVATION;
    assert_eq!(peak, budget + (budget / floor) * (expansion - floor));
}

/// What a reader on a busy shard hands out, with `quiet` idle shards
/// beside it.
#[derive(Debug, PartialEq, Eq)]
struct Busy {
    /// Batches with records in the second minute, when every reader has
    /// had its first event (which reserves the reader's whole budget).
    batches: usize,
    /// Records in both minutes.
    records: usize,
    /// Subscriptions made, of all shards.
    subscriptions: usize,
}

/// A shard with a record every 100 ms for two minutes beside `quiet` idle
/// shards, every reader kept up with: 32 MiB of worker budget and 4 MiB of
/// each reader's own, so 8 whole reservations fit at once, and the floors
/// of 301 shards (about 19 MiB).
async fn busy_beside(quiet: usize) -> Busy {
    let w = worker(quiet + 1, 32 * MIB, 4 * MIB);
    let mut kept_up = Vec::new();
    for shard in 0..quiet {
        kept_up.push(keep_up(w.open(shard).await));
    }
    let mut busy = w.open(quiet).await;
    let start = Instant::now();
    let (kinesis, shard) = (Arc::clone(&w.kinesis), w.shards[quiet].clone());
    let producer = tokio::spawn(async move {
        for i in 0..1200 {
            kinesis.put(STREAM, &shard, &format!("pk-{i}"), vec![b'x'; KIB]);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (_, first) = read_until(busy.as_mut(), start + Duration::from_secs(60)).await;
    let (batches, second) = read_until(busy.as_mut(), start + Duration::from_secs(120)).await;
    producer.abort();
    for task in kept_up {
        task.abort();
    }
    Busy {
        batches,
        records: first + second,
        subscriptions: w.fake.subscriptions().len(),
    }
}

/// Batches with records, and their records, a reader hands out until
/// `until`.
async fn read_until(reader: &mut dyn ShardReader, until: Instant) -> (usize, usize) {
    let (mut batches, mut records) = (0, 0);
    while let Ok(batch) = tokio::time::timeout_at(until, reader.next_batch()).await {
        let n = batch.expect("batch").records.len();
        if n > 0 {
            batches += 1;
            records += n;
        }
    }
    (batches, records)
}

#[tokio::test(start_paused = true)]
async fn a_busy_shard_beside_hundreds_of_quiet_ones_reads_as_often_as_alone() {
    let alone = busy_beside(0).await;
    let beside = busy_beside(300).await;
    // A quiet shard waits for its next event holding only the floor, so
    // the busy one gets its turn at each of its events, as when alone.
    assert!(alone.batches >= 500, "{alone:?}");
    assert_eq!(beside.batches, alone.batches, "{beside:?}");
    assert_eq!(beside.records, alone.records, "{beside:?}");
    assert_eq!(beside.subscriptions, 301, "one subscription per shard");
}

#[tokio::test(start_paused = true)]
async fn waiting_for_the_worker_budget_does_not_end_a_subscription() {
    // One whole reservation fits at once and a quiet shard's first event
    // takes a second: the last of 20 readers to start waits about 20 s
    // for its turn, twice the stall limit.
    const SHARDS: usize = 20;
    let w = worker(SHARDS, 2 * MIB, 2 * MIB);
    let mut kept_up = Vec::new();
    for shard in 0..SHARDS {
        kept_up.push(keep_up(w.open(shard).await));
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let read: HashSet<String> = w.fake.event_shards().into_iter().collect();
    assert_eq!(read.len(), SHARDS, "every shard got its turn");
    assert_eq!(
        w.fake.subscriptions().len(),
        SHARDS,
        "one subscription each"
    );
    assert_eq!(w.source.stats().resubscribes, 0);
    for task in kept_up {
        task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn a_reservation_won_after_a_stall_serves_the_next_subscription() {
    // Every reservation is the floor, and only one fits the budget beside
    // what the batches hold: the two shards take turns.
    let per_reader = MIN_EVENT_RESERVATION;
    let config = config()
        .max_buffered_bytes(per_reader)
        .max_buffered_batches(2);
    let w = worker_with(2, per_reader + per_reader / 4, config);
    w.put_plain(0, 1, KIB);
    let mut stalled = w.open(0).await;
    let other = keep_up(w.open(1).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.put_plain(0, 1, KIB);
    // Shard 0's two batches are not handed out, so its next event has no
    // slot: after the stall limit its subscription is let go. (Shard 1's
    // events come every second from 0.5 s on; this is between two.)
    tokio::time::sleep(Duration::from_millis(30_250)).await;
    assert_eq!(w.fake.active(), 1, "the stalled subscription was let go");
    w.put_plain(0, 1, KIB);
    let before = w.fake.event_shards().len();
    assert_eq!(drain(stalled.as_mut(), 2).await.len(), 2);
    // Room again: shard 0 waits for the budget once, until the other
    // shard's event gives it back, and reads with it in a new
    // subscription before the other's next turn.
    assert_eq!(drain(stalled.as_mut(), 1).await.len(), 1);
    let turns = w.fake.event_shards().split_off(before);
    assert_eq!(turns, [w.shards[1].clone(), w.shards[0].clone()]);
    assert_eq!(w.fake.subscriptions().len(), 3);
    other.abort();
}
