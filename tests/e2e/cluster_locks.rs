//! `ClusterDistributedLock` (issue 42 item 4), end to end on an API server of the test's own,
//! the controller watching every namespace as `deploy/` installs it (on a real plane with the
//! `deploy/` ServiceAccount's RBAC): one queue for the claims of the namespaces the lock
//! selects, in arrival order across namespaces; a claim from another namespace waits with
//! reason `NamespaceNotAllowed` and a Warning Event, queued nowhere, and joins the queue when
//! its namespace is labelled; tokens rise across every namespace's holders; a holder keeps its
//! grant when its namespace stops being selected; `kubectl get locks` and
//! `turnstile queue --cluster` show the lock and the holder's namespace; `turnstile lock` and
//! `turnstile wait` take it with `--cluster`; the schema refuses a cluster lock on a claim of
//! several locks; gated Jobs of two namespaces (`turnstile.dev/lock-kind`) run in turn.

use crate::support;

use std::path::Path;
use tokio::process::Command;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, PostParams};
use support::pods::create_pod;
use support::waits::wait_object;
use support::{phase_of, position_of, reason_of, token_of, Env};
use turnstile_api::{
    ClaimPhase, ClusterDistributedLock, LockClaim, LockClaimSpec, LOCK_ANNOTATION,
    LOCK_KIND_ANNOTATION, TOKEN_ANNOTATION,
};

const LOCK: &str = "db-migration";

fn cluster_lock_yaml(name: &str) -> String {
    format!(
        "apiVersion: turnstile.dev/v1alpha1\nkind: ClusterDistributedLock\nmetadata:\n  name: {name}\nspec:\n  namespaceSelector:\n    matchLabels:\n      team: payments\n  lock:\n    leaseDurationSeconds: 300\n"
    )
}

/// A client's view of the claims of `namespace`.
fn claims_in(env: &Env, namespace: &str) -> Api<LockClaim> {
    Api::namespaced(env.client.clone(), namespace)
}

/// Creates the claim `name` in `namespace` on the cluster lock `lock`.
async fn claim_in(env: &Env, namespace: &str, name: &str, lock: &str) {
    let claim = LockClaim::new(name, LockClaimSpec::for_cluster_lock(lock));
    claims_in(env, namespace)
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
}

async fn wait_in(
    env: &Env,
    namespace: &str,
    name: &str,
    done: impl Fn(&LockClaim) -> bool,
) -> LockClaim {
    wait_object(claims_in(env, namespace), name, done).await
}

async fn wait_phase_in(env: &Env, namespace: &str, name: &str, phase: ClaimPhase) -> LockClaim {
    wait_in(env, namespace, name, |claim| phase_of(claim) == Some(phase)).await
}

async fn delete_in(env: &Env, namespace: &str, name: &str) {
    claims_in(env, namespace)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete claim");
}

async fn create_namespace(env: &Env, name: &str, labels: serde_json::Value) {
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": labels}}))
            .expect("namespace");
    Api::<Namespace>::all(env.client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
}

/// Sets (`Some`) or removes (`None`) the `team` label of `namespace`.
fn label_team(env: &Env, namespace: &str, team: Option<&str>) {
    let label = match team {
        Some(team) => format!("team={team}"),
        None => "team-".to_owned(),
    };
    env.kubectl(&["label", "namespace", namespace, &label, "--overwrite"]);
}

/// The reasons of the Events about `name` in `namespace`.
async fn event_reasons_in(env: &Env, namespace: &str, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), namespace);
    events
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|event| event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|event| event.reason)
        .collect()
}

/// `turnstile ARGS` with only `KUBECONFIG` pointing at the test's API server (not blocking
/// the runtime the controller runs on).
async fn turnstile(env: &Env, args: &[&str]) -> std::process::Output {
    Command::new(Path::new(env!("CARGO_BIN_EXE_turnstile")))
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .env_remove("POD_NAMESPACE")
        .output()
        .await
        .expect("run turnstile")
}

