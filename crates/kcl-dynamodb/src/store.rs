//! [`DynamoDbLeaseStore`]: the lease table on DynamoDB.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConsumedCapacity, ReturnConsumedCapacity, ReturnValue,
    ReturnValuesOnConditionCheckFailure,
};
use aws_smithy_runtime_api::http::Response;
use futures::stream::BoxStream;
use kcl_core::metric_names::LEASE_ITEMS_MALFORMED;
use kcl_core::store::metered::StoreStats;
use kcl_core::store::{
    Beat, BeatUpdate, CheckpointUpdate, CheckpointWrite, Holder, Intent, LeaseStore, Page,
    StoreError, StoreOp,
};
use kcl_core::{Lease, Throughput};
use tracing::warn;

use crate::error::{ClassifiedError, ConditionalError, classify, unconditional_error};
use crate::item::{ReadItem, from_item, null_in_conditions, throughput_value, to_item};
use crate::java_reports::ScannedReports;
use crate::schema::{lease as attr, workers_table_for};

mod partiql;
mod scan;
mod update;
#[doc(hidden)]
pub use update::{NULL_TYPE, absent_or_null};

pub(crate) use update::Update;
pub(crate) use update::{checkpoint_transact_item, fence_item};
use update::{checkpoint_update, hands_off, owned_by, owner_condition, tenure_is};

/// A [`LeaseStore`] on a DynamoDB table with the Java KCL's item layout.
///
/// Every write is a conditional `UpdateItem`/`PutItem`/`DeleteItem` that
/// names only the attributes it changes, so attributes this store does not
/// know (written by another KCL) survive. Writes of a holder are
/// conditional on its tenure (`kclTenure`, see [`crate::item`]). A failed
/// condition returns the item as DynamoDB saw it
/// (`ReturnValuesOnConditionCheckFailure=ALL_OLD`): if it shows our own
/// write, tenure included, the write was applied by an earlier attempt
/// whose response was lost, and the call succeeds without an extra read.
/// An item that does not parse (a hand edit) is reported as a failed
/// condition without an item, with a log line and a metric naming the key
/// and the attribute, never as a fatal error: one bad item must not stop a
/// shard sync or a worker's startup. Scans are strongly consistent and
/// follow `LastEvaluatedKey` to the end, skipping unreadable items the
/// same way.
#[derive(Debug, Clone)]
pub struct DynamoDbLeaseStore {
    client: Client,
    table: String,
    workers_table: String,
    page_size: Option<i32>,
    stats: Option<Arc<StoreStats>>,
    /// Set once the table refused a `BatchExecuteStatement` (no
    /// `dynamodb:PartiQLUpdate`): checkpoints then go one by one.
    partiql_refused: Arc<AtomicBool>,
    /// The Java KCL 3.5 reports the last whole scan saw (see [`crate::java`]).
    scanned_reports: ScannedReports,
}

