//! Tenure ids: one fresh id per take, so that every write of a holder can
//! be made conditional on the tenure it holds the lease under (invariant
//! 10).
//!
//! An id is `<instance>.<n>`: a random 64-bit instance id drawn once per
//! coordinator (so once per process, in practice; from the config's seed
//! when one is set) and a sequence number.
//! The instance part lets this process recognise tenures it wrote itself
//! (a take whose response was lost) without remembering each one, and tell
//! them from the tenures of another process running under the same worker
//! id.

use std::sync::atomic::{AtomicU64, Ordering};

/// Makes this coordinator's tenure ids.
#[derive(Debug)]
pub(crate) struct Tenures {
    prefix: String,
    next: AtomicU64,
}

impl Tenures {
    /// Ids under a fresh random instance id.
    pub(crate) fn new() -> Self {
        Self::with_instance(rand::random::<u64>())
    }

    /// Ids under an instance id drawn from `seed` and the worker id: a
    /// seeded simulation replays exactly (the instance orders liveness
    /// records and elects the sync leader). Two processes of one worker
    /// id need different seeds, or each takes the other's tenures for its
    /// own.
    pub(crate) fn seeded(seed: u64, worker_id: &str) -> Self {
        Self::with_instance(crate::backoff::mix_seed(seed, worker_id))
    }

    fn with_instance(instance: u64) -> Self {
        Tenures {
            prefix: format!("{instance:016x}."),
            next: AtomicU64::new(1),
        }
    }

    /// A tenure id never used before.
    pub(crate) fn fresh(&self) -> String {
        format!(
            "{}{:x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// True if `tenure` was made here.
    pub(crate) fn is_ours(&self, tenure: &str) -> bool {
        tenure.starts_with(&self.prefix)
    }

    /// This coordinator's instance id: the key of its liveness record and
    /// the prefix of its tenures.
    pub(crate) fn instance(&self) -> &str {
        &self.prefix[..self.prefix.len() - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::instance_of;

    #[test]
    fn ids_are_fresh_and_recognised_only_by_their_maker() {
        let (mine, theirs) = (Tenures::new(), Tenures::new());
        let (a, b) = (mine.fresh(), mine.fresh());
        assert_ne!(a, b);
        assert!(mine.is_ours(&a) && mine.is_ours(&b));
        assert!(!theirs.is_ours(&a));
        assert!(!mine.is_ours(&theirs.fresh()));
        assert!(!mine.is_ours(""));
        assert_eq!(instance_of(&a), mine.instance());
        assert_ne!(instance_of(&a), theirs.instance());
    }

    #[test]
    fn a_seeded_instance_is_the_same_in_every_process_and_differs_by_worker() {
        let a = Tenures::seeded(5, "w0");
        assert_eq!(a.instance(), Tenures::seeded(5, "w0").instance());
        assert_ne!(a.instance(), Tenures::seeded(5, "w1").instance());
        assert_ne!(a.instance(), Tenures::seeded(6, "w0").instance());
        // Seed and worker id do not cancel out.
        let b = Tenures::seeded(2, "b");
        assert_ne!(Tenures::seeded(1, "a").instance(), b.instance());
    }
}
