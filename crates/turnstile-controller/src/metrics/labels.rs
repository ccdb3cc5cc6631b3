//! The label values: closed enums only, so the number of series is bounded by construction
//! (no lock, claim or namespace name ever becomes a label).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use turnstile_api::BackendKind;

/// Why a holder lost its grant (label `cause` of `turnstile_lock_lost_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockLostCause {
    /// The lease ran out without a renewal.
    Expired,
    /// The backend no longer had the grant (restart, data loss, eviction).
    BackendLost,
    /// The DistributedLock was deleted while the claim held it.
    LockDeleted,
    /// A newer claim of its group cancelled it (`whenBusy: CancelInProgress`): asked for, so
    /// the alert on lost locks leaves it out.
    Superseded,
    /// An administrator ended it (`turnstile release`): asked for, so the alert leaves it out.
    ForceReleased,
}

impl LockLostCause {
    /// Every cause, for creating the series up front.
    pub const ALL: [Self; 5] = [
        Self::Expired,
        Self::BackendLost,
        Self::LockDeleted,
        Self::Superseded,
        Self::ForceReleased,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::BackendLost => "backend_lost",
            Self::LockDeleted => "lock_deleted",
            Self::Superseded => "superseded",
            Self::ForceReleased => "force_released",
        }
    }
}

/// The backend call that failed (label `operation` of `turnstile_backend_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendOperation {
    /// Connecting or checking the connection.
    Connect,
    /// A grant attempt.
    Acquire,
    /// A lease extension.
    Extend,
    /// A release.
    Release,
    /// Raising the fencing counter to the lock's high-water mark.
    RaiseFloor,
}

impl BackendOperation {
    /// Every operation, for creating the series up front.
    pub const ALL: [Self; 5] = [
        Self::Connect,
        Self::Acquire,
        Self::Extend,
        Self::Release,
        Self::RaiseFloor,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Acquire => "acquire",
            Self::Extend => "extend",
            Self::Release => "release",
            Self::RaiseFloor => "raise_floor",
        }
    }
}

/// What made a reconciliation fail (label `kind` of `turnstile_reconcile_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReconcileErrorKind {
    /// A Kubernetes API call failed (conflict, network, server error).
    Api,
    /// The lock backend failed.
    Backend,
    /// Anything else.
    Other,
}

impl ReconcileErrorKind {
    /// Every kind, for creating the series up front.
    pub const ALL: [Self; 3] = [Self::Api, Self::Backend, Self::Other];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Backend => "backend",
            Self::Other => "other",
        }
    }
}

/// Which reconciler a pass belongs to (label `controller` of `turnstile_reconcile_total` and
/// `turnstile_reconcile_duration_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControllerKind {
    /// A lock and all its claims.
    Lock,
    /// A claim whose lock does not exist.
    Claim,
    /// A Job gated by `turnstile.dev/lock`.
    Job,
    /// A Pod gated by the `turnstile.dev/lock` label and scheduling gate.
    Pod,
}

impl ControllerKind {
    /// Every controller, for creating the series up front.
    pub const ALL: [Self; 4] = [Self::Lock, Self::Claim, Self::Job, Self::Pod];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Claim => "claim",
            Self::Job => "job",
            Self::Pod => "pod",
        }
    }
}

/// How a pass ended (label `result` of `turnstile_reconcile_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReconcileResult {
    /// The pass did what it decided.
    Ok,
    /// The pass failed and is retried.
    Error,
}

impl ReconcileResult {
    /// Both results, for creating the series up front.
    pub const ALL: [Self; 2] = [Self::Ok, Self::Error];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
        }
    }
}

/// How a grant ended (label `outcome` of `turnstile_hold_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum HoldOutcome {
    Released,
    Expired,
    Lost,
}

impl HoldOutcome {
    pub(super) const ALL: [Self; 3] = [Self::Released, Self::Expired, Self::Lost];

    fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Expired => "expired",
            Self::Lost => "lost",
        }
    }
}

/// The `backend` label: [`BackendKind`] is the API crate's, so the label encoding wraps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct BackendLabel(pub(super) BackendKind);

impl BackendLabel {
    pub(super) const ALL: [Self; 4] = [
        Self(BackendKind::Memory),
        Self(BackendKind::Redis),
        Self(BackendKind::Mongo),
        Self(BackendKind::Etcd),
    ];

    fn as_str(self) -> &'static str {
        self.0.as_str()
    }
}

/// Encodes any of the closed label enums by its `as_str`.
macro_rules! label_value {
    ($($kind:ty),*) => {$(
        impl EncodeLabelValue for $kind {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                EncodeLabelValue::encode(&self.as_str(), encoder)
            }
        }
    )*};
}
label_value!(
    BackendLabel,
    LockLostCause,
    BackendOperation,
    ReconcileErrorKind,
    ControllerKind,
    ReconcileResult,
    HoldOutcome
);

/// Declares label sets: structs whose fields are the labels, named as the fields.
macro_rules! label_sets {
    ($($name:ident { $($label:ident: $kind:ty),+ $(,)? })*) => {$(
        #[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
        pub(super) struct $name {
            $(pub(super) $label: $kind,)+
        }
    )*};
}
label_sets! {
    BackendLabels { backend: BackendLabel }
    LostLabels { backend: BackendLabel, cause: LockLostCause }
    HoldLabels { backend: BackendLabel, outcome: HoldOutcome }
    BackendErrorLabels { backend: BackendLabel, operation: BackendOperation }
    ReconcileErrorLabels { kind: ReconcileErrorKind }
    ControllerLabels { controller: ControllerKind }
    ReconcileLabels { controller: ControllerKind, result: ReconcileResult }
}

impl BackendLabels {
    pub(super) fn of(backend: BackendKind) -> Self {
        Self {
            backend: BackendLabel(backend),
        }
    }
}
