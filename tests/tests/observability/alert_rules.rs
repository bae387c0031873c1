//! The alert rules and the dashboard in `deploy/`: every `kcl_*` metric they
//! name is one kcl records (a rename fails here), every alert has its
//! `for:`, severity and texts, and promtool accepts the rules and passes
//! their unit tests (`deploy/prometheus/kcl-alerts.test.yml`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use kcl::metric_names::{ALL, MetricKind};

pub(crate) fn deploy_file(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy")).join(path)
}

pub(crate) fn read_deploy_file(path: &str) -> String {
    let path = deploy_file(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every `kcl_...` identifier in `text`.
fn kcl_identifiers(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while let Some(at) = text[i..].find("kcl_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        if start == 0 || !ident(bytes[start - 1]) {
            found.insert(text[start..end].to_owned());
        }
        i = end.max(start + 1);
    }
    found
}

/// The identifiers that are not series kcl exports: a histogram is
/// exported as `_bucket`, `_sum` and `_count` series.
fn unknown_metrics(names: &BTreeSet<String>) -> Vec<String> {
    names
        .iter()
        .filter(|name| {
            let known = |n: &str| ALL.iter().any(|m| m.name == n);
            let histogram = |n: &str| {
                ALL.iter()
                    .any(|m| m.name == n && m.kind == MetricKind::Histogram)
            };
            let series_of_histogram = ["_bucket", "_sum", "_count"]
                .iter()
                .any(|suffix| name.strip_suffix(suffix).is_some_and(histogram));
            // A histogram's own name is no series.
            let plain_series = known(name) && !histogram(name);
            !plain_series && !series_of_histogram
        })
        .cloned()
        .collect()
}

/// The PromQL of every panel target of the dashboard.
pub(crate) fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read_deploy_file("grafana/kcl-dashboard.json"))
            .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut queries = Vec::new();
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = panel["title"].as_str().expect("a panel title").to_owned();
        let targets = panel["targets"].as_array().expect("panel targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("a target expr");
            queries.push((title.clone(), expr.to_owned()));
        }
    }
    queries
}

#[test]
fn every_kcl_metric_in_the_alert_rules_and_the_dashboard_is_one_kcl_records() {
    let rules = kcl_identifiers(&read_deploy_file("prometheus/kcl-alerts.yml"));
    let tests = kcl_identifiers(&read_deploy_file("prometheus/kcl-alerts.test.yml"));
    let dashboard: BTreeSet<String> = dashboard_queries()
        .iter()
        .flat_map(|(_, expr)| kcl_identifiers(expr))
        .collect();
    for (file, names) in [
        ("kcl-alerts.yml", &rules),
        ("kcl-alerts.test.yml", &tests),
        ("kcl-dashboard.json", &dashboard),
    ] {
        assert!(names.len() >= 5, "{file} names only {names:?}");
        let unknown = unknown_metrics(names);
        assert!(
            unknown.is_empty(),
            "{file} names metrics kcl does not record (see kcl_core::metric_names): {unknown:?}"
        );
    }
    // What the dashboard is for: lag per shard, records per second, leases
    // per worker, checkpoints, throttles, processor time quantiles.
    for needed in [
        "kcl_millis_behind_latest",
        "kcl_records_processed_total",
        "kcl_leases_held",
        "kcl_checkpoints_total",
        "kcl_kinesis_throttles_total",
        "kcl_batch_processing_seconds_bucket",
    ] {
        assert!(
            dashboard.contains(needed),
            "the dashboard shows no {needed}"
        );
    }
    // What the alerts watch: records waiting, progress and lag, lease
    // losses and moves, throttling, leases held.
    for needed in [
        "kcl_shard_records_waiting",
        "kcl_shard_last_delivery_timestamp_seconds",
        "kcl_shard_last_checkpoint_timestamp_seconds",
        "kcl_millis_behind_latest",
        "kcl_leases_ended_total",
        "kcl_leases_acquired_total",
        "kcl_kinesis_throttles_total",
        "kcl_leases_held",
    ] {
        assert!(rules.contains(needed), "no alert uses {needed}");
    }
}

#[test]
fn a_renamed_metric_is_caught_by_the_name_check() {
    // The check itself: a misspelt name and the series of a counter taken
    // for a histogram's are reported; a histogram's series are not.
    let names = kcl_identifiers(
        "rate(kcl_records_processed_totl[5m]) + kcl_checkpoints_total_count \
         + kcl_batch_processing_seconds_bucket + kcl_leases_held",
    );
    assert_eq!(
        unknown_metrics(&names),
        ["kcl_checkpoints_total_count", "kcl_records_processed_totl"]
    );
}

#[test]
fn every_alert_has_a_for_duration_a_severity_and_its_texts() {
    let rules = read_deploy_file("prometheus/kcl-alerts.yml");
    let lines: Vec<&str> = rules.lines().map(str::trim).collect();
    let count = |prefix: &str| lines.iter().filter(|l| l.starts_with(prefix)).count();
    let alerts = count("- alert:");
    assert!(alerts >= 5, "{alerts} alerts");
    for key in ["for:", "severity:", "summary:", "description:", "expr:"] {
        assert_eq!(count(key), alerts, "{key} lines: one per alert");
    }
    for key in ["{{ $labels.stream }}", "{{ $labels.shard }}"] {
        assert!(rules.contains(key), "no annotation names {key}");
    }
}

/// Runs promtool with `args` in `deploy/prometheus`; fails with how to
/// install it when it is missing.
fn promtool(args: &[&str]) -> std::process::Output {
    Command::new("promtool")
        .args(args)
        .current_dir(deploy_file("prometheus"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install Prometheus's tools with localstack/install \
                 (it runs apt-get install prometheus), or put promtool >= 2.42 on PATH"
            )
        })
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let out = promtool(&["check", "rules", "kcl-alerts.yml"]);
    assert!(
        out.status.success(),
        "promtool check rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_alert_rules_pass_their_promtool_unit_tests() {
    let out = promtool(&["test", "rules", "kcl-alerts.test.yml"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("SUCCESS"),
        "promtool test rules failed:\n{text}"
    );
}
