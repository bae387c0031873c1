//! The checkpointer's tests: validation, pacing, lanes' watermark,
//! commits.

use super::*;
use crate::lease::Lease;
use crate::store::Holder;
use crate::store::memory::InMemoryLeaseStore;

async fn setup() -> (InMemoryLeaseStore, Checkpointer) {
    let store = InMemoryLeaseStore::new();
    let lease = store
        .create_if_absent(&Lease::new("s", Checkpoint::TrimHorizon))
        .await
        .unwrap();
    let lease = store
        .take(&lease, crate::store::Holder::new("me", "t1"))
        .await
        .unwrap();
    let handle = LeaseHandle::detached(lease, Duration::from_secs(60));
    let cp = Checkpointer::for_test(Arc::new(store.clone()), handle);
    (store, cp)
}

/// The checkpoint lease `s` shows in `store`.
async fn stored(store: &InMemoryLeaseStore) -> Checkpoint {
    store.get("s").await.unwrap().unwrap().checkpoint
}

/// Delivers the record at `seq`/`sub` to `cp` and checkpoints it (a
/// policy may hold the write back).
async fn deliver_and_checkpoint(cp: &mut Checkpointer, seq: &str, sub: u64) {
    cp.delivered_for_test(seq, sub);
    cp.checkpoint().await.unwrap();
}

#[tokio::test]
async fn checkpoint_means_the_last_delivered_record() {
    let (store, mut cp) = setup().await;
    cp.checkpoint().await.unwrap();
    assert_eq!(
        stored(&store).await,
        Checkpoint::TrimHorizon,
        "nothing delivered"
    );
    deliver_and_checkpoint(&mut cp, "100", 3).await;
    assert_eq!(stored(&store).await, Checkpoint::at("100", 3));
    cp.set_shard_ended(vec![]);
    cp.checkpoint().await.unwrap();
    assert_eq!(stored(&store).await, Checkpoint::ShardEnd);
}