async fn turnstile_queue(env: &Env, lock: &str) -> String {
    let output = turnstile(env, &["queue", lock, "--cluster", "-o", "wide"]).await;
    assert!(
        output.status.success(),
        "turnstile queue --cluster failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lock_for_the_namespaces_it_selects_in_one_fair_queue() {
    let mut env = Env::alone().await;
    let pay = env.namespace.clone();
    let pay_too = format!("{pay}-b");
    let other = format!("{pay}-c");
    label_team(&env, &pay, Some("payments"));
    create_namespace(&env, &pay_too, serde_json::json!({"team": "payments"})).await;
    create_namespace(&env, &other, serde_json::json!({})).await;
    env.apply(&cluster_lock_yaml(LOCK));
    env.start_controller_of_all_namespaces();

    // A claim on a cluster lock that does not exist waits, naming the kind it looked for.
    claim_in(&env, &pay, "early", "not-yet").await;
    let early = wait_in(&env, &pay, "early", |claim| {
        reason_of(claim).as_deref() == Some("LockNotFound")
    })
    .await;
    assert_eq!(
        early.status.and_then(|status| status.message).as_deref(),
        Some("ClusterDistributedLock not-yet does not exist")
    );
    // `turnstile wait` on it looks for the cluster lock, not a namespace's lock.
    let waited = turnstile(&env, &["wait", "early", "-n", &pay, "--timeout", "30s"]).await;
    let stderr = String::from_utf8_lossy(&waited.stderr);
    assert_eq!(waited.status.code(), Some(6), "{stderr}");
    assert!(
        stderr.contains("ClusterDistributedLock not-yet does not exist"),
        "{stderr}"
    );

    // One queue across the selected namespaces, in arrival order.
    claim_in(&env, &pay, "first", LOCK).await;
    let first = wait_phase_in(&env, &pay, "first", ClaimPhase::Held).await;
    claim_in(&env, &pay_too, "second", LOCK).await;
    wait_in(&env, &pay_too, "second", |claim| {
        position_of(claim) == Some(1)
    })
    .await;
    claim_in(&env, &pay, "third", LOCK).await;
    wait_in(&env, &pay, "third", |claim| position_of(claim) == Some(2)).await;

    // A namespace the selector does not select: refused, with a reason and a Warning Event,
    // and in no queue.
    claim_in(&env, &other, "refused", LOCK).await;
    let refused = wait_in(&env, &other, "refused", |claim| {
        reason_of(claim).as_deref() == Some("NamespaceNotAllowed")
    })
    .await;
    assert_eq!(phase_of(&refused), Some(ClaimPhase::Pending));
    let message = refused
        .status
        .and_then(|status| status.message)
        .unwrap_or_default();
    assert!(
        message.contains(&format!("namespace {other}")) && message.contains("namespaceSelector"),
        "{message}"
    );
    assert_eq!(
        event_reasons_in(&env, &other, "refused").await,
        ["NamespaceNotAllowed"]
    );
    let locks: Api<ClusterDistributedLock> = Api::all(env.client.clone());
    let lock = wait_object(locks.clone(), LOCK, |lock| {
        lock.status
            .as_ref()
            .is_some_and(|status| status.waiting == 2)
    })
    .await;
    let status = lock.status.expect("status");
    assert_eq!(status.holders[0].claim, format!("{pay}/first"));

    // What people see: the cluster lock among the locks, with the holder's namespace.
    let listed = env.kubectl(&["get", "locks"]);
    assert!(
        listed.contains(&format!("clusterdistributedlock.turnstile.dev/{LOCK}"))
            && listed.contains(&format!("{pay}/first")),
        "{listed}"
    );
    let queue = turnstile_queue(&env, LOCK).await;
    assert!(
        queue.starts_with(&format!("ClusterDistributedLock {LOCK} ")),
        "{queue}"
    );
    let second_at = queue.find(&format!("{pay_too}/second"));
    let third_at = queue.find(&format!("{pay}/third"));
    assert!(
        second_at.is_some() && second_at < third_at && !queue.contains("refused"),
        "the queue in arrival order across namespaces, without the refused claim:\n{queue}"
    );

    // The hand-off goes to the next in line, whatever its namespace, with a higher token.
    let mut last_token = token_of(&first).expect("token");
    delete_in(&env, &pay, "first").await;
    let second = wait_phase_in(&env, &pay_too, "second", ClaimPhase::Held).await;
    let token = token_of(&second).expect("token");
    assert!(token > last_token, "{token} after {last_token}");
    last_token = token;

    // Labelled, the refused namespace's claim joins the queue (behind the claims before it).
    label_team(&env, &other, Some("payments"));
    wait_in(&env, &other, "refused", |claim| {
        reason_of(claim).as_deref() == Some("Queued") && position_of(claim) == Some(2)
    })
    .await;
    delete_in(&env, &pay_too, "second").await;
    let third = wait_phase_in(&env, &pay, "third", ClaimPhase::Held).await;
    let token = token_of(&third).expect("token");
    assert!(token > last_token, "{token} after {last_token}");
    last_token = token;
    delete_in(&env, &pay, "third").await;
    let admitted = wait_phase_in(&env, &other, "refused", ClaimPhase::Held).await;
    let token = token_of(&admitted).expect("token");
    assert!(token > last_token, "{token} after {last_token}");
    last_token = token;

    // A holder keeps its grant when its namespace stops being selected. The positive sign that
    // the lock's pass came after the label's removal: a later claim queued behind the holder.
    label_team(&env, &other, None);
    claim_in(&env, &pay, "later", LOCK).await;
    wait_in(&env, &pay, "later", |claim| position_of(claim) == Some(1)).await;
    let kept = claims_in(&env, &other).get("refused").await.expect("get");
    assert_eq!(phase_of(&kept), Some(ClaimPhase::Held), "{kept:?}");
    assert_eq!(token_of(&kept), Some(token));
    delete_in(&env, &other, "refused").await;
    let later = wait_phase_in(&env, &pay, "later", ClaimPhase::Held).await;
    let token = token_of(&later).expect("token");
    assert!(token > last_token);
    delete_in(&env, &pay, "later").await;

    // `turnstile lock --cluster`: the command runs holding the cluster lock, with the next
    // token, and its claim goes with it.
    let ran = turnstile(
        &env,
        &[
            "lock",
            "--lock",
            LOCK,
            "--cluster",
            "-n",
            &pay_too,
            "--",
            "sh",
            "-c",
            "echo token=$TURNSTILE_FENCING_TOKEN",
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let ran_with: i64 = stdout
        .trim()
        .strip_prefix("token=")
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("a token: {stdout}"));
    assert!(ran_with > token, "{ran_with} after {token}");
    let left = claims_in(&env, &pay_too)
        .list(&Default::default())
        .await
        .expect("list");
    assert!(
        left.items
            .iter()
            .all(|claim| claim.metadata.deletion_timestamp.is_some()),
        "no claim left behind: {:?}",
        left.items
            .iter()
            .map(|claim| claim.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    // A missing cluster lock is a usage error, before any claim is made.
    let missing = turnstile(
        &env,
        &[
            "lock",
            "--lock",
            "nope",
            "--cluster",
            "-n",
            &pay,
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr)
        .contains("ClusterDistributedLock nope does not exist"));

    // `turnstile wait --create --cluster`: an init container's claim on the cluster lock, owned
    // by its Pod (in the test's namespace), held at once (the lock is free).
    let uid = create_pod(&env, "init").await;
    let waited = turnstile(
        &env,
        &[
            "wait",
            "init-db",
            "--create",
            "--lock",
            LOCK,
            "--cluster",
            "-n",
            &pay,
            "--pod-name",
            "init",
            "--pod-uid",
            &uid,
            "--timeout",
            "60s",
        ],
    )
    .await;
    assert!(
        waited.status.success(),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let init = claims_in(&env, &pay).get("init-db").await.expect("get");
    assert!(init.spec.claims_cluster_lock());
    assert!(token_of(&init) > Some(ran_with));

    // The schema: a cluster lock is claimed alone, never among several locks.
    let output = env.kubectl_apply_output(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: several\nspec:\n  lockKind: ClusterDistributedLock\n  lockNames: [a, b]\n",
    );
    assert!(!output.status.success(), "refused by the schema");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("lockKind ClusterDistributedLock takes one lock"),
        "{stderr}"
    );
    env.stop_controller().await;
}

/// A suspended Job in `namespace` gated on the cluster lock `lock`.
async fn gated_job(env: &Env, namespace: &str, name: &str, lock: &str) {
    let job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": {
            LOCK_ANNOTATION: lock,
            LOCK_KIND_ANNOTATION: "ClusterDistributedLock",
        }},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox"}]}}}
    }))
    .expect("job");
    Api::<Job>::namespaced(env.client.clone(), namespace)
        .create(&PostParams::default(), &job)
        .await
        .expect("create job");
}

