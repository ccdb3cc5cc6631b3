//! Jobs in tests: the Jobs of the test's namespace, ending one at a moment the test chooses,
//! and waiting for the gate's changes to it.
//!
//! On a real plane the real Job controller, scheduler and KWOK run a Job: its Pods are held
//! unscheduled by [`held_pods`] until [`finish_job`] lets them run (`Complete`) or sets a
//! deadline they cannot meet (`Failed`). On the fake nothing runs Pods, and `finish_job`
//! writes the condition the Job controller would.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{wait_object, Env};

/// The Jobs of the test's namespace.
pub fn jobs(env: &Env) -> Api<Job> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

/// The label of KWOK's Node that lets this test's held Pods be scheduled.
fn run_label(env: &Env) -> String {
    format!("e2e.turnstile.dev/{}", env.namespace)
}

/// A Pod template's `nodeSelector` that keeps this test's Pods unscheduled until
/// [`finish_job`] lets them run.
pub fn held_pods(env: &Env) -> serde_json::Value {
    json!({ run_label(env): "run" })
}

/// Ends the Job `job` with `condition` (`Complete` or `Failed`) and returns once the Job
/// shows it. On a real plane, `Complete`: KWOK's Node gets the label [`held_pods`] selects, so
/// the scheduler binds the Pods, KWOK runs them to `Succeeded` and the Job controller completes
/// the Job; `Failed`: a one-second `activeDeadlineSeconds`, which the held Pods cannot meet, so
/// the Job controller fails it. On the fake: the condition written to the Job's status.
pub async fn finish_job(env: &Env, job: &str, condition: &str) {
    if env.fake.is_some() {
        jobs(env)
            .patch_status(
                job,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"conditions": [
                    {"type": condition, "status": "True"}
                ]}})),
            )
            .await
            .expect("job status");
        return;
    }
    match condition {
        "Complete" => {
            let nodes: Api<Node> = Api::all(env.client.clone());
            let labels = json!({"metadata": {"labels": {run_label(env): "run"}}});
            nodes
                .patch(
                    test_servers::KWOK_NODE,
                    &PatchParams::default(),
                    &Patch::Merge(&labels),
                )
                .await
                .expect("label KWOK's Node");
        }
        "Failed" => {
            jobs(env)
                .patch(
                    job,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"activeDeadlineSeconds": 1}})),
                )
                .await
                .expect("a deadline on the Job");
        }
        other => panic!("finish_job: no way to make a Job {other}"),
    }
    wait_job(env, job, |job| has_condition(job, condition)).await;
}

/// Creates the Job `job` (JSON, as `kubectl` would send it) and the claim `claim` on `lock`
/// that it owns (controller reference); returns the Job's uid.
pub async fn job_owning_a_claim(
    env: &Env,
    job: serde_json::Value,
    claim: &str,
    lock: &str,
) -> String {
    let job = super::create_from_json(&jobs(env), job).await;
    let name = job.metadata.name.clone().expect("the Job's name");
    let uid = job.metadata.uid.expect("the Job's uid");
    env.apply(&super::pods::owned_claim(
        claim, lock, "Job", "batch/v1", &name, &uid,
    ));
    uid
}

/// Whether the Job has the condition `kind` with status `True`.
pub fn has_condition(job: &Job, kind: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == kind && c.status == "True")
        })
}

/// Whether the Job is suspended (`spec.suspend: true`).
pub fn is_suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

/// Polls the Job `name` until `done` holds; panics after [`WAIT`](super::WAIT).
pub async fn wait_job(env: &Env, name: &str, done: impl Fn(&Job) -> bool) -> Job {
    wait_object(jobs(env), name, done).await
}
