//! One error policy at open and mid-read: a whole worker on the in-memory
//! store, with a source whose opens and reads fail as scripted, under a
//! paused clock. A fatal error gives the shard back after five attempts
//! in a row wherever it shows (counted and logged); a transient one is
//! retried and keeps the shard; lanes go on with what was fetched while
//! the reader is reopened. Its own test binary: it installs a global
//! metrics recorder.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kcl_core::LeaseConfig;
use kcl_core::checkpointer::Checkpointer;
use kcl_core::processor::{ProcessorError, RecordBatch, RecordProcessor, ShardContext};
use kcl_core::source::memory::InMemoryShardSource;
use kcl_core::source::{
    Batch, InitialPosition, OpenShard, ShardInfo, ShardReader, ShardSource, SourceError,
    StartPosition,
};
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::test_util::fleet::{self, Payloads, Seen};
use kcl_core::test_util::metrics::Recorded;
use kcl_core::worker::WorkerHandle;

/// What one open does, in script order; opens past the script succeed.
#[derive(Debug, Clone, Copy)]
enum Open {
    /// The open fails with this error.
    Fails(Kind),
    /// The open succeeds, and the reader's first fetch fails with this.
    ReadFails(Kind),
    /// As `ReadFails`, with three records (`late-0` to `late-2`) written
    /// between the open and that fetch.
    WrittenThenReadFails(Kind),
    /// The open succeeds, and the reader's fetch after `batches` fails.
    ReadsThenFails { batches: usize, kind: Kind },
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// What Kinesis rejects for good (an `InvalidArgument` that is no
    /// trimmed checkpoint).
    Fatal,
    /// A throttle or a 5xx the reader already retried.
    Transient,
}

impl Kind {
    fn error(self, stream: &str, shard: &str) -> SourceError {
        match self {
            Kind::Fatal => SourceError::Fatal {
                stream: stream.to_owned(),
                message: format!(
                    "{shard}: Kinesis rejected the request (InvalidArgumentException)"
                ),
                source: None,
            },
            Kind::Transient => SourceError::Retryable {
                stream: stream.to_owned(),
                shard: shard.to_owned(),
                source: "injected: InternalFailure".into(),
            },
        }
    }
}

/// The in-memory source, with scripted failures. Each open records the
/// lease table's owner changes so far: opens with the same count belong
/// to one tenure.
#[derive(Debug)]
struct Scripted {
    inner: InMemoryShardSource,
    table: InMemoryLeaseStore,
    script: Mutex<VecDeque<Open>>,
    opens: Mutex<Vec<usize>>,
    /// Where each open started.
    positions: Mutex<Vec<StartPosition>>,
    /// What the processors had seen, and how much of it at each open.
    seen: Seen,
    seen_at_opens: Mutex<Vec<usize>>,
}

impl Scripted {
    /// How many opens each tenure made, in order.
    fn opens_per_tenure(&self) -> Vec<usize> {
        let mut groups: Vec<(usize, usize)> = Vec::new();
        for tenure in self.opens.lock().unwrap().iter() {
            match groups.last_mut() {
                Some((t, n)) if t == tenure => *n += 1,
                _ => groups.push((*tenure, 1)),
            }
        }
        groups.into_iter().map(|(_, n)| n).collect()
    }
}

#[async_trait]
impl ShardSource for Scripted {
    async fn list_shards(&self, stream: &str) -> Result<Vec<ShardInfo>, SourceError> {
        self.inner.list_shards(stream).await
    }

    async fn open(&self, request: OpenShard) -> Result<Box<dyn ShardReader>, SourceError> {
        self.opens
            .lock()
            .unwrap()
            .push(self.table.owner_changes().len());
        self.positions
            .lock()
            .unwrap()
            .push(request.position.clone());
        let seen = self.seen.lock().unwrap().len();
        self.seen_at_opens.lock().unwrap().push(seen);
        let next = self.script.lock().unwrap().pop_front();
        let (stream, shard) = (request.stream.clone(), request.shard_id.clone());
        match next {
            Some(Open::Fails(kind)) => Err(kind.error(&stream, &shard)),
            Some(Open::WrittenThenReadFails(kind)) => {
                let inner = self.inner.open(request).await?;
                for i in 0..3 {
                    self.inner.put(&stream, "pk", format!("late-{i}")).unwrap();
                }
                Ok(Box::new(FailsAfter {
                    inner,
                    batches: 0,
                    error: Some(kind.error(&stream, &shard)),
                }))
            }
            Some(Open::ReadFails(kind)) => Ok(Box::new(FailsAfter {
                inner: self.inner.open(request).await?,
                batches: 0,
                error: Some(kind.error(&stream, &shard)),
            })),
            Some(Open::ReadsThenFails { batches, kind }) => Ok(Box::new(FailsAfter {
                inner: self.inner.open(request).await?,
                batches,
                error: Some(kind.error(&stream, &shard)),
            })),
            None => self.inner.open(request).await,
        }
    }
}

