//! The lease coordinator's promises, one worker at a time, under a paused
//! clock: lost leases stop their consumer, lost responses heal, stuck
//! workers fence themselves, restarts reclaim, a hung call holds back no
//! other lease, a lapsed tenure stays over, throttling is not amplified.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use kcl_core::store::memory::{Fault, InMemoryLeaseStore};
use kcl_core::store::{StoreErrorKind, StoreOp};
use kcl_core::{EndReason, LeaseCoordinator, LeaseEvent, LeaseHandle, LeaseStore};
use tokio::time::{Instant, sleep, timeout};

const RENEW: Duration = Duration::from_millis(3333);

/// A table of one lease, and worker `a` (renewing per lease) with the
/// handle it took on its first tick.
async fn one_lease_taken() -> (InMemoryLeaseStore, SimWorker, LeaseHandle) {
    let table = table_with(1).await;
    let a = SimWorker::start(&table, per_lease("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    let handle = a
        .coordinator()
        .handle("shardId-000000000000")
        .expect("taken on the first tick");
    (table, a, handle)
}

#[tokio::test(start_paused = true)]
async fn failed_renewal_stops_the_consumer_at_once() {
    let (table, a, handle) = one_lease_taken().await;
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
    let (table, a, handle) = one_lease_taken().await;
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
    // Renewals count the beats' extensions too (every kcl worker beats).
    let s = a.coordinator().stats();
    assert_eq!((s.lost, s.fenced), (0, 0));
    assert!(s.renewals >= 1, "{s:?}");
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
    let a = SimWorker::start(&table, per_lease("a", 1).build().unwrap());
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

/// A process restarted under the same worker id finds its old leases
/// under a tenure it did not write. It cannot tell a stopped predecessor
/// from a live second process with the same id, so it takes them like any
/// other worker's leases: once they expire, never from under a holder.
#[tokio::test(start_paused = true)]
async fn a_restart_under_the_same_id_takes_its_old_leases_once_they_expire() {
    let table = table_with(3).await;
    let mut a = SimWorker::start(&table, per_lease("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    assert_eq!(a.coordinator().held_keys().len(), 3);
    a.kill().await;

    let killed_at = Instant::now();
    let restarted = SimWorker::start(&table, per_lease("a", 2).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    assert!(
        restarted.coordinator().held_keys().is_empty(),
        "taken from under a holder that might be alive"
    );
    while restarted.coordinator().held_keys().len() < 3 {
        assert!(
            killed_at.elapsed() <= LEASE + tick_max(),
            "not taken after expiry"
        );
        sleep(Duration::from_millis(100)).await;
    }
    let s = restarted.coordinator().stats();
    assert_eq!((s.taken, s.reclaimed), (3, 0), "{s:?}");
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
    let a = SimWorker::start(&table, per_lease("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    let b = SimWorker::start(
        &table,
        per_lease("b", 2).max_leases_to_steal(0).build().unwrap(),
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
    let step = Duration::from_millis(10);
    run_for(&workers, &mut log, Duration::from_secs(40), step).await;

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
    run_for(&workers, &mut log, Duration::from_secs(45), step).await;
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

/// One lease's renewals hang on a dead connection (the request is never
/// answered). Its own tenure fences at its deadline; every other lease of
/// the worker keeps renewing on time, round after round.
#[tokio::test(start_paused = true)]
async fn a_hung_renewal_of_one_lease_never_holds_back_the_others() {
    let table = table_with(4).await;
    let a = SimWorker::start(&table, per_lease("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    let keys = a.coordinator().held_keys();
    assert_eq!(keys.len(), 4);
    let handles: Vec<_> = keys
        .iter()
        .map(|k| a.coordinator().handle(k).unwrap())
        .collect();
    let counters = |t: &InMemoryLeaseStore| -> Vec<u64> {
        keys.iter()
            .map(|k| {
                t.snapshot()
                    .into_iter()
                    .find(|l| &l.key == k)
                    .unwrap()
                    .counter
            })
            .collect()
    };
    let before = counters(&table);
    a.store.blackhole(&[&keys[0]]);
    sleep(Duration::from_secs(30)).await;

    assert_eq!(
        handles[0].end_reason(),
        Some(EndReason::Fenced),
        "the hung lease fences"
    );
    let after = counters(&table);
    for i in 1..4 {
        assert_eq!(
            handles[i].end_reason(),
            None,
            "{}: held back by the hung lease",
            keys[i]
        );
        assert!(handles[i].is_valid());
        // 30 s of 3.33 s rounds: 9 renewals each.
        assert!(
            after[i] - before[i] >= 8,
            "{}: only {} renewals in 30 s",
            keys[i],
            after[i] - before[i]
        );
    }
    assert_eq!(after[0], before[0], "nothing of the hung lease applied");
    let s = a.coordinator().stats();
    assert_eq!((s.fenced, s.lost), (1, 0), "{s:?}");
}

/// A take whose scan was slow enough that the tenure's validity (counted
/// from when the scan asked for the lease's page) ran out before the take
/// answered: no consumer ever gets a handle that is not valid, the tenure
/// ends as fenced instead of being renewed back to life, and the next tick
/// reclaims the lease in a new tenure.
#[tokio::test(start_paused = true)]
async fn a_take_that_lapsed_before_it_answered_starts_no_consumer() {
    let table = table_paged(70, 10).await;
    let store = table.handle();
    // Seven full pages, each 1.5 s (inside the 1.67 s call timeout): the
    // takes answer at 10.5 s, when the first two pages' tenures (valid from
    // 0 s and 1.5 s, for 9 s) are over; the third page's (to 12 s) runs out
    // before the first renewal round after the takes (13.3 s).
    for _ in 0..7 {
        store.inject(StoreOp::ScanPage, Fault::Delay(Duration::from_millis(1500)));
    }
    let (coordinator, mut events) = LeaseCoordinator::start(
        std::sync::Arc::new(store.clone()),
        per_lease("a", 1).build().unwrap(),
    );
    let mut acquired = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        tokio::select! {
            Some(e) = events.recv() => if let LeaseEvent::Acquired(h) = e {
                assert!(h.is_valid(), "{} given to a consumer with its validity over", h.key());
                acquired.push(h);
            },
            _ = sleep(Duration::from_millis(100)) => {}
        }
    }
    let s = coordinator.stats();
    assert_eq!(s.fenced, 30, "the first three pages' tenures lapsed: {s:?}");
    assert_eq!(s.reclaimed, 30, "and were reclaimed in new tenures: {s:?}");
    // 20 tenures lapsed at birth and never reached a consumer; the third
    // page's 10 reached one while valid and were fenced later.
    assert_eq!(acquired.len(), 70 + 10);
    let mut live: Vec<&str> = acquired
        .iter()
        .filter(|h| h.is_valid())
        .map(|h| h.key())
        .collect();
    live.sort();
    live.dedup();
    assert_eq!(live.len(), 70, "one live tenure per lease");
    assert!(
        acquired
            .iter()
            .filter(|h| !h.is_valid())
            .all(|h| h.end_reason() == Some(EndReason::Fenced)),
        "every tenure that ended was fenced, never revived"
    );
    assert_eq!(coordinator.held_keys().len(), 70);
}

/// A throttled table: every renewal fails with throttling for three
/// rounds. The renewer retries each lease at most twice per round (the
/// next round is a retry too), instead of retrying from 50 ms on top of
/// the SDK's own retries, which multiplies the load that caused the
/// throttling.
#[tokio::test(start_paused = true)]
async fn renewals_under_throttling_retry_at_most_twice_per_round() {
    const LEASES: u64 = 10;
    let table = table_with(LEASES as usize).await;
    let a = SimWorker::start(&table, per_lease("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    let before = a.stats.snapshot().op(StoreOp::Renew).calls;
    let rounds = 3;
    a.store.fail_until(
        Some(StoreOp::Renew),
        StoreErrorKind::Throttled,
        Instant::now() + RENEW * rounds,
    );
    sleep(RENEW * rounds).await;
    let calls = a.stats.snapshot().op(StoreOp::Renew).calls - before;
    println!("throttled renewals: {calls} calls for {LEASES} leases over {rounds} rounds");
    assert!(
        calls >= LEASES * u64::from(rounds),
        "every lease tried each round: {calls}"
    );
    assert!(
        calls <= 3 * LEASES * u64::from(rounds),
        "{calls} renewal calls in {rounds} throttled rounds of {LEASES} leases"
    );
}

/// A consumer that stops on its own (its checkpoint was rejected) must not
/// leave its tenure renewed with nobody reading the shard (invariant 12):
/// the tenure ends, and the taker reclaims the lease in a new tenure for a
/// new consumer.
#[tokio::test(start_paused = true)]
async fn a_tenure_whose_consumer_stopped_is_not_renewed_on() {
    let (table, a, first) = one_lease_taken().await;
    a.coordinator().consumer_stopped(&first).await;
    assert_eq!(first.end_reason(), Some(EndReason::Lost));
    let counter = table.snapshot()[0].counter;
    sleep(RENEW * 2).await;
    assert_eq!(
        a.coordinator().stats().renewals,
        0,
        "the stopped tenure was renewed without a reader"
    );
    sleep(tick_max()).await;
    let second = a
        .coordinator()
        .handle("shardId-000000000000")
        .expect("reclaimed");
    assert!(second.is_valid());
    assert_ne!(second.tenure(), first.tenure(), "a new tenure");
    assert!(!first.is_valid(), "the old tenure stays over");
    assert!(table.snapshot()[0].counter > counter);
    assert_eq!(a.coordinator().stats().reclaimed, 1);
}

/// More leases hang than renewals may run at once: a hung renewal gives its
/// place back after a moment, so the others still renew every round.
#[tokio::test(start_paused = true)]
async fn more_hung_renewals_than_slots_still_hold_back_no_other_lease() {
    let table = table_with(12).await;
    let a = SimWorker::start(
        &table,
        per_lease("a", 1).renew_concurrency(4).build().unwrap(),
    );
    sleep(Duration::from_millis(10)).await;
    let keys = a.coordinator().held_keys();
    assert_eq!(keys.len(), 12);
    let hung: Vec<&str> = keys[..6].iter().map(String::as_str).collect();
    a.store.blackhole(&hung);
    sleep(Duration::from_secs(30)).await;
    let s = a.coordinator().stats();
    assert_eq!(s.fenced, 6, "the hung leases fence, and only they: {s:?}");
    for key in &keys[6..] {
        let h = a.coordinator().handle(key).expect("still held");
        assert!(h.is_valid(), "{key} held back by the hung leases");
    }
}

/// With liveness records, a release whose write failed leaves the lease
/// naming this instance, alive for as long as it beats: the taker reads the
/// table again and takes it back in a new tenure, instead of leaving a
/// lease held and read by nobody.
#[tokio::test(start_paused = true)]
async fn a_release_that_failed_is_taken_back_rather_than_left_held_and_unread() {
    let table = table_with(1).await;
    let a = SimWorker::start(&table, config("a", 1).build().unwrap());
    // Settled: its ticks read only the liveness records.
    sleep(tick_max() * 3).await;
    assert!(
        a.coordinator().stats().quiet_ticks > 0,
        "{:?}",
        a.coordinator().stats()
    );
    let key = "shardId-000000000000";
    let handle = a
        .coordinator()
        .handle(key)
        .expect("taken on the first tick");
    a.store
        .inject(StoreOp::Release, Fault::Error(StoreErrorKind::Retryable));
    assert!(a.coordinator().release(&handle).await.is_err());
    assert!(a.coordinator().held_keys().is_empty());
    sleep(tick_max() + Duration::from_secs(1)).await;
    assert_eq!(a.coordinator().held_keys(), vec![key.to_owned()]);
    assert_eq!(a.coordinator().stats().reclaimed, 1);
}

/// A holder's beat can land while an observer's lease scan is slow, after
/// the observer read the liveness records and before it judges the leases
/// they name. The holder counts its validity from that beat, so the
/// observer must judge as of its read: judged at the end of the scan, the
/// beat is missed and a live holder's lease is taken.
#[tokio::test(start_paused = true)]
async fn a_beat_that_lands_during_a_slow_scan_keeps_its_holder_alive() {
    let s = Duration::from_secs;
    // One lease held by a hand-driven instance, and a finished one that
    // makes the scan two pages long.
    let table = InMemoryLeaseStore::new().with_page_size(1);
    let victim = "00000000000000aa";
    let held = "shardId-000000000000";
    put_held(&table, held, victim, "a");
    table.put_raw(kcl_core::Lease::new(
        "shardId-000000000001",
        kcl_core::Checkpoint::ShardEnd,
    ));
    let beat_as_a = || beat_as(&table, victim, "a");
    beat_as_a().await;

    let b = SimWorker::start(&table, config("b", 1).store_timeout(s(4)).build().unwrap());
    sleep(s(1)).await;
    assert!(b.coordinator().held_keys().is_empty());
    let b_instance = table
        .beats_snapshot()
        .into_iter()
        .find(|r| r.worker == "b")
        .expect("b beats")
        .instance;
    // b's next tick reads the records at its next beat (about 5 s, when
    // it sees this wake-up), then scans its three pages for ~7 s, past a
    // lease duration since it first saw a's counter.
    for _ in 0..2 {
        b.store
            .inject(StoreOp::ScanPage, Fault::Delay(Duration::from_millis(3500)));
    }
    table.poke(&b_instance, None).await.unwrap();
    sleep(s(5)).await;
    // a beats during the scan, 6 s after its last beat: it counts itself
    // valid until ~15 s.
    beat_as_a().await;
    let scans_before = b.stats.snapshot().op(StoreOp::ScanPage).calls;
    sleep(s(8)).await;
    assert!(
        b.stats.snapshot().op(StoreOp::ScanPage).calls > scans_before,
        "the slow scan ran"
    );
    assert_eq!(
        table.get(held).await.unwrap().unwrap().owner.as_deref(),
        Some("a"),
        "a live holder's lease was taken: {:?}",
        b.coordinator().stats()
    );
    assert_eq!(b.coordinator().stats().taken, 0);
}

/// A holder judged dead by a liveness read can come back right after it:
/// its beat lands, and it reclaims its lease in a new tenure, validity
/// counted from that beat. An observer whose lease scan comes after the
/// reclaim must not take the new tenure on the strength of the older read.
#[tokio::test(start_paused = true)]
async fn a_tenure_written_after_the_liveness_read_is_not_judged_by_it() {
    let s = Duration::from_secs;
    let table = InMemoryLeaseStore::new();
    let victim = "00000000000000aa";
    let key = "shardId-000000000000";
    put_held(&table, key, victim, "x");
    let beat_as_x = || beat_as(&table, victim, "x");
    beat_as_x().await;
    let b = SimWorker::start(&table, config("b", 1).build().unwrap());
    sleep(s(9)).await;
    assert!(b.coordinator().held_keys().is_empty());
    // b's next tick comes when x would count as dead (~10 s): its read
    // shows x dead; its scan then takes a second.
    b.store.inject(StoreOp::ScanPage, Fault::Delay(s(1)));
    sleep(Duration::from_millis(1500)).await;
    // x comes back during that scan: beats, and reclaims its lease.
    beat_as_x().await;
    let current = table.get(key).await.unwrap().unwrap();
    let reclaimed = table
        .reclaim(&current, kcl_core::Holder::new("x", &format!("{victim}.2")))
        .await
        .unwrap();
    for _ in 0..3 {
        sleep(s(3)).await;
        beat_as_x().await;
    }
    assert!(
        b.stats.snapshot().op(StoreOp::ScanPage).calls >= 2,
        "the slow scan ran"
    );
    let now = table.get(key).await.unwrap().unwrap();
    assert_eq!(
        (now.owner.as_deref(), now.tenure.as_deref()),
        (Some("x"), reclaimed.tenure.as_deref()),
        "the reclaimed tenure was taken: {:?}",
        b.coordinator().stats()
    );
    assert_eq!(b.coordinator().stats().taken, 0);
}

/// Puts lease `key` into `table`, held by `worker` in the first tenure of
/// `instance`, an instance driven by hand.
fn put_held(table: &InMemoryLeaseStore, key: &str, instance: &str, worker: &str) {
    let mut lease = kcl_core::Lease::new(key, kcl_core::Checkpoint::TrimHorizon);
    lease.owner = Some(worker.into());
    lease.tenure = Some(format!("{instance}.1"));
    table.put_raw(lease);
}

/// One beat of a liveness record driven by hand (an instance holding one
/// lease), as its renewer would write it.
async fn beat_as(table: &InMemoryLeaseStore, instance: &str, worker: &str) {
    table
        .beat(&kcl_core::store::BeatUpdate {
            instance,
            worker,
            held: 1,
            changes: 0,
            answered: &[],
            stopping: false,
            lease_duration: std::time::Duration::from_secs(10),
            beat_interval: std::time::Duration::from_secs(5),
            per_lease: false,
        })
        .await
        .unwrap();
}

/// Counts what an application's observer is told, by worker and kind.
#[derive(Debug, Default)]
struct Recorder {
    seen: std::sync::Mutex<Vec<(String, String)>>,
}

impl kcl_core::observe::Observer for Recorder {
    fn observe(&self, worker: &str, event: &kcl_core::observe::Event<'_>) {
        use kcl_core::observe::{Acquisition, Event};
        let kind = match event {
            Event::Tick => "tick",
            Event::Acquired {
                how: Acquisition::Taken,
                ..
            } => "taken",
            Event::Acquired {
                how: Acquisition::Stolen,
                ..
            } => "stolen",
            Event::HandoffEnded { forced: false, .. } => "handoff_completed",
            Event::Ended {
                reason: EndReason::HandedOff,
                ..
            } => "handed_off",
            Event::Renewed { .. } => "renewed",
            _ => return,
        };
        self.seen
            .lock()
            .unwrap()
            .push((worker.to_owned(), kind.to_owned()));
    }
}

impl Recorder {
    fn count(&self, worker: &str, kind: &str) -> u64 {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(w, k)| w == worker && k == kind)
            .count() as u64
    }
}

#[tokio::test(start_paused = true)]
async fn an_observer_is_told_every_lease_event_the_counters_count() {
    let table = table_with(4).await;
    let recorder = std::sync::Arc::new(Recorder::default());
    let observer = || Some(recorder.clone() as std::sync::Arc<dyn kcl_core::observe::Observer>);
    let start = |id: &str, seed| {
        let config = per_lease(id, seed).build().unwrap();
        SimWorker::start_observed(&table, config, StandIn::Idle, observer())
    };
    let a = start("a", 1);
    sleep(Duration::from_millis(10)).await;
    let b = start("b", 2);
    // b steals its share from a, which hands it over; both renew.
    sleep(Duration::from_secs(60)).await;
    let (sa, sb) = (a.coordinator().stats(), b.coordinator().stats());
    assert_eq!((sa.taken, sb.stolen), (4, 2), "{sa:?} {sb:?}");
    assert_eq!((sa.handed_off, sb.handoffs_completed), (2, 2));
    for (worker, s) in [("a", sa), ("b", sb)] {
        let counted = [
            ("tick", s.ticks),
            ("taken", s.taken),
            ("stolen", s.stolen),
            ("handoff_completed", s.handoffs_completed),
            ("handed_off", s.handed_off),
            ("renewed", s.renewals),
        ];
        for (kind, n) in counted {
            assert_eq!(recorder.count(worker, kind), n, "{worker}: {kind}");
        }
        assert!(s.ticks > 0 && s.renewals > 0, "{worker}: {s:?}");
    }
}

/// An operator's eviction of a holder whose consumer hangs inside its
/// processor's call: the handoff to nobody the eviction left waits for that
/// consumer to stop, but no longer than the handoff timeout after its
/// tenure ended (invariant 12): then the holder completes it, call
/// returned or not, rather than keep the shard unread for as long as the
/// call hangs.
#[tokio::test(start_paused = true)]
async fn a_hung_consumer_holds_an_evicted_lease_back_for_at_most_the_handoff_timeout() {
    use kcl_core::leases::operator::{evict, tell};
    let table = table_with(1).await;
    let a = SimWorker::start(&table, config("a", 1).build().unwrap());
    sleep(tick_max()).await;
    let key = "shardId-000000000000";
    // The hung consumer's handle: never dropped, its exit never handled.
    let hung = a
        .coordinator()
        .handle(key)
        .expect("taken on the first tick");
    let lease = table.get(key).await.unwrap().unwrap();
    let (_, instance) = evict(&table, &lease, &table.beats_snapshot())
        .await
        .unwrap()
        .expect("a beats its liveness record: evicted");
    assert!(tell(&table, &instance, key).await);
    hung.ended().await;
    assert_eq!(hung.end_reason(), Some(EndReason::Lost));
    let ended = Instant::now();
    let in_handoff = || table.snapshot()[0].checkpoint_owner.is_some();
    // The default handoff timeout is the lease duration.
    while Instant::now() < ended + LEASE {
        assert!(
            in_handoff(),
            "completed {:?} after the tenure ended, its consumer still running",
            ended.elapsed()
        );
        sleep(Duration::from_millis(100)).await;
    }
    // Still in handoff after more than one tick since: not bounded.
    let ticks = a.coordinator().stats().ticks;
    while in_handoff() {
        assert!(
            a.coordinator().stats().ticks <= ticks + 1,
            "not completed at the first tick past the handoff timeout: {:?}",
            table.snapshot()[0]
        );
        sleep(Duration::from_millis(100)).await;
    }
    drop(hung);
}

/// Reading the leases peers asked for is slow (the lease table throttled
/// while the workers table answers): a beat renews the leases nobody asked
/// for at once. It renewed nothing until every asked one was read, one
/// read after another, and two slow reads let every tenure lapse: the
/// worker fenced leases no peer wanted.
#[tokio::test(start_paused = true)]
async fn slow_reads_of_asked_leases_hold_back_no_other_renewal() {
    let table = table_with(3).await;
    let a = SimWorker::start(&table, config("a", 1).build().unwrap());
    sleep(Duration::from_millis(10)).await;
    let keys: Vec<String> = (0..3).map(|i| format!("shardId-{i:012}")).collect();
    let handles: Vec<LeaseHandle> = keys
        .iter()
        .map(|k| a.coordinator().handle(k).expect("taken on the first tick"))
        .collect();
    let instance = table
        .beats_snapshot()
        .into_iter()
        .find(|r| r.worker == "a")
        .expect("a beats")
        .instance;
    for key in &keys[..2] {
        a.store
            .inject_on(StoreOp::Get, key, Fault::Delay(Duration::from_secs(6)));
        table.poke(&instance, Some(key)).await.unwrap();
    }
    sleep(LEASE * 2).await;
    assert_eq!(
        handles[2].end_reason(),
        None,
        "{:?}",
        a.coordinator().stats()
    );
    assert!(handles[2].is_valid());
    // The asked ones are renewed by no beat before they are read: a read
    // slower than their validity fences them (a peer wants them anyway).
    assert!(a.coordinator().stats().fenced <= 2);
}

/// A shutdown frees a lease only once no consumer of it runs, of its
/// current tenure or of an older one whose call outlived it (the lease
/// lost, then taken back). It released the taken-back tenure while a call
/// of the older one still ran, and a peer could process the shard beside
/// it. Here a handle of the older tenure stays alive, as a call blocking
/// its thread keeps one: the lease is left to expire.
#[tokio::test(start_paused = true)]
async fn a_shutdown_leaves_a_lease_whose_older_tenure_still_runs_to_expire() {
    let (table, mut a, first) = one_lease_taken().await;
    let current = table.get(first.key()).await.unwrap().unwrap();
    table
        .take(&current, kcl_core::Holder::new("thief", "t-thief"))
        .await
        .unwrap();
    timeout(RENEW * 2, first.ended()).await.expect("lost");
    // The thief never renews: a takes the lease back once it expires.
    let taken_back = async {
        while a
            .coordinator()
            .handle(first.key())
            .is_none_or(|h| h.tenure() == first.tenure())
        {
            sleep(Duration::from_millis(100)).await;
        }
    };
    timeout(LEASE * 3 + tick_max() * 2, taken_back)
        .await
        .expect("taken back");
    a.stop_gracefully().await;
    assert_eq!(
        table.snapshot()[0].owner.as_deref(),
        Some("a"),
        "left to expire while the older tenure's consumer runs"
    );
    drop(first);
}
