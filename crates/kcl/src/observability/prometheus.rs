//! The process-wide Prometheus recorder, and its series in the Prometheus
//! text format.
//!
//! The `metrics` facade has one global recorder per process, so the first
//! worker that serves metrics installs it and later ones (several workers
//! in one process, or a worker restarted in place) share it. It is the
//! series registry the OTLP export uses too, so a shard's series go once
//! no consumer of the process reads the shard, and `/metrics` stays the
//! size of what the process holds now, however many leases moved.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use kcl_core::ConfigError;
use metrics::Key;

use super::registry::{Buckets, HistogramPoint, KEEP_RETIRED, Registry};

static RECORDER: OnceLock<Result<Arc<Registry>, String>> = OnceLock::new();

/// The registry of kcl's Prometheus recorder, installing it on first use.
/// Fails if the application installed another recorder first.
pub(crate) fn registry() -> Result<Arc<Registry>, ConfigError> {
    RECORDER
        .get_or_init(install)
        .clone()
        .map_err(|reason| ConfigError {
            field: "serve_metrics",
            reason,
        })
}

fn install() -> Result<Arc<Registry>, String> {
    // No bound on the series: an application's own series are kept as
    // they always were; kcl's per-shard ones go with their consumers.
    let (registry, forgets) = Registry::new(usize::MAX, Buckets::default(), KEEP_RETIRED);
    metrics::set_global_recorder(Arc::clone(&registry)).map_err(|e| {
        format!(
            "cannot install kcl's Prometheus recorder ({e}); another `metrics` recorder is \
             already installed in this process: serve it yourself instead of calling \
             serve_metrics"
        )
    })?;
    // The recorder is the process's for good, and so is its subscription.
    forgets.keep_forever();
    Ok(registry)
}

/// One metric family: its `# TYPE`, the name it was recorded under (for
/// its description) and its samples, rendered.
struct Family {
    kind: &'static str,
    recorded: String,
    samples: String,
}

/// Every series of `registry` in the Prometheus text exposition format
/// (version 0.0.4): per metric name a `# HELP` line (where described), a
/// `# TYPE` line and its samples; histograms as cumulative `_bucket`
/// series with `le`, then `_sum` and `_count`. Names and label sets are
/// sorted, so two renderings of one state are the same text.
pub(crate) fn render(registry: &Registry) -> String {
    let snapshot = registry.snapshot();
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for (key, point) in sorted(snapshot.counters) {
        let (name, out) = family(&mut families, &key, "counter");
        sample(out, &name, &labels(&key, false, None), point.value as f64);
    }
    for (key, value) in sorted(snapshot.gauges) {
        let (name, out) = family(&mut families, &key, "gauge");
        sample(out, &name, &labels(&key, false, None), value);
    }
    for (key, point) in sorted(snapshot.histograms) {
        let (name, out) = family(&mut families, &key, "histogram");
        histogram(out, &name, &key, &point);
    }
    let mut text = String::new();
    for (name, family) in families {
        if let Some(description) = registry.description(&family.recorded) {
            let help = description.help.replace('\\', "\\\\").replace('\n', "\\n");
            let _ = writeln!(text, "# HELP {name} {help}");
        }
        let _ = writeln!(text, "# TYPE {name} {}", family.kind);
        text.push_str(&family.samples);
    }
    text
}

/// The samples of `key`'s family, made with its kind if new, and the
/// family's name.
fn family<'a>(
    families: &'a mut BTreeMap<String, Family>,
    key: &Key,
    kind: &'static str,
) -> (String, &'a mut String) {
    let name = sanitize(key.name(), true);
    let entry = families.entry(name.clone()).or_insert_with(|| Family {
        kind,
        recorded: key.name().to_owned(),
        samples: String::new(),
    });
    (name, &mut entry.samples)
}

/// `series` by name, then by labels.
fn sorted<T>(mut series: Vec<(Key, T)>) -> Vec<(Key, T)> {
    series.sort_by_cached_key(|(key, _)| (key.name().to_owned(), labels(key, false, None)));
    series
}

fn histogram(out: &mut String, name: &str, key: &Key, point: &HistogramPoint) {
    let mut cumulative = 0;
    for (bound, count) in point.bounds.iter().zip(&point.buckets) {
        cumulative += count;
        let le = number(*bound);
        sample(
            out,
            &format!("{name}_bucket"),
            &labels(key, true, Some(&le)),
            cumulative as f64,
        );
    }
    let all = labels(key, true, Some("+Inf"));
    sample(out, &format!("{name}_bucket"), &all, point.count as f64);
    let plain = labels(key, true, None);
    sample(out, &format!("{name}_sum"), &plain, point.sum);
    sample(out, &format!("{name}_count"), &plain, point.count as f64);
}

