//! The `kcl` command: inspect and repair an application's lease table,
//! consume a stream to stdout, run the demo.
//!
//! The binary (`src/main.rs`) only calls [`main`]; everything is here so
//! that `examples/demo` can run the same demo as `kcl demo` and the
//! end-to-end tests can build the same binary (and create and delete their
//! streams and tables as the demo does, with [`demo::resources`]).
//!
//! # Layout
//!
//! - this file: the command line (clap), logging, exit codes.
//! - `args`: parsers for positions, checkpoints and durations.
//! - `aws`: the SDK configuration, and turning SDK failures into advice
//!   (missing table, no credentials, unreachable endpoint).
//! - `view`: the lease table as rows, states and per-worker summaries; the
//!   terminal table and the JSON document. Pure, unit-tested.
//! - `table`: reads and the two repair writes (`reset`, `release`), each a
//!   conditional write on what was just read.
//! - `watch`: `kcl leases watch`, a refreshing view that judges expiry
//!   from counter movement and reports owner changes.
//! - `consume`: `kcl consume`, a ready-made worker writing JSON lines.
//! - [`demo`]: `kcl demo` / `make demo`.
//!
//! # Concurrency model
//!
//! Each command runs on one multi-threaded tokio runtime built in
//! [`main`]. `consume` and `demo` run kcl workers (which own their tasks);
//! the lease commands make sequential calls. Ctrl-C ends `watch` at once
//! and stops `consume` gracefully.

/// `println!` that does not panic when stdout is closed (`kcl leases | head
/// -1`): what a command prints is a report, and a reader that stopped
/// reading must not stop the command's work (a reset run over every
/// shard, the telling of an evicted worker) half-way. Defined before the
/// modules, which use it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod args;
mod aws;
mod consume;
pub mod demo;
mod table;
mod view;
mod watch;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Inspect and repair kcl lease tables, consume a stream, run the demo.
///
/// AWS region, credentials and endpoints come from the standard AWS
/// environment: AWS_REGION, AWS_PROFILE, AWS_ACCESS_KEY_ID /
/// AWS_SECRET_ACCESS_KEY, shared config files, instance and task roles,
/// and AWS_ENDPOINT_URL_DYNAMODB / AWS_ENDPOINT_URL_KINESIS (or
/// AWS_ENDPOINT_URL) for local emulators.
#[derive(Debug, Parser)]
#[command(name = "kcl", version, propagate_version = true)]
pub struct Cli {
    /// Log more to stderr (info level; RUST_LOG overrides).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List an application's leases: one row per shard with its owner,
    /// counter, checkpoint, parents and state, then a summary per worker.
    ///
    /// States: active (owned; whether its owner is still alive shows over
    /// time, see `kcl leases watch`), handoff (a graceful handoff from the
    /// previous owner runs), unowned (free for any worker to take),
    /// completed (the shard was read to its end).
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Leases(LeasesCommand),
    /// Consume streams with a ready-made worker: every record becomes one
    /// JSON line on stdout.
    ///
    /// Fields: stream, shard, partition_key, sequence, sub_sequence,
    /// arrival (RFC 3339), data (UTF-8 text, or base64 when the payload is
    /// not valid UTF-8) and data_encoding ("utf-8" or "base64").
    ///
    /// Each batch is written and flushed before it is checkpointed, so a
    /// restart resumes after the last line written. Copies with the same
    /// --app share the shards. SIGTERM or Ctrl-C stops gracefully (every
    /// shard checkpoints, leases are released); logs go to stderr.
    Consume(consume::ConsumeArgs),
    /// Run the demo (what `make demo` runs): a producer and three workers
    /// sharing a 4-shard stream for about a minute, printing where the
    /// shards are and checking that every record was processed.
    ///
    /// Creates and deletes its own stream and lease table. Refuses to run
    /// against real AWS unless KCL_DEMO_ALLOW_REAL_AWS=1.
    Demo,
}

#[derive(Debug, Args)]
struct LeasesCommand {
    #[command(subcommand)]
    action: Option<LeasesAction>,
    #[command(flatten)]
    list: ListArgs,
}

