//! Warnings about conditions that recur (throttling, retried calls) at
//! most once per interval, each saying how often it happened since the
//! last: a storm shows at warn level without flooding the log.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How often a recurring condition is warned about.
pub const WARN_INTERVAL: Duration = Duration::from_secs(30);

/// Counts occurrences of one condition and says when to warn.
#[derive(Debug)]
pub struct RateLimitedWarn {
    interval: Duration,
    /// When the last warning went out, and occurrences since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLimitedWarn {
    /// Warns at most once per `interval`.
    pub const fn new(interval: Duration) -> Self {
        RateLimitedWarn {
            interval,
            state: Mutex::new((None, 0)),
        }
    }

    /// Counts one occurrence. Returns how many there were since the last
    /// warning (this one included) when a warning is due now: the first
    /// occurrence warns at once, later ones once the interval has passed.
    pub fn hit(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.1 += 1;
        let now = Instant::now();
        let due = state.0.is_none_or(|last| now >= last + self.interval);
        if !due {
            return None;
        }
        let n = state.1;
        *state = (Some(now), 0);
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_storm_warns_once_per_interval_with_its_count() {
        let w = RateLimitedWarn::new(Duration::from_secs(30));
        assert_eq!(w.hit(), Some(1), "the first one at once");
        let mut warned = Vec::new();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Some(n) = w.hit() {
                warned.push(n);
            }
        }
        assert_eq!(warned, vec![30, 30, 30], "{warned:?}");
    }
}
