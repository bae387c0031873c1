//! `kcl-bench`: runs kcl's benchmark scenarios against the emulators (and
//! in memory) and writes what they measured to `docs/benchmarks.json`: each
//! figure by name, and each scenario's section of the report (a table of
//! its figures, the settings used next to the production defaults, a
//! comparison with the Java KCL where one is meaningful, what limits the
//! figure on this machine) with the machine itself. It then renders
//! `docs/BENCHMARKS.md` and the figures the README and the guide quote from
//! that file alone (`figures.rs`), so that no doc can disagree with it.
//!
//! Usage (`make bench` does the first, `make figures` the last):
//!
//! ```text
//! cargo run --release -p kcl-tests --bin kcl-bench                # every scenario
//! cargo run --release -p kcl-tests --bin kcl-bench -- --only cold-start,failover
//! cargo run --release -p kcl-tests --bin kcl-bench -- --out /tmp/b.md
//! cargo run -p kcl-tests --bin kcl-bench -- render                # the docs from the json
//! ```
//!
//! A partial run (`--only`) replaces its own sections and figures in the
//! json and keeps the rest, and prints its own report to stdout unless
//! `--out` is given; `--out` writes the run's own report there.
//!
//! # Layout
//!
//! - this file: options, the scenarios' sections and the machine
//!   description, and what a run writes to `docs/benchmarks.json`;
//! - `figures.rs`: the json's layout, and the docs rendered from it
//!   (`docs/BENCHMARKS.md`, the README's and the guide's figures);
//! - `bench_local.rs`: in-process scenarios: per-record CPU on the
//!   in-memory source, de-aggregation, end-to-end throughput against a bare
//!   `GetRecords` loop, and the DynamoDB cost of an idle fleet;
//! - `bench_fleet.rs`: scenarios with worker processes (this binary
//!   re-executed as `kcl-bench worker`): cold start, scale-out, failover,
//!   graceful stop, peak RSS; and the fan-out helper's latency bench;
//! - `bench_join.rs`: at the defaults with records flowing, a worker
//!   process joining a running one and a shard split under one worker;
//! - `bench_policy.rs`: the DynamoDB requests of a busy fleet whose
//!   processor checkpoints every batch, with and without a checkpoint
//!   policy;
//! - `bench_parallel.rs`: records a second through one shard in 1 to 10
//!   parallel lanes, for a processor spending 10 ms per record;
//! - `bench_lanes.rs`: the peak of the lanes' watermark window when one
//!   lane never checkpoints, against its bound;
//! - `bench_retrieval.rs`: polling pacing at the defaults (latency and
//!   calls a second at 5 records/s, idle calls) and the worker-wide
//!   prefetch budget with 1000 shards (re-executed as
//!   `kcl-bench budget-worker`);
//! - `bench_fanout_budget.rs`: the same budget in fan-out mode, on the
//!   in-memory fan-out stand-in;
//! - `bench_protocol.rs`: the model checker's states and time, the fleet
//!   simulator's seeds a minute, and failover at the defaults over 12 kill
//!   phases (the fleet simulation's own test, in a release build);
//! - `bench_cost.rs`: the DynamoDB cost of an idle fleet, and the fleet
//!   simulation's cost and cold start at 100 workers x 10,000 shards;
//! - `bench_balance.rs`: 8 shards, 2 of them carrying 80 % of the bytes,
//!   2 then 3 workers for five minutes, balanced by load and by count.
//!
//! Every figure a section lists under `figures` also goes to
//! `docs/benchmarks.json` by name (merged: a partial run updates its own
//! keys).
//!
//! # Concurrency model
//!
//! Scenarios run one after another, never overlapping, so that each has
//! the emulators and both cores to itself. The CPU-bound ones run first,
//! on a current-thread runtime of their own; the rest share one
//! multi-threaded runtime. Worker processes are children of this process
//! (killed on drop), and every wait is bounded.

mod bench_balance;
mod bench_cost;
mod bench_fanout_budget;
mod bench_fleet;
mod bench_join;
mod bench_lanes;
mod bench_local;
mod bench_parallel;
mod bench_policy;
mod bench_protocol;
mod bench_retrieval;
mod figures;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};

pub(crate) use figures::Section;

