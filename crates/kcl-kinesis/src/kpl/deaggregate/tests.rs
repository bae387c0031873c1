use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use kcl_core::test_util::metrics::Recorded;

use super::super::{UserRecord, aggregate};
use super::*;
use crate::test_util::passed_through;

fn raw(data: impl Into<Bytes>) -> RawRecord {
    RawRecord {
        data: data.into(),
        partition_key: "outer-pk".to_owned(),
        explicit_hash_key: None,
        sequence_number: "49590338271490256608559692538361571095921575989136588898".to_owned(),
        approximate_arrival: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
    }
}

fn user(pk: &str, ehk: Option<&str>, data: &'static [u8]) -> UserRecord {
    UserRecord {
        partition_key: pk.to_owned(),
        explicit_hash_key: ehk.map(str::to_owned),
        data: Bytes::from_static(data),
    }
}

/// Magic + body + correct MD5: reaches the protobuf decoder.
fn framed(body: &[u8]) -> Bytes {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(body);
    v.extend_from_slice(&md5(body));
    Bytes::from(v)
}

fn proto_record(pk: Option<u64>, ehk: Option<u64>, data: Option<&'static [u8]>) -> proto::Record {
    proto::Record {
        partition_key_index: pk,
        explicit_hash_key_index: ehk,
        data: data.map(Bytes::from_static),
        tags: Vec::new(),
    }
}

fn framed_message(msg: &proto::AggregatedRecord) -> Bytes {
    framed(&msg.encode_to_vec())
}

fn table(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

/// Asserts the input came back as exactly one untouched plain record.
fn assert_passed_through(input: &RawRecord, out: &Deaggregated) {
    assert_eq!(out.records, vec![passed_through(input)]);
    assert_eq!(out.outside_shard, 0);
}

fn malformed(data: Bytes) -> MalformedReason {
    let input = raw(data);
    let out = deaggregate(input.clone());
    assert_passed_through(&input, &out);
    match out.malformed {
        Some(reason) => reason,
        None => panic!("expected a malformed reason"),
    }
}

#[test]
fn plain_record_passes_through_untouched() {
    let mut input = raw(&b"just some json {\"a\":1}"[..]);
    input.explicit_hash_key = Some("12".to_owned());
    let out = deaggregate(input.clone());
    assert_passed_through(&input, &out);
    assert_eq!(out.malformed, None);
    // Moved, not copied.
    assert_eq!(out.records[0].data.as_ptr(), input.data.as_ptr());
}

#[test]
fn empty_and_short_data_are_plain_records() {
    for data in [
        &b""[..],
        &[0xF3],
        &[0xF3, 0x89, 0x9A],
        &[0xF3, 0x89, 0x9A, 0xC3],
        b"abcd",
    ] {
        let input = raw(Bytes::copy_from_slice(data));
        let out = deaggregate(input.clone());
        assert_passed_through(&input, &out);
        assert_eq!(
            out.malformed, None,
            "{data:?} does not claim to be an aggregate"
        );
    }
}

#[test]
fn magic_without_room_for_a_digest_is_truncated() {
    assert_eq!(
        malformed(Bytes::from_static(&MAGIC)),
        MalformedReason::Truncated { len: 4 }
    );
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&[0; 15]);
    assert_eq!(
        malformed(Bytes::from(v)),
        MalformedReason::Truncated { len: 19 }
    );
}

#[test]
fn magic_and_digest_of_nothing_is_an_empty_aggregate() {
    // 20 bytes: an empty body (a valid, empty AggregatedRecord) and its MD5.
    assert_eq!(malformed(framed(b"")), MalformedReason::Empty);
    // Tables but no records.
    let msg = proto::AggregatedRecord {
        partition_key_table: table(&["a"]),
        explicit_hash_key_table: Vec::new(),
        records: Vec::new(),
    };
    assert_eq!(malformed(framed_message(&msg)), MalformedReason::Empty);
}

