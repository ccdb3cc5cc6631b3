//! One backend call of a pass: the core's [`BackendOp`] made on the lock engine, its answer
//! as the core's [`OpOutcome`]. The lock's own calls (`pass::execute`) and the
//! calls followed onto a multi-lock claim's other locks (`multi_lock`) both go through it.

use turnstile_lock::{AcquireMode, AcquireOutcome, AcquireRequest, Backend, LockError, ShareMode};

use crate::core::{BackendOp, CallTerms, OpOutcome, LEASE_CUT};

/// How long a claim's place in a backend queue lasts without another attempt: well above
/// the [`MAX_BUSY_RETRY`](crate::core::MAX_BUSY_RETRY) at which a refused claim is tried
/// again, and short enough that a place left by a controller that died (or by a claim that
/// is no longer at the head of its cluster's queue) frees the key soon.
pub const WAITER_LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// One backend call of a pass.
pub async fn perform(
    backend: &dyn Backend,
    key: &str,
    terms: CallTerms,
    op: &BackendOp,
) -> Result<OpOutcome, LockError> {
    Ok(match op {
        BackendOp::RaiseFloor { floor } => OpOutcome::FloorRaised {
            counter: backend.raise_fencing_floor(key, *floor).await?,
        },
        BackendOp::Acquire {
            owner,
            ttl,
            shared,
            queue,
            ..
        } => {
            let mode = if *queue {
                AcquireMode::Wait
            } else {
                AcquireMode::Try
            };
            let request = AcquireRequest {
                share: if *shared {
                    ShareMode::Shared
                } else {
                    ShareMode::Exclusive
                },
                lock_delay: terms.lock_delay,
                ..AcquireRequest::new(key, owner, *ttl, terms.max_holders, mode, WAITER_LEASE)
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
        BackendOp::Release { owner, involuntary } if *involuntary => OpOutcome::Released {
            was_held: backend.extend(key, owner, LEASE_CUT).await?.is_some(),
        },
        BackendOp::Release { owner, .. } => OpOutcome::Released {
            was_held: backend.release(key, owner, terms.max_holders).await?,
        },
    })
}
