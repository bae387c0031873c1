//! `Worker::builder`: every setting, validated at `build()`, wired to
//! DynamoDB and Kinesis at `run()`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::SdkConfig;
use kcl_core::config::{LeaseConfig, LeaseRenewal};
use kcl_core::processor::{FailurePolicy, ProcessorFactory};
use kcl_core::source::{InitialPosition, ShardSource, SourceError};
use kcl_core::store::LeaseStore;
use kcl_core::store::metered::{MeteredStore, StoreStats};
use kcl_core::worker::{
    RemovedStreamPolicy, StreamSpec, StreamTracker, WorkerConfig, WorkerError, WorkerHandle,
    retry_startup,
};
use kcl_core::{ConfigError, LeaseLayout};
use kcl_dynamodb::table::workers_table_for;
use kcl_dynamodb::{Capacity, DynamoDbLeaseStore, ensure_table, ensure_workers_table};
use kcl_kinesis::{FanOutConfig, KinesisShardSource, PollingConfig, Retrieval, StreamArn};
use tracing::{info, warn};

/// Why a worker could not be built or could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is impossible; the message names the field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A configured stream does not exist.
    #[error("stream {stream:?} does not exist (check the name, the region and the endpoint)")]
    StreamNotFound {
        /// The stream name.
        stream: String,
    },
    /// Describing a stream failed.
    #[error("cannot describe stream {stream:?}")]
    DescribeStream {
        /// The stream name.
        stream: String,
        /// The SDK error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The lease table could not be created or is not a lease table.
    #[error("lease table {table:?} cannot be used")]
    LeaseTable {
        /// The table name.
        table: String,
        /// What went wrong.
        #[source]
        source: kcl_core::StoreError,
    },
    /// The worker stopped with an error.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The metrics endpoint's address cannot be bound (in use, or not an
    /// address of this host).
    #[cfg(feature = "prometheus")]
    #[error("cannot serve metrics on {addr}")]
    MetricsBind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why binding failed.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True when the same run may succeed if tried again later: the lease
    /// table or Kinesis throttled, answered 5xx or did not answer. A worker
    /// retries these at startup by itself; this tells the rest apart.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::LeaseTable { source, .. } => source.is_retryable(),
            Error::DescribeStream { source, .. } => source
                .downcast_ref::<DescribeError>()
                .is_some_and(describe_is_retryable),
            Error::Worker(WorkerError::Store(e)) => e.is_retryable(),
            Error::Worker(WorkerError::Source { source, .. }) => source.is_retryable(),
            _ => false,
        }
    }
}

type DescribeError = aws_sdk_kinesis::error::SdkError<
    aws_sdk_kinesis::operation::describe_stream_summary::DescribeStreamSummaryError,
    aws_sdk_kinesis::config::http::HttpResponse,
>;

/// Throttling (LimitExceeded), 5xx, and no answer at all.
fn describe_is_retryable(e: &DescribeError) -> bool {
    use aws_sdk_kinesis::error::SdkError;
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(s) => {
            s.err().is_limit_exceeded_exception() || s.raw().status().as_u16() >= 500
        }
        _ => false,
    }
}

/// A kcl worker: consumes its streams' shards together with the other
/// workers of the same application name.
pub struct Worker {
    app: String,
    table: String,
    streams: Vec<String>,
    multi_stream: bool,
    kinesis: aws_sdk_kinesis::Client,
    dynamodb: aws_sdk_dynamodb::Client,
    capacity: Capacity,
    config: WorkerConfig,
    /// Built (and so validated) at `build()`; kept to shut it down after
    /// the worker stopped.
    source: KinesisShardSource,
    factory: Arc<dyn ProcessorFactory>,
    handle: WorkerHandle,
    store_stats: Arc<StoreStats>,
    tracker: Option<StreamNames>,
    #[cfg(feature = "prometheus")]
    metrics: Option<crate::observability::Endpoint>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("application", &self.app)
            .field("table", &self.table)
            .field("streams", &self.streams)
            .field("worker_id", &self.config.lease().worker_id())
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Starts configuring a worker for `application_name`, which also names
    /// the lease table unless [`WorkerBuilder::table_name`] says otherwise.
    pub fn builder(application_name: impl Into<String>) -> WorkerBuilder {
        WorkerBuilder::new(application_name.into())
    }

