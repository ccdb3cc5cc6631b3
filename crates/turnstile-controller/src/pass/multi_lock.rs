//! Claims on several locks (`spec.lockNames`): granted all at once or not at all, by the pass of
//! the claim's *first* lock (in name order).
//!
//! Every lock of such a claim has it in its queue, in the one order all queues share
//! (priority, creation, name). The passes of the other locks only keep its place: a slot while
//! it holds, its turn while it waits — so nobody behind it overtakes it there — and they write
//! nothing about it. The first lock's pass reads the other locks (cache and one backend
//! snapshot each, [`OtherLock`]) and gives the core what it needs of them ([`prepare`]:
//! [`MemberLock`]s); the core plans the calls on them in the claim's step (a grant takes the
//! other locks in name order right after its own and gives everything back if one refuses;
//! renewals, re-attaching a lost grant and releases follow the first lock's), and the pass
//! makes them on each lock's own backend ([`MemberEngines`]): no backend holds part of a
//! grant beyond the pass.
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

use crate::core::{
    plan, BackendOp, BackendView, CallTerms, ClaimView, LockInput, LockView, MemberLock, OpOutcome,
    Seconds,
};
use crate::pass::backend_call::perform;
use turnstile_api::error_chain;
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

/// Another lock's backend as the pass calls it.
#[derive(Clone)]
struct MemberEngine {
    /// `None` when the controller has none for it or it did not answer.
    backend: Option<Arc<dyn Backend>>,
    key: String,
    terms: CallTerms,
}

/// The other locks of a pass's claims on several locks, by name: where the core's calls on
/// them ([`PlannedOp::on_lock`](crate::core::PlannedOp::on_lock)) are made.
#[derive(Clone, Default)]
pub struct MemberEngines {
    locks: HashMap<String, MemberEngine>,
}

impl MemberEngines {
    /// Makes the calls on the lock `lock` under `terms` on `key` of `backend` (`None`: the
    /// lock's backend did not answer).
    pub fn add(
        &mut self,
        lock: &str,
        backend: Option<Arc<dyn Backend>>,
        key: String,
        terms: CallTerms,
    ) {
        let engine = MemberEngine {
            backend,
            key,
            terms,
        };
        self.locks.insert(lock.to_owned(), engine);
    }

    /// Makes `op` on the lock `lock`; a lock without a backend that answered fails the call.
    pub async fn perform(&self, lock: &str, op: &BackendOp) -> OpOutcome {
        let Some(MemberEngine {
            backend: Some(backend),
            key,
            terms,
        }) = self.locks.get(lock)
        else {
            return OpOutcome::Failed {
                message: format!("the backend of lock {lock} did not answer"),
            };
        };
        perform(backend.as_ref(), key, *terms, op)
            .await
            .unwrap_or_else(|error| OpOutcome::Failed {
                message: error_chain(&error),
            })
    }
}

/// Fills in what the pass of `lock` needs about its claims on several locks, before it plans:
/// for those it is first for, the other locks ([`MemberLock`]: do they exist, would they
/// admit the claim, do their backends hold its grant) and the shortest lease and maximum hold
/// among them; those it is not first for, naming a lock that does not exist, are dropped (they
/// are queued nowhere). Returns where the calls on the other locks are made.
pub fn prepare(
    lock: &LockView,
    claims: &mut Vec<ClaimView>,
    others: &HashMap<String, OtherLock>,
    lock_exists: impl Fn(&str) -> bool,
    now: Timestamp,
) -> MemberEngines {
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
    let mut engines = MemberEngines::default();
    for claim in claims.iter_mut().filter(|claim| first_here(claim, lock)) {
        let mut members = Vec::new();
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
            let holds = match other {
                // No lock, no key: nothing to take back or give back there.
                None => Some(false),
                Some(other) if other.lock.deleting => None,
                Some(other) => other
                    .view
                    .snapshot()
                    .map(|_| other.view.holds(&claim.owner_token)),
            };
            let plan = plans.get(name.as_str());
            members.push(MemberLock {
                name: name.clone(),
                exists: live.is_some(),
                admits: plan.is_some_and(|plan| plan.admits_for_other_locks.contains(&claim.name)),
                holds,
                fencing_token: recorded,
                high_water: plan.map_or(0, crate::core::Plan::high_water),
                shared: other.is_some_and(|other| claim.shared(&other.lock)),
            });
            if let Some(other) = other {
                let view = &other.lock;
                leases.push(view.lease_seconds());
                max_holds.extend(view.max_hold_seconds());
                engines.add(
                    name,
                    other.backend.clone(),
                    view.backend_key(),
                    CallTerms::of(view),
                );
            }
        }
        // A lease no lock would give on its own is not given: the shortest of them all.
        if claim.spec.lease_duration_seconds.is_none() {
            claim.spec.lease_duration_seconds = leases.into_iter().min();
        }
        claim.members_max_hold = max_holds.into_iter().min();
        claim.members = members;
    }
    engines
}
