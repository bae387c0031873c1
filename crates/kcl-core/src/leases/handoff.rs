//! What the table says about a lease this worker holds: a pure judgement
//! over (our tenure and phase, the item as last read), tested by a table
//! of cases.
//!
//! Every observation of a held lease goes through [`judge`]: the item a
//! renewal's failed condition returned, the item the handoff poller read,
//! and the lease in the taker's scan. The async code only gathers the
//! observation and applies the verdict, so the graceful handoff's state
//! machine lives here in one place:
//!
//! ```text
//!   victim (Active) --peer starts a handoff--> HandingOff --processor
//!   checkpointed--> complete_handoff (ends HandedOff)
//!
//!   thief (Awaiting) --victim completed--> Activate (renew, consume)
//!                    \--deadline passed---> Force (take, consume)
//! ```
//!
//! The handoff is written and renewed as the Java KCL 3.x does it: the
//! handoff write leaves the counter alone, the previous owner renews the
//! lease until it completes (if it renews per lease), and the thief renews
//! nothing it awaits. The deadline of a previous owner that renews per
//! lease is a lease duration after its counter last moved (it stopped:
//! dead, or its drain passed the handoff timeout); of one with a liveness
//! record, a handoff timeout after it was told.
//!
//! A tenure is ours only while the table shows our worker id *and* our
//! tenure id: the same worker id under another tenure is another process
//! (or a later restart) of this worker, and the lease is lost to it.

use tokio::time::Instant;

use crate::lease::Lease;
use crate::leases::held::Phase;
use crate::store::Holder;

/// What this worker knows about one of its tenures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ours<'a> {
    /// Our worker id and tenure.
    pub(crate) holder: Holder<'a>,
    /// The counter we last wrote or adopted.
    pub(crate) counter: u64,
    /// Where the tenure stands in a handoff.
    pub(crate) phase: &'a Phase,
}

/// What to do about an observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing to do: the lease is ours as we knew it, or the observation
    /// is older than our last write.
    Keep,
    /// Still ours in this tenure, at a later counter (a handoff step, or a
    /// write of ours whose answer was lost): take the table's state without
    /// extending validity.
    Adopt,
    /// A peer started a graceful handoff from us: stop fetching, let the
    /// processor checkpoint, then complete it.
    Drain,
    /// The handoff we await was completed by the previous owner: renew
    /// (fresh validity), then start consuming.
    Activate,
    /// The handoff we await is past its deadline: take the lease, which
    /// ends the previous owner's right to checkpoint.
    Force,
    /// The tenure is over. `same_id` is true when the lease went to another
    /// tenure of this same worker id: another process runs under this id.
    Lost {
        /// Another tenure of our own worker id holds the lease.
        same_id: bool,
    },
}

