//! Fault injection for tests: makes chosen Kinesis calls fail with the
//! service's real error variants, which the emulator never produces
//! (throttling, expired iterators, internal failures, timeouts).
//!
//! A [`FaultInjector`] is handed to
//! [`KinesisShardSourceBuilder::fault_injector`](crate::KinesisShardSourceBuilder::fault_injector);
//! the source then wraps its client so that each call first consults the
//! injector. An injected fault replaces the call: nothing reaches the
//! service, exactly as when the real service rejects a request.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use aws_sdk_kinesis::error::{ErrorMetadata, SdkError};
use aws_sdk_kinesis::operation::get_records::{GetRecordsError, GetRecordsOutput};
use aws_sdk_kinesis::operation::get_shard_iterator::{
    GetShardIteratorError, GetShardIteratorOutput,
};
use aws_sdk_kinesis::operation::list_shards::{ListShardsError, ListShardsOutput};
use aws_sdk_kinesis::types::error::{
    AccessDeniedException, ExpiredIteratorException, ExpiredNextTokenException,
    InternalFailureException, InvalidArgumentException, KmsAccessDeniedException,
    KmsDisabledException, KmsInvalidStateException, KmsNotFoundException, KmsOptInRequired,
    KmsThrottlingException, LimitExceededException, ProvisionedThroughputExceededException,
    ResourceNotFoundException,
};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;

use crate::calls::{IteratorStart, KinesisApi, ListShardsPage};

/// A Kinesis operation the source calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// `ListShards`.
    ListShards,
    /// `GetShardIterator`.
    GetShardIterator,
    /// `GetRecords`.
    GetRecords,
}

/// An error to return instead of making a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// `ExpiredIteratorException` (GetRecords only; other calls get an
    /// unmodeled error with that code).
    ExpiredIterator,
    /// `ProvisionedThroughputExceededException`.
    ProvisionedThroughputExceeded,
    /// `LimitExceededException`.
    LimitExceeded,
    /// `KMSThrottlingException`.
    KmsThrottling,
    /// `ExpiredNextTokenException`.
    ExpiredNextToken,
    /// `InternalFailureException` with HTTP 500.
    InternalFailure,
    /// The call timed out (no response).
    Timeout,
    /// The call never answers (a request stuck on a dead connection).
    Hang,
    /// `ResourceNotFoundException` (a shard past retention, a deleted
    /// stream).
    ResourceNotFound,
    /// `InvalidArgumentException` (for `GetShardIterator`, a starting
    /// sequence number behind the trim horizon).
    InvalidArgument,
    /// `AccessDeniedException`.
    AccessDenied,
    /// `KMSAccessDeniedException`.
    KmsAccessDenied,
    /// `KMSDisabledException`.
    KmsDisabled,
    /// `KMSInvalidStateException`.
    KmsInvalidState,
    /// `KMSNotFoundException`.
    KmsNotFound,
    /// `KMSOptInRequired`.
    KmsOptInRequired,
}

impl Fault {
    /// Every KMS and access error: what retrying cannot fix but an
    /// operator can.
    pub const ACCESS: [Fault; 6] = [
        Fault::AccessDenied,
        Fault::KmsAccessDenied,
        Fault::KmsDisabled,
        Fault::KmsInvalidState,
        Fault::KmsNotFound,
        Fault::KmsOptInRequired,
    ];
}

impl Fault {
    fn code(self) -> &'static str {
        match self {
            Fault::ExpiredIterator => "ExpiredIteratorException",
            Fault::ProvisionedThroughputExceeded => "ProvisionedThroughputExceededException",
            Fault::LimitExceeded => "LimitExceededException",
            Fault::KmsThrottling => "KMSThrottlingException",
            Fault::ExpiredNextToken => "ExpiredNextTokenException",
            Fault::InternalFailure => "InternalFailureException",
            Fault::Timeout => "Timeout",
            Fault::Hang => "Hang",
            Fault::ResourceNotFound => "ResourceNotFoundException",
            Fault::InvalidArgument => "InvalidArgumentException",
            Fault::AccessDenied => "AccessDeniedException",
            Fault::KmsAccessDenied => "KMSAccessDeniedException",
            Fault::KmsDisabled => "KMSDisabledException",
            Fault::KmsInvalidState => "KMSInvalidStateException",
            Fault::KmsNotFound => "KMSNotFoundException",
            Fault::KmsOptInRequired => "KMSOptInRequired",
        }
    }

    fn status(self) -> u16 {
        match self {
            Fault::InternalFailure => 500,
            _ => 400,
        }
    }

    fn meta(self) -> ErrorMetadata {
        ErrorMetadata::builder()
            .code(self.code())
            .message("injected by kcl_kinesis::faults")
            .build()
    }
}

