//! What a pass decides ([`Decision`]): the writes to the claims and the lock, the Events to
//! publish, the facts for the metrics and when to look again. [`super::fold`] makes it; the
//! shell carries it out.

use std::time::Duration;

use turnstile_api::{reasons, ClaimPhase, DistributedLockStatus, LockClaimStatus};

/// What happens to a claim's finalizer after its status is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalizerChange {
    /// Leave the finalizers as they are.
    Keep,
    /// Remove the controller's finalizer (the backend release is done or not needed).
    Remove,
}

/// A write to one claim.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimChange {
    /// The claim's name.
    pub name: String,
    /// The new status, when it differs from the current one.
    pub status: Option<LockClaimStatus>,
    /// What happens to the finalizer afterwards.
    pub finalizer: FinalizerChange,
}

/// Severity of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSeverity {
    /// Routine transition.
    Normal,
    /// Something the user should look at.
    Warning,
}

/// The object an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventSubject {
    /// The lock.
    Lock,
    /// The lock, told because the named claim's status changed: it goes out with that
    /// status, even when a later write of the pass fails (it would never be planned again).
    LockFor(String),
    /// The named claim.
    Claim(String),
}

/// An Event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    /// What it is about.
    pub subject: EventSubject,
    /// Normal or Warning.
    pub severity: EventSeverity,
    /// `Queued`, `Acquired`, `Renewed`, `Released`, `LockLost`, `Failed`, or a `Ready` reason.
    pub reason: &'static str,
    /// For people.
    pub note: String,
}

/// A fact for the metrics.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// A claim was granted after waiting this long.
    Granted {
        /// From creation to grant.
        waited: Duration,
    },
    /// A lease was renewed.
    Renewed,
    /// A grant ended after being held this long.
    GrantEnded {
        /// How it ended.
        end: GrantEnd,
        /// From grant to end.
        held_for: Duration,
    },
    /// A claim failed without being granted.
    Failed,
}

/// How a grant ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantEnd {
    /// Released: on request, or the claim was deleted.
    Released,
    /// The lease ran out without renewal.
    Expired,
    /// The backend lost the grant and it could not be taken back.
    BackendLost,
    /// The lock was deleted.
    LockDeleted,
    /// A newer claim of its group cancelled it (`whenBusy: CancelInProgress`).
    Superseded,
    /// An administrator ended it (`turnstile release`).
    ForceReleased,
}

impl GrantEnd {
    /// How the grant that `status` records ended (`None` while it runs, or never granted).
    pub(crate) fn of(status: &LockClaimStatus) -> Option<Self> {
        match status.phase? {
            ClaimPhase::Released => Some(GrantEnd::Released),
            ClaimPhase::Expired => Some(match status.reason.as_deref() {
                Some(reasons::LOCK_LOST) => GrantEnd::BackendLost,
                Some(reasons::LOCK_DELETED) => GrantEnd::LockDeleted,
                Some(reasons::SUPERSEDED) => GrantEnd::Superseded,
                Some(reasons::FORCE_RELEASED) => GrantEnd::ForceReleased,
                _ => GrantEnd::Expired,
            }),
            _ => None,
        }
    }
}

/// Step two's result: what to write, publish and when to come back.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Claim writes, in the order they must happen: claims leaving `Held` first, so that
    /// the API never shows more than `maxHolders` held claims even if a later write fails;
    /// then new grants by fencing token, so that grants are announced in token order (a
    /// grant the backend made in an earlier pass, re-used now, may carry a smaller token than
    /// one made in this pass); then the rest.
    pub claims: Vec<ClaimChange>,
    /// The lock's new status, when it differs from the current one.
    pub lock_status: Option<DistributedLockStatus>,
    /// Add the controller's finalizer to the lock.
    pub add_lock_finalizer: bool,
    /// Remove the controller's finalizer from the lock (it is being deleted, grants ended).
    pub remove_lock_finalizer: bool,
    /// Events to publish after the writes.
    pub events: Vec<PlannedEvent>,
    /// Facts for the metrics.
    pub observations: Vec<Observation>,
    /// When to look again at the latest (events may come sooner).
    pub requeue_after: Duration,
    /// The backend failed (before or during the pass): retry with backoff.
    pub backend_failure: Option<String>,
    /// The decision brings waiters' positions up to date (the shell counts it against the
    /// controller's budget for refreshes).
    pub refreshed_positions: bool,
}

impl Decision {
    /// Whether the decision writes anything to the API.
    pub fn writes_anything(&self) -> bool {
        self.lock_status.is_some()
            || self.add_lock_finalizer
            || self.remove_lock_finalizer
            || self
                .claims
                .iter()
                .any(|c| c.status.is_some() || c.finalizer == FinalizerChange::Remove)
    }
}
