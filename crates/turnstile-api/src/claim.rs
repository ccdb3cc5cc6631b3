//! `LockClaim`: one workload's request for a `DistributedLock`, and the record of its grant.

use std::cmp::Reverse;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::{CustomResource, KubeSchema, ResourceExt};
use serde::{Deserialize, Serialize};

use crate::vocabulary::{
    FINALIZER, MAX_ACQUIRE_TIMEOUT_SECONDS, MAX_LEASE_DURATION_SECONDS, MAX_LOCKS_PER_CLAIM,
    MAX_PRIORITY,
};

/// A request for a `DistributedLock` in the same namespace (or, with `lockKind`, for a
/// `ClusterDistributedLock`). Claims are granted by `priority`
/// (higher first), then in order of arrival (`status.arrivedAt`, else `creationTimestamp`),
/// then name; the status records the grant and its fencing token.
// clippy reads the repeated `type_` keys of separate `printcolumn(...)` groups as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[kube(
    group = "turnstile.dev",
    version = "v1alpha1",
    kind = "LockClaim",
    plural = "lockclaims",
    singular = "lockclaim",
    shortname = "lclaim",
    category = "locks",
    namespaced,
    status = "LockClaimStatus",
    derive = "PartialEq",
    doc = "A request for a DistributedLock; the status records the grant and its fencing token.",
    printcolumn(
        name = "Lock",
        type_ = "string",
        json_path = ".spec.lockName",
        description = "The DistributedLock claimed"
    ),
    printcolumn(
        name = "Locks",
        type_ = "string",
        json_path = ".spec.lockNames",
        description = "The DistributedLocks claimed all at once (lockNames)",
        priority = 1
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Pending, Held, Released, Expired or Failed"
    ),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.mode",
        description = "Exclusive or Shared (omitted: Shared on a semaphore, Exclusive on a mutex)",
        priority = 1
    ),
    printcolumn(
        name = "Holder",
        type_ = "string",
        json_path = ".status.holderIdentity",
        description = "Who holds (or will hold) the grant"
    ),
    printcolumn(
        name = "Token",
        type_ = "integer",
        json_path = ".status.fencingToken",
        description = "The fencing token of the grant"
    ),
    printcolumn(
        name = "Position",
        type_ = "integer",
        json_path = ".status.position",
        description = "1-based place in the queue while Pending"
    ),
    printcolumn(
        name = "Expires",
        type_ = "string",
        json_path = ".status.expiresAt",
        description = "When the grant lapses unless renewed (RFC 3339)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.lockName) != has(self.lockNames)")
        .message("set exactly one of lockName and lockNames"),
    validation = Rule::new("has(self.lockNames) == has(oldSelf.lockNames)")
        .message("a claim cannot switch between lockName and lockNames"),
    validation = Rule::new(
        "!has(self.whenBusy) || self.whenBusy == 'Wait' || self.whenBusy == 'Fail' || has(self.group)"
    )
    .message("whenBusy ReplacePending and CancelInProgress need spec.group"),
    validation = Rule::new("!has(self.whenBusy) || self.whenBusy == 'Wait' || !has(self.lockNames)")
        .message("whenBusy other than Wait is for a claim on one lock (lockName, not lockNames)"),
    validation = Rule::new("has(self.whenBusy) == has(oldSelf.whenBusy)")
        .message("whenBusy is immutable"),
    validation = Rule::new("has(self.group) == has(oldSelf.group)")
        .message("group is immutable"),
    validation = Rule::new(
        "!has(self.lockKind) || self.lockKind == 'DistributedLock' || has(self.lockName)"
    )
    .message("lockKind ClusterDistributedLock takes one lock, in lockName (not lockNames)"),
    validation = Rule::new("has(self.lockKind) == has(oldSelf.lockKind)")
        .message("lockKind is immutable"),
)]
pub struct LockClaimSpec {
    /// The `DistributedLock` in the same namespace this claim asks for (with `lockKind:
    /// ClusterDistributedLock`, the cluster lock of that name); immutable. Empty (and
    /// omitted) when the claim names several locks in `lockNames`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("lockName is immutable"))]
    pub lock_name: String,
    /// Several `DistributedLock`s of the namespace, granted all at once or not at all (instead
    /// of `lockName`); each at most once; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = MAX_LOCKS_PER_CLAIM), inner(length(min = 1, max = 253)))]
    #[x_kube(
        validation = Rule::new("self.all(name, self.exists_one(other, other == name))")
            .message("lockNames must not name a lock twice"),
        validation = Rule::new("self == oldSelf").message("lockNames is immutable"),
    )]
    pub lock_names: Option<Vec<String>>,
    /// Who will hold the lock; default: the owner's name, else the claim's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub holder_identity: Option<String>,
    /// Overrides the lock's lease duration for this claim, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_LEASE_DURATION_SECONDS))]
    pub lease_duration_seconds: Option<i64>,
    /// The claim fails if it is not granted within this many seconds of its creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_ACQUIRE_TIMEOUT_SECONDS))]
    pub acquire_timeout_seconds: Option<i64>,
    /// The holder bumps this to extend its lease: the grant then runs for a lease from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<Time>,
    /// `true` releases the lock but keeps the claim as a record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<bool>,
    /// Higher is granted first (default 0); FIFO within one priority. A holder is never
    /// preempted. Stored in the spec, so a restart or a new leader keeps the order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -MAX_PRIORITY, max = MAX_PRIORITY))]
    pub priority: Option<i32>,
    /// `Exclusive` holds alone; `Shared` holds together with other shared claims, up to the
    /// lock's `maxHolders`. Omitted: `Shared` on a lock of several holders (a semaphore, as
    /// ever) and `Exclusive` on a mutex, where the two are the same. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("mode is immutable"))]
    pub mode: Option<ClaimMode>,
    /// What the claim does when the lock cannot be granted at once ([`BusyPolicy`]; default
    /// `Wait`). On one lock (`lockName`) only; immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("whenBusy is immutable"))]
    pub when_busy: Option<BusyPolicy>,
    /// The claim's concurrency group on its lock (a branch, an environment): `whenBusy:
    /// ReplacePending` and `CancelInProgress` replace the older claims of this group only.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("group is immutable"))]
    pub group: Option<String>,
    /// Which kind of lock `lockName` names: `DistributedLock` (the default), in the claim's
    /// namespace; or `ClusterDistributedLock`, cluster-scoped, which takes claims from the
    /// namespaces its `namespaceSelector` selects. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("lockKind is immutable"))]
    pub lock_kind: Option<LockKind>,
}

