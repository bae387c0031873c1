//! Stream names to lease layouts: the resolver that describes each stream
//! once, and the tracker of the stream names an application supplies at
//! runtime.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_kinesis::error::SdkError;
use kcl_core::LeaseLayout;
use kcl_core::source::SourceError;
use kcl_core::worker::{StreamSpec, StreamTracker};
use kcl_kinesis::StreamArn;

use crate::error::{Error, ErrorKind, Repr};

/// The stream names an application supplies at runtime.
pub(crate) type StreamNames = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// The one place a stream name becomes a lease layout: the configured
/// streams at startup and the tracker's at every shard sync. A
/// multi-stream layout needs the Java KCL's identifier,
/// `account:stream:creationEpoch`, which Kinesis is asked for once per
/// stream; a single-stream worker still describes its stream, so a
/// misspelt name fails at startup.
pub(crate) struct StreamResolver {
    kinesis: aws_sdk_kinesis::Client,
    pub(crate) multi_stream: bool,
    identifiers: Mutex<HashMap<String, String>>,
}

impl StreamResolver {
    pub(crate) fn new(kinesis: aws_sdk_kinesis::Client, multi_stream: bool) -> Self {
        StreamResolver {
            kinesis,
            multi_stream,
            identifiers: Mutex::default(),
        }
    }

    /// The identifier of `name`, if [`Self::spec`] resolved it.
    pub(crate) fn known_identifier(&self, name: &str) -> Option<String> {
        self.identifiers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
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
    }

    pub(crate) async fn spec(&self, name: &str) -> Result<StreamSpec, Error> {
        let known = self
            .identifiers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned();
        let identifier = match known {
            Some(id) => id,
            None => {
                let id = stream_identifier(&self.kinesis, name).await?;
                self.identifiers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.to_owned(), id.clone());
                id
            }
        };
        let layout = if self.multi_stream {
            LeaseLayout::MultiStream { identifier }
        } else {
            LeaseLayout::SingleStream
        };
        Ok(StreamSpec {
            name: name.to_owned(),
            layout,
        })
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
        for name in names {
            match self.resolver.spec(&name).await {
                Ok(spec) => specs.push(spec),
                // A stream not created yet is simply not consumed yet.
                Err(e) if e.kind() == ErrorKind::StreamNotFound => continue,
                Err(e) => {
                    return Err(SourceError::Fatal {
                        stream: name,
                        message: e.to_string(),
                        source: None,
                    });
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

    /// A name the application no longer lists is described again if it
    /// comes back (the stream may have been created anew); the ones still
    /// listed are not described again.
    /// A `DescribeStreamSummary` that is never answered fails after
    /// `DESCRIBE_TIMEOUT`, retryably, so that startup retries it while the
    /// readiness probe says why. Before, the call had no bound (the SDK's
    /// defaults set none) and the worker never started.
    #[tokio::test(start_paused = true)]
    async fn a_describe_that_is_never_answered_fails_retryably() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Accepts, reads nothing, answers nothing.
        let _held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        let config = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_kinesis::config::Credentials::new(
                "test", "test", None, None, "test",
            ))
            .endpoint_url(format!("http://{addr}"))
            .build();
        let kinesis = aws_sdk_kinesis::Client::from_conf(config);
        let answer = tokio::time::timeout(
            Duration::from_secs(600),
            stream_identifier(&kinesis, "orders"),
        )
        .await
        .expect("the describe is still waiting after 600 s");
        let err = answer.expect_err("nothing answered");
        assert!(err.is_retryable(), "{err}");
    }

    #[tokio::test]
    async fn a_stream_no_longer_listed_is_forgotten_and_the_others_kept() {
        let kinesis = aws_sdk_kinesis::Client::new(&crate::test_support::offline_sdk());
        let resolver = Arc::new(StreamResolver::new(kinesis, true));
        for name in ["a", "b"] {
            resolver
                .identifiers
                .lock()
                .unwrap()
                .insert(name.into(), format!("123456789012:{name}:1"));
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
