//! `turnstile wait --create`: the claim owned by the current Pod, created idempotently.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};

use turnstile_api::{LockClaim, LockClaimSpec};

/// The Pod `turnstile wait` runs in, from the downward API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// `metadata.name` (`POD_NAME`).
    pub name: String,
    /// `metadata.uid` (`POD_UID`).
    pub uid: String,
}

impl PodIdentity {
    /// The ownerReference tying a claim to this Pod: the controller releases the claim when
    /// the Pod finishes, and the garbage collector deletes it with the Pod.
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Pod".to_owned(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            // Setting it would need `update` on pods/finalizers; nothing relies on it.
            block_owner_deletion: None,
        }
    }
}

/// Why an existing claim of the requested name cannot be adopted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdoptError {
    /// It asks for another lock (`spec.lockName` is immutable).
    #[error("LockClaim {claim} already exists for lock {existing:?}, not {requested:?}")]
    OtherLock {
        /// The claim's name.
        claim: String,
        /// Its `spec.lockName`.
        existing: String,
        /// `--lock`.
        requested: String,
    },
    /// It belongs to another Pod: its grant is that Pod's, not ours.
    #[error(
        "LockClaim {claim} already exists and belongs to Pod {owner} (uid {owner_uid}), not to \
         this Pod; give each Pod its own claim name, e.g. \"$(POD_NAME)-<lock>\""
    )]
    OtherPod {
        /// The claim's name.
        claim: String,
        /// The owning Pod's name.
        owner: String,
        /// The owning Pod's uid.
        owner_uid: String,
    },
}

/// Whether an existing claim may serve as the one `--create` would have made: same lock, and
/// not owned by another Pod (one owned by this Pod, e.g. after an init container restart, or
/// by no Pod at all is fine).
pub fn check_adoptable(claim: &LockClaim, lock: &str, pod: &PodIdentity) -> Result<(), AdoptError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    if claim.spec.lock_name != lock {
        return Err(AdoptError::OtherLock {
            claim: name,
            existing: claim.spec.lock_name.clone(),
            requested: lock.to_owned(),
        });
    }
    let foreign_pod = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.api_version == "v1" && owner.kind == "Pod" && owner.uid != pod.uid);
    if let Some(owner) = foreign_pod {
        return Err(AdoptError::OtherPod {
            claim: name,
            owner: owner.name.clone(),
            owner_uid: owner.uid.clone(),
        });
    }
    Ok(())
}

/// The claim `--create` makes: `name` asking for `lock`, owned by `pod`, with the
/// controller's finalizer from the start (one controller write to `Held`).
pub fn claim_for_pod(name: &str, namespace: &str, lock: &str, pod: &PodIdentity) -> LockClaim {
    let mut claim = LockClaim::new(name, LockClaimSpec::for_lock(lock)).with_release_finalizer();
    claim.metadata.namespace = Some(namespace.to_owned());
    claim.metadata.owner_references = Some(vec![pod.owner_reference()]);
    claim
}

/// What [`create_or_adopt`] found.
#[derive(Debug)]
pub enum Created {
    /// The claim was created now.
    New(LockClaim),
    /// A claim of that name existed and may be adopted.
    Existing(LockClaim),
    /// A claim of that name existed but belongs to another Pod or lock.
    Conflict(AdoptError),
}

/// Creates the claim, or adopts an existing one of the same name (the create is idempotent
/// across init container restarts).
pub async fn create_or_adopt(
    claims: &Api<LockClaim>,
    wanted: &LockClaim,
    pod: &PodIdentity,
) -> Result<Created, kube::Error> {
    let name = wanted.metadata.name.clone().unwrap_or_default();
    match claims.create(&PostParams::default(), wanted).await {
        Ok(created) => return Ok(Created::New(created)),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(error) => return Err(error),
    }
    let existing = claims.get(&name).await?;
    Ok(match adoptable_as(&existing, wanted, pod) {
        Ok(()) => Created::Existing(existing),
        Err(conflict) => Created::Conflict(conflict),
    })
}

/// [`check_adoptable`] for the claim `wanted` would have been: also on a lock of the same
/// kind (a namespace's `DistributedLock` and a `ClusterDistributedLock` of one name are two
/// locks).
fn adoptable_as(
    existing: &LockClaim,
    wanted: &LockClaim,
    pod: &PodIdentity,
) -> Result<(), AdoptError> {
    let kind = |claim: &LockClaim| claim.spec.lock_kind.unwrap_or_default();
    if kind(existing) != kind(wanted) {
        return Err(AdoptError::OtherLock {
            claim: existing.metadata.name.clone().unwrap_or_default(),
            existing: format!("{} {}", kind(existing).as_str(), existing.spec.lock_name),
            requested: format!("{} {}", kind(wanted).as_str(), wanted.spec.lock_name),
        });
    }
    check_adoptable(existing, &wanted.spec.lock_name, pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> PodIdentity {
        PodIdentity {
            name: format!("pod-{uid}"),
            uid: uid.to_owned(),
        }
    }

    #[test]
    fn the_created_claim_is_owned_by_the_pod() {
        let claim = claim_for_pod("web-0-db", "shop", "db", &pod("u1"));
        assert_eq!(claim.metadata.name.as_deref(), Some("web-0-db"));
        assert_eq!(claim.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(claim.spec.lock_name, "db");
        let owners = claim.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        let owner = &owners[0];
        assert_eq!(
            (owner.api_version.as_str(), owner.kind.as_str()),
            ("v1", "Pod")
        );
        assert_eq!((owner.name.as_str(), owner.uid.as_str()), ("pod-u1", "u1"));
        assert_eq!(owner.controller, Some(true));
        // The controller's finalizer from the start: no finalizer write before the grant.
        assert_eq!(
            claim.metadata.finalizers,
            Some(vec![turnstile_api::FINALIZER.to_owned()])
        );
    }

    #[test]
    fn own_or_unowned_claims_are_adopted_others_are_not() {
        let mine = claim_for_pod("c", "ns", "db", &pod("u1"));
        assert_eq!(check_adoptable(&mine, "db", &pod("u1")), Ok(()));

        let mut unowned = mine.clone();
        unowned.metadata.owner_references = None;
        assert_eq!(check_adoptable(&unowned, "db", &pod("u1")), Ok(()));

        let theirs = check_adoptable(&mine, "db", &pod("u2")).unwrap_err();
        assert!(matches!(theirs, AdoptError::OtherPod { ref owner_uid, .. } if owner_uid == "u1"));

        let other_lock = check_adoptable(&mine, "cache", &pod("u1")).unwrap_err();
        assert!(matches!(other_lock, AdoptError::OtherLock { .. }));
    }

    #[test]
    fn a_claim_on_the_other_kind_of_lock_is_not_adopted() {
        let namespaced = claim_for_pod("c", "ns", "db", &pod("u1"));
        let mut cluster = namespaced.clone();
        cluster.spec.lock_kind = Some(turnstile_api::LockKind::ClusterDistributedLock);
        assert_eq!(adoptable_as(&cluster, &cluster, &pod("u1")), Ok(()));
        let refused = adoptable_as(&namespaced, &cluster, &pod("u1")).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "LockClaim c already exists for lock \"DistributedLock db\", not \"ClusterDistributedLock db\""
        );
    }
}