#[test]
fn wrong_digest_passes_through() {
    let good = aggregate(&[user("a", None, b"x"), user("b", None, b"y")]);
    let mut bad = good.to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0x01;
    assert_eq!(malformed(Bytes::from(bad)), MalformedReason::DigestMismatch);
    // A flipped body bit is caught by the digest too.
    let mut bad = good.to_vec();
    bad[6] ^= 0x40;
    assert_eq!(malformed(Bytes::from(bad)), MalformedReason::DigestMismatch);
    // So is a cut-off tail.
    assert_eq!(
        malformed(good.slice(..good.len() - 3)),
        MalformedReason::DigestMismatch
    );
}

#[test]
fn truncated_protobuf_with_valid_digest_passes_through() {
    let good = aggregate(&[user("a", None, b"hello"), user("b", None, b"world")]);
    let body = &good[MAGIC.len()..good.len() - DIGEST_LEN];
    // Every strict prefix of this body cuts a field in half, except at a
    // top-level field boundary (which decodes to fewer records, or none).
    let mut decode_errors = 0;
    for cut in 1..body.len() {
        let input = raw(framed(&body[..cut]));
        let out = deaggregate(input.clone());
        match out.malformed {
            Some(MalformedReason::Decode(_)) => {
                decode_errors += 1;
                assert_passed_through(&input, &out);
            }
            Some(MalformedReason::Empty) => assert_passed_through(&input, &out),
            None => assert!(out.records.iter().all(|r| r.aggregated)),
            Some(other) => panic!("cut at {cut}: unexpected {other:?}"),
        }
    }
    assert!(
        decode_errors > body.len() / 2,
        "{decode_errors} of {}",
        body.len()
    );
    // A length prefix pointing past the end.
    assert!(matches!(
        malformed(framed(&[0x1A, 0x7F, 0x08])),
        MalformedReason::Decode(_)
    ));
    // Garbage wire type.
    assert!(matches!(
        malformed(framed(&[0x0F])),
        MalformedReason::Decode(_)
    ));
    // Invalid UTF-8 in a partition key (a proto `string`).
    assert!(matches!(
        malformed(framed(&[
            0x0A, 0x02, 0xC3, 0x28, 0x1A, 0x04, 0x08, 0x00, 0x1A, 0x00
        ])),
        MalformedReason::Decode(_)
    ));
}

#[test]
fn partition_key_index_out_of_range_passes_through() {
    let msg = proto::AggregatedRecord {
        partition_key_table: table(&["a", "b"]),
        explicit_hash_key_table: Vec::new(),
        records: vec![
            proto_record(Some(1), None, Some(b"ok")),
            proto_record(Some(2), None, Some(b"bad")),
        ],
    };
    assert_eq!(
        malformed(framed_message(&msg)),
        MalformedReason::PartitionKeyIndexOutOfRange {
            sub: 1,
            index: 2,
            table_len: 2
        }
    );
    // An index no usize can hold.
    let msg = proto::AggregatedRecord {
        partition_key_table: table(&["a"]),
        explicit_hash_key_table: Vec::new(),
        records: vec![proto_record(Some(u64::MAX), None, Some(b"x"))],
    };
    assert!(matches!(
        malformed(framed_message(&msg)),
        MalformedReason::PartitionKeyIndexOutOfRange {
            index: u64::MAX,
            ..
        }
    ));
}

#[test]
fn explicit_hash_key_index_out_of_range_passes_through() {
    let msg = proto::AggregatedRecord {
        partition_key_table: table(&["a"]),
        explicit_hash_key_table: Vec::new(),
        records: vec![proto_record(Some(0), Some(0), Some(b"x"))],
    };
    assert_eq!(
        malformed(framed_message(&msg)),
        MalformedReason::ExplicitHashKeyIndexOutOfRange {
            sub: 0,
            index: 0,
            table_len: 0
        }
    );
}

