//! `turnstile wait` end to end: the built binary against the fake API server (`KUBECONFIG`
//! pointing at it). The test plays the controller, writing the claim's status through
//! `/status`, so these tests do not depend on the controller.
//!
//! - a claim that becomes Held (after Pending) prints its token and exits 0, on the watch;
//! - Failed / Expired / Released exit 3 / 4 / 5 with one line naming phase and reason;
//! - `--timeout` exits 75 naming where the claim stands;
//! - a missing DistributedLock exits 6 (before creating anything, and when the status says
//!   LockNotFound); a LockNotFound status for a lock that exists by now keeps waiting;
//! - a missing or deleted claim exits 7;
//! - `--create` makes the claim owned by the Pod from the downward API variables, adopts it
//!   again after a restart, refuses another Pod's claim (8), and `--token-file` gets the token.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use support::child::one_line_exit;
use support::child::{finish_within, spawn_captured};
use support::docs::docs_page;
use support::output::{stderr, stdout};
use support::roles::{example_role, verbs};
use support::tls_front::tls_front;
use support::{namespace_with_a_claim, write_unreachable_kubeconfig};
use tokio::process::{Child, Command};
use turnstile_api::{DistributedLock, LockClaim};

/// Upper bound on anything that should finish in a few seconds, even on a loaded box.
const PATIENCE: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "default";

/// The status the controller writes on a claim of the missing lock `db`.
fn lock_db_not_found() -> Value {
    json!({"phase": "Pending", "reason": "LockNotFound", "message": "DistributedLock db does not exist"})
}

/// Creates `object` (its JSON) through `api`.
async fn create<K>(api: &Api<K>, object: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let object: K = serde_json::from_value(object).expect("a valid object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create");
}

/// Deletes `name` through `api`.
async fn delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete");
}

/// A fake API server with the CRDs registered and a kubeconfig file for the binary.
struct Cluster {
    server: FakeApiServer,
    client: kube::Client,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Self {
        let server = FakeApiServer::start().await.expect("fake apiserver");
        let client = server.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in turnstile_api::crds() {
            crds.create(&PostParams::default(), &crd)
                .await
                .expect("register CRD");
        }
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        Cluster {
            server,
            client,
            kubeconfig,
            _dir: dir,
        }
    }

    /// [`Cluster::start`], with the DistributedLock `lock`.
    async fn with_lock(lock: &str) -> Self {
        let cluster = Cluster::start().await;
        cluster.create_lock(lock).await;
        cluster
    }

