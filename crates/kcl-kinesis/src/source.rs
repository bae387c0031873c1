//! [`KinesisShardSource`]: shard discovery and readers on Kinesis.

use std::sync::Arc;

use async_trait::async_trait;
use kcl_core::source::{OpenShard, ShardInfo, ShardReader, ShardSource, SourceError};

use crate::budget::DEFAULT_PREFETCH_BUDGET;
use crate::calls::{KinesisApi, Shared};
use crate::discovery::{list_all, shard_info};
use crate::fanout::{FanOut, FanOutApi, FanOutConfig, FanOutReader};
use crate::polling::PollingReader;
use crate::polling::{ConfigError, PollingConfig};
use crate::stats::{SourceSnapshot, SourceStats};

/// The smallest worker-wide prefetch budget a source accepts.
const MIN_PREFETCH_BUDGET: usize = 1024 * 1024;

/// Most shards one `ListShards` call may return (a Kinesis limit).
pub const MAX_LIST_SHARDS_RESULTS: i32 = 10_000;

/// How readers get records.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retrieval {
    /// `GetRecords` in a loop (the default): shares the shard's 2 MB/s and
    /// five reads per second with every other polling application.
    Polling(PollingConfig),
    /// Enhanced fan-out: `SubscribeToShard` through a registered stream
    /// consumer, with its own 2 MB/s per shard and records pushed as they
    /// arrive.
    FanOut(FanOutConfig),
}

impl Default for Retrieval {
    fn default() -> Self {
        Retrieval::Polling(PollingConfig::default())
    }
}

/// A [`ShardSource`] on Amazon Kinesis: `ListShards` for discovery and
/// lineage, polling `GetRecords` or enhanced fan-out readers (see
/// [`Retrieval`]).
///
/// Cloning shares the client, the settings and the [`SourceStats`].
#[derive(Debug, Clone)]
pub struct KinesisShardSource {
    pub(crate) shared: Shared,
    /// The settings of polling readers (and, in `shared`, of the calls
    /// every reader makes).
    polling: PollingConfig,
    /// Set in fan-out mode.
    fanout: Option<Arc<FanOut>>,
}

impl KinesisShardSource {
    /// A source with default settings on `client` (build the client from
    /// an `aws_config::SdkConfig`; endpoints and credentials come from it).
    /// The source uses a copy of the client with the SDK's retries turned
    /// off: it retries every call itself.
    pub fn new(client: aws_sdk_kinesis::Client) -> Self {
        KinesisShardSource {
            shared: Shared::new(
                Arc::new(one_retry_layer(&client)),
                PollingConfig::default().retry_policy(),
                None,
                DEFAULT_PREFETCH_BUDGET,
            ),
            polling: PollingConfig::default(),
            fanout: None,
        }
    }

    /// A builder for a source with non-default settings.
    pub fn builder(client: aws_sdk_kinesis::Client) -> KinesisShardSourceBuilder {
        let client = one_retry_layer(&client);
        KinesisShardSourceBuilder {
            fanout_api: Some(Arc::new(client.clone())),
            fan_out: None,
            api: Arc::new(client),
            polling: PollingConfig::default(),
            max_results: None,
            prefetch_budget: DEFAULT_PREFETCH_BUDGET,
            #[cfg(any(test, feature = "test-util"))]
            faults: None,
        }
    }

    /// The counters of this source and all its readers.
    pub fn stats(&self) -> SourceSnapshot {
        self.shared.stats.snapshot()
    }

    /// The live counters, for reading them after the source was handed to
    /// a worker.
    pub fn stats_handle(&self) -> Arc<SourceStats> {
        Arc::clone(&self.shared.stats)
    }

    /// The polling settings readers use.
    pub fn polling_config(&self) -> &PollingConfig {
        &self.polling
    }

    /// How readers get records.
    pub fn retrieval(&self) -> Retrieval {
        match &self.fanout {
            Some(fanout) => Retrieval::FanOut(fanout.config.clone()),
            None => Retrieval::Polling(self.polling.clone()),
        }
    }

    /// Call once the worker using this source stopped. In fan-out mode
    /// with [`crate::DeregisterConsumer::OnShutdown`], deregisters the
    /// stream consumers the readers used and returns how many; otherwise
    /// does nothing.
    pub async fn shutdown(&self) -> Result<usize, SourceError> {
        match &self.fanout {
            Some(fanout) => fanout.shutdown(&self.shared).await,
            None => Ok(0),
        }
    }