impl DynamoDbLeaseStore {
    /// A store on `table` (see [`crate::table::ensure_table`] to create it).
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let table = table.into();
        DynamoDbLeaseStore {
            client,
            workers_table: workers_table_for(&table),
            table,
            page_size: None,
            stats: None,
            partiql_refused: Arc::default(),
            scanned_reports: ScannedReports::default(),
        }
    }

    /// Caps the items per scan page (DynamoDB's own 1 MB page limit applies
    /// either way). Values below 1 are raised to 1.
    pub fn with_page_size(mut self, items: i32) -> Self {
        self.page_size = Some(items.max(1));
        self
    }

    /// Reports consumed capacity into `stats` (share it with a
    /// [`kcl_core::store::metered::MeteredStore`] to see cost per operation).
    pub fn with_stats(mut self, stats: Arc<StoreStats>) -> Self {
        self.stats = Some(stats);
        self
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Keeps the liveness records in `table` instead of the default
    /// `<lease table>-workers`.
    pub fn with_workers_table(mut self, table: impl Into<String>) -> Self {
        self.workers_table = table.into();
        self
    }

    /// The table of liveness records (see [`crate::liveness`]).
    pub fn workers_table(&self) -> &str {
        &self.workers_table
    }

    /// The DynamoDB client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn record_capacity(&self, op: StoreOp, capacity: Option<&ConsumedCapacity>) {
        if let (Some(stats), Some(units)) = (
            &self.stats,
            capacity.and_then(ConsumedCapacity::capacity_units),
        ) {
            stats.add_capacity(op, units);
        }
    }

    pub(crate) fn key(key: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([(
            attr::LEASE_KEY.to_owned(),
            AttributeValue::S(key.to_owned()),
        )])
    }

    /// The lease in `item`, which `op` read or returned: a failure is
    /// `op`'s, so that an update whose write landed is not reported as a
    /// failed read.
    fn parse(
        &self,
        op: StoreOp,
        item: &HashMap<String, AttributeValue>,
    ) -> Result<Lease, StoreError> {
        // An update's write landed before its answer was read.
        let landed = |what: String| match op {
            StoreOp::Get => what,
            _ => format!("{op} landed, but the item it returned: {what}"),
        };
        match from_item(item) {
            Ok(ReadItem::Lease(l)) => Ok(*l),
            Ok(ReadItem::NotALease) => Err(StoreError::Fatal {
                op,
                message: landed(format!("item in table {:?} is not a lease", self.table)),
                source: None,
            }),
            Err(e) => Err(StoreError::Fatal {
                op,
                message: landed(e.to_string()),
                source: Some(Box::new(e)),
            }),
        }
    }

    /// A conditional `UpdateItem` of the item at `key` in `table` (the lease
    /// table, or the liveness records' table) with `update`'s expressions,
    /// asking for the capacity it consumed; the caller adds what it wants
    /// returned, and sends it.
    pub(crate) fn conditional_update(
        &self,
        table: &str,
        key: HashMap<String, AttributeValue>,
        update: Update,
    ) -> UpdateItemFluentBuilder {
        let values = update.used_values();
        self.client
            .update_item()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(update.expression)
            .condition_expression(update.condition)
            .set_expression_attribute_names(Some(update.names))
            .set_expression_attribute_values(values)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
    }

    /// The outcome of a write (conditional or not) to `table` billed to
    /// `op`: a success with the capacity it consumed (`capacity` reads it)
    /// recorded, or a failure classified, naming `key`.
    pub(crate) fn billed<O, E: ConditionalError>(
        &self,
        op: StoreOp,
        table: &str,
        key: &str,
        result: Result<O, SdkError<E, Response>>,
        capacity: impl FnOnce(&O) -> Option<&ConsumedCapacity>,
    ) -> Result<O, ClassifiedError> {
        match result {
            Ok(out) => {
                self.record_capacity(op, capacity(&out));
                Ok(out)
            }
            Err(e) => Err(classify(op, table, key, e)),
        }
    }

    /// Sends a [`Self::conditional_update`] of the item `item_key` (named
    /// `key` in errors) billed to `op`, and returns the item as written; a
    /// failure comes classified, with the item as it was when `on_failure`
    /// asks for it.
    pub(crate) async fn updated_item(
        &self,
        op: StoreOp,
        table: &str,
        key: &str,
        item_key: HashMap<String, AttributeValue>,
        update: Update,
        on_failure: ReturnValuesOnConditionCheckFailure,
    ) -> Result<Option<HashMap<String, AttributeValue>>, ClassifiedError> {
        let result = self
            .conditional_update(table, item_key, update)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(on_failure)
            .send()
            .await;
        let out = self.billed(op, table, key, result, |out| out.consumed_capacity())?;
        Ok(out.attributes)
    }

    /// Runs one conditional update and turns its outcome into the store's
    /// terms, reconciling a failed condition against `intent`.
    async fn update(
        &self,
        op: StoreOp,
        key: &str,
        update: Update,
        intent: Option<Intent<'_>>,
    ) -> Result<Lease, StoreError> {
        let on_failure = ReturnValuesOnConditionCheckFailure::AllOld;
        let item_key = Self::key(key);
        match self
            .updated_item(op, &self.table, key, item_key, update, on_failure)
            .await
        {
            Ok(item) => {
                let item = item.ok_or_else(|| StoreError::Fatal {
                    op,
                    message: format!("{op} on {key:?} returned no attributes"),
                    source: None,
                })?;
                self.parse(op, &item)
            }
            Err(c) => self.condition_failed(key, c, intent),
        }
    }

    fn condition_failed(
        &self,
        key: &str,
        classified: ClassifiedError,
        intent: Option<Intent<'_>>,
    ) -> Result<Lease, StoreError> {
        match classified {
            ClassifiedError::Store(e) => Err(e),
            ClassifiedError::ConditionFailed(item) => {
                let current = item.as_ref().and_then(|i| read_lenient(&self.table, i));
                if let (Some(intent), Some(current)) = (intent, &current)
                    && intent.applied_in(current)
                {
                    return Ok(current.clone());
                }
                Err(StoreError::ConditionFailed {
                    key: key.to_owned(),
                    current: current.map(Box::new),
                })
            }
        }
    }
}

