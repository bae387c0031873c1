//! `kcl-app`: a kcl application shaped for a container platform (ECS,
//! Kubernetes): configured only through environment variables, logging to
//! stderr as plain text or JSON, and stopping gracefully on SIGTERM.
//!
//! Its processor counts records per partition key; every
//! `KCL_SUMMARY_INTERVAL` the app logs how many records it processed, the
//! busiest keys and how many shards it holds. It checkpoints after every
//! batch and when a shard is handed over or the process stops.
//!
//! # Configuration
//!
//! | variable | | default |
//! | --- | --- | --- |
//! | `KCL_APP` | application name; also names the lease table | required |
//! | `KCL_STREAMS` | comma-separated stream names or stream ARNs | required |
//! | `KCL_TABLE_NAME` | lease table | `KCL_APP` |
//! | `KCL_INITIAL_POSITION` | `LATEST`, `TRIM_HORIZON` or `AT_TIMESTAMP=<RFC 3339 time or epoch seconds>` | `LATEST` |
//! | `KCL_WORKER_ID` | this process's id in the lease table (keep it unique) | host name + random suffix |
//! | `KCL_LEASE_DURATION` | how long peers wait before taking a silent worker's shards | `10s` |
//! | `KCL_TAKER_INTERVAL` | how often leases are balanced | `10s` |
//! | `KCL_MAX_LEASES_TO_STEAL` | leases taken from busier workers per balancing round; 0 disables | `4` |
//! | `KCL_SHUTDOWN_TIMEOUT` | how long processors get to finish on SIGTERM | `25s` |
//! | `KCL_SUMMARY_INTERVAL` | how often the summary is logged | `30s` |
//! | `KCL_METRICS_ADDR` | serve Prometheus `/metrics` and the `/healthz`, `/readyz` probes on this address (`0.0.0.0:9090` in a container) | not served |
//! | `KCL_LOG_FORMAT` | `plain` or `json` | `plain` |
//! | `RUST_LOG` | log filter (`info`, `kcl=debug`, ...) | `info` |
//!
//! Durations are a number and a unit: `500ms`, `10s`, `1.5m`, `1h`. AWS
//! region, credentials and endpoints come from the standard AWS environment.
//!
//! Exit status: 0 after a graceful shutdown, 2 for a bad configuration, 1
//! when the worker cannot run (a stream that does not exist, a lease table
//! that cannot be created).
//!
//! # Concurrency model
//!
//! `main` runs the worker and the summary reporter side by side in one
//! `select!`; the reporter never ends, so it is dropped when the worker
//! returns. The worker runs one task per shard, each with its own
//! `KeyCounter`; they share one `Tally` (a mutex taken once per batch).

