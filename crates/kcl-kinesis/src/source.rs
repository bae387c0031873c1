//! [`KinesisShardSource`]: shard discovery and readers on Kinesis.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_kinesis::types::{Shard, ShardFilter, ShardFilterType};
use kcl_core::HashKeyRange;
use kcl_core::leases::LeaseHandle;
use kcl_core::source::{ChildShard, OpenShard, ShardInfo, ShardReader, ShardSource, SourceError};
use tracing::{debug, warn};

use crate::api::{KinesisApi, ListShardsPage};
use crate::config::PollingConfig;
use crate::error::{Class, Classified, ConfigError, classify};
use crate::fanout::{FanOut, FanOutApi, FanOutConfig, FanOutReader};
use crate::polling::PollingReader;
use crate::stats::{SourceStats, StatsSnapshot};

/// Most shards one `ListShards` call may return (a Kinesis limit).
pub const MAX_LIST_SHARDS_RESULTS: i32 = 10_000;

/// Most `ListShards` pages one listing follows; a `NextToken` that never
/// ends is a service bug, not a reason to loop forever.
const MAX_LIST_PAGES: usize = 100_000;

/// How often a listing restarts after its `NextToken` expired.
const MAX_LIST_RESTARTS: u32 = 3;

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
    shared: Shared,
}

/// What the source and its readers share.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub(crate) api: Arc<dyn KinesisApi>,
    pub(crate) polling: PollingConfig,
    pub(crate) max_results: Option<i32>,
    pub(crate) stats: Arc<SourceStats>,
    /// Set in fan-out mode.
    pub(crate) fanout: Option<Arc<FanOut>>,
}

impl KinesisShardSource {
    /// A source with default settings on `client` (build the client from
    /// an `aws_config::SdkConfig`; endpoints and credentials come from it).
    pub fn new(client: aws_sdk_kinesis::Client) -> Self {
        KinesisShardSource {
            shared: Shared {
                api: Arc::new(client),
                polling: PollingConfig::default(),
                max_results: None,
                stats: Arc::default(),
                fanout: None,
            },
        }
    }

    /// A builder for a source with non-default settings.
    pub fn builder(client: aws_sdk_kinesis::Client) -> KinesisShardSourceBuilder {
        KinesisShardSourceBuilder {
            fanout_api: Arc::new(client.clone()),
            fan_out: None,
            api: Arc::new(client),
            polling: PollingConfig::default(),
            max_results: None,
            #[cfg(any(test, feature = "test-util"))]
            faults: None,
        }
    }

    /// The counters of this source and all its readers.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// The live counters, for reading them after the source was handed to
    /// a worker.
    pub fn stats_handle(&self) -> Arc<SourceStats> {
        Arc::clone(&self.shared.stats)
    }

    /// The polling settings readers use.
    pub fn polling_config(&self) -> &PollingConfig {
        &self.shared.polling
    }

    /// How readers get records.
    pub fn retrieval(&self) -> Retrieval {
        match &self.shared.fanout {
            Some(fanout) => Retrieval::FanOut(fanout.config.clone()),
            None => Retrieval::Polling(self.shared.polling.clone()),
        }
    }

    /// Call once the worker using this source stopped. In fan-out mode
    /// with [`crate::DeregisterConsumer::OnShutdown`], deregisters the
    /// stream consumers the readers used and returns how many; otherwise
    /// does nothing.
    pub async fn shutdown(&self) -> Result<usize, SourceError> {
        match &self.shared.fanout {
            Some(fanout) => fanout.shutdown(&self.shared).await,
            None => Ok(0),
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
            shared: Shared {
                api,
                polling: PollingConfig::default(),
                max_results: None,
                stats: Arc::default(),
                fanout: Some(Arc::new(FanOut::new(config, name, fanout_api))),
            },
        }
    }

    /// A source on any [`KinesisApi`], for unit tests.
    #[cfg(test)]
    pub(crate) fn with_api(api: Arc<dyn KinesisApi>, polling: PollingConfig) -> Self {
        KinesisShardSource {
            shared: Shared {
                api,
                polling,
                max_results: None,
                stats: Arc::default(),
                fanout: None,
            },
        }
    }
}

/// Builds a [`KinesisShardSource`].
#[derive(Debug)]
pub struct KinesisShardSourceBuilder {
    api: Arc<dyn KinesisApi>,
    fanout_api: Arc<dyn FanOutApi>,
    fan_out: Option<FanOutConfig>,
    polling: PollingConfig,
    max_results: Option<i32>,
    #[cfg(any(test, feature = "test-util"))]
    faults: Option<crate::faults::FaultInjector>,
}

