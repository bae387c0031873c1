//! `KinesisShardSource` and shard sync against the emulators: discovery
//! with pagination and resharding lineage, shard sync on DynamoDB from two
//! workers at once, polling reads in order, resume inside a KPL aggregate,
//! expired iterators and throttling injected mid-read, and lease loss.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use bytes::Bytes;
use kcl_core::leases::{EndReason, LeaseHandle};
use kcl_core::shard_sync::{SyncReport, sync_shards};
use kcl_core::source::{
    InitialPosition, OpenShard, ShardInfo, ShardReader, ShardSource, SourceError, StartPosition,
};
use kcl_core::{Checkpoint, Lease, LeaseLayout, LeaseStore, Record};
use kcl_dynamodb::{Capacity, DynamoDbLeaseStore, ensure_table};
use kcl_kinesis::faults::{Call, Fault, FaultInjector};
use kcl_kinesis::kpl::{UserRecord, aggregate};
use kcl_kinesis::{KinesisShardSource, PollingConfig};
use kcl_tests::{
    TestEnv, TestRecord, create_stream, delete_stream, delete_table, merge_shards, put_entries,
    put_sequenced_records, split_shard_in_half, unique_name,
};

/// How long a test waits for the records it expects.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

fn polling() -> kcl_kinesis::PollingConfigBuilder {
    PollingConfig::builder()
        .idle_time_between_reads(Duration::from_millis(200))
        .time_between_reads(Duration::from_millis(200))
        .retry_min_delay(Duration::from_millis(20))
        .retry_max_delay(Duration::from_millis(200))
}

fn source(
    env: &TestEnv,
    polling: PollingConfig,
    faults: Option<FaultInjector>,
) -> anyhow::Result<KinesisShardSource> {
    let mut builder = KinesisShardSource::builder(env.kinesis().clone()).polling(polling);
    if let Some(faults) = faults {
        builder = builder.fault_injector(faults);
    }
    Ok(builder.build()?)
}

/// A lease held for the whole test, as a coordinator would hand it out.
fn held(shard: &ShardInfo) -> LeaseHandle {
    let mut lease = Lease::new(shard.shard_id.clone(), Checkpoint::TrimHorizon);
    lease.hash_key_range = Some(shard.hash_key_range.clone());
    LeaseHandle::detached(lease, Duration::from_secs(3600))
}

async fn only_shard(source: &KinesisShardSource, stream: &str) -> anyhow::Result<ShardInfo> {
    let mut shards = source.list_shards(stream).await?;
    ensure!(shards.len() == 1, "expected one shard, got {shards:?}");
    shards.pop().context("no shard")
}

async fn open(
    source: &KinesisShardSource,
    stream: &str,
    shard: &ShardInfo,
    position: StartPosition,
    lease: LeaseHandle,
) -> anyhow::Result<Box<dyn ShardReader>> {
    Ok(source
        .open(OpenShard::new(
            stream,
            shard.shard_id.clone(),
            position,
            lease,
        ))
        .await?)
}

/// Opens `shard` at TRIM_HORIZON under a lease held for the whole test.
async fn open_at_start(
    source: &KinesisShardSource,
    stream: &str,
    shard: &ShardInfo,
) -> anyhow::Result<Box<dyn ShardReader>> {
    open(
        source,
        stream,
        shard,
        StartPosition::TrimHorizon,
        held(shard),
    )
    .await
}

