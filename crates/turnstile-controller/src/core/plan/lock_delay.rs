//! The lock-delay: after a grant ends without its holder asking, nobody is granted the lock
//! for `lockDelaySeconds` (the holder may still be at work for a moment).

use turnstile_api::reasons;

use super::Draft;
use crate::core::model::{LockInput, Seconds};
use crate::core::ops::LEASE_CUT;

/// The end of the lock-delay: the one recorded in the lock's status, or `lockDelaySeconds`
/// after a grant this pass ends involuntarily (its lease or maximum hold ran out, its owner
/// vanished), whichever is later. A release, on request or by a finished owner, delays
/// nothing. The delay runs from the end of the lease this pass cuts (rounded up to the
/// second), not from the end the status recorded: that is when the backend's own delay
/// starts, so the backend never refuses the grant the plan makes when the delay is over.
pub(super) fn lock_delay_end(input: &LockInput, drafts: &[(usize, Draft)]) -> Option<Seconds> {
    let delay = input.lock.lock_delay_seconds();
    // The cut lease runs out LEASE_CUT after now; whole seconds, rounded up.
    let cut_lease_end = i64::from(input.now.subsec_nanosecond())
        + i64::try_from(LEASE_CUT.as_nanos()).unwrap_or(i64::MAX);
    let ended_now = input
        .now
        .as_second()
        .saturating_add((cut_lease_end + 999_999_999) / 1_000_000_000);
    let starts_delay = drafts.iter().any(|(_, draft)| {
        matches!(draft, Draft::End { reason, released_at: Some(_), .. }
            if starts_lock_delay(input, reason))
    });
    starts_delay
        .then(|| ended_now.saturating_add(delay))
        .into_iter()
        .chain(input.lock.locked_until())
        .max()
}

/// Whether a grant of this lock ending for `reason` starts a lock-delay.
pub(super) fn starts_lock_delay(input: &LockInput, reason: &str) -> bool {
    input.lock.lock_delay_seconds() > 0 && INVOLUNTARY_ENDS.contains(&reason)
}

/// The reasons a grant ends without its holder asking: they start a lock-delay (a cancelled
/// or force-released holder may still be at work for a moment, like one whose lease ran out).
const INVOLUNTARY_ENDS: [&str; 5] = [
    reasons::LEASE_EXPIRED,
    reasons::MAX_HOLD_EXCEEDED,
    reasons::OWNER_GONE,
    reasons::SUPERSEDED,
    reasons::FORCE_RELEASED,
];
