//! End-to-end test support: a real control plane (this test process's, or the cluster named
//! by `TURNSTILE_E2E_KUBECONFIG`; the fake API server only for tests that say why, see
//! [`plane`]) with the generated CRDs posted, a fresh namespace per test, the controller
//! running in-process (stoppable, restartable) as the `deploy/` ServiceAccount, `kubectl`,
//! and waiting helpers.

pub mod actor;
pub mod child;
pub mod dns;
#[path = "../../common/docs.rs"]
pub mod docs;
mod flows;
pub mod jobs;
#[path = "../../common/json.rs"]
pub mod json;
mod kubectl;
pub mod launch;
pub mod monitor;
#[path = "../../common/output.rs"]
pub mod output;
pub mod plane;
pub mod pods;
pub mod roles;
pub mod scrape;
#[path = "../../common/scratch.rs"]
pub mod scratch;
pub mod tls_front;
pub mod waits;

pub use monitor::HolderMonitor;
pub use waits::wait_object;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use turnstile_api::{ClaimPhase, DistributedLock, LockClaim, TOKEN_ANNOTATION};
use turnstile_controller::{run, ControllerConfig};
use turnstile_lock::{Backend as _, LockSnapshot, MongoBackend, MongoBackendConfig};

/// How long a test waits for the controller to reach a state.
pub const WAIT: Duration = Duration::from_secs(30);

/// A controller running in this process.
pub struct RunningController {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), turnstile_controller::ControllerError>>,
}

impl RunningController {
    /// Stops the controller and waits until it has stopped.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("controller stops in time")
            .expect("controller task")
            .expect("controller result");
    }
}

/// One test's API server, namespace and controller.
pub struct Env {
    /// A client for the test's own reads and writes (cluster admin).
    pub client: Client,
    /// The client the controller runs with: on a real plane the `deploy/` ServiceAccount's,
    /// so every flow passes with exactly the installed RBAC; on the fake the admin's.
    pub controller_client: Client,
    /// The test's namespace.
    pub namespace: String,
    /// A kubeconfig for `kubectl`.
    pub kubeconfig: PathBuf,
    /// The fake (None on a real cluster).
    pub fake: Option<FakeApiServer>,
    /// The control plane this test has to itself ([`Env::alone`]), stopped with it.
    pub own_plane: Option<test_servers::ControlPlane>,
    controller: Option<RunningController>,
    _dir: tempfile::TempDir,
}

fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

impl Env {
    /// The real control plane (see [`plane::real_plane`]), the CRDs installed, a fresh
    /// namespace; no controller.
    pub async fn new() -> Env {
        init_logging();
        match plane::real_plane().await {
            Some(path) => Env::on_cluster(&path).await,
            None => Env::on_fake_server(FakeApiServer::builder()).await,
        }
    }

    /// The fake API server configured by `fake`, the CRDs installed, a fresh namespace.
    async fn on_fake_server(fake: fake_apiserver::Builder) -> Env {
        Env::on_fake_server_in(fake, None).await
    }

    async fn on_fake_server_in(fake: fake_apiserver::Builder, namespace: Option<&str>) -> Env {
        init_logging();
        let dir = tempfile::tempdir().expect("tempdir");
        let server = fake.start().await.expect("start fake API server");
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let client = server.client();
        Env::in_fresh_namespace(
            client.clone(),
            client,
            kubeconfig,
            Some(server),
            dir,
            namespace,
        )
        .await
    }

