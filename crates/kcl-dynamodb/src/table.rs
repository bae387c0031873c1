//! Creating and validating the lease table.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, PointInTimeRecoverySpecification,
    ProvisionedThroughput, ScalarAttributeType, SseSpecification, SseType, TableStatus, Tag,
};
use kcl_core::store::{StoreError, StoreOp};
use tracing::info;

use crate::error::{ConditionalError, unconditional_error};
pub use crate::schema::{STREAM_CLAIM_KEY, workers_table_for};
use crate::schema::{lease as attr, liveness};

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

impl From<Capacity> for TableOptions {
    fn from(capacity: Capacity) -> Self {
        TableOptions::default().capacity(capacity)
    }
}

/// Whether a worker creates a missing table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TableCreation {
    /// Create the table when it does not exist (the default).
    #[default]
    IfMissing,
    /// Never create a table: a missing one fails startup with its name,
    /// for deployments whose tables come from CloudFormation or Terraform
    /// (and whose workers have no `dynamodb:CreateTable`).
    Never,
}

/// How kcl creates its tables (the lease table and the liveness records'):
/// billing, tags, point-in-time recovery, deletion protection and the KMS
/// key, or not at all. Applied only to a table kcl creates (an existing
/// table's settings belong to whoever made it and are left alone), except
/// point-in-time recovery, which when asked for is turned on at every
/// start.
///
/// ```
/// use kcl_dynamodb::{Capacity, TableOptions};
///
/// let options = TableOptions::default()
///     .capacity(Capacity::Provisioned { read: 10, write: 10 })
///     .tag("team", "payments")
///     .point_in_time_recovery(true)
///     .deletion_protection(true);
/// assert_eq!(options.tags(), [("team".to_owned(), "payments".to_owned())]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableOptions {
    capacity: Capacity,
    creation: TableCreation,
    tags: Vec<(String, String)>,
    point_in_time_recovery: bool,
    deletion_protection: bool,
    kms_key: Option<String>,
}

impl TableOptions {
    kcl_core::setters!(self {
        /// Billing (default on-demand).
        capacity(capacity: Capacity),

        /// Whether a missing table is created (default: it is).
        creation(creation: TableCreation),
    });

    /// Adds a tag (cost allocation, ownership).
    pub fn tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.push((key.into(), value.into()));
        self
    }

    kcl_core::setters!(self {
        /// Turns on point-in-time recovery (continuous backups): on creation,
        /// and at every start on an existing table (an idempotent call, so a
        /// crash right after creating the table cannot leave it off).
        point_in_time_recovery(on: bool),

        /// Creates the table with deletion protection: DeleteTable is refused
        /// until it is turned off.
        deletion_protection(on: bool),
    });

    /// Encrypts the table with this KMS key (id, ARN or alias) instead of
    /// the AWS-owned key.
    pub fn kms_key(mut self, key: impl Into<String>) -> Self {
        self.kms_key = Some(key.into());
        self
    }

    /// The billing.
    pub fn billing(&self) -> Capacity {
        self.capacity
    }

    /// Whether a missing table is created.
    pub fn creates(&self) -> TableCreation {
        self.creation
    }

    /// The tags, in the order given.
    pub fn tags(&self) -> &[(String, String)] {
        &self.tags
    }
}

/// How long [`ensure_table`] waits for a new table to become ACTIVE.
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// Creates the lease table if it does not exist (hash key `leaseKey`, a
/// string) with `options` (a [`Capacity`] alone will do) and waits until it
/// is ACTIVE. An existing table must have exactly that key schema;
/// otherwise the error names the table and the mismatch.
pub async fn ensure_table(
    client: &Client,
    table: &str,
    options: impl Into<TableOptions>,
) -> Result<(), StoreError> {
    ensure(
        client,
        table,
        attr::LEASE_KEY,
        &options.into(),
        "lease table",
    )
    .await
}

/// Creates the table of liveness records (hash key `instance`, a string)
/// if it does not exist, and waits until it is ACTIVE; an existing table
/// must have that key schema. Only the worker-liveness renewal mode needs
/// it (see [`crate::liveness`]).
pub async fn ensure_workers_table(
    client: &Client,
    table: &str,
    options: impl Into<TableOptions>,
) -> Result<(), StoreError> {
    let key = liveness::INSTANCE;
    ensure(
        client,
        table,
        key,
        &options.into(),
        "table of worker liveness records",
    )
    .await
}

