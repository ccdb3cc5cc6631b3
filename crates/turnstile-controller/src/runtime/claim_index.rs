//! An index of the claim cache by lock and by owner, so that a lock's pass and an owner's event
//! read only their own claims instead of scanning every claim in the cluster; and, fed the
//! watch's events in order, the claims' arrivals (see `arrivals`).
//!
//! The index holds names only; the objects stay in the reflector's [`Store`]. It is fed the
//! claim watch's events *before* the store is (see `runtime`), so a name the index returns may
//! not be in the store yet (it is skipped, never dropped: the store's own event wakes the lock
//! again), but a claim in the store is always in the index. A re-list builds a new index next
//! to the old one and swaps it in at its end, as the store does: so deletions the re-list never
//! reports go, and a claim created during a watch outage — listed, but in the store only once
//! the re-list ends — is not lost. (Pruning names missing from the store on read lost exactly
//! those claims: their lock's passes never saw them again and later claims overtook them, as
//! the chaos suite's FIFO check found.)

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::core::{WorkloadKind, WorkloadOwner};
use crate::runtime::arrivals::Arrivals;
use turnstile_api::LockClaim;

/// `(namespace, lock name)`; the namespace is empty for a `ClusterDistributedLock`.
pub type LockKey = (String, String);
/// `(namespace, claim name)`.
type ClaimKey = (String, String);

/// The keys of the locks `claim` names, in the claim's namespace (`namespace`) or, for a
/// `ClusterDistributedLock`, with an empty namespace.
fn lock_keys(claim: &LockClaim, namespace: &str) -> Vec<LockKey> {
    let scope = if claim.spec.claims_cluster_lock() {
        ""
    } else {
        namespace
    };
    claim
        .spec
        .locks()
        .into_iter()
        .map(|lock| (scope.to_owned(), lock.to_owned()))
        .collect()
}

#[derive(Debug, Default)]
struct Names {
    by_lock: HashMap<LockKey, BTreeSet<ClaimKey>>,
    by_owner: HashMap<String, BTreeSet<ClaimKey>>,
}

impl Names {
    /// Whether the claim is here already (under its first lock: each claim is under all).
    fn contains(&self, claim: &LockClaim) -> bool {
        let Some(namespace) = claim.namespace() else {
            return false;
        };
        let Some(first) = lock_keys(claim, &namespace).into_iter().next() else {
            return false;
        };
        self.by_lock
            .get(&first)
            .is_some_and(|claims| claims.contains(&(namespace, claim.name_any())))
    }

    fn insert(&mut self, claim: &LockClaim) {
        let (Some(namespace), name) = (claim.namespace(), claim.name_any()) else {
            return;
        };
        if let Some(owner) = WorkloadOwner::of(claim.owner_references()) {
            self.by_owner
                .entry(owner.uid)
                .or_default()
                .insert((namespace.clone(), name.clone()));
        }
        // `spec.lockName` and `spec.lockNames` are immutable: a claim never moves between
        // locks. A claim on several locks is in each one's queue.
        for key in lock_keys(claim, &namespace) {
            self.by_lock
                .entry(key)
                .or_default()
                .insert((namespace.clone(), name.clone()));
        }
    }

