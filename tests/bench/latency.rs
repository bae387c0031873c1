//! Delivery latency, put → `process_records`, of polling and enhanced
//! fan-out side by side, against the emulators the environment points at.
//!
//! For each retrieval mode: a fresh stream and application, one worker, a
//! warm-up record to make sure every shard is being read, then RECORDS
//! single-record puts spaced INTERVAL_MS apart. Each payload carries its
//! wall-clock put time; the processor takes the difference when the batch
//! arrives. Prints p50 / p90 / p99 / max per mode.
//!
//! Usage: `cargo run --release -p kcl-tests --bin latency-bench -- [RECORDS] [INTERVAL_MS]`
//! (default 200 records, 100 ms apart).
//!
//! On kinesis-mock, fan-out latency is dominated by the emulator pushing
//! one event per second per subscription (about 0.5 s on average); AWS
//! pushes records as they arrive (typically ~70 ms).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use kcl::{FanOutConfig, PollingConfig, Retrieval};
use kcl_tests::latency::{
    Seen, latency_worker, now_ns, percentile, put_one, take_sorted, timed_payload, wait_latencies,
};
use kcl_tests::{TestEnv, create_stream, delete_stream, unique_name};
use tokio::time::Instant;

const SHARDS: i32 = 2;

#[derive(Debug)]
struct Report {
    mode: &'static str,
    samples: usize,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
}

async fn measure(
    env: &TestEnv,
    mode: &'static str,
    retrieval: Retrieval,
    records: usize,
    interval: Duration,
) -> anyhow::Result<Report> {
    let kinesis = env.kinesis();
    let stream = unique_name("kcl-latency");
    create_stream(kinesis, &stream, SHARDS).await?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let worker = latency_worker("kcl-latency-app", &stream, env.sdk_config(), &seen)
        .retrieval(retrieval)
        .build()?;
    let handle = worker.handle();
    let running = tokio::spawn(worker.run());

    // Warm up: one record per key until some arrived on every shard's
    // reader (keys spread over both shards), so no measured record waits
    // for a lease or a first subscription.
    let keys: Vec<String> = (0..16).map(|k| format!("pk-{k}")).collect();
    let warm_deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for key in &keys {
            put_one(kinesis, &stream, key, format!("warm:{}", now_ns())).await?;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let warm = seen.lock().unwrap_or_else(|e| e.into_inner()).warm;
        if warm >= 2 * keys.len() {
            break;
        }
        if Instant::now() > warm_deadline {
            bail!("{mode}: the worker did not start reading within 120 s");
        }
    }

    for i in 0..records {
        let key = &keys[i % keys.len()];
        put_one(kinesis, &stream, key, timed_payload()).await?;
        tokio::time::sleep(interval).await;
    }
    if let Err(n) = wait_latencies(&seen, records, Duration::from_secs(60)).await {
        bail!("{mode}: {n} of {records} records processed after 60 s");
    }
    handle.shutdown();
    running.await??;
    delete_stream(kinesis, &stream).await?;

    let latencies = take_sorted(&seen);
    Ok(Report {
        mode,
        samples: latencies.len(),
        p50: percentile(&latencies, 50.0),
        p90: percentile(&latencies, 90.0),
        p99: percentile(&latencies, 99.0),
        max: latencies.last().copied().unwrap_or_default(),
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let records: usize = args
        .next()
        .map(|s| s.parse())
        .transpose()
        .context("RECORDS")?
        .unwrap_or(200);
    let interval = Duration::from_millis(
        args.next()
            .map(|s| s.parse())
            .transpose()
            .context("INTERVAL_MS")?
            .unwrap_or(100),
    );
    let env = TestEnv::connect().await?;
    let modes: Vec<(&'static str, Retrieval)> = vec![
        (
            "polling, defaults (500 ms after records, 1 s idle)",
            Retrieval::Polling(PollingConfig::default()),
        ),
        (
            "polling, time_between_reads 200 ms",
            Retrieval::Polling(
                PollingConfig::builder()
                    .time_between_reads(Duration::from_millis(200))
                    .idle_time_between_reads(Duration::from_millis(200))
                    .build()?,
            ),
        ),
        (
            "enhanced fan-out",
            Retrieval::FanOut(FanOutConfig::default()),
        ),
    ];
    println!(
        "delivery latency put -> process_records, {records} records {interval:?} apart, {SHARDS} shards, endpoint {}",
        std::env::var("AWS_ENDPOINT_URL_KINESIS").unwrap_or_else(|_| "(AWS)".into())
    );
    let mut reports = Vec::new();
    for (mode, retrieval) in modes {
        let report = measure(&env, mode, retrieval, records, interval).await?;
        eprintln!("{report:?}");
        reports.push(report);
    }
    println!(
        "{:<48} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "mode", "samples", "p50", "p90", "p99", "max"
    );
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    for r in &reports {
        println!(
            "{:<48} {:>7} {:>9} {:>9} {:>9} {:>9}",
            r.mode,
            r.samples,
            ms(r.p50),
            ms(r.p90),
            ms(r.p99),
            ms(r.max)
        );
    }
    Ok(())
}
