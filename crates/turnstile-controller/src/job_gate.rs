//! Job gating without an init container: a Job created with `spec.suspend: true` and the
//! annotation `turnstile.dev/lock: <lock name>` gets a `LockClaim` owned by the Job; once the
//! claim is `Held` the controller writes its fencing token to the Job (annotation
//! `turnstile.dev/fencing-token`, on the Job and on its Pod template, so the Pods can read it
//! through the downward API) and un-suspends it. The owner rule then renews the claim while
//! the Job runs and releases it when the Job finishes or is deleted.
//!
//! The decision ([`decide`]) is pure; [`reconcile_job`] performs it. Every step is idempotent:
//! the claim has a fixed name (`<job>-<lock>`), creating it twice answers AlreadyExists, and
//! the un-suspend patch is conditional on the Job's resourceVersion.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::controller::{Action, Config as ControllerRuntimeConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};

use super::context::LeadershipGate;
use super::core::{WorkloadKind, WorkloadOwner};
use super::error::ControllerError;
use super::owners::job_finished;
use super::writer::{ApiWriter, Created, Write};
use crate::metrics::{ControllerKind, Metrics};
use turnstile_api::{
    job_event_reasons, ClaimPhase, LockClaim, LockClaimSpec, LOCK_ANNOTATION, TOKEN_ANNOTATION,
};

/// How long a name may be (DNS-1123 subdomain).
const MAX_NAME_LENGTH: usize = 253;
/// Retry delay after a failed pass.
const RETRY: Duration = Duration::from_secs(2);

/// What a pass over one Job does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateStep {
    /// Not a gated Job (no annotation), or nothing left to do.
    Nothing,
    /// Create the Job's claim on this lock.
    CreateClaim {
        /// The claim's name.
        claim: String,
        /// The lock it asks for.
        lock: String,
    },
    /// The claim waits in the queue: stay suspended.
    Wait,
    /// The claim is held: write the token and un-suspend.
    Release {
        /// The grant's fencing token.
        token: i64,
    },
    /// The Job cannot be gated; it stays as it is, and this says why.
    Blocked {
        /// For people.
        reason: String,
    },
}

/// The claim name of a gated Job: `<job>-<lock>`.
pub fn claim_name(job: &str, lock: &str) -> String {
    format!("{job}-{lock}")
}

fn is_suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|spec| spec.suspend) == Some(true)
}

/// The lock a Job is gated on, if it carries a non-empty annotation.
pub fn gate_lock(job: &Job) -> Option<&str> {
    job.annotations()
        .get(LOCK_ANNOTATION)
        .map(|lock| lock.trim())
        .filter(|lock| !lock.is_empty())
}

/// Decides what to do about `job`, given its claim (looked up by [`claim_name`]) if it exists.
pub fn decide(job: &Job, claim: Option<&LockClaim>) -> GateStep {
    let Some(lock) = gate_lock(job) else {
        return GateStep::Nothing;
    };
    if job.metadata.deletion_timestamp.is_some() || job_finished(job) {
        return GateStep::Nothing;
    }
    let name = claim_name(&job.name_any(), lock);
    let Some(claim) = claim else {
        // Only a suspended Job can be held back; one that runs already is not gated.
        if !is_suspended(job) {
            return GateStep::Nothing;
        }
        if name.len() > MAX_NAME_LENGTH {
            return GateStep::Blocked {
                reason: format!("claim name {name:?} is longer than {MAX_NAME_LENGTH} characters"),
            };
        }
        return GateStep::CreateClaim {
            claim: name,
            lock: lock.to_owned(),
        };
    };
    let owned = WorkloadOwner::of(claim.owner_references()).is_some_and(|owner| {
        owner.kind == WorkloadKind::Job && Some(&owner.uid) == job.metadata.uid.as_ref()
    });
    if !owned {
        return GateStep::Blocked {
            reason: format!("claim {name} exists but is not owned by this Job"),
        };
    }
    if claim.spec.lock_name != lock {
        return GateStep::Blocked {
            reason: format!(
                "claim {name} asks for lock {}, not {lock}",
                claim.spec.lock_name
            ),
        };
    }
    let status = claim.status.as_ref();
    match status.and_then(|s| s.phase).unwrap_or_default() {
        ClaimPhase::Pending => GateStep::Wait,
        ClaimPhase::Held => match status.and_then(|s| s.fencing_token) {
            Some(token) => {
                let written = job.annotations().get(TOKEN_ANNOTATION) == Some(&token.to_string());
                if is_suspended(job) || !written {
                    GateStep::Release { token }
                } else {
                    GateStep::Nothing
                }
            }
            None => GateStep::Wait,
        },
        // Released (the Job finished), Expired or Failed: a terminal claim is never granted
        // again, so a Job still suspended stays so (the claim's reason says why).
        phase => {
            if is_suspended(job) {
                GateStep::Blocked {
                    reason: format!("claim {name} is {phase}; the Job stays suspended"),
                }
            } else {
                GateStep::Nothing
            }
        }
    }
}

