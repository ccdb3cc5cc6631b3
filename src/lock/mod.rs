//! The lock engine: mutexes and counting semaphores over pluggable backends.
//!
//! Work in progress: the [`Backend`] trait and the error types are stable; the `Locker` API
//! follows.

pub mod backend;
pub mod error;

pub use self::backend::{
    AcquireMode, AcquireOutcome, AcquireRequest, Backend, HolderInfo, LockSnapshot, MemoryBackend,
    WakeRegistry, WakeSubscription,
};
pub use self::error::{BoxError, LockError, LockResult};
