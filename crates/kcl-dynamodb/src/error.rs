//! Maps SDK errors onto the lease store's error kinds.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_runtime_api::http::Response;
use kcl_core::store::{StoreError, StoreOp};

/// Error codes DynamoDB uses to ask callers to slow down.
const THROTTLING: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "Throttling",
];

/// Error codes worth retrying: the request may succeed as sent.
const TRANSIENT: &[&str] = &[
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "LimitExceededException",
];

/// The error of a conditional write, which may say its condition failed.
pub(crate) trait ConditionalError:
    ProvideErrorMetadata + std::error::Error + Send + Sync + 'static
{
    /// `Some` when the condition failed, holding the item as DynamoDB saw
    /// it when the write asked for it (ReturnValuesOnConditionCheckFailure).
    fn failed_condition(&self) -> Option<Option<HashMap<String, AttributeValue>>>;
}

/// The conditional writes' errors: each has its own
/// ConditionalCheckFailedException variant, all read alike.
macro_rules! conditional_errors {
    ($($error:ty),+) => {$(
        impl ConditionalError for $error {
            fn failed_condition(&self) -> Option<Option<HashMap<String, AttributeValue>>> {
                match self {
                    Self::ConditionalCheckFailedException(c) => Some(c.item().cloned()),
                    _ => None,
                }
            }
        }
    )+};
}

conditional_errors!(DeleteItemError, PutItemError, UpdateItemError);

/// Classifies the SDK error of a conditional write.
pub(crate) fn classify<E: ConditionalError>(
    op: StoreOp,
    table: &str,
    key: &str,
    err: SdkError<E, Response>,
) -> ClassifiedError {
    if let SdkError::ServiceError(service) = &err
        && let Some(item) = service.err().failed_condition()
    {
        return ClassifiedError::ConditionFailed(item);
    }
    ClassifiedError::Store(unconditional_error(op, table, key, err))
}

/// Whether DynamoDB refused `err`'s call to this caller's role or
/// credentials (a lasting answer, unlike a throttle or a 5xx).
pub(crate) fn is_access_denied<E: ProvideErrorMetadata>(err: &SdkError<E, Response>) -> bool {
    matches!(err, SdkError::ServiceError(service) if service.err().code() == Some("AccessDeniedException"))
}

/// Classifies the error of a call without a condition (a read, a scan, a
/// describe), which cannot fail one.
pub(crate) fn unconditional_error<E>(
    op: StoreOp,
    table: &str,
    key: &str,
    err: SdkError<E, Response>,
) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    if let SdkError::ServiceError(service) = &err {
        let code = service.err().code().unwrap_or_default().to_owned();
        let status = service.raw().status().as_u16();
        if THROTTLING.contains(&code.as_str()) {
            return StoreError::Throttled {
                op,
                source: Box::new(err),
            };
        }
        if TRANSIENT.contains(&code.as_str()) || status >= 500 {
            return StoreError::retryable(op, err);
        }
        let message = match code.as_str() {
            "ResourceNotFoundException" => format!(
                "table {table:?} does not exist (create it with the worker's table settings, \
                 or check the region and endpoint)"
            ),
            "AccessDeniedException" | "UnrecognizedClientException" => format!(
                "access to table {table:?} was denied ({code}); check the credentials and the \
                 IAM policy"
            ),
            _ => format!("{op} on {key:?} in table {table:?} failed with {code} (HTTP {status})"),
        };
        return StoreError::Fatal {
            op,
            message,
            source: Some(Box::new(err)),
        };
    }
    match err {
        // No answer, or an unreadable one: the request may have applied.
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreError::retryable(op, err)
        }
        other => StoreError::Fatal {
            op,
            message: format!("{op} on {key:?} in table {table:?} could not be sent"),
            source: Some(Box::new(other)),
        },
    }
}

/// An SDK error sorted for the store.
pub(crate) enum ClassifiedError {
    /// The condition failed; the item as DynamoDB saw it, when returned.
    ConditionFailed(Option<HashMap<String, AttributeValue>>),
    /// Any other failure.
    Store(StoreError),
}
