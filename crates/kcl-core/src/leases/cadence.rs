//! When a peer's beats land, learnt from reads of its liveness record
//! alone: what lets a worker read the records just after each peer's beat,
//! so that it sees a holder's last beat within milliseconds rather than up
//! to a read interval late.
//!
//! A peer beats every `interval` on its own clock and its counter grows by
//! one a beat. A read of its record asked for at `q`, answered at `r` and
//! showing counter `v` says that beat `v` landed no later than `r` and
//! beat `v + 1` no earlier than `q`. Assuming a steady cadence, each read
//! narrows one window for when the next beat lands; a read placed in the
//! middle of that window halves it, and once it is narrow a read just after
//! its end sees each beat moments after it landed.
//!
//! The cadence only ever decides *when* to read. A wrong guess (a beat
//! late, retried or shifted by an overrun, a clock running at another rate)
//! costs precision, never safety: liveness is still judged from what the
//! reads showed and when this worker asked for them (`liveness`).

use std::time::Duration;

use tokio::time::Instant;

/// What one peer's reads have shown of its beats' timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cadence {
    interval: Duration,
    /// The last counter read.
    counter: u64,
    /// Beat `counter` landed after `lo` and no later than `hi`.
    lo: Instant,
    hi: Instant,
    /// How long reads take (the slowest of the recent ones, forgotten
    /// slowly): no window gets much narrower than twice that, whatever the
    /// reads. The last read's alone made "narrow" flip with every fast
    /// answer, and each flip cost a read in the window's middle (13 reads
    /// a minute instead of 12 for one peer on DynamoDB).
    latency: Duration,
}

/// More beats than this between two reads and the cadence is not trusted
/// to have held: the window is learnt anew.
const MAX_EXTRAPOLATED: u64 = 8;

impl Cadence {
    /// The cadence of a peer beating every `interval`, from a first read.
    pub(crate) fn new(interval: Duration, counter: u64, asked: Instant, answered: Instant) -> Self {
        let (lo, hi) = alone(interval, asked, answered);
        Cadence {
            interval,
            counter,
            lo,
            hi,
            latency: answered.saturating_duration_since(asked),
        }
    }

    /// How soon after it lands a beat is seen once the window is learnt:
    /// reads halve the window until it is half this wide, then come half
    /// this after its end. A fiftieth of the interval (100 ms at the
    /// default 5 s), within 10 to 200 ms.
    pub(crate) fn precision(&self) -> Duration {
        (self.interval / 50).clamp(Duration::from_millis(10), Duration::from_millis(200))
    }

    /// The beat interval this cadence assumes.
    #[cfg(test)]
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// When the last counter read landed: after the first and no later
    /// than the second instant.
    #[cfg(test)]
    pub(crate) fn window(&self) -> (Instant, Instant) {
        (self.lo, self.hi)
    }

    /// Narrows the window by one more read, asked for at `asked` and
    /// answered at `answered`, showing `counter`. A read that contradicts
    /// the cadence (a beat later than it allows, the interval changed, the
    /// counter jumped) starts it afresh from this read, keeping what the
    /// earlier window allows give or take a few precisions of jitter.
    pub(crate) fn observe(
        &mut self,
        interval: Duration,
        counter: u64,
        asked: Instant,
        answered: Instant,
    ) {
        let (lo, hi) = alone(interval, asked, answered);
        let beats = counter.checked_sub(self.counter);
        let trusted = interval == self.interval && beats.is_some_and(|k| k <= MAX_EXTRAPOLATED);
        let (mut new_lo, mut new_hi) = (lo, hi);
        if let (true, Some(k)) = (trusted, beats) {
            let shift = self.interval * k as u32;
            let (prior_lo, prior_hi) = (self.lo + shift, self.hi + shift);
            if prior_lo.max(lo) < prior_hi.min(hi) {
                (new_lo, new_hi) = (prior_lo.max(lo), prior_hi.min(hi));
            } else {
                // Landings jitter by the store's latency: a beat a little
                // later than the window said narrows from a slightly wider
                // one instead of from scratch.
                let slack = self.precision() * 4;
                let (wide_lo, wide_hi) = (prior_lo - slack, prior_hi + slack);
                if wide_lo.max(lo) < wide_hi.min(hi) {
                    (new_lo, new_hi) = (wide_lo.max(lo), wide_hi.min(hi));
                }
            }
        }
        let latency = answered.saturating_duration_since(asked);
        *self = Cadence {
            interval,
            counter,
            lo: new_lo,
            hi: new_hi,
            latency: latency.max(self.latency - self.latency / 8),
        };
    }

    /// When to read next to learn the most about the next beat, no
    /// earlier than `after`: in the middle of the window it may land in
    /// while that window is wide, just after its end once it is narrow.
    /// Past both (the beat is late, or the peer stopped), the same point
    /// of a later beat.
    pub(crate) fn next_read(&self, after: Instant) -> Instant {
        let half = self.precision() / 2;
        let (lo, hi) = (self.lo + self.interval, self.hi + self.interval);
        // Reads cannot narrow a window below about twice their own
        // latency: at that width, go just after its end.
        let narrow = hi.saturating_duration_since(lo) <= half + self.latency * 2;
        let mut at = if narrow {
            hi + half
        } else {
            lo + (hi - lo) / 2
        };
        if at > after || self.interval.is_zero() {
            return at.max(after);
        }
        // The planned read is past (the read before it answered late, or
        // the beat is late) while the beat's window is not: read now.
        if hi + half > after {
            return after;
        }
        while at <= after {
            at += self.interval;
        }
        at
    }
}

