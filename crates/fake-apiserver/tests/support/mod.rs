//! Test support: a target that is the fake (default) or the real cluster named by
//! `TURNSTILE_E2E_KUBECONFIG`, a per-test namespace, the Widget CRD fixture, raw HTTP
//! helpers and kubectl.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Once;
use std::time::Duration;

use fake_apiserver::FakeApiServer;
use http_body_util::BodyExt;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::Client;
use serde_json::{json, Value};

/// The variable naming a real cluster's kubeconfig.
pub const REAL_CLUSTER_ENV: &str = "TURNSTILE_E2E_KUBECONFIG";

static ANNOUNCE: Once = Once::new();

/// One test's view of its API server.
pub struct Env {
    pub client: Client,
    pub namespace: String,
    pub kubeconfig: PathBuf,
    pub fake: Option<FakeApiServer>,
    dir: tempfile::TempDir,
}

/// The real API server this binary targets: `TURNSTILE_E2E_KUBECONFIG`'s cluster, else — in a
/// binary whose root says `ON_REAL_PLANE` — this process's control plane (`test-servers`);
/// None for the fake. Where the plane's binaries are not built a local run says so once and
/// uses the fake; under `CI=true` that fails.
pub async fn real_kubeconfig() -> Option<PathBuf> {
    if let Some(path) = test_servers::env_path(REAL_CLUSTER_ENV) {
        return Some(path);
    }
    if !crate::ON_REAL_PLANE {
        return None;
    }
    let started = tokio::task::spawn_blocking(|| {
        test_servers::ControlPlane::for_this_process().map(|plane| plane.kubeconfig().to_path_buf())
    })
    .await
    .expect("control plane start thread");
    match started {
        Ok(path) => Some(path),
        Err(test_servers::Unavailable::Skip(why)) => {
            ANNOUNCE.call_once(|| {
                println!("contract tests on the fake instead of the real plane: {why}")
            });
            None
        }
        Err(test_servers::Unavailable::Fail(error)) => {
            panic!("the real control plane is needed: {error}")
        }
    }
}

fn random_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

impl Env {
    /// The fake, or the real cluster when `TURNSTILE_E2E_KUBECONFIG` is set; with a fresh namespace.
    pub async fn new() -> Env {
        Self::with_builder(FakeApiServer::builder()).await
    }

    /// [`Env::new`] with the Widget CRD installed.
    pub async fn with_widgets() -> Env {
        let env = Env::new().await;
        env.install_widget_crd().await;
        env
    }

    /// Like [`Env::new`], configuring the fake with `builder`.
    pub async fn with_builder(builder: fake_apiserver::Builder) -> Env {
        Env::on(real_kubeconfig().await, builder).await
    }

