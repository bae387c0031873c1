//! The store's scans: the lease table page by page (as the lease taker
//! reads it, the Java KCL 3.5 workers' reports noted on the way), and
//! any table whole.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::scan::ScanError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use aws_smithy_runtime_api::http::Response;
use futures::stream::{self, BoxStream, StreamExt};
use kcl_core::store::{Page, StoreError, StoreOp};

use super::{DynamoDbLeaseStore, read_lenient};
use crate::error::{is_access_denied, unconditional_error};
use crate::java_reports::{ScannedReports, Seen};
use tracing::warn;

/// Where a scan of the lease table stands: the key to resume after
/// (`None` for the first page) and what of the Java KCL it saw so far.
type Resume = (Option<HashMap<String, AttributeValue>>, Seen);

impl DynamoDbLeaseStore {
    /// The lease table's pages, strongly consistent. A failed page ends
    /// the scan; the caller retries it whole. A whole scan leaves the
    /// reports it saw in [`Self::scanned_reports`].
    pub(super) fn lease_pages(&self) -> BoxStream<'_, Result<Page, StoreError>> {
        // `None` = done.
        let first: Option<Resume> = Some((None, Seen::default()));
        stream::unfold(first, move |state| async move {
            let (start, mut seen) = state?;
            let result = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .set_limit(self.page_size)
                .set_exclusive_start_key(start)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            match result {
                Ok(out) => {
                    self.record_capacity(StoreOp::ScanPage, out.consumed_capacity());
                    out.items().iter().for_each(|item| seen.note(item));
                    let page = out
                        .items()
                        .iter()
                        .filter_map(|item| read_lenient(&self.table, item))
                        .collect();
                    let next = match out.last_evaluated_key().filter(|k| !k.is_empty()) {
                        Some(key) => Some((Some(key.clone()), seen)),
                        None => {
                            self.scanned_reports.scanned(seen);
                            None
                        }
                    };
                    Some((Ok(page), next))
                }
                Err(e) => Some((
                    Err(unconditional_error(StoreOp::ScanPage, &self.table, "", e)),
                    None,
                )),
            }
        })
        .boxed()
    }

    /// The Java KCL 3.5 reports the last whole scan of the lease table saw.
    pub(crate) fn scanned_reports(&self) -> &ScannedReports {
        &self.scanned_reports
    }

    /// Every item of `table` in one paginated scan (strongly consistent
    /// when `consistent`, only the attributes of `projection` when given),
    /// or `None` when the table does not exist. Billed to `op`.
    pub(crate) async fn scan_all(
        &self,
        op: StoreOp,
        table: &str,
        consistent: bool,
        projection: Option<&str>,
    ) -> Result<Option<Vec<HashMap<String, AttributeValue>>>, StoreError> {
        self.scan_whole(op, table, consistent, projection)
            .await
            .map_err(|e| unconditional_error(op, table, "", e))
    }

    /// [`Self::scan_all`] of another application's table, which this one
    /// may not be allowed to read: denied, it is taken for absent, and
    /// warned of once (`warned`).
    pub(crate) async fn scan_if_allowed(
        &self,
        op: StoreOp,
        table: &str,
        projection: &str,
        warned: &AtomicBool,
    ) -> Result<Option<Vec<HashMap<String, AttributeValue>>>, StoreError> {
        match self.scan_whole(op, table, false, Some(projection)).await {
            Ok(items) => Ok(items),
            Err(e) if is_access_denied(&e) => {
                if !warned.swap(true, Ordering::Relaxed) {
                    let e = unconditional_error(op, table, "", e);
                    warn!(table, error = %e, "cannot read the Java KCL's table: its workers there \
                        are not seen (the role needs dynamodb:Scan on it)");
                }
                Ok(None)
            }
            Err(e) => Err(unconditional_error(op, table, "", e)),
        }
    }

    async fn scan_whole(
        &self,
        op: StoreOp,
        table: &str,
        consistent: bool,
        projection: Option<&str>,
    ) -> Result<Option<Vec<HashMap<String, AttributeValue>>>, SdkError<ScanError, Response>> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let result = self
                .client
                .scan()
                .table_name(table)
                .consistent_read(consistent)
                .set_projection_expression(projection.map(str::to_owned))
                .set_exclusive_start_key(start)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            let out = match result {
                Ok(out) => out,
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_not_found_exception()) =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(e),
            };
            self.record_capacity(op, out.consumed_capacity());
            items.extend_from_slice(out.items());
            match out.last_evaluated_key().filter(|k| !k.is_empty()) {
                Some(next) => start = Some(next.clone()),
                None => return Ok(Some(items)),
            }
        }
    }
}
