//! End to end through `kubectl`, as a user drives it: apply a lock and three claims, read the
//! printer columns, `kubectl wait` for the next holder while deleting the current one; and
//! an idle controller writes nothing; uninstalling as the README says, with the controller
//! running and, with it gone, by removing the finalizers by hand.

use crate::support;

use std::time::Duration;

use kube::ResourceExt;
use support::output::succeeded;
use support::{phase_of, position_of, token_of, Env};
use turnstile_api::{ClaimPhase, FINALIZER};

/// The memory lock `db-migrations` and the claims `a`, `b`, `c` on it, as one document stream
/// for a single `kubectl apply`.
fn lock_and_claims() -> String {
    let mut yaml = "\
apiVersion: turnstile.dev/v1alpha1
kind: DistributedLock
metadata:
  name: db-migrations
spec:
  backend: memory
  leaseDurationSeconds: 300
"
    .to_owned();
    for claim in ["a", "b", "c"] {
        yaml.push_str(&format!(
            "---\napiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: {claim}\nspec:\n  lockName: db-migrations\n"
        ));
    }
    yaml
}

/// The header line of the table whose first column is `NAME` and which mentions `marker`.
fn header_with<'a>(output: &'a str, marker: &str) -> &'a str {
    output
        .lines()
        .find(|line| line.starts_with("NAME") && line.contains(marker))
        .unwrap_or_else(|| panic!("no table with {marker} in:\n{output}"))
}

