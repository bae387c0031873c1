//! Stream names to lease layouts: the resolver that describes each stream
//! (again every [`DESCRIBED_FOR`]), and the tracker of the stream names an
//! application supplies at runtime.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_kinesis::error::SdkError;
use aws_sdk_kinesis::types::StreamStatus;
use kcl_core::LeaseLayout;
use kcl_core::source::SourceError;
use kcl_core::worker::{StreamSpec, StreamTracker};
use kcl_kinesis::StreamArn;
use tokio::time::Instant;
use tracing::warn;

use crate::error::{Error, ErrorKind, Repr};

/// The stream names an application supplies at runtime.
pub(crate) type StreamNames = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// The one place a stream name becomes a lease layout: the configured
/// streams at startup and the tracker's at every shard sync. A
/// multi-stream layout needs the Java KCL's identifier,
/// `account:stream:creationEpoch`, which Kinesis is asked for when a
/// stream is first seen and again every [`DESCRIBED_FOR`]; a single-stream
/// worker still describes its stream, so a misspelt name fails at startup.
pub(crate) struct StreamResolver {
    kinesis: aws_sdk_kinesis::Client,
    pub(crate) multi_stream: bool,
    /// Each name's identifier, and until when it is trusted.
    identifiers: Mutex<HashMap<String, (String, Instant)>>,
    /// Names not known whose describe failed, and when to try again.
    undescribed: Mutex<HashMap<String, Instant>>,
}

/// How long a stream's identifier is trusted before the stream is
/// described again: a stream deleted and created again under a name the
/// application keeps listing has a new creation epoch, and so a new lease
/// prefix, which only a new describe tells. Kept, it was read under the
/// old stream's leases and checkpoints until the process restarted.
/// Spread by up to a fifth either way for each name, so that names
/// described together are not all described again in one round.
const DESCRIBED_FOR: Duration = Duration::from_secs(300);

/// After a describe of a name failed, when it is tried again.
const DESCRIBE_RETRY: Duration = Duration::from_secs(60);

/// How long one tracker answer may spend describing: then known names keep
/// their identifiers and names not known yet wait for the next answer.
/// The tracker's whole answer is given up at 30 s, and with it every
/// change of streams: many names described one after another (each up to
/// `DESCRIBE_TIMEOUT`) froze them.
const DESCRIBE_BUDGET: Duration = Duration::from_secs(15);

impl StreamResolver {
    pub(crate) fn new(kinesis: aws_sdk_kinesis::Client, multi_stream: bool) -> Self {
        StreamResolver {
            kinesis,
            multi_stream,
            identifiers: Mutex::default(),
            undescribed: Mutex::default(),
        }
    }

    /// The identifier of `name`, if [`Self::spec`] resolved it.
    pub(crate) fn known_identifier(&self, name: &str) -> Option<String> {
        self.cached(name).map(|(id, _)| id)
    }

    /// Forgets the identifiers of every stream but `names`: an
    /// application's streams may come and go for as long as it runs, and
    /// a stream deleted and created again under its name has a new
    /// creation epoch, so a name added again is described again.
    fn retain(&self, names: &[String]) {
        self.identifiers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| names.contains(name));
        self.undescribed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| names.contains(name));
    }

    /// Whether `name`, not known, failed to be described less than
    /// [`DESCRIBE_RETRY`] ago; with `failed`, that it just did.
    fn undescribed(&self, name: &str, failed: bool) -> bool {
        let mut undescribed = self.undescribed.lock().unwrap_or_else(|e| e.into_inner());
        if failed {
            undescribed.insert(name.to_owned(), Instant::now() + DESCRIBE_RETRY);
        }
        undescribed
            .get(name)
            .is_some_and(|retry| Instant::now() < *retry)
    }

    /// The spec of `name`, described if its identifier is not known or
    /// stale.
    pub(crate) async fn spec(&self, name: &str) -> Result<StreamSpec, Error> {
        let known = self.cached(name);
        let identifier = match known {
            Some((id, until)) if Instant::now() < until => id,
            known => self.describe(name, known.map(|(id, _)| id)).await?,
        };
        Ok(self.spec_of(name, identifier))
    }

    /// The spec of `name` from its identifier known, stale or not, with no
    /// call to Kinesis.
    fn cached_spec(&self, name: &str) -> Option<StreamSpec> {
        self.cached(name).map(|(id, _)| self.spec_of(name, id))
    }

    fn cached(&self, name: &str) -> Option<(String, Instant)> {
        self.identifiers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    fn spec_of(&self, name: &str, identifier: String) -> StreamSpec {
        let layout = if self.multi_stream {
            LeaseLayout::MultiStream { identifier }
        } else {
            LeaseLayout::SingleStream
        };
        StreamSpec {
            name: name.to_owned(),
            layout,
        }
    }

    /// Describes `name` and remembers its identifier. A describe that
    /// fails keeps the one `known` (a live stream is not dropped for a
    /// passing error); a stream not found (or being deleted) is forgotten.
    async fn describe(&self, name: &str, known: Option<String>) -> Result<String, Error> {
        let described = stream_identifier(&self.kinesis, name).await;
        let mut identifiers = self.identifiers.lock().unwrap_or_else(|e| e.into_inner());
        match (described, known) {
            (Ok(id), _) => {
                let spread = DESCRIBED_FOR.mul_f64(rand::random_range(0.8..=1.2));
                identifiers.insert(name.to_owned(), (id.clone(), Instant::now() + spread));
                Ok(id)
            }
            (Err(e), Some(known)) if e.kind() != ErrorKind::StreamNotFound => {
                warn!(stream = name, error = %e, "describing the stream again failed; keeping its identifier");
                let retry = Instant::now() + DESCRIBE_RETRY;
                identifiers.insert(name.to_owned(), (known.clone(), retry));
                Ok(known)
            }
            (Err(e), _) => {
                identifiers.remove(name);
                Err(e)
            }
        }
    }
}

