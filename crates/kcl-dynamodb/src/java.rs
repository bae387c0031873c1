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

use kcl_core::store::{JavaWorker, StoreError, StoreOp};

use crate::java_reports::report;
use crate::schema::java_workers::{LAST_UPDATE, WORKER_ID};
pub use crate::schema::worker_metric_stats_table_for;
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
        // A worker migrating between the layouts may report in both: its
        // newest report counts.
        for report in self.scanned_reports().last() {
            match workers.iter_mut().find(|w| w.id == report.id) {
                Some(w) => w.last_update_secs = w.last_update_secs.max(report.last_update_secs),
                None => workers.push(report),
            }
        }
        Ok(workers)
    }
}
