//! The claim statuses a pass writes, built in one place so that the same facts always give
//! the same status: pending (queued, or waiting with a reason), held (with its grant on every
//! lock), terminal; and the conditions they carry.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use turnstile_api::{ClaimPhase, ClaimedLock, LockClaimStatus, HELD_CONDITION};

use super::model::{time_at, ClaimView, Seconds};

/// A condition's `status` for `ready`.
pub(super) fn conditions_status(ready: bool) -> &'static str {
    if ready {
        "True"
    } else {
        "False"
    }
}

// The statuses a fold writes, built here so that the same facts always give the same status
// (the second pass over unchanged state must write nothing).

/// Sets condition `type_` in `conditions` (keeping the others), moving `lastTransitionTime`
/// only when the condition's status flips.
pub(super) fn set_condition(
    conditions: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Seconds,
) -> Vec<Condition> {
    let status = conditions_status(status);
    let mut out: Vec<Condition> = conditions.to_vec();
    let transition = conditions
        .iter()
        .find(|condition| condition.type_ == type_)
        .filter(|condition| condition.status == status)
        .map(|condition| condition.last_transition_time.clone())
        .unwrap_or_else(|| time_at(now));
    let condition = Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: transition,
        observed_generation: generation,
    };
    match out.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => *existing = condition,
        None => out.push(condition),
    }
    out
}

/// A claim's status in `phase` with the fields every phase shares filled in: `reason`,
/// `message`, the `Held` condition, `observedGeneration` and `arrivedAt`.
fn with_common(
    claim: &ClaimView,
    mut status: LockClaimStatus,
    reason: &str,
    message: String,
    now: Seconds,
) -> LockClaimStatus {
    let held = status.phase == Some(ClaimPhase::Held);
    status.conditions = set_condition(
        &claim.status.conditions,
        HELD_CONDITION,
        held,
        reason,
        &message,
        claim.generation,
        now,
    );
    status.reason = Some(reason.to_owned());
    status.message = Some(message);
    status.observed_generation = claim.generation;
    // The claim's place in the queue, kept for good once written.
    status.arrived_at = claim.status.arrived_at.clone();
    status
}

/// Waiting in the queue (`position` is `None` when there is no queue: the lock is missing).
pub(super) fn pending_status(
    claim: &ClaimView,
    position: Option<i32>,
    reason: &str,
    message: String,
    now: Seconds,
) -> LockClaimStatus {
    let status = LockClaimStatus {
        phase: Some(ClaimPhase::Pending),
        position,
        holder_identity: Some(claim.holder_identity()),
        ..LockClaimStatus::default()
    };
    with_common(claim, status, reason, message, now)
}

/// Holding the lock.
pub(super) fn held_status(
    claim: &ClaimView,
    holder_identity: String,
    fencing_token: u64,
    acquired_at: Seconds,
    expires_at: Seconds,
    message: String,
    now: Seconds,
) -> LockClaimStatus {
    let status = LockClaimStatus {
        phase: Some(ClaimPhase::Held),
        holder_identity: Some(holder_identity),
        fencing_token: i64::try_from(fencing_token).ok(),
        acquired_at: Some(time_at(acquired_at)),
        expires_at: Some(time_at(expires_at)),
        locks: lock_grants(claim, fencing_token, expires_at),
        ..LockClaimStatus::default()
    };
    with_common(
        claim,
        status,
        turnstile_api::reasons::ACQUIRED,
        message,
        now,
    )
}

/// `status.locks` of a claim on several locks held until `expires_at`: its first lock's grant
/// (`fencing_token`) and each other lock's, as the pass found or made them (empty for a claim
/// on one lock).
fn lock_grants(claim: &ClaimView, fencing_token: u64, expires_at: Seconds) -> Vec<ClaimedLock> {
    if !claim.is_multi_lock() {
        return Vec::new();
    }
    let first = (claim.first_lock(), Some(fencing_token));
    let others = claim
        .members
        .iter()
        .map(|member| (member.name.as_str(), member.fencing_token));
    std::iter::once(first)
        .chain(others)
        .filter_map(|(lock, token)| {
            Some(ClaimedLock {
                lock_name: lock.to_owned(),
                fencing_token: i64::try_from(token?).ok()?,
                expires_at: Some(time_at(expires_at)),
            })
        })
        .collect()
}

/// Ended in a terminal phase: the grant's record (holder, token, acquiredAt) stays, the
/// queue position and the lease expiry go.
pub(super) fn terminal_status(
    claim: &ClaimView,
    phase: ClaimPhase,
    reason: &str,
    message: String,
    released_at: Option<Seconds>,
    now: Seconds,
) -> LockClaimStatus {
    let old = &claim.status;
    let status = LockClaimStatus {
        phase: Some(phase),
        position: None,
        holder_identity: old
            .holder_identity
            .clone()
            .or_else(|| Some(claim.holder_identity())),
        fencing_token: old.fencing_token,
        acquired_at: old.acquired_at.clone(),
        expires_at: None,
        released_at: released_at.map(time_at),
        // Each lock's token stays on record; no lease runs any more.
        locks: old
            .locks
            .iter()
            .map(|entry| ClaimedLock {
                expires_at: None,
                ..entry.clone()
            })
            .collect(),
        ..LockClaimStatus::default()
    };
    with_common(claim, status, reason, message, now)
}
