//! Playing the kubelet and the workload's owner on the fake: Pods created and moved through
//! their phases by hand, and claims owned by them.

#![allow(dead_code)]

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

/// Sets the Pod's `status.phase`, as the kubelet would. On a real plane KWOK plays the kubelet
/// of the Pods it is given: a finished phase is set only once KWOK has made the Pod ready (if
/// the Pod is to be scheduled at all), or KWOK's own later `Running` would overwrite it.
pub async fn set_pod_phase(env: &Env, name: &str, phase: &str) {
    if env.fake.is_none() && matches!(phase, "Succeeded" | "Failed") {
        let pod = pods(env).get(name).await.expect("get pod");
        let to_be_scheduled = pod
            .spec
            .as_ref()
            .is_some_and(|spec| spec.scheduling_gates.as_ref().is_none_or(Vec::is_empty));
        if to_be_scheduled {
            super::wait_object(pods(env), name, |pod| {
                pod.status
                    .as_ref()
                    .and_then(|status| status.conditions.as_ref())
                    .is_some_and(|conditions| {
                        conditions
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    })
            })
            .await;
        }
    }
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
