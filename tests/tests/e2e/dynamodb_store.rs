//! The DynamoDB lease store against DynamoDB Local: the shared conformance
//! suite, unchanged, plus what only a real table can show (table checks,
//! foreign attributes kept, Java KCL items read, malformed items skipped,
//! consumed capacity reported).

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use futures::TryStreamExt;
use kcl_core::store::metered::MeteredStore;
use kcl_core::store::{CheckpointUpdate, CheckpointWrite, Holder, LeaseStore, StoreOp};
use kcl_core::{Checkpoint, Lease};
use kcl_dynamodb::{
    Capacity, DynamoDbLeaseStore, TableCreation, TableOptions, claim_stream, ensure_table,
    ensure_workers_table,
};
use kcl_tests::fault_proxy::{FaultProxy, Faults};
use kcl_tests::{TestEnv, delete_table, dynamodb_endpoint, unique_name};

async fn env() -> TestEnv {
    match TestEnv::connect().await {
        Ok(env) => env,
        Err(e) => panic!("{e:#}"),
    }
}

/// A store on a fresh lease table named from `name`, with no workers
/// table.
async fn lease_table_only(name: &str) -> DynamoDbLeaseStore {
    let env = env().await;
    let table = unique_name(name);
    ensure_table(env.dynamodb(), &table, Capacity::OnDemand)
        .await
        .expect("create table");
    DynamoDbLeaseStore::new(env.dynamodb().clone(), table)
}

/// A fresh lease table with scan pages of 10, as the conformance suite asks.
async fn new_store() -> DynamoDbLeaseStore {
    let store = lease_table_only("kcl-conformance").await.with_page_size(10);
    ensure_workers_table(store.client(), store.workers_table(), Capacity::OnDemand)
        .await
        .expect("create the workers table");
    store
}

kcl_core::lease_store_conformance!(new_store);

#[tokio::test]
async fn ensure_table_is_idempotent_and_rejects_a_foreign_schema() {
    let env = env().await;
    let table = unique_name("kcl-ensure");
    ensure_table(env.dynamodb(), &table, Capacity::OnDemand)
        .await
        .expect("create");
    ensure_table(env.dynamodb(), &table, Capacity::OnDemand)
        .await
        .expect("exists: no-op");

    let foreign = unique_name("kcl-foreign");
    let number = aws_sdk_dynamodb::types::ScalarAttributeType::N;
    kcl_tests::create_keyed_table(env.dynamodb(), &foreign, "id", number)
        .await
        .unwrap();
    let err = ensure_table(env.dynamodb(), &foreign, Capacity::OnDemand)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&foreign), "names the table: {err}");
    assert!(
        err.contains("id (HASH)") && err.contains("leaseKey"),
        "names the mismatch: {err}"
    );

    let provisioned = unique_name("kcl-provisioned");
    ensure_table(
        env.dynamodb(),
        &provisioned,
        Capacity::Provisioned { read: 5, write: 5 },
    )
    .await
    .expect("provisioned");
}

#[tokio::test]
async fn a_table_created_with_deletion_protection_refuses_deletion() {
    let env = env().await;
    let table = unique_name("kcl-protected");
    let options = TableOptions::default()
        .deletion_protection(true)
        .tag("team", "payments");
    ensure_table(env.dynamodb(), &table, options)
        .await
        .expect("create");
    let described = env
        .dynamodb()
        .describe_table()
        .table_name(&table)
        .send()
        .await
        .expect("describe");
    assert_eq!(
        described
            .table()
            .and_then(|t| t.deletion_protection_enabled()),
        Some(true)
    );
    let refused = env
        .dynamodb()
        .delete_table()
        .table_name(&table)
        .send()
        .await;
    assert!(refused.is_err(), "a protected table was deleted");
    // Leave the emulator clean: protection off, then delete.
    env.dynamodb()
        .update_table()
        .table_name(&table)
        .deletion_protection_enabled(false)
        .send()
        .await
        .expect("unprotect");
    delete_table(env.dynamodb(), &table).await.expect("delete");
}

