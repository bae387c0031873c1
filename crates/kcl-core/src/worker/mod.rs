//! The worker engine: the lease coordinator, the shard sync loop and one
//! consumer per held lease, with a graceful shutdown.
//!
//! Store- and source-agnostic: the `kcl` crate wires it to DynamoDB and
//! Kinesis; tests wire it to the in-memory store and source.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, info, info_span, warn};

use crate::backoff::Backoff;
use crate::checkpointer::CheckpointPacer;
use crate::consumer::{self, ConsumerExit, ConsumerSetup, ShardSlots};
use crate::lease::{Lease, LeaseLayout};
use crate::leases::{FleetSignals, LeaseCoordinator, LeaseEvent, LeaseFilter, LeaseHandle};
use crate::observe::Observer;
use crate::processor::ProcessorFactory;
use crate::shard_series;
use crate::shard_sync::{self, SyncError};
use crate::source::{ShardSource, SourceError};
use crate::store::timeout::TimeoutStore;
use crate::store::{LeaseStore, StoreError};

mod config;
mod ended;
mod handle;
mod running;
mod shutdown;
mod streams;
mod sync_loop;
pub use crate::progress::{CheckpointMark, Delivery, ProcessorCall, ShardProgress};
pub use config::{
    DEFAULT_MAX_READ_FAILURE_TIME, MAX_PARALLELISM_PER_SHARD, WorkerConfig, WorkerConfigBuilder,
    check_stream_names,
};
pub use handle::{WorkerHandle, WorkerStatus};
use running::Running;
pub use shutdown::{ReportHold, ShutdownReport};
use streams::{LiveStreams, read};
pub use streams::{RemovedStreamPolicy, StreamSpec, StreamTracker};
use sync_loop::SyncLoop;

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
    /// One of the worker's own tasks (the lease taker, the liveness
    /// watcher, the renewer, shard sync) panicked: a fault of kcl's, or of
    /// the application's `Observer` it called; the panic's message is in
    /// the log before it. The worker drained its shards and released its
    /// leases as in a shutdown; run it again.
    #[error("the worker's {task} panicked; its message is in the log")]
    TaskFailed {
        /// The task.
        task: &'static str,
    },
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
        // A run dropped before it ends (its task aborted, an outer
        // timeout) publishes nothing below: its waiters waited for good.
        let _dropped = shutdown::PublishOnDrop(stopped.clone());
        // Boxed: the run's state machine nests deep enough that a binary
        // awaiting it in its own `async fn main` overflowed the compiler's
        // layout query depth (`kcl-app` did).
        let result = Box::pin(self.run_inner()).instrument(span).await;
        // Published however the run ended, so no waiter waits forever: a
        // run that failed after its drain published that drain's counts.
        match result {
            Ok(report) => stopped.publish(report),
            Err(_) => stopped.publish_unless_published(ShutdownReport::default()),
        }
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
        if !self.first_syncs(&bounded).await? {
            info!("shut down during startup");
            return Ok(ShutdownReport {
                graceful: true,
                ..ShutdownReport::default()
            });
        }
        // The stream list can change at runtime (a tracker); the taker, the
        // sync loop and consumer setup all read the live list.
        let live: LiveStreams = Arc::new(RwLock::new(config.streams.clone()));
        let (coordinator, events) = self.start_coordinator(&live);

        let sync_stop = CancellationToken::new();
        let (removed_tx, removed) = mpsc::channel::<StreamSpec>(64);
        // Aborted if this future is dropped, like every task the worker owns.
        let sync_now = Arc::new(tokio::sync::Notify::new());
        let signals = coordinator.signals();
        let sync_loop = self.sync_loop(
            coordinator.signals(),
            Arc::clone(&bounded),
            sync_stop.clone(),
            Arc::clone(&live),
            removed_tx,
            Arc::clone(&sync_now),
        );
        let sync_task = AbortOnDropHandle::new(tokio::spawn(
            async move { signals.guard("shard sync", sync_loop).await }.in_current_span(),
        ));

        let mut session = Session {
            coordinator,
            events,
            removed,
            live,
            bounded,
            sync_now,
            setups: HashMap::new(),
            slots: Arc::default(),
            consumers: JoinSet::new(),
            running: Running::new(&self.handle),
            deferred: ended::Deferred::new(),
            cut: CancellationToken::new(),
        };
        self.serve(&mut session).await;
        let signals = session.coordinator.signals();

        // Graceful shutdown: no new leases, then every processor gets its
        // chance to checkpoint while the leases are still renewed, each
        // lease released as its shard drains (peers take it at once).
        info!("shutting down: stopping the lease taker and the processors");
        session.coordinator.stop_taking();
        sync_stop.cancel();
        session.running.stop_all();
        let mut report = self.drain(&mut session).await;
        // Its removed streams are read no more: a send waiting for room
        // fails instead of holding the sync loop (and this wait) for good.
        session.removed.close();
        let _ = sync_task.await;
        self.release_all(session, &mut report).await;
        // A task that panicked while serving, or during the drain: the
        // shards were still drained and released, and the report says so.
        match signals.failed_task() {
            Some(task) => {
                self.handle.stopped.publish(ShutdownReport {
                    graceful: false,
                    ..report
                });
                Err(WorkerError::TaskFailed { task })
            }
            None => Ok(report),
        }
    }

    /// Startup checks: every stream exists, and the first sync creates the
    /// leases before the taker's first tick looks for them. What retrying
    /// can fix (throttling, 5xx, a lost connection) is retried with capped
    /// backoff while the status says why; the rest ends the run. `false`
    /// if the worker was shut down meanwhile.
    async fn first_syncs(&self, bounded: &Arc<dyn LeaseStore>) -> Result<bool, WorkerError> {
        for spec in &self.config.streams {
            let what = format!("the first shard sync of stream {:?}", spec.name);
            let synced = retry_startup(&self.handle, &what, SyncError::is_retryable, || {
                self.sync(bounded, spec)
            })
            .await
            .map_err(|e| sync_failed(e, spec))?;
            if synced.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Starts the lease coordinator on the leases of the live streams, and
    /// marks the worker ready.
    fn start_coordinator(
        &self,
        live: &LiveStreams,
    ) -> (LeaseCoordinator, mpsc::Receiver<LeaseEvent>) {
        let config = &self.config;
        let filter_streams = Arc::clone(live);
        let filter: LeaseFilter =
            Arc::new(move |l: &Lease| read(&filter_streams).iter().any(|s| s.layout.owns(l)));
        let (coordinator, events) = LeaseCoordinator::start_filtered(
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
        (coordinator, events)
    }

    /// Runs consumers for the leases the coordinator acquires, until
    /// shutdown is asked for (or the coordinator's events end).
    /// Serves until shut down, or until one of the worker's tasks panicked.
    async fn serve(&self, s: &mut Session) {
        let shutdown = self.handle.shutdown.clone();
        loop {
            tokio::select! {
                biased;
                _ = s.coordinator.task_failed() => return,
                _ = shutdown.cancelled() => return,
                event = s.events.recv() => match event {
                    Some(LeaseEvent::Acquired(lease)) => self.start_consumer(s, lease).await,
                    Some(_) => self.publish(&s.coordinator),
                    None => return,
                },
                Some(done) = s.consumers.join_next_with_id() => {
                    let ended = self.consumer_ended(&s.coordinator, &mut s.running, &mut s.deferred, done);
                    for due in ended.map(|e| e.due).unwrap_or_default() {
                        let _ = self.settle(&s.coordinator, due).await;
                    }
                }
                Some(spec) = s.removed.recv() => {
                    // Processors of a removed stream checkpoint and stop; their
                    // leases are released when they are done.
                    let stopped = s.running.retire(&spec.layout);
                    // Its consumers keep their own reference; a stream
                    // added again gets a new one.
                    s.setups.remove(&spec.layout);
                    info!(stream = %spec.name, consumers = stopped, "stream removed; stopping its consumers");
                }
            }
        }
    }

    /// Spawns the consumer of an acquired lease, or gives the lease back if
    /// its stream was removed since the take.
    async fn start_consumer(&self, s: &mut Session, lease: LeaseHandle) {
        let held = lease.lease();
        let Some(spec) = read(&s.live)
            .iter()
            .find(|sp| sp.layout.owns(&held))
            .cloned()
        else {
            // Its stream was removed since the take: give it back.
            release(&s.coordinator, &lease).await;
            return;
        };
        let setup = s
            .setups
            .entry(spec.layout.clone())
            .or_insert_with(|| self.consumer_setup(&spec, &s.bounded, &s.sync_now, &s.slots));
        let key = lease.key().to_owned();
        let stops = consumer::Stops {
            cut: s.cut.clone(),
            ..consumer::Stops::default()
        };
        let running = stops.clone();
        let span = info_span!("shard", stream = %setup.stream, shard = %held.shard_id);
        let setup = Arc::clone(setup);
        let (task_key, tenure) = (key.clone(), lease.clone());
        // Held for the whole task, aborted or not: the shard's series go
        // once no consumer of the process records into them.
        let reading = shard_series::reading(&setup.stream, &held.shard_id);
        let task = s.consumers.spawn(
            async move {
                let _reading = reading;
                (task_key, consumer::run(setup, lease, stops).await)
            }
            .instrument(span),
        );
        s.running.insert(task.id(), tenure, spec.layout, &running);
        self.publish(&s.coordinator);
    }

    fn consumer_setup(
        &self,
        spec: &StreamSpec,
        store: &Arc<dyn LeaseStore>,
        sync_now: &Arc<tokio::sync::Notify>,
        slots: &Arc<ShardSlots>,
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
            checkpoints: CheckpointPacer::new(config.checkpoint_policy, store),
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
            slots: Arc::clone(slots),
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
        SyncLoop {
            source: Arc::clone(&self.source),
            tracker: self.tracker.clone(),
            interval: self.config.shard_sync_interval,
            initial: self.config.initial_position,
            retention: self.config.completed_lease_retention,
            policy: self.config.removed_stream_policy,
            signals,
            store,
            stop,
            live,
            removed_tx,
            now,
            cleanups: HashMap::new(),
            removed_at: HashMap::new(),
            follow_up: None,
            forget_check: None,
        }
        .run()
    }
}

/// What a started worker runs with: the coordinator and its events, the
/// streams, and the consumers with what they share.
struct Session {
    consumers: JoinSet<(String, ConsumerExit)>,
    events: mpsc::Receiver<LeaseEvent>,
    /// Streams the tracker removed, whose consumers stop.
    removed: mpsc::Receiver<StreamSpec>,
    live: LiveStreams,
    /// The store with every call bounded.
    bounded: Arc<dyn LeaseStore>,
    sync_now: Arc<tokio::sync::Notify>,
    /// One setup per stream, shared by its consumers; dropped when the
    /// stream is removed.
    setups: HashMap<LeaseLayout, Arc<ConsumerSetup>>,
    /// One consumer per shard at a time, whatever setup it came from: a
    /// stream removed and added again while its consumers finish gets a
    /// new setup, and its shards must still wait for those consumers.
    slots: Arc<ShardSlots>,
    running: Running,
    /// Lease actions put off until an older consumer of the lease ends.
    deferred: ended::Deferred,
    /// Cancelled at the shutdown timeout: every consumer's processor call
    /// under way is cut.
    cut: CancellationToken,
    /// Last, so that a session dropped without a shutdown (the run future
    /// dropped) aborts its consumers and drops every lease handle it has
    /// before the coordinator's drop releases the leases: released first,
    /// a peer took a shard whose processor call still ran.
    coordinator: LeaseCoordinator,
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
