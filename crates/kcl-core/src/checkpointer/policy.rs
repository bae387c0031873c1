//! How often a shard's checkpoint is written: every `checkpoint()` call,
//! or at most once per period or per so many records.
//!
//! A processor that checkpoints every batch writes the lease item once per
//! batch: with fast pacing (small batches) that is several writes a second
//! per shard, the bulk of a busy fleet's DynamoDB bill. A policy coalesces
//! those calls: a call that comes before the period (or the record count)
//! is up is remembered, not written, and the latest position asked for is
//! written once it is up, at the first fetch after that, and always at the
//! end of the shard's tenure while the lease is still held (a graceful
//! shutdown, a handoff: `shutdown_requested`; a shard given back under
//! `ReleaseShard`, a processor timeout or an unreadable shard) and at
//! SHARD_END. So a policy only changes how many records a *crash* or a
//! lost lease repeats (those of about one period: up to two right after a
//! take, see [`Pacing::align_to`], plus the short wait while a worker's
//! due positions are gathered into one request), never what a graceful
//! stop, a handoff or a give-back repeats.
//!
//! Under every policy, writing every call included, a write that fails
//! (other than for a lost lease) keeps its position as the latest asked
//! for: the processor sees the error, and the next fetch's flush, or the
//! end of the tenure, writes that position again.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::{ConfigError, invalid};
use crate::lease::Checkpoint;

/// How often a shard's checkpoint is written. See the module docs.
///
/// ```
/// use std::time::Duration;
/// use kcl_core::checkpointer::CheckpointPolicy;
///
/// // At most one write per shard every 5 s, or every 10,000 records if
/// // those come first.
/// let policy = CheckpointPolicy::every(Duration::from_secs(5)).or_every_records(10_000);
/// assert!(!policy.is_every_call());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointPolicy {
    period: Option<Duration>,
    records: Option<u64>,
}

impl CheckpointPolicy {
    /// Every `checkpoint()` call writes (the default).
    pub fn every_call() -> Self {
        Self::default()
    }

    /// At most one write per shard per `period`.
    pub fn every(period: Duration) -> Self {
        CheckpointPolicy {
            period: Some(period),
            records: None,
        }
    }

    /// At most one write per shard per `records` records delivered.
    pub fn every_records(records: u64) -> Self {
        CheckpointPolicy {
            period: None,
            records: Some(records),
        }
    }

    /// Also writes once `records` records were delivered since the last
    /// write, if that comes before the period is up.
    pub fn or_every_records(self, records: u64) -> Self {
        CheckpointPolicy {
            records: Some(records),
            ..self
        }
    }

    /// True if every call writes.
    pub fn is_every_call(&self) -> bool {
        self.period.is_none() && self.records.is_none()
    }

    /// The period, if the policy has one.
    pub fn period(&self) -> Option<Duration> {
        self.period
    }

    /// The record count, if the policy has one.
    pub fn records(&self) -> Option<u64> {
        self.records
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.period.is_some_and(|p| p.is_zero()) {
            return invalid(
                "checkpoint_policy",
                "has a zero period; use CheckpointPolicy::every_call() to write every call",
            );
        }
        if self.records == Some(0) {
            return invalid(
                "checkpoint_policy",
                "has a record count of 0; use CheckpointPolicy::every_call() to write every call",
            );
        }
        Ok(())
    }
}

/// `epoch + k * period`, or `None` past what an instant holds.
fn boundary(epoch: Instant, period: Duration, k: u128) -> Option<Instant> {
    let nanos = u64::try_from(k.checked_mul(period.as_nanos())?).ok()?;
    epoch.checked_add(Duration::from_nanos(nanos))
}

/// Where one shard's checkpoint writes stand under its policy.
#[derive(Debug, Default)]
pub(crate) struct Pacing {
    policy: CheckpointPolicy,
    /// When the last write landed.
    last_write: Option<Instant>,
    /// Records delivered since the last write.
    delivered: u64,
    /// The latest position asked for and not written yet.
    deferred: Option<Checkpoint>,
    /// Every call writes from now on (the tenure is ending).
    immediate: bool,
    /// With a batcher: the instant the period's boundaries count from.
    epoch: Option<Instant>,
}

impl Pacing {
    pub(crate) fn new(policy: CheckpointPolicy) -> Self {
        Pacing {
            policy,
            ..Pacing::default()
        }
    }

    /// True if a write asked for at `now` is to wait.
    pub(crate) fn defers(&self, now: Instant) -> bool {
        if self.writes_every_call() {
            return false;
        }
        let Some(last) = self.last_write else {
            return false;
        };
        let period_up = self
            .policy
            .period
            .and_then(|p| self.due(last, p))
            .is_some_and(|due| now >= due);
        let records_up = self.policy.records.is_some_and(|n| self.delivered >= n);
        !(period_up || records_up)
    }

    /// Counts the period in boundaries from `epoch` (`epoch + k *
    /// period`), the same for every shard of the worker, so that their
    /// writes fall due together and go in one request: a write is due at
    /// the first boundary a whole period after the last one, which counts
    /// as written at the boundary it was due at (see [`Pacing::written_at`]).
    /// So writes stay at least a period apart, one per period once they
    /// follow the boundaries; the first after a take (which goes at once)
    /// waits for the first boundary a period after it, less than two
    /// periods.
    pub(crate) fn align_to(&mut self, epoch: Instant) {
        self.epoch = Some(epoch);
    }