    fn remove(&mut self, claim: &LockClaim) {
        let (Some(namespace), name) = (claim.namespace(), claim.name_any()) else {
            return;
        };
        for key in lock_keys(claim, &namespace) {
            if let Some(claims) = self.by_lock.get_mut(&key) {
                claims.remove(&(namespace.clone(), name.clone()));
                if claims.is_empty() {
                    self.by_lock.remove(&key);
                }
            }
        }
        if let Some(owner) = WorkloadOwner::of(claim.owner_references()) {
            if let Some(claims) = self.by_owner.get_mut(&owner.uid) {
                claims.remove(&(namespace, name));
                if claims.is_empty() {
                    self.by_owner.remove(&owner.uid);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct Index {
    /// What the store holds (or is about to hold: events reach the index first).
    current: Names,
    /// During a re-list: what it has listed so far, swapped in when it ends.
    relisting: Option<Names>,
    /// When the claims the watch delivered arrived (see `arrivals`).
    arrivals: Arrivals,
}

/// Claim names by lock and by owner uid (see the module docs). Clones share one index.
#[derive(Debug, Clone, Default)]
pub struct ClaimIndex {
    inner: Arc<RwLock<Index>>,
}

impl ClaimIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records what a watch event says about claims.
    pub fn observe(&self, event: &watcher::Event<LockClaim>) {
        let mut guard = self.write();
        let index = &mut *guard;
        match event {
            watcher::Event::Apply(claim) => {
                let known = index.current.contains(claim);
                index.arrivals.applied(claim, known, Timestamp::now());
                index.current.insert(claim);
            }
            watcher::Event::Delete(claim) => {
                index.arrivals.deleted(claim);
                index.current.remove(claim);
            }
            watcher::Event::Init => {
                index.arrivals.relist_started();
                index.relisting = Some(Names::default());
            }
            watcher::Event::InitApply(claim) => {
                index.arrivals.listed(claim);
                index
                    .relisting
                    .get_or_insert_with(Names::default)
                    .insert(claim);
            }
            watcher::Event::InitDone => {
                index.arrivals.relist_done(Timestamp::now());
                if let Some(listed) = index.relisting.take() {
                    index.current = listed;
                }
            }
        }
    }

    /// Records what a gated workload's watch event says about its arrival (see `arrivals`):
    /// a workload the watch delivers (not in a list) arrives then.
    pub fn observe_workload<K: Resource>(&self, event: &watcher::Event<K>) {
        let mut guard = self.write();
        match event {
            watcher::Event::Apply(workload) => guard
                .arrivals
                .workload_applied(workload.meta(), Timestamp::now()),
            watcher::Event::Delete(workload) => guard.arrivals.workload_deleted(workload.meta()),
            watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => {}
        }
    }

    /// The claim `name` in `namespace` is about to be made for the gated workload `uid`: it
    /// takes the workload's arrival.
    pub fn expect_arrival(&self, namespace: &str, name: &str, uid: &str) {
        self.write().arrivals.expect(namespace, name, uid);
    }

    /// When the claim arrived, as the watch delivered it, while its status does not record
    /// it yet (see `arrivals`).
    pub fn arrival(&self, claim: &LockClaim) -> Option<MicroTime> {
        self.read().arrivals.of(claim.metadata.uid.as_deref()?)
    }

    /// The cached claims of lock `name` in `namespace` (empty: of the `ClusterDistributedLock`
    /// `name`, from every namespace).
    pub fn claims_of_lock(
        &self,
        store: &Store<LockClaim>,
        namespace: &str,
        name: &str,
    ) -> Vec<Arc<LockClaim>> {
        let key = (namespace.to_owned(), name.to_owned());
        let claims: Vec<ClaimKey> = match self.read().current.by_lock.get(&key) {
            Some(claims) => claims.iter().cloned().collect(),
            None => return Vec::new(),
        };
        claims
            .iter()
            .filter_map(|(namespace, claim)| store.get(&ObjectRef::new(claim).within(namespace)))
            .collect()
    }

    /// The locks of the live (non-terminal) claims owned by the object `kind` with `uid` in
    /// `namespace`, each once, as [`LockKey`]s (a cluster lock's with an empty namespace).
    pub fn locks_of_owner(
        &self,
        store: &Store<LockClaim>,
        kind: WorkloadKind,
        namespace: &str,
        uid: &str,
    ) -> Vec<LockKey> {
        let claims: Vec<ClaimKey> = match self.read().current.by_owner.get(uid) {
            Some(claims) => claims.iter().cloned().collect(),
            None => return Vec::new(),
        };
        let locks: BTreeSet<LockKey> = claims
            .iter()
            .filter(|(claim_namespace, _)| claim_namespace == namespace)
            .filter_map(|(_, claim)| store.get(&ObjectRef::new(claim).within(namespace)))
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
            // The first lock decides about a claim on several locks (its owner included).
            .filter_map(|claim| lock_keys(&claim, namespace).into_iter().next())
            .collect();
        locks.into_iter().collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        // A panic while holding the lock leaves names that are still valid: keep using them.
        self.inner
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.inner
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::store::Writer;

    use super::*;
    use turnstile_api::LockClaimSpec;

    fn claim(name: &str) -> LockClaim {
        let mut claim = LockClaim::new(name, LockClaimSpec::for_lock("db"));
        claim.metadata.namespace = Some("ns".to_owned());
        claim
    }

    fn names(index: &ClaimIndex, store: &Store<LockClaim>) -> Vec<String> {
        index
            .claims_of_lock(store, "ns", "db")
            .iter()
            .map(|claim| claim.name_any())
            .collect()
    }

    /// The index is fed first, the store second, as in `runtime`.
    fn feed(index: &ClaimIndex, writer: &mut Writer<LockClaim>, event: watcher::Event<LockClaim>) {
        index.observe(&event);
        writer.apply_watcher_event(&event);
    }

    #[test]
    fn a_claim_created_during_a_watch_outage_survives_the_relist() {
        let mut writer = Writer::default();
        let store = writer.as_reader();
        let index = ClaimIndex::new();
        feed(&index, &mut writer, watcher::Event::Apply(claim("old")));
        feed(
            &index,
            &mut writer,
            watcher::Event::Apply(claim("deleted-meanwhile")),
        );

        // The re-list: the store keeps its old contents until InitDone.
        feed(&index, &mut writer, watcher::Event::Init);
        feed(&index, &mut writer, watcher::Event::InitApply(claim("old")));
        feed(&index, &mut writer, watcher::Event::InitApply(claim("new")));
        // A lock pass during the re-list sees the old contents, and forgets nothing.
        assert_eq!(names(&index, &store), ["deleted-meanwhile", "old"]);
        feed(&index, &mut writer, watcher::Event::InitDone);
        assert_eq!(
            names(&index, &store),
            ["new", "old"],
            "the re-list's view, whole"
        );
    }

    #[test]
    fn a_lock_reads_its_own_claims_among_ten_thousand() {
        let mut writer = Writer::default();
        let store = writer.as_reader();
        let index = ClaimIndex::new();
        for n in 0..10_000 {
            let mut other = LockClaim::new(
                &format!("claim-{n}"),
                LockClaimSpec::for_lock(format!("lock-{}", n % 1000)),
            );
            other.metadata.namespace = Some("ns".to_owned());
            feed(&index, &mut writer, watcher::Event::Apply(other));
        }
        let read = index.claims_of_lock(&store, "ns", "lock-7");
        let mut names: Vec<String> = read.iter().map(|claim| claim.name_any()).collect();
        names.sort();
        let mut expected: Vec<String> =
            (0..10).map(|k| format!("claim-{}", 7 + 1000 * k)).collect();
        expected.sort();
        assert_eq!(
            names, expected,
            "exactly its 10 claims are read, not 10 000"
        );
        assert!(index
            .claims_of_lock(&store, "other-ns", "lock-7")
            .is_empty());
    }

    #[test]
    fn a_cluster_locks_claims_from_every_namespace_are_its_own_and_no_namespaced_locks() {
        let mut writer = Writer::default();
        let store = writer.as_reader();
        let index = ClaimIndex::new();
        for (namespace, name) in [("pay", "a"), ("web", "b")] {
            let mut on_cluster_lock = LockClaim::new(name, LockClaimSpec::for_cluster_lock("db"));
            on_cluster_lock.metadata.namespace = Some(namespace.to_owned());
            feed(&index, &mut writer, watcher::Event::Apply(on_cluster_lock));
        }
        feed(
            &index,
            &mut writer,
            watcher::Event::Apply(claim("namespaced")),
        );
        let mut cluster: Vec<(String, String)> = index
            .claims_of_lock(&store, "", "db")
            .iter()
            .map(|claim| (claim.namespace().unwrap_or_default(), claim.name_any()))
            .collect();
        cluster.sort();
        assert_eq!(
            cluster,
            [
                ("pay".to_owned(), "a".to_owned()),
                ("web".to_owned(), "b".to_owned())
            ]
        );
        assert_eq!(
            names(&index, &store),
            ["namespaced"],
            "the namespaced lock db's own"
        );
        assert!(index.claims_of_lock(&store, "pay", "db").is_empty());
    }
}
