//! A worker's settings: [`WorkerConfig`], built and validated by
//! [`WorkerConfigBuilder`], the stream-name check and the limits and
//! defaults they apply.

use std::time::{Duration, SystemTime};

use super::{RemovedStreamPolicy, StreamSpec};
use crate::checkpointer::CheckpointPolicy;
use crate::config::{ConfigError, LeaseConfig, count_in, each_at_most_max, invalid};
use crate::lease::LeaseLayout;
use crate::processor::FailurePolicy;
use crate::source::InitialPosition;

/// Settings of a [`Worker`](super::Worker); build with [`WorkerConfig::builder`].
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub(crate) lease: LeaseConfig,
    pub(crate) streams: Vec<StreamSpec>,
    pub(crate) initial_position: InitialPosition,
    pub(crate) failure_policy: FailurePolicy,
    pub(crate) parallelism_per_shard: usize,
    pub(crate) checkpoint_policy: CheckpointPolicy,
    pub(crate) shard_sync_interval: Duration,
    pub(crate) parent_poll_interval: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) completed_lease_retention: Duration,
    pub(crate) removed_stream_policy: RemovedStreamPolicy,
    pub(crate) max_read_failure_time: Duration,
    pub(crate) processor_warn_after: Duration,
    pub(crate) processor_timeout: Option<Duration>,
}

impl WorkerConfig {
    /// A builder for the given lease settings (which carry the worker id).
    pub fn builder(lease: LeaseConfig) -> WorkerConfigBuilder {
        WorkerConfigBuilder::default().lease(lease)
    }

    /// The lease settings.
    pub fn lease(&self) -> &LeaseConfig {
        &self.lease
    }

    /// The streams consumed.
    pub fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
}

/// Builder of [`WorkerConfig`]: the lease settings and at least one stream
/// are required, every other setting has a default.
#[derive(Debug, Clone)]
pub struct WorkerConfigBuilder {
    lease: Option<LeaseConfig>,
    streams: Vec<StreamSpec>,
    initial_position: InitialPosition,
    failure_policy: FailurePolicy,
    parallelism_per_shard: usize,
    checkpoint_policy: CheckpointPolicy,
    shard_sync_interval: Duration,
    parent_poll_interval: Duration,
    shutdown_timeout: Duration,
    max_backoff: Duration,
    completed_lease_retention: Duration,
    removed_stream_policy: RemovedStreamPolicy,
    max_read_failure_time: Duration,
    processor_warn_after: Duration,
    processor_timeout: Option<Duration>,
}

impl Default for WorkerConfigBuilder {
    fn default() -> Self {
        WorkerConfigBuilder {
            lease: None,
            streams: Vec::new(),
            initial_position: InitialPosition::Latest,
            failure_policy: FailurePolicy::Retry,
            parallelism_per_shard: 1,
            checkpoint_policy: CheckpointPolicy::every_call(),
            shard_sync_interval: Duration::from_secs(60),
            parent_poll_interval: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(25),
            max_backoff: Duration::from_secs(30),
            completed_lease_retention: Duration::from_secs(300),
            removed_stream_policy: RemovedStreamPolicy::Keep,
            max_read_failure_time: DEFAULT_MAX_READ_FAILURE_TIME,
            processor_warn_after: Duration::from_secs(60),
            processor_timeout: None,
        }
    }
}

