//! The custom resources: `DistributedLock`, `ClusterDistributedLock`, `LockClaim` and
//! `LockTemplate` in `turnstile.dev/v1alpha1`.
//!
//! The names, fields, phases and printer columns here are the user-facing contract (the
//! README's "Status fields" and the generated `crds/`, which `tests/checks/crds.rs` pins): scripts
//! and `kubectl` sessions depend on them, so change them only together with those.

mod claim;
mod cluster_lock;
mod crds;
mod error_chain;
mod lock;
mod template;
pub mod vocabulary;

pub use claim::{
    arrival_key, arrival_micros, holder_identity, queue_place, BusyPolicy, ClaimMode, ClaimPhase,
    ClaimedLock, LockClaim, LockClaimSpec, LockClaimStatus, LockKind, Micros, QueuePlace,
};
pub use cluster_lock::{ClusterDistributedLock, ClusterDistributedLockSpec};
pub use crds::{crd_yaml, crds, crds_yaml, CrdRenderError};
pub use error_chain::error_chain;
pub use lock::{
    holder_summary, BackendKind, DistributedLock, DistributedLockSpec, DistributedLockStatus,
    LockHolder, PastGrant, QueueOrder, HOLDER_SUMMARY_NAMES, LOCK_HISTORY_LEN,
};
pub use template::{
    template_for, unused_lock_deadline, LockTemplate, LockTemplateSpec, MAX_TEMPLATE_NAMES,
};
pub use vocabulary::{
    event_reasons, gate_event_reasons, object_event_reasons, reasons,
    DEFAULT_LEASE_DURATION_SECONDS, DEFAULT_MAX_OVERTAKE_SECONDS, FINALIZER,
    FORCE_RELEASED_BY_ANNOTATION, FORCE_RELEASE_ANNOTATION, GROUP_ANNOTATION, HELD_CONDITION,
    LOCKS_ANNOTATION, LOCK_ANNOTATION, LOCK_KIND_ANNOTATION, LOCK_LABEL,
    MAX_ACQUIRE_TIMEOUT_SECONDS, MAX_HOLDERS, MAX_HOLD_SECONDS, MAX_LEASE_DURATION_SECONDS,
    MAX_LOCKS_PER_CLAIM, MAX_LOCK_DELAY_SECONDS, MAX_OVERTAKE_SECONDS, MAX_PRIORITY,
    MAX_UNUSED_LOCK_SECONDS, READY_CONDITION, SCHEDULING_GATE, TEMPLATE_LABEL, TOKEN_ANNOTATION,
    TRACEPARENT_ANNOTATION, UNUSED_LOCK_SECONDS_ANNOTATION, WHEN_BUSY_ANNOTATION,
};

/// The API group of both custom resources.
pub const GROUP: &str = "turnstile.dev";
/// The API version of both custom resources.
pub const VERSION: &str = "v1alpha1";
/// The category both kinds belong to: `kubectl get locks` lists locks and claims together.
pub const CATEGORY: &str = "locks";