#[derive(Debug, Default)]
struct Plan {
    queued: HashMap<Call, VecDeque<Fault>>,
    always: HashMap<Call, Fault>,
    at: HashMap<(Call, u64), Fault>,
    calls: HashMap<Call, u64>,
    injected: HashMap<Call, u64>,
}

/// A script of faults per call, shared by every clone.
#[derive(Debug, Clone, Default)]
pub struct FaultInjector {
    plan: Arc<Mutex<Plan>>,
}

impl FaultInjector {
    /// An injector with nothing scheduled.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the next call of `call` that has no earlier fault queued fail
    /// with `fault`. Faults queue up in order.
    pub fn inject(&self, call: Call, fault: Fault) {
        self.lock().queued.entry(call).or_default().push_back(fault);
    }

    /// Makes the `nth` call of `call` (counting from 1 since the injector
    /// was created, faulted calls included) fail with `fault`. Takes
    /// precedence over faults queued with [`FaultInjector::inject`].
    pub fn inject_at(&self, call: Call, nth: u64, fault: Fault) {
        self.lock().at.insert((call, nth), fault);
    }

    /// Makes every call of `call` fail with `fault` (an outage: a KMS key
    /// disabled, a policy revoked) until [`FaultInjector::clear`]. Faults
    /// scheduled with `inject_at` and `inject` come first.
    pub fn fail_all(&self, call: Call, fault: Fault) {
        self.lock().always.insert(call, fault);
    }

    /// Ends a [`FaultInjector::fail_all`] outage of `call`.
    pub fn clear(&self, call: Call) {
        self.lock().always.remove(&call);
    }

    /// Calls of `call` made so far, faulted or not.
    pub fn calls(&self, call: Call) -> u64 {
        self.lock().calls.get(&call).copied().unwrap_or(0)
    }

    /// Faults of `call` returned so far.
    pub fn injected(&self, call: Call) -> u64 {
        self.lock().injected.get(&call).copied().unwrap_or(0)
    }

    /// Faults still queued for `call`.
    pub fn pending(&self, call: Call) -> usize {
        self.lock().queued.get(&call).map_or(0, VecDeque::len)
    }

    /// Counts a call and takes its fault, if one is queued.
    fn next(&self, call: Call) -> Option<Fault> {
        let mut plan = self.lock();
        let count = plan.calls.entry(call).or_default();
        *count += 1;
        let nth = *count;
        let fault = match plan.at.remove(&(call, nth)) {
            Some(fault) => Some(fault),
            None => match plan.queued.get_mut(&call).and_then(VecDeque::pop_front) {
                Some(fault) => Some(fault),
                None => plan.always.get(&call).copied(),
            },
        };
        if fault.is_some() {
            *plan.injected.entry(call).or_default() += 1;
        }
        fault
    }
}

/// The error as the SDK would return it for a response with the fault's
/// status and an empty body.
fn service_error<E>(fault: Fault, err: E) -> SdkError<E> {
    match StatusCode::try_from(fault.status()) {
        Ok(status) => SdkError::service_error(err, HttpResponse::new(status, SdkBody::empty())),
        // Not reached (400 and 500 are valid statuses), but no panic if it were.
        Err(e) => SdkError::construction_failure(e),
    }
}

