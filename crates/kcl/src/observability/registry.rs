//! The aggregation behind both exporters (the Prometheus endpoint and the
//! OTLP push): one cell per series (metric name and label set), updated
//! lock-free for counters and gauges and under a per-series lock for
//! histograms, read by the exporter.
//!
//! Series are kept for the life of the process, as cumulative counters
//! must be, except a shard's: once no consumer of the process reads a
//! shard ([`kcl_core::shard_series`]), every series labelled with its
//! stream and shard is forgotten, so that leases moving between workers
//! do not grow the registry without end. Not at once: its gauges were set
//! to 0 as its consumer stopped, and the alerts rely on seeing that 0 (a
//! stall or lag alert on the shard ends with it). So the series are
//! exported at least once more, and for [`KEEP_RETIRED`] after, before
//! they go, unless a consumer reads the shard again by then. Nothing may
//! export them (no scraper): then they go half an hour after, as new
//! series come.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant, SystemTime};

use kcl_core::metric_names::{self, MetricUnit};
use kcl_core::shard_series::{self, Subscription};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tracing::warn;

/// How long the series of a shard no consumer reads any more stay (and
/// are exported) before they go: two minutes, so that every scraper with
/// an interval up to that sees the gauges at 0 at least once.
pub(crate) const KEEP_RETIRED: Duration = Duration::from_secs(120);

/// How many times `keep_retired` a retired shard's series stay when no
/// snapshot exports them (see [`Registry::forget_long_retired`]).
const UNEXPORTED_KEEP: u32 = 15;

/// The OpenTelemetry SDKs' default explicit buckets, for histograms kcl
/// has no buckets of its own for (an application's histograms).
const DEFAULT_BUCKETS: &[f64] = &[
    0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0, 7500.0,
    10000.0,
];

/// Which bucket bounds a histogram gets, by name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Buckets {
    pub(crate) configured: Vec<(String, Vec<f64>)>,
}

impl Buckets {
    /// The bounds of histogram `name`: as configured (the last setting
    /// for a name wins), else kcl's, else the OpenTelemetry defaults.
    pub(crate) fn bounds(&self, name: &str) -> Vec<f64> {
        if let Some((_, bounds)) = self.configured.iter().rev().find(|(n, _)| n == name) {
            return bounds.clone();
        }
        crate::observability::kcl_histogram_buckets(name)
            .unwrap_or(DEFAULT_BUCKETS)
            .to_vec()
    }
}

/// The registry records what the `metrics` facade is given: installed as
/// the process's recorder (behind an `Arc`, which the exporter shares).
impl Recorder for Registry {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.describe(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.describe(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.describe(key, unit, description);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match self.counter(key) {
            Some(cell) => Counter::from_arc(cell),
            None => Counter::from_arc(Arc::clone(&self.overflow)),
        }
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        match self.gauge(key) {
            Some(cell) => Gauge::from_arc(cell),
            None => Gauge::from_arc(Arc::clone(&self.overflow)),
        }
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        match self.histogram(key) {
            Some(cell) => Histogram::from_arc(cell),
            None => Histogram::from_arc(Arc::clone(&self.overflow)),
        }
    }
}

/// A metric's unit (UCUM, as OTLP wants it) and description.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Description {
    pub(crate) unit: String,
    pub(crate) help: String,
}

/// Every series, by kind. A name is expected to be used with one kind; if
/// an application records one name as two kinds, both are exported.
#[derive(Default)]
struct Series {
    counters: HashMap<Key, Arc<CounterCell>>,
    gauges: HashMap<Key, Arc<GaugeCell>>,
    histograms: HashMap<Key, Arc<HistogramCell>>,
}

impl Series {
    fn len(&self) -> usize {
        self.counters.len() + self.gauges.len() + self.histograms.len()
    }
}

/// The series, their descriptions and the overflow count.
pub(crate) struct Registry {
    series: RwLock<Series>,
    pub(crate) max_series: usize,
    /// Where the measurements of series beyond `max_series` go.
    overflow: Arc<Overflow>,
    /// Whether the first drop was logged.
    warned: AtomicBool,
    descriptions: RwLock<HashMap<String, Description>>,
    buckets: Buckets,
    /// Shards no consumer reads any more, by (stream, shard), whose
    /// series go once exported and `keep_retired` old.
    retired: Mutex<HashMap<(String, String), Retired>>,
    keep_retired: Duration,
}

