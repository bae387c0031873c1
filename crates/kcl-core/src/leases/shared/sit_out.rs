//! Sitting out: a worker cut off from the stream service (it reads no
//! shard, yet reaches the lease table) takes nothing for a while, so that
//! a peer that can read gets its shards (see [`Shared::sit_out`]).

use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use super::Shared;

/// Sitting out after a shard could not be read (see [`Shared::sit_out`]).
#[derive(Debug, Default)]
pub(super) struct SitOut {
    /// Until when this worker takes no lease.
    until: Option<Instant>,
    /// When each sit-out of the last [`SIT_OUT_MEMORY`] began.
    began: std::collections::VecDeque<Instant>,
}

/// How long a worker sits out after `recent` sit-outs in the last
/// [`SIT_OUT_MEMORY`], for a `max_read_failure_time` of `limit`.
fn sit_out_length(recent: usize, limit: Duration) -> Duration {
    let doublings = u32::try_from(recent).unwrap_or(u32::MAX);
    let factor = 2u32.saturating_pow(doublings).min(SIT_OUT_MAX_FACTOR);
    limit.saturating_mul(2).saturating_mul(factor)
}

/// How far back sit-outs count towards the next one's length: a worker
/// that read its shards for this long starts again at the shortest.
const SIT_OUT_MEMORY: Duration = Duration::from_secs(3600);
/// The longest sit-out, in multiples of the first.
const SIT_OUT_MAX_FACTOR: u32 = 16;

impl Shared {
    /// This worker gave a shard back because no read of it succeeded, and
    /// the stream service answered none of its calls, for `limit`
    /// (`max_read_failure_time`): it is cut off from the service while it
    /// still reaches the lease table. Taking that lease (or another) again
    /// at its next tick would leave the shard unread for another `limit`,
    /// and again after that: the worker that can read would never get it,
    /// as the balance counts this one in. So this worker takes and steals
    /// nothing for a while, and its beats say it is stopping, so
    /// that peers leave it out of their targets and take what it gave
    /// back. Returns how long: twice `limit`, doubling with each sit-out
    /// of the last hour up to 16 times that, so that a worker cut off for
    /// good tries its share again ever more rarely, and one whose route
    /// came back is at full strength again soon.
    pub(crate) fn sit_out(&self, now: Instant, limit: Duration) -> Duration {
        let mut sit = self.sit_out.lock().unwrap_or_else(|e| e.into_inner());
        while sit
            .began
            .front()
            .is_some_and(|b| now.saturating_duration_since(*b) > SIT_OUT_MEMORY)
        {
            sit.began.pop_front();
        }
        // A sit-out already under way (several shards given back at once)
        // counts once; a shard given back near its end stretches it, so
        // that the shard is not taken right back.
        let running = sit.until.is_some_and(|until| until > now);
        let recent = sit.began.len().saturating_sub(usize::from(running));
        let length = sit_out_length(recent, limit);
        if !running {
            sit.began.push_back(now);
        }
        // A length past what an Instant holds (a limit of `Duration::MAX`)
        // stands for thirty years.
        let until = now
            .checked_add(length)
            .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 24 * 3600));
        let until = sit
            .until
            .filter(|_| running)
            .map_or(until, |u| u.max(until));
        sit.until = Some(until);
        until - now
    }

    /// Whether this worker sits out at `now` (see [`Shared::sit_out`]).
    /// The taker asks before it takes anything, and every beat asks, so
    /// that the record says `stopping` exactly as long as the sit-out lasts.
    pub(crate) fn sitting_out(&self, now: Instant) -> bool {
        let mut sit = self.sit_out.lock().unwrap_or_else(|e| e.into_inner());
        match sit.until {
            Some(until) if until > now => true,
            Some(_) => {
                sit.until = None;
                info!("the sit-out after an unreadable shard ended; taking leases again");
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sit_outs_double_from_twice_the_read_limit_up_to_sixteen_times_that() {
        let limit = Duration::from_secs(45);
        let lengths: Vec<u64> = (0..7)
            .map(|recent| sit_out_length(recent, limit).as_secs())
            .collect();
        assert_eq!(lengths, [90, 180, 360, 720, 1440, 1440, 1440]);
        assert_eq!(sit_out_length(usize::MAX, Duration::MAX), Duration::MAX);
    }
}
