//! kcl's metrics in Amazon CloudWatch, under the Java KCL's metric names,
//! dimensions, units and levels (feature `cloudwatch`), so that dashboards
//! and alarms built on a Java KCL application's metrics keep working.
//!
//! [`crate::WorkerBuilder::publish_cloudwatch_metrics`] installs the
//! process's `metrics` recorder at `build()` and publishes while the
//! worker runs, with a last flush once it has stopped. An application
//! that installs its own recorder (a fan-out, say) builds the pieces with
//! [`CloudWatchMetrics::build`]: a [`CloudWatchRecorder`] to install and a
//! [`CloudWatchPublisher`] to run.
//!
//! ```no_run
//! # async fn run(sdk: aws_config::SdkConfig) -> Result<(), Box<dyn std::error::Error>> {
//! use kcl::observability::cloudwatch::{CloudWatchMetrics, MetricsLevel};
//!
//! let (recorder, publisher) = CloudWatchMetrics::new()
//!     .namespace("orders-counter")
//!     .level(MetricsLevel::Summary)
//!     .client(aws_sdk_cloudwatch::Client::new(&sdk))
//!     .build()?;
//! metrics::set_global_recorder(recorder)?;
//! let flushing = tokio::spawn(async move { publisher.run_until(kcl::shutdown_signal()).await });
//! // ... run the worker ...
//! flushing.await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What is published
//!
//! The namespace is the application name (as the Java KCL's), unless
//! [`CloudWatchMetrics::namespace`] says otherwise. Each kcl metric with a
//! Java KCL equivalent is published under the Java KCL's name, with its
//! `Operation` and the dimensions of its scope:
//!
#![doc = include_str!("mapping.md")]
//!
//! `ShardId` is the `shard` label, `WorkerIdentifier` the `worker` label
//! (the worker id), and `StreamId` the `stream` label (the stream's name)
//! for a worker of several streams only, as the Java KCL adds it in
//! multi-stream mode only. The Java KCL metrics kcl records no equivalent
//! of (`NumWorkers`, `TotalLeases`, `ExpiredLeases`, `LeaseSpillover`,
//! `NeededLeases`, `LeasesToTake`, `VeryOldLeases`, the `Time` and
//! `Success` of each task) are not published. A metric of the
//! application's own, recorded through the same `metrics` facade, is
//! published under its name with its labels as dimensions, at every level
//! but `NONE`.
//!
//! [`MetricsLevel`] filters as the Java KCL's `metricsLevel` does
//! (`DETAILED`, the default, publishes everything; `SUMMARY` only the
//! Java KCL's summary metrics; `NONE` nothing), and
//! [`CloudWatchMetrics::enabled_dimensions`] as its
//! `metricsEnabledDimensions`: a dimension left out merges the series
//! that differed by it (`Operation` is always on).
//!
//! # Aggregation and flushing
//!
//! Samples are aggregated in memory into one statistic set (count, sum,
//! minimum, maximum) per CloudWatch metric, as the Java KCL does: a
//! counter's increments, a gauge's values and a histogram's observations
//! are its samples. A gauge not set since the last flush contributes its
//! last value again, so that `CurrentLeases` has a datum every period; a
//! per-shard gauge kcl set to 0 (the worker stopped consuming the shard)
//! is published once at 0 and then forgotten. Every
//! [`CloudWatchMetrics::flush_interval`] (10 s, the Java KCL's
//! `metricsBufferTimeMillis`) the sets are sent with PutMetricData, at
//! most 1000 data and under 1 MB per request, each request retried after
//! 0.5 s, 1 s and 2 s while CloudWatch throttles or fails transiently
//! (an attempt is given up after 10 s without an answer).
//! At most [`CloudWatchMetrics::max_buffered_datums`] metrics (10,000,
//! the Java KCL's `metricsMaxQueueSize`) wait for a flush and at most as
//! many gauges are remembered: a sample for a metric beyond that is
//! dropped and counted ([`PublisherStats::samples_dropped`]), so memory
//! stays bounded whatever the number of shards.

mod aggregate;
mod mapping;
mod publish;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use kcl_core::ConfigError;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use aggregate::{Buffer, Series};
use mapping::{Mapper, UnitKey};
use publish::Sink;

