//! Step 3 of the fold: the lock's status — its holders by token, how many wait, the tokens'
//! high water, the `Ready` condition (with an Event when it changes), the lock-delay and the
//! history of grants.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use turnstile_api::{
    reasons, ClaimPhase, DistributedLockStatus, LockClaimStatus, LockHolder, PastGrant,
    LOCK_HISTORY_LEN, READY_CONDITION,
};

use super::statuses::Statuses;
use super::{Folder, DEADLINE_MARGIN};
use crate::core::decision::{EventSeverity, EventSubject, PlannedEvent};
use crate::core::model::{cluster_of_token, time_at};
use crate::core::ops::OpOutcome;
use crate::core::plan::LockMode;
use crate::core::status::{conditions_status, set_condition};

/// The lock's new status, None when it is as it was; `ended` are the grants the pass ends.
pub(super) fn lock_status(
    folder: &mut Folder<'_>,
    statuses: &Statuses,
    ended: Vec<PastGrant>,
    events: &mut Vec<PlannedEvent>,
) -> Option<DistributedLockStatus> {
    let (input, plan, now) = (folder.input, folder.plan, folder.now);
    let holders = holders(folder, &statuses.statuses);
    let conditions = ready_condition(folder, events);
    if let Some(until) = plan.locked_until.filter(|until| *until > now) {
        // Wake up when the lock-delay ends, to grant.
        folder.requeue = folder
            .requeue
            .min(Duration::from_secs(u64::try_from(until - now).unwrap_or(0)));
    }
    let new_status = DistributedLockStatus {
        observed_generation: input.lock.generation,
        holder_summary: turnstile_api::holder_summary(&holders),
        holders,
        waiting: statuses.waiting,
        fencing_token: fencing_token(folder),
        conditions,
        // The plan's end already counts the one the status records.
        locked_until: plan.locked_until.map(time_at),
        history: with_history(&input.lock.status.history, ended),
    };
    (new_status != input.lock.status).then_some(new_status)
}

/// The claims that hold after the pass, by token.
fn holders(
    folder: &mut Folder<'_>,
    statuses: &[(usize, Option<LockClaimStatus>)],
) -> Vec<LockHolder> {
    let input = folder.input;
    let mut holders: Vec<LockHolder> = statuses
        .iter()
        .filter_map(|(index, status)| {
            let claim = &input.claims[*index];
            let status = status.as_ref().unwrap_or(&claim.status);
            (status.phase == Some(ClaimPhase::Held) && !claim.deleting).then(|| LockHolder {
                claim: claim.name.clone(),
                holder_identity: status.holder_identity.clone().unwrap_or_default(),
                fencing_token: status.fencing_token.unwrap_or_default(),
                cluster: None,
                acquired_at: status.acquired_at.clone(),
                expires_at: status.expires_at.clone(),
            })
        })
        .collect();
    holders.extend(held_elsewhere(folder));
    holders.sort_by_key(|holder| holder.fencing_token);
    holders
}

/// The grants the backend holds for no claim of this pass — another cluster's, whose
/// controller shares the lock's backend key — by the cluster their owner tokens name;
/// the lock looks again when the first one's lease would end. Without a snapshot, the ones
/// the status shows already.
fn held_elsewhere(folder: &mut Folder<'_>) -> Vec<LockHolder> {
    let input = folder.input;
    if input.backend.snapshot().is_none() {
        return (input.lock.status.holders.iter())
            .filter(|holder| holder.claim.is_empty())
            .cloned()
            .collect();
    }
    let elsewhere = input.holders_outside();
    if let Some(first_end) = elsewhere.iter().map(|holder| holder.expires_in).min() {
        folder.wake_in(first_end + DEADLINE_MARGIN);
    }
    (elsewhere.into_iter())
        .map(|holder| LockHolder {
            claim: String::new(),
            holder_identity: holder.owner.clone(),
            fencing_token: i64::try_from(holder.fencing_token).unwrap_or(i64::MAX),
            cluster: cluster_of_token(&holder.owner).map(str::to_owned),
            acquired_at: None,
            expires_at: None,
        })
        .collect()
}

/// The highest token the lock has issued, as far as the pass knows: its status's, the
/// plan's, the backend counter's and every token this pass was given.
fn fencing_token(folder: &Folder<'_>) -> Option<i64> {
    let (input, plan) = (folder.input, folder.plan);
    // Only this lock's calls: the other locks of a claim on several count their own tokens.
    let own_outcomes = (plan.ops.iter().zip(folder.outcomes))
        .filter(|(planned, _)| planned.on_lock.is_none())
        .map(|(_, outcome)| outcome);
    let issued = own_outcomes.filter_map(|outcome| match outcome {
        OpOutcome::Granted { fencing_token, .. } => Some(*fencing_token),
        OpOutcome::FloorRaised { counter } => Some(*counter),
        _ => None,
    });
    let snapshot_counter = input.backend.snapshot().map(|s| s.fencing_token);
    let high_water = issued
        .chain(snapshot_counter)
        .fold(plan.high_water, u64::max);
    if high_water == 0 {
        input.lock.status.fencing_token
    } else {
        i64::try_from(high_water).ok()
    }
}

