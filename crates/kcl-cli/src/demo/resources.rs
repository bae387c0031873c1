//! Creating the demo's stream and deleting it and its lease table. Public
//! because the end-to-end tests (the `kcl-tests` crate) create and delete
//! their streams and tables with the same calls.
//!
//! Every wait polls every 100 ms and is bounded: the SDK's own waiters
//! start at 10 s between polls, right for AWS and far too slow for an
//! emulator.

use std::time::Duration;

use anyhow::Context;
use aws_sdk_kinesis::types::StreamStatus;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;

/// How long [`create_stream`] waits for the new stream to become ACTIVE;
/// the tests' bound for every status change.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates a provisioned stream with `shards` shards and waits until it is
/// ACTIVE.
pub async fn create_stream(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    shards: i32,
) -> anyhow::Result<()> {
    kinesis
        .create_stream()
        .stream_name(stream)
        .shard_count(shards)
        .send()
        .await
        .with_context(|| format!("CreateStream {stream} with {shards} shards"))?;
    wait_for_stream_active(kinesis, stream, STATUS_TIMEOUT).await
}

/// Polls `DescribeStreamSummary` until the stream is ACTIVE, failing after
/// `timeout`. Use it after any change that makes a stream UPDATING (split,
/// merge, resharding).
pub async fn wait_for_stream_active(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    until_active(&format!("stream {stream}"), timeout, move || async move {
        let out = kinesis
            .describe_stream_summary()
            .stream_name(stream)
            .send()
            .await
            .with_context(|| format!("DescribeStreamSummary {stream}"))?;
        let status = out
            .stream_description_summary()
            .map(|s| s.stream_status().clone());
        Ok(status == Some(StreamStatus::Active))
    })
    .await
}

/// Asks `active` every 100 ms until it answers true, failing after
/// `timeout` with "`what` not ACTIVE".
pub async fn until_active<F, Fut>(
    what: &str,
    timeout: Duration,
    mut active: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let poll = async {
        loop {
            if active().await? {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(timeout, poll)
        .await
        .with_context(|| format!("{what} not ACTIVE after {timeout:?}"))?
}

/// Deletes a stream (and its consumers). Succeeds if the stream is already
/// gone.
pub async fn delete_stream(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> anyhow::Result<()> {
    let answer = kinesis
        .delete_stream()
        .stream_name(stream)
        .enforce_consumer_deletion(true)
        .send()
        .await;
    found(
        answer,
        |e| e.is_resource_not_found_exception(),
        || format!("DeleteStream {stream}"),
    )?;
    Ok(())
}

/// Deletes a table. Succeeds if it is already gone.
pub async fn delete_table(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> anyhow::Result<()> {
    let answer = dynamodb.delete_table().table_name(table).send().await;
    found(
        answer,
        |e| e.is_resource_not_found_exception(),
        || format!("DeleteTable {table}"),
    )?;
    Ok(())
}

/// The answer of a call on one resource, `None` where the resource is not
/// there (the service error `not_found` picks); `call` names it in an
/// error.
pub fn found<T, E>(
    answer: Result<T, SdkError<E, HttpResponse>>,
    not_found: impl FnOnce(&E) -> bool,
    call: impl FnOnce() -> String,
) -> anyhow::Result<Option<T>>
where
    E: std::error::Error + Send + Sync + 'static,
{
    match answer {
        Ok(out) => Ok(Some(out)),
        Err(e) if e.as_service_error().is_some_and(not_found) => Ok(None),
        Err(e) => Err(e).with_context(call),
    }
}
