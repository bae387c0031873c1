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

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::processor::{ProcessorError, ShardContext};
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
}

/// Where records go that a processor keeps failing on: a dead-letter
/// stream, a table, a queue. `kcl-kinesis` and `kcl-dynamodb` have ready
/// ones (`KinesisDestination`, `DynamoDbDestination`).
///
/// `send` is retried with backoff until it succeeds or the shard's lease
/// ends, and the shard waits meanwhile: nothing passes the checkpoint
/// unless its destination accepted it. A send that fails after writing
/// part of the records is retried whole, so a destination may see a record
/// twice (delivery is at-least-once, as for the processor itself).
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
/// Defaults: 3 attempts, no age limit, bisection on.
#[derive(Clone)]
pub struct PoisonPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) max_record_age: Option<Duration>,
    pub(crate) bisect: bool,
    action: Action,
}

impl fmt::Debug for PoisonPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoisonPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("max_record_age", &self.max_record_age)
            .field("bisect", &self.bisect)
            .field(
                "action",
                &match self.action {
                    Action::Send(_) => "send to destination",
                    Action::Drop => "drop",
                },
            )
            .finish()
    }
}

impl PoisonPolicy {
    /// Records given up on go to `destination` (an `Arc` of one is a
    /// destination too, to keep a handle on it).
    pub fn send_to(destination: impl FailureDestination) -> Self {
        PoisonPolicy {
            max_attempts: 3,
            max_record_age: None,
            bisect: true,
            action: Action::Send(Arc::new(destination)),
        }
    }

    /// Records given up on are dropped: logged at error level with their
    /// position and error, and counted in
    /// `kcl_poison_records_total{outcome="dropped"}`.
    pub fn drop_failed() -> Self {
        PoisonPolicy {
            max_attempts: 3,
            max_record_age: None,
            bisect: true,
            action: Action::Drop,
        }
    }

    /// How many times the processor may fail on a record before it is
    /// given up on; at least 1. With bisection, a record's attempts are
    /// counted once it stands alone (the splits before do not count).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// A record that fails while older than `age` (by its approximate
    /// arrival time) is given up on at once, whatever its attempts.
    pub fn max_record_age(mut self, age: Duration) -> Self {
        self.max_record_age = Some(age);
        self
    }

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
    pub fn bisect(mut self, on: bool) -> Self {
        self.bisect = on;
        self
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
mod tests {
    use super::*;

    fn record(age: Option<Duration>) -> Record {
        Record {
            data: bytes::Bytes::from_static(b"x"),
            partition_key: "k".into(),
            explicit_hash_key: None,
            sequence_number: "1".into(),
            sub_sequence_number: 0,
            approximate_arrival: age.map(|a| SystemTime::now() - a),
            aggregated: false,
        }
    }

    #[test]
    fn a_long_error_is_cut_at_a_character_boundary() {
        let ctx = ShardContext {
            stream: "s".into(),
            shard_id: "sh".into(),
            lease_key: "sh".into(),
            worker_id: "w".into(),
            lane: None,
        };
        let f = FailedRecord::new(
            ctx,
            record(None),
            "é".repeat(10),
            1,
            FailureReason::MaxAttempts,
        );
        assert_eq!(f.error_within(5), "éé");
        assert_eq!(f.error_within(100), f.error);
    }

    #[test]
    fn a_record_is_given_up_on_after_its_attempts_or_when_too_old() {
        let p = PoisonPolicy::drop_failed()
            .max_attempts(3)
            .max_record_age(Duration::from_secs(60));
        let fresh = record(Some(Duration::from_secs(1)));
        assert_eq!(p.verdict(&fresh, 2), None);
        assert_eq!(p.verdict(&fresh, 3), Some(FailureReason::MaxAttempts));
        let old = record(Some(Duration::from_secs(61)));
        assert_eq!(p.verdict(&old, 1), Some(FailureReason::MaxRecordAge));
        // No arrival time: only the attempts count.
        assert_eq!(p.verdict(&record(None), 1), None);
    }
}