impl KinesisShardSourceBuilder {
    /// Shards per `ListShards` page, 1 to 10 000 (default: the service's,
    /// 1000). Small pages are for tests of pagination.
    pub fn max_results(mut self, n: i32) -> Self {
        self.max_results = Some(n);
        self
    }

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
                Some(Arc::new(FanOut::new(config, name, self.fanout_api)))
            }
            None => None,
        };
        Ok(KinesisShardSource {
            shared: Shared {
                api,
                polling: self.polling,
                max_results: self.max_results,
                stats: Arc::default(),
                fanout,
            },
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
        if let Some(fanout) = &self.shared.fanout {
            let reader =
                FanOutReader::open(self.shared.clone(), Arc::clone(fanout), request).await?;
            return Ok(Box::new(reader));
        }
        let reader = PollingReader::open(self.shared.clone(), request).await?;
        Ok(Box::new(reader))
    }
}

/// The children a closed shard's last response reported, or `None` when
/// they are missing or incomplete (a range absent): then `ListShards` must
/// say. Shared by the polling and fan-out readers.
pub(crate) fn reported_children(
    reported: Option<Vec<aws_sdk_kinesis::types::ChildShard>>,
) -> Option<Vec<ChildShard>> {
    reported
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            Some(ChildShard {
                hash_key_range: c.hash_key_range.map(|r| HashKeyRange {
                    starting: r.starting_hash_key,
                    ending: r.ending_hash_key,
                })?,
                shard_id: c.shard_id,
                parent_shard_ids: c.parent_shards,
            })
        })
        .collect::<Option<Vec<_>>>()
        .filter(|c| !c.is_empty())
}

/// The children of `parent` in a shard listing.
pub(crate) fn children_in(shards: Vec<ShardInfo>, parent: &str) -> Vec<ChildShard> {
    shards
        .into_iter()
        .filter(|s| s.parents().any(|p| p == parent))
        .map(|s| ChildShard {
            parent_shard_ids: s.parents().map(str::to_owned).collect(),
            shard_id: s.shard_id,
            hash_key_range: s.hash_key_range,
        })
        .collect()
}

/// The shards that follow `shard_id` (the only ones that can be its
/// children: Kinesis numbers shards in creation order), for a reader that
/// reached the end of a shard without `ChildShards` in the response.
pub(crate) async fn list_after(
    shared: &Shared,
    stream: &str,
    shard_id: &str,
) -> Result<Vec<ShardInfo>, SourceError> {
    let filter = ShardFilter::builder()
        .r#type(ShardFilterType::AfterShardId)
        .shard_id(shard_id)
        .build()
        .map_err(|e| SourceError::Fatal {
            stream: stream.to_owned(),
            message: "cannot build a ListShards filter".to_owned(),
            source: Some(Box::new(e)),
        })?;
    let shards = list_all(shared, stream, Some(filter)).await?;
    Ok(shards.into_iter().map(|s| shard_info(stream, s)).collect())
}

/// Every shard of `stream` (after `filter`), following `NextToken` to the
/// end.
async fn list_all(
    shared: &Shared,
    stream: &str,
    filter: Option<ShardFilter>,
) -> Result<Vec<Shard>, SourceError> {
    let mut restarts = 0;
    'listing: loop {
        let mut shards = Vec::new();
        let mut token: Option<String> = None;
        for page in 0..MAX_LIST_PAGES {
            let request = match &token {
                Some(token) => ListShardsPage::Next { token },
                None => ListShardsPage::First {
                    stream,
                    filter: filter.clone(),
                },
            };
            let attempt = || {
                shared.stats.list_shards_call();
                metrics::counter!(
                    "kcl_kinesis_list_shards_calls_total",
                    "stream" => stream.to_owned()
                )
                .increment(1);
                let request = request.clone();
                async move {
                    shared
                        .api
                        .list_shards(request, shared.max_results)
                        .await
                        .map_err(classify)
                }
            };
            let out = match retrying(shared, Op::ListShards, stream, None, attempt).await {
                Ok(out) => out,
                Err(Failure::Classified(c)) if c.class == Class::ExpiredNextToken => {
                    restarts += 1;
                    if restarts > MAX_LIST_RESTARTS {
                        return Err(retryable(stream, "ListShards", c.error));
                    }
                    debug!(stream, page, "ListShards NextToken expired; listing again");
                    continue 'listing;
                }
                Err(Failure::Classified(c)) if c.class == Class::NotFound => {
                    return Err(SourceError::StreamNotFound {
                        stream: stream.to_owned(),
                    });
                }
                Err(failure) => return Err(failure.into_source_error(stream, "ListShards")),
            };
            shards.extend(out.shards.unwrap_or_default());
            match out.next_token {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(shards),
            }
        }
        return Err(SourceError::Fatal {
            stream: stream.to_owned(),
            message: format!("ListShards returned a NextToken on {MAX_LIST_PAGES} pages"),
            source: None,
        });
    }
}

