//! Testing a [`RecordProcessor`] without a worker, Kinesis or DynamoDB
//! (feature `test-util`): records, KPL aggregates and batches as the worker
//! delivers them, and a shard that drives a processor through the
//! lifecycle the worker runs (`initialize`, batches, then shard end,
//! shutdown or a lost lease) with a real [`Checkpointer`] over an in-memory
//! lease table, recording every checkpoint written.
//!
//! ```
//! use kcl_core::checkpointer::Checkpointer;
//! use kcl_core::processor::{ProcessorError, RecordBatch, RecordProcessor};
//! use kcl_core::testing::{Ending, TestShard};
//! use kcl_core::Checkpoint;
//!
//! struct CheckpointEveryBatch;
//!
//! #[async_trait::async_trait]
//! impl RecordProcessor for CheckpointEveryBatch {
//!     async fn process_records(
//!         &mut self,
//!         _batch: &RecordBatch,
//!         checkpointer: &mut Checkpointer,
//!     ) -> Result<(), ProcessorError> {
//!         checkpointer.checkpoint().await?;
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), ProcessorError> {
//! let mut shard = TestShard::new("shardId-000000000000").await;
//! let batches = vec![
//!     shard.batch([("pk-1", "a"), ("pk-2", "b")]),
//!     shard.batch([("pk-1", "c")]),
//! ];
//! shard.drive(&mut CheckpointEveryBatch, batches, Ending::ShardEnd).await?;
//! assert_eq!(
//!     shard.checkpoints(),
//!     [Checkpoint::at("2", 0), Checkpoint::at("3", 0), Checkpoint::ShardEnd]
//! );
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::checkpointer::Checkpointer;
use crate::lease::{Checkpoint, Lease};
use crate::leases::{EndReason, LeaseHandle};
use crate::processor::{
    InitializeInput, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
};
use crate::record::Record;
use crate::store::memory::InMemoryLeaseStore;
use crate::store::{Holder, LeaseStore};

/// The worker id and tenure the test shard's lease is held under.
const WORKER: &str = "test-worker";
const TENURE: &str = "test-tenure";

/// How a [`TestShard::drive`] run ends, after its batches.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ending {
    /// The shard was closed (a split or merge) into these children:
    /// `shard_ended`, where `checkpoint()` writes SHARD_END.
    ShardEnd,
    /// A graceful shutdown or a handoff: `shutdown_requested`.
    ShutdownRequested,
    /// Another worker took the lease: `lease_lost`, after which no
    /// checkpoint is accepted.
    LeaseLost,
    /// Nothing after the batches (the processor stays usable).
    None,
}

/// One shard's lease, held by a test worker, and the processor calls the
/// worker would make on it. Sequence numbers count up from 1, one per
/// Kinesis record (an aggregate's records share one).
pub struct TestShard {
    store: InMemoryLeaseStore,
    context: ShardContext,
    lease: LeaseHandle,
    checkpointer: Checkpointer,
    next_sequence: u64,
}

impl std::fmt::Debug for TestShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestShard")
            .field("shard", &self.context.shard_id)
            .field("last_checkpoint", self.checkpointer.last_checkpoint())
            .finish_non_exhaustive()
    }
}

impl TestShard {
    /// A shard with no checkpoint yet (TRIM_HORIZON), held by this test's
    /// worker.
    pub async fn new(shard_id: &str) -> Self {
        Self::starting_at(shard_id, Checkpoint::TrimHorizon).await
    }

    /// A shard whose lease already holds `checkpoint`, as after an earlier
    /// owner: what `initialize` is told. New records' sequence numbers
    /// follow a numeric checkpoint's.
    pub async fn starting_at(shard_id: &str, checkpoint: Checkpoint) -> Self {
        let next_sequence = match &checkpoint {
            Checkpoint::Sequence { seq, .. } => seq.parse::<u64>().map_or(1, |s| s + 1),
            _ => 1,
        };
        let store = InMemoryLeaseStore::new();
        let created = store
            .create_if_absent(&Lease::new(shard_id, checkpoint))
            .await
            .expect("the in-memory store creates the lease");
        let held = store
            .take(&created, Holder::new(WORKER, TENURE))
            .await
            .expect("the in-memory store lets the test take the lease");
        // Valid for a day of the (possibly paused) clock: a test does not
        // renew.
        let lease = LeaseHandle::detached(held, Duration::from_secs(24 * 3600));
        let checkpointer = Checkpointer::for_test(Arc::new(store.handle()), lease.clone());
        TestShard {
            store,
            context: ShardContext {
                stream: "test-stream".into(),
                shard_id: shard_id.into(),
                lease_key: shard_id.into(),
                worker_id: WORKER.into(),
                lane: None,
            },
            lease,
            checkpointer,
            next_sequence,
        }
    }

