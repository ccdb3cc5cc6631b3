//! Pod and Job events → the locks whose live claims they own, so that a finished or deleted
//! owner releases its claim (and the next claim is granted) within moments, not at the
//! claim's next renewal check.
//!
//! Trade-off: Kubernetes cannot select Pods by "owns a LockClaim" (the owner reference points
//! from the claim to the Pod, and the Pods are the tenants' objects, which the controller does
//! not label). So:
//!
//! - Pods: only *finished* Pods are watched ([`FINISHED_PODS`], a `status.phase` field
//!   selector the API server filters on), so running Pods cost nothing; a Pod enters that
//!   watch when it succeeds or fails. A deleted Pod needs no watch: the garbage collector
//!   deletes its claims (they carry its owner reference) and the claim watch sees that.
//! - Jobs: all Jobs of the served namespaces (a Job's end is a condition, which no selector
//!   reaches; Jobs are few next to Pods).
//!
//! No cache is kept of either: each event is matched against the claim cache by owner uid and
//! dropped unless a live claim is owned by that object. RBAC: `list` and `watch` on `pods` and
//! `batch/jobs` (the owner lookups already needed `get`).

use std::collections::BTreeSet;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use super::core::{WorkloadKind, WorkloadOwner};
use turnstile_api::{DistributedLock, LockClaim};

/// The field selector of the Pod watch: Pods that succeeded or failed.
pub const FINISHED_PODS: &str = "status.phase!=Pending,status.phase!=Running,status.phase!=Unknown";

/// The locks of the live (non-terminal) claims in `claims` owned by the object `kind` with
/// `uid` in `namespace`, each once.
pub fn locks_of_owner(
    claims: &Store<LockClaim>,
    kind: WorkloadKind,
    namespace: &str,
    uid: &str,
) -> Vec<ObjectRef<DistributedLock>> {
    let locks: BTreeSet<String> = claims
        .state()
        .iter()
        .filter(|claim| claim.namespace().as_deref() == Some(namespace))
        .filter(|claim| {
            !claim
                .status
                .as_ref()
                .and_then(|status| status.phase)
                .is_some_and(|phase| phase.is_terminal())
        })
        .filter(|claim| {
            WorkloadOwner::of(claim.owner_references())
                .is_some_and(|owner| owner.kind == kind && owner.uid == uid)
        })
        .map(|claim| claim.spec.lock_name.clone())
        .collect();
    locks
        .into_iter()
        .map(|lock| ObjectRef::new(&lock).within(namespace))
        .collect()
}

/// A mapper for `Controller::watches`: an event about a Pod or Job (`kind`) → the locks of
/// the claims it owns (none for the great majority of Pods).
pub fn owner_trigger<K>(
    claims: Store<LockClaim>,
    kind: WorkloadKind,
) -> impl Fn(K) -> Vec<ObjectRef<DistributedLock>> + Send + Sync + 'static
where
    K: Resource,
{
    move |object: K| {
        let meta = object.meta();
        match (meta.namespace.as_deref(), meta.uid.as_deref()) {
            (Some(namespace), Some(uid)) => {
                let locks = locks_of_owner(&claims, kind, namespace, uid);
                if !locks.is_empty() {
                    tracing::debug!(
                        namespace,
                        owner = meta.name.as_deref().unwrap_or(""),
                        locks = locks.len(),
                        "claim owner changed; reconciling its locks"
                    );
                }
                locks
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    fn claim(name: &str, lock: &str, owner_kind: &str, uid: &str, phase: &str) -> LockClaim {
        let api_version = if owner_kind == "Job" {
            "batch/v1"
        } else {
            "v1"
        };
        serde_json::from_value(serde_json::json!({
            "apiVersion": "turnstile.dev/v1alpha1",
            "kind": "LockClaim",
            "metadata": {
                "name": name, "namespace": "ns", "uid": format!("claim-{name}"),
                "ownerReferences": [{
                    "apiVersion": api_version, "kind": owner_kind, "name": "owner",
                    "uid": uid, "controller": true
                }]
            },
            "spec": {"lockName": lock},
            "status": {"phase": phase}
        }))
        .expect("claim")
    }

    fn store(claims: Vec<LockClaim>) -> Store<LockClaim> {
        let mut writer = Writer::default();
        for claim in claims {
            writer.apply_watcher_event(&Event::Apply(claim));
        }
        writer.as_reader()
    }

    fn names(refs: Vec<ObjectRef<DistributedLock>>) -> Vec<String> {
        refs.into_iter().map(|r| r.name).collect()
    }

    #[test]
    fn an_owner_maps_to_the_locks_of_its_live_claims_only() {
        let claims = store(vec![
            claim("a", "db", "Pod", "p1", "Held"),
            claim("b", "cache", "Pod", "p1", "Pending"),
            claim("c", "db", "Pod", "p1", "Held"),
            claim("d", "old", "Pod", "p1", "Released"),
            claim("e", "other", "Pod", "p2", "Held"),
            claim("f", "jobs", "Job", "p1", "Held"),
        ]);
        assert_eq!(
            names(locks_of_owner(&claims, WorkloadKind::Pod, "ns", "p1")),
            vec!["cache", "db"]
        );
        assert_eq!(
            names(locks_of_owner(&claims, WorkloadKind::Job, "ns", "p1")),
            vec!["jobs"]
        );
        assert!(locks_of_owner(&claims, WorkloadKind::Pod, "elsewhere", "p1").is_empty());
        assert!(locks_of_owner(&claims, WorkloadKind::Pod, "ns", "nobody").is_empty());
    }
}
