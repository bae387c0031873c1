//! `kcl leases reset`: a lease's checkpoint moved, one shard or all, each
//! write conditional on the lease as read (and read again while an owner
//! renewing per lease moves its counter), a held lease's owner evicted
//! first with `--force`.

use std::collections::HashMap;

use anyhow::bail;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use clap::Args;
use kcl::Checkpoint;
use kcl::core::operator;
use kcl::core::store::{Beat, is_evicted_tenure};
use kcl::core::{Lease, LeaseStore as _};
use kcl_dynamodb::item::{ReadItem, attr, from_item};
use kcl_dynamodb::store::{NULL_TYPE, absent_or_null};

use super::{Table, of_stream, sequence};
use crate::{TableArgs, args, aws};

/// Arguments of `kcl leases reset`.
#[derive(Debug, Args)]
pub(crate) struct ResetArgs {
    #[command(flatten)]
    table: TableArgs,
    /// The shard (shardId-000000000001), or its lease key.
    #[arg(long, required_unless_present = "all", conflicts_with = "all")]
    shard: Option<String>,
    /// Every shard of the application (of `--stream`, if given) that is
    /// not completed; with `--force`, completed ones too. Rewinds a whole
    /// application in one command.
    #[arg(long)]
    all: bool,
    /// The stream, when the table holds several (multi-stream
    /// applications).
    #[arg(long)]
    stream: Option<String>,
    /// The new checkpoint: TRIM_HORIZON, LATEST, AT_TIMESTAMP (the
    /// workers' configured timestamp), or a sequence number with an
    /// optional /sub-sequence (processing resumes after that record).
    #[arg(long, value_parser = args::checkpoint)]
    to: Checkpoint,
    /// Reset even while a worker holds the lease (evicting it), or when
    /// the shard is completed.
    #[arg(long)]
    force: bool,
    /// Print what would change, and write nothing.
    #[arg(long)]
    dry_run: bool,
}

/// `kcl leases reset`: one shard, or every shard with `--all`. Every lease
/// is checked before anything is written, so a refusal writes nothing.
pub(crate) async fn reset(a: ResetArgs) -> anyhow::Result<()> {
    refuse_one_number_for_all(&a)?;
    let table = Table::open(&a.table).await?;
    let leases = leases_to_reset(&table, &a).await?;
    if !a.force {
        refuse_any(&leases)?;
    }
    if let (Checkpoint::Sequence { seq, .. }, [lease]) = (&a.to, leases.as_slice()) {
        sequence::check_in_shard(&table, lease, seq, a.stream.as_deref(), a.force).await?;
    }
    if a.to == Checkpoint::AtTimestamp {
        // The sentinel stores no time: read as the workers' own setting,
        // it quietly meant TRIM_HORIZON to a worker configured otherwise.
        say!(
            "note: AT_TIMESTAMP stores no time: each worker starts at the initial timestamp it \
             is configured with, and one configured with another initial position starts at \
             TRIM_HORIZON"
        );
    }
    if a.dry_run {
        print_dry_run(&table, &leases, &a.to);
        return Ok(());
    }
    // Held by kcl instances with liveness records, a lease is evicted by a
    // handoff to nobody, and the holder told through its record.
    let beats = if a.force {
        table.records_for(&leases).await?
    } else {
        Vec::new()
    };
    let mut failed = Vec::new();
    for lease in &leases {
        if let Err(e) = reset_retrying(&table, lease, &a.to, a.force, &beats).await {
            failed.push(format!("{e:#}"));
        }
    }
    match failed.as_slice() {
        [] => Ok(()),
        [one] if leases.len() == 1 => bail!("{one}"),
        _ => bail!(
            "{} of {} shards were not reset (the others were):\n  {}",
            failed.len(),
            leases.len(),
            failed.join("\n  ")
        ),
    }
}

/// The leases `a` names: its one shard, or every lease of the table (of
/// its stream, when given; finished ones only with `--force`), in stream
/// and shard order. None at all is an error naming the table.
async fn leases_to_reset(table: &Table, a: &ResetArgs) -> anyhow::Result<Vec<Lease>> {
    Ok(match &a.shard {
        Some(shard) => vec![table.find(shard, a.stream.as_deref()).await?],
        None => {
            let leases = table.leases().await?;
            table.check_serves(&leases, a.stream.as_deref()).await?;
            let mut all: Vec<Lease> = leases
                .into_iter()
                .filter(|l| of_stream(l, a.stream.as_deref()))
                .filter(|l| a.force || !l.is_finished())
                .collect();
            all.sort_by(|x, y| (&x.stream, &x.shard_id).cmp(&(&y.stream, &y.shard_id)));
            if all.is_empty() {
                bail!(
                    "no lease to reset in table {}{}",
                    table.name(),
                    a.stream
                        .as_deref()
                        .map(|s| format!(" for stream {s}"))
                        .unwrap_or_default()
                );
            }
            all
        }
    })
}

