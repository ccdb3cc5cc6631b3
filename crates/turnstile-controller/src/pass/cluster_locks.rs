//! `ClusterDistributedLock`s: one lock, one queue, claims from several namespaces.
//!
//! A cluster lock's pass is a `DistributedLock`'s pass (`lock_reconciler`) over the lock seen
//! as a namespaceless `DistributedLock` (`ClusterDistributedLock::as_namespaceless_lock`: its `spec.lock`, its status). So
//! everything a lock does, a cluster lock does, with the same code: fencing, leases, semaphores,
//! busy policies, history, force-release. Two things differ:
//!
//! - its backend key is `/<key>` (no namespaced lock's key starts with `/`), and its claims,
//!   from every namespace it admits, are named `namespace/name` in the pass
//!   (`core::claim_key`): one queue orders them all by arrival, whatever their namespace;
//! - a claim enters the queue only if the lock's `namespaceSelector` selects the claim's
//!   namespace ([`admits`]). Any other claim is the claim reconciler's: it waits with reason
//!   `NamespaceNotAllowed` and a Warning Event, and is granted once its namespace is selected.
//!   A claim that holds the lock keeps it when its namespace stops being selected, until the
//!   grant ends: ending grants is the lock's business (lease, release, force-release), not the
//!   selector's, and a holder is never cut off by a label edit.
//!
//! Wake-ups: its claims' events, their owners' (`owner_watch`) and every Namespace's (labels
//! decide who is admitted; namespaces are few and change rarely). Served only by a controller
//! of all namespaces: a cluster-scoped object is no one namespace's.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::core::{PartialObjectMeta, Selector, SelectorExt};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;

use crate::runtime::claim_index::ClaimIndex;
use crate::runtime::context::Context;
use turnstile_api::{ClaimPhase, ClusterDistributedLock, LockClaim};

/// Whether a claim on a cluster lock is in the lock's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The lock takes it: its pass decides about the claim.
    Admitted,
    /// No such cluster lock (or this controller serves none).
    LockMissing,
    /// The lock does not take claims from the claim's namespace; why, for people.
    NotAllowed(String),
}

/// Whether the cluster lock the claim names takes it (see the module docs).
pub fn admission(ctx: &Context, claim: &LockClaim) -> Admission {
    let Some(locks) = &ctx.cache.cluster_locks else {
        return Admission::LockMissing;
    };
    match locks.get(&ObjectRef::new(&claim.spec.lock_name)) {
        None => Admission::LockMissing,
        Some(lock) => match admits(ctx, &lock, claim) {
            Ok(()) => Admission::Admitted,
            Err(why) => Admission::NotAllowed(why),
        },
    }
}

/// `Ok` when `lock` takes `claim` into its queue: the claim holds it already, or its
/// namespace is selected; else why not.
pub fn admits(
    ctx: &Context,
    lock: &ClusterDistributedLock,
    claim: &LockClaim,
) -> Result<(), String> {
    let holds = claim
        .status
        .as_ref()
        .is_some_and(|status| status.phase == Some(ClaimPhase::Held));
    if holds {
        return Ok(());
    }
    let namespace = claim.namespace().unwrap_or_default();
    let labels = ctx
        .cache
        .namespaces
        .as_ref()
        .and_then(|namespaces| namespaces.get(&ObjectRef::new(&namespace)))
        .map(|meta| meta.labels().clone());
    selects(lock, &namespace, labels.as_ref())
}

