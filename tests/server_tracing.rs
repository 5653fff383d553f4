#![allow(clippy::unwrap_used)]
//! OpenTelemetry traces of the real `ditto serve` binary arrive at an in-process OTLP
//! collector (a tonic `TraceService` server this test starts on loopback) with the right
//! names, kinds and parent ids: a span per RPC and per HTTP request, children for the
//! snapshot, the resolution and the simulation of a question, and a trace continued from an
//! incoming W3C `traceparent` (gRPC metadata and HTTP header), and a root span per live-mirror
//! scrape. Configured only by the
//! standard OTEL_* variables; `OTEL_TRACES_EXPORTER=none` exports nothing.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ditto::server::proto;
use ditto::server::proto::twin_client::TwinClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Everything the collector received.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    resources: Arc<Mutex<Vec<Vec<KeyValue>>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource_spans in request.into_inner().resource_spans {
            if let Some(resource) = resource_spans.resource {
                self.resources.lock().unwrap().push(resource.attributes);
            }
            for scope in resource_spans.scope_spans {
                self.spans.lock().unwrap().extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn start_collector() -> (Collector, SocketAddr) {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    (collector, addr)
}

/// `ditto serve` on free ports with `env`; returns it and its gRPC and HTTP addresses.
fn start_ditto(env: &[(&str, String)]) -> (Child, SocketAddr, SocketAddr) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ditto"));
    command
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--drain-ms",
            "2000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for name in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
    ] {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (ready, addresses) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if let Some(rest) = line.strip_prefix("ditto serve: gRPC on ") {
                let (grpc, rest) = rest.split_once(", HTTP on ").unwrap();
                let http = rest.split_whitespace().next().unwrap();
                let _ = ready.send((grpc.parse().unwrap(), http.parse().unwrap()));
            }
        }
    });
    let (grpc, http) = addresses
        .recv_timeout(Duration::from_secs(60))
        .expect("ditto serve reported its addresses");
    (child, grpc, http)
}

/// SIGTERM, then the process must exit 0 (its last spans are flushed on the way out).
fn stop(mut child: Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    for _ in 0..600 {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "ditto serve exited with {status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    panic!("ditto serve did not exit within 30 s of SIGTERM");
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const SCRAPER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const SCRAPER_SPAN: &str = "b7ad6b7169203331";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|value| value.value.as_ref())
}

fn int_attribute(span: &Span, key: &str) -> i64 {
    match attribute(&span.attributes, key) {
        Some(Value::IntValue(value)) => *value,
        other => panic!("{} has no integer {key}: {other:?}", span.name),
    }
}