/// Under a policy, a call inside the period is held back and the
/// latest one written once it is up; a flush that fails keeps the
/// position for the next; the tenure's end writes it.
#[tokio::test(start_paused = true)]
async fn a_policy_holds_positions_back_and_a_failed_flush_keeps_them() {
    use crate::store::StoreOp;
    use crate::store::memory::Fault;
    let (store, cp) = setup().await;
    let mut cp = cp.with_policy(CheckpointPolicy::every(Duration::from_secs(5)));
    deliver_and_checkpoint(&mut cp, "100", 0).await;
    assert_eq!(
        stored(&store).await,
        Checkpoint::at("100", 0),
        "the first goes at once"
    );
    deliver_and_checkpoint(&mut cp, "200", 0).await;
    deliver_and_checkpoint(&mut cp, "300", 0).await;
    assert_eq!(stored(&store).await, Checkpoint::at("100", 0), "held back");
    cp.flush_due().await.unwrap();
    assert_eq!(
        stored(&store).await,
        Checkpoint::at("100", 0),
        "not due yet"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    for _ in 0..6 {
        store.inject(
            StoreOp::Checkpoint,
            Fault::Error(crate::store::StoreErrorKind::Retryable),
        );
    }
    assert!(cp.flush_due().await.is_err());
    assert_eq!(stored(&store).await, Checkpoint::at("100", 0));
    cp.flush_due().await.unwrap();
    assert_eq!(
        stored(&store).await,
        Checkpoint::at("300", 0),
        "kept and written"
    );
    deliver_and_checkpoint(&mut cp, "400", 0).await;
    cp.write_every_call();
    deliver_and_checkpoint(&mut cp, "500", 0).await;
    assert_eq!(
        stored(&store).await,
        Checkpoint::at("500", 0),
        "the tenure's end writes"
    );
}

/// A SHARD_END write that fails gives back the position the policy held
/// back, for the tenure's end to write (a graceful stop right after
/// repeats nothing). It used to be dropped as SHARD_END superseded it,
/// though SHARD_END never landed.
#[tokio::test(start_paused = true)]
async fn a_failed_shard_end_write_keeps_the_held_back_position() {
    use crate::store::StoreOp;
    use crate::store::memory::Fault;
    let (store, cp) = setup().await;
    let mut cp = cp.with_policy(CheckpointPolicy::every(Duration::from_secs(5)));
    deliver_and_checkpoint(&mut cp, "100", 0).await;
    deliver_and_checkpoint(&mut cp, "200", 0).await;
    assert_eq!(stored(&store).await, Checkpoint::at("100", 0), "held back");
    cp.set_shard_ended(vec![]);
    for _ in 0..6 {
        store.inject(
            StoreOp::Checkpoint,
            Fault::Error(crate::store::StoreErrorKind::Retryable),
        );
    }
    assert!(cp.checkpoint().await.is_err(), "SHARD_END did not land");
    cp.write_every_call();
    cp.flush().await.unwrap();
    assert_eq!(stored(&store).await, Checkpoint::at("200", 0));
}

#[tokio::test]
async fn checkpoint_at_is_validated() {
    let (_, mut cp) = setup().await;
    assert!(
        matches!(
            cp.checkpoint_at("5", 0).await,
            Err(CheckpointError::OutOfRange { .. })
        ),
        "nothing delivered yet"
    );
    cp.delivered_for_test("100", 0);
    cp.checkpoint_at("50", 0).await.unwrap();
    for (seq, sub) in [
        ("101", 0),
        ("100", 1),
        ("49", 0),
        ("abc", 0),
        ("SHARD_END", 0),
    ] {
        let e = cp.checkpoint_at(seq, sub).await.unwrap_err();
        assert!(
            matches!(e, CheckpointError::OutOfRange { .. }),
            "{seq}/{sub}: {e}"
        );
        assert!(
            e.to_string().contains("50/0"),
            "names the last checkpoint: {e}"
        );
    }
    cp.checkpoint_at("50", 0).await.unwrap();
    cp.checkpoint_at("100", 0).await.unwrap();
}

#[tokio::test]
async fn a_moved_lease_is_lease_lost_and_stops_the_consumer() {
    let cp = lease_lost_after(|store, current| async move {
        store.take(&current, Holder::new("thief", "t2")).await
    })
    .await;
    assert!(cp.lost.is_cancelled());
}

#[tokio::test]
async fn a_write_of_an_earlier_tenure_of_this_worker_is_rejected() {
    // The same worker id took the lease again in a new tenure (a
    // restart, or another process under the same id).
    lease_lost_after(|store, current| async move {
        store.reclaim(&current, Holder::new("me", "t-later")).await
    })
    .await;
}

/// A checkpoint made after `moved` moved the lease (given the table and
/// the lease as read) from under the checkpointer: lease lost, and nothing
/// written. Returns the checkpointer.
async fn lease_lost_after<F>(moved: impl FnOnce(InMemoryLeaseStore, Lease) -> F) -> Checkpointer
where
    F: std::future::Future<Output = Result<Lease, crate::store::StoreError>>,
{
    let (store, mut cp) = setup().await;
    let current = store.get("s").await.unwrap().unwrap();
    moved(store.clone(), current).await.unwrap();
    cp.delivered_for_test("7", 0);
    let e = cp.checkpoint().await.unwrap_err();
    assert!(matches!(e, CheckpointError::LeaseLost { .. }), "{e}");
    assert_eq!(stored(&store).await, Checkpoint::TrimHorizon);
    cp
}

#[tokio::test]
async fn a_late_attempt_of_an_earlier_checkpoint_never_lands_after_a_newer_one() {
    let (store, mut cp) = setup().await;
    let lease = cp.lease.clone();
    let holder = lease.holder();
    // What a given-up first attempt to checkpoint 5 looks like when it
    // lands after the checkpointer moved on to 9.
    let late = CheckpointUpdate::to(Checkpoint::at("5", 0)).replacing(Checkpoint::TrimHorizon);
    deliver_and_checkpoint(&mut cp, "5", 0).await;
    deliver_and_checkpoint(&mut cp, "9", 0).await;
    let e = store.checkpoint("s", holder, &late).await.unwrap_err();
    assert!(e.is_condition_failed(), "{e}");
    assert_eq!(stored(&store).await, Checkpoint::at("9", 0));
    // A replay of the latest write reconciles as applied.
    let replay = CheckpointUpdate::to(Checkpoint::at("9", 0)).replacing(Checkpoint::at("5", 0));
    store.checkpoint("s", holder, &replay).await.unwrap();
}

#[tokio::test]
async fn a_caller_written_checkpoint_moves_on_only_when_its_write_succeeded() {
    let (_, mut cp) = setup().await;
    cp.delivered_for_test("9", 2);
    let out_of_range = cp
        .commit_with("10", 0, |_| async { Ok::<(), CommitFailure<()>>(()) })
        .await;
    assert!(matches!(
        out_of_range,
        Err(CheckpointError::OutOfRange { .. })
    ));
    let failed = cp
        .commit_with("9", 1, |p| async move {
            assert_eq!(p.update.checkpoint, Checkpoint::at("9", 1));
            assert_eq!(p.update.replacing, Some(Checkpoint::TrimHorizon));
            assert_eq!(p.holder(), Holder::new("me", "t1"));
            Err(CommitFailure::Other("sink said no"))
        })
        .await
        .unwrap();
    assert_eq!(failed, Err("sink said no"));
    assert_eq!(cp.last_checkpoint(), &Checkpoint::TrimHorizon);
    cp.commit_with("9", 1, |_| async { Ok::<(), CommitFailure<()>>(()) })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("9", 1));
    // Not at the same position again: its condition would still pass
    // after the first commit landed.
    let again = cp
        .commit_with("9", 1, |_| async { Ok::<(), CommitFailure<()>>(()) })
        .await;
    assert!(matches!(again, Err(CheckpointError::OutOfRange { .. })));
    let lost = cp
        .commit_with("9", 2, |_| async {
            Err::<(), _>(CommitFailure::<()>::LeaseLost)
        })
        .await;
    assert!(matches!(lost, Err(CheckpointError::LeaseLost { .. })));
    assert!(cp.lost.is_cancelled(), "the consumer stops");
}