#[test]
fn invalid_explicit_hash_key_passes_through_only_when_used() {
    let mut msg = proto::AggregatedRecord {
        partition_key_table: table(&["a"]),
        explicit_hash_key_table: table(&["42", "not-a-number"]),
        records: vec![
            proto_record(Some(0), Some(0), Some(b"x")),
            proto_record(Some(0), None, Some(b"y")),
        ],
    };
    // The bad entry is unused: fine.
    let out = deaggregate(raw(framed_message(&msg)));
    assert_eq!(out.malformed, None);
    assert_eq!(out.records[0].explicit_hash_key.as_deref(), Some("42"));
    assert_eq!(out.records[1].explicit_hash_key, None);

    msg.records.push(proto_record(Some(0), Some(1), Some(b"z")));
    assert_eq!(
        malformed(framed_message(&msg)),
        MalformedReason::InvalidExplicitHashKey {
            sub: 2,
            source: super::super::HashKeyError::Invalid("not-a-number".to_owned())
        }
    );
}

/// An aggregate naming a partition key longer than Kinesis allows (256
/// characters) is delivered whole, not split: every sub-record owns a copy
/// of its key, and one long key named by thousands of sub-records made a
/// small aggregate take gigabytes. An unused long entry is harmless; 256
/// characters of several bytes each are a valid key.
#[test]
fn an_overlong_partition_key_passes_through_only_when_used() {
    let long = "k".repeat(257);
    let wide = "é".repeat(256);
    let mut msg = proto::AggregatedRecord {
        partition_key_table: table(&["a", &long, &wide]),
        explicit_hash_key_table: Vec::new(),
        records: vec![
            proto_record(Some(0), None, Some(b"x")),
            proto_record(Some(2), None, Some(b"y")),
        ],
    };
    let out = deaggregate(raw(framed_message(&msg)));
    assert_eq!(out.malformed, None);
    assert_eq!(out.records[1].partition_key, wide);

    msg.records = (0..10_000)
        .map(|_| proto_record(Some(1), None, Some(b"")))
        .collect();
    let input = raw(framed_message(&msg));
    let out = deaggregate(input.clone());
    assert_passed_through(&input, &out);
    assert_eq!(
        out.malformed,
        Some(MalformedReason::PartitionKeyTooLong { sub: 0, chars: 257 })
    );
}

#[test]
fn missing_required_fields_pass_through() {
    let base = proto::AggregatedRecord {
        partition_key_table: table(&["a"]),
        explicit_hash_key_table: Vec::new(),
        records: vec![proto_record(Some(0), None, Some(b"fine"))],
    };
    // Each case strips one required field: (how, sub-record, field).
    type Strip = fn(&mut proto::AggregatedRecord);
    let cases: [(Strip, u64, &str); 3] = [
        (
            |m| m.records.push(proto_record(None, None, Some(b"x"))),
            1,
            "Record.partition_key_index",
        ),
        (
            |m| m.records.push(proto_record(Some(0), None, None)),
            1,
            "Record.data",
        ),
        (
            |m| {
                m.records[0].tags.push(proto::Tag {
                    key: None,
                    value: Some("v".to_owned()),
                })
            },
            0,
            "Tag.key",
        ),
    ];
    for (strip, sub, field) in cases {
        let mut msg = base.clone();
        strip(&mut msg);
        assert_eq!(
            malformed(framed_message(&msg)),
            MalformedReason::MissingField { sub, field },
            "{field}"
        );
    }
    // Present but empty is fine: proto2 presence, not emptiness.
    let mut empty_data = base;
    empty_data
        .records
        .push(proto_record(Some(0), None, Some(b"")));
    let out = deaggregate(raw(framed_message(&empty_data)));
    assert_eq!(out.malformed, None);
    assert_eq!(out.records[1].data, Bytes::new());
}

