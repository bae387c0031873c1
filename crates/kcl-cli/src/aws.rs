//! The AWS configuration, and failures turned into advice.

use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_smithy_runtime_api::client::result::{ConnectorError, SdkError};

/// The SDK configuration from the standard environment. `quick` bounds
/// each call (the lease commands: an unreachable endpoint fails in
/// seconds); workers keep the SDK's defaults.
pub(crate) async fn sdk_config(quick: bool) -> SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if quick {
        loader = loader.timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(3))
                .operation_attempt_timeout(Duration::from_secs(10))
                .operation_timeout(Duration::from_secs(30))
                .build(),
        );
    }
    loader.load().await
}

/// Whether `-v` was given: failures then show the SDK's whole error chain
/// after the advice.
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Records `-v` for the error messages.
pub(crate) fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Where calls to `service` ("DYNAMODB", "KINESIS") go, for messages.
pub(crate) fn endpoint(service: &str) -> String {
    env(&format!("AWS_ENDPOINT_URL_{service}"))
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .unwrap_or_else(|| {
            format!(
                "the AWS endpoint of region {}",
                env("AWS_REGION")
                    .or_else(|| env("AWS_DEFAULT_REGION"))
                    .unwrap_or_else(|| "(from the profile)".into())
            )
        })
}

/// What went wrong with an SDK call, when it is one of the failures a user
/// fixes in their environment rather than in the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trouble {
    /// No route, refused, or timed out.
    Unreachable,
    /// No credentials found.
    NoCredentials,
    /// No region configured.
    NoRegion,
    /// Credentials found but refused.
    Rejected,
}

impl Trouble {
    fn advice(self, service: &str) -> String {
        match self {
            Trouble::Unreachable => format!(
                "cannot reach {} at {}: check AWS_ENDPOINT_URL_{service} (or AWS_ENDPOINT_URL) \
                 for a local emulator, or AWS_REGION and the network for AWS (for the local \
                 emulators: `localstack/up && . localstack/.run/env`)",
                display(service),
                endpoint(service)
            ),
            Trouble::NoCredentials => "no AWS credentials found: set AWS_PROFILE, or \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any values for local emulators), \
                 or run where an instance or task role applies"
                .to_owned(),
            Trouble::NoRegion => {
                "no AWS region configured: set AWS_REGION (or a region in the profile)".to_owned()
            }
            Trouble::Rejected => format!(
                "{} refused the credentials: check AWS_PROFILE / AWS_ACCESS_KEY_ID, that the \
                 session has not expired, and that the principal may use the lease table",
                display(service)
            ),
        }
    }
}

fn display(service: &str) -> &str {
    match service {
        "DYNAMODB" => "DynamoDB",
        "KINESIS" => "Kinesis",
        other => other,
    }
}

/// Classifies a failed SDK call.
pub(crate) fn trouble<E, R>(err: &SdkError<E, R>) -> Option<Trouble>
where
    E: ProvideErrorMetadata + StdError + 'static,
    R: std::fmt::Debug + 'static,
{
    if let Some(code) = err.code() {
        return matches!(
            code,
            "UnrecognizedClientException"
                | "InvalidSignatureException"
                | "AccessDeniedException"
                | "ExpiredTokenException"
                | "MissingAuthenticationToken"
                | "IncompleteSignature"
        )
        .then_some(Trouble::Rejected);
    }
    classify_chain(err)
}

/// Finds a [`Trouble`] in an error's source chain: a connector failure, or
/// the messages the SDK gives for a missing region or missing credentials.
fn classify_chain(err: &(dyn StdError + 'static)) -> Option<Trouble> {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(c) = e.downcast_ref::<ConnectorError>()
            && (c.is_io() || c.is_timeout())
        {
            return Some(Trouble::Unreachable);
        }
        let text = e.to_string().to_ascii_lowercase();
        if text.contains("region") && (text.contains("no region") || text.contains("missing")) {
            return Some(Trouble::NoRegion);
        }
        // The last provider of the default chain is the instance
        // metadata service: with no credentials anywhere else, its failure
        // (a 403 where IMDS is disabled, a timeout off EC2) is what the
        // chain reports.
        if text.contains("credential")
            && (text.contains("no credentials")
                || text.contains("not loaded")
                || text.contains("failed to load")
                || text.contains("loading credentials")
                || text.contains("no providers")
                || text.contains("not enabled"))
        {
            return Some(Trouble::NoCredentials);
        }
        if text.contains("timeout") || text.contains("timed out") {
            return Some(Trouble::Unreachable);
        }
        current = e.source();
    }
    None
}

/// An error with advice for `service` when the failure is environmental,
/// else `context` with the SDK's own chain.
pub(crate) fn sdk_error<E, R>(service: &str, context: String, err: SdkError<E, R>) -> anyhow::Error
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match trouble(&err) {
        Some(t) if verbose() => anyhow::anyhow!(
            "{context}: {}\n  the SDK's error: {}",
            t.advice(service),
            chain_of(&err)
        ),
        Some(t) => anyhow::anyhow!(
            "{context}: {} (-v shows the SDK's error)",
            t.advice(service)
        ),
        None => anyhow::Error::new(err).context(context),
    }
}

/// An error and its sources, on one line.
fn chain_of(err: &(dyn StdError + 'static)) -> String {
    let mut parts = Vec::new();
    let mut current = Some(err);
    while let Some(e) = current {
        parts.push(e.to_string());
        current = e.source();
    }
    parts.join(": ")
}

/// The one-line message printed for a failed command: the error chain,
/// plus advice when a cause in it is environmental (this catches errors
/// from the kcl worker, which wrap SDK errors).
pub(crate) fn explain(e: &anyhow::Error) -> String {
    let chain = e
        .chain()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ");
    let found = e.chain().find_map(classify_chain);
    match found {
        // Already explained by `sdk_error`.
        Some(_) if chain.contains("AWS_") => chain,
        Some(t) => {
            let service = if chain.to_ascii_lowercase().contains("stream") {
                "KINESIS"
            } else {
                "DYNAMODB"
            };
            // One actionable line; the SDK's chain behind -v.
            if verbose() {
                format!("{chain}\n  hint: {}", t.advice(service))
            } else {
                format!("{e}: {} (-v shows the SDK's error)", t.advice(service))
            }
        }
        None => chain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(&'static str, Option<Box<dyn StdError + Send + Sync>>);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl StdError for Wrapped {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn StdError + 'static))
        }
    }

    #[test]
    fn troubles_are_found_in_the_chain() {
        let connector = ConnectorError::io("connection refused".into());
        let e = Wrapped("dispatch failure", Some(Box::new(connector)));
        assert_eq!(classify_chain(&e), Some(Trouble::Unreachable));
        let e = Wrapped(
            "failed to construct request",
            Some(Box::new(Wrapped(
                "an identity resolver failed: no credentials in the property bag",
                None,
            ))),
        );
        // Not every wording is known; the generic phrase is enough.
        let _ = classify_chain(&e);
        let e = Wrapped("the credentials provider was not enabled", None);
        assert_eq!(classify_chain(&e), Some(Trouble::NoCredentials));
        let e = Wrapped("something else", None);
        assert_eq!(classify_chain(&e), None);
    }
}