    /// A handle to stop the worker gracefully and read its status.
    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }

    /// This worker's id, as written in the lease table.
    pub fn worker_id(&self) -> &str {
        self.config.lease().worker_id()
    }

    /// Counters of the worker's lease-table calls (calls, errors, consumed
    /// capacity per operation).
    pub fn store_stats(&self) -> Arc<StoreStats> {
        Arc::clone(&self.store_stats)
    }

    /// The address of the metrics endpoint (see
    /// [`WorkerBuilder::serve_metrics`]), with the port actually bound.
    #[cfg(feature = "prometheus")]
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(|m| m.local_addr())
    }

    /// Counters of the worker's Kinesis calls and reads (polling calls,
    /// fan-out subscriptions and resubscriptions, records).
    pub fn source_stats(&self) -> Arc<kcl_kinesis::SourceStats> {
        self.source.stats_handle()
    }

    /// Runs until [`WorkerHandle::shutdown`] is called.
    pub async fn run(self) -> Result<(), Error> {
        self.run_until(std::future::pending()).await
    }

    /// Runs until `signal` completes (for example [`crate::shutdown_signal`])
    /// or [`WorkerHandle::shutdown`] is called, then shuts down gracefully:
    /// processors checkpoint in `shutdown_requested`, leases are released.
    pub async fn run_until(
        #[allow(unused_mut)] mut self,
        signal: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        #[cfg(feature = "prometheus")]
        if let Some(endpoint) = self.metrics.take() {
            // Served next to the worker, not spawned: it answers from the
            // first startup check (503) to the end of the drain, and stops
            // when the worker has.
            let probe = crate::observability::Probe::new(
                self.handle.clone(),
                Arc::clone(&self.store_stats),
                crate::observability::readiness_window(self.config.lease()),
            );
            let stop = tokio_util::sync::CancellationToken::new();
            let worker = async {
                let result = self.run_worker(signal).await;
                stop.cancel();
                result
            };
            let (result, ()) = tokio::join!(worker, endpoint.serve(probe, stop.clone()));
            return result;
        }
        self.run_worker(signal).await
    }

    /// The startup steps before the engine's own: every stream exists (and
    /// its multi-stream identifier), and the lease table exists with the
    /// right schema. Streams first: a misspelt stream must not leave an
    /// empty table. Failures that retrying can fix are retried with capped
    /// backoff while the readiness probe says why. `None` if a shutdown
    /// came first.
    async fn prepare(&self) -> Result<Option<Vec<String>>, Error> {
        let mut identifiers = Vec::with_capacity(self.streams.len());
        for stream in &self.streams {
            let id = retry_startup(
                &self.handle,
                "describing the stream",
                Error::is_retryable,
                || stream_identifier(&self.kinesis, stream),
            )
            .await?;
            let Some(id) = id else { return Ok(None) };
            identifiers.push(id);
        }
        let checked = retry_startup(
            &self.handle,
            "checking the lease table",
            Error::is_retryable,
            || async {
                ensure_table(&self.dynamodb, &self.table, self.capacity)
                    .await
                    .map_err(|source| Error::LeaseTable {
                        table: self.table.clone(),
                        source,
                    })?;
                if self.config.lease().renewal() == LeaseRenewal::WorkerLiveness {
                    let workers = workers_table_for(&self.table);
                    ensure_workers_table(&self.dynamodb, &workers, self.capacity)
                        .await
                        .map_err(|source| Error::LeaseTable {
                            table: workers,
                            source,
                        })?;
                }
                Ok(())
            },
        )
        .await?;
        Ok(checked.map(|()| identifiers))
    }

    async fn run_worker(self, signal: impl Future<Output = ()> + Send) -> Result<(), Error> {
        tokio::pin!(signal);
        // Startup steps retry what retrying can fix, so they must notice a
        // shutdown too: a SIGTERM during a throttling storm ends the run.
        let prepared = tokio::select! {
            prepared = self.prepare() => prepared?,
            _ = &mut signal => None,
        };
        let Some(identifiers) = prepared else {
            info!("shut down during startup");
            return Ok(());
        };
        let mut config = self.config;
        for (stream, identifier) in self.streams.iter().zip(identifiers) {
            let layout = if self.multi_stream {
                LeaseLayout::MultiStream { identifier }
            } else {
                LeaseLayout::SingleStream
            };
            config = config.with_stream(StreamSpec {
                name: stream.clone(),
                layout,
            });
        }
        let store: Arc<dyn LeaseStore> = Arc::new(MeteredStore::with_stats(
            DynamoDbLeaseStore::new(self.dynamodb.clone(), &self.table)
                .with_stats(Arc::clone(&self.store_stats)),
            Arc::clone(&self.store_stats),
        ));
        let source: Arc<dyn ShardSource> = Arc::new(self.source.clone());
        info!(application = %self.app, table = %self.table, worker = %config.lease().worker_id(), "starting kcl worker");
        let mut worker = kcl_core::worker::Worker::new(config, store, source, self.factory)
            .with_handle(self.handle);
        if let Some(names) = self.tracker {
            worker = worker.with_stream_tracker(Arc::new(NameTracker {
                names,
                kinesis: self.kinesis.clone(),
                identifiers: Mutex::default(),
            }));
        }
        let result = worker.run_until(&mut signal).await;
        // After the worker: no reader subscribes any more.
        if let Err(e) = self.source.shutdown().await {
            warn!(error = %e, "deregistering the stream consumer failed; it stays registered");
        }
        result.map_err(|e| match e {
            WorkerError::StreamNotFound { stream } => Error::StreamNotFound { stream },
            other => Error::Worker(other),
        })
    }
}

