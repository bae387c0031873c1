//! De-aggregation of aggregates written by an independent implementation:
//! `aws-kinesis-agg` (Python), via `fixtures/make_kpl_fixtures.py`.
// Test helpers outside #[test] fns are still test code: unwrap is fine here.
#![allow(clippy::unwrap_used)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use kcl_core::{HashKeyRange, Record};
use kcl_kinesis::kpl::{
    self, Deaggregator, RawRecord, ShardHashRange, UserRecord, effective_hash_key, record_in_range,
};
use serde_json::Value;

const FIXTURES: &str = include_str!("fixtures/kpl_aggregates.json");
const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

struct Expected {
    partition_key: String,
    explicit_hash_key: Option<String>,
    data: Vec<u8>,
    effective_hash_key: u128,
}

struct Case {
    name: String,
    raw: RawRecord,
    expected: Vec<Expected>,
}

fn text(v: &Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a string: {v}"))
        .to_owned()
}

fn opt_text(v: &Value, field: &str) -> Option<String> {
    match &v[field] {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => panic!("{field} is neither null nor a string: {other}"),
    }
}

fn cases() -> Vec<Case> {
    let doc: Value = serde_json::from_str(FIXTURES).unwrap();
    let cases: Vec<Case> = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: text(c, "name"),
            raw: RawRecord {
                data: Bytes::from(B64.decode(text(c, "data")).unwrap()),
                partition_key: text(c, "partition_key"),
                explicit_hash_key: opt_text(c, "explicit_hash_key"),
                sequence_number: SEQ.to_owned(),
                approximate_arrival: None,
            },
            expected: c["expected"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| Expected {
                    partition_key: text(e, "partition_key"),
                    explicit_hash_key: opt_text(e, "explicit_hash_key"),
                    data: B64.decode(text(e, "data")).unwrap(),
                    effective_hash_key: text(e, "effective_hash_key").parse().unwrap(),
                })
                .collect(),
        })
        .collect();
    assert_eq!(cases.len(), 11, "fixture file changed: update this test");
    cases
}

fn case(name: &str) -> Case {
    cases().into_iter().find(|c| c.name == name).unwrap()
}

#[test]
fn every_fixture_decodes_to_exactly_its_user_records() {
    let mut total = 0;
    for case in cases() {
        assert!(kpl::has_magic(&case.raw.data), "{}", case.name);
        let out = kpl::deaggregate(case.raw.clone());
        assert_eq!(out.malformed, None, "{}", case.name);
        assert_eq!(out.records.len(), case.expected.len(), "{}", case.name);
        for (i, (got, want)) in out.records.iter().zip(&case.expected).enumerate() {
            let ctx = format!("{} sub-record {i}", case.name);
            assert_eq!(got.partition_key, want.partition_key, "{ctx}");
            assert_eq!(got.explicit_hash_key, want.explicit_hash_key, "{ctx}");
            assert_eq!(got.data[..], want.data[..], "{ctx}");
            assert_eq!(got.sequence_number, SEQ, "{ctx}");
            assert_eq!(got.sub_sequence_number, i as u64, "{ctx}");
            assert!(got.aggregated, "{ctx}");
            assert_eq!(
                effective_hash_key(got),
                Ok(want.effective_hash_key),
                "{ctx}"
            );
        }
        total += out.records.len();
    }
    assert_eq!(total, 1 + 3 + 4 + 4 + 3 + 3 + 3 + 3 + 500 + 2 + 3);
}

#[test]
fn mixed_explicit_hash_keys_keep_absent_ones_absent() {
    // aws-kinesis-agg's own deaggregator gets this one wrong (it gives the
    // records without an explicit hash key the table's first entry); the
    // fixture records the inputs, so this pins the correct reading.
    let out = kpl::deaggregate(case("mixed_explicit_hash_keys").raw);
    let ehks: Vec<_> = out
        .records
        .iter()
        .map(|r| r.explicit_hash_key.as_deref())
        .collect();
    assert_eq!(ehks, vec![None, Some("12345"), None]);
}

