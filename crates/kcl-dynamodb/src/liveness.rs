//! Liveness records on DynamoDB (the worker-liveness renewal mode): one item
//! per worker process in a table of their own, `<lease table>-workers` by
//! default, so that reading every worker's record never reads a lease.
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `instance` | S (hash key) | the process's instance id, the prefix of its tenures |
//! | `workerId` | S | its worker id |
//! | `beat` | N | bumped by every beat |
//! | `held` | N | leases held at the last beat |
//! | `changes` | N | bumped when it created or released leases |
//! | `wake` | N | bumped by peers asking it to read the lease table |
//! | `asked` | SS | lease keys peers asked it to hand over |
//! | `stopping` | BOOL | a graceful shutdown is under way (absent otherwise) |
//! | `d` | N | its lease duration in milliseconds: peers judge its leases by it |
//! | `i` | N | its beat interval in milliseconds: peers read just after its beats |
//! | `p` | BOOL | it renews every lease too (absent otherwise): peers also judge its leases by their counters |
//! | `t` | N | when it last beat (epoch milliseconds, its wall clock; for tools, and a hint of life) |
//!
//! Every worker reads every record at each tick, so a record's bytes are
//! paid workers x workers times a tick: the two fields only tools read
//! have one-letter names (about 14 bytes a record instead of 49), and
//! `stopping` is written only while true (9 bytes saved on nearly every
//! record).
//!
//! The Java KCL never reads or writes this table; a lease table shared with
//! it must use per-lease renewal (whose workers beat here too).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnConsumedCapacity, ReturnValuesOnConditionCheckFailure,
};
use kcl_core::store::{Beat, BeatUpdate, StoreError, StoreOp};

use crate::error::ClassifiedError;
use crate::store::{DynamoDbLeaseStore, Update};

/// Attribute names of a liveness record (kept in [`crate::schema`]).
pub use crate::schema::liveness as attr;

fn key(instance: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([(
        attr::INSTANCE.to_owned(),
        AttributeValue::S(instance.to_owned()),
    )])
}

