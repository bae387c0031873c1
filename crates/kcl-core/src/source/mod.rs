//! The `ShardSource` trait: where records come from.
//!
//! A source lists a stream's shards with their lineage and opens a
//! [`ShardReader`] on one shard at a position. Readers deliver user records
//! (KPL aggregates already split, sub-records at or below a resume
//! checkpoint already dropped) in batches, check lease ownership before
//! every fetch, and report the end of a closed shard with its children.
//! `kcl-kinesis` implements it on Kinesis (polling and enhanced fan-out);
//! `memory` (feature `test-util`) implements it in memory for tests and
//! benchmarks.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;

use crate::lease::{Checkpoint, HashKeyRange};
use crate::leases::LeaseHandle;
use crate::record::Record;

#[cfg(any(test, feature = "test-util"))]
pub mod memory;

/// One shard as listed by the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard id.
    pub shard_id: String,
    /// The shard it was split from, or the first of the two it was merged
    /// from.
    pub parent_shard_id: Option<String>,
    /// The second parent of a merge.
    pub adjacent_parent_shard_id: Option<String>,
    /// The hash keys it covers.
    pub hash_key_range: HashKeyRange,
    /// The first sequence number of the shard.
    pub starting_sequence_number: String,
    /// Set once the shard is closed (split or merged away).
    pub ending_sequence_number: Option<String>,
}

impl ShardInfo {
    /// The shard's parents (zero, one, or two after a merge).
    pub fn parents(&self) -> impl Iterator<Item = &str> {
        self.parent_shard_id
            .iter()
            .chain(&self.adjacent_parent_shard_id)
            .map(String::as_str)
    }

    /// True once the shard no longer receives records.
    pub fn is_closed(&self) -> bool {
        self.ending_sequence_number.is_some()
    }
}

/// Where an application with no checkpoint starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialPosition {
    /// The oldest record still in the stream.
    TrimHorizon,
    /// Only records written after the consumer first reads the shard.
    Latest,
    /// The first record at or after this time.
    AtTimestamp(SystemTime),
}

impl InitialPosition {
    /// The sentinel stored in a new lease's checkpoint.
    pub fn checkpoint(&self) -> Checkpoint {
        match self {
            InitialPosition::TrimHorizon => Checkpoint::TrimHorizon,
            InitialPosition::Latest => Checkpoint::Latest,
            InitialPosition::AtTimestamp(_) => Checkpoint::AtTimestamp,
        }
    }
}

/// Where a reader starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartPosition {
    /// The oldest record in the shard.
    TrimHorizon,
    /// After the newest record at the time of the first read.
    Latest,
    /// The first record at or after this time.
    AtTimestamp(SystemTime),
    /// Resume after a checkpoint: re-read the record `seq` and drop its user
    /// records with sub-sequence `<= sub` (they were processed).
    AfterCheckpoint {
        /// The checkpointed sequence number.
        seq: String,
        /// The checkpointed sub-sequence number.
        sub: u64,
    },
}

impl StartPosition {
    /// The position that resumes from a lease's checkpoint. `initial` gives
    /// the time for an `AT_TIMESTAMP` sentinel. `None` for `SHARD_END`:
    /// nothing is left to read.
    pub fn from_checkpoint(checkpoint: &Checkpoint, initial: InitialPosition) -> Option<Self> {
        Some(match checkpoint {
            Checkpoint::TrimHorizon => StartPosition::TrimHorizon,
            Checkpoint::Latest => StartPosition::Latest,
            Checkpoint::AtTimestamp => match initial {
                InitialPosition::AtTimestamp(t) => StartPosition::AtTimestamp(t),
                // A lease created by another application version with a
                // timestamp we do not know: the earliest safe choice.
                _ => StartPosition::TrimHorizon,
            },
            Checkpoint::ShardEnd => return None,
            Checkpoint::Sequence { seq, sub } => StartPosition::AfterCheckpoint {
                seq: seq.clone(),
                sub: *sub,
            },
        })
    }
}

/// A shard created from a closed one, as reported at its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildShard {
    /// The child's shard id.
    pub shard_id: String,
    /// All parents of the child (one for a split, two for a merge).
    pub parent_shard_ids: Vec<String>,
    /// The child's hash-key range.
    pub hash_key_range: HashKeyRange,
}

/// One fetch's worth of records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// User records, in shard order.
    pub records: Vec<Record>,
    /// How far behind the tip of the shard this batch is, when known.
    pub millis_behind_latest: Option<u64>,
    /// Set when the shard is closed and every record was delivered: the
    /// children that continue its hash keys.
    pub shard_end: Option<Vec<ChildShard>>,
}

