//! Several leases' checkpoints in one `BatchExecuteStatement`.
//!
//! A checkpoint policy makes a worker's shards due together (see
//! `kcl_core::checkpointer`), and their writes go as one request of up to
//! 25 PartiQL `UPDATE`s instead of one `UpdateItem` each. DynamoDB bills
//! each statement as the single write it stands for (one write unit per
//! KB of the item), so the bill stays and the requests drop.
//!
//! Each statement is the single checkpoint's [`Update`] translated, not
//! written a second time: the same `SET` and `REMOVE` and the same
//! condition in its `WHERE`, so the two cannot drift apart. A statement
//! that fails comes back as an error of its own (a failed condition
//! without the item: the caller writes it again through `checkpoint`,
//! which reconciles a replay). A table that refuses the request for good
//! (an IAM policy without `dynamodb:PartiQLUpdate`) turns batches off for
//! the store's life, after one warning: the caller then writes each
//! checkpoint alone.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeValue, BatchStatementError, BatchStatementErrorCodeEnum, BatchStatementRequest,
    BatchStatementResponse, ReturnConsumedCapacity,
};
use kcl_core::store::{CheckpointWrite, StoreError, StoreOp};
use tracing::warn;

use super::update::NULL_TYPE;
use super::{DynamoDbLeaseStore, Update, checkpoint_update};
use crate::error::unconditional_error;
use crate::schema::lease as attr;

/// The most statements DynamoDB takes in one `BatchExecuteStatement`.
const MAX_STATEMENTS: usize = 25;

