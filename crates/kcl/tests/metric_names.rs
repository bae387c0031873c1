//! The metric names are declared once, in `kcl_core::metric_names`: the
//! metrics tables of docs/metrics.md document exactly that set, and no emit
//! site in the crates names a metric by a string literal of its own.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use kcl_core::metric_names::ALL;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The section of docs/metrics.md that documents the metrics, up to the
/// next section.
fn metrics_section(doc: &str) -> &str {
    const HEADING: &str = "\n## The metrics\n";
    let start = doc
        .find(HEADING)
        .expect("docs/metrics.md has no `## The metrics` section");
    let rest = &doc[start + HEADING.len()..];
    let end = rest
        .find("\n## ")
        .into_iter()
        .chain(rest.find("\n### "))
        .min();
    &rest[..end.unwrap_or(rest.len())]
}

/// One table row, `| `kcl_x` | kind | labels | meaning |`, as (name, kind).
fn parse_row(row: &str) -> Result<(String, String), String> {
    let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
    let [name, kind, ..] = cells[..] else {
        return Err(format!("row with fewer than two cells: {row}"));
    };
    let name = name
        .strip_prefix('`')
        .and_then(|n| n.strip_suffix('`'))
        .filter(|n| n.starts_with("kcl_") && !n.contains('`'))
        .ok_or_else(|| format!("row does not name exactly one `kcl_*` metric: {row}"))?;
    Ok((name.to_owned(), kind.to_owned()))
}

/// Every metric the tables of docs/metrics.md document, by name, with its
/// kind.
fn documented_metrics() -> BTreeMap<String, String> {
    let doc = fs::read_to_string(workspace_root().join("docs/metrics.md"))
        .expect("docs/metrics.md is readable");
    let mut documented = BTreeMap::new();
    let rows = metrics_section(&doc)
        .lines()
        .filter(|line| line.starts_with('|'))
        .filter(|line| !line.starts_with("| metric ") && !line.starts_with("| ---"));
    for row in rows {
        let (name, kind) = parse_row(row).unwrap_or_else(|e| panic!("docs/metrics.md: {e}"));
        if let Some(earlier) = documented.insert(name.clone(), kind) {
            panic!("docs/metrics.md documents {name} twice (once as {earlier})");
        }
    }
    documented
}

fn declared_metrics() -> BTreeMap<String, String> {
    ALL.iter()
        .map(|spec| (spec.name.to_owned(), spec.kind.as_str().to_owned()))
        .collect()
}

#[test]
fn the_metrics_doc_documents_exactly_the_declared_metrics_with_their_kinds() {
    let documented = documented_metrics();
    let declared = declared_metrics();
    let mut problems = Vec::new();
    for (name, kind) in &declared {
        match documented.get(name) {
            None => problems.push(format!(
                "{name} ({kind}) is recorded but not in docs/metrics.md"
            )),
            Some(doc) if doc != kind => {
                problems.push(format!("{name} is a {kind}, docs/metrics.md says {doc}"))
            }
            Some(_) => {}
        }
    }
    for name in documented.keys().filter(|n| !declared.contains_key(*n)) {
        problems.push(format!(
            "{name} is in docs/metrics.md but not in kcl_core::metric_names"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// Lines (1-based) where a macro call's first argument is a `"kcl_`
/// string literal, the name written out instead of taken from the module.
fn literal_metric_names(source: &str) -> Vec<usize> {
    source
        .match_indices("!(")
        .filter(|(at, _)| source[at + 2..].trim_start().starts_with("\"kcl_"))
        .map(|(at, _)| source[..at].lines().count().max(1))
        .collect()
}

#[test]
fn no_emit_site_names_a_metric_by_a_string_literal() {
    let mut files = Vec::new();
    for krate in fs::read_dir(workspace_root().join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    assert!(!files.is_empty(), "found no sources under crates/*/src");
    let offenders: Vec<String> = files
        .iter()
        .filter(|path| !path.ends_with("kcl-core/src/metric_names.rs"))
        .flat_map(|path| {
            let source = fs::read_to_string(path).unwrap();
            literal_metric_names(&source)
                .into_iter()
                .map(move |line| format!("{}:{line}", path.display()))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "metric names written as literals (use kcl_core::metric_names): {offenders:?}"
    );
}

#[test]
fn the_literal_scan_sees_a_name_on_the_line_after_the_macro() {
    let source = "fn f() {\n    metrics::counter!(\n        \"kcl_x_total\"\n    );\n}\n";
    assert_eq!(literal_metric_names(source), [2]);
    assert!(literal_metric_names("metrics::counter!(NAME, \"kcl_label\" => v)").is_empty());
}

/// The lease table's metrics carry an `op` label for every store
/// operation: docs/metrics.md names each (it missed the newer ones:
/// `reclaim`, `beat`, `read_beats`, ...).
#[test]
fn every_store_operation_label_is_documented() {
    let doc = fs::read_to_string(workspace_root().join("docs/metrics.md")).unwrap();
    const INTRO: &str = "**Lease table** (label `op`:";
    let start = doc
        .find(INTRO)
        .expect("the lease table's metrics say their `op` label");
    let labels = &doc[start..start + doc[start..].find("):").expect("the list ends")];
    let missing: Vec<&str> = kcl_core::store::StoreOp::ALL
        .iter()
        .map(|op| op.as_str())
        .filter(|op| !labels.contains(&format!("`{op}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/metrics.md does not name op {missing:?}"
    );
}
