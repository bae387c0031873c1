//! The worker engine: the lease coordinator, the shard sync loop and one
//! consumer per held lease, with a graceful shutdown.
//!
//! Store- and source-agnostic: the `kcl` crate wires it to DynamoDB and
//! Kinesis; tests wire it to the in-memory store and source.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::TryStreamExt;
use rand::Rng;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, error, info, info_span, warn};

use crate::backoff::Backoff;
use crate::checkpointer::CheckpointPolicy;
use crate::cleanup::LeaseCleanup;
use crate::config::{ConfigError, LeaseConfig};
use crate::consumer::{self, ConsumerExit, ConsumerSetup};
use crate::lease::{Lease, LeaseLayout};
use crate::leases::{
    CoordinatorStats, FleetSignals, LeaseCoordinator, LeaseEvent, LeaseFilter, LeaseHandle,
    ShutdownMode, StatsSnapshot,
};
use crate::metric_names::CONSUMER_PANICS;
use crate::observe::Observer;
use crate::processor::{FailurePolicy, ProcessorFactory};
use crate::shard_sync::{self, SyncError};
use crate::source::{InitialPosition, ShardSource, SourceError};
use crate::store::timeout::TimeoutStore;
use crate::store::{LeaseStore, StoreError};

mod progress;
mod shutdown;
pub use progress::{CheckpointMark, Delivery, ProcessorCall, ShardProgress};
pub(crate) use progress::{ProgressRegistry, ShardTracker};
pub use shutdown::ShutdownReport;
use shutdown::Stopped;

/// One stream a worker consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// The stream name.
    pub name: String,
    /// How its lease keys are formed.
    pub layout: LeaseLayout,
}

/// Settings of a [`Worker`]; build with [`WorkerConfig::builder`].
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub(crate) lease: LeaseConfig,
    pub(crate) streams: Vec<StreamSpec>,
    pub(crate) initial_position: InitialPosition,
    pub(crate) failure_policy: FailurePolicy,
    pub(crate) parallelism_per_shard: usize,
    pub(crate) checkpoint_policy: CheckpointPolicy,
    pub(crate) shard_sync_interval: Duration,
    pub(crate) parent_poll_interval: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) completed_lease_retention: Duration,
    pub(crate) removed_stream_policy: RemovedStreamPolicy,
    pub(crate) max_read_failure_time: Duration,
    pub(crate) processor_warn_after: Duration,
    pub(crate) processor_timeout: Option<Duration>,
}

impl WorkerConfig {
    /// A builder for the given lease settings (which carry the worker id).
    pub fn builder(lease: LeaseConfig) -> WorkerConfigBuilder {
        WorkerConfigBuilder::default().lease(lease)
    }

    /// The lease settings.
    pub fn lease(&self) -> &LeaseConfig {
        &self.lease
    }

    /// The streams consumed.
    pub fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
}

/// Builder of [`WorkerConfig`]: the lease settings and at least one stream
/// are required, every other setting has a default.
#[derive(Debug, Clone)]
pub struct WorkerConfigBuilder {
    lease: Option<LeaseConfig>,
    streams: Vec<StreamSpec>,
    initial_position: InitialPosition,
    failure_policy: FailurePolicy,
    parallelism_per_shard: usize,
    checkpoint_policy: CheckpointPolicy,
    shard_sync_interval: Duration,
    parent_poll_interval: Duration,
    shutdown_timeout: Duration,
    max_backoff: Duration,
    completed_lease_retention: Duration,
    removed_stream_policy: RemovedStreamPolicy,
    max_read_failure_time: Duration,
    processor_warn_after: Duration,
    processor_timeout: Option<Duration>,
}

impl Default for WorkerConfigBuilder {
    fn default() -> Self {
        WorkerConfigBuilder {
            lease: None,
            streams: Vec::new(),
            initial_position: InitialPosition::Latest,
            failure_policy: FailurePolicy::Retry,
            parallelism_per_shard: 1,
            checkpoint_policy: CheckpointPolicy::every_call(),
            shard_sync_interval: Duration::from_secs(60),
            parent_poll_interval: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(25),
            max_backoff: Duration::from_secs(30),
            completed_lease_retention: Duration::from_secs(300),
            removed_stream_policy: RemovedStreamPolicy::Keep,
            max_read_failure_time: DEFAULT_MAX_READ_FAILURE_TIME,
            processor_warn_after: Duration::from_secs(60),
            processor_timeout: None,
        }
    }
}

impl WorkerConfigBuilder {
    /// The lease settings (required; they carry the worker id).
    pub fn lease(mut self, lease: LeaseConfig) -> Self {
        self.lease = Some(lease);
        self
    }
    /// Adds a stream.
    pub fn stream(mut self, spec: StreamSpec) -> Self {
        self.streams.push(spec);
        self
    }
    /// Where shards without a checkpoint start (default LATEST, as the Java
    /// KCL).
    pub fn initial_position(mut self, p: InitialPosition) -> Self {
        self.initial_position = p;
        self
    }
    /// What happens when a processor returns an error (default: retry the
    /// same batch with backoff).
    pub fn failure_policy(mut self, p: FailurePolicy) -> Self {
        self.failure_policy = p;
        self
    }