/// The application's stream names, resolved by the worker's
/// [`StreamResolver`] (always multi-stream: a tracker implies it).
pub(crate) struct NameTracker {
    pub(crate) names: StreamNames,
    pub(crate) resolver: Arc<StreamResolver>,
}

impl fmt::Debug for NameTracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NameTracker").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl StreamTracker for NameTracker {
    async fn streams(&self) -> Result<Vec<StreamSpec>, SourceError> {
        let mut specs = Vec::new();
        let names = (self.names)();
        self.resolver.retain(&names);
        let budget = Instant::now() + DESCRIBE_BUDGET;
        for name in names {
            if Instant::now() >= budget {
                // This answer's describing is done: a known name keeps its
                // identifier, one not known yet waits for the next answer.
                specs.extend(self.resolver.cached_spec(&name));
                continue;
            }
            // Tried again a while after it failed, not at each answer: a
            // describe that hangs took its 10 s every time, and two such
            // names spent the budget of every answer, so names listed
            // after them were never added.
            if self.resolver.undescribed(&name, false) {
                continue;
            }
            match self.resolver.spec(&name).await {
                Ok(spec) => specs.push(spec),
                // A stream not created yet is simply not consumed yet.
                Err(e) if e.kind() == ErrorKind::StreamNotFound => continue,
                // Nor one that cannot be described (access denied, another
                // region, a name Kinesis refuses): only a name not known yet
                // fails here, so no stream consumed is dropped. Failing the
                // whole answer froze every other change, removals too.
                Err(e) => {
                    warn!(stream = %name, error = %e, "not consuming a listed stream that cannot be described; trying again in a minute");
                    self.resolver.undescribed(&name, true);
                }
            }
        }
        Ok(specs)
    }
}

