//! Exactly-once into DynamoDB, on the emulators: records counted per key
//! into a counter table, each batch's counts committed with its checkpoint
//! in one transaction conditional on the lease's tenure.
//!
//! - Under the DynamoDB fault proxy (lost responses, TransactionConflict,
//!   throttling, all on the transactions): every counter exact.
//! - Three worker processes killed, paused past their lease and restarted
//!   while records keep coming, one of them killed right after a batch's
//!   counts were durable: every counter exact; the same run with plain
//!   at-least-once checkpoints counts that batch twice.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use kcl::{Checkpointer, ExactlyOnce, InitialPosition, Worker};
use kcl_tests::counting::{self, Counter, Mode};
use kcl_tests::e2e::{
    CheckpointMode, KEYS, LEASE, Producer, Scenario, WorkerProcess, out_dir, signal,
};
use kcl_tests::fault_proxy::{FaultProxy, Faults};
use kcl_tests::{dynamodb_endpoint, unique_name};
use tokio::time::Instant;

use crate::E2E_WORKER;

// Commits whose answer is lost, settled by their own token.
mod settling;

/// Waits until every key's count reaches `per_key` and holds still for a
/// few seconds (late or repeated commits would show), then returns them.
async fn settled_counts(s: &Scenario, table: &str, per_key: u64) -> HashMap<String, u64> {
    let started = Instant::now();
    let mut last: Option<HashMap<String, u64>> = None;
    loop {
        let counts = counting::counts(s.env.dynamodb(), table).await.unwrap();
        let reached =
            (0..KEYS).all(|k| counts.get(&format!("pk-{k}")).copied().unwrap_or(0) >= per_key);
        if reached && last.as_ref() == Some(&counts) {
            return counts;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "counts never reached {per_key} per key: {counts:?}"
        );
        last = reached.then_some(counts);
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_stay_exact_through_lost_responses_conflicts_and_throttling() {
    exact_under_transaction_faults(kcl::LeaseRenewal::WorkerLiveness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_stay_exact_through_transaction_faults_with_per_lease_renewal() {
    exact_under_transaction_faults(kcl::LeaseRenewal::PerLease).await;
}

async fn exact_under_transaction_faults(renewal: kcl::LeaseRenewal) {
    let mut s = Scenario::new(2).await;
    let table = unique_name("kcl-counts");
    counting::create_table(s.env.dynamodb(), &table)
        .await
        .unwrap();
    let proxy = FaultProxy::start(
        &dynamodb_endpoint(),
        Faults {
            drop_response: 0.25,
            throttle: 0.25,
            ..Faults::NONE
        },
        17,
    )
    .await
    .unwrap();
    // Only the transactions meet faults: the lease store's own calls go
    // through untouched, so what is measured is the commit path.
    proxy.set_only(Some("TransactWriteItems"));
    proxy.set_transaction_conflicts(0.2);
    // No SDK retries: every lost response and throttle reaches kcl's own
    // retries and reconciliation.
    let through_proxy = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(s.env.sdk_config())
            .endpoint_url(proxy.url())
            .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
            .build(),
    );
    let exactly_once = ExactlyOnce::new(through_proxy.clone(), &s.app);
    let (client, counter_table) = (through_proxy.clone(), table.clone());
    let worker = Worker::builder(&s.app)
        .stream(&s.stream)
        .clients(s.env.kinesis().clone(), through_proxy)
        .worker_id("eo-1")
        .renewal(renewal)
        .initial_position(InitialPosition::TrimHorizon)
        .lease_duration(LEASE)
        .taker_interval(Duration::from_secs(2))
        .idle_time_between_reads(Duration::from_millis(200))
        .processor(move |_: &kcl::ShardContext| Counter {
            mode: Mode::ExactlyOnce,
            dynamodb: client.clone(),
            table: counter_table.clone(),
            exactly_once: exactly_once.clone(),
            work: Duration::ZERO,
            stall_once: None,
        })
        .build()
        .unwrap();
    let handle = worker.handle();
    let task = tokio::spawn(worker.run());
    // Until every kind of fault has met a transaction (bounded).
    for round in 0.. {
        s.produce(4).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let f = proxy.counts();
        if f.dropped_responses > 0 && f.conflicts > 0 && f.throttles > 0 && round >= 5 {
            break;
        }
        assert!(round < 60, "not every fault was drawn in 60 rounds: {f:?}");
    }
    let counts = settled_counts(&s, &table, s.produced).await;
    let leases = handle.status().leases;
    handle.shutdown();
    task.await.unwrap().unwrap();
    let faults = proxy.counts();
    println!(
        "exactly-once under faults ({renewal:?}): {} requests through the proxy, {} transaction responses lost, {} conflicts, {} throttled; counts {counts:?}; leases {leases:?}",
        faults.requests, faults.dropped_responses, faults.conflicts, faults.throttles
    );
    // A lost response was reconciled as the commit it was, not taken for
    // a lost lease: the consumers never stopped, no lease was taken again.
    assert_eq!(
        (leases.taken, leases.reclaimed, leases.lost),
        (2, 0, 0),
        "{leases:?}"
    );
    for k in 0..KEYS {
        assert_eq!(counts[&format!("pk-{k}")], s.produced, "pk-{k}: {counts:?}");
    }
    assert!(faults.dropped_responses > 0, "{faults:?}");
    assert!(faults.conflicts > 0, "{faults:?}");
    assert!(faults.throttles > 0, "{faults:?}");
}

/// What one chaos run did and counted.
struct Run {
    produced: u64,
    counts: HashMap<String, u64>,
    kills: u32,
    pauses: u32,
    /// Records of the batch whose counts were durable when its process
    /// was killed (the deterministic fault).
    stalled: u64,
}

impl Run {
    fn extra(&self) -> i64 {
        self.counts.values().map(|n| *n as i64).sum::<i64>()
            - (self.produced * u64::from(KEYS)) as i64
    }
}

/// Waits for the process that stalled at `Counter::stall_once` to say so:
/// its pid and the records of the batch it counted.
async fn stalled_at(path: &std::path::Path) -> (u32, u64) {
    let started = Instant::now();
    loop {
        // Written just after the file is created: parse until complete.
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some((pid, records)) = text.strip_suffix('\n').and_then(|t| t.split_once(' ')) {
            return (pid.parse().unwrap(), records.parse().unwrap());
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no worker reached its stall point in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three workers count a stream. First, one of them stalls right after a
/// batch's counts are durable and is killed there (restarted a second
/// later): at-least-once has counted that batch but not checkpointed it,
/// exactly-once has done both. Then, every 3 s, one of them is killed (and
/// restarted a second later) or paused for longer than the lease (and
/// resumed, still believing it holds its leases, with batches in hand).
async fn chaos_run(mode: Mode) -> Run {
    let s = Scenario::new(4).await;
    let table = unique_name("kcl-counts");
    counting::create_table(s.env.dynamodb(), &table)
        .await
        .unwrap();
    let out = out_dir("kcl-e2e-exactly-once");
    let stall = out.join("stall");
    let mut config = s.processes(E2E_WORKER, &out, CheckpointMode::EveryBatch);
    config.extra_env = vec![
        ("KCL_E2E_COUNT_TABLE".into(), table.clone()),
        ("KCL_E2E_COUNT_MODE".into(), mode.as_str().into()),
        ("KCL_E2E_COUNT_STALL".into(), stall.display().to_string()),
    ];
    let ids = ["c-1", "c-2", "c-3"];
    let mut workers: Vec<WorkerProcess> = ids.iter().map(|id| config.spawn(id).unwrap()).collect();
    let mut s = s;
    let producer = Producer::start(&s, 2, Duration::from_millis(250));
    let (pid, stalled) = stalled_at(&stall).await;
    let i = workers
        .iter()
        .position(|w| w.child.id() == Some(pid))
        .unwrap_or_else(|| panic!("pid {pid} is none of the workers"));
    workers[i].kill().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    workers[i] = config.spawn(ids[i]).unwrap();
    let (mut kills, mut pauses) = (1, 0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    for round in 0..8 {
        let i = round % ids.len();
        if round % 2 == 0 {
            workers[i].kill().await.unwrap();
            kills += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
            workers[i] = config.spawn(ids[i]).unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
        } else {
            signal(&workers[i].child, "-STOP").unwrap();
            pauses += 1;
            tokio::time::sleep(LEASE + Duration::from_secs(3)).await;
            signal(&workers[i].child, "-CONT").unwrap();
        }
    }
    let produced = producer.stop(&mut s).await;
    let counts = settled_counts(&s, &table, produced).await;
    for w in &mut workers {
        w.terminate(Duration::from_secs(30)).await.unwrap();
    }
    Run {
        produced,
        counts,
        kills,
        pauses,
        stalled,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_are_exact_under_kills_and_pauses_where_at_least_once_counts_twice() {
    let exact = chaos_run(Mode::ExactlyOnce).await;
    let plain = chaos_run(Mode::AtLeastOnce).await;
    for (name, run) in [("exactly-once", &exact), ("at-least-once", &plain)] {
        println!(
            "{name}: {} records per key produced, {} kills ({} records durable at the first) and {} pauses past the lease; counted {} extra: {:?}",
            run.produced,
            run.kills,
            run.stalled,
            run.pauses,
            run.extra(),
            run.counts
        );
    }
    for k in 0..KEYS {
        assert_eq!(
            exact.counts[&format!("pk-{k}")],
            exact.produced,
            "pk-{k} counted inexactly: {:?}",
            exact.counts
        );
    }
    // The same faults: the batch counted when its process died is counted
    // again by at-least-once (its checkpoint was not written), never by
    // exactly-once (its checkpoint was, with the counts).
    assert!(exact.stalled > 0 && plain.stalled > 0);
    assert!(
        plain.extra() >= plain.stalled as i64,
        "at-least-once counted {} extra, not the {} records of the killed batch again: {:?}",
        plain.extra(),
        plain.stalled,
        plain.counts
    );
}

/// A lease table with lease `shard-1` held by `w-1` in tenure `t-1`, a
/// checkpointer for it handed records up to `100/5`, and a sink table.
struct Held {
    env: kcl_tests::TestEnv,
    store: kcl_dynamodb::DynamoDbLeaseStore,
    lease_table: String,
    checkpointer: Checkpointer,
    sink: String,
}

async fn held_lease() -> Held {
    use kcl_core::store::LeaseStore as _;
    let env = kcl_tests::TestEnv::connect()
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let lease_table = unique_name("kcl-eo-leases");
    kcl_dynamodb::ensure_table(
        env.dynamodb(),
        &lease_table,
        kcl_dynamodb::Capacity::OnDemand,
    )
    .await
    .unwrap();
    let store = kcl_dynamodb::DynamoDbLeaseStore::new(env.dynamodb().clone(), &lease_table);
    let lease = store
        .create_if_absent(&kcl_core::Lease::new(
            "shard-1",
            kcl_core::Checkpoint::TrimHorizon,
        ))
        .await
        .unwrap();
    let lease = store
        .take(&lease, kcl_core::Holder::new("w-1", "t-1"))
        .await
        .unwrap();
    let handle = kcl_core::LeaseHandle::detached(lease, Duration::from_secs(300));
    let mut checkpointer = Checkpointer::for_test(std::sync::Arc::new(store.clone()), handle);
    checkpointer.delivered_for_test("100", 5);
    let sink = unique_name("kcl-eo-sink");
    counting::create_table(env.dynamodb(), &sink).await.unwrap();
    Held {
        env,
        store,
        lease_table,
        checkpointer,
        sink,
    }
}

/// [`held_lease`], with an [`ExactlyOnce`] on its lease table.
async fn held_lease_with_eo() -> (
    kcl_tests::TestEnv,
    kcl_dynamodb::DynamoDbLeaseStore,
    Checkpointer,
    ExactlyOnce,
    String,
) {
    let held = held_lease().await;
    let eo = ExactlyOnce::new(held.env.dynamodb().clone(), &held.lease_table);
    (held.env, held.store, held.checkpointer, eo, held.sink)
}

/// Asserts that no commit landed: `sink` holds no count, and the stored
/// checkpoint of [`held_lease`]'s lease is still TRIM_HORIZON.
async fn assert_nothing_committed(
    env: &kcl_tests::TestEnv,
    store: &kcl_dynamodb::DynamoDbLeaseStore,
    sink: &str,
) {
    use kcl_core::store::LeaseStore as _;
    let counts = counting::counts(env.dynamodb(), sink).await.unwrap();
    assert!(counts.is_empty(), "no commit landed: {counts:?}");
    assert_eq!(
        store.get("shard-1").await.unwrap().unwrap().checkpoint,
        kcl_core::Checkpoint::TrimHorizon
    );
}

fn record(seq: &str, sub: u64) -> kcl::Record {
    kcl::Record {
        data: bytes::Bytes::from_static(b"x"),
        partition_key: "pk-0".into(),
        explicit_hash_key: None,
        sequence_number: seq.into(),
        sub_sequence_number: sub,
        approximate_arrival: None,
        aggregated: sub > 0,
    }
}

fn put(table: &str, key: &str) -> aws_sdk_dynamodb::types::TransactWriteItem {
    use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name(table)
                .item(counting::KEY, AttributeValue::S(key.into()))
                .item(counting::COUNT, AttributeValue::N("1".into()))
                .build()
                .unwrap(),
        )
        .build()
}

#[tokio::test]
async fn a_commit_moves_the_checkpoint_with_its_writes_at_a_sub_sequence_position() {
    use kcl_core::store::LeaseStore as _;
    let (env, store, mut cp, eo, sink) = held_lease_with_eo().await;
    eo.commit(&mut cp, one_write(put(&sink, "a")), &record("100", 3))
        .await
        .unwrap();
    let lease = store.get("shard-1").await.unwrap().unwrap();
    assert_eq!(lease.checkpoint, kcl_core::Checkpoint::at("100", 3));
    assert_eq!(
        counting::counts(env.dynamodb(), &sink).await.unwrap()["a"],
        1
    );
    assert!(cp.is_checkpointed(&record("100", 3)));
    assert!(!cp.is_checkpointed(&record("100", 4)));
}

#[tokio::test]
async fn a_failed_condition_of_the_applications_own_writes_writes_nothing() {
    use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, TransactWriteItem};
    let (env, store, mut cp, eo, sink) = held_lease_with_eo().await;
    let mut tx = kcl::Transaction::new();
    tx.push(put(&sink, "a")).unwrap();
    tx.push(
        TransactWriteItem::builder()
            .condition_check(
                ConditionCheck::builder()
                    .table_name(&sink)
                    .key(counting::KEY, AttributeValue::S("missing".into()))
                    .condition_expression("attribute_exists(#k)")
                    .expression_attribute_names("#k", counting::KEY)
                    .build()
                    .unwrap(),
            )
            .build(),
    )
    .unwrap();
    let e = eo.commit(&mut cp, tx, &record("100", 0)).await.unwrap_err();
    assert!(
        matches!(e, kcl::TransactionError::ConditionFailed { index: 1, .. }),
        "{e}"
    );
    assert_nothing_committed(&env, &store, &sink).await;
}

#[tokio::test]
async fn a_stale_tenure_writes_nothing_and_learns_its_lease_is_lost() {
    use kcl_core::store::LeaseStore as _;
    let (env, store, mut cp, eo, sink) = held_lease_with_eo().await;
    // The same worker id took the lease again (a restart): this tenure is
    // stale though the owner's name matches.
    let current = store.get("shard-1").await.unwrap().unwrap();
    store
        .reclaim(&current, kcl_core::Holder::new("w-1", "t-2"))
        .await
        .unwrap();
    let e = eo
        .commit(&mut cp, one_write(put(&sink, "a")), &record("100", 0))
        .await
        .unwrap_err();
    assert!(matches!(e, kcl::TransactionError::LeaseLost { .. }), "{e}");
    assert_nothing_committed(&env, &store, &sink).await;
}

#[tokio::test]
async fn the_previous_owner_commits_while_it_hands_the_lease_off() {
    use kcl_core::store::LeaseStore as _;
    let (env, store, mut cp, eo, sink) = held_lease_with_eo().await;
    let current = store.get("shard-1").await.unwrap().unwrap();
    store
        .start_handoff(&current, kcl_core::Holder::new("w-2", "t-9"))
        .await
        .unwrap();
    eo.commit(&mut cp, one_write(put(&sink, "a")), &record("100", 5))
        .await
        .unwrap();
    assert_eq!(
        store.get("shard-1").await.unwrap().unwrap().checkpoint,
        kcl_core::Checkpoint::at("100", 5)
    );
    assert_eq!(
        counting::counts(env.dynamodb(), &sink).await.unwrap()["a"],
        1
    );
}

#[tokio::test]
async fn a_second_commit_at_the_same_position_is_refused_so_it_cannot_apply_twice() {
    let (env, _store, mut cp, eo, sink) = held_lease_with_eo().await;
    eo.commit(&mut cp, one_write(put_add(&sink, "a")), &record("100", 2))
        .await
        .unwrap();
    let e = eo
        .commit(&mut cp, one_write(put_add(&sink, "a")), &record("100", 2))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            kcl::TransactionError::Checkpoint(kcl::CheckpointError::OutOfRange { .. })
        ),
        "{e}"
    );
    assert_eq!(
        counting::counts(env.dynamodb(), &sink).await.unwrap()["a"],
        1
    );
}

/// A transaction of the one write `item`.
fn one_write(item: aws_sdk_dynamodb::types::TransactWriteItem) -> kcl::Transaction {
    let mut tx = kcl::Transaction::new();
    tx.push(item).unwrap();
    tx
}

/// `ADD n 1` to `key`: applied twice, it shows.
fn put_add(table: &str, key: &str) -> aws_sdk_dynamodb::types::TransactWriteItem {
    use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
    TransactWriteItem::builder()
        .update(
            Update::builder()
                .table_name(table)
                .key(counting::KEY, AttributeValue::S(key.into()))
                .update_expression("ADD #n :one")
                .expression_attribute_names("#n", counting::COUNT)
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .build()
                .unwrap(),
        )
        .build()
}
