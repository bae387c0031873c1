//! A [`LeaseStore`](super::LeaseStore) decorator that bills every call as
//! DynamoDB would, for simulations of fleets too large for DynamoDB Local:
//! item sizes from the attribute names and values of the Java KCL layout,
//! read units per 4 KB of a strongly consistent read (a scan page or a
//! query is billed on the sum of its items), write units per 1 KB of the
//! larger of the item before and after (a failed condition still bills
//! its write).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::stream::StreamExt;

use super::{Beat, StoreError, StoreOp};
use crate::lease::{Checkpoint, Lease};

crate::counters! {
    /// Requests and capacity units counted by a [`CostedStore`].
    pub struct Bill => BillSnapshot {
        counts {
            /// Requests (a scan page is one).
            requests,
            /// Read capacity units.
            read_units,
            /// Write capacity units.
            write_units,
        }
    }
}

impl Bill {
    fn read(&self, bytes: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.read_units
            .fetch_add(bytes.div_ceil(4096).max(1) as u64, Ordering::Relaxed);
    }

    fn write(&self, bytes: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.write_units
            .fetch_add(bytes.div_ceil(1024).max(1) as u64, Ordering::Relaxed);
    }

    /// Writes of `items` lease items together (a checkpoint's is under
    /// 1 KB): one request per [`BATCH_STATEMENTS`], billed per item, as
    /// single writes are.
    fn write_items(&self, items: usize) {
        self.requests.fetch_add(
            items.div_ceil(BATCH_STATEMENTS).max(1) as u64,
            Ordering::Relaxed,
        );
        self.write_units
            .fetch_add(items.max(1) as u64, Ordering::Relaxed);
    }
}

/// The most statements DynamoDB takes in one `BatchExecuteStatement`
/// request, what a store writing checkpoints together sends at once.
const BATCH_STATEMENTS: usize = 25;

/// The size DynamoDB counts for a number attribute's value.
fn number_bytes(n: u64) -> usize {
    n.to_string().len().div_ceil(2) + 1
}

fn checkpoint_bytes(c: &Checkpoint) -> usize {
    match c {
        Checkpoint::Sequence { seq, .. } => seq.len(),
        other => other.to_string().len(),
    }
}

/// The size of a lease item in the Java KCL layout (names plus values).
pub fn lease_bytes(l: &Lease) -> usize {
    let text = |name: &str, v: Option<&str>| v.map_or(0, |v| name.len() + v.len());
    let mut bytes = "leaseKey".len()
        + l.key.len()
        + "leaseCounter".len()
        + number_bytes(l.counter)
        + "checkpoint".len()
        + checkpoint_bytes(&l.checkpoint)
        + "checkpointSubSequenceNumber".len()
        + 2
        + "ownerSwitchesSinceCheckpoint".len()
        + number_bytes(l.owner_switches_since_checkpoint);
    bytes += text("leaseOwner", l.owner.as_deref());
    bytes += text("kclTenure", l.tenure.as_deref());
    bytes += text("checkpointOwner", l.checkpoint_owner.as_deref());
    bytes += text(
        "kclCheckpointOwnerTenure",
        l.checkpoint_owner_tenure.as_deref(),
    );
    bytes += text("streamName", l.stream.as_deref());
    if !l.parent_shard_ids.is_empty() {
        bytes += "parentShardId".len() + l.parent_shard_ids.iter().map(String::len).sum::<usize>();
    }
    if !l.child_shard_ids.is_empty() {
        bytes += "childShardIds".len() + l.child_shard_ids.iter().map(String::len).sum::<usize>();
    }
    if l.hash_key_range.is_some() {
        bytes += "startingHashKey".len() + "endingHashKey".len() + 2 * 39;
    }
    if let Some(p) = &l.pending_checkpoint {
        bytes += "pendingCheckpoint".len() + checkpoint_bytes(p);
    }
    bytes
}