/// Reads until at least `n` records arrived (or the shard ended), failing
/// on any non-retryable error; returns them and the retryable errors seen.
async fn read_n(reader: &mut dyn ShardReader, n: usize) -> anyhow::Result<(Vec<Record>, usize)> {
    let read = async {
        let mut records = Vec::new();
        let mut retryable = 0;
        while records.len() < n {
            match reader.next_batch().await {
                Ok(batch) => {
                    records.extend(batch.records);
                    if batch.shard_end.is_some() {
                        break;
                    }
                }
                Err(e) if e.is_retryable() => retryable += 1,
                Err(e) => return Err(e).context("next_batch"),
            }
        }
        Ok((records, retryable))
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .with_context(|| format!("{n} records not read within {READ_TIMEOUT:?}"))?
}

fn positions(records: &[Record]) -> Vec<(String, u64)> {
    records
        .iter()
        .map(|r| (r.sequence_number.clone(), r.sub_sequence_number))
        .collect()
}

// ---------------------------------------------------------------------------
// Discovery
// ---------------------------------------------------------------------------

/// Fails unless each key's counters run 0, 1, 2, ... in `records`.
fn each_key_counts_up(records: &[Record]) -> anyhow::Result<()> {
    let mut per_key: BTreeMap<u32, u64> = BTreeMap::new();
    for r in records {
        let t = TestRecord::parse(&r.data).context("payload")?;
        let next = per_key.entry(t.key).or_default();
        ensure!(
            t.counter == *next,
            "pk-{} read {} after {}",
            t.key,
            t.counter,
            *next
        );
        *next += 1;
    }
    Ok(())
}

fn by_id(shards: &[ShardInfo]) -> BTreeMap<&str, &ShardInfo> {
    shards.iter().map(|s| (s.shard_id.as_str(), s)).collect()
}

fn bounds(shard: &ShardInfo) -> anyhow::Result<(u128, u128)> {
    Ok((
        shard.hash_key_range.starting.parse()?,
        shard.hash_key_range.ending.parse()?,
    ))
}

#[tokio::test]
async fn discovery_paginates_and_follows_splits_and_merges() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("src-discovery");
    create_stream(kinesis, &stream, 5).await?;
    let source = KinesisShardSource::builder(kinesis.clone())
        .max_results(2)
        .build()?;

    let shards = source.list_shards(&stream).await?;
    let pages = source.stats().list_shards_calls;
    ensure!(
        pages == 3,
        "5 shards in pages of 2 took {pages} ListShards calls"
    );
    let ids: BTreeSet<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
    ensure!(ids.len() == 5 && shards.len() == 5, "listed {ids:?}");
    ensure!(
        shards
            .iter()
            .all(|s| !s.is_closed() && s.parents().count() == 0)
    );

    // Split the first shard at the middle of its range.
    let mut open: Vec<&ShardInfo> = shards.iter().collect();
    open.sort_by_key(|s| bounds(s).map(|b| b.0).unwrap_or(0));
    let parent = open[0].clone();
    split_shard_in_half(kinesis, &stream, &parent.shard_id).await?;

    let after_split = source.list_shards(&stream).await?;
    let map = by_id(&after_split);
    ensure!(after_split.len() == 7, "after the split: {:?}", map.keys());
    ensure!(
        map[parent.shard_id.as_str()].is_closed(),
        "parent not closed"
    );
    let children: Vec<&ShardInfo> = after_split
        .iter()
        .filter(|s| s.parents().any(|p| p == parent.shard_id))
        .collect();
    ensure!(children.len() == 2, "children of the split: {children:?}");
    for child in &children {
        ensure!(!child.is_closed() && child.adjacent_parent_shard_id.is_none());
    }

    // Merge the two highest open shards (adjacent ranges).
    let mut open: Vec<&ShardInfo> = after_split.iter().filter(|s| !s.is_closed()).collect();
    open.sort_by_key(|s| bounds(s).map(|b| b.0).unwrap_or(0));
    let (a, b) = (open[open.len() - 2].clone(), open[open.len() - 1].clone());
    merge_shards(kinesis, &stream, &a.shard_id, &b.shard_id).await?;

    let after_merge = source.list_shards(&stream).await?;
    let map = by_id(&after_merge);
    ensure!(after_merge.len() == 8, "after the merge: {:?}", map.keys());
    ensure!(map[a.shard_id.as_str()].is_closed() && map[b.shard_id.as_str()].is_closed());
    let merged: Vec<&ShardInfo> = after_merge
        .iter()
        .filter(|s| s.parents().any(|p| p == a.shard_id))
        .collect();
    ensure!(merged.len() == 1, "children of the merge: {merged:?}");
    let merged = merged[0];
    ensure!(
        merged.parent_shard_id.as_deref() == Some(a.shard_id.as_str())
            && merged.adjacent_parent_shard_id.as_deref() == Some(b.shard_id.as_str()),
        "merged child lineage: {merged:?}"
    );
    ensure!(
        bounds(merged)? == (bounds(&a)?.0, bounds(&b)?.1),
        "merged range {merged:?}"
    );

    delete_stream(kinesis, &stream).await
}

// ---------------------------------------------------------------------------
// Shard sync on DynamoDB
// ---------------------------------------------------------------------------

