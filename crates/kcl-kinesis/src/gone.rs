//! What a reader does when its shard, its stream or its starting point is
//! gone: Kinesis answers `ResourceNotFound` for a shard past the stream's
//! retention as for a deleted stream, and `InvalidArgument` for a
//! starting sequence number behind the trim horizon. Both readers (polling
//! and fan-out) decide the same way, here.

use kcl_core::metric_names::{KINESIS_EXPIRED_SHARDS, KINESIS_TRIMMED_CHECKPOINTS};
use kcl_core::source::{ChildShard, SourceError};
use tracing::{error, warn};

use crate::calls::retry::{Failure, ForReader};
use crate::calls::{IteratorStart, Shared};
use crate::discovery::{children_in, list_all, shard_info};
use kcl_core::checkpointer::SequenceNumber;

/// Why Kinesis said a shard does not exist.
#[derive(Debug)]
pub(crate) enum Missing {
    /// The stream itself is gone.
    Stream,
    /// The stream no longer lists the shard: it aged out of the retention
    /// period. Its records are gone; it is over, and its children (if any
    /// are still listed) are where the hash range goes on.
    Expired(Vec<ChildShard>),
    /// The shard is still listed, or too new for the listing (nothing
    /// after it is listed): it is not gone. The answer was stale (eventual
    /// consistency right after a reshard), and retrying can fix it; for a
    /// fan-out subscription, the missing resource may be the consumer
    /// instead.
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
    // A shard ages out only after it was closed by a reshard, which
    // created shards after it (Kinesis numbers shards in creation order):
    // unlisted with nothing newer listed, it is a shard too new for the
    // listing (a child right after a reshard), not an expired one.
    let newer = shards
        .iter()
        .any(|s| compare_shard_ids(&s.shard_id, shard).is_gt());
    if !newer || shards.iter().any(|s| s.shard_id == shard) {
        return Ok(Missing::Listed);
    }
    let children = children_in(shards, shard);
    shared.stats.expired_shard();
    count(KINESIS_EXPIRED_SHARDS, stream, shard);
    warn!(
        stream,
        shard,
        children = ?children.iter().map(|c| c.shard_id.as_str()).collect::<Vec<_>>(),
        "the shard is past the stream's retention and its unread records are gone; \
         taking it as ended (SHARD_END) so that its children start"
    );
    Ok(Missing::Expired(children))
}

/// Orders shard ids (`shardId-` and a zero-padded number) by creation.
fn compare_shard_ids(a: &str, b: &str) -> std::cmp::Ordering {
    let number = |id: &str| id.rsplit('-').next().map(str::to_owned).unwrap_or_default();
    SequenceNumber::order(&number(a), &number(b))
}

