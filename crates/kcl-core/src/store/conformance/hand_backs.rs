//! An operator's hand-backs and evictions: pinned to the lease as read, a
//! handoff to nobody, replays that reconcile.

use super::{
    DRAINING, Write, a_in, assert_condition_failed, assert_refused, checkpointed_only_by, cp,
    created, h, lease, taken_by_a, written_and_replayed,
};
use crate::lease::{Checkpoint, Lease};
use crate::store::{Holder, LeaseStore};

/// An operator's hand-back is written on the strength of one read: it
/// applies only while the item shows the owner, tenure and counter read,
/// and no handoff runs; anything else (a renewal, a re-take, a steal, a
/// release since) fails its condition and writes nothing.
pub async fn a_hand_back_applies_only_to_the_lease_as_seen<S: LeaseStore + ?Sized>(store: &S) {
    let seen = created(store, "s").await;
    assert_condition_failed(store.hand_back(&seen, true).await, "an unowned lease");
    let l = store.take(&seen, a_in("i1.1")).await.expect("take");
    let mut stale = l.clone();
    stale.counter -= 1;
    assert_condition_failed(store.hand_back(&stale, true).await, "an older counter");
    let mut ahead = l.clone();
    ahead.counter += 1;
    assert_condition_failed(store.hand_back(&ahead, false).await, "a later counter");
    let mut other = l.clone();
    other.owner = Some("b".into());
    assert_condition_failed(store.hand_back(&other, true).await, "another owner");
    let mut twin = l.clone();
    twin.tenure = Some("i2.1".into());
    assert_condition_failed(
        store.hand_back(&twin, true).await,
        "another tenure of the same worker",
    );
    let mut untenured = l.clone();
    untenured.tenure = None;
    assert_condition_failed(
        store.hand_back(&untenured, true).await,
        "a lease read without a tenure",
    );
    // The holder renewed (or re-took) since the read: nothing is written.
    let renewed = store
        .renew("s", a_in("i1.1"), l.counter)
        .await
        .expect("renew");
    assert_condition_failed(store.hand_back(&l, true).await, "renewed since the read");
    // A handoff runs: the thief's tenure is not the operator's to end, and
    // the previous owner's right to checkpoint is kept.
    let started = store
        .start_handoff(&renewed, h("b"))
        .await
        .expect("start handoff");
    let current = assert_condition_failed(
        store.hand_back(&started, true).await,
        "a handoff in progress",
    );
    if let Some(current) = current {
        assert_eq!(current, started, "nothing written");
    }
    let mut ghost = l.clone();
    ghost.key = "ghost".into();
    assert_condition_failed(store.hand_back(&ghost, true).await, "a missing lease");
    assert_eq!(
        store.get("ghost").await.expect("get"),
        None,
        "never created"
    );
    assert_eq!(store.get("s").await.expect("get"), Some(started));
}

/// A draining hand-back leaves the lease to nobody with the holder as the
/// previous owner of a handoff, in its own tenure, at the counter it had
/// (as a steal leaves it): the holder renews from the counter it knows,
/// checkpoints once more and completes; nothing else of the lease moves.
pub async fn a_hand_back_is_a_handoff_to_nobody_the_holder_drains<S: LeaseStore + ?Sized>(
    store: &S,
) {
    taken_by_a(store, "s", "i1.1").await;
    let l = store
        .checkpoint("s", a_in("i1.1"), &cp("5"))
        .await
        .expect("checkpoint");
    let back = store.hand_back(&l, true).await.expect("hand back");
    assert_eq!((&back.owner, &back.tenure), (&None, &None));
    assert_eq!(
        handing_off(&back),
        (Some("a"), Some("i1.1")),
        "the holder hands off in its own tenure"
    );
    assert_eq!(
        back.counter, l.counter,
        "the counter stays, as in a handoff"
    );
    assert_eq!(
        (&back.checkpoint, back.owner_switches_since_checkpoint),
        (&l.checkpoint, l.owner_switches_since_checkpoint),
    );
    assert_eq!(store.get("s").await.expect("get"), Some(back.clone()));
    assert_condition_failed(store.hand_back(&back, true).await, "a second hand-back");
    assert_condition_failed(
        store.release("s", a_in("i1.1")).await,
        "a release by the holder",
    );
    // The holder's last writes, in its tenure and no other.
    assert_refused(store, "s", a_in("i1.2"), DRAINING, "another tenure").await;
    let renewed = store
        .renew("s", a_in("i1.1"), back.counter)
        .await
        .expect("the holder renews while it drains");
    assert_eq!(
        (
            renewed.owner.as_deref(),
            renewed.checkpoint_owner.as_deref()
        ),
        (None, Some("a"))
    );
    // And still none after each of the holder's own writes.
    checkpointed_only_by(
        store,
        "s",
        a_in("i1.1"),
        a_in("i1.2"),
        &cp("9"),
        "while the holder drains",
    )
    .await;
    assert_refused(
        store,
        "s",
        a_in("i1.2"),
        &[Write::CompleteHandoff],
        "another tenure",
    )
    .await;
    let done = store
        .complete_handoff("s", a_in("i1.1"))
        .await
        .expect("the holder completes");
    assert_eq!(
        (
            &done.owner,
            &done.checkpoint_owner,
            &done.checkpoint_owner_tenure
        ),
        (&None, &None, &None)
    );
    assert_eq!(done.checkpoint, Checkpoint::at("9", 0));
    assert!(done.counter > renewed.counter);
    let taken = store.take(&done, h("b")).await.expect("free to take");
    assert_eq!(taken.owner.as_deref(), Some("b"));
}

