//! The deployed RBAC covers every call the controller makes. Representative flows run
//! against the fake API server (locks, claims and their status, finalizers, Events, the
//! leader Lease, claims owned by a Pod and a Job, a gated Job and a gated Pod, an orphan
//! claim, an expiry, a lock made from a template, a cluster lock), the controller watching
//! every namespace as `deploy/` runs it;
//! the controller has a client of its own whose requests are tagged, so the fake's request
//! log tells them from the test's. Every request it made must be granted by the rendered
//! `deploy/` ClusterRole or, for the Lease, the namespaced leader-election Role (with its
//! `resourceNames`). Grants nothing used are printed, as information.

use crate::deploy;
use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use deploy::{find, grants, render_base, Grant};
use fake_apiserver::{rbac_summary, RecordedRequest};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::actor::{requests_of, tagged_client};
use support::pods::{owned_claim, pods, set_pod_phase};
use support::{wait_object, Env};
use turnstile_api::ClaimPhase;
use turnstile_controller::leader::{LeaderConfig, DEFAULT_LEASE_NAME};
use turnstile_controller::ControllerConfig;

const ACTOR: &str = "controller";

/// `resource` or `resource/subresource`, as RBAC names it.
fn rbac_resource(request: &RecordedRequest) -> String {
    if request.subresource.is_empty() {
        request.resource.clone()
    } else {
        format!("{}/{}", request.resource, request.subresource)
    }
}

/// Whether `grant` allows `request` (a Role only in its own namespace: the Lease's here).
fn allows(grant: &Grant, request: &RecordedRequest) -> bool {
    let (group, resource, verb, names) = grant;
    group == &request.api_group
        && resource == &rbac_resource(request)
        && verb == &request.verb
        && (names.is_empty() || names.contains(&request.name))
}