/// The kcl view of a listed shard.
fn shard_info(stream: &str, shard: Shard) -> ShardInfo {
    let hash_key_range = match shard.hash_key_range {
        Some(r) => HashKeyRange {
            starting: r.starting_hash_key,
            ending: r.ending_hash_key,
        },
        None => {
            // The API documents the range as always present. Without it the
            // shard is taken to cover everything: it still gets a lease and
            // is read, which is what matters.
            warn!(
                stream,
                shard = %shard.shard_id,
                "ListShards returned a shard without a hash-key range"
            );
            HashKeyRange {
                starting: "0".to_owned(),
                ending: u128::MAX.to_string(),
            }
        }
    };
    let (starting_sequence_number, ending_sequence_number) = match shard.sequence_number_range {
        Some(r) => (r.starting_sequence_number, r.ending_sequence_number),
        None => (String::new(), None),
    };
    ShardInfo {
        shard_id: shard.shard_id,
        parent_shard_id: shard.parent_shard_id.filter(|p| !p.is_empty()),
        adjacent_parent_shard_id: shard.adjacent_parent_shard_id.filter(|p| !p.is_empty()),
        hash_key_range,
        starting_sequence_number,
        ending_sequence_number,
    }
}

/// A Kinesis operation, for metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    ListShards,
    GetShardIterator,
    GetRecords,
    DescribeStreamSummary,
    DescribeStreamConsumer,
    RegisterStreamConsumer,
    DeregisterStreamConsumer,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::ListShards => "list_shards",
            Op::GetShardIterator => "get_shard_iterator",
            Op::GetRecords => "get_records",
            Op::DescribeStreamSummary => "describe_stream_summary",
            Op::DescribeStreamConsumer => "describe_stream_consumer",
            Op::RegisterStreamConsumer => "register_stream_consumer",
            Op::DeregisterStreamConsumer => "deregister_stream_consumer",
        }
    }
}

/// Why [`retrying`] gave up.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The lease was no longer valid before an attempt.
    LeaseLost,
    /// An error retrying does not fix (including an expired iterator,
    /// which the caller fixes by getting a new one).
    Classified(Classified),
    /// Transient failures (or, without a lease, throttles) went on for
    /// `max_transient_retries` attempts.
    Exhausted(Classified),
}

impl Failure {
    /// The error to hand to the caller of the source.
    pub(crate) fn into_source_error(self, stream: &str, shard: &str) -> SourceError {
        match self {
            Failure::LeaseLost => SourceError::LeaseLost {
                shard: shard.to_owned(),
            },
            Failure::Exhausted(c) => retryable(stream, shard, c.error),
            Failure::Classified(c) => SourceError::Fatal {
                stream: stream.to_owned(),
                message: match c.class {
                    Class::NotFound => format!("shard {shard} or its stream does not exist"),
                    _ => format!(
                        "{shard}: Kinesis rejected the request ({})",
                        c.code.as_deref().unwrap_or("no error code")
                    ),
                },
                source: Some(c.error),
            },
        }
    }
}

pub(crate) fn retryable(
    stream: &str,
    shard: &str,
    source: Box<dyn std::error::Error + Send + Sync>,
) -> SourceError {
    SourceError::Retryable {
        stream: stream.to_owned(),
        shard: shard.to_owned(),
        source,
    }
}

