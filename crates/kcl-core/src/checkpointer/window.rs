//! The low watermark of a shard processed in parallel lanes: the highest
//! position below which every record handed to a lane is done. Lanes finish
//! out of shard order, so the shard's checkpoint may only advance to this
//! position, never to the last record of the lane that happens to be ahead.

use std::collections::VecDeque;

use super::Position;

/// How many records a shard's lanes may hold between the watermark and
/// the newest record handed out before the consumer stops fetching.
///
/// A lane's record is done only once that lane checkpoints past it (a lane
/// may hold records in memory and flush them later), so one lane that
/// never checkpoints would otherwise pin every record of every lane. With
/// this bound the window holds at most this many records plus the batch
/// that crossed it (about 150 bytes a record with Kinesis's 56-digit
/// sequence numbers: some 16 MB a shard), and the shard's fetching waits
/// until the lane holding the oldest record checkpoints it. At a shard's
/// 1,000 records/s, each lane must checkpoint within about 100 s; one that
/// checkpoints only in `shutdown_requested` stalls its shard here.
pub const MAX_LANE_RECORDS_IN_FLIGHT: usize = 100_000;

/// A record handed to a lane and not yet passed by the watermark.
#[derive(Debug)]
struct Slot {
    position: Position,
    done: bool,
}

/// Every record handed to the lanes and not yet passed by the watermark, in
/// shard order, and which of them each lane still owes.
#[derive(Debug)]
pub(crate) struct Window {
    /// Records in shard order, the first being the oldest not yet done.
    slots: VecDeque<Slot>,
    /// The ordinal of `slots[0]`.
    base: u64,
    /// Each lane's records not yet checkpointed, in shard order, by
    /// ordinal. A record set aside stays until the lane's front reaches it
    /// (its slot says it is done): taking it out of the middle would cost
    /// a shift of the queue per record.
    lanes: Vec<VecDeque<u64>>,
    watermark: Option<Position>,
    /// The lanes that checkpointed their last record since the shard ended.
    ended: Vec<bool>,
    /// Records at which the consumer stops fetching.
    capacity: usize,
    /// Slots looked at by `done_exactly`, to hold its cost to account.
    #[cfg(test)]
    probes: u64,
}

impl Window {
    pub(crate) fn new(lanes: usize) -> Self {
        Window {
            slots: VecDeque::new(),
            base: 0,
            lanes: vec![VecDeque::new(); lanes],
            watermark: None,
            ended: vec![false; lanes],
            capacity: MAX_LANE_RECORDS_IN_FLIGHT,
            #[cfg(test)]
            probes: 0,
        }
    }

    /// `position` goes to `lane`; positions come in shard order.
    pub(crate) fn dispatch(&mut self, lane: usize, position: Position) {
        let ordinal = self.base + self.slots.len() as u64;
        self.slots.push_back(Slot {
            position,
            done: false,
        });
        self.lanes[lane].push_back(ordinal);
    }

    /// Every record of `lane` at or before `through` is done.
    pub(crate) fn done_through(&mut self, lane: usize, through: &Position) {
        while let Some(&ordinal) = self.lanes[lane].front() {
            if self
                .slot(ordinal)
                .is_some_and(|slot| slot.position > *through)
            {
                break;
            }
            self.mark(ordinal);
            self.lanes[lane].pop_front();
        }
        self.advance();
    }

    /// The records of `lane` at exactly `positions` (in shard order) are
    /// done (set aside), and no other: records before them the lane's
    /// processor has not checkpointed still hold the watermark back. The
    /// cost is linear in `positions` (plus a binary search): they are a run
    /// of the lane's records, walked alongside the lane's queue.
    pub(crate) fn done_exactly(&mut self, lane: usize, positions: &[Position]) {
        self.settle(lane);
        let (hits, _probes) = self.find(lane, positions);
        #[cfg(test)]
        {
            self.probes += _probes;
        }
        for ordinal in hits {
            self.mark(ordinal);
        }
        self.settle(lane);
        self.advance();
    }

