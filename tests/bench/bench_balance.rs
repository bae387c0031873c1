//! Load-aware balance at the defaults: eight shards, two of them carrying
//! 80 % of the bytes, two then three worker processes, run twice at once
//! on two streams: balanced by load (the default) and by count.
//!
//! Both fleets start alike: two workers split the idle stream by count,
//! and the two shards made hot are two the first worker holds (count
//! balance's worst case). Production starts; after 90 s a third worker
//! joins; the fleet then runs five minutes. The figures come from the
//! batch logs over the last two minutes: each worker's bytes a second, the
//! most loaded against the fleet's mean; and from a watch of the lease
//! table, one read a second: lease moves (a completed handoff counts once)
//! before the last two minutes and within them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use kcl_tests::e2e::{KEYS, now_ns, verify};
use kcl_tests::skew::{COLD_BYTES, HOT_BYTES, Skew, SkewedProducer, max_over_mean};
use tokio::time::Instant;

use crate::Section;
use crate::bench_fleet::{DEFAULTS, Fleet, moves, settle, wait_complete};

/// When the third worker starts, after production started.
const JOIN_AFTER: Duration = Duration::from_secs(90);
/// How long the three workers then run.
const STEADY: Duration = Duration::from_secs(300);
/// The window the figures are measured over: the end of the run.
const LAST: Duration = Duration::from_secs(120);
/// One round of records (one per shard) every 250 ms.
const ROUND: Duration = Duration::from_millis(250);

/// What one fleet did.
struct Run {
    /// Each worker's bytes a second over the last two minutes.
    rates: BTreeMap<String, f64>,
    /// Lease counts at the end.
    counts: BTreeMap<String, usize>,
    /// Lease moves from the start of production to the last two minutes.
    moves_before: usize,
    /// Lease moves within the last two minutes.
    moves_last: usize,
    lost: usize,
    duplicates: usize,
    overlaps: usize,
}

async fn run(exe: &Path, mode: &str) -> anyhow::Result<Run> {
    let mut fleet = Fleet::new(exe, KEYS as i32, DEFAULTS).await?;
    fleet
        .extra_env
        .push(("KCL_BENCH_BALANCE".into(), mode.into()));
    let ids = [
        format!("{mode}-1"),
        format!("{mode}-2"),
        format!("{mode}-3"),
    ];
    let id: Vec<&str> = ids.iter().map(String::as_str).collect();
    fleet.spawn(id[0])?;
    fleet.spawn(id[1])?;
    settle(&fleet, &id[..2], KEYS as usize, Duration::from_secs(120)).await?;
    let leases = fleet.leases().await?;
    let first: Vec<&str> = leases
        .iter()
        .filter(|(_, o)| o.as_deref() == Some(id[0]))
        .map(|(k, _)| k.as_str())
        .collect();
    anyhow::ensure!(first.len() >= 2, "{} holds {first:?}", id[0]);
    let skew = Skew::of_shards(&fleet.shards, [first[0], first[1]])?;
    let producer = SkewedProducer::start(fleet.env.kinesis(), &fleet.stream, &skew, 0, ROUND);
    let started = Instant::now();
    let mut joined = false;
    let mut last = fleet.leases().await?;
    let (mut moves_before, mut moves_last) = (0, 0);
    let end = started + JOIN_AFTER + STEADY;
    let window_from = end - LAST;
    let mut window_ns = None;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !joined && started.elapsed() >= JOIN_AFTER {
            fleet.spawn(id[2])?;
            joined = true;
        }
        if window_ns.is_none() && Instant::now() >= window_from {
            window_ns = Some(now_ns());
        }
        let now = fleet.leases().await?;
        let moved = moves(&last, &now);
        if window_ns.is_some() {
            moves_last += moved;
        } else {
            moves_before += moved;
        }
        last = now;
    }
    let to = now_ns();
    let from = window_ns.context("the run never reached its last two minutes")?;
    let per_key = producer.stop().await?;
    let batches = wait_complete(&fleet, KEYS, per_key, Duration::from_secs(120)).await?;
    fleet.stop_all().await?;
    let verdict = verify(&batches, KEYS, per_key);
    let mut counts: BTreeMap<String, usize> = id.iter().map(|w| ((*w).to_owned(), 0)).collect();
    for owner in last.values().flatten() {
        *counts.entry(owner.clone()).or_default() += 1;
    }
    let rates = skew.rates(&batches, &id, from, to);
    fleet.cleanup().await;
    Ok(Run {
        rates,
        counts,
        moves_before,
        moves_last,
        lost: verdict.missing.len(),
        duplicates: verdict.duplicates,
        overlaps: verdict.overlaps.len(),
    })
}

