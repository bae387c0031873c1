//! The UpdateItem expressions of the lease store's writes: conditions on
//! an owner, its tenure and a handoff, the checkpoint update (plain, or
//! the item of an exactly-once transaction) and the fence of a commit.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use kcl_core::Checkpoint;
use kcl_core::store::{CheckpointUpdate, Holder};

use crate::schema::lease as attr;

/// One UpdateItem's expressions, built with placeholders so attribute names
/// never clash with DynamoDB's reserved words.
#[derive(Debug, Default)]
pub(crate) struct Update {
    pub(crate) expression: String,
    pub(crate) condition: String,
    pub(crate) names: HashMap<String, String>,
    pub(crate) values: HashMap<String, AttributeValue>,
}

/// The value [`absent_or_null`] compares an attribute's type with: bind
/// it to the string `NULL` wherever the condition uses it.
pub const NULL_TYPE: &str = ":kclNullType";

/// `condition` with each `attribute_not_exists(#a)` of a lease attribute
/// (not the key) widened to `(attribute_not_exists(#a) OR
/// attribute_type(#a, :kclNullType))`: the reader takes a NULL attribute
/// (another tool's `None`) for absent, DynamoDB's `attribute_not_exists`
/// for present, so without this a lease whose owner is NULL is free to
/// every reader and refuses every take, and one whose handoff attributes
/// are NULL refuses its holder's checkpoints.
pub fn absent_or_null(condition: &str) -> String {
    const NOT_EXISTS: &str = "attribute_not_exists(#";
    let mut out = String::with_capacity(condition.len());
    let mut rest = condition;
    while let Some(at) = rest.find(NOT_EXISTS) {
        out.push_str(&rest[..at]);
        let after = &rest[at + NOT_EXISTS.len()..];
        let Some(end) = after.find(')') else {
            break;
        };
        let name = &after[..end];
        if name == attr::LEASE_KEY {
            out.push_str(&rest[at..at + NOT_EXISTS.len() + end + 1]);
        } else {
            out.push_str(&format!(
                "(attribute_not_exists(#{name}) OR attribute_type(#{name}, {NULL_TYPE}))"
            ));
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

impl Update {
    pub(super) fn new(expression: &str, condition: &str) -> Self {
        let mut u = Update {
            expression: expression.to_owned(),
            condition: absent_or_null(condition),
            ..Update::default()
        };
        // Bound whatever the condition; sent only if it is used.
        u.values
            .insert(NULL_TYPE.to_owned(), AttributeValue::S("NULL".to_owned()));
        // Every expression below names attributes as #attributeName.
        for a in [
            attr::LEASE_KEY,
            attr::LEASE_OWNER,
            attr::LEASE_COUNTER,
            attr::CHECKPOINT,
            attr::CHECKPOINT_SUB,
            attr::PENDING_CHECKPOINT,
            attr::PENDING_CHECKPOINT_SUB,
            attr::PENDING_CHECKPOINT_STATE,
            attr::OWNER_SWITCHES,
            attr::CHECKPOINT_OWNER,
            attr::TENURE,
            attr::CHECKPOINT_OWNER_TENURE,
            attr::CHILD_SHARD_IDS,
            attr::COMMIT_TOKEN,
            attr::FENCED_COMMITS,
            attr::THROUGHPUT_KBPS,
        ] {
            let placeholder = format!("#{a}");
            if uses(&u.expression, &placeholder) || uses(&u.condition, &placeholder) {
                u.names.insert(placeholder, a.to_owned());
            }
        }
        u
    }

    pub(super) fn s(mut self, name: &str, v: &str) -> Self {
        self.values
            .insert(name.to_owned(), AttributeValue::S(v.to_owned()));
        self
    }

    pub(super) fn n(mut self, name: &str, v: u64) -> Self {
        self.values
            .insert(name.to_owned(), AttributeValue::N(v.to_string()));
        self
    }

    /// Binds `:prev` and `:prevsub` to the checkpoint replaced, if any
    /// (see [`checkpoint_condition`]).
    fn replacing(self, replacing: Option<&Checkpoint>) -> Self {
        match replacing {
            Some(p) => self.s(":prev", p.as_str()).n(":prevsub", p.sub_sequence()),
            None => self,
        }
    }

    /// Binds `:owner` and `:tenure` to holder `by`, as the conditions of
    /// [`owned_by`], [`hands_off`] and [`checkpoint_condition`] name them.
    pub(super) fn holder(self, by: Holder<'_>) -> Self {
        self.s(":owner", by.owner).tenure(":tenure", by.tenure)
    }

    /// The values the expressions name, `None` if none: DynamoDB refuses a
    /// value no expression uses (one bound for a case the condition does
    /// not take, as a hand-back of a lease a Java KCL 3.x take left with a
    /// handoff's tenure and no handoff was), and an empty map.
    pub(crate) fn used_values(&self) -> Option<HashMap<String, AttributeValue>> {
        let used: HashMap<String, AttributeValue> = (self.values.iter())
            .filter(|(name, _)| uses(&self.expression, name) || uses(&self.condition, name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        (!used.is_empty()).then_some(used)
    }

    /// Binds `:name` when the tenure is known (see [`tenure_is`]).
    pub(super) fn tenure(self, name: &str, tenure: Option<&str>) -> Self {
        match tenure {
            Some(t) => self.s(name, t),
            None => self,
        }
    }
}

/// `#attr = :value`, or, for a holder whose lease carries no tenure
/// (written by a Java KCL worker or by kcl before tenures), that the item
/// has none either.
pub(super) fn tenure_is(attribute: &str, value: &str, tenure: Option<&str>) -> String {
    match tenure {
        Some(_) => format!("#{attribute} = {value}"),
        None => format!("attribute_not_exists(#{attribute})"),
    }
}

/// The condition that `by` owns the lease in its tenure.
pub(super) fn owned_by(by: Holder<'_>) -> String {
    format!(
        "#leaseOwner = :owner AND {}",
        tenure_is(attr::TENURE, ":tenure", by.tenure)
    )
}

/// The condition that `by` is the previous owner of a handoff in progress,
/// in the tenure the handoff recorded (a handoff recorded without one, by a
/// Java KCL leader, counts for any tenure: see [`Holder::hands_off`]).
pub(super) fn hands_off(by: Holder<'_>) -> String {
    let tenure = match by.tenure {
        Some(_) => {
            "(#kclCheckpointOwnerTenure = :tenure OR attribute_not_exists(#kclCheckpointOwnerTenure))"
        }
        None => "attribute_not_exists(#kclCheckpointOwnerTenure)",
    };
    format!("#checkpointOwner = :owner AND {tenure}")
}

/// True if `expr` uses `placeholder` as a whole token (`#checkpoint` is not
/// used by `#checkpointOwner`): DynamoDB rejects unused names.
fn uses(expr: &str, placeholder: &str) -> bool {
    expr.match_indices(placeholder).any(|(i, m)| {
        !expr[i + m.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// The UpdateItem of a checkpoint by `by`: conditional on `by` owning the
/// lease in its tenure (or handing it off), and on the checkpoint it
/// replaces. The lease store's checkpoint writes it without `commit`; the
/// transactional checkpoint of [`crate::exactly_once`] with its commit's
/// token, which it stores (the marker no plain checkpoint writes), and which
/// must not have been fenced (see [`fence_item`]).
pub(super) fn checkpoint_update(
    by: Holder<'_>,
    update: &CheckpointUpdate,
    commit: Option<&str>,
) -> Update {
    let mut set = vec![
        "#checkpoint = :cp",
        "#checkpointSubSequenceNumber = :sub",
        "#ownerSwitchesSinceCheckpoint = :zero",
    ];
    let mut remove = Vec::new();
    match &update.pending {
        Some(_) => {
            set.push("#pendingCheckpoint = :pcp");
            set.push("#pendingCheckpointSubSequenceNumber = :psub");
        }
        None => remove.extend(["#pendingCheckpoint", "#pendingCheckpointSubSequenceNumber"]),
    }
    match &update.pending_state {
        Some(_) => set.push("#pendingCheckpointState = :pstate"),
        None => remove.push("#pendingCheckpointState"),
    }
    if !update.children.is_empty() {
        set.push("#childShardIds = :children");
    }
    let mut condition = checkpoint_condition(by, update.replacing.as_ref());
    // Every fenced attempt was conditional on the checkpoint it replaced,
    // and checkpoints only move forward: once one moves past it (a commit
    // or a plain checkpoint), none of them can land any more, and the
    // fence set is cleared rather than left to grow.
    let moves = update
        .replacing
        .as_ref()
        .is_some_and(|p| *p != update.checkpoint);
    if commit.is_some() || moves {
        remove.push("#kclFencedCommits");
    }
    if commit.is_some() {
        set.push("#kclCommitToken = :token");
        condition.push_str(" AND NOT contains(#kclFencedCommits, :token)");
    }
    let mut expression = format!("SET {}", set.join(", "));
    if !remove.is_empty() {
        expression.push_str(&format!(" REMOVE {}", remove.join(", ")));
    }
    let mut full = Update::new(&expression, &condition)
        .holder(by)
        .replacing(update.replacing.as_ref())
        .s(":cp", update.checkpoint.as_str())
        .n(":sub", update.checkpoint.sub_sequence())
        .n(":zero", 0);
    if let Some(p) = &update.pending {
        full = full.s(":pcp", p.as_str()).n(":psub", p.sub_sequence());
    }
    if let Some(state) = &update.pending_state {
        full.values.insert(
            ":pstate".into(),
            AttributeValue::B(Blob::new(state.clone())),
        );
    }
    if !update.children.is_empty() {
        full.values.insert(
            ":children".into(),
            AttributeValue::Ss(update.children.iter().cloned().collect()),
        );
    }
    if let Some(token) = commit {
        full = full.s(":token", token);
    }
    full
}

/// The condition of a checkpoint by `by` replacing `replacing`: `by` owns
/// the lease in its tenure (or hands it off), and the checkpoint is still
/// the one replaced. Binds `:owner`, `:tenure`, `:prev` and `:prevsub`.
fn checkpoint_condition(by: Holder<'_>, replacing: Option<&Checkpoint>) -> String {
    let mut condition = format!(
        "(({}) OR (attribute_not_exists(#checkpointOwner) AND {}))",
        hands_off(by),
        owned_by(by)
    );
    // Items the Java KCL wrote before it stored sub-sequence numbers lack
    // the attribute, which means 0.
    match replacing {
        Some(p) if p.sub_sequence() == 0 => condition.push_str(
            " AND #checkpoint = :prev AND (#checkpointSubSequenceNumber = :prevsub \
                 OR attribute_not_exists(#checkpointSubSequenceNumber))",
        ),
        Some(_) => condition
            .push_str(" AND #checkpoint = :prev AND #checkpointSubSequenceNumber = :prevsub"),
        None => {}
    }
    condition
}

/// A checkpoint of lease `key` by `by` as one item of the TransactWriteItems
/// of exactly-once commit `token`, returning the lease item if its
/// condition fails (to tell what happened to the commit).
pub(crate) fn checkpoint_transact_item(
    table: &str,
    key: &str,
    by: Holder<'_>,
    update: &CheckpointUpdate,
    token: &str,
) -> Result<aws_sdk_dynamodb::types::TransactWriteItem, aws_sdk_dynamodb::error::BuildError> {
    let item = sdk_update(table, key, checkpoint_update(by, update, Some(token)))?;
    Ok(aws_sdk_dynamodb::types::TransactWriteItem::builder()
        .update(item)
        .build())
}

/// The UpdateItem that fences exactly-once commit `token` of `by`,
/// replacing `replacing`: it adds the token to `kclFencedCommits`, under
/// the commit's own lease condition. If it lands, the commit had not (it
/// would have moved the checkpoint) and never will (its condition now
/// fails); if its condition fails, the lease item returned tells why.
pub(crate) fn fence_item(
    table: &str,
    key: &str,
    by: Holder<'_>,
    replacing: Option<&Checkpoint>,
    token: &str,
) -> Result<aws_sdk_dynamodb::types::Update, aws_sdk_dynamodb::error::BuildError> {
    let mut fence = Update::new(
        "ADD #kclFencedCommits :fence",
        &checkpoint_condition(by, replacing),
    )
    .holder(by)
    .replacing(replacing);
    fence
        .values
        .insert(":fence".into(), AttributeValue::Ss(vec![token.to_owned()]));
    sdk_update(table, key, fence)
}

/// `u` on lease `key`, as the SDK's update, returning the lease item if its
/// condition fails.
fn sdk_update(
    table: &str,
    key: &str,
    u: Update,
) -> Result<aws_sdk_dynamodb::types::Update, aws_sdk_dynamodb::error::BuildError> {
    let values = u.used_values();
    aws_sdk_dynamodb::types::Update::builder()
        .table_name(table)
        .set_key(Some(super::DynamoDbLeaseStore::key(key)))
        .update_expression(u.expression)
        .condition_expression(u.condition)
        .set_expression_attribute_names(Some(u.names))
        .set_expression_attribute_values(values)
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .build()
}

pub(super) fn owner_condition(owner: Option<&str>) -> &'static str {
    match owner {
        Some(_) => "#leaseOwner = :old",
        None => "attribute_not_exists(#leaseOwner)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the values an expression names are sent (a name that merely
    /// starts with another's is not a use of it), and none at all as no map.
    #[test]
    fn values_no_expression_names_are_not_sent() {
        let u = Update::new("SET #checkpoint = :cp", "#leaseCounter = :counter")
            .s(":cp", "17")
            .n(":counter", 3)
            .s(":seenFromTenure", "i1.0")
            .s(":c", "a prefix of both");
        let mut used: Vec<String> = u.used_values().unwrap().into_keys().collect();
        used.sort();
        assert_eq!(used, [":counter", ":cp"]);
        let none = Update::new("REMOVE #leaseOwner", "attribute_exists(#leaseKey)");
        assert_eq!(none.used_values(), None);
    }
}
