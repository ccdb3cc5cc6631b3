//! Claims on several locks (`spec.lockNames`): granted all at once or not at all, by the pass of
//! the claim's *first* lock (in name order).
//!
//! Every lock of such a claim has it in its queue, in the one order all queues share
//! (priority, creation, name). The passes of the other locks only keep its place: a slot while
//! it holds, its turn while it waits — so nobody behind it overtakes it there — and they write
//! nothing about it. The first lock's pass reads the other locks (cache and one backend
//! snapshot each, [`OtherLock`]), grants when every one of them admits the claim, takes the
//! other locks' grants in name order right after its own, and gives back whatever it took if
//! one refuses ([`MemberGrants::follow`]): no backend holds part of a grant beyond the pass.
//! Renewals, re-attaching a lost grant and the release at the end follow the first lock's
//! calls onto the other locks; a claim that is not held when the pass ends keeps nothing
//! ([`MemberGrants::give_back`]).
//!
//! Why it cannot deadlock: the claim that comes first in that shared order among all waiting
//! claims is first in the queue of every lock it names, and no lock grants past the head of
//! its queue; so as holders finish it gets all its locks. Two claims on `[a, b]` and `[b, a]`
//! are both claims on `a` and `b`, taken in the same order.
//!
//! The cost of waiting at the head: a claim on several locks that has one of them and waits
//! for another keeps the first one idle (strict FIFO on each lock; nobody overtakes it).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

use crate::backend_call::perform;
use crate::core::{
    plan, BackendOp, BackendView, CallTerms, ClaimChange, ClaimView, Decision, FinalizerChange,
    LockInput, LockView, MemberLock, OpOutcome, Seconds,
};
use turnstile_api::{error_chain, ClaimPhase, LockClaimStatus};
use turnstile_lock::Backend;

/// Another lock of a claim on several locks, as the first lock's pass read it (a lock that
/// does not exist has none).
#[derive(Debug, Clone)]
pub struct OtherLock {
    /// The lock.
    pub lock: LockView,
    /// Its claims, each seen from it.
    pub claims: Vec<ClaimView>,
    /// Its backend, when the controller has one and it answered.
    pub backend: Option<Arc<dyn Backend>>,
    /// Its backend's state before the pass.
    pub view: BackendView,
}

/// The other locks the claims of the pass of `lock` need read: those of its multi-lock claims
/// that `lock` is first for and that are live or still hold a finalizer. A lock missing from
/// what [`prepare`] is given does not exist.
pub fn other_locks_needed(lock: &LockView, claims: &[ClaimView]) -> BTreeSet<String> {
    claims
        .iter()
        .filter(|claim| first_here(claim, lock))
        .filter(|claim| claim.has_finalizer || !claim.phase().is_terminal())
        .flat_map(|claim| claim.locks.iter().skip(1).cloned())
        .collect()
}

fn first_here(claim: &ClaimView, lock: &LockView) -> bool {
    claim.is_multi_lock() && claim.first_lock() == lock.name
}

/// One other lock's part of a claim's grant.
#[derive(Debug, Clone)]
struct Part {
    lock: String,
    key: String,
    backend: Option<Arc<dyn Backend>>,
    terms: CallTerms,
    /// Every new grant of this lock is above it.
    high_water: u64,
    /// Whether the backend held the claim's grant before the pass (`None`: no answer).
    holds: Option<bool>,
    /// The grant's token: as recorded, or as granted in this pass.
    token: Option<u64>,
    shared: bool,
    /// Granted in this pass.
    granted_now: bool,
}

/// Why taking a part failed: the outcome the first lock's call is given instead.
type Refusal = OpOutcome;

impl Part {
    async fn call(&self, op: &BackendOp) -> OpOutcome {
        let Some(backend) = &self.backend else {
            return OpOutcome::Failed {
                message: format!("the backend of lock {} did not answer", self.lock),
            };
        };
        perform(backend.as_ref(), &self.key, self.terms, op)
            .await
            .unwrap_or_else(|error| OpOutcome::Failed {
                message: error_chain(&error),
            })
    }

    /// A new grant above the lock's high-water mark (a grant left from an earlier pass is
    /// given back first: its token may be at or below a later announced one).
    async fn take(&mut self, owner: &str, ttl: std::time::Duration) -> Result<u64, Refusal> {
        if self.holds == Some(true) {
            self.release(owner).await?;
        }
        let floor = BackendOp::RaiseFloor {
            floor: self.high_water,
        };
        if let failed @ OpOutcome::Failed { .. } = self.call(&floor).await {
            return Err(failed);
        }
        match self.call(&self.acquire(owner, ttl)).await {
            OpOutcome::Granted { fencing_token, .. } if fencing_token > self.high_water => {
                self.token = Some(fencing_token);
                self.granted_now = true;
                Ok(fencing_token)
            }
            OpOutcome::Granted { .. } => Err(OpOutcome::Busy { retry_after: None }),
            refused => Err(refused),
        }
    }