/// When a shard's last consumer stopped, and whether a snapshot exported
/// its series since. A shard read again and retired again starts anew, so
/// that its new zeros are exported too.
struct Retired {
    at: Instant,
    exported: bool,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("series", &self.series_count())
            .field("max_series", &self.max_series)
            .finish()
    }
}

impl Registry {
    /// An empty registry that knows every kcl metric's unit and
    /// description, and the subscription that makes it forget a shard's
    /// series once no consumer reads the shard, exported and
    /// `keep_retired` later ([`KEEP_RETIRED`] but in tests; dropping the
    /// subscription ends that).
    pub(crate) fn new(
        max_series: usize,
        buckets: Buckets,
        keep_retired: Duration,
    ) -> (Arc<Self>, Subscription) {
        let descriptions = metric_names::ALL
            .iter()
            .map(|spec| {
                let description = Description {
                    unit: spec.unit.map(kcl_unit).unwrap_or_default().to_owned(),
                    help: spec.help.to_owned(),
                };
                (spec.name.to_owned(), description)
            })
            .collect();
        let registry = Arc::new(Registry {
            series: RwLock::default(),
            max_series,
            overflow: Arc::default(),
            warned: AtomicBool::new(false),
            descriptions: RwLock::new(descriptions),
            buckets,
            retired: Mutex::default(),
            keep_retired,
        });
        let weak = Arc::downgrade(&registry);
        let subscription = shard_series::subscribe(move |stream, shard| {
            if let Some(registry) = weak.upgrade() {
                registry.retire(stream, shard, Instant::now());
            }
        });
        (registry, subscription)
    }

    /// No consumer reads `shard` of `stream` since `at`: its series go once
    /// exported and `keep_retired` old. A shard retired again starts anew.
    fn retire(&self, stream: &str, shard: &str, at: Instant) {
        let key = (stream.to_owned(), shard.to_owned());
        let retired = Retired {
            at,
            exported: false,
        };
        lock(&self.retired).insert(key, retired);
    }

    /// Forgets the shards retired long enough whose series a snapshot
    /// exported, unless a consumer reads them again; marks the others
    /// exported by the snapshot about to be taken.
    fn sweep(&self, now: Instant) {
        let due =
            self.take_retired(|r| r.exported && now.duration_since(r.at) >= self.keep_retired);
        if !due.is_empty() {
            let keys: Vec<(String, String)> = due.into_iter().map(|(key, _)| key).collect();
            // Outside the retired lock: `with_unread` holds the consumers'
            // lock, which the subscription holds as it takes ours.
            shard_series::with_unread(&keys, |unread| self.forget_shards(unread));
        }
        lock(&self.retired)
            .values_mut()
            .for_each(|r| r.exported = true);
    }

    /// Forgets the shards retired [`UNEXPORTED_KEEP`] times `keep_retired`
    /// ago, exported or not: with nothing scraping `/metrics` (only the
    /// probes asked, or the scraper was down) no snapshot swept, and every
    /// shard the process ever read kept its series. Called as a series is
    /// made, which is what grows the registry; so maybe under the
    /// consumers' lock (an application's subscriber recording a new
    /// series), where waiting for it would never end: then it is left for
    /// the next series.
    fn forget_long_retired(&self, now: Instant) {
        let limit = self.keep_retired * UNEXPORTED_KEEP;
        let due = self.take_retired(|r| now.duration_since(r.at) >= limit);
        if due.is_empty() {
            return;
        }
        let keys: Vec<(String, String)> = due.iter().map(|(key, _)| key.clone()).collect();
        if !shard_series::try_with_unread(&keys, |unread| self.forget_shards(unread)) {
            let mut retired = lock(&self.retired);
            for (key, r) in due {
                retired.entry(key).or_insert(r);
            }
        }
    }

