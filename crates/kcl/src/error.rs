//! The facade's error: [`Error`], the [`ErrorKind`] a caller branches on,
//! and which failures a retry can fix.

use kcl_core::ConfigError;
use kcl_core::worker::WorkerError;

/// Why a worker could not be built or could not run.
///
/// Branch on [`Error::kind`]; the cause is behind
/// [`std::error::Error::source`], and the accessors give the details a
/// caller acts on (the setting, the stream, the engine's error).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Error(Repr);

/// What went wrong, for a caller deciding what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A setting is impossible: [`Error::config`] names the field.
    Config,
    /// A configured stream does not exist: [`Error::stream`] names it.
    StreamNotFound,
    /// Describing a stream failed (access, endpoint, throttling).
    DescribeStream,
    /// The lease table could not be created or is not a lease table.
    LeaseTable,
    /// The worker stopped with an error: [`Error::worker`] has it.
    Worker,
    /// The health or metrics endpoint's address cannot be bound.
    MetricsBind,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Repr {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("stream {stream:?} does not exist (check the name, the region and the endpoint)")]
    StreamNotFound { stream: String },
    /// Of kind [`ErrorKind::StreamNotFound`]: its leases would be the old
    /// stream's, and it is soon gone.
    #[error(
        "stream {stream:?} is being deleted (wait for the deletion to finish, then create it again)"
    )]
    StreamDeleting { stream: String },
    #[error("cannot describe stream {stream:?}")]
    DescribeStream {
        stream: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("lease table {table:?} cannot be used")]
    LeaseTable {
        table: String,
        #[source]
        source: kcl_core::StoreError,
    },
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error("cannot listen on {addr} ({setting})")]
    MetricsBind {
        addr: std::net::SocketAddr,
        /// `serve_health` or `serve_metrics`.
        setting: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl<T: Into<Repr>> From<T> for Error {
    fn from(repr: T) -> Self {
        Error(repr.into())
    }
}

impl Error {
    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        match &self.0 {
            Repr::Config(_) => ErrorKind::Config,
            Repr::StreamNotFound { .. } | Repr::StreamDeleting { .. } => ErrorKind::StreamNotFound,
            Repr::DescribeStream { .. } => ErrorKind::DescribeStream,
            Repr::LeaseTable { .. } => ErrorKind::LeaseTable,
            Repr::Worker(_) => ErrorKind::Worker,
            Repr::MetricsBind { .. } => ErrorKind::MetricsBind,
        }
    }

    /// The impossible setting, for [`ErrorKind::Config`].
    pub fn config(&self) -> Option<&ConfigError> {
        match &self.0 {
            Repr::Config(e) => Some(e),
            _ => None,
        }
    }

    /// The stream concerned, for [`ErrorKind::StreamNotFound`] and
    /// [`ErrorKind::DescribeStream`].
    pub fn stream(&self) -> Option<&str> {
        match &self.0 {
            Repr::StreamNotFound { stream }
            | Repr::StreamDeleting { stream }
            | Repr::DescribeStream { stream, .. } => Some(stream),
            _ => None,
        }
    }

    /// The setting whose address could not be bound, for
    /// [`ErrorKind::MetricsBind`].
    pub(crate) fn bind_setting(&self) -> Option<&'static str> {
        match &self.0 {
            Repr::MetricsBind { setting, .. } => Some(setting),
            _ => None,
        }
    }

    /// The engine's error, for [`ErrorKind::Worker`].
    pub fn worker(&self) -> Option<&WorkerError> {
        match &self.0 {
            Repr::Worker(e) => Some(e),
            _ => None,
        }
    }

    /// True when the same run may succeed if tried again later: the lease
    /// table or Kinesis throttled, answered 5xx or did not answer. A worker
    /// retries these at startup by itself; this tells the rest apart.
    pub fn is_retryable(&self) -> bool {
        match &self.0 {
            Repr::LeaseTable { source, .. } => source.is_retryable(),
            Repr::DescribeStream { source, .. } => source
                .downcast_ref::<DescribeError>()
                .is_some_and(describe_is_retryable),
            Repr::Worker(WorkerError::Store(e)) => e.is_retryable(),
            Repr::Worker(WorkerError::Source { source, .. }) => source.is_retryable(),
            _ => false,
        }
    }
}

type DescribeError = aws_sdk_kinesis::error::SdkError<
    aws_sdk_kinesis::operation::describe_stream_summary::DescribeStreamSummaryError,
    aws_sdk_kinesis::config::http::HttpResponse,
>;

/// Throttling (LimitExceeded), 5xx, and no answer at all.
fn describe_is_retryable(e: &DescribeError) -> bool {
    use aws_sdk_kinesis::error::SdkError;
    match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(s) => {
            s.err().is_limit_exceeded_exception() || s.raw().status().as_u16() >= 500
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kcl_core::store::{StoreError, StoreOp};

    fn describe_failure(e: DescribeError) -> Error {
        Repr::DescribeStream {
            stream: "s".into(),
            source: Box::new(e),
        }
        .into()
    }

    #[test]
    fn startup_retries_what_retrying_can_fix_and_nothing_else() {
        use aws_sdk_kinesis::error::SdkError;
        let throttled = StoreError::Throttled {
            op: StoreOp::Get,
            source: "slow down".into(),
        };
        let fatal = StoreError::Fatal {
            op: StoreOp::Get,
            message: "access denied".into(),
            source: None,
        };
        let cases: Vec<(&str, Error, bool)> = vec![
            (
                "no answer from Kinesis",
                describe_failure(SdkError::timeout_error("timed out")),
                true,
            ),
            (
                "a connection that failed",
                describe_failure(SdkError::dispatch_failure(
                    aws_sdk_kinesis::error::ConnectorError::io("reset".into()),
                )),
                true,
            ),
            (
                "a request that could not be built",
                describe_failure(SdkError::construction_failure("bad")),
                false,
            ),
            (
                "a throttled lease table",
                Repr::LeaseTable {
                    table: "t".into(),
                    source: throttled,
                }
                .into(),
                true,
            ),
            (
                "a lease table access denied",
                Repr::LeaseTable {
                    table: "t".into(),
                    source: fatal,
                }
                .into(),
                false,
            ),
            (
                "a missing stream",
                Repr::StreamNotFound { stream: "s".into() }.into(),
                false,
            ),
        ];
        for (what, error, retryable) in cases {
            assert_eq!(error.is_retryable(), retryable, "{what}: {error}");
        }
    }
}
