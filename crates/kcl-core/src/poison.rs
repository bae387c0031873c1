//! Poison records: records a processor keeps failing on. Under
//! [`FailurePolicy::Isolate`](crate::processor::FailurePolicy::Isolate) a
//! failing batch is split in halves until the failing records stand alone,
//! each of those is retried up to a number of attempts (or until it is too
//! old), and then handed to a [`FailureDestination`] the application
//! chooses, or dropped if it chose to drop (counted, logged and exposed as
//! `kcl_poison_records_total{outcome="dropped"}`).
//!
//! The checkpoint passes a poison record only after its destination
//! accepted it: a crash or a lease move before that delivers it again.
//!
//! A send that never answers (a connection dead without a reset, which the
//! SDK's default settings wait on forever) must not hold the shard: each
//! attempt is cut after [`PoisonPolicy::send_attempt_timeout`], and once
//! [`PoisonPolicy::send_deadline`] has passed without a send accepted, the
//! shard is given back with its checkpoint before the record. A record the
//! destination says it can never store ([`CannotStore`]) keeps the shard
//! instead: another worker would fail the same way.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::context::{ProcessorError, ShardContext};
use crate::record::Record;

/// Why a record was given up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureReason {
    /// The processor failed on it [`PoisonPolicy::max_attempts`] times.
    MaxAttempts,
    /// It failed while older than [`PoisonPolicy::max_record_age`].
    MaxRecordAge,
}

impl FailureReason {
    /// A stable lower-case name, for metric labels and destinations.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::MaxAttempts => "max_attempts",
            FailureReason::MaxRecordAge => "max_record_age",
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One record given up on, with what is known about its failure.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FailedRecord {
    /// Where it came from.
    pub shard: ShardContext,
    /// The record as the processor saw it.
    pub record: Record,
    /// The processor's last error, as text (the error itself is not
    /// `Clone`, and destinations store text anyway).
    pub error: String,
    /// How many times the processor failed on it (on it alone, when the
    /// batch was bisected).
    pub attempts: u32,
    /// Why it was given up on.
    pub reason: FailureReason,
    /// When it was given up on.
    pub failed_at: SystemTime,
}

impl FailedRecord {
    /// A record given up on now (for destinations' tests; the worker
    /// makes these).
    pub fn new(
        shard: ShardContext,
        record: Record,
        error: String,
        attempts: u32,
        reason: FailureReason,
    ) -> Self {
        FailedRecord {
            shard,
            record,
            error,
            attempts,
            reason,
            failed_at: SystemTime::now(),
        }
    }

    /// The error text cut to at most `max_bytes` (at a character boundary),
    /// for destinations with item or record size limits.
    pub fn error_within(&self, max_bytes: usize) -> &str {
        if self.error.len() <= max_bytes {
            return &self.error;
        }
        let mut end = max_bytes;
        while !self.error.is_char_boundary(end) {
            end -= 1;
        }
        &self.error[..end]
    }

    /// `stream/shard/sequence/sub-sequence`: the record's place in its
    /// source stream, which names it in destinations (a key, a document id)
    /// and in their errors.
    pub fn id(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.shard.stream,
            self.shard.shard_id,
            self.record.sequence_number,
            self.record.sub_sequence_number
        )
    }
}

/// The error a [`FailureDestination`] returns for records it can never
/// store, whoever sends them and however often: one too big for it, one it
/// cannot encode. Return it (boxed, or as the source of the error returned)
/// when retrying can never help.
///
/// The worker then keeps the shard rather than giving it back at the
/// policy's deadline (the next owner would read the same record and fail
/// the same way, and the lease would move around the fleet for ever): it
/// logs the record and the reason at error level, counts the refusal in
/// `kcl_failure_destination_cannot_store_total`, and retries with capped
/// backoff, so that a change to the destination (a larger limit, a
/// redeploy) lets the record through. The checkpoint never passes it
/// before that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CannotStore {
    reason: String,
}

