//! Setting records aside: to the policy's destination, each attempt cut by
//! its timeout and every attempt by the policy's deadline, or dropped.
//!
//! The destination is reached on the application's behalf, so kcl bounds
//! it: an SDK client sets no operation timeout by default, and a write on a
//! connection that died without a reset waits forever. Without a bound,
//! the shard would be held and unread for as long as the lease lives, which
//! under liveness records is as long as the worker runs.
//!
//! A destination that refuses records for good ([`CannotStore`]) is not
//! helped by another worker: the shard is kept, and the send retried with
//! capped backoff until the destination changes.

use tokio::time::{Instant, timeout};
use tracing::{error, warn};

use super::super::{Consumer, Stop, shard_labels};
use crate::metric_names::{
    FAILURE_DESTINATION_CANNOT_STORE, FAILURE_DESTINATION_DEADLINES, FAILURE_DESTINATION_ERRORS,
    POISON_RECORDS,
};
use crate::poison::{CannotStore, FailedRecord, FailureDestination, PoisonPolicy};
use crate::warn_limit::{RateLimitedWarn, WARN_INTERVAL};

/// Why one send did not store the records.
enum Refusal {
    /// This attempt failed or timed out; another may not.
    Failed(String),
    /// The destination can never store them ([`CannotStore`]).
    Never(String),
}

/// Sends `failed` to the policy's destination until it accepts them, or
/// drops them, counted and logged. `Err(Stop::Release)` once the policy's
/// deadline passed without a send accepted: the checkpoint has not passed
/// them, so the next owner of the shard reads them again. A refusal for
/// good starts the deadline over: the next owner would be refused too.
pub(super) async fn set_aside(
    c: &Consumer,
    policy: &PoisonPolicy,
    failed: &[FailedRecord],
) -> Result<(), Stop> {
    let Some(destination) = policy.destination() else {
        drop_all(c, failed);
        return Ok(());
    };
    let mut deadline = Instant::now() + policy.send_deadline;
    let mut backoff = c.setup.backoff.pauses();
    let never_log = RateLimitedWarn::new(WARN_INTERVAL);
    loop {
        c.still_ours()?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(give_back(c, policy, failed));
        }
        let attempt = policy.send_attempt_timeout.min(left);
        match send_once(c, destination.as_ref(), failed, attempt).await? {
            Ok(()) => {
                count_sent(c, failed);
                return Ok(());
            }
            Err(Refusal::Failed(why)) => {
                warn!(error = %why, records = failed.len(), "the failure destination did not take the records; retrying");
                count_error(c);
            }
            Err(Refusal::Never(why)) => {
                cannot_store(c, failed, &why, &never_log);
                deadline = Instant::now() + policy.send_deadline;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        c.pause(backoff.next_or_max().min(left)).await?;
    }
}

/// One send, cut after `attempt`. The outer `Err` is why the consumer
/// stops (the lease ended, a handoff, shutdown) meanwhile; the inner one
/// why this attempt did not store the records.
async fn send_once(
    c: &Consumer,
    destination: &dyn FailureDestination,
    failed: &[FailedRecord],
    attempt: std::time::Duration,
) -> Result<Result<(), Refusal>, Stop> {
    let sent = tokio::select! {
        stop = c.stopped() => return Err(stop),
        _ = c.halt.cancelled() => return Err(Stop::Release),
        sent = timeout(attempt, destination.send(failed)) => sent,
    };
    Ok(match sent {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => match CannotStore::find(&*e) {
            Some(never) => Err(Refusal::Never(never.reason().to_owned())),
            None => Err(Refusal::Failed(e.to_string())),
        },
        Err(_) => Err(Refusal::Failed(format!(
            "the send did not complete within {attempt:?}"
        ))),
    })
}

fn count_error(c: &Consumer) {
    metrics::counter!(FAILURE_DESTINATION_ERRORS, &shard_labels(c)).increment(1);
}

/// The destination can never store `failed`: logged at error level (at
/// once, then at most every [`WARN_INTERVAL`] with the refusals since, as
/// it goes on until someone changes the destination) and counted.
fn cannot_store(c: &Consumer, failed: &[FailedRecord], why: &str, log: &RateLimitedWarn) {
    count_error(c);
    metrics::counter!(FAILURE_DESTINATION_CANNOT_STORE, &shard_labels(c)).increment(1);
    let Some(refusals) = log.hit() else {
        return;
    };
    let first = &failed[0].record;
    error!(
        sequence_number = %first.sequence_number,
        sub_sequence_number = first.sub_sequence_number,
        partition_key = %first.partition_key,
        records = failed.len(),
        refusals,
        reason = %why,
        "the failure destination can never store this record; the shard is kept, its \
         checkpoint before the record, and the send retried until the destination changes"
    );
}

/// The deadline passed: the shard goes back with its checkpoint before
/// `failed`, to be read again by whoever takes it next (maybe this worker,
/// with fresh connections; maybe one that can reach the destination).
fn give_back(c: &Consumer, policy: &PoisonPolicy, failed: &[FailedRecord]) -> Stop {
    error!(
        records = failed.len(),
        first = %failed[0].record.sequence_number,
        deadline = ?policy.send_deadline,
        "the failure destination took no send before the deadline; giving the shard back to be read again"
    );
    metrics::counter!(FAILURE_DESTINATION_DEADLINES, &shard_labels(c)).increment(1);
    Stop::Release
}

fn count_sent(c: &Consumer, failed: &[FailedRecord]) {
    warn!(
        records = failed.len(),
        first = %failed[0].record.sequence_number,
        reason = %failed[0].reason,
        "records the processor keeps failing on went to the failure destination"
    );
    metrics::counter!(POISON_RECORDS, &outcome_labels(c, "sent")).increment(failed.len() as u64);
}

fn drop_all(c: &Consumer, failed: &[FailedRecord]) {
    for f in failed {
        error!(
            sequence_number = %f.record.sequence_number,
            sub_sequence_number = f.record.sub_sequence_number,
            partition_key = %f.record.partition_key,
            attempts = f.attempts,
            reason = %f.reason,
            error = %f.error,
            "dropping a record the processor keeps failing on, as configured"
        );
    }
    metrics::counter!(POISON_RECORDS, &outcome_labels(c, "dropped")).increment(failed.len() as u64);
}

fn outcome_labels(c: &Consumer, outcome: &'static str) -> [(&'static str, String); 3] {
    [
        ("stream", c.ctx.stream.clone()),
        ("shard", c.ctx.shard_id.clone()),
        ("outcome", outcome.to_owned()),
    ]
}
