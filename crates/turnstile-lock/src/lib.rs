//! The lock engine: mutexes and counting semaphores over pluggable backends, with fencing
//! tokens, fair (FIFO) hand-off and push wake-ups. No Kubernetes dependency.
//!
//! ```
//! use std::time::Duration;
//! use turnstile_lock::{Locker, MemoryBackend, RetryPolicy};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), turnstile_lock::LockError> {
//! let locker = Locker::new(MemoryBackend::new())
//!     .with_retry(RetryPolicy::new().total_time(Duration::from_secs(10)));
//!
//! // Manual acquire / release.
//! let lock = locker.lock("user:123", Duration::from_secs(3)).acquire().await?;
//! let token = lock.fencing_token(); // pass it along with every write you protect
//! lock.extend(Duration::from_secs(2)).await?; // 2 s from now; LockLost if it ran out
//! lock.release().await?; // idempotent
//!
//! // Released automatically when the closure ends, even on error or panic.
//! let next = locker
//!     .lock("user:123", Duration::from_secs(3))
//!     .run(|lock| async move { lock.fencing_token() })
//!     .await?;
//! assert!(next > token);
//!
//! // A counting semaphore admitting two holders; try_acquire never waits.
//! let jobs = locker.lock("jobs", Duration::from_secs(30)).max_holders(2).shared();
//! let first = jobs.try_acquire().await?.expect("a free slot");
//! let second = jobs.try_acquire().await?.expect("a free slot");
//! assert!(jobs.try_acquire().await?.is_none());
//! first.release().await?;
//! second.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The same code runs on Redis (or MongoDB, or etcd) by swapping the backend:
//!
//! ```no_run
//! # #[cfg(feature = "redis")] mod doc {
//! # use std::time::Duration;
//! # use turnstile_lock::{Locker, RedisBackend, RedisBackendConfig};
//! # async fn redis() -> Result<(), turnstile_lock::LockError> {
//! let backend = RedisBackend::connect(
//!     RedisBackendConfig::new("redis://127.0.0.1:6379/").key_prefix("myapp:"),
//! )
//! .await?;
//! let locker = Locker::new(backend);
//! let lock = locker
//!     .lock("db-migrations", Duration::from_secs(30))
//!     .owner("claim-4f1c") // explicit owner: re-acquiring with it is idempotent
//!     .acquire()
//!     .await?;
//! # lock.release().await?;
//! # Ok(())
//! # }
//! # }
//! ```
//!
//! Guarantees (all backends; see [`backend`] for how):
//! - at most `max_holders` live leases per key, judged by the backend's clock (etcd has none:
//!   there each process counts a lease from when it saw the write, never ending it before its
//!   holder does; see [`backend::etcd`]);
//! - fencing tokens strictly increase per key, issued in the same atomic step as the grant;
//! - only the owner token that holds a lease can extend or release it;
//! - waiters are served first come, first served; a release hands the lock to (or wakes) only
//!   the waiter(s) whose turn it is, so the releaser cannot re-grab it past them;
//! - an acquire that is cancelled or times out leaves no grant behind;
//! - a holder learns that its lease ran out: [`Lock::is_lost`] (local, never later than the
//!   backend), and `LockLost` from `extend`, `refresh` and `release_strict`.
//!
//! Dropping the last handle of an unreleased [`Lock`] releases it in the background when a
//! tokio runtime is available; otherwise its lease runs out.

#[macro_use]
mod setters;

pub mod backend;
pub mod error;
mod handle;
mod locker;
pub mod retry;

pub use self::backend::{
    AcquireMode, AcquireOutcome, AcquireRequest, Backend, Handoff, HolderInfo, LockSnapshot,
    MemoryBackend, ShareMode, WakeRegistry, WakeSubscription, WakeUp, MAX_HOLDERS, MAX_KEY_LEN,
    MAX_OWNER_LEN, MAX_TTL,
};
#[cfg(feature = "etcd")]
pub use self::backend::{EtcdBackend, EtcdBackendConfig};
#[cfg(feature = "mongo")]
pub use self::backend::{MongoBackend, MongoBackendConfig};
#[cfg(feature = "redis")]
pub use self::backend::{RedisBackend, RedisBackendConfig};
pub use self::error::{BoxError, LockError, LockResult};
pub use self::handle::Lock;
pub use self::locker::{LockRequest, Locker};
pub use self::retry::{RetryContext, RetryDecision, RetryPolicy};

/// The README's examples, compiled (and, where they need no server, run) as doctests.
#[cfg(all(doctest, feature = "redis", feature = "mongo"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
