//! The commit against a fake DynamoDB (answers scripted per request, or
//! none at all), in paused time.

use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::Put;
use kcl_core::store::LeaseStore as _;
use kcl_core::store::memory::InMemoryLeaseStore;
use kcl_core::{Holder, Lease, LeaseHandle};
use serde_json::{Value, json};

use super::*;
use crate::fake::FakeDynamoDb;

/// A checkpointer of lease `shard-1` held by `w-1` in tenure `t-1`, at
/// TRIM_HORIZON, handed records up to `100/5`.
async fn checkpointer() -> Checkpointer {
    let store = InMemoryLeaseStore::new();
    let lease = store
        .create_if_absent(&Lease::new("shard-1", Checkpoint::TrimHorizon))
        .await
        .unwrap();
    let lease = store.take(&lease, Holder::new("w-1", "t-1")).await.unwrap();
    let handle = LeaseHandle::detached(lease, Duration::from_secs(24 * 3600));
    let mut cp = Checkpointer::for_test(Arc::new(store), handle);
    cp.delivered_for_test("100", 5);
    cp
}

fn record(seq: &str, sub: u64) -> Record {
    Record {
        data: Default::default(),
        partition_key: "pk".into(),
        explicit_hash_key: None,
        sequence_number: seq.into(),
        sub_sequence_number: sub,
        approximate_arrival: None,
        aggregated: sub > 0,
    }
}

