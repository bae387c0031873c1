//! What a held lease carries: a sliding-window meter per tenure, fed by
//! the shard's consumer with every batch it reads, and the rule for when
//! the figure is written to the lease item (`throughputKBps`).
//!
//! **The figure.** Bytes a second of record data read over the last
//! window (`load_report_interval`, 60 s by default, in twelve slots), in
//! KB/s as the Java KCL 3.x writes it. A lag that keeps growing counts as
//! load: when `MillisBehindLatest` grew by `g` milliseconds a millisecond
//! over at least half the window (and stands above a second), the shard
//! receives more than the consumer reads, and the figure is the rate read
//! divided by `1 - g` (capped at four times it), an estimate of what
//! arrives. Records a second are measured alongside, for logs.
//!
//! **Where the window is young.** A new tenure starts from the figure the
//! lease item carries (its previous holder's, as the Java KCL seeds its
//! own), which stands for the part of the window not measured yet: a
//! stolen hot lease does not look idle for a minute, which would invite a
//! steal back.
//!
//! **When it is written.** Renewing per lease, every renewal carries the
//! figure (as the Java KCL's do), at no request of its own. With liveness
//! records no lease item is written for renewal, so the figure is written
//! on its own ([`crate::store::LeaseStore::report_load`]), at most once a
//! `load_report_interval` per lease, and only when it moved by more than
//! [`crate::leases::balance::load::TOLERANCE`] (a fifth) from the figure
//! the item shows ([`Meter::report_due`]): an idle fleet writes nothing
//! (no figure reads as idle), and a steady one writes rarely.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::Throughput;
use crate::leases::balance::load::TOLERANCE;

/// Slots per window.
const SLOTS: u64 = 12;

/// A figure change below this (KB/s, about 50 bytes a second) is never
/// worth a write.
const MIN_CHANGE_KBPS: f64 = 0.05;

/// A lag below this is noise (a poll's own delay), not a backlog.
const LAG_FLOOR_MS: u64 = 1_000;

/// The most a growing lag multiplies the figure by.
const MAX_GROWTH: f64 = 0.75;

/// What a lease carried over the last window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reading {
    /// Bytes of record data a second.
    pub(crate) bytes_per_sec: f64,
    /// Records a second.
    pub(crate) records_per_sec: f64,
    /// How fast `MillisBehindLatest` grew (milliseconds a millisecond; 0
    /// when it did not grow, or there is no backlog).
    pub(crate) lag_growth: f64,
    /// The figure published: KB/s read, scaled up by a growing lag.
    pub(crate) load: Throughput,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    index: u64,
    bytes: u64,
    records: u64,
}

#[derive(Debug)]
struct State {
    started: Instant,
    /// Bytes a second the lease carried before this tenure (its item's
    /// figure), for the part of the window not measured yet.
    seed: f64,
    /// Whether the item had a figure at all: without one, a young window
    /// says too little to publish.
    seeded: bool,
    slots: VecDeque<Slot>,
    /// `MillisBehindLatest` as read, at most one sample a slot.
    behind: VecDeque<(u64, Instant, u64)>,
    /// When this tenure last wrote the figure (a report or a renewal that
    /// carried it).
    published_at: Option<Instant>,
}

/// A sliding-window meter of one tenure (see the module doc).
#[derive(Debug)]
pub(crate) struct Meter {
    window: Duration,
    state: Mutex<State>,
}