/// The window one read alone gives for when the counter it shows landed:
/// no later than its answer, and no earlier than an interval before its
/// ask (the next beat had not landed by then).
fn alone(interval: Duration, asked: Instant, answered: Instant) -> (Instant, Instant) {
    let lo = asked.checked_sub(interval).unwrap_or(asked);
    (lo, answered.max(lo + Duration::from_nanos(1)))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A peer beating every `interval` from `phase`, each beat landing
    /// `latency(k)` after its round; a reader that reads whenever the
    /// cadence says. Returns, per beat, how long after it landed the first
    /// read showing it was answered.
    fn follow(
        t0: Instant,
        interval: Duration,
        phase: Duration,
        latency: impl Fn(u64) -> Duration,
        read_latency: Duration,
        beats: u64,
    ) -> Vec<Duration> {
        let landed = |k: u64| t0 + phase + interval * k as u32 + latency(k);
        let counter_at = |t: Instant| (0..=beats + 1).take_while(|k| landed(*k) <= t).last();
        // The first read comes at an arbitrary moment.
        let mut asked = t0 + phase + interval * 2 + interval / 3;
        let mut cadence: Option<Cadence> = None;
        let mut seen_after: Vec<Option<Duration>> = vec![None; beats as usize + 2];
        while asked < landed(beats) {
            // The store reads the record half-way through the call.
            let served = asked + read_latency / 2;
            let answered = asked + read_latency;
            if let Some(v) = counter_at(served) {
                if seen_after[v as usize].is_none() {
                    seen_after[v as usize] = Some(answered - landed(v));
                }
                match &mut cadence {
                    Some(c) => c.observe(interval, v, asked, answered),
                    None => cadence = Some(Cadence::new(interval, v, asked, answered)),
                }
            }
            let next = match &cadence {
                Some(c) => c.next_read(answered),
                None => answered + interval / 3,
            };
            asked = next;
        }
        seen_after.into_iter().flatten().collect()
    }

    /// Once the window is learnt (a few beats), every beat is seen within
    /// the precision, three read latencies and the store's jitter of
    /// landing, with one read per beat.
    #[tokio::test(start_paused = true)]
    async fn a_steady_peer_is_read_just_after_each_beat() {
        let t0 = Instant::now();
        let interval = Duration::from_secs(5);
        let seen = follow(
            t0,
            interval,
            Duration::from_millis(777),
            |_| Duration::from_millis(20),
            Duration::from_millis(30),
            40,
        );
        let settled = &seen[10..];
        let worst = settled.iter().max().unwrap();
        assert!(
            *worst <= Duration::from_millis(100 + 3 * 30 + 20),
            "{worst:?}: {settled:?}"
        );
    }

    proptest! {
        /// Whatever the phase, interval, and a store latency that jitters
        /// by up to a fiftieth of the interval, beats are seen within the
        /// precision, the jitter and three read latencies once the window
        /// is learnt, and no beat is skipped.
        #[test]
        fn beats_are_seen_soon_after_they_land_whatever_the_phase(
            interval_ms in 1_000u64..30_000,
            phase_ms in 0u64..30_000,
            jitter in proptest::collection::vec(0u64..1_000, 64),
            read_ms in 1u64..100,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let t0 = Instant::now();
                let interval = Duration::from_millis(interval_ms);
                let precision = (interval / 50)
                    .clamp(Duration::from_millis(10), Duration::from_millis(200));
                let max_jitter = interval / 50;
                let latency = |k: u64| {
                    max_jitter.mul_f64(jitter[k as usize % jitter.len()] as f64 / 1_000.0)
                };
                let read = Duration::from_millis(read_ms);
                let seen = follow(t0, interval, Duration::from_millis(phase_ms), latency, read, 48);
                prop_assert!(seen.len() >= 45, "beats seen: {}", seen.len());
                for (k, after) in seen.iter().enumerate().skip(16) {
                    prop_assert!(
                        *after <= precision + max_jitter + read * 3,
                        "beat {k} seen {after:?} after landing ({precision:?} precision)"
                    );
                }
                Ok(())
            })?;
        }
    }

    /// A contradicting read (the interval changed, the counter jumped far)
    /// starts the window afresh from that read; a late beat widens it a
    /// little; the window always holds the beat that was read.
    #[tokio::test(start_paused = true)]
    async fn a_contradicting_read_starts_the_window_afresh() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let mut c = Cadence::new(s(5), 10, t0 + s(10), t0 + s(10) + ms(10));
        assert_eq!(c.window(), (t0 + s(5), t0 + s(10) + ms(10)));
        // Beat 11 not landed at 12 s: it lands after 12 s.
        c.observe(s(5), 10, t0 + s(12), t0 + s(12) + ms(10));
        assert_eq!(c.window().0, t0 + s(7));
        // Read far later, 20 beats on: the window comes from that read.
        c.observe(s(5), 30, t0 + s(110), t0 + s(110) + ms(10));
        assert_eq!(c.window(), (t0 + s(105), t0 + s(110) + ms(10)));
        // Another interval: afresh too.
        c.observe(s(2), 31, t0 + s(111), t0 + s(111) + ms(10));
        assert_eq!(c.interval(), s(2));
        assert_eq!(c.window(), (t0 + s(109), t0 + s(111) + ms(10)));
        assert!(c.next_read(t0 + s(200)) > t0 + s(200));
    }
}
