//! End to end: a claim owned by a Pod (as `turnstile wait --create` makes them) is renewed by
//! the controller while the Pod runs and released when it finishes; a Job owner likewise;
//! a deleted Pod takes its claim with it (garbage collection) and the lock moves on.

mod e2e_support;

use std::time::Duration;

use e2e_support::{phase_of, position_of, reason_of, Env};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use turnstile::api::ClaimPhase;

async fn create_pod(env: &Env, name: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    }))
    .expect("pod");
    let pod = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    set_pod_phase(env, name, "Running").await;
    pod.metadata.uid.expect("uid")
}

async fn set_pod_phase(env: &Env, name: &str, phase: &str) {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": phase}})),
    )
    .await
    .expect("pod status");
}

fn owned_claim(
    name: &str,
    lock: &str,
    kind: &str,
    api_version: &str,
    owner: &str,
    uid: &str,
) -> String {
    format!(
        "apiVersion: turnstile.dev/v1alpha1
kind: LockClaim
metadata:
  name: {name}
  ownerReferences:
  - apiVersion: {api_version}
    kind: {kind}
    name: {owner}
    uid: {uid}
    controller: true
spec:
  lockName: {lock}
"
    )
}

fn expires_at(claim: &turnstile::api::LockClaim) -> Option<k8s_openapi::jiff::Timestamp> {
    claim.status.as_ref()?.expires_at.as_ref().map(|t| t.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_keeps_its_claim_and_finishing_releases_it() {
    let mut env = Env::new().await;
    env.start_default_controller();
    env.apply_lock("db", "leaseDurationSeconds: 3");
    let uid = create_pod(&env, "worker-1").await;
    env.apply(&owned_claim(
        "worker-1-db",
        "db",
        "Pod",
        "v1",
        "worker-1",
        &uid,
    ));
    env.apply_claim("next", "db", "");
    let first = env.wait_phase("worker-1-db", ClaimPhase::Held).await;
    assert_eq!(
        reason_of(&env.wait_claim("next", |c| position_of(c) == Some(1)).await).as_deref(),
        Some("Queued")
    );

    // Over two leases go by without anyone touching spec.renewTime.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let renewed = env.claim("worker-1-db").await;
    assert_eq!(phase_of(&renewed), Some(ClaimPhase::Held));
    assert!(
        expires_at(&renewed) > expires_at(&first),
        "the lease moved on"
    );
    env.wait_event("worker-1-db", "Renewed").await;

    set_pod_phase(&env, "worker-1", "Succeeded").await;
    let done = env.wait_phase("worker-1-db", ClaimPhase::Released).await;
    assert_eq!(reason_of(&done).as_deref(), Some("OwnerFinished"));
    env.wait_phase("next", ClaimPhase::Held).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_job_releases_its_claim() {
    let mut env = Env::new().await;
    env.start_default_controller();
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.namespace);
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "migrate"},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox"}]
        }}}
    }))
    .expect("job");
    let job = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("create job");
    let uid = job.metadata.uid.expect("uid");
    env.apply(&owned_claim(
        "migrate-db",
        "db",
        "Job",
        "batch/v1",
        "migrate",
        &uid,
    ));
    env.wait_phase("migrate-db", ClaimPhase::Held).await;

    jobs.patch_status(
        "migrate",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"conditions": [
            {"type": "Complete", "status": "True"}
        ]}})),
    )
    .await
    .expect("job status");
    // Nothing about the claim changed, so the controller notices at its next look (the
    // resync of a 300 s lease is far): bump the claim as a user would, to check the rule.
    env.patch_claim_spec("migrate-db", json!({"holderIdentity": "migrate"}))
        .await;
    let done = env.wait_phase("migrate-db", ClaimPhase::Released).await;
    assert_eq!(reason_of(&done).as_deref(), Some("OwnerFinished"));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_takes_its_claim_and_the_lock_moves_on() {
    let Some(mut env) = Env::fake_only("a_deleted_pod_takes_its_claim_and_the_lock_moves_on").await
    else {
        return;
    };
    env.start_default_controller();
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let uid = create_pod(&env, "worker-2").await;
    env.apply(&owned_claim(
        "worker-2-db",
        "db",
        "Pod",
        "v1",
        "worker-2",
        &uid,
    ));
    env.apply_claim("next", "db", "");
    env.wait_phase("worker-2-db", ClaimPhase::Held).await;
    env.wait_claim("next", |c| position_of(c) == Some(1)).await;

    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    pods.delete("worker-2", &DeleteParams::default())
        .await
        .expect("delete pod");
    env.wait_gone("worker-2-db").await;
    env.wait_phase("next", ClaimPhase::Held).await;
    env.stop_controller().await;
}