    /// When the next write is due after one at `last`; `None` past what
    /// an instant holds (never, by the period).
    fn due(&self, last: Instant, period: Duration) -> Option<Instant> {
        let earliest = last.checked_add(period)?;
        let Some(epoch) = self.epoch else {
            return Some(earliest);
        };
        let since = earliest.saturating_duration_since(epoch).as_nanos();
        Some(boundary(epoch, period, since.div_ceil(period.as_nanos())).unwrap_or(earliest))
    }

    /// The instant a write sent at `now` counts as written at: with
    /// boundaries, and the period up, the last boundary (the write is that
    /// boundary's, however late its shard's consumer got to it); else `now`.
    pub(crate) fn written_at(&self, now: Instant) -> Instant {
        let (Some(epoch), Some(period), Some(last)) =
            (self.epoch, self.policy.period, self.last_write)
        else {
            return now;
        };
        if self.due(last, period).is_none_or(|due| now < due) {
            return now;
        }
        let since = now.saturating_duration_since(epoch).as_nanos();
        boundary(epoch, period, since / period.as_nanos()).unwrap_or(now)
    }

    /// Remembers `checkpoint` as the latest position asked for.
    pub(crate) fn defer(&mut self, checkpoint: Checkpoint) {
        self.deferred = Some(checkpoint);
    }

    /// The position asked for and not written yet.
    pub(crate) fn deferred(&self) -> Option<&Checkpoint> {
        self.deferred.as_ref()
    }

    /// Takes the position to write, if any.
    pub(crate) fn take_deferred(&mut self) -> Option<Checkpoint> {
        self.deferred.take()
    }

    /// A write landed at `now`.
    pub(crate) fn wrote(&mut self, now: Instant) {
        self.last_write = Some(now);
        self.delivered = 0;
    }

    /// Records delivered since the last write.
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered
    }

    /// `n` more records were delivered.
    pub(crate) fn count(&mut self, n: u64) {
        self.delivered = self.delivered.saturating_add(n);
    }

    /// True if every call writes: the policy says so, or the tenure is
    /// ending.
    pub(crate) fn writes_every_call(&self) -> bool {
        self.policy.is_every_call() || self.immediate
    }

    /// From now on every call writes: the tenure is ending (a shutdown, a
    /// handoff, SHARD_END), and the next owner starts from what is written.
    pub(crate) fn write_every_call(&mut self) {
        self.immediate = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn calls_within_the_period_wait_and_the_first_after_it_writes() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut p = Pacing::new(CheckpointPolicy::every(s(5)));
        assert!(!p.defers(t0), "the first write goes at once");
        p.wrote(t0);
        assert!(p.defers(t0 + s(1)));
        assert!(p.defers(t0 + Duration::from_millis(4_999)));
        assert!(!p.defers(t0 + s(5)));
        p.write_every_call();
        assert!(!p.defers(t0 + s(1)), "a tenure ending writes every call");
    }

    #[tokio::test(start_paused = true)]
    async fn aligned_writes_are_due_on_the_boundaries_at_least_a_period_apart() {
        let epoch = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pacing::new(CheckpointPolicy::every(Duration::from_secs(5)));
        p.align_to(epoch);
        assert_eq!(
            p.written_at(epoch + ms(1_100)),
            epoch + ms(1_100),
            "the first"
        );
        p.wrote(epoch + ms(1_100));
        assert!(
            p.defers(epoch + ms(6_100)),
            "a period later, but before a boundary"
        );
        assert!(p.defers(epoch + ms(9_999)));
        assert!(
            !p.defers(epoch + ms(10_000)),
            "the first boundary a period on"
        );
        assert_eq!(p.written_at(epoch + ms(10_300)), epoch + ms(10_000));
        p.wrote(epoch + ms(10_000));
        assert!(p.defers(epoch + ms(14_999)));
        assert!(!p.defers(epoch + ms(15_000)), "then every boundary");
        assert_eq!(
            p.written_at(epoch + ms(23_000)),
            epoch + ms(20_000),
            "a late write counts as the last boundary's"
        );
        assert_eq!(
            p.written_at(epoch + ms(12_000)),
            epoch + ms(12_000),
            "not due: now"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_count_writes_before_the_period_is_up() {
        let t0 = Instant::now();
        let mut p =
            Pacing::new(CheckpointPolicy::every(Duration::from_secs(60)).or_every_records(100));
        p.wrote(t0);
        p.count(99);
        assert!(p.defers(t0));
        p.count(1);
        assert!(!p.defers(t0));
        p.wrote(t0);
        assert!(p.defers(t0), "the count starts again at each write");
        let every_call = Pacing::new(CheckpointPolicy::every_call());
        assert!(!every_call.defers(t0));
    }

    #[test]
    fn a_zero_period_or_count_is_refused_by_name() {
        for bad in [
            CheckpointPolicy::every(Duration::ZERO),
            CheckpointPolicy::every_records(0),
        ] {
            let e = bad.validate().unwrap_err();
            assert_eq!(e.field, "checkpoint_policy");
        }
        assert!(
            CheckpointPolicy::every(Duration::from_secs(5))
                .validate()
                .is_ok()
        );
    }
}
