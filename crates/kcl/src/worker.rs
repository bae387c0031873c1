//! [`Worker`]: a built worker, which checks its streams and lease table
//! at startup, runs the engine with the DynamoDB store and the Kinesis
//! source, and serves its endpoints beside it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kcl_core::config::LeaseConfig;
use kcl_core::observe::Observer;
use kcl_core::processor::ProcessorFactory;
use kcl_core::source::ShardSource;
use kcl_core::store::LeaseStore;
use kcl_core::store::metered::{MeteredStore, StoreStats};
use kcl_core::worker::{StreamSpec, WorkerConfigBuilder, WorkerError, WorkerHandle, retry_startup};
use kcl_dynamodb::table::workers_table_for;
use kcl_dynamodb::{
    DynamoDbLeaseStore, TableOptions, claim_stream, ensure_table, ensure_workers_table,
};
use kcl_kinesis::KinesisShardSource;
use tracing::{info, warn};

use crate::error::{Error, Repr};
use crate::streams::{NameTracker, StreamNames, StreamResolver};

/// A kcl worker: consumes its streams' shards together with the other
/// workers of the same application name.
pub struct Worker {
    pub(crate) app: String,
    pub(crate) table: String,
    pub(crate) streams: Vec<String>,
    pub(crate) resolver: Arc<StreamResolver>,
    pub(crate) dynamodb: aws_sdk_dynamodb::Client,
    pub(crate) table_options: TableOptions,
    /// Validated at `build()`; the streams are added at `run()`, once
    /// their lease layouts are known.
    pub(crate) engine: WorkerConfigBuilder,
    pub(crate) lease: LeaseConfig,
    /// Built (and so validated) at `build()`; kept to shut it down after
    /// the worker stopped.
    pub(crate) source: KinesisShardSource,
    pub(crate) factory: Arc<dyn ProcessorFactory>,
    pub(crate) handle: WorkerHandle,
    pub(crate) store_stats: Arc<StoreStats>,
    pub(crate) tracker: Option<StreamNames>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    /// The health and metrics endpoints, bound at `build()`.
    pub(crate) endpoints: Endpoints,
    pub(crate) liveness_stall_bound: Option<Duration>,
    /// Publishes the metrics to CloudWatch while the worker runs.
    #[cfg(feature = "cloudwatch")]
    pub(crate) cloudwatch: Option<crate::observability::cloudwatch::CloudWatchPublisher>,
}

/// A worker's endpoints: probes alone, and probes with metrics; and what
/// else runs beside the worker for as long as it does.
#[derive(Debug, Default)]
pub(crate) struct Endpoints {
    pub(crate) health: Option<crate::observability::Endpoint>,
    pub(crate) metrics: Option<crate::observability::Endpoint>,
    /// Feature `otlp`: the process's OTLP exporter, run beside the worker.
    #[cfg(feature = "otlp")]
    pub(crate) otlp: Option<crate::observability::OtlpExporter>,
}

impl Endpoints {
    /// Whether nothing runs beside the worker.
    fn is_empty(&self) -> bool {
        let empty = self.health.is_none() && self.metrics.is_none();
        #[cfg(feature = "otlp")]
        let empty = empty && self.otlp.is_none();
        empty
    }
}

/// The endpoints a builder was asked for, bound once every other setting
/// proved valid.
pub(crate) struct EndpointSettings {
    pub(crate) health_addr: Option<std::net::SocketAddr>,
    #[cfg(feature = "prometheus")]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    #[cfg(feature = "otlp")]
    pub(crate) otlp: Option<crate::observability::OtlpMetrics>,
}

impl EndpointSettings {
    /// Binds the sockets, then installs the OTLP exporter of worker
    /// `worker_id` of `app`.
    pub(crate) fn bind(self, app: &str, worker_id: &str) -> Result<Endpoints, Error> {
        #[cfg(not(feature = "otlp"))]
        let _ = (app, worker_id);
        Ok(Endpoints {
            health: self
                .health_addr
                .map(crate::observability::Endpoint::health)
                .transpose()?,
            #[cfg(feature = "prometheus")]
            metrics: self
                .metrics_addr
                .map(crate::observability::Endpoint::metrics)
                .transpose()?,
            #[cfg(not(feature = "prometheus"))]
            metrics: None,
            // After the sockets: installing the recorder cannot be
            // undone, so it comes once everything else succeeded.
            #[cfg(feature = "otlp")]
            otlp: self
                .otlp
                .map(|otlp| crate::observability::install_otlp(otlp, app, worker_id))
                .transpose()?,
        })
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("application", &self.app)
            .field("table", &self.table)
            .field("streams", &self.streams)
            .field("worker_id", &self.lease.worker_id())
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A handle to stop the worker gracefully and read its status.
    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }

    /// This worker's id, as written in the lease table.
    pub fn worker_id(&self) -> &str {
        self.lease.worker_id()
    }

    /// Counters of the worker's lease-table calls (calls, errors, consumed
    /// capacity per operation).
    pub fn store_stats(&self) -> Arc<StoreStats> {
        Arc::clone(&self.store_stats)
    }

    /// The address of the metrics endpoint (see
    /// [`WorkerBuilder::serve_metrics`](crate::WorkerBuilder::serve_metrics)),
    /// with the port actually bound.
    #[cfg(feature = "prometheus")]
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.endpoints.metrics.as_ref().map(|m| m.local_addr())
    }

    /// The publisher of this worker's CloudWatch metrics (see
    /// [`WorkerBuilder::publish_cloudwatch_metrics`](crate::WorkerBuilder::publish_cloudwatch_metrics)):
    /// its
    /// [`stats`](crate::observability::cloudwatch::CloudWatchPublisher::stats)
    /// say what was sent, retried, failed and dropped.
    #[cfg(feature = "cloudwatch")]
    pub fn cloudwatch_publisher(
        &self,
    ) -> Option<crate::observability::cloudwatch::CloudWatchPublisher> {
        self.cloudwatch.clone()
    }

    /// The address of the health endpoint (see
    /// [`WorkerBuilder::serve_health`](crate::WorkerBuilder::serve_health)),
    /// with the port actually bound.
    pub fn health_addr(&self) -> Option<std::net::SocketAddr> {
        self.endpoints.health.as_ref().map(|m| m.local_addr())
    }

    /// The process's OTLP exporter, if this worker exports through it
    /// (see
    /// [`WorkerBuilder::export_otlp_metrics`](crate::WorkerBuilder::export_otlp_metrics)):
    /// its
    /// [`stats`](crate::observability::OtlpExporter::stats) say how the
    /// exports go.
    #[cfg(feature = "otlp")]
    pub fn otlp_exporter(&self) -> Option<crate::observability::OtlpExporter> {
        self.endpoints.otlp.clone()
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
        // Waiters get the report once the run is over, the stream
        // consumers' deregistration and the last metrics flush included:
        // a `main` that returns after `shutdown_and_wait` cut those short.
        let _hold = self.handle.hold_report();
        // Boxed: the run's state machine nests deep enough that a binary
        // awaiting it in its own `async fn main` overflowed the compiler's
        // layout query depth (`kcl-app` did).
        #[cfg(feature = "cloudwatch")]
        if let Some(publisher) = self.cloudwatch.take() {
            // Flushes while the worker runs, and once more after it stopped
            // (what the drain recorded included).
            return Box::pin(publisher.run_beside(self.run_serving(signal))).await;
        }
        Box::pin(self.run_serving(signal)).await
    }

    /// The worker with its endpoints, if any.
    async fn run_serving(mut self, signal: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let endpoints = std::mem::take(&mut self.endpoints);
        if endpoints.is_empty() {
            return self.run_worker(signal).await;
        }
        // Served next to the worker, not spawned: they answer from the
        // first startup check (503) to the end of the drain, and stop when
        // the worker has.
        let probes = Arc::new(self.probes());
        let stop = tokio_util::sync::CancellationToken::new();
        let worker = async {
            let result = self.run_worker(signal).await;
            stop.cancel();
            result
        };
        let serve = |e: Option<crate::observability::Endpoint>| {
            let (probes, stop) = (Arc::clone(&probes), stop.clone());
            async move {
                if let Some(e) = e {
                    e.serve(probes, stop).await;
                }
            }
        };
        // A task of its own, so that encoding an export never delays the
        // worker's future; aborted if this future is dropped. It exports
        // once more after the worker stopped.
        #[cfg(feature = "otlp")]
        let export = {
            let task = endpoints.otlp.map(|exporter| {
                let stop = stop.clone();
                tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
                    exporter.run_until(stop.cancelled_owned()).await;
                }))
            });
            async move {
                if let Some(task) = task {
                    // A panic in it is the exporter's alone: the worker's
                    // result stands.
                    let _ = task.await;
                }
            }
        };
        #[cfg(not(feature = "otlp"))]
        let export = async {};
        let (result, (), (), ()) = tokio::join!(
            worker,
            serve(endpoints.health),
            serve(endpoints.metrics),
            export
        );
        result
    }

    /// What the endpoints answer from.
    fn probes(&self) -> crate::observability::Probes {
        crate::observability::Probes {
            worker: self.handle.clone(),
            worker_id: self.lease.worker_id().to_owned(),
            readiness: crate::observability::Probe::new(
                self.handle.clone(),
                Arc::clone(&self.store_stats),
                crate::observability::readiness_window(&self.lease),
            ),
            liveness: crate::observability::Liveness::new(
                self.handle.clone(),
                self.liveness_stall_bound,
            ),
        }
    }

    /// The startup steps before the engine's own: every stream exists (its
    /// lease layout resolved), and the lease table exists with the right
    /// schema. Streams first: a misspelt stream must not leave an empty
    /// table. Failures that retrying can fix are retried with capped
    /// backoff while the readiness probe says why. `None` if a shutdown
    /// came first.
    async fn prepare(&self) -> Result<Option<Vec<StreamSpec>>, Error> {
        let mut specs = Vec::with_capacity(self.streams.len());
        for stream in &self.streams {
            let spec = retry_startup(
                &self.handle,
                "describing the stream",
                Error::is_retryable,
                || self.resolver.spec(stream),
            )
            .await?;
            let Some(spec) = spec else { return Ok(None) };
            specs.push(spec);
        }
        let checked = retry_startup(
            &self.handle,
            "checking the lease table",
            Error::is_retryable,
            || async {
                ensure_table(&self.dynamodb, &self.table, self.table_options.clone())
                    .await
                    .map_err(|source| Repr::LeaseTable {
                        table: self.table.clone(),
                        source,
                    })?;
                // Every kcl worker beats its liveness record, renewing per
                // lease too (kcl peers judge its leases by it).
                let workers = workers_table_for(&self.table);
                ensure_workers_table(&self.dynamodb, &workers, self.table_options.clone())
                    .await
                    .map_err(|source| Repr::LeaseTable {
                        table: workers.clone(),
                        source,
                    })?;
                // Multi-stream keys name their stream; single-stream keys
                // are bare shard ids, so the table says which stream it is.
                if let [stream] = self.streams.as_slice()
                    && !self.resolver.multi_stream
                    && let Some(identifier) = self.resolver.known_identifier(stream)
                {
                    claim_stream(&self.dynamodb, &self.table, &workers, &identifier)
                        .await
                        .map_err(|source| Repr::LeaseTable {
                            table: self.table.clone(),
                            source,
                        })?;
                }
                Ok(())
            },
        )
        .await?;
        Ok(checked.map(|()| specs))
    }

    async fn run_worker(self, signal: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let handle = self.handle.clone();
        let result = self.run_engine(signal).await;
        // The engine publishes its report however it stopped; a run that
        // ended before the engine started (a shutdown during the startup
        // checks, a startup error) publishes one here, or
        // `shutdown_and_wait` waited forever.
        handle.stopped_before_running(result.is_ok());
        result
    }

    /// The startup checks, then the engine.
    async fn run_engine(self, signal: impl Future<Output = ()> + Send) -> Result<(), Error> {
        tokio::pin!(signal);
        // Startup steps retry what retrying can fix, so they must notice a
        // shutdown too: a SIGTERM during a throttling storm ends the run.
        let prepared = tokio::select! {
            prepared = self.prepare() => prepared?,
            _ = &mut signal => None,
        };
        let Some(specs) = prepared else {
            info!("shut down during startup");
            return Ok(());
        };
        let config = specs
            .into_iter()
            .fold(self.engine, WorkerConfigBuilder::stream)
            .build()?;
        let store: Arc<dyn LeaseStore> = Arc::new(MeteredStore::with_stats(
            DynamoDbLeaseStore::new(self.dynamodb.clone(), &self.table)
                .with_stats(Arc::clone(&self.store_stats)),
            Arc::clone(&self.store_stats),
        ));
        let source: Arc<dyn ShardSource> = Arc::new(self.source.clone());
        info!(application = %self.app, table = %self.table, worker = %config.lease().worker_id(), "starting kcl worker");
        let mut worker = kcl_core::worker::Worker::new(config, store, source, self.factory)
            .with_handle(self.handle);
        if let Some(observer) = self.observer {
            worker = worker.with_observer(observer);
        }
        if let Some(names) = self.tracker {
            worker = worker.with_stream_tracker(Arc::new(NameTracker {
                names,
                resolver: Arc::clone(&self.resolver),
            }));
        }
        let result = worker.run_until(&mut signal).await;
        // After the worker: no reader subscribes any more.
        if let Err(e) = self.source.shutdown().await {
            warn!(error = %e, "deregistering the stream consumer failed; it stays registered");
        }
        result.map_err(|e| match e {
            WorkerError::StreamNotFound { stream } => Repr::StreamNotFound { stream }.into(),
            other => Repr::Worker(other).into(),
        })
    }
}