    /// Processes each shard in up to `n` parallel lanes (default 1, at
    /// most [`MAX_PARALLELISM_PER_SHARD`]): the records of one partition
    /// key always go to the same lane, in shard order, so a key's records
    /// never overtake each other, while records of different keys are
    /// processed concurrently. Each lane has its own processor instance
    /// (the factory is called once per lane, with
    /// [`ShardContext::lane`](crate::processor::ShardContext::lane) set),
    /// and the shard's checkpoint advances to the highest position below
    /// which every lane is done.
    pub fn parallelism_per_shard(mut self, n: usize) -> Self {
        self.parallelism_per_shard = n;
        self
    }

    /// How often each shard's checkpoint is written (default: at every
    /// `checkpoint()` call). With [`CheckpointPolicy::every`], calls within
    /// the period are coalesced into one write of the latest position at
    /// its end; a graceful shutdown, a handoff and SHARD_END always write
    /// the latest position, so a policy only changes how many records a
    /// crash repeats (at most a period's worth).
    pub fn checkpoint_policy(mut self, policy: CheckpointPolicy) -> Self {
        self.checkpoint_policy = policy;
        self
    }

    /// How often shards are listed to create leases for new ones (default
    /// 60 s, jittered by +/-25%).
    pub fn shard_sync_interval(mut self, d: Duration) -> Self {
        self.shard_sync_interval = d;
        self
    }
    /// How often a child shard checks whether its parents finished
    /// (default 10 s, as the Java KCL's `parentShardPollIntervalMillis`).
    pub fn parent_poll_interval(mut self, d: Duration) -> Self {
        self.parent_poll_interval = d;
        self
    }
    /// How long a graceful shutdown waits for processors to finish before
    /// it stops them and releases the leases anyway (default 25 s, inside
    /// the 30 s that ECS and Kubernetes give by default).
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }
    /// Longest pause between retries of a failing processor or read
    /// (default 30 s).
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }

    /// How long a finished shard's lease stays in the table before shard
    /// sync deletes it (default 5 min, as the Java KCL's
    /// `completedLeaseCleanupThreshold`).
    pub fn completed_lease_retention(mut self, d: Duration) -> Self {
        self.completed_lease_retention = d;
        self
    }

    /// What happens to the leases of a stream a [`StreamTracker`] stops
    /// listing (default: keep them, so its checkpoints survive if it comes
    /// back).
    pub fn removed_stream_policy(mut self, policy: RemovedStreamPolicy) -> Self {
        self.removed_stream_policy = policy;
        self
    }

    /// How long a processor call (`initialize`, `process_records`,
    /// `shard_ended`, `shutdown_requested`, `lease_lost`) may run before it
    /// is warned about, once per call, with its shard, lane and elapsed
    /// time, and counted in `kcl_processor_calls_slow_total` (default 60 s;
    /// above zero).
    pub fn processor_warn_after(mut self, d: Duration) -> Self {
        self.processor_warn_after = d;
        self
    }

    /// Cancels a processor call running this long and gives its shard back
    /// (default: no limit; above [`Self::processor_warn_after`]). The
    /// call's future is dropped first, so it never runs beside the shard's
    /// next owner; then the processor gets `lease_lost` (itself cut at this
    /// limit) and is dropped, the lease is released, and the next owner
    /// (maybe this worker) resumes from the last checkpoint. Counted in
    /// `kcl_processor_timeouts_total`; the failure policy does not apply.
    /// Only a call that yields can be cancelled: one blocked outside an
    /// await point holds its task, and the lease, until it returns.
    pub fn processor_timeout(mut self, d: Duration) -> Self {
        self.processor_timeout = Some(d);
        self
    }

    /// How long a held shard may go without a single successful read,
    /// and without a single answer from the service, before it is given
    /// back (default [`DEFAULT_MAX_READ_FAILURE_TIME`], 45 s; at least
    /// 1 s; `Duration::MAX` never gives a shard back for its reads): every
    /// open and fetch since the last batch failed, and none was answered
    /// (they timed out or never reached the service). The lease is
    /// released with an error log and counted in
    /// `kcl_unreadable_shards_released_total{stage="stalled"}`, so a
    /// worker that can read (a peer, or this one once its reads recover)
    /// takes the shard; without it, a worker cut off from the stream
    /// while it still reaches the lease table would keep its shards unread.
    ///
    /// Errors the service sends are answers and keep the shard in place:
    /// a fleet-wide outage (a disabled KMS key, long throttling) fails
    /// every worker alike, and moving the leases would change nothing.
    /// Only time spent reading counts: an idle shard's empty reads
    /// succeed, and a processor's time is its own. Keep it above the
    /// source's longest quiet gap between answers (the polling reader's
    /// call timeout, 10 s by default; the fan-out reader's event timeout,
    /// 30 s). A source that does not tell the consumer of its answers
    /// (see `source::AnswerClock`) has every failed read count.
    pub fn max_read_failure_time(mut self, d: Duration) -> Self {
        self.max_read_failure_time = d;
        self
    }

    /// Checks every setting but the lease settings and the streams: for a
    /// caller that validates its stream names with [`check_stream_names`]
    /// and resolves their lease layouts later (that needs the stream
    /// service), then calls [`Self::build`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, reason: &str| {
            Err(ConfigError {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.shard_sync_interval.is_zero() {
            return err("shard_sync_interval", "must be above zero");
        }
        if self.parent_poll_interval.is_zero() {
            return err("parent_poll_interval", "must be above zero");
        }
        if self.max_backoff < Duration::from_millis(100) {
            return err("max_backoff", "must be at least 100ms");
        }
        if !(1..=MAX_PARALLELISM_PER_SHARD).contains(&self.parallelism_per_shard) {
            return Err(ConfigError {
                field: "parallelism_per_shard",
                reason: format!(
                    "must be between 1 and {MAX_PARALLELISM_PER_SHARD}, not {}",
                    self.parallelism_per_shard
                ),
            });
        }
        self.checkpoint_policy.validate()?;
        if self.max_read_failure_time < Duration::from_secs(1) {
            let limit = self.max_read_failure_time;
            return Err(ConfigError {
                field: "max_read_failure_time",
                reason: format!(
                    "must be at least 1s, not {limit:?}: a healthy read can take that long"
                ),
            });
        }
        self.validate_processor_limits()?;
        if let FailurePolicy::Isolate(p) = &self.failure_policy
            && let Some(problem) = p.problem()
        {
            return err("failure_policy", problem);
        }
        Ok(())
    }

    fn validate_processor_limits(&self) -> Result<(), ConfigError> {
        if self.processor_warn_after.is_zero() {
            return Err(ConfigError {
                field: "processor_warn_after",
                reason: "must be above zero".into(),
            });
        }
        match self.processor_timeout {
            Some(timeout) if timeout <= self.processor_warn_after => Err(ConfigError {
                field: "processor_timeout",
                reason: format!(
                    "must exceed processor_warn_after ({:?}), not {timeout:?}: a call is warned \
                     about before it is cancelled",
                    self.processor_warn_after
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Validates the settings.
    pub fn build(self) -> Result<WorkerConfig, ConfigError> {
        self.validate()?;
        let Some(lease) = self.lease else {
            return Err(ConfigError {
                field: "lease",
                reason: "no lease settings; call .lease(LeaseConfig)".into(),
            });
        };
        check_stream_names(self.streams.iter().map(|s| s.name.as_str()))?;
        if self.streams.len() > 1
            && self
                .streams
                .iter()
                .any(|s| s.layout == LeaseLayout::SingleStream)
        {
            return Err(ConfigError {
                field: "streams",
                reason: "several streams need multi-stream lease keys".into(),
            });
        }
        Ok(WorkerConfig {
            lease,
            streams: self.streams,
            initial_position: self.initial_position,
            failure_policy: self.failure_policy,
            parallelism_per_shard: self.parallelism_per_shard,
            checkpoint_policy: self.checkpoint_policy,
            shard_sync_interval: self.shard_sync_interval,
            parent_poll_interval: self.parent_poll_interval,
            shutdown_timeout: self.shutdown_timeout,
            max_backoff: self.max_backoff,
            completed_lease_retention: self.completed_lease_retention,
            removed_stream_policy: self.removed_stream_policy,
            max_read_failure_time: self.max_read_failure_time,
            processor_warn_after: self.processor_warn_after,
            processor_timeout: self.processor_timeout,
        })
    }
}

/// Checks a worker's stream names: at least one, none blank, none twice.
pub fn check_stream_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    let err = |reason: String| {
        Err(ConfigError {
            field: "streams",
            reason,
        })
    };
    let mut seen: Vec<&str> = Vec::new();
    for name in names {
        if name.trim().is_empty() {
            return err("contains an empty stream name".into());
        }
        if seen.contains(&name) {
            return err(format!("names {name:?} twice"));
        }
        seen.push(name);
    }
    if seen.is_empty() {
        return err("must name at least one stream".into());
    }
    Ok(())
}

/// The most lanes a shard can be processed in.
pub const MAX_PARALLELISM_PER_SHARD: usize = 100;

/// How long a held shard may go with no read succeeding and no call
/// answered before it is given back, by default
/// ([`WorkerConfigBuilder::max_read_failure_time`]): above the fan-out
/// reader's 30 s event timeout plus a new subscription, so that a
/// connection that died unnoticed is replaced before the shard is given up.
pub const DEFAULT_MAX_READ_FAILURE_TIME: Duration = Duration::from_secs(45);

/// Supplies the streams a multi-stream worker consumes; polled at every
/// shard sync, so streams can be added and removed while it runs (the Java
/// KCL's `MultiStreamTracker`).
#[async_trait::async_trait]
pub trait StreamTracker: Send + Sync + fmt::Debug {
    /// The streams to consume now. An error keeps the current list.
    async fn streams(&self) -> Result<Vec<StreamSpec>, SourceError>;
}

/// What happens to the leases of a stream that is no longer consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovedStreamPolicy {
    /// Keep them (with their checkpoints) in the table.
    Keep,
    /// Delete them once released and this long after the removal was seen.
    DeleteAfter(Duration),
}

/// Why a worker could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A configured stream does not exist.
    #[error("stream {stream:?} does not exist (check the name, the region and the endpoint)")]
    StreamNotFound {
        /// The stream.
        stream: String,
    },
    /// Listing a stream failed at startup.
    #[error("cannot list the shards of stream {stream:?}")]
    Source {
        /// The stream.
        stream: String,
        /// The failure.
        #[source]
        source: SourceError,
    },
    /// The lease table could not be used at startup.
    #[error("the lease table is not usable")]
    Store(#[source] StoreError),
}

/// What a running worker is doing, for probes and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerStatus {
    /// True once the startup checks and first shard sync succeeded.
    pub ready: bool,
    /// While not ready: what the startup is waiting for (a lease table
    /// that throttles, a stream that cannot be listed yet), for readiness
    /// probes.
    pub starting: Option<String>,
    /// Lease keys with a running consumer.
    pub consuming: Vec<String>,
    /// The lease coordinator's counters.
    pub leases: StatsSnapshot,
    /// Shards whose records were all processed by this worker.
    pub shards_finished: u64,
}

/// A cloneable handle to a running worker: asks for a graceful shutdown and
/// reads its status.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    shutdown: CancellationToken,
    status: Arc<Mutex<WorkerStatus>>,
    /// The running coordinator's counters, read live by `status()`.
    leases: Arc<Mutex<Option<Arc<CoordinatorStats>>>>,
    /// Consumers per lease key, kept by the worker as they start and end
    /// and read by `status()`: a cost per change of O(log S), where
    /// publishing a sorted list at every change made a cold start of S
    /// shards quadratic.
    consuming: Arc<Mutex<BTreeMap<String, usize>>>,
    /// Each held shard's progress, kept by its consumer.
    progress: ProgressRegistry,
    /// The shutdown's report, published once the worker stopped.
    stopped: Stopped,
}

impl Default for WorkerHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerHandle {
    /// A handle not yet attached to a worker (see [`Worker::with_handle`]),
    /// for callers that need it before the worker exists.
    pub fn new() -> Self {
        WorkerHandle {
            shutdown: CancellationToken::new(),
            status: Arc::default(),
            leases: Arc::default(),
            consuming: Arc::default(),
            progress: ProgressRegistry::default(),
            stopped: Stopped::default(),
        }
    }

    /// The progress of every shard this worker consumes, by lease key:
    /// its last batch processed and checkpoint written, how far behind
    /// the tip it is, and any processor call running.
    pub fn shards(&self) -> Vec<ShardProgress> {
        self.progress.snapshot()
    }

    /// The shards of [`Self::shards`] that have work waiting (records
    /// behind the tip or read and not processed, or a processor call
    /// running) and neither processed a batch nor wrote a checkpoint for
    /// longer than `bound`: what a liveness check fails on.
    pub fn stalled(&self, bound: Duration) -> Vec<ShardProgress> {
        let now = Instant::now();
        self.shards()
            .into_iter()
            .filter(|s| s.is_stalled(bound, now))
            .collect()
    }

    /// Asks the worker to stop gracefully: stop taking leases, let every
    /// processor checkpoint in `shutdown_requested`, release every lease.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Asks the worker to stop gracefully (see [`Self::shutdown`]) and
    /// waits until it has: what became of its shards and leases. Waits
    /// forever for a handle of a worker that never runs.
    pub async fn shutdown_and_wait(&self) -> ShutdownReport {
        self.shutdown();
        self.stopped().await
    }

    /// Waits until the worker has stopped, however it stopped, and
    /// returns its shutdown's report.
    pub async fn stopped(&self) -> ShutdownReport {
        self.stopped.wait().await
    }

    /// True once a shutdown was asked for (the worker may still be
    /// draining): readiness probes report "not ready" from then on.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// The worker's current status.
    pub fn status(&self) -> WorkerStatus {
        let mut status = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(live) = self
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            status.leases = live.snapshot();
        }
        status.consuming = self
            .consuming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        status
    }

    /// Records what the startup is waiting for (see
    /// [`WorkerStatus::starting`]), for wrappers that run startup steps of
    /// their own before the worker's (the `kcl` facade checks the streams
    /// and the lease table).
    pub fn report_starting(&self, why: impl Into<String>) {
        let why = why.into();
        self.update(|s| s.starting = Some(why));
    }

    fn update(&self, f: impl FnOnce(&mut WorkerStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// Pauses between startup attempts that failed in a way retrying can fix:
/// doubling from 200 ms, at most 10 s, jittered so a fleet restarting under
/// throttling does not retry in step.
const STARTUP_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));

/// Runs one startup step (`what`, for the status) until it succeeds or
/// fails in a way retrying cannot fix (`is_retryable` says which). Failures
/// retrying can fix (throttling, 5xx, a lost connection) are retried with
/// capped, jittered backoff while [`WorkerStatus::starting`] says why, so a
/// fleet restarting under throttling does not crash-loop. A shutdown asked
/// for through `handle` meanwhile ends it with `Ok(None)`.
pub async fn retry_startup<T, E, F, Fut>(
    handle: &WorkerHandle,
    what: &str,
    is_retryable: impl Fn(&E) -> bool,
    mut step: F,
) -> Result<Option<T>, E>
where
    E: std::error::Error,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let shutdown = handle.shutdown.clone();
    let mut pauses = STARTUP_BACKOFF.pauses();
    let mut attempts = 0u32;
    loop {
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            outcome = step() => outcome,
        };
        let e = match outcome {
            Ok(done) => return Ok(Some(done)),
            Err(e) if is_retryable(&e) => e,
            Err(e) => return Err(e),
        };
        attempts += 1;
        // The error and its first cause: deeper causes are the SDK's own,
        // in the log line's `error` field.
        let brief = match e.source() {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        };
        let why = format!("{what} failed ({brief}), attempt {attempts}; retrying");
        warn!(error = ?e, "{why}");
        handle.report_starting(why);
        let pause = pauses.next_or_max();
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// Consumes every shard of its streams together with the other workers of
/// the same application.
pub struct Worker {
    config: WorkerConfig,
    store: Arc<dyn LeaseStore>,
    source: Arc<dyn ShardSource>,
    factory: Arc<dyn ProcessorFactory>,
    handle: WorkerHandle,
    tracker: Option<Arc<dyn StreamTracker>>,
    observer: Option<Arc<dyn Observer>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.config.lease.worker_id())
            .field("streams", &self.config.streams)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker on the given store, source and processor factory.
    pub fn new(
        config: WorkerConfig,
        store: Arc<dyn LeaseStore>,
        source: Arc<dyn ShardSource>,
        factory: Arc<dyn ProcessorFactory>,
    ) -> Self {
        Worker {
            config,
            store,
            source,
            factory,
            handle: WorkerHandle::new(),
            tracker: None,
            observer: None,
        }
    }

    /// Tells `observer` of every lease event of this worker (takes,
    /// steals, handoffs, renewals, losses: see [`crate::observe::Event`]),
    /// besides counting it and emitting its metric.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Lets `tracker` add and remove streams while the worker runs.
    pub fn with_stream_tracker(mut self, tracker: Arc<dyn StreamTracker>) -> Self {
        self.tracker = Some(tracker);
        self
    }

    /// Uses `handle` (made earlier with [`WorkerHandle::new`]) instead of a
    /// fresh one.
    pub fn with_handle(mut self, handle: WorkerHandle) -> Self {
        self.handle = handle;
        self
    }

    /// A handle to ask for shutdown and read the status.
    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }

    /// Runs until [`WorkerHandle::shutdown`] is called or `signal`
    /// completes, then shuts down gracefully.
    pub async fn run_until(
        self,
        signal: impl Future<Output = ()> + Send,
    ) -> Result<(), WorkerError> {
        let handle = self.handle.clone();
        let shutdown = self.handle.shutdown.clone();
        tokio::pin!(signal);
        let run = self.run();
        tokio::pin!(run);
        tokio::select! {
            result = &mut run => return result,
            _ = &mut signal => handle.shutdown(),
            _ = shutdown.cancelled() => {}
        }
        run.await
    }

    /// Runs until [`WorkerHandle::shutdown`] is called.
    pub async fn run(self) -> Result<(), WorkerError> {
        let span = info_span!("worker", worker = %self.config.lease.worker_id());
        let stopped = self.handle.stopped.clone();
        let result = self.run_inner().instrument(span).await;
        // Published however the run ended, so no waiter waits forever.
        stopped.publish(result.as_ref().copied().unwrap_or_default());
        result.map(|_| ())
    }

    async fn run_inner(self) -> Result<ShutdownReport, WorkerError> {
        let config = &self.config;
        // Every call of consumers, checkpoints and syncs is bounded; the
        // coordinator bounds its own (inside each lease's deadline).
        let bounded: Arc<dyn LeaseStore> = Arc::new(TimeoutStore::new(
            Arc::clone(&self.store),
            config.lease.store_timeout(),
        ));
        // Startup checks: every stream exists, and the first sync creates the
        // leases before the taker's first tick looks for them. What retrying
        // can fix (throttling, 5xx, a lost connection) is retried with capped
        // backoff while the status says why; the rest ends the run.
        for spec in &config.streams {
            let what = format!("the first shard sync of stream {:?}", spec.name);
            let synced = retry_startup(&self.handle, &what, SyncError::is_retryable, || {
                self.sync(&bounded, spec)
            })
            .await
            .map_err(|e| sync_failed(e, spec))?;
            if synced.is_none() {
                info!("shut down during startup");
                return Ok(ShutdownReport {
                    graceful: true,
                    ..ShutdownReport::default()
                });
            }
        }
        // The stream list can change at runtime (a tracker); the taker, the
        // sync loop and consumer setup all read the live list.
        let live: LiveStreams = Arc::new(RwLock::new(config.streams.clone()));
        let filter_streams = Arc::clone(&live);
        let filter: LeaseFilter =
            Arc::new(move |l: &Lease| read(&filter_streams).iter().any(|s| s.layout.owns(l)));
        let (coordinator, mut events) = LeaseCoordinator::start_filtered(
            Arc::clone(&self.store),
            config.lease.clone(),
            Some(filter),
            self.observer.clone(),
        );
        *self.handle.leases.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(coordinator.stats_source());
        self.handle.update(|s| {
            s.ready = true;
            s.starting = None;
        });
        info!(streams = ?config.streams.iter().map(|s| &s.name).collect::<Vec<_>>(), "worker started");

        let sync_stop = CancellationToken::new();
        let (removed_tx, mut removed_rx) = mpsc::channel::<StreamSpec>(64);
        // Aborted if this future is dropped, like every task the worker owns.
        let sync_now = Arc::new(tokio::sync::Notify::new());
        let sync_task = AbortOnDropHandle::new(tokio::spawn(
            self.sync_loop(
                coordinator.signals(),
                Arc::clone(&bounded),
                sync_stop.clone(),
                Arc::clone(&live),
                removed_tx,
                Arc::clone(&sync_now),
            )
            .in_current_span(),
        ));

        let mut setups: HashMap<LeaseLayout, Arc<ConsumerSetup>> = HashMap::new();
        let mut consumers: JoinSet<(String, ConsumerExit)> = JoinSet::new();
        let mut running = Running::new(&self.handle);
        let shutdown = self.handle.shutdown.clone();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                event = events.recv() => match event {
                    Some(LeaseEvent::Acquired(lease)) => {
                        let held = lease.lease();
                        let Some(spec) = read(&live).iter().find(|s| s.layout.owns(&held)).cloned() else {
                            // Its stream was removed since the take: give it back.
                            release(&coordinator, &lease).await;
                            continue;
                        };
                        let setup = setups
                            .entry(spec.layout.clone())
                            .or_insert_with(|| self.consumer_setup(&spec, &bounded, &sync_now));
                        let key = lease.key().to_owned();
                        let stop = CancellationToken::new();
                        let span = info_span!("shard", stream = %setup.stream, shard = %held.shard_id);
                        let setup = Arc::clone(setup);
                        let (task_key, task_stop, tenure) = (key.clone(), stop.clone(), lease.clone());
                        let task = consumers.spawn(
                            async move { (task_key, consumer::run(setup, lease, task_stop).await) }
                                .instrument(span),
                        );
                        running.insert(task.id(), tenure, spec.layout, stop);
                        self.publish(&coordinator);
                    }
                    Some(_) => self.publish(&coordinator),
                    None => break,
                },
                Some(done) = consumers.join_next_with_id() => {
                    self.consumer_done(&coordinator, &mut running, done).await;
                }
                Some(spec) = removed_rx.recv() => {
                    // Processors of a removed stream checkpoint and stop; their
                    // leases are released when they are done.
                    let stopped = running.retire(&spec.layout);
                    info!(stream = %spec.name, consumers = stopped, "stream removed; stopping its consumers");
                }
            }
        }

        // Graceful shutdown: no new leases, then every processor gets its
        // chance to checkpoint while the leases are still renewed, then the
        // leases are released so peers take them on their next tick.
        info!("shutting down: stopping the lease taker and the processors");
        coordinator.stop_taking();
        sync_stop.cancel();
        running.stop_all();
        let deadline = tokio::time::sleep(config.shutdown_timeout);
        tokio::pin!(deadline);
        let mut report = ShutdownReport {
            graceful: true,
            ..ShutdownReport::default()
        };
        loop {
            tokio::select! {
                done = consumers.join_next_with_id() => match done {
                    Some(done) => {
                        report.drained += 1;
                        self.consumer_done(&coordinator, &mut running, done).await;
                    }
                    None => break,
                },
                _ = &mut deadline => {
                    report.cut_off = consumers.len();
                    warn!(remaining = consumers.len(), "processors did not finish within the shutdown timeout; stopping them");
                    consumers.shutdown().await;
                    break;
                }
                // Keep the event channel flowing so no coordinator task waits on it.
                Some(_) = events.recv() => {}
            }
        }
        let _ = sync_task.await;
        let released = coordinator.shutdown(ShutdownMode::Release).await;
        report.released = released.released;
        report.handed_off = released.handed_off;
        report.release_failures = released.failed;
        self.handle.update(|s| s.ready = false);
        self.handle
            .consuming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        info!(?report, "worker stopped");
        Ok(report)
    }

    async fn consumer_done(
        &self,
        coordinator: &LeaseCoordinator,
        running: &mut Running,
        done: Result<(tokio::task::Id, (String, ConsumerExit)), tokio::task::JoinError>,
    ) {
        match done {
            Ok((id, (key, exit))) => {
                // Every action below applies to the tenure this consumer ran
                // with, not to a later one of the same lease.
                let Some(entry) = running.remove(id) else {
                    return;
                };
                let lease = &entry.lease;
                match exit {
                    ConsumerExit::ShutDown if entry.retired => release(coordinator, lease).await,
                    ConsumerExit::ShardEnded => {
                        self.handle.update(|s| s.shards_finished += 1);
                        if let Err(e) = coordinator.shard_finished(lease).await {
                            warn!(lease = %key, error = %e, "releasing a finished shard's lease failed; it expires instead");
                        }
                    }
                    ConsumerExit::Release => release(coordinator, lease).await,
                    ConsumerExit::Unreadable => {
                        let limit = self.config.max_read_failure_time;
                        if let Err(e) = coordinator.give_back_unreadable(lease, limit).await {
                            warn!(lease = %key, error = %e, "releasing an unreadable shard's lease failed; it expires instead");
                        }
                    }
                    ConsumerExit::HandedOff => {
                        if let Err(e) = coordinator.complete_handoff(lease).await {
                            warn!(lease = %key, error = %e, "completing the handoff failed; the new owner will force it");
                        }
                    }
                    // The consumer stopped on its own: its tenure is not
                    // renewed on without a reader (invariant 12).
                    ConsumerExit::LeaseLost => coordinator.consumer_stopped(lease).await,
                    // Released with every other lease by the shutdown.
                    ConsumerExit::ShutDown => {}
                }
            }
            Err(e) => {
                // A processor panicked. Its shard is given back, to be
                // retried from the last checkpoint, rather than left held
                // and unprocessed.
                if let Some(entry) = running.remove(e.id()) {
                    error!(lease = %entry.lease.key(), error = %e, "a shard consumer panicked; releasing its lease");
                    metrics::counter!(CONSUMER_PANICS, "worker" => self.config.lease.worker_id().to_owned())
                        .increment(1);
                    release(coordinator, &entry.lease).await;
                }
            }
        }
        self.publish(coordinator);
    }

    fn consumer_setup(
        &self,
        spec: &StreamSpec,
        store: &Arc<dyn LeaseStore>,
        sync_now: &Arc<tokio::sync::Notify>,
    ) -> Arc<ConsumerSetup> {
        let config = &self.config;
        Arc::new(ConsumerSetup {
            store: Arc::clone(store),
            source: Arc::clone(&self.source),
            factory: Arc::clone(&self.factory),
            stream: spec.name.clone(),
            layout: spec.layout.clone(),
            worker_id: config.lease.worker_id().to_owned(),
            initial: config.initial_position,
            policy: config.failure_policy.clone(),
            parallelism: config.parallelism_per_shard,
            checkpoint_policy: config.checkpoint_policy,
            parent_poll_interval: config.parent_poll_interval,
            max_read_failure_time: config.max_read_failure_time,
            progress: self.handle.progress.clone(),
            call_limits: consumer::CallLimits {
                warn_after: config.processor_warn_after,
                timeout: config.processor_timeout,
            },
            // Exact doubling from 100 ms: the pace of a failing shard is
            // what tests count.
            backoff: Backoff::new(Duration::from_millis(100), config.max_backoff).without_jitter(),
            slots: Arc::default(),
            sync_now: Arc::clone(sync_now),
        })
    }

    fn publish(&self, coordinator: &LeaseCoordinator) {
        let leases = coordinator.stats();
        self.handle.update(|s| s.leases = leases);
    }

    async fn sync(&self, store: &Arc<dyn LeaseStore>, spec: &StreamSpec) -> Result<(), SyncError> {
        shard_sync::sync_shards(
            self.source.as_ref(),
            store.as_ref(),
            &spec.name,
            &spec.layout,
            self.config.initial_position,
        )
        .await
        .map(|_| ())
    }

    fn sync_loop(
        &self,
        signals: FleetSignals,
        store: Arc<dyn LeaseStore>,
        stop: CancellationToken,
        live: LiveStreams,
        removed_tx: mpsc::Sender<StreamSpec>,
        now: Arc<tokio::sync::Notify>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let source = Arc::clone(&self.source);
        let tracker = self.tracker.clone();
        let interval = self.config.shard_sync_interval;
        let initial = self.config.initial_position;
        let retention = self.config.completed_lease_retention;
        let policy = self.config.removed_stream_policy;
        async move {
            let mut cleanups: HashMap<LeaseLayout, LeaseCleanup> = HashMap::new();
            let mut removed_at: HashMap<LeaseLayout, (String, Instant)> = HashMap::new();
            loop {
                let jittered = interval.mul_f64(rand::rng().random_range(0.75..=1.25));
                let mut asked = tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(jittered) => false,
                    // A consumer needs a lease only the sync creates.
                    _ = now.notified() => true,
                };
                if let Some(tracker) = &tracker {
                    match tracker.streams().await {
                        Ok(wanted) => {
                            let (removed, added) = update_streams(&live, wanted);
                            // A stream new to this worker needs its leases
                            // now, whoever leads the fleet's rounds.
                            asked |= added;
                            for spec in removed {
                                removed_at.insert(
                                    spec.layout.clone(),
                                    (spec.name.clone(), Instant::now()),
                                );
                                let _ = removed_tx.send(spec).await;
                            }
                            for spec in read(&live).iter() {
                                removed_at.remove(&spec.layout);
                            }
                        }
                        Err(e) => {
                            warn!(error = %e, "the stream tracker failed; keeping the current streams")
                        }
                    }
                }
                // One round per fleet: the periodic sync and cleanup run on
                // the leader only; a sync a consumer asked for (its shard
                // ended, its children need leases) runs here at once.
                let leader = signals.is_sync_leader();
                if !leader && !asked {
                    continue;
                }
                // One scan serves every stream of this worker.
                let leases: Vec<Lease> = match store.scan().try_collect::<Vec<_>>().await {
                    Ok(pages) => pages.into_iter().flatten().collect(),
                    Err(e) => {
                        warn!(error = %e, "shard sync could not read the lease table; retrying next interval");
                        continue;
                    }
                };
                if leader {
                    signals.saw_table(&leases);
                }
                let streams = read(&live).clone();
                let mut created = 0;
                for spec in &streams {
                    let synced = shard_sync::sync_shards_from(
                        source.as_ref(),
                        store.as_ref(),
                        &spec.name,
                        &spec.layout,
                        initial,
                        &leases,
                    )
                    .await;
                    match synced {
                        Ok(report) => {
                            created += report.created;
                            if !leader {
                                continue;
                            }
                            let cleanup = cleanups
                                .entry(spec.layout.clone())
                                .or_insert_with(|| LeaseCleanup::new(retention));
                            cleanup
                                .run(store.as_ref(), &spec.layout, &report.shards, &report.leases)
                                .await;
                        }
                        Err(e) => {
                            warn!(stream = %spec.name, error = %e, "shard sync failed; retrying next interval")
                        }
                    }
                }
                if created > 0 {
                    signals.leases_created();
                }
                if !leader {
                    continue;
                }
                if let RemovedStreamPolicy::DeleteAfter(delay) = policy {
                    delete_removed_leases(store.as_ref(), &mut removed_at, delay).await;
                }
            }
        }
    }
}

