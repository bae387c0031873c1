//! A sequence number given to `kcl leases reset --to`, checked against its
//! shard before anything is written. Written unchecked, a number of another
//! shard, of a deleted stream or mistyped made the next owner's first read
//! fail: below the shard's oldest record it was read from TRIM_HORIZON
//! again ("DATA LOSS"), otherwise the shard was given back every few reads
//! by every worker, and never read again.

use anyhow::bail;
use aws_sdk_kinesis::types::ShardIteratorType;
use kcl::core::Lease;

use super::Table;
use super::streams::{Target, target};
use crate::aws;

/// Fails, naming the shard and the stream, unless Kinesis starts a read of
/// `lease`'s shard at `seq` in the lease's own stream: the one the lease
/// key names (multi-stream tables), else the one the table records
/// serving, else `stream` (`--stream`: a name, an identifier or an ARN).
/// A stream known by its identifier must still be the one created then:
/// the positions of a stream deleted and created again under its name are
/// not the new one's.
///
/// With `force`, a stream created at another time than the identifier says
/// is warned of and checked in as it is: the Java KCL takes a multi-stream
/// lease's creation time from its application, unchecked.
pub(super) async fn check_in_shard(
    table: &Table,
    lease: &Lease,
    seq: &str,
    stream: Option<&str>,
    force: bool,
) -> anyhow::Result<()> {
    let identifier = match (&lease.stream, stream) {
        (Some(id), _) => Some(id.clone()),
        (None, Some(_)) => table.served_stream_or_warn().await?,
        (None, None) => table.served_stream().await?,
    };
    let sdk = table.sdk();
    let target = target(
        identifier.as_deref(),
        stream,
        sdk.region().map(|r| r.as_ref()),
    )?;
    let kinesis = aws_sdk_kinesis::Client::new(sdk);
    if let Some(created) = target.created {
        match same_stream(&kinesis, &target, created).await {
            Err(e) if force => say!("warning: {e:#}; --force: checking in it as it is"),
            checked => checked?,
        }
    }
    let shard = &lease.shard_id;
    let stream = &target.address;
    let request = kinesis
        .get_shard_iterator()
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
        .starting_sequence_number(seq);
    let request = if stream.starts_with("arn:") {
        request.stream_arn(stream)
    } else {
        request.stream_name(stream)
    };
    let err = match request.send().await {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    // Kinesis refuses a number not in the shard as an invalid argument;
    // emulators answer that no such record exists. A missing stream or
    // shard is answered as not found too: the answer's message says which.
    let refused = err
        .as_service_error()
        .filter(|s| s.is_invalid_argument_exception() || s.is_resource_not_found_exception());
    if let Some(refused) = refused {
        bail!(
            "refusing to reset shard {shard} to {seq}: Kinesis starts no read of shard {shard} \
             of stream {stream} there ({}). The number must be one of this shard's records, \
             still retained; nothing was written",
            refused.meta().message().unwrap_or("no message")
        );
    }
    Err(aws::sdk_error(
        "KINESIS",
        format!(
            "cannot check that {seq} is a record of shard {shard} of stream {stream} \
             (the role needs kinesis:GetShardIterator); nothing was written"
        ),
        err,
    ))
}

/// Fails unless the stream at `target` was created at `created` (epoch
/// seconds): the one the lease is of, not another made since under its
/// name.
async fn same_stream(
    kinesis: &aws_sdk_kinesis::Client,
    target: &Target,
    created: i64,
) -> anyhow::Result<()> {
    let stream = &target.address;
    let request = kinesis.describe_stream_summary();
    let request = if stream.starts_with("arn:") {
        request.stream_arn(stream)
    } else {
        request.stream_name(stream)
    };
    let described = request.send().await.map_err(|e| {
        aws::sdk_error(
            "KINESIS",
            format!(
                "cannot describe stream {stream} to check the lease is of it (the role needs \
                 kinesis:DescribeStreamSummary); nothing was written"
            ),
            e,
        )
    })?;
    let now = described
        .stream_description_summary()
        .map(|s| s.stream_creation_timestamp().secs());
    if now != Some(created) {
        bail!(
            "refusing to reset to a sequence number: stream {stream} was created at {}, not at \
             {created} as this lease's key says (epoch seconds): if it was deleted and created \
             again, the old stream's positions mean nothing in the new one; if the key's time \
             was made up (the Java KCL takes it from the application), pass --force; nothing \
             was written",
            now.map_or_else(|| "an unknown time".to_owned(), |t| t.to_string())
        );
    }
    Ok(())
}
