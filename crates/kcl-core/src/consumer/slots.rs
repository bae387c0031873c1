//! One consumer per shard at a time in this worker: the slot a new
//! consumer waits on while the previous consumer of its shard finishes.

use std::sync::Arc;

/// One consumer per shard at a time in this worker. When the worker takes a
/// lease again (a fence during a store outage, then a reclaim), the
/// consumer of its previous tenure may still be inside a processor call.
/// Its checkpoints can no longer land (they are conditional on its tenure),
/// but its side effects would overlap the new tenure's: the new consumer
/// waits for the old one, reads the checkpoint after it, and two processors
/// of one shard never run in one worker.
#[derive(Debug, Default)]
pub(crate) struct ShardSlots {
    slots: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl ShardSlots {
    /// The slot of `key`, held by the returned value until it drops.
    pub(super) fn slot(self: &Arc<Self>, key: &str) -> SlotRef {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        SlotRef {
            slots: Arc::clone(self),
            key: key.to_owned(),
            slot: Some(Arc::clone(slots.entry(key.to_owned()).or_default())),
        }
    }
}

/// A consumer's reference to its shard's slot. When the last one goes, so
/// does the slot: the map stays as small as the set of shards in use, at a
/// constant cost per consumer (a sweep over every slot at each start made
/// a cold start of many shards quadratic).
pub(super) struct SlotRef {
    slots: Arc<ShardSlots>,
    key: String,
    slot: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl SlotRef {
    pub(super) fn mutex(&self) -> Arc<tokio::sync::Mutex<()>> {
        self.slot.clone().unwrap_or_default()
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        let mut slots = self.slots.slots.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.slot.take());
        if slots
            .get(&self.key)
            .is_some_and(|slot| Arc::strong_count(slot) == 1)
        {
            slots.remove(&self.key);
        }
    }
}