    /// Removes and returns the retired shards `due` picks.
    fn take_retired(&self, due: impl Fn(&Retired) -> bool) -> Vec<((String, String), Retired)> {
        let mut retired = lock(&self.retired);
        let keys: Vec<(String, String)> = retired
            .iter()
            .filter(|(_, r)| due(r))
            .map(|(key, _)| key.clone())
            .collect();
        keys.into_iter()
            .filter_map(|key| retired.remove_entry(&key))
            .collect()
    }

    /// Drops every series labelled with the stream and shard of one of
    /// `shards`, in one pass over the series. A handle to one of them that
    /// someone still holds records into a cell no export reads any more.
    pub(crate) fn forget_shards(&self, shards: &[&(String, String)]) {
        let mut by_stream: HashMap<&str, Vec<&str>> = HashMap::new();
        for (stream, shard) in shards {
            by_stream.entry(stream).or_default().push(shard);
        }
        let of_shards = |key: &Key| {
            let (Some(stream), Some(shard)) = (label(key, "stream"), label(key, "shard")) else {
                return false;
            };
            by_stream
                .get(stream)
                .is_some_and(|shards| shards.contains(&shard))
        };
        let mut series = write(&self.series);
        series.counters.retain(|key, _| !of_shards(key));
        series.gauges.retain(|key, _| !of_shards(key));
        series.histograms.retain(|key, _| !of_shards(key));
    }

    /// Series held.
    pub(crate) fn series_count(&self) -> usize {
        read(&self.series).len()
    }

    /// Measurements dropped because `max_series` series were held.
    pub(crate) fn dropped(&self) -> u64 {
        self.overflow.dropped.load(Ordering::Relaxed)
    }

    /// The unit and description of `name`, if it was described (kcl's
    /// metrics always are).
    pub(crate) fn description(&self, name: &str) -> Option<Description> {
        read(&self.descriptions).get(name).cloned()
    }

    fn describe(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        let mut descriptions = write(&self.descriptions);
        // kcl's own descriptions come from metric_names; an application's
        // first description of a name wins, as in the Prometheus recorder.
        descriptions
            .entry(name.as_str().to_owned())
            .or_insert_with(|| Description {
                unit: unit.map(ucum).unwrap_or_default().to_owned(),
                help: help.into_owned(),
            });
    }

    fn counter(&self, key: &Key) -> Option<Arc<CounterCell>> {
        self.cell(
            key,
            |s| &s.counters,
            |s| &mut s.counters,
            |_| CounterCell {
                value: AtomicU64::new(0),
                start: unix_nanos(SystemTime::now()),
            },
        )
    }

    fn gauge(&self, key: &Key) -> Option<Arc<GaugeCell>> {
        self.cell(
            key,
            |s| &s.gauges,
            |s| &mut s.gauges,
            |_| GaugeCell {
                bits: AtomicU64::new(0.0_f64.to_bits()),
            },
        )
    }

    fn histogram(&self, key: &Key) -> Option<Arc<HistogramCell>> {
        self.cell(
            key,
            |s| &s.histograms,
            |s| &mut s.histograms,
            |key| HistogramCell::new(self.buckets.bounds(key.name())),
        )
    }

    /// The cell of `key`, made if there is room for another series.
    fn cell<C>(
        &self,
        key: &Key,
        map: impl Fn(&Series) -> &HashMap<Key, Arc<C>>,
        map_mut: impl Fn(&mut Series) -> &mut HashMap<Key, Arc<C>>,
        make: impl FnOnce(&Key) -> C,
    ) -> Option<Arc<C>> {
        // Most calls find their series: the read lock only.
        if let Some(cell) = map(&read(&self.series)).get(key) {
            return Some(Arc::clone(cell));
        }
        // Before the write lock: forgetting takes it.
        self.forget_long_retired(Instant::now());
        let mut series = write(&self.series);
        if let Some(cell) = map(&series).get(key) {
            return Some(Arc::clone(cell));
        }
        if series.len() >= self.max_series {
            drop(series);
            if !self.warned.swap(true, Ordering::Relaxed) {
                warn!(
                    max_series = self.max_series,
                    metric = key.name(),
                    "the OTLP exporter holds its maximum number of series: the measurements \
                     of new series are dropped from now on and counted in \
                     kcl_otlp_measurements_dropped_total (raise OtlpMetrics::max_series)"
                );
            }
            return None;
        }
        let cell = Arc::new(make(key));
        map_mut(&mut series).insert(key.clone(), Arc::clone(&cell));
        Some(cell)
    }