/// Fails if `a` resets every shard to one sequence number: a number is of
/// one shard's records, and taken for another's, it made each shard's next
/// owner fail its reads (or read the shard from its start again).
fn refuse_one_number_for_all(a: &ResetArgs) -> anyhow::Result<()> {
    if let (true, Checkpoint::Sequence { seq, .. }) = (a.all, &a.to) {
        bail!(
            "refusing to reset every shard to sequence number {seq}: a sequence number is of \
             one shard; reset that shard with --shard, or the others to TRIM_HORIZON, LATEST \
             or AT_TIMESTAMP; nothing was written"
        );
    }
    Ok(())
}

/// Fails, naming every refusal, if any of `leases` may not be reset
/// without `--force`: checked before anything is written.
fn refuse_any(leases: &[Lease]) -> anyhow::Result<()> {
    let refusals: Vec<String> = leases.iter().filter_map(refusal).collect();
    if let [one] = refusals.as_slice() {
        bail!("{one}");
    }
    if !refusals.is_empty() {
        bail!(
            "refusing to reset {} of {} shards, so nothing was written:\n  {}",
            refusals.len(),
            leases.len(),
            refusals.join("\n  ")
        );
    }
    Ok(())
}

/// `--dry-run`: what each reset would change.
fn print_dry_run(table: &Table, leases: &[Lease], to: &Checkpoint) {
    for lease in leases {
        say!(
            "would reset shard {} of table {} to {} (now {}, counter {}){}",
            lease.shard_id,
            table.name(),
            to,
            lease.checkpoint,
            lease.counter,
            evicting(lease)
        );
    }
    say!("dry run: nothing was written");
}

/// Whom a forced reset of `lease` evicts, as the dry run says it: its
/// owner, or during a handoff the previous owner still draining it and the
/// owner taking it over (the reset removes both).
fn evicting(lease: &Lease) -> String {
    match (&lease.checkpoint_owner, &lease.owner) {
        (Some(from), Some(to)) => {
            format!(", evicting {from} (still draining it) and {to} (taking it over)")
        }
        (Some(from), None) => format!(", evicting {from} (still draining it)"),
        (None, Some(owner)) => format!(", evicting {owner}"),
        (None, None) => String::new(),
    }
}

/// Why `lease` may not be reset without `--force`, if it may not.
fn refusal(lease: &Lease) -> Option<String> {
    let shard = &lease.shard_id;
    if let Some(from) = &lease.checkpoint_owner {
        return Some(format!(
            "refusing to reset shard {shard}: a handoff from {from} to {} is in progress \
             (counter {}); its workers would overwrite the checkpoint. Stop the application \
             first, or pass --force to evict both",
            lease.owner.as_deref().unwrap_or("nobody"),
            lease.counter
        ));
    }
    if lease.is_finished() {
        return Some(format!(
            "refusing to reset shard {shard}: it is completed (SHARD_END) and its child \
             shards may already be processed; pass --force to read it again anyway"
        ));
    }
    lease.owner.as_ref().map(|owner| {
        format!(
            "refusing to reset shard {shard}: it is held by {owner} (counter {}), which \
             would overwrite the checkpoint with its next one. Stop the application first, \
             or pass --force to evict the owner (it stops processing the shard before any \
             other worker takes it)",
            lease.counter
        )
    })
}

/// How many times a reset is tried on a lease that changed since it was
/// read.
const RESET_TRIES: u32 = 5;

/// A reset's write found the lease changed since it was read.
#[derive(Debug)]
struct Changed(String);

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Changed {}

/// [`reset_one`], read again and tried again while the lease changed since
/// it was read: a Java KCL owner, or kcl renewing per lease, bumps the
/// counter every few seconds, and a reset of every shard written from one
/// scan lost most of those races (run again, it rewound the shards it had
/// reset a second time). A lease read again is judged again (a refusal
/// without `--force` stands).
async fn reset_retrying(
    table: &Table,
    lease: &Lease,
    to: &Checkpoint,
    force: bool,
    beats: &[Beat],
) -> anyhow::Result<()> {
    let mut lease = lease.clone();
    let mut tries = 1;
    // An eviction that landed on an earlier try is not one a later try
    // sees as its own: the instance to tell is carried over.
    let mut evicted = None;
    loop {
        match reset_one(table, &lease, to, force, beats, &mut evicted).await {
            Err(e) if tries < RESET_TRIES && e.is::<Changed>() => {
                tries += 1;
                lease = match table.store.get(&lease.key).await? {
                    Some(now) => now,
                    None => bail!("shard {} was deleted while resetting", lease.shard_id),
                };
                if let Some(why) = refusal(&lease).filter(|_| !force) {
                    bail!("{why}");
                }
            }
            done => return done,
        }
    }
}

