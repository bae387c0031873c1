//! Support code for kcl's end-to-end tests, which run against the Kinesis and
//! DynamoDB emulators started by `localstack/up` (or any endpoint the standard
//! `AWS_*` environment variables point at).
//!
//! # Layout
//!
//! - [`TestEnv`]: SDK config and clients built from the environment, after a
//!   check that the emulators are configured and answer. Tests never skip
//!   silently: without emulators they fail with instructions.
//! - [`unique_name`]: per-test stream and table names, so tests can share one
//!   emulator and run in parallel.
//! - Kinesis helpers: [`create_stream`], [`wait_for_stream_active`],
//!   [`delete_stream`], [`list_all_shards`], [`put_records`] /
//!   [`put_sequenced_records`] with [`TestRecord`] payloads such as `"pk-3:17"`,
//!   and [`read_shard`].
//! - DynamoDB helpers: [`create_lease_table`], [`delete_table`],
//!   [`table_exists`].
//!
//! Every helper paginates where the API does and bounds every wait with a
//! timeout, so a misbehaving emulator fails a test instead of hanging it.
//!
//! # Concurrency model
//!
//! Nothing here spawns tasks. Clients are built per test: each `#[tokio::test]`
//! has its own runtime, and an SDK client's connection pool must not outlive the
//! runtime that created it, so clients are not shared through statics.

pub mod counting;
pub mod e2e;
pub mod fault_proxy;
pub mod java_kcl;
pub mod latency;
pub mod sdk_http;
pub mod skew;

// Streams and tables are created and deleted as the demo does its own,
// and waited for as it waits.
use kcl_cli::demo::resources::found;
pub use kcl_cli::demo::resources::{
    STATUS_TIMEOUT, create_stream, delete_stream, delete_table, until_active,
    wait_for_stream_active,
};

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, Record, Shard, ShardIteratorType};

/// How long [`TestEnv::connect`] waits for each emulator to answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Most records one `PutRecords` call accepts.
pub const PUT_RECORDS_MAX_BATCH: usize = 500;

/// Environment variable that allows the tests to run against real AWS (no
/// endpoint override). Without it, a missing endpoint is an error: the tests
/// create and delete streams, which costs money on a real account.
pub const ALLOW_REAL_AWS_VAR: &str = "KCL_TESTS_ALLOW_REAL_AWS";

const HOW_TO_START: &str = "start them with `localstack/up` and `. localstack/.run/env`, \
     or run `make test` (with Docker: `docker compose up -d`, \
     `export AWS_ENDPOINT_URL=http://localhost:4566`)";

static NAME_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Returns a name no other test (in this or a concurrent process) uses:
/// `<prefix>-<pid>-<counter>-<random hex>`.
///
/// The result is valid as a Kinesis stream name and a DynamoDB table name
/// provided `prefix` is made of `[A-Za-z0-9_.-]` and is at most 90 characters.
pub fn unique_name(prefix: &str) -> String {
    let n = NAME_COUNTER.fetch_add(1, Ordering::Relaxed);
    let suffix: u32 = rand::random();
    format!("{prefix}-{}-{n}-{suffix:08x}", std::process::id())
}

/// The SDK configuration and clients a test uses, built from the standard
/// environment (`AWS_ENDPOINT_URL_KINESIS`, `AWS_ENDPOINT_URL_DYNAMODB`,
/// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, ...).
#[derive(Debug, Clone)]
pub struct TestEnv {
    config: SdkConfig,
    kinesis: aws_sdk_kinesis::Client,
    dynamodb: aws_sdk_dynamodb::Client,
}

impl TestEnv {
    /// Loads the SDK config from the environment and checks that both services
    /// answer a real API call.
    ///
    /// Fails, with instructions, when no endpoint override is configured
    /// (unless [`ALLOW_REAL_AWS_VAR`] is set) or when an emulator does not
    /// answer within [`CONNECT_TIMEOUT`].
    pub async fn connect() -> anyhow::Result<Self> {
        check_endpoint_vars()?;
        let config = aws_config::defaults(BehaviorVersion::latest()).load().await;
        let env = Self {
            kinesis: aws_sdk_kinesis::Client::new(&config),
            dynamodb: aws_sdk_dynamodb::Client::new(&config),
            config,
        };
        env.ping().await?;
        Ok(env)
    }

