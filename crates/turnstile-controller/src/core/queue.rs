//! The FIFO order of a lock's claims and the positions waiters are shown. The order is one
//! function, used by the reconcile pass ([`super::plan`]) and by whatever shows the queue
//! (`turnstile queue`), so that what people are shown is the order the controller grants in.

use super::model::{seconds_of, ClaimView, Seconds};
use turnstile_api::{ClaimPhase, LockClaimStatus};

/// Indices into `claims`, in queue order: higher priority first, then arrival
/// (`status.arrivedAt`, else `creationTimestamp` in whole seconds), then name
/// ([`turnstile_api::arrival_key`]). The controller grants pending claims in this order, as
/// many as `maxHolders` allows; a claim never overtakes one before it.
pub fn queue_order(claims: &[ClaimView]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by(|a, b| claims[*a].queue_order().cmp(&claims[*b].queue_order()));
    order
}

/// Waiters whose `status.position` is brought up to date soon after every move of the queue:
/// the head, where a user waits for "am I next?".
pub const EXACT_POSITIONS: i32 = 3;

/// How many positions behind [`EXACT_POSITIONS`] a refresh brings up to date at most, the most
/// out of date first, so that a refresh costs a constant number of writes at any queue depth.
pub const POSITION_REFRESHES_PER_PASS: usize = 2;

/// How long after the queue last moved (a grant, a waiter leaving) positions are refreshed,
/// in whole seconds. The passes of a hand-off write no waiter, and a burst of hand-offs costs
/// one refresh: rewriting the head at every hand-off was most of a hand-off's writes.
pub const POSITION_REFRESH_DELAY: Seconds = 2;

/// The position a waiter's status shows: the one last written while that is still an upper
/// bound (waiters move forward when others leave; only a higher-priority claim arriving moves
/// them back, and then the truth is written at once), else the exact one, also for a claim
/// that joins the queue.
pub(super) fn shown_position(claim: &ClaimView, exact: i32) -> i32 {
    let written = claim
        .status
        .position
        .filter(|_| claim.phase() == ClaimPhase::Pending);
    match written {
        Some(written) if written >= exact => written,
        _ => exact,
    }
}

/// When the stale positions at the head of a queue may be refreshed:
/// [`POSITION_REFRESH_DELAY`] after the latest grant among the holders after the pass
/// (`statuses`: every claim's status after it), at once when there is none. A waiter leaving
/// the queue without a grant is refreshed at once, as a grant after a quiet spell: only the
/// grant's own time is recorded, so only a hand-off can wait without a clock of its own.
pub(super) fn positions_refresh_at<'a>(
    statuses: impl IntoIterator<Item = &'a LockClaimStatus>,
    now: Seconds,
) -> Seconds {
    statuses
        .into_iter()
        .filter(|status| status.phase == Some(ClaimPhase::Held))
        .filter_map(|status| status.acquired_at.as_ref().map(seconds_of))
        .max()
        .map_or(now, |granted| granted + POSITION_REFRESH_DELAY)
}

/// Brings stale positions up to date: every one in the first [`EXACT_POSITIONS`] places, and
/// up to [`POSITION_REFRESHES_PER_PASS`] behind them, the ones whose shown position is the
/// largest multiple of the truth first (ties: nearest the head). `stale` holds (slot in
/// `statuses`, exact position).
pub(super) fn refresh_stale_positions(
    statuses: &mut [(usize, Option<LockClaimStatus>)],
    stale: &[(usize, i32)],
) {
    let (head, behind): (Vec<_>, Vec<_>) = stale
        .iter()
        .partition(|&&(_, exact)| exact <= EXACT_POSITIONS);
    let mut candidates: Vec<(i64, i64, usize, i32)> = behind
        .iter()
        .filter_map(|&&(slot, exact)| {
            let shown = statuses[slot].1.as_ref()?.position?;
            Some((i64::from(shown), i64::from(exact), slot, exact))
        })
        .collect();
    // shown_a / exact_a > shown_b / exact_b, compared without division.
    candidates.sort_by(|a, b| (b.0 * a.1).cmp(&(a.0 * b.1)).then(a.2.cmp(&b.2)));
    let behind = candidates
        .iter()
        .take(POSITION_REFRESHES_PER_PASS)
        .map(|&(_, _, slot, exact)| (slot, exact));
    for (slot, exact) in head.into_iter().copied().chain(behind) {
        if let Some(status) = statuses[slot].1.as_mut() {
            status.position = Some(exact);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_api::LockClaim;

    fn claim(name: &str, created: &str, arrived: Option<&str>) -> ClaimView {
        let claim: LockClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
            "metadata": {"name": name, "uid": name, "creationTimestamp": created},
            "spec": {"lockName": "l"},
            "status": {"arrivedAt": arrived}
        }))
        .expect("claim");
        ClaimView::from_resource(&claim).expect("complete claim")
    }

    fn names(claims: &[ClaimView]) -> Vec<&str> {
        queue_order(claims)
            .into_iter()
            .map(|index| claims[index].name.as_str())
            .collect()
    }

    #[test]
    fn arrival_to_the_microsecond_not_the_name() {
        // Created in one second, in the order c, b, a.
        let claims = [
            claim(
                "a",
                "2026-01-01T00:00:01Z",
                Some("2026-01-01T00:00:01.000300Z"),
            ),
            claim(
                "c",
                "2026-01-01T00:00:01Z",
                Some("2026-01-01T00:00:01.000100Z"),
            ),
            claim(
                "b",
                "2026-01-01T00:00:01Z",
                Some("2026-01-01T00:00:01.000200Z"),
            ),
        ];
        assert_eq!(names(&claims), ["c", "b", "a"]);
    }

    #[test]
    fn claims_never_seen_arriving_go_by_creation_second_then_name() {
        let claims = [
            claim("b", "2026-01-01T00:00:01Z", None),
            claim("z", "2026-01-01T00:00:00.900Z", None),
            claim("a", "2026-01-01T00:00:01Z", None),
            claim("c", "2026-01-01T00:00:00Z", None),
            // Seen arriving within second 1: after the claims that count from its start.
            claim("0", "2026-01-01T00:00:01Z", Some("2026-01-01T00:00:01.5Z")),
        ];
        assert_eq!(names(&claims), ["c", "z", "a", "b", "0"]);
    }

    #[test]
    fn behind_the_head_the_most_out_of_date_positions_are_refreshed_first() {
        let shown = |position: i32| LockClaimStatus {
            position: Some(position),
            ..LockClaimStatus::default()
        };
        // (shown, exact): the head's place 2, then places 5, 10, 4 and 20 behind it.
        let mut statuses = vec![
            (0, Some(shown(3))),
            (1, Some(shown(10))),
            (2, Some(shown(12))),
            (3, Some(shown(9))),
            (4, Some(shown(30))),
        ];
        let stale = [(0, 2), (1, 5), (2, 10), (3, 4), (4, 20)];
        refresh_stale_positions(&mut statuses, &stale);
        let positions: Vec<i32> = statuses
            .iter()
            .map(|(_, status)| status.as_ref().and_then(|s| s.position).expect("position"))
            .collect();
        // The head always; behind it the two shown furthest out of proportion: 9 for 4
        // (2.25×) and 10 for 5 (2×), not 30 for 20 (further off, but 1.5×) nor 12 for 10.
        assert_eq!(positions, [2, 5, 12, 4, 30]);
    }
}
