//! kcl's metrics in CloudWatch under the Java KCL's names: a worker built
//! with `publish_cloudwatch_metrics` consumes a stream of the emulators
//! and publishes to moto's CloudWatch, which is then asked (ListMetrics,
//! GetMetricStatistics) for what a Java KCL dashboard reads.
//!
//! The worker runs in a process of its own (this test binary again, with
//! only this test selected): the builder installs the process's `metrics`
//! recorder, and the other tests of this binary install Prometheus's.
//!
//! moto speaks CloudWatch's JSON and query protocols, while the current
//! AWS SDK speaks its RPC v2 CBOR protocol: the worker's CloudWatch client
//! gets an HTTP connector ([`CborToJson`]) that rewrites each request to JSON
//! and each answer back to CBOR, field for field.

use std::collections::{BTreeMap, BTreeSet};
use std::iter::Peekable;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use aws_sdk_cloudwatch::config::http::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::http::{HttpConnector, HttpConnectorFuture};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use bytes::Bytes;
use http_body_util::Full;
use kcl::observability::cloudwatch::CloudWatchMetrics;
use kcl::{InitialPosition, Worker};
use kcl_tests::fault_proxy::exchange;
use kcl_tests::sdk_http::ConnectorClient;
use kcl_tests::{TestEnv, create_stream, put_sequenced_records, unique_name};

use crate::Counting;
use crate::fleet::{in_own_process, ran_in_own_process};
use minicbor::data::Token;
use serde_json::{Value, json};
use tokio::time::Instant;

/// The CloudWatch service id in the RPC v2 path and the JSON target.
const SERVICE: &str = "GraniteServiceVersion20100801";
const KEYS: u32 = 4;
const PER_KEY: u64 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_publishes_the_java_kcl_metrics_to_cloudwatch() {
    if in_own_process() {
        return worker_process().await;
    }
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let moto = Moto::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    let stream = unique_name("kcl-cw");
    let app = unique_name("kcl-cw-app");
    let worker_id = unique_name("cw-worker");
    create_stream(env.kinesis(), &stream, 2).await.unwrap();
    let sent = put_sequenced_records(env.kinesis(), &stream, KEYS, PER_KEY)
        .await
        .unwrap();
    let shards: BTreeSet<String> = sent.iter().map(|r| r.shard_id.clone()).collect();

    // The worker runs in a process of its own, with the names it is to use.
    let ran = ran_in_own_process(
        module_path!(),
        "a_worker_publishes_the_java_kcl_metrics_to_cloudwatch",
        &[
            ("KCL_CW_STREAM", &stream),
            ("KCL_CW_APP", &app),
            ("KCL_CW_WORKER", &worker_id),
            ("KCL_CW_ENDPOINT", &moto.endpoint),
        ],
    )
    .await;
    assert!(ran, "the worker ran in a process of its own");

    // What a Java KCL dashboard of this application finds in CloudWatch.
    let listed = moto
        .call("ListMetrics", json!({ "Namespace": app }))
        .await
        .unwrap();
    let metrics: BTreeSet<(String, BTreeMap<String, String>)> = listed["Metrics"]
        .as_array()
        .expect("a metric list")
        .iter()
        .map(|m| {
            let dims = m["Dimensions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| (string(&d["Name"]), string(&d["Value"])))
                .collect();
            (string(&m["MetricName"]), dims)
        })
        .collect();
    let has = |name: &str, dims: &[(&str, &str)]| {
        let dims: BTreeMap<String, String> = dims
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        metrics.contains(&(name.to_owned(), dims))
    };
    for shard in &shards {
        for name in [
            "RecordsProcessed",
            "DataBytesProcessed",
            "MillisBehindLatest",
            "RecordProcessor.processRecords.Time",
        ] {
            assert!(
                has(name, &[("Operation", "ProcessTask"), ("ShardId", shard)]),
                "{name} of {shard} in {metrics:#?}"
            );
        }
    }
    assert!(has(
        "MillisBehindLatest",
        &[("Operation", "ApplicationTracker")]
    ));
    let worker_dims = |operation: &'static str| {
        [
            ("Operation", operation),
            ("WorkerIdentifier", worker_id.as_str()),
        ]
    };
    for (name, operation) in [
        ("CurrentLeases", "RenewAllLeases"),
        ("TakenLeases", "TakeLeases"),
    ] {
        assert!(has(name, &worker_dims(operation)), "{name} in {metrics:#?}");
    }
    for (name, dims) in &metrics {
        assert!(
            !dims.contains_key("StreamId"),
            "one stream: no StreamId, as the Java KCL ({name})"
        );
        assert!(
            !name.starts_with("kcl_records_processed")
                && !name.starts_with("kcl_millis_behind_latest")
                && !name.starts_with("kcl_leases_held"),
            "a metric with a Java KCL name is not published twice: {name}"
        );
    }
    assert!(
        metrics
            .iter()
            .any(|(name, _)| name == "kcl_kinesis_get_records_calls_total"),
        "kcl's own metrics under their own name at DETAILED: {metrics:#?}"
    );

    // Every record counted once, across the shards.
    let mut records = 0.0;
    for shard in &shards {
        let dims = [("Operation", "ProcessTask"), ("ShardId", shard.as_str())];
        records += moto
            .statistic(&app, "RecordsProcessed", &dims, "Sum")
            .await
            .unwrap();
    }
    assert_eq!(records, f64::from(KEYS) * PER_KEY as f64);
    let held = moto
        .statistic(
            &app,
            "CurrentLeases",
            &worker_dims("RenewAllLeases"),
            "Maximum",
        )
        .await
        .unwrap();
    assert_eq!(held, 2.0, "both shards' leases were held at once");
    let taken = moto
        .statistic(&app, "TakenLeases", &worker_dims("TakeLeases"), "Sum")
        .await
        .unwrap();
    assert_eq!(taken, 2.0, "each lease taken once");
}