    /// The ordinals of `positions` among `lane`'s records (settled, so each
    /// has a slot), and how many slots were looked at.
    fn find(&self, lane: usize, positions: &[Position]) -> (Vec<u64>, u64) {
        let owed = &self.lanes[lane];
        let at = |ordinal: u64| self.slot(ordinal).map(|slot| &slot.position);
        let Some(first) = positions.first() else {
            return (Vec::new(), 0);
        };
        let mut probes = 0u64;
        let mut i = owed.partition_point(|&ordinal| {
            probes += 1;
            at(ordinal).is_some_and(|p| p < first)
        });
        let mut hits = Vec::with_capacity(positions.len());
        for position in positions {
            while let Some(&ordinal) = owed.get(i) {
                probes += 1;
                match at(ordinal) {
                    Some(p) if p < position => i += 1,
                    Some(p) if p == position => {
                        hits.push(ordinal);
                        i += 1;
                        break;
                    }
                    _ => break,
                }
            }
        }
        (hits, probes)
    }

    /// `lane` checkpointed after the shard ended. It is ended once it owes
    /// nothing: a lane that flushes what it held chunk by chunk is not done
    /// at its first chunk. True once every lane is.
    pub(crate) fn end_lane(&mut self, lane: usize) -> bool {
        self.settle(lane);
        if self.lanes[lane].is_empty() {
            self.ended[lane] = true;
        }
        self.ended.iter().all(|e| *e)
    }

    /// Drops the front of `lane`'s queue while it is done (set aside) or
    /// passed by the watermark.
    fn settle(&mut self, lane: usize) {
        while let Some(&ordinal) = self.lanes[lane].front() {
            if self.slot(ordinal).is_some_and(|slot| !slot.done) {
                break;
            }
            self.lanes[lane].pop_front();
        }
    }

    /// The slot of `ordinal`, unless the watermark passed it.
    fn slot(&self, ordinal: u64) -> Option<&Slot> {
        let index = usize::try_from(ordinal.checked_sub(self.base)?).ok()?;
        self.slots.get(index)
    }

    fn mark(&mut self, ordinal: u64) {
        let Some(index) = ordinal
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
        else {
            return;
        };
        if let Some(slot) = self.slots.get_mut(index) {
            slot.done = true;
        }
    }

    fn advance(&mut self) {
        while self.slots.front().is_some_and(|slot| slot.done) {
            if let Some(slot) = self.slots.pop_front() {
                self.watermark = Some(slot.position);
            }
            self.base += 1;
        }
    }

    /// The highest position at and below which everything handed out is
    /// done; `None` until the first record is.
    pub(crate) fn watermark(&self) -> Option<&Position> {
        self.watermark.as_ref()
    }

    /// Records handed out and not yet passed by the watermark.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots.len()
    }

    /// Whether the consumer must stop fetching until the watermark moves.
    pub(crate) fn is_full(&self) -> bool {
        self.slots.len() >= self.capacity
    }

    /// The lane that owes the oldest record not done, and that record: the
    /// one the watermark waits for.
    pub(crate) fn holder(&self) -> Option<(usize, &Position)> {
        let oldest = self.slots.front()?;
        let lane = self
            .lanes
            .iter()
            .position(|owed| owed.binary_search(&self.base).is_ok())?;
        Some((lane, &oldest.position))
    }

    /// How many records handed out are not done yet.
    #[cfg(test)]
    pub(crate) fn outstanding(&self) -> usize {
        self.slots.iter().filter(|slot| !slot.done).count()
    }
}

