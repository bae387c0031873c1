//! The lease item layout, compatible with the Java KCL 2.x/3.x.
//!
//! | attribute | type | model field |
//! |---|---|---|
//! | `leaseKey` | S | `key` (hash key) |
//! | `leaseOwner` | S | `owner` (absent when unowned) |
//! | `leaseCounter` | N | `counter` |
//! | `checkpoint` | S | sequence number or sentinel |
//! | `checkpointSubSequenceNumber` | N | sub-sequence of the checkpoint |
//! | `pendingCheckpoint` | S | prepared checkpoint |
//! | `pendingCheckpointSubSequenceNumber` | N | its sub-sequence |
//! | `pendingCheckpointState` | B | application state of the prepared checkpoint |
//! | `ownerSwitchesSinceCheckpoint` | N | |
//! | `parentShardId` | SS | parent shards |
//! | `childShardIds` | SS | child shards |
//! | `startingHashKey`, `endingHashKey` | S | hash-key range |
//! | `checkpointOwner` | S | previous owner during a graceful handoff |
//! | `throughputKBps` | N | what the shard carries, KB/s (see below) |
//! | `kclTenure` | S | the owner's tenure (kcl only; see below) |
//! | `kclCheckpointOwnerTenure` | S | the previous owner's tenure during a handoff (kcl only) |
//! | `kclCommitToken` | S | the token of the last exactly-once commit (kcl only) |
//! | `kclFencedCommits` | SS | tokens of exactly-once commits settled as never to land (kcl only) |
//! | `streamName`, `shardId` | S | multi-stream leases: stream identifier and shard |
//!
//! The `kcl…` attributes are kcl's own: every take writes a fresh
//! tenure, and kcl's writes are conditional on it. The Java KCL neither
//! writes nor reads them (its updates name only the attributes they
//! change), so in a shared table a Java take leaves a stale tenure behind,
//! which guards nothing because the owner changed as well.
//!
//! The two commit attributes belong to [`crate::exactly_once`] and are not
//! part of the lease model: only a transactional commit writes
//! `kclCommitToken`, so a lease item showing a checkpoint tells whether
//! that commit wrote it (a plain checkpoint at the same position does not
//! count); and a commit settled as not applied is fenced by adding its
//! token to `kclFencedCommits`, which the transaction's condition checks,
//! so an attempt still in flight can never land after the verdict. Each
//! commit that lands clears the set: every fenced attempt was conditional
//! on a checkpoint it has moved past.
//!
//! `throughputKBps` is the Java KCL 3.x's: its renewals write what the
//! lease carried (a `Double`, kilobytes a second), and its leader reads it
//! to assign leases by throughput. kcl writes the same attribute (with
//! renewals per lease, or on its own at a low rate) and balances by it. A
//! value that is not a finite non-negative number reads as no figure,
//! never as a malformed item: the figure is a hint, and a lease must never
//! become unreadable over it.
//!
//! Multi-stream keys are `account:stream:creationEpoch:shardId`. Newer Java
//! KCLs also keep non-lease entities in the table (marked by an `entityType`
//! other than `LEASE`, which the Java KCL 3.5 writes on its leases); those
//! are not leases and are skipped without complaint.

use std::collections::{BTreeSet, HashMap};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use kcl_core::{Checkpoint, HashKeyRange, Lease, Throughput};

/// Attribute names, as the Java KCL spells them (kept in [`crate::schema`]).
pub use crate::schema::lease as attr;

/// Why an item could not be read as a lease.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed lease item {key:?}: {reason}")]
pub struct ItemError {
    /// The item's `leaseKey`, or `"<missing>"`.
    pub key: String,
    /// What is wrong, naming the attribute.
    pub reason: String,
}

/// The result of reading one table item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadItem {
    /// A lease.
    Lease(Box<Lease>),
    /// Not a lease (a Java KCL worker-metrics or leader-lock entity).
    NotALease,
}

