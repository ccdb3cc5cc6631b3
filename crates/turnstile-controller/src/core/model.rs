//! The core's view of the world: plain data taken from the API objects and the backend, with
//! every time reduced to whole Unix seconds (the API's resolution), so that comparisons made
//! in one pass agree with what the next pass reads back.

use std::collections::HashSet;
use std::fmt::Display;
use std::ops::RangeInclusive;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use turnstile_api::{
    queue_place, BackendKind, BusyPolicy, ClaimMode, ClaimPhase, DistributedLock,
    DistributedLockSpec, DistributedLockStatus, LockClaim, LockClaimSpec, LockClaimStatus,
    QueueOrder, QueuePlace, FINALIZER, FORCE_RELEASED_BY_ANNOTATION, FORCE_RELEASE_ANNOTATION,
    MAX_ACQUIRE_TIMEOUT_SECONDS, MAX_HOLDERS, MAX_HOLD_SECONDS, MAX_LEASE_DURATION_SECONDS,
    MAX_LOCKS_PER_CLAIM, MAX_LOCK_DELAY_SECONDS, MAX_OVERTAKE_SECONDS,
};
use turnstile_lock::{HolderInfo, LockSnapshot};

/// The backend lease outlives the lease shown in the API by this much: the controller, not the
/// backend, ends grants (it releases at `expiresAt`), so a backend clock running slightly ahead
/// can never free a slot that the API still shows as held.
pub const BACKEND_LEASE_GRACE: Duration = Duration::from_secs(5);

/// The longest backend key the controller builds, in bytes (the engine's limit).
pub const MAX_BACKEND_KEY_LEN: usize = turnstile_lock::backend::MAX_KEY_LEN;

/// Whole Unix seconds: the resolution of every time the API stores.
pub type Seconds = i64;

/// Whole seconds of an API time (fractions are dropped, as the API drops them when it stores).
pub fn seconds_of(time: &Time) -> Seconds {
    time.0.as_second()
}

