//! Exactly-once into DynamoDB: a batch's writes and its checkpoint commit
//! in one `TransactWriteItems`, conditional on this worker still holding
//! its tenure of the lease.
//!
//! A processor collects its puts, updates, deletes and condition checks
//! (the SDK's own [`TransactWriteItem`]s) in a [`Transaction`] and commits
//! it with [`ExactlyOnce::commit`], through the record its writes cover.
//! The transaction carries one more item: the lease's checkpoint update,
//! with the lease store's own condition (owner, tenure, and the checkpoint
//! it replaces), which also stores the commit's token (`kclCommitToken`,
//! see [`crate::item`]). So:
//!
//! - A stale owner's transaction (paused past its lease, fenced, or handed
//!   off) fails as a whole: none of its writes land, and the processor
//!   learns `LeaseLost`.
//! - The next owner resumes right after the last committed transaction:
//!   every batch's effects land once.
//! - A commit counts as applied only when DynamoDB says so or the lease
//!   item shows its own token: never by the checkpoint value alone, which a
//!   plain checkpoint of this tenure may have written with its answer lost.
//!   Such a checkpoint fails the commit with
//!   [`TransactionError::CheckpointMoved`]; the checkpointer moves on to it.
//! - A lost response is retried with the same client request token, so
//!   DynamoDB answers a retry of a committed transaction with success. If
//!   the retry is judged on its conditions instead, it fails its checkpoint
//!   condition, and the lease item returned shows the commit's token.
//! - Every attempt waits at most the attempt timeout for its answer, and
//!   the commit as a whole at most its deadline: a dead connection costs
//!   an attempt, never the shard. When the attempts end without a verdict,
//!   the commit is settled: a conditional write adds its token to the
//!   lease's fenced commits, which the transaction's condition checks. If
//!   that lands, no attempt has committed and none still in flight ever
//!   can; if it fails, the lease item it returns tells. A definite failure
//!   of a later attempt (a condition of the caller's items, an expired
//!   token) is settled the same way when an earlier attempt may still land
//!   (it got no answer, a 5xx, or TransactionInProgress), before it is
//!   reported. No write is applied twice, and none is reported
//!   missing that may still land.
//! - TransactionConflict, throttling and 5xx are retried with backoff; a
//!   failed condition of the caller's own items comes back as
//!   [`TransactionError::ConditionFailed`], for the processor to handle.
//!
//! Limits: DynamoDB takes 100 items (this checkpoint is one of them) and
//! 4 MB per transaction, 400 KB per item, and no two operations on one
//! item. A transaction past the limits is refused with
//! [`TransactionError::TooLarge`] (a Put past the item limit with
//! [`TransactionError::ItemTooLarge`]) before it
//! is sent. To commit more, commit at a record inside the batch (the
//! checkpoint then sits at that record, and the next transaction covers the
//! records after it): every commit is a consistent cut, so the guarantee
//! holds for each. Not available in parallel lanes.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use kcl_core::Checkpoint;
use kcl_core::backoff::Backoff;
use kcl_core::checkpointer::{CheckpointError, Checkpointer, CommitFailure, PreparedCheckpoint};
use kcl_core::record::Record;
use tokio::time::Instant;

use crate::store::checkpoint_transact_item;

mod attempts;
mod settle;
#[cfg(test)]
mod tests;

/// Items a transaction may hold, the checkpoint included.
pub const MAX_ITEMS: usize = 100;
/// Bytes a transaction may hold (DynamoDB counts items' sizes).
pub const MAX_BYTES: usize = 4 * 1024 * 1024;
/// Bytes one item may hold.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;
/// Room kept for the checkpoint item and the request around the items.
const CHECKPOINT_BYTES: usize = 2 * 1024;

/// The application's writes for one commit.
#[derive(Debug, Clone, Default)]
pub struct Transaction {
    items: Vec<TransactWriteItem>,
    bytes: usize,
}