    /// What every series holds now (after the shards retired long enough
    /// are forgotten).
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.sweep(Instant::now());
        fn cells<C>(map: &HashMap<Key, Arc<C>>) -> Vec<(Key, Arc<C>)> {
            map.iter()
                .map(|(k, c)| (k.clone(), Arc::clone(c)))
                .collect()
        }
        let (counters, gauges, histograms) = {
            let series = read(&self.series);
            (
                cells(&series.counters),
                cells(&series.gauges),
                cells(&series.histograms),
            )
        };
        // The values are read after the lock is released: recording never
        // waits for an export.
        Snapshot {
            counters: counters
                .into_iter()
                .map(|(key, cell)| {
                    let value = cell.value.load(Ordering::Relaxed);
                    (
                        key,
                        CounterPoint {
                            value,
                            start: cell.start,
                        },
                    )
                })
                .collect(),
            gauges: gauges
                .into_iter()
                .map(|(key, cell)| (key, f64::from_bits(cell.bits.load(Ordering::Relaxed))))
                .collect(),
            histograms: histograms
                .into_iter()
                .map(|(key, cell)| (key, cell.point()))
                .collect(),
            dropped: self.dropped(),
        }
    }
}

/// The values of every series at one moment.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) counters: Vec<(Key, CounterPoint)>,
    pub(crate) gauges: Vec<(Key, f64)>,
    pub(crate) histograms: Vec<(Key, HistogramPoint)>,
    /// Measurements dropped so far for want of room (only OTLP bounds
    /// its series).
    #[cfg_attr(not(feature = "otlp"), allow(dead_code))]
    pub(crate) dropped: u64,
}

/// A counter's total since `start` (Unix nanoseconds).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CounterPoint {
    pub(crate) value: u64,
    /// OTLP's start time; the Prometheus text format has none.
    #[cfg_attr(not(feature = "otlp"), allow(dead_code))]
    pub(crate) start: u64,
}

/// A histogram's state since `start` (Unix nanoseconds).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HistogramPoint {
    pub(crate) start: u64,
    pub(crate) bounds: Arc<[f64]>,
    /// One more than `bounds`: the last counts values above every bound.
    pub(crate) buckets: Vec<u64>,
    pub(crate) count: u64,
    pub(crate) sum: f64,
    /// `None` until a value was recorded.
    pub(crate) min_max: Option<(f64, f64)>,
}

struct CounterCell {
    value: AtomicU64,
    start: u64,
}

impl CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.value.fetch_add(value, Ordering::Relaxed);
    }

    fn absolute(&self, value: u64) {
        self.value.fetch_max(value, Ordering::Relaxed);
    }
}

/// An `f64` in an atomic, as its bits.
struct GaugeCell {
    bits: AtomicU64,
}

impl GaugeCell {
    fn update(&self, f: impl Fn(f64) -> f64) {
        // Never fails: the closure always returns Some.
        let _ = self
            .bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some(f(f64::from_bits(bits)).to_bits())
            });
    }
}

impl GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.bits.store(value.to_bits(), Ordering::Relaxed);
    }
}

struct HistogramCell {
    start: u64,
    bounds: Arc<[f64]>,
    state: Mutex<HistogramState>,
}

struct HistogramState {
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
    min_max: Option<(f64, f64)>,
}

impl HistogramCell {
    fn new(bounds: Vec<f64>) -> Self {
        let buckets = vec![0; bounds.len() + 1];
        HistogramCell {
            start: unix_nanos(SystemTime::now()),
            bounds: bounds.into(),
            state: Mutex::new(HistogramState {
                buckets,
                count: 0,
                sum: 0.0,
                min_max: None,
            }),
        }
    }

    fn point(&self) -> HistogramPoint {
        let state = lock(&self.state);
        HistogramPoint {
            start: self.start,
            bounds: Arc::clone(&self.bounds),
            buckets: state.buckets.clone(),
            count: state.count,
            sum: state.sum,
            min_max: state.min_max,
        }
    }
}

