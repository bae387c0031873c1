//! The benchmark figures' one source and the docs rendered from it.
//!
//! `kcl-bench` writes every run's figures and report sections into
//! `docs/benchmarks.json`; this module renders from that file alone the whole
//! of `docs/BENCHMARKS.md` and the block between `<!-- figures:begin -->` and
//! `<!-- figures:end -->` in `README.md` and `docs/guide.md`. So the figures
//! the docs quote cannot disagree with each other or with the json: the unit
//! test below fails when a committed doc differs from what the committed json
//! renders to. `make figures` (`kcl-bench render`) re-renders them, after an
//! edit of a template here or of the json; `make bench` renders at the end of
//! its run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// Where a rendered block starts in a doc; it ends at [`BLOCK_END`].
const BLOCK_BEGIN: &str = "<!-- figures:begin (rendered from docs/benchmarks.json by `make figures`; edits are overwritten) -->";
/// Where a rendered block ends.
const BLOCK_END: &str = "<!-- figures:end -->";

/// The blocks quoted outside BENCHMARKS.md: `(doc, template)`, one line per
/// paragraph or list item, wrapped when rendered. `{name}` is the figure's
/// value as stored, `{name:.N}` rounded to N decimals.
const BLOCKS: &[(&str, &str)] = &[
    (
        "README.md",
        "- **Failover** at the defaults (lease 10 s): a SIGKILLed worker's shards \
         deliver again after {failover_s:.1} s against the emulators; over 12 kill phases \
         in the fleet simulation, {failover_defaults_median_s:.1} s median and \
         {failover_defaults_max_s:.1} s at most. After a SIGTERM they are handed over in \
         {graceful_pickup_2x8_s:.1} s (median), with no record repeated.\n\
         - **DynamoDB cost** of an idle fleet, in requests a minute: {idle_requests_per_min_2x8} for 2 workers \
         on 8 shards, {idle_requests_per_min_4x100} for 4 workers on 100 shards \
         ({idle_requests_per_min_2x8_per_lease} and {idle_requests_per_min_4x100_per_lease} \
         renewing every lease, as the Java KCL does), and \
         {sim_idle_requests_per_min_100x10000} for 100 workers on 10,000 shards (simulated).\n\
         - **Throughput**: one worker drains 8 shards at {throughput_ratio_8_shards} times \
         the rate of a bare `GetRecords` loop (1 shard: {throughput_ratio_1_shard}), and \
         spends {cpu_ns_per_record_worker} ns of CPU per record in memory.\n\
         - **Parallel lanes**: a processor spending 10 ms per record handles \
         {parallel_records_per_s_n10} records/s in 10 lanes against \
         {parallel_records_per_s_n1} in 1.\n\
         - **Memory**: one worker holding 200 shards peaks at \
         {rss_peak_mib_200_shards:.1} MiB RSS; 1,000 fan-out shards under a 128 MiB \
         prefetch budget hold at most {budget_1000_shards_fanout_peak_buffered_mib:.0} MiB \
         of records.\n",
    ),
    (
        "docs/guide.md",
        "`make bench` measures the bound: 1,000 polling shards under a 128 MiB budget \
         held at most {budget_1000_shards_peak_buffered_mib:.1} MiB of records, and 1,000 \
         fan-out shards {budget_1000_shards_fanout_peak_buffered_mib:.1} MiB.\n",
    ),
];

/// Where rendered blocks wrap, as the docs' prose does.
const WIDTH: usize = 76;

/// `docs/benchmarks.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Figures {
    /// Every figure by its stable name, as of the latest run that measured
    /// it: what scripts compare from run to run.
    pub(crate) figures: BTreeMap<String, Figure>,
    /// What BENCHMARKS.md is rendered from.
    #[serde(default)]
    pub(crate) report: Report,
}

/// One figure's value and unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Figure {
    pub(crate) unit: String,
    pub(crate) value: f64,
}

/// The report's parts that are not figures by name.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Report {
    /// The machine of the latest full run, `(what, value)`, its date among
    /// them.
    pub(crate) machine: Vec<(String, String)>,
    /// How long the latest full run took, in seconds.
    pub(crate) total_s: f64,
    /// Scenario name (as `--only` takes it) -> its section as last run.
    pub(crate) sections: BTreeMap<String, Section>,
}

