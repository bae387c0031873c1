//! `kcl leases watch`: the lease list, refreshed in place, with expiry
//! judged the way workers judge it and owner changes as they happen.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, SystemTime};

use aws_smithy_types::date_time::{DateTime, Format};
use clap::Args;
use kcl::core::Lease;
use kcl::core::store::Beat;
use tokio::time::{Instant, MissedTickBehavior};

use crate::table::Table;
use crate::view::{Listing, Liveness, Row, State, stream_name};
use crate::{TableArgs, args, aws};

/// Owner changes kept on screen.
const MOVES_SHOWN: usize = 12;

/// The lease duration of a fleet whose records do not give one: kcl's
/// and the Java KCL's default.
const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(10);

/// The longest lease duration the workers recorded: during a rolling
/// change of the setting, a lease is not expired before every worker
/// would judge it so.
fn recorded_lease_duration(beats: &HashMap<String, Beat>) -> Option<Duration> {
    beats.values().filter_map(|b| b.lease_duration).max()
}

/// Arguments of `kcl leases watch`.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Time between refreshes.
    #[arg(long, default_value = "2s", value_parser = args::duration)]
    interval: Duration,
    /// The workers' lease duration: an owned lease whose counter has not
    /// moved for this long (as seen from here) is shown as expired
    /// (default: the longest one the workers' liveness records give, else
    /// 10s).
    #[arg(long, value_parser = args::duration)]
    lease_duration: Option<Duration>,
    /// Print checkpoints in full instead of abbreviated.
    #[arg(long)]
    wide: bool,
    /// Stop after this many refreshes (default: until Ctrl-C).
    #[arg(long)]
    count: Option<u64>,
}

/// What the watcher last saw of one lease.
#[derive(Debug, Clone)]
struct Seen {
    owner: Option<String>,
    counter: u64,
    /// When the counter was last seen to change, on this process's clock
    /// (invariant 3: never the owner's wall clock).
    changed_at: Instant,
}

/// Remembers leases across refreshes: counter movement for expiry, owners
/// for moves.
#[derive(Debug)]
pub(crate) struct Watcher {
    lease_duration: Duration,
    seen: HashMap<String, Seen>,
    moves: VecDeque<String>,
    refreshes: u64,
}

impl Watcher {
    pub(crate) fn new(lease_duration: Duration) -> Self {
        Watcher {
            lease_duration,
            seen: HashMap::new(),
            moves: VecDeque::new(),
            refreshes: 0,
        }
    }

    /// Takes in one scan made at `now` (`clock` labels the moves), and the
    /// holders' liveness records, read at `wall`.
    pub(crate) fn observe(
        &mut self,
        table: &str,
        leases: &[Lease],
        beats: &HashMap<String, Beat>,
        now: Instant,
        wall: SystemTime,
        clock: &str,
    ) -> Listing {
        let first = self.refreshes == 0;
        self.refreshes += 1;
        let mut rows = Vec::with_capacity(leases.len());
        let mut present = HashMap::with_capacity(leases.len());
        for lease in leases {
            let label = label(lease);
            let seen = match self.seen.remove(&lease.key) {
                None => {
                    if !first {
                        self.record(format!(
                            "{clock}  {label}: new lease{}",
                            lease
                                .owner
                                .as_deref()
                                .map(|o| format!(", owned by {o}"))
                                .unwrap_or_default()
                        ));
                    }
                    Seen {
                        owner: lease.owner.clone(),
                        counter: lease.counter,
                        changed_at: now,
                    }
                }
                Some(mut seen) => {
                    if seen.owner != lease.owner {
                        let how = match (&seen.owner, &lease.owner) {
                            (Some(a), Some(b)) if lease.checkpoint_owner.as_deref() == Some(a) => {
                                format!("{a} -> {b} (handoff started)")
                            }
                            (Some(a), Some(b)) => format!("{a} -> {b}"),
                            (Some(a), None) if lease.is_finished() => {
                                format!("released by {a} (completed)")
                            }
                            (Some(a), None) => format!("released by {a}"),
                            (None, Some(b)) => format!("taken by {b}"),
                            (None, None) => unreachable!("owners differ"),
                        };
                        self.record(format!("{clock}  {label}: {how}"));
                        seen.owner = lease.owner.clone();
                    }
                    if seen.counter != lease.counter {
                        seen.counter = lease.counter;
                        seen.changed_at = now;
                    }
                    seen
                }
            };
            let unchanged = now.saturating_duration_since(seen.changed_at);
            let expired = unchanged >= self.lease_duration;
            rows.push(
                Row::new(lease, State::of(lease, expired), Some(unchanged))
                    .with_liveness(Liveness::of(lease, beats, wall)),
            );
            present.insert(lease.key.clone(), seen);
        }
        let mut gone: Vec<String> = self.seen.keys().cloned().collect();
        gone.sort();
        for key in gone {
            self.record(format!("{clock}  {key}: lease deleted"));
        }
        self.seen = present;
        Listing::new(table, std::time::SystemTime::now(), rows)
    }

