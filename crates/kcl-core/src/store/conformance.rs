//! The conformance suite every [`LeaseStore`] must pass, unchanged.
//!
//! Each case takes a fresh, empty store whose scans return pages of at most
//! 10 leases. [`lease_store_conformance!`](crate::lease_store_conformance)
//! turns the whole suite into one test per case for a store factory:
//!
//! ```ignore
//! async fn new_store() -> MyStore { /* empty table, page size <= 10 */ }
//! kcl_core::lease_store_conformance!(new_store);
//! ```

use std::collections::HashSet;

use futures::TryStreamExt;

use super::{BeatUpdate, CheckpointUpdate, Holder, LeaseStore, StoreError};
use crate::lease::{Checkpoint, HashKeyRange, Lease, Throughput};

/// Rounds of each race case; every round must have exactly one winner.
pub const RACE_ROUNDS: usize = 40;

/// Generates one `#[tokio::test]` per conformance case for `$factory`, an
/// async fn returning a fresh, empty store with scan pages of at most 10.
#[macro_export]
macro_rules! lease_store_conformance {
    ($factory:path) => {
        $crate::lease_store_conformance!(@cases $factory;
            create_if_absent_is_conditional,
            get_round_trips_every_field,
            take_is_guarded_by_counter_and_owner,
            concurrent_takes_have_one_winner,
            renew_is_guarded_by_owner_and_counter,
            steal_racing_renewal_has_one_winner,
            release_is_guarded_by_owner,
            release_keeps_a_handoff_in_progress,
            checkpoint_is_guarded_by_ownership,
            checkpoint_after_the_lease_moved_is_rejected,
            handoff_moves_checkpoint_rights,
            take_ends_a_handoff,
            delete_is_guarded_by_counter,
            scan_pages_through_the_whole_table,
            replayed_writes_reconcile_as_applied,
            missing_leases_fail_conditions,
            every_write_of_a_tenure_is_conditional_on_it,
            a_replay_reconciles_only_for_its_own_tenure,
            reclaim_starts_a_tenure_and_keeps_a_handoff,
            handoff_steps_are_conditional_on_the_previous_owners_tenure,
            a_java_take_leaves_a_stale_tenure_that_guards_nothing,
            a_checkpoint_naming_its_predecessor_is_conditional_on_it,
            a_shard_end_checkpoint_records_the_children,
            a_forced_take_never_reconciles_against_a_renewal,
            beats_bump_the_counter_and_are_conditional_on_the_worker,
            pokes_ask_and_beats_answer,
            forgetting_a_record_is_conditional_on_its_counter,
            a_hand_back_applies_only_to_the_lease_as_seen,
            a_hand_back_is_a_handoff_to_nobody_the_holder_drains,
            an_eviction_hands_back_in_a_tenure_the_holder_never_wrote,
            a_replayed_hand_back_reconciles_as_applied,
            an_eviction_during_a_steal_evicts_the_draining_previous_owner,
            a_load_figure_is_written_by_its_holder_and_travels_with_the_lease
        );
    };
    (@cases $factory:path; $($case:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let store = $factory().await;
                $crate::store::conformance::$case(&store).await;
            }
        )+
    };
}

fn lease(key: &str) -> Lease {
    Lease::new(key, Checkpoint::TrimHorizon)
}

async fn created<S: LeaseStore + ?Sized>(store: &S, key: &str) -> Lease {
    store.create_if_absent(&lease(key)).await.expect("create")
}

/// `owner` in the tenure named after it (`"t-<owner>"`), for cases where
/// one tenure per worker is enough.
fn h(owner: &str) -> Holder<'_> {
    Holder {
        owner,
        tenure: Some(match owner {
            "a" => "t-a",
            "b" => "t-b",
            "victim" => "t-victim",
            "thief" => "t-thief",
            _ => "t-other",
        }),
    }
}

async fn owned_by<S: LeaseStore + ?Sized>(store: &S, key: &str, owner: &str) -> Lease {
    let l = created(store, key).await;
    store.take(&l, h(owner)).await.expect("take")
}

