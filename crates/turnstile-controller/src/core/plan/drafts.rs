//! Step 1 of the plan: what each claim is heading for, in queue order, before anyone is
//! admitted. A held claim keeps holding, renews, is re-attached or ends; a waiting claim
//! waits or ends; a claim being deleted or already ended gives back what it holds; a claim
//! on several locks whose first lock is another only keeps its place here.

use turnstile_api::{reasons, ClaimPhase};

use super::builder::{Builder, OpRef};
use super::{holds_exclusively, Draft, LockMode};
use crate::core::busy::{self, Replacement};
use crate::core::expiry::{backend_lease_outlasts, backend_ttl, held_expiry};
use crate::core::model::{ClaimView, OwnerState, Seconds, WorkloadKind};
use crate::core::queue::queue_order;

/// Every claim's draft, in queue order.
pub(super) struct Drafts {
    /// `(claim index, draft)`, in queue order.
    pub drafts: Vec<(usize, Draft)>,
    /// The slots in `drafts` of the claims that wait, in queue order.
    pub queue: Vec<usize>,
    /// How many claims go on holding.
    pub held: usize,
    /// Whether one of them holds alone.
    pub held_exclusive: bool,
}

impl Drafts {
    /// Counts a claim that goes on holding.
    fn holds(&mut self, builder: &Builder<'_>, claim: &ClaimView) {
        self.held += 1;
        self.held_exclusive |= holds_exclusively(builder.input, claim);
    }

    /// Puts the claim about to be drafted in the queue.
    fn waits(&mut self) {
        self.queue.push(self.drafts.len());
    }
}

/// Each claim's draft (see the module docs).
pub(super) fn drafts(builder: &mut Builder<'_>, mode: &LockMode, now: Seconds) -> Drafts {
    let input = builder.input;
    let order = queue_order(&input.claims);
    let replaced = busy::replacements(input);
    let mut all = Drafts {
        drafts: Vec::with_capacity(order.len()),
        queue: Vec::new(),
        held: 0,
        held_exclusive: false,
    };
    for &index in &order {
        let claim = &input.claims[index];
        let phase = claim.phase();
        let draft = if claim.kept_by(&input.lock.name) {
            kept_draft(builder, mode, claim, &mut all)
        } else if claim.deleting {
            // Without our finalizer nobody waits for us: the claim simply goes away.
            let release = if claim.has_finalizer {
                builder.release_if_held(claim, phase == ClaimPhase::Held)
            } else {
                None
            };
            Draft::Delete {
                release_op: release,
            }
        } else if phase.is_terminal() {
            Draft::Terminal {
                release_op: builder.release_if_held(claim, false),
            }
        } else if phase == ClaimPhase::Held {
            let draft = match replaced.get(&index) {
                Some(replacement) if *mode != LockMode::Deleting => Draft::End {
                    phase: ClaimPhase::Expired,
                    reason: reasons::SUPERSEDED,
                    message: replacement.message(true),
                    released_at: Some(now),
                    release_op: builder.end_held(claim, reasons::SUPERSEDED),
                },
                _ => held_draft(builder, mode, claim, now),
            };
            if !matches!(draft, Draft::End { .. }) {
                all.holds(builder, claim);
            }
            draft
        } else {
            waiting_draft(builder, mode, claim, replaced.get(&index), now, &mut all)
        };
        all.drafts.push((index, draft));
    }
    all
}

/// A claim on several locks of which this is not the first: it keeps a slot while held and
/// its turn while waiting; its first lock's pass grants and ends it.
fn kept_draft(
    builder: &mut Builder<'_>,
    mode: &LockMode,
    claim: &ClaimView,
    all: &mut Drafts,
) -> Draft {
    let phase = claim.phase();
    let live = !claim.deleting && !phase.is_terminal();
    if *mode == LockMode::Deleting {
        // The lock goes: its part of the grant goes with it (nobody is granted the
        // lock again); the first lock's pass ends the claim.
        builder.release_if_held(claim, false);
        Draft::KeptPlace { waiting: false }
    } else if phase == ClaimPhase::Held {
        // Deleted or not, it holds until its first lock's pass gives the grant back.
        all.holds(builder, claim);
        Draft::KeptPlace { waiting: false }
    } else if live {
        all.waits();
        Draft::KeptPlace { waiting: true }
    } else {
        Draft::KeptPlace { waiting: false }
    }
}

/// A claim that is not held (nor deleted, nor ended): it waits, or ends now.
fn waiting_draft(
    builder: &mut Builder<'_>,
    mode: &LockMode,
    claim: &ClaimView,
    replaced: Option<&Replacement>,
    now: Seconds,
    all: &mut Drafts,
) -> Draft {
    if *mode == LockMode::Deleting {
        builder.release_if_held(claim, false);
        Draft::LockGone
    } else if let Some((phase, reason, message)) = pending_ending(claim, now) {
        Draft::End {
            phase,
            reason,
            message,
            released_at: None,
            release_op: builder.release_if_held(claim, false),
        }
    } else if let Some(replacement) = replaced {
        Draft::End {
            phase: ClaimPhase::Failed,
            reason: reasons::SUPERSEDED,
            message: replacement.message(false),
            released_at: None,
            release_op: builder.release_if_held(claim, false),
        }
    } else if let Some(gone) = claim.members.iter().find(|member| !member.exists) {
        builder.release_if_held(claim, false);
        Draft::OtherLockGone {
            lock: gone.name.clone(),
        }
    } else {
        all.waits();
        Draft::Queue
    }
}

