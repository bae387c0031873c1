//! Sending a flush to CloudWatch: PutMetricData per batch, retried with
//! backoff while CloudWatch throttles or fails transiently.

use std::fmt;
use std::time::Duration;

use aws_sdk_cloudwatch::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_cloudwatch::types::MetricDatum;

/// Attempts per batch (the client's own retries come on top).
pub(crate) const ATTEMPTS: u32 = 4;
/// The wait before the second attempt; doubled before each next one.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// How long one attempt (the client's own retries in it) may take. The
/// SDK's default configuration bounds only the connection, so a request
/// whose answer never came held the flush, and with it the worker's
/// return from `run` (the publisher runs beside it), for good.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a batch was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SendError {
    /// Throttled, timed out, or failed on CloudWatch's side: worth another
    /// attempt.
    Retryable(String),
    /// Refused for good (a malformed request, access denied): not retried.
    Fatal(String),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Retryable(e) => write!(f, "{e} (retryable)"),
            SendError::Fatal(e) => f.write_str(e),
        }
    }
}

/// Where batches go: CloudWatch, or a recording fake in the tests.
#[async_trait::async_trait]
pub(crate) trait Sink: Send + Sync + fmt::Debug {
    async fn put(&self, namespace: &str, data: Vec<MetricDatum>) -> Result<(), SendError>;
}

#[async_trait::async_trait]
impl Sink for aws_sdk_cloudwatch::Client {
    async fn put(&self, namespace: &str, data: Vec<MetricDatum>) -> Result<(), SendError> {
        self.put_metric_data()
            .namespace(namespace)
            .set_metric_data(Some(data))
            .send()
            .await
            .map(|_| ())
            .map_err(classify)
    }
}

/// The error codes CloudWatch answers a request with that a later attempt
/// may get through.
const RETRYABLE_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "InternalServiceError",
    "InternalServiceFault",
    "ServiceUnavailable",
];

fn classify<E, R>(error: SdkError<E, R>) -> SendError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: fmt::Debug,
{
    let text = aws_sdk_cloudwatch::error::DisplayErrorContext(&error).to_string();
    match &error {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            SendError::Retryable(text)
        }
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or_default();
            if RETRYABLE_CODES.contains(&code) {
                SendError::Retryable(text)
            } else {
                SendError::Fatal(text)
            }
        }
        _ => SendError::Fatal(text),
    }
}

/// Sends one batch, retrying a retryable failure (an attempt without an
/// answer within [`ATTEMPT_TIMEOUT`] among them) after 0.5 s, 1 s, 2 s.
/// The last error if no attempt got through.
pub(crate) async fn send_with_retries(
    sink: &dyn Sink,
    namespace: &str,
    batch: Vec<MetricDatum>,
    retried: &std::sync::atomic::AtomicU64,
) -> Result<(), SendError> {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        let answer = tokio::time::timeout(ATTEMPT_TIMEOUT, sink.put(namespace, batch.clone()))
            .await
            .unwrap_or_else(|_| {
                Err(SendError::Retryable(format!(
                    "no answer within {ATTEMPT_TIMEOUT:?}"
                )))
            });
        match answer {
            Ok(()) => return Ok(()),
            Err(SendError::Retryable(e)) if attempt < ATTEMPTS => {
                tracing::debug!(attempt, error = %e, "PutMetricData failed; retrying");
                retried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
