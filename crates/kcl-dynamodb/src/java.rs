//! The Java KCL 3.x's own table, read in the Java-compatible mode so that a
//! mixed fleet shares the shards: `<lease table>-WorkerMetricStats`, one
//! entry per Java worker, which its leader balances over.
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `wid` (hash key) | S | the worker id, as in `leaseOwner` |
//! | `lut` | N | when it last reported, epoch seconds (every 30 s) |
//!
//! kcl only reads this table (the `wid` and `lut` of every entry, one
//! paginated scan); it never creates it and never writes to it.
//!
//! From the Java KCL 3.5 on, the reports live in the lease table itself
//! (its default "single table" layout, for new applications and once a
//! migration completes): items whose `entityType` is
//! `WORKER_METRIC_STATS`, the worker id in `leaseKey`, `lut` as above.
//! kcl reads both places. The lease table's reports are the ones its last
//! whole scan saw, at no cost of their own, while that scan is recent: the
//! lease taker scans every tick while it renews per lease (the mode a table
//! shared with Java workers runs in). Otherwise (a worker renewing by
//! liveness record scans seldom) one read of the Java KCL's migration item
//! tells whether a Java 3.5 fleet ran on the table, and only then are the
//! reports read by a scan of their own.
//!
//! A fleet upgrading from the Java KCL 2.x reports as well, but its workers
//! take leases themselves and pick up none assigned to them: while its
//! migration state (`cv` of the item `Migration3.0`, in
//! `<lease table>-CoordinatorState` or, from 3.5 on, the lease table) says
//! `CLIENT_VERSION_2X` or `CLIENT_VERSION_UPGRADE_FROM_2X`, none of its
//! workers is returned: kcl judges their leases as any owner's and hands
//! them none (a lease handed over stood unrenewed until taken back).

use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_core::store::{JavaWorker, StoreError, StoreOp};
use tracing::{debug, warn};

use crate::error::{is_access_denied, unconditional_error};
use crate::java_reports::{Seen, client_version_in_lease_table, report, report_in_lease_table};
use crate::schema::java_migration::{CLIENT_VERSION, MIGRATION_KEY, SELF_TAKING, STATE_KEY};
use crate::schema::java_workers::{LAST_UPDATE, WORKER_ID};
use crate::schema::lease::{ENTITY_TYPE, LEASE_KEY};
pub use crate::schema::{coordinator_state_table_for, worker_metric_stats_table_for};
use crate::store::DynamoDbLeaseStore;

impl DynamoDbLeaseStore {
    pub(crate) async fn read_java_workers(&self) -> Result<Vec<JavaWorker>, StoreError> {
        let table = worker_metric_stats_table_for(self.table());
        // No such table: no Java KCL 3.0-3.4 worker ever ran here.
        let projection = format!("{WORKER_ID}, {LAST_UPDATE}");
        let items = self
            .scan_if_allowed(
                StoreOp::ReadJavaWorkers,
                &table,
                &projection,
                &self.scanned_reports().denied_warned.reports,
            )
            .await?
            .unwrap_or_default();
        let mut workers: Vec<JavaWorker> =
            items.iter().filter_map(|i| report(i, WORKER_ID)).collect();
        let seen = match self.scanned_reports().fresh() {
            Some(seen) => seen,
            None => self.read_java_in_lease_table().await?,
        };
        // A worker migrating between the layouts may report in both: its
        // newest report counts.
        for report in seen.reports {
            match workers.iter_mut().find(|w| w.id == report.id) {
                Some(w) => w.last_update_secs = w.last_update_secs.max(report.last_update_secs),
                None => workers.push(report),
            }
        }
        if workers.is_empty() {
            return Ok(workers);
        }
        let version = match seen.client_version {
            Some(version) => Some(version),
            None => self.read_client_version().await?,
        };
        match version {
            Some(version) if SELF_TAKING.contains(&version.as_str()) => {
                debug!(
                    version,
                    "the Java KCL workers run 2.x-compatible: they take leases \
                    themselves, and are judged by their renewals like any owner"
                );
                Ok(Vec::new())
            }
            _ => Ok(workers),
        }
    }

    /// What the lease table holds of the Java KCL 3.5, when no recent scan
    /// says (a worker in the liveness mode scans seldom): its migration
    /// item, read alone, and only where there is one (a Java 3.5 fleet
    /// ran here) the reports, by a scan of their own. A table no Java 3.5
    /// worker touched costs one read.
    async fn read_java_in_lease_table(&self) -> Result<Seen, StoreError> {
        let read = self
            .client()
            .get_item()
            .table_name(self.table())
            .key(LEASE_KEY, AttributeValue::S(MIGRATION_KEY.into()))
            .send()
            .await
            .map_err(|e| unconditional_error(StoreOp::ReadJavaWorkers, self.table(), "", e))?;
        let Some(migration) = read.item else {
            return Ok(Seen::default());
        };
        let mut seen = Seen {
            reports: Vec::new(),
            client_version: client_version_in_lease_table(&migration),
        };
        let projection = format!("{LEASE_KEY}, {ENTITY_TYPE}, {LAST_UPDATE}");
        let items = self
            .scan_all(
                StoreOp::ReadJavaWorkers,
                self.table(),
                false,
                Some(&projection),
            )
            .await?
            .unwrap_or_default();
        seen.reports = items.iter().filter_map(report_in_lease_table).collect();
        Ok(seen)
    }

