//! Tenures: every write of a holder is conditional on the tenure its take
//! wrote, reclaims start a new one, and a Java KCL worker's writes (which
//! carry none) are judged by their owner.

use super::{
    HOLDING, a_in, assert_condition_failed, assert_refused, cp, created, h, lease, owned_by,
    taken_by_a,
};
use crate::lease::Checkpoint;
use crate::store::{Holder, LeaseStore};

/// Renewal, checkpoint and release need the tenure the take wrote, not just
/// the worker id: a second process under the same id, or a write from an
/// earlier tenure, fails its condition.
pub async fn every_write_of_a_tenure_is_conditional_on_it<S: LeaseStore + ?Sized>(store: &S) {
    let l = taken_by_a(store, "s", "t1").await;
    assert_eq!(l.tenure.as_deref(), Some("t1"));
    assert_refused(store, "s", a_in("t2"), HOLDING, "another tenure").await;
    let untenured = Holder {
        owner: "a",
        tenure: None,
    };
    assert_condition_failed(
        store.renew("s", untenured, l.counter).await,
        "renew, no tenure",
    );
    let l = store
        .renew("s", a_in("t1"), l.counter)
        .await
        .expect("renew");
    assert_eq!(
        l.tenure.as_deref(),
        Some("t1"),
        "a renewal keeps the tenure"
    );
    store
        .checkpoint("s", a_in("t1"), &cp("5"))
        .await
        .expect("checkpoint in the tenure");
    let released = store.release("s", a_in("t1")).await.expect("release");
    assert_eq!((released.owner, released.tenure), (None, None));
    assert_condition_failed(
        store.checkpoint("s", a_in("t1"), &cp("6")).await,
        "checkpoint after release",
    );
    let stored = store.get("s").await.expect("get").expect("exists");
    assert_eq!(stored.checkpoint, Checkpoint::at("5", 0));
}

/// A lost response is reconciled by comparing the tenure too: a retry of a
/// renewal whose item now shows the same worker id and the next counter,
/// but another tenure, is a lost race.
pub async fn a_replay_reconciles_only_for_its_own_tenure<S: LeaseStore + ?Sized>(store: &S) {
    let seen = created(store, "s").await;
    let mine = store.take(&seen, a_in("t1")).await.expect("take");
    // A second process under the same id reclaims it (a restart it takes
    // for its own leftovers).
    let theirs = store.reclaim(&mine, a_in("t2")).await.expect("reclaim");
    assert_eq!(
        (theirs.counter, theirs.tenure.as_deref()),
        (mine.counter + 1, Some("t2"))
    );
    // The first process's renewal from its counter fails: the item shows
    // (a, counter + 1), as its own renewal would, but not its tenure.
    let current = assert_condition_failed(
        store.renew("s", a_in("t1"), mine.counter).await,
        "renewal of the displaced tenure",
    );
    if let Some(current) = current {
        assert_eq!(current.tenure.as_deref(), Some("t2"));
    }
    assert_condition_failed(
        store.take(&seen, a_in("t1")).await,
        "take replay, other tenure",
    );
    let replay = store
        .reclaim(&mine, a_in("t2"))
        .await
        .expect("the reclaim's own replay reconciles");
    assert_eq!(replay, theirs);
}

/// A reclaim needs the worker id and the counter, writes a new tenure, and
/// leaves a handoff in progress alone (the previous owner may still be
/// draining).
pub async fn reclaim_starts_a_tenure_and_keeps_a_handoff<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "victim").await;
    let started = store.start_handoff(&l, a_in("t1")).await.expect("start");
    let mut stale = started.clone();
    stale.counter -= 1;
    assert_condition_failed(store.reclaim(&stale, a_in("t2")).await, "stale counter");
    let mut wrong = started.clone();
    wrong.owner = Some("b".into());
    assert_condition_failed(
        store
            .reclaim(
                &wrong,
                Holder {
                    owner: "b",
                    tenure: Some("t9"),
                },
            )
            .await,
        "not the owner",
    );
    let reclaimed = store.reclaim(&started, a_in("t2")).await.expect("reclaim");
    assert_eq!(reclaimed.counter, started.counter + 1);
    assert_eq!(reclaimed.tenure.as_deref(), Some("t2"));
    assert_eq!(reclaimed.checkpoint_owner.as_deref(), Some("victim"));
    assert_eq!(
        reclaimed.checkpoint_owner_tenure.as_deref(),
        Some("t-victim")
    );
    assert_eq!(
        reclaimed.owner_switches_since_checkpoint, started.owner_switches_since_checkpoint,
        "the owner did not change"
    );
    store
        .checkpoint("s", h("victim"), &cp("3"))
        .await
        .expect("the previous owner still checkpoints");
    assert_condition_failed(
        store.renew("s", a_in("t1"), reclaimed.counter).await,
        "the old tenure",
    );
    store
        .renew("s", a_in("t2"), reclaimed.counter)
        .await
        .expect("the new tenure renews");
}

/// In a table shared with Java KCL workers: a Java take changes the owner
/// and the counter but leaves kcl's tenure attribute as it was. The stale
/// tenure guards nothing (every write checks the owner too), and a lease
/// without a tenure is taken, reclaimed and released like any other.
pub async fn a_java_take_leaves_a_stale_tenure_that_guards_nothing<S: LeaseStore + ?Sized>(
    store: &S,
) {
    // As a Java worker leaves a lease it took from kcl worker "a" (tenure t1).
    let mut java = lease("s");
    java.owner = Some("java-worker".into());
    java.counter = 12;
    java.tenure = Some("t1".into());
    store.create_if_absent(&java).await.expect("create");
    assert_refused(store, "s", a_in("t1"), HOLDING, "the old kcl owner").await;
    // Pinned to what was observed: an operator's eviction of the Java owner.
    let evicted = store
        .release("s", Holder::owner_of(&java).expect("owned"))
        .await
        .expect("eviction pinned to the observed owner and tenure");
    assert_eq!((&evicted.owner, &evicted.tenure), (&None, &None));
    let back = store
        .take(&evicted, a_in("t2"))
        .await
        .expect("kcl takes it back");
    assert_eq!(back.tenure.as_deref(), Some("t2"));

    // As a Java worker (or kcl before tenures) writes a lease: no tenure.
    let mut untenured = lease("u");
    untenured.owner = Some("a".into());
    untenured.counter = 3;
    store.create_if_absent(&untenured).await.expect("create");
    let none = Holder {
        owner: "a",
        tenure: None,
    };
    let renewed = store
        .renew("u", none, 3)
        .await
        .expect("renewed as observed");
    let reclaimed = store
        .reclaim(&renewed, a_in("t3"))
        .await
        .expect("reclaimed into a tenure");
    assert_eq!(reclaimed.tenure.as_deref(), Some("t3"));
    assert_condition_failed(
        store.renew("u", none, reclaimed.counter).await,
        "no tenure any more",
    );
}
