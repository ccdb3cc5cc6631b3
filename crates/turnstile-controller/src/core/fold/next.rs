//! Step 1a of the fold: one claim's status after the pass, from its intent and the answer
//! to its backend call.

use turnstile_api::{reasons, ClaimPhase};

use super::{Folder, Next, MAX_BUSY_RETRY, MIN_BUSY_RETRY};
use crate::core::busy::fails_when_busy;
use crate::core::execution::{member_tokens, step_outcome};
use crate::core::model::{ClaimView, Seconds};
use crate::core::ops::OpOutcome;
use crate::core::orphan::lock_not_found;
use crate::core::plan::Intent;
use crate::core::status::{held_status, pending_status, terminal_status};

impl Folder<'_> {
    /// What the claim's call at `op` came to, its calls on other locks included.
    fn step_outcome(&self, op: usize) -> OpOutcome {
        step_outcome(&self.plan.ops, self.outcomes, op)
    }

    /// `claim` with the grants its step at `op` took on its other locks (a claim on several
    /// locks records each lock's token in `status.locks`).
    fn with_member_grants(&self, claim: &ClaimView, op: usize) -> ClaimView {
        let mut claim = claim.clone();
        for (lock, token) in member_tokens(&self.plan.ops, self.outcomes, op) {
            if let Some(member) = claim.members.iter_mut().find(|member| member.name == lock) {
                member.fencing_token = Some(token);
            }
        }
        claim
    }

    /// The claim's status after the pass, as its intent and its call's answer make it.
    pub(super) fn next(&mut self, claim: &ClaimView, intent: &Intent) -> Next {
        match intent {
            Intent::KeepHeld => {
                // A pending renewal is only recorded once the backend extends the grant, but
                // the claim is not expired before the renewed expiry.
                let (expiry, _) =
                    crate::core::expiry::held_expiry(self.input, claim, &self.plan.mode);
                self.wake_at(expiry);
                self.held_until(claim, self.recorded_expiry(claim))
            }
            Intent::Renew { expiry, op } => self.renewed(claim, *expiry, *op),
            Intent::Reattach {
                expiry,
                renewed,
                op,
            } => self.reattached(claim, *expiry, *renewed, *op),
            Intent::Grant { expiry, op } => self.granted(claim, *expiry, *op),
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

    /// A holder whose renewal was asked of the backend.
    fn renewed(&mut self, claim: &ClaimView, expiry: Seconds, op: usize) -> Next {
        match self.step_outcome(op) {
            OpOutcome::Extended { still_held: true } => self.still_held(claim, expiry),
            OpOutcome::Extended { still_held: false } => self.lost(
                claim,
                "the backend no longer held the grant when it was renewed".to_owned(),
            ),
            other => {
                self.note_failure(&other);
                let recorded = self.recorded_expiry(claim);
                self.still_held(claim, recorded)
            }
        }
    }

    /// A holder whose grant the backend was asked to confirm (re-attach) with its own token.
    fn reattached(&mut self, claim: &ClaimView, expiry: Seconds, renewed: bool, op: usize) -> Next {
        let recorded_token = claim.fencing_token().unwrap_or(0);
        let expiry = if renewed {
            expiry
        } else {
            self.recorded_expiry(claim)
        };
        match self.step_outcome(op) {
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
                    "the backend lost the grant and someone else holds the lock now".to_owned(),
                )
            }
            other => {
                self.note_failure(&other);
                let recorded = self.recorded_expiry(claim);
                self.still_held(claim, recorded)
            }
        }
    }

    /// A waiter the backend was asked to grant.
    fn granted(&mut self, claim: &ClaimView, expiry: Seconds, op: usize) -> Next {
        match self.step_outcome(op) {
            OpOutcome::Granted { fencing_token, .. } if fencing_token > self.plan.high_water => {
                self.wake_for_grant(claim, expiry);
                let claim = &self.with_member_grants(claim, op);
                Next::status(held_status(
                    claim,
                    claim.holder_identity(),
                    fencing_token,
                    self.now,
                    expiry,
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
        }
    }
}
