//! Settings of enhanced fan-out retrieval, validated at `build()`.

use std::time::Duration;

use crate::budget::validate_reader_bytes;
use crate::calls::retry::{RetryPolicy, RetrySettings};

use kcl_core::backoff::Pauses;

use kcl_core::ConfigError;

/// How long a stream-consumer call (describe, register, deregister) may
/// take; they answer in milliseconds.
const CONTROL_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest stream-consumer name Kinesis accepts.
pub const MAX_CONSUMER_NAME_LEN: usize = 128;

/// The most events a fan-out reader holds for its consumer (each within
/// the byte bounds): a channel that long is already far past any use.
pub(crate) const MAX_BUFFERED_BATCHES: usize = 65_536;

/// What happens to the stream consumer when the source shuts down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeregisterConsumer {
    /// Leave it registered (the default). Every worker of the application
    /// subscribes through the same consumer, so one worker stopping (a
    /// deploy, a scale-in) must not pull it from under the others; a
    /// consumer costs nothing while nobody subscribes.
    #[default]
    Never,
    /// Deregister the consumers this source used when
    /// [`crate::KinesisShardSource::shutdown`] is called. Only for the last
    /// worker of an application that is going away for good: the other
    /// workers' subscriptions end with the consumer.
    OnShutdown,
}

/// How an enhanced fan-out reader subscribes. Build with
/// [`FanOutConfig::builder`].
///
/// Each held shard gets one `SubscribeToShard` subscription through a
/// registered stream consumer, which receives its own 2 MB/s per shard and
/// records pushed as they arrive instead of polled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanOutConfig {
    pub(crate) consumer_name: Option<String>,
    pub(crate) subscription_lifetime: Option<Duration>,
    pub(crate) consumer_active_timeout: Duration,
    pub(crate) max_buffered_batches: usize,
    pub(crate) max_buffered_bytes: usize,
    pub(crate) retry: RetrySettings,
    pub(crate) closed_shard_check_interval: Option<Duration>,
    pub(crate) event_timeout: Duration,
    pub(crate) deregister: DeregisterConsumer,
}

impl Default for FanOutConfig {
    fn default() -> Self {
        FanOutConfig {
            consumer_name: None,
            subscription_lifetime: None,
            // Registration usually takes seconds; the API allows five
            // registrations per second per account, so a large fleet
            // starting at once may wait its turn.
            consumer_active_timeout: Duration::from_secs(120),
            max_buffered_batches: 4,
            // One event carries at most what the shard pushed in about a
            // second (2 MB/s per consumer per shard); 8 MiB holds a few
            // seconds of a saturated shard, as the polling prefetch does.
            max_buffered_bytes: 8 * 1024 * 1024,
            retry: RetrySettings::default(),
            // Kinesis announces a shard's end in its last event; the check
            // is for endpoints that do not, and costs the shard's shared
            // polling quota.
            closed_shard_check_interval: None,
            // Kinesis sends an event every few seconds even when the shard
            // is idle (no records, a new continuation); half a minute of
            // silence is a dead connection, not a quiet shard.
            event_timeout: Duration::from_secs(30),
            deregister: DeregisterConsumer::Never,
        }
    }
}

impl FanOutConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> FanOutConfigBuilder {
        FanOutConfigBuilder {
            config: FanOutConfig::default(),
        }
    }

    /// The stream consumer's name, if set (the `kcl` facade defaults it to
    /// the application name).
    pub fn consumer_name(&self) -> Option<&str> {
        self.consumer_name.as_deref()
    }

    /// How long a subscription lasts before the reader renews it; `None`
    /// lets the service end it (after 5 minutes on AWS).
    pub fn subscription_lifetime(&self) -> Option<Duration> {
        self.subscription_lifetime
    }

    /// How long opening a shard waits for the consumer to become ACTIVE.
    pub fn consumer_active_timeout(&self) -> Duration {
        self.consumer_active_timeout
    }

    /// Most batches received ahead of the processor.
    pub fn max_buffered_batches(&self) -> usize {
        self.max_buffered_batches
    }

    /// Most payload bytes received ahead of the processor.
    pub fn max_buffered_bytes(&self) -> usize {
        self.max_buffered_bytes
    }

    /// How often a caught-up reader checks whether its shard was closed,
    /// for endpoints that never announce the end; `None` never checks.
    pub fn closed_shard_check_interval(&self) -> Option<Duration> {
        self.closed_shard_check_interval
    }

    /// How long a subscription may deliver no event at all before it is
    /// taken for dead and replaced.
    pub fn event_timeout(&self) -> Duration {
        self.event_timeout
    }

    /// What happens to the consumer at shutdown.
    pub fn deregister(&self) -> DeregisterConsumer {
        self.deregister
    }

    /// The same settings with `name` as the consumer name, validated. For
    /// callers that fill in a default (the `kcl` facade uses the
    /// application name).
    pub fn with_consumer_name(mut self, name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        validate_consumer_name(&name)?;
        self.consumer_name = Some(name);
        Ok(self)
    }

    /// How fan-out's calls are retried: subscriptions, and the stream
    /// consumer's lookup and registration (not the polling settings').
    pub(crate) fn retry_policy(&self) -> RetryPolicy {
        self.retry.policy(CONTROL_CALL_TIMEOUT)
    }

    /// Delays between retries of a failed subscription: exponential, capped,
    /// with jitter so that many shards failing together do not retry in step.
    pub(crate) fn backoff(&self) -> Pauses {
        self.retry_policy().backoff.pauses()
    }
}