#[tokio::test]
async fn shard_sync_from_two_workers_creates_each_lease_once() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("src-sync");
    let table = unique_name("src-sync-leases");
    create_stream(kinesis, &stream, 3).await?;
    ensure_table(env.dynamodb(), &table, Capacity::OnDemand).await?;

    // Split one shard so that lineage matters: with TRIM_HORIZON the
    // closed parent and both children get leases, the children at
    // TRIM_HORIZON after their parent.
    let lister = KinesisShardSource::new(kinesis.clone());
    let first = lister.list_shards(&stream).await?;
    let parent = first.first().context("no shard")?.clone();
    split_shard_in_half(kinesis, &stream, &parent.shard_id).await?;
    let shards = lister.list_shards(&stream).await?;
    ensure!(shards.len() == 5, "{shards:?}");

    // Two workers, each with its own source and store client.
    let workers: Vec<(KinesisShardSource, DynamoDbLeaseStore)> = (0..2)
        .map(|_| {
            (
                KinesisShardSource::new(kinesis.clone()),
                DynamoDbLeaseStore::new(env.dynamodb().clone(), &table).with_page_size(2),
            )
        })
        .collect();
    let layout = LeaseLayout::SingleStream;
    let sync = |i: usize| {
        let (source, store) = &workers[i];
        sync_shards(
            source,
            store,
            &stream,
            &layout,
            InitialPosition::TrimHorizon,
        )
    };
    let (one, two) = tokio::join!(sync(0), sync(1));
    let (one, two) = (one?, two?);
    ensure!(
        one.created + two.created == 5,
        "created {} + {} leases for 5 shards",
        one.created,
        two.created
    );
    ensure!(
        one.holes.is_empty() && two.holes.is_empty(),
        "holes: {one:?} {two:?}"
    );

    let store = &workers[0].1;
    let pages: Vec<Vec<Lease>> = futures::TryStreamExt::try_collect(store.scan()).await?;
    let leases: BTreeMap<String, Lease> = pages
        .into_iter()
        .flatten()
        .map(|l| (l.key.clone(), l))
        .collect();
    let want: BTreeSet<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
    let got: BTreeSet<&str> = leases.keys().map(String::as_str).collect();
    ensure!(got == want, "leases {got:?}, shards {want:?}");
    for shard in &shards {
        let lease = &leases[&shard.shard_id];
        ensure!(lease.checkpoint == Checkpoint::TrimHorizon, "{lease:?}");
        ensure!(lease.owner.is_none(), "{lease:?}");
        let parents: BTreeSet<&str> = lease.parent_shard_ids.iter().map(String::as_str).collect();
        ensure!(parents == shard.parents().collect(), "lineage of {lease:?}");
        ensure!(lease.hash_key_range.as_ref() == Some(&shard.hash_key_range));
    }

    // Again, from both: nothing new.
    let (one, two) = tokio::join!(sync(0), sync(1));
    let nothing_new = |r: &SyncReport| (r.created, r.already_existed, r.holes.len()) == (0, 0, 0);
    ensure!(
        nothing_new(&one?) && nothing_new(&two?),
        "a repeated sync created leases"
    );

    delete_table(env.dynamodb(), &table).await?;
    delete_stream(kinesis, &stream).await
}

// ---------------------------------------------------------------------------
// Polling reads
// ---------------------------------------------------------------------------

#[tokio::test]
async fn polling_reads_every_record_of_a_prefilled_shard_in_order() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("src-poll");
    create_stream(kinesis, &stream, 1).await?;
    let sent = put_sequenced_records(kinesis, &stream, 4, 75).await?;

    let source = source(&env, polling().max_records(50).build()?, None)?;
    let shard = only_shard(&source, &stream).await?;
    let mut reader = open_at_start(&source, &stream, &shard).await?;
    let (records, retryable) = read_n(reader.as_mut(), 300).await?;
    ensure!(retryable == 0);

    let mut expected: Vec<(&str, String)> = sent
        .iter()
        .map(|s| (s.sequence_number.as_str(), s.record.payload()))
        .collect();
    expected.sort_by(|a, b| (a.0.len(), a.0).cmp(&(b.0.len(), b.0)));
    let got: Vec<(&str, String)> = records
        .iter()
        .map(|r| {
            (
                r.sequence_number.as_str(),
                String::from_utf8_lossy(&r.data).into_owned(),
            )
        })
        .collect();
    ensure!(got == expected, "records out of order or missing");
    each_key_counts_up(&records)?;
    let stats = source.stats();
    ensure!(
        stats.get_records_calls >= 6,
        "300 records at 50 a call: {stats:?}"
    );
    ensure!(stats.records == 300, "{stats:?}");

    // Caught up: the reader returns empty batches, and says how far behind.
    let batch = reader.next_batch().await?;
    ensure!(
        batch.records.is_empty() && batch.shard_end.is_none(),
        "{batch:?}"
    );
    ensure!(batch.millis_behind_latest.is_some(), "{batch:?}");

    delete_stream(kinesis, &stream).await
}

