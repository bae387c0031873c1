//! Liveness records (one per worker process) and the Java KCL workers
//! that share a lease table: what [`LeaseStore`](super::LeaseStore)'s beat
//! and worker reads carry.

/// One worker process's liveness record (the worker-liveness renewal mode):
/// renewed every renew interval instead of every lease, so that a fleet's
/// idle cost grows with its workers, not its shards.
///
/// The record is keyed by the process's instance id, the prefix of every
/// tenure it writes (`<instance>.<n>`): a lease whose tenure names a live
/// instance is alive, whatever its own item says. Peers write into it only
/// to ask something of its owner ([`LeaseStore::poke`](super::LeaseStore::poke)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Beat {
    /// The instance id (the record's key).
    pub instance: String,
    /// The worker id the instance runs under.
    pub worker: String,
    /// Bumped by every beat: peers judge liveness by seeing it move, on
    /// their own monotonic clocks (invariant 3).
    pub counter: u64,
    /// Leases the instance held at its last beat (peers balance from it
    /// without reading the lease table).
    pub held: u64,
    /// Bumped by the instance when it changed the lease table in a way
    /// peers should look at (leases created, released or finished).
    pub changes: u64,
    /// Bumped by peers that want the instance to read the lease table now
    /// (a worker that released its leases on its way out).
    pub wake: u64,
    /// Lease keys peers asked the instance to hand over (steals), until
    /// the instance answers them in a later beat.
    pub asked: std::collections::BTreeSet<String>,
    /// True while the instance takes no lease: a graceful shutdown is
    /// under way (its leases will be released soon), it sits out after a
    /// shard it could not read, or its taker could not read the lease
    /// table (or the liveness records) for a lease duration. Peers leave
    /// it, and the leases it holds, out of their targets.
    pub stopping: bool,
    /// True if the instance renews every lease it holds too (the
    /// per-lease mode): its tenures last no longer than its last renewal
    /// allows either, so peers also judge its leases by their counters.
    pub per_lease: bool,
    /// The instance's lease duration, so tools can judge its leases
    /// without being told the application's settings (`None` in records
    /// written before it was recorded).
    pub lease_duration: Option<std::time::Duration>,
    /// When the record was last written, on the writer's wall clock: for
    /// operators' tools, which have one sample to judge from; never for
    /// the engine's judgement of expiry, which is by the counter moving on
    /// its own clock (invariant 3).
    pub written_at: Option<std::time::SystemTime>,
    /// How long before the read the record was written, as far as the
    /// reading store can tell (DynamoDB: the reader's wall clock against
    /// [`Beat::written_at`], so off by the hosts' clock skew). The engine
    /// uses it only as a hint that cannot break an invariant: proof that a
    /// holder runs before stealing from it (a wrong proof costs a handoff
    /// forced a lease duration later, as the holder's leases expire).
    pub age: Option<std::time::Duration>,
    /// How often the instance beats (`None` in records written before it
    /// was recorded): peers read the records just after its beats land.
    pub beat_interval: Option<std::time::Duration>,
}

/// What one beat writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeatUpdate<'a> {
    /// The instance id.
    pub instance: &'a str,
    /// Its worker id.
    pub worker: &'a str,
    /// Leases held now.
    pub held: u64,
    /// The instance's change counter (see [`Beat::changes`]).
    pub changes: u64,
    /// Handoff requests (from [`Beat::asked`]) this beat answers: removed
    /// from the record.
    pub answered: &'a [String],
    /// See [`Beat::stopping`].
    pub stopping: bool,
    /// See [`Beat::per_lease`].
    pub per_lease: bool,
    /// See [`Beat::lease_duration`].
    pub lease_duration: std::time::Duration,
    /// See [`Beat::beat_interval`].
    pub beat_interval: std::time::Duration,
}

/// A Java KCL 3.x worker, from its `WorkerMetricStats` entry: it reports
/// every 30 s, and its leader assigns leases only to workers that report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JavaWorker {
    /// Its worker id (the `leaseOwner` it writes).
    pub id: String,
    /// When it last reported (`lut`: epoch seconds, on its own clock).
    pub last_update_secs: u64,
}