/// Writes every model field as its attribute; absent options are omitted.
pub fn to_item(lease: &Lease) -> HashMap<String, AttributeValue> {
    let mut item = HashMap::new();
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let n = |v: u64| AttributeValue::N(v.to_string());
    item.insert(attr::LEASE_KEY.into(), s(&lease.key));
    item.insert(attr::LEASE_COUNTER.into(), n(lease.counter));
    if let Some(owner) = &lease.owner {
        item.insert(attr::LEASE_OWNER.into(), s(owner));
    }
    item.insert(
        attr::OWNER_SWITCHES.into(),
        n(lease.owner_switches_since_checkpoint),
    );
    item.insert(attr::CHECKPOINT.into(), s(lease.checkpoint.as_str()));
    item.insert(
        attr::CHECKPOINT_SUB.into(),
        n(lease.checkpoint.sub_sequence()),
    );
    if let Some(p) = &lease.pending_checkpoint {
        item.insert(attr::PENDING_CHECKPOINT.into(), s(p.as_str()));
        item.insert(attr::PENDING_CHECKPOINT_SUB.into(), n(p.sub_sequence()));
    }
    if let Some(state) = &lease.pending_checkpoint_state {
        item.insert(
            attr::PENDING_CHECKPOINT_STATE.into(),
            AttributeValue::B(Blob::new(state.clone())),
        );
    }
    // DynamoDB rejects empty sets: an empty set is an absent attribute.
    if !lease.parent_shard_ids.is_empty() {
        item.insert(
            attr::PARENT_SHARD_IDS.into(),
            string_set(&lease.parent_shard_ids),
        );
    }
    if !lease.child_shard_ids.is_empty() {
        item.insert(
            attr::CHILD_SHARD_IDS.into(),
            string_set(&lease.child_shard_ids),
        );
    }
    if let Some(range) = &lease.hash_key_range {
        item.insert(attr::STARTING_HASH_KEY.into(), s(&range.starting));
        item.insert(attr::ENDING_HASH_KEY.into(), s(&range.ending));
    }
    if let Some(cp_owner) = &lease.checkpoint_owner {
        item.insert(attr::CHECKPOINT_OWNER.into(), s(cp_owner));
    }
    if let Some(tenure) = &lease.tenure {
        item.insert(attr::TENURE.into(), s(tenure));
    }
    if let Some(tenure) = &lease.checkpoint_owner_tenure {
        item.insert(attr::CHECKPOINT_OWNER_TENURE.into(), s(tenure));
    }
    if let Some(stream) = &lease.stream {
        item.insert(attr::STREAM_NAME.into(), s(stream));
        item.insert(attr::SHARD_ID.into(), s(&lease.shard_id));
    }
    if let Some(load) = lease.throughput {
        item.insert(attr::THROUGHPUT_KBPS.into(), throughput_value(load));
    }
    item
}

/// A load figure as the `throughputKBps` number, rounded to a thousandth
/// and written as the shortest plain decimal (`12.5`, as the Java KCL
/// writes it; it parses it with `Double.valueOf`).
pub fn throughput_value(load: Throughput) -> AttributeValue {
    AttributeValue::N(load.rounded().kbps().to_string())
}

/// Reads `throughputKBps`: `None` when absent, not a number, or not a
/// finite non-negative one.
fn throughput_of(item: &HashMap<String, AttributeValue>) -> Option<Throughput> {
    match item.get(attr::THROUGHPUT_KBPS) {
        Some(AttributeValue::N(n)) => n.trim().parse().ok().and_then(Throughput::from_kbps),
        _ => None,
    }
}

/// A string set attribute.
pub fn string_set(values: &BTreeSet<String>) -> AttributeValue {
    AttributeValue::Ss(values.iter().cloned().collect())
}

/// Reads an item. Every attribute but `leaseKey` and `leaseCounter` may be
/// missing (the Java KCL omits empty ones); present attributes must have
/// the right type.
pub fn from_item(item: &HashMap<String, AttributeValue>) -> Result<ReadItem, ItemError> {
    let key = match item.get(attr::LEASE_KEY) {
        Some(AttributeValue::S(k)) => k.clone(),
        _ => {
            return Err(ItemError {
                key: "<missing>".into(),
                reason: format!("`{}` is missing or not a string", attr::LEASE_KEY),
            });
        }
    };
    // The Java KCL 3.5 marks the leases it creates too: taken for other
    // entities, a table it made (or the children it created at a reshard)
    // had shards that no kcl worker ever read, and no error said why.
    match item.get(attr::ENTITY_TYPE) {
        None => {}
        Some(AttributeValue::S(t)) if t == attr::LEASE_ENTITY => {}
        Some(_) => return Ok(ReadItem::NotALease),
    }
    let r = Reader { item, key: &key };
    let counter = r
        .number(attr::LEASE_COUNTER)?
        .ok_or_else(|| r.err(format!("`{}` is missing", attr::LEASE_COUNTER)))?;
    let checkpoint = r.checkpoint()?;
    let pending_checkpoint = r.pending_checkpoint()?;
    let pending_checkpoint_state = r.pending_state()?;
    let hash_key_range = r.hash_key_range()?;
    let (stream, shard_id) = r.stream_and_shard()?;
    Ok(ReadItem::Lease(Box::new(Lease {
        owner: r.string(attr::LEASE_OWNER)?.map(str::to_owned),
        counter,
        checkpoint,
        pending_checkpoint,
        pending_checkpoint_state,
        owner_switches_since_checkpoint: r.number(attr::OWNER_SWITCHES)?.unwrap_or(0),
        parent_shard_ids: r.string_set(attr::PARENT_SHARD_IDS)?,
        child_shard_ids: r.string_set(attr::CHILD_SHARD_IDS)?,
        hash_key_range,
        checkpoint_owner: r.string(attr::CHECKPOINT_OWNER)?.map(str::to_owned),
        tenure: r.string(attr::TENURE)?.map(str::to_owned),
        checkpoint_owner_tenure: r.string(attr::CHECKPOINT_OWNER_TENURE)?.map(str::to_owned),
        throughput: throughput_of(item),
        stream,
        shard_id,
        key,
    })))
}

