//! Step one of a pass: from the lock, its claims, the time and a snapshot of the backend, decide
//! what each claim is heading for and which backend calls that takes, in the order they must run.

use std::time::Duration;

use super::busy;
use super::expiry::{backend_lease_outlasts, backend_ttl, held_expiry};
use super::model::{BackendView, ClaimView, LockInput, OwnerState, Seconds, WorkloadKind};
use super::ops::{AcquirePurpose, BackendOp, CallTerms, PlannedOp, LEASE_CUT};
use turnstile_api::{reasons, ClaimPhase};

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
    /// Whether the plan needs the backend at all.
    pub fn has_ops(&self) -> bool {
        !self.ops.is_empty()
    }

    /// The fencing high-water mark known from the API: every grant of this pass is above it.
    pub fn high_water(&self) -> u64 {
        self.high_water
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

/// Collects the backend calls by group; [`Builder::layout`] puts the groups in order.
struct Builder<'a> {
    input: &'a LockInput,
    releases: Vec<PlannedOp>,
    /// `(recorded token, claim name, owner, ttl, shared)` of grants to take back.
    reattaches: Vec<(u64, String, String, Duration, bool)>,
    extends: Vec<PlannedOp>,
    grants: Vec<PlannedOp>,
}

/// A call in one of the [`Builder`]'s groups, before the final layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpRef {
    Release(usize),
    Extend(usize),
    Grant(usize),
    /// Re-attaches are laid out by token; found by claim name.
    Reattach,
}

impl<'a> Builder<'a> {
    fn release(&mut self, claim: &ClaimView) -> OpRef {
        self.push_release(claim, false)
    }

    fn push_release(&mut self, claim: &ClaimView, involuntary: bool) -> OpRef {
        let owner = claim.uid.clone();
        let op = BackendOp::Release { owner, involuntary };
        self.releases.push(PlannedOp::for_claim(claim, op));
        OpRef::Release(self.releases.len() - 1)
    }

    /// The release of a held grant that ends now for `reason`: an involuntary end on a lock
    /// with a lock-delay cuts the lease (see [`BackendOp::Release`]).
    fn end_held(&mut self, claim: &ClaimView, reason: &str) -> Option<OpRef> {
        let involuntary = starts_lock_delay(self.input, reason);
        match &self.input.backend {
            BackendView::Ready { .. } => Some(self.push_release(claim, involuntary)),
            _ => None,
        }
    }

    /// A release when the backend holds (or, by the API, should hold) a grant for `claim`.
    /// Without an answer from the backend nothing is planned: the caller keeps finalizers
    /// until the backend answers.
    fn release_if_held(&mut self, claim: &ClaimView, recorded_held: bool) -> Option<OpRef> {
        match &self.input.backend {
            BackendView::Ready { .. } if recorded_held || self.input.backend.holds(&claim.uid) => {
                Some(self.release(claim))
            }
            _ => None,
        }
    }

    fn extend(&mut self, claim: &ClaimView, ttl: Duration) -> OpRef {
        let owner = claim.uid.clone();
        let op = BackendOp::Extend { owner, ttl };
        self.extends.push(PlannedOp::for_claim(claim, op));
        OpRef::Extend(self.extends.len() - 1)
    }

    fn grant(&mut self, claim: &ClaimView, ttl: Duration) -> OpRef {
        let op = BackendOp::Acquire {
            owner: claim.uid.clone(),
            ttl,
            purpose: AcquirePurpose::Grant,
            shared: claim.shared(&self.input.lock),
        };
        self.grants.push(PlannedOp::for_claim(claim, op));
        OpRef::Grant(self.grants.len() - 1)
    }

    fn reattach(&mut self, claim: &ClaimView, ttl: Duration) -> OpRef {
        let token = claim.fencing_token().unwrap_or(0);
        self.reattaches.push((
            token,
            claim.name.clone(),
            claim.uid.clone(),
            ttl,
            claim.shared(&self.input.lock),
        ));
        OpRef::Reattach
    }

