//! Retrying one Kinesis call: the one retry layer for Kinesis calls (the
//! SDK client kcl builds has its own retries turned off, so every attempt
//! and every throttle is counted here). Each kind of call has its own
//! policy: an attempt timeout (a call that does not answer is given up and
//! made again), jittered exponential backoff after throttles, transient
//! failures and denied access, and a bound on transient failures before
//! they are reported. The lease is checked before every attempt.

use std::future::Future;
use std::time::Duration;

use kcl_core::ConfigError;
use kcl_core::backoff::Backoff;
use kcl_core::leases::LeaseHandle;
use kcl_core::metric_names::{
    KINESIS_ACCESS_ERRORS, KINESIS_CALL_TIMEOUTS, KINESIS_RETRIES, KINESIS_THROTTLES,
};
use kcl_core::source::{AnswerClock, SourceError};
use kcl_core::warn_limit::{RateLimitedWarn, WARN_INTERVAL};
use tracing::{debug, warn};

use super::Shared;
use super::classify::{Class, Classified};

/// Throttled Kinesis calls, and other retried ones, process-wide: a storm
/// shows at warn level, once per interval.
static THROTTLED: RateLimitedWarn = RateLimitedWarn::new(WARN_INTERVAL);
static RETRIED: RateLimitedWarn = RateLimitedWarn::new(WARN_INTERVAL);
/// Calls denied access (subscriptions too): during a KMS outage every
/// shard retries every few seconds, which warned once per call (a hundred
/// lines a second over a thousand shards).
pub(crate) static DENIED: RateLimitedWarn = RateLimitedWarn::new(WARN_INTERVAL);

/// The retry settings polling and fan-out share: one struct, one
/// validation, and one set of builder setters ([`retry_setters!`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetrySettings {
    /// The first pause after a failure (before jitter).
    pub(crate) min_delay: Duration,
    /// The longest pause.
    pub(crate) max_delay: Duration,
    /// Consecutive transient failures after which the caller is told.
    pub(crate) max_transient: u32,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
            max_transient: 10,
        }
    }
}

impl RetrySettings {
    /// Checks the settings; `what` names the calls a zero delay would
    /// retry in a tight loop.
    pub(crate) fn validate(&self, what: &str) -> Result<(), ConfigError> {
        kcl_core::config::at_most_max("retry_min_delay", self.min_delay)?;
        kcl_core::config::at_most_max("retry_max_delay", self.max_delay)?;
        if self.min_delay.is_zero() {
            return Err(ConfigError {
                field: "retry_min_delay",
                reason: format!("must be above zero, or {what} retry in a tight loop"),
            });
        }
        if self.max_delay < self.min_delay {
            return Err(ConfigError {
                field: "retry_max_delay",
                reason: format!(
                    "is {:?}; it must not be below retry_min_delay ({:?})",
                    self.max_delay, self.min_delay
                ),
            });
        }
        Ok(())
    }

    /// The policy of calls that may take up to `attempt_timeout` each.
    pub(crate) fn policy(&self, attempt_timeout: Duration) -> RetryPolicy {
        RetryPolicy {
            attempt_timeout,
            // Jittered, so that many shards failing at once do not retry
            // in step.
            backoff: Backoff::new(self.min_delay, self.max_delay),
            max_transient: self.max_transient,
        }
    }
}

/// The builder setters of [`RetrySettings`], for a builder whose `config`
/// has a `retry` field: what a failure is (for the docs) and the docs of
/// `max_transient_retries`, which say what the reader does past it.
macro_rules! retry_setters {
    ($failure:literal, $(#[$transient_doc:meta])*) => {
        #[doc = concat!("First retry delay after ", $failure, " (default 100 ms).")]
        pub fn retry_min_delay(mut self, d: std::time::Duration) -> Self {
            self.config.retry.min_delay = d;
            self
        }

        /// Longest retry delay (default 10 s).
        pub fn retry_max_delay(mut self, d: std::time::Duration) -> Self {
            self.config.retry.max_delay = d;
            self
        }

        $(#[$transient_doc])*
        pub fn max_transient_retries(mut self, n: u32) -> Self {
            self.config.retry.max_transient = n;
            self
        }
    };
}
pub(crate) use retry_setters;

/// How one kind of call is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// The longest one attempt may take before it counts as a transient
    /// failure.
    pub(crate) attempt_timeout: Duration,
    /// The pauses after failures.
    pub(crate) backoff: Backoff,
    /// Consecutive transient failures after which the caller is told.
    pub(crate) max_transient: u32,
}

/// A Kinesis operation, for metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    ListShards,
    GetShardIterator,
    GetRecords,
    DescribeStreamSummary,
    DescribeStreamConsumer,
    RegisterStreamConsumer,
    DeregisterStreamConsumer,
}