/// The claim a gated Job gets: owned (controller) by the Job, so it follows the Job's life.
pub fn claim_for(job: &Job, claim: &str, lock: &str) -> LockClaim {
    let mut object = LockClaim::new(claim, LockClaimSpec::for_lock(lock));
    object.metadata.namespace = job.namespace();
    object.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "batch/v1".to_owned(),
        kind: "Job".to_owned(),
        name: job.name_any(),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        // Setting blockOwnerDeletion needs `update` on jobs/finalizers; the claim's own
        // finalizer already guarantees the backend release.
        block_owner_deletion: None,
    }]);
    object
}

/// The merge patch that records `token` and un-suspends the Job (made conditional on the
/// Job's resourceVersion by the writer). The Pod template gets the annotation too: Kubernetes
/// allows changing a never-started suspended Job's template annotations, and the Pods read it
/// from there.
pub fn release_patch(token: i64) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "annotations": {TOKEN_ANNOTATION: token.to_string()},
        },
        "spec": {
            "suspend": false,
            "template": {"metadata": {"annotations": {TOKEN_ANNOTATION: token.to_string()}}},
        },
    })
}

/// What the Job gate's passes share.
pub struct GateContext {
    /// The API client.
    pub client: Client,
    /// The claim cache (the shared claim watch).
    pub claims: Store<LockClaim>,
    /// Checked right before every write: only the leader creates claims and un-suspends Jobs.
    pub leadership: LeadershipGate,
    /// Publishes Events about the Jobs (`kubectl describe job` tells why it waits).
    pub recorder: Recorder,
    /// Counts and times the passes.
    pub metrics: Metrics,
}

impl GateContext {
    /// Publishes a Normal Event about `job`; a failed publish is only logged.
    async fn event(&self, job: &Job, reason: &str, note: String) {
        if self.leadership.check("publishing a Job Event").is_err() {
            return;
        }
        let event = Event {
            type_: EventType::Normal,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &job.object_ref(&())).await {
            tracing::debug!(job = %job.name_any(), %error, "cannot publish Job Event");
        }
    }
}

/// One pass over a Job (see the module docs).
pub async fn reconcile_job(
    job: Arc<Job>,
    ctx: Arc<GateContext>,
) -> Result<Action, ControllerError> {
    let mut timer = ctx.metrics.reconciles.start(ControllerKind::Job);
    let result = gate_job(job, &ctx).await;
    timer.set_failed(result.is_err());
    result
}

async fn gate_job(job: Arc<Job>, ctx: &GateContext) -> Result<Action, ControllerError> {
    let Some(lock) = gate_lock(&job) else {
        return Ok(Action::await_change());
    };
    let namespace = job.namespace().unwrap_or_default();
    let name = claim_name(&job.name_any(), lock);
    let cached = ctx.claims.get(&ObjectRef::new(&name).within(&namespace));
    let claims: Api<LockClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut step = decide(&job, cached.as_deref());
    let writer = ApiWriter::new(ctx.leadership.clone());
    if let GateStep::CreateClaim { claim, lock } = &step {
        match writer
            .create(&claims, &claim_for(&job, claim, lock))
            .await?
        {
            Created::New(_) => {
                tracing::info!(%namespace, job = %job.name_any(), %lock, %claim, "gated Job: claim created");
                ctx.event(
                    &job,
                    job_event_reasons::WAITING_FOR_LOCK,
                    format!("suspended until LockClaim {claim} holds lock {lock}"),
                )
                .await;
                return Ok(Action::await_change());
            }
            // The cache lags behind: decide again on the claim as it is.
            Created::AlreadyExists => {
                let existing = claims
                    .get(claim)
                    .await
                    .map_err(|e| ControllerError::kube(format!("reading claim {claim}"), e))?;
                step = decide(&job, Some(&existing));
            }
        }
    }
    match step {
        GateStep::Release { token } => {
            let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
            let write = Write::object(&job.name_any(), release_patch(token));
            writer
                .apply(&jobs, &write, job.resource_version().as_deref())
                .await?;
            tracing::info!(%namespace, job = %job.name_any(), %lock, token, "gated Job: lock held, Job un-suspended");
            ctx.event(
                &job,
                job_event_reasons::LOCK_HELD,
                format!("lock {lock} held with fencing token {token}; Job un-suspended"),
            )
            .await;
        }
        GateStep::Blocked { reason } => {
            tracing::warn!(%namespace, job = %job.name_any(), %lock, %reason, "gated Job blocked");
        }
        GateStep::Nothing | GateStep::Wait | GateStep::CreateClaim { .. } => {}
    }
    Ok(Action::await_change())
}

/// Retries a failed pass soon (409s included: the next pass reads fresh state).
pub fn job_error_policy(job: Arc<Job>, error: &ControllerError, _ctx: Arc<GateContext>) -> Action {
    if error.is_not_leader() {
        // The controllers are stopping; the next leader takes over.
        return Action::await_change();
    }
    let object = format!(
        "job/{}/{}",
        job.namespace().unwrap_or_default(),
        job.name_any()
    );
    error.log_failed_pass(&object, RETRY);
    Action::requeue(RETRY)
}

