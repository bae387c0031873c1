//! The end-to-end suite against the emulators (kinesis-mock and DynamoDB
//! Local, started by `localstack/up`), one test binary with a module per
//! concern, as cargo's own test suite is laid out: linking the AWS SDK once
//! instead of once a file saves minutes of `make test` on two cores.
//!
//! Run one concern with a filter, e.g. `cargo test -p kcl-tests --test e2e
//! chaos::`. The observability tests are a binary of their own
//! (`--test observability`): they start a real Prometheus, moto and an
//! OTLP collector and re-run single tests as child processes with their
//! own global metrics recorder.

mod chaos;
mod cli;
mod dynamodb_store;
mod emulator_smoke;
mod exactly_once;
mod fanout;
mod java_fleet;
mod kinesis_source;
mod lease_faults;
mod poison;
mod shards_in_motion;
mod worker_e2e;

/// The worker process the scenarios start (tests/bin/e2e_worker.rs).
const E2E_WORKER: &str = env!("CARGO_BIN_EXE_e2e-worker");