/// The worker process: consumes every record, stops, and exits with the
/// publisher's account of what it sent.
async fn worker_process() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let env = TestEnv::connect().await.unwrap_or_else(|e| panic!("{e:#}"));
    let endpoint = var("KCL_CW_ENDPOINT");
    let cloudwatch = aws_sdk_cloudwatch::Client::from_conf(
        aws_sdk_cloudwatch::config::Builder::from(env.sdk_config())
            .endpoint_url(&endpoint)
            .http_client(ConnectorClient(CborToJson))
            // The rewriting client reads plain CBOR bodies.
            .disable_request_compression(true)
            .build(),
    );
    let processed = Arc::new(AtomicU64::new(0));
    let worker = Worker::builder(var("KCL_CW_APP"))
        .stream(var("KCL_CW_STREAM"))
        .sdk_config(env.sdk_config())
        .worker_id(var("KCL_CW_WORKER"))
        .initial_position(InitialPosition::TrimHorizon)
        .lease_duration(Duration::from_secs(6))
        .taker_interval(Duration::from_secs(1))
        .idle_time_between_reads(Duration::from_millis(200))
        // No periodic flush within the test: what arrives, the last flush
        // at shutdown sent.
        .publish_cloudwatch_metrics(
            CloudWatchMetrics::new()
                .client(cloudwatch.clone())
                .flush_interval(Duration::from_secs(3600)),
        )
        .processor(Counting::factory(&processed, Duration::ZERO))
        .build()
        .unwrap();
    let publisher = worker
        .cloudwatch_publisher()
        .expect("the worker publishes to CloudWatch");
    assert_eq!(publisher.namespace(), var("KCL_CW_APP"));

    // The process has one recorder: another namespace cannot have it.
    let other = Worker::builder(unique_name("kcl-cw-other"))
        .stream(var("KCL_CW_STREAM"))
        .sdk_config(env.sdk_config())
        .publish_cloudwatch_metrics(CloudWatchMetrics::new().client(cloudwatch))
        .processor(Counting::factory(&Arc::default(), Duration::ZERO))
        .build()
        .expect_err("a second namespace in one process");
    assert_eq!(
        other.config().map(|c| c.field),
        Some("publish_cloudwatch_metrics"),
        "{other}"
    );

    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    let expected = u64::from(KEYS) * PER_KEY;
    let started = Instant::now();
    while processed.load(Ordering::Relaxed) < expected {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "processed {} of {expected} records in 60 s",
            processed.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        publisher.stats().requests,
        0,
        "nothing sent before the stop"
    );
    crate::stop_within_60s(&handle, run).await;
    let stats = publisher.stats();
    assert!(stats.requests >= 1 && stats.datums_sent >= 10, "{stats:?}");
    assert_eq!(
        (stats.datums_failed, stats.samples_dropped),
        (0, 0),
        "{stats:?}"
    );
}

fn string(v: &Value) -> String {
    v.as_str().expect("a string").to_owned()
}

/// moto's server on a free port of 127.0.0.1, stopped when dropped.
struct Moto {
    endpoint: String,
    _process: tokio::process::Child,
}

