//! An in-memory [`LeaseStore`] with the same semantics as the DynamoDB one,
//! plus fault injection, for tests, benchmarks and deterministic simulation.
//!
//! Several workers share one table by holding [`InMemoryLeaseStore::handle`]s
//! of it; each handle has its own fault plan, so one worker can be made slow,
//! paused or unlucky while its peers are not.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{
    Beat, BeatUpdate, CheckpointUpdate, ErrorKind, Holder, Intent, JavaWorker, LeaseStore, Page,
    StoreError, StoreOp,
};
use crate::lease::{Checkpoint, Lease, Throughput};

/// A fault to inject into one store call.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Fail before applying, with an error of this kind.
    Error(ErrorKind),
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

/// A change of owner, as recorded by the store for later checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerChange {
    /// When the change was applied.
    pub at: Instant,
    /// The lease.
    pub key: String,
    /// The owner before.
    pub from: Option<String>,
    /// The owner after.
    pub to: Option<String>,
}

#[derive(Debug, Default)]
struct Table {
    leases: BTreeMap<String, Lease>,
    owner_changes: Vec<OwnerChange>,
    /// Every checkpoint written, with its lease key, in order.
    checkpoints: Vec<(String, Checkpoint)>,
    /// Liveness records by instance id (a table of their own in DynamoDB).
    beats: BTreeMap<String, Beat>,
    /// When each record was last written, on the (possibly paused) tokio
    /// clock every handle shares: what [`Beat::age`] is read from.
    beats_written: HashMap<String, Instant>,
    /// Java KCL workers' `WorkerMetricStats` entries, as a test sets them.
    java_workers: Vec<JavaWorker>,
}

#[derive(Debug, Default)]
struct FaultPlan {
    scripted: HashMap<StoreOp, VecDeque<Fault>>,
    /// Faults for calls of one operation on one key.
    on_key: HashMap<(StoreOp, String), VecDeque<Fault>>,
    any_op: VecDeque<Fault>,
    /// Every call (of one operation, or of all) fails with this kind until
    /// the instant: an outage, or a table that throttles.
    failing: Vec<(Option<StoreOp>, ErrorKind, Instant)>,
    random: Option<(RandomFaults, SmallRng)>,
    paused_until: Option<Instant>,
    /// Calls on these keys hang forever (a "blackhole").
    blackhole: Vec<String>,
}

/// The in-memory lease table. Cloning shares the table and the fault plan;
/// [`InMemoryLeaseStore::handle`] shares the table with a fresh fault plan.
#[derive(Debug, Clone)]
pub struct InMemoryLeaseStore {
    table: Arc<Mutex<Table>>,
    faults: Arc<Mutex<FaultPlan>>,
    page_size: usize,
}

impl Default for InMemoryLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryLeaseStore {
    /// An empty table with scan pages of 100 leases.
    pub fn new() -> Self {
        InMemoryLeaseStore {
            table: Arc::default(),
            faults: Arc::default(),
            page_size: 100,
        }
    }

