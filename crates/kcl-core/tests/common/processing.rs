//! What the whole-worker tests share around their processors: the stream
//! they read, what the processors made durable, the failure budgets they
//! spend, a failure destination that misbehaves as told, and the wait for
//! what a test expects.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use kcl_core::poison::{CannotStore, FailedRecord, FailureDestination};
use kcl_core::processor::{ProcessorError, RecordBatch};
use kcl_core::test_util::fleet;

/// The stream the whole-worker tests produce to and read.
pub const STREAM: &str = "orders";

/// Takes one from `budget` (a count of failures or hangs left to inject);
/// false once it is spent.
pub fn take_one(budget: &AtomicU32) -> bool {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// The records processors made durable, as (partition key, record
/// number), in the order they did.
#[derive(Default)]
pub struct Processed(Mutex<Vec<(String, u64)>>);

impl Processed {
    pub fn push(&self, pk: String, n: u64) {
        self.0.lock().unwrap().push((pk, n));
    }

    pub fn extend(&self, records: impl IntoIterator<Item = (String, u64)>) {
        self.0.lock().unwrap().extend(records);
    }

    pub fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Every record so far, in order.
    pub fn all(&self) -> Vec<(String, u64)> {
        self.0.lock().unwrap().clone()
    }

    /// Each key's record numbers, in the order they were made durable.
    pub fn by_key(&self) -> BTreeMap<String, Vec<u64>> {
        let processed = self.0.lock().unwrap();
        fleet::by_key(processed.iter().map(|(pk, n)| (pk.as_str(), *n)))
    }
}

/// The data of the records processors made durable, as text, in the
/// order they did.
#[derive(Default)]
pub struct Texts(Mutex<Vec<String>>);

impl Texts {
    /// Notes every record of `batch`.
    pub fn extend(&self, batch: &RecordBatch) {
        let data = batch
            .records
            .iter()
            .map(|r| String::from_utf8(r.data.to_vec()).unwrap());
        self.0.lock().unwrap().extend(data);
    }

    /// Every record so far, in order.
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Waits (in paused time) up to ten minutes until `done` holds, or fails
/// naming `what`.
pub async fn until(what: &str, done: impl Fn() -> bool) {
    let (limit, poll) = (Duration::from_secs(600), Duration::from_millis(100));
    fleet::wait_until(limit, poll, done, || format!("{what} never happened")).await;
}

/// A failure destination that keeps what it accepts, counts the sends, and
/// misbehaves as a test sets it to.
#[derive(Default)]
pub struct Collect {
    pub got: Mutex<Vec<FailedRecord>>,
    pub calls: AtomicU32,
    /// Sends left that never answer, as over a connection that died
    /// without a reset.
    pub hang: AtomicU32,
    /// Sends left that fail as a destination unavailable for a while.
    pub unavailable: AtomicU32,
    /// While set, every send is refused for good (a record too big for
    /// the destination).
    pub cannot_store: AtomicBool,
}

#[async_trait]
impl FailureDestination for Collect {
    async fn send(&self, failed: &[FailedRecord]) -> Result<(), ProcessorError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if take_one(&self.hang) {
            std::future::pending::<()>().await;
        }
        if take_one(&self.unavailable) {
            return Err("destination unavailable".into());
        }
        if self.cannot_store.load(Ordering::SeqCst) {
            return Err(Box::new(CannotStore::new("the record is too big for me")));
        }
        self.got.lock().unwrap().extend_from_slice(failed);
        Ok(())
    }
}
