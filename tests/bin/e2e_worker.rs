//! A worker process for the multi-process acceptance tests: a kcl::Worker
//! whose processor appends one JSON line per batch (see
//! `kcl_tests::e2e::BatchLog`) to `KCL_E2E_OUT`, and stops gracefully on
//! SIGTERM.
//!
//! Env: KCL_E2E_APP, KCL_E2E_STREAM, KCL_E2E_WORKER_ID, KCL_E2E_OUT,
//! KCL_E2E_CHECKPOINT=batch|shutdown, plus the standard AWS_* variables.
//! Optional: KCL_E2E_RETRIEVAL=polling|fanout (default polling).
//! Optional: KCL_E2E_HANG_AT=N makes every shard's first batch holding a
//! record with counter N hang forever (a stuck processor), after appending
//! a marker line to `<out>.hang`. At exit the worker's lease counters go to `<out>.stats`.
//! Optional: KCL_E2E_LANES=n processes each shard in n parallel lanes.
//! Optional: KCL_E2E_CHECKPOINT_EVERY_MS=n sets the checkpoint policy to at
//! most one write per shard every n ms (`CheckpointPolicy::every`).
//! Optional: KCL_E2E_SHUTDOWN_CHECKPOINT=none keeps `shutdown_requested`
//! from checkpointing, so that only kcl's own end-of-tenure write of the
//! position the policy held back saves a graceful move from repeats.
//! Optional: KCL_E2E_COUNT_TABLE=<table> replaces the batch log with
//! counting records per key into that table (`kcl_tests::counting`), in
//! KCL_E2E_COUNT_MODE=exactly-once (default) or at-least-once; with
//! KCL_E2E_COUNT_STALL=<file>, the first process to create that file
//! stalls right after a batch's counts are durable (`Counter::stall_once`).
//! Optional: KCL_E2E_POISON=key:counter[,key:counter...] makes every batch
//! holding one of those records fail before anything of it is logged (one
//! line per failed call in `<out>.failures`); with KCL_E2E_DLQ_STREAM set,
//! the worker runs `FailurePolicy::Isolate` sending them to that stream
//! (KCL_E2E_MAX_ATTEMPTS, default 3), every send refused while the file
//! KCL_E2E_DLQ_HOLD names exists (one line per refusal in
//! `<out>.dlq.refused`), and each accepted send's time (ns) appended to
//! `<out>.dlq`.
//! Optional: KCL_E2E_HANG_SHARD_FILE=<path> limits KCL_E2E_HANG_AT to the
//! shard whose id that file holds when the batch comes (none while it does
//! not exist), so a test can pick the shard once it knows who holds what.
//! Optional: KCL_E2E_PROCESSOR_WARN_MS=n and KCL_E2E_PROCESSOR_TIMEOUT_MS=n
//! set `processor_warn_after` and `processor_timeout`;
//! KCL_E2E_LIVENESS_STALL_MS=n sets `liveness_stall_bound`;
//! KCL_E2E_MAX_STEAL=n sets `max_leases_to_steal` (0: no stealing).
//! Optional: KCL_E2E_BALANCE=by-load|by-count sets `balance`, and
//! KCL_E2E_LOAD_REPORT_MS=n sets `load_report_interval`.
//! Optional: KCL_E2E_METRICS_ADDR=<addr> serves `/metrics` and the probes
//! there (`serve_metrics`), KCL_E2E_HEALTH_ADDR=<addr> only the probes
//! (`serve_health`); port 0 picks one, and the bound address is written to
//! `<out>.addr` once the worker is built.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use std::collections::HashSet;
use std::path::PathBuf;

use kcl::{
    CheckpointPolicy, Checkpointer, FailedRecord, FailureDestination, FailurePolicy,
    InitialPosition, KinesisDestination, PoisonPolicy, ProcessorError, RecordBatch,
    RecordProcessor, ShardContext, Worker, WorkerBuilder,
};
use kcl_tests::e2e::{
    BatchLog, env_millis, env_parsed, now_ns, open_log, required_var, write_lease_stats,
};

struct Logger {
    ctx: ShardContext,
    out: std::fs::File,
    every_batch: bool,
    checkpoint_at_shutdown: bool,
    hang_at: Option<u64>,
    hang_shard_file: Option<PathBuf>,
    hang_marker: String,
    poison: HashSet<(u32, u64)>,
    failures: String,
}

fn append(path: &str, line: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(format!("{line}\n").as_bytes())
}

/// The Kinesis destination, refusing its sends while the test holds it
/// (so the test reads the checkpoint while it refuses, not racing the
/// accept), and logging each refusal and acceptance.
struct LoggedDestination {
    inner: KinesisDestination,
    hold: Option<PathBuf>,
    log: String,
}

#[kcl::async_trait]
impl FailureDestination for LoggedDestination {
    async fn send(&self, failed: &[FailedRecord]) -> Result<(), ProcessorError> {
        if self.hold.as_ref().is_some_and(|hold| hold.exists()) {
            append(&format!("{}.refused", self.log), &now_ns().to_string())?;
            return Err("refused by the test".into());
        }
        self.inner.send(failed).await?;
        append(&self.log, &now_ns().to_string())?;
        Ok(())
    }
}

