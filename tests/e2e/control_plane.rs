//! What only a real control plane shows, each on the real thing: the real garbage collector
//! takes a claim after its Job, and the lock moves on; the kube-apiserver killed and etcd
//! compacted under the operator's watches (they come back with `410 Gone`), then etcd killed
//! mid-queue: grants resume, tokens keep rising, no claim lost; a lock and claims made under
//! the first release's CRDs are served after an in-place upgrade to today's; and a request
//! outside the installed role is refused with a 403 naming the controller's account.
//!
//! The restart and upgrade tests start a control plane of their own (they stop parts of it or
//! change what every namespace sees); the others share this process's plane.

use crate::support;

use std::time::{Duration, Instant};
use support::launch::launch;
use support::plane::{kubectl_ok, repo_path};

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use support::scrape::{get, try_get};
use support::{token_of, Env, HolderMonitor, WAIT};
use turnstile_api::ClaimPhase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_garbage_collector_takes_a_jobs_claim_with_it_and_the_lock_moves_on() {
    let mut env = Env::started().await;
    if !env.on_real_plane("the_garbage_collector_takes…") {
        return;
    }
    env.apply_lock("db", "leaseDurationSeconds: 300");
    // A suspended Job: it runs no Pod, so only its deletion can end the claim.
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.namespace);
    support::jobs::job_owning_a_claim(
        &env,
        json!({
            "metadata": {"name": "migrate"},
            "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}]}}}
        }),
        "migrate-db",
        "db",
    )
    .await;
    assert_eq!(
        token_of(&env.wait_phase("migrate-db", ClaimPhase::Held).await),
        Some(1)
    );
    env.apply_claim("next", "db", "");
    env.wait_claim("next", |claim| support::position_of(claim) == Some(1))
        .await;

    // Background propagation: the Job goes at once, its dependents after, by the real GC.
    jobs.delete("migrate", &DeleteParams::background())
        .await
        .expect("delete Job");
    env.wait_gone("migrate-db").await;
    assert_eq!(
        token_of(&env.wait_phase("next", ClaimPhase::Held).await),
        Some(2)
    );
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_go_on_through_an_apiserver_kill_an_etcd_compaction_and_an_etcd_kill() {
    let Some(mut plane) = support::plane::own_plane().await else {
        return;
    };
    let mut env = Env::on_cluster(plane.kubeconfig()).await;
    env.start_default_controller();
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let monitor = HolderMonitor::start(&env, "db", 1);
    let names: Vec<String> = (0..6).map(|index| format!("c{index}")).collect();
    for name in &names {
        env.apply_claim(name, "db", "");
        // One at a time, so each has its place before the next arrives.
        env.wait_claim(name, |claim| claim.status.is_some()).await;
    }
    env.wait_phase("c0", ClaimPhase::Held).await;

    // The apiserver dies; etcd moves on and is compacted to its head, so the operator's watches
    // come back to a revision that is gone (410) and it must list again.
    let mut plane = launch(
        move || {
            plane.kill_apiserver();
            plane.etcdctl(&["put", "/turnstile-test/bump", "1"])?;
            let status = plane.etcdctl(&["endpoint", "status", "-w", "json"])?;
            let revision = revision_of(&status)
                .ok_or_else(|| std::io::Error::other(format!("no revision in {status}")))?;
            plane.etcdctl(&["compact", &revision.to_string()])?;
            plane.start_apiserver()?;
            Ok::<_, std::io::Error>(plane)
        },
        "kill the apiserver, compact etcd, start the apiserver",
    )
    .await;
    env.hand_off("c0", "c1", 2).await;
    env.hand_off("c1", "c2", 3).await;

    // etcd itself dies mid-queue and comes back with its data.
    plane = launch(
        move || {
            plane.restart_etcd()?;
            Ok::<_, std::io::Error>(plane)
        },
        "restart etcd",
    )
    .await;
    env.hand_off("c2", "c3", 4).await;
    env.hand_off("c3", "c4", 5).await;
    env.hand_off("c4", "c5", 6).await;
    // Each hand-off above checked its token (2 … 6); the monitor, sampling throughout (it may
    // miss a short grant while its own connection comes back), counts violations.
    let report = monitor.finish().await;
    assert_eq!(report.over_capacity, 0, "never two holders: {report:?}");
    assert_eq!(report.token_regressions, 0, "tokens only rise: {report:?}");
    assert!(
        report.tokens().ends_with(&[6]),
        "the monitor saw the last grant: {report:?}"
    );
    env.stop_controller().await;
    drop(plane);
}

