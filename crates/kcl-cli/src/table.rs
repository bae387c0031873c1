//! Reading a lease table, and the two repairs: `reset` and `release`.
//!
//! Reads go through kcl's own `DynamoDbLeaseStore` (strongly consistent,
//! paginated scans; the same item mapping as the workers). Each repair is
//! one conditional write on what was just read, so it never races a
//! worker silently: if the lease moved in between, nothing is written and
//! the command says what it found.

use std::collections::HashMap;

use anyhow::{Context as _, bail};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeyType, ReturnValue, ReturnValuesOnConditionCheckFailure,
};
use clap::Args;
use futures::TryStreamExt as _;
use kcl::Checkpoint;
use kcl::core::operator::{self, Released};
use kcl::core::store::{Beat, is_evicted_tenure};
use kcl::core::{Lease, LeaseStore as _};
use kcl_dynamodb::DynamoDbLeaseStore;
use kcl_dynamodb::item::{ReadItem, attr, from_item};

use crate::view::{Listing, Liveness, Row, State, stream_name};
use crate::{TableArgs, args, aws};

/// A lease table that exists and has a lease table's key.
pub(crate) struct Table {
    store: DynamoDbLeaseStore,
    name: String,
}

impl Table {
    /// Checks that the table exists (and that DynamoDB answers at all),
    /// with advice when it does not.
    pub(crate) async fn open(args: &TableArgs) -> anyhow::Result<Table> {
        let sdk = aws::sdk_config(true).await;
        let client = aws_sdk_dynamodb::Client::new(&sdk);
        let name = args.table().to_owned();
        let described = match client.describe_table().table_name(&name).send().await {
            Ok(out) => out,
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                bail!(
                    "table {name} not found at {}: is {} right? Workers create the lease table \
                     on their first start (named after the application unless it sets \
                     table_name)",
                    aws::endpoint("DYNAMODB"),
                    args.flag()
                );
            }
            Err(e) => {
                return Err(aws::sdk_error(
                    "DYNAMODB",
                    format!("cannot read table {name}"),
                    e,
                ));
            }
        };
        let keys = described
            .table()
            .map(|t| t.key_schema())
            .unwrap_or_default();
        let is_lease_table = keys.len() == 1
            && keys[0].attribute_name() == attr::LEASE_KEY
            && keys[0].key_type() == &KeyType::Hash;
        if !is_lease_table {
            bail!(
                "table {name} is not a kcl lease table: its key is [{}], not the hash key {:?}",
                keys.iter()
                    .map(|k| k.attribute_name())
                    .collect::<Vec<_>>()
                    .join(", "),
                attr::LEASE_KEY
            );
        }
        Ok(Table {
            store: DynamoDbLeaseStore::new(client, &name),
            name,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Every lease, from one consistent paginated scan. Malformed items are
    /// skipped with a warning on stderr, as workers skip them.
    pub(crate) async fn leases(&self) -> anyhow::Result<Vec<Lease>> {
        let pages: Vec<Vec<Lease>> = self
            .store
            .scan()
            .try_collect()
            .await
            .with_context(|| format!("scanning table {}", self.name))?;
        Ok(pages.into_iter().flatten().collect())
    }

    /// The liveness records of the table's workers, by instance (none in
    /// the per-lease renewal mode, which writes no records).
    pub(crate) async fn beats(&self) -> anyhow::Result<HashMap<String, Beat>> {
        let beats = self
            .store
            .beats()
            .await
            .with_context(|| format!("reading the liveness records of table {}", self.name))?;
        Ok(beats.into_iter().map(|b| (b.instance.clone(), b)).collect())
    }

    /// The liveness records a repair of `leases` is judged with: an error
    /// naming the table when they cannot be read and a kcl worker may hold
    /// one of the leases (see [`operator::records_for`]).
    async fn records_for(&self, leases: &[Lease]) -> anyhow::Result<Vec<Beat>> {
        let workers = kcl_dynamodb::schema::workers_table_for(&self.name);
        operator::records_for(&self.store, leases)
            .await
            .map_err(|e| {
                let e = anyhow::Error::new(e)
                    .context(format!("reading the liveness records in table {workers}"));
                anyhow::anyhow!(
                    "{}: a kcl worker may hold the lease through its liveness record, and \
                     repairing it without telling that worker would let a peer process the \
                     shard while it still does; nothing was written (the role needs \
                     dynamodb:Scan on {workers} too)",
                    aws::explain(&e)
                )
            })
    }

    /// The lease of `shard` (a shard id or a lease key), in `stream` when
    /// the table holds several streams.
    async fn find(&self, shard: &str, stream: Option<&str>) -> anyhow::Result<Lease> {
        let leases = self.leases().await?;
        let matches: Vec<&Lease> = leases
            .iter()
            .filter(|l| l.key == shard || l.shard_id == shard)
            .filter(|l| {
                stream.is_none_or(|s| {
                    l.stream
                        .as_deref()
                        .is_some_and(|id| id == s || stream_name(id) == s)
                })
            })
            .collect();
        match matches.as_slice() {
            [one] => Ok((*one).clone()),
            [] => {
                let mut some: Vec<&str> = leases.iter().map(|l| l.shard_id.as_str()).collect();
                some.sort_unstable();
                some.dedup();
                some.truncate(5);
                bail!(
                    "no lease for shard {shard}{} in table {} ({} leases{})",
                    stream
                        .map(|s| format!(" of stream {s}"))
                        .unwrap_or_default(),
                    self.name,
                    leases.len(),
                    if some.is_empty() {
                        String::new()
                    } else {
                        format!("; for example {}", some.join(", "))
                    }
                )
            }
            several => bail!(
                "shard {shard} has a lease in several streams ({}): add --stream",
                several
                    .iter()
                    .filter_map(|l| l.stream.as_deref())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// `kcl leases`: prints the listing.
pub(crate) async fn list(args: &TableArgs, json: bool, wide: bool) -> anyhow::Result<()> {
    let table = Table::open(args).await?;
    let asked = std::time::SystemTime::now();
    let leases = table.leases().await?;
    let beats_read = std::time::SystemTime::now();
    // The liveness records only add to the listing: one that cannot be
    // read (a role allowed only the lease table) leaves it without them.
    let beats = table.beats().await.unwrap_or_else(|e| {
        eprintln!("warning: {}; listing without liveness", aws::explain(&e));
        HashMap::new()
    });
    let rows = leases
        .iter()
        .map(|l| {
            Row::new(l, State::of(l, false), None)
                .with_liveness(Liveness::of(l, &beats, beats_read))
        })
        .collect();
    let listing = Listing::new(table.name(), asked, rows);
    if json {
        say!("{}", serde_json::to_string_pretty(&listing)?);
    } else {
        {
            use std::io::Write as _;
            let _ = write!(std::io::stdout().lock(), "{}", listing.render(wide));
        }
        let unjudged = listing
            .leases
            .iter()
            .any(|r| r.state == State::Active && r.liveness.is_none());
        if unjudged {
            say!(
                "\n\"active\" means owned: whether an owner is still alive shows over time \
                 (`kcl leases watch` marks leases whose counter stops moving as expired)."
            );
        }
    }
    Ok(())
}

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
    let table = Table::open(&a.table).await?;
    let leases = leases_to_reset(&table, &a).await?;
    if !a.force {
        refuse_any(&leases)?;
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
        if let Err(e) = reset_one(&table, lease, &a.to, a.force, &beats).await {
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
            let mut all: Vec<Lease> = table
                .leases()
                .await?
                .into_iter()
                .filter(|l| {
                    a.stream.as_deref().is_none_or(|s| {
                        l.stream
                            .as_deref()
                            .is_some_and(|id| id == s || stream_name(id) == s)
                    })
                })
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
            lease
                .owner
                .as_deref()
                .map(|o| format!(", evicting {o}"))
                .unwrap_or_default()
        );
    }
    say!("dry run: nothing was written");
}

/// Why `lease` may not be reset without `--force`, if it may not.
fn refusal(lease: &Lease) -> Option<String> {
    let shard = &lease.shard_id;
    if let Some(from) = &lease.checkpoint_owner {
        return Some(format!(
            "refusing to reset shard {shard}: a handoff from {from} to {} is in progress \
             (counter {}); its workers would overwrite the checkpoint. Stop the application \
             first, or pass --force to evict both in the same write",
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

/// Resets one lease, conditional on the counter it was seen at (and, without
/// `force`, on nobody holding it).
async fn reset_one(
    table: &Table,
    lease: &Lease,
    to: &Checkpoint,
    force: bool,
    beats: &[Beat],
) -> anyhow::Result<()> {
    let shard = &lease.shard_id;
    let evicted = evict_first(table, lease, force, beats).await?;
    let (lease, instance) = match &evicted {
        Some((now, instance)) => (now, Some(instance.as_str())),
        None => (lease, None),
    };
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
                bail!(
                    "shard {shard} changed while resetting (it was {}); nothing was written: \
                     look again and retry",
                    describe(failed.item())
                );
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
                    anyhow::anyhow!(
                        "shard {shard} changed while resetting; nothing was written: look again \
                         and retry"
                    )
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
            condition
                .push_str(" AND attribute_not_exists(#owner) AND attribute_not_exists(#cpOwner)");
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

/// Arguments of `kcl leases release`.
#[derive(Debug, Args)]
pub(crate) struct ReleaseArgs {
    #[command(flatten)]
    table: TableArgs,
    /// The shard (shardId-000000000001), or its lease key.
    #[arg(long)]
    shard: String,
    /// The stream, when the table holds several (multi-stream
    /// applications).
    #[arg(long)]
    stream: Option<String>,
}

/// `kcl leases release`.
pub(crate) async fn release(a: ReleaseArgs) -> anyhow::Result<()> {
    let table = Table::open(&a.table).await?;
    let lease = table.find(&a.shard, a.stream.as_deref()).await?;
    let shard = &lease.shard_id;
    let Some(owner) = &lease.owner else {
        say!("shard {shard} is not owned by any worker; nothing to release");
        return Ok(());
    };
    let beats = table.records_for(std::slice::from_ref(&lease)).await?;
    // Pinned to the tenure (and counter) read above: if the worker re-took
    // the lease since (a new tenure), nothing is released.
    match operator::release(&table.store, &lease, &beats).await {
        Ok(Released::HandedBack { told, .. }) => {
            say!(
                "released shard {shard} (owner was {owner}; counter {}): {owner} renews through \
                 its liveness record, so the release is a handoff to nobody, asked for in that \
                 record: {owner} stops fetching{}, lets its processor checkpoint and hands the \
                 shard over; a running worker takes it only then (or once {owner} stops beating)",
                lease.counter,
                if told {
                    " within a renew interval"
                } else {
                    " at its next read of the lease table (telling it through its record failed)"
                },
            );
            Ok(())
        }
        Ok(Released::Released { lease: now }) => {
            say!(
                "released shard {shard} (owner was {owner}; counter {} -> {}): {owner} has no \
                 liveness record (it renews every lease: a Java KCL worker, or kcl renewing per \
                 lease) and stops at its next renewal; a running worker takes the shard at its \
                 next lease-taker tick",
                lease.counter,
                now.counter
            );
            if let Some(from) = &now.checkpoint_owner {
                say!(
                    "note: a handoff from {from} is in progress; the shard is taken once {from} \
                     completes it, or when the lease expires"
                );
            }
            Ok(())
        }
        Ok(_) => {
            say!("shard {shard} is not owned by any worker; nothing to release");
            Ok(())
        }
        Err(e) if e.is_condition_failed() => {
            let now = e
                .current()
                .map(|l| {
                    l.owner
                        .as_deref()
                        .map_or("unowned".to_owned(), |o| format!("owned by {o}"))
                })
                .unwrap_or_else(|| "deleted".into());
            bail!("shard {shard} changed owner since it was read (now {now}); nothing was written")
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("releasing shard {shard}"))),
    }
}