impl Transaction {
    /// An empty transaction.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `item` (a Put, Update, Delete or ConditionCheck built with the
    /// SDK). Refused, leaving the transaction as it was, when it would
    /// pass DynamoDB's limits: commit what is there first.
    pub fn push(&mut self, item: TransactWriteItem) -> Result<(), TransactionError> {
        let bytes = item_bytes(&item);
        // A Put's whole item is known here; DynamoDB refuses one past its
        // item limit only when the transaction is sent, as a generic
        // failure of the whole commit. Judged by what the item holds at
        // the least, so that no item DynamoDB would take is refused.
        if let Some(put) = item.put()
            && put_bytes_at_least(put.item()) > MAX_ITEM_BYTES
        {
            return Err(TransactionError::ItemTooLarge {
                index: self.items.len(),
                bytes: put_bytes_at_least(put.item()),
            });
        }
        if self.items.len() + 1 >= MAX_ITEMS {
            return Err(TransactionError::TooLarge {
                items: self.items.len() + 2,
                bytes: self.bytes + bytes + CHECKPOINT_BYTES,
            });
        }
        if self.bytes + bytes + CHECKPOINT_BYTES > MAX_BYTES {
            return Err(TransactionError::TooLarge {
                items: self.items.len() + 2,
                bytes: self.bytes + bytes + CHECKPOINT_BYTES,
            });
        }
        self.items.push(item);
        self.bytes += bytes;
        Ok(())
    }

    /// Items added so far.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True if nothing was added.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How many more items fit (the checkpoint's place kept).
    pub fn room(&self) -> usize {
        MAX_ITEMS - 1 - self.items.len()
    }

    /// The items, in the order added.
    pub fn items(&self) -> &[TransactWriteItem] {
        &self.items
    }
}

/// Why a commit did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionError {
    /// This worker no longer holds its tenure of the lease, and the
    /// shard's consumer stops. The commit did not land, unless an earlier
    /// attempt whose answer was lost landed before the lease moved on (the
    /// next holder's commit then replaced its token): either way the
    /// lease's checkpoint says where the next holder resumes, so nothing is
    /// applied twice, but do not compensate for the writes as if they were
    /// surely not made.
    #[error(
        "lease {key:?} is no longer held in this tenure: the commit did not land, unless an \
         attempt whose answer was lost landed before the lease moved on"
    )]
    LeaseLost {
        /// The lease key.
        key: String,
    },
    /// One of the application's own conditions failed: nothing was
    /// written, and the checkpoint did not move.
    #[error("the condition of transaction item {index} failed: nothing was written")]
    ConditionFailed {
        /// Its index among the items pushed.
        index: usize,
        /// The item as DynamoDB saw it, when the item asked for it
        /// (`ReturnValuesOnConditionCheckFailure::AllOld`).
        item: Option<HashMap<String, AttributeValue>>,
    },
    /// The transaction passes DynamoDB's limits (100 items with the
    /// checkpoint, 4 MB).
    #[error(
        "a transaction of {items} items and about {bytes} bytes (checkpoint included) passes \
         DynamoDB's limits of {MAX_ITEMS} items and {MAX_BYTES} bytes: commit at a record \
         inside the batch first"
    )]
    TooLarge {
        /// Items it would hold, the checkpoint included.
        items: usize,
        /// About how many bytes.
        bytes: usize,
    },
    /// The item put at `index` passes DynamoDB's item limit (400 KB).
    #[error(
        "item {index} of about {bytes} bytes passes DynamoDB's limit of {MAX_ITEM_BYTES} bytes \
         an item: split it, or keep its large part elsewhere (S3) and put a reference"
    )]
    ItemTooLarge {
        /// Its index among the items pushed.
        index: usize,
        /// About how many bytes.
        bytes: usize,
    },
    /// Not applied: the lease, still held in this tenure, already shows
    /// the checkpoint at `checkpoint`, written by another write of this
    /// tenure whose answer was lost (a plain checkpoint, or an earlier
    /// commit). The checkpointer has moved on to it: when the batch comes
    /// again, skip the records it covers
    /// ([`Checkpointer::is_checkpointed`]).
    #[error(
        "lease {key:?} already shows checkpoint {checkpoint}, written in this tenure by a \
         write whose answer was lost: this transaction was not applied"
    )]
    CheckpointMoved {
        /// The lease key.
        key: String,
        /// The checkpoint the lease shows.
        checkpoint: Checkpoint,
    },
    /// The checkpoint position was refused (out of range, or in lanes).
    #[error(transparent)]
    Checkpoint(CheckpointError),
    /// DynamoDB refused the transaction for a reason retrying cannot fix
    /// (a validation error: two operations on one item, a wrong key, a
    /// missing table), or retries ran out.
    #[error("the transaction failed: {message}")]
    Failed {
        /// What DynamoDB said.
        message: String,
        /// Whether it was still failing after retries of a kind worth
        /// retrying (conflicts, throttling, 5xx, lost responses).
        retries_exhausted: bool,
    },
}

