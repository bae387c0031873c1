//! The lease model: one lease per shard, as stored in the lease table.
//!
//! Field names and meanings follow the Java KCL's lease items so that a table
//! written by either library can be read by the other (the DynamoDB mapping
//! lives in `kcl-dynamodb`).

use std::collections::BTreeSet;
use std::fmt;

/// Where a shard's processing stands: a sentinel position or a record's
/// (sequence number, sub-sequence number).
///
/// The sub-sequence number identifies a user record inside a KPL aggregate; a
/// plain record has sub-sequence 0. Resuming from `Sequence { seq, sub }`
/// re-reads the aggregate `seq` and skips its sub-records `0..=sub`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Checkpoint {
    /// Nothing processed yet; start at the oldest record still in the shard.
    TrimHorizon,
    /// Nothing processed yet; start after the newest record at first read.
    Latest,
    /// Nothing processed yet; start at the configured timestamp.
    AtTimestamp,
    /// Every record of this closed shard was processed.
    ShardEnd,
    /// Records up to and including this one were processed.
    Sequence {
        /// The Kinesis sequence number (a decimal string of up to 128 bits).
        seq: String,
        /// The user record's index inside a KPL aggregate, 0 for plain records.
        sub: u64,
    },
}

impl Checkpoint {
    /// The Java KCL's spelling of the sentinels, as stored in the `checkpoint`
    /// attribute.
    pub const TRIM_HORIZON: &'static str = "TRIM_HORIZON";
    /// See [`Checkpoint::TRIM_HORIZON`].
    pub const LATEST: &'static str = "LATEST";
    /// See [`Checkpoint::TRIM_HORIZON`].
    pub const AT_TIMESTAMP: &'static str = "AT_TIMESTAMP";
    /// See [`Checkpoint::TRIM_HORIZON`].
    pub const SHARD_END: &'static str = "SHARD_END";

    /// A checkpoint at a record.
    pub fn at(seq: impl Into<String>, sub: u64) -> Self {
        Checkpoint::Sequence {
            seq: seq.into(),
            sub,
        }
    }

    /// Parses the stored pair (`checkpoint`, `checkpointSubSequenceNumber`).
    /// Sentinels ignore the sub-sequence; anything else must be a decimal
    /// sequence number.
    pub fn parse(value: &str, sub: u64) -> Result<Self, InvalidCheckpoint> {
        match value {
            Self::TRIM_HORIZON => Ok(Checkpoint::TrimHorizon),
            Self::LATEST => Ok(Checkpoint::Latest),
            Self::AT_TIMESTAMP => Ok(Checkpoint::AtTimestamp),
            Self::SHARD_END => Ok(Checkpoint::ShardEnd),
            v if !v.is_empty() && v.len() <= 129 && v.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(Checkpoint::at(v, sub))
            }
            v => Err(InvalidCheckpoint(v.to_owned())),
        }
    }

    /// The value stored in the `checkpoint` attribute.
    pub fn as_str(&self) -> &str {
        match self {
            Checkpoint::TrimHorizon => Self::TRIM_HORIZON,
            Checkpoint::Latest => Self::LATEST,
            Checkpoint::AtTimestamp => Self::AT_TIMESTAMP,
            Checkpoint::ShardEnd => Self::SHARD_END,
            Checkpoint::Sequence { seq, .. } => seq,
        }
    }

    /// The value stored in `checkpointSubSequenceNumber` (0 for sentinels).
    pub fn sub_sequence(&self) -> u64 {
        match self {
            Checkpoint::Sequence { sub, .. } => *sub,
            _ => 0,
        }
    }

    /// True for the four sentinel positions.
    pub fn is_sentinel(&self) -> bool {
        !matches!(self, Checkpoint::Sequence { .. })
    }
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checkpoint::Sequence { seq, sub } => write!(f, "{seq}/{sub}"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// A stored checkpoint value that is neither a sentinel nor a sequence number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid checkpoint value {0:?}: expected a sentinel or a decimal sequence number")]
pub struct InvalidCheckpoint(pub String);

/// What a lease carries, as its holder published it: kilobytes (1024
/// bytes) a second, the lease item's `throughputKBps` as the Java KCL 3.x
/// writes it (a number, a `Double` on the Java side). Always finite and
/// non-negative, so it compares and hashes like an integer.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Throughput(f64);

impl Eq for Throughput {}

impl Throughput {
    /// `kbps` kilobytes a second; `None` for a negative or non-finite value
    /// (a figure that means nothing is no figure).
    pub fn from_kbps(kbps: f64) -> Option<Self> {
        // `+ 0.0` turns -0.0 into 0.0, so equal figures have equal bits.
        (kbps.is_finite() && kbps >= 0.0).then_some(Throughput(kbps + 0.0))
    }

    /// Kilobytes a second.
    pub fn kbps(self) -> f64 {
        self.0
    }

    /// The figure rounded to a thousandth of a KB/s (about one byte a
    /// second), as stored: the Java KCL rounds to six decimals.
    pub fn rounded(self) -> Self {
        Throughput((self.0 * 1000.0).round() / 1000.0)
    }
}

impl fmt::Display for Throughput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} KB/s", self.0)
    }
}