/// The stream names an application supplies at runtime.
type StreamNames = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// Turns the application's stream names into lease layouts, asking Kinesis
/// once per stream for its multi-stream identifier.
struct NameTracker {
    names: StreamNames,
    kinesis: aws_sdk_kinesis::Client,
    identifiers: Mutex<HashMap<String, String>>,
}

impl fmt::Debug for NameTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NameTracker").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl StreamTracker for NameTracker {
    async fn streams(&self) -> Result<Vec<StreamSpec>, SourceError> {
        let mut specs = Vec::new();
        for name in (self.names)() {
            let known = self
                .identifiers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&name)
                .cloned();
            let identifier = match known {
                Some(id) => id,
                None => match stream_identifier(&self.kinesis, &name).await {
                    Ok(id) => {
                        self.identifiers
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(name.clone(), id.clone());
                        id
                    }
                    // A stream not created yet is simply not consumed yet.
                    Err(Error::StreamNotFound { .. }) => continue,
                    Err(e) => {
                        return Err(SourceError::Fatal {
                            stream: name,
                            message: e.to_string(),
                            source: None,
                        });
                    }
                },
            };
            specs.push(StreamSpec {
                name,
                layout: LeaseLayout::MultiStream { identifier },
            });
        }
        Ok(specs)
    }
}

