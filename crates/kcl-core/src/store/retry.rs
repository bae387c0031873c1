//! Retrying one store call inside a deadline.
//!
//! Every attempt is bounded by the attempt timeout and by the time left, so
//! a call stuck on a dead connection costs one attempt, not the deadline;
//! retryable failures wait a jittered, doubling pause (twice as long after
//! throttling, which more requests would only prolong), and no pause runs
//! past the deadline. The store's SDK retries inside each attempt too, so
//! the pauses here start in the hundreds of milliseconds, not at 50 ms.

use std::future::Future;
use std::time::Duration;

use backon::Retryable;
use tokio::time::Instant;

use super::timeout::bounded;
use super::{StoreError, StoreErrorKind, StoreOp};
use crate::backoff::Backoff;
use crate::warn_limit::{RateLimitedWarn, WARN_INTERVAL};

/// Throttled lease-table calls, and other retried ones, process-wide: a
/// storm shows at warn level, once per interval.
static THROTTLED: RateLimitedWarn = RateLimitedWarn::new(WARN_INTERVAL);
static RETRIED: RateLimitedWarn = RateLimitedWarn::new(WARN_INTERVAL);

/// Counts `e` towards the process-wide throttling warning if the lease
/// table throttled it, warning when one is due; true if it was throttled.
/// Callers that give up on a call until their next round (the taker's
/// reads and takes) warn of other failures themselves, but not of each
/// throttled one: a storm would repeat it every tick, and under load the
/// throttles that reach the retries may be few (the SDK retries inside
/// each attempt, and an attempt that times out reads as unavailable).
pub(crate) fn counted_as_throttling(op: StoreOp, e: &StoreError) -> bool {
    if e.kind() != StoreErrorKind::Throttled {
        return false;
    }
    if let Some(n) = THROTTLED.hit() {
        tracing::warn!(%op, calls = n, "the lease table is throttling: {n} throttled calls since the last warning, each tried again later (leases and checkpoints lag while it lasts)");
    }
    true
}

/// How one kind of call is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// The longest one attempt may take.
    pub(crate) attempt_timeout: Duration,
    /// The pauses between attempts; its retries bound the attempts.
    pub(crate) backoff: Backoff,
}

/// The deadline has passed before an attempt could start.
#[derive(Debug, thiserror::Error)]
#[error("the deadline passed before the call could be sent")]
struct DeadlinePassed;

/// Runs `call` until it succeeds, fails for good, runs out of attempts, or
/// `deadline` comes (the last error is returned).
pub(crate) async fn retry_until<T, F, Fut>(
    op: StoreOp,
    deadline: Instant,
    policy: RetryPolicy,
    mut call: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let attempt = || {
        let left = deadline.saturating_duration_since(Instant::now());
        let fut = call();
        async move {
            if left.is_zero() {
                return Err(StoreError::retryable(op, DeadlinePassed));
            }
            bounded(op, left.min(policy.attempt_timeout), fut).await
        }
    };
    attempt
        .retry(policy.backoff.pauses())
        .sleep(tokio::time::sleep)
        .when(StoreError::is_retryable)
        .notify(move |e: &StoreError, pause: Duration| {
            if counted_as_throttling(op, e) {
                return;
            }
            if let Some(n) = RETRIED.hit() {
                tracing::warn!(%op, calls = n, error = %e, ?pause, "lease-table calls are failing: {n} retried since the last warning");
            }
        })
        .adjust(move |e, pause| {
            let pause = pause?;
            let pause = if e.kind() == StoreErrorKind::Throttled {
                pause * 2
            } else {
                pause
            };
            // A retry that could not start before the deadline is not made.
            (Instant::now() + pause < deadline).then_some(pause)
        })
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        attempt_timeout: Duration::from_secs(1),
        backoff: Backoff::new(Duration::from_millis(300), Duration::from_secs(2)).retries(2),
    };

    fn failing(kind: StoreErrorKind) -> StoreError {
        match kind {
            StoreErrorKind::Throttled => StoreError::Throttled {
                op: StoreOp::Renew,
                source: "slow down".into(),
            },
            _ => StoreError::retryable(StoreOp::Renew, "try again"),
        }
    }

    /// Retries `call` (given the attempt's index, from 0) under [`POLICY`]
    /// until `deadline`: the outcome, and how many attempts were made.
    async fn attempts<F>(
        deadline: Instant,
        call: impl Fn(usize) -> F,
    ) -> (Result<(), StoreError>, usize)
    where
        F: Future<Output = Result<(), StoreError>>,
    {
        let calls = AtomicUsize::new(0);
        let r = retry_until(StoreOp::Renew, deadline, POLICY, || {
            call(calls.fetch_add(1, Ordering::Relaxed))
        })
        .await;
        (r, calls.load(Ordering::Relaxed))
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_are_capped_and_bounded_by_the_deadline() {
        let deadline = Instant::now() + Duration::from_secs(30);
        let (r, calls) = attempts(deadline, |_| async {
            Err(failing(StoreErrorKind::Retryable))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls, 3, "max_attempts");

        // A hung call costs one attempt timeout; the deadline stops the rest.
        let started = Instant::now();
        let deadline = started + Duration::from_millis(1500);
        let (r, calls) = attempts(deadline, |_| std::future::pending()).await;
        assert!(r.unwrap_err().is_retryable());
        assert!(Instant::now() <= deadline, "never past the deadline");
        assert!(calls <= 2);
    }

    #[tokio::test(start_paused = true)]
    async fn conditions_and_fatal_errors_are_not_retried() {
        let deadline = Instant::now() + Duration::from_secs(30);
        let (r, calls) = attempts(deadline, |_| async {
            Err(StoreError::ConditionFailed {
                key: "s".into(),
                current: None,
            })
        })
        .await;
        assert!(r.unwrap_err().is_condition_failed());
        assert_eq!(calls, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_waits_twice_as_long() {
        for (kind, min_wait) in [
            (StoreErrorKind::Retryable, Duration::from_millis(300)),
            (StoreErrorKind::Throttled, Duration::from_millis(600)),
        ] {
            let started = Instant::now();
            let deadline = started + Duration::from_secs(30);
            let (r, _) = attempts(deadline, |n| async move {
                if n == 0 { Err(failing(kind)) } else { Ok(()) }
            })
            .await;
            assert!(r.is_ok());
            assert!(
                started.elapsed() >= min_wait,
                "{kind:?}: {:?}",
                started.elapsed()
            );
        }
    }
}
