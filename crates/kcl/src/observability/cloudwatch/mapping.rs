//! Which CloudWatch metrics (name, dimensions, unit, level) each kcl
//! metric becomes: the Java KCL's where it has an equivalent, its own
//! name otherwise.
//!
//! The table is data ([`JAVA`], [`ALSO_OWN`], [`SKIPPED`]) so that the
//! docs/metrics.md's copy of it is rendered from here ([`markdown_table`]) and a
//! test holds the two together.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;

use aws_sdk_cloudwatch::types::StandardUnit;
use kcl_core::metric_names::{
    self as names, BATCH_PROCESSING_SECONDS, BYTES_PROCESSED, KINESIS_EXPIRED_ITERATORS,
    LEASE_RENEWAL_FAILURES, LEASE_RENEWALS, LEASE_TAKE_CONFLICTS, LEASE_TAKE_FAILURES,
    LEASES_ACQUIRED, LEASES_ENDED, LEASES_HELD, MILLIS_BEHIND_LATEST, MetricUnit,
    RECORDS_PROCESSED, SHARD_LAST_CHECKPOINT_TIMESTAMP, SHARD_LAST_DELIVERY_TIMESTAMP,
};

use super::{Dimension, MetricsLevel};

/// The Java KCL's `Operation` dimension, on every metric it publishes.
pub(crate) const OPERATION: &str = "Operation";

/// CloudWatch's limit on a dimension value's length.
const MAX_DIMENSION_VALUE: usize = 1024;
/// CloudWatch's limit on dimensions per metric.
const MAX_DIMENSIONS: usize = 30;

/// How a kcl metric's recorded values become samples of a CloudWatch
/// metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Sample {
    /// The value as recorded: a counter's increment (the Java KCL adds one
    /// datum per batch or call, with the count as its value), a gauge's
    /// value, a histogram's observation.
    Value,
    /// The value times this factor (seconds to the Java KCL's
    /// milliseconds).
    Scaled(f64),
    /// Each unit of a counter's increment is one sample of this value: the
    /// Java KCL's `*.Success` metrics, 1 per success and 0 per failure, so
    /// that their average is the success rate.
    Each(f64),
}