/// Defines each `$name`, the error a call fails with on an injected fault:
/// a timeout, or the `$exception` each listed fault stands for, built with
/// `$message` and the fault's metadata; the faults that match `$other`
/// (listed first) are an unmodeled error with their code.
macro_rules! injected_errors {
    ($(
        fn $name:ident -> $error:ident {
            generic: $other:pat,
            $($fault:ident => $exception:ident: $message:literal,)*
        }
    )*) => {$(
        fn $name(fault: Fault) -> SdkError<$error> {
            let meta = fault.meta();
            let err = match fault {
                Fault::Timeout => return SdkError::timeout_error("injected timeout"),
                $(Fault::$fault => $error::$exception(
                    $exception::builder().message($message).meta(meta).build(),
                ),)*
                $other => $error::generic(meta),
            };
            service_error(fault, err)
        }
    )*};
}

injected_errors! {
    fn get_records_error -> GetRecordsError {
        generic: Fault::LimitExceeded | Fault::ExpiredNextToken | Fault::Hang,
        ExpiredIterator => ExpiredIteratorException: "injected: iterator expired",
        ProvisionedThroughputExceeded => ProvisionedThroughputExceededException:
            "injected: rate exceeded",
        KmsThrottling => KmsThrottlingException: "injected: KMS throttled",
        InternalFailure => InternalFailureException: "injected: internal failure",
        ResourceNotFound => ResourceNotFoundException: "injected: shard not found",
        InvalidArgument => InvalidArgumentException: "injected: invalid argument",
        AccessDenied => AccessDeniedException: "injected: access denied",
        KmsAccessDenied => KmsAccessDeniedException: "injected: KMS access denied",
        KmsDisabled => KmsDisabledException: "injected: KMS key disabled",
        KmsInvalidState => KmsInvalidStateException: "injected: KMS key in an invalid state",
        KmsNotFound => KmsNotFoundException: "injected: KMS key not found",
        KmsOptInRequired => KmsOptInRequired: "injected: KMS opt-in required",
    }

    fn get_shard_iterator_error -> GetShardIteratorError {
        generic: _,
        ProvisionedThroughputExceeded => ProvisionedThroughputExceededException:
            "injected: rate exceeded",
        InternalFailure => InternalFailureException: "injected: internal failure",
        ResourceNotFound => ResourceNotFoundException: "injected: shard not found",
        InvalidArgument => InvalidArgumentException:
            "injected: starting sequence number behind the trim horizon",
        AccessDenied => AccessDeniedException: "injected: access denied",
    }

    fn list_shards_error -> ListShardsError {
        generic: _,
        LimitExceeded => LimitExceededException: "injected: limit exceeded",
        ExpiredNextToken => ExpiredNextTokenException: "injected: next token expired",
    }
}

/// A [`KinesisApi`] that fails the calls its injector says, and passes the
/// rest to `inner`.
#[derive(Debug)]
pub(crate) struct Faulty {
    pub(crate) inner: Arc<dyn KinesisApi>,
    pub(crate) faults: FaultInjector,
}

/// Implements each call of [`KinesisApi`] for [`Faulty`]: it takes the
/// call's fault, if one is queued, and otherwise passes it on to `inner`.
/// A hanging call never answers; any other fault is `$to_error`'s error.
macro_rules! faulty_calls {
    ($(
        fn $method:ident($($arg:ident: $ty:ty),*) -> $out:ty, $error:ty;
        fault $call:ident => $to_error:ident;
    )*) => {
        #[async_trait]
        impl KinesisApi for Faulty {$(
            async fn $method(&self, $($arg: $ty),*) -> Result<$out, SdkError<$error>> {
                match self.faults.next(Call::$call) {
                    Some(Fault::Hang) => std::future::pending().await,
                    Some(fault) => Err($to_error(fault)),
                    None => self.inner.$method($($arg),*).await,
                }
            }
        )*}
    };
}

faulty_calls! {
    fn list_shards(page: ListShardsPage<'_>, max_results: Option<i32>)
        -> ListShardsOutput, ListShardsError;
    fault ListShards => list_shards_error;

    fn get_shard_iterator(stream: &str, shard_id: &str, start: &IteratorStart)
        -> GetShardIteratorOutput, GetShardIteratorError;
    fault GetShardIterator => get_shard_iterator_error;

    fn get_records(stream: &str, iterator: &str, limit: i32)
        -> GetRecordsOutput, GetRecordsError;
    fault GetRecords => get_records_error;
}