/// An operator's eviction (a reset's) records the holder as the previous
/// owner in [`crate::store::evicted_tenure`] of its tenure: in its instance, but
/// a tenure it never wrote, so the holder's tenure may write nothing more
/// (no renewal, checkpoint or completion), and the handoff is completed
/// only as the evicted tenure (by the instance, once it stopped).
pub async fn an_eviction_hands_back_in_a_tenure_the_holder_never_wrote<S: LeaseStore + ?Sized>(
    store: &S,
) {
    let l = taken_by_a(store, "s", "i1.1").await;
    let evicted = store.hand_back(&l, false).await.expect("evict");
    let tenure = crate::store::evicted_tenure("i1.1");
    assert!(crate::store::is_evicted_tenure(&tenure), "{tenure}");
    assert_eq!(
        crate::lease::instance_of(&tenure),
        "i1",
        "the holder's instance"
    );
    assert_eq!((&evicted.owner, &evicted.tenure), (&None, &None));
    assert_eq!(handing_off(&evicted), (Some("a"), Some(tenure.as_str())));
    assert_eq!(evicted.counter, l.counter, "the counter stays");
    assert_refused(store, "s", a_in("i1.1"), DRAINING, "the evicted tenure").await;
    assert_eq!(store.get("s").await.expect("get"), Some(evicted.clone()));
    let done = store
        .complete_handoff(
            "s",
            Holder::checkpoint_owner_of(&evicted).expect("a handoff runs"),
        )
        .await
        .expect("completed as the handoff recorded it");
    assert_eq!((&done.owner, &done.checkpoint_owner), (&None, &None));
    assert_eq!(
        done.checkpoint, l.checkpoint,
        "the eviction wrote no checkpoint"
    );
}

/// A hand-back whose answer was lost and that is sent again finds the
/// item as its first attempt left it: that is success (the CLI tells the
/// holder and goes on), not a lease that moved. Once the holder completed,
/// or for another holder, it is a failed condition again.
pub async fn a_replayed_hand_back_reconciles_as_applied<S: LeaseStore + ?Sized>(store: &S) {
    let l = handed_back_twice(store, "s", "i1.1", true).await;
    store
        .complete_handoff("s", a_in("i1.1"))
        .await
        .expect("complete");
    assert_condition_failed(store.hand_back(&l, true).await, "a replay after completion");

    let l = handed_back_twice(store, "t", "i1.2", false).await;
    let mut other = l.clone();
    other.owner = Some("b".into());
    assert_condition_failed(
        store.hand_back(&other, false).await,
        "another holder's replay",
    );
}

/// `key` taken by `a` in `tenure`, then handed back (`drain`) and the
/// hand-back sent again: the replay reconciles, while a hand-back of the
/// other kind (an eviction over a draining one, or the reverse) fails.
/// Returns the lease as the hand-backs read it.
async fn handed_back_twice<S: LeaseStore + ?Sized>(
    store: &S,
    key: &str,
    tenure: &str,
    drain: bool,
) -> Lease {
    let l = taken_by_a(store, key, tenure).await;
    let what = format!("hand-back with drain {drain}");
    written_and_replayed(|| store.hand_back(&l, drain), &what).await;
    assert_condition_failed(
        store.hand_back(&l, !drain).await,
        &format!(
            "a hand-back with drain {} replayed over one with drain {drain}",
            !drain
        ),
    );
    l
}