/// The kind of lock a claim names (`spec.lockKind`).
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default, schemars::JsonSchema,
)]
pub enum LockKind {
    /// A `DistributedLock` in the claim's namespace.
    #[default]
    DistributedLock,
    /// A cluster-scoped `ClusterDistributedLock`.
    ClusterDistributedLock,
}

impl LockKind {
    /// The kind's name, as in `spec.lockKind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DistributedLock => "DistributedLock",
            Self::ClusterDistributedLock => "ClusterDistributedLock",
        }
    }
}

/// What a claim does when its lock cannot be granted at once (`spec.whenBusy`).
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default, schemars::JsonSchema,
)]
pub enum BusyPolicy {
    /// Queue until granted (or `acquireTimeoutSeconds`).
    #[default]
    Wait,
    /// Do not queue: a claim the lock cannot grant when the controller first sees it ends
    /// `Failed`, reason `LockBusy` ("skip if busy").
    Fail,
    /// Queue, and end the older pending claims of the same `group` on the lock (`Failed`,
    /// reason `Superseded`): the newest run replaces the waiting ones.
    ReplacePending,
    /// As `ReplacePending`, and also end the grant of the group's older holder (`Expired`,
    /// reason `Superseded`, a `LockLost` Warning): the newest run cancels the one in progress.
    CancelInProgress,
}

impl BusyPolicy {
    /// Whether a claim of this policy replaces the older pending claims of its group.
    pub fn replaces_pending(self) -> bool {
        matches!(self, Self::ReplacePending | Self::CancelInProgress)
    }
}

/// How a claim holds its lock (`spec.mode`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum ClaimMode {
    /// Holds alone: granted only when nobody holds the lock.
    Exclusive,
    /// Holds together with other shared claims, up to `maxHolders`.
    Shared,
}

/// Microseconds since the Unix epoch: the unit of a claim's place in its queue.
pub type Micros = i64;

