//! `GetRecords` batches built in memory, and the loop that times their
//! de-aggregation: one definition for `cargo bench -p kcl-kinesis` and the
//! de-aggregation section of `make bench`, so the two measure the same
//! cases the same way.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::kpl::{self, Deaggregator, RawRecord, UserRecord};

/// A batch as one `GetRecords` call would return it.
#[derive(Debug)]
pub struct Batch {
    /// The records as fetched, aggregates or plain.
    pub raws: Vec<RawRecord>,
    /// Their payload bytes, what the input rate is counted in.
    pub input_bytes: usize,
    /// The user records de-aggregation yields from them.
    pub user_records: usize,
}

/// The `i`-th fetched record of a batch, carrying `data`.
fn fetched(i: usize, data: Bytes) -> RawRecord {
    RawRecord {
        data,
        partition_key: format!("partition-{i}"),
        explicit_hash_key: None,
        sequence_number: format!("4959033827149025660855969253836157109592157598913658{i:04}"),
        approximate_arrival: None,
    }
}

/// `records` plain (not aggregated) records of `size` bytes each.
pub fn plain(records: usize, size: usize) -> Batch {
    let raws: Vec<RawRecord> = (0..records)
        .map(|i| fetched(i, Bytes::from(vec![i as u8; size])))
        .collect();
    Batch {
        input_bytes: records * size,
        user_records: records,
        raws,
    }
}

/// `aggregates` aggregates of `per` user records of `size` bytes each, with
/// distinct partition keys (as the KPL sees from a keyed producer).
pub fn aggregated(aggregates: usize, per: usize, size: usize) -> Batch {
    let raws: Vec<RawRecord> = (0..aggregates)
        .map(|a| {
            let users: Vec<UserRecord> = (0..per)
                .map(|u| UserRecord {
                    partition_key: format!("user-{a}-{u}"),
                    explicit_hash_key: None,
                    data: Bytes::from(vec![(a + u) as u8; size]),
                })
                .collect();
            fetched(a, kpl::aggregate(&users))
        })
        .collect();
    Batch {
        input_bytes: raws.iter().map(|r| r.data.len()).sum(),
        user_records: aggregates * per,
        raws,
    }
}

/// How fast a batch went through a de-aggregator.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    /// User records out per second.
    pub records_per_s: f64,
    /// Megabytes (10^6) of input per second.
    pub mb_per_s: f64,
    /// Nanoseconds per user record.
    pub ns_per_record: f64,
    /// Batches run in the timed budget.
    pub batches: u64,
}

/// Runs `batch` through `d` for `warm_up`, then for `budget` timed. Every
/// run clones the fetched records, as the retrieval path does when it
/// converts the SDK's type, so that cost is counted.
///
/// # Panics
/// If a run yields other than the batch's user records.
pub fn measure(d: &Deaggregator, batch: &Batch, warm_up: Duration, budget: Duration) -> Rate {
    rate_of(batch, warm_up, budget, || {
        let n = black_box(d.deaggregate_batch(batch.raws.iter().cloned())).len();
        assert_eq!(n, batch.user_records, "lost records");
    })
}

/// Runs `once`, one pass over `batch`, for `warm_up`, then for `budget`
/// timed, and counts the rate in `batch`'s records and bytes: for a
/// reference row that does part of the work (such as only the digests).
pub fn rate_of(batch: &Batch, warm_up: Duration, budget: Duration, mut once: impl FnMut()) -> Rate {
    let warm = Instant::now();
    while warm.elapsed() < warm_up {
        once();
    }
    let mut batches = 0u64;
    let start = Instant::now();
    while start.elapsed() < budget {
        once();
        batches += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let records_per_s = batch.user_records as f64 * batches as f64 / secs;
    Rate {
        records_per_s,
        mb_per_s: batch.input_bytes as f64 * batches as f64 / secs / 1e6,
        ns_per_record: 1e9 / records_per_s,
        batches,
    }
}