/// Writes `writes` in requests of [`MAX_STATEMENTS`], side by side. A write
/// the translation does not cover (a commit), a second write of the same
/// lease (DynamoDB refuses a batch that names an item twice) and every
/// write once the table refused PartiQL are answered unsent, for the
/// caller to write alone.
pub(super) async fn checkpoint_many(
    store: &DynamoDbLeaseStore,
    writes: &[CheckpointWrite<'_>],
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    let mut answers: Vec<Result<(), StoreError>> = writes.iter().map(|_| Err(unsent())).collect();
    if store.partiql_refused.load(Ordering::Relaxed) {
        return Ok(answers);
    }
    let mut batch: Vec<(usize, BatchStatementRequest)> = Vec::new();
    let mut keys = HashSet::new();
    for (i, w) in writes.iter().enumerate() {
        if let Some(r) = request(&store.table, w).filter(|_| keys.insert(w.key)) {
            batch.push((i, r));
        }
    }
    let sent = futures::future::join_all(batch.chunks(MAX_STATEMENTS).map(|chunk| {
        let keys: Vec<&str> = chunk.iter().map(|(i, _)| writes[*i].key).collect();
        let statements = chunk.iter().map(|(_, r)| r.clone()).collect();
        async move { send(store, &keys, statements).await }
    }))
    .await;
    for (chunk, results) in batch.chunks(MAX_STATEMENTS).zip(sent) {
        match results {
            Ok(results) => {
                for ((i, _), result) in chunk.iter().zip(results) {
                    answers[*i] = result;
                }
            }
            // The request failed as a whole: any of its writes may have
            // landed.
            Err(e) if e.is_retryable() => {
                for (i, _) in chunk {
                    answers[*i] = Err(StoreError::retryable(
                        StoreOp::CheckpointMany,
                        e.to_string(),
                    ));
                }
            }
            // Refused for good (left unsent).
            Err(_) => {}
        }
    }
    Ok(answers)
}

/// The answer of a write not sent in a batch.
fn unsent() -> StoreError {
    StoreError::retryable(
        StoreOp::CheckpointMany,
        "not sent in a batch: write it alone",
    )
}

/// One request. A refusal that retrying will not change (access denied,
/// a statement the table does not take), of the request or of every
/// statement in it, turns batches off for the store's life, with one
/// warning: from then on its checkpoints go one by one.
async fn send(
    store: &DynamoDbLeaseStore,
    keys: &[&str],
    statements: Vec<BatchStatementRequest>,
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    let op = StoreOp::CheckpointMany;
    let sent = store
        .client
        .batch_execute_statement()
        .set_statements(Some(statements))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    let out = match sent {
        Ok(out) => out,
        Err(e) => {
            let refused = matches!(
                e.code(),
                Some("AccessDeniedException" | "ValidationException")
            );
            let e = unconditional_error(op, &store.table, keys[0], e);
            if refused {
                refuse(store, &e);
            }
            return Err(e);
        }
    };
    for capacity in out.consumed_capacity() {
        store.record_capacity(op, Some(capacity));
    }
    let responses = out.responses();
    if responses.len() != keys.len() {
        return Err(StoreError::retryable(
            op,
            format!("{} answers to {} statements", responses.len(), keys.len()),
        ));
    }
    let answers: Vec<Result<(), StoreError>> = responses
        .iter()
        .zip(keys)
        .map(|(r, key)| r.error().map_or(Ok(()), |e| Err(statement_error(key, e))))
        .collect();
    // Every statement refused as such (not a condition, not a throttle):
    // the table takes no PartiQL writes from this worker.
    let refused = |r: &BatchStatementResponse| {
        matches!(
            r.error().and_then(BatchStatementError::code),
            Some(
                BatchStatementErrorCodeEnum::AccessDenied
                    | BatchStatementErrorCodeEnum::ValidationError
                    | BatchStatementErrorCodeEnum::ResourceNotFound
            )
        )
    };
    if responses.iter().all(refused)
        && let Some(Err(e)) = answers.first()
    {
        refuse(store, e);
    }
    Ok(answers)
}

/// Turns batches off for `store`'s life, warning once: the table refused
/// them with `e`, which retrying will not change.
fn refuse(store: &DynamoDbLeaseStore, e: &StoreError) {
    if !store.partiql_refused.swap(true, Ordering::Relaxed) {
        warn!(
            table = %store.table,
            error = %e,
            "BatchExecuteStatement was refused; checkpoints of a policy go one request each \
             from now on (grant dynamodb:PartiQLUpdate on the lease table to write them \
             together)"
        );
    }
}

/// The store's error for one statement's failure.
fn statement_error(key: &str, e: &BatchStatementError) -> StoreError {
    let op = StoreOp::CheckpointMany;
    let what = format!(
        "statement on {key:?} failed: {:?} {}",
        e.code(),
        e.message().unwrap_or_default()
    );
    match e.code() {
        Some(BatchStatementErrorCodeEnum::ConditionalCheckFailed) => StoreError::ConditionFailed {
            key: key.to_owned(),
            current: None,
        },
        Some(
            BatchStatementErrorCodeEnum::ProvisionedThroughputExceeded
            | BatchStatementErrorCodeEnum::RequestLimitExceeded
            | BatchStatementErrorCodeEnum::ThrottlingError,
        ) => StoreError::Throttled {
            op,
            source: what.into(),
        },
        // Anything else is written again alone, which names it properly.
        _ => StoreError::retryable(op, what),
    }
}

/// The single checkpoint of `w` as a batch statement, if it translates.
fn request(table: &str, w: &CheckpointWrite<'_>) -> Option<BatchStatementRequest> {
    let (statement, parameters) =
        statement(table, w.key, &checkpoint_update(w.by, w.update, None))?;
    BatchStatementRequest::builder()
        .statement(statement)
        .set_parameters(Some(parameters))
        .build()
        .ok()
}

/// `u` on lease `key` in `table` as one PartiQL `UPDATE` and its
/// positional parameters: `SET "a" = ?` for each `#a = :v` assignment,
/// `REMOVE "b"` for each removal, and the condition in the `WHERE` after
/// the key, with `attribute_not_exists(#a)` as `"a" IS MISSING`. `None`
/// for anything else (a function such as `contains`, an assignment that is
/// not a plain value).
fn statement(table: &str, key: &str, u: &Update) -> Option<(String, Vec<AttributeValue>)> {
    let quoted = |placeholder: &str| Some(format!("\"{}\"", u.names.get(placeholder)?));
    let mut parameters = Vec::new();
    let mut statement = format!("UPDATE \"{table}\"");
    let rest = u.expression.strip_prefix("SET ")?;
    let (set, remove) = match rest.split_once(" REMOVE ") {
        Some((set, remove)) => (set, Some(remove)),
        None => (rest, None),
    };
    for assignment in set.split(", ") {
        let (name, value) = assignment.split_once(" = ")?;
        statement.push_str(&format!(" SET {} = ?", quoted(name)?));
        parameters.push(u.values.get(value)?.clone());
    }
    for name in remove.into_iter().flat_map(|r| r.split(", ")) {
        statement.push_str(&format!(" REMOVE {}", quoted(name)?));
    }
    statement.push_str(&format!(" WHERE \"{}\" = ? AND (", attr::LEASE_KEY));
    parameters.push(AttributeValue::S(key.to_owned()));
    statement.push_str(&condition(
        &u.condition,
        &u.names,
        &u.values,
        &mut parameters,
    )?);
    statement.push(')');
    Some((statement, parameters))
}

/// A condition expression in PartiQL, its values appended to
/// `parameters` in the order they appear.
fn condition(
    expr: &str,
    names: &HashMap<String, String>,
    values: &HashMap<String, AttributeValue>,
    parameters: &mut Vec<AttributeValue>,
) -> Option<String> {
    let token_end = |s: &str| {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    let mut out = String::new();
    let mut rest = expr;
    while let Some(c) = rest.chars().next() {
        if let Some(inner) = rest.strip_prefix("attribute_not_exists(#") {
            let end = token_end(inner);
            out.push_str(&format!(
                "\"{}\" IS MISSING",
                names.get(&format!("#{}", &inner[..end]))?
            ));
            rest = inner[end..].strip_prefix(')')?;
        } else if let Some(inner) = rest.strip_prefix("attribute_type(#") {
            // Only the NULL test of `absent_or_null`, with its type as a
            // literal: PartiQL's attribute_type takes one.
            let end = token_end(inner);
            let name = names.get(&format!("#{}", &inner[..end]))?;
            let tail = format!(", {NULL_TYPE})");
            rest = inner[end..].strip_prefix(tail.as_str())?;
            out.push_str(&format!("attribute_type(\"{name}\", 'NULL')"));
        } else if let Some(inner) = rest.strip_prefix('#') {
            let end = token_end(inner);
            out.push_str(&format!(
                "\"{}\"",
                names.get(&format!("#{}", &inner[..end]))?
            ));
            rest = &inner[end..];
        } else if let Some(inner) = rest.strip_prefix(':') {
            let end = token_end(inner);
            parameters.push(values.get(&format!(":{}", &inner[..end]))?.clone());
            out.push('?');
            rest = &inner[end..];
        } else if c.is_ascii_alphabetic() {
            // Only the operators; a function (contains, size, ...) is not
            // translated.
            let end = token_end(rest);
            let word = &rest[..end];
            if !matches!(word, "AND" | "OR" | "NOT") {
                return None;
            }
            out.push_str(word);
            rest = &rest[end..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use kcl_core::Checkpoint;
    use kcl_core::store::{CheckpointUpdate, Holder, LeaseStore};

    use super::*;

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.to_owned())
    }

    fn n(v: u64) -> AttributeValue {
        AttributeValue::N(v.to_string())
    }

    #[test]
    fn a_checkpoint_translates_to_one_update_with_its_condition_in_the_where() {
        let update = CheckpointUpdate::to(Checkpoint::parse("200", 0).unwrap())
            .replacing(Checkpoint::parse("100", 0).unwrap());
        let by = Holder::new("w-1", "t-1");
        let (statement, parameters) =
            statement("app", "shard-1", &checkpoint_update(by, &update, None)).unwrap();
        assert_eq!(
            statement,
            "UPDATE \"app\" SET \"checkpoint\" = ? SET \"checkpointSubSequenceNumber\" = ? \
             SET \"ownerSwitchesSinceCheckpoint\" = ? REMOVE \"pendingCheckpoint\" \
             REMOVE \"pendingCheckpointSubSequenceNumber\" REMOVE \"pendingCheckpointState\" \
             REMOVE \"kclFencedCommits\" WHERE \"leaseKey\" = ? AND (((\"checkpointOwner\" = ? \
             AND (\"kclCheckpointOwnerTenure\" = ? OR (\"kclCheckpointOwnerTenure\" IS MISSING \
             OR attribute_type(\"kclCheckpointOwnerTenure\", 'NULL')))) \
             OR ((\"checkpointOwner\" IS MISSING OR attribute_type(\"checkpointOwner\", 'NULL')) \
             AND \"leaseOwner\" = ? AND \"kclTenure\" = ?)) \
             AND \"checkpoint\" = ? AND (\"checkpointSubSequenceNumber\" = ? \
             OR (\"checkpointSubSequenceNumber\" IS MISSING \
             OR attribute_type(\"checkpointSubSequenceNumber\", 'NULL'))))"
        );
        assert_eq!(
            parameters,
            [
                s("200"),
                n(0),
                n(0),
                s("shard-1"),
                s("w-1"),
                s("t-1"),
                s("w-1"),
                s("t-1"),
                s("100"),
                n(0),
            ]
        );
    }

    /// Two writes through a store on a fake endpoint answering every
    /// `BatchExecuteStatement` with `status` and `body`, twice: each time
    /// both are answered unsent (for the caller to write alone), and the
    /// endpoint is asked once, then not again.
    async fn refused_twice(status: u16, body: serde_json::Value) {
        use crate::fake::FakeDynamoDb;
        let dynamodb = FakeDynamoDb::new(move |op, _| {
            (op == "BatchExecuteStatement").then(|| (status, body.clone()))
        });
        let store = DynamoDbLeaseStore::new(dynamodb.client(), "app");
        let update = CheckpointUpdate::to(Checkpoint::parse("200", 0).unwrap())
            .replacing(Checkpoint::parse("100", 0).unwrap());
        let by = Holder::new("w-1", "t-1");
        let writes = ["shard-1", "shard-2"].map(|key| CheckpointWrite {
            key,
            by,
            update: &update,
        });
        for _ in 0..2 {
            let answers = store.checkpoint_many(&writes).await.unwrap();
            assert!(
                answers
                    .iter()
                    .all(|a| a.as_ref().is_err_and(StoreError::is_retryable)),
                "answered unsent: {answers:?}"
            );
        }
        assert_eq!(dynamodb.operations(), ["BatchExecuteStatement"]);
    }

    /// A table whose policy refuses PartiQL writes turns batches off for
    /// good.
    #[tokio::test]
    async fn a_refused_batch_turns_batches_off_for_good() {
        let denied = serde_json::json!({
            "__type": "com.amazonaws.dynamodb.v20120810#AccessDeniedException",
            "message": "not authorized to perform: dynamodb:PartiQLUpdate"
        });
        refused_twice(400, denied).await;
    }

    /// The same when the request is answered but every statement in it is
    /// refused (DynamoDB may report a missing permission per statement).
    #[tokio::test]
    async fn statements_all_refused_turn_batches_off_for_good() {
        let denied = serde_json::json!({"Error": {"Code": "AccessDenied", "Message": "no"}});
        let body = serde_json::json!({"Responses": [denied.clone(), denied]});
        refused_twice(200, body).await;
    }

    #[test]
    fn a_condition_with_a_function_is_not_translated() {
        let update = CheckpointUpdate::to(Checkpoint::parse("200", 0).unwrap());
        let commit = checkpoint_update(Holder::new("w-1", "t-1"), &update, Some("token"));
        assert!(statement("app", "shard-1", &commit).is_none());
    }
}