fn cp(seq: &str) -> CheckpointUpdate {
    CheckpointUpdate::to(Checkpoint::at(seq, 0))
}

fn assert_condition_failed<T: std::fmt::Debug>(
    r: Result<T, StoreError>,
    what: &str,
) -> Option<Lease> {
    match r {
        Err(e) if e.is_condition_failed() => e.current().cloned(),
        other => panic!("{what}: expected a failed condition, got {other:?}"),
    }
}

/// A second create of the same key fails and returns the existing item.
pub async fn create_if_absent_is_conditional<S: LeaseStore + ?Sized>(store: &S) {
    let first = created(store, "shardId-000000000001").await;
    assert_eq!(first.owner, None);
    let mut other = lease("shardId-000000000001");
    other.checkpoint = Checkpoint::Latest;
    let current = assert_condition_failed(store.create_if_absent(&other).await, "second create");
    if let Some(current) = current {
        assert_eq!(
            current.checkpoint,
            Checkpoint::TrimHorizon,
            "the first item is kept"
        );
    }
    let stored = store
        .get("shardId-000000000001")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(stored.checkpoint, Checkpoint::TrimHorizon);
}

/// Every field of the model survives a write and a read.
pub async fn get_round_trips_every_field<S: LeaseStore + ?Sized>(store: &S) {
    assert_eq!(store.get("absent").await.expect("get"), None);
    let mut full = Lease::new_multi_stream(
        "123456789012:orders:1700000000",
        "shardId-000000000007",
        Checkpoint::at(
            "49590338271490256608559692538361571095921575989136588898",
            4,
        ),
    )
    .with_parents(["shardId-000000000002", "shardId-000000000003"]);
    full.owner = Some("worker-a".into());
    full.counter = 41;
    full.pending_checkpoint = Some(Checkpoint::at(
        "49590338271490256608559692538361571095921575989136589000",
        0,
    ));
    full.pending_checkpoint_state = Some(vec![0, 1, 2, 255]);
    full.owner_switches_since_checkpoint = 3;
    full.child_shard_ids = ["shardId-000000000009".to_owned()].into();
    full.hash_key_range = Some(HashKeyRange {
        starting: "0".into(),
        ending: "170141183460469231731687303715884105727".into(),
    });
    full.checkpoint_owner = Some("worker-b".into());
    full.tenure = Some("3f2a9c01d4e5b687.1".into());
    full.checkpoint_owner_tenure = Some("77aa00ff11ee22dd.4".into());
    full.throughput = Throughput::from_kbps(12.5);
    store.create_if_absent(&full).await.expect("create");
    let read = store.get(&full.key).await.expect("get").expect("exists");
    assert_eq!(read, full);
    let scanned: Vec<Lease> = store.scan().try_concat().await.expect("scan");
    assert_eq!(scanned, vec![full]);
}

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

/// A thief that releases a lease while the previous owner still drains it
/// leaves the previous owner's right to checkpoint and complete intact.
pub async fn release_keeps_a_handoff_in_progress<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "victim").await;
    store.start_handoff(&l, h("thief")).await.expect("start");
    let released = store.release("s", h("thief")).await.expect("release");
    assert_eq!(released.owner, None);
    assert_eq!(released.checkpoint_owner.as_deref(), Some("victim"));
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

/// The owner checkpoints (without bumping the counter); others cannot.
pub async fn checkpoint_is_guarded_by_ownership<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "a").await;
    let pending = CheckpointUpdate {
        pending: Some(Checkpoint::at("200", 3)),
        pending_state: Some(b"prepared".to_vec()),
        ..CheckpointUpdate::to(Checkpoint::at("100", 0))
    };
    let c = store
        .checkpoint("s", h("a"), &pending)
        .await
        .expect("checkpoint");
    assert_eq!(c.checkpoint, Checkpoint::at("100", 0));
    assert_eq!(c.pending_checkpoint, Some(Checkpoint::at("200", 3)));
    assert_eq!(
        c.pending_checkpoint_state.as_deref(),
        Some(&b"prepared"[..])
    );
    assert_eq!(c.owner_switches_since_checkpoint, 0);
    assert_eq!(c.counter, l.counter, "a checkpoint must not race renewals");

    let done = store
        .checkpoint("s", h("a"), &CheckpointUpdate::to(Checkpoint::at("200", 3)))
        .await
        .expect("commit");
    assert_eq!(done.checkpoint, Checkpoint::at("200", 3));
    assert_eq!(done.pending_checkpoint, None);
    assert_eq!(done.pending_checkpoint_state, None);

    assert_condition_failed(
        store
            .checkpoint("s", h("b"), &CheckpointUpdate::to(Checkpoint::ShardEnd))
            .await,
        "checkpoint by a non-owner",
    );
    let after = store.get("s").await.expect("get").expect("exists");
    assert_eq!(after.checkpoint, Checkpoint::at("200", 3));
}

