//! Looking up whether the Pod or Job owning a claim still runs (the controller renews the
//! claims of running owners and releases those of finished or vanished ones).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

use super::core::{ClaimView, OwnerState, WorkloadKind, WorkloadOwner};

/// The state of `owner` in `namespace`; `Unknown` when the API cannot tell.
pub async fn owner_state(client: &Client, namespace: &str, owner: &WorkloadOwner) -> OwnerState {
    let state = match owner.kind {
        WorkloadKind::Pod => Api::<Pod>::namespaced(client.clone(), namespace)
            .get_opt(&owner.name)
            .await
            .map(|pod| pod.map(|pod| pod_state(&pod, owner))),
        WorkloadKind::Job => Api::<Job>::namespaced(client.clone(), namespace)
            .get_opt(&owner.name)
            .await
            .map(|job| job.map(|job| job_state(&job, owner))),
    };
    match state {
        Ok(Some(state)) => state,
        Ok(None) => OwnerState::Gone,
        Err(error) => {
            tracing::debug!(namespace, owner = %owner.name, %error, "cannot look up claim owner");
            OwnerState::Unknown
        }
    }
}

fn same_object(uid: Option<&String>, owner: &WorkloadOwner) -> bool {
    uid.is_some_and(|uid| *uid == owner.uid)
}

fn pod_state(pod: &Pod, owner: &WorkloadOwner) -> OwnerState {
    if !same_object(pod.metadata.uid.as_ref(), owner) {
        return OwnerState::Gone;
    }
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Succeeded" | "Failed") => OwnerState::Finished,
        _ => OwnerState::Alive,
    }
}

/// Whether a Job has finished: a `Complete` or `Failed` condition that is True.
pub fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True")
        })
}

fn job_state(job: &Job, owner: &WorkloadOwner) -> OwnerState {
    if !same_object(job.metadata.uid.as_ref(), owner) {
        return OwnerState::Gone;
    }
    if job_finished(job) {
        OwnerState::Finished
    } else {
        OwnerState::Alive
    }
}

/// Fills in the owner state of every live claim that has a Pod or Job owner.
pub async fn fill_owner_states(client: &Client, namespace: &str, claims: &mut [ClaimView]) {
    let lookups = claims.iter_mut().filter_map(|claim| {
        let owner = claim.owner.clone()?;
        if claim.deleting || claim.phase().is_terminal() {
            return None;
        }
        Some(async move {
            claim.owner_state = owner_state(client, namespace, &owner).await;
        })
    });
    futures::future::join_all(lookups).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> WorkloadOwner {
        WorkloadOwner {
            kind: WorkloadKind::Pod,
            name: "p".to_owned(),
            uid: "u1".to_owned(),
        }
    }

    fn pod(uid: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": uid},
            "status": {"phase": phase}
        }))
        .expect("pod")
    }

    #[test]
    fn pods_run_until_they_succeed_or_fail() {
        assert_eq!(
            pod_state(&pod("u1", "Running"), &owner()),
            OwnerState::Alive
        );
        assert_eq!(
            pod_state(&pod("u1", "Pending"), &owner()),
            OwnerState::Alive
        );
        assert_eq!(
            pod_state(&pod("u1", "Succeeded"), &owner()),
            OwnerState::Finished
        );
        assert_eq!(
            pod_state(&pod("u1", "Failed"), &owner()),
            OwnerState::Finished
        );
        assert_eq!(pod_state(&pod("u2", "Running"), &owner()), OwnerState::Gone);
    }

    #[test]
    fn jobs_run_until_complete_or_failed() {
        let job = |condition: &str, status: &str| -> Job {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "uid": "u1"},
                "status": {"conditions": [{"type": condition, "status": status}]}
            }))
            .expect("job")
        };
        let owner = WorkloadOwner {
            kind: WorkloadKind::Job,
            ..owner()
        };
        assert_eq!(
            job_state(&job("Suspended", "True"), &owner),
            OwnerState::Alive
        );
        assert_eq!(
            job_state(&job("Complete", "False"), &owner),
            OwnerState::Alive
        );
        assert_eq!(
            job_state(&job("Complete", "True"), &owner),
            OwnerState::Finished
        );
        assert_eq!(
            job_state(&job("Failed", "True"), &owner),
            OwnerState::Finished
        );
    }
}