/// The API time at whole second `seconds` (clamped to the representable range).
pub fn time_at(seconds: Seconds) -> Time {
    let clamped = seconds.clamp(Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
    Time(Timestamp::from_second(clamped).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// A `DistributedLock` as the core sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct LockView {
    /// The lock's namespace.
    pub namespace: String,
    /// The lock's name.
    pub name: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `metadata.deletionTimestamp` is set, or the namespace is being deleted
    /// ([`LockView::going_with_namespace`]).
    pub deleting: bool,
    /// The namespace is being deleted: the lock and its claims go with it, and nothing is
    /// written to them but finalizer removals.
    pub namespace_terminating: bool,
    /// Whether the controller's finalizer is on the lock.
    pub has_finalizer: bool,
    /// The desired state.
    pub spec: DistributedLockSpec,
    /// The last written status (default when none).
    pub status: DistributedLockStatus,
}

/// A claim's name in the pass of a lock of `lock_namespace`: its own name; on a
/// `ClusterDistributedLock` (no namespace), whose claims come from several namespaces,
/// `namespace/name` (a name holds no `/`, so the two parts are told apart).
pub fn claim_key(lock_namespace: &str, claim_namespace: &str, name: &str) -> String {
    if lock_namespace.is_empty() {
        format!("{claim_namespace}/{name}")
    } else {
        name.to_owned()
    }
}

/// Where the claim named `key` in the pass of a lock of `lock_namespace` lives:
/// `(namespace, name)` (the inverse of [`claim_key`]).
pub fn claim_address<'a>(lock_namespace: &'a str, key: &'a str) -> (&'a str, &'a str) {
    if lock_namespace.is_empty() {
        key.split_once('/').unwrap_or(("", key))
    } else {
        (lock_namespace, key)
    }
}

/// A claim's owner token in the backend: `uid`, or `cluster/uid` when the controller runs
/// with a cluster name (`--cluster-name`). A uid holds no `/`, so [`cluster_of_token`]
/// reads the cluster back from a token another cluster's controller wrote.
pub fn owner_token_in(cluster: Option<&str>, uid: &str) -> String {
    match cluster {
        Some(cluster) => format!("{cluster}/{uid}"),
        None => uid.to_owned(),
    }
}

/// The cluster an owner token names (see [`owner_token_in`]), if it names one.
pub fn cluster_of_token(token: &str) -> Option<&str> {
    token
        .split_once('/')
        .map(|(cluster, _)| cluster)
        .filter(|cluster| !cluster.is_empty())
}

impl LockView {
    /// Takes the parts of a lock object the core needs.
    pub fn from_resource(lock: &DistributedLock) -> Self {
        Self {
            namespace: lock.namespace().unwrap_or_default(),
            name: lock.name_any(),
            generation: lock.metadata.generation,
            deleting: lock.metadata.deletion_timestamp.is_some(),
            namespace_terminating: false,
            has_finalizer: lock.finalizers().iter().any(|f| f == FINALIZER),
            spec: lock.spec.clone(),
            status: lock.status.clone().unwrap_or_default(),
        }
    }

    /// Counts the lock as being deleted when its namespace is (`namespace_terminating`): it
    /// goes with the namespace, so its pass grants nothing, releases, removes the finalizers
    /// of the claims already marked for deletion (the others' marks are on their way) and
    /// writes no status to objects about to vanish.
    pub fn going_with_namespace(mut self, namespace_terminating: bool) -> Self {
        self.deleting |= namespace_terminating;
        self.namespace_terminating = namespace_terminating;
        self
    }

    /// The key of this lock in its backend: always prefixed by the namespace, so tenants of
    /// different namespaces can never share (or steal) a backend lock by choosing a key.
    pub fn backend_key(&self) -> String {
        let key = self
            .spec
            .key
            .as_deref()
            .filter(|key| !key.is_empty())
            .unwrap_or(&self.name);
        format!("{}/{}", self.namespace, key)
    }

    /// The highest fencing token recorded for this lock (0 if none).
    pub fn fencing_high_water(&self) -> u64 {
        self.status
            .fencing_token
            .and_then(|token| u64::try_from(token).ok())
            .unwrap_or(0)
    }

    /// Why the spec cannot be served, if it cannot (the CRD schema rejects these already, but
    /// a fake or an old API server may let them through).
    pub fn spec_problem(&self) -> Option<String> {
        let spec = &self.spec;
        let out_of_bounds = [
            outside(
                "leaseDurationSeconds",
                Some(spec.lease_duration_seconds),
                1..=MAX_LEASE_DURATION_SECONDS,
            ),
            outside("maxHolders", Some(spec.max_holders), 1..=MAX_HOLDERS),
            outside(
                "maxHoldSeconds",
                spec.max_hold_seconds,
                1..=MAX_HOLD_SECONDS,
            ),
            outside(
                "lockDelaySeconds",
                spec.lock_delay_seconds,
                0..=MAX_LOCK_DELAY_SECONDS,
            ),
            outside(
                "maxOvertakeSeconds",
                spec.max_overtake_seconds,
                1..=MAX_OVERTAKE_SECONDS,
            ),
        ];
        if let Some(problem) = out_of_bounds.into_iter().flatten().next() {
            return Some(problem);
        }
        let key = self.backend_key();
        if key.len() > MAX_BACKEND_KEY_LEN {
            return Some(format!(
                "the backend key {key:?} is {} bytes, the limit is {MAX_BACKEND_KEY_LEN}",
                key.len()
            ));
        }
        None
    }

    /// `maxHolders`, clamped into the accepted range (used for releases even when invalid).
    pub fn max_holders(&self) -> u32 {
        u32::try_from(self.spec.max_holders.clamp(1, MAX_HOLDERS)).unwrap_or(1)
    }

    /// `maxHoldSeconds`, if set (clamped into the accepted range).
    pub fn max_hold_seconds(&self) -> Option<Seconds> {
        self.spec
            .max_hold_seconds
            .map(|seconds| seconds.clamp(1, MAX_HOLD_SECONDS))
    }

    /// `lockDelaySeconds` (0 when unset; clamped into the accepted range).
    pub fn lock_delay_seconds(&self) -> Seconds {
        self.spec
            .lock_delay_seconds
            .unwrap_or(0)
            .clamp(0, MAX_LOCK_DELAY_SECONDS)
    }

    /// Whether a waiting claim created at `created` may still be passed by claims behind it
    /// that can be granted now: only on a `queue: FirstRunnable` lock, within
    /// `maxOvertakeSeconds` of its creation.
    pub fn may_be_passed(&self, created: Seconds, now: Seconds) -> bool {
        self.spec.queue_order() == QueueOrder::FirstRunnable
            && now < created.saturating_add(self.spec.max_overtake_seconds())
    }

    /// `status.lockedUntil`: no grant before it.
    pub fn locked_until(&self) -> Option<Seconds> {
        self.status.locked_until.as_ref().map(seconds_of)
    }

    /// The lock's lease in seconds, clamped into the accepted range.
    pub fn lease_seconds(&self) -> i64 {
        self.spec
            .lease_duration_seconds
            .clamp(1, MAX_LEASE_DURATION_SECONDS)
    }
}

/// A `LockClaim` as the core sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimView {
    /// The claim's name.
    pub name: String,
    /// The owner token of the claim's grant in the backend: its `metadata.uid`, as
    /// `CLUSTER/UID` when the controller runs with a cluster name (see
    /// [`ClaimView::in_cluster`]), so that a lock shared by several clusters tells whose
    /// grant the backend holds.
    pub owner_token: String,
    /// `metadata.creationTimestamp` (whole seconds): where the acquire timeout counts from,
    /// and the claim's place in the queue when it has no `status.arrivedAt`.
    pub created: Seconds,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Whether the controller's finalizer is on the claim.
    pub has_finalizer: bool,
    /// The name of the claim's owner (the controlling owner reference, else the first).
    pub owner_name: Option<String>,
    /// The Pod or Job whose life the claim is tied to, if any.
    pub owner: Option<WorkloadOwner>,
    /// Whether that owner still runs (filled in by the shell; `Unknown` until it looks).
    pub owner_state: OwnerState,
    /// The desired state.
    pub spec: LockClaimSpec,
    /// The last written status (default when none). A claim on several locks is seen from
    /// one of them: `fencingToken` is that lock's (see [`ClaimView::for_lock`]).
    pub status: LockClaimStatus,
    /// The locks claimed, in name order: one, or those of `spec.lockNames`. The first is the
    /// claim's *first lock*, whose pass decides and writes everything about the claim; the
    /// passes of the others only keep its place (see [`MemberLock`]).
    pub locks: Vec<String>,
    /// In the pass of the first lock of a claim on several locks: the other locks, as the
    /// shell found them before the pass (empty otherwise).
    pub members: Vec<MemberLock>,
    /// The shortest `maxHoldSeconds` of the claim's other locks, if any sets one: a claim on
    /// several locks is held no longer than any of them allows.
    pub members_max_hold: Option<Seconds>,
    /// An administrator asked for the grant to end now (`turnstile release`).
    pub force_release: Option<ForceRelease>,
}