    fn claims(&self) -> Api<LockClaim> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn locks(&self) -> Api<DistributedLock> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    async fn create_lock(&self, name: &str) {
        let lock = json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "DistributedLock",
            "metadata": {"name": name}, "spec": {}
        });
        create(&self.locks(), lock).await;
    }

    async fn create_claim(&self, name: &str, lock: &str) {
        let claim = json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
            "metadata": {"name": name}, "spec": {"lockName": lock}
        });
        create(&self.claims(), claim).await;
    }

    /// Plays the controller: writes the claim's status.
    async fn set_status(&self, claim: &str, status: Value) {
        self.claims()
            .patch_status(
                claim,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .unwrap();
    }

    /// `turnstile wait ARGS…` with only `KUBECONFIG` (and `extra_env`) set for it.
    fn spawn_wait(&self, args: &[&str], extra_env: &[(&str, &str)]) -> Child {
        let mut command = Command::new(env!("CARGO_BIN_EXE_turnstile"));
        command
            .arg("wait")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_UID")
            .envs(extra_env.iter().copied());
        spawn_captured(&mut command, Stdio::null(), "turnstile wait")
    }

    /// Spawns `turnstile wait` on the claim `args[0]` and returns once it is watching it.
    async fn waiting(&self, args: &[&str], extra_env: &[(&str, &str)]) -> Child {
        let child = self.spawn_wait(args, extra_env);
        self.watched(args[0]).await;
        child
    }

    /// Waits until some process is watching claim `name` (the initial list is done).
    async fn watched(&self, name: &str) {
        let selector = format!("metadata.name%3D{name}");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let watching = self.server.request_log().iter().any(|request| {
                request.verb == "watch"
                    && request.resource == "lockclaims"
                    && (request.query.contains(&selector)
                        || request.query.contains(&format!("metadata.name={name}")))
            });
            if watching {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nobody watches claim {name}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn finish(child: Child) -> Output {
    finish_within(PATIENCE, child, "turnstile wait").await
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("exited normally")
}

/// Exited `expected` (non-zero) with exactly one stderr line starting `turnstile: `, as the
/// README promises for every failure; returns that line.
fn one_line_failure(output: &Output, expected: i32) -> String {
    one_line_exit(output, expected, "turnstile wait")
}

fn pending(position: i32) -> Value {
    json!({"phase": "Pending", "position": position, "reason": "Queued",
           "message": format!("position {position} in the queue")})
}

fn held(token: i64) -> Value {
    json!({"phase": "Held", "fencingToken": token, "reason": "Acquired", "holderIdentity": "c"})
}

#[tokio::test]
async fn prints_the_token_once_the_claim_is_held() {
    let cluster = Cluster::with_lock("db").await;
    cluster.create_claim("job-a", "db").await;
    let waiting = cluster
        .waiting(&["job-a"], &[("POD_NAMESPACE", NAMESPACE)])
        .await;
    cluster.set_status("job-a", pending(2)).await;
    cluster.set_status("job-a", pending(1)).await;
    cluster.set_status("job-a", held(42)).await;
    let output = finish(waiting).await;
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(stdout(&output), "42\n");
    assert_eq!(stderr(&output), "");
}

#[tokio::test]
async fn terminal_phases_exit_with_their_codes_and_reasons() {
    let cluster = Cluster::with_lock("db").await;
    let cases = [
        (
            "failed",
            json!({"phase": "Failed", "reason": "AcquireTimeout",
                          "message": "not granted within acquireTimeoutSeconds (60s)"}),
            3,
        ),
        (
            "expired",
            json!({"phase": "Expired", "reason": "LeaseExpired",
                           "message": "lease ran out", "fencingToken": 9}),
            4,
        ),
        (
            "released",
            json!({"phase": "Released", "reason": "Withdrawn",
                            "message": "withdrawn (spec.release) before it was granted"}),
            5,
        ),
    ];
    for (name, status, expected) in cases {
        cluster.create_claim(name, "db").await;
        let waiting = cluster
            .waiting(&[name, "--namespace", NAMESPACE], &[])
            .await;
        cluster.set_status(name, pending(1)).await;
        let reason = status["reason"].as_str().unwrap().to_owned();
        let phase = status["phase"].as_str().unwrap().to_owned();
        cluster.set_status(name, status).await;
        let output = finish(waiting).await;
        one_line_failure(&output, expected);
        assert_eq!(
            stdout(&output),
            "",
            "{name}: no token for a claim that is not held"
        );
        let line = stderr(&output);
        assert_eq!(line.lines().count(), 1, "one line: {line}");
        assert!(line.starts_with("turnstile: "), "{line}");
        assert!(line.contains(&format!("LockClaim {name}")), "{line}");
        assert!(
            line.contains(&format!("it is {phase} ({reason}:")),
            "{line}"
        );
    }
}

#[tokio::test]
async fn timeout_exits_75_and_says_where_the_claim_stands() {
    let cluster = Cluster::with_lock("db").await;
    cluster.create_claim("slow", "db").await;
    cluster.set_status("slow", pending(3)).await;
    let output = finish(cluster.spawn_wait(&["slow", "--timeout", "1s"], &[])).await;
    let line = one_line_failure(&output, 75);
    assert!(line.contains("timed out after 1s"), "{line}");
    assert!(
        line.contains("Pending, position 3 (Queued: position 3 in the queue)"),
        "{line}"
    );
    // The claim keeps its place: a restarted init container finds it again.
    let claim = cluster
        .claims()
        .get("slow")
        .await
        .expect("the claim is still there");
    assert_eq!(claim.metadata.deletion_timestamp, None);
    assert_eq!(claim.spec.release, None, "not released");
    assert_eq!(claim.status.and_then(|s| s.position), Some(3));
}

#[tokio::test]
async fn a_missing_lock_exits_6() {
    let cluster = Cluster::start().await;
    let pod_env = [
        ("POD_NAME", "web-0"),
        ("POD_UID", "0b0d3a9e-0000-4000-8000-000000000001"),
    ];

    // --create checks the lock first and leaves nothing behind.
    let output =
        finish(cluster.spawn_wait(&["web-0-db", "--create", "--lock", "nope"], &pod_env)).await;
    let line = one_line_failure(&output, 6);
    assert!(
        line.contains("DistributedLock nope does not exist"),
        "{line}"
    );
    assert!(cluster
        .claims()
        .get_opt("web-0-db")
        .await
        .unwrap()
        .is_none());

    // An existing claim for a lock that does not exist.
    cluster.create_claim("orphan", "gone").await;
    let output = finish(cluster.spawn_wait(&["orphan"], &[])).await;
    one_line_failure(&output, 6);

    // The lock is deleted while we wait, and the controller says so.
    cluster.create_lock("db").await;
    cluster.create_claim("c", "db").await;
    let waiting = cluster.waiting(&["c"], &[]).await;
    delete(&cluster.locks(), "db").await;
    cluster.set_status("c", lock_db_not_found()).await;
    let output = finish(waiting).await;
    one_line_failure(&output, 6);
}

#[tokio::test]
async fn a_stale_lock_not_found_status_keeps_waiting_while_the_lock_exists() {
    let cluster = Cluster::with_lock("db").await;
    cluster.create_claim("early", "db").await;
    let waiting = cluster.waiting(&["early"], &[]).await;
    // Written before the lock existed, say; the lock exists now.
    cluster.set_status("early", lock_db_not_found()).await;
    cluster.set_status("early", held(5)).await;
    let output = finish(waiting).await;
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(stdout(&output), "5\n");
}

#[tokio::test]
async fn a_missing_or_deleted_claim_exits_7() {
    let cluster = Cluster::with_lock("db").await;
    let output = finish(cluster.spawn_wait(&["never-made"], &[])).await;
    one_line_failure(&output, 7);
    assert!(stderr(&output).contains("LockClaim never-made in namespace default does not exist"));

    cluster.create_claim("doomed", "db").await;
    let waiting = cluster.waiting(&["doomed"], &[]).await;
    delete(&cluster.claims(), "doomed").await;
    let output = finish(waiting).await;
    let line = one_line_failure(&output, 7);
    assert!(line.contains("was deleted"), "{line}");
}

async fn create_pod(cluster: &Cluster, name: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]}
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    pod.metadata.uid.expect("uid")
}

/// The downward API variables of the Pod `name` with `uid`, as `--create` reads them.
fn downward_api<'a>(name: &'a str, uid: &'a str) -> [(&'static str, &'a str); 3] {
    [
        ("POD_NAME", name),
        ("POD_NAMESPACE", NAMESPACE),
        ("POD_UID", uid),
    ]
}

