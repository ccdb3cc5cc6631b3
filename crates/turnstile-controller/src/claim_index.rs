//! An index of the claim cache by lock and by owner, so that a lock's pass and an owner's event
//! read only their own claims instead of scanning every claim in the cluster.
//!
//! The index holds names only; the objects stay in the reflector's [`Store`]. It is fed the
//! claim watch's events *before* the store is (see `runtime`), so a name the index returns may
//! not be in the store yet (it is skipped: the store's own event wakes the lock again), but a
//! claim in the store is always in the index. Names whose object has gone from the store are
//! pruned when read, which also covers deletions a re-list never reports.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::ResourceExt;

use super::core::{WorkloadKind, WorkloadOwner};
use turnstile_api::{DistributedLock, LockClaim};

/// `(namespace, lock name)`.
type LockKey = (String, String);
/// `(namespace, claim name)`.
type ClaimKey = (String, String);

#[derive(Debug, Default)]
struct Index {
    by_lock: HashMap<LockKey, BTreeSet<String>>,
    by_owner: HashMap<String, BTreeSet<ClaimKey>>,
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

    /// Records what a watch event says about claims (deletions are pruned on read too).
    pub fn observe(&self, event: &watcher::Event<LockClaim>) {
        match event {
            watcher::Event::Apply(claim) | watcher::Event::InitApply(claim) => self.insert(claim),
            watcher::Event::Delete(claim) => self.remove(claim),
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    fn insert(&self, claim: &LockClaim) {
        let (Some(namespace), name) = (claim.namespace(), claim.name_any()) else {
            return;
        };
        let mut index = self.write();
        if let Some(owner) = WorkloadOwner::of(claim.owner_references()) {
            index
                .by_owner
                .entry(owner.uid)
                .or_default()
                .insert((namespace.clone(), name.clone()));
        }
        // `spec.lockName` is immutable, so a claim never moves between locks.
        index
            .by_lock
            .entry((namespace, claim.spec.lock_name.clone()))
            .or_default()
            .insert(name);
    }

    fn remove(&self, claim: &LockClaim) {
        let (Some(namespace), name) = (claim.namespace(), claim.name_any()) else {
            return;
        };
        let mut index = self.write();
        let key = (namespace.clone(), claim.spec.lock_name.clone());
        if let Some(names) = index.by_lock.get_mut(&key) {
            names.remove(&name);
            if names.is_empty() {
                index.by_lock.remove(&key);
            }
        }
        if let Some(owner) = WorkloadOwner::of(claim.owner_references()) {
            if let Some(claims) = index.by_owner.get_mut(&owner.uid) {
                claims.remove(&(namespace, name));
                if claims.is_empty() {
                    index.by_owner.remove(&owner.uid);
                }
            }
        }
    }

    /// The cached claims of lock `name` in `namespace`.
    pub fn claims_of_lock(
        &self,
        store: &Store<LockClaim>,
        namespace: &str,
        name: &str,
    ) -> Vec<Arc<LockClaim>> {
        let key = (namespace.to_owned(), name.to_owned());
        let names: Vec<String> = match self.read().by_lock.get(&key) {
            Some(names) => names.iter().cloned().collect(),
            None => return Vec::new(),
        };
        let mut found = Vec::with_capacity(names.len());
        let mut gone = Vec::new();
        for claim in names {
            match store.get(&ObjectRef::new(&claim).within(namespace)) {
                Some(object) => found.push(object),
                None => gone.push(claim),
            }
        }
        if !gone.is_empty() {
            let mut index = self.write();
            if let Some(names) = index.by_lock.get_mut(&key) {
                for claim in &gone {
                    // Only a name still absent is pruned: it may have arrived meanwhile.
                    if store
                        .get(&ObjectRef::new(claim).within(namespace))
                        .is_none()
                    {
                        names.remove(claim);
                    }
                }
            }
        }
        found
    }

    /// The locks of the live (non-terminal) claims owned by the object `kind` with `uid` in
    /// `namespace`, each once.
    pub fn locks_of_owner(
        &self,
        store: &Store<LockClaim>,
        kind: WorkloadKind,
        namespace: &str,
        uid: &str,
    ) -> Vec<ObjectRef<DistributedLock>> {
        let claims: Vec<ClaimKey> = match self.read().by_owner.get(uid) {
            Some(claims) => claims.iter().cloned().collect(),
            None => return Vec::new(),
        };
        let locks: BTreeSet<String> = claims
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
            .map(|claim| claim.spec.lock_name.clone())
            .collect();
        locks
            .into_iter()
            .map(|lock| ObjectRef::new(&lock).within(namespace))
            .collect()
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