/// The scenarios, in the order they run.
const SCENARIOS: &[&str] = &[
    "protocol",
    "failover-phases",
    "cpu",
    "deaggregation",
    "lanes-window",
    "cold-start",
    "scale-out",
    "failover",
    "graceful-stop",
    "throughput",
    "parallel",
    "rss",
    "cost",
    "checkpoint-policy-cost",
    "cold-start-defaults",
    "pickup-defaults",
    "failover-defaults",
    "late-joiner",
    "reshard-defaults",
    "load-balance",
    "sim",
    "latency",
    "pacing",
    "budget",
    "fanout-budget",
];

struct Options {
    only: Option<Vec<String>>,
    out: Option<PathBuf>,
}

fn options() -> anyhow::Result<Options> {
    let mut only = None;
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--only" => {
                let list: Vec<String> = args
                    .next()
                    .context("--only needs a comma-separated list")?
                    .split(',')
                    .map(str::to_owned)
                    .collect();
                for s in &list {
                    if !SCENARIOS.contains(&s.as_str()) {
                        bail!(
                            "unknown scenario {s:?}; the scenarios: {}",
                            SCENARIOS.join(", ")
                        );
                    }
                }
                only = Some(list);
            }
            "--out" => out = Some(PathBuf::from(args.next().context("--out needs a path")?)),
            "-h" | "--help" => {
                println!(
                    "kcl-bench [--only SCENARIO,...] [--out PATH]\n\
                     kcl-bench render   (the docs from docs/benchmarks.json)\n\
                     scenarios: {}",
                    SCENARIOS.join(", ")
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    Ok(Options { only, out })
}

/// `nproc`, memory, CPU model, kernel, date, rustc.
fn machine() -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let cmd = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|| "unknown".into())
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    vec![
        ("nproc".into(), cores.to_string()),
        (
            "memory".into(),
            format!("{:.1} GiB", mem_kb as f64 / 1024.0 / 1024.0),
        ),
        ("CPU".into(), model),
        ("kernel".into(), cmd("uname", &["-sr"])),
        ("date".into(), cmd("date", &["-u", "+%Y-%m-%d %H:%M UTC"])),
        ("rustc".into(), cmd("rustc", &["--version"])),
        (
            "emulators".into(),
            "kinesis-mock (npm kinesis-local 0.6.2), DynamoDB Local 1.25.1, on the same host"
                .into(),
        ),
    ]
}

/// Merges a run into `docs/benchmarks.json`'s contents: every figure by
/// name (`{"figures": {name: {"value": number, "unit": text}}}`, names
/// stable from run to run so that a script can compare runs) and every
/// section of the report by scenario. A full run (`machine` given) also
/// replaces the machine, its time and any section of a scenario that no
/// longer exists; a partial run (`--only`) updates its own names and
/// sections and keeps the rest, except where a scenario failed before it
/// measured anything: its last good section stays. Returns how many
/// figures it wrote.
fn merge(
    doc: &mut figures::Figures,
    sections: &[(&str, Section, f64)],
    machine: Option<(Vec<(String, String)>, f64)>,
    date: &str,
) -> usize {
    let full = machine.is_some();
    if let Some((machine, total_s)) = machine {
        doc.report.machine = machine;
        doc.report.total_s = total_s;
        doc.report.sections.clear();
    }
    let mut wrote = 0;
    for (name, s, secs) in sections {
        if !full && s.failed.is_some() && s.figures.is_empty() {
            continue;
        }
        let recorded = Section {
            seconds: *secs,
            date: date.to_owned(),
            ..s.clone()
        };
        doc.report.sections.insert((*name).to_owned(), recorded);
        for (name, value) in &s.figures {
            let unit = s
                .units
                .get(name)
                .copied()
                .expect("Section::figure records a unit");
            doc.figures.insert(
                name.clone(),
                figures::Figure {
                    unit: unit.to_owned(),
                    value: *value,
                },
            );
            wrote += 1;
        }
    }
    wrote
}