impl WorkerConfigBuilder {
    /// The lease settings (required; they carry the worker id).
    pub fn lease(mut self, lease: LeaseConfig) -> Self {
        self.lease = Some(lease);
        self
    }
    /// Adds a stream.
    pub fn stream(mut self, spec: StreamSpec) -> Self {
        self.streams.push(spec);
        self
    }
    crate::setters!(self {
        /// Where shards without a checkpoint start (default LATEST, as the Java
        /// KCL). An `AT_TIMESTAMP` more than a day ahead of the clock is
        /// refused: every shard would skip the records written until then.
        initial_position(p: InitialPosition),
        /// What happens when a processor returns an error (default: retry the
        /// same batch with backoff).
        failure_policy(p: FailurePolicy),

        /// Processes each shard in up to `n` parallel lanes (default 1, at
        /// most [`MAX_PARALLELISM_PER_SHARD`]): the records of one partition
        /// key always go to the same lane, in shard order, so a key's records
        /// never overtake each other, while records of different keys are
        /// processed concurrently. Each lane has its own processor instance
        /// (the factory is called once per lane, with
        /// [`ShardContext::lane`](crate::processor::ShardContext::lane) set),
        /// and the shard's checkpoint advances to the highest position below
        /// which every lane is done.
        parallelism_per_shard(n: usize),

        /// How often each shard's checkpoint is written (default: at every
        /// `checkpoint()` call). With [`CheckpointPolicy::every`], calls within
        /// the period are coalesced into one write of the latest position at
        /// its end; a graceful shutdown, a handoff and SHARD_END always write
        /// the latest position, so a policy only changes how many records a
        /// crash repeats (at most a period's worth).
        checkpoint_policy(policy: CheckpointPolicy),

        /// How often shards are listed to create leases for new ones (default
        /// 60 s, jittered by +/-25%).
        shard_sync_interval(d: Duration),
        /// How often a child shard checks whether its parents finished
        /// (default 10 s, as the Java KCL's `parentShardPollIntervalMillis`).
        parent_poll_interval(d: Duration),
        /// How long a graceful shutdown waits for processors to finish before
        /// it stops them and releases the leases anyway (default 25 s, inside
        /// the 30 s that ECS and Kubernetes give by default). Stopping takes
        /// up to 2 s more: the calls under way are cancelled, the positions
        /// their processors asked for before are written, and each is told
        /// `lease_lost`.
        shutdown_timeout(d: Duration),
        /// Longest pause between retries of a failing processor or read
        /// (default 30 s).
        max_backoff(d: Duration),

        /// How long a finished shard's lease stays in the table before shard
        /// sync deletes it (default 5 min, as the Java KCL's
        /// `completedLeaseCleanupThreshold`).
        completed_lease_retention(d: Duration),

        /// What happens to the leases of a stream a
        /// [`StreamTracker`](super::StreamTracker) stops listing (default: keep
        /// them, so its checkpoints survive if it comes back).
        removed_stream_policy(policy: RemovedStreamPolicy),

        /// How long a processor call (`initialize`, `process_records`,
        /// `shard_ended`, `shutdown_requested`, `lease_lost`) may run before it
        /// is warned about, once per call, with its shard, lane and elapsed
        /// time, and counted in `kcl_processor_calls_slow_total` (default 60 s;
        /// above zero).
        processor_warn_after(d: Duration),

        /// Cancels a processor call running this long and gives its shard back
        /// (default: no limit; above [`Self::processor_warn_after`]). The
        /// call's future is dropped first, so it never runs beside the shard's
        /// next owner; then the processor gets `lease_lost` (itself cut at this
        /// limit) and is dropped, the lease is released, and the next owner
        /// (maybe this worker) resumes from the last checkpoint. Counted in
        /// `kcl_processor_timeouts_total`; the failure policy does not apply.
        /// Only a call that yields can be cancelled: one blocked outside an
        /// await point holds its task, and the lease, until it returns.
        processor_timeout(d: Duration) = Some(d),

        /// How long a held shard may go without a single successful read,
        /// and without a single answer from the service, before it is given
        /// back (default [`DEFAULT_MAX_READ_FAILURE_TIME`], 45 s; at least
        /// 1 s; `Duration::MAX` never gives a shard back for its reads): every
        /// open and fetch since the last batch failed, and none was answered
        /// (they timed out or never reached the service). The lease is
        /// released with an error log and counted in
        /// `kcl_unreadable_shards_released_total{stage="stalled"}`, so a
        /// worker that can read (a peer, or this one once its reads recover)
        /// takes the shard; without it, a worker cut off from the stream
        /// while it still reaches the lease table would keep its shards unread.
        ///
        /// Errors the service sends are answers and keep the shard in place:
        /// a fleet-wide outage (a disabled KMS key, long throttling) fails
        /// every worker alike, and moving the leases would change nothing.
        /// Only time spent reading counts: an idle shard's empty reads
        /// succeed, and a processor's time is its own. Keep it above the
        /// source's longest quiet gap between answers (the polling reader's
        /// call timeout, 10 s by default; the fan-out reader's event timeout,
        /// 30 s). A source that does not tell the consumer of its answers
        /// (see `source::AnswerClock`) has every failed read count.
        max_read_failure_time(d: Duration),
    });

