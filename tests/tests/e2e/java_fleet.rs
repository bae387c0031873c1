//! kcl and the real Java KCL 3.1.3 on one lease table (kcl renewing per
//! lease, the Java-compatible mode): a mixed fleet that shares the shards
//! by graceful handoffs in both directions, and the one-restart move from
//! either library to the other, across a split; and kcl's load figures
//! (`throughputKBps` on the lease items) read by the Java worker without
//! error. The Java worker is
//! `tests/java/KclJavaWorker.java` (polling, metrics off), compiled at
//! test time against the jars `localstack/install` fetched.
//!
//! Every worker checkpoints only in `shutdown_requested` (and at shard
//! end): a shard that moves between workers any other way than by a
//! completed graceful handoff, or that resumes anywhere but exactly after
//! the last checkpoint, repeats records, and the verdict counts them.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_tests::e2e::{
    BatchLog, CheckpointMode, KEYS, Producer, Scenario, Verdict, WorkerProcess,
    WorkerProcessConfig, out_dir, process_stats, read_logs, stat, verify, wait_complete,
};
use kcl_tests::java_kcl::JavaKcl;
use kcl_tests::{list_all_shards, split_shard_in_half};
use tokio::time::Instant;

use crate::E2E_WORKER;

const SHARDS: i32 = 4;
/// A Java worker on a fresh lease table waits up to 30 s for another to
/// create the leases, syncs shards, creates its own tables and index, and
/// only then runs its leader's first assignment: one to two minutes here.
const JAVA_START: Duration = Duration::from_secs(240);
/// How long the shards may take to spread once both libraries run: kcl
/// steals one lease per taker tick (2 s here), each a graceful handoff
/// the Java worker completes in a few seconds.
const SPREAD: Duration = Duration::from_secs(90);

/// The kcl side of a mixed fleet: per-lease renewal, the mode a table
/// shared with the Java KCL needs.
fn kcl_processes(s: &Scenario, out: &Path) -> WorkerProcessConfig {
    let mut cfg = s.processes(E2E_WORKER, out, CheckpointMode::OnShutdown);
    cfg.extra_env
        .push(("KCL_E2E_RENEWAL".into(), "per-lease".into()));
    cfg
}

/// What each test here starts from: the Java KCL worker ready to run, a
/// stream of `shards` shards, and kcl's worker processes logging their
/// batches into `out_dir(name)`.
async fn mixed_fleet(shards: i32, name: &str) -> (JavaKcl, Scenario, PathBuf, WorkerProcessConfig) {
    let java = JavaKcl::prepare().unwrap_or_else(|e| panic!("{e:#}"));
    let s = Scenario::new(shards).await;
    let out = out_dir(name);
    let cfg = kcl_processes(&s, &out);
    (java, s, out, cfg)
}

fn owner_counts(owners: &[Option<String>]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for o in owners.iter().flatten() {
        *m.entry(o.clone()).or_default() += 1;
    }
    m
}

/// Waits until the unfinished leases are owned as `want` says (owner ->
/// count) with no handoff in progress; returns how long it took.
async fn wait_owned(s: &Scenario, want: &BTreeMap<String, usize>, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let items = s.lease_items().await;
        let in_handoff = items.iter().any(|i| i.contains_key("checkpointOwner"));
        let counts = owner_counts(&s.owners().await);
        if !in_handoff && &counts == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "leases not owned as {want:?} after {limit:?}: {counts:?} (a handoff in progress: {in_handoff})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(w, n)| ((*w).to_owned(), *n)).collect()
}

async fn stop(p: &mut WorkerProcess) {
    p.terminate(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("stopping {}: {e:#}", p.id));
}

