//! Retrieval scenarios: polling pacing at the defaults (put -> process
//! latency and `GetRecords` calls a second of a trickling shard, calls of
//! an idle one), and the worker-wide prefetch budget with 1000 shards (a
//! child process, `kcl-bench budget-worker`, so its peak RSS is its own).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use kcl_core::source::{OpenShard, ShardReader, ShardSource, StartPosition};
use kcl_core::{Checkpoint, Lease, LeaseHandle};
use kcl_kinesis::fake::FakeKinesis;
use kcl_kinesis::{KinesisShardSource, PollingConfig};
use kcl_tests::latency::{
    Seen, latency_worker, percentile, put_one, take_sorted, timed_payload, wait_latencies,
};
use kcl_tests::{TestEnv, create_stream, delete_stream, unique_name};
use tokio::process::Command;
use tokio::time::Instant;

use crate::Section;

/// Records a second of the trickle, and how long it lasts.
const TRICKLE_RATE: u64 = 5;
const TRICKLE: Duration = Duration::from_secs(60);
/// How long the idle shard is watched.
const IDLE: Duration = Duration::from_secs(30);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Polling at the production defaults, one shard: a record every 200 ms
/// for a minute, then nothing for half a minute.
pub(crate) async fn polling_pacing() -> anyhow::Result<Section> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis().clone();
    let stream = unique_name("kcl-pacing");
    create_stream(&kinesis, &stream, 1).await?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let worker = latency_worker("kcl-pacing-app", &stream, env.sdk_config(), &seen).build()?;
    let stats = worker.source_stats();
    let handle = worker.handle();
    let running = tokio::spawn(worker.run());

    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.lock().unwrap_or_else(|e| e.into_inner()).warm == 0 {
        put_one(&kinesis, &stream, "pk", "warm".into()).await?;
        ensure!(
            Instant::now() < deadline,
            "the worker read nothing within 120 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Caught up after the warm-up, then the trickle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let records = TRICKLE_RATE * TRICKLE.as_secs();
    let every = Duration::from_nanos(1_000_000_000 / TRICKLE_RATE);
    let before = stats.snapshot();
    let started = Instant::now();
    for i in 0..records {
        tokio::time::sleep_until(started + every * u32::try_from(i)?).await;
        put_one(&kinesis, &stream, "pk", timed_payload()).await?;
    }
    let trickle_secs = started.elapsed().as_secs_f64();
    let trickle_calls = stats.snapshot().get_records_calls - before.get_records_calls;
    if let Err(n) = wait_latencies(&seen, usize::try_from(records)?, Duration::from_secs(30)).await
    {
        bail!("{n} of {records} records processed 30 s after the last put");
    }
    // Idle: nothing more is put.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = stats.snapshot();
    let idle_started = Instant::now();
    tokio::time::sleep(IDLE).await;
    let idle_calls = stats.snapshot().get_records_calls - before.get_records_calls;
    let idle_secs = idle_started.elapsed().as_secs_f64();
    handle.shutdown();
    running.await??;
    delete_stream(&kinesis, &stream).await?;

    let latencies = take_sorted(&seen);
    let (p50, p99) = (percentile(&latencies, 50.0), percentile(&latencies, 99.0));
    let trickle_rate = trickle_calls as f64 / trickle_secs;
    let idle_rate = idle_calls as f64 / idle_secs;
    let defaults = PollingConfig::default();
    let mut s = Section::new("Polling pacing at the defaults: latency and read quota");
    s.what = format!(
        "One worker (kcl facade, default PollingConfig) on a 1-shard stream: {records} \
         single-record puts, one every {} ms ({TRICKLE_RATE} records/s for {} s), each \
         carrying its put time; put -> process_records latency from the processor. Then \
         {} s with no puts. GetRecords calls counted by the source's stats over each phase.",
        every.as_millis(),
        TRICKLE.as_secs(),
        IDLE.as_secs()
    );
    s.row("records", latencies.len().to_string());
    s.row("latency p50", format!("{:.0} ms", ms(p50)));
    s.row("latency p99", format!("{:.0} ms", ms(p99)));
    s.row(
        "latency max",
        format!(
            "{:.0} ms",
            ms(latencies.last().copied().unwrap_or_default())
        ),
    );
    s.row(
        "GetRecords calls/s, 5 records/s",
        format!("{trickle_rate:.2}"),
    );
    s.row("GetRecords calls/s, idle", format!("{idle_rate:.2}"));
    s.figure("polling_latency_p50_ms_5rps", ms(p50).round(), "ms");
    s.figure("polling_latency_p99_ms_5rps", ms(p99).round(), "ms");
    s.figure(
        "polling_calls_per_s_5rps",
        (trickle_rate * 100.0).round() / 100.0,
        "GetRecords/s per shard",
    );
    s.figure(
        "polling_calls_per_s_idle",
        (idle_rate * 100.0).round() / 100.0,
        "GetRecords/s per shard",
    );
    s.headline = format!(
        "5 records/s: p50 {:.0} ms, p99 {:.0} ms at {trickle_rate:.2} GetRecords/s; idle {idle_rate:.2} calls/s",
        ms(p50),
        ms(p99)
    );
    s.settings = format!(
        "The defaults: time_between_reads {:?} after a short batch with records, \
         idle_time_between_reads {:?} after an empty one, 200 ms while MillisBehindLatest > 0, \
         none after a full batch. Lease 6 s and a 1 s taker tick only to start quickly.",
        defaults.time_between_reads(),
        defaults.idle_time_between_reads()
    );
    s.java = "The Java KCL 3.x polls every idleTimeBetweenReadsInMillis (1.5 s by default) \
              whatever the response held; lifion-kinesis every 250 ms (about 4 of the \
              shard's 5 reads/s)."
        .into();
    s.limits = "Latency is the wait for the next call (up to 500 ms, 250 ms on average) plus \
                kinesis-mock's answer on a shared 2-core machine."
        .into();
    s.fail_if(
        ms(p50) > 300.0,
        format!("p50 {:.0} ms is above 300 ms", ms(p50)),
    );
    s.fail_if(
        trickle_rate > 2.0,
        format!("{trickle_rate:.2} calls/s at 5 records/s is above 2"),
    );
    s.fail_if(
        idle_rate > 1.1,
        format!("{idle_rate:.2} idle calls/s is above 1.1"),
    );
    Ok(s)
}

/// Shards, records per shard and payload of the budget scenario.
const BUDGET_SHARDS: usize = 1000;
const BUDGET_PER_SHARD: usize = 20;
const BUDGET_PAYLOAD: usize = 10 * 1024;
const BUDGET_MIB: usize = 128;

/// A fake stream `s` of `shards` shards, each holding `per_shard` records
/// of `payload` bytes: more than a budget lets a worker hold. Returns the
/// fake and the shard ids.
pub(crate) fn full_fake(
    shards: usize,
    per_shard: usize,
    payload: usize,
) -> (Arc<FakeKinesis>, Vec<String>) {
    let fake = Arc::new(FakeKinesis::default());
    let ids = fake.create_stream("s", shards);
    let payload = vec![b'x'; payload];
    for id in &ids {
        for i in 0..per_shard {
            fake.put("s", id, &format!("pk-{i}"), payload.clone());
        }
    }
    (fake, ids)
}

/// A reader on each of `ids` (shards of stream `s`) from TRIM_HORIZON, under
/// a lease that outlasts the run.
pub(crate) async fn open_from_start(
    source: &KinesisShardSource,
    ids: &[String],
) -> anyhow::Result<Vec<Box<dyn ShardReader>>> {
    let mut readers = Vec::new();
    for id in ids {
        let lease = LeaseHandle::detached(
            Lease::new(id, Checkpoint::TrimHorizon),
            Duration::from_secs(3600),
        );
        let request = OpenShard::new("s", id.clone(), StartPosition::TrimHorizon, lease);
        readers.push(source.open(request).await?);
    }
    Ok(readers)
}

/// What the budget worker prints (one line, `key=value` pairs).
fn parse_report(line: &str) -> std::collections::BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `kcl-bench budget-worker`: a KinesisShardSource on the in-memory fake
/// with 1000 shards holding 200 MB, a 128 MiB worker-wide budget, a reader
/// on every shard and no processor: everything the budgets allow is
/// fetched. Prints what the source accounted and this process's peak RSS.
pub(crate) fn budget_worker_main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (fake, ids) = full_fake(BUDGET_SHARDS, BUDGET_PER_SHARD, BUDGET_PAYLOAD);
        let baseline = vm("VmRSS");
        let source = KinesisShardSource::on_fake(Arc::clone(&fake))
            .prefetch_budget(BUDGET_MIB * 1024 * 1024)
            .build()?;
        let mut readers = open_from_start(&source, &ids).await?;
        // Until the fetching stops: the budget is full.
        let mut last = 0;
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let calls = fake.get_records_calls();
            if calls == last {
                break;
            }
            last = calls;
        }
        let held = source.stats();
        // Every shard's consumer drains its own reader, all at once, as a
        // worker's do (one after another, a reader still waiting for budget
        // would wait for readers not drained yet).
        let drains = readers.iter_mut().map(|reader| async move {
            let mut got = 0;
            while got < BUDGET_PER_SHARD {
                got += reader.next_batch().await?.records.len();
            }
            anyhow::Ok(got)
        });
        let mut delivered = 0usize;
        for got in futures::future::join_all(drains).await {
            delivered += got?;
        }
        println!(
            "shards={BUDGET_SHARDS} data_bytes={} budget_bytes={} buffered_bytes={} peak_buffered_bytes={} \
             delivered={delivered} baseline_rss_kb={baseline} peak_rss_kb={}",
            BUDGET_SHARDS * BUDGET_PER_SHARD * BUDGET_PAYLOAD,
            BUDGET_MIB * 1024 * 1024,
            held.buffered_bytes,
            source.stats().peak_buffered_bytes,
            vm("VmHWM")
        );
        anyhow::Ok(())
    })
}

