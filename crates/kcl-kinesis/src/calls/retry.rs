//! Retrying one Kinesis call: backoff after throttles and transient
//! failures, the lease checked before every attempt, every attempt and
//! retry counted.

use std::future::Future;

use kcl_core::leases::LeaseHandle;
use kcl_core::source::SourceError;
use tracing::debug;

use super::Shared;
use super::classify::{Class, Classified};

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

/// Makes `attempt` until it succeeds, backing off (exponential, capped,
/// jittered) after throttles and transient failures.
///
/// With a `lease`, the lease is checked before every attempt, and
/// throttling is retried for as long as the lease lasts: the service is
/// pacing this consumer, and giving up would only restart the same calls.
/// Without one (shard listing), throttles count toward the
/// `max_transient_retries` limit like any transient failure, so a sync
/// cannot hang.
pub(crate) async fn retrying<T, F, Fut>(
    shared: &Shared,
    op: Op,
    stream: &str,
    lease: Option<&LeaseHandle>,
    mut attempt: F,
) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Classified>>,
{
    let mut backoff = shared.polling.backoff();
    let mut failures: u32 = 0;
    loop {
        if lease.is_some_and(|l| !l.is_valid()) {
            return Err(Failure::LeaseLost);
        }
        let error = match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        match error.class {
            Class::Throttled => {
                shared.stats.throttle();
                metrics::counter!(
                    "kcl_kinesis_throttles_total",
                    "stream" => stream.to_owned(),
                    "call" => op.as_str()
                )
                .increment(1);
                if lease.is_none() {
                    failures += 1;
                }
            }
            Class::Transient => failures += 1,
            _ => return Err(Failure::Classified(error)),
        }
        if failures > shared.polling.max_transient_retries {
            return Err(Failure::Exhausted(error));
        }
        shared.stats.retry();
        metrics::counter!(
            "kcl_kinesis_retries_total",
            "stream" => stream.to_owned(),
            "call" => op.as_str()
        )
        .increment(1);
        let delay = backoff.next().unwrap_or(shared.polling.retry_max_delay);
        debug!(stream, call = op.as_str(), code = ?error.code, ?delay, "retrying Kinesis call");
        tokio::time::sleep(delay).await;
    }
}
