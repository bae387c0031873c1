//! The worker-wide prefetch budget in fan-out mode: 1000 shards subscribed
//! through the in-memory fan-out stand-in (kinesis-mock's
//! `SubscribeToShard` would not hold 1000 subscriptions on 2 cores), a
//! budget smaller than what the shards hold, and nobody consuming.

use std::time::Duration;

use anyhow::{Context, bail};
use kcl_core::source::ShardReader;
use kcl_kinesis::{FanOutConfig, KinesisShardSource, Retrieval, held_bytes};
use tokio::time::Instant;

use crate::Section;
use crate::bench_retrieval::{full_fake, open_from_start};

/// Shards, records per shard and payload: the polling budget scenario's.
const SHARDS: usize = 1000;
const PER_SHARD: usize = 20;
const PAYLOAD: usize = 10 * 1024;
const BUDGET_MIB: usize = 128;
const MIB: f64 = 1024.0 * 1024.0;
/// The least a fan-out subscriber reserves for an event, what a quiet
/// shard reserves (kcl-kinesis's `budget::estimate`).
const FLOOR_RESERVATION: usize = 64 * 1024;

/// A fan-out source on a fake with every shard full, and a reader on each.
async fn open_all() -> anyhow::Result<(KinesisShardSource, Vec<Box<dyn ShardReader>>, usize)> {
    let (fake, ids) = full_fake(SHARDS, PER_SHARD, PAYLOAD);
    let config = FanOutConfig::builder().consumer_name("bench").build()?;
    let per_reader = config.max_buffered_bytes();
    let source = KinesisShardSource::on_fake_fan_out(fake)
        .prefetch_budget(BUDGET_MIB * 1024 * 1024)
        .retrieval(Retrieval::FanOut(config))
        .build()?;
    let readers = open_from_start(&source, &ids).await?;
    Ok((source, readers, per_reader))
}

/// Waits until no record was read for 3 s: the budget is full.
async fn until_reading_stops(source: &KinesisShardSource) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let records = source.stats().records;
        if records == last {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("still reading after 300 s ({records} records)");
        }
        last = records;
    }
}

/// Drains every reader at once, as the shards' consumers do; returns the
/// records delivered and the largest batch, as the budget counts it.
async fn drain(readers: &mut [Box<dyn ShardReader>]) -> anyhow::Result<(usize, usize)> {
    let drains = readers.iter_mut().map(|reader| async move {
        let (mut got, mut largest) = (0, 0);
        while got < PER_SHARD {
            let batch = reader.next_batch().await?;
            largest = largest.max(held_bytes(&batch.records));
            got += batch.records.len();
        }
        anyhow::Ok((got, largest))
    });
    let all = tokio::time::timeout(Duration::from_secs(300), futures::future::join_all(drains))
        .await
        .context("draining took over 300 s")?;
    let (mut delivered, mut largest) = (0, 0);
    for one in all {
        let (got, batch) = one?;
        delivered += got;
        largest = largest.max(batch);
    }
    Ok((delivered, largest))
}

/// The scenario: fill, measure, drain, check the bound.
pub(crate) async fn fanout_budget() -> anyhow::Result<Section> {
    let (source, mut readers, per_reader) = open_all().await?;
    until_reading_stops(&source).await?;
    let full = source.stats();
    let (delivered, largest) = drain(&mut readers).await?;
    drop(readers);
    let peak = source.stats().peak_buffered_bytes as f64;
    let budget = (BUDGET_MIB * 1024 * 1024) as f64;
    // A subscriber reserves its own max_buffered_bytes before its first
    // event and an estimate after, at least the floor; only a batch holding
    // more than its reservation goes over, at most B / R of them at once,
    // R the smallest reservation.
    let reservation = FLOOR_RESERVATION
        .min(per_reader)
        .min(BUDGET_MIB * 1024 * 1024);
    let excess = largest.saturating_sub(reservation) as f64;
    let bound = budget + (budget / reservation as f64).floor() * excess;
    let data = (SHARDS * PER_SHARD * PAYLOAD) as f64;

    let mut s = Section::new("Memory: the worker-wide prefetch budget with 1000 fan-out shards");
    s.what = format!(
        "A fan-out KinesisShardSource on the in-memory Kinesis fake and its SubscribeToShard \
         stand-in: {SHARDS} shards holding {:.0} MiB of records ({PER_SHARD} x {} KiB each, \
         one event per shard), a subscription on every shard and nobody consuming, with a \
         {BUDGET_MIB} MiB worker-wide budget and each reader's own budget at its \
         {:.0} MiB default. Reading goes on until it stops by itself; then every reader is \
         drained. Peak as the budget accounts it (what the batches really hold).",
        data / MIB,
        PAYLOAD / 1024,
        per_reader as f64 / MIB
    );
    s.row(
        "records held when reading stopped",
        format!("{:.1} MiB", full.buffered_bytes as f64 / MIB),
    );
    s.row(
        "most held at once (accounted)",
        format!("{:.1} MiB of {:.0} MiB", peak / MIB, budget / MIB),
    );
    s.row(
        "bound: B + floor(B / R) x (largest batch - R)",
        format!(
            "{:.1} MiB (R {:.0} KiB, largest batch {:.2} MiB)",
            bound / MIB,
            reservation as f64 / 1024.0,
            largest as f64 / MIB
        ),
    );
    s.row("events read", full.events.to_string());
    s.row("records delivered after draining", delivered.to_string());
    s.figure(
        "budget_1000_shards_fanout_peak_buffered_mib",
        (peak / MIB * 10.0).round() / 10.0,
        "MiB",
    );
    s.headline = format!(
        "fan-out, {SHARDS} shards, {:.0} MiB of records: at most {:.1} MiB held (budget {BUDGET_MIB} MiB, bound {:.1} MiB)",
        data / MIB,
        peak / MIB,
        bound / MIB
    );
    s.settings = format!(
        "The default budget is 1 GiB; here {BUDGET_MIB} MiB so that it binds. A subscriber \
         reserves its max_buffered_bytes ({:.0} MiB) before its first event, so {} first \
         events are read at once; after that the largest of its recent batches, at least \
         {} KiB.",
        per_reader as f64 / MIB,
        BUDGET_MIB * 1024 * 1024 / per_reader.min(BUDGET_MIB * 1024 * 1024),
        FLOOR_RESERVATION / 1024
    );
    s.limits = "The stand-in pushes a shard's records in one event as soon as a subscriber \
                reads, so each shard's first event is its only one with records and fits the \
                whole own budget it reserved; no KPL aggregates. No batch outgrows its \
                reservation here: the bound's overshoot term is the worst case of quiet \
                shards bursting at once, not reached."
        .into();
    s.fail_if(
        peak > bound,
        format!("{peak} bytes held, over the bound {bound}"),
    );
    s.fail_if(
        delivered != SHARDS * PER_SHARD,
        format!("{delivered} of {} records delivered", SHARDS * PER_SHARD),
    );
    Ok(s)
}