fn read_token(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[tokio::test]
async fn create_makes_the_claim_owned_by_the_pod_and_adopts_it_on_restart() {
    let cluster = Cluster::with_lock("db").await;
    let uid = create_pod(&cluster, "web-0").await;
    let env = downward_api("web-0", &uid);
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    let token_arg = token_file.to_str().unwrap();
    let args = [
        "web-0-db",
        "--create",
        "--lock",
        "db",
        "--token-file",
        token_arg,
    ];

    let waiting = cluster.waiting(&args, &env).await;
    let claim = cluster.claims().get("web-0-db").await.unwrap();
    assert_eq!(claim.spec.lock_name, "db");
    let owners = claim.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let owner = &owners[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        ("v1", "Pod", "web-0", uid.as_str())
    );
    assert_eq!(owner.controller, Some(true));

    cluster.set_status("web-0-db", held(7)).await;
    let output = finish(waiting).await;
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(stdout(&output), "7\n");
    assert_eq!(read_token(&token_file), "7\n");

    // An init container restart finds its own claim: no error, same grant.
    let again = finish(cluster.spawn_wait(&args, &env)).await;
    assert_eq!(code(&again), 0, "{}", stderr(&again));
    assert_eq!(stdout(&again), "7\n");
    let creates = cluster
        .server
        .request_log()
        .iter()
        .filter(|r| r.verb == "create" && r.resource == "lockclaims")
        .map(|r| r.status)
        .collect::<Vec<_>>();
    assert_eq!(creates, [201, 409], "created once, then found existing");

    // Another Pod reusing the name must not take this Pod's grant for its own.
    let other_uid = create_pod(&cluster, "web-1").await;
    let other_env = downward_api("web-1", &other_uid);
    let stolen =
        finish(cluster.spawn_wait(&["web-0-db", "--create", "--lock", "db"], &other_env)).await;
    let line = one_line_failure(&stolen, 8);
    assert!(line.contains("belongs to Pod web-0"), "{line}");
    assert_eq!(stdout(&stolen), "");

    // The same Pod asking for another lock under this claim's name: refused too.
    cluster.create_lock("other").await;
    let other_lock =
        finish(cluster.spawn_wait(&["web-0-db", "--create", "--lock", "other"], &env)).await;
    let line = one_line_failure(&other_lock, 8);
    assert!(
        line.starts_with("turnstile: ") && line.contains("already exists for lock \"db\""),
        "{line}"
    );
}

/// The numeric exit codes in `text` (a `--help` section or a README table): each
/// whitespace- or `/`-separated number at the start of a code cell, `128+N` and "the
/// command's own" left out.
fn numeric_codes<'a>(cells: impl Iterator<Item = &'a str>) -> BTreeSet<u8> {
    cells
        .flat_map(|cell| cell.split('/'))
        .filter_map(|code| code.trim().parse().ok())
        .collect()
}

