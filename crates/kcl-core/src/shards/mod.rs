//! What the stream's shards mean for the lease table: [`sync`] gives every
//! shard that needs processing a lease (a pure plan over one listing and one
//! scan, applied with conditional creates), and [`cleanup`] deletes the
//! leases of finished shards after a retention period.
//!
//! Both read the shard source and write the lease store, and only the
//! worker's sync task runs them: they sit above the lease engine
//! (`crate::leases`) and the source (`crate::source`, whose readers hold the
//! engine's `LeaseHandle`), so neither of those depends on them.

pub(crate) mod cleanup;
pub mod sync;
