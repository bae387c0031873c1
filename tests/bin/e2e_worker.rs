//! A worker process for the multi-process acceptance tests: a kcl::Worker
//! whose processor appends one JSON line per batch (see
//! `kcl_tests::e2e::BatchLog`) to `KCL_E2E_OUT`, and stops gracefully on
//! SIGTERM.
//!
//! Env: KCL_E2E_APP, KCL_E2E_STREAM, KCL_E2E_WORKER_ID, KCL_E2E_OUT,
//! KCL_E2E_CHECKPOINT=batch|shutdown, plus the standard AWS_* variables.

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
}

#[kcl::async_trait]
impl RecordProcessor for Logger {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let start = now_ns();
        // A little work, so that two workers on one shard would overlap.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let line = serde_json::to_string(&BatchLog::new(
            &self.ctx.worker_id,
            &self.ctx.shard_id,
            start,
            &batch.records,
        ))?;
        writeln!(self.out, "{line}")?;
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
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let worker = Worker::builder(var("KCL_E2E_APP")?)
        .stream(var("KCL_E2E_STREAM")?)
        .sdk_config(&sdk)
        .worker_id(&worker_id)
        .initial_position(InitialPosition::TrimHorizon)
        .lease_duration(Duration::from_secs(6))
        .taker_interval(Duration::from_secs(2))
        .idle_time_between_reads(Duration::from_millis(200))
        .parent_poll_interval(Duration::from_secs(1))
        .shard_sync_interval(Duration::from_secs(10))
        .processor(move |ctx: &ShardContext| Logger {
            ctx: ctx.clone(),
            out: std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&out_path)
                .unwrap_or_else(|e| panic!("cannot open {out_path}: {e}")),
            every_batch,
        })
        .build()?;
    worker.run_until(kcl::shutdown_signal()).await?;
    Ok(())
}
