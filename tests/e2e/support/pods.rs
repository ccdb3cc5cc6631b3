//! Playing the kubelet and the workload's owner on the fake: Pods created and moved through
//! their phases by hand, and claims owned by them.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::Env;

/// The Pods of the test's namespace.
pub fn pods(env: &Env) -> Api<Pod> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

/// Creates a one-container Pod `name` (no phase yet); returns its uid.
pub async fn create_pod(env: &Env, name: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    }))
    .expect("pod");
    pods(env)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod")
        .metadata
        .uid
        .expect("uid")
}

/// Sets the Pod's `status.phase`, as the kubelet would.
pub async fn set_pod_phase(env: &Env, name: &str, phase: &str) {
    pods(env)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": phase}})),
        )
        .await
        .expect("pod status");
}

/// A claim `name` on `lock` whose controlling owner is the `kind` object `owner` (`uid`).
pub fn owned_claim(
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
