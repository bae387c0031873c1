//! Smoke tests of the emulators through the Rust SDK: the calls kcl depends
//! on behave as on AWS (round trips, pagination, resharding lineage,
//! conditional writes). If one of these fails, fix the emulator setup before
//! debugging kcl.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::{Context, ensure};
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use kcl_tests::{
    TestEnv, TestRecord, create_lease_table, create_stream, delete_stream, delete_table,
    list_all_shards, list_shards_paged, put_sequenced_records, read_shard, unique_name,
    wait_for_stream_active,
};

#[tokio::test]
async fn put_and_get_records_round_trip() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("smoke-roundtrip");
    create_stream(kinesis, &stream, 2).await?;

    // 8 keys x 40 records = 320 records: one batch of 320 through PutRecords.
    let sent = put_sequenced_records(kinesis, &stream, 8, 40).await?;
    ensure!(sent.len() == 320, "sent {} records", sent.len());

    let shards = list_all_shards(kinesis, &stream).await?;
    ensure!(shards.len() == 2, "expected 2 shards, got {}", shards.len());
    let mut received: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut received_count = 0;
    for shard in &shards {
        for record in read_shard(kinesis, &stream, shard.shard_id()).await? {
            let parsed = TestRecord::parse(record.data().as_ref())
                .with_context(|| format!("unexpected payload {:?}", record.data()))?;
            ensure!(
                record.partition_key() == Some(parsed.partition_key().as_str()),
                "partition key {:?} does not match payload {}",
                record.partition_key(),
                parsed.payload()
            );
            // Every record of a key lands in the shard PutRecords reported.
            let expected_shard = sent
                .iter()
                .find(|s| s.record == parsed)
                .map(|s| s.shard_id.as_str());
            ensure!(
                expected_shard == Some(shard.shard_id()),
                "{} read from {} but PutRecords put it in {expected_shard:?}",
                parsed.payload(),
                shard.shard_id()
            );
            received.entry(parsed.key).or_default().push(parsed.counter);
            received_count += 1;
        }
    }
    ensure!(
        received_count == 320,
        "read {received_count} records, put 320"
    );
    for (key, counters) in &received {
        // Within a key (one shard), records come back in the order they were put.
        let expected: Vec<u64> = (0..40).collect();
        ensure!(counters == &expected, "key pk-{key} read as {counters:?}");
    }

    delete_stream(kinesis, &stream).await
}

#[tokio::test]
async fn list_shards_paginates() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("smoke-listshards");
    create_stream(kinesis, &stream, 7).await?;

    let listing = list_shards_paged(kinesis, &stream, Some(2)).await?;
    ensure!(
        listing.pages == 4,
        "7 shards at 2 per page should take 4 pages, took {}",
        listing.pages
    );
    let ids: BTreeSet<&str> = listing.shards.iter().map(|s| s.shard_id()).collect();
    ensure!(
        ids.len() == 7 && listing.shards.len() == 7,
        "expected 7 distinct shards, got {:?}",
        listing
            .shards
            .iter()
            .map(|s| s.shard_id())
            .collect::<Vec<_>>()
    );
    let unpaged = list_all_shards(kinesis, &stream).await?;
    let unpaged_ids: BTreeSet<&str> = unpaged.iter().map(|s| s.shard_id()).collect();
    ensure!(
        ids == unpaged_ids,
        "paged {ids:?} != unpaged {unpaged_ids:?}"
    );

    delete_stream(kinesis, &stream).await
}

#[tokio::test]
async fn split_shard_records_lineage() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("smoke-split");
    create_stream(kinesis, &stream, 1).await?;

    let parent = list_all_shards(kinesis, &stream)
        .await?
        .into_iter()
        .next()
        .context("new stream has no shard")?;
    let range = parent
        .hash_key_range()
        .context("shard without hash range")?;
    let start: u128 = range.starting_hash_key().parse()?;
    let end: u128 = range.ending_hash_key().parse()?;
    let middle = start + (end - start) / 2;

    kinesis
        .split_shard()
        .stream_name(&stream)
        .shard_to_split(parent.shard_id())
        .new_starting_hash_key(middle.to_string())
        .send()
        .await
        .context("SplitShard")?;
    wait_for_stream_active(kinesis, &stream, kcl_tests::STATUS_TIMEOUT).await?;

    let shards = list_all_shards(kinesis, &stream).await?;
    ensure!(
        shards.len() == 3,
        "expected parent + 2 children, got {:?}",
        shards.iter().map(|s| s.shard_id()).collect::<Vec<_>>()
    );
    let children: Vec<_> = shards
        .iter()
        .filter(|s| s.parent_shard_id() == Some(parent.shard_id()))
        .collect();
    ensure!(
        children.len() == 2,
        "expected 2 children of {}",
        parent.shard_id()
    );
    let parent_after = shards
        .iter()
        .find(|s| s.shard_id() == parent.shard_id())
        .context("parent shard missing after split")?;
    ensure!(
        parent_after
            .sequence_number_range()
            .and_then(|r| r.ending_sequence_number())
            .is_some(),
        "parent shard is not closed after the split"
    );
    let mut child_ranges: Vec<(u128, u128)> = children
        .iter()
        .map(|c| -> anyhow::Result<(u128, u128)> {
            let r = c.hash_key_range().context("child without hash range")?;
            Ok((r.starting_hash_key().parse()?, r.ending_hash_key().parse()?))
        })
        .collect::<anyhow::Result<_>>()?;
    child_ranges.sort_unstable();
    ensure!(
        child_ranges == [(start, middle - 1), (middle, end)],
        "children cover {child_ranges:?}, expected the parent's range split at {middle}"
    );

    delete_stream(kinesis, &stream).await
}

