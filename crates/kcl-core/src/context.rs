//! Which shard a processor works on, and what it fails with: the types
//! both the processor API and the poison-record policy name, kept below
//! both so that neither depends on the other for them. Public at
//! [`crate::processor`].

/// An error returned by a processor; what happens next is decided by the
/// worker's [`FailurePolicy`](crate::processor::FailurePolicy).
pub type ProcessorError = Box<dyn std::error::Error + Send + Sync>;

/// Which shard a processor works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardContext {
    /// The stream name.
    pub stream: String,
    /// The shard id.
    pub shard_id: String,
    /// The lease key in the lease table.
    pub lease_key: String,
    /// This worker's id.
    pub worker_id: String,
    /// The lane this processor serves when the shard is processed in
    /// parallel lanes (`parallelism_per_shard` above 1), `None` otherwise.
    pub lane: Option<Lane>,
}

/// One of the parallel lanes of a shard: a processor instance that sees
/// every record of the partition keys hashed to it, in shard order, and no
/// other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    /// This lane, `0..count`.
    pub index: usize,
    /// How many lanes the shard has.
    pub count: usize,
}