/// Where to read instead when Kinesis rejected `start` as an invalid
/// argument. A sequence-number start behind the trim horizon means the
/// checkpointed position was trimmed: reading resumes at `TRIM_HORIZON`,
/// the oldest record left, and the lost range is counted and logged at
/// error level (the operator must know that records were never
/// processed). Kinesis answers the same for a sequence number of another
/// shard or stream, so the oldest record left is read first: only if it
/// lies after the checkpoint was the checkpoint trimmed. `Ok(None)` when
/// it was not (or `start` is no sequence number): the argument is wrong
/// for another reason, and re-reading the shard from its start would be
/// a guess. When the oldest record cannot be found (see [`oldest_record`])
/// reading resumes at `TRIM_HORIZON` too, counted as trimmed but warned
/// of as unknown: a shard never read again would be worse.
pub(crate) async fn past_trim_horizon(
    shared: &Shared,
    stream: &str,
    shard: &str,
    start: &IteratorStart,
    reader: ForReader<'_>,
) -> Result<Option<IteratorStart>, SourceError> {
    let seq = match start {
        IteratorStart::AtSequence(seq) | IteratorStart::AfterSequence(seq) => seq,
        _ => return Ok(None),
    };
    match oldest_record(shared, stream, shard, reader).await? {
        Oldest::Record(oldest) if SequenceNumber::order(&oldest, seq).is_le() => {
            warn!(stream, shard, sequence_number = %seq, oldest_retained = %oldest,
                "Kinesis rejected the starting sequence number, which is not behind the trim \
                 horizon: it is not of this shard");
            return Ok(None);
        }
        Oldest::Unknown => {
            // Maybe trimmed, maybe another shard's: a shard never read
            // again would be worse than one read again. Counted as
            // trimmed, for the alert on lost records, as it may be.
            shared.stats.trimmed_start();
            count(KINESIS_TRIMMED_CHECKPOINTS, stream, shard);
            warn!(stream, shard, sequence_number = %seq,
                "Kinesis rejected the starting sequence number, and the shard's oldest record \
                 was not reached within {OLDEST_PAGES} pages, so whether it was trimmed is \
                 unknown (counted as trimmed): resuming at TRIM_HORIZON, records may be \
                 delivered again or have been lost");
            return Ok(Some(IteratorStart::TrimHorizon));
        }
        // Nothing retained, or the oldest record is after the checkpoint.
        Oldest::Record(_) | Oldest::Nothing => {}
    }
    shared.stats.trimmed_start();
    count(KINESIS_TRIMMED_CHECKPOINTS, stream, shard);
    error!(
        stream,
        shard,
        sequence_number = %seq,
        "the starting sequence number is behind the trim horizon: the records after it \
         and before the oldest retained one were trimmed unprocessed (DATA LOSS); \
         resuming at TRIM_HORIZON"
    );
    Ok(Some(IteratorStart::TrimHorizon))
}

/// What a shard retains at its start.
enum Oldest {
    /// The sequence number of its oldest record.
    Record(String),
    /// No record: the shard ended, or the tip was reached.
    Nothing,
    /// Not found within [`OLDEST_PAGES`] empty pages, the tip not reached
    /// (a sparse shard of long retention).
    Unknown,
}

/// Most empty pages read looking for a shard's oldest record.
const OLDEST_PAGES: usize = 100;

/// The oldest record `shard` retains: a `TRIM_HORIZON` iterator and the
/// first non-empty page of one record. A shard whose retained records
/// start far behind can answer empty pages first, so an empty page means
/// nothing is retained only at the tip (`MillisBehindLatest` 0) or the
/// shard's end; short of either within [`OLDEST_PAGES`], the answer is
/// unknown (it was taken for "nothing retained", and the checkpoint
/// reported trimmed, DATA LOSS, though it may have been another shard's).
async fn oldest_record(
    shared: &Shared,
    stream: &str,
    shard: &str,
    reader: ForReader<'_>,
) -> Result<Oldest, SourceError> {
    let fail = |f: Failure| f.into_source_error(stream, shard);
    let mut iterator = shared
        .shard_iterator(stream, shard, &IteratorStart::TrimHorizon, Some(reader))
        .await
        .map_err(fail)?;
    for _ in 0..OLDEST_PAGES {
        let Some(it) = iterator.take() else {
            return Ok(Oldest::Nothing);
        };
        let out = shared
            .peek_records(stream, &it, 1, Some(reader))
            .await
            .map_err(fail)?;
        if let Some(first) = out.records.first() {
            return Ok(Oldest::Record(first.sequence_number.clone()));
        }
        if out.millis_behind_latest == Some(0) {
            return Ok(Oldest::Nothing);
        }
        iterator = out.next_shard_iterator.filter(|it| !it.is_empty());
    }
    Ok(Oldest::Unknown)
}

/// Adds one to the metric `name`, labelled with the stream and shard.
fn count(name: &'static str, stream: &str, shard: &str) {
    metrics::counter!(name, "stream" => stream.to_owned(), "shard" => shard.to_owned())
        .increment(1);
}
