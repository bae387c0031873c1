//! Sending one commit's transaction: each attempt bounded by the attempt
//! timeout and the time left, retried with backoff, and each failure
//! judged by what it says of the commit.

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::CancellationReason;
use tokio::time::Instant;
use tracing::warn;

use super::settle::{Verdict, verdict};

use super::{Commit, ExactlyOnce, Outcome, TransactionError};

/// How sending a commit ended: the last attempt's outcome, and whether an
/// attempt may still land whatever a later one says (it got no answer, a
/// 5xx, or TransactionInProgress).
pub(super) struct Sent {
    pub(super) outcome: Outcome,
    pub(super) unsure: bool,
}

impl ExactlyOnce {
    /// Sends `commit` until an attempt has a verdict, the retries are spent,
    /// or no retry could start before `until`.
    pub(super) async fn send_attempts(&self, commit: &Commit<'_>, until: Instant) -> Sent {
        let mut pauses = self.backoff.pauses();
        let mut unsure = false;
        loop {
            let (outcome, may_land) = self.attempt(commit, until).await;
            unsure |= may_land;
            let Outcome::Retry(why) = outcome else {
                return Sent { outcome, unsure };
            };
            match pauses.next() {
                Some(pause) if Instant::now() + pause < until => {
                    warn!(why, ?pause, "the transactional checkpoint is retried");
                    tokio::time::sleep(pause).await;
                }
                _ => {
                    return Sent {
                        outcome: Outcome::Retry(why),
                        unsure,
                    };
                }
            }
        }
    }

    /// One `TransactWriteItems`, cut at the attempt timeout or at `until`,
    /// and whether it may still land.
    async fn attempt(&self, commit: &Commit<'_>, until: Instant) -> (Outcome, bool) {
        let limit = until
            .saturating_duration_since(Instant::now())
            .min(self.attempt_timeout);
        let call = self
            .client
            .transact_write_items()
            .set_transact_items(Some(commit.items.to_vec()))
            .client_request_token(commit.token)
            .send();
        match tokio::time::timeout(limit, call).await {
            Ok(Ok(_)) => (Outcome::Applied, false),
            Ok(Err(e)) => self.judge(e, commit),
            // Like a lost answer: it may still land. A retry (same token)
            // or the settling finds out.
            Err(_) => (Outcome::Retry(format!("no answer within {limit:?}")), true),
        }
    }

    /// What a failed attempt means, and whether it may still land: only
    /// an attempt without an answer, with a 5xx, or still in progress
    /// (TransactionInProgress) may; a throttled, conflicting, cancelled or
    /// refused one did not.
    fn judge(
        &self,
        err: SdkError<TransactWriteItemsError, aws_smithy_runtime_api::http::Response>,
        commit: &Commit<'_>,
    ) -> (Outcome, bool) {
        let service = match &err {
            SdkError::ServiceError(s) => s.err(),
            // No answer, or an unreadable one: the transaction may have
            // committed; the retry finds out.
            SdkError::TimeoutError(_)
            | SdkError::DispatchFailure(_)
            | SdkError::ResponseError(_) => {
                let why = format!("no answer: {}", DisplayErrorContext(&err));
                return (Outcome::Retry(why), true);
            }
            _ => {
                let failed = TransactionError::Failed {
                    message: DisplayErrorContext(&err).to_string(),
                    retries_exhausted: false,
                };
                return (Outcome::Fail(failed), false);
            }
        };
        if let TransactWriteItemsError::TransactionCanceledException(c) = service {
            return (self.judge_cancelled(c, commit), false);
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
        let may_land = code == "TransactionInProgressException"
            || matches!(code, "InternalServerError" | "ServiceUnavailable")
            || status >= 500;
        let message = format!("{code}: {}", service.message().unwrap_or_default());
        if retryable {
            (Outcome::Retry(message), may_land)
        } else {
            let failed = TransactionError::Failed {
                message,
                retries_exhausted: false,
            };
            (Outcome::Fail(failed), false)
        }
    }

    /// A cancelled transaction: the lease item's reason first (it says
    /// whether an earlier attempt committed), then the caller's items'.
    fn judge_cancelled(
        &self,
        c: &aws_sdk_dynamodb::types::error::TransactionCanceledException,
        commit: &Commit<'_>,
    ) -> Outcome {
        // The lease item is the last one.
        let user_items = commit.items.len() - 1;
        let reasons = c.cancellation_reasons();
        let code = |r: &CancellationReason| r.code().unwrap_or("None").to_owned();
        if let Some(lease) = reasons.get(user_items)
            && code(lease) == "ConditionalCheckFailed"
        {
            return match verdict(
                &self.lease_table,
                lease.item(),
                commit.checkpoint,
                commit.token,
            ) {
                Verdict::Applied => Outcome::Applied,
                Verdict::LeaseLost => Outcome::LeaseLost,
                Verdict::Moved(to) => Outcome::Moved(to),
                // Only a fence of this token is left to fail the condition,
                // and the settling, which fences, tells.
                Verdict::Unchanged => Outcome::Retry(
                    "the lease item's condition failed though it shows this tenure at the \
                     checkpoint replaced"
                        .to_owned(),
                ),
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
        Outcome::Fail(TransactionError::Failed {
            message: format!(
                "cancelled ({}): {}",
                codes.join(", "),
                c.message().unwrap_or_default()
            ),
            retries_exhausted: false,
        })
    }
}