#[tokio::test]
async fn a_worker_that_never_creates_tables_names_the_missing_one() {
    let env = env().await;
    let table = unique_name("kcl-absent");
    let never = TableOptions::default().creation(TableCreation::Never);
    let error = ensure_table(env.dynamodb(), &table, never.clone())
        .await
        .expect_err("no table");
    assert!(!error.is_retryable(), "{error}");
    assert!(error.to_string().contains(&table), "{error}");
    assert!(
        !kcl_tests::table_exists(env.dynamodb(), &table)
            .await
            .unwrap(),
        "the table was created"
    );
    // An existing table is used as it is.
    ensure_table(env.dynamodb(), &table, Capacity::OnDemand)
        .await
        .expect("create");
    ensure_table(env.dynamodb(), &table, never)
        .await
        .expect("exists");
}

async fn put_raw(store: &DynamoDbLeaseStore, item: HashMap<String, AttributeValue>) {
    store
        .client()
        .put_item()
        .table_name(store.table())
        .set_item(Some(item))
        .send()
        .await
        .expect("PutItem");
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.into())
}
fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A Java KCL 3.5 worker's report in the lease table.
fn java_report(id: &str, lut: u64) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("leaseKey".into(), s(id)),
        ("entityType".into(), s("WORKER_METRIC_STATS")),
        ("lut".into(), n(lut)),
    ])
}

/// The item of lease `key` as stored, every attribute.
async fn raw_item(store: &DynamoDbLeaseStore, key: &str) -> HashMap<String, AttributeValue> {
    store
        .client()
        .get_item()
        .table_name(store.table())
        .key("leaseKey", s(key))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
        .expect("the item")
}

/// A DynamoDB client whose calls go through `proxy`.
fn client_through(env: &TestEnv, proxy: &FaultProxy) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(env.sdk_config())
            .endpoint_url(proxy.url())
            .build(),
    )
}

/// The Java KCL 3.5 keeps its workers' reports in the lease table (items
/// of `entityType` `WORKER_METRIC_STATS`, the worker id in `leaseKey`), not
/// in `<table>-WorkerMetricStats`: kcl reads them there, as the last whole
/// scan of the leases saw them, and still reads the old table. It read
/// only the old table, so a Java 3.5 fleet's workers were invisible: their
/// leases judged expired at one lease duration, not two, and none handed
/// to them.
#[tokio::test]
async fn java_kcl_3_5_workers_reporting_in_the_lease_table_are_seen() {
    let store = new_store().await;
    let report = java_report;
    put_raw(&store, report("java-1", 1_765_000_000)).await;
    let scan = || async { store.scan().try_concat().await.unwrap() };
    let leases: Vec<Lease> = scan().await;
    assert!(leases.is_empty(), "reports are not leases: {leases:?}");
    let ids = |workers: Vec<kcl_core::store::JavaWorker>| {
        let mut ids: Vec<(String, u64)> = workers
            .into_iter()
            .map(|w| (w.id, w.last_update_secs))
            .collect();
        ids.sort();
        ids
    };
    let seen = ids(store.java_workers().await.unwrap());
    assert_eq!(seen, [("java-1".to_owned(), 1_765_000_000)]);
    // Newer reports: seen once a scan has.
    put_raw(&store, report("java-1", 1_765_000_030)).await;
    put_raw(&store, report("java-2", 1_765_000_030)).await;
    scan().await;
    let seen = ids(store.java_workers().await.unwrap());
    assert_eq!(
        seen,
        [
            ("java-1".to_owned(), 1_765_000_030),
            ("java-2".to_owned(), 1_765_000_030)
        ]
    );
    // A worker that has not scanned lately (one renewing by liveness
    // record scans seldom) reads them itself once the Java KCL's migration
    // item says a 3.5 fleet ran here; without it, it reads no further.
    let unscanned = || DynamoDbLeaseStore::new(store.client().clone(), store.table());
    assert!(unscanned().java_workers().await.unwrap().is_empty());
    put_raw(
        &store,
        HashMap::from([
            ("leaseKey".into(), s("Migration3.0")),
            ("entityType".into(), s("CLIENT_VERSION_MIGRATION")),
            ("cv".into(), s("CLIENT_VERSION_3X")),
        ]),
    )
    .await;
    assert_eq!(ids(unscanned().java_workers().await.unwrap()).len(), 2);
}