/// A worker whose lease was taken cannot checkpoint any more.
pub async fn checkpoint_after_the_lease_moved_is_rejected<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "a").await;
    store.take(&l, h("b")).await.expect("steal");
    assert_condition_failed(
        store.checkpoint("s", h("a"), &cp("5")).await,
        "checkpoint by the old owner",
    );
    let c = store
        .checkpoint("s", h("b"), &cp("6"))
        .await
        .expect("new owner checkpoints");
    assert_eq!(c.checkpoint, Checkpoint::at("6", 0));
}

/// During a handoff the previous owner alone may checkpoint; completing it
/// gives that right to the new owner.
pub async fn handoff_moves_checkpoint_rights<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "a").await;
    let mut stale = l.clone();
    stale.counter += 7;
    assert_condition_failed(store.start_handoff(&stale, h("b")).await, "stale counter");
    let mut other = l.clone();
    other.owner = Some("z".into());
    assert_condition_failed(store.start_handoff(&other, h("b")).await, "not the owner");
    let started = store
        .start_handoff(&l, h("b"))
        .await
        .expect("start handoff");
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

    let cp = CheckpointUpdate::to(Checkpoint::at("42", 0));
    store
        .checkpoint("s", h("a"), &cp)
        .await
        .expect("previous owner checkpoints");
    assert_condition_failed(
        store.checkpoint("s", h("b"), &cp).await,
        "new owner before completion",
    );
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
    assert_condition_failed(
        store.checkpoint("s", h("a"), &cp).await,
        "old owner after completion",
    );
    store
        .checkpoint("s", h("b"), &cp)
        .await
        .expect("new owner after completion");
}

/// SHARD_END is checkpointed with the shard's children, recorded on the
/// parent as the Java KCL records them (`childShardIds`); written again it
/// succeeds, and a later checkpoint without children keeps them.
pub async fn a_shard_end_checkpoint_records_the_children<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "a").await;
    let children = ["shardId-000000000001", "shardId-000000000002"].map(str::to_owned);
    let end = CheckpointUpdate::to(Checkpoint::ShardEnd).with_children(children.clone());
    let done = store
        .checkpoint("s", h("a"), &end)
        .await
        .expect("shard end");
    assert_eq!(done.checkpoint, Checkpoint::ShardEnd);
    assert_eq!(done.child_shard_ids, children.clone().into());
    let read = store.get("s").await.expect("get").expect("exists");
    assert_eq!(read.child_shard_ids, children.clone().into());
    store
        .checkpoint("s", h("a"), &end)
        .await
        .expect("written again");
    let again = store
        .checkpoint("s", h("a"), &CheckpointUpdate::to(Checkpoint::ShardEnd))
        .await
        .expect("checkpoint without children");
    assert_eq!(again.child_shard_ids, children.into());
    assert_eq!(l.counter, again.counter, "checkpoints never race renewals");
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

/// Delete needs the counter it read.
pub async fn delete_is_guarded_by_counter<S: LeaseStore + ?Sized>(store: &S) {
    let l = owned_by(store, "s", "a").await;
    assert_condition_failed(store.delete("s", l.counter - 1).await, "stale delete");
    store.delete("s", l.counter).await.expect("delete");
    assert_eq!(store.get("s").await.expect("get"), None);
    assert_condition_failed(store.delete("s", l.counter).await, "delete twice");
}

