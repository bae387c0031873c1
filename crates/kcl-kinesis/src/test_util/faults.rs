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

/// The service error `$error::$exception` an injected fault stands for:
/// its exception, built with `$message` and the fault's metadata.
macro_rules! injected {
    ($error:ident :: $exception:ident, $meta:expr, $message:literal) => {
        $error::$exception($exception::builder().message($message).meta($meta).build())
    };
}

fn get_records_error(fault: Fault) -> SdkError<GetRecordsError> {
    let meta = fault.meta();
    let err = match fault {
        Fault::Timeout => return SdkError::timeout_error("injected timeout"),
        Fault::ExpiredIterator => injected!(
            GetRecordsError::ExpiredIteratorException,
            meta,
            "injected: iterator expired"
        ),
        Fault::ProvisionedThroughputExceeded => {
            injected!(
                GetRecordsError::ProvisionedThroughputExceededException,
                meta,
                "injected: rate exceeded"
            )
        }
        Fault::KmsThrottling => injected!(
            GetRecordsError::KmsThrottlingException,
            meta,
            "injected: KMS throttled"
        ),
        Fault::InternalFailure => injected!(
            GetRecordsError::InternalFailureException,
            meta,
            "injected: internal failure"
        ),
        Fault::ResourceNotFound => injected!(
            GetRecordsError::ResourceNotFoundException,
            meta,
            "injected: shard not found"
        ),
        Fault::InvalidArgument => injected!(
            GetRecordsError::InvalidArgumentException,
            meta,
            "injected: invalid argument"
        ),
        Fault::AccessDenied => injected!(
            GetRecordsError::AccessDeniedException,
            meta,
            "injected: access denied"
        ),
        Fault::KmsAccessDenied => injected!(
            GetRecordsError::KmsAccessDeniedException,
            meta,
            "injected: KMS access denied"
        ),
        Fault::KmsDisabled => injected!(
            GetRecordsError::KmsDisabledException,
            meta,
            "injected: KMS key disabled"
        ),
        Fault::KmsInvalidState => injected!(
            GetRecordsError::KmsInvalidStateException,
            meta,
            "injected: KMS key in an invalid state"
        ),
        Fault::KmsNotFound => injected!(
            GetRecordsError::KmsNotFoundException,
            meta,
            "injected: KMS key not found"
        ),
        Fault::KmsOptInRequired => injected!(
            GetRecordsError::KmsOptInRequired,
            meta,
            "injected: KMS opt-in required"
        ),
        Fault::LimitExceeded | Fault::ExpiredNextToken | Fault::Hang => {
            GetRecordsError::generic(meta)
        }
    };
    service_error(fault, err)
}

fn get_shard_iterator_error(fault: Fault) -> SdkError<GetShardIteratorError> {
    let meta = fault.meta();
    let err = match fault {
        Fault::Timeout => return SdkError::timeout_error("injected timeout"),
        Fault::ProvisionedThroughputExceeded => {
            injected!(
                GetShardIteratorError::ProvisionedThroughputExceededException,
                meta,
                "injected: rate exceeded"
            )
        }
        Fault::InternalFailure => injected!(
            GetShardIteratorError::InternalFailureException,
            meta,
            "injected: internal failure"
        ),
        Fault::ResourceNotFound => injected!(
            GetShardIteratorError::ResourceNotFoundException,
            meta,
            "injected: shard not found"
        ),
        Fault::InvalidArgument => injected!(
            GetShardIteratorError::InvalidArgumentException,
            meta,
            "injected: starting sequence number behind the trim horizon"
        ),
        Fault::AccessDenied => injected!(
            GetShardIteratorError::AccessDeniedException,
            meta,
            "injected: access denied"
        ),
        _ => GetShardIteratorError::generic(meta),
    };
    service_error(fault, err)
}

fn list_shards_error(fault: Fault) -> SdkError<ListShardsError> {
    let meta = fault.meta();
    let err = match fault {
        Fault::Timeout => return SdkError::timeout_error("injected timeout"),
        Fault::LimitExceeded => injected!(
            ListShardsError::LimitExceededException,
            meta,
            "injected: limit exceeded"
        ),
        Fault::ExpiredNextToken => injected!(
            ListShardsError::ExpiredNextTokenException,
            meta,
            "injected: next token expired"
        ),
        _ => ListShardsError::generic(meta),
    };
    service_error(fault, err)
}

/// A [`KinesisApi`] that fails the calls its injector says, and passes the
/// rest to `inner`.
#[derive(Debug)]
pub(crate) struct Faulty {
    pub(crate) inner: Arc<dyn KinesisApi>,
    pub(crate) faults: FaultInjector,
}

#[async_trait]
impl KinesisApi for Faulty {
    async fn list_shards(
        &self,
        page: ListShardsPage<'_>,
        max_results: Option<i32>,
    ) -> Result<ListShardsOutput, SdkError<ListShardsError>> {
        match self.faults.next(Call::ListShards) {
            Some(Fault::Hang) => std::future::pending().await,
            Some(fault) => Err(list_shards_error(fault)),
            None => self.inner.list_shards(page, max_results).await,
        }
    }

    async fn get_shard_iterator(
        &self,
        stream: &str,
        shard_id: &str,
        start: &IteratorStart,
    ) -> Result<GetShardIteratorOutput, SdkError<GetShardIteratorError>> {
        match self.faults.next(Call::GetShardIterator) {
            Some(Fault::Hang) => std::future::pending().await,
            Some(fault) => Err(get_shard_iterator_error(fault)),
            None => self.inner.get_shard_iterator(stream, shard_id, start).await,
        }
    }

    async fn get_records(
        &self,
        stream: &str,
        iterator: &str,
        limit: i32,
    ) -> Result<GetRecordsOutput, SdkError<GetRecordsError>> {
        match self.faults.next(Call::GetRecords) {
            Some(Fault::Hang) => std::future::pending().await,
            Some(fault) => Err(get_records_error(fault)),
            None => self.inner.get_records(stream, iterator, limit).await,
        }
    }
}
