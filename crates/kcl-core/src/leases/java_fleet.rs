//! Java KCL 3.x workers sharing the lease table (the Java-compatible
//! renewal mode only): who is alive, from their `WorkerMetricStats`
//! reports. A Java 3.x worker takes no lease itself (its leader assigns
//! them, and only to workers that report), so the balance counts the ones
//! alive and the most loaded kcl worker hands them their share.
//!
//! A report's `lut` is the Java worker's own wall clock, so it is judged
//! like a lease counter, by whether it moves on this worker's monotonic
//! clock: alive while it moved within [`REPORT_GAP`]. At first sight,
//! before it could move, a report within [`REPORT_GAP`] of this host's
//! wall clock counts as alive (a hint: a wrong one costs a gift the dead
//! worker never takes up, which expires back).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::JavaWorker;

/// How often the reports are read: a Java worker reports every 30 s.
pub(crate) const READ_EVERY: Duration = Duration::from_secs(30);
/// A worker whose report has not moved for this long is gone (two and a
/// half report intervals; the Java leader itself allows two).
pub(crate) const REPORT_GAP: Duration = Duration::from_secs(75);

#[derive(Debug)]
struct Seen {
    last_update: u64,
    since: Instant,
    /// Moved while watched, or fresh by the wall clock at first sight.
    credible: bool,
}

/// What this worker knows of the Java workers' reports.
#[derive(Debug, Default)]
pub(crate) struct JavaFleet {
    seen: HashMap<String, Seen>,
    read_at: Option<Instant>,
    /// Workers whose leases expired here, with the report they had then:
    /// gone, whatever that report's age says, until it moves again.
    departed: HashMap<String, u64>,
}

impl JavaFleet {
    /// True when the reports should be read again.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.read_at
            .is_none_or(|at| now.saturating_duration_since(at) >= READ_EVERY)
    }

    /// A read that failed at `now`: the next comes a period later (a table
    /// this worker may not read must not cost a scan every tick).
    pub(crate) fn failed(&mut self, now: Instant) {
        self.read_at = Some(now);
    }

    /// Records one read of every report, made at `now` when this host's
    /// wall clock read `wall_secs`.
    pub(crate) fn observe(&mut self, workers: Vec<JavaWorker>, now: Instant, wall_secs: u64) {
        let mut next = HashMap::with_capacity(workers.len());
        for w in workers {
            let seen = match self.seen.remove(&w.id) {
                Some(s) if s.last_update == w.last_update_secs => s,
                Some(_) => Seen {
                    last_update: w.last_update_secs,
                    since: now,
                    credible: true,
                },
                None => Seen {
                    last_update: w.last_update_secs,
                    since: now,
                    credible: wall_secs.abs_diff(w.last_update_secs) < REPORT_GAP.as_secs(),
                },
            };
            if self
                .departed
                .get(&w.id)
                .is_some_and(|lut| *lut != w.last_update_secs)
            {
                self.departed.remove(&w.id);
            }
            next.insert(w.id, seen);
        }
        // A departed worker whose report is gone from the table cannot
        // count again: Java worker ids change with every process, so its
        // entry would stay for good.
        self.departed.retain(|id, _| next.contains_key(id));
        self.seen = next;
        self.read_at = Some(now);
    }

    /// A lease of `worker` expired and was taken here: it is not
    /// processing, so it counts as gone (is neither counted nor given
    /// anything) until its report moves again. Its last reports stay
    /// fresh for a while after it stopped (nothing deletes them): without
    /// this, a fleet took a departed Java worker's expired leases and
    /// handed some back to it at once, to stand unread.
    pub(crate) fn departed(&mut self, worker: &str) {
        if let Some(s) = self.seen.get(worker) {
            self.departed.insert(worker.to_owned(), s.last_update);
        }
    }

    /// The Java workers alive at `now`, by id.
    pub(crate) fn alive(&self, now: Instant) -> Vec<String> {
        let mut ids: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, s)| s.credible && now.saturating_duration_since(s.since) < REPORT_GAP)
            .filter(|(id, s)| self.departed.get(*id) != Some(&s.last_update))
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: &str, lut: u64) -> JavaWorker {
        JavaWorker {
            id: id.into(),
            last_update_secs: lut,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_java_worker_is_alive_while_its_report_moves() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut f = JavaFleet::default();
        assert!(f.due(t0));
        // Fresh by the wall clock at first sight; a stale one is not.
        f.observe(vec![report("fresh", 1000), report("stale", 100)], t0, 1010);
        assert_eq!(f.alive(t0), vec!["fresh".to_owned()]);
        assert!(!f.due(t0 + s(29)) && f.due(t0 + s(30)));
        // Its report moves: alive for another gap from then.
        f.observe(
            vec![report("fresh", 1030), report("stale", 100)],
            t0 + s(30),
            0,
        );
        assert_eq!(f.alive(t0 + s(104)), vec!["fresh".to_owned()]);
        assert!(f.alive(t0 + s(105)).is_empty());
        // A stale report that starts moving is a live worker after all.
        f.observe(vec![report("stale", 160)], t0 + s(60), 0);
        assert_eq!(f.alive(t0 + s(61)), vec!["stale".to_owned()]);
    }

    /// A Java worker whose lease expired here is gone although its last
    /// report is still fresh: nothing is given back to it. It counts
    /// again once it reports anew (it was only slow).
    #[tokio::test(start_paused = true)]
    async fn a_java_worker_whose_lease_expired_is_gone_until_it_reports_again() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut f = JavaFleet::default();
        f.observe(vec![report("j", 1000)], t0, 1000);
        f.observe(vec![report("j", 1030)], t0 + s(30), 0);
        assert_eq!(f.alive(t0 + s(31)), vec!["j".to_owned()]);
        f.departed("j");
        assert!(
            f.alive(t0 + s(31)).is_empty(),
            "its report is fresh, but it left"
        );
        f.observe(vec![report("j", 1030)], t0 + s(60), 0);
        assert!(
            f.alive(t0 + s(61)).is_empty(),
            "the same report: still gone"
        );
        f.observe(vec![report("j", 1090)], t0 + s(90), 0);
        assert_eq!(
            f.alive(t0 + s(91)),
            vec!["j".to_owned()],
            "it reports again"
        );
    }

    /// Java worker ids change with every process: one that departed and
    /// whose report is gone from the table is forgotten, not kept for the
    /// life of this worker.
    #[tokio::test(start_paused = true)]
    async fn a_departed_java_worker_whose_report_is_gone_is_forgotten() {
        let t0 = Instant::now();
        let mut f = JavaFleet::default();
        f.observe(vec![report("j-1", 1000), report("j-2", 1000)], t0, 1000);
        f.departed("j-1");
        f.departed("j-2");
        f.observe(vec![report("j-2", 1000)], t0 + READ_EVERY, 0);
        let departed: Vec<&String> = f.departed.keys().collect();
        assert_eq!(departed, ["j-2"]);
    }
}