    /// The shard as the processor factory and `initialize` see it.
    pub fn context(&self) -> &ShardContext {
        &self.context
    }

    /// The next Kinesis record: a new sequence number, arrived now.
    pub fn record(&mut self, partition_key: &str, data: impl Into<Bytes>) -> Record {
        let sequence = self.next_sequence.to_string();
        self.next_sequence += 1;
        Record {
            data: data.into(),
            partition_key: partition_key.into(),
            explicit_hash_key: None,
            sequence_number: sequence,
            sub_sequence_number: 0,
            approximate_arrival: Some(SystemTime::now()),
            aggregated: false,
        }
    }

    /// The records of one KPL aggregate as the worker delivers them: one
    /// Kinesis sequence number, sub-sequence numbers 0, 1, 2, ...
    pub fn aggregate<K: AsRef<str>, D: Into<Bytes>>(
        &mut self,
        records: impl IntoIterator<Item = (K, D)>,
    ) -> Vec<Record> {
        let sequence = self.next_sequence.to_string();
        self.next_sequence += 1;
        records
            .into_iter()
            .enumerate()
            .map(|(sub, (key, data))| Record {
                data: data.into(),
                partition_key: key.as_ref().to_owned(),
                explicit_hash_key: None,
                sequence_number: sequence.clone(),
                sub_sequence_number: sub as u64,
                approximate_arrival: Some(SystemTime::now()),
                aggregated: true,
            })
            .collect()
    }

    /// A batch of new records, one per `(partition key, data)`.
    pub fn batch<K: AsRef<str>, D: Into<Bytes>>(
        &mut self,
        records: impl IntoIterator<Item = (K, D)>,
    ) -> RecordBatch {
        let records = records
            .into_iter()
            .map(|(key, data)| self.record(key.as_ref(), data))
            .collect();
        RecordBatch {
            records,
            millis_behind_latest: Some(0),
        }
    }

    /// `initialize`, told the lease's checkpoint.
    pub async fn initialize(
        &mut self,
        processor: &mut dyn RecordProcessor,
    ) -> Result<(), ProcessorError> {
        let input = InitializeInput {
            shard: self.context.clone(),
            checkpoint: self.checkpointer.last_checkpoint().clone(),
            pending_checkpoint: None,
        };
        processor.initialize(&input).await
    }

    /// `process_records` with `batch`, whose records `checkpoint()` then
    /// covers. An error is returned as the processor gave it (the worker
    /// would hand it to its failure policy).
    pub async fn process(
        &mut self,
        processor: &mut dyn RecordProcessor,
        batch: &RecordBatch,
    ) -> Result<(), ProcessorError> {
        self.checkpointer.count_dispatched(batch.records.len());
        if let Some(last) = batch.records.last() {
            self.checkpointer.delivered(last);
        }
        processor
            .process_records(batch, &mut self.checkpointer)
            .await
    }

    /// `shard_ended`, the shard closed into `children`: `checkpoint()`
    /// there writes SHARD_END.
    pub async fn end(
        &mut self,
        processor: &mut dyn RecordProcessor,
        children: &[&str],
    ) -> Result<(), ProcessorError> {
        self.checkpointer.write_every_call();
        self.checkpointer
            .set_shard_ended(children.iter().map(|c| (*c).to_owned()).collect());
        processor.shard_ended(&mut self.checkpointer).await
    }

    /// `shutdown_requested`, as on a graceful shutdown or a handoff.
    pub async fn request_shutdown(
        &mut self,
        processor: &mut dyn RecordProcessor,
    ) -> Result<(), ProcessorError> {
        self.checkpointer.write_every_call();
        processor.shutdown_requested(&mut self.checkpointer).await
    }

    /// Another worker took the lease: later checkpoints are refused, and
    /// the processor gets `lease_lost`.
    pub async fn lose_lease(&mut self, processor: &mut dyn RecordProcessor) {
        self.lease.end_for_test(EndReason::Lost);
        processor.lease_lost().await;
    }

    /// The whole lifecycle: `initialize`, each batch, then `ending`. Stops
    /// at the first error the processor returns.
    pub async fn drive(
        &mut self,
        processor: &mut dyn RecordProcessor,
        batches: impl IntoIterator<Item = RecordBatch>,
        ending: Ending,
    ) -> Result<(), ProcessorError> {
        self.initialize(processor).await?;
        for batch in batches {
            self.process(processor, &batch).await?;
        }
        match ending {
            Ending::ShardEnd => self.end(processor, &[]).await,
            Ending::ShutdownRequested => self.request_shutdown(processor).await,
            Ending::LeaseLost => {
                self.lose_lease(processor).await;
                Ok(())
            }
            Ending::None => Ok(()),
        }
    }