/// Read while a steal moves the lease, an eviction ends the previous
/// owner's right to the shard (it may still be draining it) and removes
/// the thief: nobody owns, the previous owner is recorded in the evicted
/// form of the tenure the handoff recorded, the counter stays. Pinned to
/// the handoff as read; a draining hand-back of a lease in a handoff, or
/// an eviction of a handoff recorded without a tenure (a Java KCL
/// leader's), fails.
pub async fn an_eviction_during_a_steal_evicts_the_draining_previous_owner<
    S: LeaseStore + ?Sized,
>(
    store: &S,
) {
    an_eviction_is_pinned_to_the_steal_as_read(store).await;
    an_eviction_after_the_thief_released_evicts_the_previous_owner(store).await;
    a_handoff_without_a_tenure_is_not_evicted(store).await;
}

/// `key` taken by `a` in `tenure`, then stolen by `b` (a handoff running,
/// `a` draining): the set-up of every eviction during a steal. Returns the
/// lease as the steal left it.
async fn stolen_from_a<S: LeaseStore + ?Sized>(store: &S, key: &str, tenure: &str) -> Lease {
    let l = taken_by_a(store, key, tenure).await;
    store.start_handoff(&l, h("b")).await.expect("steal")
}

/// The previous owner of `l`'s handoff and the tenure recorded for it.
fn handing_off(l: &Lease) -> (Option<&str>, Option<&str>) {
    (
        l.checkpoint_owner.as_deref(),
        l.checkpoint_owner_tenure.as_deref(),
    )
}

/// The eviction applies only to the handoff, owner and counter as read,
/// evicts the draining previous owner (who may write nothing more) and the
/// thief, and its replay reconciles.
async fn an_eviction_is_pinned_to_the_steal_as_read<S: LeaseStore + ?Sized>(store: &S) {
    let started = stolen_from_a(store, "s", "i1.1").await;
    assert_condition_failed(
        store.hand_back(&started, true).await,
        "a draining hand-back of a lease in a handoff",
    );
    let mut stale = started.clone();
    stale.checkpoint_owner_tenure = Some("i1.0".into());
    assert_condition_failed(store.hand_back(&stale, false).await, "another handoff");
    let mut unowned = started.clone();
    unowned.owner = None;
    unowned.tenure = None;
    assert_condition_failed(store.hand_back(&unowned, false).await, "another owner");
    let mut ahead = started.clone();
    ahead.counter += 1;
    assert_condition_failed(store.hand_back(&ahead, false).await, "another counter");
    let evicted = store.hand_back(&started, false).await.expect("evict");
    assert_eq!((&evicted.owner, &evicted.tenure), (&None, &None));
    let tenure = crate::store::evicted_tenure("i1.1");
    assert_eq!(handing_off(&evicted), (Some("a"), Some(tenure.as_str())));
    assert_eq!(evicted.counter, started.counter, "the counter stays");
    assert_refused(
        store,
        "s",
        a_in("i1.1"),
        DRAINING,
        "the draining previous owner",
    )
    .await;
    assert_refused(store, "s", h("b"), &[Write::Renew], "the thief").await;
    let replay = store
        .hand_back(&started, false)
        .await
        .expect("the replay reconciles");
    assert_eq!(replay, evicted);
}

/// The thief released the lease (a stop) while the previous owner
/// drains: that previous owner is evicted all the same.
async fn an_eviction_after_the_thief_released_evicts_the_previous_owner<S: LeaseStore + ?Sized>(
    store: &S,
) {
    let started = stolen_from_a(store, "t", "i1.2").await;
    let released = store.release("t", h("b")).await.expect("release");
    let evicted = store.hand_back(&released, false).await.expect("evict");
    assert_eq!(
        handing_off(&evicted),
        (
            Some("a"),
            Some(crate::store::evicted_tenure("i1.2").as_str())
        )
    );
    // Neither the release (a handoff's counter stays) nor the eviction
    // (its tenure is what refuses the drainer) moved the counter.
    assert_eq!(evicted.counter, started.counter);
    assert_refused(
        store,
        "t",
        a_in("i1.2"),
        &[Write::Renew],
        "the evicted drainer",
    )
    .await;
}

/// A Java KCL leader's handoff records no tenure: nothing to evict in.
async fn a_handoff_without_a_tenure_is_not_evicted<S: LeaseStore + ?Sized>(store: &S) {
    let mut java = lease("u");
    java.owner = Some("java-2".into());
    java.checkpoint_owner = Some("java-1".into());
    java.counter = 4;
    store.create_if_absent(&java).await.expect("create");
    assert_condition_failed(
        store.hand_back(&java, false).await,
        "a handoff without a tenure",
    );
    assert_eq!(store.get("u").await.expect("get"), Some(java));
}