    /// The real API server of the kubeconfig `real`, else the fake built by `builder`; with a
    /// fresh namespace.
    async fn on(real: Option<PathBuf>, builder: fake_apiserver::Builder) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = match real {
            Some(path) => {
                ANNOUNCE.call_once(|| {
                    println!(
                        "contract tests: running against the real cluster in {}",
                        path.display()
                    )
                });
                let kubeconfig = kube::config::Kubeconfig::read_from(&path)
                    .expect("read TURNSTILE_E2E_KUBECONFIG");
                let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .expect("kubeconfig");
                Env {
                    client: Client::try_from(config).expect("client"),
                    namespace: String::new(),
                    kubeconfig: path,
                    fake: None,
                    dir,
                }
            }
            None => {
                let server = builder.start().await.expect("start fake");
                let kubeconfig = dir.path().join("kubeconfig");
                server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
                Env {
                    client: server.client(),
                    namespace: String::new(),
                    kubeconfig,
                    fake: Some(server),
                    dir,
                }
            }
        };
        let mut env = env;
        env.namespace = format!("ct-{}", random_suffix());
        create_namespace(&env.client, &env.namespace).await;
        env
    }

    /// The fake, for the test `test` that uses its hooks (in both contract binaries).
    pub async fn fake_only(test: &str) -> Env {
        Env::fake_only_with(test, FakeApiServer::builder()).await
    }

    /// [`Env::fake_only`] with the Widget CRD installed.
    pub async fn fake_only_with_widgets(test: &str) -> Env {
        let env = Env::fake_only(test).await;
        env.install_widget_crd().await;
        env
    }

    /// Like [`Env::fake_only`], configuring the fake with `builder`.
    pub async fn fake_only_with(test: &str, builder: fake_apiserver::Builder) -> Env {
        println!("{test}: on the fake, whose hooks it uses");
        Env::on(None, builder).await
    }

    /// Whether this run targets the fake.
    pub fn is_fake(&self) -> bool {
        self.fake.is_some()
    }

    /// The fake (panics on a real cluster: call only from fake-only tests).
    pub fn server(&self) -> &FakeApiServer {
        self.fake.as_ref().expect("this test needs the fake")
    }

    /// A scratch directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Posts the Widget CRD (unless it exists) and waits until it is Established.
    pub async fn install_widget_crd(&self) {
        let crds: Api<DynamicObject> = Api::all_with(self.client.clone(), &crd_resource());
        let crd: DynamicObject = serde_json::from_value(widget_crd()).expect("crd");
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create CRD: {e}"),
        }
        for _ in 0..100 {
            let got = crds.get(WIDGET_CRD_NAME).await.expect("get CRD");
            let established = got
                .data
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                });
            if established {
                // The type is served right after Established.
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("CRD never became Established");
    }

    /// Widgets in the test namespace.
    pub fn widgets(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &widget_resource())
    }

    /// A raw request; returns status, headers and body.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, http::HeaderMap, String) {
        let mut builder = http::Request::builder().method(method).uri(path);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let request = builder
            .body(kube::client::Body::from(bytes))
            .expect("request");
        let response = self.client.send(request).await.expect("send");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    /// GETs `path`, asserts a 200 and returns the body as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        let (code, _, body) = self.raw("GET", path, &[], None).await;
        assert_eq!(code, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
    }

    /// Opens a watch and returns the raw response for line-by-line reading.
    pub async fn open_watch(&self, path_and_query: &str) -> WatchLines {
        let request = http::Request::builder()
            .uri(path_and_query)
            .body(kube::client::Body::empty())
            .expect("request");
        let response = self.client.send(request).await.expect("watch");
        WatchLines {
            status: response.status().as_u16(),
            content_type: response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            body: response.into_body(),
            buffer: Vec::new(),
        }
    }

    /// A kubectl command against this env (own cache dir, so ports reused across tests do not mix).
    pub fn kubectl_command(&self, args: &[&str]) -> std::process::Command {
        let mut command = std::process::Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("kubectl-cache"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command
    }

    /// Runs kubectl against this env.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_command(args).output().expect("run kubectl")
    }

    /// Runs kubectl with `stdin` piped in.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        test_servers::output_with_stdin(&mut self.kubectl_command(args), stdin)
            .expect("run kubectl with stdin")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if self.fake.is_none() && !self.namespace.is_empty() {
            // Best effort: leave no test namespace behind on a real cluster.
            let _ = self.kubectl(&["delete", "namespace", &self.namespace, "--wait=false"]);
        }
    }
}

/// A watch response read line by line.
pub struct WatchLines {
    pub status: u16,
    pub content_type: String,
    body: kube::client::Body,
    buffer: Vec<u8>,
}

impl WatchLines {
    /// The next event line, parsed; None when the stream has ended. Panics when neither an
    /// event nor the end comes within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(pos) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=pos).collect();
                let text = String::from_utf8_lossy(&line);
                if text.trim().is_empty() {
                    continue;
                }
                return Some(
                    serde_json::from_str(text.trim())
                        .unwrap_or_else(|e| panic!("watch line is not JSON ({e}): {text}")),
                );
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .unwrap_or_else(|_| {
                    panic!("no watch event and no end of the stream within {timeout:?}")
                })?;
            if let Ok(data) = frame.expect("watch frame").into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }

    /// The next non-BOOKMARK event.
    pub async fn next_change(&mut self, timeout: Duration) -> Option<Value> {
        loop {
            let ev = self.next(timeout).await?;
            if ev["type"] != "BOOKMARK" {
                return Some(ev);
            }
        }
    }
}

