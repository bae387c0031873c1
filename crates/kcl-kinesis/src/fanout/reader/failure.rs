//! What the subscription task does when a subscription fails: count it,
//! find out what a missing shard or a rejected start means, report what
//! keeps failing, and back off before the next subscription.

use std::sync::Arc;

use kcl_core::backoff::Pauses;
use kcl_core::metric_names::{KINESIS_ACCESS_ERRORS, KINESIS_THROTTLES};
use kcl_core::source::{Batch, ChildShard, SourceError};
use tracing::{debug, warn};

use tokio::time::{Duration, Instant};

use super::Subscriber;
use crate::calls::classify::{Class, Classified};
use crate::calls::retry::{ForReader, retryable};
use crate::fanout::api::IN_USE;
use crate::gone::{Missing, past_trim_horizon, why_missing};
use crate::task_reader::Delivery;

/// How long subscriptions may be answered `ResourceInUse` before it is
/// warned about: six times the 5 s after which AWS lets a new subscription
/// take a shard over.
pub(super) const IN_USE_REPORT_AFTER: Duration = Duration::from_secs(30);

/// A run of subscriptions answered `ResourceInUse`, reset by an event.
#[derive(Debug, Default)]
pub(super) struct InUse {
    /// When the first of the run was answered.
    since: Option<Instant>,
    /// Whether the run was warned about.
    reported: bool,
}

impl Subscriber {
    /// Handles a failed subscription: waits before the next one, reports
    /// persistent transient failures, ends the reader on fatal ones.
    /// `Ok(false)` when the task is done: the reader went away, or the
    /// shard turned out to be past retention and its end was queued.
    pub(super) async fn failed(
        &mut self,
        c: Classified,
        backoff: &mut Pauses,
    ) -> Result<bool, SourceError> {
        self.shared.stats.subscription_error();
        self.meters.error(&c);
        let in_use = c.code.as_deref() == Some(IN_USE);
        match c.class {
            Class::Throttled => self.count_throttle(),
            // Another subscription of this consumer still holds the shard:
            // the previous owner's (AWS lets a new one take over after 5 s,
            // kinesis-mock once the old connection is gone) or our own
            // previous one, not yet torn down. Waiting it out is the only
            // remedy, and it is not a failure worth reporting unless it
            // lasts.
            Class::Transient if in_use => self.held_elsewhere(),
            Class::Transient => {
                self.transient_failures += 1;
                if self.transient_failures > self.fanout.config.retry.max_transient {
                    self.transient_failures = 0;
                    let e = retryable(&self.stream, &self.shard_id, c.error);
                    warn!(stream = %self.stream, shard = %self.shard_id, error = %e,
                        "subscriptions keep failing; still retrying");
                    if self.tx.send(Err(e)).await.is_err() {
                        return Ok(false);
                    }
                    return self.back_off(backoff).await.map(|()| true);
                }
            }
            Class::AccessDenied => self.access_denied(&c),
            Class::NotFound => return self.not_found(c, backoff).await,
            Class::InvalidArgument => return self.invalid_argument(c, backoff).await,
            _ => return Err(self.fatal(c, "Kinesis rejected the subscription")),
        }
        debug!(stream = %self.stream, shard = %self.shard_id, code = ?c.code, error = %c.error,
            "subscription failed; subscribing again");
        self.back_off(backoff).await.map(|()| true)
    }

    /// Notes a subscription answered `ResourceInUse`, and warns once when
    /// such answers have lasted [`IN_USE_REPORT_AFTER`] with no event: AWS
    /// lets a new subscription take over after 5 s, so a shard held longer
    /// is held by a subscriber that keeps subscribing, another application
    /// registered under the same consumer name most likely. Both would
    /// read the shard by turns.
    fn held_elsewhere(&mut self) {
        let now = Instant::now();
        let since = *self.in_use.since.get_or_insert(now);
        let held_for = now.duration_since(since);
        if self.in_use.reported || held_for < IN_USE_REPORT_AFTER {
            return;
        }
        self.in_use.reported = true;
        warn!(stream = %self.stream, shard = %self.shard_id, consumer = %self.consumer_arn,
            ?held_for,
            "another subscriber of this stream consumer has held the shard's subscription \
             for {:?} (ResourceInUse): is another application registered under the same \
             consumer name? Still subscribing", held_for);
    }

    /// Counts a throttled subscription.
    fn count_throttle(&self) {
        self.shared.stats.throttle();
        metrics::counter!(
            KINESIS_THROTTLES,
            "stream" => self.stream.clone(),
            "call" => "subscribe_to_shard"
        )
        .increment(1);
    }