impl Moto {
    /// Starts `moto_server` (`$KCL_MOTO_SERVER`, which `localstack/up`
    /// exports, or the one on PATH) and waits until it answers.
    async fn start() -> anyhow::Result<Moto> {
        let program = std::env::var("KCL_MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let process = tokio::process::Command::new(&program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "cannot run moto's server ({program}): run localstack/install, which installs \
                     it into localstack/.cache (then `. localstack/.run/env` sets KCL_MOTO_SERVER), \
                     or `pip install 'moto[server]'`"
                )
            })?;
        let moto = Moto {
            endpoint: format!("http://127.0.0.1:{port}"),
            _process: process,
        };
        let started = Instant::now();
        loop {
            match moto.call("ListMetrics", json!({})).await {
                Ok(_) => return Ok(moto),
                Err(e) if started.elapsed() > Duration::from_secs(30) => {
                    return Err(e.context("moto's server did not answer within 30 s"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// One CloudWatch call in the JSON protocol; the answer's body.
    async fn call(&self, operation: &str, body: Value) -> anyhow::Result<Value> {
        let authority = self.endpoint.trim_start_matches("http://");
        let (status, body) = post_json(authority, operation, &[], body.to_string().into()).await?;
        if status != 200 {
            bail!("{operation}: {status} {}", String::from_utf8_lossy(&body));
        }
        Ok(serde_json::from_slice(&body)?)
    }

    /// One statistic of a metric over the last and the next hour, summed
    /// (or maximised) over its minutes.
    async fn statistic(
        &self,
        namespace: &str,
        name: &str,
        dimensions: &[(&str, &str)],
        statistic: &str,
    ) -> anyhow::Result<f64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs();
        let answer = self
            .call(
                "GetMetricStatistics",
                json!({
                    "Namespace": namespace,
                    "MetricName": name,
                    "Dimensions": dimensions
                        .iter()
                        .map(|(n, v)| json!({ "Name": n, "Value": v }))
                        .collect::<Vec<_>>(),
                    "StartTime": now - 3600,
                    "EndTime": now + 3600,
                    "Period": 60,
                    "Statistics": [statistic],
                }),
            )
            .await?;
        let values = answer["Datapoints"]
            .as_array()
            .context("datapoints")?
            .iter()
            .map(|p| p[statistic].as_f64().context("a number"))
            .collect::<anyhow::Result<Vec<f64>>>()?;
        if values.is_empty() {
            bail!("no datapoint of {name} {dimensions:?}");
        }
        Ok(if statistic == "Maximum" {
            values.iter().copied().fold(f64::MIN, f64::max)
        } else {
            values.iter().sum()
        })
    }
}

/// POSTs a CloudWatch JSON-protocol request to `authority` on a fresh
/// connection; the status and body.
async fn post_json(
    authority: &str,
    operation: &str,
    headers: &[(String, String)],
    body: Bytes,
) -> anyhow::Result<(u16, Bytes)> {
    let mut request = hyper::Request::builder()
        .method("POST")
        .uri("/")
        .header("host", authority)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", format!("{SERVICE}.{operation}"));
    let mut signed = false;
    for (name, value) in headers {
        signed |= name.eq_ignore_ascii_case("authorization");
        request = request.header(name, value);
    }
    if !signed {
        // moto reads the region and account from the credential scope.
        request = request.header(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=test/20240101/us-east-1/monitoring/aws4_request, \
             SignedHeaders=host, Signature=0",
        );
    }
    let request = request.body(Full::new(body))?;
    let (parts, body) = exchange(authority, request).await?;
    Ok((parts.status.as_u16(), body))
}

/// An HTTP connector for the CloudWatch SDK that speaks JSON to moto: the
/// RPC v2 CBOR request (`POST /service/<service>/operation/<op>`) becomes
/// the JSON request `X-Amz-Target: <service>.<op>` with the same fields
/// (CBOR timestamps, tag 1 over epoch seconds, become JSON's epoch
/// seconds), and the JSON answer becomes a CBOR one.
#[derive(Debug, Clone)]
struct CborToJson;

impl HttpConnector for CborToJson {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        HttpConnectorFuture::new(async move {
            rewrite(request)
                .await
                .map_err(|e| ConnectorError::other(e.into(), None))
        })
    }
}

async fn rewrite(request: HttpRequest) -> anyhow::Result<HttpResponse> {
    let uri: hyper::Uri = request.uri().parse()?;
    let authority = uri.authority().context("an endpoint")?.to_string();
    let operation = uri
        .path()
        .strip_prefix(&format!("/service/{SERVICE}/operation/"))
        .with_context(|| format!("not an RPC v2 CloudWatch call: {uri}"))?
        .to_owned();
    let cbor = request.body().bytes().context("a buffered body")?;
    let json = if cbor.is_empty() {
        json!({})
    } else {
        let mut decoder = minicbor::Decoder::new(cbor);
        let mut tokens = decoder.tokens().peekable();
        cbor_value(&mut tokens)?
    };
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .filter(|(name, _)| {
            ["authorization", "x-amz-date"].contains(&name.to_ascii_lowercase().as_str())
        })
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    let (status, body) =
        post_json(&authority, &operation, &headers, json.to_string().into()).await?;
    let answer: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body)
            .with_context(|| String::from_utf8_lossy(&body).into_owned())?
    };
    let mut encoder = minicbor::Encoder::new(Vec::new());
    encode(&mut encoder, &answer)?;
    let mut response = HttpResponse::new(
        StatusCode::try_from(status)?,
        SdkBody::from(encoder.into_writer()),
    );
    response
        .headers_mut()
        .insert("content-type", "application/cbor");
    response
        .headers_mut()
        .insert("smithy-protocol", "rpc-v2-cbor");
    Ok(response)
}