impl HistogramFn for HistogramCell {
    fn record(&self, value: f64) {
        self.record_many(value, 1);
    }

    fn record_many(&self, value: f64, count: usize) {
        // A NaN has no bucket and would turn the sum into NaN for good.
        if value.is_nan() || count == 0 {
            return;
        }
        // OTLP's explicit buckets: bucket i holds bounds[i-1] < v <= bounds[i].
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        let n = count as u64;
        let mut state = lock(&self.state);
        state.buckets[bucket] += n;
        state.count += n;
        state.sum += value * count as f64;
        state.min_max = Some(match state.min_max {
            None => (value, value),
            Some((min, max)) => (min.min(value), max.max(value)),
        });
    }
}

/// The handle of every series refused for want of room: counts each
/// measurement it is given.
#[derive(Default)]
struct Overflow {
    dropped: AtomicU64,
}

impl Overflow {
    fn drop_measurements(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }
}

impl CounterFn for Overflow {
    fn increment(&self, _: u64) {
        self.drop_measurements(1);
    }

    fn absolute(&self, _: u64) {
        self.drop_measurements(1);
    }
}

impl GaugeFn for Overflow {
    fn increment(&self, _: f64) {
        self.drop_measurements(1);
    }

    fn decrement(&self, _: f64) {
        self.drop_measurements(1);
    }

    fn set(&self, _: f64) {
        self.drop_measurements(1);
    }
}

impl HistogramFn for Overflow {
    fn record(&self, _: f64) {
        self.drop_measurements(1);
    }

    fn record_many(&self, _: f64, count: usize) {
        self.drop_measurements(count as u64);
    }
}

/// The value of `key`'s label `name`, if it has one.
fn label<'k>(key: &'k Key, name: &str) -> Option<&'k str> {
    key.labels().find(|l| l.key() == name).map(|l| l.value())
}

/// Nanoseconds since the Unix epoch (0 for a clock set before it).
pub(crate) fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// kcl's units in UCUM, the notation OTLP uses.
fn kcl_unit(unit: MetricUnit) -> &'static str {
    match unit {
        MetricUnit::Bytes => "By",
        MetricUnit::Seconds => "s",
        MetricUnit::Milliseconds => "ms",
    }
}

/// The `metrics` crate's units in UCUM. A plain count has no unit: "1"
/// would make a collector's Prometheus exporter append `_ratio`.
fn ucum(unit: Unit) -> &'static str {
    match unit {
        Unit::Count => "",
        Unit::Percent => "%",
        Unit::Seconds => "s",
        Unit::Milliseconds => "ms",
        Unit::Microseconds => "us",
        Unit::Nanoseconds => "ns",
        Unit::Tebibytes => "TiBy",
        Unit::Gibibytes => "GiBy",
        Unit::Mebibytes => "MiBy",
        Unit::Kibibytes => "KiBy",
        Unit::Bytes => "By",
        Unit::TerabitsPerSecond => "Tbit/s",
        Unit::GigabitsPerSecond => "Gbit/s",
        Unit::MegabitsPerSecond => "Mbit/s",
        Unit::KilobitsPerSecond => "kbit/s",
        Unit::BitsPerSecond => "bit/s",
        Unit::CountPerSecond => "1/s",
    }
}

// A panic while a lock is held leaves plain numbers behind, still valid:
// recording and exporting go on rather than poisoning every later call.
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

