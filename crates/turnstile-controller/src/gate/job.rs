//! The Job gate: a Job created with `spec.suspend: true` and the annotation
//! `turnstile.dev/lock: <lock name>` is un-suspended once its claim is held. The token goes on
//! the Job and on its Pod template: Kubernetes allows changing a never-started suspended
//! Job's template annotations, and the Pods read it from there. A Job another admission
//! controller holds (Kueue's queue label, another `spec.managedBy`) is not gated: Turnstile
//! cannot be the one that lets it run.

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use super::{Gated, OtherHolder};
use crate::core::WorkloadKind;
use crate::metrics::ControllerKind;
use crate::pass::owners::job_finished;
use turnstile_api::{LOCK_ANNOTATION, TOKEN_ANNOTATION};

impl Gated for Job {
    const KIND: WorkloadKind = WorkloadKind::Job;
    const CONTROLLER: ControllerKind = ControllerKind::Job;
    const HELD_BACK: &'static str = "suspended";

    fn marking(&self) -> Option<&String> {
        self.annotations().get(LOCK_ANNOTATION)
    }

    fn held_back(&self) -> bool {
        self.spec.as_ref().and_then(|spec| spec.suspend) == Some(true)
    }

    fn finished(&self) -> bool {
        job_finished(self)
    }

    fn release_patch(&self, token: i64) -> serde_json::Value {
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

    fn other_holder(&self) -> Option<OtherHolder> {
        if let Some(queue) = self.labels().get(KUEUE_QUEUE_LABEL) {
            return Some(OtherHolder::Decides(format!(
                "label {KUEUE_QUEUE_LABEL}={queue}"
            )));
        }
        self.spec
            .as_ref()
            .and_then(|spec| spec.managed_by.as_deref())
            .filter(|manager| *manager != BUILT_IN_JOB_CONTROLLER)
            .map(|manager| OtherHolder::Decides(format!("spec.managedBy {manager}")))
    }
}

/// The label by which Kueue queues a Job (and suspends it until it admits it).
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// `spec.managedBy` of a Job the built-in Job controller runs (also when the field is unset).
const BUILT_IN_JOB_CONTROLLER: &str = "kubernetes.io/job-controller";

#[cfg(test)]
mod tests {
    use super::super::{claim_for, decide, GateStep};
    use super::*;
    use crate::core::WorkloadOwner;
    use crate::writer::Write;
    use serde_json::json;
    use turnstile_api::{LockClaim, LOCKS_ANNOTATION};

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
        let mut claim = claim_for(job, "migrate-db", &["db".to_owned()]);
        claim.status = serde_json::from_value(status).expect("status");
        claim
    }

    #[test]
    fn a_jobs_traceparent_goes_on_its_claim() {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced = job(
            json!({LOCK_ANNOTATION: "db", turnstile_api::TRACEPARENT_ANNOTATION: traceparent}),
            true,
        );
        let claim = claim_for(&traced, "migrate-db", &["db".to_owned()]);
        assert_eq!(
            claim.metadata.annotations.unwrap_or_default()[turnstile_api::TRACEPARENT_ANNOTATION],
            traceparent
        );
        let untraced = claim_for(&gated(true), "migrate-db", &["db".to_owned()]);
        assert!(untraced.metadata.annotations.is_none());
    }

    #[test]
    fn the_locks_annotation_gives_a_job_one_claim_on_all_its_locks() {
        let job = job(
            json!({LOCK_ANNOTATION: "db", LOCKS_ANNOTATION: "db,cache"}),
            true,
        );
        let locks = vec!["cache".to_owned(), "db".to_owned()];
        assert_eq!(
            decide(&job, None),
            GateStep::CreateClaim {
                claim: "migrate-db".to_owned(),
                locks: locks.clone(),
            }
        );
        let mut claim = claim_for(&job, "migrate-db", &locks);
        assert_eq!(claim.spec.lock_names, Some(locks));
        claim.status =
            serde_json::from_value(json!({"phase": "Held", "fencingToken": 9})).expect("status");
        assert_eq!(decide(&job, Some(&claim)), GateStep::Release { token: 9 });
    }