fn lease_item(owner: &str, counter: i64) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (
            "leaseKey".to_owned(),
            AttributeValue::S("shardId-000000000000".to_owned()),
        ),
        ("leaseOwner".to_owned(), AttributeValue::S(owner.to_owned())),
        (
            "leaseCounter".to_owned(),
            AttributeValue::N(counter.to_string()),
        ),
    ])
}

#[tokio::test]
async fn conditional_put_reports_the_old_item() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let dynamodb = env.dynamodb();
    let table = unique_name("smoke-conditional");
    create_lease_table(dynamodb, &table).await?;

    dynamodb
        .put_item()
        .table_name(&table)
        .set_item(Some(lease_item("worker-a", 1)))
        .condition_expression("attribute_not_exists(leaseKey)")
        .send()
        .await
        .context("first conditional PutItem")?;

    // A second worker thinks the counter is still 0: its write must lose.
    let result = dynamodb
        .put_item()
        .table_name(&table)
        .set_item(Some(lease_item("worker-b", 1)))
        .condition_expression("leaseCounter = :expected")
        .expression_attribute_values(":expected", AttributeValue::N("0".to_owned()))
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await;
    let err = match result {
        Ok(_) => anyhow::bail!("PutItem succeeded although its condition is false"),
        Err(e) => e.into_service_error(),
    };
    let aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(
        failed,
    ) = err
    else {
        anyhow::bail!("expected ConditionalCheckFailedException, got {err:?}");
    };
    let old = failed
        .item()
        .context("ALL_OLD did not return the old item")?;
    ensure!(
        old.get("leaseOwner") == Some(&AttributeValue::S("worker-a".to_owned()))
            && old.get("leaseCounter") == Some(&AttributeValue::N("1".to_owned())),
        "old item is {old:?}"
    );

    // And the stored item is unchanged.
    let stored = dynamodb
        .get_item()
        .table_name(&table)
        .key(
            "leaseKey",
            AttributeValue::S("shardId-000000000000".to_owned()),
        )
        .consistent_read(true)
        .send()
        .await
        .context("GetItem")?;
    ensure!(
        stored.item() == Some(&lease_item("worker-a", 1)),
        "stored item is {:?}",
        stored.item()
    );

    delete_table(dynamodb, &table).await
}

#[tokio::test]
async fn scan_paginates() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let dynamodb = env.dynamodb();
    let table = unique_name("smoke-scan");
    create_lease_table(dynamodb, &table).await?;

    for i in 0..30 {
        dynamodb
            .put_item()
            .table_name(&table)
            .item("leaseKey", AttributeValue::S(format!("shardId-{i:012}")))
            .send()
            .await
            .with_context(|| format!("PutItem {i}"))?;
    }

    let mut keys = BTreeSet::new();
    let mut pages = 0;
    let mut start_key = None;
    loop {
        let out = dynamodb
            .scan()
            .table_name(&table)
            .limit(7)
            .consistent_read(true)
            .set_exclusive_start_key(start_key.take())
            .send()
            .await
            .with_context(|| format!("Scan page {}", pages + 1))?;
        pages += 1;
        ensure!(
            out.items().len() <= 7,
            "page of {} items",
            out.items().len()
        );
        for item in out.items() {
            if let Some(AttributeValue::S(key)) = item.get("leaseKey") {
                keys.insert(key.clone());
            }
        }
        match out.last_evaluated_key() {
            Some(last) if !last.is_empty() => start_key = Some(last.clone()),
            _ => break,
        }
        ensure!(pages <= 30, "Scan never stopped paginating");
    }
    ensure!(
        keys.len() == 30,
        "scanned {} distinct items, put 30",
        keys.len()
    );
    // 30 items at 7 a page: 5 pages, the last possibly followed by an empty one.
    ensure!((5..=6).contains(&pages), "took {pages} pages");

    delete_table(dynamodb, &table).await
}