#[kcl::async_trait]
impl RecordProcessor for Logger {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let start = now_ns();
        if batch
            .records
            .iter()
            .filter_map(|r| kcl_tests::TestRecord::parse(&r.data))
            .any(|t| self.poison.contains(&(t.key, t.counter)))
        {
            let line = serde_json::json!({ "size": batch.records.len(), "ns": start.to_string() });
            append(&self.failures, &line.to_string())?;
            return Err("a poison record".into());
        }
        if let Some(n) = self.hang_at
            && batch
                .records
                .iter()
                .filter_map(|r| kcl_tests::TestRecord::parse(&r.data))
                .any(|t| t.counter == n)
            && self.hang_shard_file.as_ref().is_none_or(|file| {
                std::fs::read_to_string(file).is_ok_and(|shard| shard.trim() == self.ctx.shard_id)
            })
        {
            // Each shard's processor hangs once; the rest of the process
            // (renewals, other shards) stays healthy.
            let marker = serde_json::json!({ "worker": self.ctx.worker_id, "shard": self.ctx.shard_id, "start_ns": start.to_string() });
            append(&self.hang_marker, &marker.to_string())?;
            std::future::pending::<()>().await;
        }
        // A little work, so that two workers on one shard would overlap.
        tokio::time::sleep(Duration::from_millis(20)).await;
        BatchLog::new(&self.ctx, start, cp, &batch.records).append_to(&mut self.out)?;
        if self.every_batch {
            cp.checkpoint().await?;
        }
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        if self.checkpoint_at_shutdown {
            cp.checkpoint().await?;
        }
        Ok(())
    }
}

/// The processor limits, probes and balancing knobs the observability
/// tests set (see the module doc); each left at kcl's default when unset.
fn observability(mut builder: WorkerBuilder) -> anyhow::Result<WorkerBuilder> {
    type Setter<T> = fn(WorkerBuilder, T) -> WorkerBuilder;
    let durations: [(&str, Setter<Duration>); 4] = [
        (
            "KCL_E2E_PROCESSOR_WARN_MS",
            WorkerBuilder::processor_warn_after,
        ),
        (
            "KCL_E2E_PROCESSOR_TIMEOUT_MS",
            WorkerBuilder::processor_timeout,
        ),
        (
            "KCL_E2E_LIVENESS_STALL_MS",
            WorkerBuilder::liveness_stall_bound,
        ),
        (
            "KCL_E2E_LOAD_REPORT_MS",
            WorkerBuilder::load_report_interval,
        ),
    ];
    for (name, set) in durations {
        if let Some(d) = env_millis(name)? {
            builder = set(builder, d);
        }
    }
    let addrs: [(&str, Setter<std::net::SocketAddr>); 2] = [
        ("KCL_E2E_METRICS_ADDR", WorkerBuilder::serve_metrics),
        ("KCL_E2E_HEALTH_ADDR", WorkerBuilder::serve_health),
    ];
    for (name, set) in addrs {
        if let Some(a) = env_parsed(name)? {
            builder = set(builder, a);
        }
    }
    if let Some(n) = env_parsed("KCL_E2E_MAX_STEAL")? {
        builder = builder.max_leases_to_steal(n);
    }
    match std::env::var("KCL_E2E_BALANCE").as_deref() {
        Err(_) => {}
        Ok("by-load") => builder = builder.balance(kcl::Balance::ByLoad),
        Ok("by-count") => builder = builder.balance(kcl::Balance::ByCount),
        Ok(other) => anyhow::bail!("KCL_E2E_BALANCE={other}: expected by-load or by-count"),
    }
    Ok(builder)
}