    /// The CRDs installed and a fresh namespace (named `namespace`, else a random name) made
    /// through `client`.
    async fn in_fresh_namespace(
        client: Client,
        controller_client: Client,
        kubeconfig: PathBuf,
        fake: Option<FakeApiServer>,
        dir: tempfile::TempDir,
        namespace: Option<&str>,
    ) -> Env {
        let namespace = namespace.map_or_else(
            || format!("e2e-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            str::to_owned,
        );
        let env = Env {
            client,
            controller_client,
            namespace,
            kubeconfig,
            fake,
            own_plane: None,
            controller: None,
            _dir: dir,
        };
        env.install_crds().await;
        let namespaces: Api<Namespace> = Api::all(env.client.clone());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": env.namespace}})).expect("ns");
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        if env.fake.is_none() {
            plane::leader_election_role_in(&env.kubeconfig, &env.namespace).await;
            // Pods are admitted only once the service-account controller has made the
            // namespace's `default` ServiceAccount.
            let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &env.namespace);
            let deadline = Instant::now() + WAIT;
            while accounts
                .get_opt("default")
                .await
                .expect("get ServiceAccount")
                .is_none()
            {
                assert!(
                    Instant::now() < deadline,
                    "no default ServiceAccount in {}",
                    env.namespace
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        env
    }

    /// [`Env::new`] on the cluster of the admin kubeconfig at `path`: no fake and no hooks;
    /// the controller runs as the `deploy/` ServiceAccount.
    pub async fn on_cluster(path: &std::path::Path) -> Env {
        Env::on_cluster_in(path, None).await
    }

    async fn on_cluster_in(path: &std::path::Path, namespace: Option<&str>) -> Env {
        init_logging();
        let client = plane::client_for(path).await;
        let controller = plane::client_for(&plane::controller_kubeconfig(path).await).await;
        Env::in_fresh_namespace(
            client,
            controller,
            path.to_path_buf(),
            None,
            tempfile::tempdir().expect("tempdir"),
            namespace,
        )
        .await
    }

    /// Another cluster (a control plane of its own; a second fake where tests fall back to the
    /// fake) with a namespace of the same name as this test's: two clusters whose locks of the
    /// same name share one backend key.
    pub async fn another_cluster_like(&self) -> Env {
        match plane::own_plane().await {
            Some(plane) => {
                let mut env = Env::on_cluster_in(plane.kubeconfig(), Some(&self.namespace)).await;
                env.own_plane = Some(plane);
                env
            }
            None => Env::on_fake_server_in(FakeApiServer::builder(), Some(&self.namespace)).await,
        }
    }

    /// [`Env::new`] on a control plane of the test's own, for a test whose steps reach every
    /// namespace (the fake when there is no real plane here, see [`plane::own_plane`]).
    pub async fn alone() -> Env {
        match plane::own_plane().await {
            Some(plane) => {
                let mut env = Env::on_cluster(plane.kubeconfig()).await;
                env.own_plane = Some(plane);
                env
            }
            None => Env::on_fake_server(FakeApiServer::builder()).await,
        }
    }

    /// The fake API server, for a test that needs what only it does; `why` names that (a fault
    /// it injects, its request log, an object it stores past the schema).
    pub async fn fake_only(why: &str) -> Env {
        Env::fake_only_with(why, FakeApiServer::builder()).await
    }

    /// [`Env::fake_only`], with the fake configured by `fake`.
    pub async fn fake_only_with(why: &str, fake: fake_apiserver::Builder) -> Env {
        println!("on the fake API server: {why}");
        Env::on_fake_server(fake).await
    }

    /// [`Env::new`] with the default controller already running (memory backend).
    pub async fn started() -> Env {
        let mut env = Env::new().await;
        env.start_default_controller();
        env
    }

    /// [`Env::fake_only`] with the default controller already running.
    pub async fn fake_only_started(why: &str) -> Env {
        let mut env = Env::fake_only(why).await;
        env.start_default_controller();
        env
    }

    /// Whether this test runs on a real API server; if not (the fallback where no plane is
    /// built), says that `test` needs one, and under CI fails it.
    pub fn on_real_plane(&self, test: &str) -> bool {
        if self.fake.is_some() {
            test_servers::skip_or_fail(
                test,
                "it needs a real control plane",
                test_servers::under_ci(),
            );
        }
        self.fake.is_none()
    }

    /// The fake (panics on a real cluster).
    pub fn server(&self) -> &FakeApiServer {
        self.fake
            .as_ref()
            .expect("this step needs the fake API server")
    }

    /// Stores the claim `name` (uid `uid`) with `spec` in the fake as it is, past the schema
    /// (as one written before a schema change would be); `metadata` adds to its metadata.
    pub fn store_unvalidated_claim(
        &self,
        name: &str,
        uid: &str,
        metadata: serde_json::Value,
        spec: serde_json::Value,
    ) {
        let mut object = json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
            "metadata": {
                "name": name, "namespace": self.namespace, "uid": uid,
                "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1
            },
            "spec": spec
        });
        if let serde_json::Value::Object(extra) = metadata {
            object["metadata"]
                .as_object_mut()
                .expect("metadata")
                .extend(extra);
        }
        self.server()
            .store_unvalidated("turnstile.dev", "lockclaims", &self.namespace, object);
    }

    /// The lock `lock` of the test's namespace as the MongoDB at `uri` holds it, in the
    /// database and collection `config` names.
    pub async fn mongo_snapshot(
        &self,
        uri: &str,
        config: MongoBackendConfig,
        lock: &str,
    ) -> LockSnapshot {
        let reader = MongoBackend::connect(uri, config)
            .await
            .unwrap_or_else(|error| panic!("connect to MongoDB at {uri}: {error}"));
        reader
            .snapshot(&format!("{}/{lock}", self.namespace))
            .await
            .unwrap_or_else(|error| panic!("snapshot of {lock}: {error}"))
    }

    /// Posts the generated CRDs (as `turnstile crds` prints them) and waits until served.
    async fn install_crds(&self) {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        for crd in turnstile_api::crds() {
            match crds.create(&PostParams::default(), &crd).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    let name = crd.metadata.name.clone().expect("crd name");
                    let patch = json!({"spec": serde_json::to_value(&crd.spec).expect("spec")});
                    crds.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .expect("update CRD");
                }
                Err(error) => panic!("create CRD: {error}"),
            }
        }
        let locks = self.locks();
        let deadline = Instant::now() + WAIT;
        while locks.list(&Default::default()).await.is_err() {
            assert!(Instant::now() < deadline, "CRDs never served");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The controller watches only the test's namespace (on a real cluster another Turnstile
    /// may serve the rest).
    fn scoped(&self, mut config: ControllerConfig) -> ControllerConfig {
        config
            .namespace
            .get_or_insert_with(|| self.namespace.clone());
        config
    }

    /// Starts the controller in this process, watching the test's namespace.
    pub fn start_controller(&mut self, config: ControllerConfig) {
        let config = self.scoped(config);
        self.start_controller_as_configured(config);
    }

    /// Starts the default controller watching every namespace, as `deploy/` installs it (so it
    /// serves `ClusterDistributedLock`s too). Only on an API server of the test's own
    /// ([`Env::alone`], a fake): on a shared plane it would serve every other test's namespaces.
    pub fn start_controller_of_all_namespaces(&mut self) {
        self.start_controller_as_configured(ControllerConfig::default());
    }

    /// [`Env::spawn_controller_with`], the controller watching every namespace (see
    /// [`Env::start_controller_of_all_namespaces`]).
    pub fn spawn_controller_of_all_namespaces_with(
        &self,
        client: Client,
        config: ControllerConfig,
    ) -> RunningController {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            run(client, config, async {
                let _ = stopped.await;
            })
            .await
        });
        RunningController { stop, task }
    }

    fn start_controller_as_configured(&mut self, config: ControllerConfig) {
        assert!(self.controller.is_none(), "controller already running");
        let (stop, stopped) = oneshot::channel::<()>();
        let client = self.controller_client.clone();
        let task = tokio::spawn(async move {
            run(client, config, async {
                let _ = stopped.await;
            })
            .await
        });
        self.controller = Some(RunningController { stop, task });
    }

    /// Starts one more controller in this process (for leader election tests); the caller
    /// stops it.
    pub fn spawn_controller(&self, config: ControllerConfig) -> RunningController {
        self.spawn_controller_with(self.controller_client.clone(), config)
    }

    /// Starts one more controller in this process using `client` (e.g. an
    /// [`actor::tagged_client`]); the caller stops it.
    pub fn spawn_controller_with(
        &self,
        client: Client,
        config: ControllerConfig,
    ) -> RunningController {
        self.spawn_controller_of_all_namespaces_with(client, self.scoped(config))
    }

    /// Starts the controller with the default configuration (memory backend).
    pub fn start_default_controller(&mut self) {
        self.start_controller(ControllerConfig::default());
    }

    /// Starts the default controller with its metrics server on a free loopback port, and
    /// returns that address.
    pub fn start_controller_serving_metrics(&mut self) -> std::net::SocketAddr {
        let addr = scrape::free_addr();
        self.start_controller(ControllerConfig {
            metrics_addr: Some(addr),
            ..ControllerConfig::default()
        });
        addr
    }

    /// Stops the controller and waits until it has stopped.
    pub async fn stop_controller(&mut self) {
        let running = self.controller.take().expect("controller running");
        running.stop().await;
    }

    /// The API path of `rest` (`lockclaims`, `lockclaims/a/status`, …) among the turnstile
    /// objects of the test namespace, for the fake's fault injection.
    pub fn turnstile_path(&self, rest: &str) -> String {
        format!(
            "/apis/turnstile.dev/v1alpha1/namespaces/{}/{rest}",
            self.namespace
        )
    }

    /// Claims in the test namespace.
    pub fn claims(&self) -> Api<LockClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Locks in the test namespace.
    pub fn locks(&self) -> Api<DistributedLock> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Applies the claim `name` on `lock` (with extra spec lines) and waits until it is `Held`.
    pub async fn hold(&self, name: &str, lock: &str, extra_spec: &str) -> LockClaim {
        self.apply_claim(name, lock, extra_spec);
        self.wait_phase(name, ClaimPhase::Held).await
    }

    /// [`Env::hold`], asserting the claim was `Held` within `limit` of being applied (`why`
    /// says what it shows, for the message).
    pub async fn hold_within(
        &self,
        limit: Duration,
        why: &str,
        name: &str,
        lock: &str,
    ) -> LockClaim {
        let applied = Instant::now();
        let held = self.hold(name, lock, "").await;
        let took = applied.elapsed();
        assert!(took < limit, "{why}: {name} was held only after {took:?}");
        held
    }

    /// Applies claims `a`, `b`, `c` on `lock` (in that order) and waits until `a` holds it and
    /// `b`, `c` wait at positions 1 and 2 (a mutex).
    pub async fn queue_of_three(&self, lock: &str) {
        for name in ["a", "b", "c"] {
            self.apply_claim(name, lock, "");
        }
        self.wait_phase("a", ClaimPhase::Held).await;
        self.wait_claim("b", |c| position_of(c) == Some(1)).await;
        self.wait_claim("c", |c| position_of(c) == Some(2)).await;
    }

    /// Deletes the holder `holder` and waits until `next` holds the lock with fencing token
    /// `token` (the hand-off every backend test checks).
    pub async fn hand_off(&self, holder: &str, next: &str, token: i64) -> LockClaim {
        self.delete_claim(holder).await;
        let next_claim = self.wait_phase(next, ClaimPhase::Held).await;
        assert_eq!(
            token_of(&next_claim),
            Some(token),
            "{next}'s token after {holder} let go"
        );
        next_claim
    }

    /// With `a` holding and `b`, `c` queued (as [`Env::queue_of_three`] leaves them): hands
    /// the lock on to `b`, then `c`, checks `monitor` saw tokens 1, 2, 3 and never two holders,
    /// and stops the controller.
    pub async fn hand_on_down_the_queue(&mut self, monitor: HolderMonitor) {
        self.hand_off("a", "b", 2).await;
        self.hand_off("b", "c", 3).await;
        let report = monitor.finish().await;
        assert_eq!(report.tokens(), [1, 2, 3]);
        self.stop_controller().await;
    }

    /// With `holder` holding `lock` and the claim `first` waiting first in line (its arrival
    /// recorded): applies `second` (a name that sorts before `first`'s) and checks it queues
    /// behind `first` by arrival, position and grant.
    pub async fn a_later_claim_queues_behind(
        &self,
        lock: &str,
        holder: &str,
        first: &LockClaim,
        second: &str,
    ) {
        let first_name = first.metadata.name.clone().unwrap_or_default();
        self.apply_claim(second, lock, "");
        let later = self.wait_claim(second, |c| position_of(c) == Some(2)).await;
        assert!(
            arrival_of(first) < arrival_of(&later),
            "{:?} then {:?}",
            arrival_of(first),
            arrival_of(&later)
        );
        self.wait_claim(&first_name, |c| position_of(c) == Some(1))
            .await;
        self.delete_claim(holder).await;
        self.wait_phase(&first_name, ClaimPhase::Held).await;
        assert_eq!(
            phase_of(&self.claim(second).await),
            Some(ClaimPhase::Pending)
        );
    }

    /// Claims `a` (granted, token 1) and `b` (waiting first in line) on `lock`.
    pub async fn a_holds_and_b_waits(&self, lock: &str) {
        self.apply_claim("a", lock, "");
        let a = self.wait_phase("a", ClaimPhase::Held).await;
        assert_eq!(token_of(&a), Some(1));
        self.apply_claim("b", lock, "");
        self.wait_claim("b", |c| position_of(c) == Some(1)).await;
    }

    /// With `a` holding lock `db` (token 1) and `b` waiting, just after their backend went
    /// away: creates `c`, whose pass finds the backend gone, and checks what the README
    /// promises: `Ready=False` (`BackendUnavailable`) with its Event, `b` still `Pending` with
    /// that reason, and `a` keeping its grant and token.
    pub async fn backend_gone_while_a_holds_and_b_waits(&self) {
        self.apply_claim("c", "db", "");
        let ready = self.wait_ready("db", "False").await;
        assert_eq!(ready.reason, "BackendUnavailable");
        self.wait_event("db", "BackendUnavailable").await;
        self.wait_pending_for("b", "BackendUnavailable").await;
        let during = self.claim("a").await;
        assert_eq!(
            phase_of(&during),
            Some(ClaimPhase::Held),
            "a keeps its grant"
        );
        assert_eq!(token_of(&during), Some(1));
    }

    /// Reads a claim: None if there is none of that name.
    pub async fn claim_opt(&self, name: &str) -> Option<LockClaim> {
        self.claims().get_opt(name).await.expect("get claim")
    }

    /// Reads a claim.
    pub async fn claim(&self, name: &str) -> LockClaim {
        self.claims().get(name).await.expect("get claim")
    }

    /// How many of the namespace's claims are `Held` now (one list).
    pub async fn held_count(&self) -> usize {
        let claims = self.claims().list(&Default::default()).await.expect("list");
        claims
            .items
            .iter()
            .filter(|claim| phase_of(claim) == Some(ClaimPhase::Held))
            .count()
    }

    /// Reads a lock.
    pub async fn lock(&self, name: &str) -> DistributedLock {
        self.locks().get(name).await.expect("get lock")
    }

    /// Writes to LockClaims and DistributedLocks (status included) served so far.
    pub fn lock_and_claim_writes(&self) -> Vec<String> {
        self.server()
            .request_log()
            .iter()
            .filter(|request| {
                matches!(request.verb.as_str(), "update" | "patch")
                    && matches!(request.resource.as_str(), "lockclaims" | "distributedlocks")
            })
            .map(|request| format!("{} {}", request.verb, request.path))
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(running) = self.controller.take() {
            let _ = running.stop.send(());
            running.task.abort();
        }
    }
}

