//! `kcl consume`: a ready-made worker that writes every record as one
//! JSON line to stdout.
//!
//! A batch is written and flushed under one lock (lines of different
//! shards never interleave), then checkpointed: the checkpoint never runs
//! ahead of what reached stdout. If stdout fails (a closed pipe), the
//! worker stops gracefully, checkpointing only what was written.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use aws_smithy_types::date_time::{DateTime, Format};
use base64::Engine as _;
use clap::Args;
use kcl::{
    Checkpoint, Checkpointer, InitialPosition, ProcessorError, Record, RecordBatch,
    RecordProcessor, ShardContext, Worker,
};
use serde::Serialize;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::watch;
use tracing::info;

use crate::{args, aws};

/// Arguments of `kcl consume`.
#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// The application name: names the lease table; copies with the same
    /// name share the shards.
    #[arg(long)]
    app: String,
    /// A stream to consume (repeat for several).
    #[arg(long = "stream", required = true)]
    streams: Vec<String>,
    /// Where shards without a checkpoint start: TRIM_HORIZON, LATEST, or
    /// AT_TIMESTAMP=<RFC 3339 time or epoch seconds>. Checkpoints win.
    #[arg(long, default_value = "LATEST", value_parser = args::initial_position)]
    position: InitialPosition,
    /// The lease table (default: the application name).
    #[arg(long)]
    table: Option<String>,
    /// This copy's id in the lease table (default: host name and a random
    /// suffix).
    #[arg(long)]
    worker_id: Option<String>,
    /// How long peers wait before taking a silent copy's shards (default
    /// 10s).
    #[arg(long, value_parser = args::duration)]
    lease_duration: Option<Duration>,
    /// How often leases are balanced between copies (default 10s).
    #[arg(long, value_parser = args::duration)]
    taker_interval: Option<Duration>,
    /// How often this copy renews its hold (default half the lease
    /// duration); must leave the lease duration room for a renewal to
    /// land (checked at start, naming the setting).
    #[arg(long, value_parser = args::duration)]
    renew_interval: Option<Duration>,
    /// Pause after an empty read of a shard (default 1s).
    #[arg(long, value_parser = args::duration)]
    idle_time_between_reads: Option<Duration>,
    /// How long a graceful stop waits for the shards to checkpoint
    /// (default 25s).
    #[arg(long, value_parser = args::duration)]
    shutdown_timeout: Option<Duration>,
    /// Serve Prometheus metrics, /healthz and /readyz on this address
    /// (for example 127.0.0.1:9090).
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Add to each line who processed it and when: `worker` (this copy's
    /// id), `tenure` (its tenure of the shard's lease) and `processed_at`
    /// (RFC 3339, when the batch was written), so one file can audit a
    /// whole fleet.
    #[arg(long)]
    meta: bool,
}

/// `kcl consume`.
pub(crate) async fn run(a: ConsumeArgs) -> anyhow::Result<()> {
    let sdk = aws::sdk_config(false).await;
    let out = Arc::new(Output::new());
    let meta = a.meta;
    // Every option is a field of the library's settings, applied to the
    // builder as a deployment's environment would be.
    let mut settings = kcl::Settings::default();
    settings.streams = Some(a.streams);
    settings.initial_position = Some(a.position);
    settings.table_name = a.table;
    settings.worker_id = a.worker_id;
    settings.lease_duration = a.lease_duration;
    settings.taker_interval = a.taker_interval;
    settings.renew_interval = a.renew_interval;
    settings.idle_time_between_reads = a.idle_time_between_reads;
    settings.shutdown_timeout = a.shutdown_timeout;
    settings.serve_metrics = a.metrics_addr;
    let builder = settings
        .apply(Worker::builder(&a.app))?
        .sdk_config(&sdk)
        .processor({
            let out = Arc::clone(&out);
            move |shard: &ShardContext| JsonLines::new(shard, Arc::clone(&out), meta)
        });
    let worker = builder.build()?;
    info!(
        application = %a.app,
        worker = worker.worker_id(),
        metrics = ?worker.metrics_addr(),
        "consuming; SIGTERM or Ctrl-C stops gracefully"
    );
    let mut failed = out.failed.subscribe();
    let stop = async move {
        tokio::select! {
            () = kcl::shutdown_signal() => {}
            _ = failed.wait_for(|f| f.is_some()) => {}
        }
    };
    worker.run_until(stop).await?;
    if let Some(e) = out.failed.borrow().as_ref() {
        bail!("writing to stdout failed ({e}); stopped after checkpointing what was written");
    }
    Ok(())
}

