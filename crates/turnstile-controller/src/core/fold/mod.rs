//! Step two of a pass: fold the backend's answers into the claims' and the lock's statuses
//! (the claims' built by `status`, so that the same facts always give the same status), the
//! Events to emit and when to look again. In three steps, a module each, then the teardown
//! rule:
//!
//! 1. [`statuses`]: each claim's status after its backend call ([`next`]), with its queue
//!    position;
//! 2. [`claim_writes`]: the claim writes, in the order that never shows more holders than
//!    allowed, with their Events and metric observations;
//! 3. [`lock_status`]: the lock's status: holders, waiters, the tokens' high water, `Ready`,
//!    the history of grants;
//! 4. in a namespace being deleted, only finalizer removals ([`leave_with_the_namespace`]).

mod claim_writes;
mod lock_status;
mod next;
mod statuses;

use std::collections::HashSet;
use std::time::Duration;

use turnstile_api::{reasons, ClaimPhase, LockClaimStatus};

use super::decision::{Decision, FinalizerChange};
use super::execution::{answer, Step};
use super::model::{seconds_of, BackendView, ClaimView, LockInput, OwnerState, Seconds};
use super::ops::{BackendOp, OpOutcome};
use super::plan::{LockMode, Plan};
use super::status::{held_status, terminal_status};
use claim_writes::ClaimWrites;

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

/// Whether the backend no longer holds a grant for the claim (so its finalizer may go).
fn release_settled(input: &LockInput, op: Option<usize>, outcomes: &[OpOutcome]) -> bool {
    match &input.backend {
        BackendView::NotConfigured { .. } => true,
        BackendView::Unavailable { .. } => false,
        BackendView::Ready { .. } => {
            op.is_none_or(|op| matches!(answer(outcomes, op), OpOutcome::Released { .. }))
        }
    }
}

/// Whether every other lock's grant the pass gave back for `claim` (a claim on several
/// locks that does not hold after it) is back. A claim on one lock gave nothing back there.
fn members_given_back(plan: &Plan, outcomes: &[OpOutcome], claim: &ClaimView) -> bool {
    if claim.members.is_empty() {
        return true;
    }
    plan.ops
        .iter()
        .enumerate()
        .filter(|(_, planned)| {
            planned.on_lock.is_some()
                && planned.claim.as_deref() == Some(claim.name.as_str())
                && matches!(planned.op, BackendOp::Release { .. })
                && matches!(planned.step, Step::Lead { .. })
        })
        .all(|(index, _)| matches!(answer(outcomes, index), OpOutcome::Released { .. }))
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
}

/// Step two of a pass (pure): folds the answers to [`Plan::ops`] (`outcomes[i]` answers
/// `ops[i]`; missing answers count as skipped) into the writes, Events and requeue time.
pub fn fold(input: &LockInput, plan: &Plan, outcomes: &[OpOutcome]) -> Decision {
    let mut folder = Folder {
        input,
        plan,
        outcomes,
        now: input.now_seconds(),
        requeue: RESYNC_INTERVAL,
        failure: match &input.backend {
            BackendView::Unavailable { message, .. } => Some(message.clone()),
            _ => None,
        },
    };
    let statuses = statuses::claim_statuses(&mut folder);
    let mut writes = claim_writes::claim_writes(&folder, &statuses.statuses);
    let deleting = plan.mode == LockMode::Deleting;
    let lock_status = if deleting {
        None
    } else {
        let ended = std::mem::take(&mut writes.ended);
        lock_status::lock_status(&mut folder, &statuses, ended, &mut writes.events)
    };
    let claims_still_kept = leave_with_the_namespace(input, &mut writes);
    Decision {
        claims: writes.changes,
        lock_status,
        add_lock_finalizer: !deleting && !input.lock.has_finalizer,
        remove_lock_finalizer: deleting && input.lock.has_finalizer && !claims_still_kept,
        events: writes.events,
        observations: writes.observations,
        requeue_after: folder.requeue,
        backend_failure: folder.failure,
        refreshed_positions: statuses.refreshed_positions,
    }
}

/// In a namespace being deleted everything goes with the namespace: keeps only the
/// finalizer removals of claims already marked for deletion, without status, and no Event.
/// Whether claims still keep the lock (their finalizers not yet let go).
fn leave_with_the_namespace(input: &LockInput, writes: &mut ClaimWrites) -> bool {
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
        writes.changes.retain(|change| {
            change.finalizer == FinalizerChange::Remove && marked.contains(change.name.as_str())
        });
        for change in &mut writes.changes {
            change.status = None;
        }
        writes.events.clear();
    }
    // The lock stays until its claims have let go of their finalizers: with no status
    // written, only the lock's passes (which each claim's mark wakes) remove them.
    let claims_still_kept = input.lock.namespace_terminating
        && input.claims.iter().any(|claim| {
            claim.has_finalizer
                && !writes.changes.iter().any(|change| {
                    change.name == claim.name && change.finalizer == FinalizerChange::Remove
                })
        });
    claims_still_kept
}
