//! A [`LeaseStore`] decorator that counts and times every operation.
//!
//! Counts go to a shared [`StoreStats`] (for tests and benchmarks, which
//! assert on them) and to the `metrics` facade (for dashboards):
//! `kcl_store_operations_total{op,outcome}`, `kcl_store_operation_seconds{op}`
//! and `kcl_store_scans_total`. A store that learns its own cost (DynamoDB's
//! consumed capacity) reports it into the same [`StoreStats`] with
//! [`StoreStats::add_capacity`].

use crate::metric_names::{
    STORE_CAPACITY_UNITS_MILLI, STORE_OPERATION_SECONDS, STORE_OPERATIONS, STORE_SCANS,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::stream::StreamExt;
use tokio::time::Instant;

use super::{LeaseStore, StoreError, StoreErrorKind, StoreOp};

#[derive(Debug, Default)]
struct OpCounters {
    calls: AtomicU64,
    condition_failed: AtomicU64,
    errors: AtomicU64,
    nanos: AtomicU64,
    /// Consumed capacity in thousandths of a unit (DynamoDB reports fractions).
    capacity_milli: AtomicU64,
}

/// Operation counts shared between a [`MeteredStore`] and its readers.
#[derive(Debug, Default)]
pub struct StoreStats {
    ops: [OpCounters; StoreOp::ALL.len()],
    scans: AtomicU64,
}

/// A point-in-time copy of one operation's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpSnapshot {
    /// Calls made (a scan page is one call).
    pub calls: u64,
    /// Calls that failed their condition.
    pub condition_failed: u64,
    /// Calls that failed otherwise.
    pub errors: u64,
    /// Total time spent in calls, in seconds.
    pub seconds: f64,
    /// Capacity units consumed, as reported by the store.
    pub capacity: f64,
}

/// A point-in-time copy of all counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreSnapshot {
    /// Whole-table scans started.
    pub scans: u64,
    /// Per-operation counters.
    pub ops: BTreeMap<StoreOp, OpSnapshot>,
}

impl StoreSnapshot {
    /// The counters of `op` (zero if never called).
    pub fn op(&self, op: StoreOp) -> OpSnapshot {
        self.ops.get(&op).copied().unwrap_or_default()
    }

    /// Calls of every operation, scan pages included.
    pub fn total_calls(&self) -> u64 {
        self.ops.values().map(|o| o.calls).sum()
    }

    /// Capacity consumed by every operation.
    pub fn total_capacity(&self) -> f64 {
        self.ops.values().map(|o| o.capacity).sum()
    }

    /// The counts accumulated since `earlier`.
    pub fn since(&self, earlier: &StoreSnapshot) -> StoreSnapshot {
        let ops = self
            .ops
            .iter()
            .map(|(op, now)| {
                let then = earlier.op(*op);
                let diff = OpSnapshot {
                    calls: now.calls - then.calls,
                    condition_failed: now.condition_failed - then.condition_failed,
                    errors: now.errors - then.errors,
                    seconds: now.seconds - then.seconds,
                    capacity: now.capacity - then.capacity,
                };
                (*op, diff)
            })
            .collect();
        StoreSnapshot {
            scans: self.scans - earlier.scans,
            ops,
        }
    }
}

impl StoreStats {
    fn counters(&self, op: StoreOp) -> &OpCounters {
        // StoreOp::ALL lists every variant, in declaration order.
        &self.ops[op as usize]
    }

    /// Adds capacity units consumed by one call of `op`.
    pub fn add_capacity(&self, op: StoreOp, units: f64) {
        let milli = (units * 1000.0).round().max(0.0) as u64;
        self.counters(op)
            .capacity_milli
            .fetch_add(milli, Ordering::Relaxed);
        metrics::counter!(STORE_CAPACITY_UNITS_MILLI, "op" => op.as_str()).increment(milli);
    }

    /// Whole-table scans started so far.
    pub fn scans(&self) -> u64 {
        self.scans.load(Ordering::Relaxed)
    }

    /// Copies every counter.
    pub fn snapshot(&self) -> StoreSnapshot {
        let ops = StoreOp::ALL
            .iter()
            .map(|&op| {
                let c = self.counters(op);
                let snap = OpSnapshot {
                    calls: c.calls.load(Ordering::Relaxed),
                    condition_failed: c.condition_failed.load(Ordering::Relaxed),
                    errors: c.errors.load(Ordering::Relaxed),
                    seconds: c.nanos.load(Ordering::Relaxed) as f64 / 1e9,
                    capacity: c.capacity_milli.load(Ordering::Relaxed) as f64 / 1000.0,
                };
                (op, snap)
            })
            .collect();
        StoreSnapshot {
            scans: self.scans(),
            ops,
        }
    }

    fn record<T>(&self, op: StoreOp, started: Instant, result: &Result<T, StoreError>) {
        let c = self.counters(op);
        let elapsed = started.elapsed();
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) if e.kind() == StoreErrorKind::ConditionFailed => {
                c.condition_failed.fetch_add(1, Ordering::Relaxed);
                "condition_failed"
            }
            Err(e) => {
                c.errors.fetch_add(1, Ordering::Relaxed);
                match e.kind() {
                    StoreErrorKind::Throttled => "throttled",
                    StoreErrorKind::Fatal => "fatal",
                    _ => "retryable",
                }
            }
        };
        metrics::counter!(STORE_OPERATIONS, "op" => op.as_str(), "outcome" => outcome).increment(1);
        metrics::histogram!(STORE_OPERATION_SECONDS, "op" => op.as_str())
            .record(elapsed.as_secs_f64());
    }
}

/// Wraps a [`LeaseStore`], counting and timing every call into a
/// [`StoreStats`].
#[derive(Debug, Clone)]
pub struct MeteredStore<S> {
    inner: S,
    stats: Arc<StoreStats>,
}

impl<S: LeaseStore> MeteredStore<S> {
    /// Wraps `inner` with fresh counters.
    pub fn new(inner: S) -> Self {
        Self::with_stats(inner, Arc::default())
    }

    /// Wraps `inner`, counting into `stats` (which the inner store may also
    /// feed with consumed capacity).
    pub fn with_stats(inner: S, stats: Arc<StoreStats>) -> Self {
        MeteredStore { inner, stats }
    }

    /// The shared counters.
    pub fn stats(&self) -> &Arc<StoreStats> {
        &self.stats
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn timed<T>(
        &self,
        op: StoreOp,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = fut.await;
        self.stats.record(op, started, &result);
        result
    }
}

crate::store::decorate! {
    MeteredStore, around: timed,
    scan: |this| {
        this.stats.scans.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(STORE_SCANS).increment(1);
        // Each page is timed from the end of the previous one.
        this.inner
            .scan()
            .scan(Instant::now(), move |started, page| {
                this.stats.record(StoreOp::ScanPage, *started, &page);
                *started = Instant::now();
                futures::future::ready(Some(page))
            })
            .boxed()
    }
}