/// `Ok` when `lock`'s `namespaceSelector` selects `namespace`, labelled `labels` (`None`: not
/// known yet); else why not.
fn selects(
    lock: &ClusterDistributedLock,
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<(), String> {
    let name = lock.name_any();
    let selector = Selector::try_from(lock.spec.namespace_selector.clone()).map_err(|error| {
        format!("ClusterDistributedLock {name} has an invalid spec.namespaceSelector: {error}")
    })?;
    match labels {
        Some(labels) if selector.matches(labels) => Ok(()),
        _ => Err(format!(
            "ClusterDistributedLock {name} does not take claims from namespace {namespace} \
             (its spec.namespaceSelector does not select it)"
        )),
    }
}

/// The cluster lock `name`'s resourceVersion in the cache.
pub fn cached_version(ctx: &Context, name: &str) -> Option<String> {
    ctx.cache
        .cluster_locks
        .as_ref()?
        .get(&ObjectRef::new(name))
        .and_then(|lock| lock.resource_version())
}

/// A mapper for `Controller::watches`: a claim → the cluster lock it names, if it names one.
pub fn lock_of_claim(claim: Arc<LockClaim>) -> Option<ObjectRef<ClusterDistributedLock>> {
    claim
        .spec
        .claims_cluster_lock()
        .then(|| ObjectRef::new(&claim.spec.lock_name))
}

/// A mapper for `Controller::watches`: any Namespace event → every cluster lock (labels decide
/// admission).
pub fn every_lock(
    locks: Store<ClusterDistributedLock>,
) -> impl Fn(Arc<PartialObjectMeta<Namespace>>) -> Vec<ObjectRef<ClusterDistributedLock>> {
    move |_| {
        locks
            .state()
            .iter()
            .map(|lock| ObjectRef::from_obj(&**lock))
            .collect()
    }
}

/// A mapper for the claim reconciler: a cluster lock's event → its claims, each decided again
/// (the selector may now take or refuse them; the lock may be gone).
pub fn claims_of_lock(
    claims: Store<LockClaim>,
    index: ClaimIndex,
) -> impl Fn(Arc<ClusterDistributedLock>) -> Vec<ObjectRef<LockClaim>> {
    move |lock| {
        index
            .claims_of_lock(&claims, "", &lock.name_any())
            .iter()
            .map(|claim| ObjectRef::from_obj(&**claim))
            .collect()
    }
}

/// A mapper for the claim reconciler: a Namespace event → its claims on cluster locks (its
/// labels may now admit or refuse them).
pub fn claims_in_namespace(
    claims: Store<LockClaim>,
) -> impl Fn(Arc<PartialObjectMeta<Namespace>>) -> Vec<ObjectRef<LockClaim>> {
    move |namespace| {
        let namespace = namespace.name_any();
        claims
            .state()
            .iter()
            .filter(|claim| {
                claim.spec.claims_cluster_lock() && claim.namespace().as_deref() == Some(&namespace)
            })
            .map(|claim| ObjectRef::from_obj(&**claim))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::LockView;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    use turnstile_api::{ClusterDistributedLockSpec, DistributedLockSpec};

    fn lock(selector: LabelSelector) -> ClusterDistributedLock {
        ClusterDistributedLock::new(
            "migrate",
            ClusterDistributedLockSpec {
                namespace_selector: selector,
                lock: DistributedLockSpec::default(),
            },
        )
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn the_selector_decides_and_says_which_namespace_it_refused() {
        let payments = lock(LabelSelector {
            match_labels: Some(labels(&[("team", "payments")])),
            ..LabelSelector::default()
        });
        assert_eq!(
            selects(&payments, "pay", Some(&labels(&[("team", "payments")]))),
            Ok(())
        );
        let refused =
            selects(&payments, "web", Some(&labels(&[("team", "web")]))).expect_err("another team");
        assert!(refused.contains("namespace web"), "{refused}");
        assert!(
            selects(&payments, "new", None).is_err(),
            "a namespace not seen yet is not selected"
        );
        let everyone = lock(LabelSelector::default());
        assert_eq!(selects(&everyone, "any", Some(&labels(&[]))), Ok(()));
    }

    #[test]
    fn an_invalid_selector_admits_nobody_and_names_the_field() {
        let invalid = lock(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "team".to_owned(),
                operator: "Near".to_owned(),
                values: None,
            }]),
            ..LabelSelector::default()
        });
        let refused = selects(&invalid, "pay", Some(&labels(&[("team", "x")])))
            .expect_err("invalid selector");
        assert!(refused.contains("spec.namespaceSelector"), "{refused}");
    }

    #[test]
    fn the_pass_lock_has_no_namespace_and_a_key_no_namespaced_lock_has() {
        let cluster = lock(LabelSelector::default());
        let view = LockView::from_resource(&cluster.as_namespaceless_lock());
        assert_eq!(view.namespace, "");
        assert_eq!(view.backend_key(), "/migrate");
    }
}