/// A scan follows continuation to the end over many pages, each lease once.
pub async fn scan_pages_through_the_whole_table<S: LeaseStore + ?Sized>(store: &S) {
    assert_eq!(store.scan().try_concat().await.expect("empty scan"), vec![]);
    for i in 0..25 {
        created(store, &format!("shardId-{i:012}")).await;
    }
    let pages: Vec<Vec<Lease>> = store.scan().try_collect().await.expect("scan");
    assert!(
        pages.len() >= 3,
        "25 leases in pages of at most 10 make at least 3 pages, got {}",
        pages.len()
    );
    assert!(pages.iter().all(|p| p.len() <= 10));
    let keys: HashSet<String> = pages.into_iter().flatten().map(|l| l.key).collect();
    assert_eq!(keys.len(), 25);
}

/// A write applied whose response was lost is retried by the SDK or the
/// caller; the retry fails its condition and must reconcile to success when
/// the item shows our write, and only then.
pub async fn replayed_writes_reconcile_as_applied<S: LeaseStore + ?Sized>(store: &S) {
    let seen = created(store, "s").await;
    let first = store.take(&seen, h("a")).await.expect("take");
    let replay = store
        .take(&seen, h("a"))
        .await
        .expect("replayed take reconciles");
    assert_eq!(replay, first);
    assert_condition_failed(store.take(&seen, h("b")).await, "someone else's replay");

    let renewed = store
        .renew("s", h("a"), first.counter)
        .await
        .expect("renew");
    let replay = store
        .renew("s", h("a"), first.counter)
        .await
        .expect("replayed renew reconciles");
    assert_eq!(replay, renewed);

    let started = store
        .start_handoff(&renewed, h("b"))
        .await
        .expect("handoff");
    let replay = store
        .start_handoff(&renewed, h("b"))
        .await
        .expect("replayed handoff reconciles");
    assert_eq!(replay, started);

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

/// Every conditional write on a missing key fails its condition.
pub async fn missing_leases_fail_conditions<S: LeaseStore + ?Sized>(store: &S) {
    let ghost = lease("ghost");
    let mut owned_ghost = ghost.clone();
    owned_ghost.owner = Some("a".into());
    assert_condition_failed(store.take(&ghost, h("a")).await, "take");
    assert_condition_failed(store.reclaim(&owned_ghost, h("a")).await, "reclaim");
    assert_condition_failed(store.renew("ghost", h("a"), 0).await, "renew");
    assert_condition_failed(store.release("ghost", h("a")).await, "release");
    assert_condition_failed(
        store
            .checkpoint("ghost", h("a"), &CheckpointUpdate::to(Checkpoint::ShardEnd))
            .await,
        "checkpoint",
    );
    assert_condition_failed(
        store.start_handoff(&owned_ghost, h("b")).await,
        "start_handoff",
    );
    assert_condition_failed(
        store.complete_handoff("ghost", h("a")).await,
        "complete_handoff",
    );
    assert_condition_failed(store.delete("ghost", 0).await, "delete");
    assert_eq!(
        store.get("ghost").await.expect("get"),
        None,
        "no write may create an item"
    );
}

/// `a` in tenure `tenure`.
fn a_in(tenure: &str) -> Holder<'_> {
    Holder {
        owner: "a",
        tenure: Some(tenure),
    }
}