/// The lock's conditions with `Ready` as the pass found the lock and its backend; an Event
/// when `Ready` changes.
fn ready_condition(folder: &Folder<'_>, events: &mut Vec<PlannedEvent>) -> Vec<Condition> {
    let (input, plan, now) = (folder.input, folder.plan, folder.now);
    let backend = input.backend.backend();
    let (ready, reason, message) = match (&plan.mode, &folder.failure) {
        (LockMode::Blocked { reason, message }, _) => (false, *reason, message.clone()),
        (_, Some(message)) => (false, reasons::BACKEND_UNAVAILABLE, message.clone()),
        _ => (
            true,
            reasons::BACKEND_READY,
            format!("served by the {backend} backend"),
        ),
    };
    let conditions = set_condition(
        &input.lock.status.conditions,
        READY_CONDITION,
        ready,
        reason,
        &message,
        input.lock.generation,
        now,
    );
    let old_ready = input
        .lock
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == READY_CONDITION);
    let ready_changed =
        old_ready.is_none_or(|c| c.status != conditions_status(ready) || c.reason != reason);
    if ready_changed {
        events.push(PlannedEvent {
            subject: EventSubject::Lock,
            severity: if ready {
                EventSeverity::Normal
            } else {
                EventSeverity::Warning
            },
            reason,
            note: message,
        });
    }
    conditions
}

/// `history` with the grants `ended` appended (a grant already recorded, by a pass whose
/// claim write was then refused, is not recorded twice), keeping the last
/// [`LOCK_HISTORY_LEN`].
fn with_history(history: &[PastGrant], ended: Vec<PastGrant>) -> Vec<PastGrant> {
    let mut history = history.to_vec();
    for grant in ended {
        let recorded = history
            .iter()
            .any(|past| past.claim == grant.claim && past.fencing_token == grant.fencing_token);
        if !recorded {
            history.push(grant);
        }
    }
    let extra = history.len().saturating_sub(LOCK_HISTORY_LEN);
    history.drain(..extra);
    history
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use turnstile_api::{BackendKind, ClaimPhase};
    use turnstile_lock::LockSnapshot;

    use crate::core::model::BackendView;
    use crate::core::ops::{BackendOp, OpOutcome};
    use crate::core::tests::{held_claim, holding, input_at, pass, waiting_claim, T0};

    fn busy(op: &BackendOp) -> OpOutcome {
        match op {
            BackendOp::Acquire { .. } => OpOutcome::Busy { retry_after: None },
            other => panic!("no other call expected: {other:?}"),
        }
    }

    /// Another cluster's grant on the shared key is shown by the cluster its token names
    /// (without times, so its renewals write nothing here), and the lock looks again when
    /// its lease would end; a grant whose lease was cut is over and not shown.
    #[test]
    fn a_grant_held_from_another_cluster_is_shown_by_its_cluster() {
        let mut input = input_at(T0, waiting_claim());
        input.backend = BackendView::Ready {
            backend: BackendKind::Redis,
            snapshot: LockSnapshot {
                holders: vec![
                    holding("east/uid-e1", 7, Duration::from_secs(20)),
                    holding("west/uid-cut", 6, Duration::from_millis(1)),
                ],
                fencing_token: 7,
                ..LockSnapshot::default()
            },
        };
        let decision = pass(&input, busy);
        let status = decision.lock_status.expect("the lock's status");
        assert_eq!(status.holders.len(), 1, "{:?}", status.holders);
        let elsewhere = &status.holders[0];
        assert_eq!(elsewhere.cluster.as_deref(), Some("east"));
        assert_eq!(
            (elsewhere.claim.as_str(), elsewhere.holder_identity.as_str()),
            ("", "east/uid-e1")
        );
        assert_eq!(elsewhere.fencing_token, 7);
        assert_eq!(
            (&elsewhere.acquired_at, &elsewhere.expires_at),
            (&None, &None)
        );
        assert_eq!(status.holder_summary.as_deref(), Some("cluster east"));
        assert!(
            decision.requeue_after <= Duration::from_millis(20_050),
            "{:?}",
            decision.requeue_after
        );
    }

    /// The claims of the pass are this cluster's, whatever their token: a claim's own grant
    /// is never shown as held elsewhere.
    #[test]
    fn a_claims_own_grant_is_not_held_elsewhere() {
        let mut claim = held_claim(T0 + 8, None);
        claim.owner_token = "west/uid-a".to_owned();
        let mut input = input_at(T0, claim);
        input.backend = BackendView::Ready {
            backend: BackendKind::Redis,
            snapshot: LockSnapshot {
                holders: vec![holding("west/uid-a", 1, Duration::from_secs(8))],
                fencing_token: 1,
                ..LockSnapshot::default()
            },
        };
        let decision = pass(&input, |op| panic!("no call expected: {op:?}"));
        let status = decision.lock_status.expect("the lock's status");
        assert_eq!(status.holders.len(), 1);
        assert_eq!(
            (status.holders[0].claim.as_str(), &status.holders[0].cluster),
            ("a", &None)
        );
        assert_eq!(input.claims[0].phase(), ClaimPhase::Held);
    }
}