/// Resets one lease, conditional on the counter it was seen at (and, without
/// `force`, on nobody holding it). `evicted`: the instance this reset (on
/// any try) evicted, to tell once the reset lands.
async fn reset_one(
    table: &Table,
    lease: &Lease,
    to: &Checkpoint,
    force: bool,
    beats: &[Beat],
    evicted: &mut Option<String>,
) -> anyhow::Result<()> {
    let shard = &lease.shard_id;
    let now = match evict_first(table, lease, force, beats).await? {
        Some((now, instance)) => {
            *evicted = Some(instance);
            Some(now)
        }
        None => None,
    };
    let lease = now.as_ref().unwrap_or(lease);
    let instance = evicted.as_deref();
    let keep = lease
        .checkpoint_owner
        .as_deref()
        .zip(lease.checkpoint_owner_tenure.as_deref())
        .filter(|(_, t)| force && is_evicted_tenure(t));
    let write = ResetWrite::new(lease, to, force, keep);
    let result = table
        .store
        .client()
        .update_item()
        .table_name(table.name())
        .key(attr::LEASE_KEY, AttributeValue::S(lease.key.clone()))
        .update_expression(format!(
            "SET #cp = :cp, #sub = :sub, #counter = :next, #switches = :zero REMOVE {}",
            write.remove
        ))
        .condition_expression(write.condition)
        .set_expression_attribute_names(Some(write.names))
        .set_expression_attribute_values(Some(write.values))
        .return_values(ReturnValue::AllNew)
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await;
    match result {
        Ok(_) => {
            report_reset(table, lease, to, keep, instance).await;
            Ok(())
        }
        Err(e) => {
            if let Some(UpdateItemError::ConditionalCheckFailedException(failed)) =
                e.as_service_error()
            {
                return Err(Changed(format!(
                    "shard {shard} changed while resetting (it was {}); nothing was written{}: \
                     look again and retry",
                    describe(failed.item()),
                    if instance.is_some() {
                        " but the eviction of its owner"
                    } else {
                        ""
                    }
                ))
                .into());
            }
            Err(aws::sdk_error(
                "DYNAMODB",
                format!("resetting shard {shard}"),
                e,
            ))
        }
    }
}

/// With `force`, evicts the holder before the reset: the lease as the
/// eviction left it, and the instance to tell, if it was evicted.
async fn evict_first(
    table: &Table,
    lease: &Lease,
    force: bool,
    beats: &[Beat],
) -> anyhow::Result<Option<(Lease, String)>> {
    let shard = &lease.shard_id;
    // A holder that renews through its liveness record writes no lease item
    // per round: removed from the lease, it would go on processing until its
    // next checkpoint while a peer took the shard. Evicted first (a handoff
    // to nobody in a tenure it never wrote), it may write nothing more, and
    // no peer takes the lease before it let go or stopped beating; the
    // reset keeps that handoff. An eviction left by an earlier attempt is
    // kept the same way.
    Ok(if force {
        operator::evict(&table.store, lease, beats)
            .await
            .map_err(|e| {
                if e.is_condition_failed() {
                    Changed(format!(
                        "shard {shard} changed while resetting; nothing was written: look again \
                         and retry"
                    ))
                    .into()
                } else {
                    anyhow::Error::new(e).context(format!("evicting the owner of shard {shard}"))
                }
            })?
    } else {
        None
    })
}

