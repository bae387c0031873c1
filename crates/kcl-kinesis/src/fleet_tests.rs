//! Whole kcl-core workers on [`KinesisShardSource`] over the fake Kinesis
//! API and the in-memory lease table, under paused time: how a retrieval
//! fault plays out across the fleet (who holds the lease, what reaches
//! the processor), not just inside one reader.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use kcl_core::test_util::fleet::{self, Payloads, Seen};
use kcl_core::{Checkpoint, LeaseConfig, LeaseStore};
use tokio::time::{Instant, sleep};

use crate::calls::KinesisApi;
use crate::fake::FakeKinesis;
use crate::faults::{Call, Fault, FaultInjector, Faulty};
use crate::{KinesisShardSource, PollingConfig, SourceSnapshot};

const STREAM: &str = "orders";

/// Workers on the fake Kinesis, each processor keeping what it sees.
struct Fleet {
    base: fleet::Fleet,
    fake: Arc<FakeKinesis>,
    seen: Seen,
    sources: Vec<KinesisShardSource>,
    /// One injector for every worker's calls: a KMS key or a policy fails
    /// the whole fleet alike.
    faults: FaultInjector,
}

// The table, the workers and their shared helpers (`owners`,
// `given_back`, `stop_all`).
kcl_core::deref_fleet!(Fleet, base);

impl Fleet {
    fn new(shards: usize) -> (Self, Vec<String>) {
        let fake = Arc::new(FakeKinesis::default());
        let ids = fake.create_stream(STREAM, shards);
        let fleet = Fleet {
            base: fleet::Fleet::new(),
            fake,
            seen: Seen::default(),
            sources: Vec::new(),
            faults: FaultInjector::new(),
        };
        (fleet, ids)
    }

    fn start(&mut self, id: &str) {
        self.start_with(id, self.faults.clone());
    }

    /// Starts a worker whose calls go through `faults` of its own (one
    /// worker's route to Kinesis, not the service).
    fn start_with(&mut self, id: &str, faults: FaultInjector) {
        let api: Arc<dyn KinesisApi> = Arc::new(Faulty {
            inner: Arc::clone(&self.fake) as Arc<dyn KinesisApi>,
            faults,
        });
        let polling = PollingConfig::builder()
            .retry_min_delay(Duration::from_millis(50))
            .retry_max_delay(Duration::from_secs(2))
            .build()
            .unwrap();
        let source = KinesisShardSource::with_api(api, polling);
        self.sources.push(source.clone());
        let lease = LeaseConfig::builder(id)
            .taker_interval(Duration::from_secs(10))
            .seed(id.len() as u64 * 17)
            .release_on_drop(false)
            .build()
            .unwrap();
        let config = fleet::one_stream(lease, STREAM)
            .parent_poll_interval(Duration::from_secs(1))
            .shard_sync_interval(Duration::from_secs(5))
            .build()
            .unwrap();
        let store = Arc::new(self.base.table_for_worker());
        let factory = Payloads::factory(&self.seen);
        self.base
            .run_worker(config, store, Arc::new(source), factory);
    }

    fn put(&self, shard: &str, payload: &str) {
        self.fake.put(STREAM, shard, "pk", payload.to_owned());
    }

    /// Puts one record on each of `ids`, `{tag}-{i}` on the i-th.
    fn put_each(&self, ids: &[String], tag: &str) {
        for (i, id) in ids.iter().enumerate() {
            self.put(id, &format!("{tag}-{i}"));
        }
    }

    /// Waits until the four shards were read and `w-a` and `w-b` hold two
    /// leases each.
    async fn wait_balanced(&self) {
        self.wait_until(
            "all shards read and the leases balanced",
            Duration::from_secs(300),
            |f| f.seen().len() == 4 && held_by(f, "w-a") == 2 && held_by(f, "w-b") == 2,
        )
        .await;
    }

    fn seen(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }

    async fn wait_until(&self, what: &str, limit: Duration, done: impl Fn(&Self) -> bool) {
        fleet::wait_until(
            limit,
            Duration::from_millis(200),
            || done(self),
            || format!("not within {limit:?}: {what}"),
        )
        .await;
    }

    /// Waits until `n` records were seen.
    async fn wait_seen(&self, what: &str, limit: Duration, n: usize) {
        self.wait_until(what, limit, |f| f.seen().len() == n).await;
    }

