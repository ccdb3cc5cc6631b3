//! The backend calls a plan makes, collected by group and laid out in the order they must
//! run.

use std::time::Duration;

use super::lock_delay::starts_lock_delay;
use super::members;
use crate::core::model::{BackendView, ClaimView, LockInput};
use crate::core::ops::{AcquirePurpose, BackendOp, PlannedOp};

/// Collects the backend calls by group; [`Builder::layout`] puts the groups in order. A
/// claim's step (its call and, on several locks, the calls on its other locks: [`members`])
/// stays together.
pub(super) struct Builder<'a> {
    pub(super) input: &'a LockInput,
    /// Every new grant of the pass is above it.
    high_water: u64,
    releases: Vec<PlannedOp>,
    /// `(recorded token, claim name, its step)` of grants to take back.
    reattaches: Vec<(u64, String, Vec<PlannedOp>)>,
    extends: Vec<Vec<PlannedOp>>,
    grants: Vec<Vec<PlannedOp>>,
    /// The key is held or queued for someone outside this cluster: a refused grant joins
    /// the backend's queue (see [`BackendOp::Acquire`]). Looked up at the first grant: most
    /// passes plan none.
    queue_when_busy: Option<bool>,
}

/// A call in one of the [`Builder`]'s groups, before the final layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpRef {
    Release(usize),
    Extend(usize),
    Grant(usize),
    /// Re-attaches are laid out by token; found by claim name.
    Reattach,
}

impl<'a> Builder<'a> {
    /// A builder with no calls yet.
    pub(super) fn new(input: &'a LockInput, high_water: u64) -> Self {
        Self {
            input,
            high_water,
            releases: Vec::new(),
            reattaches: Vec::new(),
            extends: Vec::new(),
            grants: Vec::new(),
            queue_when_busy: None,
        }
    }

    pub(super) fn release(&mut self, claim: &ClaimView) -> OpRef {
        self.push_release(claim, false)
    }

    pub(super) fn push_release(&mut self, claim: &ClaimView, involuntary: bool) -> OpRef {
        let owner = claim.owner_token.clone();
        let op = BackendOp::Release { owner, involuntary };
        self.releases.push(PlannedOp::for_claim(claim, op));
        OpRef::Release(self.releases.len() - 1)
    }

    /// The release of a held grant that ends now for `reason`: an involuntary end on a lock
    /// with a lock-delay cuts the lease (see [`BackendOp::Release`]).
    pub(super) fn end_held(&mut self, claim: &ClaimView, reason: &str) -> Option<OpRef> {
        let involuntary = starts_lock_delay(self.input, reason);
        match &self.input.backend {
            BackendView::Ready { .. } => Some(self.push_release(claim, involuntary)),
            _ => None,
        }
    }

    /// A release when the backend holds (or, by the API, should hold) a grant for `claim`, or
    /// has it in its queue (it leaves the queue).
    /// Without an answer from the backend nothing is planned: the caller keeps finalizers
    /// until the backend answers.
    pub(super) fn release_if_held(
        &mut self,
        claim: &ClaimView,
        recorded_held: bool,
    ) -> Option<OpRef> {
        match &self.input.backend {
            BackendView::Ready { .. }
                if recorded_held
                    || self.input.backend.holds(&claim.owner_token)
                    || self.input.backend.queues(&claim.owner_token) =>
            {
                Some(self.release(claim))
            }
            _ => None,
        }
    }

    pub(super) fn extend(&mut self, claim: &ClaimView, ttl: Duration) -> OpRef {
        let owner = claim.owner_token.clone();
        let lead = PlannedOp::for_claim(claim, BackendOp::Extend { owner, ttl });
        self.extends.push(members::renew(claim, lead, ttl));
        OpRef::Extend(self.extends.len() - 1)
    }

    pub(super) fn grant(&mut self, claim: &ClaimView, ttl: Duration) -> OpRef {
        let op = BackendOp::Acquire {
            owner: claim.owner_token.clone(),
            ttl,
            purpose: AcquirePurpose::Grant,
            shared: claim.shared(&self.input.lock),
            // A claim on several locks is granted on all of them at once or none: it never
            // waits in one backend queue while holding up the others.
            queue: !claim.is_multi_lock() && self.queue_when_busy(),
        };
        let lead = PlannedOp::for_claim(claim, op);
        self.grants
            .push(members::grant(claim, lead, ttl, self.high_water));
        OpRef::Grant(self.grants.len() - 1)
    }

    /// Gives back every other lock's grant of a claim on several locks that does not hold
    /// after the pass.
    pub(super) fn give_back_members(&mut self, claim: &ClaimView) {
        self.releases.extend(members::give_back(claim));
    }

    fn queue_when_busy(&mut self) -> bool {
        let input = self.input;
        *self
            .queue_when_busy
            .get_or_insert_with(|| input.shared_outside())
    }

    pub(super) fn reattach(&mut self, claim: &ClaimView, ttl: Duration) -> OpRef {
        let token = claim.fencing_token().unwrap_or(0);
        let lead = PlannedOp::for_claim(
            claim,
            BackendOp::Acquire {
                owner: claim.owner_token.clone(),
                ttl,
                purpose: AcquirePurpose::Reattach,
                shared: claim.shared(&self.input.lock),
                queue: false,
            },
        );
        let step = members::reattach(claim, lead, ttl, token);
        self.reattaches.push((token, claim.name.clone(), step));
        OpRef::Reattach
    }

