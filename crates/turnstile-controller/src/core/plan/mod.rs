//! Step one of a pass: from the lock, its claims, the time and a snapshot of the backend, decide
//! what each claim is heading for and which backend calls that takes, in the order they must run.
//! In two steps, a module each:
//!
//! 1. [`drafts`]: what each claim is heading for before anyone is admitted (held claims
//!    renew, are re-attached or end; waiting claims wait or end);
//! 2. [`admission`]: who is granted now, from the head of the queue (with the
//!    [`lock_delay`]);
//!
//! then the finalizers every claim that goes on needs first, and the calls laid out in
//! order ([`builder`]), a claim on several locks with its calls on the other locks
//! ([`members`]).

mod admission;
mod builder;
mod drafts;
mod lock_delay;
mod members;

use turnstile_api::{reasons, ClaimPhase};

use super::model::{BackendView, ClaimView, LockInput, Seconds};
use super::ops::{CallTerms, PlannedOp};
use builder::{Builder, OpRef};
use lock_delay::lock_delay_end;

/// How the lock as a whole is being served in this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// Normal operation.
    Serving,
    /// No new grants: the `Ready` condition explains why.
    Blocked {
        reason: &'static str,
        message: String,
    },
    /// The lock is being deleted: every grant ends.
    Deleting,
}

/// What a claim is heading for in this pass. `Op` names the backend call it depends on:
/// an index into [`Plan::ops`] once the calls are laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Intent<Op = usize> {
    /// Held and staying held, nothing to tell the backend.
    KeepHeld,
    /// Held; extend the lease to `expiry`.
    Renew { expiry: Seconds, op: Op },
    /// Held but missing from the backend: take it again with the recorded token.
    Reattach {
        expiry: Seconds,
        renewed: bool,
        op: Op,
    },
    /// Pending and at the head of the queue with a free slot: grant until `expiry`.
    Grant { expiry: Seconds, op: Op },
    /// Pending, waiting in the queue.
    Queue,
    /// Ends in a terminal phase now.
    End {
        phase: ClaimPhase,
        reason: &'static str,
        message: String,
        /// `releasedAt`, when a grant ends.
        released_at: Option<Seconds>,
        release_op: Option<Op>,
    },
    /// Already terminal: the status stays as it is.
    Terminal { release_op: Option<Op> },
    /// Being deleted: release, then let it go.
    Delete { release_op: Option<Op> },
    /// Pending, but its lock is being deleted.
    LockGone,
    /// Pending on several locks, one of which does not exist or is being deleted: queued
    /// nowhere until it does.
    OtherLockGone { lock: String },
    /// A claim on several locks of which this is not the first: this pass only keeps its
    /// place (a slot while held, its turn while waiting) and writes nothing about it.
    KeptPlace {
        /// Waiting (counted in the lock's queue).
        waiting: bool,
    },
}

impl<Op> Intent<Op> {
    /// The same intent with its backend call renamed by `rename`.
    fn map_op<New>(self, rename: impl Fn(Op) -> New) -> Intent<New> {
        match self {
            Intent::KeepHeld => Intent::KeepHeld,
            Intent::Renew { expiry, op } => Intent::Renew {
                expiry,
                op: rename(op),
            },
            Intent::Reattach {
                expiry,
                renewed,
                op,
            } => Intent::Reattach {
                expiry,
                renewed,
                op: rename(op),
            },
            Intent::Grant { expiry, op } => Intent::Grant {
                expiry,
                op: rename(op),
            },
            Intent::Queue => Intent::Queue,
            Intent::End {
                phase,
                reason,
                message,
                released_at,
                release_op,
            } => Intent::End {
                phase,
                reason,
                message,
                released_at,
                release_op: release_op.map(rename),
            },
            Intent::Terminal { release_op } => Intent::Terminal {
                release_op: release_op.map(rename),
            },
            Intent::Delete { release_op } => Intent::Delete {
                release_op: release_op.map(rename),
            },
            Intent::LockGone => Intent::LockGone,
            Intent::OtherLockGone { lock } => Intent::OtherLockGone { lock },
            Intent::KeptPlace { waiting } => Intent::KeptPlace { waiting },
        }
    }
}

