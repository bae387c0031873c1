use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine;
use proptest::prelude::*;

use super::*;

/// Lease tables the Java KCL wrote, as `aws dynamodb scan` shows them.
const SINGLE_STREAM: &str = include_str!("../../tests/fixtures/java_kcl_single_stream.json");
const MULTI_STREAM: &str = include_str!("../../tests/fixtures/java_kcl_multi_stream.json");

/// Reads DynamoDB JSON (the `aws dynamodb scan` format) into items.
fn fixture(json: &str) -> Vec<HashMap<String, AttributeValue>> {
    let items: Vec<HashMap<String, serde_json::Value>> = serde_json::from_str(json).unwrap();
    items
        .into_iter()
        .map(|item| item.into_iter().map(|(k, v)| (k, attribute(&v))).collect())
        .collect()
}

fn attribute(v: &serde_json::Value) -> AttributeValue {
    let (ty, val) = v.as_object().unwrap().iter().next().unwrap();
    match ty.as_str() {
        "S" => AttributeValue::S(val.as_str().unwrap().into()),
        "N" => AttributeValue::N(val.as_str().unwrap().into()),
        "SS" => AttributeValue::Ss(
            val.as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().into())
                .collect(),
        ),
        "B" => AttributeValue::B(Blob::new(
            base64::engine::general_purpose::STANDARD
                .decode(val.as_str().unwrap())
                .unwrap(),
        )),
        other => panic!("fixture type {other}"),
    }
}

fn lease(item: &HashMap<String, AttributeValue>) -> Lease {
    match from_item(item).unwrap() {
        ReadItem::Lease(l) => *l,
        ReadItem::NotALease => panic!("not a lease"),
    }
}

#[test]
fn reads_java_kcl_single_stream_items() {
    let items = fixture(SINGLE_STREAM);

    let parent = lease(&items[0]);
    assert_eq!(parent.key, "shardId-000000000000");
    assert_eq!(parent.shard_id, "shardId-000000000000");
    assert_eq!(parent.stream, None);
    assert_eq!(
        parent.owner.as_deref(),
        Some("ip-10-0-1-17.ec2.internal:6f0b1a1e-3c1f-4e32-9d57-2a1f4d2f9b10")
    );
    assert_eq!(parent.counter, 1523);
    assert_eq!(parent.checkpoint, Checkpoint::ShardEnd);
    assert_eq!(
        parent.child_shard_ids,
        [
            "shardId-000000000002".to_owned(),
            "shardId-000000000003".to_owned()
        ]
        .into()
    );
    assert_eq!(
        parent.hash_key_range,
        Some(HashKeyRange {
            starting: "0".into(),
            ending: "340282366920938463463374607431768211455".into()
        })
    );

    let child = lease(&items[1]);
    assert_eq!(child.counter, 88);
    assert_eq!(
        child.checkpoint,
        Checkpoint::at(
            "49651538401220946287154431546713870925640718925419724802",
            7
        )
    );
    assert_eq!(child.owner_switches_since_checkpoint, 2);
    assert_eq!(
        child.parent_shard_ids,
        ["shardId-000000000000".to_owned()].into()
    );

    let unowned = lease(&items[2]);
    assert_eq!(unowned.owner, None);
    assert_eq!(unowned.checkpoint, Checkpoint::TrimHorizon);

    let handoff = lease(&items[3]);
    assert_eq!(handoff.owner.as_deref(), Some("worker-b"));
    assert_eq!(handoff.checkpoint_owner.as_deref(), Some("worker-a"));
    assert_eq!(
        handoff.pending_checkpoint,
        Some(Checkpoint::at(
            "49651538401220946287154431546713870925640718925419725000",
            3
        ))
    );
    assert_eq!(handoff.pending_checkpoint_state, Some(vec![0, 1, 2, 255]));

    assert_eq!(from_item(&items[4]), Ok(ReadItem::NotALease));
}