/// Which metrics are published, as the Java KCL's `MetricsLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MetricsLevel {
    /// Nothing: no recorder is installed, no request is made.
    None,
    /// The Java KCL's summary metrics only (processing, lag, leases held,
    /// taken and lost).
    Summary,
    /// Everything (the default): the Java KCL's detailed metrics, and
    /// kcl's own.
    Detailed,
}

impl MetricsLevel {
    /// The level as the Java KCL spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricsLevel::None => "NONE",
            MetricsLevel::Summary => "SUMMARY",
            MetricsLevel::Detailed => "DETAILED",
        }
    }
}

/// A dimension the Java KCL lets an application turn off (`Operation` is
/// always on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dimension {
    /// The shard of per-shard metrics.
    ShardId,
    /// The stream of per-shard metrics, for a worker of several streams.
    StreamId,
    /// The worker id of per-worker metrics.
    WorkerIdentifier,
}

impl Dimension {
    /// The dimension's name in CloudWatch.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::ShardId => "ShardId",
            Dimension::StreamId => "StreamId",
            Dimension::WorkerIdentifier => "WorkerIdentifier",
        }
    }

    const ALL: [Dimension; 3] = [
        Dimension::ShardId,
        Dimension::StreamId,
        Dimension::WorkerIdentifier,
    ];
}

/// The Java KCL's `metricsBufferTimeMillis`.
const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(10);
/// The Java KCL's `metricsMaxQueueSize`.
const DEFAULT_MAX_BUFFERED_DATUMS: usize = 10_000;
/// CloudWatch's limit on a namespace's length.
const MAX_NAMESPACE_LEN: usize = 255;
/// How long the flushes after a stop may take together (see
/// [`CloudWatchPublisher::run_until`]).
const FINAL_FLUSH_DEADLINE: Duration = Duration::from_secs(10);

/// How kcl's metrics are published to CloudWatch: namespace, level,
/// dimensions, flush interval, buffer bound and client. Given to
/// [`crate::WorkerBuilder::publish_cloudwatch_metrics`], or built into a
/// recorder and publisher with [`Self::build`].
#[derive(Clone, derive_more::Debug)]
pub struct CloudWatchMetrics {
    namespace: Option<String>,
    level: MetricsLevel,
    dimensions: BTreeSet<Dimension>,
    flush_interval: Duration,
    max_buffered_datums: usize,
    // Whether one is given; its configuration is the SDK's to show.
    #[debug("{}", client.is_some())]
    client: Option<aws_sdk_cloudwatch::Client>,
    stream_dimension: Option<bool>,
}

impl Default for CloudWatchMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl CloudWatchMetrics {
    /// The Java KCL's defaults: level `DETAILED`, every dimension, a flush
    /// every 10 s, at most 10,000 metrics buffered.
    pub fn new() -> Self {
        CloudWatchMetrics {
            namespace: None,
            level: MetricsLevel::Detailed,
            dimensions: Dimension::ALL.into_iter().collect(),
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            max_buffered_datums: DEFAULT_MAX_BUFFERED_DATUMS,
            client: None,
            stream_dimension: None,
        }
    }

    /// The CloudWatch namespace (default with the worker builder: the
    /// application name, as the Java KCL's).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Which metrics are published (default [`MetricsLevel::Detailed`]).
    pub fn level(mut self, level: MetricsLevel) -> Self {
        self.level = level;
        self
    }

    /// The dimensions published besides `Operation` (default: all three).
    /// A dimension left out merges the series that differed by it: without
    /// [`Dimension::ShardId`], `RecordsProcessed` counts the records of
    /// every shard in one metric.
    pub fn enabled_dimensions(mut self, dimensions: impl IntoIterator<Item = Dimension>) -> Self {
        self.dimensions = dimensions.into_iter().collect();
        self
    }

    kcl_core::setters!(self {
        /// How often the aggregated metrics are sent (default 10 s).
        flush_interval(interval: Duration),

        /// Most CloudWatch metrics (name and dimensions) buffered between two
        /// flushes, and most gauges remembered (default 10,000); samples of
        /// metrics beyond it are dropped and counted.
        max_buffered_datums(max: usize),

        /// The CloudWatch client (default with the worker builder: one built
        /// from its `sdk_config`, so `AWS_ENDPOINT_URL_CLOUDWATCH` applies).
        client(client: aws_sdk_cloudwatch::Client) = Some(client),

        /// Whether per-shard metrics carry `StreamId` (default with the worker
        /// builder: when it consumes several streams, as the Java KCL's
        /// multi-stream mode; otherwise no).
        stream_dimension(on: bool) = Some(on),
    });

