//! Settings of polling retrieval, validated at `build()`.

use std::time::Duration;

pub use kcl_core::ConfigError;

use crate::budget::validate_reader_bytes;
use crate::calls::retry::{RetryPolicy, RetrySettings};

/// Most records one `GetRecords` call may return (a Kinesis limit).
pub const MAX_GET_RECORDS_LIMIT: i32 = 10_000;

/// The shortest time between the starts of two `GetRecords` calls on one
/// shard that did not return a full batch. Kinesis allows five reads per
/// second per shard, shared by every application reading the stream; the
/// Java KCL enforces the same floor.
pub const MIN_TIME_BETWEEN_READS: Duration = Duration::from_millis(200);

/// How a polling reader fetches. Build with [`PollingConfig::builder`].
///
/// # Pacing
///
/// How soon the next `GetRecords` call starts after the previous one
/// started depends on what that call said:
///
/// | the response                                   | next call after |
/// |------------------------------------------------|-----------------|
/// | a full batch (`max_records`)                   | at once |
/// | short, but `MillisBehindLatest` > 0 (behind)   | [`MIN_TIME_BETWEEN_READS`] (200 ms) |
/// | short, with records, at the tip (trickling)    | `time_between_reads` (500 ms) |
/// | empty, at the tip (idle)                       | `idle_time_between_reads` (1 s) |
///
/// At the defaults a shard with a trickle of records costs at most two
/// calls a second (of the shard's five, which every application reading it
/// shares) and sees a record about 250 ms after it arrives on average; an
/// idle shard costs one call a second; a shard that is behind is read as
/// fast as the shard's quota allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollingConfig {
    pub(crate) max_records: i32,
    pub(crate) idle_time_between_reads: Duration,
    pub(crate) time_between_reads: Duration,
    pub(crate) max_prefetch_records: usize,
    pub(crate) max_prefetch_bytes: usize,
    pub(crate) retry: RetrySettings,
    pub(crate) call_timeout: Duration,
}

impl Default for PollingConfig {
    fn default() -> Self {
        PollingConfig {
            max_records: MAX_GET_RECORDS_LIMIT,
            idle_time_between_reads: Duration::from_secs(1),
            time_between_reads: Duration::from_millis(500),
            max_prefetch_records: 10_000,
            // One full GetRecords response can reach 10 MiB; 8 MiB per shard
            // keeps a few hundred shards within a few GiB even when every
            // processor stalls, and a single oversized response still
            // passes (it takes the whole budget).
            max_prefetch_bytes: 8 * 1024 * 1024,
            retry: RetrySettings::default(),
            // GetRecords answers in tens of milliseconds; the Java KCL gives
            // up after 30 s. 10 s notices a dead connection sooner, and is
            // still far above a slow answer.
            call_timeout: Duration::from_secs(10),
        }
    }
}

impl PollingConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> PollingConfigBuilder {
        PollingConfigBuilder {
            config: PollingConfig::default(),
        }
    }

    /// Records asked for per `GetRecords` call.
    pub fn max_records(&self) -> i32 {
        self.max_records
    }

    /// Time between the starts of two calls when the first returned no
    /// record and the shard is caught up.
    pub fn idle_time_between_reads(&self) -> Duration {
        self.idle_time_between_reads
    }

    /// Time between the starts of two calls when the first returned some
    /// records, fewer than `max_records`, and the shard is caught up.
    pub fn time_between_reads(&self) -> Duration {
        self.time_between_reads
    }

    /// Most user records fetched ahead of the processor.
    pub fn max_prefetch_records(&self) -> usize {
        self.max_prefetch_records
    }

    /// Most payload bytes fetched ahead of the processor.
    pub fn max_prefetch_bytes(&self) -> usize {
        self.max_prefetch_bytes
    }

    /// The longest one `GetRecords`, `GetShardIterator` or `ListShards`
    /// call may take before it is given up and made again.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// How the reader's calls (and shard listing) are retried.
    pub(crate) fn retry_policy(&self) -> RetryPolicy {
        self.retry.policy(self.call_timeout)
    }
}

/// Builds a [`PollingConfig`].
#[derive(Debug, Clone)]
pub struct PollingConfigBuilder {
    config: PollingConfig,
}

impl PollingConfigBuilder {
    kcl_core::setters!(self.config {
        /// Records asked for per `GetRecords` call, 1 to 10 000 (default
        /// 10 000).
        max_records(n: i32),

        /// Time between the starts of two calls when the first returned no
        /// record and the shard is caught up (default 1 s, at least 200 ms):
        /// what an idle shard costs. See the pacing table on [`PollingConfig`].
        idle_time_between_reads(d: Duration),

        /// Time between the starts of two calls when the first returned some
        /// records but fewer than `max_records`, and the shard is caught up
        /// (default 500 ms, at least 200 ms): the latency of a trickling shard
        /// against its read quota. A full batch is followed at once, and a
        /// shard that is behind after 200 ms.
        time_between_reads(d: Duration),

        /// Most user records fetched ahead of the processor (default 10 000).
        max_prefetch_records(n: usize),

        /// Most payload bytes fetched ahead of the processor (default 8 MiB).
        /// A single response larger than this still passes, alone.
        max_prefetch_bytes(n: usize),
    });

