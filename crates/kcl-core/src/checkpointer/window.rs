//! The low watermark of a shard processed in parallel lanes: the highest
//! position below which every record handed to a lane is done. Lanes finish
//! out of shard order, so the shard's checkpoint may only advance to this
//! position, never to the last record of the lane that happens to be ahead.

use std::collections::VecDeque;

use super::Position;

/// Every record handed to the lanes and not yet passed by the watermark, in
/// shard order, and which of them each lane still owes.
#[derive(Debug, Default)]
pub(crate) struct Window {
    /// Records in shard order, the first being the oldest not yet done.
    slots: VecDeque<(Position, bool)>,
    /// The ordinal of `slots[0]`.
    base: u64,
    /// Each lane's records not yet done, in shard order, by ordinal.
    lanes: Vec<VecDeque<(u64, Position)>>,
    watermark: Option<Position>,
    /// The lanes that checkpointed since the shard ended.
    ended: Vec<bool>,
}

impl Window {
    pub(crate) fn new(lanes: usize) -> Self {
        Window {
            lanes: vec![VecDeque::new(); lanes],
            ended: vec![false; lanes],
            ..Window::default()
        }
    }

    /// `position` goes to `lane`; positions come in shard order.
    pub(crate) fn dispatch(&mut self, lane: usize, position: Position) {
        let ordinal = self.base + self.slots.len() as u64;
        self.slots.push_back((position.clone(), false));
        self.lanes[lane].push_back((ordinal, position));
    }

    /// Every record of `lane` at or before `through` is done.
    pub(crate) fn done_through(&mut self, lane: usize, through: &Position) {
        while let Some((ordinal, position)) = self.lanes[lane].front() {
            if position > through {
                break;
            }
            let ordinal = *ordinal;
            self.mark(ordinal);
            self.lanes[lane].pop_front();
        }
        self.advance();
    }

    /// The records of `lane` at exactly `positions` are done (set aside),
    /// and no other: records before them the lane's processor has not
    /// checkpointed still hold the watermark back.
    pub(crate) fn done_exactly(&mut self, lane: usize, positions: &[Position]) {
        let mut owed = std::mem::take(&mut self.lanes[lane]);
        owed.retain(|(ordinal, position)| {
            let hit = positions.contains(position);
            if hit {
                self.mark(*ordinal);
            }
            !hit
        });
        self.lanes[lane] = owed;
        self.advance();
    }

    /// `lane` checkpointed after the shard ended; true once every lane has.
    pub(crate) fn end_lane(&mut self, lane: usize) -> bool {
        self.ended[lane] = true;
        self.ended.iter().all(|e| *e)
    }

    fn mark(&mut self, ordinal: u64) {
        let index = usize::try_from(ordinal - self.base).unwrap_or(usize::MAX);
        if let Some(slot) = self.slots.get_mut(index) {
            slot.1 = true;
        }
    }

    fn advance(&mut self) {
        while self.slots.front().is_some_and(|(_, done)| *done) {
            if let Some((position, _)) = self.slots.pop_front() {
                self.watermark = Some(position);
            }
            self.base += 1;
        }
    }

    /// The highest position at and below which everything handed out is
    /// done; `None` until the first record is.
    pub(crate) fn watermark(&self) -> Option<&Position> {
        self.watermark.as_ref()
    }

    /// How many records handed out are not done yet.
    #[cfg(test)]
    pub(crate) fn outstanding(&self) -> usize {
        self.lanes.iter().map(VecDeque::len).sum()
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

    proptest! {
        /// Whatever order lanes finish in, the watermark is exactly the
        /// longest done prefix of the shard.
        #[test]
        fn the_watermark_is_the_longest_done_prefix(
            lanes_of in proptest::collection::vec(0usize..5, 1..60),
            finish in proptest::collection::vec((0usize..5, 0u64..60), 0..80),
        ) {
            let mut w = Window::new(5);
            for (i, lane) in lanes_of.iter().enumerate() {
                w.dispatch(*lane, pos(i as u64 + 1));
            }
            let mut done = vec![false; lanes_of.len()];
            for (lane, through) in finish {
                w.done_through(lane, &pos(through));
                for (i, l) in lanes_of.iter().enumerate() {
                    if *l == lane && (i as u64 + 1) <= through {
                        done[i] = true;
                    }
                }
                let prefix = done.iter().take_while(|d| **d).count();
                let expected = (prefix > 0).then(|| pos(prefix as u64));
                prop_assert_eq!(w.watermark().cloned(), expected);
            }
        }
    }
}
