//! The reading side of a consumer: opening the shard's reader, fetching
//! under the read deadline, and counting each batch handed on.

use std::time::SystemTime;

use super::read_errors::{ReadFailures, Retry, Stage};
use super::{Consumer, Stop};
use crate::lease::Checkpoint;
use crate::metric_names::{
    BYTES_PROCESSED, MILLIS_BEHIND_LATEST, RECORDS_PER_BATCH, RECORDS_PROCESSED,
};
use crate::source::{Batch, OpenShard, ShardReader, SourceError, StartPosition};

/// Opens a reader at `position`, judging each failure as a failed read
/// (see [`ReadFailures::judge`]): the attempts count with the reads'.
async fn open_reader(
    c: &Consumer,
    position: StartPosition,
    failures: &mut ReadFailures,
) -> Result<Box<dyn ShardReader>, Stop> {
    loop {
        c.still_ours()?;
        let request = OpenShard {
            answers: failures.answers().clone(),
            ..OpenShard::new(
                c.setup.stream.clone(),
                c.ctx.shard_id.clone(),
                position.clone(),
                c.lease.clone(),
            )
        };
        // An open left unanswered counts against the read deadline too.
        let open = c.setup.source.open(request);
        tokio::pin!(open);
        let opened = loop {
            tokio::select! {
                opened = &mut open => break opened,
                () = tokio::time::sleep_until(failures.next_check()) => {
                    // The deadline moves while the service answers.
                    if failures.expired() {
                        return Err(failures.unanswered(c, Stage::Open));
                    }
                }
            }
        };
        match opened {
            Ok(reader) => return Ok(reader),
            Err(e) => {
                failures.judge(c, Stage::Open, e).await?;
            }
        }
    }
}

pub(super) fn shard_labels(c: &Consumer) -> [(&'static str, String); 2] {
    [
        ("stream", c.ctx.stream.clone()),
        ("shard", c.ctx.shard_id.clone()),
    ]
}

/// The metrics of one fetched batch with records.
fn count_batch(labels: &[(&'static str, String); 2], batch: &Batch) {
    let bytes: usize = batch.records.iter().map(|r| r.data.len()).sum();
    metrics::counter!(RECORDS_PROCESSED, labels).increment(batch.records.len() as u64);
    metrics::counter!(BYTES_PROCESSED, labels).increment(bytes as u64);
    metrics::histogram!(RECORDS_PER_BATCH, labels).record(batch.records.len() as f64);
    if let Some(ms) = batch.millis_behind_latest {
        metrics::gauge!(MILLIS_BEHIND_LATEST, labels).set(ms as f64);
    }
}

/// The reading side of a consumer: its reader, the position after the
/// last batch it handed on (where a reopened reader resumes), and the
/// failures since that batch (see [`ReadFailures`]).
pub(super) struct Fetch {
    reader: Box<dyn ShardReader>,
    position: StartPosition,
    /// `stream` and `shard` labels of the shard's metrics.
    pub(super) labels: [(&'static str, String); 2],
    failures: ReadFailures,
}

impl Fetch {
    /// Opens the shard after `start`; `None` when there is nothing to read
    /// (the checkpoint is at the shard's end).
    pub(super) async fn open(c: &Consumer, start: &Checkpoint) -> Result<Option<Fetch>, Stop> {
        let Some(position) = StartPosition::from_checkpoint(start, c.setup.initial) else {
            return Ok(None);
        };
        let mut failures = ReadFailures::new(c);
        let asked = SystemTime::now();
        let reader = open_reader(c, position.clone(), &mut failures).await?;
        // A reader opened at LATEST fixed "latest": one opened again before
        // any record was handed on (the first failed for good) starts at
        // that time, not at a new LATEST that skips what came meanwhile.
        let position = match position {
            StartPosition::Latest => StartPosition::AtTimestamp(asked),
            position => position,
        };
        Ok(Some(Fetch {
            reader,
            position,
            labels: shard_labels(c),
            failures,
        }))
    }

    /// The reader's next answer, or why the consumer stops: no read
    /// succeeded within the read deadline (see [`ReadFailures`]), the
    /// answer to this one included. A fetch cut at the deadline is
    /// dropped, which a reader must take (it is cancel-safe).
    pub(super) async fn next_batch(
        &mut self,
        c: &Consumer,
    ) -> Result<Result<Batch, SourceError>, Stop> {
        let fetch = self.reader.next_batch();
        tokio::pin!(fetch);
        loop {
            tokio::select! {
                biased;
                fetched = &mut fetch => return Ok(fetched),
                () = tokio::time::sleep_until(self.failures.next_check()) => {
                    // The deadline moves while the service answers (errors
                    // a reader retries by itself, for one).
                    if self.failures.expired() {
                        return Err(self.failures.unanswered(c, Stage::Read));
                    }
                }
            }
        }
    }

    /// The batch to hand on (counted, and the position moved past it),
    /// `None` to fetch again (after a pause or a reopen from the
    /// position), or why the consumer stops.
    pub(super) async fn judge(
        &mut self,
        c: &Consumer,
        fetched: Result<Batch, SourceError>,
    ) -> Result<Option<Batch>, Stop> {
        match fetched {
            Ok(batch) => {
                self.failures.reset();
                // The reader checked the lease when it was asked for this
                // batch, but the batch can arrive much later (the process
                // was paused with the batch prefetched, and resumes after a
                // peer took the lease): nothing reaches the processor unless
                // the lease is still ours (invariant 1).
                c.still_ours()?;
                c.progress
                    .fetched(batch.records.len(), batch.millis_behind_latest);
                // What the shard carries, published on its lease for peers
                // to balance by.
                let bytes: usize = batch.records.iter().map(|r| r.data.len()).sum();
                c.lease.record_read(
                    bytes as u64,
                    batch.records.len() as u64,
                    batch.millis_behind_latest,
                );
                if let Some(last) = batch.records.last() {
                    self.position = StartPosition::AfterCheckpoint {
                        seq: last.sequence_number.clone(),
                        sub: last.sub_sequence_number,
                    };
                    count_batch(&self.labels, &batch);
                } else if let Some(ms) = batch.millis_behind_latest {
                    metrics::gauge!(MILLIS_BEHIND_LATEST, &self.labels).set(ms as f64);
                }
                Ok(Some(batch))
            }
            Err(e) => match self.failures.judge(c, Stage::Read, e).await? {
                Retry::Fetch => Ok(None),
                Retry::Reopen => {
                    self.reader = open_reader(c, self.position.clone(), &mut self.failures).await?;
                    Ok(None)
                }
            },
        }
    }
}
