//! The consumer-facing half of a reader whose fetching runs in a task of
//! its own (the polling loop or the fan-out subscription): batches arrive on
//! a bounded channel holding budget permits, the lease is checked before
//! each hand-out, and the task never outlives the reader.

use async_trait::async_trait;
use kcl_core::leases::LeaseHandle;
use kcl_core::source::{Batch, ShardReader, SourceError};
use metrics::Gauge;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Runs a fetching task's `work` until it ends or `stop` is cancelled; the
/// error it ends with goes to the reader. However the task ends, the
/// shard's `lag` gauge (`MillisBehindLatest`) drops to 0 with it.
pub(crate) async fn run_task<P>(
    stop: CancellationToken,
    tx: mpsc::Sender<Message<P>>,
    lag: Gauge,
    work: impl Future<Output = Result<(), SourceError>>,
) {
    let _lag = ZeroOnDrop(lag);
    tokio::select! {
        biased;
        () = stop.cancelled() => {}
        () = async {
            if let Err(e) = work.await {
                // If the reader is gone nobody needs the error.
                let _ = tx.send(Err(e)).await;
            }
        } => {}
    }
}

/// Sets a shard's lag gauge to 0 when dropped: when its task returns, and
/// when the task is aborted with its reader (the usual end: the consumer
/// drops the reader of a shard it no longer holds), where no line after an
/// `await` runs. No longer read here, the shard drops out of the fleet's
/// max() rather than freeze at its last value; the next reader, here or on
/// another worker, reports its own.
struct ZeroOnDrop(Gauge);

impl Drop for ZeroOnDrop {
    fn drop(&mut self) {
        self.0.set(0.0);
    }
}

/// What a fetching task hands over: a batch plus the budget permits `P`
/// it holds (dropped, so the budget frees, when the batch is handed out).
#[derive(Debug)]
pub(crate) struct Delivery<P> {
    batch: Batch,
    _held: P,
}

impl<P> Delivery<P> {
    pub(crate) fn new(batch: Batch, held: P) -> Self {
        Delivery { batch, _held: held }
    }
}

/// What a fetching task sends its reader.
pub(crate) type Message<P> = Result<Delivery<P>, SourceError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Reading,
    /// The shard-end batch was handed out.
    Ended,
    /// A non-retryable error was handed out; the task is gone.
    Stopped,
}

/// A [`ShardReader`] fed by a background task through a bounded channel of
/// batches holding permits `P`.
#[derive(Debug)]
pub(crate) struct TaskReader<P> {
    stream: String,
    shard_id: String,
    lease: LeaseHandle,
    rx: mpsc::Receiver<Message<P>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    state: State,
    /// Names the task in errors ("fetch task", "subscription task").
    task_name: &'static str,
}

impl<P: Send + 'static> TaskReader<P> {
    /// Starts the fetching task `start` makes of the sending half of a
    /// channel of `capacity` batches and of the token that stops it.
    pub(crate) fn spawn<F>(
        stream: String,
        shard_id: String,
        lease: LeaseHandle,
        capacity: usize,
        task_name: &'static str,
        start: impl FnOnce(mpsc::Sender<Message<P>>, CancellationToken) -> F,
    ) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(capacity);
        let stop = CancellationToken::new();
        let task = tokio::spawn(start(tx, stop.clone()));
        TaskReader {
            stream,
            shard_id,
            lease,
            rx,
            stop,
            task,
            state: State::Reading,
            task_name,
        }
    }

    fn lease_lost(&mut self) -> SourceError {
        self.state = State::Stopped;
        self.stop.cancel();
        SourceError::LeaseLost {
            shard: self.shard_id.clone(),
        }
    }

    fn fatal(&self, message: &str) -> SourceError {
        SourceError::Fatal {
            stream: self.stream.clone(),
            message: format!("shard {}: {message}", self.shard_id),
            source: None,
        }
    }
}

impl<P> Drop for TaskReader<P> {
    fn drop(&mut self) {
        // Cancel lets the task see it at its next await; abort makes sure
        // it is gone even if it is not polled again (for fan-out, dropping
        // the task drops its subscription). No task outlives its reader.
        self.stop.cancel();
        self.task.abort();
    }
}

#[async_trait]
impl<P: Send + std::fmt::Debug + 'static> ShardReader for TaskReader<P> {
    async fn next_batch(&mut self) -> Result<Batch, SourceError> {
        match self.state {
            State::Reading => {}
            State::Ended => return Err(self.fatal("already reached its end")),
            State::Stopped => return Err(self.fatal("reader stopped after an error")),
        }
        if !self.lease.is_valid() {
            return Err(self.lease_lost());
        }
        let ended = self.lease.ended();
        let message = tokio::select! {
            biased;
            () = ended => return Err(self.lease_lost()),
            message = self.rx.recv() => message,
        };
        match message {
            Some(Ok(Delivery { batch, .. })) => {
                if batch.shard_end.is_some() {
                    self.state = State::Ended;
                }
                Ok(batch)
            }
            Some(Err(e)) => {
                if !e.is_retryable() {
                    self.state = State::Stopped;
                }
                Err(e)
            }
            None => {
                self.state = State::Stopped;
                Err(self.fatal(&format!("{} stopped", self.task_name)))
            }
        }
    }
}
