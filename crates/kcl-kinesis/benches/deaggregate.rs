//! De-aggregation throughput. Run with `cargo bench -p kcl-kinesis`.
//!
//! A plain `harness = false` main: each case runs for a fixed wall-clock
//! budget after a short warm-up and prints records/s and MB/s of input.
//! Every iteration clones the fetched `RawRecord`s (two short strings and a
//! reference-counted buffer), as the retrieval path does when converting
//! from the SDK's type, so that cost is included.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kcl_kinesis::kpl::{self, Deaggregator, RawRecord, ShardHashRange, UserRecord};

const WARM_UP: Duration = Duration::from_millis(300);
const BUDGET: Duration = Duration::from_millis(2_500);

/// A batch as one `GetRecords` call would return it.
struct Batch {
    raws: Vec<RawRecord>,
    input_bytes: usize,
    user_records: usize,
}

fn fetched(i: usize, data: Bytes) -> RawRecord {
    RawRecord {
        data,
        partition_key: format!("partition-{i}"),
        explicit_hash_key: None,
        sequence_number: format!("4959033827149025660855969253836157109592157598913658{i:04}"),
        approximate_arrival: None,
    }
}

/// `aggregates` aggregates of `per` user records of `size` bytes each, with
/// distinct partition keys (as the KPL sees from a keyed producer).
fn aggregated(aggregates: usize, per: usize, size: usize) -> Batch {
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

fn plain(records: usize, size: usize) -> Batch {
    let raws: Vec<RawRecord> = (0..records)
        .map(|i| fetched(i, Bytes::from(vec![i as u8; size])))
        .collect();
    Batch {
        input_bytes: records * size,
        user_records: records,
        raws,
    }
}

/// Runs `batch` through `d` until the budget is spent; prints one row.
fn run(name: &str, d: &Deaggregator, batch: &Batch) {
    let once = || {
        let out = d.deaggregate_batch(batch.raws.iter().cloned());
        black_box(out).len()
    };
    let warm = Instant::now();
    while warm.elapsed() < WARM_UP {
        once();
    }
    let mut batches = 0u64;
    let mut produced = 0usize;
    let start = Instant::now();
    while start.elapsed() < BUDGET {
        produced += once();
        batches += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(
        produced,
        batch.user_records * batches as usize,
        "lost records"
    );
    let records_per_s = (batch.user_records as f64 * batches as f64) / secs;
    let mb_per_s = (batch.input_bytes as f64 * batches as f64) / secs / 1e6;
    let ns_per_record = 1e9 / records_per_s;
    println!(
        "{name:<44} {:>14.0} {:>10.1} {:>9.1} {:>9}",
        records_per_s, mb_per_s, ns_per_record, batches
    );
}

/// Reference row: only the MD5 over every aggregate, the part of the work
/// no decoder can skip (the digest must be checked before trusting the body).
fn md5_floor(batch: &Batch) {
    use md5::Digest as _;
    let once = || {
        for r in &batch.raws {
            black_box(md5::Md5::digest(&r.data[..]));
        }
    };
    let warm = Instant::now();
    while warm.elapsed() < WARM_UP {
        once();
    }
    let mut batches = 0u64;
    let start = Instant::now();
    while start.elapsed() < BUDGET {
        once();
        batches += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let records_per_s = (batch.user_records as f64 * batches as f64) / secs;
    println!(
        "{:<44} {:>14.0} {:>10.1} {:>9.1} {:>9}",
        "  reference: MD5 of the same aggregates only",
        records_per_s,
        (batch.input_bytes as f64 * batches as f64) / secs / 1e6,
        1e9 / records_per_s,
        batches
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and
    // then a quick smoke run is enough.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let aggregated_batch = aggregated(100, 100, 100);
    let plain_batch = plain(1_000, 1_024);
    if smoke {
        for b in [&aggregated_batch, &plain_batch] {
            let n = Deaggregator::new()
                .deaggregate_batch(b.raws.iter().cloned())
                .len();
            assert_eq!(n, b.user_records);
        }
        println!("deaggregate bench: smoke run ok (use `cargo bench` to measure)");
        return;
    }
    println!(
        "{:<44} {:>14} {:>10} {:>9} {:>9}",
        "case", "user recs/s", "MB/s in", "ns/rec", "batches"
    );
    println!(
        "  (a) batch = 100 aggregates x 100 user records x 100 B = {:.2} MB",
        aggregated_batch.input_bytes as f64 / 1e6
    );
    run(
        "aggregated 100 x 100 B",
        &Deaggregator::new(),
        &aggregated_batch,
    );
    run(
        "aggregated 100 x 100 B, shard range check",
        &Deaggregator::for_shard(ShardHashRange::FULL),
        &aggregated_batch,
    );
    md5_floor(&aggregated_batch);
    println!("  (b) batch = 1000 plain records x 1 KiB = 1.02 MB");
    run("plain 1 KiB", &Deaggregator::new(), &plain_batch);
}