/// One scenario's part of the report: what a scenario returns, and what
/// `docs/benchmarks.json` keeps of it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(crate) struct Section {
    /// Heading.
    pub(crate) title: String,
    /// What is measured, and how.
    pub(crate) what: String,
    /// `(figure, value)` rows.
    pub(crate) rows: Vec<(String, String)>,
    /// Text printed as is after the table (another program's table).
    pub(crate) extra: String,
    /// The settings of the run, next to the production defaults.
    pub(crate) settings: String,
    /// The Java KCL's defaults, where a comparison means something.
    pub(crate) java: String,
    /// What limits the figure here.
    pub(crate) limits: String,
    /// One line for the summary at the top.
    pub(crate) headline: String,
    /// A check that failed (records lost, ...): the bench exits non-zero.
    pub(crate) failed: Option<String>,
    /// How long the scenario took.
    pub(crate) seconds: f64,
    /// When it ran (`YYYY-MM-DD HH:MM UTC`).
    pub(crate) date: String,
    /// The figures it recorded, by name (stable from run to run): a later
    /// run of another section cannot change them, and a value that differs
    /// from the top-level figure is shown as re-measured.
    pub(crate) figures: BTreeMap<String, f64>,
    /// Each of `figures`' units, by name: the json keeps the unit with the
    /// top-level figure only.
    #[serde(skip)]
    pub(crate) units: BTreeMap<String, &'static str>,
}

impl Section {
    pub(crate) fn new(title: &str) -> Section {
        Section {
            title: title.to_owned(),
            ..Section::default()
        }
    }

    /// Records a figure for `docs/benchmarks.json`, rounded to 3 significant decimals.
    pub(crate) fn figure(&mut self, name: &'static str, value: f64, unit: &'static str) {
        let rounded = (value * 1000.0).round() / 1000.0;
        self.figures.insert(name.to_owned(), rounded);
        self.units.insert(name.to_owned(), unit);
    }

    pub(crate) fn row(&mut self, figure: &str, value: impl Into<String>) {
        self.rows.push((figure.to_owned(), value.into()));
    }

    /// Marks the section failed with `why` when `bad`, after any check
    /// that failed before it: the bench exits non-zero.
    pub(crate) fn fail_if(&mut self, bad: bool, why: impl Into<String>) {
        if bad {
            let why = why.into();
            self.failed = Some(match self.failed.take() {
                Some(before) => format!("{before}; {why}"),
                None => why,
            });
        }
    }
}

/// The repository's root.
pub(crate) fn root() -> PathBuf {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR"));
    tests.parent().unwrap_or(tests).to_path_buf()
}

/// `docs/benchmarks.json` under `root`.
pub(crate) fn json_path(root: &Path) -> PathBuf {
    root.join("docs/benchmarks.json")
}

impl Figures {
    /// Reads `docs/benchmarks.json`; empty when there is none yet.
    pub(crate) fn load(root: &Path) -> anyhow::Result<Figures> {
        let path = json_path(root);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("{} is not the figures' JSON", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Figures::default()),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes `docs/benchmarks.json`.
    pub(crate) fn save(&self, root: &Path) -> anyhow::Result<()> {
        let path = json_path(root);
        let text = serde_json::to_string_pretty(self)? + "\n";
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    }
}

/// What every rendered doc under `root` should read, from the json there:
/// `(path, text)`.
pub(crate) fn rendered(root: &Path, order: &[&str]) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let doc = Figures::load(root)?;
    let mut docs = vec![(
        root.join("docs/BENCHMARKS.md"),
        benchmarks_md(&doc, order, false),
    )];
    for (file, template) in BLOCKS {
        let path = root.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let block = wrap(&fill(template, &doc.figures)?, WIDTH);
        let text = replace_block(&text, &block).with_context(|| path.display().to_string())?;
        docs.push((path, text));
    }
    Ok(docs)
}

/// Renders every doc from the json and writes those that changed.
pub(crate) fn render_docs(root: &Path, order: &[&str]) -> anyhow::Result<()> {
    for (path, text) in rendered(root, order)? {
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("rendered {}", path.display());
        }
    }
    Ok(())
}

