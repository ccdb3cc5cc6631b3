//! Typed errors of the lock engine.

use std::time::Duration;

/// A boxed error from a backend's client library, kept as the `source` of
/// [`LockError::BackendUnavailable`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong when acquiring, holding or releasing a lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The backend could not be reached or answered with an error. The operation may or may
    /// not have been applied; the engine only retries operations that are safe to repeat.
    #[error("{backend} backend unavailable: {message}")]
    BackendUnavailable {
        /// Which backend failed (`memory`, `redis`, `mongo`).
        backend: &'static str,
        /// What the engine was doing.
        message: String,
        /// The client library's error.
        #[source]
        source: BoxError,
    },

    /// The lock is no longer held by this owner: its lease ran out (and maybe someone else holds
    /// it now), it was already released, or the backend lost it.
    #[error("lock {key:?} is no longer held by this owner")]
    LockLost {
        /// The lock's key.
        key: String,
    },

    /// The lock could not be acquired within the retry policy (retries exhausted, `total_time`
    /// or `fail_after` elapsed, or the custom delay function stopped the retries).
    #[error("gave up acquiring lock {key:?} after {attempts} attempt(s) in {elapsed:?}")]
    Timeout {
        /// The lock's key.
        key: String,
        /// How many backend acquire attempts were made.
        attempts: u32,
        /// How long the caller waited in total.
        elapsed: Duration,
    },

    /// The caller passed a value the engine cannot work with (empty key, zero ttl, zero
    /// `max_holders`, a malformed owner token, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl LockError {
    /// Wraps a backend client error.
    pub fn backend(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        LockError::BackendUnavailable {
            backend,
            message: message.into(),
            source: source.into(),
        }
    }

    /// Builds an [`LockError::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        LockError::InvalidArgument(message.into())
    }

    /// True for [`LockError::BackendUnavailable`]: the caller may retry later.
    pub fn is_backend_unavailable(&self) -> bool {
        matches!(self, LockError::BackendUnavailable { .. })
    }
}

/// Result alias of the lock engine.
pub type LockResult<T> = Result<T, LockError>;
