//! Claims whose lock does not exist (not yet created, or deleted): they wait with a reason,
//! time out, and lose a grant the deleted lock had given them.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use turnstile_api::{event_reasons, reasons};

use super::decision::{EventSeverity, EventSubject, PlannedEvent};
use super::fold::RESYNC_INTERVAL;
use super::model::ClaimView;
use super::status::{pending_status, terminal_status};
use turnstile_api::{ClaimPhase, LockClaimStatus};

/// What to do with a claim whose lock is missing.
#[derive(Debug, Clone, PartialEq)]
pub struct OrphanDecision {
    /// The new status, when it differs from the current one.
    pub status: Option<LockClaimStatus>,
    /// Remove the controller's finalizer (nothing left to release: without the lock there is
    /// no backend to ask, and a grant's backend lease runs out on its own).
    pub remove_finalizer: bool,
    /// Events to publish after the write.
    pub events: Vec<PlannedEvent>,
    /// When to look again at the latest.
    pub requeue_after: Duration,
}

/// The message of a waiter whose lock does not exist. The same whether the lock's own pass
/// says it (the lock is being deleted) or this one (it is gone): the waiter's status is then
/// written once, not again when the lock has gone (a namespace torn down with its claims).
pub(super) fn lock_not_found(lock: &str) -> String {
    format!("DistributedLock {lock} does not exist")
}

/// Why no lock's pass decides about a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unserved {
    /// The lock does not exist.
    LockMissing,
    /// The `ClusterDistributedLock` does not take claims from the claim's namespace; why, for
    /// people.
    NamespaceNotAllowed(String),
}

impl Unserved {
    /// The reason of the claim's status and of its Warning Event while it waits.
    fn reason(&self) -> &'static str {
        match self {
            Self::LockMissing => reasons::LOCK_NOT_FOUND,
            Self::NamespaceNotAllowed(_) => reasons::NAMESPACE_NOT_ALLOWED,
        }
    }

    /// Why the claim waits, for people.
    fn message(&self, claim: &ClaimView) -> String {
        let lock = claim.first_lock();
        match self {
            Self::LockMissing if claim.spec.claims_cluster_lock() => {
                format!("ClusterDistributedLock {lock} does not exist")
            }
            Self::LockMissing => lock_not_found(lock),
            Self::NamespaceNotAllowed(why) => why.clone(),
        }
    }
}

/// Decides (pure) for a claim whose lock does not exist, at time `now`.
pub fn decide_orphan(claim: &ClaimView, now: Timestamp) -> OrphanDecision {
    decide_unserved(claim, &Unserved::LockMissing, now)
}

/// Decides (pure) for a claim no lock's pass decides about (`why`), at time `now`: it waits
/// with the reason, times out, or loses a grant the lock no longer backs.
pub fn decide_unserved(claim: &ClaimView, why: &Unserved, now: Timestamp) -> OrphanDecision {
    let phase = claim.phase();
    let (new_status, requeue_after) = unserved_status(claim, why, now);
    let status = new_status.filter(|status| *status != claim.status);
    let events = status
        .as_ref()
        .and_then(|status| unserved_event(claim, why, phase, status))
        .into_iter()
        .collect();
    let ends = claim.deleting
        || phase.is_terminal()
        || status
            .as_ref()
            .is_some_and(|s| s.phase.is_some_and(ClaimPhase::is_terminal));
    OrphanDecision {
        status,
        remove_finalizer: claim.has_finalizer && ends,
        events,
        requeue_after,
    }
}

/// The status of a claim no lock serves (None: it stays as it is), and when to look again.
fn unserved_status(
    claim: &ClaimView,
    why: &Unserved,
    now: Timestamp,
) -> (Option<LockClaimStatus>, Duration) {
    let now_s = now.as_second();
    let phase = claim.phase();
    let mut requeue_after = RESYNC_INTERVAL;
    let lock = claim.first_lock();
    let new_status = if claim.deleting || phase.is_terminal() {
        None
    } else if phase == ClaimPhase::Held {
        Some(terminal_status(
            claim,
            ClaimPhase::Expired,
            reasons::LOCK_DELETED,
            format!("lock {lock} was deleted"),
            Some(now_s),
            now_s,
        ))
    } else if let Some(problem) = claim.spec_problem() {
        Some(terminal_status(
            claim,
            ClaimPhase::Failed,
            reasons::INVALID_SPEC,
            problem,
            None,
            now_s,
        ))
    } else if claim.release_requested() {
        Some(terminal_status(
            claim,
            ClaimPhase::Released,
            reasons::WITHDRAWN,
            "withdrawn (spec.release) before it was granted".to_owned(),
            None,
            now_s,
        ))
    } else if claim
        .acquire_deadline()
        .is_some_and(|deadline| deadline <= now_s)
    {
        Some(terminal_status(
            claim,
            ClaimPhase::Failed,
            reasons::ACQUIRE_TIMEOUT,
            format!(
                "not granted within acquireTimeoutSeconds ({}s): {}",
                claim.spec.acquire_timeout_seconds.unwrap_or_default(),
                why.message(claim)
            ),
            None,
            now_s,
        ))
    } else {
        if let Some(deadline) = claim.acquire_deadline() {
            let nanos = i128::from(deadline) * 1_000_000_000 - now.as_nanosecond();
            let wait = Duration::from_nanos(u64::try_from(nanos.max(0)).unwrap_or(u64::MAX));
            requeue_after = requeue_after.min(wait + Duration::from_millis(50));
        }
        Some(pending_status(
            claim,
            None,
            why.reason(),
            why.message(claim),
            now_s,
        ))
    };
    (new_status, requeue_after)
}

/// The Event a claim no lock serves gets for its new `status` (`phase`: the one it had).
fn unserved_event(
    claim: &ClaimView,
    why: &Unserved,
    phase: ClaimPhase,
    status: &LockClaimStatus,
) -> Option<PlannedEvent> {
    let note = status.message.clone().unwrap_or_default();
    let subject = EventSubject::Claim(claim.name.clone());
    match status.phase.unwrap_or_default() {
        ClaimPhase::Expired if phase != ClaimPhase::Expired => Some(PlannedEvent {
            subject,
            severity: EventSeverity::Warning,
            reason: event_reasons::LOCK_LOST,
            note,
        }),
        ClaimPhase::Failed if phase != ClaimPhase::Failed => Some(PlannedEvent {
            subject,
            severity: EventSeverity::Warning,
            reason: event_reasons::FAILED,
            note,
        }),
        ClaimPhase::Released if phase != ClaimPhase::Released => Some(PlannedEvent {
            subject,
            severity: EventSeverity::Normal,
            reason: event_reasons::RELEASED,
            note,
        }),
        // A claim for a lock that does not exist (a typo, another namespace) or does not
        // take it says so where people look, once per wait.
        ClaimPhase::Pending if claim.status.reason.as_deref() != Some(why.reason()) => {
            Some(PlannedEvent {
                subject,
                severity: EventSeverity::Warning,
                reason: match why {
                    Unserved::LockMissing => event_reasons::LOCK_NOT_FOUND,
                    Unserved::NamespaceNotAllowed(_) => event_reasons::NAMESPACE_NOT_ALLOWED,
                },
                note,
            })
        }
        _ => None,
    }
}
