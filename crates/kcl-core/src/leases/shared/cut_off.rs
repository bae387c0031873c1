//! Cut off from the lease table: a worker whose ticks cannot read it (its
//! scans fail, or its reads of the liveness records, which its ticks judge
//! the table by) while its beats land takes nothing, yet peers see it
//! alive. Once that has lasted a lease duration its beats say it takes no
//! lease (as a worker sitting out does), so that peers leave it and what
//! it holds out of their targets and take every free lease between them
//! (see [`Shared::table_read`]).

use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::Shared;

/// Since when this worker's ticks failed to read the lease table.
#[derive(Debug, Default)]
pub(super) struct CutOff {
    /// When the first of the failed reads running now failed.
    failing_since: Option<Instant>,
    /// Whether the warning that beats now say so was logged.
    told: bool,
}

impl CutOff {
    /// Whether reads failed for at least `limit` as of `now`.
    fn past(&self, now: Instant, limit: Duration) -> bool {
        self.failing_since
            .is_some_and(|since| now.saturating_duration_since(since) >= limit)
    }
}

impl Shared {
    /// The taker's tick read the lease table (`ok`), or ended without it
    /// (the scan failed, or no read of the liveness records was recent
    /// enough to judge one by). Without this, a worker whose scans fail
    /// while its beats land counts in every peer's target: a peer that
    /// started after the leases' holder died takes only its share of them
    /// and leaves the rest to this worker, which cannot take them. The
    /// rule that takes leases beyond the target once they stood free for
    /// two lease durations counts from a peer's first sight of them, so a
    /// peer that restarts meanwhile starts that count again; the shards
    /// stood unread until this worker's scans came back (simulator seed
    /// 8080808001383: 88 s).
    pub(crate) fn table_read(&self, ok: bool, now: Instant) {
        let limit = self.config.lease_duration;
        let mut cut = self.cut_off.lock().unwrap_or_else(|e| e.into_inner());
        if ok {
            if cut.told {
                info!("the lease table can be read again; taking leases again");
            }
            *cut = CutOff::default();
            return;
        }
        cut.failing_since.get_or_insert(now);
        if cut.past(now, limit) && !cut.told {
            cut.told = true;
            warn!(for_at_least = ?limit,
                "the taker cannot read the lease table or the liveness records; telling peers this worker takes no lease, so that they take every free one");
        }
    }

    /// Whether this worker could not read the lease table for a lease
    /// duration as of `now`: every beat asks, so that the record says it
    /// takes no lease exactly as long as that lasts.
    pub(crate) fn cut_off_from_table(&self, now: Instant) -> bool {
        let cut = self.cut_off.lock().unwrap_or_else(|e| e.into_inner());
        cut.past(now, self.config.lease_duration)
    }
}
