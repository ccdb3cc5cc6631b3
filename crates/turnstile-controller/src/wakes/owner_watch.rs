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
//! Each event is looked up in the claim index by owner uid and dropped unless a live claim is
//! owned by that object. Both watches also fill the caches the owner states are read from
//! (`owners`): the Job cache, and the finished Pods trimmed to their phase. RBAC: `list` and `watch` on `pods` and
//! `batch/jobs` (the owner lookups already needed `get`).

use std::sync::Arc;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;

use crate::core::WorkloadKind;
use crate::runtime::claim_index::{ClaimIndex, LockKey};
use turnstile_api::{ClusterDistributedLock, DistributedLock, LockClaim};

/// The field selector of the Pod watch: Pods that succeeded or failed.
pub const FINISHED_PODS: &str = "status.phase!=Pending,status.phase!=Running,status.phase!=Unknown";

/// A mapper for `Controller::watches`: an event about a Pod or Job (`kind`) → the locks of
/// the claims it owns (none for the great majority of Pods).
pub fn owner_trigger<K>(
    claims: Store<LockClaim>,
    index: ClaimIndex,
    kind: WorkloadKind,
) -> impl Fn(Arc<K>) -> Vec<ObjectRef<DistributedLock>> + Send + Sync + 'static
where
    K: Resource,
{
    owned_locks(claims, index, kind, |(namespace, lock)| {
        (!namespace.is_empty()).then(|| ObjectRef::new(&lock).within(&namespace))
    })
}

/// [`owner_trigger`] for the `ClusterDistributedLock`s of the claims a Pod or Job owns.
pub fn cluster_owner_trigger<K>(
    claims: Store<LockClaim>,
    index: ClaimIndex,
    kind: WorkloadKind,
) -> impl Fn(Arc<K>) -> Vec<ObjectRef<ClusterDistributedLock>> + Send + Sync + 'static
where
    K: Resource,
{
    owned_locks(claims, index, kind, |(namespace, lock)| {
        namespace.is_empty().then(|| ObjectRef::new(&lock))
    })
}

/// An event about a Pod or Job (`kind`) → the locks of the claims it owns that `pick` takes
/// (a cluster lock's key has no namespace).
fn owned_locks<K, L>(
    claims: Store<LockClaim>,
    index: ClaimIndex,
    kind: WorkloadKind,
    pick: fn(LockKey) -> Option<ObjectRef<L>>,
) -> impl Fn(Arc<K>) -> Vec<ObjectRef<L>> + Send + Sync + 'static
where
    K: Resource,
    L: Resource<DynamicType = ()> + 'static,
{
    move |object: Arc<K>| {
        let meta = object.meta();
        let (Some(namespace), Some(uid)) = (meta.namespace.as_deref(), meta.uid.as_deref()) else {
            return Vec::new();
        };
        let locks: Vec<ObjectRef<L>> = index
            .locks_of_owner(&claims, kind, namespace, uid)
            .into_iter()
            .filter_map(pick)
            .collect();
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

    fn cache(claims: Vec<LockClaim>) -> (Store<LockClaim>, ClaimIndex) {
        let mut writer = Writer::default();
        let index = ClaimIndex::new();
        for claim in claims {
            let event = Event::Apply(claim);
            index.observe(&event);
            writer.apply_watcher_event(&event);
        }
        (writer.as_reader(), index)
    }

    fn names(keys: Vec<LockKey>) -> Vec<String> {
        keys.into_iter().map(|(_, name)| name).collect()
    }

    #[test]
    fn an_owner_maps_to_the_locks_of_its_live_claims_only() {
        let (claims, index) = cache(vec![
            claim("a", "db", "Pod", "p1", "Held"),
            claim("b", "cache", "Pod", "p1", "Pending"),
            claim("c", "db", "Pod", "p1", "Held"),
            claim("d", "old", "Pod", "p1", "Released"),
            claim("e", "other", "Pod", "p2", "Held"),
            claim("f", "jobs", "Job", "p1", "Held"),
        ]);
        assert_eq!(
            names(index.locks_of_owner(&claims, WorkloadKind::Pod, "ns", "p1")),
            vec!["cache", "db"]
        );
        assert_eq!(
            names(index.locks_of_owner(&claims, WorkloadKind::Job, "ns", "p1")),
            vec!["jobs"]
        );
        assert!(index
            .locks_of_owner(&claims, WorkloadKind::Pod, "elsewhere", "p1")
            .is_empty());
        assert!(index
            .locks_of_owner(&claims, WorkloadKind::Pod, "ns", "nobody")
            .is_empty());
    }

    #[test]
    fn an_owner_wakes_its_cluster_locks_through_the_cluster_lock_controller_only() {
        let mut on_cluster_lock = claim("g", "migrate", "Pod", "p1", "Held");
        on_cluster_lock.spec.lock_kind = Some(turnstile_api::LockKind::ClusterDistributedLock);
        let (claims, index) = cache(vec![claim("a", "db", "Pod", "p1", "Held"), on_cluster_lock]);
        let pod: Arc<k8s_openapi::api::core::v1::Pod> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "p1"}
            }))
            .expect("pod"),
        );
        let namespaced =
            owner_trigger(claims.clone(), index.clone(), WorkloadKind::Pod)(pod.clone());
        assert_eq!(namespaced, vec![ObjectRef::new("db").within("ns")]);
        let cluster = cluster_owner_trigger(claims, index, WorkloadKind::Pod)(pod);
        assert_eq!(
            cluster,
            vec![ObjectRef::<ClusterDistributedLock>::new("migrate")]
        );
    }
}
