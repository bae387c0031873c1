//! The in-memory aggregation between two flushes: one statistic set per
//! CloudWatch metric, the gauges' last values, and the batching of a
//! flush into PutMetricData requests.
//!
//! Memory is bounded: at most `max_datums` CloudWatch metrics wait for a
//! flush, and at most `max_datums` gauges are remembered; a sample for a
//! metric beyond that is dropped and counted, never queued.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StatisticSet};

use super::mapping::{DatumKey, Sample, Target};

/// PutMetricData's limit on metric data per request.
pub(crate) const MAX_DATUMS_PER_REQUEST: usize = 1000;
/// PutMetricData's limit on a request's size is 1 MB; batches are cut
/// below it by an estimate that errs on the large side (see
/// [`estimated_size`]).
pub(crate) const MAX_REQUEST_BYTES: usize = 900_000;

/// A CloudWatch statistic set: the samples of one metric since the last
/// flush.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Stat {
    pub(crate) count: f64,
    pub(crate) sum: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Stat {
    /// `n` samples of `value`.
    fn of(value: f64, n: f64) -> Stat {
        Stat {
            count: n,
            sum: value * n,
            min: value,
            max: value,
        }
    }

    fn merge(&mut self, other: Stat) {
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }
}

/// The samples waiting for the next flush.
#[derive(Debug)]
pub(crate) struct Pending {
    max_datums: usize,
    stats: Mutex<HashMap<Arc<DatumKey>, Stat>>,
    dropped: AtomicU64,
}

impl Pending {
    pub(crate) fn new(max_datums: usize) -> Self {
        Pending {
            max_datums,
            stats: Mutex::default(),
            dropped: AtomicU64::new(0),
        }
    }

    fn stats(&self) -> MutexGuard<'_, HashMap<Arc<DatumKey>, Stat>> {
        // A panic elsewhere while holding the lock leaves the map
        // consistent (every update is one insert or one merge).
        self.stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a counter's increment, a gauge's value or a histogram's
    /// observation to every target.
    pub(crate) fn record(&self, targets: &[Target], value: f64) {
        if !value.is_finite() {
            // CloudWatch rejects NaN and infinities, and the whole request
            // with them.
            self.dropped
                .fetch_add(targets.len() as u64, Ordering::Relaxed);
            return;
        }
        let mut stats = self.stats();
        for target in targets {
            let stat = match target.sample {
                Sample::Value => Stat::of(value, 1.0),
                Sample::Scaled(factor) => Stat::of(value * factor, 1.0),
                Sample::Each(each) => {
                    if value <= 0.0 {
                        continue;
                    }
                    Stat::of(each, value)
                }
            };
            if let Some(existing) = stats.get_mut(&target.key) {
                existing.merge(stat);
            } else if stats.len() < self.max_datums {
                stats.insert(Arc::clone(&target.key), stat);
            } else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Samples dropped so far because the buffer was full (or the value
    /// was not a finite number).
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn count_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }

    fn take(&self) -> HashMap<Arc<DatumKey>, Stat> {
        std::mem::take(&mut *self.stats())
    }
}

/// A gauge's state: its last value is published again at every flush
/// that saw no new one, as a CloudWatch metric needs a datum per period.
#[derive(Debug)]
pub(crate) struct GaugeCell {
    targets: Vec<Target>,
    pending: Arc<Pending>,
    value: AtomicU64,
    /// Set since the last flush (its samples are in `pending` already).
    touched: AtomicBool,
    /// A per-shard gauge, which kcl sets to 0 when the worker stops
    /// consuming the shard: forgotten once it was published at 0.
    forget_at_zero: bool,
}

impl GaugeCell {
    fn value(&self) -> f64 {
        f64::from_bits(self.value.load(Ordering::Relaxed))
    }

    fn store(&self, value: f64) {
        self.value.store(value.to_bits(), Ordering::Relaxed);
        self.touched.store(true, Ordering::Relaxed);
        self.pending.record(&self.targets, value);
    }
}

impl metrics::GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        // One writer per series in kcl; a race between two writers could
        // lose an update, as any load-then-store gauge would.
        self.store(self.value() + value);
    }

    fn decrement(&self, value: f64) {
        self.store(self.value() - value);
    }

    fn set(&self, value: f64) {
        self.store(value);
    }
}

/// A counter's or histogram's series: its targets, ready to record into.
#[derive(Debug)]
pub(crate) struct Series {
    pub(crate) targets: Vec<Target>,
    pub(crate) pending: Arc<Pending>,
}

impl metrics::CounterFn for Series {
    fn increment(&self, value: u64) {
        self.pending.record(&self.targets, value as f64);
    }

    fn absolute(&self, value: u64) {
        // kcl never sets a counter outright; an application's absolute
        // value is one sample, as the Java KCL's `addData` would be.
        self.pending.record(&self.targets, value as f64);
    }
}