fn rates_text(r: &Run) -> String {
    r.rates
        .iter()
        .map(|(w, b)| format!("{w} {:.1} KB/s ({} leases)", b / 1024.0, r.counts[w]))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `load-balance` scenario.
pub(crate) async fn load_balance(exe: &Path) -> anyhow::Result<Section> {
    let (by_load, by_count) = tokio::join!(run(exe, "by-load"), run(exe, "by-count"));
    let (by_load, by_count) = (by_load?, by_count?);
    let load_ratio = max_over_mean(&by_load.rates);
    let count_ratio = max_over_mean(&by_count.rates);
    let mut s = Section::new("Load-aware balance: 8 shards, 2 of them carrying 80 % of the bytes");
    s.what = format!(
        "Two fleets at once, on two streams of 8 shards: one balanced by load (the default), one \
         by count. A round of one record per shard every {} ms, {HOT_BYTES}-byte records on two \
         shards and {COLD_BYTES}-byte ones on the six others (80 % of the bytes on the two). Two \
         workers split the idle stream by count; the hot shards are two the first worker holds \
         (count balance's worst case). Production starts; {} s later a third worker joins; the \
         fleet then runs {} s. Figures over the last {} s, from the batch logs: each worker's \
         bytes a second, the most loaded over the fleet's mean (the best three workers can do is \
         1.2: a hot shard alone carries 40 %). Lease moves from a read of the lease table every \
         second (a completed handoff counts once).",
        ROUND.as_millis(),
        JOIN_AFTER.as_secs(),
        STEADY.as_secs(),
        LAST.as_secs()
    );
    s.row(
        "by load: most loaded / mean, last 2 min",
        format!("{load_ratio:.2}"),
    );
    s.row(
        "by count: most loaded / mean, last 2 min",
        format!("{count_ratio:.2}"),
    );
    s.row(
        "by load: lease moves to converge (before the last 2 min)",
        by_load.moves_before.to_string(),
    );
    s.row(
        "by load: lease moves in the last 2 min",
        by_load.moves_last.to_string(),
    );
    s.row(
        "by count: lease moves before / in the last 2 min",
        format!("{} / {}", by_count.moves_before, by_count.moves_last),
    );
    s.row("by load: workers", rates_text(&by_load));
    s.row("by count: workers", rates_text(&by_count));
    s.row(
        "records lost / repeated / shards processed twice at once (both fleets)",
        format!(
            "{} / {} / {}",
            by_load.lost + by_count.lost,
            by_load.duplicates + by_count.duplicates,
            by_load.overlaps + by_count.overlaps
        ),
    );
    s.settings = "Production defaults: lease 10 s, taker tick 10 s +/-25 %, liveness records, \
                  load figures measured over and written at most every 60 s \
                  (`load_report_interval`), only when they moved by more than a fifth; \
                  processors checkpoint after every batch."
        .into();
    s.java = "The Java KCL 3.x balances by throughput and worker CPU through a leader and a \
              second table; kcl's workers each decide for themselves from the figures on the \
              lease items (the Java KCL's own `throughputKBps`)."
        .into();
    s.limits = "kinesis-mock and DynamoDB Local share the two cores with six workers; the \
                figures are ratios of bytes processed, which the machine's speed does not move."
        .into();
    s.headline = format!(
        "most loaded worker {load_ratio:.2} x the mean by load, {count_ratio:.2} x by count; \
         {} moves to converge, {} in the last 2 min",
        by_load.moves_before, by_load.moves_last
    );
    s.figure("load_balance_max_over_mean_skewed", load_ratio, "ratio");
    s.figure("count_balance_max_over_mean_skewed", count_ratio, "ratio");
    s.figure(
        "load_balance_moves_to_converge",
        by_load.moves_before as f64,
        "moves",
    );
    s.figure(
        "load_balance_moves_last_2_min",
        by_load.moves_last as f64,
        "moves",
    );
    s.fail_if(
        by_load.lost + by_count.lost + by_load.overlaps + by_count.overlaps > 0,
        "records lost or a shard processed twice at once",
    );
    s.fail_if(
        by_load.duplicates + by_count.duplicates > 0,
        "records repeated: a lease moved other than by graceful handoff",
    );
    s.fail_if(
        load_ratio > 1.25,
        format!("by load the most loaded worker is {load_ratio:.2} x the mean (bound 1.25)"),
    );
    s.fail_if(
        by_load.moves_last > 0,
        format!(
            "{} lease moves in the last 2 min by load",
            by_load.moves_last
        ),
    );
    Ok(s)
}