fn lock<T>(lock: &Mutex<T>) -> MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use kcl_core::metric_names::{RECORDS_PROCESSED, SHARD_RECORDS_WAITING};

    use super::*;

    #[test]
    fn a_retired_shards_series_are_exported_once_more_then_go_after_keep_retired() {
        let keep = Duration::from_secs(120);
        // Retired by hand below: the subscription would also retire the
        // shards of the other tests in this process as their consumers stop.
        let (registry, forgets) = Registry::new(usize::MAX, Buckets::default(), keep);
        drop(forgets);
        metrics::with_local_recorder(&*registry, || {
            for shard in ["retired", "read"] {
                let labels = [("stream", "keep-retired"), ("shard", shard)];
                metrics::gauge!(SHARD_RECORDS_WAITING, &labels).set(0.0);
                metrics::counter!(RECORDS_PROCESSED, &labels).increment(1);
            }
        });
        let at = Instant::now();
        registry.retire("keep-retired", "retired", at);
        // Long past `keep`, but not exported yet: this export shows it.
        registry.sweep(at + keep * 10);
        assert_eq!(registry.series_count(), 4);
        // Read again and retired again just before it was due: its new
        // zeros are exported before it goes.
        let again = at + keep - Duration::from_secs(10);
        registry.retire("keep-retired", "retired", again);
        registry.sweep(at + keep);
        assert_eq!(registry.series_count(), 4, "not exported since");
        registry.sweep(again + keep - Duration::from_secs(1));
        assert_eq!(registry.series_count(), 4, "kept for `keep`");
        registry.sweep(again + keep);
        assert_eq!(registry.series_count(), 2);
        assert!(
            read(&registry.series)
                .gauges
                .keys()
                .all(|key| key.labels().any(|l| l.value() == "read")),
            "only the shard still read keeps its series"
        );
        // Only this test's stream: another test's consumer may have stopped
        // before the subscription was dropped.
        assert!(
            !lock(&registry.retired)
                .keys()
                .any(|(stream, _)| stream == "keep-retired"),
            "the forgotten shard is no longer retired"
        );
    }

    /// With nothing scraping, a shard retired long ago loses its series
    /// once a new series is made: only a snapshot forgot them, so a
    /// process whose `/metrics` nobody read kept every shard it ever read.
    #[test]
    fn a_retired_shards_series_go_without_a_scrape_as_new_series_come() {
        let keep = Duration::from_secs(120);
        let (registry, forgets) = Registry::new(usize::MAX, Buckets::default(), keep);
        drop(forgets);
        let record = |shard: &'static str| {
            metrics::with_local_recorder(&*registry, || {
                let labels = [("stream", "unscraped"), ("shard", shard)];
                metrics::gauge!(SHARD_RECORDS_WAITING, &labels).set(0.0);
            });
        };
        record("old");
        record("recent");
        let now = Instant::now();
        let long_ago = now - keep * (UNEXPORTED_KEEP + 1);
        registry.retire("unscraped", "old", long_ago);
        registry.retire("unscraped", "recent", now);
        record("new");
        let shards: Vec<String> = read(&registry.series)
            .gauges
            .keys()
            .filter_map(|key| label(key, "shard").map(str::to_owned))
            .collect();
        assert!(!shards.contains(&"old".to_owned()), "{shards:?}");
        assert!(shards.contains(&"recent".to_owned()), "kept a while");
        assert_eq!(shards.len(), 2, "{shards:?}");
    }

    /// A series made under the consumers' lock (an application's
    /// subscriber recording as a shard retires) while a long-retired
    /// shard is due does not wait for that lock, which its own thread
    /// holds: it deadlocked. The shard goes with a later series.
    #[test]
    fn a_series_made_under_the_consumers_lock_does_not_wait_for_it() {
        let keep = Duration::from_secs(120);
        let (registry, forgets) = Registry::new(usize::MAX, Buckets::default(), keep);
        drop(forgets);
        let record = |registry: &Registry, shard: &'static str| {
            metrics::with_local_recorder(registry, || {
                let labels = [("stream", "under-lock"), ("shard", shard)];
                metrics::gauge!(SHARD_RECORDS_WAITING, &labels).set(0.0);
            });
        };
        record(&registry, "old");
        registry.retire(
            "under-lock",
            "old",
            Instant::now() - keep * (UNEXPORTED_KEEP + 1),
        );
        let (done, finished) = std::sync::mpsc::channel();
        let inside = Arc::clone(&registry);
        std::thread::spawn(move || {
            let nobody_reads = [("under-lock".to_owned(), "nobody".to_owned())];
            shard_series::with_unread(&nobody_reads, |_| record(&inside, "new"));
            done.send(()).unwrap();
        });
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("a series made under the consumers' lock waited for it");
        assert_eq!(registry.series_count(), 2, "the old shard waits for later");
        record(&registry, "later");
        assert_eq!(registry.series_count(), 2, "gone with a later series");
    }
}