/// One kcl metric published under a Java KCL metric's name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JavaRule {
    /// The kcl metric (a `metric_names` constant).
    pub(crate) kcl: &'static str,
    /// Only the series whose label has one of these values.
    pub(crate) only: Option<(&'static str, &'static [&'static str])>,
    /// The Java KCL's metric name.
    pub(crate) name: &'static str,
    /// The Java KCL's `Operation` dimension.
    pub(crate) operation: &'static str,
    /// `ShardId` (and `StreamId` for several streams) from the series'
    /// `shard` and `stream` labels; the Java KCL's per-shard scopes.
    pub(crate) per_shard: bool,
    /// `WorkerIdentifier` from the series' `worker` label.
    pub(crate) per_worker: bool,
    pub(crate) unit: UnitKey,
    /// The level the Java KCL gives the metric.
    pub(crate) level: MetricsLevel,
    pub(crate) sample: Sample,
}

const fn shard(kcl: &'static str, name: &'static str, unit: UnitKey) -> JavaRule {
    JavaRule {
        kcl,
        only: None,
        name,
        operation: "ProcessTask",
        per_shard: true,
        per_worker: false,
        unit,
        level: MetricsLevel::Summary,
        sample: Sample::Value,
    }
}

const fn worker(
    kcl: &'static str,
    operation: &'static str,
    name: &'static str,
    level: MetricsLevel,
    sample: Sample,
) -> JavaRule {
    JavaRule {
        kcl,
        only: None,
        name,
        operation,
        per_shard: false,
        per_worker: true,
        unit: UnitKey::Count,
        level,
        sample,
    }
}

/// The kcl metrics that have a Java KCL equivalent, with the Java KCL's
/// name, `Operation`, dimensions, unit and level (from its
/// `ProcessTask`, `DynamoDBLeaseRenewer`, `DynamoDBLeaseTaker` and
/// `PrefetchRecordsPublisher`).
pub(crate) const JAVA: &[JavaRule] = &[
    shard(RECORDS_PROCESSED, "RecordsProcessed", UnitKey::Count),
    shard(BYTES_PROCESSED, "DataBytesProcessed", UnitKey::Bytes),
    shard(
        MILLIS_BEHIND_LATEST,
        "MillisBehindLatest",
        UnitKey::Milliseconds,
    ),
    // The application-wide lag: every shard's values in one metric.
    JavaRule {
        operation: "ApplicationTracker",
        per_shard: false,
        ..shard(
            MILLIS_BEHIND_LATEST,
            "MillisBehindLatest",
            UnitKey::Milliseconds,
        )
    },
    JavaRule {
        sample: Sample::Scaled(1000.0),
        ..shard(
            BATCH_PROCESSING_SECONDS,
            "RecordProcessor.processRecords.Time",
            UnitKey::Milliseconds,
        )
    },
    // The Java KCL counts these per stream, not per shard.
    JavaRule {
        per_shard: false,
        ..shard(KINESIS_EXPIRED_ITERATORS, "ExpiredIterator", UnitKey::Count)
    },
    worker(
        LEASES_HELD,
        "RenewAllLeases",
        "CurrentLeases",
        MetricsLevel::Summary,
        Sample::Value,
    ),
    JavaRule {
        only: Some(("reason", &["lost", "fenced"])),
        ..worker(
            LEASES_ENDED,
            "RenewAllLeases",
            "LostLeases",
            MetricsLevel::Summary,
            Sample::Value,
        )
    },
    worker(
        LEASE_RENEWALS,
        "RenewAllLeases",
        "RenewLease.Success",
        MetricsLevel::Detailed,
        Sample::Each(1.0),
    ),
    worker(
        LEASE_RENEWAL_FAILURES,
        "RenewAllLeases",
        "RenewLease.Success",
        MetricsLevel::Detailed,
        Sample::Each(0.0),
    ),
    worker(
        LEASES_ACQUIRED,
        "TakeLeases",
        "TakenLeases",
        MetricsLevel::Summary,
        Sample::Value,
    ),
    worker(
        LEASES_ACQUIRED,
        "TakeLeases",
        "TakeLease.Success",
        MetricsLevel::Detailed,
        Sample::Each(1.0),
    ),
    worker(
        LEASE_TAKE_CONFLICTS,
        "TakeLeases",
        "UntakenLeases",
        MetricsLevel::Summary,
        Sample::Value,
    ),
    // A lost race is a call that succeeded, for the Java KCL too.
    worker(
        LEASE_TAKE_CONFLICTS,
        "TakeLeases",
        "TakeLease.Success",
        MetricsLevel::Detailed,
        Sample::Each(1.0),
    ),
    worker(
        LEASE_TAKE_FAILURES,
        "TakeLeases",
        "UntakenLeases",
        MetricsLevel::Summary,
        Sample::Value,
    ),
    worker(
        LEASE_TAKE_FAILURES,
        "TakeLeases",
        "TakeLease.Success",
        MetricsLevel::Detailed,
        Sample::Each(0.0),
    ),
];

/// kcl metrics with a Java KCL equivalent that are also published under
/// their own name, because their labels say more than the Java metric.
pub(crate) const ALSO_OWN: &[&str] = &[LEASES_ACQUIRED, LEASES_ENDED];

/// kcl metrics not published: Unix timestamps, whose use (the age,
/// `time() - value`) CloudWatch cannot compute; `MillisBehindLatest`
/// gives a shard's lag.
pub(crate) const SKIPPED: &[&str] = &[
    SHARD_LAST_DELIVERY_TIMESTAMP,
    SHARD_LAST_CHECKPOINT_TIMESTAMP,
];

/// The level of the kcl metrics published under their own name.
pub(crate) const OWN_LEVEL: MetricsLevel = MetricsLevel::Detailed;

/// A CloudWatch metric: what samples are aggregated under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct DatumKey {
    pub(crate) name: Cow<'static, str>,
    /// Sorted by name (CloudWatch ignores their order).
    pub(crate) dimensions: Vec<(Cow<'static, str>, String)>,
    pub(crate) unit: UnitKey,
}

/// [`StandardUnit`] with an order, for [`DatumKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum UnitKey {
    Count,
    Bytes,
    Seconds,
    Milliseconds,
    None,
}