/// `/readyz` by a real cause: a controller whose API server is down serves `/healthz` but
/// stays not ready (503), since it cannot fill its caches; once the API server is back it
/// becomes ready and grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_while_its_apiserver_is_down_then_ready_and_granting() {
    let Some(plane) = support::plane::own_plane().await else {
        return;
    };
    let mut env = Env::on_cluster(plane.kubeconfig()).await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let mut plane = launch(
        move || {
            let mut plane = plane;
            plane.kill_apiserver();
            Ok::<_, std::io::Error>(plane)
        },
        "kill the apiserver",
    )
    .await;
    let addr = env.start_controller_serving_metrics();
    // The positive sign that it runs and answers: /healthz. Then /readyz, over a few of its
    // list retries, says it is not ready.
    let deadline = Instant::now() + WAIT;
    while try_get(addr, "/healthz").await.map(|answer| answer.status) != Some(200) {
        assert!(Instant::now() < deadline, "/healthz never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        let ready = get(addr, "/readyz").await;
        assert_eq!(
            ready.status, 503,
            "ready without an API server: {}",
            ready.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    plane = launch(
        move || {
            plane.start_apiserver()?;
            Ok::<_, std::io::Error>(plane)
        },
        "start the apiserver",
    )
    .await;
    let deadline = Instant::now() + WAIT;
    while get(addr, "/readyz").await.status != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready once the API server was back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(token_of(&env.hold("a", "db", "").await), Some(1));
    env.stop_controller().await;
    drop(plane);
}

/// The `header.revision` of `etcdctl endpoint status -w json`.
fn revision_of(status: &str) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_str(status).ok()?;
    value.as_array()?.first()?["Status"]["header"]["revision"].as_i64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_made_under_the_first_releases_crds_are_served_after_an_in_place_upgrade() {
    let Some(plane) = support::plane::own_plane().await else {
        return;
    };
    let kubeconfig = plane.kubeconfig().to_path_buf();
    let admin = |args: &[&str]| kubectl_ok(Some(&kubeconfig), args);
    // The CRDs as the first release shipped them, and a lock and three claims made under them.
    admin(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &repo_path("tests/control_plane/crds-first-release.yaml")
            .display()
            .to_string(),
    ]);
    admin(&[
        "wait",
        "--for=condition=Established",
        "crd/lockclaims.turnstile.dev",
        "crd/distributedlocks.turnstile.dev",
        "--timeout=30s",
    ]);
    admin(&["create", "namespace", "upgraded"]);
    let mut yaml = String::from(
        "apiVersion: turnstile.dev/v1alpha1\nkind: DistributedLock\nmetadata: {name: db, namespace: upgraded}\nspec: {leaseDurationSeconds: 300}\n",
    );
    for name in ["a", "b", "c"] {
        yaml.push_str(&format!(
            "---\napiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata: {{name: {name}, namespace: upgraded}}\nspec: {{lockName: db}}\n"
        ));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = dir.path().join("objects.yaml");
    std::fs::write(&objects, yaml).expect("write objects");
    admin(&["create", "-f", &objects.display().to_string()]);
    // The upgrade: today's CRDs applied over the first release's (Env installs them).
    let mut env = Env::on_cluster(&kubeconfig).await;
    env.namespace = "upgraded".to_owned();
    env.start_default_controller();
    env.wait_phase("a", ClaimPhase::Held).await;
    env.wait_claim("c", |claim| support::position_of(claim) == Some(2))
        .await;
    env.hand_off("a", "b", 2).await;
    env.hand_off("b", "c", 3).await;
    env.stop_controller().await;
    drop(plane);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_outside_the_installed_role_is_refused_and_reported() {
    let env = Env::new().await;
    if !env.on_real_plane("a_request_outside_the_installed_role…") {
        return;
    }
    // The controller's account may not delete claims (it never does): the API server says 403.
    let controller_claims: Api<turnstile_api::LockClaim> =
        Api::namespaced(env.controller_client.clone(), &env.namespace);
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply_claim("a", "db", "");
    let refused = controller_claims
        .delete("a", &DeleteParams::default())
        .await
        .expect_err("outside the role");
    match refused {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status
                    .message
                    .contains("system:serviceaccount:turnstile-system:turnstile-controller"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 403, got {other}"),
    }
}

/// A flow of the controller, and what it does without one rule of its ClusterRole.
#[derive(Clone, Copy, Debug)]
enum Flow {
    /// A claim on a lock is granted (`Held`).
    Grant,
    /// A grant is announced by a `LockHeld` Event.
    Announce,
    /// A gated Pod's scheduling gate is removed.
    UngatePod,
    /// A gated Job is un-suspended.
    ReleaseJob,
    /// The namespaces' watch, which keeps a namespace's teardown free of status writes
    /// (`a_namespace_torn_down_gets_no_status_writes`); without it the controller still
    /// grants, and a teardown costs what it did before.
    WatchNamespaces,
    /// A claim's missing lock is made from a `LockTemplate`.
    MakeFromTemplate,
    /// A claim on a `ClusterDistributedLock` is granted (by a controller of all namespaces).
    GrantClusterLock,
}

/// The flow that needs the rule on `resource` (the rule's first resource).
fn flow_needing(resource: &str) -> Flow {
    match resource {
        "pods" => Flow::UngatePod,
        "jobs" => Flow::ReleaseJob,
        "events" => Flow::Announce,
        "namespaces" => Flow::WatchNamespaces,
        "locktemplates" => Flow::MakeFromTemplate,
        "clusterdistributedlocks" => Flow::GrantClusterLock,
        _ => Flow::Grant,
    }
}

/// Each rule of the installed `turnstile-controller` ClusterRole removed in turn, on a plane of
/// this test's own: the controller runs as a ServiceAccount bound to the rest, the flow that
/// needs the rule is started, the kube-apiserver's audit log shows a request of that account
/// refused (403) on the rule's resource — the positive sign the controller tried — and then
/// the flow has not happened (the namespaces' watch is the one optional rule: refused, the
/// controller still grants). So no rule is unused; the other tests show that with every rule
/// each flow passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_of_the_installed_role_is_needed_by_a_named_flow() {
    let first = Env::alone().await;
    if !first.on_real_plane("every_rule_of_the_installed_role_is_needed_by_a_named_flow") {
        return;
    }
    let plane = first.own_plane.as_ref().expect("Env::alone's own plane");
    let admin = plane.kubeconfig().to_path_buf();
    let audit_log = plane.files().audit_log.clone();
    let role = support::plane::installed_objects()
        .into_iter()
        .find(|object| {
            object["kind"] == "ClusterRole" && object["metadata"]["name"] == "turnstile-controller"
        })
        .expect("the controller's ClusterRole in deploy/");
    let rules = role["rules"].as_array().expect("rules").clone();
    assert_eq!(
        rules.len(),
        9,
        "the test names a flow for each rule: {rules:?}"
    );
    for (index, rule) in rules.iter().enumerate() {
        let resources: Vec<String> = rule["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .map(|r| r.as_str().expect("resource").to_owned())
            .collect();
        let flow = flow_needing(&resources[0]);
        let mut env = Env::on_cluster(&admin).await;
        let account = format!("without-rule-{index}");
        let mut partial = role.clone();
        partial["metadata"] = json!({"name": format!("{}-{account}", env.namespace)});
        partial["rules"]
            .as_array_mut()
            .expect("rules")
            .remove(index);
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{}-{account}", env.namespace)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{}-{account}", env.namespace)},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": env.namespace}]
        });
        let account_object = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": env.namespace}});
        let list = json!({"apiVersion": "v1", "kind": "List", "items": [partial, binding, account_object]});
        let mut apply = std::process::Command::new("kubectl");
        apply
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["apply", "-f", "-"]);
        let applied =
            test_servers::output_with_stdin(&mut apply, &list.to_string()).expect("kubectl apply");
        assert!(
            applied.status.success(),
            "{}",
            String::from_utf8_lossy(&applied.stderr)
        );
        let token = kubectl_ok(
            Some(&admin),
            &["create", "token", &account, "-n", &env.namespace],
        );
        let kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig file");
        std::fs::write(
            kubeconfig.path(),
            support::plane::with_token(&admin, token.trim()),
        )
        .expect("write kubeconfig");
        env.controller_client = support::plane::client_for(kubeconfig.path()).await;
        match flow {
            // The plane is this test's own: the controller may watch every namespace.
            Flow::GrantClusterLock => env.start_controller_of_all_namespaces(),
            _ => env.start_default_controller(),
        }

        env.apply_lock("db", "leaseDurationSeconds: 300");
        match flow {
            Flow::Grant | Flow::Announce | Flow::WatchNamespaces => {
                env.apply_claim("a", "db", "")
            }
            Flow::MakeFromTemplate => {
                env.apply(
                    "apiVersion: turnstile.dev/v1alpha1\nkind: LockTemplate\nmetadata:\n  name: made\nspec:\n  names: [\"made-*\"]\n  lock: {}\n",
                );
                env.apply_claim("a", "made-1", "");
            }
            Flow::GrantClusterLock => {
                env.apply(&format!(
                    "apiVersion: turnstile.dev/v1alpha1\nkind: ClusterDistributedLock\nmetadata:\n  name: {}-shared\nspec:\n  namespaceSelector: {{}}\n",
                    env.namespace
                ));
                env.apply_claim(
                    "a",
                    &format!("{}-shared", env.namespace),
                    "lockKind: ClusterDistributedLock",
                );
            }
            Flow::UngatePod => env.apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {{{}: db}}\nspec:\n  schedulingGates: [{{name: {}}}]\n  containers: [{{name: main, image: busybox}}]\n",
                turnstile_api::LOCK_LABEL, turnstile_api::SCHEDULING_GATE
            )),
            Flow::ReleaseJob => env.apply(&format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  annotations: {{{}: db}}\nspec:\n  suspend: true\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: main, image: busybox}}]\n",
                turnstile_api::LOCK_ANNOTATION
            )),
        }
        let user = format!("system:serviceaccount:{}:{account}", env.namespace);
        let refused = refused_requests(&audit_log, &user, &resources).await;
        assert!(
            !refused.is_empty(),
            "rule {index} ({resources:?}): no request of {user} was refused"
        );

        // The controller tried and was refused; its flow has not happened.
        match flow {
            Flow::Grant | Flow::GrantClusterLock => assert_ne!(
                support::phase_of(&env.claim("a").await),
                Some(ClaimPhase::Held),
                "rule {index}: granted without it"
            ),
            Flow::Announce => {
                env.wait_phase("a", ClaimPhase::Held).await;
                assert!(
                    !env.event_reasons("a")
                        .await
                        .contains(&"LockHeld".to_owned()),
                    "rule {index}: announced without it"
                );
            }
            Flow::UngatePod => {
                let pods: Api<k8s_openapi::api::core::v1::Pod> =
                    Api::namespaced(env.client.clone(), &env.namespace);
                let pod = pods.get("web").await.expect("get Pod");
                assert!(
                    pod.spec
                        .and_then(|spec| spec.scheduling_gates)
                        .is_some_and(|gates| !gates.is_empty()),
                    "rule {index}: ungated without it"
                );
            }
            Flow::WatchNamespaces => {
                // Optional: refused, the controller goes on granting.
                env.wait_phase("a", ClaimPhase::Held).await;
            }
            Flow::MakeFromTemplate => {
                env.wait_claim("a", |claim| {
                    support::reason_of(claim).as_deref() == Some("LockNotFound")
                })
                .await;
                let made = env.locks().get_opt("made-1").await.expect("get lock");
                assert!(made.is_none(), "rule {index}: made without it");
            }
            Flow::ReleaseJob => {
                let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.namespace);
                let job = jobs.get("migrate").await.expect("get Job");
                assert_eq!(
                    job.spec.and_then(|spec| spec.suspend),
                    Some(true),
                    "rule {index}: released without it"
                );
            }
        }
        println!(
            "rule {index} {resources:?}: {flow:?} fails; refused: {}",
            refused.join(", ")
        );
        env.stop_controller().await;
    }
    drop(first);
}