    fn stats(&self) -> SourceSnapshot {
        let mut total = SourceSnapshot::default();
        for s in &self.sources {
            let one = s.stats();
            total.access_denied += one.access_denied;
            total.expired_shards += one.expired_shards;
        }
        total
    }
}

#[tokio::test(start_paused = true)]
async fn a_kms_outage_keeps_every_lease_where_it_is() {
    let (mut fleet, ids) = Fleet::new(4);
    fleet.start("w-a");
    fleet.start("w-b");
    fleet.put_each(&ids, "before");
    fleet.wait_balanced().await;
    let before = fleet.store.owner_changes().len();
    let owners = fleet.owners();

    // The stream's KMS key is disabled for five minutes: every read of
    // every worker fails.
    fleet.faults.fail_all(Call::GetRecords, Fault::KmsDisabled);
    sleep(Duration::from_secs(300)).await;
    let during = fleet.stats().access_denied;
    fleet.faults.clear(Call::GetRecords);
    fleet.put_each(&ids, "after");
    fleet
        .wait_seen("reading resumed", Duration::from_secs(60), 8)
        .await;

    assert_eq!(
        fleet.store.owner_changes().len() - before,
        0,
        "no lease moved during the outage"
    );
    assert_eq!(fleet.owners(), owners);
    assert!(
        during > 100,
        "the outage was retried ({during} denied calls)"
    );
    let mut payloads: Vec<String> = fleet.seen().into_iter().map(|(_, p)| p).collect();
    payloads.sort();
    assert_eq!(payloads.len(), 8, "each record once: {payloads:?}");
    payloads.dedup();
    assert_eq!(payloads.len(), 8);
    fleet.stop_all().await;
}

/// How many leases `worker` holds.
fn held_by(fleet: &Fleet, worker: &str) -> usize {
    fleet.base.held_by(worker)
}

