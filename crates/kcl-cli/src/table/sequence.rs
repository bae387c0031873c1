//! A sequence number given to `kcl leases reset --to`, checked against its
//! shard before anything is written. Written unchecked, a number of another
//! shard, of a deleted stream or mistyped made the next owner's first read
//! fail: below the shard's oldest record it was read from TRIM_HORIZON
//! again ("DATA LOSS"), otherwise the shard was given back every few reads
//! by every worker, and never read again.

use anyhow::{Context as _, bail};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_kinesis::types::ShardIteratorType;
use kcl::core::Lease;
use kcl_dynamodb::schema::{STREAM_CLAIM_KEY, liveness, workers_table_for};

use super::Table;
use crate::aws;
use crate::view::stream_name;

/// Fails, naming the shard and the stream, unless Kinesis starts a read of
/// `lease`'s shard at `seq`. The stream is `stream` (`--stream`: a name or
/// an ARN) if given, else the one the lease key names (multi-stream
/// tables), else the one the table serves (single-stream tables record it
/// beside their workers' liveness records).
pub(super) async fn check_in_shard(
    table: &Table,
    lease: &Lease,
    seq: &str,
    stream: Option<&str>,
) -> anyhow::Result<()> {
    let stream = match stream {
        Some(s) => s.to_owned(),
        None => match &lease.stream {
            Some(id) => stream_name(id),
            None => served_stream(table).await?,
        },
    };
    let shard = &lease.shard_id;
    let kinesis = aws_sdk_kinesis::Client::new(&aws::sdk_config(true).await);
    let request = kinesis
        .get_shard_iterator()
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
        .starting_sequence_number(seq);
    let request = if stream.starts_with("arn:") {
        request.stream_arn(&stream)
    } else {
        request.stream_name(&stream)
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

/// The stream a single-stream lease table serves, by name: an error
/// asking for `--stream` when the table records none.
async fn served_stream(table: &Table) -> anyhow::Result<String> {
    let workers = workers_table_for(table.name());
    let read = table
        .store
        .client()
        .get_item()
        .table_name(&workers)
        .key(
            liveness::INSTANCE,
            AttributeValue::S(STREAM_CLAIM_KEY.into()),
        )
        .consistent_read(true)
        .send()
        .await;
    let claim = match read {
        Ok(out) => out
            .item
            .and_then(|mut item| item.remove(liveness::SERVES_STREAM))
            .and_then(|v| v.as_s().ok().cloned()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            None
        }
        Err(e) => {
            return Err(aws::sdk_error(
                "DYNAMODB",
                format!(
                    "reading the stream table {} serves, in {workers}",
                    table.name()
                ),
                e,
            ))
            .context("add --stream to name the stream");
        }
    };
    match claim {
        Some(identifier) => Ok(stream_name(&identifier)),
        None => bail!(
            "table {} records no stream it serves (it does once a kcl worker has started): \
             add --stream so that the sequence number can be checked against the shard; \
             nothing was written",
            table.name()
        ),
    }
}
