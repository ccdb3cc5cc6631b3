//! The Pod gate: a Pod with the label `turnstile.dev/lock: <lock name>` and the scheduling
//! gate `turnstile.dev/lock` (set in the Pod template by the user: no webhook) is not
//! scheduled until the controller removes the gate, which it does once the Pod's claim is
//! held. Bare Pods and the Pods of Deployments, StatefulSets and CronJobs all work, and only
//! labelled Pods are watched ([`GATED_PODS`]).
//!
//! Kubernetes only lets scheduling gates be removed, never added, and a Pod created without
//! the gate is scheduled at once: so a labelled Pod without the gate is not gated. Another
//! controller's gate on the Pod comes first: the claim is made once it is gone.

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use kube::ResourceExt;

use super::{Gated, OtherHolder};
use crate::core::WorkloadKind;
use crate::metrics::ControllerKind;
use turnstile_api::{LOCK_LABEL, SCHEDULING_GATE, TOKEN_ANNOTATION};

/// The label selector of the gated-Pod watch.
pub const GATED_PODS: &str = LOCK_LABEL;

impl Gated for Pod {
    const KIND: WorkloadKind = WorkloadKind::Pod;
    const CONTROLLER: ControllerKind = ControllerKind::Pod;
    const HELD_BACK: &'static str = "gated";

    fn marking(&self) -> Option<&String> {
        self.labels().get(LOCK_LABEL)
    }

    fn held_back(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|spec| spec.scheduling_gates.as_ref())
            .is_some_and(|gates| gates.iter().any(|gate| gate.name == SCHEDULING_GATE))
    }

    fn finished(&self) -> bool {
        matches!(
            self.status
                .as_ref()
                .and_then(|status| status.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
    }

    fn release_patch(&self, token: i64) -> serde_json::Value {
        // A merge patch replaces the list: keep every other gate (only removal is allowed).
        let others: Vec<serde_json::Value> = self
            .spec
            .as_ref()
            .and_then(|spec| spec.scheduling_gates.as_ref())
            .into_iter()
            .flatten()
            .filter(|gate| gate.name != SCHEDULING_GATE)
            .map(|gate| serde_json::json!({"name": gate.name}))
            .collect();
        serde_json::json!({
            "metadata": {"annotations": {TOKEN_ANNOTATION: token.to_string()}},
            "spec": {"schedulingGates": others},
        })
    }

    fn other_holder(&self) -> Option<OtherHolder> {
        let others: Vec<&str> = self
            .spec
            .as_ref()
            .and_then(|spec| spec.scheduling_gates.as_ref())
            .into_iter()
            .flatten()
            .map(|gate| gate.name.as_str())
            .filter(|name| *name != SCHEDULING_GATE)
            .collect();
        match others.as_slice() {
            [] => None,
            [one] => Some(OtherHolder::LetsGoFirst(format!("scheduling gate {one}"))),
            several => Some(OtherHolder::LetsGoFirst(format!(
                "scheduling gates {}",
                several.join(", ")
            ))),
        }
    }
}

/// Drops what the gate never reads from a cached Pod: all of its spec but the scheduling
/// gates, all of its status but the phase.
pub fn trim_gated_pod(pod: &mut Pod) {
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        scheduling_gates: spec.scheduling_gates,
        ..PodSpec::default()
    });
    pod.status = phase_only(pod.status.take());
}

/// A Pod status with only its phase: all that the gate and the owner states read of it.
pub fn phase_only(status: Option<PodStatus>) -> Option<PodStatus> {
    status.map(|status| PodStatus {
        phase: status.phase,
        ..PodStatus::default()
    })
}

#[cfg(test)]
mod tests {
    use super::super::{claim_for, decide, GateStep};
    use super::*;
    use crate::core::WorkloadOwner;
    use serde_json::json;
    use turnstile_api::LOCKS_ANNOTATION;

