//! Time limits on processor calls: every call the consumer makes goes
//! through [`limited`].
//!
//! A call that never returns holds its shard for as long as the lease
//! lives, which under liveness records is as long as the worker runs: the
//! records stand unread and nothing says why. So a call running longer than
//! `processor_warn_after` is warned about (once) and counted, and one
//! running past `processor_timeout`, when set, is cancelled: its future is
//! dropped, and the consumer stops with [`Stop::TimedOut`], which gives the
//! shard back only after that drop, so the call can never run beside the
//! shard's next owner. A worker's shutdown that runs past its timeout cuts
//! the calls under way the same way ([`Stop::Cut`]).
//!
//! The limit is a timer in the consumer's own task, so it fires only while
//! the call yields: a call blocked outside an await point (a synchronous
//! loop, a blocking lock) holds the task, the timer with it, and the lease;
//! the worker's liveness check is what sees that one.

use crate::metric_names::{PROCESSOR_CALLS_SLOW, PROCESSOR_TIMEOUTS};
use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tracing::{error, warn};

use super::{Consumer, Stop};

/// The time limits of a consumer's processor calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallLimits {
    /// A call running this long is warned about and counted, once.
    pub(crate) warn_after: Duration,
    /// A call running this long is cancelled and the shard given back;
    /// `None` lets a call run for as long as it takes.
    pub(crate) timeout: Option<Duration>,
}

/// The stage of the ending that follows a cut call, which is not cut.
pub(super) const LEASE_LOST: &str = "lease_lost";

/// One processor call, as the logs and metrics name it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call {
    /// The processor method: `initialize`, `process_records`, ...
    pub(super) stage: &'static str,
    /// The lane whose processor is called, when the shard has lanes.
    pub(super) lane: Option<usize>,
}

impl Call {
    pub(super) fn new(stage: &'static str, lane: Option<usize>) -> Self {
        Call { stage, lane }
    }
}

/// How a call under its limits ended.
enum Ended<T> {
    Returned(T),
    /// Cut at the timeout; the call's future is dropped by then.
    TimedOut,
    /// Cut by the worker's shutdown timeout; dropped by then too.
    Cut,
}

/// Runs `call` (the processor's future) under the consumer's limits: its
/// output, or `Err(Stop::TimedOut)` once it ran past the timeout, or
/// `Err(Stop::Cut)` once the worker's shutdown timeout cut it, by when its
/// future has been dropped.
pub(super) async fn limited<F: Future>(
    c: &Consumer,
    call: Call,
    fut: F,
) -> Result<F::Output, Stop> {
    let started = Instant::now();
    // Shown in the worker's shard progress while it runs.
    let _running = c.progress.call_started(call.stage);
    match race(c, call, started, fut).await {
        Ended::Returned(out) => Ok(out),
        Ended::TimedOut => {
            timed_out(c, call, started.elapsed());
            Err(Stop::TimedOut)
        }
        Ended::Cut => {
            cut(c, call, started.elapsed());
            Err(Stop::Cut)
        }
    }
}

/// Awaits `fut` against the warning, the timeout and the shutdown's cut.
/// It owns the future, so returning drops it: the cancellation is done
/// once this returns.
async fn race<F: Future>(c: &Consumer, call: Call, started: Instant, fut: F) -> Ended<F::Output> {
    let limits = c.setup.call_limits;
    let mut fut = std::pin::pin!(fut);
    // Every call is cut, one made after the cut too (a lane's
    // `shutdown_requested` after another lane's call was cut, a batch
    // queued behind it), but for `lease_lost`, the ending that follows a
    // cut: the worker stops waiting for it a grace period later.
    let armed = call.stage != LEASE_LOST;
    let mut cut = std::pin::pin!(async {
        if armed {
            c.cut.cancelled().await;
        } else {
            std::future::pending::<()>().await;
        }
    });
    tokio::select! {
        biased;
        out = &mut fut => return Ended::Returned(out),
        () = &mut cut => return Ended::Cut,
        () = sleep_until(started + limits.warn_after) => slow(c, call, started.elapsed()),
    }
    let timeout = async {
        match limits.timeout {
            Some(timeout) => sleep_until(started + timeout).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        out = &mut fut => Ended::Returned(out),
        () = &mut cut => Ended::Cut,
        () = timeout => Ended::TimedOut,
    }
}

/// Logs a processor call at `$level` with its shard, lane and elapsed
/// time, and counts it in `$metric`: what a slow call and a cancelled one
/// both report.
macro_rules! report {
    ($level:ident, $metric:expr, $c:expr, $call:expr, $elapsed:expr, $message:literal) => {{
        $level!(
            stream = %$c.ctx.stream,
            shard = %$c.ctx.shard_id,
            lane = ?$call.lane,
            call = $call.stage,
            elapsed = ?$elapsed,
            $message
        );
        metrics::counter!(
            $metric,
            "stream" => $c.ctx.stream.clone(),
            "shard" => $c.ctx.shard_id.clone(),
            "stage" => $call.stage
        )
        .increment(1);
    }};
}

fn slow(c: &Consumer, call: Call, elapsed: Duration) {
    report!(
        warn,
        PROCESSOR_CALLS_SLOW,
        c,
        call,
        elapsed,
        "a processor call is running long; the shard makes no progress until it returns"
    );
}

fn timed_out(c: &Consumer, call: Call, elapsed: Duration) {
    report!(
        error,
        PROCESSOR_TIMEOUTS,
        c,
        call,
        elapsed,
        "a processor call ran past processor_timeout and was cancelled; the shard is given back"
    );
}

fn cut(c: &Consumer, call: Call, elapsed: Duration) {
    warn!(
        stream = %c.ctx.stream,
        shard = %c.ctx.shard_id,
        lane = ?call.lane,
        call = call.stage,
        elapsed = ?elapsed,
        "a processor call was still running at the shutdown timeout and was cancelled"
    );
}
