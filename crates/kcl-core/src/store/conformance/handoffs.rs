//! Graceful handoffs: the previous owner keeps the right to checkpoint
//! (in the tenure the handoff recorded) until it completes; a take ends
//! one, a release keeps it.

use super::{
    Write, a_in, assert_condition_failed, assert_refused, checkpointed_only_by, cp, h, owned_by,
    taken_by_a,
};
use crate::lease::{Checkpoint, Lease};
use crate::store::{CheckpointUpdate, LeaseStore};

/// A thief that releases a lease while the previous owner still drains it
/// leaves the previous owner's right to checkpoint and complete intact.
pub async fn release_keeps_a_handoff_in_progress<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "victim").await;
    let started = store.start_handoff(&l, h("thief")).await.expect("start");
    let released = store.release("s", h("thief")).await.expect("release");
    assert_eq!(released.owner, None);
    assert_eq!(released.checkpoint_owner.as_deref(), Some("victim"));
    assert_eq!(released.counter, started.counter, "the handoff's counter");
    store
        .renew("s", h("victim"), started.counter)
        .await
        .expect("the previous owner still renews at the counter it knows");
    store
        .checkpoint("s", h("victim"), &cp("9"))
        .await
        .expect("the previous owner still checkpoints");
    let done = store
        .complete_handoff("s", h("victim"))
        .await
        .expect("complete");
    assert_eq!((done.owner, done.checkpoint_owner), (None, None));
    assert_eq!(done.checkpoint, Checkpoint::at("9", 0));
}

/// A kcl thief that stops while a Java KCL previous owner drains leaves
/// the counter as the steal did: the Java owner's renewals and final
/// checkpoint are conditioned on the counter alone, and the counter one
/// more refused them (the records since its last checkpoint were
/// processed again). A release without a handoff still adds one.
pub async fn a_thiefs_release_keeps_the_counter_a_java_owner_renews_at<S: LeaseStore + ?Sized>(
    store: &S,
) {
    let mut java = Lease::new("s", Checkpoint::at("5", 0));
    java.owner = Some("java-1".into());
    java.counter = 7;
    let java = store.create_if_absent(&java).await.expect("create");
    let started = store.start_handoff(&java, h("thief")).await.expect("steal");
    let released = store.release("s", h("thief")).await.expect("release");
    assert_eq!((released.owner, released.counter), (None, started.counter));
    let drainer = crate::store::Holder {
        owner: "java-1",
        tenure: None,
    };
    let renewed = store
        .renew("s", drainer, started.counter)
        .await
        .expect("the Java owner renews at the counter it knows");
    store
        .checkpoint("s", drainer, &cp("9"))
        .await
        .expect("its final checkpoint lands");
    assert_eq!(
        store.get("s").await.expect("get").expect("item").checkpoint,
        Checkpoint::at("9", 0)
    );
    let mine = owned_by(store, "t", "thief").await;
    let plain = store.release("t", h("thief")).await.expect("release");
    assert_eq!(plain.counter, mine.counter + 1, "no handoff: one more");
    assert_eq!(renewed.counter, started.counter + 1);
}

/// During a handoff the previous owner alone may checkpoint; completing it
/// gives that right to the new owner.
pub async fn handoff_moves_checkpoint_rights<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "a").await;
    let started = a_handoff_starts_from_the_lease_as_read(store, &l).await;

    let cp = CheckpointUpdate::to(Checkpoint::at("42", 0));
    checkpointed_only_by(store, "s", h("a"), h("b"), &cp, "before completion").await;
    // The previous owner keeps the lease alive meanwhile (the Java KCL's
    // protocol), in the tenure the handoff recorded and no other.
    assert_condition_failed(
        store.renew("s", a_in("t-old"), started.counter).await,
        "renewal by another tenure of the previous owner",
    );
    let renewed = store
        .renew("s", h("a"), started.counter)
        .await
        .expect("previous owner renews");
    assert_eq!(renewed.checkpoint_owner.as_deref(), Some("a"));
    assert_eq!(renewed.owner.as_deref(), Some("b"));
    assert_eq!(renewed.counter, started.counter + 1);
    // So does a new owner that renews while it awaits (an older kcl).
    let renewed = store
        .renew("s", h("b"), renewed.counter)
        .await
        .expect("new owner renews");

    assert_condition_failed(
        store.complete_handoff("s", h("b")).await,
        "completion by the new owner",
    );
    let done = store.complete_handoff("s", h("a")).await.expect("complete");
    assert_eq!(done.checkpoint_owner, None);
    assert_eq!(done.checkpoint_owner_tenure, None);
    assert_eq!(done.owner.as_deref(), Some("b"));
    assert_eq!(done.checkpoint, Checkpoint::at("42", 0));
    assert!(done.counter > renewed.counter);
    checkpointed_only_by(store, "s", h("b"), h("a"), &cp, "after completion").await;
}