impl Op {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Op::ListShards => "list_shards",
            Op::GetShardIterator => "get_shard_iterator",
            Op::GetRecords => "get_records",
            Op::DescribeStreamSummary => "describe_stream_summary",
            Op::DescribeStreamConsumer => "describe_stream_consumer",
            Op::RegisterStreamConsumer => "register_stream_consumer",
            Op::DeregisterStreamConsumer => "deregister_stream_consumer",
        }
    }
}

/// Why [`retrying`] gave up.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The lease was no longer valid before an attempt.
    LeaseLost,
    /// An error retrying does not fix (including an expired iterator,
    /// which the caller fixes by getting a new one).
    Classified(Classified),
    /// Transient failures (or, without a lease, throttles) went on for
    /// `max_transient_retries` attempts.
    Exhausted(Classified),
}

impl Failure {
    /// The error to hand to the caller of the source.
    pub(crate) fn into_source_error(self, stream: &str, shard: &str) -> SourceError {
        match self {
            Failure::LeaseLost => SourceError::LeaseLost {
                shard: shard.to_owned(),
            },
            Failure::Exhausted(c) => retryable(stream, shard, c.error),
            Failure::Classified(c) => SourceError::Fatal {
                stream: stream.to_owned(),
                message: match c.class {
                    Class::NotFound => format!("shard {shard} or its stream does not exist"),
                    _ => format!(
                        "{shard}: Kinesis rejected the request ({})",
                        c.code.as_deref().unwrap_or("no error code")
                    ),
                },
                source: Some(c.error),
            },
        }
    }
}

pub(crate) fn retryable(
    stream: &str,
    shard: &str,
    source: Box<dyn std::error::Error + Send + Sync>,
) -> SourceError {
    SourceError::Retryable {
        stream: stream.to_owned(),
        shard: shard.to_owned(),
        source,
    }
}

/// The reader a call is made for: its lease, checked before every
/// attempt, and its [`AnswerClock`], told of every answer the service
/// gives (a result or an error it sent; not a timeout or a connection that
/// failed), so that the consumer tells a worker the service turns down
/// from one cut off from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForReader<'a> {
    pub(crate) lease: &'a LeaseHandle,
    pub(crate) answers: &'a AnswerClock,
}

/// Makes `attempt` until it succeeds, backing off (exponential, capped,
/// jittered) after throttles, transient failures and denied access; each
/// attempt bounded by the policy's attempt timeout.
///
/// For a reader, its lease is checked before every attempt, each answer
/// is told to its clock, and throttling and denied access are retried for
/// as long as the lease lasts: the service is pacing this consumer, or an operator must fix the
/// permissions or the KMS key, and another worker would fail the same way
/// (giving the shard up would only move the same calls around the fleet).
/// Without one (shard listing), they count toward the `max_transient`
/// limit like any transient failure, so a sync cannot hang.
pub(crate) async fn retrying<T, F, Fut>(
    shared: &Shared,
    policy: &RetryPolicy,
    op: Op,
    stream: &str,
    reader: Option<ForReader<'_>>,
    attempt: F,
) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Classified>>,
{
    let prepare = || std::future::ready(Some(()));
    retrying_holding(shared, policy, op, stream, reader, prepare, attempt)
        .await
        .map(|(v, ())| v)
}

/// [`retrying`], with something `prepare` obtains before each attempt
/// (outside its timeout) and holds through it: a successful attempt
/// returns it with the answer, a failed one drops it before the pause, so
/// nothing is held while the call backs off. `prepare` answering `None`
/// (the lease ended while it waited) is [`Failure::LeaseLost`].
pub(crate) async fn retrying_holding<T, G, P, PFut, F, Fut>(
    shared: &Shared,
    policy: &RetryPolicy,
    op: Op,
    stream: &str,
    reader: Option<ForReader<'_>>,
    mut prepare: P,
    mut attempt: F,
) -> Result<(T, G), Failure>
where
    P: FnMut() -> PFut,
    PFut: Future<Output = Option<G>>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Classified>>,
{
    let call = Call {
        shared,
        policy,
        op,
        stream,
        reader,
    };
    let mut backoff = policy.backoff.pauses();
    let mut failures: u32 = 0;
    loop {
        if reader.is_some_and(|r| !r.lease.is_valid()) {
            return Err(Failure::LeaseLost);
        }
        let Some(held) = prepare().await else {
            return Err(Failure::LeaseLost);
        };
        let error = match call.attempt(attempt()).await {
            Ok(v) => return Ok((v, held)),
            Err(e) => e,
        };
        match call.count_failure(&error) {
            Some(true) => failures += 1,
            Some(false) => {}
            None => return Err(Failure::Classified(error)),
        }
        if failures > policy.max_transient {
            return Err(Failure::Exhausted(error));
        }
        call.count_retry();
        drop(held);
        call.pause(&mut backoff, &error).await;
    }
}

