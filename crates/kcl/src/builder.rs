//! `Worker::builder`: every setting, validated at `build()`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_config::SdkConfig;
use kcl_core::ConfigError;
use kcl_core::checkpointer::CheckpointPolicy;
use kcl_core::config::{Balance, LeaseConfig, LeaseConfigBuilder, LeaseRenewal};
use kcl_core::observe::Observer;
use kcl_core::processor::{FailurePolicy, ProcessorFactory};
use kcl_core::source::InitialPosition;
use kcl_core::worker::{
    RemovedStreamPolicy, WorkerConfigBuilder, WorkerHandle, check_stream_names,
};
use kcl_dynamodb::{Capacity, TableOptions};
use kcl_kinesis::{
    FanOutConfig, KinesisShardSource, PollingConfig, PollingConfigBuilder, Retrieval, StreamArn,
};

use crate::error::Error;
use crate::streams::{StreamNames, StreamResolver};
use crate::worker::{EndpointSettings, Worker};
use clients::{bounded_client, lease_table_client};

/// Configures a [`Worker`]. Every setting has a default except the streams,
/// the AWS configuration and the processor; `build()` rejects impossible
/// combinations with an error naming the field.
///
/// The engine's settings are set on the engine's own builders, which this
/// one wraps: their defaults and limits are documented (and checked) once,
/// there. The setters here forward to [`LeaseConfigBuilder`],
/// [`WorkerConfigBuilder`] and [`PollingConfigBuilder`].
pub struct WorkerBuilder {
    app: String,
    streams: Vec<String>,
    multi_stream: bool,
    sdk: Option<SdkConfig>,
    kinesis: Option<aws_sdk_kinesis::Client>,
    dynamodb: Option<aws_sdk_dynamodb::Client>,
    table: Option<String>,
    table_options: TableOptions,
    lease: LeaseConfigBuilder,
    engine: WorkerConfigBuilder,
    polling: PollingConfigBuilder,
    /// The first polling setting set here, if any: it conflicts with a
    /// [`Retrieval`] given whole.
    polling_field: Option<&'static str>,
    retrieval: Option<Retrieval>,
    prefetch_budget: Option<usize>,
    factory: Option<Arc<dyn ProcessorFactory>>,
    tracker: Option<StreamNames>,
    observer: Option<Arc<dyn Observer>>,
    #[cfg(feature = "prometheus")]
    metrics_addr: Option<std::net::SocketAddr>,
    #[cfg(feature = "otlp")]
    otlp: Option<crate::observability::OtlpMetrics>,
    health_addr: Option<std::net::SocketAddr>,
    liveness_stall_bound: Option<Duration>,
    #[cfg(feature = "cloudwatch")]
    cloudwatch: Option<crate::observability::cloudwatch::CloudWatchMetrics>,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Every setting, so a configuration loaded from elsewhere can be
        // logged and compared; the clients, processor and observer are
        // code, not settings.
        let mut s = f.debug_struct("WorkerBuilder");
        s.field("application", &self.app)
            .field("streams", &self.streams)
            .field("multi_stream", &self.multi_stream)
            .field("table", &self.table)
            .field("table_options", &self.table_options)
            .field("lease", &self.lease)
            .field("engine", &self.engine)
            .field("polling", &self.polling)
            .field("retrieval", &self.retrieval)
            .field("prefetch_budget", &self.prefetch_budget);
        #[cfg(feature = "prometheus")]
        s.field("metrics_addr", &self.metrics_addr);
        #[cfg(feature = "otlp")]
        s.field("otlp", &self.otlp);
        s.field("health_addr", &self.health_addr)
            .field("liveness_stall_bound", &self.liveness_stall_bound);
        #[cfg(feature = "cloudwatch")]
        s.field("cloudwatch", &self.cloudwatch);
        s.finish_non_exhaustive()
    }
}

