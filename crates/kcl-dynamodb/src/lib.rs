//! kcl's lease store on DynamoDB.
//!
//! # Layout
//!
//! - [`item`]: the lease item layout, compatible with the Java KCL 2.x/3.x
//!   (single- and multi-stream), and its mapping to [`kcl_core::Lease`].
//! - [`store`]: [`DynamoDbLeaseStore`], every write conditional, every read
//!   a strongly consistent paginated scan or get.
//! - [`liveness`]: the workers' liveness records (the worker-liveness
//!   renewal mode), in a table of their own.
//! - [`destination`]: [`DynamoDbDestination`], a table for records a
//!   processor keeps failing on (`FailurePolicy::Isolate`).
//! - [`exactly_once`]: a batch's writes and its checkpoint in one
//!   transaction, conditional on the lease's tenure ([`ExactlyOnce`]).
//! - [`table`]: creating the tables if missing and checking existing ones.
//! - [`schema`]: the tables' attribute names and naming conventions, in
//!   one place.
//!
//! The store passes the same conformance suite as the in-memory store
//! (`kcl_core::store::conformance`), run against DynamoDB Local by the
//! workspace's end-to-end tests.
#![deny(missing_docs)]

pub mod destination;
mod error;
pub mod exactly_once;
#[cfg(test)]
mod fake;
pub mod item;
pub mod java;
mod java_reports;
pub mod liveness;
pub mod schema;
pub mod store;
pub mod table;

pub use destination::DynamoDbDestination;
pub use exactly_once::{ExactlyOnce, Transaction, TransactionError};
pub use store::DynamoDbLeaseStore;
pub use table::{
    Capacity, TableCreation, TableOptions, claim_stream, ensure_table, ensure_workers_table,
};