type LiveStreams = Arc<RwLock<Vec<StreamSpec>>>;

fn read(live: &LiveStreams) -> std::sync::RwLockReadGuard<'_, Vec<StreamSpec>> {
    live.read().unwrap_or_else(|e| e.into_inner())
}

/// Replaces the live stream list; returns the streams that went away.
/// Replaces the live streams; returns the removed ones and whether any
/// was added.
fn update_streams(live: &LiveStreams, wanted: Vec<StreamSpec>) -> (Vec<StreamSpec>, bool) {
    let mut current = live.write().unwrap_or_else(|e| e.into_inner());
    let removed: Vec<StreamSpec> = current
        .iter()
        .filter(|s| !wanted.contains(s))
        .cloned()
        .collect();
    let mut added = false;
    for spec in wanted.iter().filter(|s| !current.contains(s)) {
        info!(stream = %spec.name, "stream added");
        added = true;
    }
    *current = wanted;
    (removed, added)
}

/// Deletes the released leases of streams removed at least `delay` ago
/// (each guarded by its counter); leases still held are left for their
/// holder to release first.
async fn delete_removed_leases(
    store: &dyn LeaseStore,
    removed_at: &mut HashMap<LeaseLayout, (String, Instant)>,
    delay: Duration,
) {
    let due: Vec<(LeaseLayout, String)> = removed_at
        .iter()
        .filter(|(_, (_, at))| at.elapsed() >= delay)
        .map(|(layout, (name, _))| (layout.clone(), name.clone()))
        .collect();
    if due.is_empty() {
        return;
    }
    let leases: Vec<Lease> = match store.scan().try_concat().await {
        Ok(leases) => leases,
        Err(e) => {
            warn!(error = %e, "scanning for leases of removed streams failed");
            return;
        }
    };
    for (layout, name) in due {
        let mine: Vec<&Lease> = leases.iter().filter(|l| layout.owns(l)).collect();
        let mut left = 0;
        for lease in &mine {
            if lease.owner.is_some() || lease.in_handoff() {
                left += 1;
                continue;
            }
            match store.delete(&lease.key, lease.counter).await {
                Ok(()) => {
                    info!(stream = %name, lease = %lease.key, "deleted a lease of a removed stream")
                }
                Err(_) => left += 1,
            }
        }
        if left == 0 {
            removed_at.remove(&layout);
        }
    }
}