/// Waits until every unfinished lease is owned by `worker` and has been
/// renewed twice since (its counter moved): held, not just assigned.
async fn wait_renewing(s: &Scenario, worker: &str) {
    let started = Instant::now();
    let mut first: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        let items = s.lease_items().await;
        let mut renewing = 0;
        let mut total = 0;
        for item in &items {
            let get = |k: &str| match item.get(k) {
                Some(AttributeValue::S(v)) => Some(v.clone()),
                Some(AttributeValue::N(v)) => Some(v.clone()),
                _ => None,
            };
            if get("checkpoint").as_deref() == Some("SHARD_END") {
                continue;
            }
            total += 1;
            let (Some(key), Some(owner), Some(counter)) =
                (get("leaseKey"), get("leaseOwner"), get("leaseCounter"))
            else {
                continue;
            };
            let counter: u64 = counter.parse().unwrap();
            if owner == worker {
                let since = *first.entry(key).or_insert(counter);
                renewing += usize::from(counter >= since + 2);
            }
        }
        if total > 0 && renewing == total {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{worker} renews {renewing} of {total} leases"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn batches(out: &Path) -> Vec<BatchLog> {
    read_logs(out).unwrap()
}

/// Java first, kcl joins: kcl sees the Java worker through its leases and
/// steals its share with the handoff the Java KCL itself writes (counter
/// unchanged): the Java worker drains, checkpoints in shutdown_requested
/// and completes every one. Then kcl stops, releasing its shards with
/// their checkpoints, and the Java leader assigns them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kcl_worker_joining_a_java_worker_takes_its_share_by_completed_handoffs() {
    let (java, mut s, out, cfg) = mixed_fleet(SHARDS, "kcl-java-first").await;
    let mut j = java.spawn(&cfg, "java-1").unwrap();
    s.produce(5).await;
    let took = wait_owned(&s, &counts(&[("java-1", 4)]), JAVA_START).await;
    // Assigned by its leader is not yet held: the Java worker finds its
    // new leases at its next discovery (up to a failover time later) and
    // renews them only from then; kcl would rightly take them as expired.
    wait_renewing(&s, "java-1").await;
    println!("the Java worker held all {SHARDS} shards {took:?} after the first records");
    let producer = Producer::start(&s, 1, Duration::from_millis(500));

    let mut k = cfg.spawn("kcl-1").unwrap();
    let spread = wait_owned(&s, &counts(&[("java-1", 2), ("kcl-1", 2)]), SPREAD).await;
    println!("split 2/2 {spread:?} after kcl joined");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let per_key = producer.stop(&mut s).await;
    wait_complete(|| batches(&out), per_key, Duration::from_secs(60)).await;

    stop(&mut k).await;
    let kcl = process_stats(&out, "kcl-1");
    s.produce(3).await;
    let per_key = s.produced;
    // The Java leader assigns the released leases (unassigned) to itself.
    wait_owned(&s, &counts(&[("java-1", 4)]), SPREAD).await;
    let all = wait_complete(|| batches(&out), per_key, Duration::from_secs(60)).await;
    stop(&mut j).await;

    let verdict = verify(&batches(&out), KEYS, per_key);
    println!(
        "java first, kcl joins: {} records, {verdict}, kcl {kcl}",
        all.len()
    );
    verdict.assert_correct();
    assert_eq!(
        verdict.duplicates, 0,
        "a shard moved without its checkpoint"
    );
    assert_eq!(stat(&kcl, "handoffs_forced"), 0, "{kcl}");
    assert!(stat(&kcl, "handoffs_completed") >= 2, "{kcl}");
    assert!(verdict.per_worker.get("kcl-1").copied().unwrap_or(0) > 0);
}

/// Starts `kcl-1` alone and produces 5 records per key; returns once it
/// holds all four leases.
async fn kcl_alone(cfg: &WorkerProcessConfig, s: &mut Scenario) -> WorkerProcess {
    let k = cfg.spawn("kcl-1").unwrap();
    s.produce(5).await;
    wait_owned(s, &counts(&[("kcl-1", 4)]), Duration::from_secs(30)).await;
    k
}