/// The lease item of `shard-1` held by `w-1` in `t-1` at `100/3`, with the
/// commit token `token` if any.
fn lease_item_at_100_3(token: Option<&str>) -> Value {
    let mut item = json!({
        "leaseKey": {"S": "shard-1"},
        "leaseOwner": {"S": "w-1"},
        "kclTenure": {"S": "t-1"},
        "leaseCounter": {"N": "2"},
        "checkpoint": {"S": "100"},
        "checkpointSubSequenceNumber": {"N": "3"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"}
    });
    if let Some(token) = token {
        item["kclCommitToken"] = json!({"S": token});
    }
    item
}

/// DynamoDB's answer to a transaction of one item and the lease's
/// checkpoint whose lease condition failed on `lease`.
fn lease_condition_failed(lease: Value) -> Option<(u16, Value)> {
    Some((
        400,
        json!({
            "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
            "Message": "Transaction cancelled, please refer cancellation reasons for specific reasons [None, ConditionalCheckFailed]",
            "CancellationReasons": [
                {"Code": "None"},
                {"Code": "ConditionalCheckFailed", "Message": "The conditional request failed", "Item": lease}
            ]
        }),
    ))
}

/// Commits one put through record 100/3, failing the test if the commit
/// waits for an hour of paused time: nothing else bounds it without the
/// attempt timeout and the deadline.
async fn commit(eo: &ExactlyOnce, cp: &mut Checkpointer) -> Result<(), TransactionError> {
    let through = record("100", 3);
    tokio::time::timeout(
        Duration::from_secs(3600),
        eo.commit(cp, one_put(), &through),
    )
    .await
    .expect("the commit waited for an answer that never came")
}

/// Asserts that `e` gave the commit up with its retries spent, saying `says`.
fn assert_gave_up(e: &TransactionError, says: &str) {
    assert!(
        matches!(
            e,
            TransactionError::Failed { message, retries_exhausted: true }
                if message.contains(says)
        ),
        "{e}"
    );
}

fn one_put() -> Transaction {
    let mut tx = Transaction::new();
    tx.push(put(10)).unwrap();
    tx
}

#[tokio::test(start_paused = true)]
async fn a_plain_checkpoint_that_landed_with_its_answer_lost_does_not_count_as_the_commit() {
    // A plain checkpoint to 100/3 landed, its answer lost: the lease shows
    // 100/3 in this tenure, but no commit's token.
    let dynamodb = FakeDynamoDb::new(|op, _| match op {
        "TransactWriteItems" => lease_condition_failed(lease_item_at_100_3(None)),
        _ => None,
    });
    let eo = ExactlyOnce::new(dynamodb.client(), "leases");
    let mut cp = checkpointer().await;

    let e = commit(&eo, &mut cp).await.unwrap_err();

    assert!(
        matches!(
            &e,
            TransactionError::CheckpointMoved { checkpoint, .. }
                if *checkpoint == Checkpoint::at("100", 3)
        ),
        "{e}"
    );
    // The checkpointer learnt where the lease is: a redelivered batch skips
    // what the plain checkpoint covered instead of committing it again.
    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("100", 3));
    assert!(cp.is_checkpointed(&record("100", 3)));
    assert!(!cp.is_checkpointed(&record("100", 4)));
    assert_eq!(dynamodb.operations(), ["TransactWriteItems"]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_finds_the_commits_own_token_counts_as_applied() {
    // The first attempt lands but never answers; its retry fails the lease
    // condition, and the lease shows this commit's token.
    let answered = Arc::new(Mutex::new(0_usize));
    let dynamodb = {
        let answered = Arc::clone(&answered);
        FakeDynamoDb::new(move |op, body| {
            if op != "TransactWriteItems" {
                return None;
            }
            let mut n = answered.lock().unwrap();
            *n += 1;
            if *n == 1 {
                return None;
            }
            let token = body["ClientRequestToken"].as_str().unwrap();
            lease_condition_failed(lease_item_at_100_3(Some(token)))
        })
    };
    let eo = ExactlyOnce::new(dynamodb.client(), "leases").attempt_timeout(Duration::from_secs(1));
    let mut cp = checkpointer().await;

    commit(&eo, &mut cp).await.unwrap();

    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("100", 3));
    let tokens: Vec<Value> = dynamodb
        .bodies("TransactWriteItems")
        .iter()
        .map(|b| b["ClientRequestToken"].clone())
        .collect();
    assert_eq!(tokens.len(), 2);
    assert_eq!(tokens[0], tokens[1], "every attempt carries one token");
}

#[tokio::test(start_paused = true)]
async fn a_transaction_that_never_answers_is_cut_by_the_attempt_timeout_and_given_up_by_the_deadline()
 {
    let dynamodb = FakeDynamoDb::new(|_, _| None);
    let deadline = Duration::from_secs(10);
    let eo = ExactlyOnce::new(dynamodb.client(), "leases")
        .attempts(3)
        .attempt_timeout(Duration::from_secs(1))
        .deadline(deadline);
    let mut cp = checkpointer().await;
    let started = Instant::now();

    let e = commit(&eo, &mut cp).await.unwrap_err();
    assert_gave_up(&e, "unknown");
    assert!(started.elapsed() <= deadline, "{:?}", started.elapsed());
    assert_eq!(dynamodb.bodies("TransactWriteItems").len(), 3);
    let ops = dynamodb.operations();
    assert!(
        ops[3..].iter().all(|op| op == "UpdateItem") && ops.len() > 3,
        "settled after the last attempt: {ops:?}"
    );
    assert_eq!(
        cp.last_checkpoint(),
        &Checkpoint::TrimHorizon,
        "nothing known moved"
    );
}

#[tokio::test(start_paused = true)]
async fn a_commit_without_a_verdict_is_reported_not_committed_only_once_its_token_is_fenced() {
    // Every attempt is given up on unanswered; the fence lands.
    let dynamodb = FakeDynamoDb::new(|op, _| match op {
        "UpdateItem" => Some((200, json!({}))),
        _ => None,
    });
    let eo = ExactlyOnce::new(dynamodb.client(), "leases")
        .attempts(2)
        .attempt_timeout(Duration::from_secs(1));
    let mut cp = checkpointer().await;

    let e = commit(&eo, &mut cp).await.unwrap_err();

    assert_gave_up(&e, "not committed");
    assert_eq!(
        dynamodb.operations(),
        ["TransactWriteItems", "TransactWriteItems", "UpdateItem"]
    );
    // The fence names the commit's token, under the checkpoint condition
    // the transaction had; every attempt's lease item refuses a fenced
    // token.
    let attempts = dynamodb.bodies("TransactWriteItems");
    let token = attempts[0]["ClientRequestToken"].clone();
    let fence = &dynamodb.bodies("UpdateItem")[0];
    assert_eq!(fence["ExpressionAttributeValues"][":fence"]["SS"][0], token);
    assert_eq!(
        fence["ExpressionAttributeValues"][":prev"]["S"],
        "TRIM_HORIZON"
    );
    for attempt in &attempts {
        let lease = &attempt["TransactItems"][1]["Update"];
        assert!(
            lease["ConditionExpression"]
                .as_str()
                .unwrap()
                .contains("NOT contains(#kclFencedCommits, :token)"),
            "{lease}"
        );
        assert_eq!(lease["ExpressionAttributeValues"][":token"]["S"], token);
    }
}

#[tokio::test(start_paused = true)]
async fn a_fence_refused_because_the_commit_landed_counts_as_applied() {
    // The attempts are given up on unanswered, but one of them landed: the
    // fence's condition fails on a lease showing the commit's token.
    let token = Arc::new(Mutex::new(String::new()));
    let dynamodb = {
        let token = Arc::clone(&token);
        FakeDynamoDb::new(move |op, body| match op {
            "TransactWriteItems" => {
                *token.lock().unwrap() = body["ClientRequestToken"].as_str()?.to_owned();
                None
            }
            "UpdateItem" => Some((
                400,
                json!({
                    "__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                    "message": "The conditional request failed",
                    "Item": lease_item_at_100_3(Some(&token.lock().unwrap()))
                }),
            )),
            _ => None,
        })
    };
    let eo = ExactlyOnce::new(dynamodb.client(), "leases")
        .attempts(1)
        .attempt_timeout(Duration::from_secs(1));
    let mut cp = checkpointer().await;

    commit(&eo, &mut cp).await.unwrap();

    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("100", 3));
    assert_eq!(dynamodb.operations(), ["TransactWriteItems", "UpdateItem"]);
}

