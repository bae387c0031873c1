//! Kinesis sequence numbers and record positions, ordered by value: the
//! one place that knows how two positions compare.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use crate::lease::Checkpoint;
use crate::record::Record;

/// A Kinesis sequence number: a decimal string of up to 128 bits, ordered
/// as the number it spells (a longer number is larger; leading zeros are
/// ignored, so `"0010"` equals `"10"`). The text is kept as given.
#[derive(Debug, Clone)]
pub struct SequenceNumber(String);

impl SequenceNumber {
    /// Wraps the decimal text of a sequence number.
    pub fn new(digits: impl Into<String>) -> Self {
        SequenceNumber(digits.into())
    }

    /// The text as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Orders two sequence numbers given as text, without wrapping them.
    pub fn order(a: &str, b: &str) -> Ordering {
        let a = a.trim_start_matches('0');
        let b = b.trim_start_matches('0');
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }

    fn significant(&self) -> &str {
        self.0.trim_start_matches('0')
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        SequenceNumber::order(&self.0, &other.0)
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for SequenceNumber {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for SequenceNumber {}

impl Hash for SequenceNumber {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Equal numbers hash alike, whatever their leading zeros.
        self.significant().hash(state);
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for SequenceNumber {
    fn from(digits: String) -> Self {
        SequenceNumber(digits)
    }
}

impl From<&str> for SequenceNumber {
    fn from(digits: &str) -> Self {
        SequenceNumber(digits.to_owned())
    }
}

/// A user record's place in its shard: the sequence number of the Kinesis
/// record, then its sub-sequence number inside a KPL aggregate (0 for a
/// record that is not aggregated). Ordered in that order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Position {
    /// The Kinesis record's sequence number.
    pub sequence: SequenceNumber,
    /// The user record's index inside its aggregate.
    pub sub_sequence: u64,
}

impl Position {
    /// The position `sequence`/`sub_sequence`.
    pub fn new(sequence: impl Into<SequenceNumber>, sub_sequence: u64) -> Self {
        Position {
            sequence: sequence.into(),
            sub_sequence,
        }
    }

    /// Where `record` is.
    pub fn of(record: &Record) -> Self {
        Position::new(record.sequence_number.as_str(), record.sub_sequence_number)
    }

    /// The position a checkpoint names, if it names one (not a sentinel).
    pub fn of_checkpoint(checkpoint: &Checkpoint) -> Option<Self> {
        match checkpoint {
            Checkpoint::Sequence { seq, sub } => Some(Position::new(seq.as_str(), *sub)),
            _ => None,
        }
    }

    /// Whether `checkpoint` covers this position: it names this position
    /// or a later one, comparing sequence numbers as integers and then
    /// sub-sequence numbers, like the Java KCL's extended sequence numbers.
    /// Sentinels (`TRIM_HORIZON`, `LATEST`, `SHARD_END`, ...) cover
    /// nothing here, and a sequence number that is not a decimal integer
    /// is only at itself: when in doubt, deliver (at-least-once).
    pub fn covered_by(&self, checkpoint: &Checkpoint) -> bool {
        let Some(at) = Position::of_checkpoint(checkpoint) else {
            return false;
        };
        let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !decimal(self.sequence.as_str()) || !decimal(at.sequence.as_str()) {
            return self.sequence.as_str() == at.sequence.as_str()
                && self.sub_sequence <= at.sub_sequence;
        }
        *self <= at
    }

    /// The checkpoint at this position.
    pub fn to_checkpoint(&self) -> Checkpoint {
        Checkpoint::at(self.sequence.as_str(), self.sub_sequence)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.sequence, self.sub_sequence)
    }
}

/// Whether `checkpoint` already covers `record`: see
/// [`Position::covered_by`], with one exception. A record this worker's
/// reader did not split (a plain one, or an aggregate passed through whole
/// as malformed to it) is not covered by a checkpoint past the first
/// sub-record of its own sequence number: whoever checkpointed split it
/// (another kcl version, the Java KCL), and the sub-records after the
/// checkpoint are only in this record. It is delivered again whole, and
/// is not done until processed.
pub fn covers(checkpoint: &Checkpoint, record: &Record) -> bool {
    if let Checkpoint::Sequence { seq, sub } = checkpoint
        && *sub > 0
        && !record.aggregated
        && *seq == record.sequence_number
    {
        return false;
    }
    Position::of(record).covered_by(checkpoint)
}

/// `seq` without leading zeros ("0" for zero), the form Kinesis gives;
/// text that is not a number is left for [`Checkpoint::parse`] to refuse.
pub(crate) fn canonical(seq: &str) -> &str {
    if !seq.bytes().all(|b| b.is_ascii_digit()) {
        return seq;
    }
    match seq.trim_start_matches('0') {
        "" if !seq.is_empty() => "0",
        digits => digits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_order_as_numbers_and_positions_by_sub_sequence_next() {
        let s = SequenceNumber::from;
        assert!(s("9") < s("10"));
        assert_eq!(s("0010"), s("10"));
        assert!(
            s("49590338271490256608559692538361571095921575989136588898")
                < s("49590338271490256608559692538361571095921575989136588899")
        );
        assert!(Position::new("10", 2) > Position::new("10", 1));
        assert!(Position::new("9", 7) < Position::new("10", 0));
        let hash = |v: &SequenceNumber| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            v.hash(&mut h);
            h.finish()
        };
        assert_eq!(hash(&s("007")), hash(&s("7")), "equal numbers hash alike");
        assert_eq!(
            Position::of_checkpoint(&Checkpoint::at("12", 3)),
            Some(Position::new("12", 3))
        );
        assert_eq!(Position::of_checkpoint(&Checkpoint::TrimHorizon), None);
        assert_eq!(
            Position::new("12", 3).to_checkpoint(),
            Checkpoint::at("12", 3)
        );
        let at = Checkpoint::at("12", 3);
        assert!(Position::new("12", 3).covered_by(&at));
        assert!(Position::new("9", 8).covered_by(&at));
        assert!(!Position::new("12", 4).covered_by(&at));
        assert!(!Position::new("1", 0).covered_by(&Checkpoint::TrimHorizon));
        let odd = Checkpoint::Sequence {
            seq: "x7".into(),
            sub: 1,
        };
        assert!(Position::new("x7", 0).covered_by(&odd));
        assert!(
            !Position::new("5", 0).covered_by(&odd),
            "no order with a non-number"
        );
    }
}
