//! One policy for what goes wrong opening or reading a shard. An error
//! means the same at open as mid-read: a shard this worker cannot read is
//! given back after a few attempts wherever the error shows, instead of
//! being kept (and never read) because the error came at open.
//!
//! Whatever the errors, a shard is also given back once no read of it
//! succeeded, and the service answered none of its calls, for
//! `max_read_failure_time`: a worker cut off from the stream (its calls
//! unanswered) while it still reaches the lease table would otherwise renew
//! the lease of a shard it cannot read for as long as the outage lasts.
//! Errors the service sends (a disabled KMS key, throttling) are answers:
//! every worker would meet them alike, so they keep the shard in place
//! (see [`AnswerClock`]).

use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, warn};

use super::{Consumer, Stop};
use crate::backoff::Pauses;
use crate::metric_names::UNREADABLE_SHARDS_RELEASED;
use crate::source::{AnswerClock, SourceError};

/// Fatal errors in a row (at open or mid-read, until a batch arrives)
/// after which the shard is given back. Another worker, or this one in a
/// later tenure, starts afresh; a few attempts first ride out what a
/// reopen fixes (a reader that lost its place).
const FATAL_ATTEMPTS: u32 = 5;

/// How often a consumer past its read deadline looks again for the silence
/// that gives the shard back (see [`ReadFailures::expired`]).
const RECHECK: Duration = Duration::from_secs(1);

/// Where an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Opening a reader.
    Open,
    /// Fetching from an open reader.
    Read,
}

impl Stage {
    fn label(self) -> &'static str {
        match self {
            Stage::Open => "open",
            Stage::Read => "read",
        }
    }
}

/// How the consumer goes on after an error it does not stop for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// The reader goes on by itself: fetch from it again.
    Fetch,
    /// Open a new reader where the last batch left off.
    Reopen,
}

/// The failures of one consumer's reading since its last batch, and the
/// pauses between its attempts.
pub(super) struct ReadFailures {
    backoff: Pauses,
    fatal: u32,
    /// When the attempts since the last batch began; `None` between a
    /// batch and the next attempt, a time the processor has, not the
    /// reader.
    since: Option<Instant>,
    /// How long the attempts may go on without a batch or an answer.
    limit: Duration,
    /// When the service last answered this consumer's reader, which the
    /// source is told of through every open.
    answers: AnswerClock,
}

impl ReadFailures {
    pub(super) fn new(c: &Consumer) -> Self {
        ReadFailures {
            backoff: c.setup.backoff.pauses(),
            fatal: 0,
            since: None,
            limit: c.setup.max_read_failure_time,
            answers: AnswerClock::default(),
        }
    }

    /// The clock the source tells of its answers to this consumer's calls.
    pub(super) fn answers(&self) -> &AnswerClock {
        &self.answers
    }

    /// A batch arrived: the failures before it no longer count.
    pub(super) fn reset(&mut self) {
        self.backoff.reset();
        self.fatal = 0;
        self.since = None;
    }

    /// When the shard is given back unless a read succeeds or the service
    /// answers first; an attempt calls it as it starts, which starts the
    /// clock if none runs. An answer since then moves it: the limit counts
    /// from the later of the two.
    pub(super) fn deadline(&mut self) -> Instant {
        let since = *self.since.get_or_insert_with(Instant::now);
        let from = self
            .answers
            .last()
            .map_or(since, |answered| answered.max(since));
        // A limit of `Duration::MAX` (never give the shard back) lands past
        // what an Instant holds: a deadline in thirty years stands for it.
        from.checked_add(self.limit)
            .unwrap_or_else(|| from + Duration::from_secs(30 * 365 * 24 * 3600))
    }

    /// Whether the shard is to be given back: nothing succeeded and the
    /// service answered nothing for the limit, and a call went unanswered
    /// in that time (a timeout, a connection that failed). Without that
    /// silence the reader waits on the worker's own limits (its prefetch
    /// budget, its pacing) or the process was paused: the route to the
    /// service is not shown broken. A source that never tells the clock
    /// has every failure count.
    pub(super) fn expired(&mut self) -> bool {
        let deadline = self.deadline();
        if Instant::now() < deadline {
            return false;
        }
        if !self.answers.is_told() {
            return true;
        }
        // The deadline is the limit after the later of the first failed
        // attempt and the last answer.
        let from = deadline.checked_sub(self.limit).unwrap_or(deadline);
        self.answers.last_silence().is_some_and(|s| s >= from)
    }