/// The fencing token in `annotations` (a gated workload's, or its Pod template's), as the
/// controller writes it there for the downward API.
pub fn token_annotation(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Option<String> {
    annotations?.get(TOKEN_ANNOTATION).cloned()
}

/// `sh -c SCRIPT` in a mount namespace of its own (`unshare --mount`, as root), with
/// `$TURNSTILE` the built binary and stdin closed, stdout and stderr piped; what the script
/// mounts there (a service account, a `resolv.conf`) no other process sees.
pub fn in_own_mount_namespace(script: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("TURNSTILE", env!("CARGO_BIN_EXE_turnstile"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Writes at `path` a kubeconfig whose only cluster is `http://127.0.0.1:PORT`, with the
/// context's namespace `namespace` (for a test whose API server cannot be reached: nothing
/// listens on a port just found free).
pub fn write_unreachable_kubeconfig(path: &std::path::Path, port: u16, namespace: &str) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: gone\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: gone\n  context:\n    cluster: gone\n    user: nobody\n    namespace: {namespace}\n\
             current-context: gone\nusers:\n- name: nobody\n  user: {{}}\n"
        ),
    )
    .unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
}

/// Creates namespace `namespace` and, in it, the memory lock `lock` and the claim `claim` on
/// it (for a test about a namespace other than its own); returns the claims of that namespace.
pub async fn namespace_with_a_claim(
    client: &Client,
    namespace: &str,
    lock: &str,
    claim: &str,
) -> Api<LockClaim> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create_from_json(&namespaces, json!({"metadata": {"name": namespace}})).await;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), namespace);
    create_from_json(
        &locks,
        json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "DistributedLock",
            "metadata": {"name": lock}, "spec": {"leaseDurationSeconds": 300}
        }),
    )
    .await;
    let claims: Api<LockClaim> = Api::namespaced(client.clone(), namespace);
    create_from_json(
        &claims,
        json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
            "metadata": {"name": claim}, "spec": {"lockName": lock}
        }),
    )
    .await;
    claims
}

