//! Creating and validating the lease table.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ProvisionedThroughput,
    ScalarAttributeType, TableStatus,
};
use kcl_core::store::{StoreError, StoreOp};
use tracing::info;

use crate::error::unconditional_error;
use crate::item::attr;

/// How the table is billed when this library creates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Capacity {
    /// On-demand (PAY_PER_REQUEST), the default: an idle fleet costs only
    /// what it reads and writes.
    #[default]
    OnDemand,
    /// Provisioned read and write capacity units.
    Provisioned {
        /// Read capacity units.
        read: i64,
        /// Write capacity units.
        write: i64,
    },
}

/// How long [`ensure_table`] waits for a new table to become ACTIVE.
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// Creates the lease table if it does not exist (hash key `leaseKey`, a
/// string) and waits until it is ACTIVE. An existing table must have
/// exactly that key schema; otherwise the error names the table and the
/// mismatch.
pub async fn ensure_table(
    client: &Client,
    table: &str,
    capacity: Capacity,
) -> Result<(), StoreError> {
    match describe(client, table, attr::LEASE_KEY).await? {
        Some(()) => {}
        None => {
            create(client, table, attr::LEASE_KEY, capacity).await?;
            info!(table, "created the lease table");
        }
    }
    wait_active(client, table).await
}

/// The default name of the liveness records' table for `lease_table`.
pub fn workers_table_for(lease_table: &str) -> String {
    format!("{lease_table}-workers")
}

/// Creates the table of liveness records (hash key `instance`, a string)
/// if it does not exist, and waits until it is ACTIVE; an existing table
/// must have that key schema. Only the worker-liveness renewal mode needs
/// it (see [`crate::liveness`]).
pub async fn ensure_workers_table(
    client: &Client,
    table: &str,
    capacity: Capacity,
) -> Result<(), StoreError> {
    let key = crate::liveness::attr::INSTANCE;
    match describe(client, table, key).await? {
        Some(()) => {}
        None => {
            create(client, table, key, capacity).await?;
            info!(table, "created the table of worker liveness records");
        }
    }
    wait_active(client, table).await
}

fn fatal(message: String, source: Option<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
    StoreError::Fatal {
        op: StoreOp::Get,
        message,
        source,
    }
}

/// `Ok(None)` if the table does not exist; an error if its key schema is
/// not a lease table's.
async fn describe(client: &Client, table: &str, key: &str) -> Result<Option<()>, StoreError> {
    let out = match client.describe_table().table_name(table).send().await {
        Ok(out) => out,
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            return Ok(None);
        }
        Err(e) => {
            let code = e.code().unwrap_or("no answer").to_owned();
            return Err(startup_error(
                StoreOp::Get,
                table,
                e,
                format!("cannot describe lease table {table:?}: {code}"),
            ));
        }
    };
    let Some(desc) = out.table() else {
        return Ok(None);
    };
    let keys: Vec<String> = desc
        .key_schema()
        .iter()
        .map(|k| format!("{} ({})", k.attribute_name(), k.key_type().as_str()))
        .collect();
    let hash_ok = desc.key_schema().len() == 1
        && desc.key_schema()[0].attribute_name() == key
        && desc.key_schema()[0].key_type() == &KeyType::Hash;
    let type_ok = desc
        .attribute_definitions()
        .iter()
        .any(|d| d.attribute_name() == key && d.attribute_type() == &ScalarAttributeType::S);
    if !hash_ok || !type_ok {
        return Err(fatal(
            format!(
                "table {table:?} exists but has the wrong key schema [{}]; kcl's table needs a \
                 single string hash key {key:?}. Use another table name (the worker's \
                 application name by default).",
                keys.join(", "),
            ),
            None,
        ));
    }
    Ok(Some(()))
}

async fn create(
    client: &Client,
    table: &str,
    key: &str,
    capacity: Capacity,
) -> Result<(), StoreError> {
    let build_err = |e: aws_sdk_dynamodb::error::BuildError| {
        fatal(format!("invalid table definition: {e}"), None)
    };
    let mut req = client
        .create_table()
        .table_name(table)
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .map_err(build_err)?,
        )
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(build_err)?,
        );
    req = match capacity {
        Capacity::OnDemand => req.billing_mode(BillingMode::PayPerRequest),
        Capacity::Provisioned { read, write } => req
            .billing_mode(BillingMode::Provisioned)
            .provisioned_throughput(
                ProvisionedThroughput::builder()
                    .read_capacity_units(read)
                    .write_capacity_units(write)
                    .build()
                    .map_err(build_err)?,
            ),
    };
    match req.send().await {
        Ok(_) => Ok(()),
        // Another worker created it first.
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) =>
        {
            Ok(())
        }
        Err(e) => {
            let code = e.code().unwrap_or("no answer").to_owned();
            Err(startup_error(
                StoreOp::Create,
                table,
                e,
                format!(
                    "cannot create lease table {table:?}: {code} (create it beforehand, or allow \
                     dynamodb:CreateTable)"
                ),
            ))
        }
    }
}

/// A table check's error: throttling, 5xx and lost connections stay
/// retryable (a fleet restarting under throttling must not crash-loop);
/// anything else is fatal, in words that name the table.
fn startup_error<E>(
    op: StoreOp,
    table: &str,
    e: aws_sdk_dynamodb::error::SdkError<E, aws_smithy_runtime_api::http::Response>,
    fatal_message: String,
) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match unconditional_error(op, table, "", e) {
        StoreError::Fatal { source, .. } => fatal(fatal_message, source),
        e => e,
    }
}

async fn wait_active(client: &Client, table: &str) -> Result<(), StoreError> {
    let deadline = tokio::time::Instant::now() + ACTIVE_TIMEOUT;
    loop {
        let status = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .ok()
            .and_then(|o| o.table().and_then(|t| t.table_status().cloned()));
        if status == Some(TableStatus::Active) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(fatal(
                format!(
                    "lease table {table:?} not ACTIVE after {ACTIVE_TIMEOUT:?} (status {status:?})"
                ),
                None,
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