/// Step one's result: the backend calls to perform, in order, and what the core will make of
/// their answers in step two ([`super::fold`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Claims (by name) that need the controller's finalizer before any backend call.
    pub finalizers_to_add: Vec<String>,
    /// The backend calls, in the order they must run (see [`ExecutionGate`](super::ExecutionGate)).
    pub ops: Vec<PlannedOp>,
    /// The lock's terms every call of this pass is made under.
    pub terms: CallTerms,
    pub(crate) mode: LockMode,
    /// Claim indices of the input, in queue order, with their intents.
    pub(crate) intents: Vec<(usize, Intent)>,
    /// The fencing high-water mark known from the API (lock status and every claim's token).
    pub(crate) high_water: u64,
    /// The end of the lock-delay (`lockDelaySeconds` after the latest involuntary end of a
    /// grant, or the one the lock status records): no grant before it.
    pub(crate) locked_until: Option<Seconds>,
    /// Claims on several locks, not first on this one, that this lock would admit now (at the
    /// head of its queue with room): their first lock's pass may grant them.
    pub admits_for_other_locks: Vec<String>,
}

impl Plan {
    /// The fencing high-water mark known from the API: every grant of this pass is above it.
    pub fn high_water(&self) -> u64 {
        self.high_water
    }
}

impl<Op> Intent<Op> {
    /// Whether the claim holds (or is granted) after the pass, as far as the plan knows.
    fn holds(&self) -> bool {
        matches!(
            self,
            Intent::KeepHeld
                | Intent::Renew { .. }
                | Intent::Reattach { .. }
                | Intent::Grant { .. }
                | Intent::KeptPlace { .. }
        )
    }
}

/// [`Intent`] before the calls are laid out.
type Draft = Intent<OpRef>;

fn mode_of(input: &LockInput) -> LockMode {
    if input.lock.deleting {
        return LockMode::Deleting;
    }
    if let Some(problem) = input.lock.spec_problem() {
        return LockMode::Blocked {
            reason: reasons::INVALID_SPEC,
            message: problem,
        };
    }
    match &input.backend {
        BackendView::NotConfigured { backend } => LockMode::Blocked {
            reason: reasons::BACKEND_NOT_CONFIGURED,
            message: format!("the controller has no {backend} backend configured"),
        },
        BackendView::Unavailable { message, .. } => LockMode::Blocked {
            reason: reasons::BACKEND_UNAVAILABLE,
            message: message.clone(),
        },
        BackendView::Ready { .. } => LockMode::Serving,
    }
}

/// Whether a held claim holds alone: in the mode it was granted in, as the backend records it
/// (an omitted mode follows `maxHolders`, which may have changed since the grant).
fn holds_exclusively(input: &LockInput, claim: &ClaimView) -> bool {
    let granted_shared = input
        .backend
        .holder(&claim.owner_token)
        .map(|h| h.share == turnstile_lock::ShareMode::Shared);
    !granted_shared.unwrap_or(claim.shared(&input.lock))
}

/// Step one of a pass (pure): what every claim is heading for and the backend calls needed.
pub fn plan(input: &LockInput) -> Plan {
    let now = input.now_seconds();
    let mode = mode_of(input);
    let high_water = input
        .claims
        .iter()
        .filter_map(ClaimView::fencing_token)
        .fold(input.lock.fencing_high_water(), u64::max);
    let mut builder = Builder::new(input, high_water);
    let mut all = drafts::drafts(&mut builder, &mode, now);
    let locked_until = lock_delay_end(input, &all.drafts);
    let admitted = admission::admit(&mut builder, &mut all, &mode, high_water, locked_until, now);
    for (index, draft) in &all.drafts {
        if !draft.holds() {
            builder.give_back_members(&input.claims[*index]);
        }
    }
    let finalizers_to_add = finalizers_to_add(input, &all.drafts);
    let (ops, resolve) = builder.layout(admitted.floor);
    let intents = all
        .drafts
        .into_iter()
        .map(|(index, draft)| {
            let name = input.claims[index].name.as_str();
            (index, draft.map_op(|op| resolve(op, name)))
        })
        .collect();
    Plan {
        finalizers_to_add,
        ops,
        terms: CallTerms::of(&input.lock),
        mode,
        intents,
        high_water,
        locked_until,
        admits_for_other_locks: admitted.admits_for_other_locks,
    }
}

/// Claims that go on (held or queued) get the finalizer before any backend call, so that a
/// grant is always released before its claim can go away. Claims ending now need none.
fn finalizers_to_add(input: &LockInput, drafts: &[(usize, Draft)]) -> Vec<String> {
    drafts
        .iter()
        .filter(|(index, draft)| {
            let goes_on = matches!(
                draft,
                Draft::KeepHeld
                    | Draft::Renew { .. }
                    | Draft::Reattach { .. }
                    | Draft::Grant { .. }
                    | Draft::Queue
            );
            goes_on && !input.claims[*index].has_finalizer
        })
        .map(|(index, _)| input.claims[*index].name.clone())
        .collect()
}