/// The running consumers: task id to lease key, stream, and stop token.
#[derive(Debug)]
struct Running {
    by_task: HashMap<tokio::task::Id, RunningConsumer>,
    /// The handle's consumer counts per lease key.
    keys: Arc<Mutex<BTreeMap<String, usize>>>,
}

#[derive(Debug)]
struct RunningConsumer {
    lease: LeaseHandle,
    layout: LeaseLayout,
    stop: CancellationToken,
    /// Stopped because its stream was removed: release the lease after.
    retired: bool,
}

impl Running {
    fn new(handle: &WorkerHandle) -> Self {
        Running {
            by_task: HashMap::new(),
            keys: Arc::clone(&handle.consuming),
        }
    }
    fn insert(
        &mut self,
        id: tokio::task::Id,
        lease: LeaseHandle,
        layout: LeaseLayout,
        stop: CancellationToken,
    ) {
        *self
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(lease.key().to_owned())
            .or_default() += 1;
        self.by_task.insert(
            id,
            RunningConsumer {
                lease,
                layout,
                stop,
                retired: false,
            },
        );
    }
    fn remove(&mut self, id: tokio::task::Id) -> Option<RunningConsumer> {
        let removed = self.by_task.remove(&id)?;
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = keys.get_mut(removed.lease.key()) {
            *n -= 1;
            if *n == 0 {
                keys.remove(removed.lease.key());
            }
        }
        Some(removed)
    }
    fn stop_all(&self) {
        for c in self.by_task.values() {
            c.stop.cancel();
        }
    }
    /// Stops the consumers of one stream; returns how many.
    fn retire(&mut self, layout: &LeaseLayout) -> usize {
        let mut n = 0;
        for c in self.by_task.values_mut().filter(|c| &c.layout == layout) {
            c.retired = true;
            c.stop.cancel();
            n += 1;
        }
        n
    }
}

/// The worker's error for a failed startup sync of `spec`.
fn sync_failed(error: SyncError, spec: &StreamSpec) -> WorkerError {
    match error {
        SyncError::Source(SourceError::StreamNotFound { stream }) => {
            WorkerError::StreamNotFound { stream }
        }
        SyncError::Source(source) => WorkerError::Source {
            stream: spec.name.clone(),
            source,
        },
        SyncError::Store(e) => WorkerError::Store(e),
    }
}

async fn release(coordinator: &LeaseCoordinator, lease: &LeaseHandle) {
    if let Err(e) = coordinator.release(lease).await {
        warn!(lease = %lease.key(), error = %e, "releasing the lease failed; it will expire instead");
    }
}