/// A reader whose fetch after `batches` fails.
#[derive(Debug)]
struct FailsAfter {
    inner: Box<dyn ShardReader>,
    batches: usize,
    error: Option<SourceError>,
}

#[async_trait]
impl ShardReader for FailsAfter {
    async fn next_batch(&mut self) -> Result<Batch, SourceError> {
        if self.batches > 0 {
            self.batches -= 1;
            return self.inner.next_batch().await;
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => self.inner.next_batch().await,
        }
    }
}

/// A processor that takes a second a batch, keeping what it sees as
/// [`Payloads`] does.
struct Slow(Payloads);

#[async_trait]
impl RecordProcessor for Slow {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.0.process_records(batch, cp).await
    }

    async fn shutdown_requested(&mut self, cp: &mut Checkpointer) -> Result<(), ProcessorError> {
        self.0.shutdown_requested(cp).await
    }
}

/// Counters by `name{labels}`, from every test of this binary; each test
/// reads those of its own stream.
/// How often `stream`'s shard was given back as unreadable at `stage`.
fn released_unreadable(stream: &str, shard: &str, stage: &str) -> u64 {
    Recorded::global().counter(
        "kcl_unreadable_shards_released_total",
        &[("shard", shard), ("stage", stage), ("stream", stream)],
    )
}

/// One worker on a one-shard `stream` whose opens follow `script`, and
/// five records in the shard.
struct Run {
    source: Arc<Scripted>,
    shard: String,
    seen: Seen,
    handle: WorkerHandle,
}

impl Run {
    fn start(stream: &str, script: Vec<Open>) -> Run {
        Self::start_at(stream, script, InitialPosition::TrimHorizon)
    }

    /// [`Run::start`], a new lease starting at `initial`.
    fn start_at(stream: &str, script: Vec<Open>, initial: InitialPosition) -> Run {
        Self::start_with(stream, script, initial, None)
    }

    /// [`Run::start_at`]; with `lanes`, in that many lanes of [`Slow`]
    /// processors, one record a batch.
    fn start_with(
        stream: &str,
        script: Vec<Open>,
        initial: InitialPosition,
        lanes: Option<usize>,
    ) -> Run {
        Recorded::global();
        let inner = match lanes {
            Some(_) => InMemoryShardSource::new().with_max_records(1),
            None => InMemoryShardSource::new(),
        };
        let shard = inner.create_stream(stream, 1).remove(0);
        for i in 0..5 {
            inner.put(stream, "pk", format!("r{i}")).unwrap();
        }
        let table = InMemoryLeaseStore::new();
        let seen = Seen::default();
        let source = Arc::new(Scripted {
            inner,
            table: table.clone(),
            script: Mutex::new(script.into()),
            opens: Mutex::default(),
            positions: Mutex::default(),
            seen: Arc::clone(&seen),
            seen_at_opens: Mutex::default(),
        });
        let lease = LeaseConfig::builder("w-a")
            .taker_interval(Duration::from_secs(10))
            .build()
            .unwrap();
        let config = fleet::one_stream(lease, stream)
            .initial_position(initial)
            // The attempts' count is what these tests judge: the time
            // bound on failing reads (tests/progress.rs) stays out of it.
            .max_read_failure_time(Duration::from_secs(3600))
            .parallelism_per_shard(lanes.unwrap_or(1))
            .build()
            .unwrap();
        let table = Arc::new(table);
        let source_dyn = Arc::clone(&source) as Arc<dyn ShardSource>;
        let payloads = Payloads::factory(&seen);
        let (handle, _) = match lanes {
            Some(_) => fleet::spawn_worker(config, table, source_dyn, move |ctx: &ShardContext| {
                Slow(payloads(ctx))
            }),
            None => fleet::spawn_worker(config, table, source_dyn, payloads),
        };
        Run {
            source,
            shard,
            seen,
            handle,
        }
    }

    /// Waits (in paused time) until the five records were processed.
    async fn wait_for_records(&self) {
        fleet::wait_until(
            Duration::from_secs(600),
            Duration::from_millis(100),
            || self.seen.lock().unwrap().len() >= 5,
            || {
                format!(
                    "records never processed; opens per tenure: {:?}",
                    self.source.opens_per_tenure()
                )
            },
        )
        .await;
        self.handle.shutdown();
    }

