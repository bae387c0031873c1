//! Settling a commit whose attempts ended without a verdict, and reading
//! a verdict from the lease item.
//!
//! An attempt given up on may still be on its way to DynamoDB, so reading
//! the lease could say "not committed" just before it lands. Settling
//! writes instead: a conditional update adds the commit's token to the
//! lease's fenced commits, under the commit's own lease condition. The
//! transaction is conditional on its token not being fenced, so once the
//! fence lands no attempt can; and the fence lands only if the checkpoint
//! is still the one the commit replaces, that is, if no attempt has.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure, Update};
use kcl_core::Checkpoint;
use kcl_core::checkpointer::PreparedCheckpoint;
use kcl_core::store::StoreOp;
use tokio::time::Instant;

use super::{ExactlyOnce, Outcome, TransactionError};
use crate::error::{ClassifiedError, classify};
use crate::schema::lease as attr;
use crate::store::{fence_item, read_lenient};

/// The first pause between two fence attempts; it doubles.
const FIRST_PAUSE: Duration = Duration::from_millis(100);

/// What the lease item says of one commit.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// It shows the commit's token: the commit landed.
    Applied,
    /// Gone, unreadable, or no longer this tenure's; the commit did not
    /// land.
    LeaseLost,
    /// This tenure's, with the checkpoint moved to this one by another
    /// write; the commit did not land.
    Moved(Checkpoint),
    /// This tenure's, at the checkpoint the commit replaces.
    Unchanged,
}

/// What `item`, the lease as a failed condition returned it, says of the
/// commit of `checkpoint` with `token`. Only the token says it landed: a
/// plain checkpoint of this tenure at the same position looks the same
/// otherwise.
pub(super) fn verdict(
    table: &str,
    item: Option<&HashMap<String, AttributeValue>>,
    checkpoint: &PreparedCheckpoint,
    token: &str,
) -> Verdict {
    let Some(item) = item else {
        return Verdict::LeaseLost;
    };
    if matches!(item.get(attr::COMMIT_TOKEN), Some(AttributeValue::S(t)) if t == token) {
        return Verdict::Applied;
    }
    let Some(lease) = read_lenient(table, item) else {
        return Verdict::LeaseLost;
    };
    if !checkpoint.holder().may_checkpoint(&lease) {
        return Verdict::LeaseLost;
    }
    match &checkpoint.update.replacing {
        Some(replaced) if *replaced != lease.checkpoint => Verdict::Moved(lease.checkpoint),
        _ => Verdict::Unchanged,
    }
}

/// One fence attempt's result.
enum Fence {
    /// It landed.
    Landed,
    /// Its condition failed; the lease item, if returned.
    Refused(Option<HashMap<String, AttributeValue>>),
    /// It failed otherwise.
    Failed { message: String, retryable: bool },
}

impl ExactlyOnce {
    /// Settles the commit of `checkpoint` with `token`, whose last attempt
    /// failed for `why`, by `until`. Once no attempt can land any more,
    /// that failure is `failed` if given (a definite one after an attempt
    /// that got no answer), else that nothing was committed.
    pub(super) async fn settle(
        &self,
        checkpoint: &PreparedCheckpoint,
        token: &str,
        until: Instant,
        why: String,
        failed: Option<TransactionError>,
    ) -> Outcome {
        let fence = match fence_item(
            &self.lease_table,
            &checkpoint.key,
            checkpoint.holder(),
            checkpoint.update.replacing.as_ref(),
            token,
        ) {
            Ok(fence) => fence,
            Err(e) => return unknown(why, &format!("building the fence: {e}")),
        };
        let mut pause = FIRST_PAUSE;
        loop {
            let limit = until
                .saturating_duration_since(Instant::now())
                .min(self.attempt_timeout);
            let problem =
                match tokio::time::timeout(limit, self.fence(&fence, &checkpoint.key)).await {
                    Ok(Fence::Landed) => {
                        return failed.map_or_else(|| not_committed(why), Outcome::Fail);
                    }
                    Ok(Fence::Refused(item)) => {
                        return self.refused(item.as_ref(), checkpoint, token, why);
                    }
                    Ok(Fence::Failed { message, retryable }) if !retryable => {
                        return unknown(why, &message);
                    }
                    Ok(Fence::Failed { message, .. }) => message,
                    Err(_) => format!("no answer within {limit:?}"),
                };
            if Instant::now() + pause >= until {
                return unknown(why, &problem);
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }

    /// The outcome of a fence whose condition failed on lease `item`.
    fn refused(
        &self,
        item: Option<&HashMap<String, AttributeValue>>,
        checkpoint: &PreparedCheckpoint,
        token: &str,
        why: String,
    ) -> Outcome {
        match verdict(&self.lease_table, item, checkpoint, token) {
            Verdict::Applied => Outcome::Applied,
            Verdict::LeaseLost => Outcome::LeaseLost,
            Verdict::Moved(to) => Outcome::Moved(to),
            Verdict::Unchanged => unknown(
                why,
                "the fence's condition failed, yet the lease shows this tenure at the \
                 checkpoint replaced",
            ),
        }
    }

    /// One attempt of `fence` on lease `key`.
    async fn fence(&self, fence: &Update, key: &str) -> Fence {
        let result = self
            .client
            .update_item()
            .table_name(fence.table_name())
            .set_key(Some(fence.key().clone()))
            .update_expression(fence.update_expression())
            .set_condition_expression(fence.condition_expression().map(str::to_owned))
            .set_expression_attribute_names(fence.expression_attribute_names().cloned())
            .set_expression_attribute_values(fence.expression_attribute_values().cloned())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let err = match result {
            Ok(_) => return Fence::Landed,
            Err(e) => e,
        };
        let message = DisplayErrorContext(&err).to_string();
        match classify(StoreOp::Checkpoint, &self.lease_table, key, err) {
            ClassifiedError::ConditionFailed(item) => Fence::Refused(item),
            ClassifiedError::Store(e) => Fence::Failed {
                message,
                retryable: e.is_retryable(),
            },
        }
    }
}

/// The commit did not land and never will: the fence landed first.
fn not_committed(why: String) -> Outcome {
    Outcome::Fail(TransactionError::Failed {
        message: format!(
            "{why} (not committed: settled after the last attempt, no attempt can land any more)"
        ),
        retries_exhausted: true,
    })
}

/// Whether the commit landed is unknown: settling failed for `problem`.
fn unknown(why: String, problem: &str) -> Outcome {
    Outcome::Fail(TransactionError::Failed {
        message: format!(
            "{why} (whether an attempt committed is unknown: settling it failed: {problem})"
        ),
        retries_exhausted: true,
    })
}