    fn record(&mut self, event: String) {
        if self.moves.len() == MOVES_SHOWN {
            self.moves.pop_front();
        }
        self.moves.push_back(event);
    }

    fn moves(&self) -> impl Iterator<Item = &String> {
        self.moves.iter()
    }
}

/// "shardId-000000000001", with the stream for multi-stream leases.
fn label(lease: &Lease) -> String {
    match &lease.stream {
        Some(id) => format!("{}/{}", stream_name(id), lease.shard_id),
        None => lease.shard_id.clone(),
    }
}

/// HH:MM:SS UTC.
fn clock(at: SystemTime) -> String {
    DateTime::from(at)
        .fmt(Format::DateTime)
        .ok()
        .and_then(|t| t.get(11..19).map(str::to_owned))
        .unwrap_or_default()
}

/// `kcl leases watch`.
pub(crate) async fn run(a: WatchArgs) -> anyhow::Result<()> {
    let table = Table::open(&a.table).await?;
    let mut view = View {
        watcher: Watcher::new(a.lease_duration.unwrap_or(DEFAULT_LEASE_DURATION)),
        beats: HashMap::new(),
        last: None,
    };
    let mut ticker = tokio::time::interval(a.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut done = 0u64;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = &mut ctrl_c => break,
        }
        // Ctrl-C also quits during a refresh: a table that answers slowly
        // (each call bounded at 30 s) held the command that long.
        let screen = tokio::select! {
            screen = view.refresh(&table, &a) => screen,
            _ = &mut ctrl_c => break,
        };
        paint(&screen)?;
        done += 1;
        if a.count.is_some_and(|c| done >= c) {
            break;
        }
    }
    Ok(())
}

/// What `watch` keeps between refreshes.
struct View {
    watcher: Watcher,
    beats: HashMap<String, Beat>,
    last: Option<Listing>,
}

impl View {
    /// Reads the table again; the screen to paint.
    async fn refresh(&mut self, table: &Table, a: &WatchArgs) -> String {
        let now_wall = SystemTime::now();
        // The records are read first, so a lease duration they give
        // judges this scan already; a failed read keeps the last ones, and
        // says so: without them a lease renewed through its holder's record
        // (its counter still) shows expired, as if nobody held it.
        let beats_status = match table.beats().await {
            Ok(read) => {
                self.beats = read;
                String::new()
            }
            Err(e) => format!(
                "reading the liveness records failed, judging by the last ones read ({} \
                 records): a lease renewed through a record shows expired while they are \
                 missing: {}\n",
                self.beats.len(),
                aws::explain(&e)
            ),
        };
        let (lease_duration, said_by) =
            match (a.lease_duration, recorded_lease_duration(&self.beats)) {
                (Some(d), _) => (d, "--lease-duration"),
                (None, Some(d)) => (d, "the workers' liveness records"),
                (None, None) => (
                    DEFAULT_LEASE_DURATION,
                    "the default; no liveness record gives one",
                ),
            };
        self.watcher.lease_duration = lease_duration;
        let status = match table.leases().await {
            Ok(leases) => {
                self.last = Some(self.watcher.observe(
                    table.name(),
                    &leases,
                    &self.beats,
                    Instant::now(),
                    now_wall,
                    &clock(now_wall),
                ));
                String::new()
            }
            Err(e) => format!(
                "refresh failed, showing the last view: {}\n",
                aws::explain(&e)
            ),
        };
        let mut screen = format!(
            "kcl leases watch: table {} at {} UTC, every {:?}; expired = counter unchanged for \
             {:?}, the lease duration from {said_by} (Ctrl-C quits)\n{beats_status}{status}\n",
            table.name(),
            clock(now_wall),
            a.interval,
            lease_duration
        );
        if let Some(listing) = &self.last {
            screen.push_str(&listing.render(a.wide));
        }
        screen.push_str("\nOwner changes (UTC):\n");
        let mut any = false;
        for event in self.watcher.moves() {
            let _ = writeln!(screen, "  {event}");
            any = true;
        }
        if !any {
            screen.push_str("  none yet\n");
        }
        screen
    }
}