/// A force-release asked for on a claim: the annotations `turnstile release` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceRelease {
    /// Why, in the asker's words.
    pub reason: String,
    /// Who asked, as `turnstile release` learned it from the API server (`None` when the
    /// annotation was set by other means: the API server's audit log says who).
    pub by: Option<String>,
}

impl ForceRelease {
    /// From a claim's annotations, when it carries [`FORCE_RELEASE_ANNOTATION`].
    pub fn of(annotations: &std::collections::BTreeMap<String, String>) -> Option<Self> {
        let reason = annotations.get(FORCE_RELEASE_ANNOTATION)?;
        Some(ForceRelease {
            reason: reason.trim().to_owned(),
            by: annotations
                .get(FORCE_RELEASED_BY_ANNOTATION)
                .map(|by| by.trim().to_owned())
                .filter(|by| !by.is_empty()),
        })
    }

    /// What the claim's status and the Events say.
    pub fn message(&self, lock: &str) -> String {
        let by = self
            .by
            .as_deref()
            .unwrap_or("an unnamed user (see the audit log)");
        let why = if self.reason.is_empty() {
            "no reason given"
        } else {
            self.reason.as_str()
        };
        format!("force-released from lock {lock} by {by}: {why}")
    }
}

/// Another lock of a claim on several locks, as the pass of the claim's first lock sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberLock {
    /// The lock's name.
    pub name: String,
    /// Whether the lock exists and is not being deleted: without it the claim cannot be
    /// granted (and a grant ends).
    pub exists: bool,
    /// Whether the lock's own queue would admit the claim now: it is at the head with room
    /// (no earlier claim waits, the lock serves and is past any lock-delay).
    pub admits: bool,
    /// Whether the claim's grant is live in this lock's backend (`None`: it did not answer;
    /// `Some(false)` too when the lock is not there: nothing can be given back to it).
    pub holds: Option<bool>,
    /// The claim's fencing token on this lock, as `status.locks` records it.
    pub fencing_token: Option<u64>,
    /// The highest token this lock has announced: a new grant of it must be above.
    pub high_water: u64,
    /// Whether the claim holds this lock together with other shared holders.
    pub shared: bool,
}