pub const WIDGET_GROUP: &str = "contract.turnstile.dev";
pub const WIDGET_CRD_NAME: &str = "widgets.contract.turnstile.dev";

/// A watch event's type and its object's name, e.g. `("ADDED", "a")`.
pub fn type_and_name(event: &Value) -> (&str, &str) {
    (
        event["type"].as_str().expect("event type"),
        event["object"]["metadata"]["name"]
            .as_str()
            .expect("object name"),
    )
}

pub fn crd_resource() -> ApiResource {
    ApiResource {
        group: "apiextensions.k8s.io".into(),
        version: "v1".into(),
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "CustomResourceDefinition".into(),
        plural: "customresourcedefinitions".into(),
    }
}

pub fn widget_resource() -> ApiResource {
    ApiResource {
        group: WIDGET_GROUP.into(),
        version: "v1".into(),
        api_version: format!("{WIDGET_GROUP}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

/// A Widget object.
pub fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{WIDGET_GROUP}/v1"),
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("widget")
}

/// The Widget CRD: status subresource, printer columns (incl. a `date` and a `string`
/// time column), a category and short name, a selectable field, defaults, bounds, an enum, a CEL
/// immutability rule and a preserve-unknown-fields field.
pub fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": WIDGET_CRD_NAME},
        "spec": {
            "group": WIDGET_GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList",
                      "shortNames": ["wg"], "categories": ["gadgets"]},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "selectableFields": [{"jsonPath": ".spec.color"}],
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Until", "type": "date", "jsonPath": ".status.expiresAt"},
                    {"name": "Expires", "type": "string", "jsonPath": ".status.expiresAt"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                "color": {"type": "string", "default": "blue", "enum": ["blue", "red"]},
                                "lockName": {"type": "string",
                                    "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "lockName is immutable"}]},
                                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                "note": {"type": "string", "nullable": true}
                            }
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "phase": {"type": "string"},
                                "expiresAt": {"type": "string", "format": "date-time"},
                                "observedGeneration": {"type": "integer"},
                                "conditions": {"type": "array", "items": {
                                    "type": "object", "required": ["type", "status"],
                                    "properties": {"type": {"type": "string"}, "status": {"type": "string"},
                                                   "reason": {"type": "string"}, "message": {"type": "string"}}}}
                            }
                        }
                    }
                }}
            }]
        }
    })
}

/// Creates the namespace `name` (panics on failure).
async fn create_namespace(client: &Client, name: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

/// The code of a kube API error.
pub fn api_code<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String, String) {
    match result {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Asserts that `result` is an API error with `code` and `reason`; returns its message.
#[track_caller]
pub fn expect_error<T: std::fmt::Debug>(
    result: Result<T, kube::Error>,
    code: u16,
    reason: &str,
) -> String {
    let (got_code, got_reason, message) = api_code(result);
    assert_eq!((got_code, got_reason.as_str()), (code, reason), "{message}");
    message
}

/// Asserts that `text` contains every one of `needles`.
#[track_caller]
pub fn assert_contains_all(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} not in {text:?}");
    }
}

/// Asserts that `result` is a 422 Invalid whose message contains every one of `needles`;
/// returns the message.
#[track_caller]
pub fn expect_invalid<T: std::fmt::Debug>(
    result: Result<T, kube::Error>,
    needles: &[&str],
) -> String {
    let message = expect_error(result, 422, "Invalid");
    assert_contains_all(&message, needles);
    message
}

/// The `name` of each item of the JSON array `items` (discovery groups, table columns, ...).
pub fn names_in(items: &Value) -> Vec<&str> {
    items
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {items}"))
        .iter()
        .map(|item| item["name"].as_str().expect("a name"))
        .collect()
}

impl Env {
    /// Creates one more namespace for a test (deleted with the env on a real cluster is not
    /// guaranteed; it carries the same random prefix).
    pub async fn new_namespace(env: &Env) -> String {
        let name = format!("{}-x", env.namespace);
        create_namespace(&env.client, &name).await;
        name
    }
}
