//! Playing the Job controller in tests: the Jobs of the test's namespace, finishing one, and
//! waiting for the gate's changes to it.

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{wait_object, Env};

/// Why a test that plays the Job controller runs on the fake API server: on a real plane the
/// real Job controller and KWOK finish a Job as soon as its Pods run (see
/// `e2e_examples::gated_jobs_run_one_at_a_time_through_the_real_job_controller` for that path).
pub const PLAYS_THE_JOB_CONTROLLER: &str =
    "it plays the Job controller, to end the Job at a moment of its choosing";

/// The Jobs of the test's namespace.
pub fn jobs(env: &Env) -> Api<Job> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

/// Plays the Job controller: the Job gets the condition `condition` (`Complete`, `Failed`).
pub async fn finish_job(env: &Env, job: &str, condition: &str) {
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
}

/// Whether the Job is suspended (`spec.suspend: true`).
pub fn is_suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

/// Polls the Job `name` until `done` holds; panics after [`WAIT`](super::WAIT).
pub async fn wait_job(env: &Env, name: &str, done: impl Fn(&Job) -> bool) -> Job {
    wait_object(jobs(env), name, done).await
}