use std::collections::HashMap;
use std::fmt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use aws_config::BehaviorVersion;
use aws_smithy_types::date_time::{DateTime, Format};
use kcl::{
    Checkpointer, InitialPosition, InitializeInput, ProcessorError, RecordBatch, RecordProcessor,
    ShardContext, Worker, WorkerHandle,
};
use tokio::time::MissedTickBehavior;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    // Logging comes first so that every later error is logged in the
    // format the platform expects; errors before it go to stderr as text.
    let format = match LogFormat::from_env(&env_lookup) {
        Ok(format) => format,
        Err(e) => {
            eprintln!("kcl-app: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = init_logging(format) {
        eprintln!("kcl-app: {e}");
        return ExitCode::from(2);
    }
    let config = match Config::from_env(&env_lookup) {
        Ok(config) => config,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            if e.is::<BadEnv>() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    info!(
        application = %config.app,
        streams = %config.streams.join(","),
        initial_position = ?config.initial_position,
        "starting"
    );
    let sdk = aws_config::load_defaults(BehaviorVersion::latest()).await;
    let tally = Arc::new(Tally::default());
    let worker = config
        .worker_builder()
        .sdk_config(&sdk)
        .processor({
            let tally = Arc::clone(&tally);
            move |shard: &ShardContext| KeyCounter {
                shard_id: shard.shard_id.clone(),
                tally: Arc::clone(&tally),
            }
        })
        .build()
        .map_err(blame_env)?;
    info!(worker = worker.worker_id(), "worker built");
    let handle = worker.handle();

    let run = worker.run_until(kcl::shutdown_signal());
    tokio::pin!(run);
    tokio::select! {
        result = &mut run => result.context("the worker stopped with an error")?,
        () = report(&tally, &handle, config.summary_interval) => {}
    }
    info!(
        records = tally.total.load(Ordering::Relaxed),
        "stopped gracefully"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The processor
// ---------------------------------------------------------------------------

/// Records counted per partition key since the last summary, shared by the
/// processors of every shard this process holds.
#[derive(Debug, Default)]
struct Tally {
    window: Mutex<HashMap<String, u64>>,
    total: AtomicU64,
}

/// Counts one shard's records into the shared [`Tally`].
struct KeyCounter {
    shard_id: String,
    tally: Arc<Tally>,
}

#[kcl::async_trait]
impl RecordProcessor for KeyCounter {
    async fn initialize(&mut self, input: &InitializeInput) -> Result<(), ProcessorError> {
        info!(shard = %self.shard_id, checkpoint = %input.checkpoint, "shard acquired");
        Ok(())
    }

    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        {
            // One lock per batch, released before the checkpoint's await.
            let mut window = self
                .tally
                .window
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for record in &batch.records {
                match window.get_mut(&record.partition_key) {
                    Some(n) => *n += 1,
                    None => {
                        window.insert(record.partition_key.clone(), 1);
                    }
                }
            }
        }
        self.tally
            .total
            .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
        // The counts are this app's only effect, so the batch is done once
        // counted. Delivery is at-least-once: after a crash, records since
        // the last checkpoint are counted again by whoever takes the shard.
        checkpointer.checkpoint().await?;
        Ok(())
    }

    async fn shard_ended(&mut self, checkpointer: &mut Checkpointer) -> Result<(), ProcessorError> {
        // Required: until SHARD_END is checkpointed, the shard's children
        // (after a split or merge) do not start.
        info!(shard = %self.shard_id, "shard ended");
        checkpointer.checkpoint().await?;
        Ok(())
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        // SIGTERM, or a peer taking the shard to balance the load: record
        // what was counted so the next owner does not count it again.
        info!(shard = %self.shard_id, "checkpointing before releasing the shard");
        checkpointer.checkpoint().await?;
        Ok(())
    }

    async fn lease_lost(&mut self) {
        warn!(shard = %self.shard_id, "lease lost; another worker continues from the last checkpoint");
    }
}

/// Logs a summary every `every`; never returns.
async fn report(tally: &Tally, handle: &WorkerHandle, every: Duration) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let window =
            std::mem::take(&mut *tally.window.lock().unwrap_or_else(PoisonError::into_inner));
        let records: u64 = window.values().sum();
        let keys = window.len();
        let mut busiest: Vec<(String, u64)> = window.into_iter().collect();
        busiest.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        busiest.truncate(5);
        let busiest = busiest
            .iter()
            .map(|(key, n)| format!("{key}={n}"))
            .collect::<Vec<_>>()
            .join(" ");
        let status = handle.status();
        info!(
            records,
            per_second = (records as f64 / every.as_secs_f64() * 10.0).round() / 10.0,
            partition_keys = keys,
            busiest = %busiest,
            shards = status.consuming.len(),
            ready = status.ready,
            "summary"
        );
    }
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// Reads a variable; a value that is not UTF-8 is kept (lossily) so that
/// validation reports it instead of treating it as unset.
fn env_lookup(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// The application's settings, read from the environment.
#[derive(Debug, Clone, PartialEq)]
struct Config {
    app: String,
    streams: Vec<String>,
    table_name: Option<String>,
    initial_position: InitialPosition,
    worker_id: Option<String>,
    lease_duration: Option<Duration>,
    taker_interval: Option<Duration>,
    max_leases_to_steal: Option<usize>,
    shutdown_timeout: Option<Duration>,
    summary_interval: Duration,
    metrics_addr: Option<std::net::SocketAddr>,
}

/// Every problem found in the environment, each naming its variable.
#[derive(Debug, PartialEq, Eq)]
struct BadEnv(Vec<(&'static str, String)>);

impl fmt::Display for BadEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid configuration: ")?;
        for (i, (var, reason)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{var} {reason}")?;
        }
        Ok(())
    }
}

impl std::error::Error for BadEnv {}

impl Config {
    /// Reads and validates every variable, reporting all problems at once
    /// so a deployment is fixed in one round.
    fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, BadEnv> {
        let mut problems = Vec::new();
        // Unset and empty are the same: templated manifests often render
        // an absent value as "".
        let get = |var: &str| lookup(var).filter(|v| !v.trim().is_empty());
        let duration = |var| get(var).map(|v| parse_duration(&v)).transpose();

        let app = note(
            &mut problems,
            "KCL_APP",
            get("KCL_APP").ok_or_else(|| {
                "is required: the application name, which also names the lease table".to_owned()
            }),
        );
        let streams = note(
            &mut problems,
            "KCL_STREAMS",
            get("KCL_STREAMS")
                .ok_or_else(|| {
                    "is required: comma-separated stream names or stream ARNs".to_owned()
                })
                .and_then(|v| parse_streams(&v)),
        );
        let initial_position = note(
            &mut problems,
            "KCL_INITIAL_POSITION",
            get("KCL_INITIAL_POSITION")
                .map_or(Ok(InitialPosition::Latest), |v| parse_initial_position(&v)),
        );
        let lease_duration = note(
            &mut problems,
            "KCL_LEASE_DURATION",
            duration("KCL_LEASE_DURATION"),
        );
        let taker_interval = note(
            &mut problems,
            "KCL_TAKER_INTERVAL",
            duration("KCL_TAKER_INTERVAL"),
        );
        let shutdown_timeout = note(
            &mut problems,
            "KCL_SHUTDOWN_TIMEOUT",
            duration("KCL_SHUTDOWN_TIMEOUT"),
        );
        let summary_interval = note(
            &mut problems,
            "KCL_SUMMARY_INTERVAL",
            duration("KCL_SUMMARY_INTERVAL"),
        );
        let max_leases_to_steal = note(
            &mut problems,
            "KCL_MAX_LEASES_TO_STEAL",
            get("KCL_MAX_LEASES_TO_STEAL")
                .map(|v| {
                    v.trim().parse::<usize>().map_err(|_| {
                        format!("is {v:?}; expected a whole number such as 1 (0 disables stealing)")
                    })
                })
                .transpose(),
        );
        let metrics_addr = note(
            &mut problems,
            "KCL_METRICS_ADDR",
            get("KCL_METRICS_ADDR")
                .map(|v| {
                    v.trim().parse::<std::net::SocketAddr>().map_err(|_| {
                        format!("is {v:?}; expected an address and port such as 0.0.0.0:9090")
                    })
                })
                .transpose(),
        );

        match (
            app,
            streams,
            initial_position,
            lease_duration,
            taker_interval,
            shutdown_timeout,
            summary_interval,
            max_leases_to_steal,
            metrics_addr,
        ) {
            (
                Some(app),
                Some(streams),
                Some(initial_position),
                Some(lease_duration),
                Some(taker_interval),
                Some(shutdown_timeout),
                Some(summary_interval),
                Some(max_leases_to_steal),
                Some(metrics_addr),
            ) => Ok(Config {
                app: app.trim().to_owned(),
                streams,
                table_name: get("KCL_TABLE_NAME").map(|v| v.trim().to_owned()),
                initial_position,
                worker_id: get("KCL_WORKER_ID").map(|v| v.trim().to_owned()),
                lease_duration,
                taker_interval,
                max_leases_to_steal,
                shutdown_timeout,
                summary_interval: summary_interval.unwrap_or(Duration::from_secs(30)),
                metrics_addr,
            }),
            _ => Err(BadEnv(problems)),
        }
    }

    /// A worker builder with every configured setting; the caller adds the
    /// AWS configuration and the processor.
    fn worker_builder(&self) -> kcl::WorkerBuilder {
        let mut builder = Worker::builder(&self.app).initial_position(self.initial_position);
        for stream in &self.streams {
            builder = builder.stream(stream);
        }
        if let Some(table) = &self.table_name {
            builder = builder.table_name(table);
        }
        if let Some(id) = &self.worker_id {
            builder = builder.worker_id(id);
        }
        if let Some(d) = self.lease_duration {
            builder = builder.lease_duration(d);
        }
        if let Some(d) = self.taker_interval {
            builder = builder.taker_interval(d);
        }
        if let Some(n) = self.max_leases_to_steal {
            builder = builder.max_leases_to_steal(n);
        }
        if let Some(d) = self.shutdown_timeout {
            builder = builder.shutdown_timeout(d);
        }
        if let Some(addr) = self.metrics_addr {
            builder = builder.serve_metrics(addr);
        }
        builder
    }
}

/// Turns a setting that `build()` rejected into an error naming the
/// variable it came from (the builder names its own field).
fn blame_env(e: kcl::Error) -> anyhow::Error {
    if e.kind() == kcl::ErrorKind::MetricsBind {
        return BadEnv(vec![("KCL_METRICS_ADDR", format!("is rejected: {e}"))]).into();
    }
    let Some(c) = e.config() else {
        return e.into();
    };
    let var = match c.field {
        "application_name" => "KCL_APP",
        "table_name" => "KCL_TABLE_NAME",
        "stream" | "streams" => "KCL_STREAMS",
        "worker_id" => "KCL_WORKER_ID",
        // Derived from the lease duration unless set explicitly, which
        // this app does not do.
        "lease_duration" | "renew_interval" | "fence_margin" | "handoff_timeout" => {
            "KCL_LEASE_DURATION"
        }
        "taker_interval" => "KCL_TAKER_INTERVAL",
        "max_leases_to_steal" => "KCL_MAX_LEASES_TO_STEAL",
        "shutdown_timeout" => "KCL_SHUTDOWN_TIMEOUT",
        "serve_metrics" => "KCL_METRICS_ADDR",
        _ => return e.into(),
    };
    BadEnv(vec![(var, format!("is rejected: {e}"))]).into()
}

/// Keeps a valid value, or records why it is not.
fn note<T>(
    problems: &mut Vec<(&'static str, String)>,
    var: &'static str,
    result: Result<T, String>,
) -> Option<T> {
    result.map_err(|reason| problems.push((var, reason))).ok()
}

fn parse_streams(value: &str) -> Result<Vec<String>, String> {
    let streams: Vec<String> = value.split(',').map(|s| s.trim().to_owned()).collect();
    if streams.iter().any(String::is_empty) {
        return Err(format!(
            "is {value:?}; expected comma-separated stream names without empty entries"
        ));
    }
    Ok(streams)
}

fn parse_initial_position(value: &str) -> Result<InitialPosition, String> {
    let v = value.trim();
    let expected = "expected LATEST, TRIM_HORIZON or AT_TIMESTAMP=<RFC 3339 time or epoch seconds>";
    if v.eq_ignore_ascii_case("LATEST") {
        return Ok(InitialPosition::Latest);
    }
    if v.eq_ignore_ascii_case("TRIM_HORIZON") {
        return Ok(InitialPosition::TrimHorizon);
    }
    let Some((kind, at)) = v.split_once('=') else {
        return Err(format!("is {value:?}; {expected}"));
    };
    if !kind.trim().eq_ignore_ascii_case("AT_TIMESTAMP") {
        return Err(format!("is {value:?}; {expected}"));
    }
    parse_timestamp(at.trim())
        .map(InitialPosition::AtTimestamp)
        .ok_or_else(|| {
            format!(
                "is {value:?}; the time must be RFC 3339 (2024-05-01T12:00:00Z, \
                 2024-05-01T14:00:00+02:00) or epoch seconds (1714564800)"
            )
        })
}

/// RFC 3339 (with `Z` or an offset) or seconds since the epoch.
fn parse_timestamp(value: &str) -> Option<SystemTime> {
    let parsed = DateTime::from_str(value, Format::DateTimeWithOffset)
        .or_else(|_| DateTime::from_str(value, Format::EpochSeconds))
        .ok()?;
    SystemTime::try_from(parsed).ok()
}

/// `500ms`, `10s`, `1.5m`, `2h`: a positive number and a unit. A bare
/// number is refused: whether `10` means seconds or milliseconds is exactly
/// the mistake this parser exists to catch.
fn parse_duration(value: &str) -> Result<Duration, String> {
    let bad =
        || format!("is {value:?}; expected a positive duration such as 500ms, 10s, 1.5m or 1h");
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = v.split_at(split);
    let millis_per_unit: u64 = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    let duration = if number.contains('.') {
        let n: f64 = number.parse().map_err(|_| bad())?;
        Duration::try_from_secs_f64(n * millis_per_unit as f64 / 1_000.0).map_err(|_| bad())?
    } else {
        let n: u64 = number.parse().map_err(|_| bad())?;
        Duration::from_millis(n.checked_mul(millis_per_unit).ok_or_else(bad)?)
    };
    if duration.is_zero() {
        return Err(bad());
    }
    Ok(duration)
}

// ---------------------------------------------------------------------------
// Logging
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    Plain,
    Json,
}

impl LogFormat {
    fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, BadEnv> {
        match lookup("KCL_LOG_FORMAT").as_deref().map(str::trim) {
            None | Some("") => Ok(LogFormat::Plain),
            Some(v) if v.eq_ignore_ascii_case("plain") => Ok(LogFormat::Plain),
            Some(v) if v.eq_ignore_ascii_case("json") => Ok(LogFormat::Json),
            Some(v) => Err(BadEnv(vec![(
                "KCL_LOG_FORMAT",
                format!("is {v:?}; expected json or plain"),
            )])),
        }
    }
}

fn init_logging(format: LogFormat) -> Result<(), BadEnv> {
    let filter = match env_lookup("RUST_LOG").filter(|v| !v.trim().is_empty()) {
        None => EnvFilter::new("info"),
        Some(v) => EnvFilter::try_new(&v).map_err(|e| {
            BadEnv(vec![(
                "RUST_LOG",
                format!("is {v:?}; not a log filter: {e}"),
            )])
        })?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        // One JSON object per line for log pipelines: the event's fields at
        // the top level, and the enclosing spans (worker, stream, shard)
        // once, as a list.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .with_ansi(false)
            .init(),
        LogFormat::Plain => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration(" 2m "), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in [
            "10",
            "s",
            "",
            "0s",
            "-1s",
            "1.2.3s",
            "10 sec",
            "99999999999999999999h",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("500ms"), "{bad}: {e}");
        }
    }

    #[test]
    fn initial_positions() {
        assert_eq!(
            parse_initial_position("latest"),
            Ok(InitialPosition::Latest)
        );
        assert_eq!(
            parse_initial_position("TRIM_HORIZON"),
            Ok(InitialPosition::TrimHorizon)
        );
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_714_564_800);
        for v in [
            "AT_TIMESTAMP=2024-05-01T12:00:00Z",
            "AT_TIMESTAMP=2024-05-01T14:00:00+02:00",
            "at_timestamp=1714564800",
        ] {
            assert_eq!(
                parse_initial_position(v),
                Ok(InitialPosition::AtTimestamp(at)),
                "{v}"
            );
        }
        for v in [
            "EARLIEST",
            "AT_TIMESTAMP=",
            "AT_TIMESTAMP=yesterday",
            "AT_SEQUENCE=5",
        ] {
            assert!(parse_initial_position(v).is_err(), "{v}");
        }
    }

    #[test]
    fn a_full_configuration() {
        let config = Config::from_env(&env(&[
            ("KCL_APP", "orders-app"),
            ("KCL_STREAMS", "orders, refunds"),
            ("KCL_INITIAL_POSITION", "TRIM_HORIZON"),
            ("KCL_WORKER_ID", "pod-7"),
            ("KCL_LEASE_DURATION", "20s"),
            ("KCL_TAKER_INTERVAL", "5s"),
            ("KCL_MAX_LEASES_TO_STEAL", "1"),
            ("KCL_SHUTDOWN_TIMEOUT", "20s"),
            ("KCL_SUMMARY_INTERVAL", "1m"),
        ]))
        .unwrap();
        assert_eq!(config.streams, ["orders", "refunds"]);
        assert_eq!(config.initial_position, InitialPosition::TrimHorizon);
        assert_eq!(config.worker_id.as_deref(), Some("pod-7"));
        assert_eq!(config.lease_duration, Some(Duration::from_secs(20)));
        assert_eq!(config.max_leases_to_steal, Some(1));
        assert_eq!(config.summary_interval, Duration::from_secs(60));
    }

    #[test]
    fn every_problem_is_reported_with_its_variable() {
        let e = Config::from_env(&env(&[
            ("KCL_STREAMS", "a,,b"),
            ("KCL_LEASE_DURATION", "10"),
            ("KCL_MAX_LEASES_TO_STEAL", "-1"),
            ("KCL_INITIAL_POSITION", "OLDEST"),
        ]))
        .unwrap_err();
        let vars: Vec<&str> = e.0.iter().map(|(var, _)| *var).collect();
        assert_eq!(
            vars,
            [
                "KCL_APP",
                "KCL_STREAMS",
                "KCL_INITIAL_POSITION",
                "KCL_LEASE_DURATION",
                "KCL_MAX_LEASES_TO_STEAL"
            ]
        );
        let message = e.to_string();
        assert!(
            message.contains("KCL_LEASE_DURATION is \"10\""),
            "{message}"
        );
    }

    #[test]
    fn empty_means_unset() {
        let e = Config::from_env(&env(&[("KCL_APP", " "), ("KCL_STREAMS", "s")])).unwrap_err();
        assert_eq!(e.0.len(), 1);
        assert_eq!(e.0[0].0, "KCL_APP");
    }

    #[test]
    fn builder_rejections_name_the_variable() {
        let config = Config::from_env(&env(&[
            ("KCL_APP", "x"), // too short for a DynamoDB table name
            ("KCL_STREAMS", "s"),
        ]))
        .unwrap();
        let e = config
            .worker_builder()
            .clients(
                aws_sdk_kinesis::Client::from_conf(
                    aws_sdk_kinesis::Config::builder()
                        .behavior_version(BehaviorVersion::latest())
                        .build(),
                ),
                aws_sdk_dynamodb::Client::from_conf(
                    aws_sdk_dynamodb::Config::builder()
                        .behavior_version(BehaviorVersion::latest())
                        .build(),
                ),
            )
            .processor(|_: &ShardContext| KeyCounter {
                shard_id: String::new(),
                tally: Arc::default(),
            })
            .build()
            .map_err(blame_env)
            .unwrap_err();
        assert!(e.is::<BadEnv>(), "{e:#}");
        assert!(e.to_string().contains("KCL_APP"), "{e:#}");
    }

    #[test]
    fn log_formats() {
        assert_eq!(LogFormat::from_env(&env(&[])), Ok(LogFormat::Plain));
        assert_eq!(
            LogFormat::from_env(&env(&[("KCL_LOG_FORMAT", "JSON")])),
            Ok(LogFormat::Json)
        );
        assert!(LogFormat::from_env(&env(&[("KCL_LOG_FORMAT", "xml")])).is_err());
    }
}