    fn seen(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter().map(|(_, payload)| payload.clone()).collect()
    }

    fn released(&self) -> u64 {
        self.handle.status().leases.released
    }
}

fn records() -> Vec<String> {
    (0..5).map(|i| format!("r{i}")).collect()
}

/// Runs `script` on `stream` until the five records were processed, and
/// checks the opens in each tenure, that the shard was given back
/// `released` times (as the worker's status and the `open` stage's counter
/// say), and that every record arrived once, in order.
async fn assert_run(stream: &str, script: Vec<Open>, opens_per_tenure: &[usize], released: u64) {
    let run = Run::start(stream, script);
    run.wait_for_records().await;
    assert_eq!(run.source.opens_per_tenure(), opens_per_tenure);
    assert_eq!(run.released(), released);
    assert_eq!(released_unreadable(stream, &run.shard, "open"), released);
    assert_eq!(run.seen(), records());
}

#[tokio::test(start_paused = true)]
async fn a_rejected_argument_at_open_gives_the_shard_back_after_five_attempts_and_is_counted() {
    // Nine failing opens: five in the first tenure, which gives the shard
    // back; four more in the next, whose fifth open succeeds.
    let script = vec![Open::Fails(Kind::Fatal); 9];
    assert_run("rejected-at-open", script, &[5, 5], 1).await;
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_at_open_is_retried_and_the_shard_kept() {
    let script = vec![Open::Fails(Kind::Transient); 12];
    assert_run("transient-at-open", script, &[13], 0).await;
}

#[tokio::test(start_paused = true)]
async fn fatal_errors_at_read_and_reopen_count_together_until_a_batch_arrives() {
    // The first fetch fails, then four reopens: five fatal errors in a
    // row, and no batch in between.
    let mut script = vec![Open::ReadFails(Kind::Fatal)];
    script.extend([Open::Fails(Kind::Fatal); 4]);
    assert_run("fatal-read-then-reopens", script, &[5, 1], 1).await;
}

/// A reader opened at `LATEST` that fails for good before handing any
/// record on is opened again at the time the first was asked for: what
/// was written meanwhile is read, nothing from before. Opened again at a
/// new `LATEST`, it skipped those records.
#[tokio::test(start_paused = true)]
async fn a_reader_reopened_before_any_record_from_latest_reads_what_came_meanwhile() {
    let run = Run::start_at(
        "latest-reopened",
        vec![Open::WrittenThenReadFails(Kind::Fatal)],
        InitialPosition::Latest,
    );
    fleet::wait_until(
        Duration::from_secs(600),
        Duration::from_millis(100),
        || run.seen.lock().unwrap().len() >= 3,
        || format!("opened at {:?}", run.source.positions.lock().unwrap()),
    )
    .await;
    run.handle.shutdown();
    let late: Vec<String> = (0..3).map(|i| format!("late-{i}")).collect();
    assert_eq!(run.seen(), late);
    let positions = run.source.positions.lock().unwrap().clone();
    assert_eq!(positions[0], StartPosition::Latest);
    assert!(
        matches!(positions[1], StartPosition::AtTimestamp(_)),
        "{positions:?}"
    );
}

/// With lanes, batches already fetched and queued for a lane start as
/// the lane frees up while the reader is retried or reopened. The fetch
/// loop judged a failed read (pauses, reopens) without taking the lanes'
/// results: queued records waited out the whole read outage, and a lane
/// cut at the processor timeout was given back only after it.
#[tokio::test(start_paused = true)]
async fn queued_lane_batches_are_processed_while_the_reader_is_reopened() {
    let mut script = vec![Open::ReadsThenFails {
        batches: 5,
        kind: Kind::Fatal,
    }];
    script.extend([Open::Fails(Kind::Transient); 10]);
    let run = Run::start_with(
        "lanes-beside-reopens",
        script,
        InitialPosition::TrimHorizon,
        Some(2),
    );
    run.wait_for_records().await;
    assert_eq!(run.seen(), records());
    // The first open and ten failing ones; the twelfth succeeds. All five
    // records were processed before it: none waited for the reader.
    let at_opens = run.source.seen_at_opens.lock().unwrap().clone();
    assert!(
        at_opens.len() <= 11,
        "a record queued for a lane waited for the reopen that succeeded; \
         records seen at each open: {at_opens:?}"
    );
}