    /// A recorder to install and the publisher that sends what it
    /// aggregates. Needs [`Self::namespace`] and [`Self::client`].
    pub fn build(self) -> Result<(CloudWatchRecorder, CloudWatchPublisher), ConfigError> {
        let Some(client) = self.client.clone() else {
            return Err(ConfigError {
                field: "cloudwatch_client",
                reason: "no CloudWatch client; call CloudWatchMetrics::client".into(),
            });
        };
        let Some(namespace) = self.namespace.clone() else {
            return Err(ConfigError {
                field: "cloudwatch_namespace",
                reason: "no namespace; call CloudWatchMetrics::namespace".into(),
            });
        };
        self.build_with(namespace, Arc::new(client), false)
    }

    fn validate(&self, namespace: &str) -> Result<(), ConfigError> {
        let invalid = |field, reason: String| Err(ConfigError { field, reason });
        if namespace.is_empty() || namespace.len() > MAX_NAMESPACE_LEN {
            return invalid(
                "cloudwatch_namespace",
                format!("is {namespace:?}; a CloudWatch namespace is 1 to 255 characters"),
            );
        }
        if namespace.starts_with("AWS/") {
            return invalid(
                "cloudwatch_namespace",
                format!("is {namespace:?}; namespaces starting with AWS/ are AWS's own"),
            );
        }
        if self.flush_interval.is_zero() {
            return invalid("cloudwatch_flush_interval", "must be above zero".into());
        }
        if self.max_buffered_datums == 0 {
            return invalid(
                "cloudwatch_max_buffered_datums",
                "must be at least 1".into(),
            );
        }
        Ok(())
    }

    fn build_with(
        self,
        namespace: String,
        sink: Arc<dyn Sink>,
        several_streams: bool,
    ) -> Result<(CloudWatchRecorder, CloudWatchPublisher), ConfigError> {
        self.validate(&namespace)?;
        let buffer = Arc::new(Buffer::new(self.max_buffered_datums));
        let recorder = CloudWatchRecorder {
            buffer: Arc::clone(&buffer),
            mapper: Mapper {
                level: self.level,
                dimensions: self.dimensions.clone(),
                stream_dimension: self.stream_dimension.unwrap_or(several_streams),
            },
            units: Mutex::default(),
            max_units: self.max_buffered_datums,
        };
        let publisher = CloudWatchPublisher {
            buffer,
            sink,
            namespace,
            interval: self.flush_interval,
            counters: Arc::default(),
        };
        Ok((recorder, publisher))
    }

    /// The worker builder's setup: the namespace and client defaulted from
    /// the worker, the recorder installed as the process's (or the one an
    /// earlier worker installed shared). `None` at level `NONE`.
    pub(crate) fn install_for_worker(
        self,
        application: &str,
        sdk: Option<&aws_config::SdkConfig>,
        several_streams: bool,
    ) -> Result<Option<CloudWatchPublisher>, ConfigError> {
        self.install_with(application, sdk, several_streams, |recorder| {
            metrics::set_global_recorder(recorder).map_err(|e| e.to_string())
        })
    }