fn validate_consumer_name(name: &str) -> Result<(), ConfigError> {
    let valid = (1..=MAX_CONSUMER_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(ConfigError {
            field: "consumer_name",
            reason: format!(
                "is {name:?}; a stream consumer name is 1-{MAX_CONSUMER_NAME_LEN} characters of a-z, A-Z, 0-9, '_', '-', '.'"
            ),
        })
    }
}

/// Builds a [`FanOutConfig`].
#[derive(Debug, Clone)]
pub struct FanOutConfigBuilder {
    config: FanOutConfig,
}

impl FanOutConfigBuilder {
    /// The stream consumer to register (or reuse) and subscribe through.
    /// All workers of one application must use the same name. Required
    /// when the source is built directly; the `kcl` facade defaults it to
    /// the application name.
    pub fn consumer_name(mut self, name: impl Into<String>) -> Self {
        self.config.consumer_name = Some(name.into());
        self
    }

    kcl_core::setters!(self.config {
        /// Renew each subscription after this long (default: never; the
        /// service ends it after 5 minutes and the reader resubscribes).
        /// Tests set a few seconds to exercise resubscription.
        subscription_lifetime(lifetime: Duration) = Some(lifetime),

        /// How long opening a shard waits for a new consumer to become ACTIVE
        /// (default 120 s).
        consumer_active_timeout(timeout: Duration),

        /// Most batches received ahead of the processor (default 4). When
        /// they are all waiting, the reader stops reading the event stream and
        /// the transport's flow control slows the service down.
        max_buffered_batches(n: usize),

        /// Most payload bytes received ahead of the processor (default 8 MiB).
        /// A single event larger than this still passes, alone.
        max_buffered_bytes(n: usize),
    });

    crate::calls::retry::retry_setters!(
        "a failed subscription",
        /// Consecutive transient failures (timeouts, 5xx, dropped connections)
        /// after which the reader reports
        /// [`kcl_core::source::SourceError::Retryable`]; it keeps
        /// resubscribing after that (default 10). Throttling, and another
        /// subscription still holding the shard, are waited out without being
        /// reported.
    );

    kcl_core::setters!(self.config {
        /// How often a caught-up reader checks (with one `GetShardIterator`
        /// and one `GetRecords`) whether its shard was closed, or `None` to
        /// never check (the default). Kinesis announces the end of a shard in
        /// the last event, so AWS does not need it; emulators that never
        /// announce it (kinesis-mock) do, to follow a reshard. Each check
        /// spends two of the five polling calls per second the shard allows
        /// all of its readers: every 30 s, that is about 1% of that quota.
        /// An event with neither a continuation nor children (no end
        /// Kinesis sends) runs the check whatever this says, at most once
        /// per this interval (30 s when `None`): the shard ends only if it
        /// is found closed.
        closed_shard_check_interval(interval: Option<Duration>),

        /// How long a subscription may deliver no event (not even an empty
        /// one) before the reader takes its connection for dead, drops it and
        /// subscribes again after the last event (default 30 s, at least 1 s).
        /// A connection can die without a reset (a NAT or load balancer
        /// forgetting it); without this bound the reader would wait forever
        /// while its lease stays renewed.
        event_timeout(timeout: Duration),

        /// What happens to the consumer at shutdown (default: it stays; see
        /// [`DeregisterConsumer`] for why).
        deregister(deregister: DeregisterConsumer),
    });