/// Commits 9/`sub` through a write that finds the lease's checkpoint
/// moved to `to` by this tenure: the commit is not applied.
async fn commit_found_moved(cp: &mut Checkpointer, sub: u64, to: Checkpoint) {
    let failed = cp
        .commit_with("9", sub, move |_| async move {
            Err::<(), _>(CommitFailure::CheckpointMoved {
                to,
                error: "not applied",
            })
        })
        .await
        .unwrap();
    assert_eq!(failed, Err("not applied"));
}

#[tokio::test]
async fn a_commit_found_moved_by_this_tenure_is_not_applied_and_the_checkpointer_catches_up() {
    let (_, mut cp) = setup().await;
    cp.delivered_for_test("9", 5);
    commit_found_moved(&mut cp, 2, Checkpoint::at("9", 2)).await;
    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("9", 2));
    assert!(!cp.lost.is_cancelled(), "still this tenure's lease");
    // Never backwards, whatever the write reports.
    commit_found_moved(&mut cp, 4, Checkpoint::at("9", 1)).await;
    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("9", 2));
    // The next commit replaces the checkpoint the lease shows.
    cp.commit_with("9", 4, |p| async move {
        assert_eq!(p.update.replacing, Some(Checkpoint::at("9", 2)));
        Ok::<(), CommitFailure<()>>(())
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("9", 4));
}

/// Two lanes' checkpointers over one shard checkpointer, the shard
/// ended, lane 0 holding record 1 and lane 1 records 2 to 4.
async fn ended_lanes() -> (InMemoryLeaseStore, Vec<Checkpointer>) {
    let (store, shard) = setup().await;
    let window = Arc::new(std::sync::Mutex::new(Window::new(2)));
    let shard = Arc::new(tokio::sync::Mutex::new(shard));
    let mut lanes: Vec<Checkpointer> = {
        let template = shard.lock().await;
        (0..2)
            .map(|i| Checkpointer::for_lane(&template, i, Arc::clone(&window), Arc::clone(&shard)))
            .collect()
    };
    {
        let mut w = window.lock().unwrap();
        w.dispatch(0, Position::new("1", 0));
        for n in 2..=4u64 {
            w.dispatch(1, Position::new(n.to_string(), 0));
        }
    }
    lanes[0].delivered_for_test("1", 0);
    lanes[1].delivered_for_test("4", 0);
    shard.lock().await.set_shard_ended(vec!["child".into()]);
    for lane in &mut lanes {
        lane.set_shard_ended(vec!["child".into()]);
    }
    (store, lanes)
}

