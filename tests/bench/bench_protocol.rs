//! The protocol's exploration as figures: how many states the model
//! checker explores at the depth `make test` runs, how long that takes,
//! and how many seeds a minute the fleet simulator runs. Both are test
//! targets of `kcl-core` (the model is a unit test, for its access to the
//! engine's private decisions); they run here as `make test` runs them,
//! in a release build, and their own summary lines are read back.

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