/// A free lease whose handoff attributes are NULL (another tool wrote
/// them) is still read, taken, and healed by the take, which removes them.
/// Refusing such an item as malformed left its shard unread for good, out
/// of the reach of `kcl leases reset` too.
#[tokio::test]
async fn a_free_lease_with_null_handoff_attributes_is_taken_and_healed() {
    let store = new_store().await;
    let mut item =
        kcl_dynamodb::item::to_item(&Lease::new("shardId-000000000000", Checkpoint::TrimHorizon));
    for attribute in ["checkpointOwner", "kclCheckpointOwnerTenure"] {
        item.insert(attribute.into(), AttributeValue::Null(true));
    }
    put_raw(&store, item).await;
    let leases: Vec<Lease> = store.scan().try_concat().await.unwrap();
    assert_eq!(leases.len(), 1, "the lease is read");
    let taken = store
        .take(&leases[0], Holder::new("a", "t-a"))
        .await
        .expect("the take lands");
    assert_eq!(taken.owner.as_deref(), Some("a"));
    let raw = raw_item(&store, "shardId-000000000000").await;
    assert!(!raw.contains_key("checkpointOwner"), "{raw:?}");
}

/// `item` with each of `attributes` written NULL, as another tool (a
/// script writing `None`) may write them.
fn with_nulls(
    mut item: HashMap<String, AttributeValue>,
    attributes: &[&str],
) -> HashMap<String, AttributeValue> {
    for attribute in attributes {
        item.insert((*attribute).into(), AttributeValue::Null(true));
    }
    item
}

/// A free lease whose owner and tenure are NULL is read as free (as the
/// reader takes a NULL) and taken: the take's condition that the lease has
/// no owner took the NULL for an owner, so every take was refused and the
/// shard stood unread for good.
#[tokio::test]
async fn a_free_lease_with_a_null_owner_and_tenure_is_taken() {
    let store = new_store().await;
    let lease = Lease::new("shardId-000000000000", Checkpoint::TrimHorizon);
    let item = kcl_dynamodb::item::to_item(&lease);
    put_raw(&store, with_nulls(item, &["leaseOwner", "kclTenure"])).await;
    let seen = store.get(&lease.key).await.unwrap().unwrap();
    assert_eq!(seen.owner, None, "read as free");
    let taken = store
        .take(&seen, Holder::new("a", "t-a"))
        .await
        .expect("the take lands");
    assert_eq!(taken.owner.as_deref(), Some("a"));
}

/// A held lease whose handoff attributes and sub-sequence number are NULL
/// (no handoff, sub-sequence 0, as read) takes its holder's checkpoints,
/// alone and written together: their conditions took each NULL for a
/// handoff or a sub-sequence number, and refused every write.
#[tokio::test]
async fn a_held_lease_with_null_handoff_attributes_takes_checkpoints() {
    let store = new_store().await;
    let a = Holder::new("a", "t-a");
    for key in ["s0", "s1"] {
        let lease = store
            .create_if_absent(&Lease::new(key, Checkpoint::TrimHorizon))
            .await
            .unwrap();
        store.take(&lease, a).await.unwrap();
        let mut item = raw_item(&store, key).await;
        item.insert("checkpoint".into(), AttributeValue::S("100".into()));
        let nulls = [
            "checkpointOwner",
            "kclCheckpointOwnerTenure",
            "checkpointSubSequenceNumber",
        ];
        put_raw(&store, with_nulls(item, &nulls)).await;
    }
    let to_200 = CheckpointUpdate::to(Checkpoint::at("200", 0)).replacing(Checkpoint::at("100", 0));
    let one = store.checkpoint("s0", a, &to_200).await.expect("lands");
    assert_eq!(one.checkpoint, Checkpoint::at("200", 0));
    let writes = [CheckpointWrite {
        key: "s1",
        by: a,
        update: &to_200,
    }];
    let answers = store.checkpoint_many(&writes).await.unwrap();
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let s1 = store.get("s1").await.unwrap().unwrap();
    assert_eq!(s1.checkpoint, Checkpoint::at("200", 0));
}

