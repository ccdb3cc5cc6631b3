//! The pure decision core: who holds a lock, who waits, who is next — with no I/O.
//!
//! A reconcile pass of one `DistributedLock` runs in three steps:
//!
//! 1. [`plan`]: from the lock, all its claims, the time and one snapshot of the backend,
//!    decide what every claim is heading for and which backend calls that takes, in order
//!    (releases, re-attaching lost grants, renewals, raising the fencing floor, new grants).
//! 2. The shell performs the calls ([`BackendOp`], module `ops`), in order, each on the lock
//!    the plan names (a claim on several locks is granted on all of them in one [`Step`]),
//!    gated by [`ExecutionGate`] (module `execution`), and records their outcomes
//!    ([`OpOutcome`]).
//! 3. [`fold`]: turn the outcomes into the claims' and the lock's statuses, Events, metrics
//!    observations and the requeue time ([`Decision`]: module `decision`).
//!
//! Claims whose lock does not exist (or does not take them) are decided by [`decide_unserved`].
//!
//! Invariants (unit- and property-tested): never more than `maxHolders` claims `Held`;
//! grants in FIFO order (arrival, see `queue`); fencing tokens strictly increasing;
//! terminal phases final; a second pass over the resulting state writes nothing.

mod busy;
mod decision;
mod execution;
mod expiry;
mod fold;
mod model;
mod ops;
mod orphan;
mod plan;
mod queue;
mod report;
mod status;

#[cfg(test)]
mod tests;

pub use decision::{
    ClaimChange, Decision, EventSeverity, EventSubject, FinalizerChange, GrantEnd, Observation,
    PlannedEvent,
};
pub use execution::{member_tokens, step_outcome, ExecutionGate, Expect, Step};
pub use fold::{fold, MAX_BUSY_RETRY, RESYNC_INTERVAL};
pub use model::{
    claim_address, claim_key, cluster_of_token, owner_token_in, seconds_of, time_at, BackendView,
    ClaimView, IncompleteClaim, LockInput, LockView, MemberLock, OwnerState, Seconds, WorkloadKind,
    WorkloadOwner, BACKEND_LEASE_GRACE,
};
pub use ops::{AcquirePurpose, BackendOp, CallTerms, OpOutcome, PlannedOp, LEASE_CUT};
pub use orphan::{decide_orphan, decide_unserved, OrphanDecision, Unserved};
pub use plan::{plan, Plan};
pub use queue::{
    queue_order, EXACT_POSITIONS, POSITION_REFRESHES_PER_PASS, POSITION_REFRESH_DELAY,
};
