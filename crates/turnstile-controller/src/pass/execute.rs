//! The middle of a lock's pass: [`run_pass`] plans, adds the finalizers a grant needs first,
//! makes the planned calls in order ([`execute_following`]: each on the lock the plan names,
//! as the core's `ExecutionGate` admits them, while the replica leads), folds and writes.
//! The controller's property tests run the same [`run_pass`] over a simulated API server.

use crate::core::{
    fold, plan, CallTerms, Decision, ExecutionGate, LockInput, OpOutcome, Plan, PlannedOp,
};
use crate::error::ControllerError;
use crate::pass::backend_call::perform;
use crate::pass::multi_lock::MemberEngines;
use crate::writer::{PassStore, PassWriter};
use turnstile_api::error_chain;
use turnstile_lock::Backend;

/// The lock engine as a pass calls it: the backend and the lock's key in it.
#[derive(Clone, Copy)]
pub struct Engine<'a> {
    /// The backend that answered the pass's snapshot.
    pub backend: &'a dyn Backend,
    /// The lock's key in it.
    pub key: &'a str,
}

/// What one pass did (its writes' resourceVersions stay in the [`PassWriter`]).
#[derive(Debug)]
pub struct PassOutcome {
    /// The core's plan.
    pub planned: Plan,
    /// One outcome per planned call (none without an engine).
    pub outcomes: Vec<OpOutcome>,
    /// The core's decision on those outcomes.
    pub decision: Decision,
    /// `Ok` when every decided write landed; otherwise the first failure (no later write was
    /// made: the next pass recomputes from fresh state).
    pub applied: Result<(), ControllerError>,
}

/// One pass over a lock, the code the shell and the controller's property tests share: on
/// `input` (the views of the objects given to `writer`): plan, finalizers, the planned calls
/// — on `engine` (none when the backend did not answer), and on the other locks of claims on
/// several locks through `members` — while `may_write` says yes, fold, writes. The pass only
/// carries the core's plan out: it never changes the core's input or decision. `Err` when a
/// finalizer write failed: then no backend call was made.
pub async fn run_pass<S: PassStore>(
    writer: &mut PassWriter<'_, S>,
    input: &LockInput,
    engine: Option<Engine<'_>>,
    members: &MemberEngines,
    may_write: impl Fn() -> bool,
) -> Result<PassOutcome, ControllerError> {
    let planned = plan(input);
    writer
        .add_claim_finalizers(&planned.finalizers_to_add)
        .await?;
    let outcomes = match engine {
        Some(engine) => {
            execute_following(
                engine.backend,
                engine.key,
                planned.terms,
                &planned.ops,
                &may_write,
                members,
            )
            .await
        }
        None => Vec::new(),
    };
    let decision = fold(input, &planned, &outcomes);
    let applied = writer.apply(input, &decision).await;
    Ok(PassOutcome {
        planned,
        outcomes,
        decision,
        applied,
    })
}

/// Performs `ops` in order on `backend` for the lock `key` (a semaphore of `max_holders`),
/// honouring the [`ExecutionGate`]: nothing runs after a failure, no grant runs after a
/// refused grant. Returns one outcome per op.
pub async fn execute(
    backend: &dyn Backend,
    key: &str,
    terms: CallTerms,
    ops: &[PlannedOp],
) -> Vec<OpOutcome> {
    execute_while(backend, key, terms, ops, || true).await
}

/// [`execute`], asking `may_write` right before each call: once it says no, that call and
/// every later one is [`OpOutcome::Skipped`] (a replica that lost the leadership must not
/// grant, even in a pass that was already running).
pub async fn execute_while(
    backend: &dyn Backend,
    key: &str,
    terms: CallTerms,
    ops: &[PlannedOp],
    may_write: impl Fn() -> bool,
) -> Vec<OpOutcome> {
    execute_following(
        backend,
        key,
        terms,
        ops,
        may_write,
        &MemberEngines::default(),
    )
    .await
}

/// [`execute_while`], the calls on the other locks of claims on several locks made through
/// `members` (see [`PlannedOp::on_lock`]).
pub async fn execute_following(
    backend: &dyn Backend,
    key: &str,
    terms: CallTerms,
    ops: &[PlannedOp],
    may_write: impl Fn() -> bool,
    members: &MemberEngines,
) -> Vec<OpOutcome> {
    let mut gate = ExecutionGate::default();
    let mut outcomes = Vec::with_capacity(ops.len());
    let mut stopped = false;
    for planned in ops {
        stopped = stopped || !may_write();
        if stopped || !gate.admits(planned) {
            outcomes.push(OpOutcome::Skipped);
            continue;
        }
        let outcome = match &planned.on_lock {
            None => perform(backend, key, terms, &planned.op)
                .await
                .unwrap_or_else(|error| OpOutcome::Failed {
                    message: error_chain(&error),
                }),
            Some(lock) => members.perform(lock, &planned.op).await,
        };
        tracing::debug!(
            key,
            lock = planned.on_lock.as_deref().unwrap_or(""),
            claim = planned.claim.as_deref().unwrap_or(""),
            op = ?planned.op,
            outcome = ?outcome,
            "backend call"
        );
        gate.record(planned, &outcome);
        outcomes.push(outcome);
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::core::{AcquirePurpose, BackendOp, Step};
    use turnstile_lock::MemoryBackend;

    fn grant(owner: &str) -> PlannedOp {
        PlannedOp {
            claim: Some(owner.to_owned()),
            op: BackendOp::Acquire {
                owner: owner.to_owned(),
                ttl: Duration::from_secs(60),
                purpose: AcquirePurpose::Grant,
                shared: true,
                queue: false,
            },
            on_lock: None,
            step: Step::LEAD,
        }
    }

    #[tokio::test]
    async fn calls_stop_once_writes_are_no_longer_allowed() {
        let backend = MemoryBackend::new();
        let ops = [grant("a"), grant("b"), grant("c")];
        // Leadership is lost after the first call.
        let asked = AtomicUsize::new(0);
        let terms = CallTerms {
            max_holders: 3,
            lock_delay: Duration::ZERO,
        };
        let outcomes = execute_while(&backend, "ns/db", terms, &ops, || {
            asked.fetch_add(1, Ordering::SeqCst) == 0
        })
        .await;
        assert!(
            matches!(outcomes[0], OpOutcome::Granted { .. }),
            "{outcomes:?}"
        );
        assert_eq!(outcomes[1..], [OpOutcome::Skipped, OpOutcome::Skipped]);
        let snapshot = backend.snapshot("ns/db").await.expect("snapshot");
        assert_eq!(
            snapshot.holders.len(),
            1,
            "only the call made before the loss"
        );
    }
}