/// Judges one observation of a held lease (`table`: the item as read,
/// `None` if it no longer exists) at `now`.
pub(crate) fn judge(ours: Ours<'_>, table: Option<&Lease>, now: Instant) -> Verdict {
    let Some(l) = table else {
        return Verdict::Lost { same_id: false };
    };
    // Counters only grow: an item behind our last write was read before
    // it, and says nothing about the lease now.
    if l.counter < ours.counter {
        return Verdict::Keep;
    }
    let me = ours.holder;
    let same_id_elsewhere = l.is_owned_by(me.owner) && !me.owns(l);
    let lost = Verdict::Lost {
        same_id: same_id_elsewhere,
    };
    match ours.phase {
        Phase::Active => {
            if me.owns(l) {
                if l.counter == ours.counter {
                    Verdict::Keep
                } else {
                    Verdict::Adopt
                }
            } else if me.hands_off(l) {
                Verdict::Drain
            } else {
                lost
            }
        }
        // We renew (per lease) while our processor drains; the right to
        // checkpoint ends when the handoff completes or is forced.
        Phase::HandingOff => {
            if me.hands_off(l) {
                Verdict::Keep
            } else {
                lost
            }
        }
        Phase::Awaiting { force_at, .. } => {
            if !me.owns(l) {
                lost
            } else if l.checkpoint_owner.is_none() {
                Verdict::Activate
            } else if now >= *force_at {
                Verdict::Force
            } else if l.counter > ours.counter {
                Verdict::Adopt
            } else {
                Verdict::Keep
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lease::Checkpoint;

    const ME: &str = "me";
    const T: &str = "t-mine";

    /// The item as the table might show it.
    fn item(owner: Option<&str>, tenure: Option<&str>, counter: u64) -> Lease {
        let mut l = Lease::new("s", Checkpoint::TrimHorizon);
        l.owner = owner.map(str::to_owned);
        l.tenure = tenure.map(str::to_owned);
        l.counter = counter;
        l
    }

    fn in_handoff(mut l: Lease, from: &str, from_tenure: Option<&str>) -> Lease {
        l.checkpoint_owner = Some(from.to_owned());
        l.checkpoint_owner_tenure = from_tenure.map(str::to_owned);
        l
    }

    /// (case, our phase, our counter, the table's item, now, verdict)
    type Case<'a> = (&'a str, &'a Phase, u64, Option<Lease>, Instant, Verdict);

    #[test]
    fn verdicts() {
        let t0 = Instant::now();
        let due = t0 + Duration::from_secs(10);
        let awaiting = Phase::Awaiting {
            from: "victim".into(),
            force_at: due,
        };
        let (active, draining) = (Phase::Active, Phase::HandingOff);
        let mine = |c| item(Some(ME), Some(T), c);
        let lost = Verdict::Lost { same_id: false };
        let twin = Verdict::Lost { same_id: true };
        #[rustfmt::skip]
        let cases: Vec<Case<'_>> = vec![
            ("active, unchanged", &active, 5, Some(mine(5)), t0, Verdict::Keep),
            ("active, our lost renewal landed", &active, 5, Some(mine(6)), t0, Verdict::Adopt),
            ("active, a stale read", &active, 5, Some(item(Some("peer"), Some("x"), 4)), t0, Verdict::Keep),
            ("active, taken by a peer", &active, 5, Some(item(Some("peer"), Some("x"), 6)), t0, lost.clone()),
            ("active, released by hand", &active, 5, Some(item(None, None, 6)), t0, lost.clone()),
            ("active, deleted", &active, 5, None, t0, lost.clone()),
            ("active, our id in another tenure", &active, 5, Some(item(Some(ME), Some("t-twin"), 6)), t0, twin.clone()),
            ("active, our id without a tenure", &active, 5, Some(item(Some(ME), None, 6)), t0, twin.clone()),
            ("active, a peer asks for it", &active, 5, Some(in_handoff(item(Some("peer"), Some("x"), 6), ME, Some(T))), t0, Verdict::Drain),
            ("active, a Java leader asks for it", &active, 5, Some(in_handoff(item(Some("peer"), None, 6), ME, None)), t0, Verdict::Drain),
            ("active, a handoff of another tenure of ours", &active, 5, Some(in_handoff(item(Some("peer"), Some("x"), 6), ME, Some("t-old"))), t0, lost.clone()),
            ("draining, still ours to checkpoint", &draining, 6, Some(in_handoff(item(Some("peer"), Some("x"), 7), ME, Some(T))), t0, Verdict::Keep),
            ("draining, forced by the thief", &draining, 6, Some(item(Some("peer"), Some("x"), 8)), t0, lost.clone()),
            ("awaiting, victim still draining", &awaiting, 6, Some(in_handoff(mine(6), "victim", Some("v"))), t0, Verdict::Keep),
            ("awaiting, our lost renewal landed", &awaiting, 6, Some(in_handoff(mine(7), "victim", Some("v"))), t0, Verdict::Adopt),
            ("awaiting, victim completed", &awaiting, 6, Some(mine(7)), t0, Verdict::Activate),
            ("awaiting, past the deadline", &awaiting, 6, Some(in_handoff(mine(6), "victim", Some("v"))), due, Verdict::Force),
            ("awaiting, completed just at the deadline", &awaiting, 6, Some(mine(7)), due, Verdict::Activate),
            ("awaiting, someone took it", &awaiting, 6, Some(item(Some("other"), Some("y"), 7)), t0, lost.clone()),
            ("awaiting, our id in another tenure", &awaiting, 6, Some(item(Some(ME), Some("t-twin"), 7)), t0, twin.clone()),
            ("awaiting, deleted", &awaiting, 6, None, t0, lost.clone()),
        ];
        for (name, phase, counter, table, now, want) in cases {
            let ours = Ours {
                holder: Holder::new(ME, T),
                counter,
                phase,
            };
            assert_eq!(judge(ours, table.as_ref(), now), want, "{name}");
        }
    }
}
