//! The `kcl` command against the emulators: listing every lease state (as
//! a table and as JSON), reset refused while held and forced, release
//! seen by a running worker, friendly errors, and `kcl consume` shared by
//! two processes, exactly once, resuming from its checkpoints.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use futures::StreamExt as _;
use kcl::core::{Checkpoint, Lease, LeaseStore};
use kcl::{
    Checkpointer, InitialPosition, ProcessorError, RecordBatch, RecordProcessor, ShardContext,
    Worker,
};
use kcl_dynamodb::DynamoDbLeaseStore;
use kcl_tests::e2e::signal;
use kcl_tests::{
    SentRecord, TestEnv, TestRecord, create_lease_table, create_stream, dynamodb_endpoint,
    put_records, unique_name,
};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const KCL: &str = env!("CARGO_BIN_EXE_kcl-for-tests");
const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

/// Runs `kcl args...` to completion with the test environment (plus
/// `env` overrides).
async fn kcl(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(KCL);
    cmd.args(args).kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("kcl {args:?} did not finish within 60s"))
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn failed(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit 1\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stderr)
}

fn lease(shard: &str, owner: Option<&str>, counter: u64, checkpoint: Checkpoint) -> Lease {
    let mut l = Lease::new(shard, checkpoint);
    l.owner = owner.map(str::to_owned);
    l.counter = counter;
    l
}

/// A lease table with one lease in each state a single listing can tell:
/// active (0), unowned (1), completed (2), handoff from w1 to w2 (3).
async fn table_in_every_state(env: &TestEnv) -> (String, DynamoDbLeaseStore) {
    let table = unique_name("kcl-cli");
    create_lease_table(env.dynamodb(), &table).await.unwrap();
    let store = DynamoDbLeaseStore::new(env.dynamodb().clone(), &table);
    let mut completed = lease("shardId-000000000002", Some("w1"), 11, Checkpoint::ShardEnd);
    completed.child_shard_ids = ["shardId-000000000003".to_owned()].into();
    let mut handoff = lease(
        "shardId-000000000003",
        Some("w2"),
        4,
        Checkpoint::TrimHorizon,
    )
    .with_parents(["shardId-000000000002"]);
    handoff.checkpoint_owner = Some("w1".into());
    for l in [
        lease(
            "shardId-000000000000",
            Some("w1"),
            5,
            Checkpoint::at(SEQ, 2),
        ),
        lease("shardId-000000000001", None, 3, Checkpoint::TrimHorizon),
        completed,
        handoff,
    ] {
        store.create_if_absent(&l).await.unwrap();
    }
    (table, store)
}

/// A free lease whose owner and handoff attributes are NULL (another
/// tool's None) reads as free, and a reset without `--force` takes it:
/// its condition took each NULL for present, so the reset retried, then
/// failed saying the lease kept changing.
#[tokio::test]
async fn a_reset_takes_a_lease_whose_owner_is_null_for_free() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (table, store) = table_in_every_state(&env).await;
    let key = "shardId-000000000001";
    let mut item = kcl_dynamodb::item::to_item(&store.get(key).await.unwrap().unwrap());
    for attribute in ["leaseOwner", "checkpointOwner"] {
        item.insert(attribute.into(), AttributeValue::Null(true));
    }
    env.dynamodb()
        .put_item()
        .table_name(&table)
        .set_item(Some(item))
        .send()
        .await
        .unwrap();
    let args = [
        "leases", "reset", "--table", &table, "--shard", key, "--to", "LATEST",
    ];
    ok(&kcl(&args, &[]).await);
    let reset = store.get(key).await.unwrap().unwrap();
    assert_eq!(reset.checkpoint, Checkpoint::Latest);
}

/// A listing into a closed pipe (`kcl leases | head -1`, the reader gone)
/// ends without a panic (exit status 101 before).
#[tokio::test]
async fn a_listing_into_a_closed_pipe_does_not_panic() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (table, _) = table_in_every_state(&env).await;
    for format in [None, Some("--json")] {
        let mut args = vec!["leases", "--table", &table];
        args.extend(format);
        let mut child = Command::new(KCL)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // The reader is gone before anything is written.
        drop(child.stdout.take());
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("kcl finishes")
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{format:?}: {}",
            text(&out.stderr)
        );
    }
}

/// `reset --all --force` over leases whose owners renew per lease (a Java
/// KCL fleet: each renewal bumps the counter) resets every one in a single
/// run: a lease that changed since the scan is read again and reset. Each
/// write was conditional on the scan alone, so every lease renewed after
/// it failed (and a second run rewound the others again).
#[tokio::test]
async fn a_forced_reset_of_every_shard_resets_leases_renewed_meanwhile() {
    const SHARDS: usize = 150;
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let table = unique_name("kcl-cli");
    create_lease_table(env.dynamodb(), &table).await.unwrap();
    let store = DynamoDbLeaseStore::new(env.dynamodb().clone(), &table);
    let keys: Vec<String> = (0..SHARDS).map(|i| format!("shardId-{i:012}")).collect();
    for key in &keys {
        let held = lease(key, Some("java-1"), 1, Checkpoint::at(SEQ, 0));
        store.create_if_absent(&held).await.unwrap();
    }
    let run = {
        let table = table.clone();
        tokio::spawn(async move {
            let args = [
                "leases",
                "reset",
                "--table",
                &table,
                "--all",
                "--to",
                "TRIM_HORIZON",
            ];
            kcl(&[&args[..], &["--force"]].concat(), &[]).await
        })
    };
    // Once the first shard is reset the scan is behind the command: the
    // owner renews every lease it still holds, once.
    let first_reset = async {
        while store.get(&keys[0]).await.unwrap().unwrap().checkpoint != Checkpoint::TrimHorizon
            && !run.is_finished()
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), first_reset)
        .await
        .expect("the command resets the first shard");
    let by = kcl::core::store::Holder {
        owner: "java-1",
        tenure: None,
    };
    // Many at once, so that most land while the command is still early
    // in its pass (it writes one lease at a time).
    let renewed = futures::stream::iter(&keys[1..])
        .map(|key| store.renew(key, by, 1))
        .buffer_unordered(16)
        .filter(|renewal| std::future::ready(renewal.is_ok()))
        .count()
        .await;
    ok(&run.await.unwrap());
    assert!(renewed > 0, "the command finished before any renewal");
    for key in &keys {
        let l = store.get(key).await.unwrap().unwrap();
        assert_eq!(
            (l.checkpoint, l.owner),
            (Checkpoint::TrimHorizon, None),
            "{key}"
        );
    }
}