/// The longest one `DescribeStreamSummary` may take before it counts as
/// failed (retryably: no answer at all).
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The Java KCL's multi-stream identifier: `account:stream:creationEpoch`.
async fn stream_identifier(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
) -> Result<String, Error> {
    let arn = StreamArn::parse(stream).ok().flatten();
    let request = match &arn {
        Some(arn) => kinesis.describe_stream_summary().stream_arn(arn.as_str()),
        None => kinesis.describe_stream_summary().stream_name(stream),
    };
    // The SDK's defaults bound no call: a describe that is never answered
    // held startup (or a tracker's round) for good.
    let sent = match tokio::time::timeout(DESCRIBE_TIMEOUT, request.send()).await {
        Ok(answer) => answer,
        Err(_) => Err(SdkError::timeout_error(format!(
            "DescribeStreamSummary did not answer within {DESCRIBE_TIMEOUT:?}"
        ))),
    };
    let out = sent.map_err(|e| {
        if e.as_service_error()
            .is_some_and(|s| s.is_resource_not_found_exception())
        {
            Repr::StreamNotFound {
                stream: stream.to_owned(),
            }
        } else {
            Repr::DescribeStream {
                stream: stream.to_owned(),
                source: Box::new(e),
            }
        }
    })?;
    let summary = out
        .stream_description_summary()
        .ok_or_else(|| Repr::DescribeStream {
            stream: stream.to_owned(),
            source: "DescribeStreamSummary returned no summary".into(),
        })?;
    // Being deleted: its epoch is the old stream's, soon gone.
    if *summary.stream_status() == StreamStatus::Deleting {
        return Err(Repr::StreamDeleting {
            stream: stream.to_owned(),
        }
        .into());
    }
    // The stream's own account and name (a stream given by ARN may be of
    // another account): arn:aws:kinesis:REGION:ACCOUNT:stream/NAME.
    let described = StreamArn::parse(summary.stream_arn()).ok().flatten();
    let (account, name) = match described.as_ref().or(arn.as_ref()) {
        Some(arn) => (arn.account().to_owned(), arn.name().to_owned()),
        None => (String::new(), stream.to_owned()),
    };
    let epoch = summary.stream_creation_timestamp().secs();
    Ok(format!("{account}:{name}:{epoch}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `DescribeStreamSummary` that is never answered fails after
    /// `DESCRIBE_TIMEOUT`, retryably, so that startup retries it while the
    /// readiness probe says why. Before, the call had no bound (the SDK's
    /// defaults set none) and the worker never started.
    #[tokio::test(start_paused = true)]
    async fn a_describe_that_is_never_answered_fails_retryably() {
        let url = unanswering_endpoint().await;
        let kinesis = client_at(&url);
        let answer = tokio::time::timeout(
            Duration::from_secs(600),
            stream_identifier(&kinesis, "orders"),
        )
        .await
        .expect("the describe is still waiting after 600 s");
        let err = answer.expect_err("nothing answered");
        assert!(err.is_retryable(), "{err}");
    }

    /// A Kinesis client of test credentials for the endpoint at `url`.
    fn client_at(url: &str) -> aws_sdk_kinesis::Client {
        let config = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_kinesis::config::Credentials::new(
                "test", "test", None, None, "test",
            ))
            .endpoint_url(url)
            .build();
        aws_sdk_kinesis::Client::from_conf(config)
    }

    /// An endpoint that accepts connections, reads nothing and answers
    /// nothing; its URL.
    async fn unanswering_endpoint() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        url
    }

    /// A listed name that cannot be described (here: no credentials) is
    /// left out, with a warning, and the other streams are kept. The
    /// whole answer failed, and the worker kept its streams as they were:
    /// no stream was added, and none removed, for as long as it stayed.
    #[tokio::test]
    async fn a_name_that_cannot_be_described_is_left_out_and_the_others_kept() {
        let kinesis = aws_sdk_kinesis::Client::new(&crate::test_support::offline_sdk());
        let resolver = Arc::new(StreamResolver::new(kinesis, true));
        resolver
            .identifiers
            .lock()
            .unwrap()
            .insert("a".into(), ("123456789012:a:1".to_owned(), Instant::now()));
        let tracker = NameTracker {
            names: Arc::new(|| vec!["a".to_owned(), "bad".to_owned()]),
            resolver,
        };
        let specs = tracker.streams().await.expect("the others are kept");
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a"]);
    }

    /// Answers each `DescribeStreamSummary` with stream "orders" created at
    /// `epochs[i]` for the i-th request (the last one after that); counts
    /// the requests.
    async fn describe_stub(epochs: Vec<i64>) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        describe_stub_with_status(epochs, "ACTIVE").await
    }

    /// [`describe_stub`], the stream in `status`.
    async fn describe_stub_with_status(
        epochs: Vec<i64>,
        status: &'static str,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let asked = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&asked);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (epochs, count) = (epochs.clone(), Arc::clone(&count));
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    // One request a read (small, and answered before the next).
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        let i = count.fetch_add(1, Ordering::SeqCst);
                        let epoch = epochs[i.min(epochs.len() - 1)];
                        let body = format!(
                            r#"{{"StreamDescriptionSummary":{{"StreamName":"orders","StreamARN":"arn:aws:kinesis:us-east-1:123456789012:stream/orders","StreamStatus":"{status}","RetentionPeriodHours":24,"StreamCreationTimestamp":{epoch},"EnhancedMonitoring":[],"OpenShardCount":1}}}}"#
                        );
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.1\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, asked)
    }

    /// A stream deleted and created again under a name the application
    /// keeps listing gets its new identifier (a new creation epoch, a new
    /// lease prefix) once its last describe is `DESCRIBED_FOR` old. The
    /// name was described once for the life of the process, and the new
    /// stream read under the old one's leases and checkpoints.
    #[tokio::test(start_paused = true)]
    async fn a_stream_created_again_under_a_listed_name_is_described_again() {
        let (url, asked) = describe_stub(vec![1_700_000_000, 1_800_000_000]).await;
        let resolver = Arc::new(StreamResolver::new(client_at(&url), true));
        let tracker = NameTracker {
            names: Arc::new(|| vec!["orders".to_owned()]),
            resolver: Arc::clone(&resolver),
        };
        let identifier = || resolver.known_identifier("orders").unwrap();
        tracker.streams().await.unwrap();
        assert_eq!(identifier(), "123456789012:orders:1700000000");
        tracker.streams().await.unwrap();
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "still fresh"
        );
        tokio::time::sleep(DESCRIBED_FOR.mul_f64(1.2)).await;
        tracker.streams().await.unwrap();
        assert_eq!(identifier(), "123456789012:orders:1800000000");
    }

    /// A stream being deleted is not taken (its leases would be the old
    /// stream's), and the error says it is being deleted: it said the
    /// stream did not exist, and to check its name, region and endpoint.
    #[tokio::test]
    async fn a_stream_being_deleted_is_refused_as_being_deleted() {
        let (url, _) = describe_stub_with_status(vec![1_700_000_000], "DELETING").await;
        let err = stream_identifier(&client_at(&url), "orders")
            .await
            .expect_err("a stream being deleted");
        assert_eq!(err.kind(), ErrorKind::StreamNotFound);
        assert_eq!(err.stream(), Some("orders"));
        assert!(err.to_string().contains("is being deleted"), "{err}");
    }

    /// One answer spends at most `DESCRIBE_BUDGET` describing, far inside
    /// the 30 s after which the worker gives a tracker's answer up (and
    /// every change with it): names not known yet wait for the next answer,
    /// a known one keeps its identifier. Four names whose describes go
    /// unanswered took 40 s.
    #[tokio::test(start_paused = true)]
    async fn one_answer_spends_at_most_its_budget_describing() {
        let url = unanswering_endpoint().await;
        let resolver = Arc::new(StreamResolver::new(client_at(&url), true));
        // Known, but due for a describe.
        let stale = ("123456789012:k:1".to_owned(), Instant::now());
        resolver
            .identifiers
            .lock()
            .unwrap()
            .insert("k".into(), stale);
        let tracker = NameTracker {
            names: Arc::new(|| ["a", "b", "c", "d", "k"].map(String::from).to_vec()),
            resolver,
        };
        let started = Instant::now();
        let specs = tracker.streams().await.unwrap();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["k"]);
        assert!(
            started.elapsed() < DESCRIBE_BUDGET + DESCRIBE_TIMEOUT,
            "{:?} describing",
            started.elapsed()
        );
    }

    /// A listed name that cannot be described is tried again a minute
    /// later, not at each answer: a describe that hangs took its 10 s at
    /// every answer (each sync round, each round a consumer asked for),
    /// and two such names spent the budget, so that names listed after
    /// them were never added.
    #[tokio::test(start_paused = true)]
    async fn a_name_that_cannot_be_described_is_tried_again_a_minute_later() {
        let url = unanswering_endpoint().await;
        let resolver = Arc::new(StreamResolver::new(client_at(&url), true));
        let tracker = NameTracker {
            names: Arc::new(|| vec!["silent".to_owned()]),
            resolver,
        };
        let took = || async {
            let started = Instant::now();
            assert!(tracker.streams().await.unwrap().is_empty());
            started.elapsed()
        };
        assert!(took().await >= DESCRIBE_TIMEOUT, "described");
        assert_eq!(took().await, Duration::ZERO, "not again at once");
        tokio::time::sleep(DESCRIBE_RETRY).await;
        assert!(took().await >= DESCRIBE_TIMEOUT, "again a minute later");
    }

    /// A name the application no longer lists is described again if it
    /// comes back (the stream may have been created anew); the ones still
    /// listed are not described again.
    #[tokio::test]
    async fn a_stream_no_longer_listed_is_forgotten_and_the_others_kept() {
        let kinesis = aws_sdk_kinesis::Client::new(&crate::test_support::offline_sdk());
        let resolver = Arc::new(StreamResolver::new(kinesis, true));
        for name in ["a", "b"] {
            resolver.identifiers.lock().unwrap().insert(
                name.into(),
                (
                    format!("123456789012:{name}:1"),
                    Instant::now() + DESCRIBED_FOR,
                ),
            );
        }
        let tracker = NameTracker {
            names: Arc::new(|| vec!["a".to_owned()]),
            resolver: Arc::clone(&resolver),
        };
        // "a" is known: no call to Kinesis, which this client cannot reach.
        let specs = tracker.streams().await.unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(
            resolver.known_identifier("a").as_deref(),
            Some("123456789012:a:1")
        );
        assert_eq!(resolver.known_identifier("b"), None);
    }
}