/// What went wrong reading a stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The stream does not exist (or is not visible with these credentials).
    #[error("stream {stream:?} not found")]
    StreamNotFound {
        /// The stream name.
        stream: String,
    },
    /// This worker no longer holds the shard's lease; the reader stopped
    /// before fetching.
    #[error("lease for shard {shard:?} is no longer held")]
    LeaseLost {
        /// The shard.
        shard: String,
    },
    /// A transient failure the reader could not hide (it already retried).
    #[error("reading {stream}/{shard} failed")]
    Retryable {
        /// The stream.
        stream: String,
        /// The shard.
        shard: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A failure retrying will not fix.
    #[error("reading {stream:?} failed: {message}")]
    Fatal {
        /// The stream.
        stream: String,
        /// What went wrong.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl SourceError {
    /// True for errors worth retrying.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SourceError::Retryable { .. })
    }
}

/// What a [`ShardSource`] needs to open a reader.
#[derive(Debug, Clone)]
pub struct OpenShard {
    /// The stream name.
    pub stream: String,
    /// The shard id.
    pub shard_id: String,
    /// Where to start.
    pub position: StartPosition,
    /// The lease that allows reading; checked before every fetch.
    pub lease: LeaseHandle,
    /// Told of every answer the service gives the calls made for this
    /// reader, the opening calls included (see [`AnswerClock`]).
    pub answers: AnswerClock,
}

impl OpenShard {
    /// A request to open `shard_id` of `stream` at `position` under
    /// `lease`, with a fresh [`AnswerClock`].
    pub fn new(
        stream: impl Into<String>,
        shard_id: impl Into<String>,
        position: StartPosition,
        lease: LeaseHandle,
    ) -> Self {
        OpenShard {
            stream: stream.into(),
            shard_id: shard_id.into(),
            position,
            lease,
            answers: AnswerClock::default(),
        }
    }
}

/// When the service last answered a reader's calls: records, nothing new,
/// or an error it sent (a throttle, a disabled KMS key). A call that timed
/// out or never reached the service is no answer.
///
/// The consumer gives a shard back when no read of it succeeded for
/// `max_read_failure_time` and a call went unanswered, so that a worker
/// cut off from the stream while it still reaches the lease table does not
/// keep shards it cannot read.
/// An answer, even an error, shows the worker does reach the service: an
/// outage every worker meets alike (a disabled key, long throttling) then
/// keeps the shard where it is, as moving it would change nothing. A
/// source that never tells the clock leaves the consumer to count every
/// failed read as unanswered.
#[derive(Debug, Clone, Default)]
pub struct AnswerClock(Arc<Mutex<Heard>>);

/// What an [`AnswerClock`] heard last.
#[derive(Debug, Clone, Copy, Default)]
struct Heard {
    answer: Option<tokio::time::Instant>,
    silence: Option<tokio::time::Instant>,
}

impl AnswerClock {
    fn heard(&self) -> std::sync::MutexGuard<'_, Heard> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The service answered a call, now.
    pub fn answered(&self) {
        self.heard().answer = Some(tokio::time::Instant::now());
    }

    /// A call went unanswered, now: it timed out, or never reached the
    /// service. The consumer gives a shard back only after such silence:
    /// a reader waiting on the worker's own limits (its prefetch budget,
    /// its pacing) is not cut off.
    pub fn silent(&self) {
        self.heard().silence = Some(tokio::time::Instant::now());
    }

    /// When the service last answered, if it ever did.
    pub fn last(&self) -> Option<tokio::time::Instant> {
        self.heard().answer
    }

    /// When a call last went unanswered, if one ever did.
    pub fn last_silence(&self) -> Option<tokio::time::Instant> {
        self.heard().silence
    }

    /// Whether the source ever told the clock anything: one that never
    /// does leaves the consumer to count every failed read as unanswered.
    pub fn is_told(&self) -> bool {
        let heard = *self.heard();
        heard.answer.is_some() || heard.silence.is_some()
    }
}

/// Lists shards and opens readers on them.
#[async_trait]
pub trait ShardSource: Send + Sync + fmt::Debug {
    /// Every shard of `stream`, open and closed (as far back as the stream
    /// retains them), following the service's pagination to the end.
    async fn list_shards(&self, stream: &str) -> Result<Vec<ShardInfo>, SourceError>;

    /// Opens a reader on one shard.
    async fn open(&self, request: OpenShard) -> Result<Box<dyn ShardReader>, SourceError>;
}

/// Reads one shard, batch by batch. Dropping the reader stops any
/// background fetching it does.
#[async_trait]
pub trait ShardReader: Send + fmt::Debug {
    /// The next batch. May return an empty batch (nothing new yet); after a
    /// batch with `shard_end` set, returns [`SourceError::Fatal`].
    /// Fails with [`SourceError::LeaseLost`] instead of fetching when the
    /// lease is no longer valid.
    async fn next_batch(&mut self) -> Result<Batch, SourceError>;
}