/// Java workers whose fleet runs 2.x-compatible (upgrading from the Java
/// KCL 2.x) report, but take leases themselves and never pick up one
/// assigned to them: they are no workers to hand leases to, whichever
/// table records the client version. kcl handed them leases, which stood
/// unrenewed until taken back, and then again after their next report.
#[tokio::test]
async fn java_workers_running_2x_compatible_are_not_handed_leases() {
    use aws_sdk_dynamodb::types::ScalarAttributeType;
    let store = new_store().await;
    let scan = || async {
        let _: Vec<Lease> = store.scan().try_concat().await.unwrap();
    };
    let ids = || async {
        let workers = store.java_workers().await.unwrap();
        workers.into_iter().map(|w| w.id).collect::<Vec<_>>()
    };
    put_raw(&store, java_report("java-1", 1_765_000_000)).await;
    scan().await;
    assert_eq!(ids().await, ["java-1"], "no migration state: 3.x");
    // The state in <table>-CoordinatorState (the Java KCL 3.0-3.4).
    let state_table = kcl_dynamodb::java::coordinator_state_table_for(store.table());
    kcl_tests::create_keyed_table(store.client(), &state_table, "key", ScalarAttributeType::S)
        .await
        .unwrap();
    let record = |version: &'static str| {
        let state_table = state_table.clone();
        let client = store.client().clone();
        async move {
            client
                .put_item()
                .table_name(state_table)
                .item("key", s("Migration3.0"))
                .item("cv", s(version))
                .send()
                .await
                .unwrap();
        }
    };
    record("CLIENT_VERSION_UPGRADE_FROM_2X").await;
    assert!(ids().await.is_empty(), "2.x-compatible");
    record("CLIENT_VERSION_3X_WITH_ROLLBACK").await;
    assert_eq!(ids().await, ["java-1"], "3.x");
    // The state in the lease table (the Java KCL 3.5), seen by a scan.
    put_raw(
        &store,
        HashMap::from([
            ("leaseKey".into(), s("Migration3.0")),
            ("entityType".into(), s("CLIENT_VERSION_MIGRATION")),
            ("cv".into(), s("CLIENT_VERSION_2X")),
        ]),
    )
    .await;
    scan().await;
    assert!(ids().await.is_empty(), "2.x-compatible, by the lease table");
    delete_table(store.client(), &state_table).await.unwrap();
}

/// A client version that cannot be read for a while (a throttle, a 5xx)
/// stands on the last answer: a 2.x-compatible fleet's workers stay
/// uncounted. Taken for "none", they counted, and were handed leases they
/// never pick up; with no answer yet, the read fails (the taker keeps what
/// it saw).
#[tokio::test]
async fn an_unreadable_client_version_stands_on_the_last_answer() {
    use aws_sdk_dynamodb::types::ScalarAttributeType;
    let env = env().await;
    let store = new_store().await;
    put_raw(&store, java_report("java-1", 1_765_000_000)).await;
    let state_table = kcl_dynamodb::java::coordinator_state_table_for(store.table());
    kcl_tests::create_keyed_table(store.client(), &state_table, "key", ScalarAttributeType::S)
        .await
        .unwrap();
    store
        .client()
        .put_item()
        .table_name(&state_table)
        .item("key", s("Migration3.0"))
        .item("cv", s("CLIENT_VERSION_UPGRADE_FROM_2X"))
        .send()
        .await
        .unwrap();
    let proxy = FaultProxy::start(&dynamodb_endpoint(), Faults::NONE, 4)
        .await
        .unwrap();
    let client = client_through(&env, &proxy);
    let through = || DynamoDbLeaseStore::new(client.clone(), store.table());
    let (answered, unanswered) = (through(), through());
    for s in [&answered, &unanswered] {
        let _: Vec<Lease> = s.scan().try_concat().await.unwrap();
    }
    assert!(
        answered.java_workers().await.unwrap().is_empty(),
        "2.x-compatible"
    );
    // Every GetItem fails from now on; scans pass.
    proxy.set_faults(Faults::OUTAGE);
    proxy.set_only(Some("GetItem"));
    assert!(
        answered.java_workers().await.unwrap().is_empty(),
        "still 2.x-compatible, by the last answer"
    );
    unanswered
        .java_workers()
        .await
        .expect_err("no answer yet: the read fails");
    assert!(
        proxy.counts().internal_errors > 0,
        "the version was asked for"
    );
    delete_table(store.client(), &state_table).await.unwrap();
}

