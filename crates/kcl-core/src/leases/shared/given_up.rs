//! Tenures this process gave up in the liveness mode (fenced, or released while
//! the release failed) that the table may still name. Nothing renews a lease
//! item in that mode: a lease left naming such a tenure names this instance,
//! which peers see beating, so no peer takes it, and nobody reads its shard
//! unless this process reclaims it. The taker reclaims it from its scan; when a
//! tick can neither judge peers nor scan (the liveness records or the lease
//! table cannot be read), from the lease as the tenure last knew it, since
//! reclaiming its own lease needs neither (see
//! `taker::claims::reclaim_given_up`).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::lease::Lease;
use crate::leases::held::Held;

/// The given-up tenures, by lease key, in key order (a seeded simulation
/// replays its store calls).
#[derive(Debug, Default)]
pub(crate) struct GivenUp(BTreeMap<String, Arc<Held>>);

impl GivenUp {
    /// `held`, the tenure of `key`, was given up.
    pub(crate) fn insert(&mut self, key: &str, held: &Arc<Held>) {
        self.0.insert(key.to_owned(), Arc::clone(held));
    }

    /// Keeps only the tenures that `leases`, a whole scan of the table,
    /// still shows holding their unfinished lease.
    pub(crate) fn retain_named(&mut self, leases: &[Lease]) {
        let named: BTreeMap<&str, &Lease> = leases.iter().map(|l| (l.key.as_str(), l)).collect();
        self.0.retain(|key, held| {
            named
                .get(key.as_str())
                .is_some_and(|l| held.holder().owns(l) && !l.is_finished())
        });
    }

    /// Forgets `key`'s tenure `held`: reclaimed, or the table moved on from
    /// it. Not another tenure given up since in its place (a reclaim whose
    /// answer came after its validity, fenced at once).
    pub(crate) fn remove(&mut self, key: &str, held: &Arc<Held>) {
        if self.0.get(key).is_some_and(|h| Arc::ptr_eq(h, held)) {
            self.0.remove(key);
        }
    }

    /// Every given-up tenure, with its key.
    pub(crate) fn entries(&self) -> Vec<(String, Arc<Held>)> {
        self.0
            .iter()
            .map(|(k, h)| (k.clone(), Arc::clone(h)))
            .collect()
    }
}
