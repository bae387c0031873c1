//! Fault injection for the in-memory store: the faults a test scripts or
//! draws at random, per handle, and the runner that applies them around
//! each call.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{InMemoryLeaseStore, Table};
use crate::store::{StoreError, StoreErrorKind, StoreOp};

/// A fault to inject into one store call.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Fail before applying, with an error of this kind.
    Error(StoreErrorKind),
    /// Apply the write, then fail as if the response was lost in transit.
    LostResponse,
    /// Wait this long before applying (a slow request).
    Delay(Duration),
    /// Apply, then wait this long before answering (a slow response).
    SlowResponse(Duration),
    /// Never answer and never apply (a request lost on a dead connection).
    Hang,
}

/// Random faults drawn for every call of a handle.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomFaults {
    /// Seed of the handle's random generator, for reproducible runs.
    pub seed: u64,
    /// Probability that a call fails before applying (retryable).
    pub error_rate: f64,
    /// Probability that a write applies but its response is lost.
    pub lost_response_rate: f64,
    /// Upper bound of a uniformly drawn latency added to every call.
    pub max_latency: Duration,
}

#[derive(Debug, Default)]
pub(super) struct FaultPlan {
    scripted: HashMap<StoreOp, VecDeque<Fault>>,
    /// Faults for calls of one operation on one key.
    on_key: HashMap<(StoreOp, String), VecDeque<Fault>>,
    any_op: VecDeque<Fault>,
    /// Every call (of one operation, or of all) fails with this kind until
    /// the instant: an outage, or a table that throttles.
    failing: Vec<(Option<StoreOp>, StoreErrorKind, Instant)>,
    random: Option<(RandomFaults, SmallRng)>,
    paused_until: Option<Instant>,
    /// Calls on these keys hang forever (a "blackhole").
    blackhole: Vec<String>,
}

impl InMemoryLeaseStore {
    /// Makes the next call of `op` on this handle suffer `fault`.
    pub fn inject(&self, op: StoreOp, fault: Fault) {
        self.plan().scripted.entry(op).or_default().push_back(fault);
    }

    /// Makes the next call of `op` on `key` on this handle suffer `fault`.
    pub fn inject_on(&self, op: StoreOp, key: &str, fault: Fault) {
        self.plan()
            .on_key
            .entry((op, key.to_owned()))
            .or_default()
            .push_back(fault);
    }

    /// Makes every call on this handle of `op` (of every operation for
    /// `None`) fail with an error of `kind` until `until`, as a table in an
    /// outage (`Retryable`) or throttling its callers (`Throttled`) would.
    /// Several such windows (of different operations) may run at once.
    pub fn fail_until(&self, op: Option<StoreOp>, kind: StoreErrorKind, until: Instant) {
        self.plan().failing.push((op, kind, until));
    }

    /// Makes the next call of any operation on this handle suffer `fault`.
    pub fn inject_next(&self, fault: Fault) {
        self.plan().any_op.push_back(fault);
    }

    /// Draws random faults for every later call on this handle.
    pub fn set_random_faults(&self, faults: Option<RandomFaults>) {
        self.plan().random = faults.map(|f| {
            let rng = SmallRng::seed_from_u64(f.seed);
            (f, rng)
        });
    }

    /// Holds every call on this handle until `until`, as if the process were
    /// stopped (SIGSTOP, a long GC pause): requests sit unsent until then.
    pub fn pause_until(&self, until: Instant) {
        self.plan().paused_until = Some(until);
    }

    /// Makes every later call on this handle that names one of `keys` hang
    /// without an answer (and without applying), as a request stuck on a
    /// dead connection would; an empty list lifts it. Scans are not
    /// affected.
    pub fn blackhole(&self, keys: &[&str]) {
        self.plan().blackhole = keys.iter().map(|k| (*k).to_owned()).collect();
    }

    /// The faults the next call of `op` (on `key`) suffers, in the order
    /// they apply, and the instant a pause holds it until.
    fn next_fault(&self, op: StoreOp, key: Option<&str>) -> (Option<Instant>, Vec<Fault>) {
        let mut plan = self.plan();
        let paused = plan.paused_until;
        let mut faults = Vec::new();
        if key.is_some_and(|k| plan.blackhole.iter().any(|b| b == k)) {
            faults.push(Fault::Hang);
        }
        let now = Instant::now();
        plan.failing.retain(|(_, _, until)| now < *until);
        if let Some((_, kind, _)) = plan
            .failing
            .iter()
            .find(|(only, _, _)| only.is_none_or(|o| o == op))
        {
            faults.push(Fault::Error(*kind));
        }
        if let Some(key) = key
            && let Some(f) = plan
                .on_key
                .get_mut(&(op, key.to_owned()))
                .and_then(VecDeque::pop_front)
        {
            faults.push(f);
        }
        if let Some(f) = plan.any_op.pop_front() {
            faults.push(f);
        }
        if let Some(f) = plan.scripted.get_mut(&op).and_then(VecDeque::pop_front) {
            faults.push(f);
        }
        if let Some((cfg, rng)) = plan.random.as_mut() {
            if !cfg.max_latency.is_zero() {
                let nanos = rng.random_range(0..=cfg.max_latency.as_nanos() as u64);
                faults.push(Fault::Delay(Duration::from_nanos(nanos)));
            }
            let roll: f64 = rng.random();
            if roll < cfg.error_rate {
                faults.push(Fault::Error(StoreErrorKind::Retryable));
            } else if op != StoreOp::ScanPage
                && op != StoreOp::Get
                && roll < cfg.error_rate + cfg.lost_response_rate
            {
                faults.push(Fault::LostResponse);
            }
        }
        (paused, faults)
    }

    /// Runs one call: injects its faults around `apply`, which runs under
    /// the table lock.
    pub(super) async fn call<T>(
        &self,
        op: StoreOp,
        key: Option<&str>,
        apply: impl FnOnce(&mut Table) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let (paused, faults) = self.next_fault(op, key);
        if let Some(until) = paused {
            tokio::time::sleep_until(until).await;
        }
        let mut after = Duration::ZERO;
        let mut lose_response = false;
        for fault in faults {
            match fault {
                Fault::Delay(d) => tokio::time::sleep(d).await,
                Fault::SlowResponse(d) => after += d,
                Fault::LostResponse => lose_response = true,
                Fault::Error(kind) => return Err(injected_error(op, kind)),
                Fault::Hang => std::future::pending::<()>().await,
            }
        }
        let result = apply(&mut self.lock());
        if !after.is_zero() {
            tokio::time::sleep(after).await;
        }
        if lose_response {
            return Err(StoreError::retryable(
                op,
                InjectedFault("response lost after the write applied"),
            ));
        }
        result
    }
}

#[derive(Debug, thiserror::Error)]
#[error("injected fault: {0}")]
struct InjectedFault(&'static str);

fn injected_error(op: StoreOp, kind: StoreErrorKind) -> StoreError {
    match kind {
        StoreErrorKind::Throttled => StoreError::Throttled {
            op,
            source: Box::new(InjectedFault("throttled")),
        },
        StoreErrorKind::Fatal => StoreError::Fatal {
            op,
            message: "injected fatal error".into(),
            source: None,
        },
        StoreErrorKind::ConditionFailed => StoreError::ConditionFailed {
            key: String::new(),
            current: None,
        },
        _ => StoreError::retryable(op, InjectedFault("request failed")),
    }
}