#[tokio::test]
async fn updates_keep_attributes_this_store_does_not_know() {
    let store = new_store().await;
    let mut item =
        kcl_dynamodb::item::to_item(&Lease::new("shardId-000000000000", Checkpoint::TrimHorizon));
    item.insert("throughputKBps".into(), AttributeValue::N("12.5".into()));
    item.insert("someOtherKclField".into(), s("keep me"));
    put_raw(&store, item).await;

    let seen = store.get("shardId-000000000000").await.unwrap().unwrap();
    let (a, b) = (Holder::new("a", "t-a"), Holder::new("b", "t-b"));
    let l = store.take(&seen, a).await.unwrap();
    let l = store.renew(&l.key, a, l.counter).await.unwrap();
    store
        .checkpoint(&l.key, a, &CheckpointUpdate::to(Checkpoint::at("17", 0)))
        .await
        .unwrap();
    let l = store.reclaim(&l, a).await.unwrap();
    let h = store.start_handoff(&l, b).await.unwrap();
    store.complete_handoff(&h.key, a).await.unwrap();
    store.release(&h.key, b).await.unwrap();

    let raw = raw_item(&store, "shardId-000000000000").await;
    assert_eq!(
        raw.get("throughputKBps"),
        Some(&AttributeValue::N("12.5".into()))
    );
    assert_eq!(raw.get("someOtherKclField"), Some(&s("keep me")));
    assert_eq!(raw.get("checkpoint"), Some(&s("17")));
}

/// A Java KCL 3.x take (or a Java leader's assignment) in the middle of a
/// kcl handoff removes checkpointOwner and leaves kcl's tenures behind. An
/// operator's hand-back of that lease applies, as on the memory store: it
/// bound a value for the handoff's tenure its condition did not name, and
/// DynamoDB refused the whole write.
#[tokio::test]
async fn a_hand_back_of_a_lease_a_java_take_left_with_kcl_tenures_applies() {
    let store = new_store().await;
    let mut item =
        kcl_dynamodb::item::to_item(&Lease::new("shardId-000000000000", Checkpoint::TrimHorizon));
    item.insert("leaseOwner".into(), s("java-c"));
    item.insert("leaseCounter".into(), n(7));
    item.insert("kclTenure".into(), s("i2.0"));
    item.insert("kclCheckpointOwnerTenure".into(), s("i1.0"));
    put_raw(&store, item).await;
    let seen = store.get("shardId-000000000000").await.unwrap().unwrap();
    assert_eq!(
        (
            seen.checkpoint_owner.as_deref(),
            seen.checkpoint_owner_tenure.as_deref()
        ),
        (None, Some("i1.0"))
    );
    let back = store.hand_back(&seen, false).await.expect("hand back");
    assert_eq!(back.owner, None);
    assert_eq!(back.checkpoint_owner.as_deref(), Some("java-c"));
}

/// The lease item's raw `kclFencedCommits`, if any.
async fn fenced(store: &DynamoDbLeaseStore, key: &str) -> Option<AttributeValue> {
    raw_item(store, key).await.get("kclFencedCommits").cloned()
}

