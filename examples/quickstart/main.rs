//! `quickstart`: the smallest complete kcl application.
//!
//! It prints every record of a stream and checkpoints after each batch.
//! Start it twice (in two terminals) and the two processes share the
//! shards; stop one and the other takes its shards over, resuming from the
//! last checkpoint.
//!
//! ```sh
//! . localstack/.run/env        # or real AWS credentials and region
//! cargo run -p kcl-examples --bin quickstart -- my-stream
//! ```
//!
//! Settings: the stream name is the first argument or `KCL_STREAM`; the
//! application name (which also names the DynamoDB lease table) is the
//! second argument or `KCL_APPLICATION_NAME`, by default
//! `<stream>-quickstart` (a lease table serves one stream, so each stream
//! gets its own). Endpoints, region and credentials
//! come from the standard AWS environment, as for any AWS SDK application.

use std::io::IsTerminal;

use anyhow::bail;
use aws_config::BehaviorVersion;
use kcl::{
    Checkpointer, InitialPosition, InitializeInput, ProcessorError, RecordBatch, RecordProcessor,
    ShardContext, Worker,
};

/// One `Printer` per shard: kcl creates it when this process takes the
/// shard's lease and drops it when the lease goes elsewhere. Calls on one
/// processor never overlap, so it can keep per-shard state in plain fields.
struct Printer {
    shard_id: String,
}

#[kcl::async_trait]
impl RecordProcessor for Printer {
    async fn initialize(&mut self, input: &InitializeInput) -> Result<(), ProcessorError> {
        // `checkpoint` is where this shard resumes: a sentinel such as
        // TRIM_HORIZON the first time, the last checkpointed record after a
        // restart or a takeover.
        println!("{}: starting after {}", self.shard_id, input.checkpoint);
        Ok(())
    }

    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        for record in &batch.records {
            // The sub-sequence number is non-zero only for records a KPL
            // producer packed into one aggregate; kcl unpacks them.
            println!(
                "{} {}/{} key={} data={}",
                self.shard_id,
                record.sequence_number,
                record.sub_sequence_number,
                record.partition_key,
                String::from_utf8_lossy(&record.data),
            );
        }
        // Printing is this app's whole side effect, so the batch is done:
        // record that in the lease table. A restart (here or on another
        // process) resumes after the last checkpoint, so records after it
        // are delivered again: at-least-once. Checkpointing less often
        // writes less to DynamoDB but redelivers more after a failure.
        //
        // An error here (the lease moved to another process, or DynamoDB
        // failed even after retries) is returned: kcl then stops this
        // shard or delivers the batch again, and never skips it.
        checkpointer.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        // The process is stopping (Ctrl-C, SIGTERM), or another process is
        // taking this shard to balance the load. Everything delivered was
        // printed, so checkpoint it: the next owner starts right after it
        // instead of repeating the last batch.
        println!("{}: shutting down, checkpointing", self.shard_id);
        checkpointer.checkpoint().await?;
        Ok(())
    }

    async fn lease_lost(&mut self) {
        // Another process owns the shard now; checkpointing would fail.
        // Records since the last checkpoint will be delivered to it again.
        println!("{}: lease lost", self.shard_id);
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // kcl logs through `tracing`; RUST_LOG=debug shows the lease traffic.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let Some(stream) = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("KCL_STREAM").ok())
        .filter(|s| !s.is_empty())
    else {
        bail!("no stream: usage `quickstart <stream>`, or set KCL_STREAM");
    };
    let app = std::env::args()
        .nth(2)
        .or_else(|| std::env::var("KCL_APPLICATION_NAME").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{stream}-quickstart"));

    // Region, credentials and endpoints (AWS_ENDPOINT_URL_KINESIS,
    // AWS_ENDPOINT_URL_DYNAMODB for the local emulators) come from the
    // environment, exactly as for any AWS SDK for Rust application.
    let sdk = aws_config::load_defaults(BehaviorVersion::latest()).await;

    let worker = Worker::builder(&app)
        .stream(&stream)
        .sdk_config(&sdk)
        // Where a shard starts when it has no checkpoint yet. The default,
        // LATEST, skips what is already in the stream; TRIM_HORIZON also
        // shows records put before the quickstart started. Once a shard has
        // a checkpoint, this setting no longer matters for it.
        .initial_position(InitialPosition::TrimHorizon)
        // Called once per shard this process takes.
        .processor(|shard: &ShardContext| Printer {
            shard_id: shard.shard_id.clone(),
        })
        // Every setting is checked here; the error names the bad one.
        .build()?;
    println!(
        "consuming {stream:?} as application {app:?}, worker {}; Ctrl-C to stop",
        worker.worker_id()
    );

    // Runs until Ctrl-C or SIGTERM, then shuts down gracefully: every
    // processor gets `shutdown_requested`, then the leases are released so
    // other processes take the shards at once instead of waiting for them
    // to expire. It fails early for a stream that does not exist or a
    // lease table that cannot be created.
    worker.run_until(kcl::shutdown_signal()).await?;
    Ok(())
}
