//! The one backoff policy every retry loop uses: a lease-table call, a
//! checkpoint, a Kinesis call, a subscription, a startup step, a processor
//! that keeps failing. Each loop names its numbers; how the pauses grow,
//! are capped, jittered and counted is written here once.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Pauses that double from `first` up to `max`, jittered unless turned
/// off, for at most `retries` retries (unbounded unless set).
///
/// Jitter adds up to one more pause of the same length at random, so a
/// fleet failing at one moment does not retry in step. [`Backoff::pauses`]
/// is an iterator, so `backon`'s `Retryable::retry` takes it as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    retries: Option<usize>,
    jitter: bool,
    /// Where the jitter comes from, if not from the thread's generator.
    seed: Option<u64>,
}

impl Backoff {
    /// Jittered pauses doubling from `first` up to `max`, without end.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            retries: None,
            jitter: true,
            seed: None,
        }
    }

    /// At most `n` pauses, so `n + 1` attempts in all.
    pub const fn retries(mut self, n: usize) -> Self {
        self.retries = Some(n);
        self
    }

    /// Exact doubling, for loops whose pace tests count.
    pub const fn without_jitter(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// Jitter drawn from `seed`, the same pauses in every run: a seeded
    /// simulation replays its retries exactly (thread-random jitter made a
    /// failing seed pass one replay in four).
    pub const fn seeded(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// A fresh run of pauses.
    pub fn pauses(&self) -> Pauses {
        let rng = match self.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_rng(&mut rand::rng()),
        };
        Pauses {
            policy: *self,
            next: self.first,
            spent: 0,
            rng,
        }
    }
}

/// `seed` mixed with `text` (FNV-1a over both): a seed per lease, tenure
/// or worker that is the same in every process, unlike the std hashers'
/// keys. The seed's bytes are hashed, not xored into the start, or seed 1
/// with "a" and seed 2 with "b" would give one instance id.
pub(crate) fn mix_seed(seed: u64, text: &str) -> u64 {
    seed.to_le_bytes()
        .into_iter()
        .chain(text.bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

/// One run of a [`Backoff`]'s pauses; `None` once its retries are spent.
#[derive(Debug, Clone)]
pub struct Pauses {
    policy: Backoff,
    next: Duration,
    spent: usize,
    rng: SmallRng,
}

impl Pauses {
    /// The next pause, or the longest one once the retries are spent: for
    /// loops that never give up (the lease or the worker ends them).
    pub fn next_or_max(&mut self) -> Duration {
        self.next().unwrap_or(self.policy.max)
    }

    /// Starts again from the first pause, after a success.
    pub fn reset(&mut self) {
        *self = self.policy.pauses();
    }
}

impl Iterator for Pauses {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.policy.retries.is_some_and(|n| self.spent >= n) {
            return None;
        }
        self.spent += 1;
        let base = self.next;
        self.next = base.saturating_mul(2).min(self.policy.max);
        Some(if self.policy.jitter {
            base + base.mul_f64(self.rng.random::<f64>())
        } else {
            base
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn pauses_double_up_to_the_cap_and_start_again_after_a_reset() {
        let mut p = Backoff::new(100 * MS, 500 * MS).without_jitter().pauses();
        let first: Vec<_> = p.by_ref().take(5).collect();
        assert_eq!(first, [100 * MS, 200 * MS, 400 * MS, 500 * MS, 500 * MS]);
        p.reset();
        assert_eq!(p.next(), Some(100 * MS));
    }

    #[test]
    fn retries_bound_the_pauses_and_jitter_stays_within_one_more_pause() {
        let policy = Backoff::new(100 * MS, 1000 * MS).retries(3);
        for _ in 0..50 {
            let pauses: Vec<_> = policy.pauses().collect();
            assert_eq!(pauses.len(), 3);
            for (pause, base) in pauses.iter().zip([100, 200, 400]) {
                assert!(
                    (base * MS..=2 * base * MS).contains(pause),
                    "{pause:?} for {base} ms"
                );
            }
        }
        let mut spent = Backoff::new(100 * MS, 700 * MS).retries(0).pauses();
        assert_eq!(spent.next_or_max(), 700 * MS);
    }

    #[test]
    fn a_seeded_policy_jitters_the_same_in_every_run() {
        let run = |seed| -> Vec<Duration> {
            Backoff::new(100 * MS, 1000 * MS)
                .retries(4)
                .seeded(seed)
                .pauses()
                .collect()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }
}
