//! The table's basics: creates, reads, scans and deletes, and conditions
//! on missing items.

use std::collections::HashSet;

use futures::TryStreamExt;

use super::{assert_condition_failed, created, h, lease, owned_by};
use crate::lease::{Checkpoint, HashKeyRange, Lease, Throughput};
use crate::store::{CheckpointUpdate, LeaseStore};

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
