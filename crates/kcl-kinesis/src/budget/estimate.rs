//! What a fan-out subscriber reserves of the worker-wide budget for its
//! next event, whose size is known only once it is read.
//!
//! The reservation is held from before the event is read until it
//! arrives, and an idle shard's next event is seconds away (Kinesis sends
//! an empty one about every 5 s): a reservation the size of the reader's
//! own budget would let a few idle shards hold the whole worker budget
//! while they wait, and queue every busy shard behind them. So it follows
//! the shard's recent events instead, with a floor for the quiet ones.

/// The least a subscriber reserves for an event (when its reader's own
/// budget is not smaller): what a quiet shard's event is expected to hold
/// at most, small enough that thousands of idle shards fit one worker's
/// budget together (16 384 in the default 1 GiB).
pub(crate) const MIN_EVENT_RESERVATION: usize = 64 * 1024;

/// The reservation for one reader's next event.
///
/// Before its first event a reader reserves its whole own budget: a reader
/// usually starts behind (from a checkpoint), so its first events are its
/// largest, and every reader starting at once must not go over the worker
/// budget. After that it reserves the largest batch seen lately, halved by
/// each event since (so an idle shard is back at the floor
/// log2(largest / floor) events after a burst, while one whose events
/// alternate between large and small keeps at least half the large), never
/// less than the floor nor more than its own budget.
#[derive(Debug, Clone)]
pub(crate) struct EventEstimate {
    /// The decayed largest batch; `None` before the first event.
    recent: Option<usize>,
    floor: usize,
    cap: usize,
}

impl EventEstimate {
    /// The estimate of a reader whose own budget is `cap` bytes.
    pub(crate) fn new(cap: usize) -> Self {
        EventEstimate {
            recent: None,
            floor: MIN_EVENT_RESERVATION.min(cap),
            cap,
        }
    }

    /// What to reserve for the next event.
    pub(crate) fn reservation(&self) -> usize {
        match self.recent {
            None => self.cap,
            Some(recent) => recent.clamp(self.floor, self.cap),
        }
    }

    /// Takes note of an event whose batch holds `held` bytes.
    pub(crate) fn saw(&mut self, held: usize) {
        let decayed = self.recent.map_or(0, |recent| recent / 2);
        self.recent = Some(held.max(decayed));
    }
}

#[cfg(test)]
mod tests {
    use super::{EventEstimate, MIN_EVENT_RESERVATION};

    const KIB: usize = 1024;

    #[test]
    fn a_reader_reserves_its_whole_budget_until_its_first_event() {
        let mut estimate = EventEstimate::new(8 * 1024 * KIB);
        assert_eq!(estimate.reservation(), 8 * 1024 * KIB);
        estimate.saw(0);
        assert_eq!(estimate.reservation(), MIN_EVENT_RESERVATION);
    }

    #[test]
    fn the_reservation_follows_the_largest_recent_batch_halving_per_event() {
        let mut estimate = EventEstimate::new(8 * 1024 * KIB);
        estimate.saw(1024 * KIB);
        assert_eq!(estimate.reservation(), 1024 * KIB);
        // Smaller batches after it: halved once per event, down to the
        // floor, and a larger one is followed at once.
        let mut reserved = Vec::new();
        for _ in 0..5 {
            estimate.saw(10 * KIB);
            reserved.push(estimate.reservation() / KIB);
        }
        assert_eq!(reserved, [512, 256, 128, 64, 64]);
        estimate.saw(300 * KIB);
        assert_eq!(estimate.reservation(), 300 * KIB);
    }

    #[test]
    fn the_reservation_stays_within_the_floor_and_the_readers_budget() {
        let mut estimate = EventEstimate::new(256 * KIB);
        estimate.saw(10 * 1024 * KIB);
        assert_eq!(estimate.reservation(), 256 * KIB);
        // A reader whose own budget is below the floor reserves all of it.
        let mut small = EventEstimate::new(16 * KIB);
        small.saw(0);
        assert_eq!(small.reservation(), 16 * KIB);
    }
}
