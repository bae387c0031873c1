//! Held-back checkpoints of a worker's shards, written together.
//!
//! Under a checkpoint policy with a period, every shard of the worker is
//! due at the same instants: the period's boundaries on the batcher's
//! clock (see [`super::policy`]). Each consumer hands its due position to
//! the batcher at its next fetch and goes on reading; the batcher waits a
//! short window for the other shards' positions and writes them all in one
//! [`LeaseStore::checkpoint_many`] request (on DynamoDB one
//! `BatchExecuteStatement` of up to 25 conditional updates, billed per item
//! as single writes are). So a busy worker's policy writes cost one request
//! per period, not one per shard per period.
//!
//! Each write keeps the condition of a single checkpoint. One that fails
//! in the batch, or whose batch got no answer, is written again alone,
//! the way every checkpoint is (with its retries, and a replay of a write
//! that landed told apart from a lost lease), so that batching never
//! decides a lease is lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{CheckpointError, CheckpointPolicy, Checkpointer};
use crate::lease::Checkpoint;
use crate::leases::LeaseHandle;
use crate::store::{CheckpointUpdate, CheckpointWrite, LeaseStore, StoreError, StoreOp};

/// The longest a due position waits for the rest of its batch.
const MAX_WINDOW: Duration = Duration::from_secs(1);

/// How a stream's consumers write their shards' checkpoints: the policy,
/// and for a policy with a period the batcher its due positions go through.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointPacer {
    policy: CheckpointPolicy,
    batcher: Option<Batcher>,
}

impl CheckpointPacer {
    /// `policy`'s pacing, writing to `store`.
    pub(crate) fn new(policy: CheckpointPolicy, store: &Arc<dyn LeaseStore>) -> Self {
        CheckpointPacer {
            policy,
            batcher: policy.period().map(|p| Batcher::new(Arc::clone(store), p)),
        }
    }
}

impl Checkpointer {
    /// Writes as `pacer` says: at most as often as its policy, due
    /// positions through its batcher.
    pub(crate) fn paced_by(self, pacer: &CheckpointPacer) -> Self {
        self.with_policy(pacer.policy)
            .with_batcher(pacer.batcher.clone())
    }
}

/// Where a worker's consumers hand their due checkpoints (one per stream
/// setup, shared by its consumers).
#[derive(Clone)]
pub(crate) struct Batcher {
    shared: Arc<Shared>,
}

struct Shared {
    store: Arc<dyn LeaseStore>,
    /// The clock the period's boundaries count from.
    epoch: Instant,
    /// How long the first position of a batch waits for the others.
    window: Duration,
    queue: Mutex<Vec<Submission>>,
    /// The id of the next submission.
    next_id: AtomicU64,
}

/// A due position and where its answer goes.
struct Submission {
    id: u64,
    lease: LeaseHandle,
    update: CheckpointUpdate,
    answer: oneshot::Sender<Result<(), StoreError>>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("epoch", &self.shared.epoch)
            .field("window", &self.shared.window)
            .finish_non_exhaustive()
    }
}

