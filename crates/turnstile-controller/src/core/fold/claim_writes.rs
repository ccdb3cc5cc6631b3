//! Step 2 of the fold: the claim writes — statuses that changed, finalizers to remove — in
//! the order that never shows more holders than allowed (grants ending first, then new
//! grants by token, then the rest), with the Events and metric observations they cause.

use turnstile_api::{reasons, ClaimPhase, LockClaimStatus, PastGrant};

use super::{members_given_back, release_settled, Folder};
use crate::core::decision::{ClaimChange, FinalizerChange, Observation, PlannedEvent};
use crate::core::model::{time_at, ClaimView, Seconds};
use crate::core::plan::Intent;
use crate::core::report::{claim_events, holder_deleted, observations_for};

/// The claim writes of a pass and what they cause.
#[derive(Default)]
pub(super) struct ClaimWrites {
    /// In the order they must be written.
    pub changes: Vec<ClaimChange>,
    /// The grants they end, for the lock's history.
    pub ended: Vec<PastGrant>,
    pub events: Vec<PlannedEvent>,
    pub observations: Vec<Observation>,
}

/// The writes of the claims whose `statuses` (step 1) or finalizers change.
pub(super) fn claim_writes(
    folder: &Folder<'_>,
    statuses: &[(usize, Option<LockClaimStatus>)],
) -> ClaimWrites {
    let (input, plan, now) = (folder.input, folder.plan, folder.now);
    let mut leaving_held = Vec::new();
    // The grants this pass ends, for the lock's history.
    let mut ended: Vec<PastGrant> = Vec::new();
    let mut grants = Vec::new();
    let mut others = Vec::new();
    let mut events = Vec::new();
    let mut observations = Vec::new();
    for ((index, status), (_, intent)) in statuses.iter().zip(&plan.intents) {
        let claim = &input.claims[*index];
        let changed = status.as_ref().filter(|new| **new != claim.status).cloned();
        if let Some(new) = &changed {
            let locks = if claim.is_multi_lock() {
                claim.locks.join(", ")
            } else {
                input.lock.name.clone()
            };
            claim_events(claim, new, &locks, &mut events);
            observations_for(claim, new, now, &mut observations);
        }
        let finalizer = finalizer_change(folder, claim, intent, &mut events, &mut observations);
        if changed.is_none() && finalizer == FinalizerChange::Keep {
            continue;
        }
        let change = ClaimChange {
            name: claim.name.clone(),
            status: changed,
            finalizer,
        };
        let was_held = claim.phase() == ClaimPhase::Held;
        // A deleted holder leaves with its finalizer (its status stays as it was).
        let goes_away = claim.deleting && change.finalizer == FinalizerChange::Remove;
        let stays_held = !goes_away
            && change
                .status
                .as_ref()
                .map_or(was_held, |s| s.phase == Some(ClaimPhase::Held));
        if was_held && !stays_held {
            ended.push(past_grant(claim, change.status.as_ref(), now));
            leaving_held.push(change);
        } else if !was_held && stays_held {
            let token = change.status.as_ref().and_then(|s| s.fencing_token);
            grants.push((token, change));
        } else {
            others.push(change);
        }
    }
    // (A stable sort: grants of one token, which do not occur, would keep the queue's order.)
    grants.sort_by_key(|(token, _)| *token);
    leaving_held.extend(grants.into_iter().map(|(_, change)| change));
    leaving_held.extend(others);
    ClaimWrites {
        changes: leaving_held,
        ended,
        events,
        observations,
    }
}

/// Whether the claim's finalizer goes: once the backend no longer holds its grant, when it
/// is deleted or its grant ended. A holder deleted is said (Event, observation) here.
fn finalizer_change(
    folder: &Folder<'_>,
    claim: &ClaimView,
    intent: &Intent,
    events: &mut Vec<PlannedEvent>,
    observations: &mut Vec<Observation>,
) -> FinalizerChange {
    let (input, outcomes, now) = (folder.input, folder.outcomes, folder.now);
    // The claim's own grant and, on several locks, every other lock's.
    let settled = |op: &Option<usize>| {
        release_settled(input, *op, outcomes) && members_given_back(folder.plan, outcomes, claim)
    };
    match intent {
        Intent::Delete { release_op } => {
            if claim.has_finalizer && settled(release_op) {
                if claim.phase() == ClaimPhase::Held {
                    holder_deleted(claim, &input.lock.name, now, events, observations);
                }
                FinalizerChange::Remove
            } else {
                FinalizerChange::Keep
            }
        }
        Intent::End { release_op, .. } | Intent::Terminal { release_op }
            if claim.has_finalizer && settled(release_op) =>
        {
            FinalizerChange::Remove
        }
        _ => FinalizerChange::Keep,
    }
}

/// A holder's grant as the lock's history records it: what its status said while held, and
/// how it ended (`new`: its status now; none when the claim leaves by deletion).
fn past_grant(claim: &ClaimView, new: Option<&LockClaimStatus>, now: Seconds) -> PastGrant {
    let held = &claim.status;
    PastGrant {
        claim: claim.name.clone(),
        holder_identity: held.holder_identity.clone().unwrap_or_default(),
        fencing_token: held.fencing_token.unwrap_or_default(),
        acquired_at: held.acquired_at.clone(),
        released_at: Some(
            new.and_then(|status| status.released_at.clone())
                .unwrap_or_else(|| time_at(now)),
        ),
        reason: new
            .and_then(|status| status.reason.clone())
            .unwrap_or_else(|| reasons::CLAIM_DELETED.to_owned()),
    }
}
