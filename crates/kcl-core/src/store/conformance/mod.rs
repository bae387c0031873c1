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

use std::future::Future;

use super::{CheckpointUpdate, Holder, LeaseStore, StoreError};
use crate::lease::{Checkpoint, Lease};

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
            a_thiefs_release_keeps_the_counter_a_java_owner_renews_at,
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
            checkpoints_written_together_keep_each_ones_condition,
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

mod basics;
mod checkpoints;
mod hand_backs;
mod handoffs;
mod liveness;
mod load;
mod takes;
mod tenures;

pub use basics::{
    create_if_absent_is_conditional, delete_is_guarded_by_counter, get_round_trips_every_field,
    missing_leases_fail_conditions, scan_pages_through_the_whole_table,
};
pub use checkpoints::{
    a_checkpoint_naming_its_predecessor_is_conditional_on_it,
    a_shard_end_checkpoint_records_the_children, checkpoint_after_the_lease_moved_is_rejected,
    checkpoint_is_guarded_by_ownership, checkpoints_written_together_keep_each_ones_condition,
};
pub use hand_backs::{
    a_hand_back_applies_only_to_the_lease_as_seen,
    a_hand_back_is_a_handoff_to_nobody_the_holder_drains,
    a_replayed_hand_back_reconciles_as_applied,
    an_eviction_during_a_steal_evicts_the_draining_previous_owner,
    an_eviction_hands_back_in_a_tenure_the_holder_never_wrote,
};
pub use handoffs::{
    a_thiefs_release_keeps_the_counter_a_java_owner_renews_at, handoff_moves_checkpoint_rights,
    handoff_steps_are_conditional_on_the_previous_owners_tenure,
    release_keeps_a_handoff_in_progress, take_ends_a_handoff,
};
pub use liveness::{
    beats_bump_the_counter_and_are_conditional_on_the_worker,
    forgetting_a_record_is_conditional_on_its_counter, pokes_ask_and_beats_answer,
};
pub use load::a_load_figure_is_written_by_its_holder_and_travels_with_the_lease;
pub use takes::{
    a_forced_take_never_reconciles_against_a_renewal, concurrent_takes_have_one_winner,
    release_is_guarded_by_owner, renew_is_guarded_by_owner_and_counter,
    replayed_writes_reconcile_as_applied, steal_racing_renewal_has_one_winner,
    take_is_guarded_by_counter_and_owner,
};
pub use tenures::{
    a_java_take_leaves_a_stale_tenure_that_guards_nothing,
    a_replay_reconciles_only_for_its_own_tenure, every_write_of_a_tenure_is_conditional_on_it,
    reclaim_starts_a_tenure_and_keeps_a_handoff,
};

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

/// `key` created and taken by `a` in `tenure`: the set-up of the cases
/// that follow one tenure of one holder.
async fn taken_by_a<S: LeaseStore + ?Sized>(store: &S, key: &str, tenure: &str) -> Lease {
    let seen = created(store, key).await;
    store.take(&seen, a_in(tenure)).await.expect("take")
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

/// Asserts that `key`'s checkpoint is `by`'s to write and not `other`'s
/// (`when` names the moment in a failure): `by`'s write of `update` lands,
/// then `other`'s write of the same update fails its condition. In that
/// order, `other`'s write finds the item already showing what it would
/// write: a store that reconciled a failed condition by the values alone,
/// forgetting who may checkpoint, would take it for a replay that applied.
/// Returns the lease as `by` wrote it.
async fn checkpointed_only_by<S: LeaseStore + ?Sized>(
    store: &S,
    key: &str,
    by: Holder<'_>,
    other: Holder<'_>,
    update: &CheckpointUpdate,
    when: &str,
) -> Lease {
    let written = store
        .checkpoint(key, by, update)
        .await
        .unwrap_or_else(|e| panic!("a checkpoint by {by:?} {when}: {e:?}"));
    assert_condition_failed(
        store.checkpoint(key, other, update).await,
        &format!("a checkpoint by {other:?} {when}"),
    );
    written
}

/// `write` sent twice, as a write whose answer was lost is sent again: the
/// replay must reconcile to the lease the first attempt wrote (`what`
/// names the write in a failure). Returns that lease.
async fn written_and_replayed<F, W>(write: F, what: &str) -> Lease
where
    F: Fn() -> W,
    W: Future<Output = Result<Lease, StoreError>>,
{
    let first = write().await.unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let replay = write()
        .await
        .unwrap_or_else(|e| panic!("the replayed {what} must reconcile: {e:?}"));
    assert_eq!(
        replay, first,
        "the replayed {what} reconciles to what it wrote"
    );
    first
}

/// A write a holder may be shut out of, for [`assert_refused`].
#[derive(Debug, Clone, Copy)]
enum Write {
    /// A renewal from the lease's counter as it stands: the holder is all
    /// that can fail its condition.
    Renew,
    Checkpoint,
    Release,
    CompleteHandoff,
}

/// The writes of a lease's holder.
const HOLDING: &[Write] = &[Write::Renew, Write::Checkpoint, Write::Release];

/// The writes of a previous owner draining a handoff: what a hand-back
/// leaves its holder, and an eviction does not.
const DRAINING: &[Write] = &[Write::Renew, Write::Checkpoint, Write::CompleteHandoff];

/// Asserts that each of `writes` by `by` to lease `key` fails its
/// condition; `who` names `by` in a failure. A refused write writes
/// nothing, so their order does not matter.
async fn assert_refused<S: LeaseStore + ?Sized>(
    store: &S,
    key: &str,
    by: Holder<'_>,
    writes: &[Write],
    who: &str,
) {
    let counter = store.get(key).await.expect("get").expect("exists").counter;
    for &write in writes {
        let what = format!("{write:?} by {who}");
        match write {
            Write::Renew => assert_condition_failed(store.renew(key, by, counter).await, &what),
            Write::Checkpoint => {
                assert_condition_failed(store.checkpoint(key, by, &cp("99")).await, &what)
            }
            Write::Release => assert_condition_failed(store.release(key, by).await, &what),
            Write::CompleteHandoff => {
                assert_condition_failed(store.complete_handoff(key, by).await, &what)
            }
        };
    }
}

/// `a` in tenure `tenure`.
fn a_in(tenure: &str) -> Holder<'_> {
    Holder {
        owner: "a",
        tenure: Some(tenure),
    }
}