/// How long one attempt waits for its answer, by default.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one commit may take in all, settling included, by default.
const DEADLINE: Duration = Duration::from_secs(30);
/// Attempt timeouts kept from the deadline for settling a commit whose
/// attempts got no verdict.
const SETTLE_ATTEMPTS: u32 = 2;

/// Commits [`Transaction`]s with their checkpoint.
#[derive(Debug, Clone)]
pub struct ExactlyOnce {
    client: Client,
    lease_table: String,
    backoff: Backoff,
    attempt_timeout: Duration,
    deadline: Duration,
}

impl ExactlyOnce {
    /// Commits through `client`; `lease_table` is the worker's lease table
    /// (the application name, unless the worker was given another).
    pub fn new(client: Client, lease_table: impl Into<String>) -> Self {
        ExactlyOnce {
            client,
            lease_table: lease_table.into(),
            backoff: Backoff::new(Duration::from_millis(50), Duration::from_secs(2)).retries(9),
            attempt_timeout: ATTEMPT_TIMEOUT,
            deadline: DEADLINE,
        }
    }

    /// How many times a transaction is sent before a retryable failure
    /// (conflict, throttling, 5xx, lost response) is returned (default 10,
    /// with jittered backoff from 50 ms to 2 s), within the deadline.
    pub fn attempts(mut self, n: usize) -> Self {
        self.backoff = self.backoff.retries(n.max(1) - 1);
        self
    }

    /// How long one attempt (a `TransactWriteItems`, or a write settling a
    /// commit) waits for its answer before it counts as lost (default 5 s;
    /// at least 1 ms). The SDK sets no such timeout by default, and a
    /// request on a silently dead connection would otherwise wait forever.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a commit may take in all, settling included (default 30 s;
    /// at least three attempt timeouts: one attempt and its settling).
    /// Past it the commit fails with `Failed { retries_exhausted: true }`,
    /// for the processor to return, so the batch is retried (or, the lease
    /// gone, the shard given back) rather than held.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Commits `tx` and the checkpoint at `through` (everything up to and
    /// including it is done) in one transaction, conditional on this
    /// worker's tenure of the lease. An empty `tx` commits the checkpoint
    /// alone, still as a transaction (the same condition, one write unit
    /// pair).
    pub async fn commit(
        &self,
        checkpointer: &mut Checkpointer,
        tx: Transaction,
        through: &Record,
    ) -> Result<(), TransactionError> {
        let outcome = checkpointer
            .commit_with(&through.sequence_number, through.sub_sequence_number, |p| {
                self.send(tx, p)
            })
            .await;
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(CheckpointError::LeaseLost { key }) => Err(TransactionError::LeaseLost { key }),
            Err(e) => Err(TransactionError::Checkpoint(e)),
        }
    }

    /// Sends the transaction until it has a verdict or the attempts end,
    /// then settles it if it has none.
    async fn send(
        &self,
        tx: Transaction,
        checkpoint: PreparedCheckpoint,
    ) -> Result<(), CommitFailure<TransactionError>> {
        // One token for every attempt of this commit: DynamoDB then answers
        // a retry of a transaction that already committed (a lost response)
        // with success, for ten minutes, whatever its conditions say now;
        // and the lease item shows it once the commit landed.
        let token = format!(
            "kcl-{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        let items = self
            .items(tx, &checkpoint, &token)
            .map_err(CommitFailure::Other)?;
        let (send_until, settle_until) = self.deadlines(Instant::now());
        let commit = Commit {
            items: &items,
            token: &token,
            checkpoint: &checkpoint,
        };
        let sent = self.send_attempts(&commit, send_until).await;
        let outcome = match sent.outcome {
            Outcome::Retry(why) => {
                self.settle(&checkpoint, &token, settle_until, why, None)
                    .await
            }
            // A later attempt's failure says nothing of an earlier one that
            // may still land (no answer, a 5xx, still in progress): it is
            // reported once settled.
            Outcome::Fail(failure) if sent.unsure => {
                let why = failure.to_string();
                self.settle(&checkpoint, &token, settle_until, why, Some(failure))
                    .await
            }
            outcome => outcome,
        };
        outcome.into_commit(&checkpoint.key)
    }

    /// The application's items, then the lease's checkpoint.
    fn items(
        &self,
        tx: Transaction,
        checkpoint: &PreparedCheckpoint,
        token: &str,
    ) -> Result<Vec<TransactWriteItem>, TransactionError> {
        let lease_item = checkpoint_transact_item(
            &self.lease_table,
            &checkpoint.key,
            checkpoint.holder(),
            &checkpoint.update,
            token,
        )
        .map_err(|e| TransactionError::Failed {
            message: format!("building the checkpoint item: {e}"),
            retries_exhausted: false,
        })?;
        let mut items = tx.items;
        items.push(lease_item);
        Ok(items)
    }

    /// When sending must stop, and when settling must: room for
    /// [`SETTLE_ATTEMPTS`] attempt timeouts is kept from the deadline.
    fn deadlines(&self, start: Instant) -> (Instant, Instant) {
        let settling = self.attempt_timeout * SETTLE_ATTEMPTS;
        let deadline = self.deadline.max(self.attempt_timeout + settling);
        (start + deadline - settling, start + deadline)
    }
}

