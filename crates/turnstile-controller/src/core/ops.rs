//! The backend calls of a pass: what the core asks of the backend ([`BackendOp`], under the
//! lock's [`CallTerms`]), what comes back ([`OpOutcome`]), and which calls run at all
//! ([`ExecutionGate`](super::ExecutionGate)). [`super::plan`] lays them out; [`super::fold`] reads their answers.

use std::time::Duration;

use super::execution::Step;
use super::model::{ClaimView, LockView};

/// A backend call the shell performs for the core, on one lock's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendOp {
    /// Raise the fence counter to at least `floor`.
    RaiseFloor {
        /// The new minimum of the counter.
        floor: u64,
    },
    /// One attempt for `owner`: `AcquireMode::Try` (the queue lives in the API), or
    /// `AcquireMode::Wait` when `queue` is set.
    Acquire {
        /// The claim's owner token ([`ClaimView::owner_token`](super::ClaimView::owner_token)).
        owner: String,
        /// The backend lease (the API lease plus [`BACKEND_LEASE_GRACE`](super::BACKEND_LEASE_GRACE)).
        ttl: Duration,
        /// A new grant, or re-attaching a grant the backend lost.
        purpose: AcquirePurpose,
        /// Holds together with other shared holders (else alone).
        shared: bool,
        /// When refused, join the backend's queue for the key (kept while the claim is
        /// tried again, at least every [`MAX_BUSY_RETRY`](crate::core::MAX_BUSY_RETRY)):
        /// the key is held or queued for someone outside this cluster, and the backend's
        /// queue is the order across clusters.
        queue: bool,
    },
    /// Extend `owner`'s lease to `ttl` from now.
    Extend {
        /// The claim's owner token ([`ClaimView::owner_token`](super::ClaimView::owner_token)).
        owner: String,
        /// The backend lease (the API lease plus [`BACKEND_LEASE_GRACE`](super::BACKEND_LEASE_GRACE)).
        ttl: Duration,
    },
    /// Release `owner`'s grant (compare-and-delete: never touches anyone else's).
    Release {
        /// The claim's owner token ([`ClaimView::owner_token`](super::ClaimView::owner_token)).
        owner: String,
        /// The grant ended without its holder asking (its lease or maximum hold ran out, its
        /// owner vanished) on a lock with a lock-delay: its lease is cut to
        /// [`LEASE_CUT`] instead of deleted, so the backend starts the lock-delay it
        /// recorded with the grant and holds off every acquirer of the key, in Kubernetes or
        /// not.
        involuntary: bool,
    },
}

/// Why an [`BackendOp::Acquire`] is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquirePurpose {
    /// Grant a pending claim. After one grant is refused, later grants in the pass are
    /// skipped: nobody overtakes the head of the queue.
    Grant,
    /// The backend lost a grant the API records (restart of the memory backend, a flushed
    /// Redis): take it again with the same fencing token.
    Reattach,
}

/// A backend call, the claim it is for (`None` for lock-wide calls), the lock whose key it is
/// made on, and its place in the claim's [`Step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedOp {
    /// The claim the call is made for.
    pub claim: Option<String>,
    /// The call.
    pub op: BackendOp,
    /// The lock whose key the call is on: `None` for the pass's own lock; for a claim on
    /// several locks, one of its other locks (by name), each with its own backend and terms.
    pub on_lock: Option<String>,
    /// Where the call stands in its claim's step: whether it runs depends on the calls
    /// before it (see [`ExecutionGate`](super::ExecutionGate)).
    pub step: Step,
}

impl PlannedOp {
    /// `op` on the pass's own lock, made for `claim`, a lead call.
    pub(crate) fn for_claim(claim: &ClaimView, op: BackendOp) -> Self {
        Self {
            claim: Some(claim.name.clone()),
            op,
            on_lock: None,
            step: Step::LEAD,
        }
    }

    /// `op` on the pass's own lock, for no claim in particular.
    pub(crate) fn lock_wide(op: BackendOp) -> Self {
        Self {
            claim: None,
            op,
            on_lock: None,
            step: Step::LEAD,
        }
    }

    /// `op` on `claim`'s other lock `lock`, at `step` of the claim's step.
    pub(crate) fn on_member(claim: &ClaimView, lock: &str, op: BackendOp, step: Step) -> Self {
        Self {
            claim: Some(claim.name.clone()),
            op,
            on_lock: Some(lock.to_owned()),
            step,
        }
    }
}

/// The answer to one [`PlannedOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpOutcome {
    /// The owner holds the lock with this token.
    Granted {
        /// The grant's fencing token.
        fencing_token: u64,
        /// The owner already held it (idempotent re-acquire).
        already_held: bool,
    },
    /// Not granted.
    Busy {
        /// When the backend expects a slot to free up.
        retry_after: Option<Duration>,
    },
    /// The lease was extended (`true`) or was no longer held (`false`).
    Extended {
        /// Whether the owner still held a live lease.
        still_held: bool,
    },
    /// The grant was released (`was_held`: it was live).
    Released {
        /// Whether the owner held a live lease.
        was_held: bool,
    },
    /// The fence counter is now `counter`.
    FloorRaised {
        /// The counter afterwards.
        counter: u64,
    },
    /// The backend failed; the rest of the pass's calls are skipped.
    Failed {
        /// The error, for people.
        message: String,
    },
    /// Not attempted (an earlier call failed, or an earlier grant was refused).
    Skipped,
}

/// The lock's terms at plan time, the same for every backend call of one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTerms {
    /// 1 for a mutex, N for a counting semaphore.
    pub max_holders: u32,
    /// Recorded with every grant: when one ends involuntarily the backend itself refuses the
    /// key to everyone for this long (see [`BackendOp::Release`]).
    pub lock_delay: Duration,
}

impl CallTerms {
    /// The terms of `lock` as its spec says now (clamped into the accepted ranges).
    pub fn of(lock: &LockView) -> Self {
        Self {
            max_holders: lock.max_holders(),
            lock_delay: Duration::from_secs(u64::try_from(lock.lock_delay_seconds()).unwrap_or(0)),
        }
    }
}

/// How short an involuntarily ended grant's lease is cut (the backends' resolution): it runs
/// out at once, as an expired lease, and the backend's lock-delay starts.
pub const LEASE_CUT: Duration = Duration::from_millis(1);