#[test]
fn sub_records_carry_the_parents_metadata() {
    let input = raw(aggregate(&[
        user("a", None, b"zero"),
        user("b", Some("99"), b"one"),
        user("a", None, b"two"),
    ]));
    let out = deaggregate(input.clone());
    assert_eq!(out.malformed, None);
    let got: Vec<_> = out
        .records
        .iter()
        .map(|r| {
            (
                r.partition_key.as_str(),
                r.explicit_hash_key.as_deref(),
                &r.data[..],
                r.sub_sequence_number,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("a", None, &b"zero"[..], 0),
            ("b", Some("99"), &b"one"[..], 1),
            ("a", None, &b"two"[..], 2),
        ]
    );
    for r in &out.records {
        assert_eq!(r.sequence_number, input.sequence_number);
        assert_eq!(r.approximate_arrival, input.approximate_arrival);
        assert!(r.aggregated);
    }
}

#[test]
fn sub_record_data_are_slices_of_the_fetched_buffer() {
    let input = raw(aggregate(&[
        user("a", None, b"first payload"),
        user("b", None, b"second"),
    ]));
    let parent = input.data.as_ptr_range();
    let out = deaggregate(input.clone());
    for r in &out.records {
        let child = r.data.as_ptr_range();
        assert!(
            parent.start <= child.start && child.end <= parent.end,
            "sub-record data was copied"
        );
    }
}

#[test]
fn unknown_fields_are_skipped() {
    // A future KPL could add fields; proto2 readers skip them.
    let mut body = aggregate(&[user("a", None, b"x")])[MAGIC.len()..].to_vec();
    body.truncate(body.len() - DIGEST_LEN);
    body.extend_from_slice(&[0x78, 0x05]); // field 15, varint 5
    body.extend_from_slice(&[0x82, 0x01, 0x01, 0xFF]); // field 16, 1 byte
    let out = deaggregate(raw(framed(&body)));
    assert_eq!(out.malformed, None);
    assert_eq!(out.records.len(), 1);
    assert_eq!(&out.records[0].data[..], b"x");
}

#[test]
fn a_failure_late_in_the_aggregate_delivers_nothing_split() {
    let msg = proto::AggregatedRecord {
        partition_key_table: table(&["a"]),
        explicit_hash_key_table: Vec::new(),
        records: vec![
            proto_record(Some(0), None, Some(b"0")),
            proto_record(Some(0), None, Some(b"1")),
            proto_record(Some(7), None, Some(b"2")),
        ],
    };
    let plain_before = raw(&b"plain"[..]);
    let agg = raw(framed_message(&msg));
    let batch = Deaggregator::new().deaggregate_batch([plain_before.clone(), agg.clone()]);
    assert_eq!(
        batch.len(),
        2,
        "the plain record and the whole aggregate, nothing else"
    );
    assert_eq!(batch[0].data, plain_before.data);
    assert_eq!(batch[1].data, agg.data);
    assert!(!batch[1].aggregated);
}

#[test]
fn batch_is_the_concatenation_of_single_calls() {
    let inputs = vec![
        raw(&b"plain"[..]),
        raw(aggregate(&[user("a", None, b"1"), user("b", None, b"2")])),
        raw(Bytes::from_static(&MAGIC)),
        raw(aggregate(&[user("c", Some("5"), b"3")])),
    ];
    let d = Deaggregator::for_shard(ShardHashRange::FULL);
    let expected: Vec<Record> = inputs
        .iter()
        .flat_map(|r| d.deaggregate(r.clone()).records)
        .collect();
    assert_eq!(expected.len(), 5);
    assert_eq!(d.deaggregate_batch(inputs), expected);
}

/// A de-aggregator for a shard that owns the lower half of the hash keys.
fn lower_half() -> Deaggregator {
    Deaggregator::for_shard(ShardHashRange::new(0, u128::MAX / 2).unwrap())
}

/// An aggregate of four sub-records, two in the lower half of the hash
/// keys and two in the upper, by partition key and by explicit hash key.
fn across_the_halves() -> RawRecord {
    // md5("a") = 0x0cc1..., md5("") = 0xd41d...: lower and upper half.
    raw(aggregate(&[
        user("a", None, b"in"),
        user("", None, b"out"),
        user("", Some("1"), b"in by explicit hash key"),
        user(
            "a",
            Some("340282366920938463463374607431768211455"),
            b"out by explicit hash key",
        ),
    ]))
}

#[test]
fn sub_records_outside_the_shard_are_counted_and_delivered() {
    let input = across_the_halves();
    let out = lower_half().deaggregate(input.clone());
    assert_eq!(out.malformed, None);
    assert_eq!(out.outside_shard, 2);
    assert_eq!(out.records.len(), 4);
    assert_eq!(out.records, deaggregate(input.clone()).records);

    let all = Deaggregator::for_shard(ShardHashRange::FULL).deaggregate(input.clone());
    assert_eq!(all.outside_shard, 0);
    // Without a range, nothing is checked.
    assert_eq!(deaggregate(input).outside_shard, 0);
}

#[test]
fn plain_records_are_not_range_checked() {
    // Kinesis routed a plain record itself: it is in its shard by
    // definition, whatever its (possibly unknown) keys hash to.
    let nowhere = ShardHashRange::new(0, 0).unwrap();
    let out = Deaggregator::for_shard(nowhere).deaggregate(raw(&b"plain"[..]));
    assert_eq!(out.outside_shard, 0);
}

#[test]
fn reasons_have_distinct_labels_and_readable_messages() {
    let reasons = [
        MalformedReason::Truncated { len: 4 },
        MalformedReason::DigestMismatch,
        malformed(framed(&[0x0F])),
        MalformedReason::MissingField {
            sub: 0,
            field: "Record.data",
        },
        MalformedReason::PartitionKeyIndexOutOfRange {
            sub: 0,
            index: 1,
            table_len: 1,
        },
        MalformedReason::ExplicitHashKeyIndexOutOfRange {
            sub: 0,
            index: 1,
            table_len: 1,
        },
        MalformedReason::PartitionKeyTooLong { sub: 0, chars: 300 },
        MalformedReason::InvalidExplicitHashKey {
            sub: 0,
            source: super::super::HashKeyError::Invalid("x".to_owned()),
        },
        MalformedReason::Empty,
    ];
    let labels: std::collections::BTreeSet<_> = reasons.iter().map(|r| r.label()).collect();
    assert_eq!(labels.len(), reasons.len());
    // Display does not repeat the source; the chain shows both.
    let decode = &reasons[2];
    let chain = ErrorChain(decode).to_string();
    assert!(chain.starts_with(&format!("{decode}: ")), "{chain}");
    assert!(chain.len() > decode.to_string().len() + 2);
}

// --- the malformed report reaches logs and metrics -------------------

/// Runs `f` with a local metrics recorder and captures its log lines;
/// returns the counters and the log text.
fn observed(f: impl FnOnce()) -> (BTreeMap<String, u64>, String) {
    let counters = Recorded::new();
    let ((), logs) =
        crate::test_util::logs::captured(|| metrics::with_local_recorder(&counters, f));
    (counters.counters(), logs)
}

#[test]
fn malformed_aggregates_are_logged_and_counted() {
    let mut corrupt = aggregate(&[user("a", None, b"x")]).to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xFF;
    let (counts, logs) = observed(|| {
        deaggregate(raw(Bytes::from(corrupt.clone())));
        deaggregate(raw(Bytes::from(corrupt)));
        deaggregate(raw(Bytes::from_static(&MAGIC)));
        deaggregate(raw(&b"plain"[..]));
        deaggregate(raw(aggregate(&[user("a", None, b"fine")])));
    });
    assert_eq!(
        counts,
        BTreeMap::from([
            (
                "kcl_kpl_malformed_aggregates_total{reason=digest_mismatch}".to_owned(),
                2
            ),
            (
                "kcl_kpl_malformed_aggregates_total{reason=truncated}".to_owned(),
                1
            ),
        ])
    );
    assert_eq!(logs.lines().count(), 3, "{logs}");
    assert!(logs.contains("WARN"), "{logs}");
    assert!(
        logs.contains("sequence_number=49590338271490256608559692538361571095921575989136588898"),
        "{logs}"
    );
    assert!(logs.contains("reason=\"digest_mismatch\""), "{logs}");
}

#[test]
fn outside_shard_sub_records_are_logged_once_and_counted_each() {
    let (counts, logs) = observed(|| {
        lower_half().deaggregate(across_the_halves());
    });
    assert_eq!(
        counts,
        BTreeMap::from([("kcl_kpl_records_outside_shard_total{}".to_owned(), 2)])
    );
    assert_eq!(logs.lines().count(), 1, "{logs}");
    assert!(logs.contains("outside=2 total=4"), "{logs}");
}