/// Makes `attempt` until it succeeds, backing off (exponential, capped,
/// jittered) after throttles and transient failures.
///
/// With a `lease`, the lease is checked before every attempt, and
/// throttling is retried for as long as the lease lasts: the service is
/// pacing this consumer, and giving up would only restart the same calls.
/// Without one (shard listing), throttles count toward the
/// `max_transient_retries` limit like any transient failure, so a sync
/// cannot hang.
pub(crate) async fn retrying<T, F, Fut>(
    shared: &Shared,
    op: Op,
    stream: &str,
    lease: Option<&LeaseHandle>,
    mut attempt: F,
) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Classified>>,
{
    let mut backoff = shared.polling.backoff();
    let mut failures: u32 = 0;
    loop {
        if lease.is_some_and(|l| !l.is_valid()) {
            return Err(Failure::LeaseLost);
        }
        let error = match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        match error.class {
            Class::Throttled => {
                shared.stats.throttle();
                metrics::counter!(
                    "kcl_kinesis_throttles_total",
                    "stream" => stream.to_owned(),
                    "call" => op.as_str()
                )
                .increment(1);
                if lease.is_none() {
                    failures += 1;
                }
            }
            Class::Transient => failures += 1,
            _ => return Err(Failure::Classified(error)),
        }
        if failures > shared.polling.max_transient_retries {
            return Err(Failure::Exhausted(error));
        }
        shared.stats.retry();
        metrics::counter!(
            "kcl_kinesis_retries_total",
            "stream" => stream.to_owned(),
            "call" => op.as_str()
        )
        .increment(1);
        let delay = backoff.next().unwrap_or(shared.polling.retry_max_delay);
        debug!(stream, call = op.as_str(), code = ?error.code, ?delay, "retrying Kinesis call");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::fake::FakeKinesis;
    use crate::faults::{Call, Fault, FaultInjector, Faulty};

    fn source(
        fake: &Arc<FakeKinesis>,
        max_results: Option<i32>,
        faults: FaultInjector,
    ) -> KinesisShardSource {
        let api: Arc<dyn KinesisApi> = Arc::new(Faulty {
            inner: Arc::clone(fake) as Arc<dyn KinesisApi>,
            faults,
        });
        let polling = PollingConfig::builder()
            .retry_min_delay(std::time::Duration::from_millis(1))
            .build()
            .expect("config");
        let mut source = KinesisShardSource::with_api(api, polling);
        source.shared.max_results = max_results;
        source
    }

    #[tokio::test(start_paused = true)]
    async fn list_follows_next_token_without_naming_the_stream() {
        let fake = Arc::new(FakeKinesis::default());
        let ids = fake.create_stream("s", 5);
        let kids = fake.split("s", &ids[1], true);
        let source = source(&fake, Some(2), FaultInjector::new());
        let shards = source.list_shards("s").await.expect("list");
        let listed: Vec<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
        let mut want: Vec<&str> = ids.iter().chain(&kids).map(String::as_str).collect();
        want.sort();
        assert_eq!(listed, want);
        let requests = fake.list_requests();
        assert_eq!(requests.len(), 4, "7 shards in pages of 2");
        assert_eq!(source.stats().list_shards_calls, 4);
        assert_eq!(requests[0].stream.as_deref(), Some("s"));
        for later in &requests[1..] {
            assert_eq!(
                later.stream, None,
                "a NextToken request must not name the stream"
            );
            assert!(later.token.is_some());
            assert_eq!(later.max_results, Some(2));
        }
        // Lineage.
        let parent = shards
            .iter()
            .find(|s| s.shard_id == ids[1])
            .expect("parent");
        assert!(parent.is_closed());
        for kid in &kids {
            let child = shards.iter().find(|s| &s.shard_id == kid).expect("child");
            assert_eq!(child.parents().collect::<Vec<_>>(), [ids[1].as_str()]);
            assert!(!child.is_closed());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn missing_stream_is_stream_not_found() {
        let fake = Arc::new(FakeKinesis::default());
        let err = source(&fake, None, FaultInjector::new())
            .list_shards("nope")
            .await
            .expect_err("missing");
        assert!(matches!(err, SourceError::StreamNotFound { stream } if stream == "nope"));
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_page_is_retried_and_expired_token_restarts_the_listing() {
        let fake = Arc::new(FakeKinesis::default());
        fake.create_stream("s", 5);
        let faults = FaultInjector::new();
        let source = source(&fake, Some(2), faults.clone());
        // Page 1 passes; page 2 is throttled, and its retry finds the token
        // expired: the listing starts over and completes in three pages.
        faults.inject_at(Call::ListShards, 2, Fault::LimitExceeded);
        faults.inject_at(Call::ListShards, 3, Fault::ExpiredNextToken);
        let shards = source.list_shards("s").await.expect("listing");
        let mut ids: Vec<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
        ids.dedup();
        assert_eq!(ids.len(), 5, "each shard once: {ids:?}");
        assert_eq!(shards.len(), 5);
        assert_eq!(faults.calls(Call::ListShards), 6);
        let stats = source.stats();
        assert_eq!((stats.throttles, stats.retries), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn persistent_failures_end_the_listing_as_retryable() {
        let fake = Arc::new(FakeKinesis::default());
        fake.create_stream("s", 1);
        let faults = FaultInjector::new();
        let source = source(&fake, None, faults.clone());
        for _ in 0..20 {
            faults.inject(Call::ListShards, Fault::InternalFailure);
        }
        let err = source.list_shards("s").await.expect_err("gives up");
        assert!(err.is_retryable(), "{err}");
    }

    #[test]
    fn builder_rejects_bad_page_sizes() {
        let client = aws_sdk_kinesis::Client::from_conf(
            aws_sdk_kinesis::Config::builder()
                .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
                .region(aws_sdk_kinesis::config::Region::new("us-east-1"))
                .build(),
        );
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
