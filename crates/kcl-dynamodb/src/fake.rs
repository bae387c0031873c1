//! A DynamoDB endpoint for unit tests: it answers each request as the test
//! says (or never, as a silently dead connection does) and records every
//! request, so a test asserts what kcl sent.

use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{
    BehaviorVersion, Credentials, Region, StalledStreamProtectionConfig,
};
use aws_smithy_runtime_api::client::http::{
    HttpConnector, HttpConnectorFuture, SharedHttpConnector, http_client_fn,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::retry::RetryConfig;
use serde_json::Value;

/// How the fake answers a request: the operation (`TransactWriteItems`,
/// `UpdateItem`, ...) and its JSON body in, a status and a JSON body out,
/// or `None` for no answer ever (a silently dead connection).
pub(crate) type Answer = dyn Fn(&str, &Value) -> Option<(u16, Value)> + Send + Sync;

/// A DynamoDB endpoint that answers as told and records each request.
#[derive(Clone)]
pub(crate) struct FakeDynamoDb {
    answer: Arc<Answer>,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
}

impl std::fmt::Debug for FakeDynamoDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FakeDynamoDb")
    }
}

impl HttpConnector for FakeDynamoDb {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let operation = request
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or_default()
            .to_owned();
        let body: Value =
            serde_json::from_slice(request.body().bytes().unwrap_or_default()).unwrap_or_default();
        let answer = (self.answer)(&operation, &body);
        self.requests.lock().unwrap().push((operation, body));
        match answer {
            None => HttpConnectorFuture::new(std::future::pending()),
            Some((status, body)) => {
                let mut response = HttpResponse::new(
                    StatusCode::try_from(status).unwrap(),
                    SdkBody::from(body.to_string()),
                );
                response
                    .headers_mut()
                    .insert("content-type", "application/x-amz-json-1.0");
                HttpConnectorFuture::ready(Ok(response))
            }
        }
    }
}

impl FakeDynamoDb {
    pub(crate) fn new(
        answer: impl Fn(&str, &Value) -> Option<(u16, Value)> + Send + Sync + 'static,
    ) -> Self {
        FakeDynamoDb {
            answer: Arc::new(answer),
            requests: Arc::default(),
        }
    }

    /// A client of this endpoint that leaves every retry to its caller.
    pub(crate) fn client(&self) -> Client {
        let fake = self.clone();
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "fake"))
            .endpoint_url("http://dynamodb.fake")
            .retry_config(RetryConfig::disabled())
            // A dead connection takes the request whole and never answers;
            // the SDK's stall detection of the upload would see the fake
            // never read it.
            .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
            .http_client(http_client_fn(move |_, _| {
                SharedHttpConnector::new(fake.clone())
            }))
            .build();
        Client::from_conf(config)
    }

    /// The operations requested, in order.
    pub(crate) fn operations(&self) -> Vec<String> {
        let requests = self.requests.lock().unwrap();
        requests.iter().map(|(op, _)| op.clone()).collect()
    }

    /// The bodies of the requests of `operation`, in order.
    pub(crate) fn bodies(&self, operation: &str) -> Vec<Value> {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .filter(|(op, _)| op == operation)
            .map(|(_, body)| body.clone())
            .collect()
    }
}
