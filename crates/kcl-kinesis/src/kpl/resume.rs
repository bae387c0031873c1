//! Skipping what a checkpoint already covers.
//!
//! A checkpoint inside an aggregate is (sequence number, sub-sequence
//! number). Kinesis can only resume at a whole record, so a consumer
//! restarting from (S, 2) asks for `AT_SEQUENCE_NUMBER` S, gets the whole
//! aggregate again, and must drop sub-records 0, 1 and 2 itself
//! (architecture invariant 6).

use kcl_core::{Checkpoint, Record};

/// Whether the checkpoint already covers `record`, i.e. the processor
/// checkpointed at it or past it: a record with the checkpoint's sequence
/// number is covered when its sub-sequence is at or below the
/// checkpoint's, and a record from before the checkpoint (a re-delivered
/// batch) whatever its sub-sequence. The rule of
/// [`kcl_core::checkpointer::covers`], which the checkpointer's
/// `is_checkpointed` follows too: a record this reader did not split is
/// not covered by a checkpoint inside it.
pub fn is_checkpointed(record: &Record, checkpoint: &Checkpoint) -> bool {
    kcl_core::checkpointer::covers(checkpoint, record)
}

/// Drops from `records` every record the checkpoint already covers (see
/// [`is_checkpointed`]), keeping the order of the rest; returns how many
/// were dropped.
///
/// Called on the first batch after resuming `AT_SEQUENCE_NUMBER` from a
/// checkpoint: with a checkpoint at (S, 2) and an aggregate S of five
/// sub-records, only sub-records 3 and 4 remain.
pub fn skip_checkpointed(records: &mut Vec<Record>, checkpoint: &Checkpoint) -> usize {
    let before = records.len();
    records.retain(|r| !is_checkpointed(r, checkpoint));
    before - records.len()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::{RawRecord, aggregate, deaggregate};
    use super::*;
    use crate::test_util::readers::sub_records;

    const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

    /// A fetched batch: a plain record before, the five-record aggregate at
    /// `SEQ`, and a plain record after.
    fn batch() -> Vec<Record> {
        let fetched = |seq: &str, data: Bytes| RawRecord {
            data,
            partition_key: "pk".to_owned(),
            explicit_hash_key: None,
            sequence_number: seq.to_owned(),
            approximate_arrival: None,
        };
        let subs = sub_records(5);
        let mut out = Vec::new();
        for raw in [
            fetched(
                "49590338271490256608559692538361571095921575989136588897",
                Bytes::from_static(b"before"),
            ),
            fetched(SEQ, aggregate(&subs)),
            fetched(
                "49590338271490256608559692538361571095921575989136588899",
                Bytes::from_static(b"after"),
            ),
        ] {
            let d = deaggregate(raw);
            assert_eq!(d.malformed, None);
            out.extend(d.records);
        }
        assert_eq!(out.len(), 7);
        out
    }

    /// What is left of [`batch`] after a resume from a checkpoint at
    /// `seq` and `sub`, and how many records it skipped.
    fn resumed_at(seq: &str, sub: u64) -> (Vec<Record>, usize) {
        let mut records = batch();
        let skipped = skip_checkpointed(&mut records, &Checkpoint::at(seq, sub));
        (records, skipped)
    }

    fn positions(records: &[Record]) -> Vec<(&str, u64)> {
        records
            .iter()
            .map(|r| {
                (
                    &r.sequence_number[r.sequence_number.len() - 3..],
                    r.sub_sequence_number,
                )
            })
            .collect()
    }

    #[test]
    fn resume_inside_an_aggregate_skips_the_done_sub_records() {
        let (records, skipped) = resumed_at(SEQ, 2);
        assert_eq!(skipped, 4, "the record before, and subs 0, 1, 2");
        assert_eq!(
            positions(&records),
            vec![("898", 3), ("898", 4), ("899", 0)]
        );
        assert_eq!(&records[0].data[..], b"sub 3");
        assert_eq!(&records[1].data[..], b"sub 4");
    }

    #[test]
    fn checkpoint_at_the_last_sub_record_skips_the_whole_aggregate() {
        let (records, _) = resumed_at(SEQ, 4);
        assert_eq!(positions(&records), vec![("899", 0)]);
    }

    #[test]
    fn checkpoint_at_an_earlier_sequence_skips_nothing_of_later_records() {
        let earlier = "49590338271490256608559692538361571095921575989136588000";
        assert_eq!(resumed_at(earlier, 9), (batch(), 0));
    }

    #[test]
    fn checkpoint_at_a_plain_record_skips_it_and_nothing_after() {
        let before = "49590338271490256608559692538361571095921575989136588897";
        let (records, skipped) = resumed_at(before, 0);
        assert_eq!(skipped, 1);
        assert_eq!(records.len(), 6);
        assert_eq!(records[0].sub_sequence_number, 0);
        assert_eq!(records[0].sequence_number, SEQ);
    }

    /// An aggregate passed through whole (malformed to this reader) at a
    /// checkpoint inside it, written by a worker that split it, is
    /// delivered again: dropped, its sub-records after the checkpoint
    /// were lost. At the first sub-record's checkpoint (the same as a
    /// plain record's) it is taken as done.
    #[test]
    fn a_record_not_split_here_is_not_covered_past_its_first_sub_record() {
        let whole = |seq: &str| Record {
            data: Bytes::from_static(b"whole"),
            partition_key: "pk".to_owned(),
            explicit_hash_key: None,
            sequence_number: seq.to_owned(),
            sub_sequence_number: 0,
            approximate_arrival: None,
            aggregated: false,
        };
        assert!(!is_checkpointed(&whole(SEQ), &Checkpoint::at(SEQ, 3)));
        assert!(is_checkpointed(&whole(SEQ), &Checkpoint::at(SEQ, 0)));
        let before = "49590338271490256608559692538361571095921575989136588897";
        assert!(is_checkpointed(&whole(before), &Checkpoint::at(SEQ, 3)));
    }

    #[test]
    fn sentinels_skip_nothing() {
        for cp in [
            Checkpoint::TrimHorizon,
            Checkpoint::Latest,
            Checkpoint::AtTimestamp,
            Checkpoint::ShardEnd,
        ] {
            let mut records = batch();
            assert_eq!(skip_checkpointed(&mut records, &cp), 0, "{cp}");
        }
    }

    #[test]
    fn unorderable_sequence_numbers_only_match_exactly() {
        let mut records = batch();
        for r in &mut records {
            r.sequence_number = format!("x{}", r.sequence_number);
        }
        let odd = format!("x{SEQ}");
        assert_eq!(skip_checkpointed(&mut records, &Checkpoint::at(odd, 1)), 2);
        assert_eq!(records.len(), 5);
        assert!(
            records
                .iter()
                .all(|r| !(r.sequence_number.ends_with("898") && r.sub_sequence_number <= 1))
        );
    }
}
