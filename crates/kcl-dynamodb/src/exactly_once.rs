//! Exactly-once into DynamoDB: a batch's writes and its checkpoint commit
//! in one `TransactWriteItems`, conditional on this worker still holding
//! its tenure of the lease.
//!
//! A processor collects its puts, updates, deletes and condition checks
//! (the SDK's own [`TransactWriteItem`]s) in a [`Transaction`] and commits
//! it with [`ExactlyOnce::commit`], through the record its writes cover.
//! The transaction carries one more item: the lease's checkpoint update,
//! with the lease store's own condition (owner, tenure, and the checkpoint
//! it replaces). So:
//!
//! - A stale owner's transaction (paused past its lease, fenced, or handed
//!   off) fails as a whole: none of its writes land, and the processor
//!   learns `LeaseLost`.
//! - The next owner resumes right after the last committed transaction:
//!   every batch's effects land once.
//! - A lost response is retried with the same client request token, so
//!   DynamoDB answers a retry of a committed transaction with success. If
//!   the retry is judged on its conditions instead, it fails its checkpoint
//!   condition (a commit must move the checkpoint forward), and the lease
//!   item returned shows the checkpoint already written, which counts as
//!   success. When retries run out after an attempt that got no answer,
//!   the lease is read back to tell. No write is applied twice.
//! - TransactionConflict, throttling and 5xx are retried with backoff; a
//!   failed condition of the caller's own items comes back as
//!   [`TransactionError::ConditionFailed`], for the processor to handle.
//!
//! Limits: DynamoDB takes 100 items (this checkpoint is one of them) and
//! 4 MB per transaction, and no two operations on one item. A transaction
//! past the limits is refused with [`TransactionError::TooLarge`] before it
//! is sent. To commit more, commit at a record inside the batch (the
//! checkpoint then sits at that record, and the next transaction covers the
//! records after it): every commit is a consistent cut, so the guarantee
//! holds for each. Not available in parallel lanes.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use backon::Retryable;
use kcl_core::backoff::Backoff;
use kcl_core::checkpointer::{CheckpointError, Checkpointer, CommitFailure, PreparedCheckpoint};
use kcl_core::record::Record;
use tracing::warn;

use crate::store::{checkpoint_applied, checkpoint_transact_item};

/// Items a transaction may hold, the checkpoint included.
pub const MAX_ITEMS: usize = 100;
/// Bytes a transaction may hold (DynamoDB counts items' sizes).
pub const MAX_BYTES: usize = 4 * 1024 * 1024;
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
    /// This worker no longer holds its tenure of the lease: nothing was
    /// written, and the shard's consumer stops.
    #[error("lease {key:?} is no longer held in this tenure: nothing was written")]
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

/// Commits [`Transaction`]s with their checkpoint.
#[derive(Debug, Clone)]
pub struct ExactlyOnce {
    client: Client,
    lease_table: String,
    backoff: Backoff,
}

impl ExactlyOnce {
    /// Commits through `client`; `lease_table` is the worker's lease table
    /// (the application name, unless the worker was given another).
    pub fn new(client: Client, lease_table: impl Into<String>) -> Self {
        ExactlyOnce {
            client,
            lease_table: lease_table.into(),
            backoff: Backoff::new(Duration::from_millis(50), Duration::from_secs(2)).retries(9),
        }
    }

