//! How an exactly-once commit is judged, on DynamoDB Local (its real
//! condition checks):
//!
//! - A plain checkpoint that landed with its answer lost is not taken for
//!   a commit at the same position: the commit reports it was not applied,
//!   and the checkpointer catches up.
//! - A commit whose attempts were given up on unanswered is reported "not
//!   committed" only when none of them can land any more: attempts held in
//!   flight and delivered after the verdict fail.

// Setup helpers live outside #[test] fns; a failed setup should panic with its error.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::config::http::{HttpRequest, HttpResponse};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_runtime_api::client::http::{HttpConnector, HttpConnectorFuture};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use bytes::Bytes;
use http_body_util::Full;
use kcl::{ExactlyOnce, Transaction, TransactionError};
use kcl_core::store::{CheckpointUpdate, LeaseStore as _};
use kcl_core::{Checkpoint, Holder};
use kcl_tests::fault_proxy::exchange;
use kcl_tests::sdk_http::ConnectorClient;
use kcl_tests::{counting, dynamodb_endpoint};

use super::{
    Held, assert_nothing_committed, held_lease, held_lease_with_eo, one_write, put_add, record,
};

/// A transaction adding 1 to `key`'s counter: applied twice, it shows.
fn add_one(table: &str, key: &str) -> Transaction {
    one_write(put_add(table, key))
}

#[tokio::test]
async fn a_plain_checkpoint_landed_with_its_answer_lost_is_not_taken_for_the_commit() {
    let (env, store, mut checkpointer, eo, sink) = held_lease_with_eo().await;
    // The plain checkpoint to 100/3 landed; its answer was lost, so the
    // checkpointer still stands at TRIM_HORIZON.
    store
        .checkpoint(
            "shard-1",
            Holder::new("w-1", "t-1"),
            &CheckpointUpdate::to(Checkpoint::at("100", 3)).replacing(Checkpoint::TrimHorizon),
        )
        .await
        .unwrap();

    // The batch comes again and its writes are committed through 100/3.
    let e = eo
        .commit(&mut checkpointer, add_one(&sink, "a"), &record("100", 3))
        .await
        .unwrap_err();

    assert!(
        matches!(&e, TransactionError::CheckpointMoved { checkpoint, .. } if *checkpoint == Checkpoint::at("100", 3)),
        "{e}"
    );
    let counts = counting::counts(env.dynamodb(), &sink).await.unwrap();
    assert!(
        counts.is_empty(),
        "not applied, so nothing written: {counts:?}"
    );
    assert!(checkpointer.is_checkpointed(&record("100", 3)));
    // The processor goes on from there: the next commit lands.
    eo.commit(&mut checkpointer, add_one(&sink, "b"), &record("100", 5))
        .await
        .unwrap();
    let counts = counting::counts(env.dynamodb(), &sink).await.unwrap();
    assert_eq!(counts.get("b"), Some(&1), "{counts:?}");
    assert_eq!(
        store.get("shard-1").await.unwrap().unwrap().checkpoint,
        Checkpoint::at("100", 5)
    );
}

#[tokio::test]
async fn an_attempt_still_in_flight_cannot_land_once_the_commit_is_reported_not_committed() {
    let Held {
        env,
        store,
        lease_table,
        mut checkpointer,
        sink,
    } = held_lease().await;
    let endpoint = dynamodb_endpoint();
    let holding = Holding::new(&endpoint);
    let client = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(env.sdk_config())
            .http_client(ConnectorClient(holding.clone()))
            .build(),
    );
    let eo = ExactlyOnce::new(client, &lease_table)
        .attempts(2)
        .attempt_timeout(Duration::from_secs(2));

    let e = eo
        .commit(&mut checkpointer, add_one(&sink, "a"), &record("100", 3))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, TransactionError::Failed { message, retries_exhausted: true } if message.contains("not committed")),
        "{e}"
    );

    // The attempts given up on reach DynamoDB only now.
    let statuses = holding.deliver_held(&endpoint).await;
    assert_eq!(statuses.len(), 2, "both attempts were held");
    for (status, body) in &statuses {
        assert_eq!(*status, 400, "{body}");
        assert!(body.contains("TransactionCanceledException"), "{body}");
    }
    // Reported not committed, and none landed.
    assert_nothing_committed(&env, &store, &sink).await;
    assert_eq!(checkpointer.last_checkpoint(), &Checkpoint::TrimHorizon);

    // The batch comes again: its new commit lands, once, and clears the
    // fence.
    let eo = ExactlyOnce::new(env.dynamodb().clone(), &lease_table);
    eo.commit(&mut checkpointer, add_one(&sink, "a"), &record("100", 3))
        .await
        .unwrap();
    let counts = counting::counts(env.dynamodb(), &sink).await.unwrap();
    assert_eq!(counts.get("a"), Some(&1), "{counts:?}");
    let item = env
        .dynamodb()
        .get_item()
        .table_name(&lease_table)
        .key("leaseKey", AttributeValue::S("shard-1".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let item = item.item().unwrap();
    assert!(!item.contains_key("kclFencedCommits"), "{item:?}");
    assert!(item.contains_key("kclCommitToken"), "{item:?}");
}

/// An HTTP connector that holds every `TransactWriteItems` (sent, never
/// answered: an attempt still on its way) and sends the rest to DynamoDB
/// Local; the held requests are delivered when the test says.
#[derive(Debug, Clone)]
struct Holding {
    endpoint: String,
    held: Arc<Mutex<Vec<HttpRequest>>>,
}

impl Holding {
    fn new(endpoint: &str) -> Self {
        Holding {
            endpoint: endpoint.to_owned(),
            held: Arc::default(),
        }
    }

    /// Delivers the held requests in order; their statuses and bodies.
    async fn deliver_held(&self, endpoint: &str) -> Vec<(u16, String)> {
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        let mut answers = Vec::new();
        for request in held {
            let response = send(endpoint, request).await.unwrap();
            let body = String::from_utf8_lossy(response.body().bytes().unwrap_or_default()).into();
            answers.push((response.status().as_u16(), body));
        }
        answers
    }
}

impl HttpConnector for Holding {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        if target.ends_with(".TransactWriteItems") {
            self.held.lock().unwrap().push(request);
            return HttpConnectorFuture::new(std::future::pending());
        }
        let endpoint = self.endpoint.clone();
        HttpConnectorFuture::new(async move {
            send(&endpoint, request)
                .await
                .map_err(|e| ConnectorError::io(e.into()))
        })
    }
}

/// Sends `request` to `endpoint` on a fresh connection, as it was signed.
async fn send(endpoint: &str, request: HttpRequest) -> anyhow::Result<HttpResponse> {
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut outgoing = hyper::Request::builder().method(request.method()).uri("/");
    // The SDK's connector adds the host from the URI.
    if request.headers().get("host").is_none() {
        outgoing = outgoing.header("host", authority);
    }
    for (name, value) in request.headers() {
        outgoing = outgoing.header(name, value);
    }
    let body = Bytes::copy_from_slice(request.body().bytes().unwrap_or_default());
    let outgoing = outgoing.body(Full::new(body))?;
    let (parts, body) = exchange(authority, outgoing).await?;
    let mut response = HttpResponse::new(
        StatusCode::try_from(parts.status.as_u16())?,
        SdkBody::from(body),
    );
    for (name, value) in &parts.headers {
        if let Ok(value) = value.to_str() {
            response
                .headers_mut()
                .insert(name.as_str().to_owned(), value.to_owned());
        }
    }
    Ok(response)
}