    crate::calls::retry::retry_setters!(
        "a throttled or failed call",
        /// Consecutive transient failures (timeouts, 5xx) after which the
        /// reader reports [`kcl_core::source::SourceError::Retryable`] to its
        /// caller; it keeps retrying after that (default 10). Throttling is
        /// retried indefinitely without being reported: it is the service
        /// pacing us, not a failure.
    );

    /// The longest one `GetRecords`, `GetShardIterator` or `ListShards`
    /// call may take before it is given up and made again (default 10 s):
    /// a call stuck on a dead connection must not stall the shard.
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.config.call_timeout = d;
        self
    }

    /// Validates the settings.
    pub fn build(self) -> Result<PollingConfig, ConfigError> {
        let c = self.config;
        let err = |field, reason: String| Err(ConfigError { field, reason });
        if !(1..=MAX_GET_RECORDS_LIMIT).contains(&c.max_records) {
            return err(
                "max_records",
                format!(
                    "is {}; GetRecords accepts 1 to {MAX_GET_RECORDS_LIMIT}",
                    c.max_records
                ),
            );
        }
        for (field, d) in [
            ("idle_time_between_reads", c.idle_time_between_reads),
            ("time_between_reads", c.time_between_reads),
        ] {
            kcl_core::config::at_most_max(field, d)?;
            if d < MIN_TIME_BETWEEN_READS {
                return err(
                    field,
                    format!(
                        "is {d:?}; it must be at least {MIN_TIME_BETWEEN_READS:?}: every application \
                         reading the shard shares its five reads per second"
                    ),
                );
            }
        }
        if c.max_prefetch_records == 0 {
            return err("max_prefetch_records", "must be at least 1".into());
        }
        validate_reader_bytes("max_prefetch_bytes", c.max_prefetch_bytes)?;
        if c.max_prefetch_records > u32::MAX as usize {
            return err(
                "max_prefetch_records",
                format!(
                    "is {}; it must be at most {}",
                    c.max_prefetch_records,
                    u32::MAX
                ),
            );
        }
        c.retry.validate("throttled calls")?;
        kcl_core::config::at_most_max("call_timeout", c.call_timeout)?;
        if c.call_timeout < Duration::from_millis(100) {
            return err(
                "call_timeout",
                format!("is {:?}; it must be at least 100ms", c.call_timeout),
            );
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::assert_each_names_its_field;

    #[test]
    fn defaults_are_valid() {
        let c = PollingConfig::builder().build().expect("defaults");
        assert_eq!(c, PollingConfig::default());
        assert_eq!(c.max_records(), 10_000);
        assert_eq!(c.idle_time_between_reads(), Duration::from_secs(1));
        assert_eq!(c.time_between_reads(), Duration::from_millis(500));
    }

    #[test]
    fn invalid_settings_name_their_field() {
        let cases: Vec<(PollingConfigBuilder, &str)> = vec![
            (PollingConfig::builder().max_records(0), "max_records"),
            (PollingConfig::builder().max_records(10_001), "max_records"),
            (
                PollingConfig::builder().idle_time_between_reads(Duration::ZERO),
                "idle_time_between_reads",
            ),
            (
                PollingConfig::builder().time_between_reads(Duration::from_millis(199)),
                "time_between_reads",
            ),
            (
                PollingConfig::builder().max_prefetch_records(0),
                "max_prefetch_records",
            ),
            (
                PollingConfig::builder().max_prefetch_bytes(0),
                "max_prefetch_bytes",
            ),
            (
                PollingConfig::builder().retry_min_delay(Duration::ZERO),
                "retry_min_delay",
            ),
            (
                PollingConfig::builder()
                    .retry_min_delay(Duration::from_secs(2))
                    .retry_max_delay(Duration::from_secs(1)),
                "retry_max_delay",
            ),
        ];
        assert_each_names_its_field(cases, PollingConfigBuilder::build);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let c = PollingConfig::builder()
            .retry_min_delay(Duration::from_millis(10))
            .retry_max_delay(Duration::from_millis(80))
            .build()
            .expect("config");
        let delays: Vec<Duration> = c.retry_policy().backoff.pauses().take(20).collect();
        assert_eq!(delays.len(), 20, "never runs out");
        // Jitter adds up to one more delay on top of the capped one.
        assert!(
            delays.iter().all(|d| *d <= Duration::from_millis(160)),
            "{delays:?}"
        );
        assert!(delays[0] >= Duration::from_millis(10));
    }
}