/// A lane that flushes what it held in chunks in `shard_ended`, each
/// chunk checkpointed: SHARD_END (which lets the children start) waits
/// for its last chunk, every chunk's checkpoint is accepted, and the
/// watermark moves with the chunks meanwhile.
#[tokio::test]
async fn a_lane_is_ended_only_after_its_last_record_is_checkpointed() {
    let (store, mut lanes) = ended_lanes().await;
    let mut seen = Vec::new();
    lanes[0].checkpoint().await.unwrap();
    seen.push(stored(&store).await);
    for n in ["2", "3", "4"] {
        lanes[1].checkpoint_at(n, 0).await.unwrap();
        seen.push(stored(&store).await);
    }
    assert_eq!(
        seen,
        vec![
            Checkpoint::at("1", 0),
            Checkpoint::at("2", 0),
            Checkpoint::at("3", 0),
            Checkpoint::ShardEnd
        ]
    );
    let lease = store.get("s").await.unwrap().unwrap();
    assert_eq!(
        lease.child_shard_ids.into_iter().collect::<Vec<_>>(),
        vec!["child".to_owned()]
    );
}

#[tokio::test]
async fn pending_checkpoints_are_stored_without_moving_the_checkpoint() {
    let (store, mut cp) = setup().await;
    cp.delivered_for_test("9", 0);
    cp.prepare_checkpoint("9", 0, Some(b"txn-42".to_vec()))
        .await
        .unwrap();
    let l = store.get("s").await.unwrap().unwrap();
    assert_eq!(l.checkpoint, Checkpoint::TrimHorizon);
    assert_eq!(l.pending_checkpoint, Some(Checkpoint::at("9", 0)));
    assert_eq!(l.pending_checkpoint_state.as_deref(), Some(&b"txn-42"[..]));
    cp.checkpoint_at("9", 0).await.unwrap();
    let l = store.get("s").await.unwrap().unwrap();
    assert_eq!(
        (l.checkpoint, l.pending_checkpoint),
        (Checkpoint::at("9", 0), None)
    );
}

/// `n` leases `s0..` held by `me`, and a checkpointer for each writing to
/// `store` under a 5 s policy through one batcher.
async fn batched(
    store: &InMemoryLeaseStore,
    through: Arc<dyn LeaseStore>,
    n: usize,
) -> Vec<Checkpointer> {
    batched_under(
        store,
        through,
        n,
        CheckpointPolicy::every(Duration::from_secs(5)),
    )
    .await
}

/// [`batched`] under `policy`, its batcher on the policy's period.
async fn batched_under(
    store: &InMemoryLeaseStore,
    through: Arc<dyn LeaseStore>,
    n: usize,
    policy: CheckpointPolicy,
) -> Vec<Checkpointer> {
    let period = policy.period().expect("a policy with a period");
    let batcher = Batcher::new(Arc::clone(&through), period);
    let mut cps = Vec::new();
    for i in 0..n {
        let lease = store
            .create_if_absent(&Lease::new(format!("s{i}"), Checkpoint::TrimHorizon))
            .await
            .unwrap();
        let lease = store.take(&lease, Holder::new("me", "t1")).await.unwrap();
        let handle = LeaseHandle::detached(lease, Duration::from_secs(60));
        cps.push(
            Checkpointer::for_test(Arc::clone(&through), handle)
                .with_policy(policy)
                .with_batcher(Some(batcher.clone())),
        );
    }
    cps
}

