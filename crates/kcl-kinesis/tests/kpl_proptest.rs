//! Property tests: de-aggregation never panics, always yields at least one
//! record, passes malformed input through byte for byte, and inverts
//! `aggregate`.
// Test helpers outside #[test] fns are still test code: unwrap is fine here.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use kcl_core::{Checkpoint, Record};
use kcl_kinesis::kpl::{
    self, DIGEST_LEN, Deaggregated, Deaggregator, MAGIC, RawRecord, ShardHashRange, UserRecord,
    effective_hash_key, skip_checkpointed,
};
use kcl_kinesis::passed_through;
use proptest::prelude::*;

const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

fn raw(data: Bytes) -> RawRecord {
    RawRecord {
        data,
        partition_key: "outer".to_owned(),
        explicit_hash_key: None,
        sequence_number: SEQ.to_owned(),
        approximate_arrival: None,
    }
}

fn md5(data: &[u8]) -> [u8; 16] {
    use md5::Digest as _;
    md5::Md5::digest(data).into()
}

/// Magic + `body` + its correct MD5: input that reaches the protobuf decoder.
fn framed(body: &[u8]) -> Bytes {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(body);
    v.extend_from_slice(&md5(body));
    Bytes::from(v)
}

/// What must hold for any input.
fn check(input: &RawRecord, out: &Deaggregated) -> Result<(), TestCaseError> {
    prop_assert!(!out.records.is_empty());
    let split = out.malformed.is_none() && out.records[0].aggregated;
    if !kpl::has_magic(&input.data) {
        prop_assert!(out.malformed.is_none());
        prop_assert!(!split);
    }
    if split {
        // A real split: every record is a sub-record of this input.
        let parent = input.data.as_ptr_range();
        for (i, r) in out.records.iter().enumerate() {
            prop_assert!(r.aggregated);
            prop_assert_eq!(r.sub_sequence_number, i as u64);
            prop_assert_eq!(&r.sequence_number, &input.sequence_number);
            let child = r.data.as_ptr_range();
            prop_assert!(parent.start <= child.start && child.end <= parent.end);
            // Deaggregated records always map to a shard.
            prop_assert!(effective_hash_key(r).is_ok());
        }
        let payload: usize = out.records.iter().map(|r| r.data.len()).sum();
        prop_assert!(payload <= input.data.len() - MAGIC.len() - DIGEST_LEN);
    } else {
        // Pass-through: exactly the input, untouched.
        prop_assert_eq!(&out.records, &vec![passed_through(input)]);
    }
    Ok(())
}

fn check_bytes(data: Vec<u8>) -> Result<Deaggregated, TestCaseError> {
    let input = raw(Bytes::from(data));
    let out = kpl::deaggregate(input.clone());
    check(&input, &out)?;
    Ok(out)
}

fn partition_key() -> impl Strategy<Value = String> {
    // A small pool so keys repeat (shared table entries), plus arbitrary text.
    prop_oneof![
        3 => prop::sample::select(vec!["a", "b", "user-42", "", "ключ", "🔑"]).prop_map(str::to_owned),
        1 => ".{0,20}",
    ]
}

fn explicit_hash_key() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        2 => Just(None),
        1 => any::<u128>().prop_map(|v| Some(v.to_string())),
        1 => prop::sample::select(vec![0u128, 1, u128::MAX]).prop_map(|v| Some(v.to_string())),
    ]
}

fn user_record() -> impl Strategy<Value = UserRecord> {
    (
        partition_key(),
        explicit_hash_key(),
        prop::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(partition_key, explicit_hash_key, data)| UserRecord {
            partition_key,
            explicit_hash_key,
            data: Bytes::from(data),
        })
}

