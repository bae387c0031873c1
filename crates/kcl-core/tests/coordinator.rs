//! The lease coordinator's promises, one worker at a time, under a paused
//! clock: lost leases stop their consumer, lost responses heal, stuck
//! workers fence themselves, restarts reclaim.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use kcl_core::store::StoreOp;
use kcl_core::store::memory::Fault;
use kcl_core::{EndReason, LeaseStore};
use tokio::time::{Instant, sleep, timeout};

const RENEW: Duration = Duration::from_millis(3333);

#[tokio::test(start_paused = true)]
async fn failed_renewal_stops_the_consumer_at_once() {
    let table = table_with(1).await;
    let a = SimWorker::start(&table, config("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    let handle = a
        .coordinator()
        .handle("shardId-000000000000")
        .expect("taken on the first tick");
    assert!(handle.is_valid());

    // Another worker takes the lease behind a's back.
    let current = table.get(handle.key()).await.unwrap().unwrap();
    table
        .take(&current, kcl_core::Holder::new("thief", "t-thief"))
        .await
        .unwrap();

    // a learns at its next renewal, at most one renew interval later.
    let started = Instant::now();
    timeout(RENEW + Duration::from_millis(100), handle.ended())
        .await
        .expect("the consumer is told within one renew interval");
    assert!(started.elapsed() <= RENEW + Duration::from_millis(100));
    assert_eq!(handle.end_reason(), Some(EndReason::Lost));
    assert!(!handle.is_valid());
    assert!(a.coordinator().held_keys().is_empty());
    assert_eq!(a.coordinator().stats().lost, 1);
}

#[tokio::test(start_paused = true)]
async fn renewal_whose_response_was_lost_heals_within_one_interval() {
    let table = table_with(1).await;
    let a = SimWorker::start(&table, config("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    let handle = a.coordinator().handle("shardId-000000000000").unwrap();
    let before = handle.lease().counter;
    let valid_before = handle.valid_until();

    // The first renewal is applied, but its response never arrives.
    a.store.inject(StoreOp::Renew, Fault::LostResponse);
    // The retry pauses a tenth of the interval, doubled at most by jitter.
    sleep(RENEW + Duration::from_millis(900)).await;

    assert_eq!(
        handle.end_reason(),
        None,
        "a lost response must not lose the lease"
    );
    assert!(handle.is_valid());
    assert!(
        handle.valid_until() > valid_before,
        "the retry reconciled and extended validity"
    );
    let stored = table.get(handle.key()).await.unwrap().unwrap();
    assert_eq!(stored.counter, before + 1, "applied exactly once");
    assert_eq!(handle.lease().counter, stored.counter);
    let s = a.coordinator().stats();
    assert_eq!((s.renewals, s.lost, s.fenced), (1, 0, 0));
    assert_eq!(
        a.stats.snapshot().op(StoreOp::Renew).calls,
        2,
        "one lost response, one retry"
    );

    // Later renewals go on from the reconciled counter.
    sleep(RENEW).await;
    assert_eq!(
        table.get(handle.key()).await.unwrap().unwrap().counter,
        before + 2
    );
}

#[tokio::test(start_paused = true)]
async fn take_whose_response_was_lost_is_reclaimed_next_tick() {
    let table = table_with(1).await;
    let a = SimWorker::start(&table, config("a", 1).build().unwrap());
    // Spawned tasks have not run yet: the very first take loses its response.
    a.store.inject(StoreOp::Take, Fault::LostResponse);
    sleep(Duration::from_millis(10)).await;
    assert!(a.coordinator().held_keys().is_empty());
    assert_eq!(
        table.snapshot()[0].owner.as_deref(),
        Some("a"),
        "applied in the table"
    );
    assert_eq!(a.coordinator().stats().take_failures, 1);

    sleep(tick_max()).await;
    let s = a.coordinator().stats();
    assert_eq!((s.taken, s.reclaimed), (0, 1), "{s:?}");
    assert_eq!(a.coordinator().held_keys(), vec!["shardId-000000000000"]);
}

#[tokio::test(start_paused = true)]
async fn restart_under_the_same_id_reclaims_without_waiting_for_expiry() {
    let table = table_with(3).await;
    let mut a = SimWorker::start(&table, config("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    assert_eq!(a.coordinator().held_keys().len(), 3);
    a.kill().await;

    let restarted = SimWorker::start(&table, config("a", 2).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    assert_eq!(
        restarted.coordinator().held_keys().len(),
        3,
        "reclaimed on the first tick"
    );
    assert_eq!(restarted.coordinator().stats().reclaimed, 3);
    assert!(
        restarted.coordinator().held_keys().iter().all(|k| restarted
            .coordinator()
            .handle(k)
            .unwrap()
            .is_valid())
    );
}

#[tokio::test(start_paused = true)]
async fn a_stuck_worker_fences_itself_before_a_peer_takes_over() {
    let table = table_with(4).await;
    let a = SimWorker::start(&table, config("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    let b = SimWorker::start(
        &table,
        config("b", 2).max_leases_to_steal(0).build().unwrap(),
    );
    assert_eq!(a.coordinator().held_keys().len(), 4);
    let handles: Vec<_> = a
        .coordinator()
        .held_keys()
        .iter()
        .map(|k| a.coordinator().handle(k).unwrap())
        .collect();

    // a stops talking to the store for a minute (SIGSTOP, a GC pause, a
    // partition): requests hang unsent.
    let paused_at = Instant::now();
    a.store
        .pause_until(paused_at + Duration::from_millis(61_500));
    let workers = [a, b];
    let mut log = OverlapLog::default();
    run_for(
        &workers,
        &mut log,
        Duration::from_secs(40),
        Duration::from_millis(10),
    )
    .await;

    assert_eq!(
        log.max(),
        Duration::ZERO,
        "never two workers believing one lease valid"
    );
    for h in &handles {
        assert_eq!(h.end_reason(), Some(EndReason::Fenced));
    }
    assert_eq!(
        workers[1].coordinator().held_keys().len(),
        4,
        "b took over after expiry"
    );
    let fenced = workers[0].coordinator().stats().fenced;
    assert_eq!(fenced, 4);

    // When a comes back, its stale renewals fail: it never thinks it owns
    // them again.
    run_for(
        &workers,
        &mut log,
        Duration::from_secs(45),
        Duration::from_millis(10),
    )
    .await;
    let (sa, sb) = (
        workers[0].coordinator().stats(),
        workers[1].coordinator().stats(),
    );
    // Back online, a asks for its share and b hands it over gracefully. a's
    // scan was asked for before the pause, so the handoffs' validity counts
    // from then: a may fence them at once and take them back next tick
    // (reclaim) rather than activate them; either way no moment has both
    // believing in one lease, and the shares settle.
    assert_eq!(sa.stolen, 2);
    assert_eq!(sb.handed_off, 2);
    assert_eq!(sa.handoffs_forced, 0);
    assert_eq!(sa.handoffs_completed + sa.reclaimed, 2, "{sa:?}");
    assert_eq!(log.max(), Duration::ZERO);
    assert_eq!(
        (workers[0].valid_keys().len(), workers[1].valid_keys().len()),
        (2, 2)
    );
}