/// Under a batcher, every shard's policy writes go in one request per
/// boundary, whether the processor's own `checkpoint()` or the consumer's
/// flush finds the position due; neither waits for the write, and a
/// position asked for meanwhile is held for the next boundary.
#[tokio::test(start_paused = true)]
async fn held_back_positions_of_several_shards_go_in_one_request() {
    use crate::store::StoreOp;
    use crate::store::metered::MeteredStore;
    let store = InMemoryLeaseStore::new();
    let metered = MeteredStore::new(store.clone());
    let stats = Arc::clone(metered.stats());
    let mut cps = batched(&store, Arc::new(metered), 4).await;
    let requests = || {
        let snap = stats.snapshot();
        (
            snap.op(StoreOp::CheckpointMany).calls,
            snap.op(StoreOp::Checkpoint).calls,
        )
    };
    // The first writes go at once, together.
    for cp in &mut cps {
        deliver_and_checkpoint(cp, "100", 0).await;
        assert!(cp.in_flight.is_some(), "handed over without waiting");
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for (i, cp) in cps.iter_mut().enumerate() {
        cp.flush_due().await.unwrap();
        assert_eq!(cp.last_checkpoint(), &Checkpoint::at("100", 0));
        // Held back until the boundary 5 s after the batcher started.
        tokio::time::sleep(Duration::from_millis(900)).await;
        deliver_and_checkpoint(cp, &format!("2{i}0"), 0).await;
        assert!(cp.in_flight.is_none());
    }
    assert_eq!(requests(), (1, 0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // At the boundary the processors' own calls hand their positions over.
    for cp in &mut cps {
        deliver_and_checkpoint(cp, "300", 0).await;
        assert!(cp.in_flight.is_some(), "handed over without waiting");
        deliver_and_checkpoint(cp, "400", 0).await;
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for cp in &mut cps {
        cp.flush_due().await.unwrap();
        assert_eq!(cp.last_checkpoint(), &Checkpoint::at("300", 0));
        assert_eq!(cp.asked(), &Checkpoint::at("400", 0), "held back");
    }
    assert_eq!(
        requests(),
        (2, 0),
        "one request per boundary, no single write"
    );
    // The next boundary, found by the consumers' flushes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for cp in &mut cps {
        cp.flush_due().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for (i, cp) in cps.iter_mut().enumerate() {
        cp.flush_due().await.unwrap();
        assert_eq!(
            stored_at(&store, &format!("s{i}")).await,
            Checkpoint::at("400", 0)
        );
    }
    assert_eq!(requests(), (3, 0));
}

/// A held-back position the batch finds taken by another worker stops the
/// shard, as a single write's would; one whose batch failed is written
/// again alone, and lands.
#[tokio::test(start_paused = true)]
async fn a_batched_write_on_a_lost_lease_stops_the_shard_and_a_failed_one_is_retried() {
    use crate::store::StoreOp;
    use crate::store::memory::Fault;
    let store = InMemoryLeaseStore::new();
    let mut cps = batched(&store, Arc::new(store.clone()), 2).await;
    for cp in &mut cps {
        deliver_and_checkpoint(cp, "100", 0).await;
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for cp in &mut cps {
        cp.flush_due().await.unwrap();
        deliver_and_checkpoint(cp, "200", 0).await;
    }
    let seen = store.get("s0").await.unwrap().unwrap();
    store.take(&seen, Holder::new("other", "t9")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    for cp in &mut cps {
        cp.flush_due().await.unwrap();
        assert!(cp.in_flight.is_some());
    }
    // The memory store writes a batch as single writes side by side: both
    // fail in the batch, and are written again alone.
    for _ in 0..2 {
        store.inject(
            StoreOp::Checkpoint,
            Fault::Error(crate::store::StoreErrorKind::Retryable),
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(matches!(
        cps[0].flush_due().await,
        Err(CheckpointError::LeaseLost { .. })
    ));
    assert!(cps[0].lost.is_cancelled(), "the consumer stops");
    cps[1].flush_due().await.unwrap();
    assert_eq!(cps[1].last_checkpoint(), &Checkpoint::at("200", 0));
    assert_eq!(stored_at(&store, "s1").await, Checkpoint::at("200", 0));
    assert_eq!(stored_at(&store, "s0").await, Checkpoint::at("100", 0));
}

/// One shard's checkpointer under a batcher, its first position (100)
/// handed over and its batch not gone yet.
async fn first_write_in_flight() -> (InMemoryLeaseStore, Checkpointer) {
    let store = InMemoryLeaseStore::new();
    let mut cp = batched(&store, Arc::new(store.clone()), 1).await.remove(0);
    deliver_and_checkpoint(&mut cp, "100", 0).await;
    assert!(cp.in_flight.is_some(), "queued");
    (store, cp)
}

/// A write of the shard's own (the tenure ending) takes a position back
/// from a batch that has not gone and writes the latest at once; a wait
/// for a batch's answer that is cut off leaves the position in flight.
#[tokio::test(start_paused = true)]
async fn a_tenure_ending_write_takes_back_a_queued_position_and_a_cut_wait_keeps_it() {
    let (store, mut cp) = first_write_in_flight().await;
    let cp = &mut cp;
    let cut = tokio::time::timeout(Duration::from_millis(10), cp.settle(true)).await;
    assert!(cut.is_err(), "cut off while the batch waits");
    assert!(cp.in_flight.is_some(), "still in flight");
    cp.write_every_call();
    deliver_and_checkpoint(cp, "200", 0).await;
    assert!(cp.in_flight.is_none(), "taken back");
    assert_eq!(stored_at(&store, "s0").await, Checkpoint::at("200", 0));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        stored_at(&store, "s0").await,
        Checkpoint::at("200", 0),
        "the withdrawn position never lands"
    );
}

/// A tenure-ending write cut off while it waits (a processor's call past
/// its timeout) leaves its position, not the older one in flight, for
/// the last flush: a graceful end still writes the latest position.
#[tokio::test(start_paused = true)]
async fn a_cut_tenure_ending_write_leaves_the_latest_position_for_the_last_flush() {
    use crate::store::StoreOp;
    use crate::store::memory::Fault;
    let (store, mut cp) = first_write_in_flight().await;
    let cp = &mut cp;
    cp.write_every_call();
    store.inject(StoreOp::Checkpoint, Fault::Delay(Duration::from_secs(30)));
    cp.delivered_for_test("200", 0);
    let cut = tokio::time::timeout(Duration::from_secs(1), cp.checkpoint()).await;
    assert!(cut.is_err(), "cut off while its write waits");
    cp.flush().await.unwrap();
    assert_eq!(stored_at(&store, "s0").await, Checkpoint::at("200", 0));
}

/// Records delivered while a position is in flight count towards the
/// next write's record count.
#[tokio::test(start_paused = true)]
async fn records_delivered_while_a_position_is_in_flight_count_towards_the_next() {
    let store = InMemoryLeaseStore::new();
    let policy = CheckpointPolicy::every(Duration::from_secs(60)).or_every_records(10);
    let mut cp = batched_under(&store, Arc::new(store.clone()), 1, policy)
        .await
        .remove(0);
    deliver_and_checkpoint(&mut cp, "100", 0).await;
    for i in 0..10 {
        cp.count_dispatched(1);
        deliver_and_checkpoint(&mut cp, &format!("2{i:02}"), 0).await;
    }
    assert!(cp.in_flight.is_some(), "the first write is in flight");
    tokio::time::sleep(Duration::from_secs(2)).await;
    cp.flush_due().await.unwrap();
    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("100", 0));
    assert!(
        cp.in_flight.is_some(),
        "10 records since: the next goes at once"
    );
}

/// One lease whose writes hang holds back no other shard's answer: the
/// batch is cut at the store's call timeout, and each write goes again
/// alone, side by side, answered as it lands.
#[tokio::test(start_paused = true)]
async fn a_lease_whose_writes_hang_holds_back_no_other_shards_answer() {
    use crate::store::timeout::TimeoutStore;
    let store = InMemoryLeaseStore::new();
    let through = TimeoutStore::new(store.clone(), Duration::from_secs(2));
    let mut cps = batched(&store, Arc::new(through), 3).await;
    store.blackhole(&["s0"]);
    for cp in &mut cps {
        deliver_and_checkpoint(cp, "100", 0).await;
    }
    // The window (1 s), the batch cut (2 s), then the writes alone.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    for cp in &mut cps[1..] {
        cp.flush_due().await.unwrap();
        assert_eq!(cp.last_checkpoint(), &Checkpoint::at("100", 0));
    }
    cps[0].flush_due().await.unwrap();
    assert!(cps[0].in_flight.is_some(), "still tried alone");
}

async fn stored_at(store: &InMemoryLeaseStore, key: &str) -> Checkpoint {
    store.get(key).await.unwrap().unwrap().checkpoint
}

/// A sequence number given with leading zeros orders as the number, but
/// Kinesis refuses to resume at its text (every later owner would fail
/// to open the shard), and a commit at "0123" after one at "123" passed
/// the "not at the same position again" check, applying its writes twice.
#[tokio::test]
async fn a_sequence_number_with_leading_zeros_is_stored_as_kinesis_gives_it() {
    let (store, mut cp) = setup().await;
    cp.delivered_for_test("123", 0);
    cp.checkpoint_at("000123", 0).await.unwrap();
    assert_eq!(stored(&store).await, Checkpoint::at("123", 0));
    let again = cp
        .commit_with("0123", 0, |_| async { Ok::<(), CommitFailure<()>>(()) })
        .await;
    assert!(
        matches!(again, Err(CheckpointError::OutOfRange { .. })),
        "{again:?}"
    );
    // A record's own number, padded, checkpointed as delivered: a commit
    // at it unpadded is at the same position still.
    cp.delivered_for_test("000124", 0);
    cp.checkpoint().await.unwrap();
    let again = cp
        .commit_with("124", 0, |_| async { Ok::<(), CommitFailure<()>>(()) })
        .await;
    assert!(
        matches!(again, Err(CheckpointError::OutOfRange { .. })),
        "{again:?}"
    );
    assert_eq!(sequence::canonical("0"), "0");
    assert_eq!(sequence::canonical("000"), "0");
    assert_eq!(sequence::canonical("LATEST"), "LATEST");
}

/// A write whose first attempt landed with its answer lost and whose
/// retries all failed leaves the lease at a checkpoint of this tenure the
/// checkpointer never saw confirmed. The next write found it and took the
/// lease for lost: the shard was given up and its records since that
/// checkpoint processed again. It catches up and writes on.
#[tokio::test(start_paused = true)]
async fn a_write_that_landed_unanswered_is_caught_up_with_not_taken_for_a_lost_lease() {
    use crate::store::StoreOp;
    use crate::store::memory::Fault;
    let (store, mut cp) = setup().await;
    cp.delivered_for_test("100", 0);
    store.inject(StoreOp::Checkpoint, Fault::LostResponse);
    for _ in 0..5 {
        store.inject(
            StoreOp::Checkpoint,
            Fault::Error(crate::store::StoreErrorKind::Retryable),
        );
    }
    let unanswered = cp.checkpoint().await;
    assert!(
        matches!(unanswered, Err(CheckpointError::Store(_))),
        "{unanswered:?}"
    );
    assert_eq!(stored(&store).await, Checkpoint::at("100", 0), "it landed");
    deliver_and_checkpoint(&mut cp, "200", 0).await;
    assert_eq!(stored(&store).await, Checkpoint::at("200", 0));
    assert!(!cp.lost.is_cancelled(), "the consumer goes on");
}

/// A record the reader delivers whole at a checkpoint inside it (another
/// version or the Java KCL split it and checkpointed at (S, 2)) is not
/// done: the sub-records after the checkpoint are only in it. The
/// checkpointer called it covered while the reader delivered it again,
/// and an exactly-once processor that skips covered records skipped it,
/// its checkpoint then passing sub-records never applied.
#[tokio::test]
async fn a_record_delivered_whole_at_a_checkpoint_inside_it_is_not_covered() {
    let at = |seq: &str, sub: u64, aggregated: bool| Record {
        data: Default::default(),
        partition_key: "pk".into(),
        explicit_hash_key: None,
        sequence_number: seq.into(),
        sub_sequence_number: sub,
        approximate_arrival: None,
        aggregated,
    };
    let (_, mut cp) = setup().await;
    deliver_and_checkpoint(&mut cp, "500", 2).await;
    assert!(!cp.is_checkpointed(&at("500", 0, false)), "whole: not done");
    assert!(cp.is_checkpointed(&at("500", 2, true)), "split: done to 2");
    assert!(!cp.is_checkpointed(&at("500", 3, true)));
    assert!(cp.is_checkpointed(&at("499", 0, false)), "before it");
    deliver_and_checkpoint(&mut cp, "600", 0).await;
    assert!(cp.is_checkpointed(&at("600", 0, false)));
}
