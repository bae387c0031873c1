//! One policy for what goes wrong opening or reading a shard. An error
//! means the same at open as mid-read: a shard this worker cannot read is
//! given back after a few attempts wherever the error shows, instead of
//! being kept (and never read) because the error came at open.

use tracing::{error, warn};

use super::{Consumer, Stop};
use crate::backoff::Pauses;
use crate::source::SourceError;

/// Fatal errors in a row (at open or mid-read, until a batch arrives)
/// after which the shard is given back. Another worker, or this one in a
/// later tenure, starts afresh; a few attempts first ride out what a
/// reopen fixes (a reader that lost its place).
const FATAL_ATTEMPTS: u32 = 5;

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
}

impl ReadFailures {
    pub(super) fn new(c: &Consumer) -> Self {
        ReadFailures {
            backoff: c.setup.backoff.pauses(),
            fatal: 0,
        }
    }

    /// A batch arrived: the failures before it no longer count.
    pub(super) fn reset(&mut self) {
        self.backoff.reset();
        self.fatal = 0;
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
                c.pause(self.backoff.next_or_max()).await?;
                Ok(Retry::Fetch)
            }
            e @ SourceError::StreamNotFound { .. } => {
                error!(stage = stage.label(), error = %e,
                    "the stream is gone; keeping the shard and checking again");
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
                "kcl_unreadable_shards_released_total",
                "stream" => c.ctx.stream.clone(),
                "shard" => c.ctx.shard_id.clone(),
                "stage" => stage.label()
            )
            .increment(1);
            return Err(Stop::Release);
        }
        error!(stage = stage.label(), error = %e, attempt = self.fatal,
            "the shard reader failed; opening it again");
        c.pause(self.backoff.next_or_max()).await?;
        Ok(Retry::Reopen)
    }
}
