//! `demo`: records flowing through Kinesis, end to end.
//!
//! Until kcl's `Worker` lands this is a stand-in built on the bare SDK: it
//! creates a 4-shard stream (or uses `KCL_DEMO_STREAM`), produces records for
//! about 20 s, and consumes every shard from TRIM_HORIZON with
//! GetShardIterator + GetRecords, printing per-shard throughput each second and
//! a summary at the end (after about 30 s, or on Ctrl-C).
//!
//! Run it with `make demo`, which starts the emulators first.
//!
//! # Concurrency model
//!
//! `main` owns every task: one producer, one reader per shard, and the
//! per-second reporter, all stopped through one `watch` channel and joined
//! before the summary is printed. Counters are atomics shared through `Arc`s.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use aws_config::BehaviorVersion;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType, StreamStatus};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

const SHARDS: i32 = 4;
const PRODUCE_FOR: Duration = Duration::from_secs(20);
const RUN_FOR: Duration = Duration::from_secs(30);
const PARTITION_KEYS: u64 = 64;
const BATCH: u64 = 16;
const PRODUCE_EVERY: Duration = Duration::from_millis(100);
/// Kinesis allows 5 GetRecords calls per second per shard.
const POLL_EVERY: Duration = Duration::from_millis(250);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    if std::env::var_os("AWS_ENDPOINT_URL_KINESIS").is_none()
        && std::env::var_os("AWS_ENDPOINT_URL").is_none()
    {
        warn!(
            "no AWS_ENDPOINT_URL_KINESIS / AWS_ENDPOINT_URL: using real AWS; \
             `make demo` runs against the local emulators instead"
        );
    }
    let config = aws_config::defaults(BehaviorVersion::latest()).load().await;
    let kinesis = Client::new(&config);

    let (stream, created) = match std::env::var("KCL_DEMO_STREAM") {
        Ok(name) if !name.is_empty() => {
            let exists = kinesis
                .describe_stream_summary()
                .stream_name(&name)
                .send()
                .await
                .is_ok();
            if !exists {
                create_stream(&kinesis, &name).await?;
            }
            (name, !exists)
        }
        _ => {
            let name = format!("kcl-demo-{:08x}", rand::random::<u32>());
            create_stream(&kinesis, &name).await?;
            (name, true)
        }
    };
    wait_active(&kinesis, &stream).await?;
    info!(%stream, "stream ready");

    let shard_ids = list_shard_ids(&kinesis, &stream).await?;
    info!(
        shards = shard_ids.len(),
        "consuming every shard from TRIM_HORIZON"
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let produced = Arc::new(AtomicU64::new(0));
    let producer_done = Arc::new(AtomicBool::new(false));
    let consumed: Arc<Vec<AtomicU64>> =
        Arc::new(shard_ids.iter().map(|_| AtomicU64::new(0)).collect());

    let mut tasks = JoinSet::new();
    tasks.spawn(produce(
        kinesis.clone(),
        stream.clone(),
        Arc::clone(&produced),
        Arc::clone(&producer_done),
        stop_rx.clone(),
    ));
    for (index, shard_id) in shard_ids.iter().enumerate() {
        tasks.spawn(consume_shard(
            kinesis.clone(),
            stream.clone(),
            shard_id.clone(),
            Arc::clone(&consumed),
            index,
            stop_rx.clone(),
        ));
    }

    // Report once a second until the deadline, Ctrl-C, or (once the producer
    // finished) everything produced has been consumed.
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut last: Vec<u64> = vec![0; shard_ids.len()];
    let interrupted = loop {
        tokio::select! {
            _ = ticker.tick() => {}
            signal = tokio::signal::ctrl_c() => {
                signal.context("listening for Ctrl-C")?;
                info!("Ctrl-C: stopping");
                break true;
            }
            // A task ending early is an error (they run until told to stop).
            Some(joined) = tasks.join_next() => {
                joined.context("demo task panicked")??;
                bail!("a demo task stopped unexpectedly");
            }
        }
        let now: Vec<u64> = consumed.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let per_shard: Vec<String> = shard_ids
            .iter()
            .zip(now.iter().zip(&last))
            .map(|(id, (n, l))| format!("{}: {:>4}/s", short(id), n - l))
            .collect();
        let total: u64 = now.iter().sum();
        println!(
            "[{:>2}s] consumed {}  | total produced {}, consumed {}",
            started.elapsed().as_secs(),
            per_shard.join("  "),
            produced.load(Ordering::Relaxed),
            total
        );
        last = now;
        let all_consumed =
            producer_done.load(Ordering::Acquire) && total >= produced.load(Ordering::Relaxed);
        if all_consumed || started.elapsed() >= RUN_FOR {
            break false;
        }
    };

    let _ = stop_tx.send(true);
    while let Some(joined) = tasks.join_next().await {
        joined.context("demo task panicked")??;
    }

    let produced = produced.load(Ordering::Relaxed);
    let consumed: u64 = consumed.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    println!("produced {produced}, consumed {consumed}");

    if created {
        kinesis
            .delete_stream()
            .stream_name(&stream)
            .send()
            .await
            .with_context(|| format!("DeleteStream {stream}"))?;
        info!(%stream, "deleted the demo stream");
    }
    if !interrupted && consumed != produced {
        bail!("consumed {consumed} records but produced {produced}");
    }
    Ok(())
}