#[tokio::test]
async fn fenced_commits_are_cleared_once_the_checkpoint_moves_or_the_tenure_changes() {
    let store = new_store().await;
    let key = "shardId-000000000000";
    let fence = || AttributeValue::Ss(vec!["commit-1".into()]);
    let mut item = kcl_dynamodb::item::to_item(&Lease::new(key, Checkpoint::at("10", 0)));
    item.insert("kclFencedCommits".into(), fence());
    put_raw(&store, item).await;
    let a = Holder::new("a", "t-a");
    let seen = store.get(key).await.unwrap().unwrap();
    let held = store.take(&seen, a).await.unwrap();
    // A new tenure: commits fenced under the old one cannot land.
    assert_eq!(fenced(&store, key).await, None);

    let mut item = kcl_dynamodb::item::to_item(&held);
    item.insert("kclFencedCommits".into(), fence());
    put_raw(&store, item).await;
    // The same checkpoint written again: a fenced commit conditional on it
    // could still land if its fence went, so it stays.
    let same = CheckpointUpdate::to(Checkpoint::at("10", 0)).replacing(Checkpoint::at("10", 0));
    store.checkpoint(key, a, &same).await.unwrap();
    assert_eq!(fenced(&store, key).await, Some(fence()));
    // A checkpoint past it: the fenced commits' condition fails for good.
    let moved = CheckpointUpdate::to(Checkpoint::at("20", 0)).replacing(Checkpoint::at("10", 0));
    store.checkpoint(key, a, &moved).await.unwrap();
    assert_eq!(fenced(&store, key).await, None);
}

#[tokio::test]
async fn reads_items_written_by_the_java_kcl_and_skips_malformed_ones() {
    let store = new_store().await;
    for item in [
        // As the Java KCL 2.x writes a lease mid-stream, and a 3.x handoff.
        HashMap::from([
            ("leaseKey".into(), s("shardId-000000000002")),
            ("leaseOwner".into(), s("java-worker-1")),
            ("leaseCounter".into(), n(88)),
            (
                "checkpoint".into(),
                s("49651538401220946287154431546713870925640718925419724802"),
            ),
            ("checkpointSubSequenceNumber".into(), n(7)),
            ("ownerSwitchesSinceCheckpoint".into(), n(2)),
            (
                "parentShardId".into(),
                AttributeValue::Ss(vec!["shardId-000000000000".into()]),
            ),
        ]),
        HashMap::from([
            (
                "leaseKey".into(),
                s("123456789012:orders:1700000000:shardId-000000000001"),
            ),
            ("streamName".into(), s("123456789012:orders:1700000000")),
            ("shardId".into(), s("shardId-000000000001")),
            ("leaseOwner".into(), s("java-worker-2")),
            ("checkpointOwner".into(), s("java-worker-1")),
            ("leaseCounter".into(), n(5)),
            ("checkpoint".into(), s("LATEST")),
            ("checkpointSubSequenceNumber".into(), n(0)),
        ]),
        // Malformed: no counter; an unknown sentinel; a worker-metrics entity.
        HashMap::from([
            ("leaseKey".into(), s("bad-1")),
            ("checkpoint".into(), s("LATEST")),
        ]),
        HashMap::from([
            ("leaseKey".into(), s("bad-2")),
            ("leaseCounter".into(), n(1)),
            ("checkpoint".into(), s("SHARD_BEGIN")),
        ]),
        HashMap::from([
            ("leaseKey".into(), s("worker-x")),
            ("entityType".into(), s("WORKER_METRIC_STATS")),
        ]),
    ] {
        put_raw(&store, item).await;
    }

    let mut leases: Vec<Lease> = store
        .scan()
        .try_concat()
        .await
        .expect("a scan survives malformed items");
    leases.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(leases.len(), 2, "{leases:?}");
    let multi = &leases[0];
    assert_eq!(
        multi.stream.as_deref(),
        Some("123456789012:orders:1700000000")
    );
    assert_eq!(multi.shard_id, "shardId-000000000001");
    assert_eq!(multi.checkpoint_owner.as_deref(), Some("java-worker-1"));
    assert_eq!((multi.counter, &multi.checkpoint), (5, &Checkpoint::Latest));
    let single = &leases[1];
    assert_eq!(single.owner.as_deref(), Some("java-worker-1"));
    assert_eq!(single.counter, 88);
    assert_eq!(
        single.checkpoint,
        Checkpoint::at(
            "49651538401220946287154431546713870925640718925419724802",
            7
        )
    );
    assert_eq!(single.parent_shard_ids.len(), 1);

    // A Java-written lease can be taken over by this store.
    let taken = store
        .take(single, Holder::new("rust-worker", "t-1"))
        .await
        .unwrap();
    assert_eq!(taken.owner_switches_since_checkpoint, 3);
}

