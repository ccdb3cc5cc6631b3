//! The backend calls a plan makes, collected by group and laid out in the order they must
//! run.

use std::time::Duration;

use super::lock_delay::starts_lock_delay;
use crate::core::model::{BackendView, ClaimView, LockInput};
use crate::core::ops::{AcquirePurpose, BackendOp, PlannedOp};

/// Collects the backend calls by group; [`Builder::layout`] puts the groups in order.
pub(super) struct Builder<'a> {
    pub(super) input: &'a LockInput,
    releases: Vec<PlannedOp>,
    /// `(recorded token, claim name, owner, ttl, shared)` of grants to take back.
    reattaches: Vec<(u64, String, String, Duration, bool)>,
    extends: Vec<PlannedOp>,
    grants: Vec<PlannedOp>,
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
    pub(super) fn new(input: &'a LockInput) -> Self {
        Self {
            input,
            releases: Vec::new(),
            reattaches: Vec::new(),
            extends: Vec::new(),
            grants: Vec::new(),
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

    /// A release when the backend holds (or, by the API, should hold) a grant for `claim`.
    /// Without an answer from the backend nothing is planned: the caller keeps finalizers
    /// until the backend answers.
    pub(super) fn release_if_held(
        &mut self,
        claim: &ClaimView,
        recorded_held: bool,
    ) -> Option<OpRef> {
        match &self.input.backend {
            BackendView::Ready { .. }
                if recorded_held || self.input.backend.holds(&claim.owner_token) =>
            {
                Some(self.release(claim))
            }
            _ => None,
        }
    }

    pub(super) fn extend(&mut self, claim: &ClaimView, ttl: Duration) -> OpRef {
        let owner = claim.owner_token.clone();
        let op = BackendOp::Extend { owner, ttl };
        self.extends.push(PlannedOp::for_claim(claim, op));
        OpRef::Extend(self.extends.len() - 1)
    }

    pub(super) fn grant(&mut self, claim: &ClaimView, ttl: Duration) -> OpRef {
        let op = BackendOp::Acquire {
            owner: claim.owner_token.clone(),
            ttl,
            purpose: AcquirePurpose::Grant,
            shared: claim.shared(&self.input.lock),
        };
        self.grants.push(PlannedOp::for_claim(claim, op));
        OpRef::Grant(self.grants.len() - 1)
    }

    pub(super) fn reattach(&mut self, claim: &ClaimView, ttl: Duration) -> OpRef {
        let token = claim.fencing_token().unwrap_or(0);
        self.reattaches.push((
            token,
            claim.name.clone(),
            claim.owner_token.clone(),
            ttl,
            claim.shared(&self.input.lock),
        ));
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
