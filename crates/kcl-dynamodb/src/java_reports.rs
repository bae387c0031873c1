//! The Java KCL 3.x workers' reports as items: in their own table
//! (3.0-3.4) or in the lease table (3.5), and the ones the last whole scan
//! of the lease table saw (see [`crate::java`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_dynamodb::types::AttributeValue;
use kcl_core::store::JavaWorker;

use crate::schema::java_workers::{ENTITY, LAST_UPDATE};
use crate::schema::lease::{ENTITY_TYPE, LEASE_KEY};

/// The Java workers' reports the last whole scan of the lease table saw;
/// shared by the clones of a store.
#[derive(Debug, Clone, Default)]
pub(crate) struct ScannedReports(Arc<Mutex<Vec<JavaWorker>>>);

impl ScannedReports {
    /// A whole scan ended, having seen `reports`.
    pub(crate) fn scanned(&self, reports: Vec<JavaWorker>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = reports;
    }

    /// The reports of the last whole scan (none before one).
    pub(crate) fn last(&self) -> Vec<JavaWorker> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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