/// Each command's `--help` ends with its exit codes, and its docs page lists the very same
/// codes: `wait` and `lock` in their `| exit | meaning |` tables, `queue` in its "Exit codes:"
/// line. (The help lists are made from the code's constants.)
#[test]
fn each_commands_help_and_its_docs_page_list_the_same_exit_codes() {
    // The first `| exit | meaning |` table of a page.
    let table = |page: &str| -> BTreeSet<u8> {
        let text = docs_page(page);
        let table = text
            .split("| exit | meaning |\n|---|---|\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{page} has no exit code table"));
        let rows = table.lines().take_while(|line| line.starts_with('|'));
        numeric_codes(rows.map(|row| row.split('|').nth(1).unwrap_or_default()))
    };
    let tables = [
        table("how-to/turnstile-wait.md"),
        table("how-to/turnstile-lock.md"),
    ];
    let operating = docs_page("how-to/operating.md");
    let queue_line = operating
        .split("- Exit codes: ")
        .nth(1)
        .and_then(|rest| rest.split(" (one `turnstile:` line").next())
        .expect("how-to/operating.md: the queue's exit codes");
    let queue_codes = numeric_codes(
        queue_line
            .split(';')
            .map(|entry| entry.split_whitespace().next().unwrap_or_default()),
    );
    for (command, docs_codes) in [
        ("wait", &tables[0]),
        ("lock", &tables[1]),
        ("queue", &queue_codes),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args([command, "--help"])
            .stdin(Stdio::null())
            .output()
            .expect("run turnstile --help");
        assert_eq!(code(&output), 0, "{command}");
        let help = stdout(&output);
        let section = help
            .split("Exit codes:")
            .nth(1)
            .unwrap_or_else(|| panic!("{command} --help has no exit codes: {help}"));
        // Each line: two spaces, the code cell, at least two spaces, the meaning.
        let help_codes = numeric_codes(
            section
                .lines()
                .filter_map(|line| line.trim().split("  ").next()),
        );
        assert!(help_codes.len() >= 3, "{command}: {help_codes:?} in {help}");
        assert_eq!(
            &help_codes, docs_codes,
            "{command}: --help and the docs' exit codes differ"
        );
    }
}

/// `--when-busy` and `--group` reach the created claim (what the controller does with them is
/// tested with `turnstile lock --when-busy` and in the core); a `Failed` / `LockBusy` claim
/// exits 3.
#[tokio::test]
async fn create_with_a_busy_policy_puts_it_on_the_claim() {
    let cluster = Cluster::with_lock("db").await;
    let uid = create_pod(&cluster, "deploy-7").await;
    let env = downward_api("deploy-7", &uid);
    let args = [
        "deploy-7-db",
        "--create",
        "--lock",
        "db",
        "--when-busy",
        "cancel-in-progress",
        "--group",
        "prod",
    ];
    let waiting = cluster.waiting(&args, &env).await;
    let claim = cluster.claims().get("deploy-7-db").await.unwrap();
    assert_eq!(
        (claim.spec.when_busy, claim.spec.group.as_deref()),
        (
            Some(turnstile_api::BusyPolicy::CancelInProgress),
            Some("prod")
        )
    );
    cluster
        .set_status(
            "deploy-7-db",
            json!({"phase": "Failed", "reason": "LockBusy", "message": "busy"}),
        )
        .await;
    let output = finish(waiting).await;
    assert_eq!(code(&output), 3, "{}", stderr(&output));
}

