//! The Kinesis calls enhanced fan-out makes, behind a small trait (the
//! seam unit tests replace with a fake), and how their errors are
//! classified.
//!
//! As in `crate::api`, the trait takes and returns the SDK's own types, so
//! the fake and the production path share the classification code.

use std::fmt;

use async_trait::async_trait;
use aws_sdk_kinesis::error::SdkError;
use aws_sdk_kinesis::operation::deregister_stream_consumer::{
    DeregisterStreamConsumerError, DeregisterStreamConsumerOutput,
};
use aws_sdk_kinesis::operation::describe_stream_consumer::{
    DescribeStreamConsumerError, DescribeStreamConsumerOutput,
};
use aws_sdk_kinesis::operation::describe_stream_summary::{
    DescribeStreamSummaryError, DescribeStreamSummaryOutput,
};
use aws_sdk_kinesis::operation::register_stream_consumer::{
    RegisterStreamConsumerError, RegisterStreamConsumerOutput,
};
use aws_sdk_kinesis::operation::subscribe_to_shard::{
    SubscribeToShardError, SubscribeToShardOutput,
};
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::error::SubscribeToShardEventStreamError;
use aws_sdk_kinesis::types::{ShardIteratorType, StartingPosition, SubscribeToShardEventStream};
use aws_smithy_types::event_stream::RawMessage;

use crate::calls::IteratorStart;
use crate::calls::classify::{Classified, classify_with, known_codes};

/// An error read from an open event stream.
pub(crate) type StreamError = SdkError<SubscribeToShardEventStreamError, RawMessage>;

/// The events of one subscription.
#[async_trait]
pub(crate) trait EventStream: Send + fmt::Debug {
    /// The next event; `Ok(None)` once the service ended the subscription.
    async fn recv(&mut self) -> Result<Option<SubscribeToShardEventStream>, StreamError>;
}

/// The calls behind enhanced fan-out.
#[async_trait]
pub(crate) trait FanOutApi: Send + Sync + fmt::Debug {
    async fn describe_stream_summary(
        &self,
        stream: &str,
    ) -> Result<DescribeStreamSummaryOutput, SdkError<DescribeStreamSummaryError>>;

    async fn describe_stream_consumer(
        &self,
        stream_arn: &str,
        consumer_name: &str,
    ) -> Result<DescribeStreamConsumerOutput, SdkError<DescribeStreamConsumerError>>;

    async fn register_stream_consumer(
        &self,
        stream_arn: &str,
        consumer_name: &str,
    ) -> Result<RegisterStreamConsumerOutput, SdkError<RegisterStreamConsumerError>>;

    async fn deregister_stream_consumer(
        &self,
        consumer_arn: &str,
    ) -> Result<DeregisterStreamConsumerOutput, SdkError<DeregisterStreamConsumerError>>;

    /// Opens a subscription. The returned stream must stop the underlying
    /// request when dropped.
    async fn subscribe_to_shard(
        &self,
        consumer_arn: &str,
        shard_id: &str,
        start: &IteratorStart,
    ) -> Result<Box<dyn EventStream>, SdkError<SubscribeToShardError>>;
}

/// A live `SubscribeToShard` response. Dropping it drops the response
/// body, which closes the HTTP/2 stream (or HTTP/1.1 connection): the
/// service sees the subscription end.
#[derive(Debug)]
struct SdkEvents(SubscribeToShardOutput);

#[async_trait]
impl EventStream for SdkEvents {
    async fn recv(&mut self) -> Result<Option<SubscribeToShardEventStream>, StreamError> {
        self.0.event_stream.recv().await
    }
}

/// The SDK's starting position for an [`IteratorStart`].
pub(crate) fn starting_position(
    start: &IteratorStart,
) -> Result<StartingPosition, aws_sdk_kinesis::error::BuildError> {
    let builder = StartingPosition::builder();
    let builder = match start {
        IteratorStart::TrimHorizon => builder.r#type(ShardIteratorType::TrimHorizon),
        IteratorStart::Latest => builder.r#type(ShardIteratorType::Latest),
        IteratorStart::AtTimestamp(t) => builder
            .r#type(ShardIteratorType::AtTimestamp)
            .timestamp(DateTime::from(*t)),
        IteratorStart::AtSequence(seq) => builder
            .r#type(ShardIteratorType::AtSequenceNumber)
            .sequence_number(seq),
        IteratorStart::AfterSequence(seq) => builder
            .r#type(ShardIteratorType::AfterSequenceNumber)
            .sequence_number(seq),
    };
    builder.build()
}

#[async_trait]
impl FanOutApi for aws_sdk_kinesis::Client {
    async fn describe_stream_summary(
        &self,
        stream: &str,
    ) -> Result<DescribeStreamSummaryOutput, SdkError<DescribeStreamSummaryError>> {
        let (name, arn) = crate::arn::stream_fields(stream);
        self.describe_stream_summary()
            .set_stream_name(name)
            .set_stream_arn(arn)
            .send()
            .await
    }

    async fn describe_stream_consumer(
        &self,
        stream_arn: &str,
        consumer_name: &str,
    ) -> Result<DescribeStreamConsumerOutput, SdkError<DescribeStreamConsumerError>> {
        self.describe_stream_consumer()
            .stream_arn(stream_arn)
            .consumer_name(consumer_name)
            .send()
            .await
    }

    async fn register_stream_consumer(
        &self,
        stream_arn: &str,
        consumer_name: &str,
    ) -> Result<RegisterStreamConsumerOutput, SdkError<RegisterStreamConsumerError>> {
        self.register_stream_consumer()
            .stream_arn(stream_arn)
            .consumer_name(consumer_name)
            .send()
            .await
    }