/// The start of a handoff of `l` (owned by `a`) to `b`: only from the
/// owner and counter read, once, as the Java KCL writes it. Returns the
/// lease as the start left it.
async fn a_handoff_starts_from_the_lease_as_read<S: LeaseStore + ?Sized>(
    store: &S,
    l: &Lease,
) -> Lease {
    let mut stale = l.clone();
    stale.counter += 7;
    assert_condition_failed(store.start_handoff(&stale, h("b")).await, "stale counter");
    let mut other = l.clone();
    other.owner = Some("z".into());
    assert_condition_failed(store.start_handoff(&other, h("b")).await, "not the owner");
    let started = store.start_handoff(l, h("b")).await.expect("start handoff");
    assert_eq!(started.owner.as_deref(), Some("b"));
    assert_eq!(started.checkpoint_owner.as_deref(), Some("a"));
    assert_eq!(
        (started.counter, started.owner_switches_since_checkpoint),
        (l.counter, l.owner_switches_since_checkpoint),
        "written as the Java KCL writes a handoff: the counter and the switch count stay"
    );
    assert_eq!(
        started.tenure.as_deref(),
        Some("t-b"),
        "the thief's new tenure"
    );
    assert_eq!(
        started.checkpoint_owner_tenure.as_deref(),
        Some("t-a"),
        "the previous owner's tenure, for its last checkpoints"
    );
    assert_condition_failed(
        store.start_handoff(&started, h("c")).await,
        "second handoff",
    );
    started
}

/// Taking a lease (a forced handoff after its deadline) clears the
/// checkpoint owner.
pub async fn take_ends_a_handoff<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "a").await;
    let started = store.start_handoff(&l, h("b")).await.expect("start");
    let forced = store.take(&started, h("b")).await.expect("force");
    assert_eq!(forced.checkpoint_owner, None);
    assert_eq!(forced.checkpoint_owner_tenure, None);
    assert_eq!(forced.owner.as_deref(), Some("b"));
    assert_condition_failed(
        store.checkpoint("s", h("a"), &cp("1")).await,
        "old owner after a forced handoff",
    );
}

/// The previous owner's last checkpoints and the completion are pinned to
/// the tenure the handoff recorded: a delayed write of an earlier tenure of
/// the same worker does not land.
pub async fn handoff_steps_are_conditional_on_the_previous_owners_tenure<S: LeaseStore + ?Sized>(
    store: &S,
) {
    let l = taken_by_a(store, "s", "t1").await;
    let started = store.start_handoff(&l, h("b")).await.expect("start");
    assert_eq!(started.checkpoint_owner_tenure.as_deref(), Some("t1"));
    assert_refused(
        store,
        "s",
        a_in("t0"),
        &[Write::Checkpoint, Write::CompleteHandoff],
        "an earlier tenure",
    )
    .await;
    store
        .checkpoint("s", a_in("t1"), &cp("7"))
        .await
        .expect("the handing-off tenure checkpoints");
    store
        .complete_handoff("s", a_in("t1"))
        .await
        .expect("and completes");
    assert_condition_failed(
        store.complete_handoff("s", a_in("t1")).await,
        "completes twice",
    );
    let done = store.get("s").await.expect("get").expect("exists");
    assert_eq!(done.checkpoint, Checkpoint::at("7", 0));
    assert_eq!(done.tenure.as_deref(), Some("t-b"));
}
