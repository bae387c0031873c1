//! What tests and benchmarks run the source on instead of Kinesis
//! (feature `test-util`): the in-memory Kinesis ([`fake`]), its fan-out
//! calls (`fanout`), the fault injector ([`faults`]) that wraps a real
//! or fake client with the service's errors the emulator never produces,
//! and the de-aggregation benchmarks' batches ([`batches`]).
//!
//! The public parts are re-exported at the crate root as `kcl_kinesis::fake`,
//! `kcl_kinesis::faults`, `kcl_kinesis::batches`, `kcl_kinesis::held_bytes`
//! and `kcl_kinesis::passed_through`, the paths tests and benchmarks name.

pub mod batches;
pub mod fake;
pub(crate) mod fanout;
pub mod faults;
#[cfg(test)]
pub(crate) mod logs;
#[cfg(test)]
pub(crate) mod readers;

/// What a batch of records holds as the prefetch budgets count it (each
/// record, its payload and the strings it owns), for benchmarks that check
/// the budgets' bound.
pub fn held_bytes(records: &[kcl_core::Record]) -> usize {
    crate::records::held_bytes(records)
}

/// The one record de-aggregation hands back for `input` when it does not
/// split it (a plain record, or a malformed aggregate passed through):
/// every field of `input` untouched, as sub-record 0 of no aggregate.
/// Written out field by field, apart from the library's own conversion,
/// for tests to check that conversion against.
pub fn passed_through(input: &crate::kpl::RawRecord) -> kcl_core::Record {
    kcl_core::Record {
        data: input.data.clone(),
        partition_key: input.partition_key.clone(),
        explicit_hash_key: input.explicit_hash_key.clone(),
        sequence_number: input.sequence_number.clone(),
        sub_sequence_number: 0,
        approximate_arrival: input.approximate_arrival,
        aggregated: false,
    }
}

/// A Kinesis client pointed at a port nothing listens on, for tests that
/// build a source or destination but must fail before (or never make)
/// any call.
#[cfg(test)]
pub(crate) fn offline_client() -> aws_sdk_kinesis::Client {
    aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .build(),
    )
}

/// Checks that building each of `cases` fails, naming the field it pairs
/// with both in the error and in its message.
#[cfg(test)]
pub(crate) fn assert_each_names_its_field<B, T: std::fmt::Debug>(
    cases: Vec<(B, &str)>,
    build: impl Fn(B) -> Result<T, kcl_core::ConfigError>,
) {
    for (builder, field) in cases {
        let e = build(builder).expect_err(field);
        assert_eq!(e.field, field);
        assert!(e.to_string().contains(field), "{e}");
    }
}
