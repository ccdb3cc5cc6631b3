//! The API server a run drives, and where it reads what the controller asked of it: the fake
//! (its request log, the bench's own requests tagged apart) or a real control plane of the
//! run's own (the kube-apiserver's audit log of writes; the controller runs as the `deploy/`
//! ServiceAccount, so the log's user names its requests).

use std::path::{Path, PathBuf};

use fake_apiserver::{FakeApiServer, RecordedRequest};
use kube::Client;
use serde_json::Value;
use test_servers::ControlPlane;

use crate::{actor, plane};

/// Which API server a run uses (`TURNSTILE_BENCH_PLANE`: `fake`, the default, or `real`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    /// The repository's fake API server, in this process.
    Fake,
    /// A real control plane (etcd, kube-apiserver, …) built from the Go modules.
    Real,
}

impl Plane {
    /// The plane `TURNSTILE_BENCH_PLANE` names (as `lookup` finds it); an unknown value is an
    /// error naming it.
    pub fn read(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        match lookup("TURNSTILE_BENCH_PLANE").as_deref().map(str::trim) {
            None | Some("" | "fake") => Ok(Plane::Fake),
            Some("real") => Ok(Plane::Real),
            Some(other) => Err(format!(
                "TURNSTILE_BENCH_PLANE must be fake or real, got {other:?}"
            )),
        }
    }
}

/// The running API server of a bench.
pub(super) enum Server {
    Fake(FakeApiServer),
    Real(ControlPlane),
}

/// The user the controller's requests carry on a real plane.
const CONTROLLER_USER: &str = "system:serviceaccount:turnstile-system:turnstile-controller";

impl Server {
    /// Starts `plane`.
    pub(super) async fn start(plane: Plane) -> Self {
        match plane {
            Plane::Fake => Server::Fake(FakeApiServer::start().await.expect("fake API server")),
            Plane::Real => Server::Real(
                tokio::task::spawn_blocking(ControlPlane::start)
                    .await
                    .expect("control plane thread")
                    .expect("a real control plane (bash scripts/control-plane.sh build)"),
            ),
        }
    }

    /// Whether the CRDs are already installed (a real plane installs them at start).
    pub(super) fn has_crds(&self) -> bool {
        matches!(self, Server::Real(_))
    }

    /// The bench's own client: tagged on the fake; the admin's on a real plane.
    pub(super) async fn bench_client(&self) -> Client {
        match self {
            Server::Fake(server) => actor::tagged_client(server, super::BENCH),
            Server::Real(plane) => plane::client_for(plane.kubeconfig()).await,
        }
    }

    /// A kubeconfig for the controller, written into `dir`: the fake's, or on a real plane the
    /// `deploy/` ServiceAccount's (its RBAC applied, a token minted).
    pub(super) async fn controller_kubeconfig(&self, dir: &Path) -> PathBuf {
        match self {
            Server::Fake(server) => {
                let kubeconfig = dir.join("kubeconfig");
                server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
                kubeconfig
            }
            Server::Real(plane) => plane::controller_kubeconfig(plane.kubeconfig()).await,
        }
    }

    /// Every request of the controller served so far (on a real plane: its writes).
    pub(super) fn controller_requests(&self) -> Vec<RecordedRequest> {
        match self {
            Server::Fake(server) => server
                .request_log()
                .into_iter()
                .filter(|r| !actor::sent_by(r, super::BENCH) && r.is_resource_request)
                .collect(),
            Server::Real(plane) => audited(plane)
                .filter(|entry| entry["user"]["username"] == CONTROLLER_USER)
                .map(|entry| recorded(&entry))
                .collect(),
        }
    }

    /// How many requests the server has logged (on a real plane: writes), to see it settle.
    pub(super) fn request_count(&self) -> usize {
        match self {
            Server::Fake(server) => server.request_count(),
            Server::Real(plane) => audited(plane).count(),
        }
    }

    /// What the machine line says of the API server.
    pub(super) fn describe(&self) -> &'static str {
        match self {
            Server::Fake(_) => "fake API server in-process",
            Server::Real(_) => {
                "real control plane (kube-apiserver v1.37.2 with TLS and RBAC, etcd v3.6.16 with fsync) on 127.0.0.1; writes counted in its audit log"
            }
        }
    }
}

/// The requests in the plane's audit log (one JSON object a line; by its policy every request
/// of a ServiceAccount and every write), each once: a watch is logged when its response
/// starts and again when it ends, so its end is left out.
fn audited(plane: &ControlPlane) -> impl Iterator<Item = Value> {
    let text = std::fs::read_to_string(&plane.files().audit_log).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|entry| !(entry["verb"] == "watch" && entry["stage"] == "ResponseComplete"))
        .collect::<Vec<_>>()
        .into_iter()
}

/// An audit entry as the fake's request log records a request.
fn recorded(entry: &Value) -> RecordedRequest {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    let object = &entry["objectRef"];
    RecordedRequest {
        method: String::new(),
        path: text(&entry["requestURI"]),
        query: String::new(),
        verb: text(&entry["verb"]),
        is_resource_request: !object.is_null(),
        api_group: text(&object["apiGroup"]),
        api_version: text(&object["apiVersion"]),
        resource: text(&object["resource"]),
        subresource: text(&object["subresource"]),
        namespace: text(&object["namespace"]),
        name: text(&object["name"]),
        content_type: String::new(),
        status: entry["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
        injected_fault: false,
        received: std::time::Instant::now(),
        answered: std::time::Instant::now(),
    }
}
