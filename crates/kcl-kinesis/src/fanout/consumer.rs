//! The stream consumer every fan-out reader subscribes through: found or
//! registered once per stream, shared by all readers of the source.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use aws_sdk_kinesis::operation::describe_stream_consumer::DescribeStreamConsumerOutput;
use aws_sdk_kinesis::types::ConsumerStatus;
use kcl_core::backoff::Backoff;
use kcl_core::metric_names::KINESIS_FANOUT_CONSUMERS_REGISTERED;
use kcl_core::source::SourceError;
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::api::{FanOutApi, IN_USE};
use super::config::{DeregisterConsumer, FanOutConfig};
use crate::calls::Shared;
use crate::calls::classify::{Class, Classified, classify};
use crate::calls::retry::{Failure, Op, retrying};

/// How often a consumer that is not ACTIVE yet is described again: from
/// 100 ms, doubling up to 2 s. Registration takes seconds on AWS and a
/// fraction of one on the emulators.
const STATUS_POLL: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).without_jitter();

/// Fan-out settings, the calls, and the consumer of each stream, shared by
/// the source and all its readers.
#[derive(Debug)]
pub(crate) struct FanOut {
    pub(crate) config: FanOutConfig,
    pub(crate) api: Arc<dyn FanOutApi>,
    /// The consumer name (validated when the source was built).
    name: String,
    /// One cell per stream, so that concurrent opens of one stream's
    /// shards wait for a single registration.
    consumers: Mutex<HashMap<String, Arc<ConsumerCell>>>,
}

/// A stream's consumer: its ARN once found, and the outcome of the last
/// attempt, which opens waiting on it share.
#[derive(Debug, Default)]
struct ConsumerCell {
    arn: OnceCell<String>,
    /// Held by the open finding the consumer; the failure it met, and
    /// when, for the opens that waited on it.
    attempt: tokio::sync::Mutex<Option<(Instant, SourceError)>>,
}

