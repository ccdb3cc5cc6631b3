//! Step two of a pass: fold the backend's answers into the claims' and the lock's statuses
//! (the claims' built by `status`, so that the same facts always give the same status), the
//! Events to emit and when to look again.

use std::collections::HashSet;
use std::time::Duration;

use turnstile_api::{
    reasons, ClaimPhase, DistributedLockStatus, LockClaimStatus, LockHolder, PastGrant,
    LOCK_HISTORY_LEN, READY_CONDITION,
};

use super::busy::fails_when_busy;
use super::decision::{
    ClaimChange, Decision, EventSeverity, EventSubject, FinalizerChange, PlannedEvent,
};
use super::model::{seconds_of, time_at, BackendView, ClaimView, LockInput, OwnerState, Seconds};
use super::ops::OpOutcome;
use super::orphan::lock_not_found;
use super::plan::{Intent, LockMode, Plan};
use super::queue::{
    positions_refresh_at, refresh_stale_positions, shown_position, EXACT_POSITIONS,
};
use super::report::{claim_events, holder_deleted, observations_for};
use super::status::{
    conditions_status, held_status, pending_status, set_condition, terminal_status,
};

/// Look at every lock at least this often, even when nothing happens (heals missed events).
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(300);

/// When the controller's budget for position refreshes is spent, look again this much later.
const POSITION_REFRESH_RETRY: Duration = Duration::from_secs(1);

/// Wait at least this long before retrying a refused grant.
const MIN_BUSY_RETRY: Duration = Duration::from_secs(1);

/// Retry a refused grant at least this often: the key's holder may be another cluster's
/// controller (or a process outside Kubernetes) sharing the backend, whose release nothing
/// here hears of. One backend call per try; the claim's status stays as it is.
pub const MAX_BUSY_RETRY: Duration = Duration::from_secs(2);

/// Wake this much after a deadline, so that the whole second has surely passed.
const DEADLINE_MARGIN: Duration = Duration::from_millis(50);

fn outcome(outcomes: &[OpOutcome], op: usize) -> &OpOutcome {
    outcomes.get(op).unwrap_or(&OpOutcome::Skipped)
}

/// Whether the backend no longer holds a grant for the claim (so its finalizer may go).
fn release_settled(input: &LockInput, op: Option<usize>, outcomes: &[OpOutcome]) -> bool {
    match &input.backend {
        BackendView::NotConfigured { .. } => true,
        BackendView::Unavailable { .. } => false,
        BackendView::Ready { .. } => {
            op.is_none_or(|op| matches!(outcome(outcomes, op), OpOutcome::Released { .. }))
        }
    }
}

/// A claim's status after the pass, before positions are assigned.
enum Next {
    /// Unchanged (terminal, or being deleted).
    Same,
    /// This status (boxed: a status is large beside the other variants).
    Status(Box<LockClaimStatus>),
    /// Waiting in the queue with this reason.
    Queued {
        reason: &'static str,
        message: String,
    },
    /// Waiting here for a grant its first lock's pass decides (counted, not written).
    KeptWaiting,
}

impl Next {
    fn status(status: LockClaimStatus) -> Self {
        Self::Status(Box::new(status))
    }
}

struct Folder<'a> {
    input: &'a LockInput,
    plan: &'a Plan,
    outcomes: &'a [OpOutcome],
    now: Seconds,
    requeue: Duration,
    failure: Option<String>,
}

