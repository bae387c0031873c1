//! What the subscription task does with each event: drop what was
//! received before, de-aggregate the rest, tell whether the shard ended
//! (announced, or found closed by a check), and queue the batch.

use std::cmp::Ordering;
use std::sync::Arc;

use aws_sdk_kinesis::types::{Record, SubscribeToShardEvent};
use kcl_core::checkpointer::SequenceNumber;
use kcl_core::source::{Batch, ChildShard, SourceError};
use tokio::sync::mpsc::OwnedPermit;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Flow, MAX_STALL, Message, Room, Subscriber, UNANNOUNCED_END_CHECK};
use crate::budget::HeldBudget;
use crate::calls::classify::Classified;
use crate::calls::retry::Failure;
use crate::discovery::{EndSeen, closed_shard_children};
use crate::records::{Taken, held_bytes};
use crate::task_reader::Delivery;

/// An event's batch on its way to the reader: its slot in the channel,
/// its records and what they hold of the worker-wide budget.
struct EventBatch {
    /// The channel slot the event was read into; given back while a
    /// closed shard's children are looked up (see [`Subscriber::children`]).
    slot: Option<OwnedPermit<Message>>,
    user: Vec<kcl_core::Record>,
    /// What the records hold in memory.
    bytes: usize,
    behind: Option<u64>,
    worker: HeldBudget,
}

impl Subscriber {
    /// True unless the record was already received, or lies before the
    /// resume checkpoint.
    fn is_new(&self, seq: &str) -> bool {
        if let Some(last) = self.pipeline.last_sequence() {
            return SequenceNumber::order(seq, last) == Ordering::Greater;
        }
        if let Some(floor) = &self.floor {
            return SequenceNumber::order(seq, floor) != Ordering::Less;
        }
        true
    }

    /// De-aggregates an event and queues it for the reader in the slot of
    /// `room`, keeping what it holds of the room's reservation.
    pub(super) async fn on_event(
        &mut self,
        event: SubscribeToShardEvent,
        room: Room,
    ) -> Result<Flow, SourceError> {
        self.shared.stats.event();
        self.meters.events.increment(1);
        self.answers.answered();
        self.received_event = true;
        self.restart_at = None;

        let SubscribeToShardEvent {
            records,
            continuation_sequence_number: continuation,
            millis_behind_latest,
            child_shards,
            ..
        } = event;
        let records = self.new_records(records, &continuation);
        let (mut batch, fetched) = self.take(records, room, millis_behind_latest);
        let shard_end = match self
            .shard_end(&continuation, child_shards, fetched, &mut batch)
            .await?
        {
            Closed::No => None,
            Closed::Yes(children) => Some(children),
            Closed::ReaderGone => return Ok(Flow::ReaderGone),
        };
        self.queue(batch, shard_end).await
    }

    /// The event's records not received before (nor before the resume
    /// checkpoint); notes the continuation to subscribe after.
    fn new_records(&mut self, records: Vec<Record>, continuation: &str) -> Vec<Record> {
        let received = records.len();
        let records: Vec<_> = records
            .into_iter()
            .filter(|r| self.is_new(&r.sequence_number))
            .collect();
        if records.len() < received {
            // A resubscription may start before records already received
            // (an endpoint that treats an unknown sequence number as
            // TRIM_HORIZON, say); delivering them again would break order.
            let repeated = received - records.len();
            self.meters.repeated.increment(repeated as u64);
            debug!(stream = %self.stream, shard = %self.shard_id, repeated,
                "dropped records received before");
        }
        if !records.is_empty() {
            self.floor = None;
        }
        if !continuation.is_empty() {
            self.continuation = Some(continuation.to_owned());
        } else if !records.is_empty() {
            // The next subscription, and a closed-shard check, start after
            // these records, not at an older event's continuation.
            self.continuation = None;
        }
        records
    }

    /// Runs the records through the pipeline and counts them; the batch
    /// keeps what it holds of the room's reservation. Also returns how
    /// many Kinesis records were fetched.
    fn take(
        &mut self,
        records: Vec<Record>,
        room: Room,
        millis_behind_latest: i64,
    ) -> (EventBatch, usize) {
        let Taken {
            user,
            fetched,
            payload_bytes,
        } = self.pipeline.take(records);
        self.shared
            .stats
            .fetched(user.len() as u64, payload_bytes as u64);
        self.meters.records.increment(user.len() as u64);
        self.meters.bytes.increment(payload_bytes as u64);
        let bytes = held_bytes(&user);
        // Counted as soon as the records are made (a KPL aggregate's
        // expansion included), before anything below may wait.
        let Room { slot, worker } = room;
        let worker = self.shared.budget.keep(worker, bytes);
        self.estimate.saw(bytes);
        let behind = u64::try_from(millis_behind_latest).ok();
        if let Some(ms) = behind {
            self.meters.millis_behind_latest.set(ms as f64);
        }
        let batch = EventBatch {
            slot: Some(slot),
            user,
            bytes,
            behind,
            worker,
        };
        (batch, fetched)
    }