    #[test]
    fn the_lock_kind_annotation_gives_a_job_a_claim_on_a_cluster_lock_and_bad_kinds_block_it() {
        use turnstile_api::LOCK_KIND_ANNOTATION;
        let on_cluster_lock = job(
            json!({LOCK_ANNOTATION: "db", LOCK_KIND_ANNOTATION: "ClusterDistributedLock"}),
            true,
        );
        assert!(matches!(
            decide(&on_cluster_lock, None),
            GateStep::CreateClaim { .. }
        ));
        let mut claim = claim_for(&on_cluster_lock, "migrate-db", &["db".to_owned()]);
        assert!(claim.spec.claims_cluster_lock());
        claim.status =
            serde_json::from_value(json!({"phase": "Held", "fencingToken": 3})).expect("status");
        assert_eq!(
            decide(&on_cluster_lock, Some(&claim)),
            GateStep::Release { token: 3 }
        );
        // Its claim is on the namespace's lock db (the annotation came later): another lock.
        let namespaced = claim_of(&gated(true), json!({"phase": "Pending"}));
        assert!(matches!(
            decide(&on_cluster_lock, Some(&namespaced)),
            GateStep::Blocked { reason } if reason.contains("not a ClusterDistributedLock")
        ));
        for (annotations, says) in [
            (
                json!({LOCK_ANNOTATION: "db", LOCK_KIND_ANNOTATION: "ClusterDistributedLock",
                       LOCKS_ANNOTATION: "db,cache"}),
                "claimed alone",
            ),
            (
                json!({LOCK_ANNOTATION: "db", LOCK_KIND_ANNOTATION: "Cluster"}),
                "neither DistributedLock nor ClusterDistributedLock",
            ),
        ] {
            assert!(
                matches!(
                    decide(&job(annotations.clone(), true), None),
                    GateStep::Blocked { reason } if reason.contains(says)
                ),
                "{annotations}"
            );
            // A Job that runs already is not gated at all.
            assert_eq!(decide(&job(annotations, false), None), GateStep::Nothing);
        }
    }

    #[test]
    fn busy_policy_annotations_go_on_the_claim_and_bad_pairs_block_the_job() {
        use turnstile_api::{BusyPolicy, GROUP_ANNOTATION, WHEN_BUSY_ANNOTATION};
        let replacing = job(
            json!({LOCK_ANNOTATION: "db", WHEN_BUSY_ANNOTATION: "ReplacePending",
                   GROUP_ANNOTATION: "prod"}),
            true,
        );
        assert!(matches!(
            decide(&replacing, None),
            GateStep::CreateClaim { .. }
        ));
        let claim = claim_for(&replacing, "migrate-db", &["db".to_owned()]);
        assert_eq!(claim.spec.when_busy, Some(BusyPolicy::ReplacePending));
        assert_eq!(claim.spec.group.as_deref(), Some("prod"));
        assert_eq!(claim_of(&gated(true), json!(null)).spec.when_busy, None);
        for (annotations, says) in [
            (
                json!({LOCK_ANNOTATION: "db", WHEN_BUSY_ANNOTATION: "CancelInProgress"}),
                "needs the annotation turnstile.dev/group",
            ),
            (
                json!({LOCK_ANNOTATION: "db", WHEN_BUSY_ANNOTATION: "Skip"}),
                "none of Wait, Fail",
            ),
            (
                json!({LOCK_ANNOTATION: "db", WHEN_BUSY_ANNOTATION: "Fail",
                       LOCKS_ANNOTATION: "db,cache"}),
                "is for one lock",
            ),
        ] {
            assert!(
                matches!(
                    decide(&job(annotations.clone(), true), None),
                    GateStep::Blocked { reason } if reason.contains(says)
                ),
                "{annotations}"
            );
        }
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
    fn a_job_another_controller_decides_about_is_not_gated() {
        let mut queued = gated(true);
        queued.metadata.labels = Some(
            [(KUEUE_QUEUE_LABEL.to_owned(), "team-a".to_owned())]
                .into_iter()
                .collect(),
        );
        assert!(matches!(
            decide(&queued, None),
            GateStep::Blocked { reason }
                if reason.contains("label kueue.x-k8s.io/queue-name=team-a")
        ));
        let mut managed = gated(true);
        let spec = managed.spec.as_mut().expect("spec");
        spec.managed_by = Some("example.com/batch".to_owned());
        assert!(matches!(
            decide(&managed, None),
            GateStep::Blocked { reason } if reason.contains("spec.managedBy example.com/batch")
        ));
        // The built-in Job controller named explicitly is no other controller.
        let spec = managed.spec.as_mut().expect("spec");
        spec.managed_by = Some("kubernetes.io/job-controller".to_owned());
        assert!(matches!(
            decide(&managed, None),
            GateStep::CreateClaim { .. }
        ));
    }

    #[test]
    fn a_suspended_gated_job_gets_a_claim_owned_by_it() {
        let job = gated(true);
        assert_eq!(
            decide(&job, None),
            GateStep::CreateClaim {
                claim: "migrate-db".to_owned(),
                locks: vec!["db".to_owned()]
            }
        );
        let claim = claim_for(&job, "migrate-db", &["db".to_owned()]);
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
        let write = Write::object("job", job.release_patch(42));
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
        // A claim that ended before its grant is never granted again: the Job stays
        // suspended, and the reason (for the Warning Event and the log) names the phase.
        for phase in ["Failed", "Expired"] {
            let dead = claim_of(&job, json!({"phase": phase}));
            match decide(&job, Some(&dead)) {
                GateStep::Blocked { reason } => {
                    assert!(
                        reason.contains(phase) && reason.contains("suspended"),
                        "{reason}"
                    );
                }
                other => panic!("{phase}: {other:?}"),
            }
        }
    }
}