/// A claim's place among the claims of one priority: when it arrived (microseconds), then its
/// name. One function, so that the controller's grant order and what people are shown
/// (`turnstile queue`, the POSITION column) are the same order.
///
/// The arrival is `status.arrivedAt`, stamped by the controller when its watch first
/// delivered the claim (the order the API server committed the creations). A claim the
/// controller never saw arrive (created while no controller ran, or seen first in a re-list)
/// has none: it counts from its `creationTimestamp`, which the API stores in whole seconds,
/// and ties within that second go by name.
pub fn arrival_key(
    arrived_at: Option<&MicroTime>,
    created: Option<&Time>,
    name: &str,
) -> (Micros, String) {
    (arrival_micros(arrived_at, created), name.to_owned())
}

/// A claim's place in its lock's queue: higher priority first, then arrival
/// ([`arrival_micros`]), then name. The controller grants in this order, and `turnstile queue`
/// and the POSITION column show it: one rule, here.
pub type QueuePlace<'a> = (Reverse<i32>, Micros, &'a str);

/// The [`QueuePlace`] of a claim of `priority` (`spec.priority`; 0 when unset, clamped into
/// the accepted range), arrived at `arrived_at` (else counted from `created`), named `name`.
pub fn queue_place<'a>(
    priority: Option<i32>,
    arrived_at: Option<&MicroTime>,
    created: Option<&Time>,
    name: &'a str,
) -> QueuePlace<'a> {
    let priority = priority.unwrap_or(0).clamp(-MAX_PRIORITY, MAX_PRIORITY);
    (Reverse(priority), arrival_micros(arrived_at, created), name)
}

/// Who holds (or will hold) a claim's grant: `spec.holderIdentity`, else `owner_name`, else
/// the claim's `name`.
pub fn holder_identity(spec: &LockClaimSpec, owner_name: Option<String>, name: &str) -> String {
    spec.holder_identity
        .clone()
        .filter(|identity| !identity.is_empty())
        .or(owner_name)
        .unwrap_or_else(|| name.to_owned())
}

/// The time part of [`arrival_key`]: `arrived_at`, else `created` (whole seconds), else 0.
pub fn arrival_micros(arrived_at: Option<&MicroTime>, created: Option<&Time>) -> Micros {
    arrived_at
        .map(|at| at.0.as_microsecond())
        .or_else(|| created.map(|at| at.0.as_second().saturating_mul(1_000_000)))
        .unwrap_or(0)
}

impl LockClaim {
    /// The claim with the controller's finalizer (`turnstile.dev/release`) set from its
    /// creation, as Turnstile's own clients create claims. The controller adds it before a
    /// claim's first grant (so that a claim deleted at any moment has its grant released
    /// first); present from the start, that write is not on the way to `Held`, and a grant
    /// takes one controller write (the claim's status). The controller removes it when it
    /// is done with the claim, as for any claim.
    pub fn with_release_finalizer(mut self) -> Self {
        let finalizers = self.metadata.finalizers.get_or_insert_with(Vec::new);
        if !finalizers.iter().any(|finalizer| finalizer == FINALIZER) {
            finalizers.push(FINALIZER.to_owned());
        }
        self
    }

    /// The claim's place in its lock's queue ([`queue_place`]).
    pub fn queue_place(&self) -> QueuePlace<'_> {
        queue_place(
            self.spec.priority,
            self.status
                .as_ref()
                .and_then(|status| status.arrived_at.as_ref()),
            self.creation_timestamp().as_ref(),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }

    /// Who holds (or will hold) the claim's grant: `spec.holderIdentity`, else the name of
    /// its owner (the controlling owner reference, else the first), else the claim's name.
    pub fn holder_identity(&self) -> String {
        holder_identity(&self.spec, self.owner_name(), &self.name_any())
    }

    /// The claim's fencing token on `lock`: a claim on several locks has one per lock
    /// (`status.locks`), `status.fencingToken` being its first lock's.
    pub fn fencing_token_on(&self, lock: &str) -> Option<i64> {
        let status = self.status.as_ref()?;
        if self.spec.is_multi_lock() {
            status
                .locks
                .iter()
                .find(|entry| entry.lock_name == lock)
                .map(|entry| entry.fencing_token)
        } else {
            status.fencing_token
        }
    }

    /// The name of the claim's owner: the controlling owner reference, else the first.
    pub fn owner_name(&self) -> Option<String> {
        let owners = self.owner_references();
        owners
            .iter()
            .find(|owner| owner.controller == Some(true))
            .or_else(|| owners.first())
            .map(|owner| owner.name.clone())
    }

