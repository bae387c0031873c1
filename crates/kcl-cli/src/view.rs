//! The lease table as people and scripts read it: one row per lease with a
//! state, a summary per worker, a terminal table and a JSON document.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use kcl::core::Lease;
use kcl::core::store::Beat;
use serde::{Deserialize, Serialize};

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// Owned; as far as this observer can tell, renewed.
    Active,
    /// Owned, but its counter has not moved for a lease duration as seen
    /// by this observer: any worker may take it over.
    Expired,
    /// A graceful handoff runs: `owner` waits for `handoff_from` to
    /// checkpoint and let go.
    Handoff,
    /// Nobody owns it; the next lease-taker tick of any worker takes it.
    Unowned,
    /// The shard was read to its end (checkpoint SHARD_END).
    Completed,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Expired => "expired",
            State::Handoff => "handoff",
            State::Unowned => "unowned",
            State::Completed => "completed",
        }
    }

    /// The state of `lease`; `expired` says whether its counter stood
    /// still for a lease duration (only a watcher can know).
    pub(crate) fn of(lease: &Lease, expired: bool) -> State {
        if lease.is_finished() {
            State::Completed
        } else if expired && (lease.owner.is_some() || lease.in_handoff()) {
            State::Expired
        } else if lease.in_handoff() {
            State::Handoff
        } else if lease.owner.is_none() {
            State::Unowned
        } else {
            State::Active
        }
    }
}

/// One lease, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Row {
    /// The table's hash key.
    pub(crate) key: String,
    /// The stream name, for multi-stream tables (from the identifier);
    /// left out of the JSON for a single-stream table, whose leases name
    /// no stream.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) stream: Option<String>,
    /// The multi-stream identifier `account:stream:creationEpoch`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) stream_id: Option<String>,
    pub(crate) shard: String,
    pub(crate) owner: Option<String>,
    pub(crate) counter: u64,
    /// The stored checkpoint: a sentinel or a sequence number.
    pub(crate) checkpoint: String,
    pub(crate) sub_sequence: u64,
    pub(crate) pending_checkpoint: Option<String>,
    pub(crate) parents: Vec<String>,
    pub(crate) children: Vec<String>,
    /// During a handoff: the previous owner, who may still checkpoint.
    pub(crate) handoff_from: Option<String>,
    pub(crate) owner_switches_since_checkpoint: u64,
    pub(crate) state: State,
    /// How long ago this observer saw the counter move (watch only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) counter_unchanged_secs: Option<u64>,
    /// The holder's liveness, from its liveness record: only where the
    /// table holds one for the instance named by the lease's tenure (the
    /// worker-liveness renewal mode).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) liveness: Option<Liveness>,
}

/// What the liveness record of a lease's holder says, from one read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Liveness {
    /// The instance whose tenure holds the lease.
    pub(crate) instance: String,
    /// How long before the read its record was last written: this host's
    /// clock against the writer's, so clock skew is in it.
    pub(crate) last_beat_ms_ago: u64,
    /// The instance's lease duration, as it recorded it.
    pub(crate) lease_duration_ms: u64,
    /// The last beat is within the lease duration.
    pub(crate) alive: bool,
    /// The instance takes no lease: it shuts down (and will release its
    /// leases), sits out, or cannot read the lease table.
    pub(crate) stopping: bool,
}

impl Liveness {
    /// The liveness of `lease`'s holder, if `beats` (by instance) has a
    /// record for it that says when it was written and for how long it
    /// holds. The record must name the lease's owner, as the workers judge:
    /// a Java KCL worker's take leaves the last kcl tenure behind, and that
    /// instance's record says nothing of the Java owner (a stale one showed
    /// a live Java owner's lease expired, a fresh one a dead owner's held).
    pub(crate) fn of(
        lease: &Lease,
        beats: &HashMap<String, Beat>,
        read_at: SystemTime,
    ) -> Option<Liveness> {
        let instance = lease.tenure_instance()?;
        let beat = beats
            .get(instance)
            .filter(|b| lease.owner.as_deref() == Some(b.worker.as_str()))?;
        let (written, duration) = (beat.written_at?, beat.lease_duration?);
        let ago = read_at.duration_since(written).unwrap_or_default();
        Some(Liveness {
            instance: instance.to_owned(),
            last_beat_ms_ago: ago.as_millis() as u64,
            lease_duration_ms: duration.as_millis() as u64,
            alive: ago < duration,
            stopping: beat.stopping,
        })
    }
}

