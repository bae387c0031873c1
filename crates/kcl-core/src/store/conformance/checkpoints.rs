//! Checkpoints: written by the holder that may checkpoint, never racing
//! renewals, conditional on the one they replace, SHARD_END with children.

use super::{assert_condition_failed, checkpointed_only_by, cp, h, owned_by};
use crate::lease::Checkpoint;
use crate::store::{CheckpointUpdate, CheckpointWrite, LeaseStore, StoreError};

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
    let c = checkpointed_only_by(store, "s", h("b"), h("a"), &cp("6"), "after the steal").await;
    assert_eq!(c.checkpoint, Checkpoint::at("6", 0));
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

/// Checkpoints written together keep each one's condition: the holder's
/// land, a stale predecessor, another's lease and a missing lease fail on
/// their own without stopping the rest, a pending checkpoint with state
/// lands whole, and more writes than one request takes (27) all land. A
/// write the batch answers with a failure is written again alone, as the
/// checkpointer does; a success of the batch must have landed.
pub async fn checkpoints_written_together_keep_each_ones_condition<S: LeaseStore + ?Sized>(
    store: &S,
) {
    let keys: Vec<String> = (0..27).map(|i| format!("s{i:02}")).collect();
    let mut counters = Vec::new();
    for key in &keys {
        counters.push(owned_by(store, key, "a").await.counter);
    }
    owned_by(store, "other", "b").await;
    let updates: Vec<CheckpointUpdate> = (0..keys.len())
        .map(|i| {
            CheckpointUpdate::to(Checkpoint::at(format!("{}", 100 + i), 0))
                .replacing(Checkpoint::TrimHorizon)
        })
        .collect();
    let prepared = CheckpointUpdate {
        pending: Some(Checkpoint::at("300", 1)),
        pending_state: Some(b"state".to_vec()),
        ..CheckpointUpdate::to(Checkpoint::at("200", 0)).replacing(Checkpoint::TrimHorizon)
    };
    let stale = CheckpointUpdate::to(Checkpoint::at("7", 0)).replacing(Checkpoint::at("5", 0));
    let mut writes: Vec<CheckpointWrite<'_>> = keys
        .iter()
        .zip(&updates)
        .map(|(key, update)| CheckpointWrite {
            key,
            by: h("a"),
            update,
        })
        .collect();
    // The first lease's write is the prepared one; three that must fail.
    writes[0].update = &prepared;
    writes.insert(
        1,
        CheckpointWrite {
            key: "other",
            by: h("a"),
            update: &updates[1],
        },
    );
    writes.insert(
        2,
        CheckpointWrite {
            key: "s01",
            by: h("a"),
            update: &stale,
        },
    );
    writes.insert(
        3,
        CheckpointWrite {
            key: "missing",
            by: h("a"),
            update: &updates[2],
        },
    );
    let answers = written_together(store, &writes).await;
    for (i, (w, answer)) in writes.iter().zip(&answers).enumerate() {
        match i {
            1..=3 => assert!(
                answer.as_ref().is_err_and(StoreError::is_condition_failed),
                "write {i} on {:?} must fail its condition: {answer:?}",
                w.key
            ),
            _ => assert!(answer.is_ok(), "write {i} on {:?}: {answer:?}", w.key),
        }
    }
    assert_written_together(store, &keys, &counters).await;
}

/// What [`checkpoints_written_together_keep_each_ones_condition`] leaves:
/// the prepared checkpoint whole, each other holder's write in place with
/// the counter unmoved, the failed ones' leases as they were.
async fn assert_written_together<S: LeaseStore + ?Sized>(
    store: &S,
    keys: &[String],
    counters: &[u64],
) {
    let first = store.get("s00").await.expect("get").expect("exists");
    assert_eq!(first.checkpoint, Checkpoint::at("200", 0));
    assert_eq!(first.pending_checkpoint, Some(Checkpoint::at("300", 1)));
    assert_eq!(
        first.pending_checkpoint_state.as_deref(),
        Some(&b"state"[..])
    );
    for (i, key) in keys.iter().enumerate().skip(1) {
        let l = store.get(key).await.expect("get").expect("exists");
        assert_eq!(
            l.checkpoint,
            Checkpoint::at(format!("{}", 100 + i), 0),
            "{key}"
        );
        assert_eq!(l.counter, counters[i], "checkpoints never race renewals");
        assert_eq!(l.owner.as_deref(), Some("a"));
    }
    let other = store.get("other").await.expect("get").expect("exists");
    assert_eq!(
        other.checkpoint,
        Checkpoint::TrimHorizon,
        "another's lease is untouched"
    );
    assert!(store.get("missing").await.expect("get").is_none());
}

/// `writes` through [`LeaseStore::checkpoint_many`], and each write it did
/// not land again alone (the caller's part of the contract): the verdict
/// of each.
async fn written_together<S: LeaseStore + ?Sized>(
    store: &S,
    writes: &[CheckpointWrite<'_>],
) -> Vec<Result<(), StoreError>> {
    let answers = store
        .checkpoint_many(writes)
        .await
        .expect("the request is answered");
    assert_eq!(
        answers.len(),
        writes.len(),
        "one answer per write, in order"
    );
    let mut verdicts = Vec::new();
    for (w, answer) in writes.iter().zip(answers) {
        verdicts.push(match answer {
            Ok(()) => Ok(()),
            Err(_) => store.checkpoint(w.key, w.by, w.update).await.map(drop),
        });
    }
    verdicts
}