    /// The claim's place among the claims of one priority ([`arrival_key`]; 0 and "" where
    /// unset, as on a claim not yet stored).
    pub fn arrival(&self) -> (Micros, String) {
        arrival_key(
            self.status
                .as_ref()
                .and_then(|status| status.arrived_at.as_ref()),
            self.creation_timestamp().as_ref(),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }
}

impl LockClaimSpec {
    /// A claim on `lock` with every option left to its default.
    pub fn for_lock(lock: impl Into<String>) -> Self {
        Self {
            lock_name: lock.into(),
            lock_names: None,
            holder_identity: None,
            lease_duration_seconds: None,
            acquire_timeout_seconds: None,
            renew_time: None,
            release: None,
            priority: None,
            mode: None,
            when_busy: None,
            group: None,
            lock_kind: None,
        }
    }

    /// A claim on the `ClusterDistributedLock` `lock`, every option left to its default.
    pub fn for_cluster_lock(lock: impl Into<String>) -> Self {
        Self {
            lock_kind: Some(LockKind::ClusterDistributedLock),
            ..Self::for_lock(lock)
        }
    }

    /// Whether the claim names a `ClusterDistributedLock` (`lockKind`).
    pub fn claims_cluster_lock(&self) -> bool {
        self.lock_kind == Some(LockKind::ClusterDistributedLock)
    }

    /// A claim on all of `locks` at once, every option left to its default.
    pub fn for_locks<I, S>(locks: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            lock_name: String::new(),
            lock_names: Some(locks.into_iter().map(Into::into).collect()),
            ..Self::for_lock("")
        }
    }

    /// The locks this claim asks for, in name order without repeats: `lockNames`, else
    /// `lockName`. The first is the one whose reconciler grants the claim (see the
    /// controller's `multi_lock`).
    pub fn locks(&self) -> Vec<&str> {
        let mut locks: Vec<&str> = match &self.lock_names {
            Some(names) => names.iter().map(String::as_str).collect(),
            None => vec![self.lock_name.as_str()],
        };
        locks.sort_unstable();
        locks.dedup();
        locks
    }

    /// Whether the claim names several locks (`lockNames`).
    pub fn is_multi_lock(&self) -> bool {
        self.lock_names.is_some()
    }
}

/// The lifecycle phase of a claim. `Released`, `Expired` and `Failed` are terminal.
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default, schemars::JsonSchema,
)]
pub enum ClaimPhase {
    /// Waiting in the queue (or for its lock to exist).
    #[default]
    Pending,
    /// Granted: the holder may act, fenced by `status.fencingToken`.
    Held,
    /// Released on request (`spec.release`) or because its owner finished.
    Released,
    /// The lease ran out without renewal; the lock went on to the next claim.
    Expired,
    /// Never granted: the acquire timeout passed, or the claim is invalid.
    Failed,
}

impl ClaimPhase {
    /// Whether the phase is final: a terminal claim never changes phase again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ClaimPhase::Released | ClaimPhase::Expired | ClaimPhase::Failed
        )
    }

    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimPhase::Pending => "Pending",
            ClaimPhase::Held => "Held",
            ClaimPhase::Released => "Released",
            ClaimPhase::Expired => "Expired",
            ClaimPhase::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for ClaimPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The observed state of a `LockClaim`, written by the controller.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockClaimStatus {
    /// Pending, Held, Released, Expired or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClaimPhase>,
    /// 1-based place in the queue while Pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<i32>,
    /// Who holds (or will hold) the grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_identity: Option<String>,
    /// Set when granted: strictly greater than every earlier grant of the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    /// When the lock was granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<Time>,
    /// When the grant lapses unless renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// When the grant ended (released, expired or lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
    /// Why the claim is in this phase, in one CamelCase word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why the claim is in this phase, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `Held`: True exactly when the phase is `Held`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// A claim on several locks (`spec.lockNames`): each lock's grant, in name order, with
    /// its own fencing token (`fencingToken` above is the first lock's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locks: Vec<ClaimedLock>,
    /// When the controller first saw the claim arrive (microseconds; its place in the queue
    /// after priority). Written with the claim's first status; absent on a claim the
    /// controller never saw arrive, which then queues by `creationTimestamp` and name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrived_at: Option<MicroTime>,
}

/// One lock's grant to a claim on several locks (`status.locks[]`).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedLock {
    /// The lock.
    pub lock_name: String,
    /// The grant's fencing token on this lock: strictly greater than every earlier grant of
    /// the lock, whichever claim held it.
    pub fencing_token: i64,
    /// When the grant lapses unless renewed (the same for all the claim's locks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
}