/// Writes the endpoint's bound address to `<out>.addr` (through a rename,
/// so a test polling for the file never reads half of it).
fn publish_endpoint(worker: &Worker, out_path: &str) -> anyhow::Result<()> {
    if let Some(bound) = worker.metrics_addr().or(worker.health_addr()) {
        let path = format!("{out_path}.addr");
        std::fs::write(format!("{path}.tmp"), bound.to_string())?;
        std::fs::rename(format!("{path}.tmp"), &path)?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,kcl_core=info".into()))
        .with_writer(std::io::stderr)
        .init();
    let worker_id = required_var("KCL_E2E_WORKER_ID")?;
    let out_path = required_var("KCL_E2E_OUT")?;
    // The processor factory below takes `out_path` itself.
    let endpoint_out = out_path.clone();
    let every_batch = required_var("KCL_E2E_CHECKPOINT")? == "batch";
    let checkpoint_at_shutdown = match std::env::var("KCL_E2E_SHUTDOWN_CHECKPOINT").as_deref() {
        Err(_) | Ok("checkpoint") => true,
        Ok("none") => false,
        Ok(other) => {
            anyhow::bail!("KCL_E2E_SHUTDOWN_CHECKPOINT={other}: expected checkpoint or none")
        }
    };
    let checkpoint_policy = env_millis("KCL_E2E_CHECKPOINT_EVERY_MS")?
        .map_or_else(CheckpointPolicy::every_call, CheckpointPolicy::every);
    let hang_at: Option<u64> = env_parsed("KCL_E2E_HANG_AT")?;
    let hang_shard_file = std::env::var_os("KCL_E2E_HANG_SHARD_FILE").map(PathBuf::from);
    let hang_marker = format!("{out_path}.hang");
    let stats_path = format!("{out_path}.stats");
    let fan_out = match std::env::var("KCL_E2E_RETRIEVAL").as_deref() {
        Err(_) | Ok("polling") => false,
        Ok("fanout") => true,
        Ok(other) => anyhow::bail!("KCL_E2E_RETRIEVAL={other}: expected polling or fanout"),
    };
    let renewal = match std::env::var("KCL_E2E_RENEWAL").as_deref() {
        Err(_) | Ok("liveness") => kcl::LeaseRenewal::WorkerLiveness,
        Ok("per-lease") => kcl::LeaseRenewal::PerLease,
        Ok(other) => anyhow::bail!("KCL_E2E_RENEWAL={other}: expected liveness or per-lease"),
    };
    let poison: HashSet<(u32, u64)> = match std::env::var("KCL_E2E_POISON") {
        Err(_) => HashSet::new(),
        Ok(list) => list
            .split(',')
            .map(|r| {
                let (k, c) = r
                    .split_once(':')
                    .with_context(|| format!("KCL_E2E_POISON: {r:?} is not key:counter"))?;
                Ok((k.parse()?, c.parse()?))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let lanes: usize = env_parsed("KCL_E2E_LANES")?.unwrap_or(1);
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let policy = match std::env::var("KCL_E2E_DLQ_STREAM") {
        Err(_) => FailurePolicy::Retry,
        Ok(stream) => {
            let attempts: u32 = env_parsed("KCL_E2E_MAX_ATTEMPTS")?.unwrap_or(3);
            let destination = LoggedDestination {
                inner: KinesisDestination::new(aws_sdk_kinesis::Client::new(&sdk), stream),
                hold: std::env::var_os("KCL_E2E_DLQ_HOLD").map(PathBuf::from),
                log: format!("{out_path}.dlq"),
            };
            FailurePolicy::Isolate(PoisonPolicy::send_to(destination).max_attempts(attempts))
        }
    };
    let failures = format!("{out_path}.failures");
    let builder = Worker::builder(required_var("KCL_E2E_APP")?)
        .stream(required_var("KCL_E2E_STREAM")?)
        .sdk_config(&sdk)
        .worker_id(&worker_id)
        .initial_position(InitialPosition::TrimHorizon)
        .failure_policy(policy)
        .parallelism_per_shard(lanes)
        .checkpoint_policy(checkpoint_policy)
        .lease_duration(Duration::from_secs(6))
        .renewal(renewal)
        .taker_interval(Duration::from_secs(2))
        .parent_poll_interval(Duration::from_secs(1))
        .shard_sync_interval(Duration::from_secs(10));
    let builder = if fan_out {
        // kinesis-mock never announces a shard's end over fan-out: look for
        // it every 2 s so resharding tests end in reasonable time.
        let config = kcl::FanOutConfig::builder()
            .closed_shard_check_interval(Some(Duration::from_secs(2)))
            .build()?;
        builder.retrieval(kcl::Retrieval::FanOut(config))
    } else {
        builder.idle_time_between_reads(Duration::from_millis(200))
    };
    let builder = observability(builder)?;
    if let Ok(table) = std::env::var("KCL_E2E_COUNT_TABLE") {
        let mode = kcl_tests::counting::Mode::parse(
            &std::env::var("KCL_E2E_COUNT_MODE").unwrap_or_else(|_| "exactly-once".into()),
        )?;
        let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
        let exactly_once = kcl::ExactlyOnce::new(dynamodb.clone(), required_var("KCL_E2E_APP")?);
        let worker = builder
            .processor(move |_: &ShardContext| kcl_tests::counting::Counter {
                mode,
                dynamodb: dynamodb.clone(),
                table: table.clone(),
                exactly_once: exactly_once.clone(),
                work: Duration::from_millis(300),
                stall_once: std::env::var_os("KCL_E2E_COUNT_STALL").map(PathBuf::from),
            })
            .build()?;
        publish_endpoint(&worker, &endpoint_out)?;
        return worker
            .run_until(kcl::shutdown_signal())
            .await
            .map_err(Into::into);
    }
    let worker = builder
        .processor(move |ctx: &ShardContext| Logger {
            ctx: ctx.clone(),
            out: open_log(&out_path),
            every_batch,
            checkpoint_at_shutdown,
            hang_at,
            hang_shard_file: hang_shard_file.clone(),
            hang_marker: hang_marker.clone(),
            poison: poison.clone(),
            failures: failures.clone(),
        })
        .build()?;
    publish_endpoint(&worker, &endpoint_out)?;
    let handle = worker.handle();
    let result = worker.run_until(kcl::shutdown_signal()).await;
    write_lease_stats(&handle, &stats_path)?;
    result?;
    Ok(())
}