async fn create_owner<K>(env: &Env, object: serde_json::Value) -> (String, String)
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(env.client.clone(), &env.namespace);
    let object: K = serde_json::from_value(object).expect("owner object");
    let created = api
        .create(&PostParams::default(), &object)
        .await
        .expect("create owner");
    let meta = created.meta();
    (
        meta.name.clone().expect("name"),
        meta.uid.clone().expect("uid"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_rbac_grants_every_call_the_controller_makes() {
    let env = Env::fake_only("its request log lists every call the controller made").await;
    // Of all namespaces, as `deploy/` runs it: it serves ClusterDistributedLocks too.
    let controller = env.spawn_controller_of_all_namespaces_with(
        tagged_client(env.server(), ACTOR),
        ControllerConfig {
            instance: Some("rbac-replica".to_owned()),
            leader_election: Some(
                LeaderConfig::new(env.namespace.clone(), "rbac-replica").with_timings(
                    Duration::from_secs(3),
                    Duration::from_secs(2),
                    Duration::from_millis(300),
                ),
            ),
            ..ControllerConfig::default()
        },
    );

    // A queue on a lock: a Pod-owned holder, a Job-owned claim, a plain one.
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let pod = create_owner::<Pod>(
        &env,
        json!({"metadata": {"name": "worker"},
               "spec": {"containers": [{"name": "main", "image": "busybox"}]}}),
    )
    .await;
    set_pod_phase(&env, "worker", "Running").await;
    env.apply(&owned_claim("worker-db", "db", "Pod", "v1", &pod.0, &pod.1));
    env.wait_phase("worker-db", ClaimPhase::Held).await;
    let job = create_owner::<Job>(
        &env,
        json!({"metadata": {"name": "migrate"},
               "spec": {"template": {"spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "busybox"}]}}}}),
    )
    .await;
    env.apply(&owned_claim(
        "migrate-db",
        "db",
        "Job",
        "batch/v1",
        &job.0,
        &job.1,
    ));
    env.apply_claim("plain", "db", "");

    // The Pod finishes: its claim is released, the Job's claim is granted.
    set_pod_phase(&env, "worker", "Succeeded").await;
    env.wait_phase("migrate-db", ClaimPhase::Held).await;
    // Deleting the holder's claim releases it through the finalizer.
    env.delete_claim("migrate-db").await;
    env.wait_gone("migrate-db").await;
    env.wait_phase("plain", ClaimPhase::Held).await;
    env.patch_claim_spec("plain", json!({"release": true}))
        .await;
    env.wait_phase("plain", ClaimPhase::Released).await;

    // A gated Job: the controller creates its claim and un-suspends it once held.
    env.apply(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: gated\n  annotations:\n    turnstile.dev/lock: db\nspec:\n  suspend: true\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: busybox\n",
    );
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.namespace);
    wait_object(jobs, "gated", |job| {
        job.spec.as_ref().and_then(|spec| spec.suspend) == Some(false)
    })
    .await;

    // A gated Pod (on its own lock): its claim is created and its scheduling gate removed.
    env.apply_lock("pods", "leaseDurationSeconds: 300");
    env.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: gated-pod\n  labels:\n    turnstile.dev/lock: pods\nspec:\n  schedulingGates:\n  - name: turnstile.dev/lock\n  containers:\n  - name: main\n    image: busybox\n",
    );
    wait_object(pods(&env), "gated-pod", |pod| {
        pod.spec
            .as_ref()
            .and_then(|spec| spec.scheduling_gates.as_ref())
            .is_none_or(|gates| gates.is_empty())
    })
    .await;

    // An expiry on a short lease, and a claim on a lock that does not exist.
    env.apply_lock("short", "leaseDurationSeconds: 1");
    env.apply_claim("x", "short", "");
    env.wait_phase("x", ClaimPhase::Expired).await;
    env.apply_claim("orphan", "missing", "");
    env.wait_claim("orphan", |claim| claim.status.is_some())
        .await;
    // A lock made from a template on first use, deleted once unused for a second.
    env.apply(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockTemplate\nmetadata:\n  name: made\nspec:\n  names: [\"made-*\"]\n  lock: {}\n  deleteAfterUnusedSeconds: 1\n",
    );
    env.apply_claim("on-made", "made-1", "");
    env.wait_phase("on-made", ClaimPhase::Held).await;
    env.delete_claim("on-made").await;
    env.wait_lock_gone("made-1").await;
    // A ClusterDistributedLock: granted, and released through the claim's finalizer.
    env.apply(
        "apiVersion: turnstile.dev/v1alpha1\nkind: ClusterDistributedLock\nmetadata:\n  name: shared\nspec:\n  namespaceSelector: {}\n",
    );
    env.apply_claim("on-shared", "shared", "lockKind: ClusterDistributedLock");
    env.wait_phase("on-shared", ClaimPhase::Held).await;
    env.delete_claim("on-shared").await;
    env.wait_gone("on-shared").await;
    controller.stop().await;

    let log = requests_of(&env.server().request_log(), ACTOR);
    let used = rbac_summary(&log);
    println!("the controller used:");
    for ((group, resource), verbs) in &used {
        println!("  {group}/{resource}: {verbs:?}");
    }
    // The flows reached every kind of call this test is about.
    for (group, resource, verb) in [
        ("turnstile.dev", "distributedlocks", "watch"),
        ("turnstile.dev", "lockclaims", "watch"),
        ("turnstile.dev", "lockclaims", "patch"),
        ("turnstile.dev", "lockclaims/status", "patch"),
        ("turnstile.dev", "distributedlocks/status", "patch"),
        ("turnstile.dev", "lockclaims", "create"),
        ("turnstile.dev", "distributedlocks", "create"),
        ("turnstile.dev", "distributedlocks", "delete"),
        ("turnstile.dev", "locktemplates", "watch"),
        ("turnstile.dev", "clusterdistributedlocks", "watch"),
        ("turnstile.dev", "clusterdistributedlocks", "patch"),
        ("turnstile.dev", "clusterdistributedlocks/status", "patch"),
        ("events.k8s.io", "events", "create"),
        ("coordination.k8s.io", "leases", "update"),
        ("", "pods", "watch"),
        ("batch", "jobs", "patch"),
    ] {
        assert!(
            used.get(&(group.to_owned(), resource.to_owned()))
                .is_some_and(|verbs| verbs.contains(verb)),
            "the flows never made a {verb} on {group}/{resource}: {used:?}"
        );
    }

    let objects = render_base();
    let cluster_grants = grants(find(&objects, "ClusterRole", "turnstile-controller"));
    let leader_grants = grants(find(&objects, "Role", "turnstile-leader-election"));
    let mut uncovered = BTreeSet::new();
    let mut used_grants = BTreeSet::new();
    for request in log
        .iter()
        .filter(|r| r.is_resource_request && !r.injected_fault)
    {
        let by_cluster_role = cluster_grants.iter().find(|g| allows(g, request));
        // The Role lives in the controller's namespace, where its Lease is.
        let by_leader_role = leader_grants
            .iter()
            .find(|g| request.namespace == env.namespace && allows(g, request));
        match by_cluster_role.or(by_leader_role) {
            Some(grant) => {
                used_grants.insert(grant.clone());
            }
            None => {
                uncovered.insert(format!(
                    "{} {}/{} {:?} in {:?}",
                    request.verb,
                    request.api_group,
                    rbac_resource(request),
                    request.name,
                    request.namespace
                ));
            }
        }
    }
    let unused: Vec<_> = cluster_grants
        .iter()
        .chain(&leader_grants)
        .filter(|grant| !used_grants.contains(*grant))
        .collect();
    println!("granted but not used by these flows (information): {unused:?}");
    assert!(
        uncovered.is_empty(),
        "the deployed RBAC does not grant: {uncovered:#?}"
    );
    assert!(
        log.iter()
            .filter(|r| r.resource == "leases" && r.verb != "create")
            .all(|r| r.name == DEFAULT_LEASE_NAME),
        "the controller only touches its own Lease"
    );
}