#[tokio::test]
async fn create_without_the_downward_api_variables_is_a_usage_error() {
    let cluster = Cluster::with_lock("db").await;
    let output = finish(cluster.spawn_wait(&["c", "--create", "--lock", "db"], &[])).await;
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(
        stderr(&output).contains("POD_NAME and POD_UID"),
        "{}",
        stderr(&output)
    );
    assert!(cluster.claims().get_opt("c").await.unwrap().is_none());
}

/// `turnstile wait ARGS…` run to completion, with no API server behind it (a usage error
/// must be reported before anything is asked of one).
fn wait_without_a_server(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .arg("wait")
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .env_remove("POD_UID")
        .stdin(Stdio::null())
        .output()
        .expect("run turnstile wait")
}

#[test]
fn usage_errors_are_one_turnstile_line_and_exit_2() {
    // (arguments, what the line must name)
    let cases: [(&[&str], &str); 6] = [
        (&["c", "--create"], "--lock"),
        (&["c", "--lock", "db"], "--create"),
        (&["c", "--timeout", "later"], "'later'"),
        (&["c", "--timeout"], "--timeout"),
        (&[], "<CLAIM>"),
        (&["c", "--bogus"], "'--bogus'"),
    ];
    for (args, names) in cases {
        let output = wait_without_a_server(args);
        let line = one_line_exit(&output, 2, &format!("{args:?}"));
        assert_eq!(stdout(&output), "", "{args:?}");
        assert!(line.contains(names), "{args:?} names {names}: {line:?}");
    }
}

#[test]
fn help_is_still_clap_help() {
    let output = wait_without_a_server(&["--help"]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let help = stdout(&output);
    assert!(
        help.contains("Usage:") && help.contains("Exit codes:"),
        "{help}"
    );
}

#[tokio::test]
async fn pod_flags_override_the_downward_api_variables() {
    let cluster = Cluster::with_lock("db").await;
    let uid = create_pod(&cluster, "web-2").await;
    // The env names another Pod; the flags win.
    let env = [
        ("POD_NAME", "someone-else"),
        ("POD_NAMESPACE", NAMESPACE),
        ("POD_UID", "not-this-uid"),
    ];
    let args = [
        "web-2-db",
        "--create",
        "--lock",
        "db",
        "--pod-name",
        "web-2",
        "--pod-uid",
        uid.as_str(),
    ];
    let waiting = cluster.waiting(&args, &env).await;
    let claim = cluster.claims().get("web-2-db").await.unwrap();
    let owners = claim.metadata.owner_references.clone().unwrap_or_default();
    let owner: Vec<(&str, &str)> = owners
        .iter()
        .map(|o| (o.name.as_str(), o.uid.as_str()))
        .collect();
    assert_eq!(owner, [("web-2", uid.as_str())]);
    cluster.set_status("web-2-db", held(3)).await;
    let output = finish(waiting).await;
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(stdout(&output), "3\n");
}

#[test]
fn an_unreachable_api_server_exits_1_with_one_line_from_wait_and_queue() {
    let port = test_servers::free_port().expect("free port");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    write_unreachable_kubeconfig(&kubeconfig, port, NAMESPACE);
    // `turnstile queue` reads the API the same way and ends the same way.
    for args in [&["wait", "c", "--timeout", "60s"][..], &["queue", "db"][..]] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .expect("run turnstile");
        one_line_exit(&output, 1, &format!("{args:?}"));
        assert_eq!(stdout(&output), "", "{args:?}");
    }
}

#[tokio::test]
async fn a_refused_request_exits_1_with_one_line() {
    // As RBAC would refuse `create` on lockclaims: the Pod's Role lacks the verb.
    let cluster = Cluster::with_lock("db").await;
    let uid = create_pod(&cluster, "web-0").await;
    let env = downward_api("web-0", &uid);
    let claims_path = format!("/apis/turnstile.dev/v1alpha1/namespaces/{NAMESPACE}/lockclaims");
    cluster.server.inject_faults(&claims_path, 1, 403);
    let output = finish(cluster.spawn_wait(&["web-0-db", "--create", "--lock", "db"], &env)).await;
    let line = one_line_failure(&output, 1);
    assert!(line.contains("forbidden"), "the refusal is named: {line}");
    assert_eq!(stdout(&output), "");
}