/// The kinds of owners whose life a claim follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    /// A core/v1 Pod: alive until it succeeds, fails or goes away.
    Pod,
    /// A batch/v1 Job: alive until it completes, fails or goes away.
    Job,
}

/// The Pod or Job that owns a claim (`metadata.ownerReferences`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadOwner {
    /// Pod or Job.
    pub kind: WorkloadKind,
    /// The owner's name (same namespace as the claim).
    pub name: String,
    /// The owner's uid: an object of the same name with another uid is not the owner.
    pub uid: String,
}

impl WorkloadOwner {
    /// The controlling Pod/Job owner reference, else the first Pod/Job one.
    pub fn of(
        owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    ) -> Option<Self> {
        let workload = |owner: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
            matches!(
                (owner.api_version.as_str(), owner.kind.as_str()),
                ("v1", "Pod") | ("batch/v1", "Job")
            )
        };
        let owner = owners
            .iter()
            .filter(workload)
            .find(|owner| owner.controller == Some(true))
            .or_else(|| owners.iter().find(workload))?;
        Some(Self {
            kind: if owner.kind == "Pod" {
                WorkloadKind::Pod
            } else {
                WorkloadKind::Job
            },
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        })
    }
}

/// Whether a claim's owning Pod or Job still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerState {
    /// The claim has no Pod or Job owner: its holder renews it through `spec.renewTime`.
    NotTracked,
    /// The owner could not be looked up (API error): nothing is decided from it.
    Unknown,
    /// The owner runs: the controller renews the claim's lease.
    Alive,
    /// The owner succeeded or failed: the claim is released.
    Finished,
    /// The owner no longer exists: the claim is released.
    Gone,
}

/// A claim object lacks a field the API server always sets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("LockClaim {name:?} has no metadata.{field}")]
pub struct IncompleteClaim {
    /// The claim's name.
    pub name: String,
    /// The missing field.
    pub field: &'static str,
}

impl ClaimView {
    /// Takes the parts of a claim object the core needs.
    pub fn from_resource(claim: &LockClaim) -> Result<Self, IncompleteClaim> {
        let name = claim.name_any();
        let missing = |field| IncompleteClaim {
            name: name.clone(),
            field,
        };
        let uid = claim.metadata.uid.clone().ok_or_else(|| missing("uid"))?;
        let created = claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map(seconds_of)
            .ok_or_else(|| missing("creationTimestamp"))?;
        let owner_name = claim.owner_name();
        let owner = WorkloadOwner::of(claim.owner_references());
        let owner_state = if owner.is_some() {
            OwnerState::Unknown
        } else {
            OwnerState::NotTracked
        };
        Ok(Self {
            name: name.clone(),
            owner_token: uid,
            created,
            generation: claim.metadata.generation,
            deleting: claim.metadata.deletion_timestamp.is_some(),
            has_finalizer: claim.finalizers().iter().any(|f| f == FINALIZER),
            owner_name,
            owner,
            owner_state,
            locks: claim.spec.locks().into_iter().map(str::to_owned).collect(),
            spec: claim.spec.clone(),
            status: claim.status.clone().unwrap_or_default(),
            members: Vec::new(),
            members_max_hold: None,
            force_release: ForceRelease::of(claim.annotations()),
        })
    }