/// The Job a claim event concerns: its owning Job, if any.
fn job_of_claim(claim: Arc<LockClaim>) -> Option<ObjectRef<Job>> {
    let owner = WorkloadOwner::of(claim.owner_references())?;
    let namespace = claim.namespace()?;
    (owner.kind == WorkloadKind::Job).then(|| ObjectRef::new(&owner.name).within(&namespace))
}

/// The Job gate controller over the shared Job cache (`jobs`, fed by `job_events`: all Jobs of
/// the served namespaces, as an annotation cannot be selected on) and the shared claim watch's
/// `claim_events`, until `stop` completes.
pub fn run_gate(
    jobs: Store<Job>,
    job_events: impl Stream<Item = Arc<Job>> + Send + 'static,
    ctx: GateContext,
    claim_events: impl Stream<Item = Arc<LockClaim>> + Send + 'static,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send {
    let ctx = Arc::new(ctx);
    // No debounce: a lone event is handled at once (bursts merge in the scheduler).
    Controller::for_shared_stream(job_events, jobs)
        .watches_shared_stream(claim_events, job_of_claim)
        .with_config(ControllerRuntimeConfig::default())
        .graceful_shutdown_on(stop)
        .run(reconcile_job, job_error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "job gate");
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(annotations: serde_json::Value, suspend: bool) -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": "migrate", "namespace": "ns", "uid": "job-uid",
                         "resourceVersion": "7", "annotations": annotations},
            "spec": {"suspend": suspend, "template": {"spec": {"containers": []}}}
        }))
        .expect("job")
    }

    fn gated(suspend: bool) -> Job {
        job(json!({LOCK_ANNOTATION: "db"}), suspend)
    }

    fn claim_of(job: &Job, status: serde_json::Value) -> LockClaim {
        let mut claim = claim_for(job, "migrate-db", "db");
        claim.status = serde_json::from_value(status).expect("status");
        claim
    }

    #[test]
    fn a_job_without_the_annotation_is_ignored() {
        assert_eq!(decide(&job(json!({}), true), None), GateStep::Nothing);
        assert_eq!(
            decide(&job(json!({LOCK_ANNOTATION: " "}), true), None),
            GateStep::Nothing
        );
    }

    #[test]
    fn a_suspended_gated_job_gets_a_claim_owned_by_it() {
        let job = gated(true);
        assert_eq!(
            decide(&job, None),
            GateStep::CreateClaim {
                claim: "migrate-db".to_owned(),
                lock: "db".to_owned()
            }
        );
        let claim = claim_for(&job, "migrate-db", "db");
        let owner = WorkloadOwner::of(claim.owner_references()).expect("owner");
        assert_eq!(owner.kind, WorkloadKind::Job);
        assert_eq!(owner.uid, "job-uid");
        assert_eq!(claim.spec.lock_name, "db");
        // A running Job is not gated after the fact.
        assert_eq!(decide(&gated(false), None), GateStep::Nothing);
    }

    #[test]
    fn the_job_runs_only_once_its_claim_is_held() {
        let job = gated(true);
        assert_eq!(
            decide(&job, Some(&claim_of(&job, json!({"phase": "Pending"})))),
            GateStep::Wait
        );
        assert_eq!(
            decide(&job, Some(&claim_of(&job, json!({})))),
            GateStep::Wait
        );
        let held = claim_of(&job, json!({"phase": "Held", "fencingToken": 42}));
        assert_eq!(decide(&job, Some(&held)), GateStep::Release { token: 42 });
        let write = Write::object("job", release_patch(42));
        let patch = write.conditional_patch(job.resource_version().as_deref());
        assert_eq!(patch["spec"]["suspend"], json!(false));
        assert_eq!(patch["metadata"]["annotations"][TOKEN_ANNOTATION], "42");
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn releasing_is_idempotent() {
        let running = job(
            json!({LOCK_ANNOTATION: "db", TOKEN_ANNOTATION: "42"}),
            false,
        );
        let held = claim_of(&running, json!({"phase": "Held", "fencingToken": 42}));
        assert_eq!(decide(&running, Some(&held)), GateStep::Nothing);
        let released = claim_of(&running, json!({"phase": "Released", "fencingToken": 42}));
        assert_eq!(decide(&running, Some(&released)), GateStep::Nothing);
    }

    #[test]
    fn a_foreign_or_dead_claim_blocks_the_job() {
        let job = gated(true);
        let mut foreign = claim_of(&job, json!({"phase": "Held", "fencingToken": 1}));
        foreign.metadata.owner_references = None;
        assert!(matches!(
            decide(&job, Some(&foreign)),
            GateStep::Blocked { .. }
        ));
        let failed = claim_of(&job, json!({"phase": "Failed"}));
        assert!(matches!(
            decide(&job, Some(&failed)),
            GateStep::Blocked { .. }
        ));
    }
}