impl UnitKey {
    pub(crate) fn standard(self) -> StandardUnit {
        match self {
            UnitKey::Count => StandardUnit::Count,
            UnitKey::Bytes => StandardUnit::Bytes,
            UnitKey::Seconds => StandardUnit::Seconds,
            UnitKey::Milliseconds => StandardUnit::Milliseconds,
            UnitKey::None => StandardUnit::None,
        }
    }

    fn of_kcl(unit: Option<MetricUnit>) -> UnitKey {
        match unit {
            None => UnitKey::Count,
            Some(MetricUnit::Bytes) => UnitKey::Bytes,
            Some(MetricUnit::Seconds) => UnitKey::Seconds,
            Some(MetricUnit::Milliseconds) => UnitKey::Milliseconds,
        }
    }
}

/// Where one recorded value goes.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) key: Arc<DatumKey>,
    pub(crate) sample: Sample,
}

/// Turns a `metrics` key into its CloudWatch targets, under the level and
/// enabled dimensions of one publisher.
#[derive(Debug, Clone)]
pub(crate) struct Mapper {
    pub(crate) level: MetricsLevel,
    pub(crate) dimensions: BTreeSet<Dimension>,
    /// Whether the `stream` label becomes a `StreamId` dimension (several
    /// streams, as the Java KCL in multi-stream mode).
    pub(crate) stream_dimension: bool,
}

impl Mapper {
    /// Every CloudWatch metric a series of `name` with `labels` feeds;
    /// empty when the level or the table publishes none. `unit` is the
    /// unit the application described a metric of its own with.
    pub(crate) fn targets(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        unit: Option<UnitKey>,
    ) -> Vec<Target> {
        if self.level == MetricsLevel::None {
            return Vec::new();
        }
        let Some(spec) = names::ALL.iter().find(|s| s.name == name) else {
            // The application's own metric, recorded through the same
            // facade: published as it is, at every level but NONE.
            return vec![Target {
                key: Arc::new(self.own_key(
                    Cow::Owned(name.to_owned()),
                    labels,
                    unit.unwrap_or(UnitKey::None),
                )),
                sample: Sample::Value,
            }];
        };
        if SKIPPED.contains(&spec.name) {
            return Vec::new();
        }
        let mut targets = Vec::new();
        let mut java = false;
        for rule in JAVA.iter().filter(|r| r.kcl == spec.name) {
            java = true;
            if rule.level > self.level {
                continue;
            }
            if let Some((label, values)) = rule.only
                && !label_value(labels, label).is_some_and(|v| values.contains(&v))
            {
                continue;
            }
            targets.push(Target {
                key: Arc::new(self.java_key(rule, labels)),
                sample: rule.sample,
            });
        }
        if (!java || ALSO_OWN.contains(&spec.name)) && OWN_LEVEL <= self.level {
            targets.push(Target {
                key: Arc::new(self.own_key(
                    Cow::Borrowed(spec.name),
                    labels,
                    UnitKey::of_kcl(spec.unit),
                )),
                sample: Sample::Value,
            });
        }
        targets
    }

    fn java_key(&self, rule: &JavaRule, labels: &[(&str, &str)]) -> DatumKey {
        let mut dimensions = vec![(Cow::Borrowed(OPERATION), rule.operation.to_owned())];
        if rule.per_worker {
            self.push(
                &mut dimensions,
                Dimension::WorkerIdentifier,
                labels,
                "worker",
            );
        }
        if rule.per_shard {
            self.push(&mut dimensions, Dimension::ShardId, labels, "shard");
            if self.stream_dimension {
                self.push(&mut dimensions, Dimension::StreamId, labels, "stream");
            }
        }
        dimensions.sort();
        DatumKey {
            name: Cow::Borrowed(rule.name),
            dimensions,
            unit: rule.unit,
        }
    }