/// The end of a run: the json, the docs rendered from it, and this run's
/// own report where `--out` (or a partial run, to stdout) asks for it.
fn finish(sections: Vec<(&str, Section, f64)>, total: f64, opts: &Options) -> anyhow::Result<()> {
    let machine = machine();
    let date = machine
        .iter()
        .find(|(k, _)| k == "date")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let root = figures::root();
    let mut doc = figures::Figures::load(&root)?;
    let full = opts.only.is_none().then(|| (machine.clone(), total));
    let wrote = merge(&mut doc, &sections, full, &date);
    doc.save(&root)?;
    eprintln!(
        "wrote {wrote} figures and {} sections to {}",
        sections.len(),
        figures::json_path(&root).display()
    );
    figures::render_docs(&root, SCENARIOS)?;

    let mut own = figures::Figures::default();
    merge(&mut own, &sections, Some((machine, total)), &date);
    let report = figures::benchmarks_md(&own, SCENARIOS, opts.only.is_some());
    match &opts.out {
        Some(path) => {
            std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote {} after {:.1} min", path.display(), total / 60.0);
        }
        None if opts.only.is_some() => println!("{report}"),
        None => eprintln!("done after {:.1} min", total / 60.0),
    }
    let failed: Vec<&str> = sections
        .iter()
        .filter(|(_, s, _)| s.failed.is_some())
        .map(|(_, s, _)| s.title.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("scenarios failed: {}", failed.join(", "));
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("worker") => return bench_fleet::worker_main(),
        Some("budget-worker") => return bench_retrieval::budget_worker_main(),
        Some("render") => return figures::render_docs(&figures::root(), SCENARIOS),
        _ => {}
    }
    let opts = options()?;
    let wanted = |name: &str| {
        opts.only
            .as_ref()
            .is_none_or(|l| l.iter().any(|s| s == name))
    };
    let started = Instant::now();
    let mut sections: Vec<(&str, Section, f64)> = Vec::new();
    let mut run = |name: &'static str, f: &mut dyn FnMut() -> anyhow::Result<Section>| {
        if !wanted(name) {
            return;
        }
        eprintln!("== {name}");
        let t = Instant::now();
        let section = f().unwrap_or_else(|e| {
            let mut s = Section::new(name);
            s.failed = Some(format!("{e:#}"));
            s
        });
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "   {name}: {secs:.0} s{}",
            match &section.failed {
                Some(f) => format!(", FAILED: {f}"),
                None => String::new(),
            }
        );
        for (k, v) in &section.rows {
            eprintln!("   {k}: {v}");
        }
        sections.push((name, section, secs));
    };

    // CPU-bound scenarios first, each on a runtime of its own.
    run("protocol", &mut bench_protocol::explored);
    run("failover-phases", &mut bench_protocol::failover_phases);
    run("cpu", &mut bench_local::cpu_per_record);
    run("deaggregation", &mut || Ok(bench_local::deaggregation()));
    run("lanes-window", &mut bench_lanes::window_peak_slots);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let exe = std::env::current_exe()?;
    run("cold-start", &mut || {
        rt.block_on(bench_fleet::cold_start(&exe))
    });
    run("scale-out", &mut || {
        rt.block_on(bench_fleet::scale_out(&exe))
    });
    run("failover", &mut || {
        rt.block_on(bench_fleet::lose_a_worker(&exe, bench_fleet::Loss::Kill))
    });
    run("graceful-stop", &mut || {
        rt.block_on(bench_fleet::lose_a_worker(&exe, bench_fleet::Loss::Term))
    });
    run("throughput", &mut || rt.block_on(bench_local::throughput()));
    run("parallel", &mut || rt.block_on(bench_parallel::lanes()));
    run("rss", &mut || rt.block_on(bench_fleet::peak_rss(&exe)));
    run("cost", &mut || rt.block_on(bench_cost::idle_fleet_cost()));
    run("checkpoint-policy-cost", &mut || {
        rt.block_on(bench_policy::checkpoint_policy_cost())
    });
    run("cold-start-defaults", &mut || {
        rt.block_on(bench_fleet::cold_start_at_defaults(&exe))
    });
    run("pickup-defaults", &mut || {
        rt.block_on(bench_fleet::graceful_pickup_at_defaults(&exe))
    });
    run("failover-defaults", &mut || {
        rt.block_on(bench_fleet::failover_at_defaults(&exe))
    });
    run("late-joiner", &mut || {
        rt.block_on(bench_join::late_joiner(&exe))
    });
    run("reshard-defaults", &mut || {
        rt.block_on(bench_join::reshard_at_defaults(&exe))
    });
    run("load-balance", &mut || {
        rt.block_on(bench_balance::load_balance(&exe))
    });
    run("sim", &mut bench_cost::fleet_simulation);
    run("latency", &mut || rt.block_on(bench_fleet::latency(&exe)));
    run("pacing", &mut || {
        rt.block_on(bench_retrieval::polling_pacing())
    });
    run("budget", &mut || {
        rt.block_on(bench_retrieval::prefetch_budget(&exe))
    });
    run("fanout-budget", &mut || {
        rt.block_on(bench_fanout_budget::fanout_budget())
    });
    finish(sections, started.elapsed().as_secs_f64(), &opts)
}