#[tokio::test]
async fn lists_every_state_as_a_table_and_as_json() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (table, _) = table_in_every_state(&env).await;

    let listing = ok(&kcl(&["leases", "--table", &table], &[]).await);
    let line = |shard: &str| -> String {
        listing
            .lines()
            .find(|l| l.contains(shard))
            .unwrap_or_else(|| panic!("no row for {shard}:\n{listing}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        line("shardId-000000000000"),
        "- shardId-000000000000 w1 5 495903…588898/2 - active"
    );
    assert_eq!(
        line("shardId-000000000001"),
        "- shardId-000000000001 - 3 TRIM_HORIZON - unowned"
    );
    assert_eq!(
        line("shardId-000000000002 "),
        "- shardId-000000000002 w1 11 SHARD_END - completed"
    );
    assert_eq!(
        line("shardId-000000000003 "),
        "- shardId-000000000003 w2 4 TRIM_HORIZON shardId-000000000002 handoff (from w1)"
    );
    assert!(
        listing.contains("4 leases: 1 active, 0 expired, 1 in handoff, 1 unowned, 1 completed"),
        "{listing}"
    );
    // The per-worker summary: w1 owns shard 0 (its completed shard does
    // not count) and hands 3 over; w2 owns 3, awaiting it.
    let summary: Vec<String> = listing
        .lines()
        .skip_while(|l| !l.starts_with("WORKER"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .take(3)
        .collect();
    assert_eq!(
        summary,
        [
            "WORKER LEASES HANDOFFS IN HANDOFFS OUT EXPIRED",
            "w1 1 0 1 0",
            "w2 1 1 0 0"
        ]
    );

    let json: Value =
        serde_json::from_str(&ok(
            &kcl(&["leases", "--table", &table, "--json"], &[]).await
        ))
        .unwrap();
    assert_eq!(json["table"], table.as_str());
    let read_at = json["read_at"].as_str().unwrap();
    assert!(
        aws_sdk_dynamodb::primitives::DateTime::from_str(
            read_at,
            aws_sdk_dynamodb::primitives::DateTimeFormat::DateTime
        )
        .is_ok(),
        "read_at {read_at:?} is RFC 3339"
    );
    let leases = json["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 4);
    assert!(
        leases.iter().all(|l| l.get("stream").is_none()),
        "a single-stream table's leases name no stream: {leases:?}"
    );
    let by_shard: HashMap<&str, &Value> = leases
        .iter()
        .map(|l| (l["shard"].as_str().unwrap(), l))
        .collect();
    let l0 = by_shard["shardId-000000000000"];
    assert_eq!(l0["owner"], "w1");
    assert_eq!(l0["counter"], 5);
    assert_eq!(l0["checkpoint"], SEQ);
    assert_eq!(l0["sub_sequence"], 2);
    assert_eq!(l0["state"], "active");
    assert_eq!(l0["key"], "shardId-000000000000");
    assert_eq!(l0["stream"], Value::Null);
    let l1 = by_shard["shardId-000000000001"];
    assert_eq!(
        (&l1["owner"], &l1["state"]),
        (&Value::Null, &"unowned".into())
    );
    let l2 = by_shard["shardId-000000000002"];
    assert_eq!(l2["state"], "completed");
    assert_eq!(l2["children"], serde_json::json!(["shardId-000000000003"]));
    let l3 = by_shard["shardId-000000000003"];
    assert_eq!(l3["state"], "handoff");
    assert_eq!(l3["handoff_from"], "w1");
    assert_eq!(l3["owner"], "w2");
    assert_eq!(l3["parents"], serde_json::json!(["shardId-000000000002"]));
    assert_eq!(
        json["totals"],
        serde_json::json!({"leases": 4, "active": 1, "expired": 0, "handoff": 1, "unowned": 1, "completed": 1})
    );
    assert_eq!(
        json["workers"],
        serde_json::json!([
            {"worker": "w1", "leases": 1, "handoffs_in": 0, "handoffs_out": 1, "expired": 0},
            {"worker": "w2", "leases": 1, "handoffs_in": 1, "handoffs_out": 0, "expired": 0},
        ])
    );
}

#[tokio::test]
async fn reset_is_refused_while_held_and_done_with_force() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (table, store) = table_in_every_state(&env).await;
    // `kcl leases reset` of one shard of the table.
    let reset = |shard: &'static str, to: &'static str, force: bool| {
        let table = table.clone();
        async move {
            let mut args = vec![
                "leases", "reset", "--table", &table, "--shard", shard, "--to", to,
            ];
            if force {
                args.push("--force");
            }
            kcl(&args, &[]).await
        }
    };
    let get = |key: &'static str| {
        let store = store.clone();
        async move { store.get(key).await.unwrap().unwrap() }
    };

    // Held: refused, nothing written.
    let err = failed(&reset("shardId-000000000000", "TRIM_HORIZON", false).await);
    assert!(
        err.contains("held by w1") && err.contains("--force"),
        "{err}"
    );
    let l0 = get("shardId-000000000000").await;
    assert_eq!((l0.counter, &l0.checkpoint), (5, &Checkpoint::at(SEQ, 2)));

    // In a handoff, or completed: refused too.
    let err = failed(&reset("shardId-000000000003", "LATEST", false).await);
    assert!(err.contains("handoff from w1 to w2"), "{err}");
    let err = failed(&reset("shardId-000000000002", "LATEST", false).await);
    assert!(err.contains("completed"), "{err}");

    // Unowned, to a sequence number: checked against the shard first. The
    // table records no stream it serves (no worker started), so the stream
    // is asked for; one of another shard, or of none, is refused.
    let err = failed(&reset("shardId-000000000001", "1234/5", false).await);
    assert!(err.contains("add --stream"), "{err}");
    let stream = unique_name("kcl-cli-reset");
    create_stream(env.kinesis(), &stream, 2).await.unwrap();
    let seq = put_to_second_shard(&env, &stream).await;
    let to_seq = |to: String| {
        let (table, stream) = (table.clone(), stream.clone());
        async move {
            let shard = "shardId-000000000001";
            let args = ["leases", "reset", "--table", &table, "--shard", shard];
            let args = [&args[..], &["--stream", &stream, "--to", &to]].concat();
            kcl(&args, &[]).await
        }
    };
    let err = failed(&to_seq("1234/5".into()).await);
    assert!(
        err.contains("Kinesis starts no read of shard shardId-000000000001"),
        "{err}"
    );
    assert_eq!(get("shardId-000000000001").await.counter, 3, "written");
    // Of the shard: done, with its sub-sequence, the counter bumped.
    let out = ok(&to_seq(format!("{seq}/5")).await);
    assert!(out.contains("reset shard shardId-000000000001"), "{out}");
    let l1 = get("shardId-000000000001").await;
    assert_eq!(
        (l1.counter, &l1.checkpoint, &l1.owner),
        (4, &Checkpoint::at(&seq, 5), &None)
    );
    // Once a worker has recorded the stream the table serves, no --stream;
    // recorded as created at another time (deleted and created again since),
    // the number is refused: it is not of the stream the leases are of.
    let workers = kcl_dynamodb::table::workers_table_for(&table);
    kcl_dynamodb::ensure_workers_table(env.dynamodb(), &workers, kcl_dynamodb::Capacity::OnDemand)
        .await
        .unwrap();
    let shard = "shardId-000000000001";
    let to = format!("{seq}/6");
    let no_stream = [
        "leases", "reset", "--table", &table, "--shard", shard, "--to", &to,
    ];
    let created = env
        .kinesis()
        .describe_stream_summary()
        .stream_name(&stream)
        .send()
        .await
        .unwrap()
        .stream_description_summary()
        .unwrap()
        .stream_creation_timestamp()
        .secs();
    for (epoch, accepted) in [(created - 3600, false), (created, true)] {
        serve(
            &env,
            &workers,
            &table,
            &format!("000000000000:{stream}:{epoch}"),
        )
        .await;
        let out = kcl(&no_stream, &[]).await;
        if accepted {
            ok(&out);
        } else {
            let err = failed(&out);
            assert!(err.contains("deleted and created again"), "{err}");
            // A key's time the Java KCL took unchecked: --force goes on.
            let forced = ok(&kcl(&[&no_stream[..], &["--force"]].concat(), &[]).await);
            assert!(forced.contains("checking in it as it is"), "{forced}");
        }
    }
    assert_eq!(get(shard).await.checkpoint, Checkpoint::at(&seq, 6));
    // Another stream named is refused, a sentinel for every shard too.
    let other = [
        "leases", "reset", "--table", &table, "--all", "--stream", "payments",
    ];
    let err = failed(&kcl(&[&other[..], &["--to", "TRIM_HORIZON"]].concat(), &[]).await);
    assert!(err.contains(&format!("serves stream {stream}")), "{err}");

    // Held, with --force: the owner is evicted in the same write.
    let out = ok(&reset("shardId-000000000000", "LATEST", true).await);
    assert!(out.contains("evicted w1"), "{out}");
    let l0 = get("shardId-000000000000").await;
    assert_eq!(
        (l0.counter, &l0.checkpoint, &l0.owner),
        (6, &Checkpoint::Latest, &None)
    );

    // A handoff, forced: both owners evicted.
    ok(&reset("shardId-000000000003", "TRIM_HORIZON", true).await);
    let l3 = get("shardId-000000000003").await;
    assert_eq!((&l3.owner, &l3.checkpoint_owner), (&None, &None));

    // AT_TIMESTAMP: the workers' own time, as the command says.
    let out = ok(&reset("shardId-000000000000", "AT_TIMESTAMP", false).await);
    assert!(out.contains("AT_TIMESTAMP stores no time"), "{out}");
    assert_eq!(
        get("shardId-000000000000").await.checkpoint,
        Checkpoint::AtTimestamp
    );

    // Unknown shard, bad position.
    let err = failed(&reset("shardId-9", "LATEST", false).await);
    assert!(err.contains("no lease for shard shardId-9"), "{err}");
    let out = reset("shardId-000000000001", "EARLIEST", false).await;
    assert_eq!(
        out.status.code(),
        Some(2),
        "usage error: {}",
        text(&out.stderr)
    );
}

/// A `--stream` the table's stream record cannot be read to check (the
/// workers table answers 500s) is refused, not gone by: the table could
/// serve another stream, whose shards `reset --all` would rewind.
#[tokio::test]
async fn a_stream_that_cannot_be_checked_against_the_table_is_refused() {
    use kcl_tests::fault_proxy::{FaultProxy, Faults};
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (table, store) = table_in_every_state(&env).await;
    let workers = kcl_dynamodb::table::workers_table_for(&table);
    kcl_dynamodb::ensure_workers_table(env.dynamodb(), &workers, kcl_dynamodb::Capacity::OnDemand)
        .await
        .unwrap();
    serve(&env, &workers, &table, "000000000000:orders:1700000000").await;
    let proxy = FaultProxy::start(&dynamodb_endpoint(), Faults::OUTAGE, 6)
        .await
        .unwrap();
    proxy.set_only(Some("GetItem"));
    let rewind = [
        "leases", "reset", "--table", &table, "--all", "--stream", "payments", "--to", "LATEST",
        "--force",
    ];
    let err = failed(&kcl(&rewind, &[("AWS_ENDPOINT_URL_DYNAMODB", &proxy.url())]).await);
    assert!(err.contains("reading the stream table"), "{err}");
    let l1 = store.get("shardId-000000000001").await.unwrap().unwrap();
    assert_eq!(l1.checkpoint, Checkpoint::TrimHorizon, "nothing rewound");
}

/// Records, as a single-stream table's first worker does, that `table`
/// serves the stream of `identifier` (replacing any earlier record).
async fn serve(env: &TestEnv, workers: &str, table: &str, identifier: &str) {
    env.dynamodb()
        .delete_item()
        .table_name(workers)
        .key(
            "instance",
            aws_sdk_dynamodb::types::AttributeValue::S(
                kcl_dynamodb::table::STREAM_CLAIM_KEY.into(),
            ),
        )
        .send()
        .await
        .unwrap();
    kcl_dynamodb::claim_stream(env.dynamodb(), table, workers, identifier)
        .await
        .unwrap();
}

/// Writes one record to `stream`'s second shard (the upper half of the
/// hash range, of a stream of two shards); its sequence number.
async fn put_to_second_shard(env: &TestEnv, stream: &str) -> String {
    let put = env
        .kinesis()
        .put_record()
        .stream_name(stream)
        .partition_key("k")
        .explicit_hash_key("340282366920938463463374607431768211455")
        .data(aws_sdk_kinesis::primitives::Blob::new("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(put.shard_id(), "shardId-000000000001");
    put.sequence_number().to_owned()
}

#[tokio::test]
async fn friendly_errors_for_a_missing_table_and_an_unreachable_endpoint() {
    let _env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let missing = unique_name("kcl-cli-missing");
    let err = failed(&kcl(&["leases", "--app", &missing], &[]).await);
    assert!(
        err.contains(&format!("table {missing} not found"))
            && err.contains("is --app right?")
            && err.contains("create the lease table on their first start"),
        "{err}"
    );
    let err = failed(&kcl(&["leases", "watch", "--table", &missing], &[]).await);
    assert!(err.contains("is --table right?"), "{err}");

    // A loopback port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let endpoint = format!("http://127.0.0.1:{closed}");
    let started = Instant::now();
    let err = failed(
        &kcl(
            &["leases", "--app", "anything"],
            &[("AWS_ENDPOINT_URL_DYNAMODB", &endpoint)],
        )
        .await,
    );
    assert!(
        err.contains(&format!("cannot reach DynamoDB at {endpoint}"))
            && err.contains("AWS_ENDPOINT_URL_DYNAMODB"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// An instance-metadata endpoint that answers 403 to everything, as where
/// IMDS is disabled; returns its URL. Lives as long as the runtime.
async fn forbidden_metadata_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(
                        b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    )
                    .await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credentials_end_in_one_actionable_line_and_the_sdk_chain_shows_with_v() {
    let imds = forbidden_metadata_endpoint().await;
    let run = |verbose: bool| {
        let imds = imds.clone();
        async move {
            let mut cmd = Command::new(KCL);
            cmd.args(["leases", "--app", "anything"]).kill_on_drop(true);
            if verbose {
                cmd.arg("-v");
            }
            // No credentials anywhere but the (forbidden) metadata service.
            for var in [
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN",
                "AWS_PROFILE",
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONFIG_FILE",
                "AWS_SHARED_CREDENTIALS_FILE",
                "RUST_LOG",
            ] {
                cmd.env_remove(var);
            }
            // A home without ~/.aws.
            let home = std::env::temp_dir().join(unique_name("kcl-cli-home"));
            std::fs::create_dir_all(&home).unwrap();
            cmd.env("HOME", &home)
                .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", &imds)
                .env("AWS_REGION", "us-east-1");
            tokio::time::timeout(Duration::from_secs(60), cmd.output())
                .await
                .unwrap()
                .unwrap()
        }
    };
    let err = failed(&run(false).await);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("no AWS credentials found"), "{err}");
    assert!(err.contains("-v shows the SDK's error"), "{err}");
    assert!(!err.contains("WARN") && !err.contains("IMDS"), "{err}");
    assert!(err.len() < 400, "{} bytes: {err}", err.len());
    let verbose = failed(&run(true).await);
    assert!(
        verbose.contains("no AWS credentials found") && verbose.contains("IMDS session token"),
        "-v shows the SDK's chain: {verbose}"
    );
}

/// Checkpoints every batch.
struct Quiet;

#[kcl::async_trait]
impl RecordProcessor for Quiet {
    async fn process_records(
        &mut self,
        _: &RecordBatch,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        checkpointer.checkpoint().await?;
        Ok(())
    }
}

/// `kcl leases release` of one shard of `app`: what it printed.
async fn release(app: &str, shard: &str) -> String {
    ok(&kcl(&["leases", "release", "--app", app, "--shard", shard], &[]).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_taken_again_within_a_tick() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let stream = unique_name("kcl-cli-release");
    let app = unique_name("kcl-cli-release-app");
    create_stream(env.kinesis(), &stream, 2).await.unwrap();
    let worker = Worker::builder(&app)
        .stream(&stream)
        .sdk_config(env.sdk_config())
        .worker_id("w-release")
        .initial_position(InitialPosition::TrimHorizon)
        .lease_duration(Duration::from_secs(6))
        .taker_interval(Duration::from_secs(1))
        .idle_time_between_reads(Duration::from_millis(200))
        .processor(|_: &ShardContext| Quiet)
        .build()
        .unwrap();
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    let deadline = Instant::now() + Duration::from_secs(30);
    while handle.status().consuming.len() < 2 {
        assert!(Instant::now() < deadline, "{:?}", handle.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = handle.status().leases;

    let out = release(&app, "shardId-000000000000").await;
    assert!(
        out.contains("released shard shardId-000000000000 (owner was w-release"),
        "{out}"
    );
    let released = Instant::now();
    // The worker takes it back at its next tick (1 s +/- 25%), whether
    // its renewer noticed the loss first (every 2 s) or not: either way
    // the shard's consumer restarts from the checkpoint.
    loop {
        let status = handle.status();
        if status.leases.taken > before.taken && status.consuming.len() == 2 {
            break;
        }
        // A guard against a hang, far past the tick: the time is printed.
        assert!(
            released.elapsed() < Duration::from_secs(30),
            "not taken again: before {before:?}, now {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let json: Value =
        serde_json::from_str(&ok(&kcl(&["leases", "--app", &app, "--json"], &[]).await)).unwrap();
    let owners: Vec<&Value> = json["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| &l["owner"])
        .collect();
    assert_eq!(
        owners,
        [&Value::from("w-release"), &Value::from("w-release")]
    );

    // Releasing an unowned lease is a no-op that says so.
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let out = release(&app, "shardId-000000000001").await;
    assert!(out.contains("not owned by any worker"), "{out}");
}

// ---------------------------------------------------------------------------
// kcl consume
// ---------------------------------------------------------------------------

const KEYS: u32 = 8;

/// A `kcl consume` process writing to files.
struct Consumer {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Consumer {
    fn spawn(dir: &Path, id: &str, app: &str, stream: &str, extra: &[&str]) -> Consumer {
        let stdout = dir.join(format!("{id}.jsonl"));
        let stderr = dir.join(format!("{id}.log"));
        let child = Command::new(KCL)
            .args([
                "consume",
                "--app",
                app,
                "--stream",
                stream,
                "--position",
                "TRIM_HORIZON",
                "--worker-id",
                id,
                "--lease-duration",
                "6s",
                "--taker-interval",
                "1s",
                "--idle-time-between-reads",
                "200ms",
                "--shutdown-timeout",
                "10s",
            ])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Consumer {
            child,
            stdout,
            stderr,
        }
    }

    fn lines(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.stdout).unwrap_or_default();
        // A line being written may be incomplete; complete lines parse.
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// SIGTERM, then a clean exit within `within`.
    async fn terminate(mut self, within: Duration) -> Vec<Value> {
        signal(&self.child, "-TERM").unwrap();
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("not stopped within {within:?} of SIGTERM"))
            .unwrap();
        let log = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        assert!(status.success(), "exit {status:?}; stderr:\n{log}");
        self.lines()
    }
}

/// Owners of the app's leases, through `kcl leases --json`, once no lease
/// is unowned or in a handoff.
async fn settled_owners(app: &str) -> Option<BTreeMap<String, usize>> {
    let out = kcl(&["leases", "--app", app, "--json"], &[]).await;
    if !out.status.success() {
        return None; // the table is not there yet
    }
    let json: Value = serde_json::from_str(&text(&out.stdout)).ok()?;
    let leases = json["leases"].as_array()?;
    if leases.is_empty() || leases.iter().any(|l| l["state"] != "active") {
        return None;
    }
    let mut owners = BTreeMap::new();
    for l in leases {
        *owners.entry(l["owner"].as_str()?.to_owned()).or_default() += 1;
    }
    Some(owners)
}

/// Waits until both copies hold leases, none in a handoff.
async fn balanced(app: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let owners = settled_owners(app).await;
        if owners.as_ref().is_some_and(|o| o.len() == 2) {
            return;
        }
        assert!(Instant::now() < deadline, "not balanced: {owners:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn records(from: u64, to: u64) -> Vec<TestRecord> {
    (from..to)
        .flat_map(|counter| (0..KEYS).map(move |key| TestRecord { key, counter }))
        .collect()
}

/// Checks the lines of both copies against what was sent: every record
/// exactly once, with the right fields.
fn exactly_once(lines: &[Value], sent: &[SentRecord], stream: &str) {
    let by_payload: HashMap<String, &SentRecord> =
        sent.iter().map(|s| (s.record.payload(), s)).collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for line in lines {
        let data = line["data"].as_str().unwrap().to_owned();
        let s = by_payload
            .get(&data)
            .unwrap_or_else(|| panic!("a record that was not produced now: {line}"));
        assert_eq!(line["stream"], stream);
        assert_eq!(line["shard"], s.shard_id.as_str(), "{line}");
        assert_eq!(line["sequence"], s.sequence_number.as_str(), "{line}");
        assert_eq!(line["sub_sequence"], 0);
        assert_eq!(line["partition_key"], s.record.partition_key().as_str());
        assert_eq!(line["data_encoding"], "utf-8");
        assert!(
            line["arrival"].as_str().is_some_and(|a| a.ends_with('Z')),
            "{line}"
        );
        *seen.entry(data).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "printed more than once: {twice:?}");
    let missing: Vec<_> = by_payload
        .keys()
        .filter(|p| !seen.contains_key(*p))
        .collect();
    assert!(missing.is_empty(), "never printed: {missing:?}");
}

async fn wait_for_lines(copies: &[&Consumer], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: usize = copies.iter().map(|c| c.lines().len()).sum();
        if got >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{got} of {n} lines");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A fresh `shards`-shard stream, its application's name and a scratch
/// directory, each named from `name`.
async fn stream_app_dir(env: &TestEnv, name: &str, shards: i32) -> (String, String, PathBuf) {
    let stream = unique_name(name);
    let app = unique_name(&format!("{name}-app"));
    create_stream(env.kinesis(), &stream, shards).await.unwrap();
    let dir = std::env::temp_dir().join(unique_name(name));
    std::fs::create_dir_all(&dir).unwrap();
    (stream, app, dir)
}

/// Stops both copies (SIGTERM, 30 s each); the lines they printed.
async fn terminate_both(a: Consumer, b: Consumer) -> Vec<Value> {
    let mut lines = a.terminate(Duration::from_secs(30)).await;
    lines.extend(b.terminate(Duration::from_secs(30)).await);
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_share_a_stream_exactly_once_and_resume() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (stream, app, dir) = stream_app_dir(&env, "kcl-cli-consume", 4).await;

    // Round 1: both copies share the shards, then the records come.
    let a = Consumer::spawn(&dir, "c1", &app, &stream, &[]);
    let b = Consumer::spawn(&dir, "c2", &app, &stream, &[]);
    balanced(&app).await;
    let first = put_records(env.kinesis(), &stream, &records(0, 10))
        .await
        .unwrap();
    wait_for_lines(&[&a, &b], first.len()).await;
    let lines = terminate_both(a, b).await;
    exactly_once(&lines, &first, &stream);

    // Round 2: more records while stopped; restarted copies print only
    // those, from their checkpoints.
    let second = put_records(env.kinesis(), &stream, &records(10, 20))
        .await
        .unwrap();
    let a = Consumer::spawn(&dir, "c1-again", &app, &stream, &[]);
    let b = Consumer::spawn(&dir, "c2-again", &app, &stream, &[]);
    wait_for_lines(&[&a, &b], second.len()).await;
    // Let the second copy get its share (handoffs drain gracefully), and
    // make sure nothing old shows up meanwhile.
    balanced(&app).await;
    let lines = terminate_both(a, b).await;
    exactly_once(&lines, &second, &stream);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The checkpoint of every lease of `app`, by shard, read directly.
async fn checkpoints(env: &TestEnv, app: &str) -> BTreeMap<String, String> {
    let items = env
        .dynamodb()
        .scan()
        .table_name(app)
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    items
        .items()
        .iter()
        .map(|i| {
            (
                i["leaseKey"].as_s().unwrap().clone(),
                i["checkpoint"].as_s().unwrap().clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_all_rewinds_a_running_application_and_a_dry_run_writes_nothing() {
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (stream, app, dir) = stream_app_dir(&env, "kcl-cli-reset-all", 2).await;
    let c = Consumer::spawn(&dir, "r1", &app, &stream, &["--meta"]);
    let sent = put_records(env.kinesis(), &stream, &records(0, 5))
        .await
        .unwrap();
    wait_for_lines(&[&c], sent.len()).await;
    // Both leases checkpointed past the start (`kcl consume` checkpoints
    // each batch).
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        let cps = checkpoints(&env, &app).await;
        if cps.len() == 2
            && cps
                .values()
                .all(|cp| cp.bytes().all(|b| b.is_ascii_digit()))
        {
            break cps;
        }
        assert!(Instant::now() < deadline, "never checkpointed: {cps:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Held by a running worker: refused as a whole, nothing written.
    let args = [
        "leases",
        "reset",
        "--app",
        &app,
        "--all",
        "--to",
        "TRIM_HORIZON",
    ];
    let refused = kcl(&args, &[]).await;
    assert!(!refused.status.success());
    let why = text(&refused.stderr);
    assert!(
        why.contains("refusing to reset 2 of 2 shards, so nothing was written")
            && why.contains("held by r1"),
        "{why}"
    );
    // A dry run with --force says what it would do and writes nothing.
    let dry = ok(&kcl(&[&args[..], &["--force", "--dry-run"]].concat(), &[]).await);
    assert_eq!(
        dry.lines()
            .filter(|l| l.starts_with("would reset shard"))
            .count(),
        2,
        "{dry}"
    );
    assert!(
        dry.contains("evicting r1") && dry.contains("nothing was written"),
        "{dry}"
    );
    let after_dry = checkpoints(&env, &app).await;
    assert_eq!(
        after_dry.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    assert!(
        after_dry.values().all(|cp| cp != "TRIM_HORIZON"),
        "{after_dry:?}"
    );

    // The real thing: both rewound in one command, the worker evicted; it
    // takes the shards again and reads them from the start.
    let done = ok(&kcl(&[&args[..], &["--force"]].concat(), &[]).await);
    assert_eq!(
        done.lines()
            .filter(|l| l.starts_with("reset shard"))
            .count(),
        2,
        "{done}"
    );
    wait_for_lines(&[&c], 2 * sent.len()).await;
    let lines = c.terminate(Duration::from_secs(30)).await;
    // --meta: every line says who processed it, in which tenure, and when.
    for l in &lines {
        assert_eq!(l["worker"], "r1", "{l}");
        assert!(l["tenure"].as_str().is_some_and(|t| !t.is_empty()), "{l}");
        assert!(
            l["processed_at"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{l}"
        );
    }
    let tenures: HashSet<&str> = lines.iter().filter_map(|l| l["tenure"].as_str()).collect();
    assert!(
        tenures.len() >= 3,
        "the rewind started new tenures: {tenures:?}"
    );
    let mut seen: HashMap<String, usize> = HashMap::new();
    for l in &lines {
        *seen
            .entry(l["data"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert!(
        sent.iter()
            .all(|s| seen.get(&s.record.payload()).copied().unwrap_or(0) >= 2),
        "every record read again after the rewind: {seen:?}"
    );
}

/// Ctrl-C quits `watch` while a refresh waits on a table that stopped
/// answering: it was seen only between refreshes, so the command held on
/// for each call's 30 s bound, one call after another.
#[tokio::test]
async fn ctrl_c_quits_watch_while_a_refresh_waits_on_the_table() {
    use kcl_tests::fault_proxy::{FaultProxy, Faults};
    use tokio::io::AsyncBufReadExt as _;
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (table, _) = table_in_every_state(&env).await;
    let proxy = FaultProxy::start(&dynamodb_endpoint(), Faults::NONE, 5)
        .await
        .unwrap();
    let mut child = Command::new(KCL)
        .args(["leases", "watch", "--table", &table, "--interval", "100ms"])
        .env("AWS_ENDPOINT_URL_DYNAMODB", proxy.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The first screen painted, the table stops answering.
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first_screen = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("Owner changes") {
                return;
            }
        }
        panic!("watch ended before its first screen");
    };
    tokio::time::timeout(Duration::from_secs(60), first_screen)
        .await
        .expect("the first screen");
    proxy.set_blackhole_all();
    let swallowed = async {
        while proxy.counts().blackholed == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), swallowed)
        .await
        .expect("the next refresh calls the table");
    signal(&child, "-INT").unwrap();
    // Far inside the 30 s one unanswered call took before.
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("watch quits on Ctrl-C during a refresh")
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// A refresh whose read of the liveness records fails says so on the
/// screen: it was dropped without a word, and leases renewed through their
/// holders' records (their counters still) showed expired, the header
/// blaming the lack of any record.
#[tokio::test]
async fn watch_says_when_the_liveness_records_cannot_be_read() {
    use kcl_tests::fault_proxy::{FaultProxy, Faults};
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (table, _) = table_in_every_state(&env).await;
    let proxy = FaultProxy::start(&dynamodb_endpoint(), Faults::OUTAGE, 5)
        .await
        .unwrap();
    // Scans fail (the records' and the leases'); the table is described.
    proxy.set_only(Some("Scan"));
    let watch = ["leases", "watch", "--table", &table, "--count", "1"];
    let out = kcl(&watch, &[("AWS_ENDPOINT_URL_DYNAMODB", &proxy.url())]).await;
    let screen = text(&out.stdout);
    assert!(
        screen.contains("reading the liveness records failed"),
        "{screen}\n{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_throttling_shows_at_warn_once_per_interval() {
    use kcl_tests::fault_proxy::{FaultProxy, Faults};
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let (stream, app, dir) = stream_app_dir(&env, "kcl-cli-throttled", 1).await;
    let upstream = dynamodb_endpoint();
    let proxy = FaultProxy::start(
        &upstream,
        Faults {
            throttle: 0.6,
            ..Faults::NONE
        },
        23,
    )
    .await
    .unwrap();
    let stderr = dir.join("stderr.log");
    // The default log level (no RUST_LOG, no -v): what an operator sees.
    let mut child = Command::new(KCL)
        .args([
            "consume",
            "--app",
            &app,
            "--stream",
            &stream,
            "--position",
            "TRIM_HORIZON",
            "--lease-duration",
            "6s",
            "--taker-interval",
            "1s",
        ])
        .env_remove("RUST_LOG")
        .env("AWS_ENDPOINT_URL_DYNAMODB", proxy.url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = Instant::now();
    let warning = "the lease table is throttling";
    loop {
        let log = std::fs::read_to_string(&stderr).unwrap_or_default();
        if log.contains(warning) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no warning after 60 s of throttling ({} throttled): {log}",
            proxy.counts().throttles
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    child.kill().await.unwrap();
    let log = std::fs::read_to_string(&stderr).unwrap_or_default();
    let warnings = log.lines().filter(|l| l.contains(warning)).count();
    let throttled = proxy.counts().throttles;
    let allowed = started.elapsed().as_secs() / 30 + 1;
    assert!(
        warnings as u64 <= allowed,
        "{warnings} warnings in {:?} for {throttled} throttled calls: rate-limited to one per 30 s",
        started.elapsed()
    );
    assert!(
        throttled > warnings as u64,
        "{throttled} throttled, {warnings} warnings"
    );
}

#[tokio::test]
async fn a_renew_interval_too_long_for_the_lease_is_refused_naming_it() {
    let _env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let out = kcl(
        &[
            "consume",
            "--app",
            "anything",
            "--stream",
            "anything",
            "--lease-duration",
            "6s",
            "--renew-interval",
            "6s",
        ],
        &[],
    )
    .await;
    let err = failed(&out);
    assert!(
        err.contains("renew_interval") && err.contains("6s"),
        "{err}"
    );
}

/// One listing judges each lease by its holder's liveness record (alive,
/// stale, or no record to judge by), and `watch` takes the lease duration
/// the records give instead of being told it.
#[tokio::test]
async fn one_listing_shows_each_holders_liveness_and_watch_learns_the_lease_duration() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use kcl::core::store::BeatUpdate;

    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let table = unique_name("kcl-cli-live");
    create_lease_table(env.dynamodb(), &table).await.unwrap();
    let workers = kcl_dynamodb::table::workers_table_for(&table);
    kcl_dynamodb::ensure_workers_table(env.dynamodb(), &workers, kcl_dynamodb::Capacity::OnDemand)
        .await
        .unwrap();
    let store = DynamoDbLeaseStore::new(env.dynamodb().clone(), &table);
    let held = |shard: &str, worker: &str, tenure: &str| {
        let mut l = lease(shard, Some(worker), 3, Checkpoint::TrimHorizon);
        l.tenure = Some(tenure.to_owned());
        l
    };
    for l in [
        held("shardId-000000000000", "w-live", "inst-live.1"),
        held("shardId-000000000001", "w-gone", "inst-gone.1"),
        held("shardId-000000000002", "w-per-lease", "inst-unknown.1"),
    ] {
        store.create_if_absent(&l).await.unwrap();
    }
    store
        .beat(&BeatUpdate {
            instance: "inst-live",
            worker: "w-live",
            held: 1,
            changes: 0,
            answered: &[],
            stopping: false,
            lease_duration: Duration::from_secs(60),
            beat_interval: Duration::from_secs(5),
            per_lease: false,
        })
        .await
        .unwrap();
    // A record last written an hour ago, as a crashed worker leaves it
    // (both margins far from anything a busy machine could add).
    let an_hour_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        - 3_600_000;
    let n = |v: u128| AttributeValue::N(v.to_string());
    env.dynamodb()
        .put_item()
        .table_name(&workers)
        .item("instance", AttributeValue::S("inst-gone".into()))
        .item("workerId", AttributeValue::S("w-gone".into()))
        .item("beat", n(40))
        .item("d", n(60_000))
        .item("t", n(an_hour_ago))
        .send()
        .await
        .unwrap();

    let json: Value =
        serde_json::from_str(&ok(
            &kcl(&["leases", "--table", &table, "--json"], &[]).await
        ))
        .unwrap();
    let by_shard: HashMap<&str, &Value> = json["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["shard"].as_str().unwrap(), l))
        .collect();
    let live = &by_shard["shardId-000000000000"];
    assert_eq!(live["state"], "active");
    assert_eq!(live["liveness"]["instance"], "inst-live");
    assert_eq!(live["liveness"]["alive"], true);
    assert_eq!(live["liveness"]["lease_duration_ms"], 60_000);
    let gone = &by_shard["shardId-000000000001"];
    assert_eq!(gone["state"], "expired", "{gone}");
    assert_eq!(gone["liveness"]["alive"], false);
    assert!(gone["liveness"]["last_beat_ms_ago"].as_u64().unwrap() >= 3_600_000);
    let unjudged = &by_shard["shardId-000000000002"];
    assert_eq!(unjudged["state"], "active");
    assert!(
        unjudged.get("liveness").is_none(),
        "no record for its instance, nothing to judge by: {unjudged}"
    );
    assert_eq!(json["totals"]["expired"], 1);

    let listing = ok(&kcl(&["leases", "--table", &table], &[]).await);
    assert!(listing.contains("LAST BEAT"), "{listing}");

    let watch = [
        "leases",
        "watch",
        "--table",
        &table,
        "--count",
        "1",
        "--interval",
        "100ms",
    ];
    let screen = ok(&kcl(&watch, &[]).await);
    assert!(
        screen.contains(
            "counter unchanged for 60s, the lease duration from the workers' liveness records"
        ),
        "{screen}"
    );
    let told = ok(&kcl(&[&watch[..], &["--lease-duration", "30s"]].concat(), &[]).await);
    assert!(
        told.contains("counter unchanged for 30s, the lease duration from --lease-duration"),
        "{told}"
    );
}