    /// Counts and logs a subscription denied access. The stream's KMS key
    /// or the permissions: only an operator can fix them, and every worker
    /// would fail alike, so the shard stays here and the subscription is
    /// retried.
    fn access_denied(&self, c: &Classified) {
        self.shared.stats.access_denied();
        metrics::counter!(
            KINESIS_ACCESS_ERRORS,
            "stream" => self.stream.clone(),
            "call" => "subscribe_to_shard",
            "code" => c.code.clone().unwrap_or_default()
        )
        .increment(1);
        if let Some(calls) = crate::calls::retry::DENIED.hit() {
            warn!(stream = %self.stream, shard = %self.shard_id, code = ?c.code, calls,
                error = %c.error,
                "access to the stream or its KMS key is denied ({calls} calls since the last \
                 warning); keeping the shards and subscribing again until the permissions or \
                 the key are fixed");
        }
    }

    /// `ResourceNotFound`: why the shard is missing decides. Past
    /// retention the shard is over (its end is queued); a deleted stream
    /// ends the reader; a listed shard is [`Self::listed_not_found`].
    async fn not_found(
        &mut self,
        c: Classified,
        backoff: &mut Pauses,
    ) -> Result<bool, SourceError> {
        let missing = why_missing(&self.shared, &self.stream, &self.shard_id).await;
        let Some(missing) = self.unless_retryable(missing, backoff).await? else {
            return Ok(true);
        };
        match missing {
            // Past retention: the shard is over.
            Missing::Expired(children) => {
                self.send_end(children).await;
                Ok(false)
            }
            Missing::Stream => Err(SourceError::StreamNotFound {
                stream: self.stream.clone(),
            }),
            Missing::Listed => self.listed_not_found(c, backoff).await,
        }
    }

    /// `InvalidArgument`: a start behind the trim horizon restarts there;
    /// anything else is fatal.
    async fn invalid_argument(
        &mut self,
        c: Classified,
        backoff: &mut Pauses,
    ) -> Result<bool, SourceError> {
        let position = self.position();
        let trimmed = past_trim_horizon(
            &self.shared,
            &self.stream,
            &self.shard_id,
            &position,
            ForReader {
                lease: &self.lease,
                answers: &self.answers,
            },
        )
        .await;
        let Some(trimmed) = self.unless_retryable(trimmed, backoff).await? else {
            return Ok(true);
        };
        match trimmed {
            Some(horizon) => {
                self.restart_at = Some(horizon);
                Ok(true)
            }
            None => Err(self.fatal(c, "Kinesis rejected the subscription")),
        }
    }

    /// `ResourceNotFound` for a shard that is not gone (listed, or too new
    /// for the listing): either the consumer was deregistered, or the
    /// answer about the shard was stale, as for a child right after a
    /// split. Only a missing consumer is dropped (the next open registers
    /// it again) and ends the reader; a stale answer is reported and
    /// retried with backoff, as polling does, and the consumer kept.
    async fn listed_not_found(
        &mut self,
        c: Classified,
        backoff: &mut Pauses,
    ) -> Result<bool, SourceError> {
        let registered = self
            .fanout
            .is_registered(&self.shared, &self.stream, &self.consumer_arn)
            .await;
        match self.unless_retryable(registered, backoff).await? {
            None => Ok(true),
            Some(true) => {
                let e = retryable(&self.stream, &self.shard_id, c.error);
                self.report_and_back_off(e, backoff).await?;
                Ok(true)
            }
            Some(false) => {
                self.fanout.forget(&self.stream, &self.consumer_arn);
                Err(self.fatal(c, "the stream consumer does not exist"))
            }
        }
    }

    /// The answer of a lookup made to handle a failure, or `None` when the
    /// lookup itself failed retryably: then that was reported and backed
    /// off, and the subscription is to be made again.
    async fn unless_retryable<T>(
        &self,
        answer: Result<T, SourceError>,
        backoff: &mut Pauses,
    ) -> Result<Option<T>, SourceError> {
        match answer {
            Ok(answer) => Ok(Some(answer)),
            Err(e) if e.is_retryable() => {
                self.report_and_back_off(e, backoff).await?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Tells the reader about a failure the task keeps retrying, then
    /// waits out the next backoff step.
    async fn report_and_back_off(
        &self,
        e: SourceError,
        backoff: &mut Pauses,
    ) -> Result<(), SourceError> {
        warn!(stream = %self.stream, shard = %self.shard_id, error = %e,
            "Kinesis keeps failing; still retrying");
        // If the reader is gone the task ends at its next check.
        let _ = self.tx.send(Err(e)).await;
        self.back_off(backoff).await
    }

    /// Queues the end of a shard that has no records left (it expired).
    /// False if the reader is gone.
    async fn send_end(&self, children: Vec<ChildShard>) -> bool {
        let Ok(budget) = Arc::clone(&self.bytes).acquire_many_owned(0).await else {
            return false;
        };
        let worker = self.shared.budget.nothing();
        let batch = Batch {
            records: Vec::new(),
            millis_behind_latest: Some(0),
            shard_end: Some(children),
        };
        self.tx
            .send(Ok(Delivery::new(batch, (budget, worker))))
            .await
            .is_ok()
    }
}