#[test]
fn tags_are_parsed_and_dropped() {
    let out = kpl::deaggregate(case("tags").raw);
    assert_eq!(out.malformed, None);
    let data: Vec<&[u8]> = out.records.iter().map(|r| &r.data[..]).collect();
    assert_eq!(data, vec![&b"first"[..], b"second", b""]);
}

#[test]
fn fixture_data_are_zero_copy_slices() {
    let c = case("five_hundred_small");
    let parent = c.raw.data.as_ptr_range();
    for r in kpl::deaggregate(c.raw).records {
        let child = r.data.as_ptr_range();
        assert!(parent.start <= child.start && child.end <= parent.end);
    }
}

#[test]
fn our_encoder_round_trips_the_fixtures() {
    // Re-encode what the Python library encoded; decoding ours must give the
    // same records (byte equality with Python's encoding is not expected:
    // table order is first-use in both, but proto2 encoders may differ).
    for case in cases() {
        let users: Vec<UserRecord> = case
            .expected
            .iter()
            .map(|e| UserRecord {
                partition_key: e.partition_key.clone(),
                explicit_hash_key: e.explicit_hash_key.clone(),
                data: Bytes::from(e.data.clone()),
            })
            .collect();
        let ours = kpl::deaggregate(RawRecord {
            data: kpl::aggregate(&users),
            ..case.raw.clone()
        });
        let theirs = kpl::deaggregate(case.raw.clone());
        assert_eq!(ours.records, theirs.records, "{}", case.name);
        if case.name != "tags" {
            // Without tags both encoders write the same canonical bytes.
            assert_eq!(kpl::aggregate(&users), case.raw.data, "{}", case.name);
        }
    }
}

#[test]
fn range_check_agrees_with_python_hash_keys() {
    // Four shards splitting the key space evenly; every fixture sub-record
    // is in exactly one, and in the one its Python-computed hash key names.
    let quarter = u128::MAX / 4 + 1;
    let shards: Vec<HashKeyRange> = (0..4u128)
        .map(|i| HashKeyRange {
            starting: (i * quarter).to_string(),
            ending: if i == 3 {
                u128::MAX
            } else {
                (i + 1) * quarter - 1
            }
            .to_string(),
        })
        .collect();
    let mut per_shard = [0usize; 4];
    for case in cases() {
        let records: Vec<Record> = kpl::deaggregate(case.raw.clone()).records;
        for (r, want) in records.iter().zip(&case.expected) {
            let inside: Vec<usize> = (0..4)
                .filter(|&i| record_in_range(&shards[i], r).unwrap())
                .collect();
            assert_eq!(inside, vec![(want.effective_hash_key / quarter) as usize]);
            per_shard[inside[0]] += 1;
        }
        // The de-aggregator's own count agrees with the per-record check.
        for (i, shard) in shards.iter().enumerate() {
            let range = ShardHashRange::parse(shard).unwrap();
            let out = Deaggregator::for_shard(range).deaggregate(case.raw.clone());
            let outside = records
                .iter()
                .filter(|r| !record_in_range(&shards[i], r).unwrap())
                .count();
            assert_eq!(out.outside_shard, outside, "{} shard {i}", case.name);
            assert_eq!(out.records, records);
        }
    }
    // MD5 spreads the 60-odd distinct keys over all four quarters.
    assert!(per_shard.iter().all(|&n| n > 0), "{per_shard:?}");
}

#[test]
fn corrupting_a_fixture_passes_it_through() {
    for case in cases() {
        let mut bytes = case.raw.data.to_vec();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x10;
        let raw = RawRecord {
            data: Bytes::from(bytes),
            ..case.raw.clone()
        };
        let out = kpl::deaggregate(raw.clone());
        assert_eq!(
            out.malformed,
            Some(kpl::MalformedReason::DigestMismatch),
            "{}",
            case.name
        );
        assert_eq!(out.records.len(), 1);
        assert_eq!(out.records[0].data, raw.data);
        assert!(!out.records[0].aggregated);
    }
}
