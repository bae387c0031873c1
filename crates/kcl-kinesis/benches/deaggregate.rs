//! De-aggregation throughput. Run with `cargo bench -p kcl-kinesis` (the
//! batches and the timing loop are `kcl_kinesis::batches`, which `make
//! bench` runs too).
//!
//! A plain `harness = false` main: each case runs for a fixed wall-clock
//! budget after a short warm-up and prints records/s and MB/s of input.
//! Every iteration clones the fetched `RawRecord`s (two short strings and a
//! reference-counted buffer), as the retrieval path does when converting
//! from the SDK's type, so that cost is included.

use std::hint::black_box;
use std::time::Duration;

use kcl_kinesis::batches::{Batch, Rate, aggregated, measure, plain, rate_of};
use kcl_kinesis::kpl::{Deaggregator, ShardHashRange};

const WARM_UP: Duration = Duration::from_millis(300);
const BUDGET: Duration = Duration::from_millis(2_500);

/// Runs `batch` through `d` for the budget; prints one row.
fn run(name: &str, d: &Deaggregator, batch: &Batch) {
    print_row(name, measure(d, batch, WARM_UP, BUDGET));
}

fn print_row(name: &str, r: Rate) {
    println!(
        "{name:<44} {:>14.0} {:>10.1} {:>9.1} {:>9}",
        r.records_per_s, r.mb_per_s, r.ns_per_record, r.batches
    );
}

/// Reference row: only the MD5 over every aggregate, the part of the work
/// no decoder can skip (the digest must be checked before trusting the body).
fn md5_floor(batch: &Batch) {
    use md5::Digest as _;
    let r = rate_of(batch, WARM_UP, BUDGET, || {
        for r in &batch.raws {
            black_box(md5::Md5::digest(&r.data[..]));
        }
    });
    print_row("  reference: MD5 of the same aggregates only", r);
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