/// Setters that hand their value to one of the engine's builders, whose
/// documentation (linked from each) gives the default and the limits.
macro_rules! forward {
    ($inner:ident ($builder:ident) { $( $(#[$doc:meta])* $name:ident: $ty:ty ),* $(,)? }) => {
        $(
            $(#[$doc])*
            #[doc = concat!("\n\nSee [`", stringify!($builder), "::", stringify!($name), "`].")]
            pub fn $name(mut self, value: $ty) -> Self {
                self.$inner = self.$inner.$name(value);
                self
            }
        )*
    };
}

/// The polling setters, which also note that a polling setting was given.
macro_rules! forward_polling {
    ($( $(#[$doc:meta])* $name:ident: $ty:ty ),* $(,)?) => {
        $(
            $(#[$doc])*
            #[doc = concat!("\n\nSee [`PollingConfigBuilder::", stringify!($name), "`]; not combined with [`Self::retrieval`].")]
            pub fn $name(mut self, value: $ty) -> Self {
                self.polling = self.polling.$name(value);
                self.polling_field.get_or_insert(stringify!($name));
                self
            }
        )*
    };
}

impl WorkerBuilder {
    pub(crate) fn new(app: String) -> Self {
        WorkerBuilder {
            app,
            streams: Vec::new(),
            multi_stream: false,
            sdk: None,
            kinesis: None,
            dynamodb: None,
            table: None,
            table_options: TableOptions::default(),
            lease: LeaseConfig::builder(default_worker_id()),
            engine: WorkerConfigBuilder::default(),
            polling: PollingConfig::builder(),
            polling_field: None,
            retrieval: None,
            prefetch_budget: None,
            factory: None,
            tracker: None,
            observer: None,
            #[cfg(feature = "prometheus")]
            metrics_addr: None,
            #[cfg(feature = "otlp")]
            otlp: None,
            health_addr: None,
            liveness_stall_bound: None,
            #[cfg(feature = "cloudwatch")]
            cloudwatch: None,
        }
    }

    /// Tells `observer` of every lease event of this worker (takes,
    /// steals, handoffs, renewals, losses: see [`crate::observe::Event`]),
    /// besides the metrics and counters kcl keeps: for an application's
    /// own telemetry or audit trail. It is called on kcl's tasks and must
    /// return quickly.
    ///
    /// ```
    /// #[derive(Debug)]
    /// struct Audit;
    ///
    /// impl kcl::observe::Observer for Audit {
    ///     fn observe(&self, worker: &str, event: &kcl::observe::Event<'_>) {
    ///         if let kcl::observe::Event::Ended { key, reason } = event {
    ///             eprintln!("{worker} stopped holding {key}: {reason}");
    ///         }
    ///     }
    /// }
    ///
    /// let builder = kcl::Worker::builder("orders-counter").observer(Audit);
    /// ```
    pub fn observer(mut self, observer: impl Observer + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Adds a stream to consume, by name or by ARN
    /// (`arn:aws:kinesis:REGION:ACCOUNT:stream/NAME`, which AWS recommends
    /// and which reaches a stream of another account through its resource
    /// policy; the ARN's region must be the AWS configuration's). Several
    /// streams use the Java KCL's multi-stream lease keys, which name the
    /// stream's own account.
    pub fn stream(mut self, name: impl Into<String>) -> Self {
        self.streams.push(name.into());
        self
    }

    /// Lets the set of streams change while the worker runs: `names` is
    /// called at every shard sync and its answer replaces the stream list
    /// (the streams given with [`Self::stream`] are the list at start).
    /// Uses multi-stream lease keys.
    pub fn stream_tracker(
        mut self,
        names: impl Fn() -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.tracker = Some(Arc::new(names));
        self
    }

    /// Uses multi-stream lease keys even for a single stream (to adopt a
    /// Java KCL multi-stream application's table).
    pub fn multi_stream(mut self, on: bool) -> Self {
        self.multi_stream = on;
        self
    }

    /// Builds the Kinesis and DynamoDB clients from an SDK configuration
    /// (region, credentials, and `AWS_ENDPOINT_URL_KINESIS` /
    /// `AWS_ENDPOINT_URL_DYNAMODB` overrides). The lease table's client
    /// gets timeouts the configuration leaves unset: a 2 s connect timeout
    /// and an attempt timeout of half the lease-table call timeout (a
    /// request stuck on a dead connection is given up and retried, inside
    /// the lease's validity). Timeouts set in `config` are kept.
    pub fn sdk_config(mut self, config: &SdkConfig) -> Self {
        self.sdk = Some(config.clone());
        self.kinesis = None;
        self.dynamodb = None;
        self
    }

    /// Uses these clients, as configured. The lease-table client gets the
    /// timeouts [`Self::sdk_config`] describes where its own leave them
    /// unset; the Kinesis client is used as it is (kcl bounds each of its
    /// calls itself).
    pub fn clients(
        mut self,
        kinesis: aws_sdk_kinesis::Client,
        dynamodb: aws_sdk_dynamodb::Client,
    ) -> Self {
        self.sdk = None;
        self.kinesis = Some(kinesis);
        self.dynamodb = Some(dynamodb);
        self
    }

    /// The processor factory: called once per shard this worker takes.
    pub fn processor(mut self, factory: impl ProcessorFactory) -> Self {
        self.factory = Some(Arc::new(factory));
        self
    }

    /// The lease table (default: the application name).
    pub fn table_name(mut self, name: impl Into<String>) -> Self {
        self.table = Some(name.into());
        self
    }

    /// Billing of the lease table if this worker creates it (default
    /// on-demand).
    pub fn table_capacity(mut self, capacity: Capacity) -> Self {
        self.table_options = self.table_options.capacity(capacity);
        self
    }

    /// How the lease table and the liveness records' table are created if
    /// missing: billing, tags, point-in-time recovery, deletion protection,
    /// a KMS key, or never (startup then fails naming the missing table).
    /// Replaces [`Self::table_capacity`]'s setting with its own.
    pub fn table_options(mut self, options: TableOptions) -> Self {
        self.table_options = options;
        self
    }

    /// This worker's id in the lease table (default: the host name and a
    /// random suffix). Keep it unique per process.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.lease = self.lease.worker_id(id);
        self
    }

    forward!(lease (LeaseConfigBuilder) {
        /// How long peers wait for a silent worker's leases.
        lease_duration: Duration,
        /// How often held leases (or this worker's liveness record) are
        /// renewed; validated against the lease duration.
        renew_interval: Duration,
        /// How held leases are kept alive: one liveness record per worker
        /// (the default, in the table `<lease table>-workers`, created if
        /// missing), or every lease, as a table shared with Java KCL
        /// workers needs.
        renewal: LeaseRenewal,
        /// Mean lease-taker interval.
        taker_interval: Duration,
        /// Most leases this worker holds.
        max_leases_per_worker: usize,
        /// Most leases stolen per tick.
        max_leases_to_steal: usize,
        /// How long a graceful handoff may take before it is forced.
        handoff_timeout: Duration,
        /// How leases are balanced over the fleet: by what they carry (the
        /// default: hot shards spread out, each lease's bytes a second
        /// published on its item as `throughputKBps`), or by count.
        balance: Balance,
        /// How often, at most, a lease's load figure is written on its own
        /// (with liveness records), and the window it is measured over
        /// (default 60 s).
        load_report_interval: Duration,
    });

    forward!(engine (WorkerConfigBuilder) {
        /// Where shards without a checkpoint start. An `AT_TIMESTAMP` more
        /// than a day ahead of the clock is refused by `build()`.
        initial_position: InitialPosition,
        /// What happens when a processor returns an error.
        failure_policy: FailurePolicy,
        /// Processes each shard in up to this many parallel lanes, a
        /// partition key always in the same lane (see
        /// [`ShardContext::lane`](crate::ShardContext::lane)).
        parallelism_per_shard: usize,
        /// How often each shard's checkpoint is written: every
        /// `checkpoint()` call (the default), or at most once per period
        /// ([`CheckpointPolicy::every`](crate::CheckpointPolicy::every)),
        /// the latest position always written at shutdown, handoff and
        /// shard end.
        checkpoint_policy: CheckpointPolicy,
        /// Shard listing interval.
        shard_sync_interval: Duration,
        /// How often a child shard checks its parents.
        parent_poll_interval: Duration,
        /// How long a graceful shutdown waits for processors (default
        /// 25 s); then their calls are cancelled, the positions they asked
        /// for written and `lease_lost` called, within 2 s more.
        shutdown_timeout: Duration,
        /// How long a finished shard's lease stays before it is deleted.
        completed_lease_retention: Duration,
        /// What happens to the leases of a stream the tracker stops
        /// listing.
        removed_stream_policy: RemovedStreamPolicy,
        /// How long a held shard may go without one successful read and
        /// without one answer from Kinesis (default 45 s) before it is
        /// given back and the worker sits out, so that a worker that can
        /// read takes it; errors Kinesis sends keep the shard in place.
        max_read_failure_time: Duration,
        /// How long a processor call runs before it is warned about, once.
        processor_warn_after: Duration,
        /// How long a processor call runs before it is cancelled and its
        /// shard given back (default: no limit).
        processor_timeout: Duration,
    });

    forward_polling!(
        /// Records per GetRecords call.
        max_records: i32,
        /// Time between two GetRecords calls on a caught-up idle shard:
        /// what an idle shard costs.
        idle_time_between_reads: Duration,
        /// Time between two GetRecords calls on a caught-up trickling
        /// shard: its latency against its read quota.
        time_between_reads: Duration,
    );

    /// Most bytes all of this worker's shards together hold ahead of
    /// their processors; see
    /// [`kcl_kinesis::KinesisShardSourceBuilder::prefetch_budget`].
    pub fn prefetch_budget(mut self, bytes: usize) -> Self {
        self.prefetch_budget = Some(bytes);
        self
    }

    /// How shards are read (default: polling, tuned with
    /// [`Self::max_records`], [`Self::idle_time_between_reads`] and
    /// [`Self::time_between_reads`]). With [`Retrieval::FanOut`] and no
    /// consumer name, the consumer is named after the application, so all
    /// its workers share it.
    pub fn retrieval(mut self, retrieval: Retrieval) -> Self {
        self.retrieval = Some(retrieval);
        self
    }

    /// Enhanced fan-out with default settings, through a stream consumer
    /// named after the application: short for
    /// `.retrieval(Retrieval::FanOut(FanOutConfig::default()))`.
    pub fn enhanced_fan_out(self) -> Self {
        self.retrieval(Retrieval::FanOut(FanOutConfig::default()))
    }

    /// Fan-out (`true`) or polling as settings ask, keeping a retrieval of
    /// that kind the code configured: only a change of kind replaces it.
    pub(crate) fn fan_out_or_polling(mut self, fan_out: bool) -> Self {
        let is_fan_out = matches!(self.retrieval, Some(Retrieval::FanOut(_)));
        match (fan_out, is_fan_out) {
            (true, false) => self.enhanced_fan_out(),
            (false, true) => {
                self.retrieval = None;
                self
            }
            _ => self,
        }
    }

    /// The table options set so far, for settings to override field by
    /// field.
    pub(crate) fn table_options_so_far(&self) -> &TableOptions {
        &self.table_options
    }

    /// Serves the health probes and status (`/healthz`, `/readyz`,
    /// `/status`; see [`crate::observability`]) on `addr` while the worker
    /// runs. Needs no feature and never installs a `metrics` recorder, so
    /// it works beside any recorder the application installed, or none.
    /// Port 0 picks a free port: see [`Worker::health_addr`]. The address
    /// is bound at `build()`, which fails if it is taken.
    pub fn serve_health(mut self, addr: std::net::SocketAddr) -> Self {
        self.health_addr = Some(addr);
        self
    }

    /// Makes `/healthz` fail (503, naming the shards) while any held shard
    /// has had work waiting (records behind the tip or read and not
    /// processed, or a processor call running) and neither processed a
    /// batch nor wrote a checkpoint for longer than `bound` (default: no
    /// such check; `/healthz` answers 200 while the process serves). Set
    /// it above the longest a batch may take: an orchestrator restarts a
    /// worker whose liveness probe fails.
    pub fn liveness_stall_bound(mut self, bound: Duration) -> Self {
        self.liveness_stall_bound = Some(bound);
        self
    }

    /// Serves Prometheus metrics (`/metrics`) beside the health probes and
    /// status of [`Self::serve_health`] on `addr` while the worker runs
    /// (feature `prometheus`). Port 0 picks a free port: see
    /// [`Worker::metrics_addr`]. The address is bound at `build()`, which
    /// fails if it is taken; the first worker to serve metrics installs
    /// the process's `metrics` recorder, which must not already be set
    /// (with a recorder of the application's own, use `serve_health`).
    #[cfg(feature = "prometheus")]
    pub fn serve_metrics(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// Publishes the metrics to Amazon CloudWatch under the Java KCL's
    /// metric names, dimensions and levels while the worker runs, with a
    /// last flush once it has stopped (feature `cloudwatch`; see
    /// [`crate::observability::cloudwatch`]). The namespace defaults to the
    /// application name and the client to one built from
    /// [`Self::sdk_config`]. `build()` installs the process's `metrics`
    /// recorder, which must not already be set (so not with
    /// [`Self::serve_metrics`]); later workers of the process share it, and
    /// its namespace, level and dimensions (a later worker naming another
    /// namespace fails to build).
    #[cfg(feature = "cloudwatch")]
    pub fn publish_cloudwatch_metrics(
        mut self,
        metrics: crate::observability::cloudwatch::CloudWatchMetrics,
    ) -> Self {
        self.cloudwatch = Some(metrics);
        self
    }

    /// Pushes the metrics to an OpenTelemetry collector over OTLP/HTTP
    /// while the worker runs, every `interval` and once more after it
    /// stopped (feature `otlp`; see
    /// [`OtlpMetrics`](crate::observability::OtlpMetrics)). The resource's
    /// `service.name` defaults to the application name and
    /// `service.instance.id` to the worker id. A failed export is retried
    /// with backoff and never holds the worker up. The first worker to
    /// export installs the process's `metrics` recorder at `build()`,
    /// which fails if another recorder is installed (such as
    /// [`Self::serve_metrics`]'s), or if an earlier worker of the process
    /// exports with other settings; the probes of [`Self::serve_health`]
    /// work beside it.
    #[cfg(feature = "otlp")]
    pub fn export_otlp_metrics(mut self, otlp: crate::observability::OtlpMetrics) -> Self {
        self.otlp = Some(otlp);
        self
    }

    /// Validates every setting and returns the worker.
    pub fn build(self) -> Result<Worker, Error> {
        let table = self.checked_table()?;
        self.check_streams()?;
        let sdk = self.sdk.clone();
        let (kinesis, dynamodb) = match (self.kinesis, self.dynamodb, &sdk) {
            (Some(kinesis), Some(dynamodb), _) => (Some(kinesis), Some(dynamodb)),
            (_, _, Some(sdk)) => (Some(aws_sdk_kinesis::Client::new(sdk)), None),
            _ => (None, None),
        };
        let Some(kinesis) = kinesis else {
            return Err(invalid(
                "sdk_config",
                "no AWS configuration; call .sdk_config(&config) or .clients(..)".into(),
            ));
        };
        let Some(factory) = self.factory else {
            return Err(invalid(
                "processor",
                "no processor factory; call .processor(..)".into(),
            ));
        };
        let retrieval = retrieval(self.retrieval, self.polling_field, self.polling, &self.app)?;
        let mut source = KinesisShardSource::builder(kinesis.clone()).retrieval(retrieval);
        if let Some(bytes) = self.prefetch_budget {
            source = source.prefetch_budget(bytes);
        }
        let source = source.build()?;
        let lease = self.lease.build()?;
        self.engine.validate()?;
        if self.liveness_stall_bound.is_some_and(|b| b.is_zero()) {
            return Err(invalid(
                "liveness_stall_bound",
                "must be above zero (leave it unset for no stall check)".into(),
            ));
        }
        // The names are checked here; their lease keys are resolved at
        // run(), which can ask Kinesis.
        check_stream_names(self.streams.iter().map(String::as_str))?;
        let dynamodb = match (dynamodb, &sdk) {
            (Some(dynamodb), _) => bounded_client(dynamodb, lease.store_timeout()),
            (None, Some(sdk)) => lease_table_client(sdk, lease.store_timeout()),
            (None, None) => unreachable!("a client pair or an SdkConfig was checked above"),
        };
        let multi_stream = self.multi_stream || self.streams.len() > 1 || self.tracker.is_some();
        #[cfg(feature = "cloudwatch")]
        let cloudwatch = match self.cloudwatch {
            Some(metrics) => metrics.install_for_worker(&self.app, sdk.as_ref(), multi_stream)?,
            None => None,
        };
        // Last: nothing is bound when another setting is invalid.
        let endpoints = EndpointSettings {
            health_addr: self.health_addr,
            #[cfg(feature = "prometheus")]
            metrics_addr: self.metrics_addr,
            #[cfg(feature = "otlp")]
            otlp: self.otlp,
        }
        .bind(&self.app, lease.worker_id())?;
        Ok(Worker {
            app: self.app,
            table,
            streams: self.streams,
            resolver: Arc::new(StreamResolver::new(kinesis, multi_stream)),
            dynamodb,
            table_options: self.table_options,
            engine: self.engine.lease(lease.clone()),
            lease,
            source,
            factory,
            handle: WorkerHandle::new(),
            store_stats: Arc::default(),
            tracker: self.tracker,
            observer: self.observer,
            liveness_stall_bound: self.liveness_stall_bound,
            #[cfg(feature = "cloudwatch")]
            cloudwatch,
            endpoints,
        })
    }

    /// The lease table's name (the application's unless `table_name` says
    /// otherwise), if DynamoDB accepts it.
    fn checked_table(&self) -> Result<String, Error> {
        let table = self.table.clone().unwrap_or_else(|| self.app.clone());
        let table_field = if self.table.is_some() {
            "table_name"
        } else {
            "application_name"
        };
        if !valid_table_name(&table) {
            return Err(invalid(
                table_field,
                format!(
                    "is {table:?}; a DynamoDB table name is 3-255 characters of a-z, A-Z, 0-9, '_', '-', '.'"
                ),
            ));
        }
        Ok(table)
    }

    /// At least one stream, and none given by an ARN of another region
    /// than the AWS configuration's.
    fn check_streams(&self) -> Result<(), Error> {
        if self.streams.is_empty() {
            return Err(invalid(
                "stream",
                "no stream given; call .stream(name)".into(),
            ));
        }
        let sdk_region = self
            .sdk
            .as_ref()
            .and_then(|c| c.region())
            .or_else(|| self.kinesis.as_ref().and_then(|k| k.config().region()))
            .map(|r| r.as_ref().to_owned());
        for stream in &self.streams {
            let arn = StreamArn::parse(stream)?;
            if let (Some(arn), Some(region)) = (arn, &sdk_region)
                && arn.region() != region
            {
                return Err(invalid(
                    "stream",
                    format!(
                        "{stream:?} is in region {}, the AWS configuration in {region}; a worker \
                         reads through one regional client: run one per region",
                        arn.region()
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Worker {
    /// Starts configuring a worker for `application_name`, which also names
    /// the lease table unless [`WorkerBuilder::table_name`] says otherwise.
    pub fn builder(application_name: impl Into<String>) -> WorkerBuilder {
        WorkerBuilder::new(application_name.into())
    }
}

/// An engine setting `field` rejects, as the facade's error.
fn invalid(field: &'static str, reason: String) -> Error {
    Error::from(ConfigError { field, reason })
}

/// How the worker reads its shards: the [`Retrieval`] given whole (a
/// fan-out consumer named after `app` unless named), or polling with the
/// settings given one by one, never both.
fn retrieval(
    given: Option<Retrieval>,
    polling_field: Option<&'static str>,
    polling: PollingConfigBuilder,
    app: &str,
) -> Result<Retrieval, Error> {
    // Two places for one setting would leave one of them silently
    // ignored.
    if let (Some(_), Some(field)) = (&given, polling_field) {
        return Err(invalid(
            field,
            "cannot be combined with .retrieval(..): set it on the PollingConfig given there (it does not apply to fan-out)".into(),
        ));
    }
    Ok(match given {
        None => Retrieval::Polling(polling.build()?),
        Some(Retrieval::FanOut(fan_out)) if fan_out.consumer_name().is_none() => {
            Retrieval::FanOut(fan_out.with_consumer_name(app).map_err(|e| {
                invalid(
                    e.field,
                    format!("{} (it defaults to the application name; set FanOutConfig's consumer_name)", e.reason),
                )
            })?)
        }
        Some(other) => other,
    })
}

fn valid_table_name(name: &str) -> bool {
    (3..=255).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The host name (the pod name in Kubernetes) plus a random suffix: unique
/// per process, recognisable in `kcl leases`.
fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kcl-worker".to_owned());
    format!("{host}-{:08x}", rand::random::<u32>())
}

mod clients;
#[cfg(test)]
mod tests;