/// About how many bytes DynamoDB counts for `item`: attribute names and
/// values, as it sizes items (numbers and binaries by their length).
fn item_bytes(item: &TransactWriteItem) -> usize {
    fn map(m: &HashMap<String, AttributeValue>) -> usize {
        m.iter().map(|(k, v)| k.len() + value(v)).sum()
    }
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) | AttributeValue::N(s) => s.len(),
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::Ss(l) | AttributeValue::Ns(l) => l.iter().map(String::len).sum(),
            AttributeValue::Bs(l) => l.iter().map(|b| b.as_ref().len()).sum(),
            AttributeValue::M(m) => 3 + map(m),
            AttributeValue::L(l) => 3 + l.iter().map(value).sum::<usize>(),
            _ => 1,
        }
    }
    let values = |v: Option<&HashMap<String, AttributeValue>>| v.map_or(0, map);
    if let Some(p) = item.put() {
        map(p.item())
    } else if let Some(u) = item.update() {
        map(u.key()) + u.update_expression().len() + values(u.expression_attribute_values())
    } else if let Some(d) = item.delete() {
        map(d.key())
    } else if let Some(c) = item.condition_check() {
        map(c.key())
    } else {
        0
    }
}

/// The bytes DynamoDB counts for an item at the least: its names,
/// strings and binaries, and one byte for each number and each element of
/// a list or map (a number takes one byte per two significant digits
/// more, which its text does not tell exactly).
fn put_bytes_at_least(item: &HashMap<String, AttributeValue>) -> usize {
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) => s.len(),
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::Ss(l) => l.iter().map(String::len).sum(),
            AttributeValue::Bs(l) => l.iter().map(|b| b.as_ref().len()).sum(),
            AttributeValue::Ns(l) => l.len(),
            AttributeValue::M(m) => m.iter().map(|(k, v)| k.len() + value(v) + 1).sum(),
            AttributeValue::L(l) => l.iter().map(|v| value(v) + 1).sum(),
            _ => 1,
        }
    }
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

/// One commit's transaction as each attempt sends it.
struct Commit<'a> {
    /// The application's items, then the lease's.
    items: &'a [TransactWriteItem],
    /// The client request token every attempt shares.
    token: &'a str,
    checkpoint: &'a PreparedCheckpoint,
}

/// What became of a commit, or of one attempt of it.
#[derive(Debug)]
enum Outcome {
    /// It committed (perhaps in an earlier attempt whose answer was lost).
    Applied,
    /// The lease is no longer this tenure's, and the commit did not land.
    LeaseLost,
    /// Another write of this tenure moved the checkpoint to this one; the
    /// commit did not land.
    Moved(Checkpoint),
    /// No verdict (no answer, or a failure worth retrying): it may yet land.
    Retry(String),
    /// It did not land, for this reason.
    Fail(TransactionError),
}

impl Outcome {
    /// The outcome as `Checkpointer::commit_with` takes it, for lease `key`.
    fn into_commit(self, key: &str) -> Result<(), CommitFailure<TransactionError>> {
        match self {
            Outcome::Applied => Ok(()),
            Outcome::LeaseLost => Err(CommitFailure::LeaseLost),
            Outcome::Moved(to) => Err(CommitFailure::CheckpointMoved {
                error: TransactionError::CheckpointMoved {
                    key: key.to_owned(),
                    checkpoint: to.clone(),
                },
                to,
            }),
            Outcome::Retry(message) => Err(CommitFailure::Other(TransactionError::Failed {
                message,
                retries_exhausted: true,
            })),
            Outcome::Fail(e) => Err(CommitFailure::Other(e)),
        }
    }
}