    /// A metric under its own name: `worker`, `shard` and `stream` become
    /// the Java KCL's dimensions (under the same rules), every other label
    /// a dimension of its own name.
    fn own_key(&self, name: Cow<'static, str>, labels: &[(&str, &str)], unit: UnitKey) -> DatumKey {
        let mut dimensions = Vec::new();
        for (label, _) in labels {
            match *label {
                "worker" => self.push(&mut dimensions, Dimension::WorkerIdentifier, labels, label),
                "shard" => self.push(&mut dimensions, Dimension::ShardId, labels, label),
                "stream" => {
                    if self.stream_dimension {
                        self.push(&mut dimensions, Dimension::StreamId, labels, label);
                    }
                }
                other => {
                    if let Some(value) = dimension_value(labels, other) {
                        dimensions.push((Cow::Owned(other.to_owned()), value));
                    }
                }
            }
        }
        dimensions.sort();
        dimensions.dedup_by(|a, b| a.0 == b.0);
        dimensions.truncate(MAX_DIMENSIONS);
        DatumKey {
            name,
            dimensions,
            unit,
        }
    }

    fn push(
        &self,
        dimensions: &mut Vec<(Cow<'static, str>, String)>,
        dimension: Dimension,
        labels: &[(&str, &str)],
        label: &str,
    ) {
        if !self.dimensions.contains(&dimension) {
            return;
        }
        if let Some(value) = dimension_value(labels, label) {
            dimensions.push((Cow::Borrowed(dimension.as_str()), value));
        }
    }
}

fn label_value<'a>(labels: &[(&'a str, &'a str)], name: &str) -> Option<&'a str> {
    labels.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

/// A label's value as a dimension value: CloudWatch takes 1 to 1024
/// characters, so an empty value is left out and a long one cut.
fn dimension_value(labels: &[(&str, &str)], name: &str) -> Option<String> {
    let value = label_value(labels, name)?;
    if value.is_empty() {
        return None;
    }
    Some(value.chars().take(MAX_DIMENSION_VALUE).collect())
}

#[cfg(test)]
fn unit_name(unit: UnitKey) -> &'static str {
    match unit {
        UnitKey::Count => "Count",
        UnitKey::Bytes => "Bytes",
        UnitKey::Seconds => "Seconds",
        UnitKey::Milliseconds => "Milliseconds",
        UnitKey::None => "None",
    }
}

#[cfg(test)]
/// The mapping as docs/metrics.md shows it: one row per Java KCL metric kcl
/// publishes, then the rules for the rest.
pub(crate) fn markdown_table() -> String {
    let mut out = String::from(
        "| kcl metric | CloudWatch metric | dimensions | unit | level | value |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for rule in JAVA {
        let mut kcl = format!("`{}`", rule.kcl);
        if let Some((label, values)) = rule.only {
            kcl.push_str(&format!(" (`{label}`: {})", values.join(", ")));
        }
        let mut dimensions = format!("`Operation={}`", rule.operation);
        if rule.per_worker {
            dimensions.push_str(", `WorkerIdentifier`");
        }
        if rule.per_shard {
            dimensions.push_str(", `ShardId` (, `StreamId`)");
        }
        let value = match rule.sample {
            Sample::Value => "each increment, value or observation".to_owned(),
            Sample::Scaled(f) => format!("each observation × {f}"),
            Sample::Each(v) => format!("{v} per unit counted"),
        };
        out.push_str(&format!(
            "| {kcl} | `{}` | {dimensions} | {} | {} | {value} |\n",
            rule.name,
            unit_name(rule.unit),
            rule.level.as_str(),
        ));
    }
    for own in ALSO_OWN {
        out.push_str(&format!(
            "| `{own}` | `{own}` (also) | its labels | Count | {} | each increment |\n",
            OWN_LEVEL.as_str()
        ));
    }
    for skipped in SKIPPED {
        out.push_str(&format!(
            "| `{skipped}` | not published (a Unix timestamp) | | | | |\n"
        ));
    }
    out.push_str(&format!(
        "| every other `kcl_*` metric | its own name | its labels | its unit | {} | each increment, value or observation |\n",
        OWN_LEVEL.as_str()
    ));
    out
}