impl Meter {
    /// A meter over `window`, starting now from `seed` (the figure the
    /// lease item showed when this tenure began).
    pub(crate) fn new(window: Duration, seed: Option<Throughput>) -> Self {
        Meter {
            window: window.max(Duration::from_millis(SLOTS)),
            state: Mutex::new(State {
                started: Instant::now(),
                seed: seed.map_or(0.0, |t| t.kbps() * 1024.0),
                seeded: seed.is_some(),
                slots: VecDeque::new(),
                behind: VecDeque::new(),
                published_at: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot_width(&self) -> Duration {
        self.window / SLOTS as u32
    }

    fn index(&self, state: &State, now: Instant) -> u64 {
        let since = now.saturating_duration_since(state.started);
        (since.as_nanos() / self.slot_width().as_nanos().max(1)) as u64
    }

    /// One batch read: `bytes` of record data in `records` records, the
    /// shard's tip `behind` milliseconds ahead (if the source says).
    pub(crate) fn record(&self, bytes: u64, records: u64, behind: Option<u64>, now: Instant) {
        let mut state = self.lock();
        let index = self.index(&state, now);
        match state.slots.back_mut() {
            Some(slot) if slot.index == index => {
                slot.bytes += bytes;
                slot.records += records;
            }
            _ => state.slots.push_back(Slot {
                index,
                bytes,
                records,
            }),
        }
        if let Some(ms) = behind {
            match state.behind.back_mut() {
                Some(sample) if sample.0 == index => *sample = (index, now, ms),
                _ => state.behind.push_back((index, now, ms)),
            }
        }
        let first = index.saturating_sub(SLOTS - 1);
        while state.slots.front().is_some_and(|s| s.index < first) {
            state.slots.pop_front();
        }
        while state.behind.front().is_some_and(|s| s.0 < first) {
            state.behind.pop_front();
        }
    }

    /// What the lease carried over the window ending `now`.
    pub(crate) fn reading(&self, now: Instant) -> Reading {
        let state = self.lock();
        let index = self.index(&state, now);
        let first = index.saturating_sub(SLOTS - 1);
        let counted = state.slots.iter().filter(|s| s.index >= first);
        let (bytes, records) = counted.fold((0u64, 0u64), |(b, r), s| (b + s.bytes, r + s.records));
        let age = now.saturating_duration_since(state.started);
        let (bytes_per_sec, span) = if age < self.window {
            // A young window: the item's figure stands for the part not
            // measured yet.
            let unseen = (self.window - age).as_secs_f64();
            let rate = (bytes as f64 + state.seed * unseen) / self.window.as_secs_f64();
            (rate, age)
        } else {
            let span_start = state.started + self.slot_width() * first as u32;
            let span = now.saturating_duration_since(span_start);
            (bytes as f64 / span.as_secs_f64().max(1e-3), span)
        };
        let records_per_sec = records as f64 / span.as_secs_f64().max(1.0);
        let lag_growth = growth(&state.behind, first, self.window);
        let kbps = bytes_per_sec / 1024.0 / (1.0 - lag_growth);
        Reading {
            bytes_per_sec,
            records_per_sec,
            lag_growth,
            load: Throughput::from_kbps(kbps).unwrap_or_default(),
        }
    }

    /// The figure a renewal carries now: none while the window is young
    /// and the item had no figure to stand for the rest of it.
    pub(crate) fn current(&self, now: Instant) -> Option<Throughput> {
        {
            let state = self.lock();
            let young = now.saturating_duration_since(state.started) < self.window;
            if young && !state.seeded {
                return None;
            }
        }
        Some(self.reading(now).load)
    }

    /// The figure to write now, if one is due: a `load_report_interval`
    /// (the window) since this tenure last wrote it (or since it began),
    /// and moved by more than [`TOLERANCE`] from `shown` (the item's
    /// figure; none reads as idle).
    pub(crate) fn report_due(&self, shown: Option<Throughput>, now: Instant) -> Option<Reading> {
        let since = {
            let state = self.lock();
            state.published_at.unwrap_or(state.started)
        };
        if now.saturating_duration_since(since) < self.window {
            return None;
        }
        let reading = self.reading(now);
        moved(shown.map_or(0.0, Throughput::kbps), reading.load.kbps()).then_some(reading)
    }

    /// Starts the window afresh at `now` from `seed` (a tenure that
    /// awaited a handoff read nothing until it activated).
    pub(crate) fn restart(&self, seed: Option<Throughput>, now: Instant) {
        let mut state = self.lock();
        state.started = now;
        state.seed = seed.map_or(0.0, |t| t.kbps() * 1024.0);
        state.seeded = seed.is_some();
        state.slots.clear();
        state.behind.clear();
    }

    /// The figure was written, by a write sent at `at`.
    pub(crate) fn published(&self, at: Instant) {
        let mut state = self.lock();
        state.published_at = Some(state.published_at.map_or(at, |p| p.max(at)));
    }
}

/// True if a figure moved enough from `old` to `new` to be worth a write.
pub(crate) fn moved(old: f64, new: f64) -> bool {
    let change = (new - old).abs();
    change >= MIN_CHANGE_KBPS && change > TOLERANCE * new.max(old)
}

/// How fast the lag grew over the samples in the window (see the module
/// doc): 0 without a backlog or without samples spanning half the window.
fn growth(behind: &VecDeque<(u64, Instant, u64)>, first: u64, window: Duration) -> f64 {
    let mut samples = behind.iter().filter(|s| s.0 >= first);
    let (Some(oldest), Some(newest)) = (samples.next(), behind.back()) else {
        return 0.0;
    };
    let span = newest.1.saturating_duration_since(oldest.1);
    if span < window / 2 || newest.2 < LAG_FLOOR_MS {
        return 0.0;
    }
    let grown = newest.2.saturating_sub(oldest.2) as f64;
    (grown / span.as_millis() as f64).clamp(0.0, MAX_GROWTH)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn kbps(x: f64) -> Option<Throughput> {
        Throughput::from_kbps(x)
    }

    /// 10 KB every second for two windows reads as 10 KB/s, and the old
    /// window's bytes leave it.
    #[tokio::test(start_paused = true)]
    async fn a_steady_shard_reads_as_its_rate_over_the_window() {
        let meter = Meter::new(MIN, None);
        for _ in 0..120 {
            tokio::time::advance(Duration::from_secs(1)).await;
            meter.record(10 * 1024, 10, Some(0), Instant::now());
        }
        let r = meter.reading(Instant::now());
        assert!((r.load.kbps() - 10.0).abs() < 0.5, "{r:?}");
        assert!((r.records_per_sec - 10.0).abs() < 0.5, "{r:?}");
        assert_eq!(r.lag_growth, 0.0);
        // It goes quiet: a window later it reads idle.
        tokio::time::advance(MIN + Duration::from_secs(6)).await;
        assert_eq!(meter.reading(Instant::now()).load.kbps(), 0.0);
    }

    /// A new tenure starts from its predecessor's figure, so a stolen hot
    /// lease does not read as idle while its window fills.
    #[tokio::test(start_paused = true)]
    async fn a_young_window_stands_on_the_items_figure() {
        let seeded = Meter::new(MIN, kbps(40.0));
        let unseeded = Meter::new(MIN, None);
        for _ in 0..15 {
            tokio::time::advance(Duration::from_secs(1)).await;
            seeded.record(40 * 1024, 1, None, Instant::now());
            unseeded.record(40 * 1024, 1, None, Instant::now());
        }
        let now = Instant::now();
        assert!((seeded.reading(now).load.kbps() - 40.0).abs() < 1.0);
        assert!(unseeded.reading(now).load.kbps() < 11.0);
        // Renewals carry the seeded figure, and none while unseeded.
        assert!(seeded.current(now).is_some());
        assert_eq!(unseeded.current(now), None);
        tokio::time::advance(MIN).await;
        assert!(unseeded.current(Instant::now()).is_some());
    }

    /// A lag growing half a second a second doubles the figure: the shard
    /// receives twice what its consumer reads.
    #[tokio::test(start_paused = true)]
    async fn a_growing_lag_counts_as_load() {
        let meter = Meter::new(MIN, None);
        for s in 0..60u64 {
            tokio::time::advance(Duration::from_secs(1)).await;
            meter.record(10 * 1024, 10, Some(5_000 + s * 500), Instant::now());
        }
        let r = meter.reading(Instant::now());
        assert!((r.lag_growth - 0.5).abs() < 0.02, "{r:?}");
        assert!((r.load.kbps() - 20.0).abs() < 1.0, "{r:?}");
        // A steady backlog is no growth.
        let steady = Meter::new(MIN, None);
        for _ in 0..60 {
            tokio::time::advance(Duration::from_secs(1)).await;
            steady.record(10 * 1024, 10, Some(30_000), Instant::now());
        }
        assert_eq!(steady.reading(Instant::now()).lag_growth, 0.0);
    }

    /// Reports come at most once a window, only when the figure moved by
    /// more than a fifth: an idle lease never reports, a steady one once.
    #[tokio::test(start_paused = true)]
    async fn a_figure_is_written_once_a_window_at_most_and_only_when_it_moved() {
        let idle = Meter::new(MIN, None);
        tokio::time::advance(MIN * 3).await;
        assert_eq!(idle.report_due(None, Instant::now()), None);

        let busy = Meter::new(MIN, None);
        let mut shown = None;
        let mut writes = 0;
        for _ in 0..300 {
            tokio::time::advance(Duration::from_secs(1)).await;
            busy.record(10 * 1024, 10, None, Instant::now());
            if let Some(reading) = busy.report_due(shown, Instant::now()) {
                shown = Some(reading.load);
                busy.published(Instant::now());
                writes += 1;
            }
        }
        assert_eq!(writes, 1, "steady at 10 KB/s after the first window");
        assert!((shown.expect("written").kbps() - 10.0).abs() < 0.5);
        // Within a fifth: nothing; beyond: written.
        assert!(!moved(10.0, 11.9));
        assert!(moved(10.0, 12.6));
        assert!(moved(10.0, 0.0));
        assert!(!moved(0.0, 0.04));
    }
}