impl CannotStore {
    /// Records are refused for good, because of `reason` (which should
    /// name the record and what it would take to store it).
    pub fn new(reason: impl Into<String>) -> Self {
        CannotStore {
            reason: reason.into(),
        }
    }

    /// Why the records cannot be stored.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The `CannotStore` in `error` or in its chain of sources, if any.
    pub fn find<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a CannotStore> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(found) = e.downcast_ref::<CannotStore>() {
                return Some(found);
            }
            next = e.source();
        }
        None
    }
}

impl fmt::Display for CannotStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for CannotStore {}

/// Where records go that a processor keeps failing on: a dead-letter
/// stream, a table, a queue. `kcl-kinesis` and `kcl-dynamodb` have ready
/// ones (`KinesisDestination`, `DynamoDbDestination`).
///
/// `send` is retried with backoff, and the shard waits meanwhile: nothing
/// passes the checkpoint unless its destination accepted it. An attempt
/// that runs past [`PoisonPolicy::send_attempt_timeout`] is dropped (its
/// future is cancelled) and counts as failed; once
/// [`PoisonPolicy::send_deadline`] has passed, the shard is given back
/// (its lease released) and whoever takes it next reads the records again
/// and sends them again. A send that fails or is cut after writing part of
/// the records is retried whole, so a destination may see a record twice
/// (delivery is at-least-once, as for the processor itself).
///
/// A destination that cannot store a record whole must fail the send
/// (unless its user chose to cut records), not leave the data out: the
/// source stream's copy is the only other one, until its retention ends.
/// When no retry could ever store it, fail with [`CannotStore`]: the
/// shard then stays with this worker, its checkpoint before the record,
/// instead of being given back at the deadline.
#[async_trait]
pub trait FailureDestination: Send + Sync + 'static {
    /// Stores `failed` durably; `Ok` means the shard may move past them.
    async fn send(&self, failed: &[FailedRecord]) -> Result<(), ProcessorError>;
}

/// A destination shared with the application (to read back what it got,
/// or to use one for several workers).
#[async_trait]
impl<T: FailureDestination + ?Sized> FailureDestination for Arc<T> {
    async fn send(&self, failed: &[FailedRecord]) -> Result<(), ProcessorError> {
        (**self).send(failed).await
    }
}

/// What happens to a record given up on.
#[derive(Clone)]
enum Action {
    Send(Arc<dyn FailureDestination>),
    Drop,
}

/// How [`FailurePolicy::Isolate`](crate::processor::FailurePolicy::Isolate)
/// finds and sets aside poison records.
///
/// Defaults: 3 attempts, no age limit, bisection on; each send to the
/// destination cut after [`DEFAULT_SEND_ATTEMPT_TIMEOUT`], the shard given
/// back after [`DEFAULT_SEND_DEADLINE`] without a send accepted.
#[derive(Clone, derive_more::Debug)]
pub struct PoisonPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) max_record_age: Option<Duration>,
    pub(crate) bisect: bool,
    pub(crate) send_attempt_timeout: Duration,
    pub(crate) send_deadline: Duration,
    // A destination is code, not a setting: shown by what is done.
    #[debug("{:?}", match action {
        Action::Send(_) => "send to destination",
        Action::Drop => "drop",
    })]
    action: Action,
}

/// How long one [`FailureDestination::send`] may run by default. Far above
/// a healthy write (a `PutRecords` of 5 MiB, a few hundred `PutItem`s) with
/// the SDK's own retries, far below "forever".
pub const DEFAULT_SEND_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the sends of one group of records may go on failing by default
/// before the shard is given back: long enough to ride out a throttling
/// burst or a short outage without moving the lease, short enough that a
/// shard is not held unread for long by a destination this worker cannot
/// reach.
pub const DEFAULT_SEND_DEADLINE: Duration = Duration::from_secs(5 * 60);

impl PoisonPolicy {
    /// Records given up on go to `destination` (an `Arc` of one is a
    /// destination too, to keep a handle on it).
    pub fn send_to(destination: impl FailureDestination) -> Self {
        Self::with_action(Action::Send(Arc::new(destination)))
    }