/// The attribute of `item` the store's writes cannot take NULL in (a value
/// other tools write, as a script setting a field to None; kcl and the
/// Java KCL never do), if it is NULL: a take adds to the owner switch
/// count, and DynamoDB refuses to add to a NULL. The reader takes a NULL
/// for absent, and every condition that an attribute be absent takes a
/// NULL for absent too (see the store's `absent_or_null`).
pub(crate) fn null_in_conditions(item: &HashMap<String, AttributeValue>) -> Option<&'static str> {
    let name = attr::OWNER_SWITCHES;
    matches!(item.get(name), Some(AttributeValue::Null(_))).then_some(name)
}

struct Reader<'a> {
    item: &'a HashMap<String, AttributeValue>,
    key: &'a str,
}

impl<'a> Reader<'a> {
    fn err(&self, reason: String) -> ItemError {
        ItemError {
            key: self.key.to_owned(),
            reason,
        }
    }

    fn string(&self, name: &str) -> Result<Option<&'a str>, ItemError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::S(s)) => Ok(Some(s)),
            Some(_) => Err(self.err(format!("`{name}` is not a string"))),
        }
    }

    fn number(&self, name: &str) -> Result<Option<u64>, ItemError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::N(n)) => n
                .parse()
                .map(Some)
                .map_err(|_| self.err(format!("`{name}` is {n:?}, not a non-negative integer"))),
            Some(_) => Err(self.err(format!("`{name}` is not a number"))),
        }
    }

    fn string_set(&self, name: &str) -> Result<BTreeSet<String>, ItemError> {
        match self.item.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(BTreeSet::new()),
            Some(AttributeValue::Ss(v)) => Ok(v.iter().cloned().collect()),
            // Some KCL ports wrote a single parent as a plain string.
            Some(AttributeValue::S(s)) => Ok([s.clone()].into()),
            Some(_) => Err(self.err(format!("`{name}` is not a string set"))),
        }
    }

    /// The checkpoint, which every lease has.
    fn checkpoint(&self) -> Result<Checkpoint, ItemError> {
        match self.string(attr::CHECKPOINT)? {
            Some(cp) => {
                let sub = self.number(attr::CHECKPOINT_SUB)?.unwrap_or(0);
                Checkpoint::parse(cp, sub)
                    .map_err(|e| self.err(format!("`{}`: {e}", attr::CHECKPOINT)))
            }
            None => Err(self.err(format!("`{}` is missing", attr::CHECKPOINT))),
        }
    }

    /// The prepared checkpoint, if any (an empty one is none).
    fn pending_checkpoint(&self) -> Result<Option<Checkpoint>, ItemError> {
        Ok(match self.string(attr::PENDING_CHECKPOINT)? {
            Some(p) if !p.is_empty() => {
                let sub = self.number(attr::PENDING_CHECKPOINT_SUB)?.unwrap_or(0);
                Some(
                    Checkpoint::parse(p, sub)
                        .map_err(|e| self.err(format!("`{}`: {e}", attr::PENDING_CHECKPOINT)))?,
                )
            }
            _ => None,
        })
    }

    /// The prepared checkpoint's application state, if any.
    fn pending_state(&self) -> Result<Option<Vec<u8>>, ItemError> {
        match self.item.get(attr::PENDING_CHECKPOINT_STATE) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(AttributeValue::B(b)) => Ok(Some(b.as_ref().to_vec())),
            Some(_) => Err(self.err(format!(
                "`{}` is not binary",
                attr::PENDING_CHECKPOINT_STATE
            ))),
        }
    }

    /// The hash-key range, when both ends are present and not empty.
    fn hash_key_range(&self) -> Result<Option<HashKeyRange>, ItemError> {
        Ok(
            match (
                self.string(attr::STARTING_HASH_KEY)?,
                self.string(attr::ENDING_HASH_KEY)?,
            ) {
                (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() => Some(HashKeyRange {
                    starting: a.to_owned(),
                    ending: b.to_owned(),
                }),
                _ => None,
            },
        )
    }

    /// A multi-stream lease's stream and shard, or a single-stream lease's
    /// shard, which is its key.
    fn stream_and_shard(&self) -> Result<(Option<String>, String), ItemError> {
        let stream = self.string(attr::STREAM_NAME)?.map(str::to_owned);
        let shard_id = match (&stream, self.string(attr::SHARD_ID)?) {
            (Some(_), Some(shard)) => shard.to_owned(),
            (Some(_), None) => {
                return Err(self.err(format!("multi-stream lease without `{}`", attr::SHARD_ID)));
            }
            (None, _) => self.key.to_owned(),
        };
        Ok((stream, shard_id))
    }
}

#[cfg(test)]
mod tests;