    /// Whether the event ends the shard: announced in the event, or (when
    /// a check is due on an idle shard at the tip) found closed.
    async fn shard_end(
        &mut self,
        continuation: &str,
        child_shards: Option<Vec<aws_sdk_kinesis::types::ChildShard>>,
        fetched: usize,
        batch: &mut EventBatch,
    ) -> Result<Closed, SourceError> {
        // Kinesis ends a shard's last event with its children and without
        // a continuation sequence number. Children beside a continuation
        // (an event Kinesis never sends; the Java KCL refuses it) do not
        // end the shard: records may follow the continuation, and the end
        // comes as it would without them.
        let announced =
            continuation.is_empty() && child_shards.as_ref().is_some_and(|c| !c.is_empty());
        if announced {
            Ok(
                match self
                    .children(EndSeen::Response(child_shards), &mut batch.slot)
                    .await?
                {
                    Some(children) => Closed::Yes(children),
                    None => Closed::ReaderGone,
                },
            )
        } else if continuation.is_empty() {
            // No continuation and no children: Kinesis never sends that on
            // an open shard, but another endpoint (or an SDK reading a
            // missing field as empty) may. The shard ends only once it is
            // found closed (taken for an end, an open shard's hash range
            // would never be read again), and an endpoint that sends such
            // events all along is checked at most once per interval.
            if self.unannounced_end_check_due() {
                self.unannounced_end_checked = Some(Instant::now());
                self.check_closed(&mut batch.slot).await
            } else {
                Ok(Closed::No)
            }
        } else if fetched == 0 && batch.behind == Some(0) && self.closed_check_due() {
            self.check_closed(&mut batch.slot).await
        } else {
            Ok(Closed::No)
        }
    }

    /// Queues the batch in its slot with its own byte budget, unless the
    /// lease ended or the batch says nothing new. A batch that waits
    /// [`MAX_STALL`] for the reader's bytes is kept for
    /// [`Self::queue_stalled`] ([`Flow::Stalled`]): meanwhile the
    /// subscription is unread and holds the connection's window.
    async fn queue(
        &mut self,
        batch: EventBatch,
        shard_end: Option<Vec<ChildShard>>,
    ) -> Result<Flow, SourceError> {
        let EventBatch {
            slot,
            user,
            bytes,
            behind,
            worker,
        } = batch;
        // The event may have waited in the transport while the lease ran
        // out: nothing read under a lease is queued after it.
        if !self.lease.is_valid() {
            return Err(self.lease_lost());
        }
        let end = shard_end.is_some();
        // Given back for a children lookup: taken again (the reader makes
        // room as it reads what the lookup reported).
        let slot = match slot {
            Some(slot) => slot,
            None => {
                let reserved = tokio::select! {
                    biased;
                    () = self.lease.ended() => return Err(self.lease_lost()),
                    reserved = self.tx.clone().reserve_owned() => reserved,
                };
                match reserved {
                    Ok(slot) => slot,
                    Err(_) => return Ok(Flow::ReaderGone),
                }
            }
        };
        // Our own slot counts as taken: anything less than the full
        // capacity beyond it means a batch is already waiting, and an
        // empty batch would say nothing new.
        if user.is_empty() && !end && self.tx.capacity() + 1 < self.tx.max_capacity() {
            return Ok(Flow::Continue);
        }
        let max = self.fanout.config.max_buffered_bytes;
        // The budget fits in u32 (validated at build()); a batch larger
        // than the whole budget takes all of it.
        let wanted = u32::try_from(bytes.min(max)).unwrap_or(u32::MAX);
        let batch = StalledBatch {
            slot,
            batch: Batch {
                records: user,
                millis_behind_latest: behind,
                shard_end,
            },
            wanted,
            worker,
        };
        let acquired = tokio::select! {
            biased;
            () = self.lease.ended() => return Err(self.lease_lost()),
            acquired = Arc::clone(&self.bytes).acquire_many_owned(wanted) => Some(acquired),
            () = tokio::time::sleep(MAX_STALL) => None,
        };
        match acquired {
            Some(Ok(budget)) => Ok(batch.send(budget)),
            Some(Err(_)) => Ok(Flow::ReaderGone),
            None => {
                self.stalled_batch = Some(batch);
                Ok(Flow::Stalled)
            }
        }
    }

    /// Queues the batch kept by a stall, if any, once the reader's bytes
    /// allow (no subscription is open meanwhile).
    pub(super) async fn queue_stalled(&mut self) -> Result<Flow, SourceError> {
        let Some(batch) = self.stalled_batch.take() else {
            return Ok(Flow::Continue);
        };
        let acquired = tokio::select! {
            biased;
            () = self.lease.ended() => return Err(self.lease_lost()),
            acquired = Arc::clone(&self.bytes).acquire_many_owned(batch.wanted) => acquired,
        };
        match acquired {
            Ok(budget) => Ok(batch.send(budget)),
            Err(_) => Ok(Flow::ReaderGone),
        }
    }