/// The requests of `user` on one of `resources` (`resource` or `resource/subresource`) that
/// the kube-apiserver refused with 403, as `verb resource`, once there is one (bounded).
async fn refused_requests(
    audit_log: &std::path::Path,
    user: &str,
    resources: &[String],
) -> Vec<String> {
    let deadline = std::time::Instant::now() + support::WAIT;
    loop {
        let text = std::fs::read_to_string(audit_log).unwrap_or_default();
        let refused: Vec<String> = text
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|entry| {
                entry["user"]["username"] == user && entry["responseStatus"]["code"] == 403
            })
            .filter_map(|entry| {
                let object = &entry["objectRef"];
                let resource = match object["subresource"].as_str() {
                    Some(sub) => format!("{}/{sub}", object["resource"].as_str()?),
                    None => object["resource"].as_str()?.to_owned(),
                };
                resources
                    .contains(&resource)
                    .then(|| format!("{} {resource}", entry["verb"].as_str().unwrap_or("?")))
            })
            .collect();
        if !refused.is_empty() || std::time::Instant::now() > deadline {
            return refused;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Deleting a namespace with locks, holders and waiters (and a gated Job waiting for one): the
/// controller releases and removes its finalizers, creates no claim for the Job once its own
/// went, and writes no status to anything going away (before it watched namespaces,
/// this teardown cost 10 to 30 claim status writes besides, by the order the namespace
/// controller happened to delete in). Counted in the kube-apiserver's audit log (the
/// controller's requests carry its ServiceAccount).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_torn_down_gets_no_status_writes() {
    const LOCKS: usize = 5;
    const CLAIMS_PER_LOCK: usize = 6;
    let env = Env::started().await;
    if !env.on_real_plane("a_namespace_torn_down_gets_no_status_writes") {
        return;
    }
    let mut yaml = String::new();
    for lock in 0..LOCKS {
        yaml.push_str(&format!(
            "apiVersion: turnstile.dev/v1alpha1\nkind: DistributedLock\nmetadata:\n  name: l{lock}\nspec:\n  leaseDurationSeconds: 300\n---\n"
        ));
        for claim in 0..CLAIMS_PER_LOCK {
            yaml.push_str(&format!(
                "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: l{lock}-{claim}\nspec:\n  lockName: l{lock}\n---\n"
            ));
        }
    }
    // A gated Job queued for l0: the namespace controller may delete its claim before it,
    // and a gate pass must not make the claim again (the API server refuses it there).
    yaml.push_str(&format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: gated\n  annotations:\n    turnstile.dev/lock: l0\n\
         spec:\n  suspend: true\n  template:\n    spec:\n      restartPolicy: Never\n      \
         nodeSelector: {}\n      containers: [{{name: main, image: busybox}}]\n",
        support::jobs::held_pods(&env)
    ));
    env.apply(&yaml);
    for lock in 0..LOCKS {
        env.wait_claim(&format!("l{lock}-{}", CLAIMS_PER_LOCK - 1), |claim| {
            support::position_of(claim).is_some()
        })
        .await;
    }
    env.wait_claim("gated-l0", |claim| support::position_of(claim).is_some())
        .await;
    let audit_log = test_servers::ControlPlane::for_this_process()
        .unwrap_or_else(|_| panic!("the plane of this process"))
        .files()
        .audit_log
        .clone();
    // Settled: the set-up's last passes (positions, Queued Events) are written before the
    // namespace goes, so every write counted below is the teardown's.
    // (The controller's lines about this namespace; other components log on regardless.)
    let controller_lines = || {
        std::fs::read_to_string(&audit_log)
            .expect("audit log")
            .lines()
            .filter(|line| {
                line.contains("system:serviceaccount:turnstile-system:turnstile-controller")
                    && line.contains(env.namespace.as_str())
            })
            .count()
    };
    let settle_deadline = Instant::now() + WAIT;
    let mut seen = controller_lines();
    loop {
        // Time: a second without new audit lines is the sign the set-up's writes settled.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = controller_lines();
        if now == seen {
            break;
        }
        assert!(Instant::now() < settle_deadline, "the set-up never settled");
        seen = now;
    }
    let logged_before = std::fs::read_to_string(&audit_log)
        .expect("audit log")
        .lines()
        .count();

    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    namespaces
        .delete(&env.namespace, &DeleteParams::default())
        .await
        .expect("delete the namespace");
    let deadline = Instant::now() + WAIT;
    while namespaces
        .get_opt(&env.namespace)
        .await
        .expect("get namespace")
        .is_some()
    {
        assert!(Instant::now() < deadline, "the namespace never went away");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = std::fs::read_to_string(&audit_log).expect("audit log");
    let writes: Vec<String> = text
        .lines()
        .skip(logged_before)
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| {
            entry["user"]["username"]
                == "system:serviceaccount:turnstile-system:turnstile-controller"
                && entry["objectRef"]["namespace"] == env.namespace.as_str()
                && matches!(entry["verb"].as_str(), Some("patch" | "update" | "create"))
                && entry["stage"] == "ResponseComplete"
        })
        .map(|entry| {
            format!(
                "{} {}/{} {} {}",
                entry["verb"].as_str().unwrap_or_default(),
                entry["objectRef"]["resource"].as_str().unwrap_or_default(),
                entry["objectRef"]["subresource"]
                    .as_str()
                    .unwrap_or_default(),
                entry["objectRef"]["name"].as_str().unwrap_or_default(),
                entry["responseStatus"]["code"],
            )
        })
        .collect();
    // Each object's finalizer removed once (a removal refused with 409 Conflict, because the
    // namespace controller marked the object meanwhile, is retried: it wrote nothing); no
    // status, no Event (the API server takes none into a namespace being deleted).
    let landed: Vec<&String> = writes.iter().filter(|w| w.ends_with(" 200")).collect();
    println!(
        "namespace teardown: {} objects, {} controller writes landed, {} requests in all: {writes:#?}",
        LOCKS * (CLAIMS_PER_LOCK + 1),
        landed.len(),
        writes.len()
    );
    assert!(
        writes
            .iter()
            .all(|w| !w.contains("/status ") && !w.contains("events") && !w.starts_with("create ")),
        "{writes:#?}"
    );
    // Every lock and claim, and the gated Job's claim.
    assert_eq!(
        landed.len(),
        LOCKS * (CLAIMS_PER_LOCK + 1) + 1,
        "{writes:#?}"
    );
}