    /// Validates the settings.
    pub fn build(self) -> Result<FanOutConfig, ConfigError> {
        let c = self.config;
        let err = |field, reason: String| Err(ConfigError { field, reason });
        if let Some(name) = &c.consumer_name {
            validate_consumer_name(name)?;
        }
        kcl_core::config::each_at_most_max(&[
            ("subscription_lifetime", c.subscription_lifetime),
            ("event_timeout", Some(c.event_timeout)),
            ("consumer_active_timeout", Some(c.consumer_active_timeout)),
            ("closed_shard_check_interval", c.closed_shard_check_interval),
        ])?;
        if let Some(lifetime) = c.subscription_lifetime
            && lifetime < Duration::from_secs(1)
        {
            return err(
                "subscription_lifetime",
                format!(
                    "is {lifetime:?}; Kinesis allows one subscription per second per shard, so it must be at least 1 s"
                ),
            );
        }
        if c.event_timeout < Duration::from_secs(1) {
            return err(
                "event_timeout",
                format!(
                    "is {:?}; it must be at least 1 s (Kinesis sends an event every few seconds)",
                    c.event_timeout
                ),
            );
        }
        if c.consumer_active_timeout.is_zero() {
            return err("consumer_active_timeout", "must be above zero".into());
        }
        kcl_core::config::count_in(
            "max_buffered_batches",
            c.max_buffered_batches,
            MAX_BUFFERED_BATCHES,
        )?;
        validate_reader_bytes("max_buffered_bytes", c.max_buffered_bytes)?;
        c.retry.validate("failed subscriptions")?;
        if c.closed_shard_check_interval.is_some_and(|d| d.is_zero()) {
            return err(
                "closed_shard_check_interval",
                "must be above zero (or None to never check)".into(),
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
        let c = FanOutConfig::builder().build().expect("defaults");
        assert_eq!(c, FanOutConfig::default());
        assert_eq!(c.subscription_lifetime(), None);
        assert_eq!(c.deregister(), DeregisterConsumer::Never);
        assert_eq!(c.consumer_name(), None);
        assert_eq!(c.closed_shard_check_interval(), None);
        assert_eq!(c.event_timeout(), Duration::from_secs(30));
    }

    #[test]
    fn invalid_settings_name_their_field() {
        let cases: Vec<(FanOutConfigBuilder, &str)> = vec![
            (FanOutConfig::builder().consumer_name(""), "consumer_name"),
            (
                FanOutConfig::builder().consumer_name("has space"),
                "consumer_name",
            ),
            (
                FanOutConfig::builder().consumer_name("x".repeat(129)),
                "consumer_name",
            ),
            (
                FanOutConfig::builder().subscription_lifetime(Duration::from_millis(500)),
                "subscription_lifetime",
            ),
            (
                FanOutConfig::builder().consumer_active_timeout(Duration::ZERO),
                "consumer_active_timeout",
            ),
            (
                FanOutConfig::builder().event_timeout(Duration::from_millis(999)),
                "event_timeout",
            ),
            (
                FanOutConfig::builder().max_buffered_batches(0),
                "max_buffered_batches",
            ),
            // Past what a channel can hold: it panicked at every open.
            (
                FanOutConfig::builder().max_buffered_batches(usize::MAX),
                "max_buffered_batches",
            ),
            (
                FanOutConfig::builder().consumer_active_timeout(Duration::MAX),
                "consumer_active_timeout",
            ),
            (
                FanOutConfig::builder().max_buffered_bytes(0),
                "max_buffered_bytes",
            ),
            (
                FanOutConfig::builder().retry_min_delay(Duration::ZERO),
                "retry_min_delay",
            ),
            (
                FanOutConfig::builder()
                    .retry_min_delay(Duration::from_secs(2))
                    .retry_max_delay(Duration::from_secs(1)),
                "retry_max_delay",
            ),
            (
                FanOutConfig::builder().closed_shard_check_interval(Some(Duration::ZERO)),
                "closed_shard_check_interval",
            ),
        ];
        assert_each_names_its_field(cases, FanOutConfigBuilder::build);
    }

    #[test]
    fn a_default_consumer_name_is_validated_too() {
        let c = FanOutConfig::default();
        assert_eq!(
            c.clone()
                .with_consumer_name("my-app.v2")
                .expect("valid")
                .consumer_name(),
            Some("my-app.v2")
        );
        let e = c.with_consumer_name("my app").expect_err("space");
        assert_eq!(e.field, "consumer_name");
    }
}