/// Redraws in place: cursor home, each line cleared to its end, the rest
/// of the screen cleared; no flicker, no scrollback spam.
fn paint(screen: &str) -> std::io::Result<()> {
    let mut out = String::with_capacity(screen.len() + 256);
    out.push_str("\x1b[H");
    for line in screen.lines() {
        out.push_str(line);
        out.push_str("\x1b[K\n");
    }
    out.push_str("\x1b[J");
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes())?;
    stdout.flush()
}

#[cfg(test)]
mod tests {
    use kcl::Checkpoint;

    use super::*;

    fn lease(shard: &str, owner: Option<&str>, counter: u64) -> Lease {
        let mut l = Lease::new(shard, Checkpoint::TrimHorizon);
        l.owner = owner.map(str::to_owned);
        l.counter = counter;
        l
    }

    /// One scan of table "t" with no liveness records.
    fn seen(w: &mut Watcher, leases: &[Lease], at: Instant, clock: &str) -> Listing {
        w.observe("t", leases, &HashMap::new(), at, SystemTime::now(), clock)
    }

    fn states(l: &Listing) -> Vec<State> {
        l.leases.iter().map(|r| r.state).collect()
    }

    #[test]
    fn expiry_is_judged_by_counter_movement_on_our_clock() {
        let t0 = Instant::now();
        let mut w = Watcher::new(Duration::from_secs(10));
        // Each scan: when, the holder and counter of leases a and b, and
        // the states judged.
        let scans = [
            // First sight: the counter's age is unknown, so it starts now.
            (0, ("w1", 5), ("w2", 9), [State::Active, State::Active]),
            // a renews, b does not.
            (6, ("w1", 6), ("w2", 9), [State::Active, State::Active]),
            (10, ("w1", 7), ("w2", 9), [State::Active, State::Expired]),
            // w1 takes b over: a move, and b is active again.
            (12, ("w1", 8), ("w1", 10), [State::Active, State::Active]),
        ];
        let listings: Vec<Listing> = scans
            .into_iter()
            .map(|(secs, a, b, expected)| {
                let leases = [lease("a", Some(a.0), a.1), lease("b", Some(b.0), b.1)];
                let at = t0 + Duration::from_secs(secs);
                let l = seen(&mut w, &leases, at, &format!("00:00:{secs:02}"));
                assert_eq!(states(&l), expected, "at {secs}s");
                l
            })
            .collect();
        let expired = &listings[2];
        assert_eq!(expired.leases[1].counter_unchanged_secs, Some(10));
        assert_eq!(expired.workers[1].expired, 1);
        let moves: Vec<&String> = w.moves().collect();
        assert_eq!(moves, ["00:00:12  b: w2 -> w1"]);
    }

    #[test]
    fn moves_name_what_happened() {
        let t0 = Instant::now();
        let mut w = Watcher::new(Duration::from_secs(10));
        seen(
            &mut w,
            &[lease("a", Some("w1"), 1), lease("b", None, 1)],
            t0,
            "x",
        );
        let mut handoff = lease("a", Some("w2"), 2);
        handoff.checkpoint_owner = Some("w1".into());
        seen(
            &mut w,
            &[handoff, lease("b", Some("w2"), 2), lease("c", None, 0)],
            t0,
            "y",
        );
        seen(&mut w, &[lease("a", None, 4)], t0, "z");
        let moves: Vec<&str> = w.moves().map(String::as_str).collect();
        assert_eq!(
            moves,
            [
                "y  a: w1 -> w2 (handoff started)",
                "y  b: taken by w2",
                "y  c: new lease",
                "z  a: released by w2",
                "z  b: lease deleted",
                "z  c: lease deleted",
            ]
        );
    }
}