#[async_trait]
impl LeaseStore for DynamoDbLeaseStore {
    async fn create_if_absent(&self, lease: &Lease) -> Result<Lease, StoreError> {
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(to_item(lease)))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", attr::LEASE_KEY)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match self.billed(StoreOp::Create, &self.table, &lease.key, result, |out| {
            out.consumed_capacity()
        }) {
            Ok(_) => Ok(lease.clone()),
            Err(c) => self.condition_failed(&lease.key, c, None),
        }
    }

    fn scan(&self) -> BoxStream<'_, Result<Page, StoreError>> {
        self.lease_pages()
    }

    async fn get(&self, key: &str) -> Result<Option<Lease>, StoreError> {
        let result = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key)))
            .consistent_read(true)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match result {
            Ok(out) => {
                self.record_capacity(StoreOp::Get, out.consumed_capacity());
                out.item().map(|i| self.parse(StoreOp::Get, i)).transpose()
            }
            Err(e) => Err(unconditional_error(StoreOp::Get, &self.table, key, e)),
        }
    }

    async fn take(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError> {
        // A new tenure: commits fenced under the old one were conditional
        // on it and can never land, so their fence set goes.
        let switch = if seen.is_owned_by(by.owner) { 0 } else { 1 };
        let (set_tenure, remove_tenure) = match by.tenure {
            Some(_) => (", #kclTenure = :tenure", ""),
            None => ("", ", #kclTenure"),
        };
        let mut update = Update::new(
            &format!(
                "SET #leaseOwner = :new, #leaseCounter = :next, \
                 #ownerSwitchesSinceCheckpoint = if_not_exists(#ownerSwitchesSinceCheckpoint, :zero) + :switch{set_tenure} \
                 REMOVE #checkpointOwner, #kclCheckpointOwnerTenure, #kclFencedCommits{remove_tenure}"
            ),
            &format!("#leaseCounter = :counter AND {}", owner_condition(seen.owner.as_deref())),
        )
        .s(":new", by.owner)
        .tenure(":tenure", by.tenure)
        .n(":next", seen.counter + 1)
        .n(":counter", seen.counter)
        .n(":zero", 0)
        .n(":switch", switch);
        if let Some(old) = &seen.owner {
            update = update.s(":old", old);
        }
        let intent = Intent::Taken {
            by,
            counter: seen.counter + 1,
        };
        self.update(StoreOp::Take, &seen.key, update, Some(intent))
            .await
    }

    async fn reclaim(&self, seen: &Lease, by: Holder<'_>) -> Result<Lease, StoreError> {
        let expression = match by.tenure {
            Some(_) => "SET #leaseCounter = :next, #kclTenure = :tenure",
            None => "SET #leaseCounter = :next REMOVE #kclTenure",
        };
        let update = Update::new(
            expression,
            "#leaseOwner = :owner AND #leaseCounter = :counter",
        )
        .holder(by)
        .n(":counter", seen.counter)
        .n(":next", seen.counter + 1);
        let intent = Intent::Own {
            by,
            counter: seen.counter + 1,
        };
        self.update(StoreOp::Reclaim, &seen.key, update, Some(intent))
            .await
    }

    async fn renew_with(
        &self,
        key: &str,
        by: Holder<'_>,
        counter: u64,
        load: Option<Throughput>,
    ) -> Result<Lease, StoreError> {
        // The figure rides on the renewal, as the Java KCL 3.x writes it.
        let expression = match load {
            Some(_) => "SET #leaseCounter = :next, #throughputKBps = :load",
            None => "SET #leaseCounter = :next",
        };
        let mut update = Update::new(
            expression,
            &format!(
                "(({}) OR ({})) AND #leaseCounter = :counter",
                owned_by(by),
                hands_off(by)
            ),
        )
        .holder(by)
        .n(":counter", counter)
        .n(":next", counter + 1);
        if let Some(load) = load {
            update.values.insert(":load".into(), throughput_value(load));
        }
        let intent = Intent::Own {
            by,
            counter: counter + 1,
        };
        self.update(StoreOp::Renew, key, update, Some(intent)).await
    }

    async fn report_load(
        &self,
        key: &str,
        by: Holder<'_>,
        load: Throughput,
    ) -> Result<Lease, StoreError> {
        let mut update = Update::new("SET #throughputKBps = :load", &owned_by(by)).holder(by);
        update.values.insert(":load".into(), throughput_value(load));
        self.update(StoreOp::ReportLoad, key, update, None).await
    }

    async fn release(&self, key: &str, by: Holder<'_>) -> Result<Lease, StoreError> {
        // One expression cannot add to the counter only without a handoff
        // (see `LeaseStore::release`), so the write names which it expects:
        // no handoff first (the common case), the other when the item
        // answers that one is in progress, and again while the owner's
        // handoffs start or complete under it.
        let mut handing_off = false;
        for _ in 0..3 {
            let update = if handing_off {
                Update::new(
                    "REMOVE #leaseOwner, #kclTenure",
                    &format!("{} AND attribute_exists(#checkpointOwner)", owned_by(by)),
                )
                .holder(by)
            } else {
                Update::new(
                    "REMOVE #leaseOwner, #kclTenure SET #leaseCounter = #leaseCounter + :one",
                    &format!(
                        "{} AND attribute_not_exists(#checkpointOwner)",
                        owned_by(by)
                    ),
                )
                .holder(by)
                .n(":one", 1)
            };
            match self.update(StoreOp::Release, key, update, None).await {
                Err(StoreError::ConditionFailed {
                    current: Some(current),
                    ..
                }) if by.owns(&current) => handing_off = current.checkpoint_owner.is_some(),
                done => return done,
            }
        }
        Err(StoreError::Retryable {
            op: StoreOp::Release,
            source: format!("{key:?}: a handoff kept starting and ending under the release").into(),
        })
    }

    async fn hand_back(&self, seen: &Lease, drain: bool) -> Result<Lease, StoreError> {
        let Some((from, previous)) = kcl_core::store::handed_back_by(seen, drain) else {
            return Err(StoreError::lost_race(seen));
        };
        // Pinned to the item as read: its owner and tenure, its handoff
        // (previous owner and tenure, or none) and its counter.
        let owner = match seen.owner {
            Some(_) => format!(
                "#leaseOwner = :seenOwner AND {}",
                tenure_is(attr::TENURE, ":seenTenure", seen.tenure.as_deref())
            ),
            None => {
                "attribute_not_exists(#leaseOwner) AND attribute_not_exists(#kclTenure)".to_owned()
            }
        };
        let handoff = match seen.checkpoint_owner {
            Some(_) => format!(
                "#checkpointOwner = :seenFrom AND {}",
                tenure_is(
                    attr::CHECKPOINT_OWNER_TENURE,
                    ":seenFromTenure",
                    seen.checkpoint_owner_tenure.as_deref()
                )
            ),
            None => "attribute_not_exists(#checkpointOwner)".to_owned(),
        };
        let mut update = Update::new(
            "REMOVE #leaseOwner, #kclTenure \
             SET #checkpointOwner = :from, #kclCheckpointOwnerTenure = :previous",
            &format!("{owner} AND {handoff} AND #leaseCounter = :counter"),
        )
        .s(":from", from.owner)
        .s(":previous", &previous)
        .tenure(":seenTenure", seen.tenure.as_deref())
        .tenure(":seenFromTenure", seen.checkpoint_owner_tenure.as_deref())
        .n(":counter", seen.counter);
        if let Some(o) = &seen.owner {
            update = update.s(":seenOwner", o);
        }
        if let Some(f) = &seen.checkpoint_owner {
            update = update.s(":seenFrom", f);
        }
        let intent = Intent::HandedBack {
            from: Holder::new(from.owner, &previous),
            counter: seen.counter,
        };
        self.update(StoreOp::Release, &seen.key, update, Some(intent))
            .await
    }

    async fn checkpoint(
        &self,
        key: &str,
        by: Holder<'_>,
        update: &CheckpointUpdate,
    ) -> Result<Lease, StoreError> {
        let full = checkpoint_update(by, update, None);
        let intent = Intent::Checkpointed { by, update };
        self.update(StoreOp::Checkpoint, key, full, Some(intent))
            .await
    }

    async fn checkpoint_many(
        &self,
        writes: &[CheckpointWrite<'_>],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        partiql::checkpoint_many(self, writes).await
    }

    async fn start_handoff(&self, seen: &Lease, to: Holder<'_>) -> Result<Lease, StoreError> {
        let Some(from) = seen.owner.as_deref() else {
            return Err(StoreError::lost_race(seen));
        };
        // The counter guard makes the previous owner's tenure the one `seen`
        // shows: it is recorded for the previous owner's last writes. The
        // counter itself stays, as the Java KCL writes a handoff.
        let mut set = vec!["#leaseOwner = :to", "#checkpointOwner = :from"];
        let mut remove = Vec::new();
        match to.tenure {
            Some(_) => set.push("#kclTenure = :tenure"),
            None => remove.push("#kclTenure"),
        }
        match seen.tenure {
            Some(_) => set.push("#kclCheckpointOwnerTenure = :fromTenure"),
            None => remove.push("#kclCheckpointOwnerTenure"),
        }
        let mut expression = format!("SET {}", set.join(", "));
        if !remove.is_empty() {
            expression.push_str(&format!(" REMOVE {}", remove.join(", ")));
        }
        let update = Update::new(
            &expression,
            "#leaseOwner = :from AND #leaseCounter = :counter AND attribute_not_exists(#checkpointOwner)",
        )
        .s(":to", to.owner)
        .tenure(":tenure", to.tenure)
        .s(":from", from)
        .tenure(":fromTenure", seen.tenure.as_deref())
        .n(":counter", seen.counter);
        let intent = Intent::HandoffStarted {
            from,
            to,
            counter: seen.counter,
        };
        self.update(StoreOp::StartHandoff, &seen.key, update, Some(intent))
            .await
    }

    async fn complete_handoff(&self, key: &str, from: Holder<'_>) -> Result<Lease, StoreError> {
        let update = Update::new(
            "REMOVE #checkpointOwner, #kclCheckpointOwnerTenure SET #leaseCounter = #leaseCounter + :one",
            &hands_off(from),
        )
        .holder(from)
        .n(":one", 1);
        self.update(StoreOp::CompleteHandoff, key, update, None)
            .await
    }

    async fn delete(&self, key: &str, counter: u64) -> Result<(), StoreError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key)))
            .condition_expression("#leaseCounter = :counter")
            .expression_attribute_names("#leaseCounter", attr::LEASE_COUNTER)
            .expression_attribute_values(":counter", AttributeValue::N(counter.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        match self.billed(StoreOp::Delete, &self.table, key, result, |out| {
            out.consumed_capacity()
        }) {
            Ok(_) => Ok(()),
            Err(c) => self.condition_failed(key, c, None).map(|_| ()),
        }
    }

    async fn beat(&self, update: &BeatUpdate<'_>) -> Result<Beat, StoreError> {
        self.write_beat(update).await
    }

    async fn beats(&self) -> Result<Vec<Beat>, StoreError> {
        self.read_beats().await
    }

    async fn poke(&self, instance: &str, ask: Option<&str>) -> Result<(), StoreError> {
        self.poke_beat(instance, ask).await
    }

    async fn forget(&self, instance: &str, counter: Option<u64>) -> Result<(), StoreError> {
        self.forget_beat(instance, counter).await
    }

    async fn java_workers(&self) -> Result<Vec<kcl_core::store::JavaWorker>, StoreError> {
        self.read_java_workers().await
    }
}

