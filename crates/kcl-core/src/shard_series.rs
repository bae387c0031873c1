//! When a shard's metric series may be forgotten.
//!
//! A worker records about fifteen series per shard it reads (its lag, its
//! records waiting, its counters, ...). Leases move with every deploy,
//! steal and reshard, so a recorder that kept each shard's series for the
//! life of the process would grow without end, and `/metrics` with it.
//! The `metrics` facade has no call that removes a series, so this module
//! tells a recorder when it may: each consumer holds a [`Reading`] for as
//! long as it runs, and once no consumer in the process reads a shard, the
//! recorders [`subscribe`]d are called with its stream and shard to drop
//! every series labelled with both. The Prometheus and OTLP recorders of
//! the `kcl` crate subscribe (and keep the last values a while, for a
//! scrape to see the gauges at 0, before they forget them through
//! [`with_unread`]); an application's own recorder can too.
//!
//! Consumers are counted per shard, so a shard that a second worker of the
//! process reads, or that this worker took back before its previous
//! consumer finished, keeps its series.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// What a subscriber is called with: the stream and the shard id.
type Forget = Box<dyn Fn(&str, &str) + Send + Sync>;

struct Registry {
    /// Consumers running, by (stream, shard).
    readers: BTreeMap<(String, String), usize>,
    subscribers: Vec<(u64, Forget)>,
    next_id: u64,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    readers: BTreeMap::new(),
    subscribers: Vec::new(),
    next_id: 0,
});

fn registry() -> MutexGuard<'static, Registry> {
    // A panicking subscriber leaves plain counts behind, still valid.
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Calls `forget(stream, shard)` each time the last consumer of a shard in
/// this process stops, until the returned [`Subscription`] is dropped.
///
/// `forget` runs while no consumer of that shard can start (the count it
/// acts on is locked), so a consumer that starts right after records into
/// new series, never into ones being removed. It must be quick, and must
/// not start or stop a consumer, nor call into this module (subscribe,
/// drop a subscription, [`with_unread`]): the lock is not reentrant.
pub fn subscribe(forget: impl Fn(&str, &str) + Send + Sync + 'static) -> Subscription {
    let mut registry = registry();
    let id = registry.next_id;
    registry.next_id += 1;
    registry.subscribers.push((id, Box::new(forget)));
    Subscription { id }
}

/// A subscriber of [`subscribe`]; dropping it unsubscribes.
#[must_use = "dropping the subscription unsubscribes at once"]
pub struct Subscription {
    id: u64,
}

impl Subscription {
    /// Keeps the subscription for the life of the process (a recorder
    /// installed once, process-wide).
    pub fn keep_forever(self) {
        std::mem::forget(self);
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        registry().subscribers.retain(|(id, _)| *id != self.id);
    }
}

/// Calls `forget` with those of `shards` (stream, shard id) that no
/// consumer of this process reads now, while none can start: for a
/// recorder that keeps a shard's last values a while after
/// [`subscribe`]'s call (so that a scrape sees its gauges at 0) and
/// forgets them later, unless the shard came back meanwhile. `forget` must
/// not start or stop a consumer, nor call into this module.
pub fn with_unread(shards: &[(String, String)], forget: impl FnOnce(&[&(String, String)])) {
    forget_unread(&registry(), shards, forget);
}

/// Calls `forget` with those of `shards` no consumer reads, if any.
fn forget_unread(
    registry: &Registry,
    shards: &[(String, String)],
    forget: impl FnOnce(&[&(String, String)]),
) {
    let unread: Vec<&(String, String)> = shards
        .iter()
        .filter(|key| !registry.readers.contains_key(*key))
        .collect();
    if !unread.is_empty() {
        forget(&unread);
    }
}

/// [`with_unread`], unless another call of this module holds its lock:
/// then nothing is called, and the answer is false. For a caller that may
/// run under that lock itself (a recorder making a series, recorded into
/// by a subscriber's `forget`), where waiting would never end.
pub fn try_with_unread(
    shards: &[(String, String)],
    forget: impl FnOnce(&[&(String, String)]),
) -> bool {
    let registry = match REGISTRY.try_lock() {
        Ok(registry) => registry,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return false,
    };
    forget_unread(&registry, shards, forget);
    true
}

/// A consumer reads `shard` of `stream` for as long as the returned guard
/// lives; it is taken before the consumer records anything.
pub(crate) fn reading(stream: &str, shard: &str) -> Reading {
    let key = (stream.to_owned(), shard.to_owned());
    *registry().readers.entry(key.clone()).or_insert(0) += 1;
    Reading { key }
}

/// One consumer's claim on its shard's series (see [`reading`]).
#[derive(Debug)]
pub(crate) struct Reading {
    key: (String, String),
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut registry = registry();
        let Some(count) = registry.readers.get_mut(&self.key) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        registry.readers.remove(&self.key);
        // Under the lock: a consumer of this shard starting now waits in
        // `reading` until every subscriber has forgotten the old series.
        for (_, forget) in &registry.subscribers {
            forget(&self.key.0, &self.key.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex as StdMutex};

    use super::*;

    /// The forgets seen by one test's subscriber, for shards of its own
    /// stream: tests run in parallel and share the process-wide registry.
    fn collect(stream: &'static str) -> (Subscription, Arc<StdMutex<Vec<String>>>) {
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let subscription = subscribe(move |s, shard| {
            if s == stream {
                sink.lock().unwrap().push(shard.to_owned());
            }
        });
        (subscription, seen)
    }

    #[test]
    fn a_shard_is_forgotten_once_its_last_consumer_stops() {
        let (_subscription, seen) = collect("forget-last");
        let first = reading("forget-last", "shard-1");
        let second = reading("forget-last", "shard-1");
        let other = reading("forget-last", "shard-2");
        drop(first);
        assert!(
            seen.lock().unwrap().is_empty(),
            "a consumer still reads shard-1"
        );
        drop(second);
        assert_eq!(*seen.lock().unwrap(), ["shard-1"]);
        drop(other);
        assert_eq!(*seen.lock().unwrap(), ["shard-1", "shard-2"]);
    }

    #[test]
    fn a_late_forget_gets_only_the_shards_no_consumer_reads() {
        let shards = [("late-forget", "shard-1"), ("late-forget", "shard-2")]
            .map(|(stream, shard)| (stream.to_owned(), shard.to_owned()));
        let forgotten = StdMutex::new(Vec::new());
        let forget = |unread: &[&(String, String)]| {
            forgotten
                .lock()
                .unwrap()
                .extend(unread.iter().map(|(_, shard)| shard.clone()));
        };
        let back = reading("late-forget", "shard-1");
        with_unread(&shards, forget);
        assert_eq!(
            *forgotten.lock().unwrap(),
            ["shard-2"],
            "shard-1 is read again"
        );
        drop(back);
        with_unread(&shards, forget);
        assert_eq!(
            *forgotten.lock().unwrap(),
            ["shard-2", "shard-1", "shard-2"]
        );
    }

    #[test]
    fn a_dropped_subscription_is_called_no_more() {
        let (subscription, seen) = collect("unsubscribed");
        drop(reading("unsubscribed", "shard-1"));
        drop(subscription);
        drop(reading("unsubscribed", "shard-2"));
        assert_eq!(*seen.lock().unwrap(), ["shard-1"]);
    }
}
