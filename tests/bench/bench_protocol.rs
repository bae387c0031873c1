//! The protocol's exploration as figures: how many states the model
//! checker explores at the depth `make test` runs, how long that takes,
//! and how many seeds a minute the fleet simulator runs; and the failover
//! at the defaults as a distribution over kill phases, from the fleet
//! simulation. All are test targets of `kcl-core` (the model is a unit
//! test, for its access to the engine's private decisions); they run here
//! as `make test` runs them, in a release build, and their own summary
//! lines are read back.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

use crate::Section;

/// Runs `cargo test --release -p kcl-core` with `args` and `env`, and
/// returns its standard output.
fn cargo_test(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["test", "--release", "-p", "kcl-core"]).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().context("running cargo test")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "cargo test {} failed:\n{}{}",
            args.join(" "),
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// The number after `key` on the first line holding `marker`.
fn number_after(text: &str, marker: &str, key: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.contains(marker))?;
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.parse().ok()
}

pub(crate) fn explored() -> anyhow::Result<Section> {
    let mut s = Section::new("The lease protocol explored: model checker and fleet simulator");
    // Built first, so that the timings below are the runs' own.
    cargo_test(&["--no-run", "--lib", "--test", "sim"], &[])?;
    let started = Instant::now();
    let model = cargo_test(&["--lib", "leases::model", "--", "--nocapture"], &[])?;
    let model_s = started.elapsed().as_secs_f64();
    let states =
        number_after(&model, "model:", "model:").context("the model printed no state count")?;
    s.row(
        "model checker, make test's horizon (26 s)",
        format!("{states:.0} states, {model_s:.1} s"),
    );
    s.figure("model_states_explored", states, "states");
    s.figure("model_check_s", model_s, "s");
    let sim = cargo_test(
        &["--test", "sim", "random_seeds", "--", "--nocapture"],
        &[("SIM_SEEDS", "40"), ("SIM_BASE", "7000")],
    )?;
    let per_min = number_after(&sim, "seeds/min", "(").context("the simulator printed no rate")?;
    s.row(
        "fleet simulator, 40 seeds of 3 simulated minutes",
        format!("{per_min:.0} seeds/min"),
    );
    s.figure("sim_seeds_per_min", per_min, "seeds/min");
    s.what = "The model checker at the horizon make test runs (every interleaving of two \
              workers' beats, reads, ticks and time for 26 s, three scenarios), and 40 seeds \
              of the seeded fleet simulator (2-4 workers, mixed settings, random faults), \
              each in a release build."
        .into();
    s.headline =
        format!("model: {states:.0} states in {model_s:.1} s; simulator: {per_min:.0} seeds/min");
    s.settings = "make test runs the same model depth and 14 seeds in a debug build.".into();
    s.limits = "One core's worth per run; the model's memory grows with its horizon (about a \
                gigabyte at 26 s)."
        .into();
    Ok(s)
}

/// The failover bound the fleet simulation asserts at the defaults: the
/// lease duration (10 s) plus how late a watcher sees a beat (0.5 s).
const FAILOVER_BOUND_S: f64 = 10.5;
/// What issue-level targets allow: the median and the worst kill phase.
const FAILOVER_MEDIAN_MAX_S: f64 = 10.0;
const FAILOVER_MAX_S: f64 = 14.0;

/// A `Duration`'s `Debug` text (`9.88s`, `980ms`, `12.5µs`) in seconds.
fn debug_secs(text: &str) -> Option<f64> {
    let digits: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let value: f64 = digits.parse().ok()?;
    let unit = &text[digits.len()..];
    let scale = if unit.starts_with("ms") {
        1e-3
    } else if unit.starts_with("µs") || unit.starts_with("us") {
        1e-6
    } else if unit.starts_with("ns") {
        1e-9
    } else if unit.starts_with('s') {
        1.0
    } else {
        return None;
    };
    Some(value * scale)
}

/// `(min, median, max)` from the line the kill-phase test prints for `mode`.
fn phases(text: &str, mode: &str) -> Option<(f64, f64, f64)> {
    let marker = format!("failover ({mode}) over");
    let line = text.lines().find(|l| l.contains(&marker))?;
    let after = |key: &str| debug_secs(&line[line.find(key)? + key.len()..]);
    Some((after("min ")?, after("median ")?, after("max ")?))
}

/// Failover at the library's defaults (lease 10 s, tick 10 s, 2 workers on
/// 8 shards) over 12 kill phases spread evenly over a tick, in both
/// renewal modes: the fleet simulation's own test, under paused time, read
/// back. The real-process run (`failover-defaults`) checks one phase end to
/// end against the emulators.
pub(crate) fn failover_phases() -> anyhow::Result<Section> {
    let mut s = Section::new("Failover at the defaults over 12 kill phases (fleet simulation)");
    let out = cargo_test(
        &[
            "--test",
            "fleet_sim",
            "failover_stays_within_its_bound_at_every_kill_phase",
            "--",
            "--nocapture",
        ],
        &[],
    )?;
    let mut heads = Vec::new();
    for (mode, median_name, max_name) in [
        (
            "WorkerLiveness",
            "failover_defaults_median_s",
            "failover_defaults_max_s",
        ),
        (
            "PerLease",
            "failover_defaults_per_lease_median_s",
            "failover_defaults_per_lease_max_s",
        ),
    ] {
        let (min, median, max) =
            phases(&out, mode).with_context(|| format!("no kill-phase line for {mode}"))?;
        s.row(
            &format!("{mode}: min / median / max"),
            format!("{min:.2} / {median:.2} / {max:.2} s"),
        );
        s.figure(median_name, median, "s");
        s.figure(max_name, max, "s");
        if median > FAILOVER_MEDIAN_MAX_S || max > FAILOVER_MAX_S {
            s.failed = Some(format!(
                "{mode}: failover median {median:.2} s, max {max:.2} s: above \
                 {FAILOVER_MEDIAN_MAX_S} s / {FAILOVER_MAX_S} s"
            ));
        }
        heads.push(format!("{mode} median {median:.1} s, max {max:.1} s"));
    }
    s.what = "2 workers on 8 shards at the library's defaults (lease 10 s, tick 10 s, beat \
              every 5 s) in the fleet simulation (the engine over the in-memory table, paused \
              time); once balanced and past the cadences' learning, the worker holding the \
              most leases is killed at one of 12 phases spread evenly over a tick; the time \
              until the survivor processes every one of its leases. Both renewal modes."
        .into();
    s.headline = format!("failover over 12 kill phases: {}", heads.join("; "));
    s.settings = format!(
        "Production defaults. The test itself asserts every phase within {FAILOVER_BOUND_S} s \
         (lease + 0.5 s); the bench fails past a median of {FAILOVER_MEDIAN_MAX_S} s or a max \
         of {FAILOVER_MAX_S} s."
    );
    s.limits = "The lease duration by design, counted from the holder's last beat: a kill \
                just after a beat is taken over a lease duration later, one just before it a \
                beat interval sooner. The watcher sees each beat within about 100 ms."
        .into();
    Ok(s)
}
