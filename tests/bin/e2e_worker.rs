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

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use kcl::{
    Checkpointer, InitialPosition, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
    Worker,
};
use kcl_tests::e2e::{BatchLog, now_ns};

struct Logger {
    ctx: ShardContext,
    out: std::fs::File,
    every_batch: bool,
    hang_at: Option<u64>,
    hang_marker: String,
}

#[kcl::async_trait]
impl RecordProcessor for Logger {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let start = now_ns();
        if let Some(n) = self.hang_at
            && batch
                .records
                .iter()
                .filter_map(|r| kcl_tests::TestRecord::parse(&r.data))
                .any(|t| t.counter == n)
        {
            // Each shard's processor hangs once; the rest of the process
            // (renewals, other shards) stays healthy.
            let marker = serde_json::json!({ "worker": self.ctx.worker_id, "shard": self.ctx.shard_id, "start_ns": start.to_string() });
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.hang_marker)?;
            f.write_all(format!("{marker}\n").as_bytes())?;
            std::future::pending::<()>().await;
        }
        // A little work, so that two workers on one shard would overlap.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let line = serde_json::to_string(&BatchLog::new(
            &self.ctx.worker_id,
            &self.ctx.shard_id,
            start,
            cp,
            &batch.records,
        ))?;
        // One write per line: every shard's processor appends to this file,
        // and `writeln!` writes the text and the newline separately, so two
        // shards' lines could interleave into one unparsable line.
        self.out.write_all(format!("{line}\n").as_bytes())?;
        self.out.flush()?;
        if self.every_batch {
            cp.checkpoint().await?;
        }
        Ok(())
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        cp.checkpoint().await?;
        Ok(())
    }
}

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("{name} is not set"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,kcl_core=info".into()))
        .with_writer(std::io::stderr)
        .init();
    let worker_id = var("KCL_E2E_WORKER_ID")?;
    let out_path = var("KCL_E2E_OUT")?;
    let every_batch = var("KCL_E2E_CHECKPOINT")? == "batch";
    let hang_at: Option<u64> = std::env::var("KCL_E2E_HANG_AT")
        .ok()
        .map(|v| v.parse())
        .transpose()?;
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
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let builder = Worker::builder(var("KCL_E2E_APP")?)
        .stream(var("KCL_E2E_STREAM")?)
        .sdk_config(&sdk)
        .worker_id(&worker_id)
        .initial_position(InitialPosition::TrimHorizon)
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
    let worker = builder
        .processor(move |ctx: &ShardContext| Logger {
            ctx: ctx.clone(),
            out: std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&out_path)
                .unwrap_or_else(|e| panic!("cannot open {out_path}: {e}")),
            every_batch,
            hang_at,
            hang_marker: hang_marker.clone(),
        })
        .build()?;
    let handle = worker.handle();
    let result = worker.run_until(kcl::shutdown_signal()).await;
    let s = handle.status().leases;
    let stats = serde_json::json!({
        "taken": s.taken, "stolen": s.stolen, "handoffs_completed": s.handoffs_completed,
        "handoffs_forced": s.handoffs_forced, "handed_off": s.handed_off, "lost": s.lost,
        "fenced": s.fenced, "released": s.released, "reclaimed": s.reclaimed,
        "same_id_conflicts": s.same_id_conflicts,
    });
    std::fs::write(&stats_path, stats.to_string())?;
    result?;
    Ok(())
}
