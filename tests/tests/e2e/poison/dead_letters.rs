//! The dead-letter stream on the Kinesis emulator: a failed record of
//! Kinesis's maximum size (1 MiB), which cannot go whole into one record
//! with its metadata, is written in parts the service accepts, and read
//! back whole.

use std::time::SystemTime;

use kcl_core::poison::{FailedRecord, FailureDestination, FailureReason};
use kcl_core::processor::ShardContext;
use kcl_kinesis::{KinesisDestination, reassemble_dead_letters};
use kcl_tests::{TestEnv, create_stream, list_all_shards, read_shard, unique_name};

const MIB: usize = 1024 * 1024;

#[tokio::test]
async fn a_1_mib_failed_record_goes_to_the_dead_letter_stream_whole() {
    let env = TestEnv::connect().await.unwrap();
    let stream = unique_name("kcl-dead-letters");
    create_stream(env.kinesis(), &stream, 1).await.unwrap();
    let data: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let failed = FailedRecord::new(
        ShardContext {
            stream: "orders".into(),
            shard_id: "shardId-000000000000".into(),
            lease_key: "shardId-000000000000".into(),
            worker_id: "w-1".into(),
            lane: None,
        },
        kcl_core::Record {
            data: data.clone().into(),
            partition_key: "customer-7".into(),
            explicit_hash_key: None,
            sequence_number: "4959".into(),
            sub_sequence_number: 0,
            approximate_arrival: Some(SystemTime::now()),
            aggregated: false,
        },
        "e".repeat(20_000),
        3,
        FailureReason::MaxAttempts,
    );
    KinesisDestination::new(env.kinesis().clone(), &stream)
        .send(&[failed])
        .await
        .unwrap();

    let shards = list_all_shards(env.kinesis(), &stream).await.unwrap();
    let records = read_shard(env.kinesis(), &stream, shards[0].shard_id())
        .await
        .unwrap();
    assert_eq!(records.len(), 2, "two parts");
    let letters = reassemble_dead_letters(records.iter().map(|r| r.data().as_ref())).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].id, "orders/shardId-000000000000/4959/0");
    assert!(letters[0].data.as_ref() == data.as_slice(), "byte for byte");
    assert_eq!(
        letters[0].document["error"].as_str().unwrap().len(),
        8 * 1024
    );
}
