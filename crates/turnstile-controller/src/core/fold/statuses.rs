//! Step 1 of the fold: each claim's status after the pass (see `next`), with its place in
//! the queue.

use turnstile_api::LockClaimStatus;

use super::{release_settled, Folder, Next, POSITION_REFRESH_RETRY};
use crate::core::plan::Intent;
use crate::core::queue::{
    positions_refresh_at, refresh_stale_positions, shown_position, EXACT_POSITIONS,
};
use crate::core::status::pending_status;

/// The claims' statuses after the pass.
pub(super) struct Statuses {
    /// By index into the input's claims, in queue order; None: unchanged.
    pub statuses: Vec<(usize, Option<LockClaimStatus>)>,
    /// How many claims wait.
    pub waiting: i32,
    /// Whether the head's stale positions were refreshed in this pass.
    pub refreshed_positions: bool,
}

/// Each claim's status, with positions assigned in queue order.
pub(super) fn claim_statuses(folder: &mut Folder<'_>) -> Statuses {
    let (input, plan, now) = (folder.input, folder.plan, folder.now);
    let mut nexts: Vec<(usize, Next)> = Vec::with_capacity(plan.intents.len());
    for (index, intent) in &plan.intents {
        let next = folder.next(&input.claims[*index], intent);
        nexts.push((*index, next));
    }
    let mut position = 0i32;
    let mut statuses: Vec<(usize, Option<LockClaimStatus>)> = Vec::with_capacity(nexts.len());
    let mut stale: Vec<(usize, i32)> = Vec::new();
    for (index, next) in nexts {
        let claim = &input.claims[index];
        let status = match next {
            Next::Same => None,
            Next::KeptWaiting => {
                position += 1;
                None
            }
            Next::Status(status) => Some(*status),
            Next::Queued { reason, message } => {
                position += 1;
                let shown = shown_position(claim, position);
                if shown != position {
                    stale.push((statuses.len(), position));
                }
                Some(pending_status(claim, Some(shown), reason, message, now))
            }
        };
        statuses.push((index, status));
    }
    let refreshed_positions = refresh_the_head(folder, &mut statuses, &stale);
    Statuses {
        statuses,
        waiting: position,
        refreshed_positions,
    }
}

/// Writes the exact positions of the waiters near the head whose shown ones are `stale` (by
/// index into `statuses`, with the exact one), when their time has come; whether it did.
fn refresh_the_head(
    folder: &mut Folder<'_>,
    statuses: &mut [(usize, Option<LockClaimStatus>)],
    stale: &[(usize, i32)],
) -> bool {
    let (input, plan, outcomes, now) = (folder.input, folder.plan, folder.outcomes, folder.now);
    // The head's positions are refreshed a little after a grant, not by it: a hand-off then
    // writes no waiter, and the passes after the refresh find nothing stale at the head, so
    // they refresh nothing further back either.
    if !stale.iter().any(|&(_, exact)| exact <= EXACT_POSITIONS) {
        return false;
    }
    // A deleted holder whose grant this pass ends holds nothing after it (its status
    // stays as it was, so it would hold the refresh back a whole delay).
    let after_pass = statuses
        .iter()
        .zip(&plan.intents)
        .filter(|(_, (_, intent))| match intent {
            Intent::Delete { release_op } => !release_settled(input, *release_op, outcomes),
            _ => true,
        })
        .map(|((index, status), _)| {
            let claim = &input.claims[*index];
            status.as_ref().unwrap_or(&claim.status)
        });
    let refresh_at = positions_refresh_at(after_pass, now);
    if refresh_at > now {
        folder.wake_at(refresh_at);
        false
    } else if input.may_refresh_positions {
        refresh_stale_positions(statuses, stale);
        true
    } else {
        // The controller's budget for refreshes is spent (a wave of hand-offs): the
        // grants' own writes go first, the positions a little later.
        folder.wake_in(POSITION_REFRESH_RETRY);
        false
    }
}
