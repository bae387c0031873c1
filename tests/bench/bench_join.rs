//! Fleet changes at the production defaults with records flowing: a worker
//! process joining a running one, and a shard split under a single worker.
//! Built on `bench_fleet`'s worker processes, producer and lease-table
//! watch; times are wall-clock, shared by every process on this host.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use kcl_tests::e2e::{BatchLog, now_ns, shard_span_ns, verify};
use kcl_tests::{list_all_shards, split_shard_in_half};
use tokio::time::Instant;

use crate::Section;
use crate::bench_fleet::{
    DEFAULTS, Fleet, LOAD_EVERY, PAIR_SHARDS, Producer, per_run, settle, wait_complete,
};

fn secs(ns: u128) -> f64 {
    ns as f64 / 1e9
}

// ---------------------------------------------------------------------------
// A late joiner
// ---------------------------------------------------------------------------

/// Runs of the late-joiner scenario: each costs about 25 s, and one run
/// alone would hide where the joiner's start falls in the holder's timers.
const JOIN_RUNS: usize = 3;
/// When the joiner starts, after the first worker: as the issue measured it,
/// and well past the first worker taking all 8 leases (a few seconds).
const JOIN_AFTER: Duration = Duration::from_secs(20);
/// The bound on the joiner's first record, from its spawn.
const JOIN_BOUND_S: f64 = 2.0;

/// One late-joiner run: the joiner's first record and the balance after its
/// spawn (seconds), and the run's record verdict.
struct JoinRun {
    first_record: f64,
    balanced: f64,
    lost: usize,
    order_violations: usize,
    duplicates: usize,
    /// Moments two workers processed one shard at once (a handoff gone wrong).
    overlaps: usize,
    produced: u64,
    /// Records put per second, over the producer's life.
    rate: f64,
}