fn columns(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn row<'a>(output: &'a str, name: &str) -> Vec<&'a str> {
    output
        .lines()
        .map(columns)
        .find(|cells| cells.first() == Some(&name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{output}"))
}

/// Whether `api` lists no object (in the test namespace).
async fn lists_nothing<K>(api: kube::Api<K>) -> bool
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.list(&Default::default())
        .await
        .expect("list")
        .items
        .is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_get_locks_and_wait_for_the_next_holder() {
    apply_get_and_wait(Env::new().await).await;
}

/// `kubectl apply` a lock and three claims, `get locks`, wait for the next holder, and read the
/// Events: the steps of the quick tour, with no hook of the fake.
async fn apply_get_and_wait(mut env: Env) {
    env.start_default_controller();
    env.apply(&lock_and_claims());

    let a = env.wait_phase("a", ClaimPhase::Held).await;
    assert_eq!(token_of(&a), Some(1));
    // The finalizer by its documented name: deleting the claim releases it first.
    assert_eq!(
        a.metadata.finalizers.as_deref(),
        Some(&["turnstile.dev/release".to_owned()][..])
    );
    let b = env.wait_claim("b", |c| position_of(c) == Some(1)).await;
    let c = env.wait_claim("c", |c| position_of(c) == Some(2)).await;
    assert_eq!(phase_of(&b), Some(ClaimPhase::Pending));
    assert_eq!(phase_of(&c), Some(ClaimPhase::Pending));
    assert_eq!(env.held_count().await, 1, "exactly one holder");
    env.wait_lock("db-migrations", |lock| {
        lock.status.as_ref().is_some_and(|s| s.waiting == 2)
    })
    .await;

    // `kubectl get locks`: both kinds (category `locks`), with their printer columns.
    let output = env.kubectl(&["get", "locks"]);
    let lock_header = header_with(&output, "BACKEND");
    assert_eq!(
        columns(lock_header),
        ["NAME", "BACKEND", "HOLDERS", "TOKEN", "WAITING", "EXPIRES", "AGE"]
    );
    let claim_header = header_with(&output, "PHASE");
    assert_eq!(
        columns(claim_header),
        ["NAME", "LOCK", "PHASE", "HOLDER", "TOKEN", "POSITION", "EXPIRES", "AGE"]
    );
    let lock_row = row(&output, "distributedlock.turnstile.dev/db-migrations");
    assert_eq!(&lock_row[1..5], ["memory", "a", "1", "2"]);
    assert!(
        lock_row[5].ends_with('Z') && lock_row[5].contains('T'),
        "Expires is an RFC 3339 time, not an age: {lock_row:?}"
    );
    let a_row = row(&output, "lockclaim.turnstile.dev/a");
    assert_eq!(&a_row[1..5], ["db-migrations", "Held", "a", "1"]);
    assert!(a_row[5].ends_with('Z'), "claim Expires column: {a_row:?}");
    let b_row = row(&output, "lockclaim.turnstile.dev/b");
    assert_eq!(&b_row[1..5], ["db-migrations", "Pending", "b", "1"]);
    let c_row = row(&output, "lockclaim.turnstile.dev/c");
    assert_eq!(&c_row[1..5], ["db-migrations", "Pending", "c", "2"]);
    // Short names work too.
    assert!(env.kubectl(&["get", "dlock"]).contains("db-migrations"));
    assert!(env.kubectl(&["get", "lclaim", "b"]).contains("Pending"));

    // `kubectl wait` returns once b holds the lock, after `kubectl delete lockclaim/a`.
    let mut wait = env.kubectl_command(&[
        "wait",
        "--for=condition=Held",
        "lockclaim/b",
        "--timeout=60s",
    ]);
    let waiter = tokio::task::spawn_blocking(move || wait.output());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "b is not held yet");
    env.kubectl(&["delete", "lockclaim/a"]);
    let output = waiter.await.expect("join").expect("kubectl wait");
    assert!(
        output.status.success(),
        "kubectl wait failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("condition met"));
    let b = env.claim("b").await;
    assert_eq!(token_of(&b), Some(2), "the next grant has a larger token");
    let c = env.wait_claim("c", |c| position_of(c) == Some(1)).await;
    assert_eq!(phase_of(&c), Some(ClaimPhase::Pending));
    env.wait_gone("a").await;
    env.wait_event("a", "Acquired").await;
    env.wait_event("a", "Released").await;
    env.wait_event("b", "Queued").await;
    env.wait_event("b", "Acquired").await;

    // The README's renewal, release and Events, as the commands it shows. (A renewal in the
    // second of the grant moves no whole-second expiry, so it is no news: wait one out.)
    // Time: a renewal in the second of the grant moves no whole-second expiry.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch_b =
        |patch: &str| env.kubectl(&["patch", "lockclaim", "b", "--type=merge", "-p", patch]);
    patch_b(&format!(r#"{{"spec":{{"renewTime":"{now}"}}}}"#));
    env.wait_event("b", "Renewed").await;
    // A second renewal is the same Event said again: its count rises, no second Event.
    // Time: a renewal in the same second moves no whole-second expiry.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    patch_b(&format!(r#"{{"spec":{{"renewTime":"{now}"}}}}"#));
    env.wait_event_said("b", "Renewed", 2).await;
    patch_b(r#"{"spec":{"release":true}}"#);
    env.wait_phase("b", ClaimPhase::Released).await;
    env.wait_event("b", "Released").await;
    let events = env.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=b",
        "-o",
        "jsonpath={.items[*].reason}",
    ]);
    for reason in ["Queued", "Acquired", "Renewed", "Released"] {
        assert!(
            events.split_whitespace().any(|r| r == reason),
            "no {reason}: {events}"
        );
    }
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_controller_writes_nothing() {
    let mut env = Env::fake_only_started("its request log counts the controller's writes").await;
    env.apply(&lock_and_claims());
    // Also idle: a lock whose backend is not configured, and a claim for a missing lock.
    env.apply_lock("cache", "backend: redis");
    env.apply_claim("x", "cache", "");
    env.apply_claim("orphan", "missing", "");
    env.wait_phase("a", ClaimPhase::Held).await;
    env.wait_claim("c", |c| position_of(c) == Some(2)).await;
    env.wait_claim("x", |c| {
        c.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("BackendNotConfigured")
    })
    .await;
    env.wait_claim("orphan", |c| {
        c.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("LockNotFound")
    })
    .await;
    env.wait_lock("db-migrations", |lock| {
        lock.status.as_ref().is_some_and(|s| s.waiting == 2)
    })
    .await;
    // The passes the set-up's writes caused have run (a pass after them has), and so has the
    // Event that pass publishes after its writes (the marker's `Released`): otherwise it may
    // land in the idle window.
    env.after_a_pass_over(&["db-migrations"]).await;
    let marker_told = |event: &k8s_openapi::api::events::v1::Event| {
        event.reason.as_deref() == Some("Released")
            && event
                .regarding
                .as_ref()
                .and_then(|regarding| regarding.name.as_deref())
                .is_some_and(|name| name.starts_with(support::waits::MARKER_PREFIX))
    };
    let deadline = tokio::time::Instant::now() + support::WAIT;
    while !env.events().await.iter().any(marker_told) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the marker's Released Event never came"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = env.lock_and_claim_writes();
    let requests_before = env.server().request_log().len();
    // Time: the test is that an idle controller writes nothing over a while.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = env.lock_and_claim_writes();
    assert_eq!(
        after.len(),
        before.len(),
        "writes while idle: {:?}",
        &after[before.len()..]
    );
    // Nor reads, nor Events: nothing but the open watches.
    let requests: Vec<String> = env.server().request_log()[requests_before..]
        .iter()
        .filter(|request| request.verb != "watch")
        .map(|request| format!("{} {}", request.verb, request.path))
        .collect();
    assert!(requests.is_empty(), "requests while idle: {requests:?}");
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_as_the_readme_says_with_the_controller_and_without_it() {
    // `--all-namespaces`: on a plane of its own, so no other test's objects go with it.
    let mut env = Env::alone().await;
    env.start_default_controller();
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.a_holds_and_b_waits("db").await;
    // With the controller running: every grant released, every finalizer removed.
    // The README's command as a user types it: no `-n`.
    let deleted = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .args([
            "delete",
            "lockclaims,distributedlocks",
            "--all",
            "--all-namespaces",
            "--wait",
            "--timeout=60s",
        ])
        .output()
        .expect("run kubectl");
    succeeded("kubectl delete", &deleted);
    assert!(lists_nothing(env.claims()).await, "claims left");
    assert!(lists_nothing(env.locks()).await, "locks left");

    // The controller gone first: deletion waits on the finalizers until they are removed by
    // hand with the README's patch.
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.hold("a", "db", "").await;
    env.stop_controller().await;
    env.kubectl(&["delete", "lockclaim", "a", "--wait=false"]);
    env.kubectl(&["delete", "distributedlock", "db", "--wait=false"]);
    let stuck = env.claim("a").await;
    assert!(
        stuck.metadata.deletion_timestamp.is_some() && !stuck.finalizers().is_empty(),
        "held back by its finalizer: {stuck:?}"
    );
    for kind in ["lockclaim/a", "distributedlock/db"] {
        let (kind, name) = kind.split_once('/').expect("kind/name");
        env.kubectl(&[
            "patch",
            kind,
            name,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
    }
    env.wait_gone("a").await;
    env.wait_lock_gone("db").await;
}

/// The `finalizer-on-create` component on a real control plane: a claim applied by kubectl
/// reaches `Held` after one change to it (the controller's status write), where without the
/// component the controller first adds its finalizer (two changes). Counted on a watch of the
/// claim, which sees every change. A claim's own finalizers are kept beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_finalizer_on_create_component_a_kubectl_claim_is_held_after_one_write() {
    let env = Env::started().await;
    if !env.on_real_plane("with_the_finalizer_on_create_component…") {
        return;
    }
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply_lock("db2", "leaseDurationSeconds: 300");

    // The control: without the policy the finalizer is a write of its own before the grant.
    let plain = changes_until_held(&env, "plain", "db").await;
    assert_eq!(
        plain,
        ClaimChanges {
            finalizer_at_creation: false,
            changes_before_held: 2
        }
    );

    let policy = FinalizerPolicy::install(&env).await;
    let applied = changes_until_held(&env, "applied", "db2").await;
    assert_eq!(
        applied,
        ClaimChanges {
            finalizer_at_creation: true,
            changes_before_held: 1
        },
        "with the policy the grant is the only write before Held"
    );
    // The finalizer still does its work: deleting the holder releases the lock.
    env.apply_claim("next", "db2", "");
    env.wait_claim("next", |claim| position_of(claim) == Some(1))
        .await;
    env.delete_claim("applied").await;
    assert_eq!(
        token_of(&env.wait_phase("next", ClaimPhase::Held).await),
        Some(2)
    );

    // A claim's own finalizers are kept beside the controller's.
    env.apply(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: own\n  finalizers: [example.com/keep]\nspec:\n  lockName: db2\n",
    );
    let own = env.claim("own").await;
    assert_eq!(
        own.finalizers(),
        ["example.com/keep".to_owned(), FINALIZER.to_owned()],
        "both finalizers, the claim's own first"
    );
    env.kubectl(&[
        "patch",
        "lockclaim",
        "own",
        "--type=merge",
        "-p",
        &format!("{{\"metadata\":{{\"finalizers\":[\"{FINALIZER}\"]}}}}"),
    ]);
    policy.remove(&env);
}

/// What a watch of one claim saw from its creation to `Held`.
#[derive(Debug, PartialEq, Eq)]
struct ClaimChanges {
    /// The created object already carried the controller's finalizer.
    finalizer_at_creation: bool,
    /// Changes to it after its creation, the one that made it `Held` included.
    changes_before_held: usize,
}

/// Applies the claim `name` on `lock` with kubectl and watches it until it is `Held`.
async fn changes_until_held(env: &Env, name: &str, lock: &str) -> ClaimChanges {
    use futures::{StreamExt as _, TryStreamExt as _};
    use kube::api::{ListParams, WatchEvent, WatchParams};

    let by_name = format!("metadata.name={name}");
    let claims = env.claims();
    let listed = claims
        .list_metadata(&ListParams::default().fields(&by_name))
        .await
        .expect("list claims");
    let version = listed.metadata.resource_version.expect("list version");
    let mut events = claims
        .watch(&WatchParams::default().fields(&by_name), &version)
        .await
        .expect("watch the claim")
        .boxed();
    env.apply_claim(name, lock, "");

    let mut seen = ClaimChanges {
        finalizer_at_creation: false,
        changes_before_held: 0,
    };
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let event = tokio::time::timeout_at(deadline, events.try_next())
            .await
            .unwrap_or_else(|_| panic!("{name} not Held in time: {seen:?}"))
            .expect("watch event")
            .unwrap_or_else(|| panic!("the watch of {name} ended: {seen:?}"));
        match event {
            WatchEvent::Added(claim) => {
                seen.finalizer_at_creation = claim.finalizers().iter().any(|f| f == FINALIZER);
            }
            WatchEvent::Modified(claim) => {
                seen.changes_before_held += 1;
                if phase_of(&claim) == Some(ClaimPhase::Held) {
                    return seen;
                }
            }
            other => panic!("{name}: unexpected {other:?} ({seen:?})"),
        }
    }
}

/// The component's MutatingAdmissionPolicy as shipped, under a name of the test's, bound to
/// the test's namespace only (the plane is shared with other tests).
struct FinalizerPolicy {
    name: String,
}

impl FinalizerPolicy {
    const FILE: &'static str = "deploy/components/finalizer-on-create/policy.yaml";

    /// Installs it and waits until the API server applies it (a dry-run create shows it).
    async fn install(env: &Env) -> Self {
        let name = format!("turnstile-release-finalizer-{}", env.namespace);
        let text = std::fs::read_to_string(support::plane::repo_path(Self::FILE))
            .expect("read the component's policy");
        let mut documents: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|document| serde::Deserialize::deserialize(document).expect("policy YAML"))
            .collect();
        for document in &mut documents {
            document["metadata"]["name"] = name.clone().into();
            if document["kind"] == "MutatingAdmissionPolicyBinding" {
                document["spec"]["policyName"] = name.clone().into();
                document["spec"]["matchResources"] = serde_json::json!({
                    "namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": env.namespace
                    }}
                });
            }
        }
        assert_eq!(documents.len(), 2, "a policy and its binding");
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": documents});
        env.apply(&list.to_string());

        let probe = "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: probe\nspec:\n  lockName: db\n";
        let deadline = std::time::Instant::now() + support::WAIT;
        loop {
            let mut dry_run = env.kubectl_command(&[
                "create",
                "--dry-run=server",
                "-o",
                "jsonpath={.metadata.finalizers}",
                "-f",
                "-",
            ]);
            let output = support::child::output_with_input(
                &mut dry_run,
                probe.as_bytes(),
                "kubectl create --dry-run=server",
            );
            assert!(output.status.success(), "{output:?}");
            if String::from_utf8_lossy(&output.stdout).contains(FINALIZER) {
                return Self { name };
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the policy never applied"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes the policy and its binding.
    fn remove(self, env: &Env) {
        for kind in ["mutatingadmissionpolicybinding", "mutatingadmissionpolicy"] {
            env.kubectl(&["delete", kind, &self.name]);
        }
    }
}