    /// Orders the calls: releases free slots first; re-attached grants take their own tokens
    /// back, ascending (the floor is raised to just below each); renewals; the floor is raised
    /// to the high-water mark; new grants come last, above it. Returns the calls and a
    /// resolver from [`OpRef`] (with the claim name) to the index in the list.
    pub(super) fn layout(
        mut self,
        floor: Option<u64>,
    ) -> (Vec<PlannedOp>, impl Fn(OpRef, &str) -> usize) {
        let mut ops = Vec::new();
        ops.append(&mut self.releases);
        let release_base = 0;
        self.reattaches.sort_by_key(|(token, ..)| *token);
        let mut reattach_at = std::collections::HashMap::new();
        for (token, claim, step) in self.reattaches {
            ops.push(PlannedOp::lock_wide(BackendOp::RaiseFloor {
                floor: token.saturating_sub(1),
            }));
            reattach_at.insert(claim, ops.len());
            ops.extend(step);
        }
        let extend_at = lay_out(&mut ops, self.extends);
        if let Some(floor) = floor {
            ops.push(PlannedOp::lock_wide(BackendOp::RaiseFloor { floor }));
        }
        let grant_at = lay_out(&mut ops, self.grants);
        let resolve = move |op: OpRef, claim: &str| match op {
            OpRef::Release(i) => release_base + i,
            OpRef::Extend(i) => extend_at[i],
            OpRef::Grant(i) => grant_at[i],
            OpRef::Reattach => reattach_at.get(claim).copied().unwrap_or(usize::MAX),
        };
        (ops, resolve)
    }
}

/// Appends `steps` to `ops`; returns where each step's lead call is.
fn lay_out(ops: &mut Vec<PlannedOp>, steps: Vec<Vec<PlannedOp>>) -> Vec<usize> {
    steps
        .into_iter()
        .map(|step| {
            let lead = ops.len();
            ops.extend(step);
            lead
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use turnstile_api::BackendKind;
    use turnstile_lock::LockSnapshot;

    use crate::core::model::{BackendView, LockInput, MemberLock};
    use crate::core::ops::BackendOp;
    use crate::core::plan;
    use crate::core::tests::{holding, input_at, waiting_claim, T0};

    /// Claim `a` waiting on a key the backend holds for `holder` and queues `waiters` for.
    fn waiting_behind(holder: &str, waiters: &[&str]) -> LockInput {
        let mut input = input_at(T0, waiting_claim());
        input.backend = BackendView::Ready {
            backend: BackendKind::Etcd,
            snapshot: LockSnapshot {
                holders: vec![holding(holder, 4, Duration::from_secs(30))],
                waiters: waiters.iter().map(|waiter| (*waiter).to_owned()).collect(),
                fencing_token: 4,
                ..LockSnapshot::default()
            },
        };
        input
    }

    /// Whether the pass's grant of claim `a` would join the backend's queue.
    fn grant_queues(input: &LockInput) -> Option<bool> {
        plan(input)
            .ops
            .iter()
            .find_map(|planned| match &planned.op {
                BackendOp::Acquire { queue, .. } => Some(*queue),
                _ => None,
            })
    }

    /// A grant joins the backend's queue only when the key is held or queued for someone
    /// outside this cluster — then the backend's queue is the order across clusters; a
    /// claim on several locks never queues in one backend.
    #[test]
    fn a_grant_queues_in_the_backend_only_when_the_key_is_shared_outside() {
        assert_eq!(grant_queues(&input_at(T0, waiting_claim())), Some(false));
        assert_eq!(
            grant_queues(&waiting_behind("east/uid-e1", &[])),
            Some(true)
        );
        assert_eq!(
            grant_queues(&waiting_behind("uid-gone", &["east/uid-e2"])),
            Some(true)
        );
        let mut multi = waiting_behind("east/uid-e1", &[]);
        multi.claims[0].locks.push("other".to_owned());
        multi.claims[0].members = vec![MemberLock {
            name: "other".to_owned(),
            exists: true,
            admits: true,
            holds: Some(false),
            fencing_token: None,
            high_water: 0,
            shared: false,
        }];
        assert_eq!(grant_queues(&multi), Some(false));
    }

    /// A claim that goes while it waits in the backend's queue leaves the queue (a release),
    /// so its place does not hold up the others until it runs out.
    #[test]
    fn a_claim_that_goes_while_queued_in_the_backend_leaves_the_queue() {
        let mut input = waiting_behind("east/uid-e1", &["uid-a"]);
        input.claims[0].deleting = true;
        let releases: Vec<_> = (plan(&input).ops.into_iter())
            .filter(|planned| matches!(&planned.op, BackendOp::Release { owner, .. } if owner == "uid-a"))
            .collect();
        assert_eq!(releases.len(), 1);
        // Not queued there: nothing to leave.
        let mut input = waiting_behind("east/uid-e1", &[]);
        input.claims[0].deleting = true;
        assert!(plan(&input).ops.is_empty(), "{:?}", plan(&input).ops);
    }
}
