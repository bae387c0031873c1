//! The poison policy's tests: verdicts, error text, `CannotStore`.

use super::*;

fn record(age: Option<Duration>) -> Record {
    Record {
        data: bytes::Bytes::from_static(b"x"),
        partition_key: "k".into(),
        explicit_hash_key: None,
        sequence_number: "1".into(),
        sub_sequence_number: 0,
        approximate_arrival: age.map(|a| SystemTime::now() - a),
        aggregated: false,
    }
}

#[derive(Debug)]
struct Wrapped(CannotStore);

impl fmt::Display for Wrapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sending failed: {}", self.0)
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[test]
fn cannot_store_is_found_returned_boxed_or_as_a_source() {
    let boxed: ProcessorError = Box::new(CannotStore::new("too big"));
    assert_eq!(
        CannotStore::find(&*boxed).map(CannotStore::reason),
        Some("too big")
    );
    let wrapped: ProcessorError = Box::new(Wrapped(CannotStore::new("too big")));
    assert_eq!(
        CannotStore::find(&*wrapped).map(CannotStore::reason),
        Some("too big")
    );
    let other: ProcessorError = "throttled".into();
    assert_eq!(CannotStore::find(&*other), None);
}

#[test]
fn a_long_error_is_cut_at_a_character_boundary() {
    let ctx = ShardContext {
        stream: "s".into(),
        shard_id: "sh".into(),
        lease_key: "sh".into(),
        worker_id: "w".into(),
        lane: None,
    };
    let f = FailedRecord::new(
        ctx,
        record(None),
        "é".repeat(10),
        1,
        FailureReason::MaxAttempts,
    );
    assert_eq!(f.error_within(5), "éé");
    assert_eq!(f.error_within(100), f.error);
}

#[test]
fn a_record_is_given_up_on_after_its_attempts_or_when_too_old() {
    let p = PoisonPolicy::drop_failed()
        .max_attempts(3)
        .max_record_age(Duration::from_secs(60));
    let fresh = record(Some(Duration::from_secs(1)));
    assert_eq!(p.verdict(&fresh, 2), None);
    assert_eq!(p.verdict(&fresh, 3), Some(FailureReason::MaxAttempts));
    let old = record(Some(Duration::from_secs(61)));
    assert_eq!(p.verdict(&old, 1), Some(FailureReason::MaxRecordAge));
    // No arrival time: only the attempts count.
    assert_eq!(p.verdict(&record(None), 1), None);
}
