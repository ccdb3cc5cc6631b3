//! The contract's vocabulary: every reason, Event reason, condition type, annotation,
//! finalizer and limit a user can see, one constant each.
//!
//! The controller's core writes these, the CLI reads them and the CRD schema's bounds use the
//! limits, so scripts that match on a reason and the schema that rejects a value agree with the
//! code by construction.

/// Reasons (one CamelCase word) the controller writes into claim statuses and conditions.
pub mod reasons {
    /// Waiting in the queue.
    pub const QUEUED: &str = "Queued";
    /// The backend refused a grant although a slot looked free (someone outside the API
    /// holds the key); or a claim with `whenBusy: Fail` found the lock busy.
    pub const LOCK_BUSY: &str = "LockBusy";
    /// A newer claim of the same `group` with `whenBusy: ReplacePending` or
    /// `CancelInProgress` replaced this one.
    pub const SUPERSEDED: &str = "Superseded";
    /// Granted.
    pub const ACQUIRED: &str = "Acquired";
    /// `spec.release` was set while held.
    pub const RELEASE_REQUESTED: &str = "ReleaseRequested";
    /// `spec.release` was set before the claim was granted.
    pub const WITHDRAWN: &str = "Withdrawn";
    /// The lease ran out without renewal.
    pub const LEASE_EXPIRED: &str = "LeaseExpired";
    /// The grant reached the lock's `maxHoldSeconds`, renewed or not.
    pub const MAX_HOLD_EXCEEDED: &str = "MaxHoldExceeded";
    /// The claim's owning Pod or Job finished.
    pub const OWNER_FINISHED: &str = "OwnerFinished";
    /// The claim's owning Pod or Job no longer exists.
    pub const OWNER_GONE: &str = "OwnerGone";
    /// The backend no longer had the grant and it could not be taken back.
    pub const LOCK_LOST: &str = "LockLost";
    /// The lock was deleted while the claim held it.
    pub const LOCK_DELETED: &str = "LockDeleted";
    /// In a lock's `status.history`: the holding claim was deleted (its grant released).
    pub const CLAIM_DELETED: &str = "ClaimDeleted";
    /// An administrator ended the grant (`turnstile release`, which sets
    /// [`FORCE_RELEASE_ANNOTATION`](super::FORCE_RELEASE_ANNOTATION)); also the reason of the
    /// Warning Event on the lock that says who and why.
    pub const FORCE_RELEASED: &str = "ForceReleased";
    /// The lock does not exist (yet).
    pub const LOCK_NOT_FOUND: &str = "LockNotFound";
    /// The claim names a `ClusterDistributedLock` whose `namespaceSelector` does not select
    /// the claim's namespace.
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
    /// `acquireTimeoutSeconds` passed before the claim was granted.
    pub const ACQUIRE_TIMEOUT: &str = "AcquireTimeout";
    /// The claim's spec is out of bounds.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The lock's spec is out of bounds (on claims waiting for it).
    pub const INVALID_LOCK_SPEC: &str = "InvalidLockSpec";
    /// The lock's backend has no connection configured on the controller.
    pub const BACKEND_NOT_CONFIGURED: &str = "BackendNotConfigured";
    /// The lock's backend did not answer.
    pub const BACKEND_UNAVAILABLE: &str = "BackendUnavailable";
    /// The lock is served.
    pub const BACKEND_READY: &str = "BackendReady";
}

/// Event reasons on claims.
pub mod event_reasons {
    /// Joined the queue.
    pub const QUEUED: &str = "Queued";
    /// Granted.
    pub const ACQUIRED: &str = "Acquired";
    /// Lease extended.
    pub const RENEWED: &str = "Renewed";
    /// Released (on request, on deletion).
    pub const RELEASED: &str = "Released";
    /// The holder lost the lock (expired, lost by the backend, lock deleted).
    pub const LOCK_LOST: &str = "LockLost";
    /// Never granted (timeout, invalid spec).
    pub const FAILED: &str = "Failed";
    /// Waiting for a lock that does not exist (a Warning, once per wait).
    pub const LOCK_NOT_FOUND: &str = "LockNotFound";
    /// Waiting for a `ClusterDistributedLock` that does not take claims from the claim's
    /// namespace (a Warning, once per wait).
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
}

/// Event reasons on objects the controller cannot read.
pub mod object_event_reasons {
    /// The stored object does not match the controller's schema (a field of the wrong type,
    /// e.g. across a CRD upgrade): it is skipped until fixed.
    pub const INVALID_OBJECT: &str = "InvalidObject";
}

/// Event reasons on gated workloads: suspended Jobs with the annotation
/// [`LOCK_ANNOTATION`], Pods with that label and scheduling gate.
pub mod gate_event_reasons {
    /// The workload's claim is queued: it stays held back.
    pub const WAITING_FOR_LOCK: &str = "WaitingForLock";
    /// Another controller's scheduling gate is on the Pod too: its claim is made once those
    /// gates are gone.
    pub const WAITING_FOR_GATES: &str = "WaitingForGates";
    /// The workload's claim is held: it is let go (un-suspended, or its gate removed).
    pub const LOCK_HELD: &str = "LockHeld";
    /// The workload cannot be gated (its claim failed, belongs to another, ...): it stays
    /// held back, and the Event says why (Warning).
    pub const GATE_BLOCKED: &str = "GateBlocked";
}

