//! Reading a lease table, and the two repairs: `reset` and `release`.
//!
//! Reads go through kcl's own `DynamoDbLeaseStore` (strongly consistent,
//! paginated scans; the same item mapping as the workers). Each repair is
//! one conditional write on what was just read, so it never races a
//! worker silently: if the lease moved in between, nothing is written and
//! the command says what it found.

use std::collections::HashMap;

use anyhow::{Context as _, bail};
use aws_sdk_dynamodb::types::KeyType;
use clap::Args;
use futures::TryStreamExt as _;
use kcl::core::operator::{self, Released};
use kcl::core::store::Beat;
use kcl::core::{Lease, LeaseStore as _};
use kcl_dynamodb::DynamoDbLeaseStore;
use kcl_dynamodb::item::attr;

use crate::view::{Listing, Liveness, Row, State, stream_name};
use crate::{TableArgs, aws};

mod reset;
mod sequence;
mod streams;

pub(crate) use reset::{ResetArgs, reset};

/// Whether `lease` is of `stream` (`--stream`: a name, an identifier or
/// an ARN), if one is given. The leases of a single-stream table name no
/// stream: they are of the one it serves, which
/// [`Table::check_serves`] compares with `--stream` (it filtered every one
/// of them out).
fn of_stream(lease: &Lease, stream: Option<&str>) -> bool {
    match (stream, lease.stream.as_deref()) {
        (Some(s), Some(id)) => streams::names(id, s),
        _ => true,
    }
}

/// A lease table that exists and has a lease table's key.
pub(crate) struct Table {
    store: DynamoDbLeaseStore,
    name: String,
    /// The AWS settings the table was opened with, for the command's other
    /// clients (a checked reset's Kinesis client).
    sdk: aws_config::SdkConfig,
    /// The stream the table records serving, once read.
    served: std::sync::Mutex<Option<Option<String>>>,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
            sdk,
            served: std::sync::Mutex::default(),
        })
    }

    /// The AWS settings the table was opened with.
    pub(crate) fn sdk(&self) -> &aws_config::SdkConfig {
        &self.sdk
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

    /// The identifier of the stream a single-stream table serves, as its
    /// first worker recorded it beside the liveness records; `None` when
    /// none is recorded.
    async fn served_stream(&self) -> anyhow::Result<Option<String>> {
        self.read_served_stream(false).await
    }

    /// [`Self::served_stream`], a denied read warned of and taken for
    /// none, for a caller that has `--stream` to go by: a role without
    /// access to `<table>-workers` could use it before the record was
    /// read. Any other failure (a throttle, an outage) is an error: going
    /// on without the record could rewind another stream's table.
    async fn served_stream_or_warn(&self) -> anyhow::Result<Option<String>> {
        self.read_served_stream(true).await
    }

    async fn read_served_stream(&self, denied_is_none: bool) -> anyhow::Result<Option<String>> {
        if let Some(served) = lock(&self.served).clone() {
            return Ok(served);
        }
        let workers = kcl_dynamodb::schema::workers_table_for(&self.name);
        let err = match kcl_dynamodb::table::served_stream(self.store.client(), &workers).await {
            Ok(served) => {
                // One read per command: a reset checks the stream twice.
                *lock(&self.served) = Some(served.clone());
                return Ok(served);
            }
            Err(e) => e,
        };
        let denied = err
            .as_service_error()
            .and_then(|s| s.meta().code())
            .is_some_and(|code| code == "AccessDeniedException");
        let err = aws::sdk_error(
            "DYNAMODB",
            format!(
                "reading the stream table {} serves, in {workers}",
                self.name
            ),
            err,
        );
        if denied && denied_is_none {
            eprintln!("warning: {}; going by --stream alone", aws::explain(&err));
            *lock(&self.served) = Some(None);
            return Ok(None);
        }
        Err(err)
    }

    /// Fails if `stream` (`--stream`) is given for `leases` of a
    /// single-stream table that records serving another stream: they are
    /// that stream's, and a command meant for `stream` must not move them.
    async fn check_serves(&self, leases: &[Lease], stream: Option<&str>) -> anyhow::Result<()> {
        let Some(given) = stream else { return Ok(()) };
        if leases.iter().all(|l| l.stream.is_some()) {
            return Ok(());
        }
        match self.served_stream_or_warn().await? {
            Some(served) if !streams::names(&served, given) => bail!(
                "table {} serves stream {} ({served}), not {given}; nothing was written",
                self.name,
                stream_name(&served)
            ),
            _ => Ok(()),
        }
    }

    /// The lease of `shard` (a shard id or a lease key), in `stream` when
    /// the table holds several streams.
    async fn find(&self, shard: &str, stream: Option<&str>) -> anyhow::Result<Lease> {
        let leases = self.leases().await?;
        self.check_serves(&leases, stream).await?;
        let matches: Vec<&Lease> = leases
            .iter()
            .filter(|l| l.key == shard || l.shard_id == shard)
            .filter(|l| of_stream(l, stream))
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
