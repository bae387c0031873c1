//! What tests and benchmarks run the source on instead of Kinesis
//! (feature `test-util`): the in-memory Kinesis ([`fake`]), its fan-out
//! calls (`fanout`), and the fault injector ([`faults`]) that wraps a real
//! or fake client with the service's errors the emulator never produces.
//!
//! The public parts are re-exported at the crate root as `kcl_kinesis::fake`
//! and `kcl_kinesis::faults`, the paths tests and benchmarks name.

pub mod fake;
pub(crate) mod fanout;
pub mod faults;
#[cfg(test)]
pub(crate) mod readers;
