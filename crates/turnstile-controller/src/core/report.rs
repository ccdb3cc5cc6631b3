//! What a claim's status change reports besides the write: the Events it is announced by and
//! the observations the metrics count (grants, renewals, how grants end).

use std::time::Duration;

use super::decision::{EventSeverity, EventSubject, GrantEnd, Observation, PlannedEvent};
use super::model::{seconds_of, ClaimView, Seconds};
use turnstile_api::{event_reasons, reasons, ClaimPhase, LockClaimStatus};

/// Events for a claim's status change.
pub(super) fn claim_events(
    claim: &ClaimView,
    new: &LockClaimStatus,
    lock_name: &str,
    events: &mut Vec<PlannedEvent>,
) {
    let message = new.message.clone().unwrap_or_default();
    let lost =
        new.phase == Some(ClaimPhase::Expired) && claim.status.phase != Some(ClaimPhase::Expired);
    if lost {
        lost_events(claim, new, message, events);
    } else if let Some((severity, reason, note)) = phase_event(claim, new, lock_name, message) {
        events.push(PlannedEvent {
            subject: EventSubject::Claim(claim.name.clone()),
            severity,
            reason,
            note,
        });
    }
}

/// The one Event a claim's new status says, if any (a grant lost aside: [`lost_events`]).
fn phase_event(
    claim: &ClaimView,
    new: &LockClaimStatus,
    lock_name: &str,
    message: String,
) -> Option<(EventSeverity, &'static str, String)> {
    let old = &claim.status;
    let old_phase = old.phase;
    match new.phase.unwrap_or_default() {
        // A claim on several locks, one of which does not exist: said once per wait, as for
        // a claim whose only lock is missing.
        ClaimPhase::Pending
            if new.reason.as_deref() == Some(reasons::LOCK_NOT_FOUND)
                && old.reason.as_deref() != Some(reasons::LOCK_NOT_FOUND)
                && claim.is_multi_lock() =>
        {
            Some((
                EventSeverity::Warning,
                event_reasons::LOCK_NOT_FOUND,
                message,
            ))
        }
        ClaimPhase::Pending
            if new.position.is_some() && (old.position.is_none() || old_phase.is_none()) =>
        {
            Some((
                EventSeverity::Normal,
                event_reasons::QUEUED,
                format!(
                    "queued for lock {lock_name} at position {}",
                    new.position.unwrap_or_default()
                ),
            ))
        }
        ClaimPhase::Held if old_phase != Some(ClaimPhase::Held) => Some((
            EventSeverity::Normal,
            event_reasons::ACQUIRED,
            format!(
                "acquired lock {lock_name} with fencing token {}",
                new.fencing_token.unwrap_or_default()
            ),
        )),
        ClaimPhase::Held => {
            let old_expiry = old.expires_at.as_ref().map(seconds_of);
            let new_expiry = new.expires_at.as_ref().map(seconds_of);
            (new_expiry > old_expiry).then(|| {
                (
                    EventSeverity::Normal,
                    event_reasons::RENEWED,
                    format!(
                        "lease of lock {lock_name} renewed until {}",
                        new.expires_at
                            .as_ref()
                            .map(|t| t.0.to_string())
                            .unwrap_or_default()
                    ),
                )
            })
        }
        ClaimPhase::Released if old_phase != Some(ClaimPhase::Released) => {
            Some((EventSeverity::Normal, event_reasons::RELEASED, message))
        }
        ClaimPhase::Failed if old_phase != Some(ClaimPhase::Failed) => {
            Some((EventSeverity::Warning, event_reasons::FAILED, message))
        }
        _ => None,
    }
}

/// A grant lost (the claim now `Expired`): a Warning on the claim, and a force-release said
/// on the lock too, so whoever looks at the lock sees who ended whose grant.
fn lost_events(
    claim: &ClaimView,
    new: &LockClaimStatus,
    message: String,
    events: &mut Vec<PlannedEvent>,
) {
    if new.reason.as_deref() == Some(reasons::FORCE_RELEASED) {
        events.push(PlannedEvent {
            subject: EventSubject::LockFor(claim.name.clone()),
            severity: EventSeverity::Warning,
            reason: reasons::FORCE_RELEASED,
            note: format!(
                "{} (claim {}, fencing token {})",
                message,
                claim.name,
                new.fencing_token.unwrap_or_default()
            ),
        });
    }
    events.push(PlannedEvent {
        subject: EventSubject::Claim(claim.name.clone()),
        severity: EventSeverity::Warning,
        reason: event_reasons::LOCK_LOST,
        note: message,
    });
}

/// The metrics' observations of a claim's status change.
pub(super) fn observations_for(
    claim: &ClaimView,
    new: &LockClaimStatus,
    now: Seconds,
    out: &mut Vec<Observation>,
) {
    let old_phase = claim.phase();
    let new_phase = new.phase.unwrap_or_default();
    let seconds = |s: i64| Duration::from_secs(u64::try_from(s.max(0)).unwrap_or(0));
    match (old_phase, new_phase) {
        (ClaimPhase::Held, ClaimPhase::Held) if new.expires_at != claim.status.expires_at => {
            out.push(Observation::Renewed);
        }
        (ClaimPhase::Held, ClaimPhase::Held) => {}
        (_, ClaimPhase::Held) => out.push(Observation::Granted {
            waited: seconds(now - claim.created),
        }),
        (ClaimPhase::Held, _) => {
            if let Some(end) = GrantEnd::of(new) {
                out.push(Observation::GrantEnded {
                    end,
                    held_for: held_for(claim, now),
                });
            }
        }
        (_, ClaimPhase::Failed) if !old_phase.is_terminal() => out.push(Observation::Failed),
        _ => {}
    }
}

/// What a holder's claim deleted (it leaves without a status write) reports once its release
/// is settled: `Released`, and the grant's end for the metrics.
pub(super) fn holder_deleted(
    claim: &ClaimView,
    lock_name: &str,
    now: Seconds,
    events: &mut Vec<PlannedEvent>,
    observations: &mut Vec<Observation>,
) {
    events.push(PlannedEvent {
        subject: EventSubject::Claim(claim.name.clone()),
        severity: EventSeverity::Normal,
        reason: event_reasons::RELEASED,
        note: format!("claim deleted: lock {lock_name} released"),
    });
    observations.push(Observation::GrantEnded {
        end: GrantEnd::Released,
        held_for: held_for(claim, now),
    });
}

/// How long the claim has held its lock at `now`: since its `acquiredAt` (none: zero).
fn held_for(claim: &ClaimView, now: Seconds) -> Duration {
    let acquired = claim
        .status
        .acquired_at
        .as_ref()
        .map(seconds_of)
        .unwrap_or(now);
    Duration::from_secs(u64::try_from(now - acquired).unwrap_or(0))
}
