//! The worker's shard sync task: on a jittered interval, or at once when a
//! consumer asks, it follows the stream tracker, lists shards and creates
//! their leases, cleans up finished leases, and deletes the leases of
//! removed streams.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use rand::Rng;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::streams::{LiveStreams, delete_removed_leases, read, update_streams};
use super::{RemovedStreamPolicy, StreamSpec, StreamTracker};
use crate::backoff::{Backoff, Pauses};
use crate::lease::{Lease, LeaseLayout};
use crate::leases::FleetSignals;
use crate::shard_sync;
use crate::shards::cleanup::LeaseCleanup;
use crate::source::{InitialPosition, ShardSource};
use crate::store::LeaseStore;

/// How long a call of the stream tracker may take before the round goes on
/// with the current streams (see [`StreamTracker::streams`]).
const TRACKER_TIMEOUT: Duration = Duration::from_secs(30);

/// The shard sync task's settings (from the worker's configuration), its
/// ties to the worker, and what it keeps from round to round.
pub(super) struct SyncLoop {
    pub(super) source: Arc<dyn ShardSource>,
    pub(super) tracker: Option<Arc<dyn StreamTracker>>,
    pub(super) interval: Duration,
    pub(super) initial: InitialPosition,
    pub(super) retention: Duration,
    pub(super) policy: RemovedStreamPolicy,
    pub(super) signals: FleetSignals,
    pub(super) store: Arc<dyn LeaseStore>,
    pub(super) stop: CancellationToken,
    pub(super) live: LiveStreams,
    /// Where removed streams go, for the worker to stop their consumers.
    pub(super) removed_tx: mpsc::Sender<StreamSpec>,
    /// Notified by a consumer that needs a lease only the sync creates.
    pub(super) now: Arc<tokio::sync::Notify>,
    /// Each stream's finished-lease cleanup (it remembers what it saw).
    pub(super) cleanups: HashMap<LeaseLayout, LeaseCleanup>,
    /// Streams removed, and when, for `RemovedStreamPolicy::DeleteAfter`.
    pub(super) removed_at: HashMap<LeaseLayout, (String, Instant)>,
    /// When to sync again after a round a consumer asked for created
    /// nothing, and how many such rounds ran (see [`FOLLOW_UPS`]).
    pub(super) follow_up: Option<(Instant, u32)>,
    /// On a follower: when it may scan next for removed streams the
    /// leader deleted, and the wait after that scan if one still has
    /// leases (see [`SyncLoop::forget_deleted_streams`]).
    pub(super) forget_check: Option<(Instant, Pauses)>,
}

/// The longest wait between a follower's scans for removed streams the
/// leader deleted: a leader that keeps them (another deletion policy, or a
/// peer still reading one) costs a scan an hour.
const FORGET_CHECK_MAX: Duration = Duration::from_secs(3600);

/// The follow-up after a round: none once a round created leases; the next
/// (or none, past [`FOLLOW_UPS`]) after one asked for that created none;
/// unchanged otherwise.
fn next_follow_up(
    pending: Option<(Instant, u32)>,
    asked: bool,
    created: Option<usize>,
) -> Option<(Instant, u32)> {
    match created {
        Some(n) if n > 0 => None,
        Some(_) if asked => {
            let done = pending.map_or(0, |(_, done)| done);
            (done < FOLLOW_UPS).then(|| (Instant::now() + Duration::from_secs(1 << done), done + 1))
        }
        _ => pending,
    }
}

/// Rounds after one a consumer asked for that created nothing: 1 s, 2 s, 4 s
/// ... apart, about a minute in all. A shard that ended naming no children
/// asks because the listing did not show them yet, and the round it asks
/// for may read that same listing; without these its children waited for
/// the next periodic round (on a worker that does not lead the fleet's
/// rounds, for good).
const FOLLOW_UPS: u32 = 6;

