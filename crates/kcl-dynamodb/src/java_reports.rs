//! The Java KCL 3.x workers' reports as items: in their own table
//! (3.0-3.4) or in the lease table (3.5), and the ones the last whole scan
//! of the lease table saw (see [`crate::java`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_core::store::JavaWorker;

use crate::schema::java_migration::{CLIENT_VERSION, MIGRATION_ENTITY};
use crate::schema::java_workers::{ENTITY, LAST_UPDATE};
use crate::schema::lease::{ENTITY_TYPE, LEASE_KEY};

/// What the last whole scan of the lease table saw of the Java KCL 3.5:
/// its workers' reports and its fleet's client version.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    pub(crate) reports: Vec<JavaWorker>,
    pub(crate) client_version: Option<String>,
}

impl Seen {
    /// Notes what of the Java KCL `item` (of the lease table) is.
    pub(crate) fn note(&mut self, item: &HashMap<String, AttributeValue>) {
        if let Some(report) = report_in_lease_table(item) {
            self.reports.push(report);
        } else if let Some(version) = client_version_in_lease_table(item) {
            self.client_version = Some(version);
        }
    }
}

/// How old the last whole scan may be and still stand for the lease
/// table: a Java worker reports every 30 s and counts as gone after 75 s
/// without a report, so an older scan could only show it gone.
const SCAN_FRESH: Duration = Duration::from_secs(60);

/// What the last whole scan of the lease table saw, and when it ended,
/// and the last client version read from `<table>-CoordinatorState`;
/// shared by the clones of a store.
#[derive(Debug, Clone, Default)]
pub(crate) struct ScannedReports {
    scan: Arc<Mutex<Option<(Instant, Seen)>>>,
    /// `None` until a read answered; then its answer (`Some(None)`: no
    /// version recorded).
    version: Arc<Mutex<Option<Option<String>>>>,
    /// Whether a denied read of the Java KCL's tables was warned of: once
    /// per store (so per lease table) and table, as reads repeat.
    pub(crate) denied_warned: Arc<DeniedWarned>,
}

/// See [`ScannedReports::denied_warned`].
#[derive(Debug, Default)]
pub(crate) struct DeniedWarned {
    pub(crate) reports: AtomicBool,
    pub(crate) version: AtomicBool,
}

impl ScannedReports {
    /// A whole scan ended, having seen `seen`.
    pub(crate) fn scanned(&self, seen: Seen) {
        *self.scan.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), seen));
    }

    /// What the last whole scan saw, if it ended in the last
    /// [`SCAN_FRESH`].
    pub(crate) fn fresh(&self) -> Option<Seen> {
        match &*self.scan.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((at, seen)) if at.elapsed() <= SCAN_FRESH => Some(seen.clone()),
            _ => None,
        }
    }

    /// A read of the coordinator state answered `version`.
    pub(crate) fn read_version(&self, version: Option<String>) {
        *self.version.lock().unwrap_or_else(PoisonError::into_inner) = Some(version);
    }

    /// The last answer of a read of the coordinator state, if any came.
    pub(crate) fn last_version(&self) -> Option<Option<String>> {
        self.version
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The client version the Java KCL 3.5's migration item `item` of the
/// lease table records, if it is that item.
pub(crate) fn client_version_in_lease_table(
    item: &HashMap<String, AttributeValue>,
) -> Option<String> {
    match item.get(ENTITY_TYPE) {
        Some(AttributeValue::S(kind)) if kind == MIGRATION_ENTITY => {
            item.get(CLIENT_VERSION)?.as_s().ok().cloned()
        }
        _ => None,
    }
}

/// The Java KCL 3.5 worker report `item` of the lease table is, if it is
/// one.
pub(crate) fn report_in_lease_table(item: &HashMap<String, AttributeValue>) -> Option<JavaWorker> {
    match item.get(ENTITY_TYPE) {
        Some(AttributeValue::S(kind)) if kind == ENTITY => report(item, LEASE_KEY),
        _ => None,
    }
}

/// A report's worker id (in attribute `id`) and `lut`.
pub(crate) fn report(item: &HashMap<String, AttributeValue>, id: &str) -> Option<JavaWorker> {
    let id = match item.get(id) {
        Some(AttributeValue::S(id)) => id.clone(),
        _ => return None,
    };
    let last_update_secs = match item.get(LAST_UPDATE) {
        Some(AttributeValue::N(n)) => n.parse().ok()?,
        _ => return None,
    };
    Some(JavaWorker {
        id,
        last_update_secs,
    })
}