    /// The recorded grant again, with its own token (the backend lost it).
    async fn retake(&mut self, owner: &str, ttl: std::time::Duration) -> Result<(), Refusal> {
        let Some(token) = self.token else {
            return Err(OpOutcome::Busy { retry_after: None });
        };
        let floor = BackendOp::RaiseFloor {
            floor: token.saturating_sub(1),
        };
        if let failed @ OpOutcome::Failed { .. } = self.call(&floor).await {
            return Err(failed);
        }
        match self.call(&self.acquire(owner, ttl)).await {
            OpOutcome::Granted { fencing_token, .. } if fencing_token == token => {
                // Held again: given back after the fold if the claim does not stay held.
                self.holds = Some(true);
                Ok(())
            }
            // Another token: the grant was not continuous. Given back; the claim is lost.
            OpOutcome::Granted { .. } => {
                self.release(owner).await?;
                Err(OpOutcome::Busy { retry_after: None })
            }
            refused => Err(refused),
        }
    }

    async fn release(&mut self, owner: &str) -> Result<(), Refusal> {
        let op = BackendOp::Release {
            owner: owner.to_owned(),
            involuntary: false,
        };
        match self.call(&op).await {
            OpOutcome::Released { .. } => {
                self.holds = Some(false);
                self.granted_now = false;
                Ok(())
            }
            failed => Err(failed),
        }
    }

    fn acquire(&self, owner: &str, ttl: std::time::Duration) -> BackendOp {
        BackendOp::Acquire {
            owner: owner.to_owned(),
            ttl,
            purpose: crate::core::AcquirePurpose::Grant,
            shared: self.shared,
            queue: false,
        }
    }
}

/// The other locks' parts of the grants of one pass's multi-lock claims, by claim name.
#[derive(Debug, Default)]
pub struct MemberGrants {
    parts: HashMap<String, (String, Vec<Part>)>,
}

/// The first lock's own backend, for giving its grant back when another lock refuses.
#[derive(Clone, Copy)]
pub struct FirstLock<'a> {
    /// The backend.
    pub backend: &'a dyn Backend,
    /// The lock's key in it.
    pub key: &'a str,
    /// The terms of the pass's calls.
    pub terms: CallTerms,
}

impl FirstLock<'_> {
    /// Gives `owner`'s grant on the first lock back; `involuntary` as at the end of a lease
    /// (its lock-delay starts). A grant not given back now is given back by a later pass.
    async fn release(&self, owner: &str, involuntary: bool) {
        let release = BackendOp::Release {
            owner: owner.to_owned(),
            involuntary,
        };
        let _ = perform(self.backend, self.key, self.terms, &release).await;
    }
}

/// Fills in what the pass of `lock` needs about its claims on several locks, before it plans:
/// for those it is first for, the other locks ([`MemberLock`]: do they exist, would they
/// admit the claim, do their backends hold its grant) and the shortest lease and maximum hold
/// among them; those it is not first for, naming a lock that does not exist, are dropped (they
/// are queued nowhere). Returns the parts for [`MemberGrants::follow`].
pub fn prepare(
    lock: &LockView,
    claims: &mut Vec<ClaimView>,
    others: &HashMap<String, OtherLock>,
    lock_exists: impl Fn(&str) -> bool,
    now: Timestamp,
) -> MemberGrants {
    claims.retain(|claim| {
        !claim.kept_by(&lock.name) || claim.locks.iter().all(|name| lock_exists(name))
    });
    // Each other lock's plan, once: does its queue admit the claim now?
    let plans: HashMap<&str, crate::core::Plan> = others
        .iter()
        .filter(|(_, other)| !other.lock.deleting)
        .map(|(name, other)| {
            let input = LockInput {
                lock: other.lock.clone(),
                claims: other.claims.clone(),
                now,
                backend: other.view.clone(),
                // Planned only to see whether its queue admits a claim: nothing is written.
                may_refresh_positions: false,
            };
            (name.as_str(), plan(&input))
        })
        .collect();
    let mut grants = MemberGrants::default();
    for claim in claims.iter_mut().filter(|claim| first_here(claim, lock)) {
        let mut members = Vec::new();
        let mut parts = Vec::new();
        let mut leases = vec![claim.lease_seconds(lock)];
        let mut max_holds: Vec<Seconds> = Vec::new();
        for name in claim.locks.iter().skip(1) {
            let recorded = claim
                .status
                .locks
                .iter()
                .find(|entry| &entry.lock_name == name)
                .and_then(|entry| u64::try_from(entry.fencing_token).ok());
            let other = others.get(name);
            let live = other.filter(|other| !other.lock.deleting);
            let holds = live.and_then(|other| {
                other
                    .view
                    .snapshot()
                    .map(|_| other.view.holds(&claim.owner_token))
            });
            let plan = plans.get(name.as_str());
            members.push(MemberLock {
                name: name.clone(),
                exists: live.is_some(),
                admits: plan.is_some_and(|plan| plan.admits_for_other_locks.contains(&claim.name)),
                holds,
                fencing_token: recorded,
            });
            if let Some(other) = other {
                let view = &other.lock;
                leases.push(view.lease_seconds());
                max_holds.extend(view.max_hold_seconds());
                parts.push(Part {
                    lock: name.clone(),
                    key: view.backend_key(),
                    backend: other.backend.clone(),
                    terms: CallTerms::of(view),
                    high_water: plan.map_or(0, crate::core::Plan::high_water),
                    holds,
                    token: recorded,
                    shared: claim.shared(view),
                    granted_now: false,
                });
            }
        }
        // A lease no lock would give on its own is not given: the shortest of them all.
        if claim.spec.lease_duration_seconds.is_none() {
            claim.spec.lease_duration_seconds = leases.into_iter().min();
        }
        claim.members_max_hold = max_holds.into_iter().min();
        claim.members = members;
        grants
            .parts
            .insert(claim.name.clone(), (claim.owner_token.clone(), parts));
    }
    grants
}