impl SyncLoop {
    /// Runs rounds until stopped.
    pub(super) async fn run(mut self) {
        let stop = self.stop.clone();
        loop {
            let Some(asked) = self.wait().await else {
                return;
            };
            // A shutdown does not wait for a round (a throttled listing,
            // a tracker slow to answer) while the worker's drained leases
            // are still renewed and unread. Cut short, a round leaves what
            // the next does: each write is conditional, parents are created
            // before children and deleted after them.
            let created = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                created = self.follow_and_sync(asked) => created,
            };
            self.follow_up = next_follow_up(self.follow_up, asked, created);
        }
    }

    /// Follows the tracker, then runs a round if this worker leads the
    /// fleet's rounds or `asked` (a consumer asked); how many leases the
    /// round created, `None` without a round.
    async fn follow_and_sync(&mut self, asked: bool) -> Option<usize> {
        let mut wanted = asked;
        if self.tracker.is_some() {
            // A stream new to this worker needs its leases now.
            wanted |= self.follow_tracker().await;
        }
        // One round per fleet: the periodic sync and cleanup run on the
        // leader only; a sync a consumer asked for (its shard ended, its
        // children need leases) runs here at once.
        let leader = self.signals.is_sync_leader();
        if !leader && !wanted {
            self.forget_deleted_streams().await;
            return None;
        }
        Some(self.round(leader).await)
    }

    /// On a follower with no round to run: once a removed stream is due
    /// for deletion, a scan tells whether the leader deleted its leases,
    /// and forgets it then. Only rounds forgot them, which a follower runs
    /// only when a consumer or the tracker asks. While one stays, the
    /// scans come at waits doubling from the sync interval up to
    /// [`FORGET_CHECK_MAX`].
    async fn forget_deleted_streams(&mut self) {
        let RemovedStreamPolicy::DeleteAfter(delay) = self.policy else {
            return;
        };
        let now = Instant::now();
        let due = self
            .removed_at
            .values()
            .any(|(_, at)| at.elapsed() >= delay);
        if !due || self.forget_check.as_ref().is_some_and(|(at, _)| now < *at) {
            return;
        }
        let Ok(pages) = self.store.scan().try_collect::<Vec<_>>().await else {
            return;
        };
        let leases: Vec<Lease> = pages.into_iter().flatten().collect();
        let before = self.removed_at.len();
        self.forget_streams_without_leases(&leases);
        // Exact doubling from the sync interval while nothing changes.
        let mut pauses = match self.forget_check.take() {
            Some((_, pauses)) if self.removed_at.len() == before => pauses,
            _ => Backoff::new(self.interval, FORGET_CHECK_MAX)
                .without_jitter()
                .pauses(),
        };
        let wait = pauses.next_or_max();
        self.forget_check = (!self.removed_at.is_empty()).then(|| (now + wait, pauses));
    }

    /// Forgets the removed streams of which `leases`, a scan of the whole
    /// table, holds no lease: the leader deleted them all.
    fn forget_streams_without_leases(&mut self, leases: &[Lease]) {
        self.removed_at
            .retain(|layout, _| leases.iter().any(|l| layout.owns(l)));
    }

    /// Waits for the next round: `Some(true)` when a consumer asked for
    /// it, `Some(false)` at the jittered interval, `None` once stopped.
    async fn wait(&self) -> Option<bool> {
        let jittered = self.interval.mul_f64(rand::rng().random_range(0.75..=1.25));
        let follow_up = async {
            match self.follow_up {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.stop.cancelled() => None,
            _ = tokio::time::sleep(jittered) => Some(false),
            // A consumer needs a lease only the sync creates.
            _ = self.now.notified() => Some(true),
            () = follow_up => Some(true),
        }
    }

    /// Takes the tracker's stream list as the live one, handing removed
    /// streams to the worker; `true` if a stream was added.
    async fn follow_tracker(&mut self) -> bool {
        let Some(tracker) = &self.tracker else {
            return false;
        };
        let mut added = false;
        // A call that never answered held back every later round (shard
        // listings, lease cleanup, removed streams), and shutdown waited
        // on it.
        let answer = tokio::time::timeout(TRACKER_TIMEOUT, tracker.streams()).await;
        match answer {
            Err(_) => warn!(timeout = ?TRACKER_TIMEOUT,
                "the stream tracker did not answer in time; keeping the current streams"),
            Ok(Ok(wanted)) => {
                let (removed, any_added) = update_streams(&self.live, wanted);
                // A stream new to this worker needs its leases
                // now, whoever leads the fleet's rounds.
                added = any_added;
                for spec in removed {
                    // Nothing of a removed stream stays behind but what
                    // its deletion needs: streams may come and go for as
                    // long as the worker runs.
                    self.cleanups.remove(&spec.layout);
                    if matches!(self.policy, RemovedStreamPolicy::DeleteAfter(_)) {
                        self.removed_at
                            .insert(spec.layout.clone(), (spec.name.clone(), Instant::now()));
                        // A stream newly removed is checked at the usual
                        // pace, not at the wait a kept one has grown to.
                        self.forget_check = None;
                    }
                    let _ = self.removed_tx.send(spec).await;
                }
                for spec in read(&self.live).iter() {
                    self.removed_at.remove(&spec.layout);
                }
            }
            Ok(Err(e)) => {
                warn!(error = %e, "the stream tracker failed; keeping the current streams")
            }
        }
        added
    }

    /// One round: one scan of the lease table, a sync of every stream from
    /// it, and (on the leader) the cleanups and removed streams' deletions;
    /// how many leases it created.
    async fn round(&mut self, leader: bool) -> usize {
        // One scan serves every stream of this worker.
        let leases: Vec<Lease> = match self.store.scan().try_collect::<Vec<_>>().await {
            Ok(pages) => pages.into_iter().flatten().collect(),
            Err(e) => {
                warn!(error = %e, "shard sync could not read the lease table; retrying next interval");
                return 0;
            }
        };
        if leader {
            self.signals.saw_table(&leases);
        }
        let created = self.sync_streams(leader, &leases).await;
        if created > 0 {
            self.signals.leases_created();
        }
        if !leader {
            // The leader deletes the removed streams' leases; once a
            // stream's are gone, nothing of it is left to wait for here.
            self.forget_streams_without_leases(&leases);
            return created;
        }
        if let RemovedStreamPolicy::DeleteAfter(delay) = self.policy {
            // From this round's scan: a lease a dead worker still holds
            // keeps its stream here until the taker judges it given up,
            // and must not cost a second scan every round.
            let signals = &self.signals;
            let (store, removed_at) = (self.store.as_ref(), &mut self.removed_at);
            let judged = |l: &Lease| signals.judged(l);
            let done = delete_removed_leases(store, removed_at, delay, &leases, judged).await;
            // A dead holder's liveness record, named by nothing now, goes
            // at the taker's next scan; a held lease it has not judged yet
            // (its scans follow the liveness records, which may not have
            // changed since the removal) is judged there.
            if done.deleted > 0 || done.unjudged > 0 {
                self.signals.look_at_turned_down();
            }
        }
        created
    }

    /// Syncs every live stream from `leases` (cleaning up after each on the
    /// leader); returns how many leases were created.
    async fn sync_streams(&mut self, leader: bool, leases: &[Lease]) -> usize {
        let streams = read(&self.live).clone();
        let mut created = 0;
        for spec in &streams {
            let synced = shard_sync::sync_shards_from(
                self.source.as_ref(),
                self.store.as_ref(),
                &spec.name,
                &spec.layout,
                self.initial,
                leases,
            )
            .await;
            match synced {
                Ok(report) => {
                    created += report.created;
                    if !leader {
                        continue;
                    }
                    let retention = self.retention;
                    let cleanup = self
                        .cleanups
                        .entry(spec.layout.clone())
                        .or_insert_with(|| LeaseCleanup::new(retention));
                    cleanup
                        .run(
                            self.store.as_ref(),
                            &spec.layout,
                            &report.shards,
                            &report.leases,
                        )
                        .await;
                }
                Err(e) => {
                    warn!(stream = %spec.name, error = %e, "shard sync failed; retrying next interval")
                }
            }
        }
        created
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::LeaseConfig;
    use crate::leases::LeaseCoordinator;
    use crate::source::SourceError;
    use crate::source::memory::InMemoryShardSource;
    use crate::store::memory::InMemoryLeaseStore;

    /// The streams a test lists.
    #[derive(Debug, Default)]
    struct Listed(Mutex<Vec<StreamSpec>>);

    #[async_trait::async_trait]
    impl StreamTracker for Listed {
        async fn streams(&self) -> Result<Vec<StreamSpec>, SourceError> {
            Ok(self.0.lock().unwrap_or_else(|e| e.into_inner()).clone())
        }
    }

    fn spec(name: &str) -> StreamSpec {
        StreamSpec {
            name: name.into(),
            layout: LeaseLayout::MultiStream {
                identifier: format!("123456789012:{name}:1700000000"),
            },
        }
    }

    /// A sync loop following `tracker` under `policy`, and the receiver
    /// of the streams it removes.
    fn sync_loop(
        tracker: Arc<Listed>,
        policy: RemovedStreamPolicy,
    ) -> (SyncLoop, mpsc::Receiver<StreamSpec>, LeaseCoordinator) {
        let store: Arc<dyn LeaseStore> = Arc::new(InMemoryLeaseStore::new());
        let lease = LeaseConfig::builder("w").build().unwrap();
        let (coordinator, _events) = LeaseCoordinator::start(Arc::clone(&store), lease);
        let (removed_tx, removed) = mpsc::channel(8);
        let sync = SyncLoop {
            source: Arc::new(InMemoryShardSource::new()),
            tracker: Some(tracker),
            interval: Duration::from_secs(60),
            initial: InitialPosition::TrimHorizon,
            retention: Duration::from_secs(300),
            policy,
            signals: coordinator.signals(),
            store,
            stop: CancellationToken::new(),
            live: LiveStreams::default(),
            removed_tx,
            now: Arc::default(),
            cleanups: HashMap::new(),
            removed_at: HashMap::new(),
            follow_up: None,
            forget_check: None,
        };
        (sync, removed, coordinator)
    }

    /// Lists shards never.
    #[derive(Debug)]
    struct Stuck;

    #[async_trait::async_trait]
    impl ShardSource for Stuck {
        async fn list_shards(&self, _: &str) -> Result<Vec<crate::source::ShardInfo>, SourceError> {
            std::future::pending().await
        }
        async fn open(
            &self,
            _: crate::source::OpenShard,
        ) -> Result<Box<dyn crate::source::ShardReader>, SourceError> {
            std::future::pending().await
        }
    }

    /// A stop ends the loop in the middle of a round (here a listing that
    /// never answers): the worker's shutdown waits for the loop while its
    /// drained leases are still renewed, so peers cannot take them.
    #[tokio::test(start_paused = true)]
    async fn a_stop_cuts_a_round_short() {
        let tracker = Arc::new(Listed(Mutex::new(vec![spec("a")])));
        let (mut sync, _removed, _coordinator) = sync_loop(tracker, RemovedStreamPolicy::Keep);
        sync.source = Arc::new(Stuck);
        let (stop, now) = (sync.stop.clone(), Arc::clone(&sync.now));
        let run = tokio::spawn(sync.run());
        now.notify_one();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!run.is_finished(), "the round is under way");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(3600), run)
            .await
            .expect("the loop ends at the stop")
            .expect("no panic");
    }

    /// A source whose first `stale` listings are `old` (taken before a
    /// split): ListShards shows a split's children only after a while.
    #[derive(Debug)]
    struct Stale {
        inner: InMemoryShardSource,
        old: Vec<crate::source::ShardInfo>,
        stale: std::sync::atomic::AtomicU32,
    }

    #[async_trait::async_trait]
    impl ShardSource for Stale {
        async fn list_shards(
            &self,
            stream: &str,
        ) -> Result<Vec<crate::source::ShardInfo>, SourceError> {
            use std::sync::atomic::Ordering;
            let stale = self
                .stale
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            match stale {
                Ok(_) => Ok(self.old.clone()),
                Err(_) => self.inner.list_shards(stream).await,
            }
        }
        async fn open(
            &self,
            request: crate::source::OpenShard,
        ) -> Result<Box<dyn crate::source::ShardReader>, SourceError> {
            self.inner.open(request).await
        }
    }

    /// A round a consumer asked for (its shard ended naming no children)
    /// that reads a listing without the children yet is followed up until
    /// one shows them: the children are leased within a minute, not at the
    /// next periodic round (an hour here).
    #[tokio::test(start_paused = true)]
    async fn an_asked_round_that_creates_nothing_is_followed_up() {
        let tracker = Arc::new(Listed(Mutex::new(vec![spec("a")])));
        let (mut sync, _removed, _coordinator) = sync_loop(tracker, RemovedStreamPolicy::Keep);
        let inner = InMemoryShardSource::new();
        let parent = inner.create_stream("a", 1).remove(0);
        let old = inner.list_shards("a").await.unwrap();
        let kids = inner.split("a", &parent).unwrap();
        let layout = spec("a").layout;
        let finished = layout.new_lease(&parent, crate::lease::Checkpoint::ShardEnd);
        sync.store.create_if_absent(&finished).await.unwrap();
        sync.source = Arc::new(Stale {
            inner,
            old,
            stale: 3.into(),
        });
        sync.interval = Duration::from_secs(3600);
        let (store, now) = (Arc::clone(&sync.store), Arc::clone(&sync.now));
        let run = tokio::spawn(sync.run());
        now.notify_one();
        tokio::time::sleep(Duration::from_secs(60)).await;
        for kid in &kids {
            let key = layout
                .new_lease(kid, crate::lease::Checkpoint::TrimHorizon)
                .key;
            assert!(store.get(&key).await.unwrap().is_some(), "{kid} leased");
        }
        run.abort();
    }

    /// Streams may come and go for as long as a worker runs: a removed
    /// one leaves no cleanup behind, and under `Keep` (nothing to delete)
    /// no entry waiting for a deletion either.
    #[tokio::test(start_paused = true)]
    async fn a_removed_stream_leaves_only_what_its_deletion_needs() {
        for (policy, waiting) in [
            (RemovedStreamPolicy::Keep, 0),
            (RemovedStreamPolicy::DeleteAfter(Duration::from_secs(60)), 1),
        ] {
            let tracker = Arc::new(Listed(Mutex::new(vec![spec("a"), spec("b")])));
            let (mut sync, mut removed, _coordinator) = sync_loop(Arc::clone(&tracker), policy);
            sync.follow_tracker().await;
            for layout in [spec("a").layout, spec("b").layout] {
                sync.cleanups
                    .insert(layout, LeaseCleanup::new(sync.retention));
            }
            tracker.0.lock().unwrap().retain(|s| s.name == "a");
            sync.follow_tracker().await;
            assert_eq!(removed.recv().await, Some(spec("b")));
            let cleanups: Vec<_> = sync.cleanups.keys().cloned().collect();
            assert_eq!(cleanups, [spec("a").layout], "{policy:?}");
            assert_eq!(sync.removed_at.len(), waiting, "{policy:?}");
        }
    }

    /// A stream listed again under another name (its ARN for its name),
    /// or twice, is one stream: nothing is removed, and it is live once.
    /// Compared by name, the stream was removed (its consumers stopped and
    /// leases released) while it was still listed.
    #[tokio::test(start_paused = true)]
    async fn a_stream_listed_under_another_name_is_not_removed() {
        let tracker = Arc::new(Listed(Mutex::new(vec![spec("a")])));
        let (mut sync, mut removed, _coordinator) =
            sync_loop(Arc::clone(&tracker), RemovedStreamPolicy::Keep);
        sync.follow_tracker().await;
        let by_arn = StreamSpec {
            name: "arn:aws:kinesis:us-east-1:123456789012:stream/a".into(),
            layout: spec("a").layout,
        };
        *tracker.0.lock().unwrap() = vec![by_arn, spec("a")];
        sync.follow_tracker().await;
        assert!(removed.try_recv().is_err(), "nothing removed");
        // Under the name its consumers read it by (and label it with).
        assert_eq!(*read(&sync.live), [spec("a")]);
        // Single-stream specs share a layout: their names tell them apart.
        let single = |name: &str| StreamSpec {
            name: name.into(),
            layout: LeaseLayout::SingleStream,
        };
        *tracker.0.lock().unwrap() = vec![single("x")];
        sync.follow_tracker().await;
        assert_eq!(removed.recv().await, Some(spec("a")));
        *tracker.0.lock().unwrap() = vec![single("y")];
        sync.follow_tracker().await;
        assert_eq!(removed.recv().await, Some(single("x")));
    }

    /// A worker that does not lead the rounds forgets a removed stream
    /// once the leader deleted its leases: only the leader's deletions
    /// took entries out, and a follower kept one for every stream it ever
    /// saw removed.
    #[tokio::test(start_paused = true)]
    async fn a_follower_forgets_a_removed_stream_once_its_leases_are_gone() {
        let tracker = Arc::new(Listed(Mutex::new(vec![spec("a"), spec("b")])));
        let policy = RemovedStreamPolicy::DeleteAfter(Duration::from_secs(60));
        let (mut sync, mut removed, _coordinator) = sync_loop(Arc::clone(&tracker), policy);
        sync.follow_tracker().await;
        let lease = spec("b").layout.new_lease(
            "shardId-000000000000",
            crate::lease::Checkpoint::TrimHorizon,
        );
        let lease = sync.store.create_if_absent(&lease).await.unwrap();
        tracker.0.lock().unwrap().retain(|s| s.name == "a");
        sync.follow_tracker().await;
        assert_eq!(removed.recv().await, Some(spec("b")));
        sync.round(false).await;
        assert_eq!(sync.removed_at.len(), 1, "its lease is still there");
        sync.store.delete(&lease.key, lease.counter).await.unwrap();
        sync.round(false).await;
        assert!(sync.removed_at.is_empty(), "{:?}", sync.removed_at);
    }

    /// A follower that runs no rounds (no consumer asks, the tracker adds
    /// nothing) forgets a removed stream too, once it is due for deletion
    /// and the leader deleted its leases: one scan a round until then,
    /// none before it is due.
    #[tokio::test(start_paused = true)]
    async fn a_follower_without_rounds_forgets_a_deleted_stream_once_due() {
        let tracker = Arc::new(Listed(Mutex::new(vec![spec("a"), spec("b")])));
        let policy = RemovedStreamPolicy::DeleteAfter(Duration::from_secs(60));
        let (mut sync, mut removed, _coordinator) = sync_loop(Arc::clone(&tracker), policy);
        sync.follow_tracker().await;
        tracker.0.lock().unwrap().retain(|s| s.name == "a");
        sync.follow_tracker().await;
        assert_eq!(removed.recv().await, Some(spec("b")));
        sync.forget_deleted_streams().await;
        assert_eq!(sync.removed_at.len(), 1, "not due yet");
        tokio::time::sleep(Duration::from_secs(61)).await;
        sync.forget_deleted_streams().await;
        assert!(sync.removed_at.is_empty(), "{:?}", sync.removed_at);
    }

    /// A removed stream the leader never deletes (it keeps them, or a peer
    /// still reads one) costs a follower scans at waits doubling up to an
    /// hour, not one each interval for as long as it runs.
    #[tokio::test(start_paused = true)]
    async fn a_follower_checks_a_stream_the_leader_keeps_ever_less_often() {
        use crate::store::metered::MeteredStore;
        let all = vec![spec("a"), spec("b"), spec("c")];
        let tracker = Arc::new(Listed(Mutex::new(all)));
        let policy = RemovedStreamPolicy::DeleteAfter(Duration::from_secs(60));
        let (mut sync, mut removed, _coordinator) = sync_loop(Arc::clone(&tracker), policy);
        let metered = Arc::new(MeteredStore::new(InMemoryLeaseStore::new()));
        sync.store = Arc::clone(&metered) as Arc<dyn LeaseStore>;
        sync.follow_tracker().await;
        let lease = spec("b").layout.new_lease(
            "shardId-000000000000",
            crate::lease::Checkpoint::TrimHorizon,
        );
        sync.store.create_if_absent(&lease).await.unwrap();
        tracker.0.lock().unwrap().retain(|s| s.name != "b");
        sync.follow_tracker().await;
        assert_eq!(removed.recv().await, Some(spec("b")));
        // Six hours of periodic ticks, one a sync interval (60 s).
        for _ in 0..360 {
            tokio::time::sleep(sync.interval).await;
            sync.forget_deleted_streams().await;
        }
        assert_eq!(sync.removed_at.len(), 1, "its lease is still there");
        let scans = metered.stats().scans();
        // 1, 2, 4 ... 32 minutes apart, then hourly: 11 in six hours.
        assert!((6..=14).contains(&scans), "{scans} scans");
        // A stream removed now (no lease left) is forgotten at the usual
        // pace, not after the hour the kept one's checks have grown to.
        tracker.0.lock().unwrap().retain(|s| s.name == "a");
        sync.follow_tracker().await;
        assert_eq!(removed.recv().await, Some(spec("c")));
        for _ in 0..3 {
            tokio::time::sleep(sync.interval).await;
            sync.forget_deleted_streams().await;
        }
        let left: Vec<_> = sync
            .removed_at
            .values()
            .map(|(name, _)| name.clone())
            .collect();
        assert_eq!(left, ["b"]);
    }
}