fn user_records() -> impl Strategy<Value = Vec<UserRecord>> {
    prop::collection::vec(user_record(), 1..60)
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
        let out = check_bytes(data)?;
        // Random bytes essentially never carry the magic.
        prop_assert_eq!(out.records.len(), 1);
    }

    #[test]
    fn magic_then_arbitrary_bytes_pass_through(tail in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut data = MAGIC.to_vec();
        data.extend(tail);
        let out = check_bytes(data)?;
        // Without a matching digest nothing decodes.
        prop_assert!(out.malformed.is_some());
    }

    #[test]
    fn arbitrary_body_with_valid_digest_never_panics(body in prop::collection::vec(any::<u8>(), 0..512)) {
        check_bytes(framed(&body).to_vec())?;
    }

    #[test]
    fn protobuf_shaped_garbage_never_panics(
        fields in prop::collection::vec(
            (1u8..6, 0u8..6, prop::collection::vec(any::<u8>(), 0..24)), 0..16)
    ) {
        // Tag bytes with plausible field numbers and wire types, followed by
        // arbitrary payloads: gets deeper into the decoder than pure noise.
        let mut body = Vec::new();
        for (field, wire, payload) in fields {
            body.push((field << 3) | wire);
            if wire == 2 {
                body.push(payload.len() as u8);
            }
            body.extend(payload);
        }
        check_bytes(framed(&body).to_vec())?;
    }

    #[test]
    fn bit_flips_in_valid_aggregates_never_panic(
        records in user_records(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4),
    ) {
        let good = kpl::aggregate(&records);
        let mut bad = good.to_vec();
        for (at, bit) in &flips {
            let i = at.index(bad.len());
            bad[i] ^= 1 << bit;
        }
        let out = check_bytes(bad.clone())?;
        if bad != good[..] {
            // Any change to body or digest breaks the MD5 (or the magic).
            prop_assert_eq!(out.records.len(), 1);
        }
    }

    #[test]
    fn bit_flips_in_the_body_with_a_fresh_digest_never_panic(
        records in user_records(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4),
    ) {
        // Re-digested, so the flipped protobuf reaches the decoder and the
        // index/field checks.
        let good = kpl::aggregate(&records);
        let mut body = good[MAGIC.len()..good.len() - DIGEST_LEN].to_vec();
        for (at, bit) in &flips {
            let i = at.index(body.len());
            body[i] ^= 1 << bit;
        }
        check_bytes(framed(&body).to_vec())?;
    }

    #[test]
    fn aggregate_then_deaggregate_is_identity(records in user_records()) {
        let input = raw(kpl::aggregate(&records));
        let out = kpl::deaggregate(input.clone());
        check(&input, &out)?;
        prop_assert_eq!(out.malformed, None);
        let expected: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, u)| Record {
                data: u.data.clone(),
                partition_key: u.partition_key.clone(),
                explicit_hash_key: u.explicit_hash_key.clone(),
                sequence_number: SEQ.to_owned(),
                sub_sequence_number: i as u64,
                approximate_arrival: None,
                aggregated: true,
            })
            .collect();
        prop_assert_eq!(out.records, expected);
    }

    #[test]
    fn outside_shard_count_matches_per_record_check(
        records in user_records(),
        a in any::<u128>(),
        b in any::<u128>(),
    ) {
        let range = ShardHashRange::new(a.min(b), a.max(b)).unwrap();
        let input = raw(kpl::aggregate(&records));
        let out = Deaggregator::for_shard(range).deaggregate(input.clone());
        let outside = out
            .records
            .iter()
            .filter(|r| !range.contains_record(r).unwrap())
            .count();
        prop_assert_eq!(out.outside_shard, outside);
        // Delivered all the same.
        prop_assert_eq!(out.records, kpl::deaggregate(input).records);
    }

    #[test]
    fn resume_skips_exactly_the_checkpointed_prefix(records in user_records(), at in any::<prop::sample::Index>()) {
        let mut out = kpl::deaggregate(raw(kpl::aggregate(&records))).records;
        let n = out.len();
        let sub = at.index(n) as u64;
        let skipped = skip_checkpointed(&mut out, &Checkpoint::at(SEQ, sub));
        prop_assert_eq!(skipped as u64, sub + 1);
        let remaining: Vec<u64> = out.iter().map(|r| r.sub_sequence_number).collect();
        prop_assert_eq!(remaining, ((sub + 1)..n as u64).collect::<Vec<_>>());
    }
}
