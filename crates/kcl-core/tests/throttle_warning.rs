//! A throttling storm on the lease table shows at warn level as one
//! rate-limited warning with its count, whichever call the table throttles:
//! the taker's reads and takes, which wait for the next tick instead of
//! retrying, count towards it as the renewer's retries do. Its own test
//! binary: the warning's rate limit is process-wide.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use kcl_core::store::{StoreErrorKind, StoreOp};
use tokio::time::{Instant, sleep};

#[tokio::test(start_paused = true)]
async fn throttled_taker_reads_show_as_the_rate_limited_throttling_warning() {
    let lines = Lines::default();
    let _guard = capture_warnings(&lines);

    let table = table_with(2).await;
    let config = config("a", 1).build().unwrap();
    let a = SimWorker::start(&table, config);
    // Every read of the liveness records is throttled for a minute: the
    // taker gives up on each tick.
    a.store.fail_until(
        Some(StoreOp::ReadBeats),
        StoreErrorKind::Throttled,
        Instant::now() + Duration::from_secs(65),
    );
    sleep(Duration::from_secs(65)).await;
    let ticks = a.coordinator().stats().scan_failures;
    let log = lines.text();
    let warnings = log
        .lines()
        .filter(|l| l.contains("the lease table is throttling"))
        .count();
    assert!(ticks >= 5, "{ticks} failed ticks");
    assert!(
        (1..=3).contains(&warnings),
        "{warnings} throttling warnings for {ticks} throttled ticks in 65 s (one per 30 s):\n{log}"
    );
    assert!(
        !log.contains("reading the liveness records failed"),
        "a throttled read is not warned about tick by tick:\n{log}"
    );
}
