//! The table definitions in `deploy/` (CloudFormation and Terraform) give
//! each table the key the store reads and writes: a deployment that creates
//! its tables itself (`TableCreation::Never`) must not discover a wrong key
//! schema at its first startup.

use std::path::PathBuf;

use kcl_dynamodb::item::attr::LEASE_KEY;
use kcl_dynamodb::liveness::attr::INSTANCE;
use serde_json::Value;

fn deploy_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// A table's hash key and its attribute definitions, as (name, type).
#[derive(Debug, PartialEq, Eq)]
struct KeySchema {
    hash_key: String,
    attributes: Vec<(String, String)>,
}

fn expected(key: &str) -> KeySchema {
    KeySchema {
        hash_key: key.to_owned(),
        attributes: vec![(key.to_owned(), "S".to_owned())],
    }
}

fn cloudformation_table(template: &Value, resource: &str) -> KeySchema {
    let properties = &template["Resources"][resource]["Properties"];
    let keys = properties["KeySchema"]
        .as_array()
        .expect("a KeySchema list");
    assert_eq!(keys.len(), 1, "{resource}: one key, a hash key");
    assert_eq!(keys[0]["KeyType"], "HASH", "{resource}");
    let attributes = properties["AttributeDefinitions"]
        .as_array()
        .expect("AttributeDefinitions")
        .iter()
        .map(|a| {
            (
                a["AttributeName"].as_str().expect("a name").to_owned(),
                a["AttributeType"].as_str().expect("a type").to_owned(),
            )
        })
        .collect();
    KeySchema {
        hash_key: keys[0]["AttributeName"]
            .as_str()
            .expect("a name")
            .to_owned(),
        attributes,
    }
}

#[test]
fn the_cloudformation_tables_have_the_keys_the_store_uses() {
    let template: Value =
        serde_json::from_str(&deploy_file("cloudformation/kcl-tables.json")).expect("JSON");
    assert_eq!(
        cloudformation_table(&template, "LeaseTable"),
        expected(LEASE_KEY)
    );
    assert_eq!(
        cloudformation_table(&template, "WorkersTable"),
        expected(INSTANCE)
    );
    // The workers' table is named as the worker looks for it.
    assert_eq!(
        template["Resources"]["WorkersTable"]["Properties"]["TableName"]["Fn::Sub"],
        format!(
            "${{LeaseTableName}}{}",
            kcl_dynamodb::table::workers_table_for("")
        )
    );
}

fn terraform_table(body: &hcl::Body, name: &str) -> KeySchema {
    let block = body
        .blocks()
        .find(|b| {
            let labels: Vec<&str> = b.labels().iter().map(|l| l.as_str()).collect();
            b.identifier() == "resource" && labels == ["aws_dynamodb_table", name]
        })
        .unwrap_or_else(|| panic!("no aws_dynamodb_table {name:?}"));
    let text = |body: &hcl::Body, key: &str| -> String {
        match body.attributes().find(|a| a.key() == key).map(|a| a.expr()) {
            Some(hcl::Expression::String(s)) => s.clone(),
            other => panic!("{name}.{key} is {other:?}, not a string"),
        }
    };
    let attributes = block
        .body()
        .blocks()
        .filter(|b| b.identifier() == "attribute")
        .map(|b| (text(b.body(), "name"), text(b.body(), "type")))
        .collect();
    assert!(
        !block.body().attributes().any(|a| a.key() == "range_key"),
        "{name}: a hash key only"
    );
    KeySchema {
        hash_key: text(block.body(), "hash_key"),
        attributes,
    }
}

#[test]
fn the_terraform_tables_have_the_keys_the_store_uses() {
    let body: hcl::Body = hcl::from_str(&deploy_file("terraform/kcl_tables.tf")).expect("HCL");
    assert_eq!(terraform_table(&body, "kcl_leases"), expected(LEASE_KEY));
    assert_eq!(terraform_table(&body, "kcl_workers"), expected(INSTANCE));
}