/// Renewal, checkpoint and release need the tenure the take wrote, not just
/// the worker id: a second process under the same id, or a write from an
/// earlier tenure, fails its condition.
pub async fn every_write_of_a_tenure_is_conditional_on_it<S: LeaseStore + ?Sized>(store: &S) {
    let seen = created(store, "s").await;
    let l = store.take(&seen, a_in("t1")).await.expect("take");
    assert_eq!(l.tenure.as_deref(), Some("t1"));
    let twin = a_in("t2");
    assert_condition_failed(
        store.renew("s", twin, l.counter).await,
        "renew, other tenure",
    );
    assert_condition_failed(
        store.checkpoint("s", twin, &cp("5")).await,
        "checkpoint, other tenure",
    );
    assert_condition_failed(store.release("s", twin).await, "release, other tenure");
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

/// The previous owner's last checkpoints and the completion are pinned to
/// the tenure the handoff recorded: a delayed write of an earlier tenure of
/// the same worker does not land.
pub async fn handoff_steps_are_conditional_on_the_previous_owners_tenure<S: LeaseStore + ?Sized>(
    store: &S,
) {
    let seen = created(store, "s").await;
    let l = store.take(&seen, a_in("t1")).await.expect("take");
    let started = store.start_handoff(&l, h("b")).await.expect("start");
    assert_eq!(started.checkpoint_owner_tenure.as_deref(), Some("t1"));
    assert_condition_failed(
        store.checkpoint("s", a_in("t0"), &cp("7")).await,
        "earlier tenure checkpoints",
    );
    assert_condition_failed(
        store.complete_handoff("s", a_in("t0")).await,
        "earlier tenure completes",
    );
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
    assert_condition_failed(
        store.renew("s", a_in("t1"), 12).await,
        "renew by the old kcl owner",
    );
    assert_condition_failed(
        store.checkpoint("s", a_in("t1"), &cp("1")).await,
        "checkpoint by the old kcl owner",
    );
    assert_condition_failed(
        store.release("s", a_in("t1")).await,
        "release by the old kcl owner",
    );
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

/// A checkpoint that names the one it replaces lands only over that one: a
/// late attempt of an earlier checkpoint of the same tenure fails. A replay
/// of a write that applied reconciles.
pub async fn a_checkpoint_naming_its_predecessor_is_conditional_on_it<S: LeaseStore + ?Sized>(
    store: &S,
) {
    owned_by(store, "s", "a").await;
    let first = CheckpointUpdate::to(Checkpoint::at("5", 0)).replacing(Checkpoint::TrimHorizon);
    store.checkpoint("s", h("a"), &first).await.expect("first");
    let second = CheckpointUpdate::to(Checkpoint::at("9", 2)).replacing(Checkpoint::at("5", 0));
    store
        .checkpoint("s", h("a"), &second)
        .await
        .expect("second");
    // The first write's late twin, and a write from a stale view.
    let current = assert_condition_failed(
        store.checkpoint("s", h("a"), &first).await,
        "a late attempt of the first",
    );
    if let Some(current) = current {
        assert_eq!(current.checkpoint, Checkpoint::at("9", 2));
    }
    let stale = CheckpointUpdate::to(Checkpoint::at("7", 0)).replacing(Checkpoint::at("5", 0));
    assert_condition_failed(
        store.checkpoint("s", h("a"), &stale).await,
        "a stale predecessor",
    );
    store
        .checkpoint("s", h("a"), &second)
        .await
        .expect("a replay of the last write reconciles");
    assert_condition_failed(
        store.checkpoint("s", h("b"), &second).await,
        "a replay by another holder",
    );
    let third = CheckpointUpdate::to(Checkpoint::ShardEnd).replacing(Checkpoint::at("9", 2));
    store.checkpoint("s", h("a"), &third).await.expect("third");
    assert_eq!(
        store
            .get("s")
            .await
            .expect("get")
            .expect("exists")
            .checkpoint,
        Checkpoint::ShardEnd
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
/// fields it writes read back, its lease duration and write time included; another worker id cannot beat for the
/// instance; a liveness record is never a lease.
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
    let seen = created(store, "s").await;
    store.take(&seen, a_in("i1.1")).await.expect("take");
    let l = store
        .checkpoint("s", a_in("i1.1"), &cp("5"))
        .await
        .expect("checkpoint");
    let back = store.hand_back(&l, true).await.expect("hand back");
    assert_eq!((&back.owner, &back.tenure), (&None, &None));
    assert_eq!(
        (
            back.checkpoint_owner.as_deref(),
            back.checkpoint_owner_tenure.as_deref()
        ),
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
    assert_condition_failed(
        store.renew("s", a_in("i1.2"), back.counter).await,
        "a renewal by another tenure",
    );
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
    assert_condition_failed(
        store.checkpoint("s", a_in("i1.2"), &cp("9")).await,
        "a checkpoint by another tenure",
    );
    store
        .checkpoint("s", a_in("i1.1"), &cp("9"))
        .await
        .expect("the holder checkpoints while it drains");
    assert_condition_failed(
        store.complete_handoff("s", a_in("i1.2")).await,
        "a completion by another tenure",
    );
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
/// owner in [`super::evicted_tenure`] of its tenure: in its instance, but
/// a tenure it never wrote, so the holder's tenure may write nothing more
/// (no renewal, checkpoint or completion), and the handoff is completed
/// only as the evicted tenure (by the instance, once it stopped).
pub async fn an_eviction_hands_back_in_a_tenure_the_holder_never_wrote<S: LeaseStore + ?Sized>(
    store: &S,
) {
    let seen = created(store, "s").await;
    let l = store.take(&seen, a_in("i1.1")).await.expect("take");
    let evicted = store.hand_back(&l, false).await.expect("evict");
    let tenure = super::evicted_tenure("i1.1");
    assert!(super::is_evicted_tenure(&tenure), "{tenure}");
    assert_eq!(
        crate::leases::tenure::instance_of(&tenure),
        "i1",
        "the holder's instance"
    );
    assert_eq!((&evicted.owner, &evicted.tenure), (&None, &None));
    assert_eq!(
        (
            evicted.checkpoint_owner.as_deref(),
            evicted.checkpoint_owner_tenure.as_deref()
        ),
        (Some("a"), Some(tenure.as_str()))
    );
    assert_eq!(evicted.counter, l.counter, "the counter stays");
    assert_condition_failed(
        store.renew("s", a_in("i1.1"), evicted.counter).await,
        "the evicted tenure renews",
    );
    assert_condition_failed(
        store.checkpoint("s", a_in("i1.1"), &cp("9")).await,
        "the evicted tenure checkpoints",
    );
    assert_condition_failed(
        store.complete_handoff("s", a_in("i1.1")).await,
        "the evicted tenure completes",
    );
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
    let seen = created(store, "s").await;
    let l = store.take(&seen, a_in("i1.1")).await.expect("take");
    let first = store.hand_back(&l, true).await.expect("hand back");
    let replay = store
        .hand_back(&l, true)
        .await
        .expect("the replay reconciles");
    assert_eq!(replay, first);
    assert_condition_failed(
        store.hand_back(&l, false).await,
        "an eviction replayed over a draining hand-back",
    );
    store
        .complete_handoff("s", a_in("i1.1"))
        .await
        .expect("complete");
    assert_condition_failed(store.hand_back(&l, true).await, "a replay after completion");

    let seen = created(store, "t").await;
    let l = store.take(&seen, a_in("i1.2")).await.expect("take");
    let first = store.hand_back(&l, false).await.expect("evict");
    let replay = store
        .hand_back(&l, false)
        .await
        .expect("the eviction's replay reconciles");
    assert_eq!(replay, first);
    assert_condition_failed(
        store.hand_back(&l, true).await,
        "a draining hand-back replayed over an eviction",
    );
    let mut other = l.clone();
    other.owner = Some("b".into());
    assert_condition_failed(
        store.hand_back(&other, false).await,
        "another holder's replay",
    );
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
    let seen = created(store, "s").await;
    let l = store.take(&seen, a_in("i1.1")).await.expect("take");
    let started = store.start_handoff(&l, h("b")).await.expect("steal");
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
    let tenure = super::evicted_tenure("i1.1");
    assert_eq!(
        (
            evicted.checkpoint_owner.as_deref(),
            evicted.checkpoint_owner_tenure.as_deref()
        ),
        (Some("a"), Some(tenure.as_str()))
    );
    assert_eq!(evicted.counter, started.counter, "the counter stays");
    assert_condition_failed(
        store.checkpoint("s", a_in("i1.1"), &cp("9")).await,
        "the draining previous owner checkpoints",
    );
    assert_condition_failed(
        store.renew("s", a_in("i1.1"), evicted.counter).await,
        "the draining previous owner renews",
    );
    assert_condition_failed(
        store.complete_handoff("s", a_in("i1.1")).await,
        "the draining previous owner completes",
    );
    assert_condition_failed(
        store.renew("s", h("b"), evicted.counter).await,
        "the thief renews",
    );
    let replay = store
        .hand_back(&started, false)
        .await
        .expect("the replay reconciles");
    assert_eq!(replay, evicted);

    // The thief released the lease (a stop) while the previous owner
    // drains: that previous owner is evicted all the same.
    let seen = created(store, "t").await;
    let l = store.take(&seen, a_in("i1.2")).await.expect("take");
    let started = store.start_handoff(&l, h("b")).await.expect("steal");
    let released = store.release("t", h("b")).await.expect("release");
    let evicted = store.hand_back(&released, false).await.expect("evict");
    assert_eq!(
        (
            evicted.checkpoint_owner.as_deref(),
            evicted.checkpoint_owner_tenure.as_deref()
        ),
        (Some("a"), Some(super::evicted_tenure("i1.2").as_str()))
    );
    assert!(evicted.counter > started.counter);

    // A Java KCL leader's handoff records no tenure: nothing to evict in.
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

fn kbps(x: f64) -> Throughput {
    Throughput::from_kbps(x).expect("a figure")
}

/// A lease's load figure (`throughputKBps`) is written only by its owner
/// in its tenure, on its own or with a renewal, without moving the
/// counter when on its own; it is rounded to a thousandth, and every other
/// write (renewal without one, checkpoint, handoff, take, release) leaves
/// it, so it travels with the lease to its next holder.
pub async fn a_load_figure_is_written_by_its_holder_and_travels_with_the_lease<
    S: LeaseStore + ?Sized,
>(
    store: &S,
) {
    let l = owned_by(store, "s", "a").await;
    assert_eq!(l.throughput, None, "no figure until one is published");
    assert_condition_failed(
        store.report_load("s", h("b"), kbps(1.0)).await,
        "a report by another worker",
    );
    assert_condition_failed(
        store.report_load("s", a_in("t-old"), kbps(1.0)).await,
        "a report by another tenure of the owner",
    );
    let reported = store
        .report_load("s", h("a"), kbps(12.345_678))
        .await
        .expect("the holder reports");
    assert_eq!(reported.throughput, Some(kbps(12.346)), "rounded to 1/1000");
    assert_eq!(reported.counter, l.counter, "a report renews nothing");
    let read = store.get("s").await.expect("get").expect("exists");
    assert_eq!(read.throughput, Some(kbps(12.346)));

    let renewed = store
        .renew_with("s", h("a"), l.counter, Some(kbps(3.0)))
        .await
        .expect("a renewal carrying a figure");
    assert_eq!(
        (renewed.counter, renewed.throughput),
        (l.counter + 1, Some(kbps(3.0)))
    );
    let renewed = store
        .renew("s", h("a"), renewed.counter)
        .await
        .expect("a renewal without one");
    assert_eq!(renewed.throughput, Some(kbps(3.0)), "kept");
    let checkpointed = store
        .checkpoint("s", h("a"), &cp("7"))
        .await
        .expect("checkpoint");
    assert_eq!(checkpointed.throughput, Some(kbps(3.0)));

    let handing = store.start_handoff(&renewed, h("b")).await.expect("steal");
    assert_eq!(handing.throughput, Some(kbps(3.0)), "travels with a steal");
    assert_condition_failed(
        store.report_load("s", h("a"), kbps(9.0)).await,
        "a report by the previous owner while it hands off",
    );
    let done = store.complete_handoff("s", h("a")).await.expect("complete");
    assert_eq!(done.throughput, Some(kbps(3.0)));
    let released = store.release("s", h("b")).await.expect("release");
    assert_eq!(released.throughput, Some(kbps(3.0)));
    let taken = store.take(&released, h("a")).await.expect("take");
    assert_eq!(
        taken.throughput,
        Some(kbps(3.0)),
        "the next holder starts from it"
    );
    let zero = store
        .report_load("s", h("a"), kbps(0.0))
        .await
        .expect("an idle figure");
    assert_eq!(zero.throughput, Some(kbps(0.0)));
}
