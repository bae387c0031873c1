//! Liveness records: beats, pokes and forgetting a record.

use futures::TryStreamExt;

use super::assert_condition_failed;
use crate::lease::Lease;
use crate::store::{BeatUpdate, LeaseStore};

fn beat_of<'a>(instance: &'a str, worker: &'a str, held: u64) -> BeatUpdate<'a> {
    BeatUpdate {
        instance,
        worker,
        held,
        changes: 0,
        answered: &[],
        stopping: false,
        lease_duration: std::time::Duration::from_millis(12_500),
        beat_interval: std::time::Duration::from_millis(4_250),
        per_lease: false,
    }
}

/// A beat creates the record and every later beat bumps its counter; the
/// fields it writes read back, its lease duration and write time included;
/// another worker id cannot beat for the instance; a liveness record is
/// never a lease.
pub async fn beats_bump_the_counter_and_are_conditional_on_the_worker<S: LeaseStore + ?Sized>(
    store: &S,
) {
    assert!(store.beats().await.expect("read").is_empty());
    let first = store
        .beat(&beat_of("i-1", "a", 3))
        .await
        .expect("first beat");
    assert_eq!(
        (first.instance.as_str(), first.worker.as_str()),
        ("i-1", "a")
    );
    assert_eq!(first.held, 3);
    let mut update = beat_of("i-1", "a", 4);
    update.changes = 7;
    update.stopping = true;
    update.per_lease = true;
    let second = store.beat(&update).await.expect("second beat");
    assert!(second.per_lease, "a per-lease worker's record says so");
    assert!(second.counter > first.counter, "{second:?} after {first:?}");
    assert_eq!((second.held, second.changes, second.stopping), (4, 7, true));
    // What tools read to judge the instance's leases from one sample.
    assert_eq!(
        second.lease_duration,
        Some(std::time::Duration::from_millis(12_500))
    );
    // What peers schedule their reads of the records by.
    assert_eq!(
        second.beat_interval,
        Some(std::time::Duration::from_millis(4_250))
    );
    let written = second
        .written_at
        .expect("a beat records when it was written");
    let off = written
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_else(|e| e.duration());
    assert!(
        off < std::time::Duration::from_secs(3600),
        "written_at is the writer's wall clock: {written:?}"
    );
    assert_condition_failed(
        store.beat(&beat_of("i-1", "b", 0)).await,
        "another worker's beat",
    );
    store
        .beat(&beat_of("i-2", "b", 0))
        .await
        .expect("a second instance");
    let mut all = store.beats().await.expect("read");
    all.sort_by(|x, y| x.instance.cmp(&y.instance));
    assert_eq!(all.len(), 2);
    // A read tells how long ago each record was written (a hint for proof
    // of life, off by the hosts' clock skew): a record just written.
    let age = all[0].age.expect("a read tells the record's age");
    assert!(
        age < std::time::Duration::from_secs(3600),
        "a record just written: {age:?}"
    );
    let without_age = |b: &crate::store::Beat| crate::store::Beat {
        age: None,
        ..b.clone()
    };
    assert_eq!(without_age(&all[0]), without_age(&second));
    // A shutdown that was called off (a record written again without
    // `stopping`) reads back as not stopping.
    let resumed = store.beat(&beat_of("i-1", "a", 4)).await.expect("beat");
    assert!(!resumed.stopping, "{resumed:?}");
    assert!(!resumed.per_lease, "{resumed:?}");
    let again = store.beats().await.expect("read");
    assert!(again.iter().all(|b| !b.stopping), "{again:?}");
    let leases: Vec<Lease> = store.scan().try_concat().await.expect("scan");
    assert!(
        leases.is_empty(),
        "liveness records are not leases: {leases:?}"
    );
}

/// A poke bumps the wake counter and records the lease asked for; a beat
/// answering it removes it; a poke never brings back a missing record.
pub async fn pokes_ask_and_beats_answer<S: LeaseStore + ?Sized>(store: &S) {
    assert_condition_failed(store.poke("nobody", None).await, "poke of a missing record");
    assert!(
        store.beats().await.expect("read").is_empty(),
        "not created by a poke"
    );
    let before = store.beat(&beat_of("i-1", "a", 1)).await.expect("beat");
    store.poke("i-1", Some("shard-1")).await.expect("ask");
    store.poke("i-1", Some("shard-2")).await.expect("ask");
    store.poke("i-1", None).await.expect("wake");
    let asked = store.beat(&beat_of("i-1", "a", 1)).await.expect("beat");
    assert_eq!(asked.wake, before.wake + 3);
    assert_eq!(
        asked.asked.iter().map(String::as_str).collect::<Vec<_>>(),
        ["shard-1", "shard-2"]
    );
    let answered = ["shard-1".to_owned()];
    let mut update = beat_of("i-1", "a", 1);
    update.answered = &answered;
    let after = store.beat(&update).await.expect("answering beat");
    assert_eq!(
        after.asked.iter().map(String::as_str).collect::<Vec<_>>(),
        ["shard-2"]
    );
}

/// A record is forgotten only at the counter the caller saw (a record that
/// beat since is alive); without a counter, unconditionally and idempotently.
pub async fn forgetting_a_record_is_conditional_on_its_counter<S: LeaseStore + ?Sized>(store: &S) {
    let beat = store.beat(&beat_of("i-1", "a", 0)).await.expect("beat");
    assert_condition_failed(
        store.forget("i-1", Some(beat.counter + 1)).await,
        "forget at a stale counter",
    );
    assert_eq!(store.beats().await.expect("read").len(), 1);
    store
        .forget("i-1", Some(beat.counter))
        .await
        .expect("forget");
    assert!(store.beats().await.expect("read").is_empty());
    assert_condition_failed(
        store.forget("i-1", Some(beat.counter)).await,
        "forget of a missing record at a counter",
    );
    store.beat(&beat_of("i-2", "a", 0)).await.expect("beat");
    store.forget("i-2", None).await.expect("forget");
    store.forget("i-2", None).await.expect("forget again");
}