impl Folder<'_> {
    fn wake_at(&mut self, at: Seconds) {
        self.wake_in(self.input.until(at) + DEADLINE_MARGIN);
    }

    fn wake_in(&mut self, delay: Duration) {
        self.requeue = self.requeue.min(delay);
    }

    fn held_message(&self, claim: &ClaimView, token: u64) -> String {
        if claim.is_multi_lock() {
            format!(
                "holds locks {} with fencing token {token} on {} (each lock's in status.locks)",
                claim.locks.join(", "),
                self.input.lock.name
            )
        } else {
            format!(
                "holds lock {} with fencing token {token}",
                self.input.lock.name
            )
        }
    }

    fn lost(&self, claim: &ClaimView, message: String) -> Next {
        Next::status(terminal_status(
            claim,
            ClaimPhase::Expired,
            reasons::LOCK_LOST,
            message,
            Some(self.now),
            self.now,
        ))
    }

    /// The claim's current grant, unchanged (or with a new expiry); wakes up at the expiry,
    /// or when the lease is due for renewal on behalf of a live owner.
    fn still_held(&mut self, claim: &ClaimView, expiry: Seconds) -> Next {
        self.wake_for_grant(claim, expiry);
        self.held_until(claim, expiry)
    }

    /// Wakes up when a grant running until `expiry` ends, or is due for renewal on behalf
    /// of a live owner.
    fn wake_for_grant(&mut self, claim: &ClaimView, expiry: Seconds) {
        self.wake_at(expiry);
        if claim.owner_state == OwnerState::Alive {
            let lease = claim.lease_seconds(&self.input.lock);
            // Not before the next whole second: a renewal never changes within one.
            let due = super::expiry::owner_renewal_due(expiry, lease).max(self.now + 1);
            self.wake_at(due);
        }
    }

    /// The claim's current grant recorded until `expiry` (without scheduling a wake-up).
    fn held_until(&self, claim: &ClaimView, expiry: Seconds) -> Next {
        let token = claim.fencing_token().unwrap_or(0);
        let acquired = claim
            .status
            .acquired_at
            .as_ref()
            .map(seconds_of)
            .unwrap_or(self.now);
        let identity = claim
            .status
            .holder_identity
            .clone()
            .unwrap_or_else(|| claim.holder_identity());
        Next::status(held_status(
            claim,
            identity,
            token,
            acquired,
            expiry,
            self.held_message(claim, token),
            self.now,
        ))
    }

    fn recorded_expiry(&self, claim: &ClaimView) -> Seconds {
        super::expiry::recorded_expiry(self.input, claim)
    }

    fn note_failure(&mut self, outcome: &OpOutcome) {
        if let OpOutcome::Failed { message } = outcome {
            self.failure.get_or_insert_with(|| message.clone());
        }
    }

    /// Why a claim waits: the lock's state, or (on several locks) the first other lock that
    /// does not admit it yet.
    fn waiting_reason(&self, claim: &ClaimView) -> (&'static str, String) {
        match claim.members.iter().find(|member| !member.admits) {
            Some(member) if self.plan.mode == LockMode::Serving => (
                reasons::QUEUED,
                format!(
                    "queued for locks {} (granted together): lock {} is not free for it yet",
                    claim.locks.join(", "),
                    member.name
                ),
            ),
            _ => self.queued_reason(),
        }
    }

    fn queued_reason(&self) -> (&'static str, String) {
        match &self.plan.mode {
            LockMode::Blocked { reason, message } => {
                let reason = if *reason == reasons::INVALID_SPEC {
                    reasons::INVALID_LOCK_SPEC
                } else {
                    reason
                };
                (reason, message.clone())
            }
            _ => (
                reasons::QUEUED,
                format!("queued for lock {}", self.input.lock.name),
            ),
        }
    }

    fn next(&mut self, claim: &ClaimView, intent: &Intent) -> Next {
        match intent {
            Intent::KeepHeld => {
                // A pending renewal is only recorded once the backend extends the grant, but
                // the claim is not expired before the renewed expiry.
                let (expiry, _) = super::expiry::held_expiry(self.input, claim, &self.plan.mode);
                self.wake_at(expiry);
                self.held_until(claim, self.recorded_expiry(claim))
            }
            Intent::Renew { expiry, op } => match outcome(self.outcomes, *op).clone() {
                OpOutcome::Extended { still_held: true } => self.still_held(claim, *expiry),
                OpOutcome::Extended { still_held: false } => self.lost(
                    claim,
                    "the backend no longer held the grant when it was renewed".to_owned(),
                ),
                other => {
                    self.note_failure(&other);
                    let recorded = self.recorded_expiry(claim);
                    self.still_held(claim, recorded)
                }
            },
            Intent::Reattach {
                expiry,
                renewed,
                op,
            } => {
                let recorded_token = claim.fencing_token().unwrap_or(0);
                let expiry = if *renewed {
                    *expiry
                } else {
                    self.recorded_expiry(claim)
                };
                match outcome(self.outcomes, *op).clone() {
                    OpOutcome::Granted { fencing_token, .. } if fencing_token == recorded_token => {
                        self.still_held(claim, expiry)
                    }
                    OpOutcome::Granted { fencing_token, .. } => {
                        // The backend handed out a new grant: the old one was not continuous.
                        // The stray grant is released on the next pass.
                        self.wake_in(MIN_BUSY_RETRY);
                        self.lost(
                            claim,
                            format!(
                                "the backend lost the grant (it would now issue token \
                                 {fencing_token} instead of {recorded_token})"
                            ),
                        )
                    }
                    OpOutcome::Busy { .. } => {
                        self.wake_in(MIN_BUSY_RETRY);
                        self.lost(
                            claim,
                            "the backend lost the grant and someone else holds the lock now"
                                .to_owned(),
                        )
                    }
                    other => {
                        self.note_failure(&other);
                        let recorded = self.recorded_expiry(claim);
                        self.still_held(claim, recorded)
                    }
                }
            }
            Intent::Grant { expiry, op } => match outcome(self.outcomes, *op).clone() {
                OpOutcome::Granted { fencing_token, .. }
                    if fencing_token > self.plan.high_water =>
                {
                    self.wake_for_grant(claim, *expiry);
                    Next::status(held_status(
                        claim,
                        claim.holder_identity(),
                        fencing_token,
                        self.now,
                        *expiry,
                        self.held_message(claim, fencing_token),
                        self.now,
                    ))
                }
                OpOutcome::Granted { .. } => {
                    // A token at or below one already announced: the next pass takes the
                    // grant again (plan releases it first).
                    self.wake_in(MIN_BUSY_RETRY);
                    let (reason, message) = self.queued_reason();
                    Next::Queued { reason, message }
                }
                OpOutcome::Busy { .. } if fails_when_busy(claim) => Next::status(terminal_status(
                    claim,
                    ClaimPhase::Failed,
                    reasons::LOCK_BUSY,
                    format!(
                        "the backend reports lock key {} busy (whenBusy: Fail)",
                        self.input.lock.backend_key()
                    ),
                    None,
                    self.now,
                )),
                OpOutcome::Busy { retry_after } => {
                    self.wake_in(retry_after.map_or(MAX_BUSY_RETRY, |after| {
                        after.clamp(MIN_BUSY_RETRY, MAX_BUSY_RETRY)
                    }));
                    Next::Queued {
                        reason: reasons::LOCK_BUSY,
                        message: format!(
                            "the backend reports lock key {} busy",
                            self.input.lock.backend_key()
                        ),
                    }
                }
                other => {
                    self.note_failure(&other);
                    let (reason, message) = self.queued_reason();
                    Next::Queued { reason, message }
                }
            },
            Intent::Queue => {
                if let Some(deadline) = claim.acquire_deadline() {
                    self.wake_at(deadline);
                }
                let (reason, message) = self.waiting_reason(claim);
                Next::Queued { reason, message }
            }
            Intent::End {
                phase,
                reason,
                message,
                released_at,
                ..
            } => Next::status(terminal_status(
                claim,
                *phase,
                reason,
                message.clone(),
                *released_at,
                self.now,
            )),
            Intent::Terminal { .. } | Intent::Delete { .. } => Next::Same,
            Intent::LockGone => Next::status(pending_status(
                claim,
                None,
                reasons::LOCK_NOT_FOUND,
                lock_not_found(&self.input.lock.name),
                self.now,
            )),
            Intent::OtherLockGone { lock } => Next::status(pending_status(
                claim,
                None,
                reasons::LOCK_NOT_FOUND,
                format!("DistributedLock {lock} does not exist (or is being deleted)"),
                self.now,
            )),
            Intent::KeptPlace { waiting: true } => Next::KeptWaiting,
            Intent::KeptPlace { waiting: false } => Next::Same,
        }
    }
}