    /// A polling source on an in-memory [`FakeKinesis`](crate::fake::FakeKinesis)
    /// (feature `test-util`), for benchmarks and tests that need more
    /// shards than an emulator holds. Fan-out is not available on it.
    #[cfg(any(test, feature = "test-util"))]
    pub fn on_fake(fake: Arc<crate::fake::FakeKinesis>) -> KinesisShardSourceBuilder {
        KinesisShardSourceBuilder {
            api: fake,
            fanout_api: None,
            fan_out: None,
            polling: PollingConfig::default(),
            max_results: None,
            prefetch_budget: DEFAULT_PREFETCH_BUDGET,
            faults: None,
        }
    }

    /// [`KinesisShardSource::on_fake`] with fan-out available: choose it
    /// with [`KinesisShardSourceBuilder::retrieval`]. Subscriptions are
    /// served in memory from the same fake (feature `test-util`), for
    /// benchmarks with more shards than an emulator holds.
    #[cfg(any(test, feature = "test-util"))]
    pub fn on_fake_fan_out(fake: Arc<crate::fake::FakeKinesis>) -> KinesisShardSourceBuilder {
        let fanout = crate::test_util::fanout::FakeFanOut::new(Arc::clone(&fake));
        KinesisShardSourceBuilder {
            fanout_api: Some(Arc::new(fanout)),
            ..Self::on_fake(fake)
        }
    }

    /// A fan-out source on fakes, for unit tests.
    #[cfg(test)]
    pub(crate) fn with_fan_out(
        api: Arc<dyn KinesisApi>,
        fanout_api: Arc<dyn FanOutApi>,
        config: FanOutConfig,
    ) -> Self {
        let name = config.consumer_name().unwrap_or("test-consumer").to_owned();
        KinesisShardSource {
            shared: Shared::new(
                api,
                PollingConfig::default().retry_policy(),
                None,
                DEFAULT_PREFETCH_BUDGET,
            ),
            polling: PollingConfig::default(),
            fanout: Some(Arc::new(FanOut::new(config, name, fanout_api))),
        }
    }

    /// A source on any [`KinesisApi`], for unit tests.
    #[cfg(test)]
    pub(crate) fn with_api(api: Arc<dyn KinesisApi>, polling: PollingConfig) -> Self {
        KinesisShardSource {
            shared: Shared::new(api, polling.retry_policy(), None, DEFAULT_PREFETCH_BUDGET),
            polling,
            fanout: None,
        }
    }
}

/// The same client with the SDK's retries turned off: kcl retries every
/// Kinesis call itself (`calls::retry`), with a policy per call, counting
/// every attempt and throttle. The SDK's standard retry under it would
/// multiply the delays, hide throttles from the counters and share one
/// token bucket across every shard.
fn one_retry_layer(client: &aws_sdk_kinesis::Client) -> aws_sdk_kinesis::Client {
    let config = client
        .config()
        .to_builder()
        .retry_config(aws_sdk_kinesis::config::retry::RetryConfig::disabled())
        .build();
    aws_sdk_kinesis::Client::from_conf(config)
}

/// Builds a [`KinesisShardSource`].
#[derive(Debug)]
pub struct KinesisShardSourceBuilder {
    api: Arc<dyn KinesisApi>,
    /// `None` on the in-memory fake, which has no fan-out.
    fanout_api: Option<Arc<dyn FanOutApi>>,
    fan_out: Option<FanOutConfig>,
    polling: PollingConfig,
    max_results: Option<i32>,
    prefetch_budget: usize,
    #[cfg(any(test, feature = "test-util"))]
    faults: Option<crate::faults::FaultInjector>,
}

impl KinesisShardSourceBuilder {
    kcl_core::setters!(self {
        /// Shards per `ListShards` page, 1 to 10 000 (default: the service's,
        /// 1000). Small pages are for tests of pagination.
        max_results(n: i32) = Some(n),

        /// Most bytes all readers of this source (one worker's shards)
        /// together hold ahead of their processors: fetched records not yet
        /// handed out, and the responses of polling calls in flight (default
        /// 1 GiB, at least 1 MiB). Each reader's own budget
        /// ([`PollingConfigBuilder::max_prefetch_bytes`],
        /// [`crate::FanOutConfigBuilder::max_buffered_bytes`]) still applies.
        ///
        /// Every `GetRecords` in flight reserves the most its response can hold
        /// (about 16 MiB at the default `max_records`), so a budget of B lets
        /// B / 16 MiB calls run at once (64 at the default): enough for
        /// thousands of idle shards at a call a second each. A fan-out reader
        /// reserves its own `max_buffered_bytes` (8 MiB by default) before it
        /// reads an event, so B / `max_buffered_bytes` subscriptions read at
        /// once (128 at the defaults); a worker with more fan-out shards than
        /// that needs a larger budget or a smaller `max_buffered_bytes`, or its
        /// shards take turns. A batch holding more than it reserved (a KPL
        /// aggregate's expansion) is over by the difference while nothing is
        /// free: at most B / R such batches at once, for a reservation R.
        ///
        /// [`PollingConfigBuilder::max_prefetch_bytes`]: crate::PollingConfigBuilder::max_prefetch_bytes
        prefetch_budget(bytes: usize),
    });