/// DynamoDB's answer to a transaction of one item and the lease's
/// checkpoint whose own item's condition failed.
fn user_condition_failed() -> Option<(u16, Value)> {
    Some((
        400,
        json!({
            "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
            "Message": "Transaction cancelled, please refer cancellation reasons for specific reasons [ConditionalCheckFailed, None]",
            "CancellationReasons": [
                {"Code": "ConditionalCheckFailed", "Message": "The conditional request failed"},
                {"Code": "None"}
            ]
        }),
    ))
}

/// The fence's answer when the commit with `token` had landed: its
/// condition fails on a lease showing the commit's token.
fn fence_finds_the_commit(token: &str) -> Option<(u16, Value)> {
    Some((
        400,
        json!({
            "__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
            "message": "The conditional request failed",
            "Item": lease_item_at_100_3(Some(token))
        }),
    ))
}

/// A fake whose first transaction never answers, whose later ones fail
/// the application's own condition, and whose fence answers `fence`
/// (given the commit's token).
fn first_unanswered_then_condition_failed(
    fence: impl Fn(&str) -> Option<(u16, Value)> + Send + Sync + 'static,
) -> FakeDynamoDb {
    first_answered_then_condition_failed(None, fence)
}

/// Like [`first_unanswered_then_condition_failed`], the first transaction
/// answered `first` (`None`: no answer).
fn first_answered_then_condition_failed(
    first: Option<(u16, Value)>,
    fence: impl Fn(&str) -> Option<(u16, Value)> + Send + Sync + 'static,
) -> FakeDynamoDb {
    let token = Arc::new(Mutex::new(String::new()));
    let attempts = Arc::new(Mutex::new(0_usize));
    FakeDynamoDb::new(move |op, body| match op {
        "TransactWriteItems" => {
            *token.lock().unwrap() = body["ClientRequestToken"].as_str()?.to_owned();
            let mut n = attempts.lock().unwrap();
            *n += 1;
            if *n == 1 {
                first.clone()
            } else {
                user_condition_failed()
            }
        }
        "UpdateItem" => fence(&token.lock().unwrap()),
        _ => None,
    })
}

/// A later attempt's definite failure (the application's own condition)
/// says nothing of an earlier attempt that got no answer: the commit is
/// settled before it is reported. Here the first attempt had landed, and
/// the commit counts as applied; it used to be reported as not written.
#[tokio::test(start_paused = true)]
async fn a_failure_after_an_unanswered_attempt_is_reported_only_once_settled() {
    let dynamodb = first_unanswered_then_condition_failed(fence_finds_the_commit);
    let eo = ExactlyOnce::new(dynamodb.client(), "leases").attempt_timeout(Duration::from_secs(1));
    let mut cp = checkpointer().await;

    commit(&eo, &mut cp).await.unwrap();

    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("100", 3));
    assert_eq!(
        dynamodb.operations(),
        ["TransactWriteItems", "TransactWriteItems", "UpdateItem"]
    );
}

