//! The names kcl's DynamoDB tables are built on, in one place: the lease
//! item's attributes, the liveness records' attributes, the Java KCL 3.x's
//! worker reports, and how the tables beside a lease table are named.
//!
//! The layouts themselves (types, meaning, compatibility) are described
//! where they are read and written: [`crate::item`], [`crate::liveness`]
//! and [`crate::java`]. The modules that use these names re-export them
//! under their old paths (`item::attr`, `liveness::attr`,
//! `table::workers_table_for`, `table::STREAM_CLAIM_KEY`,
//! `java::worker_metric_stats_table_for`).

/// Attribute names of a lease item, as the Java KCL spells them (the
/// layout: [`crate::item`]).
pub mod lease {
    /// The hash key.
    pub const LEASE_KEY: &str = "leaseKey";
    /// The owner's worker id.
    pub const LEASE_OWNER: &str = "leaseOwner";
    /// The lease counter.
    pub const LEASE_COUNTER: &str = "leaseCounter";
    /// The checkpoint's sequence number or sentinel.
    pub const CHECKPOINT: &str = "checkpoint";
    /// The checkpoint's sub-sequence number.
    pub const CHECKPOINT_SUB: &str = "checkpointSubSequenceNumber";
    /// The pending checkpoint's sequence number.
    pub const PENDING_CHECKPOINT: &str = "pendingCheckpoint";
    /// The pending checkpoint's sub-sequence number.
    pub const PENDING_CHECKPOINT_SUB: &str = "pendingCheckpointSubSequenceNumber";
    /// The pending checkpoint's application state.
    pub const PENDING_CHECKPOINT_STATE: &str = "pendingCheckpointState";
    /// Owner changes since the last checkpoint.
    pub const OWNER_SWITCHES: &str = "ownerSwitchesSinceCheckpoint";
    /// Parent shard ids.
    pub const PARENT_SHARD_IDS: &str = "parentShardId";
    /// Child shard ids.
    pub const CHILD_SHARD_IDS: &str = "childShardIds";
    /// First hash key of the shard.
    pub const STARTING_HASH_KEY: &str = "startingHashKey";
    /// Last hash key of the shard.
    pub const ENDING_HASH_KEY: &str = "endingHashKey";
    /// The previous owner during a graceful handoff.
    pub const CHECKPOINT_OWNER: &str = "checkpointOwner";
    /// Multi-stream: the stream identifier (named `streamName` for legacy
    /// reasons in the Java KCL).
    pub const STREAM_NAME: &str = "streamName";
    /// Multi-stream: the shard id.
    pub const SHARD_ID: &str = "shardId";
    /// What the shard carries, KB/s (the Java KCL 3.x's lease throughput).
    pub const THROUGHPUT_KBPS: &str = "throughputKBps";
    /// The kind of item: absent or [`LEASE_ENTITY`] on a lease (the Java
    /// KCL 3.5 marks the leases it creates), another value on the other
    /// entities newer Java KCLs keep in the table.
    pub const ENTITY_TYPE: &str = "entityType";
    /// The [`ENTITY_TYPE`] of a lease.
    pub const LEASE_ENTITY: &str = "LEASE";
    /// kcl only: the owner's tenure.
    pub const TENURE: &str = "kclTenure";
    /// kcl only: the previous owner's tenure during a graceful handoff.
    pub const CHECKPOINT_OWNER_TENURE: &str = "kclCheckpointOwnerTenure";
    /// kcl only: the token of the last exactly-once commit, written only by
    /// its transaction.
    pub const COMMIT_TOKEN: &str = "kclCommitToken";
    /// kcl only: tokens of exactly-once commits that may never land.
    pub const FENCED_COMMITS: &str = "kclFencedCommits";
}

/// Attribute names of a liveness record (the layout: [`crate::liveness`]).
pub mod liveness {
    /// Hash key: the instance id.
    pub const INSTANCE: &str = "instance";
    /// The worker id.
    pub const WORKER: &str = "workerId";
    /// The beat counter.
    pub const BEAT: &str = "beat";
    /// Leases held.
    pub const HELD: &str = "held";
    /// The change counter.
    pub const CHANGES: &str = "changes";
    /// The wake counter.
    pub const WAKE: &str = "wake";
    /// Lease keys asked for.
    pub const ASKED: &str = "asked";
    /// Shutting down.
    pub const STOPPING: &str = "stopping";
    /// The instance's lease duration, in milliseconds.
    pub const LEASE_DURATION: &str = "d";
    /// When the record was last written (epoch milliseconds, the writer's clock).
    pub const WRITTEN_AT: &str = "t";
    /// How often the instance beats, in milliseconds.
    pub const BEAT_INTERVAL: &str = "i";
    /// The instance renews every lease too.
    pub const PER_LEASE: &str = "p";
    /// On the one item that is not a liveness record: the stream a
    /// single-stream lease table serves (see
    /// [`crate::table::claim_stream`]).
    pub const SERVES_STREAM: &str = "servesStream";
}

/// Attribute names of the Java KCL 3.x's worker reports
/// (`<lease table>-WorkerMetricStats`, see [`crate::java`]).
pub mod java_workers {
    /// Hash key: the worker id, as in `leaseOwner`.
    pub const WORKER_ID: &str = "wid";
    /// When the worker last reported, epoch seconds.
    pub const LAST_UPDATE: &str = "lut";
    /// The `entityType` of a report kept in the lease table (Java KCL
    /// 3.5), whose `leaseKey` is then the worker id.
    pub const ENTITY: &str = "WORKER_METRIC_STATS";
}

/// Names of the Java KCL 3.x's migration state: one item, in
/// `<lease table>-CoordinatorState` (hash key `key`) or, from the Java KCL
/// 3.5 on, in the lease table (hash key `leaseKey`, `entityType`
/// [`MIGRATION_ENTITY`](java_migration::MIGRATION_ENTITY)).
pub mod java_migration {
    /// The item's key.
    pub const MIGRATION_KEY: &str = "Migration3.0";
    /// The coordinator state table's hash key.
    pub const STATE_KEY: &str = "key";
    /// The fleet's client version (`CLIENT_VERSION_2X`, ...).
    pub const CLIENT_VERSION: &str = "cv";
    /// The `entityType` of the item in the lease table.
    pub const MIGRATION_ENTITY: &str = "CLIENT_VERSION_MIGRATION";
    /// The client versions in which Java workers take leases themselves,
    /// as the Java KCL 2.x does, though they report (upgrading from 2.x).
    pub const SELF_TAKING: [&str; 2] = ["CLIENT_VERSION_2X", "CLIENT_VERSION_UPGRADE_FROM_2X"];
}

/// The Java KCL 3.x's coordinator state table for `lease_table` (its
/// default name: the application name, which is the lease table's).
pub fn coordinator_state_table_for(lease_table: &str) -> String {
    format!("{lease_table}-CoordinatorState")
}

/// The default name of the liveness records' table for `lease_table`.
pub fn workers_table_for(lease_table: &str) -> String {
    format!("{lease_table}-workers")
}

/// The Java KCL 3.x's table of worker reports for `lease_table` (its
/// default name: the application name, which is the lease table's).
pub fn worker_metric_stats_table_for(lease_table: &str) -> String {
    format!("{lease_table}-WorkerMetricStats")
}

/// The key of the item, in the liveness records' table, that names the
/// stream a single-stream lease table serves.
pub const STREAM_CLAIM_KEY: &str = "kcl:served-stream";
