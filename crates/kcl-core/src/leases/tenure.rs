//! Tenure ids: one fresh id per take, so that every write of a holder can
//! be made conditional on the tenure it holds the lease under (invariant
//! 10).
//!
//! An id is `<instance>.<n>`: a random 64-bit instance id drawn once per
//! coordinator (so once per process, in practice) and a sequence number.
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
        Tenures {
            prefix: format!("{:016x}.", rand::random::<u64>()),
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
}