    /// [`ClaimView::from_resource`], seen from `lock`: for a claim on several locks,
    /// `status.fencingToken` is the one `status.locks` records for `lock` (none before
    /// the grant), so each lock's fencing high-water counts its own tokens only.
    pub fn for_lock(claim: &LockClaim, lock: &str) -> Result<Self, IncompleteClaim> {
        let mut view = Self::from_resource(claim)?;
        if view.is_multi_lock() {
            view.status.fencing_token = claim.fencing_token_on(lock);
        }
        Ok(view)
    }

    /// The view with its owner token as `cluster` names it (`None`: the bare uid): see
    /// [`owner_token_in`].
    #[must_use]
    pub fn in_cluster(mut self, cluster: Option<&str>) -> Self {
        self.owner_token = owner_token_in(cluster, &self.owner_token);
        self
    }

    /// Whether the claim names several locks.
    pub fn is_multi_lock(&self) -> bool {
        self.locks.len() > 1 || self.spec.is_multi_lock()
    }

    /// The claim's first lock (name order): the one whose pass decides about the claim.
    pub fn first_lock(&self) -> &str {
        self.locks.first().map_or("", String::as_str)
    }

    /// Whether `lock`'s pass only keeps this claim's place: it claims several locks and
    /// `lock` is not the first.
    pub fn kept_by(&self, lock: &str) -> bool {
        self.is_multi_lock() && self.first_lock() != lock
    }

    /// The recorded phase; a claim without status is `Pending`.
    pub fn phase(&self) -> ClaimPhase {
        self.status.phase.unwrap_or_default()
    }

    /// Who holds (or will hold) the grant: `spec.holderIdentity`, else the owner's name, else
    /// the claim's name.
    pub fn holder_identity(&self) -> String {
        turnstile_api::holder_identity(&self.spec, self.owner_name.clone(), &self.name)
    }