    /// Records given up on are dropped: logged at error level with their
    /// position and error, and counted in
    /// `kcl_poison_records_total{outcome="dropped"}`.
    pub fn drop_failed() -> Self {
        Self::with_action(Action::Drop)
    }

    fn with_action(action: Action) -> Self {
        PoisonPolicy {
            max_attempts: 3,
            max_record_age: None,
            bisect: true,
            send_attempt_timeout: DEFAULT_SEND_ATTEMPT_TIMEOUT,
            send_deadline: DEFAULT_SEND_DEADLINE,
            action,
        }
    }

    crate::setters!(self {
        /// How many times the processor may fail on a record before it is
        /// given up on; at least 1. With bisection, a record's attempts are
        /// counted once it stands alone (the splits before do not count).
        max_attempts(n: u32),

        /// A record that fails while older than `age` (by its approximate
        /// arrival time) is given up on at once, whatever its attempts.
        max_record_age(age: Duration) = Some(age),

        /// Whether a failing batch is split in halves to find the failing
        /// records (default on; halves are tried at once, a lone record with
        /// backoff). Off, a batch that fails `max_attempts` times is given up
        /// on whole, every record of it.
        ///
        /// Attempts are spent on any failure: while a dependency of the
        /// processor is down, every record runs out of them in turn. Choose
        /// `max_attempts` (the backoff doubles from 100 ms up to the worker's
        /// `max_backoff`) for the outage to ride out, or keep
        /// `FailurePolicy::Retry` where no record may ever be set aside.
        bisect(on: bool),

        /// How long one send to the destination may run before it is cut
        /// (cancelled) and retried with backoff; above zero. Default
        /// [`DEFAULT_SEND_ATTEMPT_TIMEOUT`]. One send carries every record
        /// given up on together (a whole batch without bisection), so leave
        /// room for the largest such group.
        send_attempt_timeout(timeout: Duration),

        /// How long sends of one group of records may go on failing or timing
        /// out before the shard is given back: its lease is released with the
        /// checkpoint before the records, so that this worker or another one
        /// reads them again and retries, rather than the shard staying held
        /// and unread. Above zero; default [`DEFAULT_SEND_DEADLINE`]. Each
        /// give-back is counted in `kcl_failure_destination_deadlines_total`.
        /// A refusal with [`CannotStore`] starts the deadline over: the shard
        /// is kept while the destination says no worker could store the
        /// records.
        send_deadline(deadline: Duration),
    });

    /// What is wrong with the settings, if anything.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        if self.max_attempts == 0 {
            Some(
                "Isolate needs max_attempts of at least 1 (1 gives up on a record at its first failure)",
            )
        } else if self.send_attempt_timeout.is_zero() {
            Some("the poison policy's send_attempt_timeout must be above zero")
        } else if self.send_deadline.is_zero() {
            Some("the poison policy's send_deadline must be above zero")
        } else if self.send_attempt_timeout > crate::config::MAX_DURATION
            || self.send_deadline > crate::config::MAX_DURATION
        {
            Some(
                "the poison policy's send_attempt_timeout and send_deadline must be at most a year",
            )
        } else {
            None
        }
    }

    pub(crate) fn destination(&self) -> Option<&Arc<dyn FailureDestination>> {
        match &self.action {
            Action::Send(d) => Some(d),
            Action::Drop => None,
        }
    }

    /// Why `record`, which just failed after `attempts` attempts, is to be
    /// given up on, or `None` if it gets another attempt.
    pub(crate) fn verdict(&self, record: &Record, attempts: u32) -> Option<FailureReason> {
        let too_old = self.max_record_age.is_some_and(|max| {
            record
                .approximate_arrival
                .and_then(|at| SystemTime::now().duration_since(at).ok())
                .is_some_and(|age| age >= max)
        });
        if too_old {
            Some(FailureReason::MaxRecordAge)
        } else if attempts >= self.max_attempts {
            Some(FailureReason::MaxAttempts)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests;