/// The size of a liveness record.
pub fn beat_bytes(b: &Beat) -> usize {
    "instance".len()
        + b.instance.len()
        + "workerId".len()
        + b.worker.len()
        + "beat".len()
        + number_bytes(b.counter)
        + "held".len()
        + number_bytes(b.held)
        + "changes".len()
        + number_bytes(b.changes)
        + "wake".len()
        + number_bytes(b.wake)
        + if b.stopping { "stopping".len() + 1 } else { 0 }
        + b.lease_duration
            .map_or(0, |d| "d".len() + number_bytes(d.as_millis() as u64))
        + b.written_at.map_or(0, |t| {
            let millis = t
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            "t".len() + number_bytes(millis as u64)
        })
        + b.asked.iter().map(String::len).sum::<usize>()
}

/// What a call's answer tells about its billed size.
pub trait Billed {
    /// The bytes to bill, as far as the answer shows them.
    fn bytes(&self) -> usize;

    /// The items written, for an answer of several writes.
    fn items(&self) -> Option<usize> {
        None
    }
}

impl Billed for Lease {
    fn bytes(&self) -> usize {
        lease_bytes(self)
    }
}
impl Billed for Option<Lease> {
    fn bytes(&self) -> usize {
        self.as_ref().map_or(0, lease_bytes)
    }
}
impl Billed for () {
    fn bytes(&self) -> usize {
        0
    }
}
/// The answers of [`super::LeaseStore::checkpoint_many`]: one item each.
impl Billed for Vec<Result<(), StoreError>> {
    fn bytes(&self) -> usize {
        0
    }
    fn items(&self) -> Option<usize> {
        Some(self.len())
    }
}
impl Billed for Beat {
    fn bytes(&self) -> usize {
        beat_bytes(self)
    }
}
impl Billed for Vec<Beat> {
    fn bytes(&self) -> usize {
        self.iter().map(beat_bytes).sum()
    }
}
/// A `WorkerMetricStats` entry as this store reads it: `wid` and `lut`.
impl Billed for Vec<crate::store::JavaWorker> {
    fn bytes(&self) -> usize {
        self.iter().map(|w| 3 + w.id.len() + 3 + 8).sum()
    }
}

/// Bills every call of the wrapped store into a shared [`Bill`].
#[derive(Debug, Clone)]
pub struct CostedStore<S> {
    inner: S,
    bill: Arc<Bill>,
}

impl<S> CostedStore<S> {
    /// Wraps `inner`, billing into `bill`.
    pub fn new(inner: S, bill: Arc<Bill>) -> Self {
        CostedStore { inner, bill }
    }

    async fn billed<T: Billed>(
        &self,
        op: StoreOp,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = fut.await;
        let bytes = match &result {
            Ok(v) => v.bytes(),
            Err(e) => e.current().map_or(0, lease_bytes),
        };
        match (op, result.as_ref().ok().and_then(Billed::items)) {
            (StoreOp::Get | StoreOp::ReadBeats | StoreOp::ScanPage, _) => self.bill.read(bytes),
            (_, Some(items)) => self.bill.write_items(items),
            _ => self.bill.write(bytes),
        }
        result
    }
}

super::decorate! {
    CostedStore, around: billed,
    scan: |this| {
        this.inner
            .scan()
            .map(move |page| {
                let bytes = page.as_ref().map_or(0, |p| p.iter().map(lease_bytes).sum());
                this.bill.read(bytes);
                page
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::InMemoryLeaseStore;
    use crate::store::{CheckpointUpdate, CheckpointWrite, Holder, LeaseStore};

    /// DynamoDB takes 25 statements a request: 30 checkpoints written
    /// together are two requests, billed one write unit each.
    #[tokio::test]
    async fn checkpoints_written_together_bill_a_request_per_25() {
        let bill = Arc::new(Bill::default());
        let store = CostedStore::new(InMemoryLeaseStore::new(), Arc::clone(&bill));
        let keys: Vec<String> = (0..30).map(|i| format!("s{i}")).collect();
        let update = CheckpointUpdate::to(Checkpoint::at("1", 0));
        let writes: Vec<CheckpointWrite<'_>> = keys
            .iter()
            .map(|key| CheckpointWrite {
                key,
                by: Holder::new("a", "t"),
                update: &update,
            })
            .collect();
        let answers = store.checkpoint_many(&writes).await.expect("answered");
        assert_eq!(answers.len(), 30);
        let billed = bill.snapshot();
        assert_eq!((billed.requests, billed.write_units), (2, 30));
    }
}
