//! [`OtlpRecorder`]: the `metrics` recorder of an OTLP export.

use std::fmt;
use std::sync::Arc;

use kcl_core::shard_series::Subscription;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use super::registry::Registry;

/// A `metrics` recorder that aggregates every measurement for
/// [`OtlpExporter`](super::OtlpExporter) to push: counters as cumulative
/// sums, gauges as their last value, histograms into explicit buckets.
/// Made by [`OtlpMetrics::build`](super::OtlpMetrics::build); install it
/// with `metrics::set_global_recorder`.
///
/// It holds at most `max_series` series; the measurements of a series
/// beyond that are dropped and counted. Series are kept for the life of
/// the process, as cumulative counters must be, except a shard's: they go
/// once no consumer of the process reads the shard, so that leases moving
/// between workers do not use up `max_series`.
pub struct OtlpRecorder {
    pub(super) registry: Arc<Registry>,
    /// Forgets a shard's series while this recorder lives.
    pub(super) _forgets: Subscription,
}

impl fmt::Debug for OtlpRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpRecorder")
            .field("series", &self.registry.series_count())
            .field("max_series", &self.registry.max_series)
            .finish()
    }
}

impl Recorder for OtlpRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.registry.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.registry.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.registry.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.registry.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.registry.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.registry.register_histogram(key, metadata)
    }
}