/// `template` with each `{name}` / `{name:.N}` replaced by that figure's
/// value; an unknown name is an error, so a renamed figure cannot leave a
/// stale number behind.
fn fill(template: &str, figures: &BTreeMap<String, Figure>) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = start
            + rest[start..]
                .find('}')
                .context("a `{` without `}` in a figures template")?;
        let spec = &rest[start + 1..end];
        let (name, decimals) = match spec.split_once(":.") {
            Some((name, n)) => (name, Some(n.parse::<usize>()?)),
            None => (spec, None),
        };
        let value = figures
            .get(name)
            .with_context(|| format!("no figure {name:?} in docs/benchmarks.json"))?
            .value;
        match decimals {
            Some(n) => write!(out, "{value:.n$}")?,
            None => write!(out, "{value}")?,
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `text` wrapped at `width` columns, line by line: a list item's
/// continuation lines indented under its text.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let indent = if line.starts_with("- ") { "  " } else { "" };
        let mut column = 0;
        for word in line.split_whitespace() {
            if column > 0 && column + 1 + word.len() > width {
                out.push('\n');
                out.push_str(indent);
                column = indent.len();
            } else if column > 0 {
                out.push(' ');
                column += 1;
            }
            out.push_str(word);
            column += word.len();
        }
        out.push('\n');
    }
    out
}

/// `text` with what lies between its figures markers replaced by `block`.
fn replace_block(text: &str, block: &str) -> anyhow::Result<String> {
    let Some(begin) = text.find(BLOCK_BEGIN) else {
        bail!("no `{BLOCK_BEGIN}` marker");
    };
    let inner = begin + BLOCK_BEGIN.len();
    let Some(end) = text[inner..].find(BLOCK_END) else {
        bail!("no `{BLOCK_END}` after the begin marker");
    };
    Ok(format!(
        "{}\n{block}{}",
        &text[..inner],
        &text[inner + end..]
    ))
}

/// The GitHub anchor of a heading.
fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The whole of BENCHMARKS.md: the machine, a summary, the sections in
/// `order` (any others after them), and every figure. `partial` marks the
/// report of an `--only` run, printed rather than committed.
pub(crate) fn benchmarks_md(doc: &Figures, order: &[&str], partial: bool) -> String {
    let mut out = String::new();
    out.push_str(
        "# Benchmarks\n\n\
         <!-- rendered from docs/benchmarks.json by `make figures` (tests/bench/figures.rs), \
         which `make bench` runs; edits are overwritten -->\n\n\
         Figures from `make bench`: kcl against the local emulators (kinesis-mock and \
         DynamoDB Local) and in memory, on the machine below. The emulators share the \
         machine's cores with the workers, so every time here includes emulator work \
         that AWS does elsewhere; the figures compare kcl's behaviour (how many ticks, \
         how many requests, how much CPU per record), not AWS latencies.\n\n\
         The fleet scenarios run with short lease settings so that they finish in \
         seconds; each section states them next to the defaults a production \
         application uses (lease 10 s, renewal every 3.33 s, a lease-taker tick every \
         10 s +/-25 %, an idle pause of 1 s between empty `GetRecords`).\n\n\
         Every number here comes from [`benchmarks.json`](benchmarks.json), which each \
         run updates: a partial run (`kcl-bench --only`) replaces its own sections, \
         dated when they are not from the run the machine table describes, and its \
         figures. [Every figure](#every-figure) lists them all.\n\n",
    );
    if partial {
        out.push_str("*Partial run (`--only`).*\n\n");
    }
    let report = &doc.report;
    out.push_str("## Machine\n\n| | |\n|---|---|\n");
    for (k, v) in &report.machine {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    let _ = writeln!(
        out,
        "| total bench time | {:.1} min |\n",
        report.total_s / 60.0
    );
    let sections = ordered(report, order);
    out.push_str("## Summary\n\n| scenario | headline |\n|---|---|\n");
    for s in &sections {
        let headline = match &s.failed {
            Some(f) => format!("**FAILED:** {f}"),
            None if remeasured(s, &doc.figures).is_empty() => s.headline.clone(),
            None => format!(
                "{} (some figures measured again since: see the section)",
                s.headline
            ),
        };
        let _ = writeln!(out, "| [{}](#{}) | {headline} |", s.title, anchor(&s.title));
    }
    out.push('\n');
    let machine_date = report
        .machine
        .iter()
        .find(|(k, _)| k == "date")
        .map(|(_, v)| v.as_str());
    for s in &sections {
        section_md(&mut out, s, &doc.figures, machine_date);
    }
    every_figure_md(&mut out, &doc.figures);
    out
}

/// The report's sections in `order`, then any others by name.
fn ordered<'a>(report: &'a Report, order: &[&str]) -> Vec<&'a Section> {
    let known = order.iter().filter_map(|k| report.sections.get(*k));
    let others = report
        .sections
        .iter()
        .filter(|(k, _)| !order.contains(&k.as_str()))
        .map(|(_, s)| s);
    known.chain(others).collect()
}