    async fn deregister_stream_consumer(
        &self,
        consumer_arn: &str,
    ) -> Result<DeregisterStreamConsumerOutput, SdkError<DeregisterStreamConsumerError>> {
        self.deregister_stream_consumer()
            .consumer_arn(consumer_arn)
            .send()
            .await
    }

    async fn subscribe_to_shard(
        &self,
        consumer_arn: &str,
        shard_id: &str,
        start: &IteratorStart,
    ) -> Result<Box<dyn EventStream>, SdkError<SubscribeToShardError>> {
        let position = starting_position(start).map_err(SdkError::construction_failure)?;
        let out = self
            .subscribe_to_shard()
            .consumer_arn(consumer_arn)
            .shard_id(shard_id)
            .starting_position(position)
            .send()
            .await?;
        Ok(Box::new(SdkEvents(out)))
    }
}

known_codes!(DescribeStreamSummaryError {
    LimitExceededException => "LimitExceededException",
    ResourceNotFoundException => "ResourceNotFoundException",
    AccessDeniedException => "AccessDeniedException",
});

known_codes!(DescribeStreamConsumerError {
    LimitExceededException => "LimitExceededException",
    ResourceNotFoundException => "ResourceNotFoundException",
});

known_codes!(RegisterStreamConsumerError {
    LimitExceededException => "LimitExceededException",
    ResourceInUseException => "ResourceInUseException",
    ResourceNotFoundException => "ResourceNotFoundException",
});

known_codes!(DeregisterStreamConsumerError {
    LimitExceededException => "LimitExceededException",
    ResourceNotFoundException => "ResourceNotFoundException",
});

known_codes!(SubscribeToShardError {
    LimitExceededException => "LimitExceededException",
    ResourceInUseException => "ResourceInUseException",
    ResourceNotFoundException => "ResourceNotFoundException",
    InvalidArgumentException => "InvalidArgumentException",
    AccessDeniedException => "AccessDeniedException",
});

// Exceptions inside the event stream carry their type in the message's
// `:exception-type` header, which the SDK turns into the variant but not
// always into the metadata's code (kinesis-mock's do not have it): the
// variant is the reliable source.
known_codes!(SubscribeToShardEventStreamError {
    ResourceInUseException => "ResourceInUseException",
    ResourceNotFoundException => "ResourceNotFoundException",
    KmsThrottlingException => "KMSThrottlingException",
    InternalFailureException => "InternalFailureException",
    KmsAccessDeniedException => "KMSAccessDeniedException",
    KmsDisabledException => "KMSDisabledException",
    KmsInvalidStateException => "KMSInvalidStateException",
    KmsNotFoundException => "KMSNotFoundException",
    KmsOptInRequired => "KMSOptInRequired",
});

/// The error code that means another subscription still holds the shard
/// for this consumer.
pub(crate) const IN_USE: &str = "ResourceInUseException";

/// Classifies an error read from an open event stream, like
/// [`crate::calls::classify::classify`] does for responses.
pub(crate) fn classify_stream(err: StreamError) -> Classified {
    // The service ends a subscription with ResourceInUse when it moves it
    // (another subscriber took over) and with InternalFailure when it fails
    // internally; subscribing again is the documented reaction to both,
    // which `class_of` gives. An event-stream message has no HTTP status of
    // its own.
    classify_with(err, |_| 400)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use aws_sdk_kinesis::types::error::{InternalFailureException, ResourceInUseException};

    use super::*;
    use crate::calls::classify::Class;

    #[test]
    fn starting_positions() {
        let cases = [
            (IteratorStart::TrimHorizon, ShardIteratorType::TrimHorizon),
            (IteratorStart::Latest, ShardIteratorType::Latest),
            (
                IteratorStart::AtSequence("1".into()),
                ShardIteratorType::AtSequenceNumber,
            ),
            (
                IteratorStart::AfterSequence("1".into()),
                ShardIteratorType::AfterSequenceNumber,
            ),
            (
                IteratorStart::AtTimestamp(SystemTime::UNIX_EPOCH + Duration::from_secs(5)),
                ShardIteratorType::AtTimestamp,
            ),
        ];
        for (start, kind) in cases {
            let p = starting_position(&start).expect("position");
            assert_eq!(p.r#type(), &kind);
            match start {
                IteratorStart::AtSequence(s) | IteratorStart::AfterSequence(s) => {
                    assert_eq!(p.sequence_number(), Some(s.as_str()));
                }
                IteratorStart::AtTimestamp(_) => {
                    assert_eq!(p.timestamp().map(|t| t.secs()), Some(5));
                }
                _ => assert_eq!(p.sequence_number(), None),
            }
        }
    }

    #[test]
    fn stream_errors() {
        let in_use = classify_stream(SdkError::service_error(
            SubscribeToShardEventStreamError::ResourceInUseException(
                ResourceInUseException::builder().build(),
            ),
            RawMessage::invalid(None),
        ));
        assert_eq!(
            (in_use.class, in_use.code.as_deref()),
            (Class::Transient, Some(IN_USE))
        );
        let internal = classify_stream(SdkError::service_error(
            SubscribeToShardEventStreamError::InternalFailureException(
                InternalFailureException::builder().build(),
            ),
            RawMessage::invalid(None),
        ));
        assert_eq!(internal.class, Class::Transient);
        let dropped = classify_stream(SdkError::response_error(
            "connection reset",
            RawMessage::invalid(None),
        ));
        assert_eq!(dropped.class, Class::Transient);
    }
}