    /// The client version `<table>-CoordinatorState` records, if any. A
    /// failed read stands on the last answer: a role denied the table
    /// (warned of once) counts the workers as 3.x ones if no answer ever
    /// came; another failure with no answer yet fails the read, and the
    /// taker keeps what it last saw. A throttle once counted a
    /// 2.x-compatible fleet's workers, and handed them leases.
    async fn read_client_version(&self) -> Result<Option<String>, StoreError> {
        let table = coordinator_state_table_for(self.table());
        let read = self
            .client()
            .get_item()
            .table_name(&table)
            .key(STATE_KEY, AttributeValue::S(MIGRATION_KEY.into()))
            .projection_expression(CLIENT_VERSION)
            .send()
            .await;
        let answer = match read {
            Ok(out) => out
                .item
                .and_then(|mut item| item.remove(CLIENT_VERSION))
                .and_then(|v| v.as_s().ok().cloned()),
            // No such table: a fleet of the Java KCL 3.5 layout (the item
            // is then in the lease table), or of no 3.x migration.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                None
            }
            Err(e) => {
                let last = self.scanned_reports().last_version();
                let denied = is_access_denied(&e);
                let e = unconditional_error(StoreOp::ReadJavaWorkers, &table, "", e);
                let warned = &self.scanned_reports().denied_warned.version;
                if denied && !warned.swap(true, Ordering::Relaxed) {
                    let judged = match &last {
                        Some(version) => format!("going by the last one read, {version:?}"),
                        None => "counting its reporting workers as 3.x ones, which take \
                                 leases handed to them"
                            .to_owned(),
                    };
                    warn!(table, error = %e,
                        "cannot read the Java KCL fleet's client version (the role needs \
                         dynamodb:GetItem on it); {judged}");
                }
                return match (last, denied) {
                    (Some(version), _) => {
                        debug!(table, error = %e, ?version,
                            "reading the Java KCL fleet's client version failed; going by \
                             the last one read");
                        Ok(version)
                    }
                    (None, true) => Ok(None),
                    (None, false) => Err(e),
                };
            }
        };
        self.scanned_reports().read_version(answer.clone());
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::{Value, json};

    use super::*;
    use crate::fake::FakeDynamoDb;
    use kcl_core::store::LeaseStore as _;

    fn denied() -> (u16, Value) {
        let body = json!({
            "__type": "com.amazonaws.dynamodb.v20120810#AccessDeniedException",
            "message": "not authorized"
        });
        (400, body)
    }

    /// A table of application "app" whose legacy tables answer as
    /// `legacy` does (the operation and the table), holding one Java 3.5
    /// report and its migration item with client version `version`.
    fn lease_table_with_a_report(
        version: &'static str,
        legacy: impl Fn(&str, &str) -> Option<(u16, Value)> + Send + Sync + 'static,
    ) -> FakeDynamoDb {
        FakeDynamoDb::new(move |op, body| {
            let table = body["TableName"].as_str().unwrap_or_default().to_owned();
            if table != "app" {
                return legacy(op, &table);
            }
            Some(match op {
                "GetItem" => (
                    200,
                    json!({"Item": {
                    "leaseKey": {"S": "Migration3.0"},
                    "entityType": {"S": "CLIENT_VERSION_MIGRATION"},
                    "cv": {"S": version}}}),
                ),
                _ => (
                    200,
                    json!({"Items": [{
                    "leaseKey": {"S": "java-1"},
                    "entityType": {"S": "WORKER_METRIC_STATS"},
                    "lut": {"N": "1765000000"}}]}),
                ),
            })
        })
    }

    /// A role denied `<app>-WorkerMetricStats` (the Java KCL 3.0-3.4's)
    /// still sees the Java 3.5 workers in the lease table: the denied scan
    /// failed the whole read, every time.
    #[tokio::test]
    async fn a_denied_legacy_table_leaves_the_lease_tables_workers_seen() {
        let fake = lease_table_with_a_report("CLIENT_VERSION_3X", |_, _| Some(denied()));
        let store = DynamoDbLeaseStore::new(fake.client(), "app");
        let workers = store.java_workers().await.expect("read, the denial aside");
        assert_eq!(workers.len(), 1);
    }

    /// A client version whose table is denied stands on the last answer
    /// (a 2.x-compatible fleet stays uncounted) and, with none, counts the
    /// workers as 3.x ones.
    #[tokio::test]
    async fn a_denied_client_version_stands_on_the_last_answer() {
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let legacy = move |op: &str, table: &str| match (op, table) {
            ("Scan", "app-WorkerMetricStats") => Some((
                200,
                json!({"Items": [{
                "wid": {"S": "java-2"}, "lut": {"N": "1765000000"}}]}),
            )),
            ("GetItem", "app-CoordinatorState") => {
                Some(if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                    (
                        200,
                        json!({"Item": {"cv": {"S": "CLIENT_VERSION_UPGRADE_FROM_2X"}}}),
                    )
                } else {
                    denied()
                })
            }
            _ => Some((400, json!({"__type": "ResourceNotFoundException"}))),
        };
        // No 3.5 migration item: the version comes from the legacy table.
        let fake = FakeDynamoDb::new(move |op, body| {
            let table = body["TableName"].as_str().unwrap_or_default().to_owned();
            match (op, table.as_str()) {
                ("GetItem", "app") => Some((200, json!({}))),
                (_, "app") => Some((200, json!({"Items": []}))),
                _ => legacy(op, &table),
            }
        });
        let store = DynamoDbLeaseStore::new(fake.client(), "app");
        assert!(
            store.java_workers().await.unwrap().is_empty(),
            "2.x-compatible"
        );
        assert!(
            store.java_workers().await.unwrap().is_empty(),
            "denied: the last answer stands"
        );
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        let fresh = DynamoDbLeaseStore::new(fake.client(), "app");
        assert_eq!(
            fresh.java_workers().await.unwrap().len(),
            1,
            "no answer yet"
        );
    }
}