impl Batcher {
    /// A batcher writing to `store` for a policy of `period`: a batch
    /// collects for a fifth of the period, at most 1 s (consumers notice a
    /// boundary at their next fetch, a fraction of a second apart).
    pub(crate) fn new(store: Arc<dyn LeaseStore>, period: Duration) -> Self {
        Batcher {
            shared: Arc::new(Shared {
                store,
                epoch: Instant::now(),
                window: (period / 5).min(MAX_WINDOW),
                queue: Mutex::new(Vec::new()),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// The instant the period's boundaries count from.
    pub(crate) fn epoch(&self) -> Instant {
        self.shared.epoch
    }

    /// Hands `update` of `lease` to the next batch; its answer (after a
    /// single write's retries, if the batch did not land it) comes on the
    /// receiver. The id withdraws it while the batch has not gone yet.
    pub(crate) fn submit(
        &self,
        lease: LeaseHandle,
        update: CheckpointUpdate,
    ) -> (u64, oneshot::Receiver<Result<(), StoreError>>) {
        let (answer, receiver) = oneshot::channel();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let opens_batch = {
            let mut queue = self.shared.queue();
            queue.push(Submission {
                id,
                lease,
                update,
                answer,
            });
            queue.len() == 1
        };
        if opens_batch {
            let shared = Arc::clone(&self.shared);
            tokio::spawn(async move {
                tokio::time::sleep(shared.window).await;
                let batch = std::mem::take(&mut *shared.queue());
                write(shared.store.as_ref(), batch).await;
            });
        }
        (id, receiver)
    }

    /// Takes submission `id` back if its batch has not gone yet: true if
    /// it will not be written.
    pub(crate) fn withdraw(&self, id: u64) -> bool {
        let mut queue = self.shared.queue();
        let before = queue.len();
        queue.retain(|s| s.id != id);
        queue.len() < before
    }
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Submission>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Writes `batch` in one request, and each write it did not land alone.
async fn write(store: &dyn LeaseStore, batch: Vec<Submission>) {
    // No write once its worker stopped believing in the lease (as for a
    // single checkpoint): the tenure condition keeps a late write out of a
    // later tenure, and this keeps one out of a handoff's thief as well.
    let (live, gone): (Vec<_>, Vec<_>) = batch.into_iter().partition(|s| s.lease.may_checkpoint());
    for s in gone {
        let key = s.lease.key().to_owned();
        let _ = s
            .answer
            .send(Err(StoreError::ConditionFailed { key, current: None }));
    }
    if live.is_empty() {
        return;
    }
    let writes: Vec<CheckpointWrite<'_>> = live
        .iter()
        .map(|s| CheckpointWrite {
            key: s.lease.key(),
            by: s.lease.holder(),
            update: &s.update,
        })
        .collect();
    let answers: Vec<Option<Result<(), StoreError>>> = match store.checkpoint_many(&writes).await {
        Ok(answers) if answers.len() == live.len() => answers.into_iter().map(Some).collect(),
        // No answer for the writes (any may have landed): each is
        // written again alone, which reconciles one that did.
        _ => std::iter::repeat_with(|| None).take(live.len()).collect(),
    };
    drop(writes);
    let mut alone = Vec::new();
    for (s, answer) in live.into_iter().zip(answers) {
        match answer {
            Some(Ok(())) => {
                let _ = s.answer.send(Ok(()));
            }
            _ => alone.push(s),
        }
    }
    // Side by side, each answered as it ends: one lease whose writes
    // hang must not hold back the others' answers.
    futures::future::join_all(alone.into_iter().map(|s| async move {
        let result = super::write_retrying(store, &s.lease, &s.update)
            .await
            .map(drop);
        let _ = s.answer.send(result);
    }))
    .await;
}

/// A position handed to the [`Batcher`], and where its answer comes.
pub(super) struct InFlight {
    /// The batcher's id of the submission.
    id: u64,
    pub(super) checkpoint: Checkpoint,
    /// The instant the write counts as made at, if it lands.
    at: Instant,
    /// Records delivered by then: those delivered later count towards
    /// the next write.
    counted: u64,
    answer: tokio::sync::oneshot::Receiver<Result<(), StoreError>>,
}

impl Checkpointer {
    /// Under a batcher: holds `checkpoint` back as the latest position
    /// asked for, and hands it to the batcher if it is due, without
    /// waiting for the write.
    pub(super) async fn hold_for_batch(
        &mut self,
        checkpoint: Checkpoint,
    ) -> Result<(), CheckpointError> {
        if let Err(e @ CheckpointError::LeaseLost { .. }) = self.settle(false).await {
            return Err(e);
        }
        self.ensure_may_checkpoint()?;
        self.pacing.defer(checkpoint);
        self.submit_if_due()
    }

    /// Hands the held-back position to the batcher if it is due and no
    /// earlier one is being written.
    pub(super) fn submit_if_due(&mut self) -> Result<(), CheckpointError> {
        let Some(batcher) = self.batcher.clone() else {
            return Ok(());
        };
        if self.in_flight.is_some() || self.pacing.defers(Instant::now()) {
            return Ok(());
        }
        let Some(checkpoint) = self.pacing.take_deferred() else {
            return Ok(());
        };
        self.ensure_may_checkpoint()?;
        let update =
            CheckpointUpdate::to(checkpoint.clone()).replacing(self.last_checkpoint.clone());
        let at = self.pacing.written_at(Instant::now());
        let (id, answer) = batcher.submit(self.lease.clone(), update);
        self.in_flight = Some(InFlight {
            id,
            checkpoint,
            at,
            counted: self.pacing.delivered(),
            answer,
        });
        Ok(())
    }

    /// Takes in the answer to a position handed to the batcher: waiting for
    /// it with `wait`, else only if it came. A write that failed (not a
    /// lost lease) leaves its position held back again, unless the
    /// processor asked for a later one since. Cancelled while it waits,
    /// the position stays in flight.
    pub(super) async fn settle(&mut self, wait: bool) -> Result<(), CheckpointError> {
        let answer = {
            let Some(in_flight) = self.in_flight.as_mut() else {
                return Ok(());
            };
            if wait {
                (&mut in_flight.answer).await.ok()
            } else {
                match in_flight.answer.try_recv() {
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return Ok(()),
                    answer => answer.ok(),
                }
            }
        };
        let Some(in_flight) = self.in_flight.take() else {
            return Ok(());
        };
        let result = answer.unwrap_or_else(|| {
            Err(StoreError::retryable(
                StoreOp::CheckpointMany,
                "the batch ended without an answer",
            ))
        });
        let checkpoint = in_flight.checkpoint;
        let since = self.pacing.delivered().saturating_sub(in_flight.counted);
        let outcome = self.landed(
            &CheckpointUpdate::to(checkpoint.clone()),
            result,
            in_flight.at,
        );
        match &outcome {
            Ok(()) => self.pacing.count(since),
            Err(CheckpointError::Store(_)) if self.pacing.deferred().is_none() => {
                self.pacing.defer(checkpoint);
            }
            Err(_) => {}
        }
        outcome
    }

    /// Before a write of its own (each write is conditional on the one
    /// before it): takes a position handed to the batcher back if its
    /// batch has not gone (it is held back again, unless a later one is),
    /// else waits for its answer. Only a lost lease stops the write: a
    /// failed one was held back again, and the write supersedes it or
    /// writes it first.
    pub(super) async fn settle_before_writing(&mut self) -> Result<(), CheckpointError> {
        if let (Some(batcher), Some(in_flight)) = (&self.batcher, &self.in_flight)
            && batcher.withdraw(in_flight.id)
            && let Some(in_flight) = self.in_flight.take()
        {
            if self.pacing.deferred().is_none() {
                self.pacing.defer(in_flight.checkpoint);
            }
            return Ok(());
        }
        match self.settle(true).await {
            Err(e @ CheckpointError::LeaseLost { .. }) => Err(e),
            _ => Ok(()),
        }
    }
}
