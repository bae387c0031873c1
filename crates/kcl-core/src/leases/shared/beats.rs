//! What this instance knows of its own beats, and the bound they put on
//! the validity of what it holds: peers that see its liveness record judge
//! its leases by that record alone, so no tenure may outlive the last beat
//! peers may have seen land.

use tokio::time::Instant;

use super::Shared;
use crate::config::LeaseConfig;

impl Shared {
    /// The time a write sent at `sent` may count validity from. Every kcl
    /// instance beats its liveness record, and peers that know it judge its
    /// leases by its beats alone (the lease duration its record states),
    /// whatever the lease items show, so no tenure may outlive the last
    /// beat that landed: validity counts from the earlier of the two (and
    /// with no beat landed yet, from so long ago that it is over).
    pub(crate) fn valid_from(&self, sent: Instant) -> Instant {
        let beat = *self.last_beat.lock().unwrap_or_else(|e| e.into_inner());
        // Renewing per lease with no beat known to have landed (no workers
        // table, or it cannot be written): no record of this instance
        // exists, so peers judge its leases by their counters, and its
        // writes alone give validity, as before every kcl worker beat;
        // unless a beat may have landed unanswered.
        if beat.is_none() && !self.liveness_mode() {
            return self.unsure_beat().map_or(sent, |b| b.min(sent));
        }
        valid_from(beat, sent, self.config.lease_duration)
    }

    /// True if a tenure taken now would be valid for a while: while the
    /// last beat that landed is less than the usable part of a lease
    /// duration old.
    pub(crate) fn can_hold(&self, now: Instant) -> bool {
        let beat = *self.last_beat.lock().unwrap_or_else(|e| e.into_inner());
        if beat.is_none() && !self.liveness_mode() {
            return self
                .unsure_beat()
                .is_none_or(|b| can_hold(Some(b), now, &self.config));
        }
        can_hold(beat, now, &self.config)
    }

    /// Records a beat sent at `sent` that landed.
    pub(crate) fn beat_landed(&self, sent: Instant) {
        let mut last = self.last_beat.lock().unwrap_or_else(|e| e.into_inner());
        *last = Some(last.map_or(sent, |l| l.max(sent)));
    }

    /// A beat round whose first attempt goes out at `sent`. Until a beat is
    /// known to have landed, the first that may have (its answer lost, or
    /// not in yet) bounds validity as a landed one would: peers that saw
    /// the record it wrote judge this instance by it, even while this
    /// instance renews per lease. (A worker whose first beat landed
    /// unanswered and whose beats then failed counted its tenures from its
    /// per-lease renewals alone, past the moment peers judged it gone.)
    pub(crate) fn beat_sending(&self, sent: Instant) {
        let landed = self.last_beat.lock().unwrap_or_else(|e| e.into_inner());
        let mut unsure = self.unsure_beat.lock().unwrap_or_else(|e| e.into_inner());
        if landed.is_none() && unsure.is_none() {
            *unsure = Some(sent);
        }
    }

    /// The beat round sent at `sent` failed, each of its attempts refused
    /// (throttled, or no workers table): it wrote nothing, and bounds
    /// nothing.
    pub(crate) fn beat_refused(&self, sent: Instant) {
        let mut unsure = self.unsure_beat.lock().unwrap_or_else(|e| e.into_inner());
        if *unsure == Some(sent) {
            *unsure = None;
        }
    }

    fn unsure_beat(&self) -> Option<Instant> {
        *self.unsure_beat.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The time a write sent at `sent` may count validity from (see
/// [`Shared::valid_from`]), given the send time of the last beat that
/// landed (`None`: none has). The model checker runs the same rule.
pub(crate) fn valid_from(
    last_beat: Option<Instant>,
    sent: Instant,
    lease_duration: std::time::Duration,
) -> Instant {
    match last_beat {
        Some(beat) => beat.min(sent),
        None => sent.checked_sub(lease_duration).unwrap_or(sent),
    }
}

/// See [`Shared::can_hold`]; the model checker runs the same rule.
pub(crate) fn can_hold(last_beat: Option<Instant>, now: Instant, config: &LeaseConfig) -> bool {
    valid_from(last_beat, now, config.lease_duration) + config.lease_duration - config.fence_margin
        > now
}