/// The Java KCL 3.5 writes `entityType: LEASE` on the leases it creates:
/// they are leases. Any `entityType` made an item another entity, so kcl
/// never read the shards of a table the Java KCL 3.5 had made.
#[test]
fn java_kcl_leases_marked_as_leases_are_leases() {
    let items = fixture(SINGLE_STREAM);
    let marked = lease(&items[5]);
    assert_eq!(marked.shard_id, "shardId-000000000005");
    assert_eq!(
        (marked.owner.as_deref(), marked.counter),
        (Some("worker-b"), 4)
    );
    let mut other = items[5].clone();
    other.insert("entityType".into(), AttributeValue::S("COORDINATOR".into()));
    assert_eq!(from_item(&other), Ok(ReadItem::NotALease));
}

#[test]
fn reads_java_kcl_multi_stream_items() {
    let items = fixture(MULTI_STREAM);
    let a = lease(&items[0]);
    assert_eq!(a.key, "123456789012:orders:1700000000:shardId-000000000001");
    assert_eq!(a.stream.as_deref(), Some("123456789012:orders:1700000000"));
    assert_eq!(a.shard_id, "shardId-000000000001");
    assert_eq!(
        (a.owner.as_deref(), a.counter, &a.checkpoint),
        (Some("worker-a"), 42, &Checkpoint::Latest)
    );
    let b = lease(&items[1]);
    assert_eq!(b.checkpoint, Checkpoint::AtTimestamp);
    assert_eq!(b.owner, None);
}

#[test]
fn java_items_survive_a_round_trip_through_our_layout() {
    for json in [SINGLE_STREAM, MULTI_STREAM] {
        for item in fixture(json) {
            let ReadItem::Lease(l) = from_item(&item).unwrap() else {
                continue;
            };
            let written = to_item(&l);
            // Everything we write is what the Java KCL wrote (attributes
            // we do not know are kept by updates, not here).
            for (name, value) in &written {
                assert_eq!(item.get(name), Some(value), "{}: attribute {name}", l.key);
            }
            assert_eq!(lease(&written), *l);
        }
    }
}

/// A NULL where the writes' conditions test for absence is read as no
/// value, the lease kept (a take heals a NULL handoff attribute, and the
/// CLI's forced reset any of them), and named for the warning: refusing
/// the item left its shard unread for good and out of the CLI's reach.
#[test]
fn a_null_is_read_as_absent_and_one_a_take_cannot_count_from_is_named() {
    for attribute in [
        "leaseOwner",
        "kclTenure",
        "checkpointOwner",
        "kclCheckpointOwnerTenure",
        "checkpointSubSequenceNumber",
        "ownerSwitchesSinceCheckpoint",
    ] {
        let mut item = fixture(SINGLE_STREAM).remove(1);
        item.insert(attribute.into(), AttributeValue::Null(true));
        let named = (attribute == "ownerSwitchesSinceCheckpoint").then_some(attribute);
        assert_eq!(null_in_conditions(&item), named);
        lease(&item);
    }
    let mut item = fixture(SINGLE_STREAM).remove(1);
    assert_eq!(null_in_conditions(&item), None);
    item.insert("pendingCheckpoint".into(), AttributeValue::Null(true));
    assert_eq!(null_in_conditions(&item), None);
    assert_eq!(lease(&item).pending_checkpoint, None);
}

#[test]
fn malformed_items_are_errors_that_name_key_and_attribute() {
    let base = || fixture(SINGLE_STREAM).remove(1);
    let s = |v: &str| Some(AttributeValue::S(v.into()));
    let n = |v: &str| Some(AttributeValue::N(v.into()));
    // Each attribute removed (`None`) or given a value it cannot have.
    let cases = [
        ("leaseCounter", None),
        ("leaseCounter", s("7")),
        ("leaseCounter", n("-1")),
        ("checkpoint", s("SHARD_BEGIN")),
        ("checkpoint", None),
        ("leaseOwner", n("1")),
        ("parentShardId", n("1")),
        ("pendingCheckpointState", s("x")),
    ];
    for (attribute, value) in cases {
        let mut item = base();
        match value {
            Some(v) => item.insert(attribute.into(), v),
            None => item.remove(attribute),
        };
        let err = from_item(&item).unwrap_err();
        assert_eq!(err.key, "shardId-000000000002");
        assert!(err.reason.contains(attribute), "{attribute}: {err}");
    }
    let mut keyless = base();
    keyless.remove("leaseKey");
    assert_eq!(from_item(&keyless).unwrap_err().key, "<missing>");
}