    /// The loaded SDK configuration, for building other clients (such as the
    /// ones kcl's `Worker` builds).
    pub fn sdk_config(&self) -> &SdkConfig {
        &self.config
    }

    /// The Kinesis client.
    pub fn kinesis(&self) -> &aws_sdk_kinesis::Client {
        &self.kinesis
    }

    /// The DynamoDB client.
    pub fn dynamodb(&self) -> &aws_sdk_dynamodb::Client {
        &self.dynamodb
    }

    async fn ping(&self) -> anyhow::Result<()> {
        let kinesis = self.kinesis.list_streams().limit(1).send();
        answers("Kinesis", "KINESIS", "ListStreams", kinesis).await?;
        let dynamodb = self.dynamodb.list_tables().limit(1).send();
        answers("DynamoDB", "DYNAMODB", "ListTables", dynamodb).await
    }
}

/// Fails, saying how to start the emulators, unless `call` (`service`'s
/// `operation`, its endpoint in `AWS_ENDPOINT_URL_{var}`) succeeds within
/// [`CONNECT_TIMEOUT`].
async fn answers<T, E: std::error::Error>(
    service: &str,
    var: &str,
    operation: &str,
    call: impl Future<Output = Result<T, E>>,
) -> anyhow::Result<()> {
    match tokio::time::timeout(CONNECT_TIMEOUT, call).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => bail!(
            "{service} at {} does not answer {operation} ({}); {HOW_TO_START}",
            endpoint_for(var),
            // Every SDK crate re-exports aws-smithy-types' one type.
            aws_sdk_kinesis::error::DisplayErrorContext(&e)
        ),
        Err(_) => bail!(
            "{service} at {} did not answer {operation} within {CONNECT_TIMEOUT:?}; {HOW_TO_START}",
            endpoint_for(var)
        ),
    }
}

/// The DynamoDB emulator's endpoint, for a client or a proxy of the test's
/// own; panics when it is not set.
pub fn dynamodb_endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL_DYNAMODB")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .expect("AWS_ENDPOINT_URL_DYNAMODB (start the emulators: localstack/up)")
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn endpoint_for(service: &str) -> String {
    env_var(&format!("AWS_ENDPOINT_URL_{service}"))
        .or_else(|| env_var("AWS_ENDPOINT_URL"))
        .unwrap_or_else(|| "the default AWS endpoint".to_owned())
}

