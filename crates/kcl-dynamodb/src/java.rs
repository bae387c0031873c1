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
//! whole scan saw, at no cost of their own: the lease taker scans every
//! tick while it renews per lease (the mode a table shared with Java
//! workers runs in), and a report too old for its worker to count as
//! alive is judged so by its `lut`.
//!
//! A fleet upgrading from the Java KCL 2.x reports as well, but its workers
//! take leases themselves and pick up none assigned to them: while its
//! migration state (`cv` of the item `Migration3.0`, in
//! `<lease table>-CoordinatorState` or, from 3.5 on, the lease table) says
//! `CLIENT_VERSION_2X` or `CLIENT_VERSION_UPGRADE_FROM_2X`, none of its
//! workers is returned: kcl judges their leases as any owner's and hands
//! them none (a lease handed over stood unrenewed until taken back).

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_core::store::{JavaWorker, StoreError, StoreOp};
use tracing::debug;

use crate::error::unconditional_error;
use crate::java_reports::report;
use crate::schema::java_migration::{CLIENT_VERSION, MIGRATION_KEY, SELF_TAKING, STATE_KEY};
use crate::schema::java_workers::{LAST_UPDATE, WORKER_ID};
pub use crate::schema::{coordinator_state_table_for, worker_metric_stats_table_for};
use crate::store::DynamoDbLeaseStore;

impl DynamoDbLeaseStore {
    pub(crate) async fn read_java_workers(&self) -> Result<Vec<JavaWorker>, StoreError> {
        let table = worker_metric_stats_table_for(self.table());
        // No such table: no Java KCL 3.0-3.4 worker ever ran here.
        let projection = format!("{WORKER_ID}, {LAST_UPDATE}");
        let items = self
            .scan_all(StoreOp::ReadJavaWorkers, &table, false, Some(&projection))
            .await?
            .unwrap_or_default();
        let mut workers: Vec<JavaWorker> =
            items.iter().filter_map(|i| report(i, WORKER_ID)).collect();
        let seen = self.scanned_reports().last();
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

    /// The client version `<table>-CoordinatorState` records, if any.
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
        match read {
            Ok(out) => Ok(out
                .item
                .and_then(|mut item| item.remove(CLIENT_VERSION))
                .and_then(|v| v.as_s().ok().cloned())),
            // No such table: a fleet of the Java KCL 3.5 layout (the item
            // is then in the lease table), or of no 3.x migration.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                Ok(None)
            }
            Err(e) => Err(unconditional_error(StoreOp::ReadJavaWorkers, &table, "", e)),
        }
    }
}