impl super::Checkpointer {
    /// In a lane: whether the lane checkpointed its end after the shard
    /// ended (it owes nothing), so `shard_ended` is not asked of it again.
    pub(crate) fn lane_ended(&self) -> bool {
        self.lane
            .as_ref()
            .is_some_and(|link| link.window().ended[link.index])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pos(n: u64) -> Position {
        Position::new(n.to_string(), 0)
    }

    #[test]
    fn the_watermark_waits_for_the_slowest_lane() {
        let mut w = Window::new(2);
        for n in 1..=4 {
            w.dispatch((n % 2) as usize, pos(n));
        }
        // Lane 0 holds 2 and 4, lane 1 holds 1 and 3.
        w.done_through(0, &pos(4));
        assert_eq!(w.watermark(), None, "record 1 is not done");
        w.done_through(1, &pos(1));
        assert_eq!(w.watermark(), Some(&pos(2)));
        w.done_through(1, &pos(3));
        assert_eq!(w.watermark(), Some(&pos(4)));
        assert_eq!(w.outstanding(), 0);
    }

    #[test]
    fn a_record_set_aside_leaves_the_lanes_earlier_records_owed() {
        let mut w = Window::new(1);
        for n in 1..=3 {
            w.dispatch(0, pos(n));
        }
        w.done_exactly(0, &[pos(2)]);
        assert_eq!(w.watermark(), None, "record 1 is not checkpointed");
        w.done_through(0, &pos(1));
        assert_eq!(w.watermark(), Some(&pos(2)));
        w.done_through(0, &pos(3));
        assert_eq!(w.watermark(), Some(&pos(3)));
    }

    #[test]
    fn a_skipped_batch_costs_work_linear_in_its_records() {
        const N: u64 = 10_000;
        let mut w = Window::new(1);
        for n in 1..=2 * N {
            w.dispatch(0, pos(n));
        }
        let skipped: Vec<Position> = (N + 1..=2 * N).map(pos).collect();
        w.done_exactly(0, &skipped);
        assert_eq!(w.watermark(), None, "records 1..=N are owed");
        let all: Vec<Position> = (1..=N).map(pos).collect();
        w.done_exactly(0, &all);
        assert_eq!(w.watermark(), Some(&pos(2 * N)));
        // Each position once, each slot walked once, and two binary
        // searches; a search of the batch per owed record is N x N.
        assert!(
            w.probes <= 4 * N + 64,
            "{} probes for 2 x {N} records",
            w.probes
        );
    }

    #[test]
    fn a_lane_is_ended_once_it_owes_nothing() {
        let mut w = Window::new(2);
        w.dispatch(0, pos(1));
        for n in 2..=4 {
            w.dispatch(1, pos(n));
        }
        w.done_through(0, &pos(1));
        assert!(!w.end_lane(0), "lane 1 is not ended");
        w.done_through(1, &pos(2));
        assert!(!w.end_lane(1), "lane 1 owes 3 and 4");
        w.done_exactly(1, &[pos(4)]);
        assert!(!w.end_lane(1), "lane 1 owes 3");
        w.done_through(1, &pos(3));
        assert!(w.end_lane(1));
        assert_eq!(w.watermark(), Some(&pos(4)));
    }

    #[test]
    fn the_window_is_full_at_its_capacity_and_names_the_lane_holding_it() {
        let mut w = Window::new(2);
        w.capacity = 3;
        w.dispatch(1, pos(1));
        w.dispatch(0, pos(2));
        w.dispatch(1, pos(3));
        assert!(w.is_full());
        assert_eq!(w.holder(), Some((1, &pos(1))));
        w.done_through(0, &pos(2));
        assert!(w.is_full(), "record 1 holds records 2 and 3 in the window");
        w.done_through(1, &pos(1));
        assert!(!w.is_full());
        assert_eq!((w.in_flight(), w.holder()), (1, Some((1, &pos(3)))));
    }

    proptest! {
        /// Whatever order lanes finish in, and whatever runs of their
        /// records they set aside, the watermark is exactly the longest
        /// done prefix of the shard.
        #[test]
        fn the_watermark_is_the_longest_done_prefix(
            lanes_of in proptest::collection::vec(0usize..5, 1..60),
            finish in proptest::collection::vec((0usize..5, 0u64..60, 0usize..4), 0..80),
        ) {
            let mut w = Window::new(5);
            for (i, lane) in lanes_of.iter().enumerate() {
                w.dispatch(*lane, pos(i as u64 + 1));
            }
            let mut done = vec![false; lanes_of.len()];
            for (lane, through, set_aside) in finish {
                // A lane's records from `through` on, `set_aside` of them.
                let run: Vec<usize> = (0..lanes_of.len())
                    .filter(|i| lanes_of[*i] == lane && (*i as u64 + 1) >= through)
                    .take(set_aside)
                    .collect();
                if set_aside == 0 {
                    w.done_through(lane, &pos(through));
                    for (i, l) in lanes_of.iter().enumerate() {
                        if *l == lane && (i as u64 + 1) <= through {
                            done[i] = true;
                        }
                    }
                } else {
                    let positions: Vec<Position> = run.iter().map(|i| pos(*i as u64 + 1)).collect();
                    w.done_exactly(lane, &positions);
                    for i in run {
                        done[i] = true;
                    }
                }
                let prefix = done.iter().take_while(|d| **d).count();
                let expected = (prefix > 0).then(|| pos(prefix as u64));
                prop_assert_eq!(w.watermark().cloned(), expected);
                prop_assert_eq!(w.outstanding(), done.iter().filter(|d| !**d).count());
            }
        }
    }
}
