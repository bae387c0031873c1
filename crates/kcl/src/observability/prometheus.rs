//! The process-wide Prometheus recorder.
//!
//! The `metrics` facade has one global recorder per process, so the first
//! worker that serves metrics installs it and later ones (several workers
//! in one process, or a worker restarted in place) share it.

use std::sync::OnceLock;

use kcl_core::ConfigError;
use kcl_core::metric_names::{self, MetricKind, MetricSpec, MetricUnit, RECORDS_PER_BATCH};
use metrics::{KeyName, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

// Shared with the OTLP exporter, which buckets alike.
use super::{BATCH_BUCKETS, SECONDS_BUCKETS};

static RECORDER: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// The handle of kcl's Prometheus recorder, installing it on first use.
/// Fails if the application installed another recorder first.
pub(crate) fn handle() -> Result<PrometheusHandle, ConfigError> {
    RECORDER
        .get_or_init(install)
        .clone()
        .map_err(|reason| ConfigError {
            field: "serve_metrics",
            reason,
        })
}

fn install() -> Result<PrometheusHandle, String> {
    // Histograms with buckets (not summaries) so that they aggregate
    // across a fleet: histogram_quantile(0.99, sum by (le) (rate(...))).
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(RECORDS_PER_BATCH.into()), BATCH_BUCKETS)
        })
        .map_err(|e| format!("invalid histogram buckets: {e}"))?;
    let handle = builder.install_recorder().map_err(|e| {
        format!(
            "cannot install kcl's Prometheus recorder ({e}); another `metrics` recorder is \
             already installed in this process: serve it yourself instead of calling \
             serve_metrics"
        )
    })?;
    describe();
    Ok(handle)
}

/// `# HELP` lines (and units) for every metric kcl records, from the one
/// table that declares them, so that no metric goes undescribed.
fn describe() {
    metrics::with_recorder(|recorder| {
        for spec in metric_names::ALL {
            describe_one(recorder, spec);
        }
    });
}

fn describe_one(recorder: &dyn Recorder, spec: &MetricSpec) {
    let name = KeyName::from_const_str(spec.name);
    let unit = spec.unit.map(unit_of);
    let help = SharedString::const_str(spec.help);
    match spec.kind {
        MetricKind::Counter => recorder.describe_counter(name, unit, help),
        MetricKind::Gauge => recorder.describe_gauge(name, unit, help),
        MetricKind::Histogram => recorder.describe_histogram(name, unit, help),
    }
}

fn unit_of(unit: MetricUnit) -> Unit {
    match unit {
        MetricUnit::Bytes => Unit::Bytes,
        MetricUnit::Seconds => Unit::Seconds,
        MetricUnit::Milliseconds => Unit::Milliseconds,
    }
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    /// Records every metric once, so that the exporter renders it.
    fn touch_all() {
        for spec in metric_names::ALL {
            match spec.kind {
                MetricKind::Counter => metrics::counter!(spec.name).increment(0),
                MetricKind::Gauge => metrics::gauge!(spec.name).set(0.0),
                MetricKind::Histogram => metrics::histogram!(spec.name).record(0.0),
            }
        }
    }

    #[test]
    fn every_metric_gets_its_help_line_from_the_names_module() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            touch_all();
        });
        let text = handle.render();
        let undescribed: Vec<_> = metric_names::ALL
            .iter()
            .filter(|spec| !text.contains(&format!("# HELP {} {}\n", spec.name, spec.help)))
            .map(|spec| spec.name)
            .collect();
        assert!(undescribed.is_empty(), "no # HELP line for {undescribed:?}");
    }
}
