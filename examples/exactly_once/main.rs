//! Counts records per partition key into a DynamoDB table, exactly once:
//! each batch's counter updates and its checkpoint commit in one
//! transaction, conditional on this worker's tenure of the shard's lease.
//! A crash, a pause past the lease or a rebalance never counts a record
//! twice, and never loses one.
//!
//! ```sh
//! localstack/up && . localstack/.run/env
//! cargo run -p kcl-examples --bin exactly-once -- my-stream   # table: my-stream-counts
//! ```
//!
//! The application name (which also names the lease table) is the second
//! argument, by default `<stream>-exactly-once`: a lease table serves one
//! stream, so each stream gets its own.

use std::collections::BTreeMap;

use anyhow::Context;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, TransactWriteItem, Update,
};
use kcl::{
    Checkpointer, ExactlyOnce, InitialPosition, ProcessorError, Record, RecordBatch,
    RecordProcessor, ShardContext, Transaction, Worker,
};

struct Counter {
    exactly_once: ExactlyOnce,
    table: String,
}

impl Counter {
    /// One transaction: an `ADD` per key, and the checkpoint at `through`.
    async fn commit(
        &self,
        checkpointer: &mut Checkpointer,
        counts: &BTreeMap<&str, u64>,
        through: &Record,
    ) -> Result<(), ProcessorError> {
        let mut tx = Transaction::new();
        for (key, n) in counts {
            let add = Update::builder()
                .table_name(&self.table)
                .key("key", AttributeValue::S((*key).to_owned()))
                .update_expression("ADD #count :n")
                .expression_attribute_names("#count", "count")
                .expression_attribute_values(":n", AttributeValue::N(n.to_string()))
                .build()?;
            tx.push(TransactWriteItem::builder().update(add).build())?;
        }
        self.exactly_once.commit(checkpointer, tx, through).await?;
        Ok(())
    }
}

#[kcl::async_trait]
impl RecordProcessor for Counter {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        checkpointer: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        // A batch retried after an error may start with records an earlier
        // commit of it already counted.
        let pending: Vec<&Record> = batch
            .records
            .iter()
            .filter(|r| !checkpointer.is_checkpointed(r))
            .collect();
        let room = Transaction::new().room();
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        let mut previous: Option<&Record> = None;
        for record in pending {
            // One operation per item per transaction: when a new key would
            // not fit, commit the records so far, checkpointed at the last.
            if !counts.contains_key(record.partition_key.as_str())
                && counts.len() == room
                && let Some(through) = previous
            {
                self.commit(checkpointer, &counts, through).await?;
                counts.clear();
            }
            *counts.entry(&record.partition_key).or_default() += 1;
            previous = Some(record);
        }
        if let Some(last) = previous {
            self.commit(checkpointer, &counts, last).await?;
        }
        Ok(())
    }
}

async fn create_table(client: &aws_sdk_dynamodb::Client, table: &str) -> anyhow::Result<()> {
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("key")
                .attribute_type(ScalarAttributeType::S)
                .build()?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("key")
                .key_type(KeyType::Hash)
                .build()?,
        )
        .send()
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) =>
        {
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("creating {table}")),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .init();
    let stream = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("KCL_STREAM").ok())
        .context("usage: exactly-once STREAM [APPLICATION] (or KCL_STREAM)")?;
    let app = std::env::args()
        .nth(2)
        .unwrap_or_else(|| format!("{stream}-exactly-once"));
    let app = app.as_str();
    let table = format!("{stream}-counts");
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
    create_table(&dynamodb, &table).await?;
    // The lease table is named after the application.
    let exactly_once = ExactlyOnce::new(dynamodb, app);
    let worker = Worker::builder(app)
        .stream(&stream)
        .sdk_config(&sdk)
        .initial_position(InitialPosition::TrimHorizon)
        .processor(move |_: &ShardContext| Counter {
            exactly_once: exactly_once.clone(),
            table: table.clone(),
        })
        .build()?;
    worker.run_until(kcl::shutdown_signal()).await?;
    Ok(())
}