async fn join_once(exe: &Path, run: usize) -> anyhow::Result<JoinRun> {
    let mut fleet = Fleet::new(exe, PAIR_SHARDS as i32, DEFAULTS).await?;
    let producer = Producer::start(&fleet, 0, LOAD_EVERY);
    let producing = Instant::now();
    let (first, joiner) = (format!("j{run}-1"), format!("j{run}-2"));
    let started = Instant::now();
    fleet.spawn(&first)?;
    // The joiner meets a fleet in its steady state: one worker holding
    // every lease, no handoff running.
    settle(&fleet, &[&first], PAIR_SHARDS, JOIN_AFTER).await?;
    tokio::time::sleep_until(started + JOIN_AFTER).await;
    let t0 = now_ns();
    fleet.spawn(&joiner)?;
    let first_record = loop {
        let batches = fleet.batches()?;
        if let Some(t) = batches
            .iter()
            .filter(|b| b.worker == joiner && !b.records.is_empty())
            .map(|b| b.start_ns)
            .min()
        {
            break t.saturating_sub(t0);
        }
        // Generous: the figure is reported even when far above the bound.
        ensure!(
            now_ns() - t0 < 90_000_000_000,
            "{joiner} delivered no record within 90 s of its start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    settle(
        &fleet,
        &[&first, &joiner],
        PAIR_SHARDS,
        Duration::from_secs(120),
    )
    .await?;
    let balanced = now_ns() - t0;
    let per_key = producer.stop().await?;
    let produced = PAIR_SHARDS as u64 * per_key;
    let rate = produced as f64 / producing.elapsed().as_secs_f64();
    let batches =
        wait_complete(&fleet, PAIR_SHARDS as u32, per_key, Duration::from_secs(90)).await?;
    fleet.stop_all().await?;
    let verdict = verify(&batches, PAIR_SHARDS as u32, per_key);
    fleet.cleanup().await;
    Ok(JoinRun {
        first_record: secs(first_record),
        balanced: secs(balanced),
        lost: verdict.missing.len(),
        order_violations: verdict.order_violations.len(),
        duplicates: verdict.duplicates,
        overlaps: verdict.overlaps.len(),
        produced,
        rate,
    })
}

/// A worker joining a running one at the defaults: 2 processes on 8 shards,
/// the second started 20 s after the first; the time from its spawn to the
/// first record it delivers. The slowest of [`JOIN_RUNS`] is the figure.
pub(crate) async fn late_joiner(exe: &Path) -> anyhow::Result<Section> {
    let mut runs = Vec::new();
    for run in 1..=JOIN_RUNS {
        runs.push(join_once(exe, run).await?);
    }
    let firsts: Vec<f64> = runs.iter().map(|r| r.first_record).collect();
    let worst = firsts.iter().copied().fold(0.0, f64::max);
    let lost: usize = runs.iter().map(|r| r.lost).sum();
    let disordered: usize = runs.iter().map(|r| r.order_violations).sum();
    let duplicates: usize = runs.iter().map(|r| r.duplicates).sum();
    let produced: u64 = runs.iter().map(|r| r.produced).sum();
    let overlaps: usize = runs.iter().map(|r| r.overlaps).sum();
    let rate = runs.iter().map(|r| r.rate).sum::<f64>() / runs.len() as f64;
    let mut s = Section::new("Late joiner at the defaults: a second worker joins one on 8 shards");
    s.what = format!(
        "8 shards, a round of one record per shard every {} ms after the previous round's \
         PutRecords returned; one worker process at the production defaults takes every lease; {} s \
         after its start a second process starts. The figure is the time from spawning the \
         second process to the start of its first non-empty batch (its process start, its \
         first steals and their graceful handoffs included), the slowest of {JOIN_RUNS} runs, \
         each on a fresh stream and lease table.",
        LOAD_EVERY.as_millis(),
        JOIN_AFTER.as_secs()
    );
    s.row("load (measured)", format!("{rate:.0} records/s"));
    s.row("joiner's first record, per run", per_run(&firsts));
    s.row("slowest", format!("{worst:.2} s"));
    s.row(
        "balanced 4 + 4 after the joiner's spawn, per run",
        per_run(&runs.iter().map(|r| r.balanced).collect::<Vec<_>>()),
    );
    s.row(
        "records produced / lost / duplicates (all runs)",
        format!("{produced} / {lost} / {duplicates}"),
    );
    s.row(
        "moments two workers processed one shard at once (all runs)",
        overlaps.to_string(),
    );
    s.figure("late_joiner_first_record_s", worst, "s (max)");
    if worst > JOIN_BOUND_S {
        s.failed = Some(format!(
            "the joiner's first record came {worst:.2} s after its start, above the bound of \
             {JOIN_BOUND_S} s"
        ));
    }
    // Loss outranks a slow join: it is the failure to report first.
    if lost > 0 || disordered > 0 {
        s.failed = Some(format!(
            "{lost} records lost, {disordered} order violations"
        ));
    }
    s.headline = format!(
        "a worker joining 20 s after the first delivers its first record {worst:.2} s after its \
         start (max of {JOIN_RUNS}: {}; bound {JOIN_BOUND_S} s), {lost} lost, {duplicates} \
         duplicates",
        per_run(&firsts)
    );
    s.settings = "Production defaults: worker-liveness renewal, lease 10 s, taker tick 10 s \
                  +/-25 %, idle polls 1 s; processors checkpoint after every batch. The bound \
                  (2 s) is about what the join took before liveness records (0.8 s), plus \
                  the process start."
        .into();
    s.java = "Java KCL 3.1.3 in the same setup on this machine, measured by hand (not by \
              this bench): 45 s to the joiner's first record."
        .into();
    s.limits = "The process start (SDK configuration, DescribeStream, the lease table checks) \
                and then the joiner's first steal: how soon it may ask the holder for a \
                handoff (it first needs to see the holder alive through the liveness \
                records), the holder's reaction to the request at its next renewal or beat \
                (checkpoint, release), the joiner's take, and the first GetShardIterator and \
                GetRecords of the shard."
        .into();
    Ok(s)
}

// ---------------------------------------------------------------------------
// A split under load
// ---------------------------------------------------------------------------

/// Partition keys of the reshard scenario: enough that each child of the
/// split shard gets two.
const RESHARD_KEYS: u32 = 8;

/// Key `i`'s explicit hash key: the middle of the `i`-th of
/// [`RESHARD_KEYS`] equal slices of the hash space, so no key sits on a
/// shard's boundary and a split at a shard's middle divides its keys.
fn spread_keys() -> Vec<(String, String)> {
    let slice = u128::MAX / u128::from(RESHARD_KEYS) + 1;
    (0..RESHARD_KEYS)
        .map(|i| {
            (
                format!("pk-{i}"),
                (u128::from(i) * slice + slice / 2).to_string(),
            )
        })
        .collect()
}

/// The first non-empty batch of `shard` (start, ns).
fn first_record(batches: &[BatchLog], shard: &str) -> Option<u128> {
    batches
        .iter()
        .filter(|b| b.shard == shard && !b.records.is_empty())
        .map(|b| b.start_ns)
        .min()
}

/// A split under load at the defaults: one worker on 2 shards, shard 0
/// split while records flow; the time from the parent's SHARD_END (its
/// processor's `shard_ended`) to the first record of the later child.
pub(crate) async fn reshard_at_defaults(exe: &Path) -> anyhow::Result<Section> {
    let bound = DEFAULTS.taker.as_secs_f64() + 2.0;
    let mut fleet = Fleet::new(exe, 2, DEFAULTS).await?;
    let parent = fleet.shards[0].0.clone();
    let keys = spread_keys();
    let producer = Producer::start_hashed(&fleet, keys.clone(), 0, LOAD_EVERY);
    let producing = Instant::now();
    fleet.spawn("r-1")?;
    let started = Instant::now();
    loop {
        let batches = fleet.batches()?;
        if fleet
            .shards
            .iter()
            .all(|(id, _)| first_record(&batches, id).is_some())
        {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "r-1 did not deliver from both shards within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Records in the parent for a while, and the split at a random phase
    // of the worker's taker tick (10 s +/-25 %).
    tokio::time::sleep(Duration::from_millis(
        3_000 + u64::from(rand::random::<u16>()) % 12_500,
    ))
    .await;
    let split_at = now_ns();
    let children = split_shard_in_half(fleet.env.kinesis(), &fleet.stream, &parent).await?;
    ensure!(
        children.len() == 2,
        "the split of {parent} listed {} children",
        children.len()
    );
    // Which keys each child carries: both must get some, or the figure
    // would wait for a child that never has a record.
    let listing = list_all_shards(fleet.env.kinesis(), &fleet.stream).await?;
    let mut keys_of: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for child in &children {
        let range = listing
            .iter()
            .find(|s| s.shard_id() == child)
            .and_then(|s| s.hash_key_range())
            .with_context(|| format!("{child} has no hash key range"))?;
        let (lo, hi): (u128, u128) = (
            range.starting_hash_key().parse()?,
            range.ending_hash_key().parse()?,
        );
        let mine: Vec<usize> = keys
            .iter()
            .enumerate()
            .filter(|(_, (_, h))| h.parse::<u128>().is_ok_and(|h| (lo..=hi).contains(&h)))
            .map(|(i, _)| i)
            .collect();
        ensure!(!mine.is_empty(), "no partition key hashes to {child}");
        keys_of.insert(child.clone(), mine);
    }
    // Until the parent ended and both children delivered a record.
    let limit = Duration::from_secs(180);
    let (ended_at, child_firsts) = loop {
        let batches = fleet.batches()?;
        let ended = fleet
            .shard_ends()?
            .into_iter()
            .filter(|e| e.shard == parent)
            .map(|e| e.at_ns)
            .min();
        let firsts: Vec<u128> = children
            .iter()
            .filter_map(|c| first_record(&batches, c))
            .collect();
        if let Some(ended) = ended
            && firsts.len() == children.len()
        {
            break (ended, firsts);
        }
        // Generous: the figure is reported even when far above the bound.
        ensure!(
            now_ns() - split_at < limit.as_nanos(),
            "{limit:?} after the split: parent ended: {}, children delivering: {} of 2",
            ended.is_some(),
            firsts.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Records put after the children started, then every record in.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let per_key = producer.stop().await?;
    let rate = f64::from(RESHARD_KEYS) * per_key as f64 / producing.elapsed().as_secs_f64();
    let batches = wait_complete(&fleet, RESHARD_KEYS, per_key, Duration::from_secs(90)).await?;
    fleet.stop_all().await?;
    let verdict = verify(&batches, RESHARD_KEYS, per_key);

    let first_child = child_firsts.iter().copied().min().unwrap_or_default();
    let last_child = child_firsts.iter().copied().max().unwrap_or_default();
    let figure = secs(last_child.saturating_sub(ended_at));
    // Invariant 5 seen from outside: no child batch before the parent's
    // last one ended (the per-key order check covers the records).
    let parent_last_end = shard_span_ns(&batches, &parent).map_or(0, |(_, end)| end);
    let child_set: BTreeSet<&str> = children.iter().map(String::as_str).collect();
    let early_children = batches
        .iter()
        .filter(|b| child_set.contains(b.shard.as_str()) && b.start_ns < parent_last_end)
        .count();
    let records_on = |shard: &str| -> usize {
        batches
            .iter()
            .filter(|b| b.shard == shard)
            .map(|b| b.records.len())
            .sum()
    };

    let mut s = Section::new("Split under load at the defaults: one worker, shard 0 of 2 split");
    s.what = format!(
        "A 2-shard stream, {RESHARD_KEYS} partition keys at explicit hash keys spread over the \
         hash space (a round of one record per key every {} ms after the previous round's \
         PutRecords returned), one worker process at the production defaults. Once it delivers from both shards, \
         SplitShard divides shard 0 at the middle of its range while records flow (at a \
         random phase of the worker's tick). The figure is the time from the parent's \
         SHARD_END (the worker's processor called `shard_ended` for it, logged with a \
         timestamp) to the start of the first non-empty batch of the later of the two \
         children.",
        LOAD_EVERY.as_millis()
    );
    s.row("load (measured)", format!("{rate:.0} records/s"));
    s.row(
        "SplitShard to the parent's SHARD_END",
        format!("{:.2} s", secs(ended_at.saturating_sub(split_at))),
    );
    s.row(
        "SHARD_END to the first child's first record",
        format!("{:.2} s", secs(first_child.saturating_sub(ended_at))),
    );
    s.row(
        "SHARD_END to the later child's first record",
        format!("{figure:.2} s"),
    );
    s.row(
        "records delivered from the parent / the children",
        format!(
            "{} / {}",
            records_on(&parent),
            children
                .iter()
                .map(|c| format!("{} (keys {:?})", records_on(c), keys_of[c]))
                .collect::<Vec<_>>()
                .join(" + ")
        ),
    );
    s.row(
        "records produced / lost / duplicates / order violations",
        format!(
            "{} / {} / {} / {}",
            u64::from(RESHARD_KEYS) * per_key,
            verdict.missing.len(),
            verdict.duplicates,
            verdict.order_violations.len()
        ),
    );
    s.figure("reshard_children_delivering_s", figure, "s");
    if figure > bound {
        s.failed = Some(format!(
            "the later child's first record came {figure:.2} s after the parent's SHARD_END, \
             above the bound of one taker tick + 2 s ({bound:.0} s)"
        ));
    }
    if !verdict.missing.is_empty()
        || !verdict.order_violations.is_empty()
        || !verdict.overlaps.is_empty()
        || early_children > 0
    {
        s.failed = Some(format!(
            "{} records lost, {} order violations, {} overlaps, {early_children} child batches \
             before the parent's last batch ended",
            verdict.missing.len(),
            verdict.order_violations.len(),
            verdict.overlaps.len()
        ));
    }
    s.headline = format!(
        "both children of a split delivering {figure:.2} s after the parent's SHARD_END \
         (bound: taker tick + 2 s = {bound:.0} s), {} lost, {} duplicates",
        verdict.missing.len(),
        verdict.duplicates
    );
    s.settings = "Production defaults: worker-liveness renewal, lease 10 s, taker tick 10 s \
                  +/-25 %, idle polls 1 s, shard sync at its default; processors checkpoint \
                  after every batch and at SHARD_END. kinesis-mock holds the stream UPDATING \
                  for 200 ms after the split."
        .into();
    s.java = "No side-by-side figure.".into();
    s.limits = "The worker that ends the parent creates the children's leases, checkpoints \
                SHARD_END, releases the parent and asks its own taker to look at the table \
                at once (peers are woken through the change counter); the children start at \
                that look (a scan, two takes), then each child's first GetShardIterator and \
                GetRecords. Without that request they would wait for the next tick or shard \
                sync. The parent's SHARD_END itself comes at the worker's next read of the \
                closed shard (idle polls 1 s)."
        .into();
    fleet.cleanup().await;
    Ok(s)
}
