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
//! Every worker setting comes from `KCL_<SETTING>`, named as the builder's
//! setter (`KCL_APPLICATION_NAME` and `KCL_STREAMS` are required,
//! `KCL_LEASE_DURATION=15s`, `KCL_SERVE_METRICS=0.0.0.0:9090`, ...): see
//! `kcl::Settings` for every one and its form. The app adds its own:
//!
//! | variable | | default |
//! | --- | --- | --- |
//! | `KCL_SUMMARY_INTERVAL` | how often the summary is logged | `30s` |
//! | `KCL_LOG_FORMAT` | `plain` or `json` | `plain` |
//! | `RUST_LOG` | log filter (`info`, `kcl=debug`, ...) | `info` |
//!
//! AWS region, credentials and endpoints come from the standard AWS
//! environment.
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
use std::time::Duration;

use anyhow::Context as _;
use aws_config::BehaviorVersion;
use kcl::{
    Checkpointer, InitializeInput, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
    WorkerHandle,
};
use tokio::time::MissedTickBehavior;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    // Logging comes first so that every later error is logged in the
    // format the platform expects; errors before it go to stderr as text.
    let vars = environment();
    let format = match LogFormat::from_env(&vars) {
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
    let config = match Config::from_env(&vars) {
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
            if e.is::<BadEnv>() || e.is::<kcl::SettingsError>() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    info!(settings = ?config.settings, "starting");
    let sdk = aws_config::load_defaults(BehaviorVersion::latest()).await;
    let tally = Arc::new(Tally::default());
    let worker = config
        .settings
        .worker_builder()?
        .sdk_config(&sdk)
        .processor({
            let tally = Arc::clone(&tally);
            move |shard: &ShardContext| KeyCounter {
                shard_id: shard.shard_id.clone(),
                tally: Arc::clone(&tally),
            }
        })
        .build()
        .map_err(|e| match config.settings.blame(&e) {
            Some(named) => anyhow::Error::from(named),
            None => e.into(),
        })?;
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

/// Reads a variable; a value that is not UTF-8 is kept (lossily) so that
/// validation reports it instead of treating it as unset.
/// The process's variables, listed (not looked up one by one) so that kcl
/// can warn of one that is close to a setting's name: a misspelling.
fn environment() -> HashMap<String, String> {
    std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect()
}

/// The worker's settings and the app's own, read from the environment.
#[derive(Debug, Clone)]
struct Config {
    settings: kcl::Settings,
    summary_interval: Duration,
}

/// A problem with one of the app's own variables.
#[derive(Debug, PartialEq, Eq)]
struct BadEnv(&'static str, String);

impl fmt::Display for BadEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration: {} {}", self.0, self.1)
    }
}

impl std::error::Error for BadEnv {}

impl Config {
    fn from_env(vars: &HashMap<String, String>) -> anyhow::Result<Self> {
        let settings = kcl::Settings::from_vars("KCL", vars.clone())?;
        // Required here, not only at build(): the app fails before it
        // loads AWS credentials.
        settings.worker_builder()?;
        let summary_interval = match vars
            .get("KCL_SUMMARY_INTERVAL")
            .filter(|v| !v.trim().is_empty())
        {
            None => Duration::from_secs(30),
            Some(v) => kcl::Settings::parse_duration(v)
                .map_err(|reason| BadEnv("KCL_SUMMARY_INTERVAL", reason))?,
        };
        Ok(Config {
            settings,
            summary_interval,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    Plain,
    Json,
}

impl LogFormat {
    fn from_env(vars: &HashMap<String, String>) -> Result<Self, BadEnv> {
        match vars.get("KCL_LOG_FORMAT").map(|v| v.trim()) {
            None | Some("") => Ok(LogFormat::Plain),
            Some(v) if v.eq_ignore_ascii_case("plain") => Ok(LogFormat::Plain),
            Some(v) if v.eq_ignore_ascii_case("json") => Ok(LogFormat::Json),
            Some(v) => Err(BadEnv(
                "KCL_LOG_FORMAT",
                format!("is {v:?}; expected json or plain"),
            )),
        }
    }
}

fn init_logging(format: LogFormat) -> Result<(), BadEnv> {
    let filter = match std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        None => EnvFilter::new("info"),
        Some(v) => EnvFilter::try_new(&v)
            .map_err(|e| BadEnv("RUST_LOG", format!("is {v:?}; not a log filter: {e}")))?,
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

    fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
        vars.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_worker_settings_and_the_apps_own_are_read() {
        let config = Config::from_env(&env(&[
            ("KCL_APPLICATION_NAME", "orders-app"),
            ("KCL_STREAMS", "orders, refunds"),
            ("KCL_LEASE_DURATION", "20s"),
            ("KCL_SUMMARY_INTERVAL", "1m"),
        ]))
        .unwrap();
        assert_eq!(
            config.settings.streams.as_deref(),
            Some(&["orders".to_owned(), "refunds".to_owned()][..])
        );
        assert_eq!(
            config.settings.lease_duration,
            Some(Duration::from_secs(20))
        );
        assert_eq!(config.summary_interval, Duration::from_secs(60));
        // The app's own variables under the prefix are not taken for typos.
        assert_eq!(config.settings.near_misses(), &[]);
    }

    #[test]
    fn a_missing_name_or_a_bad_interval_names_its_variable() {
        let e = Config::from_env(&env(&[("KCL_STREAMS", "s")])).unwrap_err();
        assert!(e.to_string().contains("KCL_APPLICATION_NAME"), "{e:#}");
        let e = Config::from_env(&env(&[
            ("KCL_APPLICATION_NAME", "orders-app"),
            ("KCL_SUMMARY_INTERVAL", "30"),
        ]))
        .unwrap_err();
        assert!(e.is::<BadEnv>(), "{e:#}");
        assert!(e.to_string().contains("KCL_SUMMARY_INTERVAL"), "{e:#}");
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