/// Reads one scanned item, or the item a failed condition returned.
/// Malformed items are skipped with a warning and a metric naming the key
/// (the reason names the attribute): one bad item never stops a scan, and
/// a write that lost its race to a bad item is a lost race, not a fatal
/// error for the caller (a shard sync, a worker's startup).
pub(crate) fn read_lenient(table: &str, item: &HashMap<String, AttributeValue>) -> Option<Lease> {
    match from_item(item) {
        Ok(ReadItem::Lease(l)) => {
            if let Some(attribute) = null_in_conditions(item) {
                warn_of_null_once(table, &l.key, attribute);
            }
            Some(*l)
        }
        Ok(ReadItem::NotALease) => None,
        Err(e) => {
            warn!(table, lease = %e.key, reason = %e.reason, "skipping a malformed lease item");
            metrics::counter!(LEASE_ITEMS_MALFORMED, "lease" => e.key.clone()).increment(1);
            None
        }
    }
}

/// Warns that lease `key` of `table` has a NULL `attribute` (see
/// [`null_in_conditions`]), once per lease and process: every scan of
/// every worker reads it, each taker tick. Whether it warned.
fn warn_of_null_once(table: &str, key: &str, attribute: &str) -> bool {
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<(String, String)>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let first = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert((table.to_owned(), key.to_owned()));
    if first {
        warn!(
            table,
            lease = key,
            attribute,
            "a lease attribute is NULL, which a take cannot count from: takes of the lease \
             fail until it is removed (kcl leases reset --force removes it)"
        );
    }
    first
}