    /// The claim's place in the queue ([`turnstile_api::queue_place`]), with the arrival this
    /// view carries (the status's, or the one observed and not yet written).
    pub fn queue_order(&self) -> QueuePlace<'_> {
        queue_place(
            self.spec.priority,
            self.status.arrived_at.as_ref(),
            Some(&time_at(self.created)),
            &self.name,
        )
    }

    /// Records when the controller saw the claim arrive, unless its status already does: the
    /// claim's next status write (its first) then carries it, and no write is added for it.
    pub fn observed_arrival(mut self, arrived: Option<MicroTime>) -> Self {
        if self.status.arrived_at.is_none() {
            self.status.arrived_at = arrived;
        }
        self
    }

    /// Whether the claim holds together with other shared claims: `spec.mode`, and when it is
    /// omitted, shared on a lock of several holders (a semaphore) and exclusive on a mutex.
    pub fn shared(&self, lock: &LockView) -> bool {
        match self.spec.mode {
            Some(mode) => mode == ClaimMode::Shared,
            None => lock.max_holders() > 1,
        }
    }

    /// When the recorded grant must end under the lock's `maxHoldSeconds`, if it must.
    pub fn recorded_hold_deadline(&self, lock: &LockView) -> Option<Seconds> {
        self.hold_deadline(lock, self.acquired()?)
    }

    /// When a grant made at `acquired` must end under the lock's `maxHoldSeconds` (and, on
    /// several locks, the shortest of theirs).
    pub fn hold_deadline(&self, lock: &LockView, acquired: Seconds) -> Option<Seconds> {
        lock.max_hold_seconds()
            .into_iter()
            .chain(self.members_max_hold)
            .min()
            .map(|max_hold| acquired.saturating_add(max_hold))
    }

    /// When the recorded grant was made, if it was.
    pub fn acquired(&self) -> Option<Seconds> {
        self.status.acquired_at.as_ref().map(seconds_of)
    }

    /// The recorded fencing token of the grant, if any.
    pub fn fencing_token(&self) -> Option<u64> {
        self.status
            .fencing_token
            .and_then(|token| u64::try_from(token).ok())
    }

    /// When the acquire timeout runs out, if the claim has one.
    pub fn acquire_deadline(&self) -> Option<Seconds> {
        self.spec
            .acquire_timeout_seconds
            .map(|timeout| self.created.saturating_add(timeout))
    }

    /// Why the spec cannot be served, if it cannot.
    pub fn spec_problem(&self) -> Option<String> {
        match &self.spec.lock_names {
            None if self.spec.lock_name.is_empty() => {
                return Some("spec.lockName must not be empty".to_owned());
            }
            None => {}
            Some(_) if !self.spec.lock_name.is_empty() => {
                return Some("set exactly one of spec.lockName and spec.lockNames".to_owned());
            }
            Some(names) => {
                if !(2..=MAX_LOCKS_PER_CLAIM).contains(&names.len()) {
                    return Some(format!(
                        "spec.lockNames must name between 2 and {MAX_LOCKS_PER_CLAIM} locks, got {}",
                        names.len()
                    ));
                }
                if names.iter().any(String::is_empty) {
                    return Some("spec.lockNames must not contain an empty name".to_owned());
                }
                if self.locks.len() != names.len() {
                    return Some("spec.lockNames must not name a lock twice".to_owned());
                }
            }
        }
        let spec = &self.spec;
        match spec.when_busy {
            Some(policy) if policy != BusyPolicy::Wait && spec.lock_names.is_some() => {
                return Some(
                    "spec.whenBusy other than Wait is for a claim on one lock (spec.lockName)"
                        .to_owned(),
                );
            }
            Some(policy) if policy.replaces_pending() && spec.group.is_none() => {
                return Some(format!("spec.whenBusy {policy:?} needs spec.group"));
            }
            _ => {}
        }
        let out_of_bounds = [
            outside(
                "spec.leaseDurationSeconds",
                spec.lease_duration_seconds,
                1..=MAX_LEASE_DURATION_SECONDS,
            ),
            outside(
                "spec.acquireTimeoutSeconds",
                spec.acquire_timeout_seconds,
                1..=MAX_ACQUIRE_TIMEOUT_SECONDS,
            ),
        ];
        out_of_bounds.into_iter().flatten().next()
    }

    /// The lease of this claim's grants in seconds: its own override, else the lock's, both
    /// clamped into the accepted range.
    pub fn lease_seconds(&self, lock: &LockView) -> i64 {
        self.spec
            .lease_duration_seconds
            .map(|lease| lease.clamp(1, MAX_LEASE_DURATION_SECONDS))
            .unwrap_or_else(|| lock.lease_seconds())
    }

    /// `spec.release` is true.
    pub fn release_requested(&self) -> bool {
        self.spec.release == Some(true)
    }
}

/// What the backend said before the pass (one snapshot of the lock's key), or why it could
/// not be asked.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendView {
    /// The lock asks for a backend the controller has no connection for.
    NotConfigured {
        /// The backend asked for.
        backend: BackendKind,
    },
    /// The backend did not answer.
    Unavailable {
        /// The backend asked for.
        backend: BackendKind,
        /// The error, for people (it names the backend).
        message: String,
    },
    /// The backend answered.
    Ready {
        /// The backend asked.
        backend: BackendKind,
        /// Holders, waiters and the fence counter of the lock's key.
        snapshot: LockSnapshot,
    },
}

impl BackendView {
    /// The backend this view is about.
    pub fn backend(&self) -> BackendKind {
        match self {
            BackendView::NotConfigured { backend }
            | BackendView::Unavailable { backend, .. }
            | BackendView::Ready { backend, .. } => *backend,
        }
    }

    /// The snapshot, when the backend answered.
    pub fn snapshot(&self) -> Option<&LockSnapshot> {
        match self {
            BackendView::Ready { snapshot, .. } => Some(snapshot),
            _ => None,
        }
    }