fn number(item: &HashMap<String, AttributeValue>, name: &str) -> u64 {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A record as read; `None` for an item without an instance id, and for
/// the item naming the table's stream, which is not a worker's.
pub(crate) fn from_item(item: &HashMap<String, AttributeValue>) -> Option<Beat> {
    if item.contains_key(attr::SERVES_STREAM) {
        return None;
    }
    let written_at = item
        .contains_key(attr::WRITTEN_AT)
        .then(|| UNIX_EPOCH + Duration::from_millis(number(item, attr::WRITTEN_AT)));
    Some(Beat {
        instance: item.get(attr::INSTANCE)?.as_s().ok()?.clone(),
        worker: item
            .get(attr::WORKER)
            .and_then(|v| v.as_s().ok())
            .cloned()
            .unwrap_or_default(),
        counter: number(item, attr::BEAT),
        held: number(item, attr::HELD),
        changes: number(item, attr::CHANGES),
        wake: number(item, attr::WAKE),
        asked: item
            .get(attr::ASKED)
            .and_then(|v| v.as_ss().ok())
            .map(|s| s.iter().cloned().collect::<BTreeSet<_>>())
            .unwrap_or_default(),
        stopping: item
            .get(attr::STOPPING)
            .and_then(|v| v.as_bool().ok())
            .copied()
            .unwrap_or(false),
        per_lease: item
            .get(attr::PER_LEASE)
            .and_then(|v| v.as_bool().ok())
            .copied()
            .unwrap_or(false),
        lease_duration: item
            .contains_key(attr::LEASE_DURATION)
            .then(|| Duration::from_millis(number(item, attr::LEASE_DURATION))),
        written_at,
        // The reader's wall clock against the writer's: a hint only (see
        // `Beat::age`); a record from the future reads as just written.
        age: written_at.map(|w| SystemTime::now().duration_since(w).unwrap_or_default()),
        beat_interval: item
            .contains_key(attr::BEAT_INTERVAL)
            .then(|| Duration::from_millis(number(item, attr::BEAT_INTERVAL))),
    })
}

/// A beat's UpdateItem expressions: what it sets, removes and deletes.
struct BeatWrite {
    expression: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl BeatWrite {
    /// The whole update of `update`'s beat: its fields set, its flags set
    /// or removed, the answered requests deleted.
    fn new(update: &BeatUpdate<'_>) -> Self {
        let mut write = Self::set(update);
        write.flags(update);
        write.answered(update);
        write
    }

    /// The fields every beat sets, and the counter it bumps.
    fn set(update: &BeatUpdate<'_>) -> Self {
        // A record created anew starts at a random counter: a peer that
        // remembers an earlier record of this instance (deleted while the
        // instance was paused) must see the counter move.
        let mut expression =
            "SET #w = :w, #h = :h, #c = :c, #d = :d, #v = :v, #t = :t, #b = if_not_exists(#b, :start) + :one"
                .to_owned();
        // `stopping` is kept only while true (an absent one reads false):
        // the bytes every peer reads every tick stay few.
        if update.stopping {
            expression.push_str(", #s = :s");
        }
        if update.per_lease {
            expression.push_str(", #p = :p");
        }
        let names = HashMap::from([
            ("#i".to_owned(), attr::INSTANCE.to_owned()),
            ("#w".to_owned(), attr::WORKER.to_owned()),
            ("#h".to_owned(), attr::HELD.to_owned()),
            ("#c".to_owned(), attr::CHANGES.to_owned()),
            ("#s".to_owned(), attr::STOPPING.to_owned()),
            ("#p".to_owned(), attr::PER_LEASE.to_owned()),
            ("#d".to_owned(), attr::LEASE_DURATION.to_owned()),
            ("#v".to_owned(), attr::BEAT_INTERVAL.to_owned()),
            ("#t".to_owned(), attr::WRITTEN_AT.to_owned()),
            ("#b".to_owned(), attr::BEAT.to_owned()),
        ]);
        let now_millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let values = HashMap::from([
            (":w".to_owned(), AttributeValue::S(update.worker.to_owned())),
            (":h".to_owned(), AttributeValue::N(update.held.to_string())),
            (
                ":c".to_owned(),
                AttributeValue::N(update.changes.to_string()),
            ),
            (
                ":d".to_owned(),
                AttributeValue::N(update.lease_duration.as_millis().to_string()),
            ),
            (
                ":v".to_owned(),
                AttributeValue::N(update.beat_interval.as_millis().to_string()),
            ),
            (":t".to_owned(), AttributeValue::N(now_millis.to_string())),
            (":one".to_owned(), AttributeValue::N("1".into())),
            (
                ":start".to_owned(),
                AttributeValue::N(u64::from(rand::random::<u32>()).to_string()),
            ),
        ]);
        BeatWrite {
            expression,
            names,
            values,
        }
    }

    /// Binds the flags that are set, and removes those that are not (an
    /// absent flag reads false).
    fn flags(&mut self, update: &BeatUpdate<'_>) {
        let mut removed = Vec::new();
        if update.stopping {
            self.values
                .insert(":s".to_owned(), AttributeValue::Bool(true));
        } else {
            removed.push("#s");
        }
        if update.per_lease {
            self.values
                .insert(":p".to_owned(), AttributeValue::Bool(true));
        } else {
            removed.push("#p");
        }
        if !removed.is_empty() {
            self.expression.push_str(" REMOVE ");
            self.expression.push_str(&removed.join(", "));
        }
    }

    /// Deletes the requests this beat answers from the record.
    fn answered(&mut self, update: &BeatUpdate<'_>) {
        if !update.answered.is_empty() {
            self.expression.push_str(" DELETE #a :answered");
            self.names.insert("#a".to_owned(), attr::ASKED.to_owned());
            self.values.insert(
                ":answered".to_owned(),
                AttributeValue::Ss(update.answered.to_vec()),
            );
        }
    }
}

fn store_error(classified: ClassifiedError, instance: &str) -> StoreError {
    match classified {
        ClassifiedError::Store(e) => e,
        ClassifiedError::ConditionFailed(_) => StoreError::ConditionFailed {
            key: format!("liveness record {instance}"),
            current: None,
        },
    }
}

impl DynamoDbLeaseStore {
    pub(crate) async fn write_beat(&self, update: &BeatUpdate<'_>) -> Result<Beat, StoreError> {
        let table = self.workers_table();
        let BeatWrite {
            expression,
            names,
            values,
        } = BeatWrite::new(update);
        let write = Update {
            expression,
            condition: "attribute_not_exists(#i) OR #w = :w".to_owned(),
            names,
            values,
        };
        let (instance, item_key) = (update.instance, key(update.instance));
        // A failed condition is reported without the record (`store_error`).
        let on_failure = ReturnValuesOnConditionCheckFailure::None;
        match self
            .updated_item(StoreOp::Beat, table, instance, item_key, write, on_failure)
            .await
        {
            Ok(record) => record
                .as_ref()
                .and_then(from_item)
                .ok_or_else(|| StoreError::Fatal {
                    op: StoreOp::Beat,
                    message: format!("a beat in table {table:?} returned no record"),
                    source: None,
                }),
            Err(c) => Err(store_error(c, instance)),
        }
    }

    pub(crate) async fn read_beats(&self) -> Result<Vec<Beat>, StoreError> {
        // No such table: nobody renews by liveness record here (a fleet
        // renewing per lease, or a table shared with the Java KCL).
        let items = self
            .scan_all(StoreOp::ReadBeats, self.workers_table(), true, None)
            .await?
            .unwrap_or_default();
        Ok(items.iter().filter_map(from_item).collect())
    }

    pub(crate) async fn poke_beat(
        &self,
        instance: &str,
        ask: Option<&str>,
    ) -> Result<(), StoreError> {
        let table = self.workers_table();
        let mut expression = "ADD #k :one".to_owned();
        let mut names = HashMap::from([
            ("#i".to_owned(), attr::INSTANCE.to_owned()),
            ("#k".to_owned(), attr::WAKE.to_owned()),
        ]);
        let mut values = HashMap::from([(":one".to_owned(), AttributeValue::N("1".into()))]);
        if let Some(lease) = ask {
            expression.push_str(", #a :ask");
            names.insert("#a".to_owned(), attr::ASKED.to_owned());
            values.insert(
                ":ask".to_owned(),
                AttributeValue::Ss(vec![lease.to_owned()]),
            );
        }
        let poke = Update {
            expression,
            condition: "attribute_exists(#i)".to_owned(),
            names,
            values,
        };
        let result = self
            .conditional_update(table, key(instance), poke)
            .send()
            .await;
        // No table of records: nobody here renews by liveness record, so
        // the instance has none (a fleet renewing per lease).
        if let Err(e) = &result
            && e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception())
        {
            return Err(StoreError::ConditionFailed {
                key: format!("liveness record {instance}"),
                current: None,
            });
        }
        self.billed(StoreOp::Poke, table, instance, result, |out| {
            out.consumed_capacity()
        })
        .map(|_| ())
        .map_err(|c| store_error(c, instance))
    }

    pub(crate) async fn forget_beat(
        &self,
        instance: &str,
        counter: Option<u64>,
    ) -> Result<(), StoreError> {
        let table = self.workers_table();
        let mut request = self
            .client()
            .delete_item()
            .table_name(table)
            .set_key(Some(key(instance)))
            .return_consumed_capacity(ReturnConsumedCapacity::Total);
        if let Some(counter) = counter {
            request = request
                .condition_expression("#b = :b")
                .expression_attribute_names("#b", attr::BEAT)
                .expression_attribute_values(":b", AttributeValue::N(counter.to_string()));
        }
        let result = request.send().await;
        self.billed(StoreOp::Forget, table, instance, result, |out| {
            out.consumed_capacity()
        })
        .map(|_| ())
        .map_err(|c| store_error(c, instance))
    }
}