/// A `Vm*` field of this process's status, in kB.
fn vm(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

/// Runs the budget worker and reports its figures.
pub(crate) async fn prefetch_budget(exe: &Path) -> anyhow::Result<Section> {
    let run = Command::new(exe)
        .arg("budget-worker")
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(Duration::from_secs(600), run).await {
        Ok(out) => out?,
        Err(_) => bail!("the budget worker did not finish within 600 s"),
    };
    ensure!(
        out.status.success(),
        "the budget worker failed: {}",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = parse_report(stdout.lines().last().unwrap_or(""));
    let get = |k: &str| -> anyhow::Result<f64> {
        report
            .get(k)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{k} missing from {stdout:?}"))
    };
    let mib = |b: f64| b / 1024.0 / 1024.0;
    let (budget, peak, data) = (
        get("budget_bytes")?,
        get("peak_buffered_bytes")?,
        get("data_bytes")?,
    );
    let (rss, baseline) = (
        get("peak_rss_kb")? / 1024.0,
        get("baseline_rss_kb")? / 1024.0,
    );
    let mut s = Section::new("Memory: the worker-wide prefetch budget with 1000 shards");
    s.what = format!(
        "A KinesisShardSource on the in-memory Kinesis fake (a child process): {BUDGET_SHARDS} \
         shards holding {:.0} MiB of records, a reader on every shard and nobody consuming, \
         with a {BUDGET_MIB} MiB worker-wide budget (each shard's own budget at its 8 MiB \
         default). Fetching goes on until it stops by itself; then every reader is drained.",
        mib(data)
    );
    s.row(
        "records held when fetching stopped",
        format!("{:.1} MiB", mib(get("buffered_bytes")?)),
    );
    s.row(
        "most held at once (accounted)",
        format!("{:.1} MiB of {:.0} MiB", mib(peak), mib(budget)),
    );
    s.row(
        "records delivered after draining",
        format!("{:.0}", get("delivered")?),
    );
    s.row(
        "RSS before the readers (the fake's data)",
        format!("{baseline:.1} MiB"),
    );
    s.row("peak RSS (VmHWM)", format!("{rss:.1} MiB"));
    s.figure(
        "budget_1000_shards_peak_buffered_mib",
        (mib(peak) * 10.0).round() / 10.0,
        "MiB",
    );
    s.figure(
        "budget_1000_shards_peak_rss_mib",
        (rss * 10.0).round() / 10.0,
        "MiB",
    );
    s.headline = format!(
        "1000 shards, {:.0} MiB of records: at most {:.1} MiB held (budget {BUDGET_MIB} MiB), peak RSS {rss:.0} MiB of which {baseline:.0} MiB is the fake's data",
        mib(data),
        mib(peak)
    );
    s.settings = "The default budget is 1 GiB; here 128 MiB so that it binds.".into();
    s.limits = "The fake answers at once, so every shard fetches as soon as budget frees.".into();
    if peak > budget {
        s.failed = Some(format!("{peak} bytes held, over the {budget}-byte budget"));
    }
    Ok(s)
}
