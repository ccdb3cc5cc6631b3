//! The behaviours every backend must show, written once, generic over the backend, one file
//! per topic. Every case is re-exported here, so `main.rs` names them as `cases::NAME`.

use turnstile_lock::{Lock, LockResult, Locker, RetryPolicy};

mod basics;
mod fairness;
mod fencing;
mod handoff;
mod lifecycle;
mod live_limits;
mod lock_delay;
mod max_hold;
mod priority;
mod shared;
mod stress;

pub use self::basics::*;
pub use self::fairness::*;
pub use self::fencing::*;
pub use self::handoff::*;
pub use self::lifecycle::*;
pub use self::live_limits::*;
pub use self::lock_delay::*;
pub use self::max_hold::*;
pub use self::priority::*;
pub use self::shared::*;
pub use self::stress::*;

// Shared with the backend-specific test binaries.
pub(crate) use crate::support::grants::{no_polling, LONG, NO_POLLING};

/// Nobody holds `key` right now.
pub(crate) async fn no_holders(locker: &Locker, key: &str) -> bool {
    locker
        .snapshot(key)
        .await
        .expect("snapshot")
        .holders
        .is_empty()
}

/// Starts `owner`'s acquire of `key` (lease [`LONG`]) in the background.
pub(crate) fn spawn_waiter(
    locker: &Locker,
    key: &'static str,
    owner: &'static str,
    policy: RetryPolicy,
) -> tokio::task::JoinHandle<LockResult<Lock>> {
    let request = locker.lock(key, LONG).owner(owner).retry(policy);
    tokio::spawn(async move { request.acquire().await })
}