    /// Orders the calls: releases free slots first; re-attached grants take their own tokens
    /// back, ascending (the floor is raised to just below each); renewals; the floor is raised
    /// to the high-water mark; new grants come last, above it. Returns the calls and a
    /// resolver from [`OpRef`] (with the claim name) to the index in the list.
    fn layout(mut self, floor: Option<u64>) -> (Vec<PlannedOp>, impl Fn(OpRef, &str) -> usize) {
        let mut ops = Vec::new();
        ops.append(&mut self.releases);
        let release_base = 0;
        self.reattaches.sort_by_key(|(token, ..)| *token);
        let mut reattach_at = std::collections::HashMap::new();
        for (token, claim, owner, ttl, shared) in self.reattaches {
            ops.push(PlannedOp {
                claim: None,
                op: BackendOp::RaiseFloor {
                    floor: token.saturating_sub(1),
                },
            });
            reattach_at.insert(claim.clone(), ops.len());
            ops.push(PlannedOp {
                claim: Some(claim),
                op: BackendOp::Acquire {
                    owner,
                    ttl,
                    purpose: AcquirePurpose::Reattach,
                    shared,
                },
            });
        }
        let extend_base = ops.len();
        ops.append(&mut self.extends);
        if let Some(floor) = floor {
            ops.push(PlannedOp {
                claim: None,
                op: BackendOp::RaiseFloor { floor },
            });
        }
        let grant_base = ops.len();
        ops.append(&mut self.grants);
        let resolve = move |op: OpRef, claim: &str| match op {
            OpRef::Release(i) => release_base + i,
            OpRef::Extend(i) => extend_base + i,
            OpRef::Grant(i) => grant_base + i,
            OpRef::Reattach => reattach_at.get(claim).copied().unwrap_or(usize::MAX),
        };
        (ops, resolve)
    }
}

/// [`Intent`] before the calls are laid out.
type Draft = Intent<OpRef>;

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