#[derive(Debug, Subcommand)]
enum LeasesAction {
    /// Refresh the lease list in place every few seconds, judge expiry
    /// from counter movement, and show owner changes as they happen.
    ///
    /// A lease is "expired" when its owner has not renewed it (its counter
    /// has not moved) for the lease duration, as seen from here: the same
    /// rule workers use before taking it over. Ctrl-C quits.
    Watch(watch::WatchArgs),
    /// Move a shard's checkpoint, so that the next worker to take the
    /// shard starts there.
    ///
    /// Refused while a worker holds the lease (it would overwrite the
    /// checkpoint with its own next one) unless --force, which also evicts
    /// the owner: one with a liveness record (kcl's default renewal) is
    /// asked through it to stop, may write nothing more, and no worker
    /// takes the shard before it let go; one that renews every lease stops
    /// when its next renewal or checkpoint fails. A worker then takes the
    /// shard from the new checkpoint. Refused for a completed shard unless
    /// --force.
    Reset(table::ResetArgs),
    /// Hand a lease back: remove its owner (if it is still the owner just
    /// read), so that another running worker takes it.
    ///
    /// An owner with a liveness record (kcl's default renewal) is asked
    /// through it and hands the shard over as in a rebalance: it stops
    /// fetching, its processor checkpoints, and only then does another
    /// worker take it. An owner that renews every lease (a Java KCL worker,
    /// kcl in per-lease mode without a record) stops at its next renewal;
    /// records since its last checkpoint are delivered again.
    Release(table::ReleaseArgs),
}

/// Which lease table: the application's (--app), or any table (--table).
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct TableArgs {
    /// The application name, which names the lease table.
    #[arg(long)]
    app: Option<String>,
    /// The lease table, when it is not named after the application.
    #[arg(long)]
    table: Option<String>,
}

impl TableArgs {
    pub(crate) fn table(&self) -> &str {
        self.table
            .as_deref()
            .or(self.app.as_deref())
            .unwrap_or_default()
    }

    /// How the user named the table, for error messages.
    pub(crate) fn flag(&self) -> &'static str {
        if self.table.is_some() {
            "--table"
        } else {
            "--app"
        }
    }
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Print one JSON document (leases, workers, totals) instead of the
    /// table.
    #[arg(long)]
    json: bool,
    /// Print checkpoints in full instead of abbreviated.
    #[arg(long)]
    wide: bool,
}

/// Runs the command line in `std::env::args_os()` and returns the exit
/// status: 0 on success, 1 on failure, 2 for a usage error.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    aws::set_verbose(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("kcl: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli));
    // Workers and their clients are gone by now; do not wait for blocking
    // stdin/stdout threads.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kcl: {}", aws::explain(&e));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Leases(leases) => match leases.action {
            None => {
                table::list(&leases.list.table, leases.list.json, leases.list.wide).await?;
                Ok(ExitCode::SUCCESS)
            }
            Some(LeasesAction::Watch(args)) => watch::run(args).await.map(|()| ExitCode::SUCCESS),
            Some(LeasesAction::Reset(args)) => table::reset(args).await.map(|()| ExitCode::SUCCESS),
            Some(LeasesAction::Release(args)) => {
                table::release(args).await.map(|()| ExitCode::SUCCESS)
            }
        },
        Command::Consume(args) => consume::run(args).await.map(|()| ExitCode::SUCCESS),
        Command::Demo => Ok(demo::run().await),
    }
}

/// Logs to stderr (stdout carries the commands' output): `warn` by
/// default, `info` with `verbose`, `RUST_LOG` when set. Without
/// `verbose`, the SDK's credential chain logs errors only: its warning for
/// each provider that found nothing is noise before the one-line advice a
/// failed command prints.
pub fn init_logging(verbose: bool) {
    let default = if verbose {
        "info"
    } else {
        "warn,aws_config=error"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // A second call (a test that calls it twice) keeps the first logger.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn leases_parse_with_and_without_a_subcommand() {
        let cli = Cli::try_parse_from(["kcl", "leases", "--app", "orders", "--json"])
            .unwrap_or_else(|e| panic!("{e}"));
        let Command::Leases(l) = cli.command else {
            panic!("not leases")
        };
        assert!(l.action.is_none() && l.list.json);
        assert_eq!(l.list.table.table(), "orders");

        let cli = Cli::try_parse_from(["kcl", "leases", "watch", "--table", "t1"])
            .unwrap_or_else(|e| panic!("{e}"));
        let Command::Leases(l) = cli.command else {
            panic!("not leases")
        };
        assert!(matches!(l.action, Some(LeasesAction::Watch(_))));

        // Exactly one of --app and --table.
        assert!(Cli::try_parse_from(["kcl", "leases", "--app", "a", "--table", "t"]).is_err());
        assert!(Cli::try_parse_from(["kcl", "leases", "release", "--shard", "s"]).is_err());
    }
}