    /// How readers poll (and polling rather than fan-out).
    pub fn polling(mut self, polling: PollingConfig) -> Self {
        self.polling = polling;
        self.fan_out = None;
        self
    }

    /// How readers get records (default: polling with default settings).
    /// Fan-out needs a consumer name.
    pub fn retrieval(mut self, retrieval: Retrieval) -> Self {
        match retrieval {
            Retrieval::Polling(polling) => return self.polling(polling),
            Retrieval::FanOut(fan_out) => self.fan_out = Some(fan_out),
        }
        self
    }

    /// Routes every Kinesis call through `faults` first (tests only).
    #[cfg(any(test, feature = "test-util"))]
    pub fn fault_injector(mut self, faults: crate::faults::FaultInjector) -> Self {
        self.faults = Some(faults);
        self
    }

    /// Validates the settings.
    pub fn build(self) -> Result<KinesisShardSource, ConfigError> {
        if self.prefetch_budget > tokio::sync::Semaphore::MAX_PERMITS {
            return Err(ConfigError {
                field: "prefetch_budget",
                reason: format!(
                    "is {} bytes; it must be at most {} (the most a budget can count)",
                    self.prefetch_budget,
                    tokio::sync::Semaphore::MAX_PERMITS
                ),
            });
        }
        if self.prefetch_budget < MIN_PREFETCH_BUDGET {
            return Err(ConfigError {
                field: "prefetch_budget",
                reason: format!(
                    "is {} bytes; it must be at least {MIN_PREFETCH_BUDGET} (1 MiB)",
                    self.prefetch_budget
                ),
            });
        }
        if let Some(n) = self.max_results
            && !(1..=MAX_LIST_SHARDS_RESULTS).contains(&n)
        {
            return Err(ConfigError {
                field: "max_results",
                reason: format!("is {n}; ListShards accepts 1 to {MAX_LIST_SHARDS_RESULTS}"),
            });
        }
        #[cfg(any(test, feature = "test-util"))]
        let api: Arc<dyn KinesisApi> = match self.faults {
            Some(faults) => Arc::new(crate::faults::Faulty {
                inner: self.api,
                faults,
            }),
            None => self.api,
        };
        #[cfg(not(any(test, feature = "test-util")))]
        let api = self.api;
        let fanout = match self.fan_out {
            Some(config) => {
                let Some(name) = config.consumer_name().map(str::to_owned) else {
                    return Err(ConfigError {
                        field: "consumer_name",
                        reason: "is not set; enhanced fan-out subscribes through a named stream consumer (the kcl facade uses the application name)".into(),
                    });
                };
                let Some(fanout_api) = self.fanout_api else {
                    return Err(ConfigError {
                        field: "retrieval",
                        reason:
                            "enhanced fan-out needs a Kinesis client; the in-memory fake only polls"
                                .into(),
                    });
                };
                Some(Arc::new(FanOut::new(config, name, fanout_api)))
            }
            None => None,
        };
        Ok(KinesisShardSource {
            shared: Shared::new(
                api,
                self.polling.retry_policy(),
                self.max_results,
                self.prefetch_budget,
            ),
            polling: self.polling,
            fanout,
        })
    }
}

#[async_trait]
impl ShardSource for KinesisShardSource {
    async fn list_shards(&self, stream: &str) -> Result<Vec<ShardInfo>, SourceError> {
        let shards = list_all(&self.shared, stream, None).await?;
        Ok(shards.into_iter().map(|s| shard_info(stream, s)).collect())
    }

    async fn open(&self, request: OpenShard) -> Result<Box<dyn ShardReader>, SourceError> {
        if let Some(fanout) = &self.fanout {
            let reader =
                FanOutReader::open(self.shared.clone(), Arc::clone(fanout), request).await?;
            return Ok(Box::new(reader));
        }
        let reader =
            PollingReader::open(self.shared.clone(), self.polling.clone(), request).await?;
        Ok(Box::new(reader))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_rejects_bad_page_sizes() {
        let client = crate::test_util::offline_client();
        for bad in [0, -1, 10_001] {
            let err = KinesisShardSource::builder(client.clone())
                .max_results(bad)
                .build()
                .expect_err("bad page size");
            assert_eq!(err.field, "max_results");
        }
        assert!(
            KinesisShardSource::builder(client)
                .max_results(2)
                .build()
                .is_ok()
        );
    }
}