#[tokio::test]
async fn reading_a_split_parent_ends_with_its_children() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("src-end");
    create_stream(kinesis, &stream, 1).await?;
    put_sequenced_records(kinesis, &stream, 2, 10).await?;
    let source = source(&env, polling().build()?, None)?;
    let parent = only_shard(&source, &stream).await?;
    split_shard_in_half(kinesis, &stream, &parent.shard_id).await?;
    let listed: BTreeSet<String> = source
        .list_shards(&stream)
        .await?
        .into_iter()
        .filter(|s| s.parents().any(|p| p == parent.shard_id))
        .map(|s| s.shard_id)
        .collect();

    let mut reader = open_at_start(&source, &stream, &parent).await?;
    let read = async {
        let mut records = 0;
        loop {
            let batch = reader.next_batch().await?;
            records += batch.records.len();
            if let Some(children) = batch.shard_end {
                return anyhow::Ok((records, children));
            }
        }
    };
    let (records, children) = tokio::time::timeout(READ_TIMEOUT, read).await??;
    ensure!(records == 20, "read {records} of 20 records before the end");
    let ids: BTreeSet<String> = children.iter().map(|c| c.shard_id.clone()).collect();
    ensure!(
        ids == listed,
        "shard end named {ids:?}, ListShards {listed:?}"
    );
    ensure!(
        children
            .iter()
            .all(|c| c.parent_shard_ids == [parent.shard_id.clone()])
    );
    match reader.next_batch().await {
        Err(SourceError::Fatal { .. }) => {}
        other => bail!("after the end: {other:?}"),
    }

    delete_stream(kinesis, &stream).await
}

// ---------------------------------------------------------------------------
// Resume inside a KPL aggregate
// ---------------------------------------------------------------------------

#[tokio::test]
async fn resume_in_the_middle_of_a_kpl_aggregate() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("src-kpl");
    create_stream(kinesis, &stream, 1).await?;

    // Plain records and aggregates of 10 user records, interleaved.
    let mut entries = Vec::new();
    let mut users = 0;
    for a in 0..6 {
        entries.push(
            PutRecordsRequestEntry::builder()
                .partition_key(format!("plain-{a}"))
                .data(Blob::new(format!("plain {a}")))
                .build()?,
        );
        users += 1;
        let subs: Vec<UserRecord> = (0..10)
            .map(|i| UserRecord {
                partition_key: format!("pk-{a}-{i}"),
                explicit_hash_key: None,
                data: Bytes::from(format!("agg {a} sub {i}")),
            })
            .collect();
        entries.push(
            PutRecordsRequestEntry::builder()
                .partition_key(subs[0].partition_key.clone())
                .data(Blob::new(aggregate(&subs).to_vec()))
                .build()?,
        );
        users += 10;
    }
    let out = put_entries(kinesis, &stream, entries).await?;
    ensure!(
        out.failed_record_count().unwrap_or(0) == 0,
        "rejected records"
    );

    let source = source(&env, polling().max_records(3).build()?, None)?;
    let shard = only_shard(&source, &stream).await?;
    let mut first = open_at_start(&source, &stream, &shard).await?;
    let (all, _) = read_n(first.as_mut(), users).await?;
    drop(first);
    ensure!(
        all.len() == users,
        "read {} of {users} user records",
        all.len()
    );
    ensure!(
        all.iter().filter(|r| r.aggregated).count() == 60,
        "de-aggregated"
    );

    // Checkpoint at sub-record 4 of the third aggregate.
    let cut = all
        .iter()
        .position(|r| r.aggregated && r.data.as_ref() == b"agg 2 sub 4")
        .context("the checkpointed sub-record")?;
    let checkpoint = &all[cut];
    let mut resumed = open(
        &source,
        &stream,
        &shard,
        StartPosition::AfterCheckpoint {
            seq: checkpoint.sequence_number.clone(),
            sub: checkpoint.sub_sequence_number,
        },
        held(&shard),
    )
    .await?;
    let (rest, _) = read_n(resumed.as_mut(), all.len() - cut - 1).await?;
    ensure!(
        positions(&rest) == positions(&all[cut + 1..]),
        "resumed at {:?}, expected {:?}",
        positions(&rest).first(),
        positions(&all[cut + 1..]).first()
    );
    ensure!(rest[0].data.as_ref() == b"agg 2 sub 5");
    ensure!(
        rest.iter()
            .map(|r| &r.data)
            .eq(all[cut + 1..].iter().map(|r| &r.data))
    );

    delete_stream(kinesis, &stream).await
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