    /// `owner`'s live grant in the snapshot, if it has one. A grant whose lease was cut
    /// (see [`LEASE_CUT`](super::LEASE_CUT)) is over already: it runs out on its own, and
    /// releasing it would end the backend's lock-delay.
    pub fn holder(&self, owner: &str) -> Option<&HolderInfo> {
        self.snapshot()?
            .holders
            .iter()
            .find(|h| h.owner == owner && h.expires_in > super::LEASE_CUT)
    }

    /// Whether `owner` is a live holder in the snapshot.
    pub fn holds(&self, owner: &str) -> bool {
        self.holder(owner).is_some()
    }

    /// Whether `owner` waits in the backend's queue for the key, in the snapshot.
    pub fn queues(&self, owner: &str) -> bool {
        self.snapshot()
            .is_some_and(|snapshot| snapshot.waiters.iter().any(|waiter| waiter == owner))
    }
}

/// Everything one reconcile pass of a lock decides from.
#[derive(Debug, Clone, PartialEq)]
pub struct LockInput {
    /// The lock.
    pub lock: LockView,
    /// Every claim naming the lock (any order; the core sorts).
    pub claims: Vec<ClaimView>,
    /// The current time (full precision: used for backend lease lengths and requeue delays;
    /// statuses use whole seconds).
    pub now: Timestamp,
    /// The backend's state before the pass.
    pub backend: BackendView,
    /// Whether the controller's budget allows this pass to refresh waiters' positions; when
    /// it does not, a refresh that is due waits (see [`crate::core::POSITION_REFRESH_DELAY`]).
    pub may_refresh_positions: bool,
}

impl LockInput {
    /// Whether the backend holds or queues the lock's key for someone who is no claim of
    /// this pass: another cluster's controller sharing the key, or a client of the backend
    /// itself.
    pub fn shared_outside(&self) -> bool {
        let Some(snapshot) = self.backend.snapshot() else {
            return false;
        };
        let waiters = snapshot.waiters.iter().map(String::as_str);
        !self.holders_outside().is_empty() || self.outside(waiters).next().is_some()
    }

    /// The snapshot's live grants that are no claim's of this pass (see
    /// [`LockInput::shared_outside`]), in grant order.
    pub fn holders_outside(&self) -> Vec<&HolderInfo> {
        let Some(snapshot) = self.backend.snapshot() else {
            return Vec::new();
        };
        let live = (snapshot.holders.iter()).filter(|holder| holder.expires_in > super::LEASE_CUT);
        let outside: HashSet<&str> = self
            .outside(live.clone().map(|holder| holder.owner.as_str()))
            .collect();
        live.filter(|holder| outside.contains(holder.owner.as_str()))
            .collect()
    }

    /// The `owners` that are no claim's of this pass; the claims are only looked at when
    /// there is an owner to judge.
    fn outside<'a>(
        &'a self,
        owners: impl Iterator<Item = &'a str> + 'a,
    ) -> impl Iterator<Item = &'a str> + 'a {
        let mut owners = owners.peekable();
        let ours: HashSet<&str> = match owners.peek() {
            None => HashSet::new(),
            Some(_) => (self.claims.iter())
                .map(|claim| claim.owner_token.as_str())
                .collect(),
        };
        owners.filter(move |owner| !ours.contains(owner))
    }

    /// `now` in whole seconds.
    pub fn now_seconds(&self) -> Seconds {
        self.now.as_second()
    }

    /// Time from `now` until the whole second `at` (zero if it is past).
    pub fn until(&self, at: Seconds) -> Duration {
        let at_nanos = i128::from(at) * 1_000_000_000;
        let now_nanos = self.now.as_nanosecond();
        let nanos = (at_nanos - now_nanos).max(0);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// `"<field> must be between <min> and <max>, got <value>"` when `value` is set and outside
/// `bounds` (the schema's bounds, checked again for objects an API server let through).
fn outside<T>(field: &str, value: Option<T>, bounds: RangeInclusive<T>) -> Option<String>
where
    T: PartialOrd + Display,
{
    let value = value?;
    (!bounds.contains(&value)).then(|| {
        format!(
            "{field} must be between {} and {}, got {value}",
            bounds.start(),
            bounds.end()
        )
    })
}
