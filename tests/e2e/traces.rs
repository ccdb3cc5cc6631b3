//! OpenTelemetry traces end to end (opt-in, `turnstile run --otlp-endpoint`): the controller
//! exports over OTLP/gRPC to a receiver run in this test (opentelemetry-proto's
//! `TraceService` on a real tonic server on loopback, no mock of the exporter). A claim
//! annotated with the workload's `traceparent` gets a wait span and a hold span in that trace,
//! children of the workload's span, with the lock, namespace, claim, backend and token; a
//! claim that waits behind it gets its own, in a trace of its own; the controller's passes
//! arrive as spans too.

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use support::{token_of, Env};
use turnstile_api::{ClaimPhase, TRACEPARENT_ANNOTATION};
use turnstile_controller::traces::{HOLD_SPAN, WAIT_SPAN};
use turnstile_controller::ControllerConfig;

/// The workload's span, as its own tracer would write it into the claim.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const WORKLOAD_SPAN: &str = "00f067aa0ba902b7";

/// Every span the receiver was sent.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|resource| resource.scope_spans)
            .flat_map(|scope| scope.spans);
        self.0.lock().expect("received").extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Starts the receiver on a free loopback port.
async fn receiver() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let addr = listener.local_addr().expect("address");
    let received = Received::default();
    let service = TraceServiceServer::new(received.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
    });
    (addr, received)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Value::StringValue(text) => Some(text.clone()),
        Value::IntValue(number) => Some(number.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// The span `name` about claim `claim`, once the receiver has it (bounded).
async fn span_of(received: &Received, name: &str, claim: &str) -> Span {
    let deadline = Instant::now() + support::WAIT;
    loop {
        let found = received
            .0
            .lock()
            .expect("received")
            .iter()
            .find(|span| {
                span.name == name && attribute(span, "turnstile.claim").as_deref() == Some(claim)
            })
            .cloned();
        if let Some(span) = found {
            return span;
        }
        assert!(
            Instant::now() < deadline,
            "no {name} span of {claim} arrived"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_wait_and_hold_are_spans_in_the_workloads_trace() {
    let (addr, received) = receiver().await;
    let provider =
        turnstile::telemetry::tracer_provider(&format!("http://{addr}")).expect("an OTLP exporter");
    let env = Env::new().await;
    let controller = env.spawn_controller(ControllerConfig {
        tracer_provider: Some(provider.clone()),
        ..ControllerConfig::default()
    });
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply(&format!(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: traced\n  annotations:\n    {TRACEPARENT_ANNOTATION}: 00-{TRACE_ID}-{WORKLOAD_SPAN}-01\nspec:\n  lockName: db\n"
    ));
    let held = env.wait_phase("traced", ClaimPhase::Held).await;
    env.apply_claim("behind", "db", "");
    env.wait_claim("behind", |claim| support::position_of(claim) == Some(1))
        .await;
    env.patch_claim_spec("traced", serde_json::json!({"release": true}))
        .await;
    env.wait_phase("behind", ClaimPhase::Held).await;
    controller.stop().await;
    // What is still buffered goes out now.
    turnstile::telemetry::shutdown(provider).await;

    let wait = span_of(&received, WAIT_SPAN, "traced").await;
    let hold = span_of(&received, HOLD_SPAN, "traced").await;
    for span in [&wait, &hold] {
        assert_eq!(hex(&span.trace_id), TRACE_ID, "in the workload's trace");
        assert_eq!(
            hex(&span.parent_span_id),
            WORKLOAD_SPAN,
            "a child of its span"
        );
        assert_eq!(attribute(span, "turnstile.lock").as_deref(), Some("db"));
        assert_eq!(
            attribute(span, "k8s.namespace.name").as_deref(),
            Some(env.namespace.as_str())
        );
        assert_eq!(
            attribute(span, "turnstile.backend").as_deref(),
            Some("memory")
        );
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    }
    let token = token_of(&held).map(|token| token.to_string());
    assert_eq!(attribute(&hold, "turnstile.fencing_token"), token);
    assert_eq!(
        attribute(&hold, "turnstile.reason").as_deref(),
        Some("ReleaseRequested")
    );
    assert!(
        wait.end_time_unix_nano <= hold.start_time_unix_nano + 1_000_000_000,
        "the hold starts where the wait ends (whole seconds)"
    );

    // The claim behind, without a traceparent, waits in a trace of its own.
    let behind = span_of(&received, WAIT_SPAN, "behind").await;
    assert_ne!(hex(&behind.trace_id), TRACE_ID);
    assert!(behind.parent_span_id.is_empty(), "a root span");
    assert_eq!(
        attribute(&behind, "turnstile.fencing_token").as_deref(),
        Some("2")
    );
    // The controller's passes (its `tracing` spans) are not exported here: only the binary
    // installs the layer; see `turnstile_run_exports_its_passes_too`.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turnstile_run_exports_its_passes_too() {
    let (addr, received) = receiver().await;
    let env = Env::new().await;
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_turnstile"));
    command
        .args(["run", "--namespace", &env.namespace])
        .args(["--otlp-endpoint", &format!("http://{addr}")])
        .env("RUST_LOG", "info")
        .env("KUBECONFIG", &env.kubeconfig)
        .kill_on_drop(true);
    let mut controller = command.spawn().expect("start turnstile run");
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply_claim("granted", "db", "");
    env.wait_phase("granted", ClaimPhase::Held).await;
    // SIGTERM: a clean stop sends what is still buffered.
    let pid = controller.id().expect("pid").to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(signalled.success());
    let exited = tokio::time::timeout(support::WAIT, controller.wait())
        .await
        .expect("turnstile run stops on SIGTERM")
        .expect("exit status");
    assert!(exited.success(), "{exited:?}");

    span_of(&received, WAIT_SPAN, "granted").await;
    let passes: Vec<Span> = received
        .0
        .lock()
        .expect("received")
        .iter()
        .filter(|span| span.name == "reconcile")
        .filter(|span| attribute(span, "lock").as_deref() == Some("db"))
        .cloned()
        .collect();
    assert!(!passes.is_empty(), "no pass of lock db was exported");
    assert_eq!(
        attribute(&passes[0], "namespace").as_deref(),
        Some(env.namespace.as_str())
    );
}
