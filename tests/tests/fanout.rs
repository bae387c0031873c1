//! Enhanced fan-out against the emulators.

use std::time::Duration;

use anyhow::{Context, ensure};
use aws_sdk_kinesis::types::{
    ConsumerStatus, ShardIteratorType, StartingPosition, SubscribeToShardEventStream,
};
use kcl_tests::{TestEnv, create_stream, delete_stream, list_all_shards, put_sequenced_records, unique_name};

#[tokio::test]
async fn probe_subscribe_to_shard_on_the_emulator() -> anyhow::Result<()> {
    let env = TestEnv::connect().await?;
    let kinesis = env.kinesis();
    let stream = unique_name("fo-probe");
    create_stream(kinesis, &stream, 1).await?;
    put_sequenced_records(kinesis, &stream, 2, 5).await?;
    let arn = kinesis
        .describe_stream_summary()
        .stream_name(&stream)
        .send()
        .await?
        .stream_description_summary()
        .context("summary")?
        .stream_arn()
        .to_owned();
    let reg = kinesis
        .register_stream_consumer()
        .stream_arn(&arn)
        .consumer_name("probe")
        .send()
        .await?;
    let consumer = reg.consumer().context("consumer")?;
    println!("registered {:?}", consumer);
    let consumer_arn = consumer.consumer_arn().to_owned();
    loop {
        let d = kinesis
            .describe_stream_consumer()
            .consumer_arn(&consumer_arn)
            .send()
            .await?;
        let status = d.consumer_description().map(|c| c.consumer_status().clone());
        println!("status {status:?}");
        if status == Some(ConsumerStatus::Active) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = kinesis
        .register_stream_consumer()
        .stream_arn(&arn)
        .consumer_name("probe")
        .send()
        .await;
    println!("register again: {again:?}");
    let list = kinesis.list_stream_consumers().stream_arn(&arn).send().await?;
    println!("list: {list:?}");
    let shard = list_all_shards(kinesis, &stream).await?.remove(0);
    let started = std::time::Instant::now();
    let mut out = kinesis
        .subscribe_to_shard()
        .consumer_arn(&consumer_arn)
        .shard_id(shard.shard_id())
        .starting_position(
            StartingPosition::builder()
                .r#type(ShardIteratorType::TrimHorizon)
                .build()?,
        )
        .send()
        .await?;
    println!("subscribed after {:?}", started.elapsed());
    let second = kinesis
        .subscribe_to_shard()
        .consumer_arn(&consumer_arn)
        .shard_id(shard.shard_id())
        .starting_position(
            StartingPosition::builder()
                .r#type(ShardIteratorType::TrimHorizon)
                .build()?,
        )
        .send()
        .await;
    match second {
        Ok(mut o) => println!("second subscribe: first recv {:?}", o.event_stream.recv().await),
        Err(e) => println!("second subscribe: {e:?}"),
    }
    let mut n = 0;
    for _ in 0..4 {
        match out.event_stream.recv().await {
            Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(e))) => {
                n += e.records().len();
                println!(
                    "{:?}: {} records, cont {:?}, behind {}, children {:?}",
                    started.elapsed(),
                    e.records().len(),
                    e.continuation_sequence_number(),
                    e.millis_behind_latest(),
                    e.child_shards()
                );
            }
            other => println!("{other:?}"),
        }
    }
    ensure!(n == 10, "{n}");
    drop(out);
    let list2 = kinesis.list_stream_consumers().stream_arn(&arn).next_token("probe").send().await;
    println!("list page 2: {list2:?}");
    for wait in [300u64, 700, 1000, 1000, 2000] {
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let third = kinesis
        .subscribe_to_shard()
        .consumer_arn(&consumer_arn)
        .shard_id(shard.shard_id())
        .starting_position(
            StartingPosition::builder()
                .r#type(ShardIteratorType::Latest)
                .build()?,
        )
        .send()
        .await;
    match third {
        Ok(mut o) => println!("after drop +{wait}: first recv {:?}", o.event_stream.recv().await.map(|e| e.is_some())),
        Err(e) => println!("after drop: {e:?}"),
    }
    }
    delete_stream(kinesis, &stream).await
}
