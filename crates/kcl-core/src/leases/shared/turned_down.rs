//! What the taker's last scan judged of the held leases this worker's
//! filter turns down: the sync leader deletes a removed stream's lease that
//! a gone holder left behind (`worker::streams`).

use tokio::time::Instant;

use super::Shared;
use crate::lease::Lease;

/// What the taker's last scan judged of a held lease this worker's filter
/// turns down (see [`Shared::judged`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HolderJudged {
    /// Its holder is gone, and the lease was not written since.
    Gone,
    /// Its holder (this worker, or one the scan judged alive) may still
    /// hold it, or the lease moved since the scan.
    Holding,
    /// The taker has not scanned since it turned the lease down.
    NotYet,
}

impl Shared {
    /// What the taker's last scan judged of `lease`, a held lease this
    /// worker's filter turns down. A lease judged gone and not written
    /// since (its counter is the one judged) is one a taker that accepted
    /// it could take, so no live holder overlaps its deletion, which the
    /// counter guards as it would guard the take. One held here is its
    /// consumer's to release (the taker judges only others' leases).
    pub(crate) fn judged(&self, lease: &Lease) -> HolderJudged {
        if self.is_held(&lease.key) {
            return HolderJudged::Holding;
        }
        // An ended tenure here whose consumer still runs a call (up to the
        // handoff timeout) holds it too, whatever the scan judged of the
        // holder (this instance, its beats failing, looks gone): deleted,
        // the lease was created again and taken beside that call.
        if !self.still_processing(&lease.key, Instant::now()).is_empty() {
            return HolderJudged::Holding;
        }
        let judged = self.turned_down.lock().unwrap_or_else(|e| e.into_inner());
        match judged.get(&lease.key) {
            None => HolderJudged::NotYet,
            Some(&(counter, true)) if counter == lease.counter => HolderJudged::Gone,
            Some(_) => HolderJudged::Holding,
        }
    }
}