/// One scenario's part of BENCHMARKS.md. A figure whose value differs from
/// the section's (partial runs used to update the figures alone, and a
/// figure may be edited by hand) is listed with its current value, so the
/// section never contradicts the json's figures unannounced.
fn section_md(
    out: &mut String,
    s: &Section,
    figures: &BTreeMap<String, Figure>,
    machine_date: Option<&str>,
) {
    let _ = writeln!(out, "## {}\n", s.title);
    if !s.what.is_empty() {
        let _ = writeln!(out, "{}\n", s.what);
    }
    if let Some(f) = &s.failed {
        let _ = writeln!(out, "**FAILED: {f}**\n");
    }
    if !s.rows.is_empty() {
        let _ = writeln!(out, "| figure | value |\n|---|---:|");
        for (figure, value) in &s.rows {
            let _ = writeln!(out, "| {figure} | {value} |");
        }
        out.push('\n');
    }
    if !s.extra.is_empty() {
        let _ = writeln!(out, "{}\n", s.extra.trim_end());
    }
    for (label, text) in [
        ("Settings", &s.settings),
        ("Java KCL", &s.java),
        ("What limits it here", &s.limits),
    ] {
        if !text.is_empty() {
            let _ = writeln!(out, "- **{label}:** {text}");
        }
    }
    let since = remeasured(s, figures);
    if !since.is_empty() {
        let _ = writeln!(
            out,
            "- **Measured again since** by a partial run: {}.",
            since.join("; ")
        );
    }
    let dated = match machine_date {
        Some(d) if d != s.date => format!(", on {}", s.date),
        _ => String::new(),
    };
    let _ = writeln!(out, "- *Scenario took {:.0} s{dated}.*\n", s.seconds);
}

/// The section's figures that a later run measured again, each with its
/// new value and the section's.
fn remeasured(s: &Section, figures: &BTreeMap<String, Figure>) -> Vec<String> {
    s.figures
        .iter()
        .filter_map(|(name, old)| {
            let now = figures.get(name)?;
            (now.value != *old).then(|| format!("`{name}` {} {} (was {old})", now.value, now.unit))
        })
        .collect()
}

/// The closing table: every figure of the json by name.
fn every_figure_md(out: &mut String, figures: &BTreeMap<String, Figure>) {
    out.push_str(
        "## Every figure\n\n\
         Each figure of `docs/benchmarks.json` as of the latest run that measured it; the \
         names stay the same from run to run, so that runs can be compared.\n\n\
         | figure | value | unit |\n|---|---:|---|\n",
    );
    for (name, f) in figures {
        let _ = writeln!(out, "| `{name}` | {} | {} |", f.value, f.unit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command that re-renders the docs, for the failure message.
    const RENDER_COMMAND: &str = "make figures (cargo run -p kcl-tests --bin kcl-bench -- render)";

    #[test]
    fn committed_docs_are_rendered_from_the_committed_figures() {
        let root = root();
        let mut stale = Vec::new();
        for (path, text) in rendered(&root, crate::SCENARIOS).unwrap() {
            if std::fs::read_to_string(&path).unwrap() != text {
                stale.push(path.display().to_string());
            }
        }
        let json = std::fs::read_to_string(json_path(&root)).unwrap();
        let reread = serde_json::to_string_pretty(&Figures::load(&root).unwrap()).unwrap() + "\n";
        if json != reread {
            stale.push("docs/benchmarks.json (not as kcl-bench writes it)".to_owned());
        }
        assert!(
            stale.is_empty(),
            "not what docs/benchmarks.json renders to: {}; run {RENDER_COMMAND}",
            stale.join(", ")
        );
    }

    #[test]
    fn a_template_takes_values_rounded_or_as_stored_and_refuses_unknown_names() {
        let figures = BTreeMap::from([(
            "a".to_owned(),
            Figure {
                unit: "s".into(),
                value: 1.26,
            },
        )]);
        assert_eq!(fill("{a} / {a:.1} s", &figures).unwrap(), "1.26 / 1.3 s");
        assert!(fill("{b}", &figures).is_err());
        assert_eq!(wrap("- aa bb cc\ndd ee\n", 5), "- aa\n  bb\n  cc\ndd ee\n");
        let text = format!("x\n{BLOCK_BEGIN}\nold\n{BLOCK_END}\ny\n");
        assert_eq!(
            replace_block(&text, "new\n").unwrap(),
            format!("x\n{BLOCK_BEGIN}\nnew\n{BLOCK_END}\ny\n")
        );
    }
}