/// "shardId-000000000003" -> "shard-3", to keep the per-second line short.
fn short(shard_id: &str) -> String {
    let digits = shard_id
        .trim_start_matches("shardId-")
        .trim_start_matches('0');
    format!("shard-{}", if digits.is_empty() { "0" } else { digits })
}

async fn create_stream(kinesis: &Client, stream: &str) -> anyhow::Result<()> {
    kinesis
        .create_stream()
        .stream_name(stream)
        .shard_count(SHARDS)
        .send()
        .await
        .with_context(|| format!("CreateStream {stream}"))?;
    info!(%stream, shards = SHARDS, "created stream");
    Ok(())
}

async fn wait_active(kinesis: &Client, stream: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = kinesis
            .describe_stream_summary()
            .stream_name(stream)
            .send()
            .await
            .with_context(|| format!("DescribeStreamSummary {stream}"))?;
        if out
            .stream_description_summary()
            .is_some_and(|s| s.stream_status() == &StreamStatus::Active)
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("stream {stream} is not ACTIVE after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn list_shard_ids(kinesis: &Client, stream: &str) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    let mut next_token: Option<String> = None;
    loop {
        let request = match &next_token {
            Some(token) => kinesis.list_shards().next_token(token),
            None => kinesis.list_shards().stream_name(stream),
        };
        let out = request
            .send()
            .await
            .with_context(|| format!("ListShards {stream}"))?;
        ids.extend(out.shards().iter().map(|s| s.shard_id().to_owned()));
        match out.next_token() {
            Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
            _ => return Ok(ids),
        }
    }
}

/// Puts a batch of `BATCH` records every `PRODUCE_EVERY` for `PRODUCE_FOR`,
/// payloads `pk-<key>:<counter>`. Rejected entries are counted as not produced.
async fn produce(
    kinesis: Client,
    stream: String,
    produced: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let until = Instant::now() + PRODUCE_FOR;
    let mut ticker = tokio::time::interval(PRODUCE_EVERY);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut next: u64 = 0;
    while Instant::now() < until {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => break,
        }
        let entries = (next..next + BATCH)
            .map(|n| {
                let key = n % PARTITION_KEYS;
                PutRecordsRequestEntry::builder()
                    .partition_key(format!("pk-{key}"))
                    .data(Blob::new(format!("pk-{key}:{}", n / PARTITION_KEYS)))
                    .build()
                    .context("building PutRecordsRequestEntry")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        next += BATCH;
        match kinesis
            .put_records()
            .stream_name(&stream)
            .set_records(Some(entries))
            .send()
            .await
        {
            Ok(out) => {
                let failed = u64::try_from(out.failed_record_count().unwrap_or(0)).unwrap_or(0);
                if failed > 0 {
                    warn!(failed, "PutRecords rejected some entries");
                }
                produced.fetch_add(BATCH - failed, Ordering::Relaxed);
            }
            // The demo keeps going through a failed call; the summary shows it.
            Err(e) => {
                warn!(error = %aws_sdk_kinesis::error::DisplayErrorContext(&e), "PutRecords failed")
            }
        }
    }
    done.store(true, Ordering::Release);
    info!(
        produced = produced.load(Ordering::Relaxed),
        "producer finished"
    );
    // Stay alive until told to stop: main treats an early exit as a failure.
    let _ = stop.wait_for(|stopped| *stopped).await;
    Ok(())
}

/// Reads one shard from TRIM_HORIZON until stopped, counting records.
async fn consume_shard(
    kinesis: Client,
    stream: String,
    shard_id: String,
    consumed: Arc<Vec<AtomicU64>>,
    index: usize,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut iterator = kinesis
        .get_shard_iterator()
        .stream_name(&stream)
        .shard_id(&shard_id)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .with_context(|| format!("GetShardIterator {shard_id}"))?
        .shard_iterator()
        .map(str::to_owned);
    let mut ticker = tokio::time::interval(POLL_EVERY);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    while let Some(current) = iterator.take() {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return Ok(()),
        }
        match kinesis.get_records().shard_iterator(&current).send().await {
            Ok(out) => {
                consumed[index].fetch_add(out.records().len() as u64, Ordering::Relaxed);
                iterator = out.next_shard_iterator().map(str::to_owned);
            }
            Err(e) => {
                // Retry with the same iterator on the next tick.
                warn!(%shard_id, error = %aws_sdk_kinesis::error::DisplayErrorContext(&e), "GetRecords failed");
                iterator = Some(current);
            }
        }
    }
    info!(%shard_id, "shard closed");
    let _ = stop.wait_for(|stopped| *stopped).await;
    Ok(())
}