/// The condition type on a claim's status: `True` exactly while the phase is `Held`.
pub const HELD_CONDITION: &str = "Held";
/// The condition type on a lock's status saying whether the controller can serve it.
pub const READY_CONDITION: &str = "Ready";

/// The finalizer the controller puts on claims (so the backend release happens before a claim
/// goes away) and on locks (so holders learn that their lock was deleted).
pub const FINALIZER: &str = "turnstile.dev/release";
/// The annotation that marks a suspended Job as gated by a lock (its value: the lock's name).
pub const LOCK_ANNOTATION: &str = "turnstile.dev/lock";
/// The label that marks a Pod as gated by a lock (its value: the lock's name), so that the
/// controller watches only such Pods.
pub const LOCK_LABEL: &str = "turnstile.dev/lock";
/// The scheduling gate (`spec.schedulingGates[].name`) the controller removes from a Pod
/// marked with [`LOCK_LABEL`] once the Pod's claim is held.
pub const SCHEDULING_GATE: &str = "turnstile.dev/lock";
/// The annotation that makes a gated Job's or Pod's claim one claim on several locks at once
/// (its value: the locks' names, comma-separated; the marking lock need not be among them).
pub const LOCKS_ANNOTATION: &str = "turnstile.dev/locks";
/// On a gated Job or Pod: `ClusterDistributedLock` when its lock (`turnstile.dev/lock`) is a
/// cluster lock; omitted or `DistributedLock`: a lock of its namespace.
pub const LOCK_KIND_ANNOTATION: &str = "turnstile.dev/lock-kind";
/// On a gated Job or Pod: its claim's `spec.whenBusy` (`Wait`, `Fail`, `ReplacePending`,
/// `CancelInProgress`).
pub const WHEN_BUSY_ANNOTATION: &str = "turnstile.dev/when-busy";
/// On a gated Job or Pod: its claim's `spec.group` (the concurrency group a replacing
/// `turnstile.dev/when-busy` replaces within).
pub const GROUP_ANNOTATION: &str = "turnstile.dev/group";
/// The annotation where the controller writes the fencing token of a gated workload's claim.
pub const TOKEN_ANNOTATION: &str = "turnstile.dev/fencing-token";
/// The annotation that ends a held claim's grant now (its value: why, in words); written by
/// `turnstile release`. Whoever may patch LockClaims may set it, as whoever may delete them
/// may end a grant by deleting; the API server's audit log says who did.
pub const FORCE_RELEASE_ANNOTATION: &str = "turnstile.dev/force-release";
/// Beside [`FORCE_RELEASE_ANNOTATION`]: who asked, as `turnstile release` learned it from the
/// API server (`SelfSubjectReview`); shown in the Events.
pub const FORCE_RELEASED_BY_ANNOTATION: &str = "turnstile.dev/force-released-by";

/// The widest semaphore (`maxHolders`): the schema's bound and the controller's check. The
/// lock engine's limit (`turnstile_lock::MAX_HOLDERS`) is the same value, which the controller,
/// depending on both, asserts at compile time.
pub const MAX_HOLDERS: i32 = 10_000;
/// The lease of each grant when neither the lock nor the claim says otherwise, in seconds.
pub const DEFAULT_LEASE_DURATION_SECONDS: i64 = 30;
/// The longest lease the schema accepts (one day), in seconds.
pub const MAX_LEASE_DURATION_SECONDS: i64 = 86_400;
/// The longest acquire timeout the schema accepts (one year), in seconds.
pub const MAX_ACQUIRE_TIMEOUT_SECONDS: i64 = 31_536_000;
/// The longest `maxHoldSeconds` the schema accepts (one year), in seconds.
pub const MAX_HOLD_SECONDS: i64 = 31_536_000;
/// The longest `lockDelaySeconds` the schema accepts (one day), in seconds.
pub const MAX_LOCK_DELAY_SECONDS: i64 = 86_400;
/// How long a waiting claim may be passed on a `queue: FirstRunnable` lock when
/// `maxOvertakeSeconds` is not set, in seconds.
pub const DEFAULT_MAX_OVERTAKE_SECONDS: i64 = 300;
/// The longest `maxOvertakeSeconds` the schema accepts (one day), in seconds.
pub const MAX_OVERTAKE_SECONDS: i64 = 86_400;
/// The annotation on a claim naming the workload's span (a W3C `traceparent`): the claim's
/// wait and hold spans become its children (`turnstile run --otlp-endpoint`).
pub const TRACEPARENT_ANNOTATION: &str = "turnstile.dev/traceparent";
/// The label on a lock made from a `LockTemplate`: the template's name.
pub const TEMPLATE_LABEL: &str = "turnstile.dev/template";
/// The annotation on a lock made from a `LockTemplate` with `deleteAfterUnusedSeconds`: the
/// controller deletes the lock once it has had no claim for this many seconds.
pub const UNUSED_LOCK_SECONDS_ANNOTATION: &str = "turnstile.dev/delete-after-unused-seconds";
/// The longest `deleteAfterUnusedSeconds` the schema accepts (one year), in seconds.
pub const MAX_UNUSED_LOCK_SECONDS: i64 = 31_536_000;
/// The bound of a claim's `priority`, either way (higher is served first).
pub const MAX_PRIORITY: i32 = 1_000_000;
/// The most locks one claim may name in `lockNames` (each grant costs a backend call per lock).
pub const MAX_LOCKS_PER_CLAIM: usize = 8;
