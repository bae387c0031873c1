//! The lanes' watermark window when one lane never checkpoints: a shard in
//! 4 lanes whose lane of the first record holds everything it gets, the
//! other lanes checkpointing every batch. That lane pins the watermark at
//! the shard's first record, so every record handed out stays in the
//! window; the consumer must stop fetching at the window's bound
//! (`MAX_LANE_RECORDS_IN_FLIGHT`, plus the batch that crossed it) instead
//! of growing it with the stream.
//!
//! In process, on the in-memory source and lease store under a paused
//! clock (the figure is a count, not a time): the peak is the largest
//! value of the worker's own `kcl_lane_records_in_flight` gauge, caught by
//! a metrics recorder local to the runtime's thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use kcl::{Checkpointer, ProcessorError, RecordBatch, RecordProcessor, ShardContext};
use kcl_core::checkpointer::MAX_LANE_RECORDS_IN_FLIGHT;
use kcl_core::source::memory::InMemoryShardSource;
use metrics::{Counter, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, SharedString, Unit};

use crate::Section;
use crate::bench_parallel::lanes_worker;

const STREAM: &str = "lanes-window";
const LANES: usize = 4;
const KEYS: usize = 64;
/// The most records a `GetRecords` returns.
const BATCH: usize = 10_000;
/// Three times the bound: without it, all of them would pile up.
const RECORDS: usize = 3 * MAX_LANE_RECORDS_IN_FLIGHT;
const GAUGE: &str = "kcl_lane_records_in_flight";

/// The largest value `GAUGE` was set to.
#[derive(Debug, Default)]
struct Peak(AtomicU64);

impl GaugeFn for Peak {
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, value: f64) {
        self.0.fetch_max(value as u64, Ordering::Relaxed);
    }
}

/// Hands `GAUGE` to [`Peak`] and drops every other metric.
#[derive(Debug)]
struct PeakRecorder(Arc<Peak>);

impl metrics::Recorder for PeakRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        if key.name() == GAUGE {
            Gauge::from_arc(Arc::clone(&self.0))
        } else {
            Gauge::noop()
        }
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// The lane that gets the shard's first record (`k0:0`) never
/// checkpoints; the others checkpoint every batch.
struct OneLaneHolds {
    delivered: Arc<AtomicU64>,
    holds: bool,
}

#[kcl::async_trait]
impl RecordProcessor for OneLaneHolds {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        self.delivered
            .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
        self.holds |= batch.records.iter().any(|r| &r.data[..] == b"k0:0");
        if !self.holds {
            cp.checkpoint().await?;
        }
        Ok(())
    }
}

/// Records handed to the lanes when the fetching stopped.
async fn hold_one_lane() -> anyhow::Result<u64> {
    let source = InMemoryShardSource::new().with_max_records(BATCH);
    source.create_stream(STREAM, 1);
    for i in 0..RECORDS {
        let (key, n) = (i % KEYS, i / KEYS);
        source
            .put(STREAM, &format!("k{key}"), format!("k{key}:{n}"))
            .context("putting a record")?;
    }
    let delivered = Arc::new(AtomicU64::new(0));
    let factory = {
        let delivered = Arc::clone(&delivered);
        move |_: &ShardContext| OneLaneHolds {
            delivered: Arc::clone(&delivered),
            holds: false,
        }
    };
    let worker = lanes_worker("bench-lanes-window", STREAM, LANES, source, factory)?;
    let handle = worker.handle();
    let task = tokio::spawn(worker.run());
    // Paused clock: a minute without a delivery is a stall, not a slow run.
    let mut last = u64::MAX;
    let mut minutes = 0;
    let stalled = loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let now = delivered.load(Ordering::Relaxed);
        if now == last {
            break now;
        }
        last = now;
        minutes += 1;
        ensure!(minutes < 60, "deliveries never stopped ({now} records)");
    };
    handle.shutdown();
    task.await??;
    Ok(stalled)
}

pub(crate) fn window_peak_slots() -> anyhow::Result<Section> {
    let peak = Arc::new(Peak::default());
    let recorder = PeakRecorder(Arc::clone(&peak));
    // Every task of a current-thread runtime runs on this thread, so a
    // recorder local to it sees every gauge the worker sets.
    let _local = metrics::set_default_local_recorder(&recorder);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let stalled = rt.block_on(hold_one_lane())?;
    let peak = peak.0.load(Ordering::Relaxed);
    let bound = (MAX_LANE_RECORDS_IN_FLIGHT + BATCH - 1) as u64;
    let mut s = Section::new("Lanes: the watermark window when one lane never checkpoints");
    s.what = format!(
        "One shard of {RECORDS} records over {KEYS} keys in {LANES} lanes, in process (the \
         in-memory source at {BATCH} records a batch, the in-memory lease store, a paused \
         clock). The lane that gets the shard's first record never checkpoints, the others \
         checkpoint every batch, so the watermark stays at the first record and every record \
         handed out stays in the window. The peak is the largest value of the worker's \
         `{GAUGE}` gauge."
    );
    s.row("window peak", format!("{peak} slots"));
    s.row(
        "bound",
        format!(
            "{bound} slots ({MAX_LANE_RECORDS_IN_FLIGHT} `MAX_LANE_RECORDS_IN_FLIGHT`, plus the \
             batch that crossed it)"
        ),
    );
    s.row(
        "records handed to the lanes before the fetching stopped",
        format!("{stalled} of {RECORDS}"),
    );
    s.figure("lanes_window_peak_slots", peak as f64, "slots");
    s.figure("lanes_window_slot_bound", bound as f64, "slots");
    if peak == 0 {
        s.failed = Some(format!("the {GAUGE} gauge was never set"));
    } else if peak > bound {
        s.failed = Some(format!("the window peaked at {peak} slots, above {bound}"));
    } else if stalled != peak {
        s.failed = Some(format!(
            "{stalled} records were handed out but the window peaked at {peak}: the held lane's \
             first record pins them all"
        ));
    }
    s.headline = format!(
        "one lane never checkpointing: the window peaks at {peak} slots (bound {bound}), \
         {stalled} of {RECORDS} records fetched, then the shard waits"
    );
    s.settings = format!(
        "Production defaults but {LANES} lanes and TRIM_HORIZON; the bound is not a setting. \
         About 150 bytes a slot, so at most about {} MB a shard.",
        (bound * 150).div_ceil(1_000_000)
    );
    s.java = "The Java KCL has no lanes: a shard is processed one batch at a time.".into();
    s.limits = "Nothing machine-bound: the peak follows from the bound and the batch size. A \
                lane that holds records stalls its shard until it checkpoints (or the \
                consumer stops and `shutdown_requested` does)."
        .into();
    Ok(s)
}
