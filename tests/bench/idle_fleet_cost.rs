//! DynamoDB cost of an idle fleet: 4 workers holding 100 leases at default
//! lease settings, against the DynamoDB the environment points at (DynamoDB
//! Local under `make bench`). Prints requests and consumed capacity per
//! minute, split by operation, and the scans per taker tick.
//!
//! Usage: `cargo run --release -p kcl-tests --bin idle-fleet-cost -- [SECONDS]`
//! (default 60 s of measurement after the fleet settles).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use kcl_core::store::metered::{MeteredStore, StoreStats};
use kcl_core::store::{LeaseStore, StoreOp};
use kcl_core::{Checkpoint, Lease, LeaseConfig, LeaseCoordinator, ShutdownMode};
use kcl_dynamodb::{Capacity, DynamoDbLeaseStore, ensure_table};
use kcl_tests::{TestEnv, unique_name};
use tokio::time::Instant;

const WORKERS: usize = 4;
const LEASES: usize = 100;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seconds: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()
        .context("SECONDS")?
        .unwrap_or(60);
    let env = TestEnv::connect().await?;
    let table = unique_name("kcl-bench-idle");
    ensure_table(env.dynamodb(), &table, Capacity::OnDemand).await?;
    let base = DynamoDbLeaseStore::new(env.dynamodb().clone(), &table);
    for i in 0..LEASES {
        base.create_if_absent(&Lease::new(
            format!("shardId-{i:012}"),
            Checkpoint::TrimHorizon,
        ))
        .await?;
    }

    let mut fleet = Vec::new();
    for w in 0..WORKERS {
        let stats = Arc::new(StoreStats::default());
        let store = MeteredStore::with_stats(
            base.clone().with_stats(Arc::clone(&stats)),
            Arc::clone(&stats),
        );
        let config = LeaseConfig::builder(format!("worker-{w}")).build()?;
        let (coordinator, events) = LeaseCoordinator::start(Arc::new(store), config);
        // Events are not needed here; dropping the receiver is allowed.
        drop(events);
        fleet.push((coordinator, stats));
    }

    // Settle: every lease held and the fleet balanced.
    let settle_deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let counts: Vec<usize> = fleet.iter().map(|(c, _)| c.held_keys().len()).collect();
        let total: usize = counts.iter().sum();
        let spread = counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0);
        if total == LEASES && spread <= 1 {
            println!("settled: leases per worker {counts:?}");
            break;
        }
        if Instant::now() > settle_deadline {
            bail!("fleet did not settle: {counts:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // One more renew round so no acquisition write lands in the window.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let before: Vec<_> = fleet
        .iter()
        .map(|(c, s)| (c.stats(), s.snapshot()))
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let elapsed = started.elapsed().as_secs_f64();
    let per_min = 60.0 / elapsed;

    let mut rows: Vec<(StoreOp, f64, f64)> = Vec::new();
    let mut ticks = 0;
    let mut scans = 0;
    for ((c, s), (c0, s0)) in fleet.iter().zip(&before) {
        let d = s.snapshot().since(s0);
        ticks += c.stats().ticks - c0.ticks;
        scans += d.scans;
        for op in StoreOp::ALL {
            let o = d.op(op);
            if let Some(row) = rows.iter_mut().find(|r| r.0 == op) {
                row.1 += o.calls as f64;
                row.2 += o.capacity;
            } else {
                rows.push((op, o.calls as f64, o.capacity));
            }
        }
    }
    println!(
        "idle fleet: {WORKERS} workers, {LEASES} leases, defaults (lease 10 s, renew every 3.33 s, taker every 10 s +/-25%), measured {elapsed:.0} s"
    );
    println!("| operation | requests/min | capacity units/min |");
    println!("|---|---:|---:|");
    let (mut total_req, mut total_cap) = (0.0, 0.0);
    for (op, calls, cap) in rows.iter().filter(|r| r.1 > 0.0) {
        println!("| {op} | {:.1} | {:.1} |", calls * per_min, cap * per_min);
        total_req += calls * per_min;
        total_cap += cap * per_min;
    }
    println!("| total | {total_req:.1} | {total_cap:.1} |");
    println!(
        "taker ticks: {ticks}, scans: {scans} (scans per tick per worker: {:.2})",
        scans as f64 / ticks.max(1) as f64
    );
    if scans != ticks {
        bail!("scans per tick must be exactly one");
    }
    for (c, _) in fleet {
        c.shutdown(ShutdownMode::Release).await;
    }
    Ok(())
}