impl metrics::HistogramFn for Series {
    fn record(&self, value: f64) {
        self.pending.record(&self.targets, value);
    }
}

/// Every series' aggregation: the pending statistic sets and the gauges.
#[derive(Debug)]
pub(crate) struct Buffer {
    pub(crate) pending: Arc<Pending>,
    max_gauges: usize,
    gauges: Mutex<HashMap<metrics::Key, Arc<GaugeCell>>>,
}

impl Buffer {
    pub(crate) fn new(max_datums: usize) -> Self {
        Buffer {
            pending: Arc::new(Pending::new(max_datums)),
            max_gauges: max_datums,
            gauges: Mutex::default(),
        }
    }

    fn gauges(&self) -> MutexGuard<'_, HashMap<metrics::Key, Arc<GaugeCell>>> {
        self.gauges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The gauge of `key`, remembered across flushes; `None` (and counted
    /// as dropped) when `max_datums` gauges are remembered already.
    pub(crate) fn gauge(
        &self,
        key: &metrics::Key,
        targets: impl FnOnce() -> (Vec<Target>, bool),
    ) -> Option<Arc<GaugeCell>> {
        let mut gauges = self.gauges();
        if let Some(cell) = gauges.get(key) {
            return Some(Arc::clone(cell));
        }
        let (targets, forget_at_zero) = targets();
        if targets.is_empty() {
            return None;
        }
        if gauges.len() >= self.max_gauges {
            self.pending.count_dropped(1);
            return None;
        }
        let cell = Arc::new(GaugeCell {
            targets,
            pending: Arc::clone(&self.pending),
            value: AtomicU64::new(0.0f64.to_bits()),
            touched: AtomicBool::new(false),
            forget_at_zero,
        });
        gauges.insert(key.clone(), Arc::clone(&cell));
        Some(cell)
    }

    /// Everything to publish now: the gauges not set since the last flush
    /// contribute their last value (a per-shard gauge at 0 is forgotten
    /// instead), then the pending statistic sets are taken, sorted by
    /// metric.
    pub(crate) fn drain(&self) -> Vec<(Arc<DatumKey>, Stat)> {
        self.gauges().retain(|_, cell| {
            if cell.touched.swap(false, Ordering::Relaxed) {
                return true;
            }
            let value = cell.value();
            if value == 0.0 && cell.forget_at_zero {
                return false;
            }
            cell.pending.record(&cell.targets, value);
            true
        });
        let mut data: Vec<_> = self.pending.take().into_iter().collect();
        data.sort_by(|a, b| a.0.cmp(&b.0));
        data
    }

    /// Gauges remembered (for the tests of the bound).
    #[cfg(test)]
    pub(crate) fn gauge_count(&self) -> usize {
        self.gauges().len()
    }
}

/// A statistic set as a PutMetricData datum, stamped `at`.
pub(crate) fn datum(key: &DatumKey, stat: &Stat, at: SystemTime) -> MetricDatum {
    MetricDatum::builder()
        .metric_name(key.name.as_ref())
        .set_dimensions(Some(
            key.dimensions
                .iter()
                .map(|(name, value)| {
                    Dimension::builder()
                        .name(name.as_ref())
                        .value(value)
                        .build()
                })
                .collect(),
        ))
        .statistic_values(
            StatisticSet::builder()
                .sample_count(stat.count)
                .sum(stat.sum)
                .minimum(stat.min)
                .maximum(stat.max)
                .build(),
        )
        .unit(key.unit.standard())
        .timestamp(aws_sdk_cloudwatch::primitives::DateTime::from(at))
        .build()
}

/// An upper bound of a datum's share of a request, in bytes: its strings
/// and numbers as the AWS query protocol (the most verbose CloudWatch
/// speaks) would spell them, member paths included.
pub(crate) fn estimated_size(key: &DatumKey) -> usize {
    const DATUM_OVERHEAD: usize = 400;
    const DIMENSION_OVERHEAD: usize = 100;
    DATUM_OVERHEAD
        + key.name.len()
        + key
            .dimensions
            .iter()
            .map(|(n, v)| DIMENSION_OVERHEAD + n.len() + v.len() * 3)
            .sum::<usize>()
}

/// Cuts a flush's data into PutMetricData requests within the API's
/// limits: at most [`MAX_DATUMS_PER_REQUEST`] data and about
/// [`MAX_REQUEST_BYTES`] each, in order.
pub(crate) fn batches<T>(data: Vec<(T, usize)>) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = 0;
    for (item, size) in data {
        if !batch.is_empty()
            && (batch.len() == MAX_DATUMS_PER_REQUEST || bytes + size > MAX_REQUEST_BYTES)
        {
            out.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += size;
        batch.push(item);
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}
