//! Performing the core's planned backend calls on a lock engine [`Backend`].

use std::time::Duration;

use crate::core::{BackendOp, ExecutionGate, OpOutcome, PlannedOp};
use turnstile_lock::{AcquireMode, AcquireOutcome, AcquireRequest, Backend, LockError, ShareMode};

/// Performs `ops` in order on `backend` for the lock `key` (a semaphore of `max_holders`),
/// honouring the [`ExecutionGate`]: nothing runs after a failure, no grant runs after a
/// refused grant. Returns one outcome per op.
pub async fn execute(
    backend: &dyn Backend,
    key: &str,
    max_holders: u32,
    ops: &[PlannedOp],
) -> Vec<OpOutcome> {
    execute_while(backend, key, max_holders, ops, || true).await
}

/// [`execute`], asking `may_write` right before each call: once it says no, that call and
/// every later one is [`OpOutcome::Skipped`] (a replica that lost the leadership must not
/// grant, even in a pass that was already running).
pub async fn execute_while(
    backend: &dyn Backend,
    key: &str,
    max_holders: u32,
    ops: &[PlannedOp],
    may_write: impl Fn() -> bool,
) -> Vec<OpOutcome> {
    let mut gate = ExecutionGate::default();
    let mut outcomes = Vec::with_capacity(ops.len());
    let mut stopped = false;
    for planned in ops {
        stopped = stopped || !may_write();
        if stopped || !gate.admits(&planned.op) {
            outcomes.push(OpOutcome::Skipped);
            continue;
        }
        let outcome = perform(backend, key, max_holders, &planned.op)
            .await
            .unwrap_or_else(|error| OpOutcome::Failed {
                message: describe(&error),
            });
        tracing::debug!(
            key,
            claim = planned.claim.as_deref().unwrap_or(""),
            op = ?planned.op,
            outcome = ?outcome,
            "backend call"
        );
        gate.record(&planned.op, &outcome);
        outcomes.push(outcome);
    }
    outcomes
}

/// An error with its chain of causes, for status messages (`a: b: c`).
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

async fn perform(
    backend: &dyn Backend,
    key: &str,
    max_holders: u32,
    op: &BackendOp,
) -> Result<OpOutcome, LockError> {
    Ok(match op {
        BackendOp::RaiseFloor { floor } => OpOutcome::FloorRaised {
            counter: backend.raise_fencing_floor(key, *floor).await?,
        },
        BackendOp::Acquire { owner, ttl, .. } => {
            let request = AcquireRequest {
                key,
                owner,
                ttl: *ttl,
                max_holders,
                mode: AcquireMode::Try,
                waiter_lease: *ttl,
                // Until claims carry a mode, a lock of several holders stays what it was: a
                // semaphore whose claims all hold together (an exclusive claim holds alone).
                share: if max_holders > 1 {
                    ShareMode::Shared
                } else {
                    ShareMode::Exclusive
                },
                priority: 0,
                max_hold: None,
                lock_delay: Duration::ZERO,
            };
            match backend.acquire(&request).await? {
                AcquireOutcome::Granted {
                    fencing_token,
                    already_held,
                    ..
                } => OpOutcome::Granted {
                    fencing_token,
                    already_held,
                },
                AcquireOutcome::Busy { retry_after }
                | AcquireOutcome::Waiting { retry_after, .. } => OpOutcome::Busy { retry_after },
            }
        }
        BackendOp::Extend { owner, ttl } => OpOutcome::Extended {
            still_held: backend.extend(key, owner, *ttl).await?.is_some(),
        },
        BackendOp::Release { owner } => OpOutcome::Released {
            was_held: backend.release(key, owner, max_holders).await?,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::core::AcquirePurpose;
    use turnstile_lock::MemoryBackend;

    fn grant(owner: &str) -> PlannedOp {
        PlannedOp {
            claim: Some(owner.to_owned()),
            op: BackendOp::Acquire {
                owner: owner.to_owned(),
                ttl: Duration::from_secs(60),
                purpose: AcquirePurpose::Grant,
            },
        }
    }

    #[tokio::test]
    async fn calls_stop_once_writes_are_no_longer_allowed() {
        let backend = MemoryBackend::new();
        let ops = [grant("a"), grant("b"), grant("c")];
        // Leadership is lost after the first call.
        let asked = AtomicUsize::new(0);
        let outcomes = execute_while(&backend, "ns/db", 3, &ops, || {
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