/// The Job `name` in `namespace` once `done` says so.
async fn wait_job(env: &Env, namespace: &str, name: &str, done: impl Fn(&Job) -> bool) -> Job {
    wait_object(Api::namespaced(env.client.clone(), namespace), name, done).await
}

fn job_token(job: &Job) -> Option<i64> {
    job.metadata
        .annotations
        .as_ref()?
        .get(TOKEN_ANNOTATION)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_jobs_of_two_namespaces_take_one_cluster_lock_in_turn() {
    let mut env = Env::alone().await;
    let first_ns = env.namespace.clone();
    let second_ns = format!("{first_ns}-b");
    create_namespace(&env, &second_ns, serde_json::json!({})).await;
    env.apply(
        "apiVersion: turnstile.dev/v1alpha1\nkind: ClusterDistributedLock\nmetadata:\n  name: deploys\nspec:\n  namespaceSelector: {}\n  lock:\n    leaseDurationSeconds: 300\n",
    );
    env.start_controller_of_all_namespaces();
    let running = |job: &Job| job.spec.as_ref().and_then(|spec| spec.suspend) == Some(false);

    gated_job(&env, &first_ns, "migrate", "deploys").await;
    let first = wait_job(&env, &first_ns, "migrate", running).await;
    let first_token = job_token(&first).expect("the token on the Job");
    let claim = wait_phase_in(&env, &first_ns, "migrate-deploys", ClaimPhase::Held).await;
    assert!(claim.spec.claims_cluster_lock());

    // The other namespace's Job waits its turn, suspended: its claim is queued behind.
    gated_job(&env, &second_ns, "migrate", "deploys").await;
    wait_in(&env, &second_ns, "migrate-deploys", |claim| {
        position_of(claim) == Some(1)
    })
    .await;
    let waiting = wait_job(&env, &second_ns, "migrate", |_| true).await;
    assert!(
        !running(&waiting),
        "suspended while the other namespace holds"
    );

    // The first Job's grant ends: the second runs, with a higher token.
    delete_in(&env, &first_ns, "migrate-deploys").await;
    let second = wait_job(&env, &second_ns, "migrate", running).await;
    let second_token = job_token(&second).expect("the token on the Job");
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}"
    );
    env.stop_controller().await;
}
