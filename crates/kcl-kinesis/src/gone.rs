//! What a reader does when its shard, its stream or its starting point is
//! gone: Kinesis answers `ResourceNotFound` for a shard past the stream's
//! retention as for a deleted stream, and `InvalidArgument` for a
//! starting sequence number behind the trim horizon. Both readers (polling
//! and fan-out) decide the same way, here.

use kcl_core::source::{ChildShard, SourceError};
use tracing::{error, warn};

use crate::calls::{IteratorStart, Shared};
use crate::discovery::{children_in, list_all, shard_info};

/// Why Kinesis said a shard does not exist.
#[derive(Debug)]
pub(crate) enum Missing {
    /// The stream itself is gone.
    Stream,
    /// The stream no longer lists the shard: it aged out of the retention
    /// period. Its records are gone; it is over, and its children (if any
    /// are still listed) are where the hash range goes on.
    Expired(Vec<ChildShard>),
    /// The shard is still listed: the answer was stale (eventual
    /// consistency right after a reshard); retrying can fix it.
    Listed,
}

/// Asks `ListShards` why `shard` was not found. An expired shard is
/// counted and logged here (once per reader that meets it).
pub(crate) async fn why_missing(
    shared: &Shared,
    stream: &str,
    shard: &str,
) -> Result<Missing, SourceError> {
    let shards = match list_all(shared, stream, None).await {
        Ok(shards) => shards,
        Err(SourceError::StreamNotFound { .. }) => return Ok(Missing::Stream),
        Err(e) => return Err(e),
    };
    let shards: Vec<_> = shards.into_iter().map(|s| shard_info(stream, s)).collect();
    if shards.iter().any(|s| s.shard_id == shard) {
        return Ok(Missing::Listed);
    }
    let children = children_in(shards, shard);
    shared.stats.expired_shard();
    metrics::counter!(
        "kcl_kinesis_expired_shards_total",
        "stream" => stream.to_owned(),
        "shard" => shard.to_owned()
    )
    .increment(1);
    warn!(
        stream,
        shard,
        children = ?children.iter().map(|c| c.shard_id.as_str()).collect::<Vec<_>>(),
        "the shard is past the stream's retention and its unread records are gone; \
         taking it as ended (SHARD_END) so that its children start"
    );
    Ok(Missing::Expired(children))
}

/// Where to read instead when Kinesis rejected `start` as an invalid
/// argument: a sequence-number start behind the trim horizon means the
/// checkpointed position was trimmed, and reading resumes at
/// `TRIM_HORIZON`, the oldest record left. The lost range is counted and
/// logged at error level: the operator must know that records were never
/// processed. `None` when `start` is not a sequence number (the argument
/// was wrong for another reason).
pub(crate) fn past_trim_horizon(
    shared: &Shared,
    stream: &str,
    shard: &str,
    start: &IteratorStart,
) -> Option<IteratorStart> {
    let seq = match start {
        IteratorStart::AtSequence(seq) | IteratorStart::AfterSequence(seq) => seq,
        _ => return None,
    };
    shared.stats.trimmed_start();
    metrics::counter!(
        "kcl_kinesis_trimmed_checkpoints_total",
        "stream" => stream.to_owned(),
        "shard" => shard.to_owned()
    )
    .increment(1);
    error!(
        stream,
        shard,
        sequence_number = %seq,
        "the starting sequence number is behind the trim horizon: the records after it \
         and before the oldest retained one were trimmed unprocessed (DATA LOSS); \
         resuming at TRIM_HORIZON"
    );
    Some(IteratorStart::TrimHorizon)
}