    /// Checks every setting but the lease settings and the streams: for a
    /// caller that validates its stream names with [`check_stream_names`]
    /// and resolves their lease layouts later (that needs the stream
    /// service), then calls [`Self::build`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        each_at_most_max(&[
            ("shard_sync_interval", Some(self.shard_sync_interval)),
            ("parent_poll_interval", Some(self.parent_poll_interval)),
            ("shutdown_timeout", Some(self.shutdown_timeout)),
            ("max_backoff", Some(self.max_backoff)),
            (
                "completed_lease_retention",
                Some(self.completed_lease_retention),
            ),
            ("processor_warn_after", Some(self.processor_warn_after)),
            ("processor_timeout", self.processor_timeout),
        ])?;
        if self.shard_sync_interval.is_zero() {
            return invalid("shard_sync_interval", "must be above zero");
        }
        if self.parent_poll_interval.is_zero() {
            return invalid("parent_poll_interval", "must be above zero");
        }
        if self.max_backoff < Duration::from_millis(100) {
            return invalid("max_backoff", "must be at least 100ms");
        }
        count_in(
            "parallelism_per_shard",
            self.parallelism_per_shard,
            MAX_PARALLELISM_PER_SHARD,
        )?;
        self.checkpoint_policy.validate()?;
        if self.max_read_failure_time < Duration::from_secs(1) {
            let limit = self.max_read_failure_time;
            return invalid(
                "max_read_failure_time",
                format!("must be at least 1s, not {limit:?}: a healthy read can take that long"),
            );
        }
        self.validate_processor_limits()?;
        validate_initial_position(self.initial_position, SystemTime::now())?;
        if let FailurePolicy::Isolate(p) = &self.failure_policy
            && let Some(problem) = p.problem()
        {
            return invalid("failure_policy", problem);
        }
        Ok(())
    }

    fn validate_processor_limits(&self) -> Result<(), ConfigError> {
        if self.processor_warn_after.is_zero() {
            return invalid("processor_warn_after", "must be above zero");
        }
        match self.processor_timeout {
            Some(timeout) if timeout <= self.processor_warn_after => invalid(
                "processor_timeout",
                format!(
                    "must exceed processor_warn_after ({:?}), not {timeout:?}: a call is warned \
                     about before it is cancelled",
                    self.processor_warn_after
                ),
            ),
            _ => Ok(()),
        }
    }

    /// Validates the settings.
    pub fn build(self) -> Result<WorkerConfig, ConfigError> {
        self.validate()?;
        let Some(lease) = self.lease else {
            return invalid("lease", "no lease settings; call .lease(LeaseConfig)");
        };
        check_stream_names(self.streams.iter().map(|s| s.name.as_str()))?;
        if self.streams.len() > 1
            && self
                .streams
                .iter()
                .any(|s| s.layout == LeaseLayout::SingleStream)
        {
            return invalid("streams", "several streams need multi-stream lease keys");
        }
        Ok(WorkerConfig {
            lease,
            streams: self.streams,
            initial_position: self.initial_position,
            failure_policy: self.failure_policy,
            parallelism_per_shard: self.parallelism_per_shard,
            checkpoint_policy: self.checkpoint_policy,
            shard_sync_interval: self.shard_sync_interval,
            parent_poll_interval: self.parent_poll_interval,
            shutdown_timeout: self.shutdown_timeout,
            max_backoff: self.max_backoff,
            completed_lease_retention: self.completed_lease_retention,
            removed_stream_policy: self.removed_stream_policy,
            max_read_failure_time: self.max_read_failure_time,
            processor_warn_after: self.processor_warn_after,
            processor_timeout: self.processor_timeout,
        })
    }
}