fn sample(out: &mut String, name: &str, labels: &str, value: f64) {
    let _ = writeln!(out, "{name}{labels} {}", number(value));
}

/// `{k="v",...}` of `key`'s labels (and `le`, for a bucket), or nothing
/// for a series without labels.
///
/// In a histogram (`histogram`), a label of the application's own named
/// `le` is renamed `exported_le` (Prometheus' name for a label that
/// clashes with one it sets): two `le`s make Prometheus refuse the scrape.
fn labels(key: &Key, histogram: bool, le: Option<&str>) -> String {
    let mut pairs: Vec<String> = key
        .labels()
        .map(|l| {
            let mut name = sanitize(l.key(), false);
            if histogram && name == "le" {
                name = "exported_le".to_owned();
            }
            format!("{name}=\"{}\"", escape(l.value()))
        })
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// A label value as the text format quotes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A value as Prometheus parses it: Go's spelling of the infinities.
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        value.to_string()
    }
}

/// `name` with every character Prometheus does not allow in a metric
/// (`colon`) or label name replaced by `_` (a leading digit too), as the
/// `metrics-exporter-prometheus` crate did.
fn sanitize(name: &str, colon: bool) -> String {
    let out: String = name
        .chars()
        .enumerate()
        .map(|(i, c)| {
            let allowed = c.is_ascii_alphabetic()
                || c == '_'
                || (colon && c == ':')
                || (i > 0 && c.is_ascii_digit());
            if allowed { c } else { '_' }
        })
        .collect();
    if out.is_empty() { "_".to_owned() } else { out }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kcl_core::metric_names::{self, MetricKind, RECORDS_PER_BATCH};

    use super::*;

    /// A registry of its own (not installed), rendered after `record`.
    fn rendered(record: impl FnOnce()) -> String {
        let (registry, _forgets) = Registry::new(usize::MAX, Buckets::default(), Duration::ZERO);
        metrics::with_local_recorder(&*registry, record);
        render(&registry)
    }

    #[test]
    fn every_metric_gets_its_help_line_from_the_names_module() {
        let text = rendered(|| {
            for spec in metric_names::ALL {
                match spec.kind {
                    MetricKind::Counter => metrics::counter!(spec.name).increment(0),
                    MetricKind::Gauge => metrics::gauge!(spec.name).set(0.0),
                    MetricKind::Histogram => metrics::histogram!(spec.name).record(0.0),
                }
            }
        });
        let undescribed: Vec<_> = metric_names::ALL
            .iter()
            .filter(|spec| {
                let head = format!(
                    "# HELP {} {}\n# TYPE {} {}\n",
                    spec.name,
                    spec.help,
                    spec.name,
                    spec.kind.as_str()
                );
                !text.contains(&head)
            })
            .map(|spec| spec.name)
            .collect();
        assert!(
            undescribed.is_empty(),
            "no # HELP and # TYPE for {undescribed:?}"
        );
    }

    #[test]
    fn counters_gauges_and_histograms_render_in_the_text_format() {
        let text = rendered(|| {
            metrics::counter!("app_orders_total", "region" => "eu\"1\\\n").increment(3);
            metrics::gauge!("app.queue depth").set(f64::INFINITY);
            metrics::describe_gauge!("app.queue depth", "Orders \\ waiting\nnow");
            metrics::gauge!("9lives", "0k" => "v").set(1.0);
            metrics::histogram!("app_size", "le" => "own").record(1.0);
            metrics::histogram!(RECORDS_PER_BATCH, "stream" => "s").record(10.0);
            metrics::histogram!(RECORDS_PER_BATCH, "stream" => "s").record(20_000.0);
        });
        let expected = "\
# TYPE _lives gauge
_lives{_k=\"v\"} 1
# TYPE app_orders_total counter
app_orders_total{region=\"eu\\\"1\\\\\\n\"} 3
# HELP app_queue_depth Orders \\\\ waiting\\nnow
# TYPE app_queue_depth gauge
app_queue_depth +Inf
# TYPE app_size histogram
app_size_bucket{exported_le=\"own\",le=\"0\"} 0
app_size_bucket{exported_le=\"own\",le=\"5\"} 1
";
        assert!(text.starts_with(expected), "{text}");
        assert!(
            text.contains("app_size_count{exported_le=\"own\"} 1\n"),
            "{text}"
        );
        let batches: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("kcl_records_per_batch"))
            .collect();
        assert_eq!(
            batches,
            [
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"1\"} 0",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"10\"} 1",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"50\"} 1",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"100\"} 1",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"250\"} 1",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"500\"} 1",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"1000\"} 1",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"2500\"} 1",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"5000\"} 1",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"10000\"} 1",
                "kcl_records_per_batch_bucket{stream=\"s\",le=\"+Inf\"} 2",
                "kcl_records_per_batch_sum{stream=\"s\"} 20010",
                "kcl_records_per_batch_count{stream=\"s\"} 2",
            ]
        );
    }

    #[test]
    fn a_shard_no_consumer_reads_is_no_longer_rendered() {
        let (registry, _forgets) = Registry::new(usize::MAX, Buckets::default(), Duration::ZERO);
        metrics::with_local_recorder(&*registry, || {
            for shard in ["shard-1", "shard-2"] {
                let labels = [("stream", "orders"), ("shard", shard)];
                metrics::counter!(metric_names::RECORDS_PROCESSED, &labels).increment(1);
                metrics::gauge!(metric_names::SHARD_RECORDS_WAITING, &labels).set(2.0);
                metrics::histogram!(metric_names::RECORDS_PER_BATCH, &labels).record(1.0);
            }
            metrics::gauge!(metric_names::LEASES_HELD).set(1.0);
        });
        registry.forget_shards(&[&("orders".to_owned(), "shard-1".to_owned())]);
        let text = render(&registry);
        assert!(!text.contains("shard-1"), "{text}");
        for kept in [
            "kcl_records_processed_total{stream=\"orders\",shard=\"shard-2\"} 1",
            "kcl_shard_records_waiting{stream=\"orders\",shard=\"shard-2\"} 2",
            "kcl_records_per_batch_count{stream=\"orders\",shard=\"shard-2\"} 1",
            "kcl_leases_held 1",
        ] {
            assert!(text.contains(kept), "{kept} is gone from {text}");
        }
    }

    /// A worker's split parent leaves `/metrics` once its consumer ended,
    /// through the registry's subscription to the end of consumers; its
    /// children, still read, stay.
    #[test]
    fn a_split_parent_leaves_the_rendered_metrics_once_its_consumer_ended() {
        use kcl_core::source::memory::InMemoryShardSource;
        use kcl_core::test_util::fleet;
        use kcl_core::{LeaseConfig, processor::ShardContext};

        // A stream of this test's own: the consumers per shard are counted
        // process-wide, and other tests run meanwhile.
        const STREAM: &str = "prometheus-split";
        let processed = |text: &str, shard: &str| {
            let name = metric_names::RECORDS_PROCESSED;
            let series = format!("{name}{{stream=\"{STREAM}\",shard=\"{shard}\"}} ");
            text.lines()
                .find_map(|line| line.strip_prefix(&series)?.parse::<f64>().ok())
        };
        let (registry, _forgets) = Registry::new(usize::MAX, Buckets::default(), Duration::ZERO);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        // One thread runs every task of the worker, so all of them record
        // into this registry.
        metrics::with_local_recorder(&*registry, || {
            runtime.block_on(async {
                let source = InMemoryShardSource::new();
                let parent = source.create_stream(STREAM, 1).remove(0);
                let mut fleet = fleet::Fleet::new();
                let lease = LeaseConfig::builder("w").build().unwrap();
                let config = fleet::one_stream(lease, STREAM).build().unwrap();
                let store = Arc::new(fleet.table_for_worker());
                let factory = |_: &ShardContext| crate::test_support::NoOp;
                fleet.run_worker(config, store, Arc::new(source.clone()), factory);
                fleet::produce(&source, STREAM, 2, 0, 5);
                rendered_until(&registry, "the parent's records processed", |t| {
                    processed(t, &parent) == Some(10.0)
                })
                .await;
                let [c1, c2] = source.split(STREAM, &parent).unwrap();
                fleet::produce(&source, STREAM, 2, 5, 5);
                rendered_until(&registry, "the children's records processed", |t| {
                    processed(t, &c1).unwrap_or(0.0) + processed(t, &c2).unwrap_or(0.0) == 10.0
                })
                .await;
                rendered_until(&registry, "the parent's series gone", |t| {
                    !t.contains(&parent)
                })
                .await;
                fleet.stop_all().await;
            });
        });
    }

    /// Waits (on the paused clock) until the rendered text passes `done`.
    async fn rendered_until(registry: &Registry, what: &str, done: impl Fn(&str) -> bool) {
        for _ in 0..1200 {
            if done(&render(registry)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("not {what} within 120 s: {}", render(registry));
    }
}