type Tokens<'a, 'b> = Peekable<minicbor::decode::Tokenizer<'a, 'b>>;

/// The next CBOR data item as JSON.
fn cbor_value(tokens: &mut Tokens<'_, '_>) -> anyhow::Result<Value> {
    let token = tokens.next().context("a CBOR item")??;
    Ok(match token {
        Token::Bool(b) => Value::Bool(b),
        Token::Null | Token::Undefined => Value::Null,
        Token::U8(n) => n.into(),
        Token::U16(n) => n.into(),
        Token::U32(n) => n.into(),
        Token::U64(n) => n.into(),
        Token::I8(n) => n.into(),
        Token::I16(n) => n.into(),
        Token::I32(n) => n.into(),
        Token::I64(n) => n.into(),
        Token::Int(n) => i64::try_from(n)?.into(),
        Token::F16(f) | Token::F32(f) => f64::from(f).into(),
        Token::F64(f) => f.into(),
        Token::String(s) => s.into(),
        Token::BeginString => {
            let mut s = String::new();
            while !next_is_break(tokens)? {
                s.push_str(cbor_value(tokens)?.as_str().context("a text chunk")?);
            }
            s.into()
        }
        Token::Array(n) => Value::Array(
            (0..n)
                .map(|_| cbor_value(tokens))
                .collect::<anyhow::Result<_>>()?,
        ),
        Token::BeginArray => {
            let mut items = Vec::new();
            while !next_is_break(tokens)? {
                items.push(cbor_value(tokens)?);
            }
            Value::Array(items)
        }
        Token::Map(n) => {
            let mut map = serde_json::Map::new();
            for _ in 0..n {
                let (k, v) = cbor_entry(tokens)?;
                map.insert(k, v);
            }
            Value::Object(map)
        }
        Token::BeginMap => {
            let mut map = serde_json::Map::new();
            while !next_is_break(tokens)? {
                let (k, v) = cbor_entry(tokens)?;
                map.insert(k, v);
            }
            Value::Object(map)
        }
        // Timestamps (tag 1): the epoch seconds are JSON's timestamps too.
        Token::Tag(_) => cbor_value(tokens)?,
        other => bail!("no JSON for the CBOR item {other}"),
    })
}

fn cbor_entry(tokens: &mut Tokens<'_, '_>) -> anyhow::Result<(String, Value)> {
    let key = cbor_value(tokens)?
        .as_str()
        .context("a string key")?
        .to_owned();
    Ok((key, cbor_value(tokens)?))
}

/// Whether an indefinite item ends here (consuming its break).
fn next_is_break(tokens: &mut Tokens<'_, '_>) -> anyhow::Result<bool> {
    match tokens.peek() {
        Some(Ok(Token::Break)) => {
            tokens.next();
            Ok(true)
        }
        Some(_) => Ok(false),
        None => bail!("the CBOR input ended inside an item"),
    }
}

/// A JSON answer as CBOR.
fn encode(e: &mut minicbor::Encoder<Vec<u8>>, value: &Value) -> anyhow::Result<()> {
    match value {
        Value::Null => {
            e.null()?;
        }
        Value::Bool(b) => {
            e.bool(*b)?;
        }
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                e.i64(i)?;
            } else {
                e.f64(n.as_f64().context("a number")?)?;
            }
        }
        Value::String(s) => {
            e.str(s)?;
        }
        Value::Array(items) => {
            e.array(items.len() as u64)?;
            for item in items {
                encode(e, item)?;
            }
        }
        Value::Object(map) => {
            e.map(map.len() as u64)?;
            for (k, v) in map {
                e.str(k)?;
                encode(e, v)?;
            }
        }
    }
    Ok(())
}
