//! What the source can do about a failed Kinesis call.

use std::error::Error as StdError;

use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::operation::get_records::GetRecordsError;
use aws_sdk_kinesis::operation::get_shard_iterator::GetShardIteratorError;
use aws_sdk_kinesis::operation::list_shards::ListShardsError;

/// How a failed call is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The shard iterator is too old: get a new one where the last left off.
    ExpiredIterator,
    /// The service asks us to slow down: back off and retry, indefinitely.
    Throttled,
    /// Worth retrying: a timeout, a 5xx, a lost connection.
    Transient,
    /// The stream (or shard) does not exist.
    NotFound,
    /// A `ListShards` continuation token is too old: restart the listing.
    ExpiredNextToken,
    /// Retrying will not help.
    Fatal,
}

/// A classified SDK error, the SDK error kept as the source.
#[derive(Debug)]
pub(crate) struct Classified {
    pub(crate) class: Class,
    pub(crate) code: Option<String>,
    pub(crate) error: Box<dyn StdError + Send + Sync>,
}

/// Error codes Kinesis uses to ask callers to slow down.
const THROTTLING: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "LimitExceededException",
    "KMSThrottlingException",
    "ThrottlingException",
    "Throttling",
    "RequestLimitExceeded",
];

/// Error codes worth retrying as sent.
const TRANSIENT: &[&str] = &[
    "InternalFailureException",
    "InternalFailure",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    // ListShards while the stream is being created or updated.
    "ResourceInUseException",
];

/// The error code of an operation error. The modeled variants are matched by
/// type, since an error built in code (as the fault injector does) need not
/// carry its code in the metadata; anything else falls back to the code
/// the service sent.
pub(crate) trait KnownCode {
    fn known_code(&self) -> Option<&str>;
}

impl KnownCode for GetRecordsError {
    fn known_code(&self) -> Option<&str> {
        Some(match self {
            GetRecordsError::ExpiredIteratorException(_) => "ExpiredIteratorException",
            GetRecordsError::ProvisionedThroughputExceededException(_) => {
                "ProvisionedThroughputExceededException"
            }
            GetRecordsError::KmsThrottlingException(_) => "KMSThrottlingException",
            GetRecordsError::InternalFailureException(_) => "InternalFailureException",
            GetRecordsError::ResourceNotFoundException(_) => "ResourceNotFoundException",
            other => return other.code(),
        })
    }
}

impl KnownCode for GetShardIteratorError {
    fn known_code(&self) -> Option<&str> {
        Some(match self {
            GetShardIteratorError::ProvisionedThroughputExceededException(_) => {
                "ProvisionedThroughputExceededException"
            }
            GetShardIteratorError::InternalFailureException(_) => "InternalFailureException",
            GetShardIteratorError::ResourceNotFoundException(_) => "ResourceNotFoundException",
            other => return other.code(),
        })
    }
}

impl KnownCode for ListShardsError {
    fn known_code(&self) -> Option<&str> {
        Some(match self {
            ListShardsError::LimitExceededException(_) => "LimitExceededException",
            ListShardsError::ExpiredNextTokenException(_) => "ExpiredNextTokenException",
            ListShardsError::ResourceInUseException(_) => "ResourceInUseException",
            ListShardsError::ResourceNotFoundException(_) => "ResourceNotFoundException",
            other => return other.code(),
        })
    }
}

/// Classifies an SDK error from any of the three operations.
pub(crate) fn classify<E>(err: SdkError<E>) -> Classified
where
    E: KnownCode + StdError + Send + Sync + 'static,
{
    let (class, code) = match &err {
        SdkError::ServiceError(service) => {
            let code = service.err().known_code().map(str::to_owned);
            let status = service.raw().status().as_u16();
            let class = match code.as_deref() {
                Some("ExpiredIteratorException") => Class::ExpiredIterator,
                Some("ExpiredNextTokenException") => Class::ExpiredNextToken,
                Some("ResourceNotFoundException") => Class::NotFound,
                Some(c) if THROTTLING.contains(&c) => Class::Throttled,
                Some(c) if TRANSIENT.contains(&c) => Class::Transient,
                _ if status == 429 => Class::Throttled,
                _ if status >= 500 => Class::Transient,
                _ => Class::Fatal,
            };
            (class, code)
        }
        // No answer, or an unreadable one: the call may succeed if repeated.
        // Reads are idempotent, so repeating them is always safe.
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            (Class::Transient, None)
        }
        _ => (Class::Fatal, None),
    };
    Classified {
        class,
        code,
        error: Box::new(err),
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_kinesis::types::error::{
        ExpiredIteratorException, InvalidArgumentException, KmsThrottlingException,
        LimitExceededException, ProvisionedThroughputExceededException,
    };

    use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;

    use super::*;

    fn service<E>(err: E, status: u16) -> SdkError<E> {
        let status = StatusCode::try_from(status).expect("valid status");
        SdkError::service_error(err, HttpResponse::new(status, SdkBody::empty()))
    }

    #[test]
    fn classes() {
        let cases: Vec<(Classified, Class)> = vec![
            (
                classify(service(
                    GetRecordsError::ExpiredIteratorException(
                        ExpiredIteratorException::builder().build(),
                    ),
                    400,
                )),
                Class::ExpiredIterator,
            ),
            (
                classify(service(
                    GetRecordsError::ProvisionedThroughputExceededException(
                        ProvisionedThroughputExceededException::builder().build(),
                    ),
                    400,
                )),
                Class::Throttled,
            ),
            (
                classify(service(
                    GetRecordsError::KmsThrottlingException(
                        KmsThrottlingException::builder().build(),
                    ),
                    400,
                )),
                Class::Throttled,
            ),
            (
                classify(service(
                    ListShardsError::LimitExceededException(
                        LimitExceededException::builder().build(),
                    ),
                    400,
                )),
                Class::Throttled,
            ),
            (
                classify(service(
                    GetRecordsError::InvalidArgumentException(
                        InvalidArgumentException::builder().build(),
                    ),
                    400,
                )),
                Class::Fatal,
            ),
            (
                classify(service(GetRecordsError::unhandled("boom"), 503)),
                Class::Transient,
            ),
            (
                classify(SdkError::<GetRecordsError>::timeout_error("slow")),
                Class::Transient,
            ),
        ];
        for (i, (got, want)) in cases.into_iter().enumerate() {
            assert_eq!(got.class, want, "case {i}: {:?}", got.code);
        }
    }
}