/// One retried call: what each phase of [`retrying_holding`] reports on.
#[derive(Debug, Clone, Copy)]
struct Call<'a> {
    shared: &'a Shared,
    policy: &'a RetryPolicy,
    op: Op,
    stream: &'a str,
    reader: Option<ForReader<'a>>,
}

impl Call<'_> {
    /// Tells the reader's clock whether the service answered.
    fn answered(&self, yes: bool) {
        if let Some(r) = self.reader {
            if yes {
                r.answers.answered();
            } else {
                r.answers.silent();
            }
        }
    }

    /// Makes one attempt within the policy's attempt timeout; one that
    /// does not answer in time is a transient failure, counted as a
    /// timeout.
    async fn attempt<T, Fut>(&self, attempt: Fut) -> Result<T, Classified>
    where
        Fut: Future<Output = Result<T, Classified>>,
    {
        match tokio::time::timeout(self.policy.attempt_timeout, attempt).await {
            Ok(Ok(v)) => {
                self.answered(true);
                Ok(v)
            }
            Ok(Err(e)) => {
                self.answered(e.answered);
                Err(e)
            }
            Err(_) => {
                self.answered(false);
                self.shared.stats.call_timeout();
                self.count(KINESIS_CALL_TIMEOUTS);
                Err(Classified {
                    class: Class::Transient,
                    code: None,
                    answered: false,
                    error: format!(
                        "{} did not answer within {:?}",
                        self.op.as_str(),
                        self.policy.attempt_timeout
                    )
                    .into(),
                })
            }
        }
    }

    /// Counts a failed attempt by its class: whether it counts toward
    /// `max_transient` (throttles and denied access do only without a
    /// reader), or `None` for an error retrying does not fix.
    fn count_failure(&self, error: &Classified) -> Option<bool> {
        let (op, stream) = (self.op, self.stream);
        match error.class {
            Class::Throttled => {
                self.shared.stats.throttle();
                self.count(KINESIS_THROTTLES);
                Some(self.reader.is_none())
            }
            Class::AccessDenied => {
                self.shared.stats.access_denied();
                let code = error.code.clone().unwrap_or_default();
                metrics::counter!(
                    KINESIS_ACCESS_ERRORS,
                    "stream" => stream.to_owned(),
                    "call" => op.as_str(),
                    "code" => code.clone()
                )
                .increment(1);
                if let Some(calls) = DENIED.hit() {
                    warn!(stream, call = op.as_str(), code, calls, error = %error.error,
                        "access to the stream or its KMS key is denied ({calls} calls since the \
                         last warning); keeping the shards and retrying until the permissions or \
                         the key are fixed");
                }
                Some(self.reader.is_none())
            }
            Class::Transient => Some(true),
            _ => None,
        }
    }

    /// Counts the retry about to be made.
    fn count_retry(&self) {
        self.shared.stats.retry();
        self.count(KINESIS_RETRIES);
    }

    /// Adds one to the metric `name`, labelled with this call's stream and
    /// operation.
    fn count(&self, name: &'static str) {
        metrics::counter!(name, "stream" => self.stream.to_owned(), "call" => self.op.as_str())
            .increment(1);
    }

    /// The pause before the next attempt (logged; a storm of retries shows
    /// at warn level once per interval).
    async fn pause(&self, backoff: &mut kcl_core::backoff::Pauses, error: &Classified) {
        let (op, stream) = (self.op, self.stream);
        let delay = backoff.next_or_max();
        debug!(stream, call = op.as_str(), code = ?error.code, ?delay, "retrying Kinesis call");
        let limiter = if error.class == Class::Throttled {
            &THROTTLED
        } else {
            &RETRIED
        };
        if let Some(n) = limiter.hit() {
            warn!(stream, call = op.as_str(), code = ?error.code, calls = n, ?delay,
                "Kinesis calls are {}: {n} retried since the last warning (the shards lag while it lasts)",
                if error.class == Class::Throttled { "throttled" } else { "failing" });
        }
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::calls::KinesisApi;
    use crate::fake::FakeKinesis;
    use crate::polling::PollingConfig;

    /// Counts the guards alive.
    struct Guard(Arc<AtomicUsize>);

    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Denied access is warned about once per interval, with the count,
    /// not once per call: a KMS outage over a thousand shards made a
    /// hundred warnings a second.
    #[test]
    fn denied_access_warns_once_per_interval_with_its_count() {
        let (attempts, warnings) =
            crate::test_util::logs::warnings_while("is denied", denied_then_answered(50));
        assert_eq!(attempts, 51);
        // The limit is process-wide: another test may have taken this
        // interval's warning.
        assert!(warnings <= 1, "{warnings} warnings for 50 denied calls");
    }

    /// A shared Kinesis client (on the fake) and a retry policy pausing
    /// `pause` between attempts.
    fn shared_and_policy(pause: Duration, max_transient: u32) -> (Shared, RetryPolicy) {
        let api: Arc<dyn KinesisApi> = Arc::new(FakeKinesis::default());
        let shared = Shared::new(api, PollingConfig::default().retry_policy(), None, 1 << 20);
        let policy = RetryPolicy {
            attempt_timeout: Duration::from_secs(1),
            backoff: Backoff::new(pause, pause),
            max_transient,
        };
        (shared, policy)
    }

    /// A failure of `class`, answered.
    fn failure(class: Class, code: &str) -> Classified {
        Classified {
            class,
            code: Some(code.into()),
            answered: true,
            error: code.into(),
        }
    }

    /// A call denied access `n` times, then answered; how many attempts.
    async fn denied_then_answered(n: usize) -> usize {
        let (shared, policy) = shared_and_policy(Duration::from_millis(1), 1_000);
        let attempts = AtomicUsize::new(0);
        let attempt = || {
            let i = attempts.fetch_add(1, Ordering::SeqCst);
            let denied = failure(Class::AccessDenied, "KMSAccessDeniedException");
            std::future::ready(if i < n { Err(denied) } else { Ok(()) })
        };
        let prepare = || std::future::ready(Some(()));
        get_records(&shared, &policy, prepare, attempt)
            .await
            .map_err(|_| "failed")
            .unwrap();
        attempts.load(Ordering::SeqCst)
    }

    /// A GetRecords of stream "s", outside any reader, made with `attempt`
    /// (each holding what `prepare` gives).
    async fn get_records<T, G, PFut, Fut>(
        shared: &Shared,
        policy: &RetryPolicy,
        prepare: impl FnMut() -> PFut,
        attempt: impl FnMut() -> Fut,
    ) -> Result<(T, G), Failure>
    where
        PFut: Future<Output = Option<G>>,
        Fut: Future<Output = Result<T, Classified>>,
    {
        retrying_holding(shared, policy, Op::GetRecords, "s", None, prepare, attempt).await
    }

    #[tokio::test(start_paused = true)]
    async fn what_an_attempt_holds_is_given_back_before_the_retry_pause() {
        let (shared, policy) = shared_and_policy(Duration::from_secs(60), 10);
        let live = Arc::new(AtomicUsize::new(0));
        let attempts = Arc::new(AtomicUsize::new(0));
        let (l, a) = (Arc::clone(&live), Arc::clone(&attempts));
        let task = tokio::spawn(async move {
            let prepare = || {
                l.fetch_add(1, Ordering::SeqCst);
                std::future::ready(Some(Guard(Arc::clone(&l))))
            };
            // Throttled once, then answered.
            let attempt = || {
                let n = a.fetch_add(1, Ordering::SeqCst);
                let throttled = failure(Class::Throttled, "ProvisionedThroughputExceededException");
                std::future::ready(if n == 0 { Err(throttled) } else { Ok(n) })
            };
            let (n, guard) = get_records(&shared, &policy, prepare, attempt)
                .await
                .map_err(|_| "failed")?;
            Ok::<_, &str>((n, guard.0.load(Ordering::SeqCst)))
        });
        // In the pause after the throttle: nothing held.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
        assert_eq!(live.load(Ordering::SeqCst), 0, "held through the pause");
        let (n, held_with_answer) = task.await.expect("task").expect("answered");
        assert_eq!(
            (n, held_with_answer),
            (1, 1),
            "the answer comes with its guard"
        );
    }
}