#[cfg(test)]
mod tests {
    use kcl_core::LeaseStore as _;
    use kcl_core::store::{Holder, StoreError, StoreOp};
    use serde_json::json;

    use crate::fake::FakeDynamoDb;

    /// An update whose write landed but whose returned item cannot be read
    /// fails as that update, saying it landed: it was reported as a failed
    /// read (`get`), which sent an operator after the wrong call.
    #[tokio::test]
    async fn an_unreadable_item_returned_by_a_landed_update_is_that_updates_error() {
        let dynamodb = FakeDynamoDb::new(|_, _| {
            let item = json!({"leaseKey": {"S": "shardId-1"}, "leaseCounter": {"S": "x"}});
            Some((200, json!({ "Attributes": item })))
        });
        let store = super::DynamoDbLeaseStore::new(dynamodb.client(), "leases");
        let e = store
            .release("shardId-1", Holder::new("w-a", "t1"))
            .await
            .unwrap_err();
        let StoreError::Fatal { op, message, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*op, StoreOp::Release, "{e}");
        assert!(message.starts_with("release landed"), "{message}");
    }

    /// A NULL attribute is warned of once per lease, not at every scan
    /// of every worker (each taker tick).
    #[test]
    fn a_null_attribute_is_warned_of_once_per_lease() {
        let warn = |key| super::warn_of_null_once("null-once", key, "leaseOwner");
        assert!(warn("shardId-1"));
        assert!(!warn("shardId-1"), "again at the next scan");
        assert!(warn("shardId-2"), "another lease");
    }
}