/// Why a claim ends because of its owner, if it does.
fn owner_ending(claim: &ClaimView) -> Option<(&'static str, String)> {
    let owner = claim.owner.as_ref()?;
    let kind = match owner.kind {
        WorkloadKind::Pod => "Pod",
        WorkloadKind::Job => "Job",
    };
    match claim.owner_state {
        OwnerState::Finished => Some((
            reasons::OWNER_FINISHED,
            format!("owner {kind} {} finished", owner.name),
        )),
        OwnerState::Gone => Some((
            reasons::OWNER_GONE,
            format!("owner {kind} {} no longer exists", owner.name),
        )),
        _ => None,
    }
}

/// Why a claim that is not held ends now, if it does.
fn pending_ending(claim: &ClaimView, now: Seconds) -> Option<(ClaimPhase, &'static str, String)> {
    if let Some(problem) = claim.spec_problem() {
        return Some((ClaimPhase::Failed, reasons::INVALID_SPEC, problem));
    }
    if claim.release_requested() {
        return Some((
            ClaimPhase::Released,
            reasons::WITHDRAWN,
            "withdrawn (spec.release) before it was granted".to_owned(),
        ));
    }
    if let Some((reason, message)) = owner_ending(claim) {
        return Some((ClaimPhase::Released, reason, message));
    }
    if claim
        .acquire_deadline()
        .is_some_and(|deadline| deadline <= now)
    {
        return Some((
            ClaimPhase::Failed,
            reasons::ACQUIRE_TIMEOUT,
            format!(
                "not granted within acquireTimeoutSeconds ({}s)",
                claim.spec.acquire_timeout_seconds.unwrap_or_default()
            ),
        ));
    }
    None
}

/// Why a held claim ends now for a reason other than its lease, if it does: its lock or
/// another of its locks deleted, force-released, released on request, its owner finished.
fn held_ending(
    builder: &mut Builder<'_>,
    mode: &LockMode,
    claim: &ClaimView,
    now: Seconds,
) -> Option<Draft> {
    let input = builder.input;
    if *mode == LockMode::Deleting {
        return Some(Draft::End {
            phase: ClaimPhase::Expired,
            reason: reasons::LOCK_DELETED,
            message: format!("lock {} was deleted", input.lock.name),
            released_at: Some(now),
            release_op: builder.end_held(claim, reasons::LOCK_DELETED),
        });
    }
    if let Some(gone) = claim.members.iter().find(|member| !member.exists) {
        return Some(Draft::End {
            phase: ClaimPhase::Expired,
            reason: reasons::LOCK_DELETED,
            message: format!("lock {} was deleted", gone.name),
            released_at: Some(now),
            release_op: builder.end_held(claim, reasons::LOCK_DELETED),
        });
    }
    if let Some(force) = &claim.force_release {
        return Some(Draft::End {
            phase: ClaimPhase::Expired,
            reason: reasons::FORCE_RELEASED,
            message: force.message(&input.lock.name),
            released_at: Some(now),
            release_op: builder.end_held(claim, reasons::FORCE_RELEASED),
        });
    }
    if claim.release_requested() {
        return Some(Draft::End {
            phase: ClaimPhase::Released,
            reason: reasons::RELEASE_REQUESTED,
            message: "released on request (spec.release)".to_owned(),
            released_at: Some(now),
            release_op: builder.end_held(claim, reasons::RELEASE_REQUESTED),
        });
    }
    if let Some((reason, message)) = owner_ending(claim) {
        return Some(Draft::End {
            phase: ClaimPhase::Released,
            reason,
            message,
            released_at: Some(now),
            release_op: builder.end_held(claim, reason),
        });
    }
    None
}

/// What a held claim is heading for.
fn held_draft(
    builder: &mut Builder<'_>,
    mode: &LockMode,
    claim: &ClaimView,
    now: Seconds,
) -> Draft {
    if let Some(ending) = held_ending(builder, mode, claim, now) {
        return ending;
    }
    let input = builder.input;
    let (expiry, renewed) = held_expiry(input, claim, mode);
    if expiry <= now && !backend_lease_outlasts(input, claim, expiry) {
        let (reason, message) = match claim.recorded_hold_deadline(&input.lock) {
            Some(deadline) if deadline <= expiry => (
                reasons::MAX_HOLD_EXCEEDED,
                format!(
                    "held for maxHoldSeconds ({}s), renewed or not",
                    input.lock.max_hold_seconds().unwrap_or_default()
                ),
            ),
            _ => (
                reasons::LEASE_EXPIRED,
                "the lease ran out without renewal".to_owned(),
            ),
        };
        return Draft::End {
            phase: ClaimPhase::Expired,
            reason,
            message,
            released_at: Some(expiry),
            release_op: builder.end_held(claim, reason),
        };
    }
    if *mode != LockMode::Serving {
        return Draft::KeepHeld;
    }
    let ttl = backend_ttl(input, expiry);
    // On several locks: a grant another lock's backend lost is taken again with the rest.
    let member_lost = claim
        .members
        .iter()
        .any(|member| member.holds == Some(false));
    if !input.backend.holds(&claim.owner_token) || member_lost {
        builder.reattach(claim, ttl);
        Draft::Reattach {
            expiry,
            renewed,
            op: OpRef::Reattach,
        }
    } else if renewed {
        Draft::Renew {
            expiry,
            op: builder.extend(claim, ttl),
        }
    } else {
        Draft::KeepHeld
    }
}