    fn install_with(
        self,
        application: &str,
        sdk: Option<&aws_config::SdkConfig>,
        several_streams: bool,
        set_global: impl FnOnce(CloudWatchRecorder) -> Result<(), String>,
    ) -> Result<Option<CloudWatchPublisher>, ConfigError> {
        if self.level == MetricsLevel::None {
            return Ok(None);
        }
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| application.to_owned());
        let client = match (&self.client, sdk) {
            (Some(client), _) => client.clone(),
            (None, Some(sdk)) => aws_sdk_cloudwatch::Client::new(sdk),
            (None, None) => {
                return Err(ConfigError {
                    field: "publish_cloudwatch_metrics",
                    reason: "no CloudWatch client: the worker was given clients, not an SDK \
                             configuration; call CloudWatchMetrics::client"
                        .into(),
                });
            }
        };
        let mut installed = INSTALLED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(first) = installed.as_ref() {
            // The process has one recorder: a later worker publishes what
            // it aggregates too, under the same namespace.
            if first.namespace != namespace {
                return Err(ConfigError {
                    field: "publish_cloudwatch_metrics",
                    reason: format!(
                        "this process already publishes to CloudWatch namespace {:?}; the \
                         `metrics` recorder is per process, so every worker in it must use \
                         that namespace (not {namespace:?})",
                        first.namespace
                    ),
                });
            }
            return Ok(Some(CloudWatchPublisher {
                buffer: Arc::clone(&first.buffer),
                sink: Arc::new(client),
                namespace,
                interval: self.flush_interval,
                counters: Arc::clone(&first.counters),
            }));
        }
        let (recorder, publisher) =
            self.build_with(namespace, Arc::new(client), several_streams)?;
        set_global(recorder).map_err(|e| ConfigError {
            field: "publish_cloudwatch_metrics",
            reason: format!(
                "cannot install kcl's CloudWatch recorder ({e}); another `metrics` recorder is \
                 already installed in this process (serve_metrics installs Prometheus's): build \
                 a CloudWatchRecorder with CloudWatchMetrics::build and feed it from your own \
                 recorder instead"
            ),
        })?;
        *installed = Some(Installed {
            namespace: publisher.namespace.clone(),
            buffer: Arc::clone(&publisher.buffer),
            counters: Arc::clone(&publisher.counters),
        });
        Ok(Some(publisher))
    }
}

/// The recorder the worker builder installed, shared by later workers of
/// the process.
static INSTALLED: Mutex<Option<Installed>> = Mutex::new(None);

#[derive(Debug)]
struct Installed {
    namespace: String,
    buffer: Arc<Buffer>,
    counters: Arc<Counters>,
}

/// A `metrics` recorder that aggregates kcl's metrics (and the
/// application's) for CloudWatch, under the Java KCL's names; its
/// [`CloudWatchPublisher`] sends them.
pub struct CloudWatchRecorder {
    buffer: Arc<Buffer>,
    mapper: Mapper,
    /// Units the application described its own metrics with.
    units: Mutex<HashMap<String, UnitKey>>,
    max_units: usize,
}

impl fmt::Debug for CloudWatchRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudWatchRecorder")
            .field("level", &self.mapper.level)
            .field("dimensions", &self.mapper.dimensions)
            .field("stream_dimension", &self.mapper.stream_dimension)
            .finish_non_exhaustive()
    }
}

impl CloudWatchRecorder {
    fn describe(&self, key: KeyName, unit: Option<Unit>) {
        let unit = match unit {
            Some(Unit::Count) => UnitKey::Count,
            Some(Unit::Bytes) => UnitKey::Bytes,
            Some(Unit::Seconds) => UnitKey::Seconds,
            Some(Unit::Milliseconds) => UnitKey::Milliseconds,
            _ => return,
        };
        let mut units = self
            .units
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if units.len() < self.max_units {
            units.insert(key.as_str().to_owned(), unit);
        }
    }

    fn targets(&self, key: &Key) -> Vec<mapping::Target> {
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        let unit = self
            .units
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key.name())
            .copied();
        self.mapper.targets(key.name(), &labels, unit)
    }

    fn series(&self, key: &Key) -> Option<Arc<Series>> {
        let targets = self.targets(key);
        (!targets.is_empty()).then(|| {
            Arc::new(Series {
                targets,
                pending: Arc::clone(&self.buffer.pending),
            })
        })
    }
}

impl Recorder for CloudWatchRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.series(key)
            .map_or_else(Counter::noop, Counter::from_arc)
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.buffer
            .gauge(key, || {
                let per_shard =
                    key.name().starts_with("kcl_") && key.labels().any(|l| l.key() == "shard");
                (self.targets(key), per_shard)
            })
            .map_or_else(Gauge::noop, Gauge::from_arc)
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.series(key)
            .map_or_else(Histogram::noop, Histogram::from_arc)
    }
}

/// What a publisher did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublisherStats {
    /// PutMetricData requests CloudWatch accepted.
    pub requests: u64,
    /// Data (one statistic set each) in them.
    pub datums_sent: u64,
    /// Data in requests that failed for good or after every retry
    /// (dropped, with a warning logged).
    pub datums_failed: u64,
    /// Attempts made again after a throttled or transient failure.
    pub retries: u64,
    /// Samples dropped because the buffer held `max_buffered_datums`
    /// metrics already (or the value was NaN or infinite).
    pub samples_dropped: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    datums_sent: AtomicU64,
    datums_failed: AtomicU64,
    retries: AtomicU64,
}

