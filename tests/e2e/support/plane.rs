//! Which API server a test runs on: the real control plane of this test process (started by
//! `test-servers`), the cluster named by `TURNSTILE_E2E_KUBECONFIG`, or — only where the real
//! plane's binaries are not built and CI is not set — the fake API server, said once.
//! On a real plane the controller runs as the `deploy/` ServiceAccount with exactly the
//! installed RBAC (a token from the TokenRequest API, as a Pod would get one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use serde::Deserialize as _;
use serde_json::Value;
use test_servers::{ControlPlane, Unavailable};
use tokio::sync::OnceCell;

/// The variable naming a real cluster's kubeconfig (one a person or CI started).
pub const REAL_CLUSTER_ENV: &str = "TURNSTILE_E2E_KUBECONFIG";

/// The controller's ServiceAccount and namespace in `deploy/`.
pub const CONTROLLER_ACCOUNT: (&str, &str) = ("turnstile-system", "turnstile-controller");

/// The kinds of `deploy/` a test plane gets: who the controller is and what it may do, and the
/// CRDs (the Deployment is the in-process controller here).
const INSTALLED_KINDS: [&str; 7] = [
    "Namespace",
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// A real API server's admin kubeconfig, or None where tests fall back to the fake.
///
/// # Panics
/// When a real plane should be there and is not (under `CI=true`, or one that failed to
/// start): a test must fail, never pass on a stand-in.
pub async fn real_plane() -> Option<PathBuf> {
    if let Some(path) = test_servers::env_path(REAL_CLUSTER_ENV) {
        return Some(path);
    }
    let started = tokio::task::spawn_blocking(|| {
        ControlPlane::for_this_process().map(|plane| plane.kubeconfig().to_path_buf())
    })
    .await
    .expect("control plane start thread");
    match started {
        Ok(kubeconfig) => Some(kubeconfig),
        Err(Unavailable::Skip(why)) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                test_servers::record_skip(
                    "(the real control plane)",
                    &format!("the e2e tests of this binary ran on the fake API server: {why}"),
                );
            });
            None
        }
        Err(Unavailable::Fail(error)) => panic!("the real control plane is needed: {error}"),
    }
}

/// A control plane of the caller's own (for a test that stops parts of it, or changes what
/// every namespace sees), or None where tests fall back to the fake (binaries not built,
/// outside CI).
///
/// # Panics
/// As [`real_plane`].
pub async fn own_plane() -> Option<ControlPlane> {
    let started = tokio::task::spawn_blocking(ControlPlane::start)
        .await
        .expect("control plane start thread");
    match started {
        Ok(plane) => Some(plane),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && !test_servers::under_ci() => {
            println!("on the fake API server (the instant fallback): {error}");
            None
        }
        Err(error) => panic!("the real control plane is needed: {error}"),
    }
}

/// A kubeconfig for the controller's ServiceAccount on the plane of `admin` (made once per
/// plane and process): `deploy/`'s RBAC applied, a token minted for the account.
pub async fn controller_kubeconfig(admin: &Path) -> PathBuf {
    static MADE: Mutex<BTreeMap<PathBuf, Arc<OnceCell<PathBuf>>>> = Mutex::new(BTreeMap::new());
    let cell = MADE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry(admin.to_path_buf())
        .or_default()
        .clone();
    let admin = admin.to_path_buf();
    cell.get_or_init(|| async move {
        tokio::task::spawn_blocking(move || install_and_mint(&admin))
            .await
            .expect("RBAC thread")
    })
    .await
    .clone()
}

/// `deploy/` rendered by kustomize (once per process), only the [`INSTALLED_KINDS`].
pub fn installed_objects() -> Vec<Value> {
    static RENDERED: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    RENDERED
        .get_or_init(|| {
            let rendered = kubectl_ok(
                None,
                &["kustomize", &repo_path("deploy").display().to_string()],
            );
            serde_yaml::Deserializer::from_str(&rendered)
                .map(|document| Value::deserialize(document).expect("kustomize's YAML"))
                .filter(|object| {
                    object["kind"]
                        .as_str()
                        .is_some_and(|kind| INSTALLED_KINDS.contains(&kind))
                })
                .collect()
        })
        .clone()
}

/// `deploy/`'s leader-election Role and RoleBinding, made in `namespace` through the admin
/// kubeconfig at `admin`: a test's controller keeps its Lease in the test's namespace, with
/// exactly the rights the installed Role gives it in `turnstile-system`.
pub async fn leader_election_role_in(admin: &Path, namespace: &str) {
    let mut objects: Vec<Value> = installed_objects()
        .into_iter()
        .filter(|object| matches!(object["kind"].as_str(), Some("Role" | "RoleBinding")))
        .collect();
    for object in &mut objects {
        object["metadata"]["namespace"] = Value::from(namespace);
    }
    let list =
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string();
    let admin = admin.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["apply", "-f", "-"]);
        let output = test_servers::output_with_stdin(&mut command, &list).expect("run kubectl");
        assert!(
            output.status.success(),
            "kubectl apply the leader-election Role: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    })
    .await
    .expect("kubectl thread");
}

fn install_and_mint(admin: &Path) -> PathBuf {
    // Beside the admin kubeconfig in a plane of ours (removed with it); for a cluster named by
    // TURNSTILE_E2E_KUBECONFIG, a folder of its own.
    let dir = match admin.parent() {
        Some(parent)
            if parent.file_name().is_some_and(|name| {
                name.to_string_lossy()
                    .starts_with(test_servers::CONTROL_PLANE_DIR_PREFIX)
            }) =>
        {
            parent.to_path_buf()
        }
        _ => tempfile::Builder::new()
            .prefix("turnstile-controller-account-")
            .tempdir()
            .expect("tempdir")
            .keep(),
    };
    let objects = dir.join("installed.json");
    let list =
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": installed_objects()});
    std::fs::write(&objects, list.to_string()).expect("write objects");
    kubectl_ok(
        Some(admin),
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &objects.display().to_string(),
        ],
    );
    let (namespace, account) = CONTROLLER_ACCOUNT;
    let token = kubectl_ok(
        Some(admin),
        &[
            "create",
            "token",
            account,
            "-n",
            namespace,
            "--duration=48h",
        ],
    );
    let path = dir.join("controller.kubeconfig");
    std::fs::write(&path, with_token(admin, token.trim())).expect("write controller kubeconfig");
    path
}

/// The admin kubeconfig at `admin` with its user's credentials replaced by `token`.
pub fn with_token(admin: &Path, token: &str) -> String {
    let mut config: Value =
        serde_yaml::from_str(&std::fs::read_to_string(admin).expect("read kubeconfig"))
            .expect("kubeconfig YAML");
    for user in config["users"].as_array_mut().expect("users") {
        user["user"] = serde_json::json!({"token": token});
    }
    serde_yaml::to_string(&config).expect("kubeconfig")
}

/// A client for the cluster the kubeconfig at `path` names (its current context).
pub async fn client_for(path: &Path) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig");
    kube::Client::try_from(config).expect("client")
}

/// A path inside the repository.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// `kubectl ARGS` (with `--kubeconfig` when given); its standard output, or a panic with its
/// error.
pub fn kubectl_ok(kubeconfig: Option<&Path>, args: &[&str]) -> String {
    let mut command = Command::new("kubectl");
    if let Some(path) = kubeconfig {
        command.arg("--kubeconfig").arg(path);
    }
    let output = command.args(args).output().expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
