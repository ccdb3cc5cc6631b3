//! The steps the lock tests take again and again: a locker with a bounded retry, a
//! `try_acquire` that must find the lock free or taken, and a background acquire awaited
//! under a hang guard.

use std::time::Duration;

use tokio::task::JoinHandle;
use turnstile_lock::{Backend, Lock, LockRequest, LockResult, Locker, RetryPolicy};

/// A lease far longer than any test runs.
pub const LONG: Duration = Duration::from_secs(60);

/// A retry delay so long that only push wake-ups can explain a prompt acquisition.
pub const NO_POLLING: Duration = Duration::from_secs(30);

/// Retries forever, every [`NO_POLLING`]: a prompt grant can only be a wake-up or hand-off.
pub fn no_polling() -> RetryPolicy {
    RetryPolicy::forever().retry_delay(NO_POLLING)
}

/// A locker over `backend` whose calls retry every `delay` for up to `total`.
pub fn locker_retrying(backend: impl Backend, total: Duration, delay: Duration) -> Locker {
    Locker::new(backend).with_retry(RetryPolicy::new().total_time(total).retry_delay(delay))
}

/// `request.try_acquire()` found the lock taken (it got nothing); panics on an error.
pub async fn is_taken(request: &LockRequest) -> bool {
    request.try_acquire().await.expect("try").is_none()
}

/// `request.try_acquire()`, which must get the lock; panics with `free` (why it should be
/// free) when it is taken, and on an error.
pub async fn take_free(request: &LockRequest, free: &str) -> Lock {
    request.try_acquire().await.expect("try").expect(free)
}

/// `request.try_acquire()` `count` times, each of which must get a place; panics with `free`
/// (why there should be a place) when one is taken, and on an error.
pub async fn take_places(request: &LockRequest, count: usize, free: &str) -> Vec<Lock> {
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        held.push(take_free(request, free).await);
    }
    held
}

/// Takes `key` on `locker` with a lease of `lease`, waiting by the locker's retry policy;
/// panics with `what` (whose lock it is) on an error.
pub async fn hold(locker: &Locker, key: &str, lease: Duration, what: &str) -> Lock {
    locker
        .lock(key, lease)
        .acquire()
        .await
        .unwrap_or_else(|error| panic!("{what}: {error:?}"))
}

/// Takes `key` as `owner` on `locker`, retrying by `policy`; panics on an error.
pub async fn acquire_as(locker: &Locker, key: &str, owner: String, policy: RetryPolicy) -> Lock {
    locker
        .lock(key, LONG)
        .owner(owner)
        .retry(policy)
        .acquire()
        .await
        .expect("acquire")
}

/// Awaits `task` for at most `limit`, panicking with `promptly` (what finishing in time
/// shows) when it takes longer, and when the task panicked; returns what it returned.
pub async fn joined_within<T>(limit: Duration, task: JoinHandle<T>, promptly: &str) -> T {
    tokio::time::timeout(limit, task)
        .await
        .expect(promptly)
        .expect("join")
}

/// Releases `holder`, then awaits `waiter`'s background acquire, which must succeed within
/// half of [`NO_POLLING`]: with a waiter that polls only every [`NO_POLLING`], only the
/// release's push (a hand-off or a wake-up) explains that.
pub async fn pushed_on_release<T>(holder: &Lock, waiter: JoinHandle<LockResult<T>>) -> T {
    holder.release().await.expect("release");
    acquired_within(
        NO_POLLING / 2,
        waiter,
        "woken by the release, not by polling",
    )
    .await
}

/// As [`joined_within`], for a background acquire, which must succeed.
pub async fn acquired_within<T>(
    limit: Duration,
    task: JoinHandle<LockResult<T>>,
    promptly: &str,
) -> T {
    joined_within(limit, task, promptly).await.expect("acquire")
}
