//! kcl: consume every shard of one or more Kinesis streams across a fleet
//! of processes, coordinated through a DynamoDB lease table compatible with
//! the Java KCL's.
//!
//! ```no_run
//! use kcl::{Checkpointer, ProcessorError, RecordBatch, RecordProcessor, ShardContext, Worker};
//!
//! struct Printer;
//!
//! #[kcl::async_trait]
//! impl RecordProcessor for Printer {
//!     async fn process_records(
//!         &mut self,
//!         batch: &RecordBatch,
//!         checkpointer: &mut Checkpointer,
//!     ) -> Result<(), ProcessorError> {
//!         for record in &batch.records {
//!             println!("{} {:?}", record.partition_key, record.data);
//!         }
//!         checkpointer.checkpoint().await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> Result<(), kcl::Error> {
//! let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
//! let worker = Worker::builder("my-app")
//!     .stream("orders")
//!     .sdk_config(&sdk)
//!     .processor(|_shard: &ShardContext| Printer)
//!     .build()?;
//! worker.run_until(kcl::shutdown_signal()).await
//! # }
//! ```
//!
//! # Layout
//!
//! - [`Worker`] and [`WorkerBuilder`]: the application's entry point; every
//!   setting validated at `build()`.
//! - [`shutdown_signal`]: SIGTERM/SIGINT as a future, for ECS and Kubernetes.
//! - [`Settings`]: every builder setting from environment variables or a
//!   TOML file, with errors naming the variable.
//! - `observability`: `/healthz`, `/readyz` and `/status`, served by the
//!   worker (`WorkerBuilder::serve_health`), and with feature `prometheus`
//!   `/metrics` beside them (`WorkerBuilder::serve_metrics`).
//!   With feature `cloudwatch`, the metrics go to Amazon CloudWatch under
//!   the Java KCL's names (`WorkerBuilder::publish_cloudwatch_metrics`);
//!   with feature `otlp`, to an OpenTelemetry collector over OTLP/HTTP
//!   (`WorkerBuilder::export_otlp_metrics`).
//! - Re-exports of the processor API from `kcl-core`.
//!
//! The engine lives in `kcl-core` (no AWS dependency), the lease table in
//! `kcl-dynamodb`, and retrieval in `kcl-kinesis`.
#![deny(missing_docs)]

// The README's and the user guide's Rust blocks compile as doctests: the
// programs a user copies cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide.md")]
mod guide {}

mod builder;
mod error;
pub mod observability;
mod settings;
mod signal;
mod streams;
#[cfg(test)]
mod test_support;
mod worker;

pub use async_trait::async_trait;
pub use builder::WorkerBuilder;
pub use error::{Error, ErrorKind};
pub use kcl_core::checkpointer::{
    CheckpointError, CheckpointPolicy, Checkpointer, Position, SequenceNumber,
};
pub use kcl_core::leases::EndReason;
/// Every `kcl_*` metric's name, kind, labels and description, declared once
/// (docs/metrics.md's tables and the Prometheus help lines come from it).
pub use kcl_core::metric_names;
/// The lease engine's typed events, for [`WorkerBuilder::observer`].
pub mod observe {
    pub use kcl_core::observe::{Acquisition, Event, Observer};
}
pub use kcl_core::poison::{
    CannotStore, FailedRecord, FailureDestination, FailureReason, PoisonPolicy,
};
pub use kcl_core::processor::{
    FailurePolicy, InitializeInput, Lane, ProcessorError, ProcessorFactory, RecordBatch,
    RecordProcessor, ShardContext,
};
pub use kcl_core::source::InitialPosition;
pub use kcl_core::worker::{
    DEFAULT_MAX_READ_FAILURE_TIME, RemovedStreamPolicy, ShutdownReport, WorkerHandle, WorkerStatus,
};
pub use kcl_core::{Balance, Checkpoint, ConfigError, LeaseRenewal, Record};
pub use kcl_dynamodb::{
    Capacity, DynamoDbDestination, ExactlyOnce, TableCreation, TableOptions, Transaction,
    TransactionError,
};
pub use kcl_kinesis::{
    DeadLetter, DeadLetterError, DeadLetterReassembler, KinesisDestination, PollingConfig,
    reassemble_dead_letters,
};
pub use kcl_kinesis::{
    DeregisterConsumer, FanOutConfig, FanOutConfigBuilder, Retrieval, SourceStats,
};
pub use settings::{NearMiss, Settings, SettingsError};
/// Testing a [`RecordProcessor`] without AWS (feature `test-util`):
/// records, KPL aggregates and batches as the worker delivers them, and a
/// [`TestShard`](testing::TestShard) that drives a processor through its
/// lifecycle with a real [`Checkpointer`] and records every checkpoint.
#[cfg(feature = "test-util")]
pub mod testing {
    pub use kcl_core::testing::{Ending, TestShard};
}
pub use signal::shutdown_signal;
pub use worker::Worker;

/// What an application that wires its own lease store or shard source
/// needs from the engine, and nothing else: the two traits, the types
/// their methods take and return, and the engine's `Worker` with its
/// settings. The engine's parts (taker, renewer, consumers, shard sync)
/// stay inside it; their behaviour is what [`Worker`] documents.
pub mod core {
    /// The lease table's interface, for a store other than DynamoDB.
    pub mod store {
        /// The tests every [`LeaseStore`] must pass (feature `test-util`).
        #[cfg(feature = "test-util")]
        pub use kcl_core::store::conformance;
        /// An in-memory store with fault injection (feature `test-util`).
        #[cfg(feature = "test-util")]
        pub use kcl_core::store::memory;
        pub use kcl_core::store::metered::{MeteredStore, StoreSnapshot, StoreStats};
        pub use kcl_core::store::{
            Beat, BeatUpdate, CheckpointUpdate, Holder, Intent, JavaWorker, LeaseStore, Page,
            StoreError, StoreErrorKind, StoreOp, evicted_tenure, is_evicted_tenure,
        };
    }

    /// An operator's repairs of a running fleet's leases (what
    /// `kcl leases release` and `kcl leases reset --force` write).
    pub use kcl_core::leases::operator;

    /// The record source's interface, for a source other than Kinesis.
    pub mod source {
        pub use kcl_core::leases::LeaseHandle;
        /// An in-memory source with splits, merges and read faults
        /// (feature `test-util`).
        #[cfg(feature = "test-util")]
        pub use kcl_core::source::memory;
        pub use kcl_core::source::{
            AnswerClock, Batch, ChildShard, InitialPosition, OpenShard, ShardInfo, ShardReader,
            ShardSource, SourceError, StartPosition,
        };
    }

    pub use kcl_core::config::{LeaseConfig, LeaseConfigBuilder, LeaseRenewal};
    pub use kcl_core::lease::{Checkpoint, HashKeyRange, InvalidCheckpoint, Lease, LeaseLayout};
    pub use kcl_core::store::{Holder, LeaseStore};
    pub use kcl_core::worker::{
        StreamSpec, StreamTracker, Worker, WorkerConfig, WorkerConfigBuilder, WorkerError,
        check_stream_names,
    };
}