async fn ensure(
    client: &Client,
    table: &str,
    key: &str,
    options: &TableOptions,
    what: &str,
) -> Result<(), StoreError> {
    if describe(client, table, key).await?.is_some() {
        wait_active(client, table).await?;
        // Asked for, it is turned on here too (the call is idempotent): a
        // worker that crashed between creating the table and this step
        // must not leave the backups off for good.
        if options.point_in_time_recovery {
            enable_point_in_time_recovery(client, table).await?;
        }
        return Ok(());
    }
    if options.creation == TableCreation::Never {
        return Err(fatal(
            format!(
                "the {what} {table:?} does not exist and this worker does not create tables \
                 (TableCreation::Never): create it with a single string hash key {key:?} \
                 (deploy/ has CloudFormation and Terraform definitions)"
            ),
            None,
        ));
    }
    create(client, table, key, options).await?;
    info!(table, "created the {what}");
    wait_active(client, table).await?;
    if options.point_in_time_recovery {
        enable_point_in_time_recovery(client, table).await?;
    }
    Ok(())
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
    options: &TableOptions,
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
    for (k, v) in &options.tags {
        req = req.tags(Tag::builder().key(k).value(v).build().map_err(build_err)?);
    }
    if options.deletion_protection {
        req = req.deletion_protection_enabled(true);
    }
    if let Some(key) = &options.kms_key {
        req = req.sse_specification(
            SseSpecification::builder()
                .enabled(true)
                .sse_type(SseType::Kms)
                .kms_master_key_id(key)
                .build(),
        );
    }
    req = match options.capacity {
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

/// Records that the single-stream lease table `lease_table` serves the
/// stream `identifier` (`account:name:creationEpoch`), or refuses if it
/// already serves another. Single-stream lease keys are bare shard ids,
/// so a table left from another stream (or from a deleted stream of the
/// same name) would hand this stream's shards that stream's checkpoints.
/// The claim is an item of the liveness records' table `workers_table`,
/// which only kcl reads; it is written once, conditionally.
pub async fn claim_stream(
    client: &Client,
    lease_table: &str,
    workers_table: &str,
    identifier: &str,
) -> Result<(), StoreError> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let serves = liveness::SERVES_STREAM;
    let put = client
        .put_item()
        .table_name(workers_table)
        .item(
            liveness::INSTANCE,
            AttributeValue::S(STREAM_CLAIM_KEY.into()),
        )
        .item(serves, AttributeValue::S(identifier.into()))
        .condition_expression("attribute_not_exists(#instance) OR #serves = :stream")
        .expression_attribute_names("#instance", liveness::INSTANCE)
        .expression_attribute_names("#serves", serves)
        .expression_attribute_values(":stream", AttributeValue::S(identifier.into()))
        .return_values_on_condition_check_failure(
            aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
        )
        .send()
        .await;
    let e = match put {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    let claimed = e
        .as_service_error()
        .and_then(ConditionalError::failed_condition)
        .flatten()
        .and_then(|item| item.get(serves)?.as_s().ok().cloned());
    match claimed {
        Some(other) => Err(fatal(
            format!(
                "lease table {lease_table:?} serves stream {other:?}, not {identifier:?} \
                 (account:name:creation time): its leases are that stream's shards and \
                 checkpoints. Use another application name or table_name for this stream; \
                 if the stream was deleted and made again under its name, its old \
                 checkpoints are void: delete the lease table and {workers_table:?} first"
            ),
            None,
        )),
        None => {
            let code = e.code().unwrap_or("no answer").to_owned();
            Err(startup_error(
                StoreOp::Create,
                workers_table,
                e,
                format!("cannot record which stream lease table {lease_table:?} serves: {code}"),
            ))
        }
    }
}

/// The identifier of the stream the single-stream lease table whose
/// liveness records' table is `workers_table` serves, as
/// [`claim_stream`] recorded it; `None` when none is recorded or the table
/// does not exist. The SDK's error otherwise, for the caller to judge (an
/// operator's tool may go on without it when the role is denied it).
pub async fn served_stream(
    client: &Client,
    workers_table: &str,
) -> Result<
    Option<String>,
    aws_sdk_dynamodb::error::SdkError<
        aws_sdk_dynamodb::operation::get_item::GetItemError,
        aws_smithy_runtime_api::http::Response,
    >,
> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let read = client
        .get_item()
        .table_name(workers_table)
        .key(
            liveness::INSTANCE,
            AttributeValue::S(STREAM_CLAIM_KEY.into()),
        )
        .consistent_read(true)
        .send()
        .await;
    match read {
        Ok(out) => Ok(out
            .item
            .and_then(|mut item| item.remove(liveness::SERVES_STREAM))
            .and_then(|v| v.as_s().ok().cloned())),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Continuous backups on: one call once the table is ACTIVE, which
/// DynamoDB requires.
async fn enable_point_in_time_recovery(client: &Client, table: &str) -> Result<(), StoreError> {
    let spec = PointInTimeRecoverySpecification::builder()
        .point_in_time_recovery_enabled(true)
        .build()
        .map_err(|e| fatal(format!("invalid backup setting: {e}"), None))?;
    client
        .update_continuous_backups()
        .table_name(table)
        .point_in_time_recovery_specification(spec)
        .send()
        .await
        .map_err(|e| {
            // Throttling stays retryable: the retry finds the table and
            // comes back here.
            let code = e.code().unwrap_or("no answer").to_owned();
            startup_error(
                StoreOp::Create,
                table,
                e,
                format!(
                    "cannot turn on point-in-time recovery of table {table:?}: {code} \
                     (allow dynamodb:UpdateContinuousBackups, or turn it on yourself and \
                     leave it off in the table options)"
                ),
            )
        })?;
    info!(table, "point-in-time recovery is on");
    Ok(())
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde_json::{Value, json};

    use super::*;
    use crate::fake::FakeDynamoDb;

    /// A DynamoDB without the table until CreateTable, then with it ACTIVE.
    fn empty_dynamodb() -> FakeDynamoDb {
        let created = Arc::new(AtomicBool::new(false));
        FakeDynamoDb::new(move |operation, body| match operation {
            "DescribeTable" if !created.load(Ordering::SeqCst) => Some((
                400,
                json!({"__type": "com.amazonaws.dynamodb.v20120810#ResourceNotFoundException",
                       "message": "Requested resource not found"}),
            )),
            "DescribeTable" => Some((
                200,
                json!({"Table": {
                    "TableName": body["TableName"],
                    "TableStatus": "ACTIVE",
                    "KeySchema": [{"AttributeName": "leaseKey", "KeyType": "HASH"}],
                    "AttributeDefinitions": [{"AttributeName": "leaseKey", "AttributeType": "S"}],
                }}),
            )),
            "CreateTable" => {
                created.store(true, Ordering::SeqCst);
                Some((
                    200,
                    json!({"TableDescription": {"TableStatus": "CREATING"}}),
                ))
            }
            _ => Some((200, json!({}))),
        })
    }

    #[tokio::test]
    async fn a_created_table_gets_its_tags_encryption_protection_and_backups() {
        let dynamodb = empty_dynamodb();
        let options = TableOptions::default()
            .capacity(Capacity::Provisioned { read: 3, write: 4 })
            .tag("team", "payments")
            .point_in_time_recovery(true)
            .deletion_protection(true)
            .kms_key("alias/kcl");
        ensure_table(&dynamodb.client(), "orders", options)
            .await
            .expect("created");
        let create = &dynamodb.bodies("CreateTable")[0];
        assert_eq!(
            create["Tags"],
            json!([{"Key": "team", "Value": "payments"}])
        );
        assert_eq!(create["DeletionProtectionEnabled"], json!(true));
        assert_eq!(
            create["SSESpecification"],
            json!({"Enabled": true, "SSEType": "KMS", "KMSMasterKeyId": "alias/kcl"})
        );
        assert_eq!(create["BillingMode"], json!("PROVISIONED"));
        assert_eq!(
            create["ProvisionedThroughput"],
            json!({"ReadCapacityUnits": 3, "WriteCapacityUnits": 4})
        );
        // Backups are turned on once the table is ACTIVE, after creation.
        let operations = dynamodb.operations();
        assert_eq!(
            operations.last().map(String::as_str),
            Some("UpdateContinuousBackups")
        );
        assert_eq!(
            dynamodb.bodies("UpdateContinuousBackups")[0]["PointInTimeRecoverySpecification"],
            json!({"PointInTimeRecoveryEnabled": true})
        );
    }

    #[tokio::test]
    async fn backups_asked_for_are_turned_on_for_an_existing_table_too() {
        let dynamodb = empty_dynamodb();
        let client = dynamodb.client();
        ensure_table(&client, "orders", Capacity::OnDemand)
            .await
            .expect("created");
        // A worker that created the table and crashed before its backups
        // were on: the next start turns them on.
        let backups = TableOptions::default().point_in_time_recovery(true);
        ensure_table(&client, "orders", backups)
            .await
            .expect("exists");
        assert_eq!(dynamodb.bodies("CreateTable").len(), 1);
        assert_eq!(dynamodb.bodies("UpdateContinuousBackups").len(), 1);
    }

    #[tokio::test]
    async fn a_table_created_with_the_defaults_sends_no_option() {
        let dynamodb = empty_dynamodb();
        ensure_table(&dynamodb.client(), "orders", Capacity::OnDemand)
            .await
            .expect("created");
        let create = &dynamodb.bodies("CreateTable")[0];
        for absent in ["Tags", "DeletionProtectionEnabled", "SSESpecification"] {
            assert_eq!(create[absent], Value::Null, "{absent}");
        }
        assert!(
            !dynamodb
                .operations()
                .contains(&"UpdateContinuousBackups".to_owned())
        );
    }

    #[tokio::test]
    async fn a_worker_that_never_creates_a_table_asks_only_whether_it_exists() {
        let dynamodb = empty_dynamodb();
        let never = TableOptions::default().creation(TableCreation::Never);
        let error = ensure_workers_table(&dynamodb.client(), "orders-workers", never)
            .await
            .expect_err("missing");
        assert!(error.to_string().contains("\"orders-workers\""), "{error}");
        assert_eq!(dynamodb.operations(), ["DescribeTable"]);
    }
}
