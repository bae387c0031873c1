//! Harnesses the crates' tests share (feature `test-util`): whole workers
//! over the in-memory lease table ([`fleet`]), and a metrics recorder that
//! reads back what the code under test recorded ([`metrics`]).
//!
//! Unlike [`testing`](crate::testing), which drives one processor without
//! a worker, these run the real [`Worker`](crate::worker::Worker) engine.

pub mod fleet;
pub mod metrics;