#[test]
fn help_never_shows_the_backend_urls_from_the_environment() {
    // URLs with credentials come from Secrets as env vars: `--help` must not print them.
    for (args, variable) in [
        (&["run", "--help"][..], "TURNSTILE_REDIS_URL"),
        (&["run", "--help"][..], "TURNSTILE_MONGO_URL"),
        (&["run", "--help"][..], "TURNSTILE_ETCD_URL"),
        (&["lock", "--help"][..], "TURNSTILE_BACKEND_URL"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args(args)
            .env(variable, "redis://user:s3cret-in-env@backend:6379")
            .stdin(Stdio::null())
            .output()
            .expect("run turnstile --help");
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{args:?}");
        assert!(help.contains(variable), "{args:?} names {variable}: {help}");
        assert!(
            !help.contains("s3cret-in-env"),
            "{args:?} printed the value of {variable}"
        );
    }
}

#[tokio::test]
async fn wait_uses_exactly_the_verbs_the_readme_and_the_example_role_grant() {
    let cluster = Cluster::with_lock("db").await;
    let uid = create_pod(&cluster, "web-0").await;
    let env = downward_api("web-0", &uid);
    let args = ["web-0-db", "--create", "--lock", "db"];
    // From here on every request is the binary's, but the test's one status write.
    cluster.server.clear_request_log();
    let waiting = cluster.waiting(&args, &env).await;
    let before_status = cluster.server.request_log().len();
    cluster.set_status("web-0-db", held(3)).await;
    let output = finish(waiting).await;
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    // Again, as a restarted init container: it finds its claim (create answers 409).
    let again = finish(cluster.spawn_wait(&args, &env)).await;
    assert_eq!(code(&again), 0, "{}", stderr(&again));

    let mut log = cluster.server.request_log();
    let test_write = log[before_status..]
        .iter()
        .position(|r| r.verb == "patch" && r.subresource == "status")
        .expect("the test's status write")
        + before_status;
    log.remove(test_write);
    let used = fake_apiserver::rbac_summary(&log);
    let readme = BTreeMap::from([
        (
            ("turnstile.dev".to_owned(), "lockclaims".to_owned()),
            verbs(&["get", "list", "watch", "create"]),
        ),
        (
            ("turnstile.dev".to_owned(), "distributedlocks".to_owned()),
            verbs(&["get"]),
        ),
    ]);
    assert_eq!(
        used, readme,
        "what turnstile wait used, against the README's list"
    );
    assert_eq!(
        example_role("wait-init-container.yaml", "turnstile-wait"),
        readme,
        "the example's Role"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_pod_it_finds_the_api_server_through_the_service_account() {
    // What a Pod has: KUBERNETES_SERVICE_HOST/PORT (an HTTPS endpoint) and the service
    // account's token, CA and namespace under /var/run/secrets/kubernetes.io/serviceaccount,
    // given to turnstile in a mount namespace of its own; no kubeconfig anywhere.
    let cluster = Cluster::start().await;
    let namespace = "in-cluster";
    let claims = namespace_with_a_claim(&cluster.client, namespace, "db", "job-a").await;

    let dir = tempfile::tempdir().expect("dir");
    let tls = tokio::task::spawn_blocking({
        let dir = dir.path().join("tls");
        move || {
            std::fs::create_dir(&dir).expect("tls dir");
            test_servers::TlsFiles::generate(&dir).expect("certificates")
        }
    })
    .await
    .expect("generate");
    let front = tls_front(&tls.server_cert, &tls.server_key, cluster.server.addr()).await;
    let account = dir.path().join("serviceaccount");
    std::fs::create_dir(&account).expect("account dir");
    std::fs::copy(&tls.ca_cert, account.join("ca.crt")).expect("ca.crt");
    std::fs::write(account.join("token"), "a-service-account-token").expect("token");
    std::fs::write(account.join("namespace"), namespace).expect("namespace");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("home");

    let script = r#"mount -t tmpfs tmpfs /run &&
        mkdir -p /run/secrets/kubernetes.io/serviceaccount &&
        cp "$ACCOUNT"/* /run/secrets/kubernetes.io/serviceaccount/ &&
        exec "$TURNSTILE" wait job-a"#;
    let waiting = support::in_own_mount_namespace(script)
        .env("ACCOUNT", &account)
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", front.addr.port().to_string())
        .env("HOME", &home)
        .env_remove("KUBECONFIG")
        .env_remove("POD_NAMESPACE")
        .env_remove("RUST_LOG")
        .spawn()
        .expect("spawn unshare");
    cluster.watched("job-a").await;
    claims
        .patch_status(
            "job-a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": held(7) })),
        )
        .await
        .expect("status");
    let output = finish(waiting).await;
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "7\n",
        "the claim in the service account's namespace"
    );
}