/// The Java KCL's multi-stream identifier: `account:stream:creationEpoch`.
async fn stream_identifier(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
) -> Result<String, Error> {
    let arn = StreamArn::parse(stream).ok().flatten();
    let request = match &arn {
        Some(arn) => kinesis.describe_stream_summary().stream_arn(arn.as_str()),
        None => kinesis.describe_stream_summary().stream_name(stream),
    };
    let out = request.send().await.map_err(|e| {
        if e.as_service_error()
            .is_some_and(|s| s.is_resource_not_found_exception())
        {
            Error::StreamNotFound {
                stream: stream.to_owned(),
            }
        } else {
            Error::DescribeStream {
                stream: stream.to_owned(),
                source: Box::new(e),
            }
        }
    })?;
    let summary = out
        .stream_description_summary()
        .ok_or_else(|| Error::DescribeStream {
            stream: stream.to_owned(),
            source: "DescribeStreamSummary returned no summary".into(),
        })?;
    // The stream's own account and name (a stream given by ARN may be of
    // another account): arn:aws:kinesis:REGION:ACCOUNT:stream/NAME.
    let described = StreamArn::parse(summary.stream_arn()).ok().flatten();
    let (account, name) = match described.as_ref().or(arn.as_ref()) {
        Some(arn) => (arn.account().to_owned(), arn.name().to_owned()),
        None => (String::new(), stream.to_owned()),
    };
    let epoch = summary.stream_creation_timestamp().secs();
    Ok(format!("{account}:{name}:{epoch}"))
}

/// Configures a [`Worker`]. Every setting has a default except the streams,
/// the AWS configuration and the processor; `build()` rejects impossible
/// combinations with an error naming the field.
pub struct WorkerBuilder {
    app: String,
    streams: Vec<String>,
    multi_stream: bool,
    sdk: Option<SdkConfig>,
    kinesis: Option<aws_sdk_kinesis::Client>,
    dynamodb: Option<aws_sdk_dynamodb::Client>,
    table: Option<String>,
    capacity: Capacity,
    worker_id: Option<String>,
    lease_duration: Option<Duration>,
    renew_interval: Option<Duration>,
    renewal: Option<LeaseRenewal>,
    taker_interval: Option<Duration>,
    max_leases_per_worker: Option<usize>,
    max_leases_to_steal: Option<usize>,
    handoff_timeout: Option<Duration>,
    initial_position: InitialPosition,
    failure_policy: FailurePolicy,
    parallelism_per_shard: Option<usize>,
    max_records: Option<i32>,
    idle_time_between_reads: Option<Duration>,
    time_between_reads: Option<Duration>,
    prefetch_budget: Option<usize>,
    retrieval: Option<Retrieval>,
    shard_sync_interval: Option<Duration>,
    parent_poll_interval: Option<Duration>,
    shutdown_timeout: Option<Duration>,
    completed_lease_retention: Option<Duration>,
    factory: Option<Arc<dyn ProcessorFactory>>,
    tracker: Option<StreamNames>,
    removed_stream_policy: Option<RemovedStreamPolicy>,
    #[cfg(feature = "prometheus")]
    metrics_addr: Option<std::net::SocketAddr>,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("application", &self.app)
            .field("streams", &self.streams)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.$name = Some(value);
            self
        }
    };
}

impl WorkerBuilder {
    fn new(app: String) -> Self {
        WorkerBuilder {
            app,
            streams: Vec::new(),
            multi_stream: false,
            sdk: None,
            kinesis: None,
            dynamodb: None,
            table: None,
            capacity: Capacity::OnDemand,
            worker_id: None,
            lease_duration: None,
            renew_interval: None,
            renewal: None,
            taker_interval: None,
            max_leases_per_worker: None,
            max_leases_to_steal: None,
            handoff_timeout: None,
            initial_position: InitialPosition::Latest,
            failure_policy: FailurePolicy::Retry,
            parallelism_per_shard: None,
            max_records: None,
            idle_time_between_reads: None,
            time_between_reads: None,
            prefetch_budget: None,
            retrieval: None,
            shard_sync_interval: None,
            parent_poll_interval: None,
            shutdown_timeout: None,
            completed_lease_retention: None,
            factory: None,
            tracker: None,
            removed_stream_policy: None,
            #[cfg(feature = "prometheus")]
            metrics_addr: None,
        }
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

    /// What happens to the leases of a stream the tracker stops listing
    /// (default: kept, with their checkpoints).
    pub fn removed_stream_policy(mut self, policy: RemovedStreamPolicy) -> Self {
        self.removed_stream_policy = Some(policy);
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

    /// Uses these clients, as configured (their timeouts included).
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
        self.capacity = capacity;
        self
    }

    /// This worker's id in the lease table (default: the host name and a
    /// random suffix). Keep it unique per process.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// Where shards without a checkpoint start (default LATEST).
    pub fn initial_position(mut self, position: InitialPosition) -> Self {
        self.initial_position = position;
        self
    }

    /// What happens when a processor returns an error (default: retry the
    /// same batch with backoff).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    setter!(
        /// Processes each shard in up to this many parallel lanes (default
        /// 1, at most 100): a partition key always goes to the same lane
        /// and its records stay in shard order; each lane has its own
        /// processor instance (see
        /// [`ShardContext::lane`](crate::ShardContext::lane)); the
        /// checkpoint advances to the point below which every lane is done.
        parallelism_per_shard: usize
    );