/// The reset's UpdateItem expressions, conditional on the counter seen (and
/// on the eviction to keep, or on nobody holding the lease).
struct ResetWrite {
    condition: String,
    remove: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl ResetWrite {
    fn new(lease: &Lease, to: &Checkpoint, force: bool, keep: Option<(&str, &str)>) -> Self {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let n = |v: u64| AttributeValue::N(v.to_string());
        // The counter is bumped like any ownership change: a worker about to
        // take the lease with the counter it scanned loses that race instead
        // of taking it with the old checkpoint in hand. Removing the tenures
        // ends every holder's tenure: an evicted owner's checkpoint still in
        // flight fails its condition instead of overwriting the reset.
        let mut condition = "#counter = :seen".to_owned();
        if !force {
            // A NULL (another tool's None) reads as absent, so it counts as
            // absent here too.
            condition.push_str(&absent_or_null(
                " AND attribute_not_exists(#owner) AND attribute_not_exists(#cpOwner)",
            ));
        }
        let mut remove = "#owner, #pcp, #psub, #pstate, #tenure".to_owned();
        if keep.is_some() {
            condition.push_str(" AND #cpOwner = :cpOwner AND #cpTenure = :cpTenure");
        } else {
            remove.push_str(", #cpOwner, #cpTenure");
        }
        let names = HashMap::from(
            [
                ("#counter", attr::LEASE_COUNTER),
                ("#owner", attr::LEASE_OWNER),
                ("#cpOwner", attr::CHECKPOINT_OWNER),
                ("#cp", attr::CHECKPOINT),
                ("#sub", attr::CHECKPOINT_SUB),
                ("#switches", attr::OWNER_SWITCHES),
                ("#pcp", attr::PENDING_CHECKPOINT),
                ("#psub", attr::PENDING_CHECKPOINT_SUB),
                ("#pstate", attr::PENDING_CHECKPOINT_STATE),
                ("#tenure", attr::TENURE),
                ("#cpTenure", attr::CHECKPOINT_OWNER_TENURE),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        let mut values = HashMap::from(
            [
                (":seen", n(lease.counter)),
                (":next", n(lease.counter + 1)),
                (":cp", s(to.as_str())),
                (":sub", n(to.sub_sequence())),
                (":zero", n(0)),
            ]
            .map(|(k, v)| (k.to_owned(), v)),
        );
        if !force {
            values.insert(NULL_TYPE.to_owned(), s("NULL"));
        }
        if let Some((owner, tenure)) = keep {
            values.insert(":cpOwner".to_owned(), s(owner));
            values.insert(":cpTenure".to_owned(), s(tenure));
        }
        ResetWrite {
            condition,
            remove,
            names,
            values,
        }
    }
}

/// Says what a reset that landed did, and tells an evicted holder with a
/// liveness record to stop (through that record).
async fn report_reset(
    table: &Table,
    lease: &Lease,
    to: &Checkpoint,
    keep: Option<(&str, &str)>,
    instance: Option<&str>,
) {
    say!(
        "reset shard {} of table {} to {} (was {}; counter {} -> {})",
        lease.shard_id,
        table.name(),
        to,
        lease.checkpoint,
        lease.counter,
        lease.counter + 1
    );
    if let (Some((owner, _)), Some(instance)) = (keep, instance) {
        let told = operator::tell(&table.store, instance, &lease.key).await;
        say!(
            "evicted {owner}: it renews through its liveness record, which now asks it \
             to stop{}; it writes nothing more to the shard, and no worker takes the \
             shard before it let go (or stopped beating); a worker then takes it from \
             the new checkpoint",
            if told {
                " (it reads it within a renew interval)"
            } else {
                " (telling it failed: it stops at its next read of the lease table)"
            }
        );
    } else if let Some(owner) = &lease.owner {
        say!(
            "evicted {owner}: it has no liveness record (it renews every lease: a Java \
             KCL worker, or kcl renewing per lease) and stops processing the shard at \
             its next renewal or checkpoint; a worker then takes the shard from the new \
             checkpoint"
        );
    }
}

/// "owned by w2 at counter 9" for an item returned with a failed
/// condition.
fn describe(item: Option<&HashMap<String, AttributeValue>>) -> String {
    match item.map(from_item) {
        Some(Ok(ReadItem::Lease(l))) => format!(
            "{} at counter {}{}",
            l.owner
                .as_deref()
                .map_or("unowned".to_owned(), |o| format!("owned by {o}")),
            l.counter,
            l.checkpoint_owner
                .as_deref()
                .map(|f| format!(", in a handoff from {f}"))
                .unwrap_or_default()
        ),
        _ => "deleted".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--all` with a sequence number is refused before anything is read
    /// or written; with a sentinel it is taken.
    #[test]
    fn one_sequence_number_for_every_shard_is_refused() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            reset: ResetArgs,
        }
        let args = |to: &str| Cli::parse_from(["kcl", "--app", "a", "--all", "--to", to]).reset;
        let err = refuse_one_number_for_all(&args("4959/2")).expect_err("refused");
        assert!(err.to_string().contains("--shard"), "{err}");
        refuse_one_number_for_all(&args("TRIM_HORIZON")).expect("a sentinel suits every shard");
    }

    /// The dry run names whom the reset evicts: during a handoff the
    /// previous owner, which still processes the shard, first (it named
    /// only the owner taking it over).
    #[test]
    fn a_dry_run_names_the_previous_owner_of_a_handoff() {
        let mut lease = Lease::new("shardId-1", Checkpoint::TrimHorizon);
        assert_eq!(evicting(&lease), "");
        lease.owner = Some("w2".into());
        assert_eq!(evicting(&lease), ", evicting w2");
        lease.checkpoint_owner = Some("w1".into());
        assert_eq!(
            evicting(&lease),
            ", evicting w1 (still draining it) and w2 (taking it over)"
        );
        lease.owner = None;
        assert_eq!(evicting(&lease), ", evicting w1 (still draining it)");
    }
}