/// Checks a worker's stream names: at least one, none blank, none twice.
pub fn check_stream_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    let mut seen: Vec<&str> = Vec::new();
    for name in names {
        if name.trim().is_empty() {
            return invalid("streams", "contains an empty stream name");
        }
        if seen.contains(&name) {
            return invalid("streams", format!("names {name:?} twice"));
        }
        seen.push(name);
    }
    if seen.is_empty() {
        return invalid("streams", "must name at least one stream");
    }
    Ok(())
}

/// The most lanes a shard can be processed in.
pub const MAX_PARALLELISM_PER_SHARD: usize = 100;

/// How far ahead of the clock an `AT_TIMESTAMP` may be: clock skew, or a
/// start planned a little ahead.
pub(crate) const MAX_INITIAL_TIMESTAMP_AHEAD: Duration = Duration::from_secs(24 * 3600);

/// Refuses an `AT_TIMESTAMP` more than [`MAX_INITIAL_TIMESTAMP_AHEAD`]
/// after `now`: every shard would skip the records written until then,
/// silently. Epoch milliseconds read as seconds land there (the year
/// 56,000), so the reason says so.
fn validate_initial_position(
    position: InitialPosition,
    now: SystemTime,
) -> Result<(), ConfigError> {
    let InitialPosition::AtTimestamp(at) = position else {
        return Ok(());
    };
    let Ok(ahead) = at.duration_since(now) else {
        return Ok(());
    };
    if ahead <= MAX_INITIAL_TIMESTAMP_AHEAD {
        return Ok(());
    }
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    invalid(
        "initial_position",
        format!(
            "AT_TIMESTAMP is {secs} s after the epoch, {} days from now: every shard would skip \
             the records written until then (a time in epoch milliseconds taken for seconds \
             lands thousands of years ahead; give seconds or RFC 3339)",
            ahead.as_secs() / 86_400
        ),
    )
}

/// How long a held shard may go with no read succeeding and no call
/// answered before it is given back, by default
/// ([`WorkerConfigBuilder::max_read_failure_time`]): above the fan-out
/// reader's 30 s event timeout plus a new subscription, so that a
/// connection that died unnoticed is replaced before the shard is given up.
pub const DEFAULT_MAX_READ_FAILURE_TIME: Duration = Duration::from_secs(45);

#[cfg(test)]
mod tests {
    use super::*;

    /// An `AT_TIMESTAMP` far ahead (epoch milliseconds read as seconds) is
    /// refused, naming the setting and the likely slip; one in the past or
    /// within a day ahead is taken. It was taken, and every shard skipped
    /// what was written until then.
    #[test]
    fn an_initial_timestamp_far_ahead_is_refused() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_765_000_000);
        let at = |secs: u64| {
            InitialPosition::AtTimestamp(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        };
        let err = validate_initial_position(at(1_765_000_000_000), now).expect_err("milliseconds");
        assert_eq!(err.field, "initial_position");
        assert!(err.reason.contains("milliseconds"), "{}", err.reason);
        validate_initial_position(at(1_765_000_000 + 2 * 86_400), now).expect_err("two days ahead");
        for fine in [1_700_000_000, 1_765_000_000 + 3600] {
            validate_initial_position(at(fine), now).expect("in the past, or an hour ahead");
        }
        validate_initial_position(InitialPosition::Latest, now).expect("no time");
    }
}