    /// When to look again whether the shard is to be given back: at the
    /// deadline, or, past it with no silence heard yet, a second on.
    pub(super) fn next_check(&mut self) -> Instant {
        self.deadline().max(Instant::now() + RECHECK)
    }

    /// No read succeeded and no call was answered for the limit (the last
    /// attempt failed, or is still unanswered at `stage`): why the
    /// consumer stops.
    pub(super) fn unanswered(&self, c: &Consumer, stage: Stage) -> Stop {
        error!(stage = stage.label(), limit = ?self.limit,
            "no read of the shard succeeded and Kinesis answered none of its calls within max_read_failure_time; giving it back so that a worker that can read takes it");
        metrics::counter!(
            UNREADABLE_SHARDS_RELEASED,
            "stream" => c.ctx.stream.clone(),
            "shard" => c.ctx.shard_id.clone(),
            "stage" => "stalled"
        )
        .increment(1);
        Stop::Unreadable
    }

    /// Waits out the next pause, cut short at the deadline, where the
    /// shard is given back instead of tried again.
    async fn pause(&mut self, c: &Consumer, stage: Stage) -> Result<(), Stop> {
        let pause = self.backoff.next_or_max();
        if self.expired() {
            return Err(self.unanswered(c, stage));
        }
        let now = Instant::now();
        let deadline = self.deadline();
        c.pause(if deadline > now {
            pause.min(deadline - now)
        } else {
            pause
        })
        .await?;
        if self.expired() {
            return Err(self.unanswered(c, stage));
        }
        Ok(())
    }

    /// Judges `e`, met at `stage`: waits out the next pause and says how
    /// to go on, or says why the consumer stops.
    ///
    /// A transient error is retried for as long as it lasts. A deleted
    /// stream keeps the shard: every worker would find the same, so the
    /// lease and its checkpoint stay here; the stream tracker retires the
    /// consumer if the stream is dropped from the application, and the
    /// removed-stream policy decides about its leases. Anything
    /// else (an argument Kinesis rejects, a shard that vanished) is tried
    /// [`FATAL_ATTEMPTS`] times in a row, then the shard is given back.
    pub(super) async fn judge(
        &mut self,
        c: &Consumer,
        stage: Stage,
        e: SourceError,
    ) -> Result<Retry, Stop> {
        match e {
            SourceError::LeaseLost { .. } => Err(c.still_ours().err().unwrap_or(Stop::LeaseLost)),
            e if e.is_retryable() => {
                warn!(stage = stage.label(), error = %e, "reading the shard failed; retrying");
                self.pause(c, stage).await?;
                Ok(Retry::Fetch)
            }
            e @ SourceError::StreamNotFound { .. } => {
                error!(stage = stage.label(), error = %e,
                    "the stream is gone; keeping the shard and checking again");
                // An answer, and the same for every worker: no reason to
                // give the shard back.
                self.since = None;
                c.pause(self.backoff.next_or_max()).await?;
                Ok(Retry::Reopen)
            }
            e => self.fatal(c, stage, e).await,
        }
    }

    async fn fatal(&mut self, c: &Consumer, stage: Stage, e: SourceError) -> Result<Retry, Stop> {
        self.fatal += 1;
        if self.fatal >= FATAL_ATTEMPTS {
            error!(stage = stage.label(), error = %e, attempts = self.fatal,
                "the shard cannot be read; giving it back so that it is tried afresh");
            metrics::counter!(
                UNREADABLE_SHARDS_RELEASED,
                "stream" => c.ctx.stream.clone(),
                "shard" => c.ctx.shard_id.clone(),
                "stage" => stage.label()
            )
            .increment(1);
            return Err(Stop::Release);
        }
        error!(stage = stage.label(), error = %e, attempt = self.fatal,
            "the shard reader failed; opening it again");
        self.pause(c, stage).await?;
        Ok(Retry::Reopen)
    }
}