impl Row {
    pub(crate) fn new(lease: &Lease, state: State, unchanged: Option<Duration>) -> Row {
        Row {
            key: lease.key.clone(),
            stream: lease.stream.as_deref().map(stream_name),
            stream_id: lease.stream.clone(),
            shard: lease.shard_id.clone(),
            owner: lease.owner.clone(),
            counter: lease.counter,
            checkpoint: lease.checkpoint.as_str().to_owned(),
            sub_sequence: lease.checkpoint.sub_sequence(),
            pending_checkpoint: lease.pending_checkpoint.as_ref().map(ToString::to_string),
            parents: lease.parent_shard_ids.iter().cloned().collect(),
            children: lease.child_shard_ids.iter().cloned().collect(),
            handoff_from: lease.checkpoint_owner.clone(),
            owner_switches_since_checkpoint: lease.owner_switches_since_checkpoint,
            state,
            counter_unchanged_secs: unchanged.map(|d| d.as_secs()),
            liveness: None,
        }
    }

    /// The row with its holder's liveness. Where a record judges the
    /// lease, it decides as the holder's peers do: a holder whose record is
    /// older than its lease duration has an expired lease, and one that
    /// beats holds it, however long the lease item's counter stood still
    /// (in the liveness mode nothing renews the item itself).
    pub(crate) fn with_liveness(mut self, liveness: Option<Liveness>) -> Row {
        if let Some(l) = &liveness
            && matches!(self.state, State::Active | State::Handoff | State::Expired)
        {
            self.state = match (l.alive, self.handoff_from.is_some()) {
                (false, _) => State::Expired,
                (true, true) => State::Handoff,
                (true, false) => State::Active,
            };
        }
        self.liveness = liveness;
        self
    }

    fn checkpoint_text(&self, wide: bool) -> String {
        if self.checkpoint.bytes().all(|b| b.is_ascii_digit()) {
            let seq = if wide {
                self.checkpoint.clone()
            } else {
                abbreviate(&self.checkpoint)
            };
            format!("{seq}/{}", self.sub_sequence)
        } else {
            self.checkpoint.clone()
        }
    }

    /// This lease's cells in the terminal table (with the watch and
    /// liveness columns when `watch` and `beats` say the table has them).
    fn cells(&self, wide: bool, watch: bool, beats: bool) -> Vec<String> {
        let r = self;
        let mut state = r.state.as_str().to_owned();
        if let Some(from) = &r.handoff_from {
            let _ = write!(state, " (from {from})");
        }
        let mut row = vec![
            r.stream.clone().unwrap_or_else(|| "-".into()),
            r.shard.clone(),
            r.owner.clone().unwrap_or_else(|| "-".into()),
            r.counter.to_string(),
            r.checkpoint_text(wide),
            if r.parents.is_empty() {
                "-".into()
            } else {
                r.parents.join(",")
            },
            state,
        ];
        if watch {
            row.push(match r.counter_unchanged_secs {
                Some(s) => format!("{s}s ago"),
                None => "-".into(),
            });
        }
        if beats {
            row.push(match &r.liveness {
                Some(l) => format!(
                    "{:.1}s ago{}",
                    l.last_beat_ms_ago as f64 / 1000.0,
                    if l.stopping { ", takes no lease" } else { "" }
                ),
                None => "-".into(),
            });
        }
        row
    }
}

/// `account:stream:creationEpoch` -> `stream` (a stream name has no ':').
pub(crate) fn stream_name(identifier: &str) -> String {
    let parts: Vec<&str> = identifier.split(':').collect();
    match parts.as_slice() {
        [_, name, _] => (*name).to_owned(),
        _ => identifier.to_owned(),
    }
}

/// Sequence numbers are 56 digits: keep both ends, which is what differs
/// between neighbours and across shards.
fn abbreviate(seq: &str) -> String {
    if seq.len() <= 16 {
        seq.to_owned()
    } else {
        format!("{}…{}", &seq[..6], &seq[seq.len() - 6..])
    }
}

