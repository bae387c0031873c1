//! OpenTelemetry metrics export (feature `otlp`): kcl's metrics, and any
//! other recorded through the `metrics` facade, pushed to a collector
//! over OTLP/HTTP with protobuf encoding.
//!
//! # Layout
//!
//! - `settings`: [`OtlpMetrics`], the settings, validated at `build()`.
//! - `recorder`: [`OtlpRecorder`], the `metrics` recorder, over the
//!   series registry the Prometheus endpoint uses too (bounded here by
//!   `max_series`).
//! - `encode`: a snapshot of the series as an OTLP
//!   `ExportMetricsServiceRequest` (the generated types of
//!   `opentelemetry-proto`).
//! - `export`: [`OtlpExporter`], the periodic POST with retries, on the
//!   hyper client the AWS SDK already uses.
//!
//! # Concurrency model
//!
//! Recording never waits for an export: counters and gauges are atomics,
//! a histogram has its own short lock, and the series map is read-locked
//! on the recording path (write-locked only to add a series). An export
//! copies the series' handles under the read lock, then reads their
//! values. The exporter is a future, not a task of its own: a worker
//! spawns it beside itself in `Worker::run_until` (aborted if that future
//! is dropped) and stops it after its own shutdown, which makes the final
//! export; an application that builds the recorder itself runs
//! [`OtlpExporter::run_until`] where it likes.
//!
//! One recorder serves a whole process (the `metrics` facade has one), so
//! the first worker asking for it installs it and later workers with the
//! same settings share it, as with the Prometheus recorder.

mod encode;
mod export;
mod recorder;
mod settings;
#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

use kcl_core::ConfigError;

// The children name the registry as their sibling, as it was.
use super::registry;

pub use export::{OtlpExportError, OtlpExporter, OtlpStats};
pub use recorder::OtlpRecorder;
pub use settings::OtlpMetrics;

/// A recorder and the exporter of what it records, from valid settings.
fn pair(settings: settings::Validated) -> Result<(OtlpRecorder, OtlpExporter), ConfigError> {
    let (registry, forgets) = registry::Registry::new(
        settings.max_series,
        settings.buckets.clone(),
        registry::KEEP_RETIRED,
    );
    let exporter = OtlpExporter::new(Arc::clone(&registry), settings)?;
    Ok((
        OtlpRecorder {
            registry,
            _forgets: forgets,
        },
        exporter,
    ))
}

/// The process's OTLP exporter, with the settings (as the application
/// gave them) it was installed with, or why it could not be installed.
static INSTALLED: OnceLock<Result<(OtlpMetrics, OtlpExporter), String>> = OnceLock::new();

/// The builder's setting that asks for the export.
const SETTING: &str = "export_otlp_metrics";

/// The exporter a worker runs: the process's, installed with these
/// settings (and the worker's defaults) on first use. Fails if the
/// settings are invalid, if the application installed another `metrics`
/// recorder first, or if an earlier worker installed it with other
/// settings.
pub(crate) fn install_for_worker(
    settings: OtlpMetrics,
    application: &str,
    worker_id: &str,
) -> Result<OtlpExporter, ConfigError> {
    // Checked before the process-wide state is touched: an invalid setting
    // fails this worker alone, and says which setting.
    let validated = settings
        .clone()
        .with_worker_defaults(application, worker_id)
        .validate()?;
    let installed = INSTALLED.get_or_init(|| {
        let (recorder, exporter) =
            pair(validated).map_err(|e| format!("{}: {}", e.field, e.reason))?;
        metrics::set_global_recorder(recorder).map_err(|e| {
            format!(
                "cannot install kcl's OTLP recorder ({e}); another `metrics` recorder is already \
                 installed in this process (serve_metrics installs one): build the recorder with \
                 OtlpMetrics::build and combine it with yours instead"
            )
        })?;
        Ok((settings.clone(), exporter))
    });
    match installed {
        Err(reason) => Err(ConfigError {
            field: SETTING,
            reason: reason.clone(),
        }),
        Ok((first, exporter)) if *first == settings => Ok(exporter.clone()),
        Ok((first, _)) => Err(ConfigError {
            field: SETTING,
            reason: format!(
                "this process already exports its metrics with other settings ({first:?}); the \
                 workers of one process share one recorder: give them the same OtlpMetrics"
            ),
        }),
    }
}