#[tokio::test(start_paused = true)]
async fn a_worker_cut_off_from_kinesis_gives_its_shards_to_a_worker_that_reads_them() {
    let (mut fleet, ids) = Fleet::new(4);
    let cut = FaultInjector::new();
    fleet.start_with("w-a", cut.clone());
    fleet.start("w-b");
    fleet.put_each(&ids, "before");
    fleet.wait_balanced().await;
    let cut_off: Vec<String> = fleet
        .owners()
        .into_iter()
        .filter(|(_, o)| o.as_deref() == Some("w-a"))
        .map(|(k, _)| k)
        .collect();

    // w-a's route to Kinesis dies while it still reaches the lease table:
    // its calls never answer, at the library's default
    // max_read_failure_time (the fleet sets none).
    let cut_at = Instant::now();
    cut.fail_all(Call::GetRecords, Fault::Hang);
    cut.fail_all(Call::GetShardIterator, Fault::Hang);
    fleet.put_each(&ids, "after");
    fleet
        .wait_seen(
            "every record read, those of w-a's shards by w-b",
            Duration::from_secs(600),
            8,
        )
        .await;

    let mut payloads: Vec<String> = fleet.seen().into_iter().map(|(_, p)| p).collect();
    payloads.sort();
    payloads.dedup();
    assert_eq!(payloads.len(), 8, "each record read: {payloads:?}");
    assert!(
        cut.injected(Call::GetRecords) > 0,
        "w-a's reads were cut off"
    );
    let released = fleet
        .store
        .owner_changes()
        .iter()
        .filter(|c| cut_off.contains(&c.key) && c.from.as_deref() == Some("w-a"))
        .count();
    assert!(
        released >= cut_off.len(),
        "each of w-a's shards was given back: {released} of {cut_off:?}"
    );
    // Cut off, w-a took nothing back: it sat out, and its peer took what
    // it gave back instead of leaving it to be given back again.
    let retaken: Vec<_> = fleet
        .store
        .owner_changes()
        .into_iter()
        .filter(|c| c.at >= cut_at && c.to.as_deref() == Some("w-a"))
        .collect();
    assert!(
        retaken.is_empty(),
        "w-a took leases while cut off: {retaken:?}"
    );
    assert_eq!(held_by(&fleet, "w-b"), 4, "w-b reads every shard");
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_lone_worker_cut_off_from_kinesis_reads_again_as_soon_as_the_route_is_back() {
    let (mut fleet, ids) = Fleet::new(2);
    let cut = FaultInjector::new();
    fleet.start_with("w-a", cut.clone());
    fleet.put_each(&ids, "before");
    fleet
        .wait_seen("all shards read", Duration::from_secs(300), 2)
        .await;

    // Cut off past max_read_failure_time (45 s): the shards are given
    // back, but with nobody else to take them w-a must not sit out.
    cut.fail_all(Call::GetRecords, Fault::Hang);
    cut.fail_all(Call::GetShardIterator, Fault::Hang);
    fleet.put_each(&ids, "after");
    sleep(Duration::from_secs(60)).await;
    let given_back = fleet
        .store
        .owner_changes()
        .iter()
        .filter(|c| c.from.as_deref() == Some("w-a") && c.to.is_none())
        .count();
    assert!(given_back > 0, "the unreadable shards were given back");
    cut.clear(Call::GetRecords);
    cut.clear(Call::GetShardIterator);
    // A sit-out would leave them unread for 90 s more; a call in flight
    // when the route came back times out (10 s) and is made again.
    fleet
        .wait_seen(
            "the shards read again within a read timeout and a tick",
            Duration::from_secs(30),
            4,
        )
        .await;
    assert_eq!(held_by(&fleet, "w-a"), 2);
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn the_children_of_an_expired_split_parent_are_processed() {
    let (mut fleet, ids) = Fleet::new(1);
    let parent = ids[0].clone();
    // The parent's records were never read, and it aged out of retention
    // after a split: nothing of it can be read any more.
    fleet.put(&parent, "lost");
    let kids = fleet.fake.split(STREAM, &parent, true);
    fleet.fake.expire(STREAM, &parent);
    fleet.put_each(&kids, "child");
    // The parent's lease exists (from before the outage), at TRIM_HORIZON.
    fleet
        .store
        .create_if_absent(&kcl_core::Lease::new(&parent, Checkpoint::TrimHorizon))
        .await
        .unwrap();
    fleet.start("w-a");
    fleet
        .wait_seen("both children read", Duration::from_secs(300), 2)
        .await;
    let seen: Vec<String> = fleet.seen().into_iter().map(|(s, _)| s).collect();
    assert!(kids.iter().all(|k| seen.contains(k)), "{seen:?}");
    let parent_lease = fleet.store.get(&parent).await.unwrap().unwrap();
    assert_eq!(parent_lease.checkpoint, Checkpoint::ShardEnd);
    assert_eq!(fleet.stats().expired_shards, 1);
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn an_invalid_argument_at_open_gives_the_shard_back_after_five_attempts() {
    let (mut fleet, ids) = Fleet::new(1);
    fleet.put(&ids[0], "only");
    // Kinesis rejects the iterator request of a TRIM_HORIZON start: no
    // trimmed checkpoint to move past, so nothing but another try helps.
    // Nine rejections: five give the shard back, the next tenure opens at
    // its fifth attempt.
    for _ in 0..9 {
        fleet
            .faults
            .inject(Call::GetShardIterator, Fault::InvalidArgument);
    }
    fleet.start("w-a");
    fleet
        .wait_seen("the record read", Duration::from_secs(600), 1)
        .await;
    assert_eq!(fleet.faults.injected(Call::GetShardIterator), 9);
    assert_eq!(
        fleet.given_back(),
        1,
        "given back once, after five attempts"
    );
    fleet.stop_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_childs_stale_not_found_after_a_split_is_retried_and_the_shard_kept() {
    let (mut fleet, ids) = Fleet::new(1);
    let parent = ids[0].clone();
    fleet.put(&parent, "parent");
    fleet.start("w-a");
    fleet
        .wait_seen("the parent read", Duration::from_secs(300), 1)
        .await;
    // Right after the split the children answer ResourceNotFound though
    // ListShards lists them: more times than a fatal error is tried, so a
    // stale answer taken for fatal would give a child back.
    for _ in 0..12 {
        fleet
            .faults
            .inject(Call::GetShardIterator, Fault::ResourceNotFound);
    }
    let kids = fleet.fake.split(STREAM, &parent, true);
    fleet.put_each(&kids, "child");
    fleet
        .wait_seen("both children read", Duration::from_secs(600), 3)
        .await;
    assert_eq!(fleet.faults.injected(Call::GetShardIterator), 12);
    assert_eq!(fleet.given_back(), 0, "no shard given back");
    assert_eq!(fleet.stats().expired_shards, 0);
    fleet.stop_all().await;
}
