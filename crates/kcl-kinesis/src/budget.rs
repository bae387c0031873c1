//! The worker-wide prefetch budget: the bytes all readers of one source
//! (one worker) hold ahead of their processors, together. Each reader also
//! has its own, smaller budget (`max_prefetch_bytes`,
//! `max_buffered_bytes`); this one bounds what a worker with many shards
//! holds when all of them fill up at once.
//!
//! Both retrieval modes follow one rule: a read reserves, before it is
//! made, what its batch is expected to hold, waiting for it; the batch
//! keeps of that what it really holds and gives the rest back. A polling
//! call reserves the most its response can hold ([`call_reservation`];
//! given back before a retry pause). A fan-out event's size is known only
//! once it is read, and the reservation is held while the subscriber waits
//! for it (seconds, on a quiet shard), so a subscriber reserves an
//! estimate ([`EventEstimate`]): its reader's whole own budget
//! (`max_buffered_bytes`) before its first event, then the largest of its
//! recent batches, decaying, never less than a floor F
//! ([`estimate::MIN_EVENT_RESERVATION`], 64 KiB, or the reader's own
//! budget if that is smaller). Quiet shards so hold F each while they
//! wait, and B / F of them (16 384 in the default 1 GiB) wait at once
//! without keeping a busy shard from its turn.
//!
//! A batch can hold more than it reserved: a KPL aggregate's sub-records
//! each own a partition key, a sequence number and a record, so an
//! aggregate of n bytes expands to up to about 87 n (see the records
//! module), and a fan-out event may be larger than the shard's recent
//! ones. The excess is counted as the batch is made: taken from the free
//! budget if there is any, without waiting (a reader waiting while it
//! holds a reservation could deadlock with others doing the same), and
//! what is not free is over. Such a batch holds at least its whole
//! reservation, at least R, the smallest reservation any read makes, so at
//! most B / R of them are held at once and the worst case is
//!
//! `B + floor(B / R) x (largest batch - R)`
//!
//! the budget exactly when no batch holds more than it reserved. In
//! fan-out R is F: the worst case is quiet shards, each reserving F, all
//! receiving a large batch at the same moment. Readers starting at once,
//! behind, stay within B unless a first event holds more than its
//! reader's whole own budget, which it reserves. One large batch
//! raises the shard's next reservation to its size (up to the reader's
//! own budget), so the overshoot does not repeat while the shard is busy.
//! The stats count what the batches really hold, so the peak shows any
//! overshoot.

use std::sync::Arc;

use kcl_core::ConfigError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::stats::SourceStats;

pub(crate) mod estimate;

pub(crate) use estimate::EventEstimate;

/// The default worker-wide budget.
pub const DEFAULT_PREFETCH_BUDGET: usize = 1024 * 1024 * 1024;

/// Checks a reader's own byte budget (`field`): 1 to `u32::MAX` bytes,
/// since it is taken as semaphore permits, at most `u32::MAX` at once.
pub(crate) fn validate_reader_bytes(field: &'static str, bytes: usize) -> Result<(), ConfigError> {
    if bytes == 0 || bytes > u32::MAX as usize {
        return Err(ConfigError {
            field,
            reason: format!("is {bytes}; it must be 1 to {}", u32::MAX),
        });
    }
    Ok(())
}

/// The most payload one `GetRecords` response carries (a Kinesis limit).
const MAX_RESPONSE_PAYLOAD: usize = 10 * 1024 * 1024;

/// What one record holds besides its payload, at most: the record itself,
/// a partition key (at most 256 bytes), a sequence number (at most 128
/// digits) and an explicit hash key (at most 39 digits).
const MAX_RECORD_OVERHEAD: usize = std::mem::size_of::<kcl_core::Record>() + 256 + 128 + 39;

/// The most a response to `GetRecords` with `limit` can hold, as the
/// budgets count it (about 16 MiB at the 10 000-record default).
pub(crate) fn call_reservation(limit: i32) -> usize {
    MAX_RESPONSE_PAYLOAD + usize::try_from(limit).unwrap_or(0) * MAX_RECORD_OVERHEAD
}

/// The budget, shared by every reader of a source.
#[derive(Debug)]
pub(crate) struct Budget {
    bytes: Arc<Semaphore>,
    total: usize,
    stats: Arc<SourceStats>,
}

/// Budget taken before a read (a call, an event), for its batch.
#[derive(Debug)]
pub(crate) struct Reservation {
    permit: OwnedSemaphorePermit,
}

/// Budget a batch holds until it is handed out (dropped).
#[derive(Debug)]
pub(crate) struct HeldBudget {
    _permit: Option<OwnedSemaphorePermit>,
    /// What the batch holds (the permits may be fewer, never more).
    bytes: usize,
    stats: Arc<SourceStats>,
}

impl Drop for HeldBudget {
    fn drop(&mut self) {
        self.stats.unbuffered(self.bytes as u64);
    }
}

impl Budget {
    /// A budget of `total` bytes (validated by the source builder).
    pub(crate) fn new(total: usize, stats: Arc<SourceStats>) -> Self {
        Budget {
            bytes: Arc::new(Semaphore::new(total)),
            total,
            stats,
        }
    }