    /// How many times a transaction is sent before a retryable failure
    /// (conflict, throttling, 5xx, lost response) is returned (default 10,
    /// with jittered backoff from 50 ms to 2 s).
    pub fn attempts(mut self, n: usize) -> Self {
        self.backoff = self.backoff.retries(n.max(1) - 1);
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

    async fn send(
        &self,
        tx: Transaction,
        checkpoint: PreparedCheckpoint,
    ) -> Result<(), CommitFailure<TransactionError>> {
        let lease_item = checkpoint_transact_item(
            &self.lease_table,
            &checkpoint.key,
            checkpoint.holder(),
            &checkpoint.update,
        )
        .map_err(|e| {
            CommitFailure::Other(TransactionError::Failed {
                message: format!("building the checkpoint item: {e}"),
                retries_exhausted: false,
            })
        })?;
        let user_items = tx.items.len();
        let mut items = tx.items;
        items.push(lease_item);
        // One token for every attempt of this commit: DynamoDB then answers
        // a retry of a transaction that already committed (a lost response)
        // with success, for ten minutes, whatever its conditions say now.
        let token = format!(
            "kcl-{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        let attempt = || async {
            match self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .client_request_token(&token)
                .send()
                .await
            {
                Ok(_) => Ok(()),
                Err(e) => Err(self.judge(e, user_items, &checkpoint)),
            }
        };
        let result = attempt
            .retry(self.backoff.pauses())
            .sleep(tokio::time::sleep)
            .when(|o: &Outcome| matches!(o, Outcome::Retry(_)))
            .notify(|o: &Outcome, after: Duration| {
                if let Outcome::Retry(why) = o {
                    warn!(why, ?after, "the transactional checkpoint is retried");
                }
            })
            .await;
        match result {
            Ok(()) | Err(Outcome::Applied) => Ok(()),
            Err(Outcome::LeaseLost) => Err(CommitFailure::LeaseLost),
            // Out of retries: an attempt that got no answer may have
            // committed. The lease item says whether it did.
            Err(Outcome::Retry(message)) => match self.read_back(&checkpoint).await {
                Some(true) => Ok(()),
                found => Err(CommitFailure::Other(TransactionError::Failed {
                    message: match found {
                        Some(_) => format!(
                            "{message} (not committed, as read back after the last attempt)"
                        ),
                        None => format!(
                            "{message} (whether an attempt committed is unknown: the lease could not be read back)"
                        ),
                    },
                    retries_exhausted: true,
                })),
            },
            Err(Outcome::Fail(e)) => Err(CommitFailure::Other(e)),
        }
    }

    /// Whether the lease item shows `checkpoint` written in its tenure (a
    /// consistent read); `None` if it cannot be read.
    async fn read_back(&self, checkpoint: &PreparedCheckpoint) -> Option<bool> {
        let out = self
            .client
            .get_item()
            .table_name(&self.lease_table)
            .set_key(Some(crate::store::DynamoDbLeaseStore::key(&checkpoint.key)))
            .consistent_read(true)
            .send()
            .await
            .ok()?;
        let item = out.item()?;
        Some(checkpoint_applied(
            &self.lease_table,
            item,
            checkpoint.holder(),
            &checkpoint.update,
        ))
    }

    /// What a failed attempt means. The lease item is the last one.
    fn judge(
        &self,
        err: SdkError<TransactWriteItemsError, aws_smithy_runtime_api::http::Response>,
        user_items: usize,
        checkpoint: &PreparedCheckpoint,
    ) -> Outcome {
        let service = match &err {
            SdkError::ServiceError(s) => s.err(),
            // No answer, or an unreadable one: the transaction may have
            // committed; the retry finds out.
            SdkError::TimeoutError(_)
            | SdkError::DispatchFailure(_)
            | SdkError::ResponseError(_) => {
                return Outcome::Retry(format!("no answer: {}", DisplayErrorContext(&err)));
            }
            _ => {
                return Outcome::Fail(TransactionError::Failed {
                    message: DisplayErrorContext(&err).to_string(),
                    retries_exhausted: false,
                });
            }
        };
        if let TransactWriteItemsError::TransactionCanceledException(c) = service {
            let reasons = c.cancellation_reasons();
            let code = |r: &aws_sdk_dynamodb::types::CancellationReason| {
                r.code().unwrap_or("None").to_owned()
            };
            if let Some(lease) = reasons.get(user_items)
                && code(lease) == "ConditionalCheckFailed"
            {
                let applied = lease.item().is_some_and(|item| {
                    checkpoint_applied(
                        &self.lease_table,
                        item,
                        checkpoint.holder(),
                        &checkpoint.update,
                    )
                });
                return if applied {
                    Outcome::Applied
                } else {
                    Outcome::LeaseLost
                };
            }
            if let Some((index, r)) = reasons
                .iter()
                .enumerate()
                .take(user_items)
                .find(|(_, r)| code(r) == "ConditionalCheckFailed")
            {
                return Outcome::Fail(TransactionError::ConditionFailed {
                    index,
                    item: r.item().cloned(),
                });
            }
            let retry = reasons.iter().map(code).find(|c| {
                matches!(
                    c.as_str(),
                    "TransactionConflict" | "ThrottlingError" | "ProvisionedThroughputExceeded"
                )
            });
            if let Some(c) = retry {
                return Outcome::Retry(format!("cancelled: {c}"));
            }
            let codes: Vec<String> = reasons.iter().map(code).collect();
            return Outcome::Fail(TransactionError::Failed {
                message: format!(
                    "cancelled ({}): {}",
                    codes.join(", "),
                    c.message().unwrap_or_default()
                ),
                retries_exhausted: false,
            });
        }
        let code = service.code().unwrap_or_default();
        let status = match &err {
            SdkError::ServiceError(s) => s.raw().status().as_u16(),
            _ => 0,
        };
        let retryable = matches!(
            code,
            "TransactionInProgressException"
                | "TransactionConflictException"
                | "ProvisionedThroughputExceededException"
                | "ThrottlingException"
                | "RequestLimitExceeded"
                | "InternalServerError"
                | "ServiceUnavailable"
        ) || status >= 500;
        let message = format!("{code}: {}", service.message().unwrap_or_default());
        if retryable {
            Outcome::Retry(message)
        } else {
            Outcome::Fail(TransactionError::Failed {
                message,
                retries_exhausted: false,
            })
        }
    }
}

/// One attempt's verdict.
#[derive(Debug)]
enum Outcome {
    /// An earlier attempt committed (its response was lost).
    Applied,
    LeaseLost,
    Retry(String),
    Fail(TransactionError),
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

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::types::Put;

    fn put(bytes: usize) -> TransactWriteItem {
        TransactWriteItem::builder()
            .put(
                Put::builder()
                    .table_name("t")
                    .item("id", AttributeValue::S("k".into()))
                    .item("blob", AttributeValue::S("x".repeat(bytes)))
                    .build()
                    .unwrap(),
            )
            .build()
    }

    #[test]
    fn a_transaction_keeps_room_for_its_checkpoint_and_refuses_what_passes_the_limits() {
        let mut tx = Transaction::new();
        for _ in 0..MAX_ITEMS - 1 {
            tx.push(put(10)).unwrap();
        }
        assert_eq!(tx.room(), 0);
        let e = tx.push(put(10)).unwrap_err();
        assert!(
            matches!(e, TransactionError::TooLarge { items: 101, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("commit at a record"), "{e}");
        assert_eq!(tx.len(), MAX_ITEMS - 1, "left as it was");

        let mut big = Transaction::new();
        for _ in 0..10 {
            big.push(put(400_000)).unwrap();
        }
        let e = big.push(put(400_000)).unwrap_err();
        assert!(matches!(e, TransactionError::TooLarge { .. }), "{e}");
    }
}