/// Sends what a [`CloudWatchRecorder`] aggregates to CloudWatch: every
/// flush interval with [`Self::run_until`], or when asked with
/// [`Self::flush`].
#[derive(Clone)]
pub struct CloudWatchPublisher {
    buffer: Arc<Buffer>,
    sink: Arc<dyn Sink>,
    namespace: String,
    interval: Duration,
    counters: Arc<Counters>,
}

impl fmt::Debug for CloudWatchPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudWatchPublisher")
            .field("namespace", &self.namespace)
            .field("interval", &self.interval)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl CloudWatchPublisher {
    /// The namespace the metrics go to.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// What was sent, retried, failed and dropped so far.
    pub fn stats(&self) -> PublisherStats {
        let c = &self.counters;
        PublisherStats {
            requests: c.requests.load(Ordering::Relaxed),
            datums_sent: c.datums_sent.load(Ordering::Relaxed),
            datums_failed: c.datums_failed.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            samples_dropped: self.buffer.pending.dropped(),
        }
    }

    /// Sends everything aggregated since the last flush, in requests
    /// within PutMetricData's limits, each retried with backoff while
    /// CloudWatch throttles. A request that still fails is dropped with a
    /// warning (and counted in [`PublisherStats::datums_failed`]): the
    /// next flush carries new data, not a growing backlog.
    pub async fn flush(&self) {
        let drained = self.buffer.drain();
        if drained.is_empty() {
            return;
        }
        let at = SystemTime::now();
        let data = drained
            .iter()
            .map(|(key, stat)| {
                (
                    aggregate::datum(key, stat, at),
                    aggregate::estimated_size(key),
                )
            })
            .collect();
        for batch in aggregate::batches(data) {
            let n = batch.len() as u64;
            match publish::send_with_retries(
                self.sink.as_ref(),
                &self.namespace,
                batch,
                &self.counters.retries,
            )
            .await
            {
                Ok(()) => {
                    self.counters.requests.fetch_add(1, Ordering::Relaxed);
                    self.counters.datums_sent.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    self.counters.datums_failed.fetch_add(n, Ordering::Relaxed);
                    tracing::warn!(
                        namespace = %self.namespace,
                        data = n,
                        error = %e,
                        "CloudWatch did not accept metrics; dropped them"
                    );
                }
            }
        }
    }

    /// Flushes every flush interval until `stop` completes, then once more
    /// (the last flush, with what was recorded up to the stop). A flush
    /// under way when `stop` completes is finished beside it; the two
    /// together take at most [`FINAL_FLUSH_DEADLINE`], what is
    /// left then dropped: CloudWatch not answering (each batch is tried
    /// for about 44 s) must not hold a stopping worker past the
    /// orchestrator's grace period, to be killed there.
    pub async fn run_until(&self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let start = tokio::time::Instant::now() + self.interval;
        let mut ticks = tokio::time::interval_at(start, self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let under_way = loop {
            tokio::select! {
                () = &mut stop => break None,
                _ = ticks.tick() => {
                    let mut flush = Box::pin(self.flush());
                    tokio::select! {
                        () = &mut flush => {}
                        () = &mut stop => break Some(flush),
                    }
                }
            }
        };
        // Side by side: a flush under way that used up the deadline left
        // no time for the last one, which holds what came up to the stop.
        let last = async {
            let under_way = async {
                if let Some(flush) = under_way {
                    flush.await;
                }
            };
            tokio::join!(under_way, self.flush());
        };
        if tokio::time::timeout(FINAL_FLUSH_DEADLINE, last)
            .await
            .is_err()
        {
            tracing::warn!(
                namespace = %self.namespace,
                deadline = ?FINAL_FLUSH_DEADLINE,
                "the last CloudWatch flush did not finish in time; dropped what was left"
            );
        }
    }

    /// Runs `work` and flushes beside it, with a last flush once it
    /// completed; `work`'s output.
    pub(crate) async fn run_beside<F: Future>(&self, work: F) -> F::Output {
        let done = tokio_util::sync::CancellationToken::new();
        let work = async {
            let output = work.await;
            done.cancel();
            output
        };
        let (output, ()) = tokio::join!(work, self.run_until(done.cancelled()));
        output
    }
}