/// The Java KCL 3.x's `throughputKBps` is read as the lease's figure; one
/// that is no finite non-negative number (a hand edit, a string) reads as
/// no figure, and never makes the item unreadable.
#[test]
fn the_throughput_figure_is_read_and_a_bad_one_is_no_figure() {
    let items = fixture(SINGLE_STREAM);
    assert_eq!(lease(&items[1]).throughput, Throughput::from_kbps(12.5));
    assert_eq!(lease(&items[0]).throughput, None);
    for bad in [
        AttributeValue::S("12.5".into()),
        AttributeValue::N("-3".into()),
        AttributeValue::N("NaN".into()),
        AttributeValue::N("1e999".into()),
        AttributeValue::N("fast".into()),
        AttributeValue::Bool(true),
    ] {
        let mut item = items[1].clone();
        item.insert(attr::THROUGHPUT_KBPS.into(), bad.clone());
        let read = lease(&item);
        assert_eq!(read.throughput, None, "{bad:?}");
        assert_eq!(read.counter, 88, "the rest of the item is read: {bad:?}");
    }
    // Written as a plain decimal, which Java's `Double.valueOf` parses.
    let written = throughput_value(Throughput::from_kbps(1_234.567_89).expect("finite"));
    assert_eq!(written, AttributeValue::N("1234.568".into()));
}

fn arb_checkpoint() -> impl Strategy<Value = Checkpoint> {
    prop_oneof![
        Just(Checkpoint::TrimHorizon),
        Just(Checkpoint::Latest),
        Just(Checkpoint::AtTimestamp),
        Just(Checkpoint::ShardEnd),
        ("[1-9][0-9]{0,55}", any::<u64>()).prop_map(|(s, sub)| Checkpoint::at(s, sub)),
    ]
}

proptest! {
    #[test]
    fn any_lease_reads_back_identically(
        shard in "shardId-[0-9]{12}",
        stream in proptest::option::of("[0-9]{12}:[a-z-]{1,20}:[0-9]{10}"),
        owner in proptest::option::of("[a-z0-9:.-]{1,40}"),
        counter in any::<u64>(),
        checkpoint in arb_checkpoint(),
        pending in proptest::option::of(arb_checkpoint()),
        state in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
        switches in any::<u64>(),
        parents in proptest::collection::btree_set("shardId-[0-9]{12}", 0..3),
        children in proptest::collection::btree_set("shardId-[0-9]{12}", 0..3),
        range in proptest::option::of(("[0-9]{1,39}", "[0-9]{1,39}")),
        cp_owner in proptest::option::of("[a-z0-9-]{1,20}"),
        kbps in proptest::option::of(0u64..1_000_000_000),
    ) {
        let mut l = match stream {
            Some(s) => Lease::new_multi_stream(s, shard, checkpoint),
            None => Lease::new(shard, checkpoint),
        };
        l.owner = owner;
        l.counter = counter;
        l.pending_checkpoint = pending;
        l.pending_checkpoint_state = state;
        l.owner_switches_since_checkpoint = switches;
        l.parent_shard_ids = parents;
        l.child_shard_ids = children;
        l.hash_key_range = range.map(|(starting, ending)| HashKeyRange { starting, ending });
        l.checkpoint_owner = cp_owner;
        // Figures are stored in thousandths of a KB/s.
        l.throughput = kbps.and_then(|k| Throughput::from_kbps(k as f64 / 1000.0));
        prop_assert_eq!(lease(&to_item(&l)), l);
    }
}