#[tokio::test]
async fn expired_iterator_and_throttling_mid_read_lose_and_repeat_nothing() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("src-faults");
    create_stream(kinesis, &stream, 1).await?;
    put_sequenced_records(kinesis, &stream, 2, 100).await?;

    let faults = FaultInjector::new();
    // One batch of prefetch: the fetcher cannot run ahead, so the faults
    // land in the middle of the shard.
    let config = polling().max_records(20).max_prefetch_records(20).build()?;
    let source = source(&env, config, Some(faults.clone()))?;
    let shard = only_shard(&source, &stream).await?;
    let mut reader = open_at_start(&source, &stream, &shard).await?;

    let (mut records, _) = read_n(reader.as_mut(), 40).await?;
    faults.inject(Call::GetRecords, Fault::ExpiredIterator);
    let (more, _) = read_n(reader.as_mut(), 100 - records.len()).await?;
    records.extend(more);
    for fault in [
        Fault::ProvisionedThroughputExceeded,
        Fault::KmsThrottling,
        Fault::ProvisionedThroughputExceeded,
    ] {
        faults.inject(Call::GetRecords, fault);
    }
    faults.inject(Call::GetShardIterator, Fault::ProvisionedThroughputExceeded);
    faults.inject(Call::GetRecords, Fault::ExpiredIterator);
    let (rest, retryable) = read_n(reader.as_mut(), 200 - records.len()).await?;
    records.extend(rest);
    ensure!(retryable == 0, "throttling surfaced as {retryable} errors");

    // All 200, in shard order, each once.
    let seqs: Vec<&str> = records.iter().map(|r| r.sequence_number.as_str()).collect();
    let distinct: BTreeSet<&str> = seqs.iter().copied().collect();
    ensure!(distinct.len() == 200, "{} distinct of 200", distinct.len());
    ensure!(
        seqs.windows(2)
            .all(|w| (w[0].len(), w[0]) < (w[1].len(), w[1])),
        "out of order"
    );
    each_key_counts_up(&records)?;

    ensure!(faults.pending(Call::GetRecords) == 0 && faults.pending(Call::GetShardIterator) == 0);
    let stats = source.stats();
    ensure!(stats.expired_iterators == 2, "{stats:?}");
    ensure!(stats.throttles == 4, "{stats:?}");
    ensure!(stats.retries == 4, "{stats:?}");
    // Open, plus one per expired iterator (the throttled attempt included).
    ensure!(stats.get_shard_iterator_calls == 4, "{stats:?}");

    delete_stream(kinesis, &stream).await
}

#[tokio::test]
async fn lease_loss_stops_the_reader_without_another_get_records() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("src-lease");
    create_stream(kinesis, &stream, 1).await?;
    put_sequenced_records(kinesis, &stream, 2, 10).await?;

    let source = source(&env, polling().build()?, None)?;
    let shard = only_shard(&source, &stream).await?;
    let lease = held(&shard);
    let mut reader = open(
        &source,
        &stream,
        &shard,
        StartPosition::TrimHorizon,
        lease.clone(),
    )
    .await?;
    read_n(reader.as_mut(), 20).await?;

    lease.end_for_test(EndReason::Lost);
    let calls = source.stats().get_records_calls;
    match reader.next_batch().await {
        Err(SourceError::LeaseLost { shard: s }) if s == shard.shard_id => {}
        other => bail!("expected LeaseLost, got {other:?}"),
    }
    // Several idle intervals later, still no call.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after = source.stats().get_records_calls;
    ensure!(
        after == calls,
        "{} GetRecords calls after the lease ended",
        after - calls
    );
    ensure!(
        reader.next_batch().await.is_err(),
        "the reader stays stopped"
    );

    delete_stream(kinesis, &stream).await
}