    setter!(
        /// Lease duration (default 10 s): how long peers wait for a silent
        /// worker's leases.
        lease_duration: Duration
    );
    setter!(
        /// Renewal interval (default half the lease duration for the
        /// worker's liveness record, a third of it per lease).
        renew_interval: Duration
    );
    setter!(
        /// How held leases are kept alive (default
        /// [`LeaseRenewal::WorkerLiveness`]: one liveness record per worker,
        /// in the table `<lease table>-workers`, which is created if
        /// missing; idle cost grows with workers, not shards). A lease table
        /// shared with Java KCL workers needs [`LeaseRenewal::PerLease`].
        renewal: LeaseRenewal
    );
    setter!(
        /// Mean lease-taker interval (default 10 s, jittered +/-25%).
        taker_interval: Duration
    );
    setter!(
        /// Most leases this worker holds (default unbounded).
        max_leases_per_worker: usize
    );
    setter!(
        /// Most leases stolen per tick (default 4; 0 disables stealing).
        max_leases_to_steal: usize
    );
    setter!(
        /// How long a graceful handoff may take before it is forced
        /// (default and minimum: the lease duration).
        handoff_timeout: Duration
    );
    setter!(
        /// Records per GetRecords call (default 10000, the service maximum).
        max_records: i32
    );
    setter!(
        /// Time between the starts of two GetRecords calls when the first
        /// returned nothing and the shard is caught up (default 1 s, at
        /// least 200 ms): what an idle shard costs.
        idle_time_between_reads: Duration
    );
    setter!(
        /// Time between the starts of two GetRecords calls when the first
        /// returned some records, short of `max_records`, at the tip of the
        /// shard (default 500 ms, at least 200 ms): a trickling shard's
        /// latency against its read quota. See [`PollingConfig`].
        time_between_reads: Duration
    );
    setter!(
        /// Most bytes all of this worker's shards together hold ahead of
        /// their processors (default 1 GiB); see
        /// [`kcl_kinesis::KinesisShardSourceBuilder::prefetch_budget`].
        prefetch_budget: usize
    );
    /// How shards are read (default: polling, tuned with
    /// [`Self::max_records`] and [`Self::idle_time_between_reads`]). With
    /// [`Retrieval::FanOut`] and no consumer name, the consumer is named
    /// after the application, so all its workers share it.
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

    setter!(
        /// Shard listing interval (default 60 s).
        shard_sync_interval: Duration
    );
    setter!(
        /// How often a child shard checks its parents (default 10 s).
        parent_poll_interval: Duration
    );
    setter!(
        /// How long a graceful shutdown waits for processors (default 25 s).
        shutdown_timeout: Duration
    );
    setter!(
        /// How long a finished shard's lease stays before it is deleted
        /// (default 5 min).
        completed_lease_retention: Duration
    );

