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

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_api::reasons;

    fn ended(phase: Option<ClaimPhase>, reason: Option<&str>) -> Option<GrantEnd> {
        GrantEnd::of(&LockClaimStatus {
            phase,
            reason: reason.map(str::to_owned),
            ..LockClaimStatus::default()
        })
    }

    /// The metrics count releases and expiries (and their kinds) by this reading of the
    /// status a grant ends with.
    #[test]
    fn a_grant_ends_as_its_new_status_says() {
        assert_eq!(
            ended(Some(ClaimPhase::Released), None),
            Some(GrantEnd::Released)
        );
        assert_eq!(
            ended(Some(ClaimPhase::Expired), None),
            Some(GrantEnd::Expired)
        );
        for (reason, end) in [
            (reasons::LOCK_LOST, GrantEnd::BackendLost),
            (reasons::LOCK_DELETED, GrantEnd::LockDeleted),
            (reasons::SUPERSEDED, GrantEnd::Superseded),
            (reasons::FORCE_RELEASED, GrantEnd::ForceReleased),
        ] {
            assert_eq!(
                ended(Some(ClaimPhase::Expired), Some(reason)),
                Some(end),
                "{reason}"
            );
        }
        for running in [
            None,
            Some(ClaimPhase::Pending),
            Some(ClaimPhase::Held),
            Some(ClaimPhase::Failed),
        ] {
            assert_eq!(ended(running, None), None, "{running:?}");
        }
    }

    fn nothing() -> Decision {
        Decision {
            claims: Vec::new(),
            lock_status: None,
            add_lock_finalizer: false,
            remove_lock_finalizer: false,
            events: Vec::new(),
            observations: vec![Observation::Renewed],
            requeue_after: Duration::from_secs(1),
            backend_failure: None,
            refreshed_positions: false,
        }
    }

    /// Events and observations are not API object writes; each kind of write alone is one.
    #[test]
    fn a_decision_writes_when_one_object_changes_and_only_then() {
        let claim = |status: Option<LockClaimStatus>, finalizer| ClaimChange {
            name: "a".to_owned(),
            status,
            finalizer,
        };
        assert!(!nothing().writes_anything());
        let kept = Decision {
            claims: vec![claim(None, FinalizerChange::Keep)],
            ..nothing()
        };
        assert!(!kept.writes_anything());
        let writes = [
            Decision {
                lock_status: Some(DistributedLockStatus::default()),
                ..nothing()
            },
            Decision {
                add_lock_finalizer: true,
                ..nothing()
            },
            Decision {
                remove_lock_finalizer: true,
                ..nothing()
            },
            Decision {
                claims: vec![claim(
                    Some(LockClaimStatus::default()),
                    FinalizerChange::Keep,
                )],
                ..nothing()
            },
            Decision {
                claims: vec![claim(None, FinalizerChange::Remove)],
                ..nothing()
            },
        ];
        for decision in writes {
            assert!(decision.writes_anything(), "{decision:?}");
        }
    }
}
