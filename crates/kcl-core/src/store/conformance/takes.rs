//! Takes, renewals and releases: each guarded by the counter and owner it
//! read, races with one winner, and replays that reconcile as applied.

use super::{RACE_ROUNDS, assert_condition_failed, created, h, owned_by, written_and_replayed};
use crate::store::LeaseStore;

/// A take succeeds only against the counter and owner it read.
pub async fn take_is_guarded_by_counter_and_owner<S: LeaseStore + ?Sized>(store: &S) {
    let seen = created(store, "s").await;
    let mine = store.take(&seen, h("a")).await.expect("take unowned");
    assert_eq!(mine.owner.as_deref(), Some("a"));
    assert_eq!(mine.counter, seen.counter + 1);
    assert_eq!(mine.owner_switches_since_checkpoint, 1);

    // Another worker with the stale view loses.
    let current = assert_condition_failed(store.take(&seen, h("b")).await, "stale take");
    if let Some(current) = current {
        assert_eq!(current.owner.as_deref(), Some("a"));
    }
    // The right counter but the wrong owner also loses.
    let mut wrong_owner = mine.clone();
    wrong_owner.owner = Some("z".into());
    assert_condition_failed(store.take(&wrong_owner, h("b")).await, "wrong owner");

    let stolen = store
        .take(&mine, h("b"))
        .await
        .expect("take with the current view");
    assert_eq!(stolen.owner.as_deref(), Some("b"));
    assert_eq!(stolen.counter, mine.counter + 1);
    assert_eq!(stolen.owner_switches_since_checkpoint, 2);
}

/// Two workers taking the same lease from the same view: exactly one wins,
/// every round.
pub async fn concurrent_takes_have_one_winner<S: LeaseStore + ?Sized>(store: &S) {
    for round in 0..RACE_ROUNDS {
        let seen = created(store, &format!("race-{round:03}")).await;
        let (a, b) = tokio::join!(store.take(&seen, h("a")), store.take(&seen, h("b")));
        let winners = [&a, &b].iter().filter(|r| r.is_ok()).count();
        assert_eq!(winners, 1, "round {round}: {a:?} / {b:?}");
        let loser = if a.is_ok() { b } else { a };
        assert_condition_failed(loser, "the loser");
        let winner_name = store
            .get(&seen.key)
            .await
            .expect("get")
            .expect("exists")
            .owner;
        assert!(winner_name.is_some());
    }
}

/// Renewal needs the owner and the counter it last wrote.
pub async fn renew_is_guarded_by_owner_and_counter<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "a").await;
    let renewed = store.renew("s", h("a"), l.counter).await.expect("renew");
    assert_eq!(renewed.counter, l.counter + 1);
    assert_eq!(renewed.owner.as_deref(), Some("a"));
    let again = store
        .renew("s", h("a"), renewed.counter)
        .await
        .expect("renew again");
    // One behind is what a replay looks like (see the reconciliation case);
    // further behind or ahead is stale.
    assert_condition_failed(store.renew("s", h("a"), l.counter).await, "stale counter");
    assert_condition_failed(
        store.renew("s", h("a"), again.counter + 1).await,
        "future counter",
    );
    assert_condition_failed(
        store.renew("s", h("b"), again.counter).await,
        "not the owner",
    );
}

/// A steal and the victim's renewal from the same counter: exactly one wins.
pub async fn steal_racing_renewal_has_one_winner<S: LeaseStore + ?Sized>(store: &S) {
    for round in 0..RACE_ROUNDS {
        let key = format!("steal-{round:03}");
        let held = owned_by(store, &key, "victim").await;
        let (steal, renew) = tokio::join!(
            store.take(&held, h("thief")),
            store.renew(&key, h("victim"), held.counter)
        );
        assert!(
            steal.is_ok() != renew.is_ok(),
            "round {round}: {steal:?} / {renew:?}"
        );
        let now = store.get(&key).await.expect("get").expect("exists");
        let expected = if steal.is_ok() { "thief" } else { "victim" };
        assert_eq!(now.owner.as_deref(), Some(expected));
        assert_eq!(now.counter, held.counter + 1);
    }
}

/// Only the owner releases; a released lease has no owner.
pub async fn release_is_guarded_by_owner<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "a").await;
    assert_condition_failed(store.release("s", h("b")).await, "release by another");
    let released = store.release("s", h("a")).await.expect("release");
    assert_eq!(released.owner, None);
    assert!(released.counter > l.counter);
    assert_condition_failed(store.release("s", h("a")).await, "release twice");
    // A released lease is taken from its new state by anyone.
    let taken = store.take(&released, h("b")).await.expect("take released");
    assert_eq!(taken.owner.as_deref(), Some("b"));
}

/// A write applied whose response was lost is retried by the SDK or the
/// caller; the retry fails its condition and must reconcile to success when
/// the item shows our write, and only then.
pub async fn replayed_writes_reconcile_as_applied<S: LeaseStore + ?Sized>(store: &S) {
    let seen = created(store, "s").await;
    let first = written_and_replayed(|| store.take(&seen, h("a")), "take").await;
    assert_condition_failed(store.take(&seen, h("b")).await, "someone else's replay");
    let renewed = written_and_replayed(|| store.renew("s", h("a"), first.counter), "renew").await;
    let started = written_and_replayed(|| store.start_handoff(&renewed, h("b")), "handoff").await;

    // Once the state moves on, the replay is a lost race again.
    store
        .renew("s", h("b"), started.counter)
        .await
        .expect("renew by b");
    assert_condition_failed(
        store.renew("s", h("a"), first.counter).await,
        "replay after a later write",
    );
    assert_condition_failed(
        store.take(&seen, h("a")).await,
        "take replay after a later write",
    );
}

/// A forced handoff takes in the thief's own tenure. If a renewal of that
/// tenure landed first (its attempt given up, the request late), the item
/// shows the thief at the next counter with the handoff still running: the
/// take's replay must not pass for applied, or the thief would start while
/// the previous owner may still checkpoint.
pub async fn a_forced_take_never_reconciles_against_a_renewal<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "victim").await;
    let started = store.start_handoff(&l, h("thief")).await.expect("start");
    store
        .renew("s", h("thief"), started.counter)
        .await
        .expect("the thief's late renewal lands");
    let current = assert_condition_failed(
        store.take(&started, h("thief")).await,
        "the force, against the renewed item",
    );
    if let Some(current) = current {
        assert_eq!(current.checkpoint_owner.as_deref(), Some("victim"));
    }
}
