//! The in-memory table's [`LeaseStore`] operations, each a guarded update
//! under the table lock with the DynamoDB store's conditions.

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::time::Instant;

use super::InMemoryLeaseStore;
use crate::lease::{Lease, Throughput};
use crate::store::{
    Beat, BeatUpdate, CheckpointUpdate, Holder, Intent, JavaWorker, LeaseStore, Page, StoreError,
    StoreOp,
};

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
        self.guarded(
            StoreOp::Take,
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
        .await
    }

    async fn reclaim(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError> {
        let intent = Intent::Own {
            by,
            counter: seen.counter + 1,
        };
        self.guarded(
            StoreOp::Reclaim,
            &seen.key,
            Some(intent),
            |l| l.counter == seen.counter && l.is_owned_by(by.owner),
            |l| {
                l.tenure = by.tenure.map(str::to_owned);
                l.counter += 1;
            },
        )
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
        self.guarded(
            StoreOp::Renew,
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
        .await
    }

    async fn report_load(
        &self,
        key: &str,
        by: Holder<'_>,
        load: Throughput,
    ) -> Result<Lease, StoreError> {
        self.guarded(
            StoreOp::ReportLoad,
            key,
            None,
            |l| by.owns(l),
            |l| l.throughput = Some(load.rounded()),
        )
        .await
    }

    async fn release(&self, key: &str, by: Holder<'_>) -> Result<Lease, StoreError> {
        self.guarded(
            StoreOp::Release,
            key,
            None,
            |l| by.owns(l),
            |l| {
                l.owner = None;
                l.tenure = None;
                // See `LeaseStore::release`: a handoff's counter stays.
                if l.checkpoint_owner.is_none() {
                    l.counter += 1;
                }
            },
        )
        .await
    }

    async fn hand_back(&self, seen: &Lease, drain: bool) -> Result<Lease, StoreError> {
        let Some((from, previous)) = crate::store::handed_back_by(seen, drain) else {
            return Err(StoreError::lost_race(seen));
        };
        let intent = Intent::HandedBack {
            from: Holder::new(from.owner, &previous),
            counter: seen.counter,
        };
        self.guarded(
            StoreOp::Release,
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
        self.guarded(
            StoreOp::StartHandoff,
            &seen.key,
            Some(intent),
            |l| l.is_owned_by(from) && l.counter == seen.counter && l.checkpoint_owner.is_none(),
            |l| {
                l.owner = Some(to.owner.to_owned());
                l.checkpoint_owner = Some(from.to_owned());
                // The counter guard makes the tenure the one `seen` shows.
                l.checkpoint_owner_tenure = l.tenure.take();
                l.tenure = to.tenure.map(str::to_owned);
            },
        )
        .await
    }

    async fn complete_handoff(&self, key: &str, from: Holder<'_>) -> Result<Lease, StoreError> {
        self.guarded(
            StoreOp::CompleteHandoff,
            key,
            None,
            |l| from.hands_off(l),
            |l| {
                l.checkpoint_owner = None;
                l.checkpoint_owner_tenure = None;
                l.counter += 1;
            },
        )
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
                    // in DynamoDB: see `kcl_dynamodb::liveness`. Drawn from
                    // the instance and the records created so far, so that
                    // a seeded simulation replays exactly.
                    counter: {
                        t.beats_created += 1;
                        crate::backoff::mix_seed(t.beats_created, update.instance) >> 32
                    },
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