impl MemberGrants {
    /// Follows the first lock's call `op` for `claim` (answered `outcome`) onto the claim's
    /// other locks, and returns the outcome for the whole claim: a grant takes every other
    /// lock in name order (and gives all back, the first lock's too, if one refuses); a
    /// re-attach takes back the grants other backends lost, with their own tokens; a renewal
    /// extends them all.
    pub async fn follow(
        &mut self,
        claim: Option<&str>,
        op: &BackendOp,
        outcome: OpOutcome,
        first: FirstLock<'_>,
    ) -> OpOutcome {
        let Some((_, parts)) = claim.and_then(|claim| self.parts.get_mut(claim)) else {
            return outcome;
        };
        match (op, &outcome) {
            (
                BackendOp::Acquire {
                    owner,
                    ttl,
                    purpose: crate::core::AcquirePurpose::Grant,
                    ..
                },
                OpOutcome::Granted { .. },
            ) => {
                for taken in 0..parts.len() {
                    if let Err(refusal) = parts[taken].take(owner, *ttl).await {
                        for part in &mut parts[..taken] {
                            // A part not given back now is given back by the next pass.
                            let _ = part.release(owner).await;
                        }
                        first.release(owner, false).await;
                        return refusal;
                    }
                }
                outcome
            }
            (
                BackendOp::Acquire {
                    owner,
                    ttl,
                    purpose: crate::core::AcquirePurpose::Reattach,
                    ..
                },
                OpOutcome::Granted { .. },
            ) => {
                for part in parts.iter_mut().filter(|part| part.holds == Some(false)) {
                    if let Err(refusal) = part.retake(owner, *ttl).await {
                        // The claim is lost (someone else has that lock now): the first
                        // lock's grant, just taken back, goes too, as at the end of a lease
                        // (its lock-delay starts); the parts retaken so far are given back
                        // after the fold.
                        first.release(owner, true).await;
                        return refusal;
                    }
                }
                outcome
            }
            (BackendOp::Extend { .. }, OpOutcome::Extended { still_held: true }) => {
                for part in parts.iter_mut() {
                    match part.call(op).await {
                        OpOutcome::Extended { still_held: true } => {}
                        lost @ OpOutcome::Extended { .. } => return lost,
                        failed => return failed,
                    }
                }
                outcome
            }
            _ => outcome,
        }
    }

    /// Writes the tokens of the grants made in this pass into the claims' views, for the
    /// fold to record in `status.locks`.
    pub fn record_grants(&self, claims: &mut [ClaimView]) {
        for claim in claims.iter_mut() {
            let Some((_, parts)) = self.parts.get(&claim.name) else {
                continue;
            };
            for member in &mut claim.members {
                if let Some(part) = parts.iter().find(|part| part.lock == member.name) {
                    member.fencing_token = part.token;
                }
            }
        }
    }

    /// After the fold: a claim that is not held once the pass's writes are made keeps no
    /// other lock's grant. A grant that cannot be given back (its backend did not answer)
    /// keeps the claim's finalizer, so that it is given back before the claim goes away.
    pub async fn give_back(&mut self, decision: &mut Decision, claims: &[ClaimView]) {
        for claim in claims {
            let Some((owner, parts)) = self.parts.get_mut(&claim.name) else {
                continue;
            };
            let change = decision
                .claims
                .iter_mut()
                .find(|change| change.name == claim.name);
            if stays_held(claim, change.as_deref()) {
                continue;
            }
            let mut all_back = true;
            for part in parts.iter_mut() {
                let may_hold = part.granted_now || part.holds != Some(false);
                if may_hold && part.release(owner).await.is_err() {
                    all_back = false;
                }
            }
            if let Some(change) = change.filter(|_| !all_back) {
                change.finalizer = FinalizerChange::Keep;
            }
        }
        // A claim whose only change was the finalizer's removal writes nothing now.
        decision.claims.retain(|change| {
            change.status.is_some() || change.finalizer == FinalizerChange::Remove
        });
    }
}

/// Whether `claim` is held once `change` (the pass's change to it, if any) is written.
fn stays_held(claim: &ClaimView, change: Option<&ClaimChange>) -> bool {
    if claim.deleting {
        return false;
    }
    let held = |status: &LockClaimStatus| status.phase == Some(ClaimPhase::Held);
    match change.and_then(|change| change.status.as_ref()) {
        Some(status) => held(status),
        None => held(&claim.status),
    }
}