/// Step two of a pass (pure): folds the answers to [`Plan::ops`] (`outcomes[i]` answers
/// `ops[i]`; missing answers count as skipped) into the writes, Events and requeue time.
pub fn fold(input: &LockInput, plan: &Plan, outcomes: &[OpOutcome]) -> Decision {
    let now = input.now_seconds();
    let mut folder = Folder {
        input,
        plan,
        outcomes,
        now,
        requeue: RESYNC_INTERVAL,
        failure: match &input.backend {
            BackendView::Unavailable { message, .. } => Some(message.clone()),
            _ => None,
        },
    };

    // Statuses, with queue positions assigned in FIFO order.
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
    let mut refreshed_positions = false;
    // The head's positions are refreshed a little after a grant, not by it: a hand-off then
    // writes no waiter, and the passes after the refresh find nothing stale at the head, so
    // they refresh nothing further back either.
    if stale.iter().any(|&(_, exact)| exact <= EXACT_POSITIONS) {
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
        } else if input.may_refresh_positions {
            refresh_stale_positions(&mut statuses, &stale);
            refreshed_positions = true;
        } else {
            // The controller's budget for refreshes is spent (a wave of hand-offs): the
            // grants' own writes go first, the positions a little later.
            folder.wake_in(POSITION_REFRESH_RETRY);
        }
    }
    let waiting = position;

    // Claim writes, events and observations.
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
        let settled = |op: &Option<usize>| release_settled(input, *op, outcomes);
        let finalizer = match intent {
            Intent::Delete { release_op } => {
                if claim.has_finalizer && settled(release_op) {
                    if claim.phase() == ClaimPhase::Held {
                        holder_deleted(
                            claim,
                            &input.lock.name,
                            now,
                            &mut events,
                            &mut observations,
                        );
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
        };
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

    // The lock's status.
    let failure = folder.failure.clone();
    let deleting = plan.mode == LockMode::Deleting;
    let mut lock_status = None;
    if !deleting {
        let mut holders: Vec<LockHolder> = statuses
            .iter()
            .filter_map(|(index, status)| {
                let claim = &input.claims[*index];
                let status = status.as_ref().unwrap_or(&claim.status);
                (status.phase == Some(ClaimPhase::Held) && !claim.deleting).then(|| LockHolder {
                    claim: claim.name.clone(),
                    holder_identity: status.holder_identity.clone().unwrap_or_default(),
                    fencing_token: status.fencing_token.unwrap_or_default(),
                    acquired_at: status.acquired_at.clone(),
                    expires_at: status.expires_at.clone(),
                })
            })
            .collect();
        holders.sort_by_key(|holder| holder.fencing_token);
        let issued = outcomes.iter().filter_map(|outcome| match outcome {
            OpOutcome::Granted { fencing_token, .. } => Some(*fencing_token),
            OpOutcome::FloorRaised { counter } => Some(*counter),
            _ => None,
        });
        let snapshot_counter = input.backend.snapshot().map(|s| s.fencing_token);
        let high_water = issued
            .chain(snapshot_counter)
            .fold(plan.high_water, u64::max);
        let fencing_token = if high_water == 0 {
            input.lock.status.fencing_token
        } else {
            i64::try_from(high_water).ok()
        };
        let backend = input.backend.backend();
        let (ready, reason, message) = match (&plan.mode, &failure) {
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
            waiting,
            fencing_token,
            conditions,
            // The plan's end already counts the one the status records.
            locked_until: plan.locked_until.map(time_at),
            history: with_history(&input.lock.status.history, ended),
        };
        if new_status != input.lock.status {
            lock_status = Some(new_status);
        }
    }

    if input.lock.namespace_terminating {
        // Everything here goes with the namespace: only the finalizers of claims already
        // marked for deletion are let go (the others' marks are on their way, and a write
        // before one would race it), and the API server takes no Event into a namespace
        // being deleted.
        let marked: HashSet<&str> = input
            .claims
            .iter()
            .filter(|claim| claim.deleting)
            .map(|claim| claim.name.as_str())
            .collect();
        leaving_held.retain(|change| {
            change.finalizer == FinalizerChange::Remove && marked.contains(change.name.as_str())
        });
        for change in &mut leaving_held {
            change.status = None;
        }
        events.clear();
    }
    // The lock stays until its claims have let go of their finalizers: with no status
    // written, only the lock's passes (which each claim's mark wakes) remove them.
    let claims_still_kept = input.lock.namespace_terminating
        && input.claims.iter().any(|claim| {
            claim.has_finalizer
                && !leaving_held.iter().any(|change| {
                    change.name == claim.name && change.finalizer == FinalizerChange::Remove
                })
        });

    Decision {
        claims: leaving_held,
        lock_status,
        add_lock_finalizer: !deleting && !input.lock.has_finalizer,
        remove_lock_finalizer: deleting && input.lock.has_finalizer && !claims_still_kept,
        events,
        observations,
        requeue_after: folder.requeue,
        backend_failure: failure,
        refreshed_positions,
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