#[tokio::test]
async fn consumed_capacity_is_reported_per_operation() {
    let inner = new_store().await;
    let metered = MeteredStore::new(inner.clone());
    let store = MeteredStore::with_stats(
        inner.with_stats(Arc::clone(metered.stats())),
        Arc::clone(metered.stats()),
    );
    let l = store
        .create_if_absent(&Lease::new("s", Checkpoint::TrimHorizon))
        .await
        .unwrap();
    let a = Holder::new("a", "t-a");
    let l = store.take(&l, a).await.unwrap();
    store.renew("s", a, l.counter).await.unwrap();
    let _: Vec<Lease> = store.scan().try_concat().await.unwrap();
    let snap = store.stats().snapshot();
    for op in [
        StoreOp::Create,
        StoreOp::Take,
        StoreOp::Renew,
        StoreOp::ScanPage,
    ] {
        assert_eq!(snap.op(op).calls, 1, "{op}");
        assert!(
            snap.op(op).capacity > 0.0,
            "{op} reported no capacity: {snap:?}"
        );
    }
    assert_eq!(snap.scans, 1);
}

/// A lease table without a table of liveness records (a fleet renewing per
/// lease, or shared with the Java KCL): reading the records finds none, and
/// asking an instance through its record fails as for a missing record, so
/// a thief renewing per lease never waits on a request it cannot send.
#[tokio::test]
async fn without_a_workers_table_there_are_no_records_to_read_or_poke() {
    let store = lease_table_only("kcl-no-workers").await;
    assert!(store.beats().await.expect("read").is_empty());
    let err = store
        .poke("some-instance", Some("shard"))
        .await
        .unwrap_err();
    assert!(err.is_condition_failed(), "{err}");
}

#[tokio::test]
async fn the_failure_table_gets_one_item_per_record_and_a_resend_overwrites_it() {
    use kcl_core::poison::{FailedRecord, FailureDestination, FailureReason};
    use kcl_core::processor::ShardContext;
    use kcl_dynamodb::DynamoDbDestination;

    let env = env().await;
    let table = unique_name("kcl-failed");
    let destination = DynamoDbDestination::new(env.dynamodb().clone(), &table);
    destination.create_table_if_absent().await.unwrap();
    destination.create_table_if_absent().await.unwrap();
    let ctx = ShardContext {
        stream: "orders".into(),
        shard_id: "shardId-000000000003".into(),
        lease_key: "shardId-000000000003".into(),
        worker_id: "w-1".into(),
        lane: None,
    };
    let record = |sub: u64, data: Vec<u8>| kcl_core::Record {
        data: data.into(),
        partition_key: "customer-7".into(),
        explicit_hash_key: None,
        sequence_number: "4959".into(),
        sub_sequence_number: sub,
        approximate_arrival: Some(std::time::SystemTime::now()),
        aggregated: true,
    };
    let failed = [
        FailedRecord::new(
            ctx.clone(),
            record(0, b"{bad".to_vec()),
            "x".repeat(100_000),
            3,
            FailureReason::MaxAttempts,
        ),
        FailedRecord::new(
            ctx,
            record(1, vec![b'y'; 380_000]),
            "too old".into(),
            1,
            FailureReason::MaxRecordAge,
        ),
    ];
    destination.send(&failed).await.unwrap();
    destination.send(&failed).await.unwrap();
    let items: Vec<HashMap<String, AttributeValue>> = env
        .dynamodb()
        .scan()
        .table_name(&table)
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(items.len(), 2, "a resend overwrote its items");
    let first = items
        .iter()
        .find(|i| i["id"].as_s().unwrap() == "orders/shardId-000000000003/4959/0")
        .unwrap();
    assert_eq!(first["data"].as_b().unwrap().as_ref(), b"{bad");
    assert_eq!(first["reason"].as_s().unwrap(), "max_attempts");
    assert_eq!(first["attempts"].as_n().unwrap(), "3");
    assert_eq!(
        first["error"].as_s().unwrap().len(),
        8 * 1024,
        "a long error is cut"
    );
    let second = items
        .iter()
        .find(|i| i["id"].as_s().unwrap().ends_with("/4959/1"))
        .unwrap();
    assert_eq!(
        second["data"].as_b().unwrap().as_ref(),
        &[b'y'; 380_000][..],
        "a record that fits an item is stored whole"
    );
    assert_eq!(second["data_bytes"].as_n().unwrap(), "380000");
    assert_eq!(second["reason"].as_s().unwrap(), "max_record_age");

    // Too big for an item: the send fails (the checkpoint holds) unless
    // truncation was chosen, and then the item says so.
    let mut too_big = failed[1].clone();
    too_big.record.sub_sequence_number = 2;
    too_big.record.data = vec![b'z'; 500_000].into();
    let err = destination.send(&[too_big.clone()]).await.unwrap_err();
    assert!(err.to_string().contains("400 KB"), "{err}");
    DynamoDbDestination::new(env.dynamodb().clone(), &table)
        .truncate_oversized_data(true)
        .send(&[too_big])
        .await
        .unwrap();
    let third = env
        .dynamodb()
        .get_item()
        .table_name(&table)
        .key(
            "id",
            AttributeValue::S("orders/shardId-000000000003/4959/2".into()),
        )
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    assert_eq!(third["data_truncated"].as_bool().unwrap(), &true);
    assert_eq!(third["data_bytes"].as_n().unwrap(), "500000");
    assert!(third["data"].as_b().unwrap().as_ref().len() > 390_000);
}