/// The hash-key range a shard covers, as decimal strings of 128-bit integers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HashKeyRange {
    /// First hash key of the range, inclusive.
    pub starting: String,
    /// Last hash key of the range, inclusive.
    pub ending: String,
}

/// One lease: the right to process one shard, held by at most one worker.
///
/// `counter` increases with every ownership change and every renewal; other
/// workers judge a lease expired when they have seen its counter stand still
/// for the lease duration on their own monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The table's hash key: the shard id, or for multi-stream applications
    /// `account:stream:creationEpoch:shardId`.
    pub key: String,
    /// The shard this lease is for.
    pub shard_id: String,
    /// The stream identifier (`account:stream:creationEpoch`) of a
    /// multi-stream lease; `None` for a single-stream application.
    pub stream: Option<String>,
    /// The worker that holds the lease; `None` when nobody does.
    pub owner: Option<String>,
    /// Bumped by every take, renewal, release and handoff step.
    pub counter: u64,
    /// Processing position.
    pub checkpoint: Checkpoint,
    /// A prepared checkpoint, written before the processor commits elsewhere.
    pub pending_checkpoint: Option<Checkpoint>,
    /// Opaque application state stored with the pending checkpoint.
    pub pending_checkpoint_state: Option<Vec<u8>>,
    /// How often the owner changed since the last checkpoint.
    pub owner_switches_since_checkpoint: u64,
    /// Shards this one was split or merged from.
    pub parent_shard_ids: BTreeSet<String>,
    /// Shards created from this one by a split or merge.
    pub child_shard_ids: BTreeSet<String>,
    /// The shard's hash-key range, when known.
    pub hash_key_range: Option<HashKeyRange>,
    /// During a graceful handoff: the previous owner, who may still
    /// checkpoint until it completes the handoff.
    pub checkpoint_owner: Option<String>,
    /// The owner's tenure: a fresh id written by every take, on which every
    /// later write of that holder is conditional (kcl's own attribute; the
    /// Java KCL neither writes nor reads it, so a lease it took may carry a
    /// stale one, which guards nothing because the owner changed too).
    pub tenure: Option<String>,
    /// During a graceful handoff: the previous owner's tenure, on which its
    /// last checkpoints and the handoff's completion are conditional.
    pub checkpoint_owner_tenure: Option<String>,
    /// What the shard carries, as its last holder published it (see
    /// [`Throughput`]); `None` until a holder published a figure. Peers
    /// balance by it, and it travels with the lease, so a new holder
    /// starts from its predecessor's figure.
    pub throughput: Option<Throughput>,
}

/// The instance that wrote `tenure` (the part before the first dot; tenure
/// ids are `<instance>.<n>`, made by `leases::tenure`). It lives with the
/// model because the store reads it too, without the lease engine.
pub(crate) fn instance_of(tenure: &str) -> &str {
    tenure
        .split_once('.')
        .map_or(tenure, |(instance, _)| instance)
}

impl Lease {
    /// The worker process (instance id) whose tenure holds the lease: the
    /// key of its liveness record. `None` for a lease without a tenure.
    pub fn tenure_instance(&self) -> Option<&str> {
        self.tenure.as_deref().map(instance_of)
    }

    /// A new, unowned lease for `shard_id` starting at `checkpoint`, keyed by
    /// the shard id (single-stream layout).
    pub fn new(shard_id: impl Into<String>, checkpoint: Checkpoint) -> Self {
        let shard_id = shard_id.into();
        Lease {
            key: shard_id.clone(),
            shard_id,
            stream: None,
            owner: None,
            counter: 0,
            checkpoint,
            pending_checkpoint: None,
            pending_checkpoint_state: None,
            owner_switches_since_checkpoint: 0,
            parent_shard_ids: BTreeSet::new(),
            child_shard_ids: BTreeSet::new(),
            hash_key_range: None,
            checkpoint_owner: None,
            tenure: None,
            checkpoint_owner_tenure: None,
            throughput: None,
        }
    }