/// Stdout, shared by every shard's processor.
struct Output {
    stdout: tokio::sync::Mutex<tokio::io::Stdout>,
    /// Set (with the error) once a write failed; stops the worker.
    failed: watch::Sender<Option<String>>,
}

impl Output {
    fn new() -> Self {
        Output {
            stdout: tokio::sync::Mutex::new(tokio::io::stdout()),
            failed: watch::Sender::new(None),
        }
    }

    /// Writes and flushes `text` as one unit.
    async fn write(&self, text: &str) -> std::io::Result<()> {
        let mut stdout = self.stdout.lock().await;
        stdout.write_all(text.as_bytes()).await?;
        stdout.flush().await
    }
}

/// One JSON line.
#[derive(Debug, Serialize)]
struct Line<'a> {
    stream: &'a str,
    shard: &'a str,
    partition_key: &'a str,
    sequence: &'a str,
    sub_sequence: u64,
    /// When Kinesis accepted the record, RFC 3339.
    arrival: Option<String>,
    data: Cow<'a, str>,
    /// "utf-8", or "base64" when the payload is not valid UTF-8.
    data_encoding: &'static str,
    /// With `--meta`: who processed the record, and when.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    meta: Option<&'a Meta>,
}

/// What `--meta` adds to a line.
#[derive(Debug, Serialize)]
struct Meta {
    worker: String,
    tenure: String,
    /// When the batch was written, RFC 3339.
    processed_at: String,
}

/// Formats `record` as one line, newline included.
fn line(
    stream: &str,
    shard: &str,
    record: &Record,
    meta: Option<&Meta>,
) -> Result<String, serde_json::Error> {
    let (data, data_encoding) = match std::str::from_utf8(&record.data) {
        Ok(text) => (Cow::Borrowed(text), "utf-8"),
        Err(_) => (
            Cow::Owned(base64::engine::general_purpose::STANDARD.encode(&record.data)),
            "base64",
        ),
    };
    let line = Line {
        stream,
        shard,
        partition_key: &record.partition_key,
        sequence: &record.sequence_number,
        sub_sequence: record.sub_sequence_number,
        arrival: record
            .approximate_arrival
            .and_then(|t| DateTime::from(t).fmt(Format::DateTime).ok()),
        data,
        data_encoding,
        meta,
    };
    let mut text = serde_json::to_string(&line)?;
    text.push('\n');
    Ok(text)
}

/// Orders (sequence, sub-sequence) pairs; sequence numbers are decimal
/// strings of up to 128 bits, without leading zeros.
fn position_cmp(a: (&str, u64), b: (&str, u64)) -> Ordering {
    (a.0.len(), a.0, a.1).cmp(&(b.0.len(), b.0, b.1))
}

/// Writes one shard's records.
struct JsonLines {
    stream: String,
    shard: String,
    out: Arc<Output>,
    /// The last record written to stdout. A batch delivered again (its
    /// checkpoint failed and the default policy retried it) is written
    /// only from after this record.
    written: Option<(String, u64)>,
    /// Lines written, for the log line at the end.
    lines: u64,
    /// This copy's id, when lines carry `--meta`.
    meta_worker: Option<String>,
}

impl JsonLines {
    fn new(shard: &ShardContext, out: Arc<Output>, meta: bool) -> Self {
        JsonLines {
            stream: shard.stream.clone(),
            shard: shard.shard_id.clone(),
            out,
            written: None,
            lines: 0,
            meta_worker: meta.then(|| shard.worker_id.clone()),
        }
    }
}