#[tokio::test]
async fn a_single_stream_table_serves_one_stream_and_names_both_when_asked_for_another() {
    let store = new_store().await;
    let (client, table, workers) = (store.client(), store.table(), store.workers_table());
    let orders = "123456789012:orders:1700000000";
    claim_stream(client, table, workers, orders)
        .await
        .expect("the first claim");
    claim_stream(client, table, workers, orders)
        .await
        .expect("the same stream again");
    // The same name, made again: another creation time, another stream.
    let remade = "123456789012:orders:1800000000";
    let error = claim_stream(client, table, workers, remade)
        .await
        .expect_err("another stream");
    assert!(!error.is_retryable(), "{error}");
    let message = error.to_string();
    assert!(
        message.contains(orders) && message.contains(remade) && message.contains(table),
        "{message}"
    );
    // The claim is no worker's liveness record.
    assert!(store.beats().await.expect("beats").is_empty());
}

/// Checkpoints written together go as one `BatchExecuteStatement` per 25
/// leases, not one `UpdateItem` each: 30 leases' checkpoints are two
/// requests, and every one of them lands.
#[tokio::test]
async fn thirty_checkpoints_written_together_are_two_requests() {
    let env = env().await;
    let store = new_store().await;
    let a = Holder::new("a", "t-a");
    let keys: Vec<String> = (0..30).map(|i| format!("s{i:02}")).collect();
    for key in &keys {
        let l = store
            .create_if_absent(&Lease::new(key, Checkpoint::TrimHorizon))
            .await
            .unwrap();
        store.take(&l, a).await.unwrap();
    }
    let proxy = FaultProxy::start(&dynamodb_endpoint(), Faults::NONE, 3)
        .await
        .unwrap();
    let client = client_through(&env, &proxy);
    let through = DynamoDbLeaseStore::new(client, store.table());
    let updates: Vec<CheckpointUpdate> = (0..keys.len())
        .map(|i| {
            CheckpointUpdate::to(Checkpoint::at(format!("{}", 100 + i), 0))
                .replacing(Checkpoint::TrimHorizon)
        })
        .collect();
    let writes: Vec<CheckpointWrite<'_>> = keys
        .iter()
        .zip(&updates)
        .map(|(key, update)| CheckpointWrite { key, by: a, update })
        .collect();
    let answers = through.checkpoint_many(&writes).await.unwrap();
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    assert_eq!(proxy.counts().requests, 2, "25 statements to a request");
    for (i, key) in keys.iter().enumerate() {
        let l = store.get(key).await.unwrap().unwrap();
        assert_eq!(l.checkpoint, Checkpoint::at(format!("{}", 100 + i), 0));
    }
}