    /// Sets the number of leases per scan page (at least 1).
    pub fn with_page_size(mut self, page_size: usize) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// Another view of the same table, with its own (empty) fault plan.
    pub fn handle(&self) -> Self {
        InMemoryLeaseStore {
            table: Arc::clone(&self.table),
            faults: Arc::default(),
            page_size: self.page_size,
        }
    }

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
    pub fn fail_until(&self, op: Option<StoreOp>, kind: ErrorKind, until: Instant) {
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

    /// Replaces a lease as a writer outside kcl would (a Java KCL worker,
    /// a hand edit), without conditions.
    pub fn put_raw(&self, lease: Lease) {
        self.lock().leases.insert(lease.key.clone(), lease);
    }

    /// Sets the Java KCL workers' `WorkerMetricStats` entries (as Java
    /// workers reporting would).
    pub fn set_java_workers(&self, workers: Vec<JavaWorker>) {
        self.lock().java_workers = workers;
    }

    /// A copy of every lease, in key order.
    pub fn snapshot(&self) -> Vec<Lease> {
        self.lock().leases.values().cloned().collect()
    }

    /// A copy of every liveness record, in instance order.
    pub fn beats_snapshot(&self) -> Vec<Beat> {
        self.lock().beats.values().cloned().collect()
    }

    /// Every owner change applied so far, in order.
    pub fn owner_changes(&self) -> Vec<OwnerChange> {
        self.lock().owner_changes.clone()
    }

    /// Every checkpoint written (plain checkpoints; SHARD_END included),
    /// with its lease key, in the order they landed.
    pub fn checkpoints_written(&self) -> Vec<(String, Checkpoint)> {
        self.lock().checkpoints.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock can only come from a test assertion;
        // the table is still consistent, so keep going.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn plan(&self) -> MutexGuard<'_, FaultPlan> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

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
                faults.push(Fault::Error(ErrorKind::Retryable));
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
    async fn call<T>(
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

    /// Applies a guarded update of one lease: `guard` decides whether the
    /// condition holds, `update` changes the lease. On a failed condition a
    /// state matching `intent` counts as success (a retried write whose
    /// first attempt applied).
    fn update(
        table: &mut Table,
        key: &str,
        intent: Option<Intent<'_>>,
        guard: impl FnOnce(&Lease) -> bool,
        update: impl FnOnce(&mut Lease),
    ) -> Result<Lease, StoreError> {
        let Some(lease) = table.leases.get_mut(key) else {
            return Err(StoreError::ConditionFailed {
                key: key.to_owned(),
                current: None,
            });
        };
        if !guard(lease) {
            if intent.is_some_and(|i| i.applied_in(lease)) {
                return Ok(lease.clone());
            }
            return Err(StoreError::ConditionFailed {
                key: key.to_owned(),
                current: Some(Box::new(lease.clone())),
            });
        }
        let before = lease.owner.clone();
        update(lease);
        let after = lease.clone();
        if before != after.owner {
            table.owner_changes.push(OwnerChange {
                at: Instant::now(),
                key: key.to_owned(),
                from: before,
                to: after.owner.clone(),
            });
        }
        Ok(after)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("injected fault: {0}")]
struct InjectedFault(&'static str);

fn injected_error(op: StoreOp, kind: ErrorKind) -> StoreError {
    match kind {
        ErrorKind::Throttled => StoreError::Throttled {
            op,
            source: Box::new(InjectedFault("throttled")),
        },
        ErrorKind::Fatal => StoreError::Fatal {
            op,
            message: "injected fatal error".into(),
            source: None,
        },
        ErrorKind::ConditionFailed => StoreError::ConditionFailed {
            key: String::new(),
            current: None,
        },
        _ => StoreError::retryable(op, InjectedFault("request failed")),
    }
}

#[async_trait]
impl LeaseStore for InMemoryLeaseStore {
    async fn create_if_absent(&self, lease: &Lease) -> Result<Lease, StoreError> {
        self.call(StoreOp::Create, Some(&lease.key), |t| {
            if let Some(existing) = t.leases.get(&lease.key) {
                return Err(StoreError::ConditionFailed {
                    key: lease.key.clone(),
                    current: Some(Box::new(existing.clone())),
                });
            }
            t.leases.insert(lease.key.clone(), lease.clone());
            Ok(lease.clone())
        })
        .await
    }

    fn scan(&self) -> BoxStream<'_, Result<Page, StoreError>> {
        // `None` = not started, `Some(None)` = done, `Some(Some(k))` = resume after k.
        stream::unfold(Some(None::<String>), move |state| async move {
            let after = state?;
            let page = self
                .call(StoreOp::ScanPage, None, |t| {
                    let range = match &after {
                        Some(k) => t.leases.range::<String, _>((
                            std::ops::Bound::Excluded(k.clone()),
                            std::ops::Bound::Unbounded,
                        )),
                        None => t.leases.range::<String, _>(..),
                    };
                    Ok(range
                        .take(self.page_size)
                        .map(|(_, l)| l.clone())
                        .collect::<Vec<_>>())
                })
                .await;
            match page {
                Ok(page) if page.len() < self.page_size => Some((Ok(page), None)),
                Ok(page) => {
                    let last = page.last().map(|l| l.key.clone());
                    Some((Ok(page), Some(last)))
                }
                // A failed page ends the scan: callers see the error and retry
                // the whole scan on their next tick.
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed()
    }

    async fn get(&self, key: &str) -> Result<Option<Lease>, StoreError> {
        self.call(StoreOp::Get, Some(key), |t| Ok(t.leases.get(key).cloned()))
            .await
    }

    async fn take(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError> {
        let intent = Intent::Taken {
            by,
            counter: seen.counter + 1,
        };
        self.call(StoreOp::Take, Some(&seen.key), |t| {
            Self::update(
                t,
                &seen.key,
                Some(intent),
                |l| l.counter == seen.counter && l.owner == seen.owner,
                |l| {
                    if !l.is_owned_by(by.owner) {
                        l.owner_switches_since_checkpoint += 1;
                    }
                    l.owner = Some(by.owner.to_owned());
                    l.tenure = by.tenure.map(str::to_owned);
                    l.counter += 1;
                    l.checkpoint_owner = None;
                    l.checkpoint_owner_tenure = None;
                },
            )
        })
        .await
    }

    async fn reclaim(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError> {
        let intent = Intent::Own {
            by,
            counter: seen.counter + 1,
        };
        self.call(StoreOp::Reclaim, Some(&seen.key), |t| {
            Self::update(
                t,
                &seen.key,
                Some(intent),
                |l| l.counter == seen.counter && l.is_owned_by(by.owner),
                |l| {
                    l.tenure = by.tenure.map(str::to_owned);
                    l.counter += 1;
                },
            )
        })
        .await
    }

    async fn renew_with(
        &self,
        key: &str,
        by: Holder<'_>,
        counter: u64,
        load: Option<Throughput>,
    ) -> Result<Lease, StoreError> {
        let intent = Intent::Own {
            by,
            counter: counter + 1,
        };
        self.call(StoreOp::Renew, Some(key), |t| {
            Self::update(
                t,
                key,
                Some(intent),
                |l| (by.owns(l) || by.hands_off(l)) && l.counter == counter,
                |l| {
                    l.counter += 1;
                    if let Some(load) = load {
                        l.throughput = Some(load.rounded());
                    }
                },
            )
        })
        .await
    }

    async fn report_load(
        &self,
        key: &str,
        by: Holder<'_>,
        load: Throughput,
    ) -> Result<Lease, StoreError> {
        self.call(StoreOp::ReportLoad, Some(key), |t| {
            Self::update(
                t,
                key,
                None,
                |l| by.owns(l),
                |l| l.throughput = Some(load.rounded()),
            )
        })
        .await
    }

    async fn release(&self, key: &str, by: Holder<'_>) -> Result<Lease, StoreError> {
        self.call(StoreOp::Release, Some(key), |t| {
            Self::update(
                t,
                key,
                None,
                |l| by.owns(l),
                |l| {
                    l.owner = None;
                    l.tenure = None;
                    l.counter += 1;
                },
            )
        })
        .await
    }

    async fn hand_back(&self, seen: &Lease, drain: bool) -> Result<Lease, StoreError> {
        let Some((from, previous)) = super::handed_back_by(seen, drain) else {
            return Err(StoreError::lost_race(seen));
        };
        let intent = Intent::HandedBack {
            from: Holder::new(from.owner, &previous),
            counter: seen.counter,
        };
        self.call(StoreOp::Release, Some(&seen.key), |t| {
            Self::update(
                t,
                &seen.key,
                Some(intent),
                |l| {
                    l.counter == seen.counter
                        && l.owner == seen.owner
                        && l.tenure == seen.tenure
                        && l.checkpoint_owner == seen.checkpoint_owner
                        && l.checkpoint_owner_tenure == seen.checkpoint_owner_tenure
                },
                |l| {
                    l.owner = None;
                    l.tenure = None;
                    l.checkpoint_owner = Some(from.owner.to_owned());
                    l.checkpoint_owner_tenure = Some(previous.clone());
                },
            )
        })
        .await
    }

    async fn checkpoint(
        &self,
        key: &str,
        by: Holder<'_>,
        update: &CheckpointUpdate,
    ) -> Result<Lease, StoreError> {
        self.call(StoreOp::Checkpoint, Some(key), |t| {
            let written = Self::update(
                t,
                key,
                Some(Intent::Checkpointed { by, update }),
                |l| {
                    by.may_checkpoint(l)
                        && update.replacing.as_ref().is_none_or(|p| *p == l.checkpoint)
                },
                |l| {
                    l.checkpoint = update.checkpoint.clone();
                    l.pending_checkpoint = update.pending.clone();
                    l.pending_checkpoint_state = update.pending_state.clone();
                    l.owner_switches_since_checkpoint = 0;
                    if !update.children.is_empty() {
                        l.child_shard_ids = update.children.clone();
                    }
                },
            );
            if written.is_ok() {
                t.checkpoints
                    .push((key.to_owned(), update.checkpoint.clone()));
            }
            written
        })
        .await
    }

    async fn start_handoff(&self, seen: &Lease, to: Holder<'_>) -> Result<Lease, StoreError> {
        let Some(from) = seen.owner.as_deref() else {
            return Err(StoreError::lost_race(seen));
        };
        let intent = Intent::HandoffStarted {
            from,
            to,
            counter: seen.counter,
        };
        self.call(StoreOp::StartHandoff, Some(&seen.key), |t| {
            Self::update(
                t,
                &seen.key,
                Some(intent),
                |l| {
                    l.is_owned_by(from) && l.counter == seen.counter && l.checkpoint_owner.is_none()
                },
                |l| {
                    l.owner = Some(to.owner.to_owned());
                    l.checkpoint_owner = Some(from.to_owned());
                    // The counter guard makes the tenure the one `seen` shows.
                    l.checkpoint_owner_tenure = l.tenure.take();
                    l.tenure = to.tenure.map(str::to_owned);
                },
            )
        })
        .await
    }

    async fn complete_handoff(&self, key: &str, from: Holder<'_>) -> Result<Lease, StoreError> {
        self.call(StoreOp::CompleteHandoff, Some(key), |t| {
            Self::update(
                t,
                key,
                None,
                |l| from.hands_off(l),
                |l| {
                    l.checkpoint_owner = None;
                    l.checkpoint_owner_tenure = None;
                    l.counter += 1;
                },
            )
        })
        .await
    }

    async fn delete(&self, key: &str, counter: u64) -> Result<(), StoreError> {
        self.call(StoreOp::Delete, Some(key), |t| match t.leases.get(key) {
            Some(l) if l.counter == counter => {
                t.leases.remove(key);
                Ok(())
            }
            other => Err(StoreError::ConditionFailed {
                key: key.to_owned(),
                current: other.cloned().map(Box::new),
            }),
        })
        .await
    }

    async fn beat(&self, update: &BeatUpdate<'_>) -> Result<Beat, StoreError> {
        self.call(StoreOp::Beat, Some(update.instance), |t| {
            let beat = t
                .beats
                .entry(update.instance.to_owned())
                .or_insert_with(|| Beat {
                    instance: update.instance.to_owned(),
                    worker: update.worker.to_owned(),
                    // A record created anew starts at a random counter, as
                    // in DynamoDB: see `kcl_dynamodb::liveness`.
                    counter: u64::from(rand::random::<u32>()),
                    ..Beat::default()
                });
            if beat.worker != update.worker {
                return Err(StoreError::ConditionFailed {
                    key: update.instance.to_owned(),
                    current: None,
                });
            }
            beat.counter += 1;
            beat.held = update.held;
            beat.changes = update.changes;
            beat.stopping = update.stopping;
            beat.per_lease = update.per_lease;
            beat.lease_duration = Some(update.lease_duration);
            beat.beat_interval = Some(update.beat_interval);
            beat.written_at = Some(std::time::SystemTime::now());
            t.beats_written
                .insert(update.instance.to_owned(), Instant::now());
            for key in update.answered {
                beat.asked.remove(key);
            }
            Ok(beat.clone())
        })
        .await
    }

    async fn beats(&self) -> Result<Vec<Beat>, StoreError> {
        self.call(StoreOp::ReadBeats, None, |t| {
            let now = Instant::now();
            Ok(t.beats
                .values()
                .map(|b| Beat {
                    age: t
                        .beats_written
                        .get(&b.instance)
                        .map(|w| now.saturating_duration_since(*w)),
                    ..b.clone()
                })
                .collect())
        })
        .await
    }

    async fn poke(&self, instance: &str, ask: Option<&str>) -> Result<(), StoreError> {
        self.call(StoreOp::Poke, Some(instance), |t| {
            let Some(beat) = t.beats.get_mut(instance) else {
                return Err(StoreError::ConditionFailed {
                    key: instance.to_owned(),
                    current: None,
                });
            };
            beat.wake += 1;
            if let Some(key) = ask {
                beat.asked.insert(key.to_owned());
            }
            Ok(())
        })
        .await
    }

    async fn java_workers(&self) -> Result<Vec<JavaWorker>, StoreError> {
        self.call(StoreOp::ReadJavaWorkers, None, |t| {
            Ok(t.java_workers.clone())
        })
        .await
    }

    async fn forget(&self, instance: &str, counter: Option<u64>) -> Result<(), StoreError> {
        self.call(StoreOp::Forget, Some(instance), |t| {
            match t.beats.get(instance) {
                Some(b) if counter.is_none_or(|c| c == b.counter) => {
                    t.beats.remove(instance);
                    t.beats_written.remove(instance);
                    Ok(())
                }
                None if counter.is_none() => Ok(()),
                _ => Err(StoreError::ConditionFailed {
                    key: instance.to_owned(),
                    current: None,
                }),
            }
        })
        .await
    }
}

#[cfg(test)]
mod conformance_tests {
    use super::InMemoryLeaseStore;

    async fn new_store() -> InMemoryLeaseStore {
        InMemoryLeaseStore::new().with_page_size(10)
    }

    crate::lease_store_conformance!(new_store);
}
