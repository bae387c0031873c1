//! What the source can do about a failed Kinesis call.

use std::error::Error as StdError;

use aws_sdk_kinesis::error::SdkError;
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
    /// Access to the stream or to its KMS key is denied, or the key cannot
    /// be used. Only an operator can fix it, and any other worker would
    /// fail the same way: the reader keeps the lease and retries with
    /// capped backoff (as the Java KCL does), saying so at warn level.
    AccessDenied,
    /// The stream (or shard) does not exist.
    NotFound,
    /// The service rejected an argument: for `GetShardIterator` at a
    /// sequence number, one behind the trim horizon (the data was trimmed).
    InvalidArgument,
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
    /// Whether the service sent it (an error response), as opposed to a
    /// call that timed out, never reached the service or got no readable
    /// answer: a worker the service answers is not cut off from it.
    pub(crate) answered: bool,
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

/// Error codes that mean access is denied or the stream's KMS key is
/// unusable (see [`Class::AccessDenied`]).
const ACCESS: &[&str] = &[
    "AccessDeniedException",
    "KMSAccessDeniedException",
    "KMSDisabledException",
    "KMSInvalidStateException",
    "KMSNotFoundException",
    "KMSOptInRequired",
    "UnrecognizedClientException",
    // Expired credentials, or a clock skewed past the signature's window:
    // the credential provider or NTP fixes them, not giving the shard up.
    "ExpiredTokenException",
    "RequestExpired",
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

/// Implements [`KnownCode`] for an operation error enum: each listed
/// variant has the given code, anything else the code the service sent.
macro_rules! known_codes {
    ($error:ty { $($variant:ident => $code:literal),+ $(,)? }) => {
        impl $crate::calls::classify::KnownCode for $error {
            fn known_code(&self) -> Option<&str> {
                Some(match self {
                    $(Self::$variant(_) => $code,)+
                    other => return aws_sdk_kinesis::error::ProvideErrorMetadata::code(other),
                })
            }
        }
    };
}
pub(crate) use known_codes;

known_codes!(GetRecordsError {
    ExpiredIteratorException => "ExpiredIteratorException",
    ProvisionedThroughputExceededException => "ProvisionedThroughputExceededException",
    KmsThrottlingException => "KMSThrottlingException",
    InternalFailureException => "InternalFailureException",
    ResourceNotFoundException => "ResourceNotFoundException",
    InvalidArgumentException => "InvalidArgumentException",
    AccessDeniedException => "AccessDeniedException",
    KmsAccessDeniedException => "KMSAccessDeniedException",
    KmsDisabledException => "KMSDisabledException",
    KmsInvalidStateException => "KMSInvalidStateException",
    KmsNotFoundException => "KMSNotFoundException",
    KmsOptInRequired => "KMSOptInRequired",
});

known_codes!(GetShardIteratorError {
    ProvisionedThroughputExceededException => "ProvisionedThroughputExceededException",
    InternalFailureException => "InternalFailureException",
    ResourceNotFoundException => "ResourceNotFoundException",
    InvalidArgumentException => "InvalidArgumentException",
    AccessDeniedException => "AccessDeniedException",
});

known_codes!(ListShardsError {
    LimitExceededException => "LimitExceededException",
    ExpiredNextTokenException => "ExpiredNextTokenException",
    ResourceInUseException => "ResourceInUseException",
    ResourceNotFoundException => "ResourceNotFoundException",
    AccessDeniedException => "AccessDeniedException",
});

/// The class of an error the service sent with `code` and HTTP `status`.
pub(crate) fn class_of(code: Option<&str>, status: u16) -> Class {
    match code {
        Some("ExpiredIteratorException") => Class::ExpiredIterator,
        Some("ExpiredNextTokenException") => Class::ExpiredNextToken,
        Some("ResourceNotFoundException") => Class::NotFound,
        Some("InvalidArgumentException") => Class::InvalidArgument,
        Some(c) if THROTTLING.contains(&c) => Class::Throttled,
        Some(c) if ACCESS.contains(&c) => Class::AccessDenied,
        Some(c) if TRANSIENT.contains(&c) => Class::Transient,
        _ if status == 429 => Class::Throttled,
        _ if status == 403 => Class::AccessDenied,
        _ if status >= 500 => Class::Transient,
        _ => Class::Fatal,
    }
}

/// Classifies an SDK error from any operation's response.
pub(crate) fn classify<E>(err: SdkError<E>) -> Classified
where
    E: KnownCode + StdError + Send + Sync + 'static,
{
    classify_with(err, |raw| raw.status().as_u16())
}

/// Classifies an SDK error whose service errors answered with the HTTP
/// status `status` finds in the raw answer (responses and event-stream
/// messages differ there).
pub(crate) fn classify_with<E, R>(err: SdkError<E, R>, status: impl Fn(&R) -> u16) -> Classified
where
    E: KnownCode + StdError + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let (class, code) = match &err {
        SdkError::ServiceError(service) => {
            let code = service.err().known_code().map(str::to_owned);
            let class = class_of(code.as_deref(), status(service.raw()));
            (class, code)
        }
        // No answer, or an unreadable one (for an event stream: a reset
        // stream, a dropped connection, a frame that did not decode): the
        // call may succeed if repeated. Reads are idempotent, and a new
        // subscription resumes where the last one stopped.
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            (Class::Transient, None)
        }
        _ => (Class::Fatal, None),
    };
    Classified {
        class,
        code,
        answered: matches!(err, SdkError::ServiceError(_)),
        error: Box::new(err),
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_kinesis::types::error::{
        AccessDeniedException, ExpiredIteratorException, InvalidArgumentException,
        KmsDisabledException, KmsThrottlingException, LimitExceededException,
        ProvisionedThroughputExceededException,
    };

    use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;

    use super::*;

    fn service<E>(err: E, status: u16) -> SdkError<E> {
        let status = StatusCode::try_from(status).expect("valid status");
        SdkError::service_error(err, HttpResponse::new(status, SdkBody::empty()))
    }

    /// The classification of the service error `$error::$exception`,
    /// answered with status 400.
    macro_rules! classified {
        ($error:ident :: $exception:ident) => {
            classify(service(
                $error::$exception($exception::builder().build()),
                400,
            ))
        };
    }

    #[test]
    fn classes() {
        let cases: Vec<(Classified, Class)> = vec![
            (
                classified!(GetRecordsError::ExpiredIteratorException),
                Class::ExpiredIterator,
            ),
            (
                classified!(GetRecordsError::ProvisionedThroughputExceededException),
                Class::Throttled,
            ),
            (
                classified!(GetRecordsError::KmsThrottlingException),
                Class::Throttled,
            ),
            (
                classified!(ListShardsError::LimitExceededException),
                Class::Throttled,
            ),
            (
                classified!(GetRecordsError::InvalidArgumentException),
                Class::InvalidArgument,
            ),
            (
                classified!(GetRecordsError::KmsDisabledException),
                Class::AccessDenied,
            ),
            (
                classified!(GetRecordsError::AccessDeniedException),
                Class::AccessDenied,
            ),
            (
                classify(service(GetRecordsError::unhandled("forbidden"), 403)),
                Class::AccessDenied,
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
