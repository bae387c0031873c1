//! A [`Snapshot`] as an OTLP `ExportMetricsServiceRequest`: one metric per
//! name and kind, one data point per label set, in a stable order (by
//! name, then by attributes) so that two exports of the same state are
//! the same bytes.

use kcl_core::metric_names::OTLP_MEASUREMENTS_DROPPED;
use metrics::Key;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::registry::{CounterPoint, HistogramPoint, Registry, Snapshot};

/// The instrumentation scope every metric is exported under.
const SCOPE: &str = "kcl";

/// The request that exports `snapshot`, taken at `now` (Unix
/// nanoseconds), for the resource `resource` (key, value pairs).
pub(super) fn request(
    registry: &Registry,
    snapshot: Snapshot,
    resource: &[(String, String)],
    started: u64,
    now: u64,
) -> ExportMetricsServiceRequest {
    let mut metrics = Vec::new();
    metrics.extend(named(
        registry,
        snapshot.counters,
        |attributes, point| counter_point(attributes, point, now),
        cumulative_sum,
    ));
    metrics.extend(named(
        registry,
        snapshot.gauges,
        |attributes, value| NumberDataPoint {
            attributes,
            time_unix_nano: now,
            value: Some(number_data_point::Value::AsDouble(value)),
            ..Default::default()
        },
        |data_points| metric::Data::Gauge(Gauge { data_points }),
    ));
    metrics.extend(named(
        registry,
        snapshot.histograms,
        |attributes, point| histogram_point(attributes, point, now),
        |data_points| {
            metric::Data::Histogram(Histogram {
                data_points,
                aggregation_temporality: AggregationTemporality::Cumulative.into(),
            })
        },
    ));
    metrics.push(dropped(registry, snapshot.dropped, started, now));
    metrics.sort_by(|a, b| a.name.cmp(&b.name));
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource
                    .iter()
                    .map(|(key, value)| attribute(key, value))
                    .collect(),
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: SCOPE.into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// One metric per name of `series`: each series a data point (made by
/// `point`), the points of a name its data (made by `data`).
fn named<P, D>(
    registry: &Registry,
    series: Vec<(Key, P)>,
    point: impl Fn(Vec<KeyValue>, P) -> D,
    data: impl Fn(Vec<D>) -> metric::Data,
) -> impl Iterator<Item = Metric> {
    grouped(series).into_iter().map(move |(name, points)| {
        let data_points = points
            .into_iter()
            .map(|(attributes, value)| point(attributes, value))
            .collect();
        metric(registry, name, data(data_points))
    })
}

/// The exporter's own count of dropped measurements, always present so
/// that an alert on it needs no absent() guard.
fn dropped(registry: &Registry, dropped: u64, started: u64, now: u64) -> Metric {
    let point = counter_point(
        Vec::new(),
        CounterPoint {
            value: dropped,
            start: started,
        },
        now,
    );
    metric(
        registry,
        OTLP_MEASUREMENTS_DROPPED.to_owned(),
        cumulative_sum(vec![point]),
    )
}

/// A counter's data: a monotonic sum, each point the total since its
/// series started.
fn cumulative_sum(data_points: Vec<NumberDataPoint>) -> metric::Data {
    metric::Data::Sum(Sum {
        data_points,
        aggregation_temporality: AggregationTemporality::Cumulative.into(),
        is_monotonic: true,
    })
}

/// The data points of one metric: each series' attributes and value.
type Points<P> = Vec<(Vec<KeyValue>, P)>;

/// A series by name, with its labels, and its value.
type Labelled<P> = (String, Vec<(String, String)>, P);

/// The series of each name, by name, each with its attributes, sorted.
fn grouped<P>(series: Vec<(Key, P)>) -> Vec<(String, Points<P>)> {
    let mut series: Vec<Labelled<P>> = series
        .into_iter()
        .map(|(key, point)| {
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.name().to_owned(), labels, point)
        })
        .collect();
    series.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let mut groups: Vec<(String, Points<P>)> = Vec::new();
    for (name, labels, point) in series {
        let attributes = labels.iter().map(|(k, v)| attribute(k, v)).collect();
        match groups.last_mut() {
            Some((last, points)) if *last == name => points.push((attributes, point)),
            _ => groups.push((name, vec![(attributes, point)])),
        }
    }
    groups
}

fn metric(registry: &Registry, name: String, data: metric::Data) -> Metric {
    let description = registry.description(&name).unwrap_or_default();
    Metric {
        name,
        description: description.help,
        unit: description.unit,
        data: Some(data),
        ..Default::default()
    }
}

fn counter_point(attributes: Vec<KeyValue>, point: CounterPoint, now: u64) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        start_time_unix_nano: point.start,
        time_unix_nano: now,
        // OTLP's integers are signed; a count past i64::MAX stays there.
        value: Some(number_data_point::Value::AsInt(
            i64::try_from(point.value).unwrap_or(i64::MAX),
        )),
        ..Default::default()
    }
}

fn histogram_point(
    attributes: Vec<KeyValue>,
    point: HistogramPoint,
    now: u64,
) -> HistogramDataPoint {
    HistogramDataPoint {
        attributes,
        start_time_unix_nano: point.start,
        time_unix_nano: now,
        count: point.count,
        sum: Some(point.sum),
        bucket_counts: point.buckets,
        explicit_bounds: point.bounds.to_vec(),
        min: point.min_max.map(|(min, _)| min),
        max: point.min_max.map(|(_, max)| max),
        ..Default::default()
    }
}

fn attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}