async fn traffic(grpc: SocketAddr, http: SocketAddr) {
    let mut twin = TwinClient::connect(format!("http://{grpc}")).await.unwrap();
    let mut question = tonic::Request::new(proto::PredictRoutingRequest {
        request: Some(proto::CandidateRequest {
            prompt_tokens: 500,
            expected_output: Some(proto::candidate_request::ExpectedOutput::OutputTokens(16)),
            ..proto::CandidateRequest::default()
        }),
        options: Some(proto::PredictOptions {
            replications: 2,
            ..proto::PredictOptions::default()
        }),
        request_id: "traced".to_owned(),
        ..proto::PredictRoutingRequest::default()
    });
    question.metadata_mut().insert(
        "traceparent",
        format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
            .parse()
            .unwrap(),
    );
    twin.predict_routing(question).await.unwrap();
    twin.get_snapshot(proto::GetSnapshotRequest::default())
        .await
        .unwrap();
    let mut stream = tokio::net::TcpStream::connect(http).await.unwrap();
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\ntraceparent: 00-{SCRAPER_TRACE}-{SCRAPER_SPAN}-01\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_reach_an_otlp_collector_with_their_parents() {
    let (collector, collector_addr) = start_collector().await;
    let (child, grpc, http) = start_ditto(&[
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        ),
        ("OTEL_SERVICE_NAME", "ditto-under-test".to_owned()),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=test".to_owned(),
        ),
        ("OTEL_TRACES_SAMPLER", "parentbased_always_on".to_owned()),
    ]);
    traffic(grpc, http).await;
    tokio::task::spawn_blocking(move || stop(child))
        .await
        .unwrap();

    let spans = collector.spans.lock().unwrap().clone();
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();

    // The RPC continues the caller's trace, as a server span whose parent is the caller's.
    let [rpc] = named("ditto.v1.Twin/PredictRouting")[..] else {
        panic!("one PredictRouting span expected: {names:?}")
    };
    assert_eq!(hex(&rpc.trace_id), CALLER_TRACE);
    assert_eq!(hex(&rpc.parent_span_id), CALLER_SPAN);
    assert_eq!(rpc.kind, 2, "SPAN_KIND_SERVER");
    match attribute(&rpc.attributes, "rpc.system") {
        Some(Value::StringValue(system)) => assert_eq!(system, "grpc"),
        other => panic!("rpc.system: {other:?}"),
    }
    // Its children: the snapshot, the resolution and the simulation, in that order.
    let children: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == rpc.span_id)
        .collect();
    let mut child_names: Vec<(&str, u64)> = children
        .iter()
        .map(|s| (s.name.as_str(), s.start_time_unix_nano))
        .collect();
    child_names.sort_by_key(|(_, start)| *start);
    let order: Vec<&str> = child_names.iter().map(|(name, _)| *name).collect();
    assert_eq!(order, ["snapshot", "resolve", "simulate"], "{names:?}");
    for child in &children {
        assert_eq!(child.trace_id, rpc.trace_id);
        assert!(child.start_time_unix_nano >= rpc.start_time_unix_nano);
        assert!(child.end_time_unix_nano <= rpc.end_time_unix_nano);
    }
    let simulate = children.iter().find(|s| s.name == "simulate").unwrap();
    assert_eq!(int_attribute(simulate, "ditto.replications"), 2);
    let candidates = int_attribute(simulate, "ditto.candidates");
    assert_eq!(candidates, 4, "the default cluster's instances");
    assert_eq!(int_attribute(simulate, "ditto.forks"), candidates * 2);
    assert!(int_attribute(simulate, "ditto.events") > 0);
    assert!(int_attribute(simulate, "ditto.simulated_horizon_us") > 0);
    let snapshot = children.iter().find(|s| s.name == "snapshot").unwrap();
    assert!(int_attribute(snapshot, "ditto.generation") >= 1);

    // A call without traceparent starts its own trace.
    let [read] = named("ditto.v1.Twin/GetSnapshot")[..] else {
        panic!("one GetSnapshot span expected: {names:?}")
    };
    assert!(read.parent_span_id.is_empty());
    assert_ne!(read.trace_id, rpc.trace_id);

    // The scrape continues the scraper's trace.
    let [scrape] = named("GET /metrics")[..] else {
        panic!("one GET /metrics span expected: {names:?}")
    };
    assert_eq!(hex(&scrape.trace_id), SCRAPER_TRACE);
    assert_eq!(hex(&scrape.parent_span_id), SCRAPER_SPAN);
    assert_eq!(int_attribute(scrape, "http.response.status_code"), 200);

    // Health checks and the startup sync make no spans of their own.
    assert!(
        !names.iter().any(|name| name.contains("grpc.health")),
        "{names:?}"
    );

    // The resource comes from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    let resources = collector.resources.lock().unwrap().clone();
    let resource = resources.first().expect("a resource");
    match attribute(resource, "service.name") {
        Some(Value::StringValue(name)) => assert_eq!(name, "ditto-under-test"),
        other => panic!("service.name: {other:?}"),
    }
    match attribute(resource, "deployment.environment") {
        Some(Value::StringValue(env)) => assert_eq!(env, "test"),
        other => panic!("deployment.environment: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn traces_exporter_none_exports_nothing() {
    let (collector, collector_addr) = start_collector().await;
    let (child, grpc, http) = start_ditto(&[
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        ),
        ("OTEL_TRACES_EXPORTER", "none".to_owned()),
    ]);
    traffic(grpc, http).await;
    tokio::task::spawn_blocking(move || stop(child))
        .await
        .unwrap();
    // The process has exited, so everything it would have sent has been sent.
    assert!(collector.spans.lock().unwrap().is_empty());
}

/// A stand-in vLLM pod: answers every `GET /metrics` on a kept-alive connection with the
/// three gauges the live mirror requires, in vLLM's names.
async fn start_fake_pod() -> SocketAddr {
    const BODY: &str = "# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 1.0\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 0.0\n\
# TYPE vllm:kv_cache_usage_perc gauge\n\
vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.01\n";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    let Ok(n) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        buffer.drain(..end + 4);
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{BODY}",
                            BODY.len()
                        );
                        if socket.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread")]
async fn live_scrapes_get_their_own_spans() {
    // Goal: with pull mode on, each scrape of a pod is a span (a root: no request caused
    // it) naming the pod and its result. Method: a stand-in pod, `ditto serve` pulling from
    // it every 50 ms for a second, then the collector's spans.
    let (collector, collector_addr) = start_collector().await;
    let pod = start_fake_pod().await;
    let (child, _, _) = start_ditto(&[
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{collector_addr}"),
        ),
        ("OTEL_TRACES_SAMPLER", "always_on".to_owned()),
        ("DITTO_PODS", pod.to_string()),
    ]);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    tokio::task::spawn_blocking(move || stop(child))
        .await
        .unwrap();
    let spans = collector.spans.lock().unwrap().clone();
    let scrapes: Vec<&Span> = spans.iter().filter(|s| s.name == "scrape").collect();
    assert!(scrapes.len() >= 3, "{} scrape spans", scrapes.len());
    for scrape in &scrapes {
        assert!(scrape.parent_span_id.is_empty(), "a scrape is a root span");
        assert_eq!(scrape.kind, 3, "SPAN_KIND_CLIENT");
        match attribute(&scrape.attributes, "ditto.pod") {
            Some(Value::StringValue(id)) => assert!(id.contains(&pod.port().to_string()), "{id}"),
            other => panic!("ditto.pod: {other:?}"),
        }
    }
    assert!(scrapes.iter().any(|s| matches!(
        attribute(&s.attributes, "ditto.scrape.result"),
        Some(Value::StringValue(result)) if result == "ok"
    )));
}