    /// Whether an event without continuation or children may run the
    /// closed-shard check: the first at once, later ones once the
    /// check's interval (or [`UNANNOUNCED_END_CHECK`]) passed.
    fn unannounced_end_check_due(&self) -> bool {
        let interval = self
            .fanout
            .config
            .closed_shard_check_interval
            .unwrap_or(UNANNOUNCED_END_CHECK);
        self.unannounced_end_checked
            .is_none_or(|at| at.elapsed() >= interval)
    }

    fn closed_check_due(&self) -> bool {
        let Some(interval) = self.fanout.config.closed_shard_check_interval else {
            return false;
        };
        self.last_closed_check.elapsed() >= interval
    }

    /// Asks with `GetShardIterator` + `GetRecords` whether the shard is
    /// closed and nothing follows the last record received: for endpoints
    /// that never announce the end in an event. Best effort: a failed
    /// check is tried again at the next interval.
    async fn check_closed(
        &mut self,
        slot: &mut Option<OwnedPermit<Message>>,
    ) -> Result<Closed, SourceError> {
        self.last_closed_check = Instant::now();
        self.meters.closed_checks.increment(1);
        // Where the next subscription would start (after a trimmed start,
        // TRIM_HORIZON rather than the trimmed position).
        let start = self.position();
        // Best effort, so without the lease: throttles and denied access
        // count toward the transient limit instead of retrying forever.
        let (stream, shard) = (self.stream.as_str(), self.shard_id.as_str());
        let failed = |c: Classified| {
            debug!(stream, shard, error = %c.error,
                "closed-shard check failed; trying again later");
            Ok(Closed::No)
        };
        let iterator = match self
            .shared
            .shard_iterator(stream, shard, &start, None)
            .await
        {
            Ok(Some(it)) => Some(it),
            // No iterator: closed and read to its end, as the Java KCL
            // takes it (the children come from ListShards).
            Ok(None) => None,
            Err(Failure::LeaseLost) => return Err(self.lease_lost()),
            Err(Failure::Classified(c) | Failure::Exhausted(c)) => return failed(c),
        };
        let mut seen = EndSeen::NoIterator;
        let no_iterator = iterator.is_none();
        if let Some(iterator) = iterator {
            let out = match self.shared.peek_records(stream, &iterator, 1, None).await {
                Ok(out) => out,
                Err(Failure::LeaseLost) => return Err(self.lease_lost()),
                Err(Failure::Classified(c) | Failure::Exhausted(c)) => return failed(c),
            };
            let open = out
                .next_shard_iterator
                .as_deref()
                .is_some_and(|it| !it.is_empty());
            if open || !out.records.is_empty() {
                // Open, or records still to come: the subscription brings them.
                return Ok(Closed::No);
            }
            seen = EndSeen::Response(out.child_shards);
        }
        let children = match self.children(seen, slot).await? {
            Some(children) => children,
            None => return Ok(Closed::ReaderGone),
        };
        // A missing iterator alone is no proof: an open shard taken for
        // ended would never be read again. Its children are.
        if no_iterator && children.is_empty() {
            return Ok(Closed::No);
        }
        info!(stream = %self.stream, shard = %self.shard_id,
            "shard is closed and fully read, though no event said so");
        Ok(Closed::Yes(children))
    }

    /// The children of the closed shard (see [`closed_shard_children`]);
    /// `None` if the reader went away while retrying.
    ///
    /// A lookup that keeps failing reports each failure to the reader
    /// through the channel, so the event's `slot` is given back first:
    /// held, it could be the channel's only free one (`max_buffered_batches`
    /// 1), and the report would wait on it for good, the reader on the
    /// report.
    async fn children(
        &self,
        seen: EndSeen,
        slot: &mut Option<OwnedPermit<Message>>,
    ) -> Result<Option<Vec<ChildShard>>, SourceError> {
        drop(slot.take());
        let report = |e: SourceError| async move {
            warn!(stream = %self.stream, shard = %self.shard_id, error = %e,
                "listing the children keeps failing; still retrying");
            self.tx.send(Err(e)).await.is_ok()
        };
        closed_shard_children(
            &self.shared,
            &self.stream,
            &self.shard_id,
            &self.lease,
            seen,
            report,
        )
        .await
    }
}

/// An event's batch waiting for the reader's bytes, in its channel slot.
#[derive(Debug)]
pub(super) struct StalledBatch {
    slot: OwnedPermit<Message>,
    batch: Batch,
    /// The reader's bytes it takes.
    wanted: u32,
    worker: HeldBudget,
}

impl StalledBatch {
    /// Hands the batch to the reader with `budget`, the reader's bytes.
    fn send(self, budget: tokio::sync::OwnedSemaphorePermit) -> Flow {
        let end = self.batch.shard_end.is_some();
        (self.slot).send(Ok(Delivery::new(self.batch, (budget, self.worker))));
        if end { Flow::ShardEnd } else { Flow::Continue }
    }
}

/// What a closed-shard check found.
enum Closed {
    No,
    Yes(Vec<ChildShard>),
    ReaderGone,
}
