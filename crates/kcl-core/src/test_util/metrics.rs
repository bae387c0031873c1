//! A metrics recorder for tests: every counter and gauge recorded through
//! it, read back by name and labels.
//!
//! It keeps the metrics in metrics-util's atomic [`Registry`], the storage
//! behind its `DebuggingRecorder`, but reads them without draining them: a
//! `DebuggingRecorder` snapshot resets every counter and gauge it reads,
//! while these tests poll one counter until it moves, read a gauge set
//! several steps before, and share one global recorder among tests running
//! at once (each reading its own series).
//!
//! ```
//! use kcl_core::test_util::metrics::Recorded;
//!
//! let recorded = Recorded::new();
//! metrics::with_local_recorder(&recorded, || {
//!     metrics::counter!("calls_total", "stage" => "open").increment(2);
//!     metrics::gauge!("waiting", "shard" => "s-1").set(4.0);
//! });
//! assert_eq!(recorded.counter("calls_total", &[("stage", "open")]), 2);
//! assert_eq!(recorded.gauge("waiting", &[("shard", "s-1")]), Some(4.0));
//! assert_eq!(recorded.counters()["calls_total{stage=open}"], 2);
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

/// A recorder keeping every counter, gauge and histogram it is given
/// (see the [module](self) for why not a `DebuggingRecorder`). Clones
/// share the same metrics.
#[derive(Debug, Clone)]
pub struct Recorded(Arc<Registry<Key, AtomicStorage>>);

impl Default for Recorded {
    fn default() -> Self {
        Recorded(Arc::new(Registry::atomic()))
    }
}

impl Recorded {
    /// No metric recorded yet. Use it for one test with
    /// `metrics::with_local_recorder` or `metrics::set_default_local_recorder`.
    pub fn new() -> Self {
        Recorded::default()
    }

    /// The one recorder installed as the process's global recorder, on the
    /// first call: for code that records on threads the test does not run
    /// (a multi-threaded runtime, spawned tasks). A test binary of its
    /// own, since a process has one global recorder.
    pub fn global() -> &'static Recorded {
        static GLOBAL: OnceLock<Recorded> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let recorded = Recorded::new();
            if metrics::set_global_recorder(recorded.clone()).is_err() {
                panic!("another global metrics recorder is installed");
            }
            recorded
        })
    }

    /// The sum of counter `name` over its series that carry every label
    /// of `labels` (others may carry more); 0 if none was recorded.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut total = 0;
        self.0.visit_counters(|key, value| {
            if matches(key, name, labels) {
                total += value.load(Ordering::SeqCst);
            }
        });
        total
    }

    /// The last value set on gauge `name`'s series carrying every label of
    /// `labels`, if one was recorded (the first found, if several match).
    pub fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = None;
        self.0.visit_gauges(|key, value| {
            if found.is_none() && matches(key, name, labels) {
                found = Some(f64::from_bits(value.load(Ordering::SeqCst)));
            }
        });
        found
    }

    /// Every counter recorded, by `name{label=value,...}` (labels sorted
    /// by name), including those still at 0.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        let mut all = BTreeMap::new();
        self.0.visit_counters(|key, value| {
            all.insert(series(key), value.load(Ordering::SeqCst));
        });
        all
    }
}

/// `key` is a series of `name` carrying every label of `labels`.
fn matches(key: &Key, name: &str, labels: &[(&str, &str)]) -> bool {
    key.name() == name
        && labels
            .iter()
            .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
}

/// `name{label=value,...}`, labels sorted by name.
fn series(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl metrics::Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(Arc::clone(c)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(Arc::clone(g)))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(Arc::clone(h)))
    }
}