impl FanOut {
    pub(crate) fn new(config: FanOutConfig, name: String, api: Arc<dyn FanOutApi>) -> Self {
        FanOut {
            config,
            api,
            name,
            consumers: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<ConsumerCell>>> {
        self.consumers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ARN of `stream`'s consumer, ACTIVE: looked up (or registered
    /// and waited for) on the first call per stream, remembered after.
    /// Opens that waited on a failed attempt fail with it: one after the
    /// other, each waiting out its own, the k-th open of a consumer that
    /// never became ACTIVE failed only after k times the timeout.
    pub(crate) async fn consumer_arn(
        &self,
        shared: &Shared,
        stream: &str,
    ) -> Result<String, SourceError> {
        let cell = Arc::clone(self.lock().entry(stream.to_owned()).or_default());
        if let Some(arn) = cell.arn.get() {
            return Ok(arn.clone());
        }
        let asked = Instant::now();
        let mut attempt = cell.attempt.lock().await;
        if let Some(arn) = cell.arn.get() {
            return Ok(arn.clone());
        }
        if let Some((at, failure)) = attempt.as_ref()
            && *at >= asked
        {
            return Err(shared_failure(failure));
        }
        match self.ensure(shared, stream).await {
            Ok(arn) => {
                // Only this open sets it, under the attempt's lock.
                let _ = cell.arn.set(arn.clone());
                Ok(arn)
            }
            Err(e) => {
                *attempt = Some((Instant::now(), shared_failure(&e)));
                Err(e)
            }
        }
    }

    /// Forgets `stream`'s consumer if it is still `arn`, so the next open
    /// looks it up again (after the service said it does not exist).
    pub(crate) fn forget(&self, stream: &str, arn: &str) {
        let mut consumers = self.lock();
        if consumers
            .get(stream)
            .and_then(|cell| cell.arn.get())
            .is_some_and(|known| known == arn)
        {
            consumers.remove(stream);
        }
    }

    /// Whether `arn` is still `stream`'s consumer, ACTIVE. A subscription
    /// answers `ResourceNotFound` for a missing shard as for a missing
    /// consumer; only the consumer's own description tells them apart.
    pub(crate) async fn is_registered(
        &self,
        shared: &Shared,
        stream: &str,
        arn: &str,
    ) -> Result<bool, SourceError> {
        // A consumer's ARN is its stream's ARN, `/consumer/`, its name and
        // creation time: no call is needed for the stream's.
        let Some((stream_arn, _)) = arn.split_once("/consumer/") else {
            return Ok(false);
        };
        let described = self.describe(shared, stream, stream_arn).await;
        match described {
            Ok(out) => Ok(out.consumer_description.is_some_and(|c| {
                c.consumer_arn == arn && c.consumer_status == ConsumerStatus::Active
            })),
            Err(Failure::Classified(c)) if c.class == Class::NotFound => Ok(false),
            Err(f) => Err(self.error(stream, f, "describing the stream consumer")),
        }
    }

    /// Deregisters the consumers this source used, if configured to.
    /// Returns how many it deregistered.
    pub(crate) async fn shutdown(&self, shared: &Shared) -> Result<usize, SourceError> {
        if self.config.deregister != DeregisterConsumer::OnShutdown {
            return Ok(0);
        }
        let known: Vec<(String, String)> = self
            .lock()
            .drain()
            .filter_map(|(stream, cell)| cell.arn.get().map(|arn| (stream, arn.clone())))
            .collect();
        let mut done = 0;
        for (stream, arn) in known {
            let out = self
                .consumer_call(shared, Op::DeregisterStreamConsumer, &stream, || {
                    let arn = arn.as_str();
                    async move {
                        self.api
                            .deregister_stream_consumer(arn)
                            .await
                            .map_err(classify)
                    }
                })
                .await;
            match out {
                Ok(_) => {
                    info!(%stream, consumer = %self.name, "stream consumer deregistered");
                    done += 1;
                }
                // Someone else deregistered it already.
                Err(Failure::Classified(c)) if c.class == Class::NotFound => {}
                Err(f) => return Err(self.error(&stream, f, "deregistering the stream consumer")),
            }
        }
        Ok(done)
    }

    /// Finds or registers the consumer and waits until it is ACTIVE.
    async fn ensure(&self, shared: &Shared, stream: &str) -> Result<String, SourceError> {
        let timeout = self.config.consumer_active_timeout;
        let deadline = Instant::now() + timeout;
        let stream_arn = self.stream_arn(shared, stream).await?;
        let mut polls = STATUS_POLL.pauses();
        let mut last_status: Option<ConsumerStatus> = None;
        loop {
            let described = self.describe(shared, stream, &stream_arn).await;
            match described {
                Ok(out) => {
                    if let Some(c) = out.consumer_description {
                        if c.consumer_status == ConsumerStatus::Active {
                            info!(%stream, consumer = %self.name, arn = %c.consumer_arn,
                                "using stream consumer");
                            return Ok(c.consumer_arn);
                        }
                        debug!(%stream, consumer = %self.name, status = c.consumer_status.as_str(),
                            "waiting for the stream consumer");
                        last_status = Some(c.consumer_status);
                    }
                }
                Err(Failure::Classified(c)) if c.class == Class::NotFound => {
                    self.register(shared, stream, &stream_arn).await?;
                }
                Err(f) => return Err(self.error(stream, f, "describing the stream consumer")),
            }
            if Instant::now() >= deadline {
                return Err(SourceError::Fatal {
                    stream: stream.to_owned(),
                    message: format!(
                        "stream consumer {:?} is not ACTIVE after {timeout:?} (status: {}); raise `consumer_active_timeout` or check the consumer with DescribeStreamConsumer",
                        self.name,
                        last_status
                            .as_ref()
                            .map_or("not registered", ConsumerStatus::as_str)
                    ),
                    source: None,
                });
            }
            tokio::time::sleep(polls.next_or_max().min(deadline - Instant::now())).await;
        }
    }

    /// Registers the consumer. Another worker registering the same name at
    /// the same moment is not an error: either way the consumer exists
    /// (or is on its way), and the caller waits for it to be ACTIVE.
    async fn register(
        &self,
        shared: &Shared,
        stream: &str,
        stream_arn: &str,
    ) -> Result<(), SourceError> {
        let out = self
            .consumer_call(shared, Op::RegisterStreamConsumer, stream, || {
                async move {
                    self.api
                        .register_stream_consumer(stream_arn, &self.name)
                        .await
                        .map_err(|e| {
                            let mut c = classify(e);
                            // In use means registered by someone else (or
                            // being deleted): a fact to act on, not a
                            // failure to retry.
                            if c.code.as_deref() == Some(IN_USE) {
                                c.class = Class::Fatal;
                            }
                            c
                        })
                }
            })
            .await;
        match out {
            Ok(_) => {
                info!(%stream, consumer = %self.name, "registered stream consumer");
                metrics::counter!(
                    KINESIS_FANOUT_CONSUMERS_REGISTERED,
                    "stream" => stream.to_owned()
                )
                .increment(1);
                Ok(())
            }
            Err(Failure::Classified(c)) if c.code.as_deref() == Some(IN_USE) => {
                debug!(%stream, consumer = %self.name,
                    "stream consumer registered by another worker (or being deleted)");
                Ok(())
            }
            Err(f) => Err(self.error(stream, f, "registering the stream consumer")),
        }
    }

    async fn stream_arn(&self, shared: &Shared, stream: &str) -> Result<String, SourceError> {
        let out = self
            .consumer_call(shared, Op::DescribeStreamSummary, stream, || async move {
                self.api
                    .describe_stream_summary(stream)
                    .await
                    .map_err(classify)
            })
            .await;
        match out {
            Ok(out) => match out.stream_description_summary {
                Some(summary) if !summary.stream_arn.is_empty() => Ok(summary.stream_arn),
                _ => Err(SourceError::Fatal {
                    stream: stream.to_owned(),
                    message: "DescribeStreamSummary returned no stream ARN".to_owned(),
                    source: None,
                }),
            },
            Err(Failure::Classified(c)) if c.class == Class::NotFound => {
                Err(SourceError::StreamNotFound {
                    stream: stream.to_owned(),
                })
            }
            Err(f) => Err(self.error(stream, f, "describing the stream")),
        }
    }

    /// A stream-consumer call, counted and retried with the fan-out policy;
    /// without a lease, as consumers are looked after outside any reader.
    async fn consumer_call<T, F, Fut>(
        &self,
        shared: &Shared,
        op: Op,
        stream: &str,
        mut call: F,
    ) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Classified>>,
    {
        retrying(
            shared,
            &self.config.retry_policy(),
            op,
            stream,
            None,
            || {
                shared.stats.consumer_call();
                call()
            },
        )
        .await
    }

    /// `DescribeStreamConsumer` of this source's consumer of the stream
    /// `stream_arn` (`stream` names it in metrics and errors).
    async fn describe(
        &self,
        shared: &Shared,
        stream: &str,
        stream_arn: &str,
    ) -> Result<DescribeStreamConsumerOutput, Failure> {
        self.consumer_call(shared, Op::DescribeStreamConsumer, stream, || async move {
            self.api
                .describe_stream_consumer(stream_arn, &self.name)
                .await
                .map_err(classify)
        })
        .await
    }

    fn error(&self, stream: &str, failure: Failure, what: &str) -> SourceError {
        match failure {
            Failure::LeaseLost => SourceError::Fatal {
                stream: stream.to_owned(),
                message: format!("{what}: unexpected lease loss"),
                source: None,
            },
            Failure::Exhausted(c) => {
                warn!(%stream, consumer = %self.name, error = %c.error, "{what} keeps failing");
                SourceError::Retryable {
                    stream: stream.to_owned(),
                    shard: format!("consumer {}", self.name),
                    source: c.error,
                }
            }
            Failure::Classified(Classified { code, error, .. }) => SourceError::Fatal {
                stream: stream.to_owned(),
                message: format!(
                    "{what} {:?} failed ({})",
                    self.name,
                    code.as_deref().unwrap_or("no error code")
                ),
                source: Some(error),
            },
        }
    }
}

/// The failure of an attempt to find a consumer, for an open that waited
/// on it: the same kind and text (the error itself is not `Clone`).
fn shared_failure(e: &SourceError) -> SourceError {
    match e {
        SourceError::StreamNotFound { stream } => SourceError::StreamNotFound {
            stream: stream.clone(),
        },
        SourceError::LeaseLost { shard } => SourceError::LeaseLost {
            shard: shard.clone(),
        },
        SourceError::Retryable {
            stream,
            shard,
            source,
        } => SourceError::Retryable {
            stream: stream.clone(),
            shard: shard.clone(),
            source: source.to_string().into(),
        },
        SourceError::Fatal {
            stream,
            message,
            source,
        } => SourceError::Fatal {
            stream: stream.clone(),
            message: message.clone(),
            source: source.as_ref().map(|s| s.to_string().into()),
        },
        other => SourceError::Fatal {
            stream: String::new(),
            message: other.to_string(),
            source: None,
        },
    }
}