/// ... and when the fence lands, no attempt can land any more: the
/// failure is reported as it was.
#[tokio::test(start_paused = true)]
async fn a_failure_after_an_unanswered_attempt_stands_once_the_fence_lands() {
    let dynamodb = first_unanswered_then_condition_failed(|_| Some((200, json!({}))));
    let eo = ExactlyOnce::new(dynamodb.client(), "leases").attempt_timeout(Duration::from_secs(1));
    let mut cp = checkpointer().await;

    let e = commit(&eo, &mut cp).await.unwrap_err();

    assert!(
        matches!(e, TransactionError::ConditionFailed { index: 0, .. }),
        "{e}"
    );
    assert_eq!(cp.last_checkpoint(), &Checkpoint::TrimHorizon);
    assert_eq!(
        dynamodb.operations(),
        ["TransactWriteItems", "TransactWriteItems", "UpdateItem"]
    );
}

/// A 5xx may have been applied too (as a TransactionInProgress is still
/// being applied): a definite failure after one is settled before it is
/// reported, and the fence finding the commit counts as applied.
#[tokio::test(start_paused = true)]
async fn a_failure_after_a_5xx_is_reported_only_once_settled() {
    let internal = json!({
        "__type": "com.amazonaws.dynamodb.v20120810#InternalServerError",
        "message": "Internal server error"
    });
    let dynamodb =
        first_answered_then_condition_failed(Some((500, internal)), fence_finds_the_commit);
    let eo = ExactlyOnce::new(dynamodb.client(), "leases").attempt_timeout(Duration::from_secs(1));
    let mut cp = checkpointer().await;

    commit(&eo, &mut cp).await.unwrap();

    assert_eq!(cp.last_checkpoint(), &Checkpoint::at("100", 3));
    let transactions = dynamodb.bodies("TransactWriteItems").len();
    assert!(transactions >= 2, "{transactions}");
    assert_eq!(
        dynamodb.operations().last().map(String::as_str),
        Some("UpdateItem")
    );
}

fn put(bytes: usize) -> TransactWriteItem {
    TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name("t")
                .item("id", AttributeValue::S("k".into()))
                .item("blob", AttributeValue::S("x".repeat(bytes)))
                .build()
                .unwrap(),
        )
        .build()
}

#[test]
fn a_transaction_keeps_room_for_its_checkpoint_and_refuses_what_passes_the_limits() {
    let mut tx = Transaction::new();
    for _ in 0..MAX_ITEMS - 1 {
        tx.push(put(10)).unwrap();
    }
    assert_eq!(tx.room(), 0);
    let e = tx.push(put(10)).unwrap_err();
    assert!(
        matches!(e, TransactionError::TooLarge { items: 101, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("commit at a record"), "{e}");
    assert_eq!(tx.len(), MAX_ITEMS - 1, "left as it was");

    let mut big = Transaction::new();
    for _ in 0..10 {
        big.push(put(400_000)).unwrap();
    }
    let e = big.push(put(400_000)).unwrap_err();
    assert!(matches!(e, TransactionError::TooLarge { .. }), "{e}");

    // One item past DynamoDB's item limit is named before anything is
    // sent (DynamoDB refused the whole commit with a generic failure).
    let mut one = Transaction::new();
    one.push(put(10)).unwrap();
    let e = one.push(put(500_000)).unwrap_err();
    assert!(
        matches!(e, TransactionError::ItemTooLarge { index: 1, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("409600"), "{e}");
    assert_eq!(one.len(), 1, "left as it was");
    // Numbers take about one byte per two digits: a set whose text passes
    // the limit but whose count does not is accepted.
    let numbers: Vec<String> = (0..41_000u64)
        .map(|i| format!("{}", 1_000_000_000 + i))
        .collect();
    let set = TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name("t")
                .item("pk", AttributeValue::S("n".into()))
                .item("ns", AttributeValue::Ns(numbers))
                .build()
                .unwrap(),
        )
        .build();
    Transaction::new()
        .push(set)
        .expect("about 250 KB as DynamoDB counts");
}