/// Starts the Java worker `java-1` beside `kcl-1`, holding all four
/// leases; returns 5 s after they hold two each.
async fn java_joins(java: &JavaKcl, cfg: &WorkerProcessConfig, s: &Scenario) -> WorkerProcess {
    let j = java.spawn(cfg, "java-1").unwrap();
    let joined = Instant::now();
    // Its first report comes once it made its tables (a minute or so);
    // kcl reads the reports every 30 s and gives a lease per tick.
    wait_owned(s, &counts(&[("java-1", 2), ("kcl-1", 2)]), JAVA_START).await;
    println!(
        "split 2/2 {:?} after the Java worker started",
        joined.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    j
}

/// Stops the Java worker `j` first: its leases expire to kcl (its own
/// graceful shutdown checkpoints in shutdown_requested but releases
/// nothing), so nothing repeats. Then 3 more records per key, all
/// processed, and kcl `k` stops: its lease counters.
async fn java_stops_first(
    s: &mut Scenario,
    out: &Path,
    j: &mut WorkerProcess,
    k: &mut WorkerProcess,
) -> serde_json::Value {
    stop(j).await;
    s.produce(3).await;
    wait_complete(|| batches(out), s.produced, Duration::from_secs(90)).await;
    stop(k).await;
    process_stats(out, "kcl-1")
}

/// The end of the kcl-first tests: nothing lost or repeated, and the Java
/// worker got its share from kcl by completed handoffs, none forced.
fn assert_java_got_its_share(verdict: &Verdict, kcl: &serde_json::Value) {
    verdict.assert_correct();
    assert_eq!(
        verdict.duplicates, 0,
        "a shard moved without its checkpoint"
    );
    assert!(stat(kcl, "handed_off") >= 2, "{kcl}");
    assert_eq!(stat(kcl, "handoffs_forced"), 0, "{kcl}");
    assert!(verdict.per_worker.get("java-1").copied().unwrap_or(0) > 0);
}

/// kcl first, Java joins: the Java worker takes no lease itself (its
/// leader assigns only unassigned or expired leases, and balances only
/// over workers that report to its `WorkerMetricStats` table, which kcl
/// does not). kcl reads those reports, counts the Java worker, and hands
/// it its share the way the Java leader would: a handoff naming the Java
/// worker, completed once kcl's processor checkpointed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_worker_joining_a_kcl_worker_is_handed_its_share() {
    let (java, mut s, out, cfg) = mixed_fleet(SHARDS, "kcl-kcl-first").await;
    let mut k = kcl_alone(&cfg, &mut s).await;
    wait_complete(|| batches(&out), s.produced, Duration::from_secs(60)).await;
    let producer = Producer::start(&s, 1, Duration::from_millis(500));

    let mut j = java_joins(&java, &cfg, &s).await;
    let per_key = producer.stop(&mut s).await;
    wait_complete(|| batches(&out), per_key, Duration::from_secs(60)).await;

    let kcl = java_stops_first(&mut s, &out, &mut j, &mut k).await;

    let verdict = verify(&batches(&out), KEYS, s.produced);
    println!("kcl first, Java joins: {verdict}, kcl {kcl}");
    assert_java_got_its_share(&verdict, &kcl);
}

/// The one-restart move, both ways and across a split: kcl consumes
/// alone, a shard splits under it, it stops; the Java worker starts on the
/// table kcl left and resumes every shard (parents finished, children
/// begun) exactly after kcl's checkpoints; then the same from Java back to
/// kcl. No record is missing or repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_restart_move_either_way_resumes_exactly_after_the_other_librarys_checkpoints() {
    let (java, mut s, out, cfg) = mixed_fleet(2, "kcl-java-restart").await;

    // kcl alone, a split halfway.
    let mut k = cfg.spawn("kcl-1").unwrap();
    s.produce(5).await;
    wait_complete(|| batches(&out), s.produced, Duration::from_secs(60)).await;
    let shards = list_all_shards(s.env.kinesis(), &s.stream).await.unwrap();
    split_shard_in_half(s.env.kinesis(), &s.stream, &shards[0].shard_id)
        .await
        .unwrap();
    s.produce(5).await;
    wait_complete(|| batches(&out), s.produced, Duration::from_secs(60)).await;
    stop(&mut k).await;
    // The parent records its children at SHARD_END, as the Java KCL does.
    let parent = s
        .lease_items()
        .await
        .into_iter()
        .find(|i| i.get("leaseKey") == Some(&AttributeValue::S(shards[0].shard_id.clone())))
        .expect("the parent's lease");
    assert_eq!(
        parent.get("checkpoint"),
        Some(&AttributeValue::S("SHARD_END".into()))
    );
    match parent.get("childShardIds") {
        Some(AttributeValue::Ss(children)) => assert_eq!(children.len(), 2, "{children:?}"),
        other => panic!("the parent has no childShardIds: {other:?}"),
    }

    // The move to Java: it starts on kcl's table.
    s.produce(5).await;
    let mut j = java.spawn(&cfg, "java-1").unwrap();
    wait_complete(|| batches(&out), s.produced, JAVA_START).await;
    s.produce(3).await;
    wait_complete(|| batches(&out), s.produced, Duration::from_secs(60)).await;
    stop(&mut j).await;

    // And back to kcl.
    s.produce(5).await;
    let mut k = cfg.spawn("kcl-2").unwrap();
    wait_complete(|| batches(&out), s.produced, Duration::from_secs(90)).await;
    stop(&mut k).await;

    let verdict = verify(&batches(&out), KEYS, s.produced);
    println!("kcl -> Java -> kcl across a split: {verdict}");
    verdict.assert_correct();
    assert_eq!(
        verdict.duplicates, 0,
        "a library resumed before the other's checkpoint"
    );
    for w in ["kcl-1", "java-1", "kcl-2"] {
        assert!(
            verdict.per_worker.get(w).copied().unwrap_or(0) > 0,
            "{w} processed nothing: {:?}",
            verdict.per_worker
        );
    }
}

