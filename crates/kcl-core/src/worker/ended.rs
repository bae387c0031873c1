//! What the worker does as a consumer ends: takes it off the running set,
//! then releases, hands off or gives back its lease as its exit says, once
//! no other consumer of that lease still runs.

use std::collections::HashMap;

use tracing::{error, warn};

use super::Worker;
use super::running::Running;
use crate::consumer::ConsumerExit;
use crate::leases::{EndReason, LeaseCoordinator, LeaseHandle, LetGo};
use crate::metric_names::CONSUMER_PANICS;
use crate::store::StoreError;

/// What a consumer task returns: its lease key and how it ended.
pub(super) type Joined = Result<(tokio::task::Id, (String, ConsumerExit)), tokio::task::JoinError>;

/// A lease's due action: the tenure it applies to, and how its consumer
/// ended (`None`: its processor panicked).
pub(super) type Due = (LeaseHandle, Option<ConsumerExit>);

/// Actions on leases put off while an older consumer of the same lease
/// still runs (its call hung past its tenure's end, and the newer tenure's
/// consumer ended while it waited for the shard's slot): freed then, a
/// peer could process the shard beside that call. Only the action of a
/// consumer that never got past that wait is put off. One that did may
/// have processed beside the older call already (it gave up waiting, or
/// took the slot from a third that had); putting its action off would
/// leave the lease held and unread for as long as that call hangs, and
/// the shard is kept read instead: a peer may then run beside the hung
/// call, as beside any call hung past its tenure's end. By lease key.
pub(super) type Deferred = HashMap<String, Due>;

/// A consumer that ended, taken off the running set.
#[derive(Debug)]
pub(super) struct Ended {
    /// Its lease key.
    pub(super) key: String,
    /// How it ended; `None` if its processor panicked.
    pub(super) exit: Option<ConsumerExit>,
    /// A newer tenure of its lease has its own consumer, which counts the
    /// shard.
    pub(super) superseded: bool,
    /// Its tenure ended under it (lost or fenced) before the worker acted.
    pub(super) lost: bool,
    /// The actions due now: its own (put off while an older consumer of
    /// the lease still runs, see [`Deferred`]), and one a newer consumer
    /// of the lease put off until this one ended.
    pub(super) due: Vec<Due>,
}

impl Worker {
    /// Takes a consumer's end off `running`; `None` for a task it no
    /// longer knows.
    pub(super) fn consumer_ended(
        &self,
        coordinator: &LeaseCoordinator,
        running: &mut Running,
        deferred: &mut Deferred,
        done: Joined,
    ) -> Option<Ended> {
        let id = match &done {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        // Every action applies to the tenure this consumer ran with, not
        // to a later one of the same lease.
        let entry = running.remove(id)?;
        let past_slot = entry.got_past_slot();
        let lease = entry.lease;
        let exit = match done {
            Ok((_, (_, exit))) => Some(exit),
            Err(e) => {
                // A processor panicked. Its shard is given back, to be
                // retried from the last checkpoint, rather than left held
                // and unprocessed.
                error!(lease = %lease.key(), error = %e, "a shard consumer panicked; releasing its lease");
                metrics::counter!(CONSUMER_PANICS, "worker" => self.config.lease.worker_id().to_owned())
                    .increment(1);
                None
            }
        };
        let superseded = coordinator
            .handle(lease.key())
            .is_some_and(|current| current.tenure() != lease.tenure());
        let lost = matches!(
            lease.end_reason(),
            Some(EndReason::Lost | EndReason::Fenced)
        );
        let key = lease.key().to_owned();
        let mut due = Vec::new();
        // A tenure nobody reads is not renewed on (invariant 12): its end
        // is never put off.
        if exit == Some(ConsumerExit::LeaseLost) || past_slot {
            due.push((lease, exit));
        } else if !superseded {
            deferred.insert(key.clone(), (lease, exit));
        }
        if !running.has_key(&key) {
            due.extend(deferred.remove(&key));
        }
        Some(Ended {
            key,
            exit,
            superseded,
            lost,
            due,
        })
    }

    /// Acts on a lease as its consumer's exit says: what became of it.
    pub(super) async fn settle(
        &self,
        coordinator: &LeaseCoordinator,
        (lease, exit): Due,
    ) -> Result<LetGo, StoreError> {
        let let_go = match exit {
            // The consumer stopped on its own: its tenure is not renewed on
            // without a reader (invariant 12).
            Some(ConsumerExit::LeaseLost) => {
                coordinator.consumer_stopped(&lease).await;
                Ok(LetGo::NotHeld)
            }
            Some(ConsumerExit::ShardEnded) => {
                self.handle.update(|s| s.shards_finished += 1);
                coordinator.shard_finished(&lease).await
            }
            Some(ConsumerExit::Unreadable) => {
                let limit = self.config.max_read_failure_time;
                coordinator.give_back_unreadable(&lease, limit).await
            }
            Some(ConsumerExit::HandedOff) => coordinator
                .complete_handoff(&lease)
                .await
                .map(LetGo::handed_off),
            // Its processor is done: peers may take the shard now, and a
            // peer's handoff asked during a shutdown need not wait for the
            // slowest shard of the drain.
            Some(ConsumerExit::ShutDown | ConsumerExit::Release | ConsumerExit::CutOff) | None => {
                coordinator.let_go(&lease).await
            }
        };
        if let Err(e) = &let_go {
            warn!(lease = %lease.key(), ?exit, error = %e, "letting the lease go failed; it expires instead (or the handoff is forced)");
        }
        self.publish(coordinator);
        let_go
    }
}
