//! Counting records per partition key into a DynamoDB table, the way the
//! exactly-once tests do it: either in one transaction with the checkpoint
//! (`ExactlyOnce`), or with plain updates and then a checkpoint
//! (at-least-once), so the two can be compared on the same faults.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use aws_sdk_dynamodb::types::{AttributeValue, ScalarAttributeType, TransactWriteItem, Update};
use kcl::{
    Checkpointer, ExactlyOnce, ProcessorError, Record, RecordBatch, RecordProcessor, Transaction,
};

/// The counter table's key attribute (the partition key counted).
pub const KEY: &str = "pk";
/// The count attribute.
pub const COUNT: &str = "n";

/// How the counts are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The counts and the checkpoint in one transaction.
    ExactlyOnce,
    /// One update per key, then a checkpoint.
    AtLeastOnce,
}

impl Mode {
    /// The spelling in `KCL_E2E_COUNT_MODE`.
    pub fn parse(s: &str) -> anyhow::Result<Mode> {
        match s {
            "exactly-once" => Ok(Mode::ExactlyOnce),
            "at-least-once" => Ok(Mode::AtLeastOnce),
            other => anyhow::bail!("count mode {other:?}: expected exactly-once or at-least-once"),
        }
    }

    /// The spelling in `KCL_E2E_COUNT_MODE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ExactlyOnce => "exactly-once",
            Mode::AtLeastOnce => "at-least-once",
        }
    }
}

/// Creates the counter table (on demand) and waits for it.
pub async fn create_table(dynamodb: &aws_sdk_dynamodb::Client, table: &str) -> anyhow::Result<()> {
    crate::create_keyed_table(dynamodb, table, KEY, ScalarAttributeType::S).await
}

/// Every key's count.
pub async fn counts(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> anyhow::Result<HashMap<String, u64>> {
    let items: Vec<HashMap<String, AttributeValue>> = dynamodb
        .scan()
        .table_name(table)
        .consistent_read(true)
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .with_context(|| format!("scanning {table}"))?;
    Ok(items
        .iter()
        .filter_map(|i| {
            let key = i.get(KEY)?.as_s().ok()?.clone();
            let n = i.get(COUNT)?.as_n().ok()?.parse().ok()?;
            Some((key, n))
        })
        .collect())
}

/// `ADD n :by` to `key`'s counter.
fn add(table: &str, key: &str, by: u64) -> anyhow::Result<Update> {
    Ok(Update::builder()
        .table_name(table)
        .key(KEY, AttributeValue::S(key.to_owned()))
        .update_expression("ADD #n :by")
        .expression_attribute_names("#n", COUNT)
        .expression_attribute_values(":by", AttributeValue::N(by.to_string()))
        .build()?)
}

/// Counts each batch's records per partition key.
#[derive(Debug)]
pub struct Counter {
    /// How the counts are written.
    pub mode: Mode,
    /// The client for the counter table.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// The counter table.
    pub table: String,
    /// Commits transactions (the worker's lease table).
    pub exactly_once: ExactlyOnce,
    /// Work between writing the counts and checkpointing, so that a kill or
    /// a pause lands between them now and then.
    pub work: Duration,
    /// A file the first process to get there creates (fleet-wide, once),
    /// writing `<pid> <records>` in it, right after a batch's counts are
    /// durable (in exactly-once, with its checkpoint; in at-least-once,
    /// before it): that process then stalls for good, for the test to kill
    /// it at a known point rather than a random one.
    pub stall_once: Option<PathBuf>,
}

impl Counter {
    /// Stalls for good if this process is the first to reach
    /// [`Counter::stall_once`], after a batch of `records` records.
    async fn stall_once(&self, records: usize) -> std::io::Result<()> {
        let Some(path) = &self.stall_once else {
            return Ok(());
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(mut f) => {
                f.write_all(format!("{} {records}\n", std::process::id()).as_bytes())?;
                std::future::pending::<()>().await;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Commits `counts` and the checkpoint at `through`.
    async fn commit(
        &self,
        cp: &mut Checkpointer,
        counts: &BTreeMap<String, u64>,
        through: &Record,
    ) -> Result<(), ProcessorError> {
        let mut tx = Transaction::new();
        for (key, n) in counts {
            tx.push(
                TransactWriteItem::builder()
                    .update(add(&self.table, key, *n)?)
                    .build(),
            )?;
        }
        tokio::time::sleep(self.work).await;
        self.exactly_once.commit(cp, tx, through).await?;
        Ok(())
    }
}

#[kcl::async_trait]
impl RecordProcessor for Counter {
    async fn process_records(
        &mut self,
        batch: &RecordBatch,
        cp: &mut Checkpointer,
    ) -> Result<(), ProcessorError> {
        // A batch retried after a failure may begin with records an earlier
        // commit inside it already counted.
        let records: Vec<&Record> = batch
            .records
            .iter()
            .filter(|r| !cp.is_checkpointed(r))
            .collect();
        let Some(last) = records.last().copied() else {
            return Ok(());
        };
        match self.mode {
            Mode::AtLeastOnce => {
                let mut counts: BTreeMap<String, u64> = BTreeMap::new();
                for r in &records {
                    *counts.entry(r.partition_key.clone()).or_default() += 1;
                }
                for (key, n) in &counts {
                    self.dynamodb
                        .update_item()
                        .table_name(&self.table)
                        .key(KEY, AttributeValue::S(key.clone()))
                        .update_expression("ADD #n :by")
                        .expression_attribute_names("#n", COUNT)
                        .expression_attribute_values(":by", AttributeValue::N(n.to_string()))
                        .send()
                        .await?;
                }
                self.stall_once(records.len()).await?;
                tokio::time::sleep(self.work).await;
                cp.checkpoint_record(last).await?;
            }
            Mode::ExactlyOnce => {
                // One counter update per key per transaction (DynamoDB
                // allows one operation on an item in a transaction); a new
                // transaction when the keys would not fit.
                let room = Transaction::new().room();
                let mut counts: BTreeMap<String, u64> = BTreeMap::new();
                let mut previous: Option<&Record> = None;
                for r in &records {
                    if !counts.contains_key(&r.partition_key)
                        && counts.len() == room
                        && let Some(through) = previous
                    {
                        self.commit(cp, &counts, through).await?;
                        counts.clear();
                    }
                    *counts.entry(r.partition_key.clone()).or_default() += 1;
                    previous = Some(r);
                }
                self.commit(cp, &counts, last).await?;
                self.stall_once(records.len()).await?;
            }
        }
        Ok(())
    }
}