fn check_endpoint_vars() -> anyhow::Result<()> {
    if env_var(ALLOW_REAL_AWS_VAR).is_some() {
        return Ok(());
    }
    let general = env_var("AWS_ENDPOINT_URL").is_some();
    let missing: Vec<&str> = ["AWS_ENDPOINT_URL_KINESIS", "AWS_ENDPOINT_URL_DYNAMODB"]
        .into_iter()
        .filter(|var| !general && env_var(var).is_none())
        .collect();
    ensure!(
        missing.is_empty(),
        "the end-to-end tests need the Kinesis and DynamoDB emulators, but {} {} not set; \
         {HOW_TO_START}. To run against real AWS instead, set {ALLOW_REAL_AWS_VAR}=1.",
        missing.join(" and "),
        if missing.len() == 1 { "is" } else { "are" },
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Kinesis
// ---------------------------------------------------------------------------

/// Lists every shard of a stream, open and closed, following `NextToken`.
pub async fn list_all_shards(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
) -> anyhow::Result<Vec<Shard>> {
    Ok(list_shards_paged(kinesis, stream, None).await?.shards)
}

/// The ARN of a stream.
pub async fn stream_arn(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> anyhow::Result<String> {
    Ok(kinesis
        .describe_stream_summary()
        .stream_name(stream)
        .send()
        .await
        .with_context(|| format!("DescribeStreamSummary {stream}"))?
        .stream_description_summary()
        .context("no stream summary")?
        .stream_arn()
        .to_owned())
}

/// One PutRecords call of `entries` on `stream`. The entries it rejects
/// are in the output, for the caller to retry or count.
pub async fn put_entries(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    entries: Vec<PutRecordsRequestEntry>,
) -> anyhow::Result<aws_sdk_kinesis::operation::put_records::PutRecordsOutput> {
    let n = entries.len();
    kinesis
        .put_records()
        .stream_name(stream)
        .set_records(Some(entries))
        .send()
        .await
        .with_context(|| format!("PutRecords {stream} ({n} records)"))
}

/// `(shard id, starting hash key)` of every shard of a stream, in the
/// order [`list_all_shards`] returns them.
pub async fn shard_hash_keys(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    Ok(list_all_shards(kinesis, stream)
        .await?
        .iter()
        .map(|s| {
            let hash = s
                .hash_key_range()
                .map(|r| r.starting_hash_key().to_owned())
                .unwrap_or_default();
            (s.shard_id().to_owned(), hash)
        })
        .collect())
}

/// The result of [`list_shards_paged`].
#[derive(Debug, Clone)]
pub struct ShardListing {
    /// Every shard, in the order the pages returned them.
    pub shards: Vec<Shard>,
    /// How many `ListShards` calls it took.
    pub pages: usize,
}

/// Lists every shard of a stream with at most `page_size` shards per
/// `ListShards` call (the service default when `None`), following `NextToken`.
pub async fn list_shards_paged(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    page_size: Option<i32>,
) -> anyhow::Result<ShardListing> {
    let mut shards = Vec::new();
    let mut pages = 0;
    let mut next_token: Option<String> = None;
    loop {
        // With a NextToken the request must not name the stream (or filter).
        let request = match &next_token {
            Some(token) => kinesis.list_shards().next_token(token),
            None => kinesis.list_shards().stream_name(stream),
        };
        let out = request
            .set_max_results(page_size)
            .send()
            .await
            .with_context(|| format!("ListShards {stream} (page {})", pages + 1))?;
        pages += 1;
        shards.extend(out.shards().iter().cloned());
        match out.next_token() {
            Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
            _ => break,
        }
        ensure!(pages < 10_000, "ListShards {stream}: NextToken never ended");
    }
    Ok(ShardListing { shards, pages })
}

/// A record the tests put: partition key `pk-<key>`, payload
/// `pk-<key>:<counter>`, so a consumer can check per-key order and
/// completeness from the payload alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TestRecord {
    /// Index of the partition key (`pk-<key>`).
    pub key: u32,
    /// Position of this record within its key, from 0.
    pub counter: u64,
}

impl TestRecord {
    /// The partition key, `pk-<key>`.
    pub fn partition_key(&self) -> String {
        format!("pk-{}", self.key)
    }

    /// The payload, `pk-<key>:<counter>`.
    pub fn payload(&self) -> String {
        format!("pk-{}:{}", self.key, self.counter)
    }

    /// The payload padded to `bytes` bytes (`pk-<key>:<counter>#...`), for
    /// records of a given size; [`TestRecord::parse`] reads it back.
    pub fn padded(&self, bytes: usize) -> String {
        let mut payload = format!("{}#", self.payload());
        let pad = bytes.saturating_sub(payload.len());
        payload.extend(std::iter::repeat_n('.', pad));
        payload
    }

    /// Parses a payload written by [`TestRecord::payload`], or by
    /// [`TestRecord::padded`] (what follows `#` is padding); `None` for
    /// anything else.
    pub fn parse(data: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(data).ok()?;
        let text = text.split_once('#').map_or(text, |(record, _)| record);
        let (key, counter) = text.strip_prefix("pk-")?.split_once(':')?;
        Some(Self {
            key: key.parse().ok()?,
            counter: counter.parse().ok()?,
        })
    }
}

/// `per_key` records for each of `keys` partition keys, interleaved
/// (`pk-0:0, pk-1:0, ..., pk-0:1, ...`) so that every batch spreads over
/// the shards.
pub fn sequenced_records(keys: u32, per_key: u64) -> Vec<TestRecord> {
    (0..per_key)
        .flat_map(|counter| (0..keys).map(move |key| TestRecord { key, counter }))
        .collect()
}

/// Where a record put by [`put_records`] landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentRecord {
    /// The record that was put.
    pub record: TestRecord,
    /// The shard Kinesis assigned it to.
    pub shard_id: String,
    /// Its sequence number in that shard.
    pub sequence_number: String,
}

/// Puts `records` with `PutRecords`, [`PUT_RECORDS_MAX_BATCH`] at a time,
/// retrying entries the service rejected (throttling) a bounded number of
/// times. Returns where each record landed, in the order given.
///
/// A retried entry lands after records of the same key that were sent after
/// it; tests that check per-key order should compare sequence numbers from the
/// result rather than assume the input order.
pub async fn put_records(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    records: &[TestRecord],
) -> anyhow::Result<Vec<SentRecord>> {
    const MAX_ATTEMPTS: u32 = 10;
    let mut sent: Vec<Option<SentRecord>> = vec![None; records.len()];
    for (chunk_index, chunk) in records.chunks(PUT_RECORDS_MAX_BATCH).enumerate() {
        let base = chunk_index * PUT_RECORDS_MAX_BATCH;
        let mut pending: Vec<usize> = (base..base + chunk.len()).collect();
        let mut attempt = 0;
        while !pending.is_empty() {
            attempt += 1;
            ensure!(
                attempt <= MAX_ATTEMPTS,
                "PutRecords {stream}: {} records still rejected after {MAX_ATTEMPTS} attempts",
                pending.len()
            );
            let entries = pending
                .iter()
                .map(|&i| {
                    let record = &records[i];
                    PutRecordsRequestEntry::builder()
                        .partition_key(record.partition_key())
                        .data(Blob::new(record.payload()))
                        .build()
                        .context("building PutRecordsRequestEntry")
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let out = put_entries(kinesis, stream, entries).await?;
            ensure!(
                out.records().len() == pending.len(),
                "PutRecords {stream}: {} results for {} entries",
                out.records().len(),
                pending.len()
            );
            let mut rejected = Vec::new();
            for (&i, result) in pending.iter().zip(out.records()) {
                match (result.shard_id(), result.sequence_number()) {
                    (Some(shard_id), Some(sequence_number)) if result.error_code().is_none() => {
                        sent[i] = Some(SentRecord {
                            record: records[i].clone(),
                            shard_id: shard_id.to_owned(),
                            sequence_number: sequence_number.to_owned(),
                        });
                    }
                    _ => rejected.push(i),
                }
            }
            pending = rejected;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
        }
    }
    sent.into_iter()
        .enumerate()
        .map(|(i, s)| s.with_context(|| format!("record {i} was never accepted")))
        .collect()
}

/// Puts [`sequenced_records`]`(keys, per_key)`; see [`put_records`].
pub async fn put_sequenced_records(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    keys: u32,
    per_key: u64,
) -> anyhow::Result<Vec<SentRecord>> {
    put_records(kinesis, stream, &sequenced_records(keys, per_key)).await
}

/// Reads a shard from TRIM_HORIZON with `GetRecords` until it is caught up
/// (an empty response at `MillisBehindLatest == 0`) or closed (no next
/// iterator), failing after [`STATUS_TIMEOUT`].
pub async fn read_shard(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    shard_id: &str,
) -> anyhow::Result<Vec<Record>> {
    let read = async {
        let mut iterator = kinesis
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(shard_id)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .with_context(|| format!("GetShardIterator {stream}/{shard_id}"))?
            .shard_iterator()
            .map(str::to_owned);
        let mut records = Vec::new();
        while let Some(current) = iterator {
            let out = kinesis
                .get_records()
                .shard_iterator(current)
                .send()
                .await
                .with_context(|| format!("GetRecords {stream}/{shard_id}"))?;
            let caught_up =
                out.records().is_empty() && out.millis_behind_latest().unwrap_or(0) == 0;
            records.extend(out.records().iter().cloned());
            iterator = out.next_shard_iterator().map(str::to_owned);
            if caught_up {
                break;
            }
        }
        anyhow::Ok(records)
    };
    tokio::time::timeout(STATUS_TIMEOUT, read)
        .await
        .with_context(|| format!("reading {stream}/{shard_id} took over {STATUS_TIMEOUT:?}"))?
}

// ---------------------------------------------------------------------------
// DynamoDB
// ---------------------------------------------------------------------------

/// Creates an on-demand table keyed by the string attribute `leaseKey` (the
/// lease table layout) and waits until it is ACTIVE.
pub async fn create_lease_table(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> anyhow::Result<()> {
    create_keyed_table(dynamodb, table, "leaseKey", ScalarAttributeType::S).await
}

/// Creates an on-demand table whose partition key is the attribute `key`
/// of type `key_type`, and waits until it is ACTIVE.
pub async fn create_keyed_table(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
    key: &str,
    key_type: ScalarAttributeType,
) -> anyhow::Result<()> {
    dynamodb
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(key_type)
                .build()
                .context("building AttributeDefinition")?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .context("building KeySchemaElement")?,
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .with_context(|| format!("CreateTable {table}"))?;
    until_active(
        &format!("table {table}"),
        STATUS_TIMEOUT,
        move || async move {
            let out = dynamodb
                .describe_table()
                .table_name(table)
                .send()
                .await
                .with_context(|| format!("DescribeTable {table}"))?;
            Ok(out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active))
        },
    )
    .await
}

/// Whether a table exists, in any status.
pub async fn table_exists(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> anyhow::Result<bool> {
    let answer = dynamodb.describe_table().table_name(table).send().await;
    let described = found(
        answer,
        |e| e.is_resource_not_found_exception(),
        || format!("DescribeTable {table}"),
    )?;
    Ok(described.is_some())
}

/// Splits an open shard at the middle of its hash-key range and waits until
/// the stream is ACTIVE again. Returns the new children's ids.
pub async fn split_shard_in_half(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    shard_id: &str,
) -> anyhow::Result<Vec<String>> {
    let shards = list_all_shards(kinesis, stream).await?;
    let shard = shards
        .iter()
        .find(|s| s.shard_id() == shard_id)
        .with_context(|| format!("shard {shard_id} not in {stream}"))?;
    let range = shard
        .hash_key_range()
        .context("shard without hash key range")?;
    let lo: u128 = range.starting_hash_key().parse()?;
    let hi: u128 = range.ending_hash_key().parse()?;
    kinesis
        .split_shard()
        .stream_name(stream)
        .shard_to_split(shard_id)
        .new_starting_hash_key((lo + (hi - lo) / 2 + 1).to_string())
        .send()
        .await
        .with_context(|| format!("SplitShard {shard_id}"))?;
    wait_for_stream_active(kinesis, stream, STATUS_TIMEOUT).await?;
    let after = list_all_shards(kinesis, stream).await?;
    Ok(after
        .iter()
        .filter(|s| s.parent_shard_id() == Some(shard_id))
        .map(|s| s.shard_id().to_owned())
        .collect())
}

/// Merges two adjacent open shards and waits until the stream is ACTIVE
/// again. Returns the child's id.
pub async fn merge_shards(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    shard: &str,
    adjacent: &str,
) -> anyhow::Result<String> {
    kinesis
        .merge_shards()
        .stream_name(stream)
        .shard_to_merge(shard)
        .adjacent_shard_to_merge(adjacent)
        .send()
        .await
        .with_context(|| format!("MergeShards {shard} + {adjacent}"))?;
    wait_for_stream_active(kinesis, stream, STATUS_TIMEOUT).await?;
    let after = list_all_shards(kinesis, stream).await?;
    after
        .iter()
        .find(|s| s.parent_shard_id() == Some(shard) || s.adjacent_parent_shard_id() == Some(shard))
        .map(|s| s.shard_id().to_owned())
        .context("merged child not listed")
}

/// One HTTP/1.0 GET (the server closes after the response), for the
/// worker's metrics and health endpoint: status and body, or the
/// connection error.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await
    .map_err(|_| std::io::Error::other("no response within 10s"))??;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {response:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    Ok((status, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips() {
        let record = TestRecord {
            key: 3,
            counter: 17,
        };
        assert_eq!(record.partition_key(), "pk-3");
        assert_eq!(record.payload(), "pk-3:17");
        assert_eq!(TestRecord::parse(b"pk-3:17"), Some(record));
        assert_eq!(TestRecord::parse(b"pk-3"), None);
        assert_eq!(TestRecord::parse(b"xx-3:1"), None);
        assert_eq!(TestRecord::parse(&[0xff, 0xfe]), None);
    }

    #[test]
    fn sequenced_records_interleave_keys() {
        let records = sequenced_records(2, 2);
        let payloads: Vec<String> = records.iter().map(TestRecord::payload).collect();
        assert_eq!(payloads, ["pk-0:0", "pk-1:0", "pk-0:1", "pk-1:1"]);
    }

    #[test]
    fn unique_names_differ_and_are_valid() {
        let a = unique_name("kcl-test");
        let b = unique_name("kcl-test");
        assert_ne!(a, b);
        assert!(a.starts_with("kcl-test-"));
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        );
        assert!(a.len() <= 128);
    }
}