    /// Permits one acquisition can ask for.
    fn clamp(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.min(self.total)).unwrap_or(u32::MAX)
    }

    /// Reserves what a `GetRecords` with `limit` may return, waiting for
    /// it. `None` only if the budget was closed (never).
    pub(crate) async fn reserve_call(&self, limit: i32) -> Option<Reservation> {
        self.reserve(call_reservation(limit)).await
    }

    /// Reserves `bytes` (at most the whole budget) for a read whose batch
    /// is known only once it is made, waiting for them. `None` only if the
    /// budget was closed (never).
    pub(crate) async fn reserve(&self, bytes: usize) -> Option<Reservation> {
        let n = self.clamp(bytes);
        let permit = Arc::clone(&self.bytes).acquire_many_owned(n).await.ok()?;
        Some(Reservation { permit })
    }

    /// Keeps `bytes` of a reservation for the batch that was made and
    /// gives the rest back. A batch holding more than was reserved also
    /// takes what is free of the excess, without waiting (see the module's
    /// notes); the rest is over the budget, and counted.
    pub(crate) fn keep(&self, mut reservation: Reservation, bytes: usize) -> HeldBudget {
        let reserved = reservation.permit.num_permits();
        if bytes <= reserved {
            let permit = reservation
                .permit
                .split(bytes)
                .unwrap_or(reservation.permit);
            return self.held(permit, bytes);
        }
        if let Some(extra) = self.take_free(self.clamp(bytes - reserved)) {
            reservation.permit.merge(extra);
        }
        self.held(reservation.permit, bytes)
    }

    /// What a batch that holds nothing (a shard's end) holds.
    pub(crate) fn nothing(&self) -> HeldBudget {
        HeldBudget {
            _permit: None,
            bytes: 0,
            stats: Arc::clone(&self.stats),
        }
    }

    /// Takes up to `wanted` permits of those free now, without waiting.
    fn take_free(&self, wanted: u32) -> Option<OwnedSemaphorePermit> {
        loop {
            let free = u32::try_from(self.bytes.available_permits()).unwrap_or(u32::MAX);
            let n = wanted.min(free);
            if n == 0 {
                return None;
            }
            match Arc::clone(&self.bytes).try_acquire_many_owned(n) {
                Ok(permit) => return Some(permit),
                // Another reader took some meanwhile: look again.
                Err(TryAcquireError::NoPermits) => {}
                Err(TryAcquireError::Closed) => return None,
            }
        }
    }

    fn held(&self, permit: OwnedSemaphorePermit, bytes: usize) -> HeldBudget {
        self.stats.buffered(bytes as u64);
        HeldBudget {
            _permit: Some(permit),
            bytes,
            stats: Arc::clone(&self.stats),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use kcl_core::source::{OpenShard, ShardReader, ShardSource, StartPosition};

    use crate::calls::KinesisApi;
    use crate::fake::FakeKinesis;
    use crate::test_util::readers::{assert_unconsumed_within, held};
    use crate::{KinesisShardSource, PollingConfig};

    const MIB: usize = 1024 * 1024;

    #[tokio::test(start_paused = true)]
    async fn a_thousand_shards_stay_within_the_worker_budget() {
        const SHARDS: usize = 1000;
        const PER_SHARD: usize = 10;
        const PAYLOAD: usize = 10 * 1024;
        let budget = 64 * MIB;
        let fake = Arc::new(FakeKinesis::default());
        let ids = fake.create_stream("s", SHARDS);
        for id in &ids {
            for i in 0..PER_SHARD {
                fake.put("s", id, &format!("pk-{i}"), vec![b'x'; PAYLOAD]);
            }
        }
        let polling = PollingConfig::builder()
            .retry_min_delay(Duration::from_millis(10))
            .build()
            .unwrap_or_default();
        let mut source = KinesisShardSource::with_api(fake as Arc<dyn KinesisApi>, polling);
        source.shared = crate::calls::Shared::new(
            Arc::clone(&source.shared.api),
            source.shared.retry,
            None,
            budget,
        );
        let mut readers: Vec<Box<dyn ShardReader>> = Vec::new();
        for id in &ids {
            let reader = source
                .open(OpenShard::new(
                    "s",
                    id.clone(),
                    StartPosition::TrimHorizon,
                    held(id),
                ))
                .await
                .map_err(|e| e.to_string());
            readers.push(reader.expect("open"));
        }
        // Nobody consumes: every reader fetches what the budgets allow.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let stats = source.stats();
        let total = (SHARDS * PER_SHARD * PAYLOAD) as u64;
        assert_unconsumed_within(&stats, budget);
        // The budget, not the shards, is what stopped the fetching: one
        // more call's reservation would not fit, far below the 100 MB the
        // shards hold.
        let full = (budget - super::call_reservation(10_000)) as u64;
        assert!(
            stats.buffered_bytes > full && stats.buffered_bytes < total,
            "buffered {} of {total}",
            stats.buffered_bytes
        );
        // Draining every reader (all at once, as each shard's consumer does)
        // gets every record, and gives the budget back.
        let drains = readers.iter_mut().map(|reader| async move {
            let mut got = 0;
            while got < PER_SHARD {
                got += reader.next_batch().await.expect("batch").records.len();
            }
            got
        });
        let records: usize = futures::future::join_all(drains).await.into_iter().sum();
        assert_eq!(records, SHARDS * PER_SHARD);
        drop(readers);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(source.stats().buffered_bytes, 0);
        assert!(source.stats().peak_buffered_bytes <= budget as u64);
    }
}