    /// Serves Prometheus metrics (`/metrics`) and health probes
    /// (`/healthz`, `/readyz`) on `addr` while the worker runs (feature
    /// `prometheus`). Port 0 picks a free port: see
    /// [`Worker::metrics_addr`]. The address is bound at `build()`, which
    /// fails if it is taken; the first worker to serve metrics installs
    /// the process's `metrics` recorder, which must not already be set.
    #[cfg(feature = "prometheus")]
    pub fn serve_metrics(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// Validates every setting and returns the worker.
    pub fn build(self) -> Result<Worker, Error> {
        let invalid =
            |field: &'static str, reason: String| Error::Config(ConfigError { field, reason });
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
        if self.streams.is_empty() {
            return Err(invalid(
                "stream",
                "no stream given; call .stream(name)".into(),
            ));
        }
        let sdk = self.sdk.clone();
        let sdk_region = sdk
            .as_ref()
            .and_then(|c| c.region())
            .or_else(|| self.kinesis.as_ref().and_then(|k| k.config().region()))
            .map(|r| r.as_ref().to_owned());
        for stream in &self.streams {
            let arn = StreamArn::parse(stream).map_err(|e| invalid(e.field, e.reason))?;
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
        let worker_id = self.worker_id.unwrap_or_else(default_worker_id);
        let mut lease = LeaseConfig::builder(worker_id);
        if let Some(d) = self.lease_duration {
            lease = lease.lease_duration(d);
        }
        if let Some(d) = self.renew_interval {
            lease = lease.renew_interval(d);
        }
        if let Some(mode) = self.renewal {
            lease = lease.renewal(mode);
        }
        if let Some(d) = self.taker_interval {
            lease = lease.taker_interval(d);
        }
        if let Some(n) = self.max_leases_per_worker {
            lease = lease.max_leases_per_worker(n);
        }
        if let Some(n) = self.max_leases_to_steal {
            lease = lease.max_leases_to_steal(n);
        }
        if let Some(d) = self.handoff_timeout {
            lease = lease.handoff_timeout(d);
        }
        let mut polling = PollingConfig::builder();
        if let Some(n) = self.max_records {
            polling = polling.max_records(n);
        }
        if let Some(d) = self.idle_time_between_reads {
            polling = polling.idle_time_between_reads(d);
        }
        if let Some(d) = self.time_between_reads {
            polling = polling.time_between_reads(d);
        }
        let polling = polling.build().map_err(|e| invalid(e.field, e.reason))?;
        let retrieval = match self.retrieval {
            None => Retrieval::Polling(polling),
            Some(retrieval) => {
                // Two places for one setting would leave one of them
                // silently ignored.
                let polling_field = if self.max_records.is_some() {
                    Some("max_records")
                } else if self.idle_time_between_reads.is_some() {
                    Some("idle_time_between_reads")
                } else if self.time_between_reads.is_some() {
                    Some("time_between_reads")
                } else {
                    None
                };
                if let Some(field) = polling_field {
                    return Err(invalid(
                        field,
                        "cannot be combined with .retrieval(..): set it on the PollingConfig given there (it does not apply to fan-out)".into(),
                    ));
                }
                match retrieval {
                    Retrieval::FanOut(fan_out) if fan_out.consumer_name().is_none() => {
                        Retrieval::FanOut(fan_out.with_consumer_name(&self.app).map_err(|e| {
                            invalid(
                                e.field,
                                format!("{} (it defaults to the application name; set FanOutConfig's consumer_name)", e.reason),
                            )
                        })?)
                    }
                    other => other,
                }
            }
        };
        let mut source = KinesisShardSource::builder(kinesis.clone()).retrieval(retrieval);
        if let Some(bytes) = self.prefetch_budget {
            source = source.prefetch_budget(bytes);
        }
        let source = source.build().map_err(|e| invalid(e.field, e.reason))?;
        let lease = lease.build()?;
        let dynamodb = match (dynamodb, &sdk) {
            (Some(dynamodb), _) => dynamodb,
            (None, Some(sdk)) => lease_table_client(sdk, lease.store_timeout()),
            (None, None) => unreachable!("a client pair or an SdkConfig was checked above"),
        };
        let mut config = WorkerConfig::builder(lease)
            .initial_position(self.initial_position)
            .failure_policy(self.failure_policy);
        if let Some(n) = self.parallelism_per_shard {
            config = config.parallelism_per_shard(n);
        }
        if let Some(d) = self.shard_sync_interval {
            config = config.shard_sync_interval(d);
        }
        if let Some(d) = self.parent_poll_interval {
            config = config.parent_poll_interval(d);
        }
        if let Some(d) = self.shutdown_timeout {
            config = config.shutdown_timeout(d);
        }
        if let Some(d) = self.completed_lease_retention {
            config = config.completed_lease_retention(d);
        }
        if let Some(p) = self.removed_stream_policy {
            config = config.removed_stream_policy(p);
        }
        // Streams are validated here (names, duplicates); their lease keys
        // are resolved at run(), which can ask Kinesis.
        let multi_stream = self.multi_stream || self.streams.len() > 1 || self.tracker.is_some();
        for name in &self.streams {
            let layout = if multi_stream {
                LeaseLayout::MultiStream {
                    identifier: format!("pending:{name}"),
                }
            } else {
                LeaseLayout::SingleStream
            };
            config = config.stream(StreamSpec {
                name: name.clone(),
                layout,
            });
        }
        let config = config.build()?.without_streams();
        Ok(Worker {
            app: self.app,
            table,
            streams: self.streams,
            multi_stream,
            kinesis,
            dynamodb,
            capacity: self.capacity,
            config,
            source,
            factory,
            handle: WorkerHandle::new(),
            store_stats: Arc::default(),
            tracker: self.tracker,
            // Last: nothing is bound when another setting is invalid.
            #[cfg(feature = "prometheus")]
            metrics: self
                .metrics_addr
                .map(crate::observability::Endpoint::bind)
                .transpose()?,
        })
    }
}

/// The lease table's client, with timeouts `sdk` leaves unset.
fn lease_table_client(sdk: &SdkConfig, call_timeout: Duration) -> aws_sdk_dynamodb::Client {
    use aws_config::timeout::TimeoutConfig;
    let mut timeouts = sdk
        .timeout_config()
        .cloned()
        .unwrap_or_else(|| TimeoutConfig::builder().build());
    timeouts.take_defaults_from(
        &TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(2))
            .operation_attempt_timeout((call_timeout / 2).max(Duration::from_millis(250)))
            .build(),
    );
    let config = aws_sdk_dynamodb::config::Builder::from(sdk)
        .timeout_config(timeouts)
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
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

#[cfg(test)]
mod tests {
    use super::*;
    use kcl_core::store::{StoreError, StoreOp};

    fn describe_failure(e: DescribeError) -> Error {
        Error::DescribeStream {
            stream: "s".into(),
            source: Box::new(e),
        }
    }

    #[test]
    fn startup_retries_what_retrying_can_fix_and_nothing_else() {
        use aws_sdk_kinesis::error::SdkError;
        let throttled = StoreError::Throttled {
            op: StoreOp::Get,
            source: "slow down".into(),
        };
        let fatal = StoreError::Fatal {
            op: StoreOp::Get,
            message: "access denied".into(),
            source: None,
        };
        let cases: Vec<(&str, Error, bool)> = vec![
            (
                "no answer from Kinesis",
                describe_failure(SdkError::timeout_error("timed out")),
                true,
            ),
            (
                "a connection that failed",
                describe_failure(SdkError::dispatch_failure(
                    aws_sdk_kinesis::error::ConnectorError::io("reset".into()),
                )),
                true,
            ),
            (
                "a request that could not be built",
                describe_failure(SdkError::construction_failure("bad")),
                false,
            ),
            (
                "a throttled lease table",
                Error::LeaseTable {
                    table: "t".into(),
                    source: throttled,
                },
                true,
            ),
            (
                "a lease table access denied",
                Error::LeaseTable {
                    table: "t".into(),
                    source: fatal,
                },
                false,
            ),
            (
                "a missing stream",
                Error::StreamNotFound { stream: "s".into() },
                false,
            ),
        ];
        for (what, error, retryable) in cases {
            assert_eq!(error.is_retryable(), retryable, "{what}: {error}");
        }
    }
}