/// Creates the object `object` (JSON, as `kubectl` would send it) through `api`; panics if
/// it does not decode or the API server refuses it.
pub async fn create_from_json<K>(api: &Api<K>, object: serde_json::Value) -> K
where
    K: Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let typed: K = serde_json::from_value(object.clone())
        .unwrap_or_else(|error| panic!("{object} does not decode: {error}"));
    api.create(&PostParams::default(), &typed)
        .await
        .unwrap_or_else(|error| panic!("create {object}: {error}"))
}

/// A claim's phase.
pub fn phase_of(claim: &LockClaim) -> Option<ClaimPhase> {
    claim.status.as_ref().and_then(|status| status.phase)
}

/// A claim's fencing token.
pub fn token_of(claim: &LockClaim) -> Option<i64> {
    claim
        .status
        .as_ref()
        .and_then(|status| status.fencing_token)
}

/// A claim's fencing token on `lock` (its own, or its `status.locks` entry's when it names
/// several locks).
pub fn token_on(claim: &LockClaim, lock: &str) -> Option<i64> {
    if !claim.spec.is_multi_lock() {
        return token_of(claim);
    }
    claim
        .status
        .as_ref()?
        .locks
        .iter()
        .find(|entry| entry.lock_name == lock)
        .map(|entry| entry.fencing_token)
}

/// A claim's fencing token on each of its locks, as its `status.locks` records them.
pub fn lock_tokens(claim: &LockClaim) -> Vec<(String, i64)> {
    claim
        .status
        .iter()
        .flat_map(|status| &status.locks)
        .map(|entry| (entry.lock_name.clone(), entry.fencing_token))
        .collect()
}

/// Sets the annotation `key` to `value` on the object `name` of `api` (a change that wakes
/// whoever watches it, and nothing else).
pub async fn annotate<K>(api: &Api<K>, name: &str, key: &str, value: &str)
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
    )
    .await
    .unwrap_or_else(|error| panic!("annotate {name}: {error}"));
}

/// A claim's recorded arrival (`status.arrivedAt`), in microseconds.
pub fn arrival_of(claim: &LockClaim) -> Option<i64> {
    let status = claim.status.as_ref()?;
    Some(status.arrived_at.as_ref()?.0.as_microsecond())
}

/// A claim's queue position.
pub fn position_of(claim: &LockClaim) -> Option<i32> {
    claim.status.as_ref().and_then(|status| status.position)
}

/// A claim's reason.
pub fn reason_of(claim: &LockClaim) -> Option<String> {
    claim
        .status
        .as_ref()
        .and_then(|status| status.reason.clone())
}