/// What a held claim is heading for.
fn held_draft(
    builder: &mut Builder<'_>,
    mode: &LockMode,
    claim: &ClaimView,
    now: Seconds,
) -> Draft {
    let input = builder.input;
    if *mode == LockMode::Deleting {
        return Draft::End {
            phase: ClaimPhase::Expired,
            reason: reasons::LOCK_DELETED,
            message: format!("lock {} was deleted", input.lock.name),
            released_at: Some(now),
            release_op: builder.end_held(claim, reasons::LOCK_DELETED),
        };
    }
    if let Some(gone) = claim.members.iter().find(|member| !member.exists) {
        return Draft::End {
            phase: ClaimPhase::Expired,
            reason: reasons::LOCK_DELETED,
            message: format!("lock {} was deleted", gone.name),
            released_at: Some(now),
            release_op: builder.end_held(claim, reasons::LOCK_DELETED),
        };
    }
    if let Some(force) = &claim.force_release {
        return Draft::End {
            phase: ClaimPhase::Expired,
            reason: reasons::FORCE_RELEASED,
            message: force.message(&input.lock.name),
            released_at: Some(now),
            release_op: builder.end_held(claim, reasons::FORCE_RELEASED),
        };
    }
    if claim.release_requested() {
        return Draft::End {
            phase: ClaimPhase::Released,
            reason: reasons::RELEASE_REQUESTED,
            message: "released on request (spec.release)".to_owned(),
            released_at: Some(now),
            release_op: builder.end_held(claim, reasons::RELEASE_REQUESTED),
        };
    }
    if let Some((reason, message)) = owner_ending(claim) {
        return Draft::End {
            phase: ClaimPhase::Released,
            reason,
            message,
            released_at: Some(now),
            release_op: builder.end_held(claim, reason),
        };
    }
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
    if !input.backend.holds(&claim.uid) || member_lost {
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

/// Whether a held claim holds alone: in the mode it was granted in, as the backend records it
/// (an omitted mode follows `maxHolders`, which may have changed since the grant).
fn holds_exclusively(input: &LockInput, claim: &ClaimView) -> bool {
    let granted_shared = input
        .backend
        .holder(&claim.uid)
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

    let order = super::queue::queue_order(&input.claims);
    let replaced = busy::replacements(input);

    let mut builder = Builder {
        input,
        releases: Vec::new(),
        reattaches: Vec::new(),
        extends: Vec::new(),
        grants: Vec::new(),
    };
    let mut drafts: Vec<(usize, Draft)> = Vec::with_capacity(order.len());
    let mut finalizers_to_add = Vec::new();
    let mut queue: Vec<usize> = Vec::new();
    let mut held = 0usize;
    let mut held_exclusive = false;

    for &index in &order {
        let claim = &input.claims[index];
        let phase = claim.phase();
        let draft = if claim.kept_by(&input.lock.name) {
            let live = !claim.deleting && !phase.is_terminal();
            if mode == LockMode::Deleting {
                // The lock goes: its part of the grant goes with it (nobody is granted the
                // lock again); the first lock's pass ends the claim.
                builder.release_if_held(claim, false);
                Draft::KeptPlace { waiting: false }
            } else if phase == ClaimPhase::Held {
                // Deleted or not, it holds until its first lock's pass gives the grant back.
                held += 1;
                held_exclusive |= holds_exclusively(input, claim);
                Draft::KeptPlace { waiting: false }
            } else if live {
                queue.push(drafts.len());
                Draft::KeptPlace { waiting: true }
            } else {
                Draft::KeptPlace { waiting: false }
            }
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
        } else {
            if phase == ClaimPhase::Held {
                let draft = match replaced.get(&index) {
                    Some(replacement) if mode != LockMode::Deleting => Draft::End {
                        phase: ClaimPhase::Expired,
                        reason: reasons::SUPERSEDED,
                        message: replacement.message(true),
                        released_at: Some(now),
                        release_op: builder.end_held(claim, reasons::SUPERSEDED),
                    },
                    _ => held_draft(&mut builder, &mode, claim, now),
                };
                if !matches!(draft, Draft::End { .. }) {
                    held += 1;
                    held_exclusive |= holds_exclusively(input, claim);
                }
                draft
            } else if mode == LockMode::Deleting {
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
            } else if let Some(replacement) = replaced.get(&index) {
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
                queue.push(drafts.len());
                Draft::Queue
            }
        };
        drafts.push((index, draft));
    }

    let locked_until = lock_delay_end(input, &drafts);
    let mut admits_for_other_locks = Vec::new();
    // Grants this pass ends are written by this lock's pass before its own grants; another
    // lock's pass, which admits through this plan but writes nothing here, counts them until
    // they are written (so the API never shows more holders than `maxHolders`).
    let (ending, ending_exclusive) = drafts
        .iter()
        .filter(|(index, draft)| {
            let claim = &input.claims[*index];
            claim.phase() == ClaimPhase::Held
                && matches!(draft, Draft::End { .. } | Draft::Delete { .. })
        })
        .fold((0usize, false), |(count, exclusive), (index, _)| {
            let claim = &input.claims[*index];
            (count + 1, exclusive || !claim.shared(&input.lock))
        });
    // Grants: the head of the queue, as many as there are free slots (none in a lock-delay).
    let mut floor = None;
    let in_lock_delay = locked_until.is_some_and(|until| until > now);
    if mode == LockMode::Serving && in_lock_delay {
        // Nobody is granted now: a claim that does not wait ends.
        for &slot in &queue {
            let claim = &input.claims[drafts[slot].0];
            if busy::fails_when_busy(claim) {
                drafts[slot].1 = busy_failure(&mut builder, claim);
            }
        }
    }
    if mode == LockMode::Serving && !in_lock_delay {
        let snapshot = input.backend.snapshot();
        if high_water > snapshot.map_or(0, |s| s.fencing_token) {
            floor = Some(high_water);
        }
        // Admission walks the queue and stops at the first claim that does not fit: shared
        // claims hold together up to maxHolders, an exclusive one alone, and a waiting
        // exclusive claim keeps later shared ones from overtaking it.
        // On a `FirstRunnable` lock a claim that does not fit blocks nobody while it may
        // still be passed: claims behind it that fit are granted (each pass walks the whole
        // queue, so they are found); once its window closes the lock drains for it.
        let max = input.lock.max_holders() as usize;
        let may_be_passed = |claim: &ClaimView| input.lock.may_be_passed(claim.created, now);
        let (mut holding, mut exclusive, mut blocked) = (held, held_exclusive, false);
        for &slot in &queue {
            let claim = &input.claims[drafts[slot].0];
            let backend_token = input
                .backend
                .holder(&claim.uid)
                .map(|holder| holder.fencing_token);
            let shared = claim.shared(&input.lock);
            let fits = !blocked
                && if shared {
                    !exclusive && holding < max
                } else {
                    holding == 0
                };
            if claim.kept_by(&input.lock.name) {
                // Its turn here: the slot is kept for it (nobody behind overtakes it) while
                // its first lock's pass takes all its locks at once. Its backend grant is
                // that pass's to make and to give back.
                let room_now = if shared {
                    !ending_exclusive && holding + ending < max
                } else {
                    ending == 0
                };
                if fits && room_now {
                    admits_for_other_locks.push(claim.name.clone());
                }
                if may_be_passed(claim) {
                    // Its first lock grants it when all its locks are free at once; the slot
                    // is not kept idle for it meanwhile.
                    continue;
                }
                blocked |= !(fits && room_now);
                if fits && room_now {
                    holding += 1;
                    exclusive |= !shared;
                }
                continue;
            }
            // On several locks, granted only when every other lock admits it too; until then
            // it waits at the head here as well.
            let fits = fits
                && (!claim.is_multi_lock() || claim.members.len() + 1 == claim.locks.len())
                && claim.members.iter().all(|member| member.admits);
            if !fits && busy::fails_when_busy(claim) {
                // It does not wait, so it holds nobody up either.
                drafts[slot].1 = busy_failure(&mut builder, claim);
                continue;
            }
            blocked |= !fits && !may_be_passed(claim);
            if fits {
                holding += 1;
                exclusive |= !shared;
                // A grant the backend made in an earlier pass whose status write failed is
                // re-used, unless a later grant was announced meanwhile: then it is taken
                // again, so announced tokens keep increasing.
                if backend_token.is_some_and(|token| token <= high_water) {
                    builder.release(claim);
                }
                let lease_end = now.saturating_add(claim.lease_seconds(&input.lock));
                let expiry = claim
                    .hold_deadline(&input.lock, now)
                    .map_or(lease_end, |deadline| lease_end.min(deadline));
                let ttl = backend_ttl(input, expiry);
                drafts[slot].1 = Draft::Grant {
                    expiry,
                    op: builder.grant(claim, ttl),
                };
            } else if backend_token.is_some() {
                // Granted in an earlier pass but no longer at the head: give the slot back.
                builder.release(claim);
            }
        }
    }

    // Claims that go on (held or queued) get the finalizer before any backend call, so that
    // a grant is always released before its claim can go away. Claims ending now need none.
    for (index, draft) in &drafts {
        let claim = &input.claims[*index];
        let goes_on = matches!(
            draft,
            Draft::KeepHeld
                | Draft::Renew { .. }
                | Draft::Reattach { .. }
                | Draft::Grant { .. }
                | Draft::Queue
        );
        if goes_on && !claim.has_finalizer {
            finalizers_to_add.push(claim.name.clone());
        }
    }

    let (ops, resolve) = builder.layout(floor);
    let intents = drafts
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
        admits_for_other_locks,
    }
}

/// The end of the lock-delay: the one recorded in the lock's status, or `lockDelaySeconds`
/// after a grant this pass ends involuntarily (its lease or maximum hold ran out, its owner
/// vanished), whichever is later. A release, on request or by a finished owner, delays
/// nothing. The delay runs from the end of the lease this pass cuts (rounded up to the
/// second), not from the end the status recorded: that is when the backend's own delay
/// starts, so the backend never refuses the grant the plan makes when the delay is over.
fn lock_delay_end(input: &LockInput, drafts: &[(usize, Draft)]) -> Option<Seconds> {
    let delay = input.lock.lock_delay_seconds();
    // The cut lease runs out LEASE_CUT after now; whole seconds, rounded up.
    let cut_lease_end = i64::from(input.now.subsec_nanosecond())
        + i64::try_from(LEASE_CUT.as_nanos()).unwrap_or(i64::MAX);
    let ended_now = input
        .now
        .as_second()
        .saturating_add((cut_lease_end + 999_999_999) / 1_000_000_000);
    let starts_delay = drafts.iter().any(|(_, draft)| {
        matches!(draft, Draft::End { reason, released_at: Some(_), .. }
            if starts_lock_delay(input, reason))
    });
    starts_delay
        .then(|| ended_now.saturating_add(delay))
        .into_iter()
        .chain(input.lock.locked_until())
        .max()
}

/// Whether a grant of this lock ending for `reason` starts a lock-delay.
fn starts_lock_delay(input: &LockInput, reason: &str) -> bool {
    input.lock.lock_delay_seconds() > 0 && INVOLUNTARY_ENDS.contains(&reason)
}

/// The reasons a grant ends without its holder asking: they start a lock-delay (a cancelled
/// or force-released holder may still be at work for a moment, like one whose lease ran out).
const INVOLUNTARY_ENDS: [&str; 5] = [
    reasons::LEASE_EXPIRED,
    reasons::MAX_HOLD_EXCEEDED,
    reasons::OWNER_GONE,
    reasons::SUPERSEDED,
    reasons::FORCE_RELEASED,
];

/// The end of a claim with `whenBusy: Fail` that the lock cannot grant now (a grant an
/// earlier pass made for it in the backend is given back).
fn busy_failure(builder: &mut Builder<'_>, claim: &ClaimView) -> Draft {
    Draft::End {
        phase: ClaimPhase::Failed,
        reason: reasons::LOCK_BUSY,
        message: busy::BUSY_MESSAGE.to_owned(),
        released_at: None,
        release_op: builder.release_if_held(claim, false),
    }
}