/// What one worker holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WorkerSummary {
    pub(crate) worker: String,
    /// Leases it owns (completed ones excluded), handoffs to it included.
    pub(crate) leases: usize,
    /// Of those, leases it is waiting to be handed.
    pub(crate) handoffs_in: usize,
    /// Leases it is handing to another worker.
    pub(crate) handoffs_out: usize,
    /// Leases it owns that look expired to this observer.
    pub(crate) expired: usize,
}

/// Counts by state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Totals {
    pub(crate) leases: usize,
    pub(crate) active: usize,
    pub(crate) expired: usize,
    pub(crate) handoff: usize,
    pub(crate) unowned: usize,
    pub(crate) completed: usize,
}

/// The whole listing: `kcl leases --json` prints exactly this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Listing {
    pub(crate) table: String,
    /// When the scan behind this listing was asked (RFC 3339, UTC): what a
    /// lease shows was true at or after this moment.
    pub(crate) read_at: String,
    pub(crate) leases: Vec<Row>,
    pub(crate) workers: Vec<WorkerSummary>,
    pub(crate) totals: Totals,
}

impl Listing {
    /// Sorts the rows (stream, then shard) and sums them up.
    pub(crate) fn new(
        table: &str,
        read_at: std::time::SystemTime,
        mut leases: Vec<Row>,
    ) -> Listing {
        leases.sort_by(|a, b| (&a.stream, &a.shard, &a.key).cmp(&(&b.stream, &b.shard, &b.key)));
        let mut workers: BTreeMap<String, WorkerSummary> = BTreeMap::new();
        let mut totals = Totals {
            leases: leases.len(),
            ..Totals::default()
        };
        for row in &leases {
            match row.state {
                State::Active => totals.active += 1,
                State::Expired => totals.expired += 1,
                State::Handoff => totals.handoff += 1,
                State::Unowned => totals.unowned += 1,
                State::Completed => totals.completed += 1,
            }
            if row.state == State::Completed {
                continue;
            }
            if let Some(owner) = &row.owner {
                let s = summary(&mut workers, owner);
                s.leases += 1;
                s.handoffs_in += usize::from(row.handoff_from.is_some());
                s.expired += usize::from(row.state == State::Expired);
            }
            if let Some(from) = &row.handoff_from {
                summary(&mut workers, from).handoffs_out += 1;
            }
        }
        Listing {
            table: table.to_owned(),
            read_at: aws_smithy_types::DateTime::from(read_at)
                .fmt(aws_smithy_types::date_time::Format::DateTime)
                .unwrap_or_default(),
            leases,
            workers: workers.into_values().collect(),
            totals,
        }
    }

    /// The terminal table, then the per-worker summary.
    pub(crate) fn render(&self, wide: bool) -> String {
        let mut out = String::new();
        if self.leases.is_empty() {
            let _ = writeln!(
                out,
                "table {} has no leases (workers create them at their first shard sync)",
                self.table
            );
        } else {
            out.push_str(&columns(&self.lease_rows(wide)));
        }
        let t = &self.totals;
        let _ = writeln!(
            out,
            "\n{} leases: {} active, {} expired, {} in handoff, {} unowned, {} completed",
            t.leases, t.active, t.expired, t.handoff, t.unowned, t.completed
        );
        if !self.workers.is_empty() {
            out.push('\n');
            out.push_str(&columns(&self.worker_rows()));
        }
        out
    }

    /// The lease table's cells, header first: the watch and liveness
    /// columns only when some row has them.
    fn lease_rows(&self, wide: bool) -> Vec<Vec<String>> {
        let watch = self
            .leases
            .iter()
            .any(|r| r.counter_unchanged_secs.is_some());
        let mut header = vec![
            "STREAM",
            "SHARD",
            "OWNER",
            "COUNTER",
            "CHECKPOINT",
            "PARENTS",
            "STATE",
        ];
        if watch {
            header.push("COUNTER MOVED");
        }
        let beats = self.leases.iter().any(|r| r.liveness.is_some());
        if beats {
            header.push("LAST BEAT");
        }
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
        for r in &self.leases {
            rows.push(r.cells(wide, watch, beats));
        }
        rows
    }