    /// Every checkpoint written to the lease, in order (SHARD_END
    /// included).
    pub fn checkpoints(&self) -> Vec<Checkpoint> {
        self.store
            .checkpoints_written()
            .into_iter()
            .map(|(_, checkpoint)| checkpoint)
            .collect()
    }

    /// The lease's checkpoint now, as the next owner would start from it.
    pub fn checkpoint(&self) -> &Checkpoint {
        self.checkpointer.last_checkpoint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpointer::CheckpointError;

    /// Checkpoints the record before the first with data "flush", and
    /// everything in `shutdown_requested`.
    struct FlushMarker;

    #[async_trait::async_trait]
    impl RecordProcessor for FlushMarker {
        async fn process_records(
            &mut self,
            batch: &RecordBatch,
            checkpointer: &mut Checkpointer,
        ) -> Result<(), ProcessorError> {
            for record in &batch.records {
                if record.data.as_ref() == b"flush" {
                    checkpointer.checkpoint_record(record).await?;
                }
            }
            Ok(())
        }

        async fn shutdown_requested(
            &mut self,
            checkpointer: &mut Checkpointer,
        ) -> Result<(), ProcessorError> {
            checkpointer.checkpoint().await?;
            Ok(())
        }
    }

    #[tokio::test]
    async fn every_checkpoint_a_processor_writes_is_recorded_in_order() {
        let mut shard = TestShard::new("shard-1").await;
        let first = shard.batch([("a", "x"), ("b", "flush"), ("c", "y")]);
        let aggregate = shard.aggregate([("a", "x"), ("b", "flush"), ("c", "z")]);
        let second = RecordBatch {
            records: aggregate,
            millis_behind_latest: None,
        };
        shard
            .drive(&mut FlushMarker, [first, second], Ending::ShutdownRequested)
            .await
            .expect("no error");
        assert_eq!(
            shard.checkpoints(),
            [
                Checkpoint::at("2", 0),
                Checkpoint::at("4", 1),
                Checkpoint::at("4", 2)
            ]
        );
    }

    #[tokio::test]
    async fn after_a_lost_lease_a_checkpoint_is_refused() {
        let mut shard = TestShard::starting_at("shard-1", Checkpoint::at("7", 0)).await;
        let batch = shard.batch([("a", "x")]);
        shard
            .drive(&mut FlushMarker, [batch], Ending::LeaseLost)
            .await
            .expect("no error");
        let late = shard.request_shutdown(&mut FlushMarker).await;
        let error = late.expect_err("the lease is gone");
        assert!(
            matches!(
                error.downcast_ref::<CheckpointError>(),
                Some(CheckpointError::LeaseLost { .. })
            ),
            "{error}"
        );
        assert!(shard.checkpoints().is_empty());
        assert_eq!(shard.checkpoint(), &Checkpoint::at("7", 0));
    }

    #[tokio::test]
    async fn shard_end_is_written_by_the_default_shard_ended() {
        let mut shard = TestShard::new("shard-1").await;
        let batch = shard.batch([("a", "x")]);
        shard
            .drive(&mut FlushMarker, [batch], Ending::ShardEnd)
            .await
            .expect("no error");
        assert_eq!(shard.checkpoints(), [Checkpoint::ShardEnd]);
    }

    /// Records the children it is told of in `shard_ended`.
    #[derive(Default)]
    struct ChildWatcher(Vec<String>);

    #[async_trait::async_trait]
    impl RecordProcessor for ChildWatcher {
        async fn process_records(
            &mut self,
            _batch: &RecordBatch,
            checkpointer: &mut Checkpointer,
        ) -> Result<(), ProcessorError> {
            assert!(checkpointer.child_shards().is_empty());
            Ok(())
        }

        async fn shard_ended(
            &mut self,
            checkpointer: &mut Checkpointer,
        ) -> Result<(), ProcessorError> {
            self.0 = checkpointer.child_shards().to_vec();
            checkpointer.checkpoint().await?;
            Ok(())
        }
    }

    #[tokio::test]
    async fn shard_ended_is_told_the_child_shards() {
        let mut shard = TestShard::new("shard-1").await;
        let mut watcher = ChildWatcher::default();
        let batch = shard.batch([("a", "x")]);
        shard.process(&mut watcher, &batch).await.expect("no error");
        shard
            .end(&mut watcher, &["shard-2", "shard-3"])
            .await
            .expect("no error");
        assert_eq!(watcher.0, ["shard-2", "shard-3"]);
        assert_eq!(shard.checkpoints(), [Checkpoint::ShardEnd]);
    }
}
