//! When a grant ends: the lease its status records (or the one the backend's lease implies
//! when a renewal's status write was lost), renewals by `spec.renewTime` or a running owner,
//! the maximum hold, and the backend lease that outlasts the API lease by a grace.

use std::time::Duration;

use super::model::{seconds_of, ClaimView, LockInput, OwnerState, Seconds, BACKEND_LEASE_GRACE};
use super::plan::LockMode;

/// The backend lease for an API lease that runs until `expiry`.
pub(super) fn backend_ttl(input: &LockInput, expiry: Seconds) -> Duration {
    input.until(expiry) + BACKEND_LEASE_GRACE
}

/// Whether the backend holds `claim`'s grant for longer than a lease ending at `expiry` would
/// have given it (`expiry` plus the grace, and a second of rounding): then a pass that saw a
/// later renewal extended it, and this pass's view of the claim is behind (a cache that lags
/// the controller's own writes, a re-list still under way). Ending the grant on that view
/// would cut a lease that was renewed in time, so it waits for a view that has caught up (or
/// for the backend's lease to run out, if that renewal's status never reached the API).
pub(super) fn backend_lease_outlasts(
    input: &LockInput,
    claim: &ClaimView,
    expiry: Seconds,
) -> bool {
    let Some(holder) = input.backend.holder(&claim.owner_token) else {
        return false;
    };
    let overdue = Duration::from_secs(u64::try_from(input.now_seconds() - expiry).unwrap_or(0));
    holder.expires_in + overdue > BACKEND_LEASE_GRACE + Duration::from_secs(1)
}

/// The end of a held claim's lease as its status records it, unless that has passed while the
/// backend still holds the grant longer (see [`backend_lease_outlasts`]): then the end the
/// backend's lease implies. That is a renewal the backend took whose status write was lost (or
/// that this pass's view does not show yet); the status then shows it again, and never a
/// lease that has run out while the grant goes on.
pub(crate) fn recorded_expiry(input: &LockInput, claim: &ClaimView) -> Seconds {
    let now = input.now_seconds();
    let recorded = claim
        .status
        .expires_at
        .as_ref()
        .map(seconds_of)
        .unwrap_or(now);
    if recorded > now || !backend_lease_outlasts(input, claim, recorded) {
        return recorded;
    }
    let Some(lease) = input
        .backend
        .holder(&claim.owner_token)
        .and_then(|holder| holder.expires_in.checked_sub(BACKEND_LEASE_GRACE))
    else {
        return recorded;
    };
    // The backend's lease was set to end exactly `BACKEND_LEASE_GRACE` after a whole second:
    // the nearest second recovers it.
    let end = input.now.as_nanosecond() + i128::try_from(lease.as_nanos()).unwrap_or(i128::MAX / 2);
    let implied = i64::try_from((end + 500_000_000).div_euclid(1_000_000_000)).unwrap_or(recorded);
    recorded.max(implied)
}

/// When a held claim's lease runs out in a pass of `mode`, and whether that is a renewal.
/// While the lock is blocked (its backend away, its spec invalid) no renewal can reach the
/// backend, so none extends the grant: it ends when the recorded lease runs out.
pub(crate) fn held_expiry(
    input: &LockInput,
    claim: &ClaimView,
    mode: &LockMode,
) -> (Seconds, bool) {
    if *mode == LockMode::Serving {
        effective_expiry(input, claim)
    } else {
        (recorded_expiry(input, claim), false)
    }
}

/// When a held claim's lease runs out, counting a renewal written before it ran out.
/// Returns `(expiry, renewed)`.
pub(crate) fn effective_expiry(input: &LockInput, claim: &ClaimView) -> (Seconds, bool) {
    let now = input.now_seconds();
    let recorded = recorded_expiry(input, claim);
    let lease = claim.lease_seconds(&input.lock);
    let renewed_until = claim
        .spec
        .renew_time
        .as_ref()
        .map(seconds_of)
        // A renewal dated in the future counts from now.
        .map(|renewed| renewed.min(now))
        // A renewal dated after the lease ran out comes too late.
        .filter(|renewed| *renewed <= recorded)
        .map(|renewed| renewed.saturating_add(lease))
        .filter(|until| *until > recorded);
    let (expiry, renewed) = match renewed_until {
        Some(until) => (until, true),
        None => (recorded, false),
    };
    // A live owner keeps the lease: renewed once half of it has passed (at the latest in its
    // last second: with whole-second times a one-second lease has no earlier moment).
    let (expiry, renewed) = if claim.owner_state == OwnerState::Alive
        && expiry >= now
        && now >= owner_renewal_due(expiry, lease)
        && now.saturating_add(lease) > expiry
    {
        (now.saturating_add(lease), true)
    } else {
        (expiry, renewed)
    };
    // `maxHoldSeconds` caps every renewal; a renewal that cannot move the end is none.
    match claim.recorded_hold_deadline(&input.lock) {
        Some(deadline) if expiry > deadline => (deadline, renewed && deadline > recorded),
        _ => (expiry, renewed),
    }
}

/// When the controller renews the lease (ending at `expiry`) of a claim whose owner runs:
/// once half of it has passed.
pub(crate) fn owner_renewal_due(expiry: Seconds, lease: Seconds) -> Seconds {
    expiry.saturating_sub(lease.saturating_add(1) / 2)
}