    /// A new, unowned multi-stream lease keyed `stream:shard_id`, where
    /// `stream` is the Java KCL's `account:stream:creationEpoch` identifier.
    pub fn new_multi_stream(
        stream: impl Into<String>,
        shard_id: impl Into<String>,
        checkpoint: Checkpoint,
    ) -> Self {
        let stream = stream.into();
        let mut lease = Lease::new(shard_id, checkpoint);
        lease.key = format!("{stream}:{}", lease.shard_id);
        lease.stream = Some(stream);
        lease
    }

    /// Sets the parent shards (builder style).
    pub fn with_parents<I, S>(mut self, parents: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.parent_shard_ids = parents.into_iter().map(Into::into).collect();
        self
    }

    /// True once every record of the shard was processed.
    pub fn is_finished(&self) -> bool {
        self.checkpoint == Checkpoint::ShardEnd
    }

    /// True while a graceful handoff from `checkpoint_owner` to `owner` runs.
    pub fn in_handoff(&self) -> bool {
        self.checkpoint_owner.is_some()
    }

    /// True if `worker` is the lease's owner.
    pub fn is_owned_by(&self, worker: &str) -> bool {
        self.owner.as_deref() == Some(worker)
    }
}

/// How a stream's lease keys are formed.
///
/// A single-stream application keys leases by shard id; a multi-stream
/// application prefixes the stream identifier, as the Java KCL does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LeaseLayout {
    /// Key = shard id.
    SingleStream,
    /// Key = `identifier:shardId`, where `identifier` is the Java KCL's
    /// `account:stream:creationEpoch`.
    MultiStream {
        /// The stream identifier.
        identifier: String,
    },
}

impl LeaseLayout {
    /// The lease key of `shard_id`.
    pub fn key(&self, shard_id: &str) -> String {
        match self {
            LeaseLayout::SingleStream => shard_id.to_owned(),
            LeaseLayout::MultiStream { identifier } => format!("{identifier}:{shard_id}"),
        }
    }

    /// A new, unowned lease for `shard_id` in this layout.
    pub fn new_lease(&self, shard_id: &str, checkpoint: Checkpoint) -> Lease {
        match self {
            LeaseLayout::SingleStream => Lease::new(shard_id, checkpoint),
            LeaseLayout::MultiStream { identifier } => {
                Lease::new_multi_stream(identifier.clone(), shard_id, checkpoint)
            }
        }
    }

    /// True if `lease` belongs to this layout's stream.
    pub fn owns(&self, lease: &Lease) -> bool {
        match self {
            LeaseLayout::SingleStream => lease.stream.is_none(),
            LeaseLayout::MultiStream { identifier } => {
                lease.stream.as_deref() == Some(identifier.as_str())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinels_round_trip() {
        for c in [
            Checkpoint::TrimHorizon,
            Checkpoint::Latest,
            Checkpoint::AtTimestamp,
            Checkpoint::ShardEnd,
            Checkpoint::at(
                "49590338271490256608559692538361571095921575989136588898",
                3,
            ),
        ] {
            assert_eq!(Checkpoint::parse(c.as_str(), c.sub_sequence()), Ok(c));
        }
    }

    #[test]
    fn throughput_figures_are_finite_and_non_negative() {
        assert_eq!(Throughput::from_kbps(1.5).map(Throughput::kbps), Some(1.5));
        assert_eq!(Throughput::from_kbps(-0.0), Throughput::from_kbps(0.0));
        for bad in [-1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(Throughput::from_kbps(bad), None, "{bad}");
        }
        let t = Throughput::from_kbps(12.345_678).expect("finite");
        assert_eq!(t.rounded().kbps(), 12.346);
    }

    #[test]
    fn bad_checkpoints_are_named() {
        for bad in ["", "SHARD_BEGIN", "12a", "-1"] {
            let err = Checkpoint::parse(bad, 0).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn layouts_key_like_the_java_kcl() {
        let multi = LeaseLayout::MultiStream {
            identifier: "123456789012:orders:1700000000".into(),
        };
        assert_eq!(
            multi.key("shardId-1"),
            "123456789012:orders:1700000000:shardId-1"
        );
        let l = multi.new_lease("shardId-1", Checkpoint::Latest);
        assert_eq!(l.key, multi.key("shardId-1"));
        assert!(multi.owns(&l) && !LeaseLayout::SingleStream.owns(&l));
        assert_eq!(LeaseLayout::SingleStream.key("shardId-1"), "shardId-1");
    }

    #[test]
    fn multi_stream_key_layout() {
        let l = Lease::new_multi_stream(
            "123456789012:orders:1700000000",
            "shardId-000000000001",
            Checkpoint::Latest,
        );
        assert_eq!(l.key, "123456789012:orders:1700000000:shardId-000000000001");
        assert_eq!(l.shard_id, "shardId-000000000001");
    }
}