/// Waits until every unfinished lease `owner` holds carries a load figure
/// (`throughputKBps`, a number; zero on a shard no key hashes to), one at
/// least above zero; returns them by lease.
async fn wait_figures(s: &Scenario, owner: &str, limit: Duration) -> BTreeMap<String, f64> {
    let started = Instant::now();
    loop {
        let mut figures = BTreeMap::new();
        let mut held = 0;
        for item in s.lease_items().await {
            let s_attr = |k: &str| match item.get(k) {
                Some(AttributeValue::S(v)) => Some(v.clone()),
                _ => None,
            };
            if s_attr("checkpoint").as_deref() == Some("SHARD_END")
                || s_attr("leaseOwner").as_deref() != Some(owner)
            {
                continue;
            }
            held += 1;
            if let (Some(key), Some(AttributeValue::N(n))) =
                (s_attr("leaseKey"), item.get("throughputKBps"))
                && let Ok(kbps) = n.parse::<f64>()
                && kbps >= 0.0
            {
                figures.insert(key, kbps);
            }
        }
        if held > 0 && figures.len() == held && figures.values().any(|f| *f > 0.0) {
            return figures;
        }
        assert!(
            started.elapsed() < limit,
            "{owner} published figures on {} of its {held} leases within {limit:?}",
            figures.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// kcl publishes what its leases carry on their items (`throughputKBps`,
/// a number, with every per-lease renewal, as the Java KCL 3.x writes
/// it). A Java KCL 3.1.3 worker joining reads every lease item, kcl's
/// figures included: its leader's assignments (each reads the whole table
/// through the Java serializer, which parses the attribute as a `Double`)
/// run without a lease failing to deserialize, and the fleet converges as
/// before (a mixed fleet balances counts: the Java leader its own workers,
/// kcl against them), with nothing repeated and no handoff forced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_worker_reads_the_load_figures_kcl_publishes_and_the_fleet_still_converges() {
    let (java, mut s, out, mut cfg) = mixed_fleet(SHARDS, "kcl-java-load").await;
    cfg.extra_env
        .push(("KCL_E2E_LOAD_REPORT_MS".into(), "4000".into()));
    let mut k = kcl_alone(&cfg, &mut s).await;
    let producer = Producer::start(&s, 1, Duration::from_millis(500));
    let figures = wait_figures(&s, "kcl-1", Duration::from_secs(60)).await;
    println!("kcl published {figures:?} (KB/s) before the Java worker started");

    let mut j = java_joins(&java, &cfg, &s).await;
    // kcl keeps publishing on the leases it kept.
    wait_figures(&s, "kcl-1", Duration::from_secs(30)).await;
    let per_key = producer.stop(&mut s).await;
    wait_complete(|| batches(&out), per_key, Duration::from_secs(60)).await;
    let kcl = java_stops_first(&mut s, &out, &mut j, &mut k).await;

    let log = std::fs::read_to_string(out.join("java-1.java.log")).unwrap();
    let assignments = log
        .lines()
        .filter(|l| l.contains("is a leader, performing assignment"))
        .count();
    let troubles: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("failed deserialization")
                || l.contains("failed to perform lease assignment")
                || l.contains("NumberFormatException")
                || l.contains("NullPointerException")
        })
        .collect();
    let verdict = verify(&batches(&out), KEYS, s.produced);
    println!("kcl's figures read by Java: {assignments} leader assignments, {verdict}, kcl {kcl}");
    assert!(
        assignments > 0,
        "the Java worker never ran its leader's assignment (which reads every lease item)"
    );
    assert!(
        troubles.is_empty(),
        "the Java worker failed on the lease items: {troubles:?}"
    );
    assert_java_got_its_share(&verdict, &kcl);
}
