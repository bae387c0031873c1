//! The progress registry's tests: what consumers report, and the gauges
//! it keeps.

use super::*;
use crate::test_util::metrics::Recorded;

/// Every gauge set through it: a recorder local to one test
/// (`metrics::with_local_recorder`), so that tests running at once do
/// not see each other's values.
#[derive(Debug, Default, Clone)]
struct Gauges(Recorded);

impl Gauges {
    fn of(&self, name: &str) -> Option<f64> {
        self.0.gauge(name, &[("stream", "s"), ("shard", "shard-1")])
    }
}

#[test]
fn records_waiting_gauge_counts_a_batch_until_its_call_returns_and_0_once_stopped() {
    let gauges = Gauges::default();
    let registry = ProgressRegistry::default();
    let tracker = registry.track("k", "s", "shard-1");
    let record = |f: &dyn Fn()| metrics::with_local_recorder(&gauges.0, f);
    let waiting = || gauges.of(SHARD_RECORDS_WAITING);

    // Idle: an empty read publishes 0, so a held shard has the series.
    record(&|| tracker.fetched(0, Some(0)));
    assert_eq!(waiting(), Some(0.0));
    // Two batches read (lanes read on while a lane is in its call).
    record(&|| tracker.fetched(5, Some(1000)));
    record(&|| tracker.fetched(3, None));
    assert_eq!(waiting(), Some(8.0));
    // The shard then goes quiet: empty reads leave the count alone.
    record(&|| tracker.fetched(0, Some(0)));
    assert_eq!(waiting(), Some(8.0));
    // A batch counts until its call returns, then leaves the count.
    record(&|| tracker.delivered(3));
    assert_eq!(waiting(), Some(5.0));
    assert!(
        gauges
            .of(SHARD_LAST_DELIVERY_TIMESTAMP)
            .is_some_and(|t| t > 0.0)
    );
    record(&|| tracker.delivered(5));
    assert_eq!(waiting(), Some(0.0));
    assert_eq!(registry.snapshot()[0].records_waiting, 0);

    // A processor hung on its batch when the consumer stops (a
    // processor_timeout, a lost lease): nothing of it stays behind.
    record(&|| tracker.fetched(4, Some(0)));
    record(&|| tracker.checkpointed("49590".into()));
    assert_eq!(waiting(), Some(4.0));
    assert!(
        gauges
            .of(SHARD_LAST_CHECKPOINT_TIMESTAMP)
            .is_some_and(|t| t > 0.0)
    );
    record(&|| tracker.stopped());
    assert_eq!(waiting(), Some(0.0));
    assert_eq!(gauges.of(SHARD_LAST_DELIVERY_TIMESTAMP), Some(0.0));
    assert_eq!(gauges.of(SHARD_LAST_CHECKPOINT_TIMESTAMP), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn a_shard_with_records_waiting_and_no_progress_past_the_bound_is_stalled() {
    let registry = ProgressRegistry::default();
    let tracker = registry.track("k", "s", "shard-1");
    let bound = Duration::from_secs(10);
    tokio::time::advance(Duration::from_secs(60)).await;
    // Idle and caught up: nothing waits, so nothing stalls.
    tracker.fetched(0, Some(0));
    assert!(!registry.snapshot()[0].is_stalled(bound, Instant::now()));
    tracker.fetched(5, Some(1000));
    let call = tracker.call_started("process_records");
    tokio::time::advance(Duration::from_secs(11)).await;
    let seen = registry.snapshot().remove(0);
    assert_eq!(seen.records_waiting, 5);
    assert_eq!(
        seen.processor_call.map(|c| c.stage),
        Some("process_records")
    );
    assert!(seen.is_stalled(bound, Instant::now()));
    drop(call);
    tracker.delivered(5);
    tracker.checkpointed("49590".into());
    let seen = registry.snapshot().remove(0);
    assert_eq!(seen.records_waiting, 0);
    assert_eq!(seen.last_delivery.map(|d| d.records), Some(5));
    assert_eq!(
        seen.last_checkpoint.as_ref().map(|c| c.value.as_str()),
        Some("49590")
    );
    assert!(!seen.is_stalled(bound, Instant::now()));
}

/// A shard idle past the bound is not stalled the moment a record comes:
/// its work has waited since then, not since its last batch (the liveness
/// probe failed at once, and a pod was restarted for reading a record).
#[tokio::test(start_paused = true)]
async fn work_arriving_after_a_long_idle_is_not_stalled_at_once() {
    let registry = ProgressRegistry::default();
    let tracker = registry.track("k", "s", "shard-1");
    let bound = Duration::from_secs(10);
    tracker.fetched(1, Some(0));
    tracker.delivered(1);
    tokio::time::advance(Duration::from_secs(600)).await;
    tracker.fetched(5, Some(1000));
    let call = tracker.call_started("process_records");
    assert!(!registry.snapshot()[0].is_stalled(bound, Instant::now()));
    tokio::time::advance(Duration::from_secs(11)).await;
    assert!(registry.snapshot()[0].is_stalled(bound, Instant::now()));
    drop(call);
    tracker.delivered(5);
    tracker.fetched(0, Some(0));
    assert_eq!(registry.snapshot()[0].waiting_since, None);
}

#[test]
fn a_finishing_consumer_leaves_the_newer_tenures_progress_in_place() {
    let registry = ProgressRegistry::default();
    let old = registry.track("k", "s", "shard-1");
    let new = registry.track("k", "s", "shard-1");
    new.lanes(3);
    drop(old);
    assert_eq!(registry.snapshot().len(), 1);
    assert_eq!(registry.snapshot()[0].lanes, 3);
    let clone = new.clone();
    drop(new);
    assert_eq!(registry.snapshot().len(), 1);
    drop(clone);
    assert!(registry.snapshot().is_empty());
}

/// A consumer whose processor call hangs past its tenure stays stalled in
/// sight when a newer consumer of its lease starts (the lease fenced in a
/// lease-table outage, then taken back): the newer one replaced it in the
/// registry, and the hung call, which holds its read buffers for good,
/// was seen by no liveness check. It leaves once its call ends.
#[tokio::test(start_paused = true)]
async fn a_call_hung_past_its_tenure_stays_stalled_after_a_newer_consumer_starts() {
    let registry = ProgressRegistry::default();
    let bound = Duration::from_secs(60);
    let hung = registry.track("k", "s", "shard-1");
    let call = hung.call_started("process_records");
    tokio::time::sleep(Duration::from_secs(40)).await;
    let newer = registry.track("k", "s", "shard-1");
    newer.fetched(0, Some(0));
    tokio::time::sleep(Duration::from_secs(40)).await;
    let stalled = registry.stalled(bound, Instant::now());
    assert_eq!(stalled.len(), 1, "{stalled:?}");
    assert_eq!(
        stalled[0].processor_call.map(|c| c.stage),
        Some("process_records")
    );
    assert_eq!(registry.snapshot().len(), 1, "the newest consumer is shown");
    drop(call);
    assert!(registry.stalled(bound, Instant::now()).is_empty());
    drop(hung);
    assert!(registry.map().replaced.is_empty(), "gone with its consumer");
}