#[kcl::async_trait]
impl RecordProcessor for JsonLines {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        let fresh = batch.records.iter().filter(|r| {
            self.written.as_ref().is_none_or(|(seq, sub)| {
                position_cmp((&r.sequence_number, r.sub_sequence_number), (seq, *sub))
                    == Ordering::Greater
            })
        });
        let meta = self.meta_worker.as_ref().map(|worker| Meta {
            worker: worker.clone(),
            tenure: checkpointer.lease_tenure().to_owned(),
            processed_at: DateTime::from(std::time::SystemTime::now())
                .fmt(Format::DateTime)
                .unwrap_or_default(),
        });
        let mut text = String::new();
        let mut count = 0u64;
        let mut last = None;
        for record in fresh {
            text.push_str(&line(&self.stream, &self.shard, record, meta.as_ref())?);
            count += 1;
            last = Some((record.sequence_number.clone(), record.sub_sequence_number));
        }
        if let Some(last) = last {
            if let Err(e) = self.out.write(&text).await {
                self.out.failed.send_replace(Some(e.to_string()));
                return Err(e.into());
            }
            self.written = Some(last);
            self.lines += count;
        }
        // Everything delivered is on stdout now.
        checkpointer.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        // Only what reached stdout: after a failed write the last batch is
        // not done.
        if let Some((seq, sub)) = &self.written
            && *checkpointer.last_checkpoint() != Checkpoint::at(seq.clone(), *sub)
        {
            checkpointer.checkpoint_at(seq, *sub).await?;
        }
        info!(
            shard = %self.shard,
            lines = self.lines,
            "stopped"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn record(data: &[u8], seq: &str, sub: u64) -> Record {
        Record {
            data: data.to_vec().into(),
            partition_key: "pk-1".into(),
            explicit_hash_key: None,
            sequence_number: seq.into(),
            sub_sequence_number: sub,
            approximate_arrival: Some(
                SystemTime::UNIX_EPOCH + Duration::from_millis(1_714_564_800_250),
            ),
            aggregated: false,
        }
    }

    #[test]
    fn lines_are_json_with_text_or_base64() {
        let text = line(
            "orders",
            "shardId-1",
            &record(b"hello \"x\"", "42", 0),
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(text.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(v["stream"], "orders");
        assert_eq!(v["shard"], "shardId-1");
        assert_eq!(v["partition_key"], "pk-1");
        assert_eq!(v["sequence"], "42");
        assert_eq!(v["sub_sequence"], 0);
        assert_eq!(v["arrival"], "2024-05-01T12:00:00.25Z");
        assert_eq!(v["data"], "hello \"x\"");
        assert_eq!(v["data_encoding"], "utf-8");

        let text = line(
            "orders",
            "shardId-1",
            &record(&[0xff, 0x00, 0x41], "43", 2),
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(v["data"], "/wBB");
        assert_eq!(v["data_encoding"], "base64");
        assert_eq!(v["sub_sequence"], 2);
    }

    #[test]
    fn meta_adds_who_processed_a_record_and_when() {
        let meta = Meta {
            worker: "copy-1".into(),
            tenure: "t-9".into(),
            processed_at: "2026-12-01T18:00:00Z".into(),
        };
        let text = line("orders", "shardId-1", &record(b"x", "42", 0), Some(&meta))
            .unwrap_or_else(|e| panic!("{e}"));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(v["worker"], "copy-1");
        assert_eq!(v["tenure"], "t-9");
        assert_eq!(v["processed_at"], "2026-12-01T18:00:00Z");
        let plain = line("orders", "shardId-1", &record(b"x", "42", 0), None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!plain.contains("worker"), "{plain}");
    }

    #[test]
    fn positions_order_numerically() {
        assert_eq!(position_cmp(("9", 0), ("10", 0)), Ordering::Less);
        assert_eq!(position_cmp(("10", 1), ("10", 0)), Ordering::Greater);
        assert_eq!(position_cmp(("10", 1), ("10", 1)), Ordering::Equal);
    }
}
