//! Whether the Pod or Job owning a claim still runs (the controller renews the claims of
//! running owners and releases those of finished or vanished ones).
//!
//! Read from the watches' caches ([`OwnerCaches`]), so a pass costs no API request per
//! owned claim: a Job's state is in the Job cache; a Pod that finished is in the cache of the
//! finished-Pods watch, and a Pod not there is taken to run. A *deleted* Pod needs no cache:
//! the garbage collector deletes its claims. Only a holder's Pod is looked up (one `GET`, at
//! most `maxHolders` per pass), so a holder whose Pod is gone ends with `OwnerGone` even
//! before the garbage collector gets to its claim; a Job the cache does not know yet
//! (created moments ago) is looked up too. An owner found gone is confirmed against the
//! claim itself (one more `GET`): an orphaning delete leaves the claim plain, not ended.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

use crate::core::{claim_address, ClaimView, OwnerState, WorkloadKind, WorkloadOwner};
use crate::runtime::caches::cache_filled;
use futures::FutureExt;
use turnstile_api::{ClaimPhase, LockClaim};

/// The watches' caches the owner states are read from.
#[derive(Clone)]
pub struct OwnerCaches {
    /// Every Job of the served namespaces.
    pub jobs: Store<Job>,
    /// The Pods that succeeded or failed (`owner_watch::FINISHED_PODS`).
    pub finished_pods: Store<Pod>,
}

impl std::fmt::Debug for OwnerCaches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerCaches")
            .field("jobs", &self.jobs.len())
            .field("finished_pods", &self.finished_pods.len())
            .finish()
    }
}

impl OwnerCaches {
    /// What the caches tell of `owner`, or `None` when only the API can tell.
    fn state(&self, namespace: &str, owner: &WorkloadOwner, held: bool) -> Option<OwnerState> {
        match owner.kind {
            WorkloadKind::Job => self
                .jobs
                .get(&ObjectRef::new(&owner.name).within(namespace))
                .map(|job| job_state(&job, owner)),
            WorkloadKind::Pod => match self
                .finished_pods
                .get(&ObjectRef::new(&owner.name).within(namespace))
            {
                Some(pod) if same_object(pod.metadata.uid.as_ref(), owner) => {
                    Some(OwnerState::Finished)
                }
                // A holder's Pod is checked for real (see the module docs).
                _ if held => None,
                _ => Some(OwnerState::Alive),
            },
        }
    }
}

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

/// Owner lookups one pass makes at once.
const CONCURRENT_LOOKUPS: usize = 8;

/// Fills in the owner state of every live claim of a lock in `lock_namespace` that has a Pod
/// or Job owner: from `caches` where they tell (see the module docs), else from the API.
pub async fn fill_owner_states(
    client: &Client,
    caches: Option<&OwnerCaches>,
    lock_namespace: &str,
    claims: &mut [ClaimView],
) {
    if let Some(caches) = caches {
        cache_filled(&caches.jobs).await;
        cache_filled(&caches.finished_pods).await;
    }
    let lookups = claims.iter_mut().filter_map(|claim| {
        let owner = claim.owner.clone()?;
        if claim.deleting || claim.phase().is_terminal() {
            return None;
        }
        // A cluster lock's claims come from several namespaces (see `claim_key`).
        let (namespace, name) = {
            let (namespace, name) = claim_address(lock_namespace, &claim.name);
            (namespace.to_owned(), name.to_owned())
        };
        let held = claim.phase() == ClaimPhase::Held;
        match caches.and_then(|caches| caches.state(&namespace, &owner, held)) {
            Some(OwnerState::Gone) => Some(
                async move { confirm_gone(client, &namespace, &name, claim, owner).await }.boxed(),
            ),
            Some(state) => {
                claim.owner_state = state;
                None
            }
            None => Some(
                async move {
                    match owner_state(client, &namespace, &owner).await {
                        OwnerState::Gone => {
                            confirm_gone(client, &namespace, &name, claim, owner).await
                        }
                        state => claim.owner_state = state,
                    }
                }
                .boxed(),
            ),
        }
    });
    futures::StreamExt::for_each_concurrent(
        futures::stream::iter(lookups),
        CONCURRENT_LOOKUPS,
        |lookup| lookup,
    )
    .await;
}

/// Sets `claim`'s owner state to `Gone` only if the claim, read afresh, still names `owner`;
/// otherwise to `Unknown`.
///
/// An orphaning delete strips the claim's owner reference *before* the owner goes, but the
/// claim's watch may bring that change after the owner's absence is seen. Ending the grant on
/// the older view would release a claim that is now plain (its holder renews it, or its
/// lease runs out) and, the status write then failing on the newer claim, read as a lost lock.
/// One `GET` per vanished owner, not per pass: an ended claim is not looked up again.
async fn confirm_gone(
    client: &Client,
    namespace: &str,
    name: &str,
    claim: &mut ClaimView,
    owner: WorkloadOwner,
) {
    let fresh = Api::<LockClaim>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await;
    claim.owner_state = match fresh {
        // A claim already gone from the API goes with its owner.
        Ok(None) => OwnerState::Gone,
        Ok(Some(fresh)) => {
            let owners = fresh
                .metadata
                .owner_references
                .as_deref()
                .unwrap_or_default();
            if WorkloadOwner::of(owners).is_some_and(|now| now.uid == owner.uid) {
                OwnerState::Gone
            } else {
                tracing::debug!(
                    namespace,
                    claim = %claim.name,
                    owner = %owner.name,
                    "owner gone but the claim no longer names it: waiting for the claim's watch"
                );
                OwnerState::Unknown
            }
        }
        Err(error) => {
            tracing::debug!(namespace, claim = %claim.name, %error, "cannot re-read claim");
            OwnerState::Unknown
        }
    };
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
        let cases = [
            ("u1", "Running", OwnerState::Alive),
            ("u1", "Pending", OwnerState::Alive),
            ("u1", "Succeeded", OwnerState::Finished),
            ("u1", "Failed", OwnerState::Finished),
            // Another Pod under the owner's name: the owner is gone.
            ("u2", "Running", OwnerState::Gone),
        ];
        for (uid, phase, state) in cases {
            let pod = pod(uid, phase);
            assert_eq!(pod_state(&pod, &owner()), state, "{uid} {phase}");
        }
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
        let cases = [
            ("Suspended", "True", OwnerState::Alive),
            ("Complete", "False", OwnerState::Alive),
            ("Complete", "True", OwnerState::Finished),
            ("Failed", "True", OwnerState::Finished),
        ];
        for (condition, status, state) in cases {
            let job = job(condition, status);
            assert_eq!(job_state(&job, &owner), state, "{condition}={status}");
        }
    }
}