    fn pod(labels: serde_json::Value, gates: &[&str]) -> Pod {
        let gates: Vec<_> = gates.iter().map(|name| json!({"name": name})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "ns", "uid": "pod-uid",
                         "resourceVersion": "9", "labels": labels},
            "spec": {"containers": [{"name": "app", "image": "app"}], "schedulingGates": gates}
        }))
        .expect("pod")
    }

    #[test]
    fn only_a_labelled_pod_with_the_gate_is_gated() {
        assert_eq!(
            decide(&pod(json!({}), &[SCHEDULING_GATE]), None),
            GateStep::Nothing
        );
        // Labelled but created without the gate: it may be running already.
        assert_eq!(
            decide(&pod(json!({LOCK_LABEL: "db"}), &[]), None),
            GateStep::Nothing
        );
        let gated = pod(json!({LOCK_LABEL: "db"}), &[SCHEDULING_GATE]);
        assert_eq!(
            decide(&gated, None),
            GateStep::CreateClaim {
                claim: "web-0-db".to_owned(),
                locks: vec!["db".to_owned()]
            }
        );
        let claim = claim_for(&gated, "web-0-db", &["db".to_owned()]);
        let owner = WorkloadOwner::of(claim.owner_references()).expect("owner");
        assert_eq!(
            (owner.kind, owner.uid.as_str()),
            (WorkloadKind::Pod, "pod-uid")
        );
    }

    #[test]
    fn the_locks_annotation_makes_one_claim_on_all_its_locks() {
        let mut gated = pod(json!({LOCK_LABEL: "db"}), &[SCHEDULING_GATE]);
        gated.metadata.annotations = Some(
            [(LOCKS_ANNOTATION.to_owned(), " cache, db ,cache,".to_owned())]
                .into_iter()
                .collect(),
        );
        let locks = vec!["cache".to_owned(), "db".to_owned()];
        assert_eq!(
            decide(&gated, None),
            GateStep::CreateClaim {
                claim: "web-0-db".to_owned(),
                locks: locks.clone(),
            }
        );
        let mut claim = claim_for(&gated, "web-0-db", &locks);
        assert_eq!(claim.spec.lock_names, Some(locks));
        assert_eq!(claim.spec.lock_name, "");
        claim.status =
            serde_json::from_value(json!({"phase": "Held", "fencingToken": 3})).expect("status");
        assert_eq!(decide(&gated, Some(&claim)), GateStep::Release { token: 3 });
        // A claim on the marking lock alone is not the claim this Pod asks for.
        let single = claim_for(&gated, "web-0-db", &["db".to_owned()]);
        assert!(matches!(
            decide(&gated, Some(&single)),
            GateStep::Blocked { reason } if reason.contains("locks cache, db")
        ));
    }

    #[test]
    fn the_gate_goes_once_the_claim_is_held_and_other_gates_stay() {
        let gated = pod(
            json!({LOCK_LABEL: "db"}),
            &["other.example/gate", SCHEDULING_GATE],
        );
        let mut claim = claim_for(&gated, "web-0-db", &["db".to_owned()]);
        claim.status = serde_json::from_value(json!({"phase": "Pending"})).expect("status");
        assert_eq!(decide(&gated, Some(&claim)), GateStep::Wait);
        claim.status =
            serde_json::from_value(json!({"phase": "Held", "fencingToken": 5})).expect("status");
        assert_eq!(decide(&gated, Some(&claim)), GateStep::Release { token: 5 });
        let patch = gated.release_patch(5);
        assert_eq!(
            patch["spec"]["schedulingGates"],
            json!([{"name": "other.example/gate"}])
        );
        assert_eq!(patch["metadata"]["annotations"][TOKEN_ANNOTATION], "5");

        claim.status = serde_json::from_value(json!({"phase": "Failed"})).expect("status");
        assert!(matches!(
            decide(&gated, Some(&claim)),
            GateStep::Blocked { .. }
        ));
    }

    #[test]
    fn another_controllers_gate_comes_first_no_claim_until_it_is_gone() {
        let both = pod(
            json!({LOCK_LABEL: "db"}),
            &[SCHEDULING_GATE, "quota.example/gate", "other.example/gate"],
        );
        assert!(matches!(
            decide(&both, None),
            GateStep::WaitForOthers { reason }
                if reason.contains("scheduling gates quota.example/gate, other.example/gate")
                    && reason.contains("lock db")
        ));
        let ours_left = pod(json!({LOCK_LABEL: "db"}), &[SCHEDULING_GATE]);
        assert!(matches!(
            decide(&ours_left, None),
            GateStep::CreateClaim { .. }
        ));
    }

    #[test]
    fn trimming_keeps_the_gates_and_the_phase() {
        let mut gated = pod(json!({LOCK_LABEL: "db"}), &[SCHEDULING_GATE]);
        gated.status = Some(PodStatus {
            phase: Some("Pending".to_owned()),
            message: Some("waiting".to_owned()),
            ..PodStatus::default()
        });
        trim_gated_pod(&mut gated);
        assert!(gated.held_back());
        let spec = gated.spec.as_ref().expect("spec");
        assert!(spec.containers.is_empty());
        let status = gated.status.as_ref().expect("status");
        assert_eq!(
            (status.phase.as_deref(), status.message.as_deref()),
            (Some("Pending"), None)
        );
    }
}