    /// The per-worker summary's cells, header first.
    fn worker_rows(&self) -> Vec<Vec<String>> {
        let mut rows = vec![vec![
            "WORKER".to_owned(),
            "LEASES".to_owned(),
            "HANDOFFS IN".to_owned(),
            "HANDOFFS OUT".to_owned(),
            "EXPIRED".to_owned(),
        ]];
        for w in &self.workers {
            rows.push(vec![
                w.worker.clone(),
                w.leases.to_string(),
                w.handoffs_in.to_string(),
                w.handoffs_out.to_string(),
                w.expired.to_string(),
            ]);
        }
        rows
    }
}

fn summary<'a>(
    workers: &'a mut BTreeMap<String, WorkerSummary>,
    worker: &str,
) -> &'a mut WorkerSummary {
    workers
        .entry(worker.to_owned())
        .or_insert_with(|| WorkerSummary {
            worker: worker.to_owned(),
            ..WorkerSummary::default()
        })
}

/// Left-aligned columns two spaces apart.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use kcl::Checkpoint;

    use super::*;

    fn lease(shard: &str, owner: Option<&str>, checkpoint: Checkpoint) -> Lease {
        let mut l = Lease::new(shard, checkpoint);
        l.owner = owner.map(str::to_owned);
        l.counter = 7;
        l
    }

    fn sample() -> Vec<Lease> {
        let mut handoff = lease("shardId-3", Some("w2"), Checkpoint::at("123", 0));
        handoff.checkpoint_owner = Some("w1".into());
        let child = lease("shardId-4", None, Checkpoint::TrimHorizon).with_parents(["shardId-0"]);
        vec![
            lease(
                "shardId-1",
                Some("w1"),
                Checkpoint::at(
                    "49590338271490256608559692538361571095921575989136588898",
                    2,
                ),
            ),
            lease("shardId-0", Some("w1"), Checkpoint::ShardEnd),
            lease("shardId-2", None, Checkpoint::Latest),
            handoff,
            child,
        ]
    }

    #[test]
    fn one_read_of_the_liveness_records_judges_the_leases_they_cover() {
        let read_at = std::time::UNIX_EPOCH + Duration::from_secs(1_764_600_000);
        let beat = |instance: &str, ago: u64, stopping: bool| Beat {
            instance: instance.into(),
            worker: "w".into(),
            lease_duration: Some(Duration::from_secs(10)),
            written_at: Some(read_at - Duration::from_secs(ago)),
            stopping,
            ..Beat::default()
        };
        let beats: HashMap<String, Beat> = [
            beat("fresh", 2, false),
            beat("stale", 12, false),
            beat("leaving", 1, true),
            Beat {
                lease_duration: None,
                ..beat("old-writer", 1, false)
            },
        ]
        .into_iter()
        .map(|b| (b.instance.clone(), b))
        .collect();
        let held_by = |tenure: Option<&str>| {
            let mut l = lease("shardId-0", Some("w"), Checkpoint::TrimHorizon);
            l.tenure = tenure.map(str::to_owned);
            l
        };
        let judged = |tenure: Option<&str>| {
            let l = held_by(tenure);
            Row::new(&l, State::of(&l, false), None)
                .with_liveness(Liveness::of(&l, &beats, read_at))
        };
        let fresh = judged(Some("fresh.4"));
        assert_eq!(fresh.state, State::Active);
        assert_eq!(
            fresh.liveness,
            Some(Liveness {
                instance: "fresh".into(),
                last_beat_ms_ago: 2000,
                lease_duration_ms: 10_000,
                alive: true,
                stopping: false,
            })
        );
        let stale = judged(Some("stale.1"));
        assert_eq!(
            stale.state,
            State::Expired,
            "a record older than its lease duration"
        );
        assert!(!stale.liveness.unwrap().alive);
        assert!(judged(Some("leaving.2")).liveness.unwrap().stopping);
        // A counter that stood still (as `watch` sees an idle lease in the
        // liveness mode, where nothing renews the item) does not expire a
        // lease whose holder beats.
        let idle = held_by(Some("fresh.4"));
        let watched = Row::new(&idle, State::of(&idle, true), Some(Duration::from_secs(30)))
            .with_liveness(Liveness::of(&idle, &beats, read_at));
        assert_eq!(watched.state, State::Active);
        let mut handing = held_by(Some("fresh.4"));
        handing.checkpoint_owner = Some("w0".into());
        let watched = Row::new(&handing, State::of(&handing, true), None)
            .with_liveness(Liveness::of(&handing, &beats, read_at));
        assert_eq!(watched.state, State::Handoff);
        // A Java KCL owner's take leaves the last kcl tenure behind: the
        // record of that instance names another worker and says nothing.
        let mut taken = held_by(Some("stale.1"));
        taken.owner = Some("java-1".into());
        assert_eq!(Liveness::of(&taken, &beats, read_at), None);
        // Nothing to judge by: no tenure, no record for the instance, or a
        // record that does not say its lease duration.
        for tenure in [None, Some("unknown.1"), Some("old-writer.1")] {
            let row = judged(tenure);
            assert_eq!(
                (row.state, row.liveness),
                (State::Active, None),
                "{tenure:?}"
            );
        }
    }

    #[test]
    fn states() {
        let leases = sample();
        let states: Vec<State> = leases.iter().map(|l| State::of(l, false)).collect();
        assert_eq!(
            states,
            [
                State::Active,
                State::Completed,
                State::Unowned,
                State::Handoff,
                State::Unowned
            ]
        );
        assert_eq!(State::of(&leases[0], true), State::Expired);
        // Nobody to expire; nothing to expire once completed.
        assert_eq!(State::of(&leases[2], true), State::Unowned);
        assert_eq!(State::of(&leases[1], true), State::Completed);
    }

    fn listing() -> Listing {
        let rows = sample()
            .iter()
            .map(|l| Row::new(l, State::of(l, false), None))
            .collect();
        Listing::new(
            "orders",
            std::time::UNIX_EPOCH + Duration::from_secs(1_764_600_000),
            rows,
        )
    }

    #[test]
    fn summary_per_worker() {
        let l = listing();
        let shards: Vec<&str> = l.leases.iter().map(|r| r.shard.as_str()).collect();
        assert_eq!(
            shards,
            [
                "shardId-0",
                "shardId-1",
                "shardId-2",
                "shardId-3",
                "shardId-4"
            ]
        );
        assert_eq!(
            l.totals,
            Totals {
                leases: 5,
                active: 1,
                expired: 0,
                handoff: 1,
                unowned: 2,
                completed: 1
            }
        );
        let w: Vec<(&str, usize, usize, usize)> = l
            .workers
            .iter()
            .map(|w| (w.worker.as_str(), w.leases, w.handoffs_in, w.handoffs_out))
            .collect();
        assert_eq!(w, [("w1", 1, 0, 1), ("w2", 1, 1, 0)]);
    }

    #[test]
    fn json_round_trips() {
        let l = listing();
        let text = serde_json::to_string(&l).unwrap_or_default();
        let back: Listing = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(back, l);
        assert!(text.contains(r#""state":"handoff""#), "{text}");
        assert!(
            text.contains(r#""read_at":"2025-12-01T14:40:00Z""#),
            "{text}"
        );
    }

    #[test]
    fn table_text() {
        let text = listing().render(false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "STREAM  SHARD      OWNER  COUNTER  CHECKPOINT       PARENTS    STATE"
        );
        assert_eq!(
            lines[2],
            "-       shardId-1  w1     7        495903…588898/2  -          active"
        );
        assert!(text.contains("handoff (from w1)"), "{text}");
        assert!(text.contains("shardId-0  unowned"), "{text}");
        assert!(
            text.contains("5 leases: 1 active, 0 expired, 1 in handoff, 2 unowned, 1 completed"),
            "{text}"
        );
        assert!(
            listing()
                .render(true)
                .contains("49590338271490256608559692538361571095921575989136588898/2")
        );
    }

    #[test]
    fn multi_stream_names() {
        assert_eq!(stream_name("123456789012:orders:1700000000"), "orders");
        assert_eq!(stream_name("odd"), "odd");
    }
}
