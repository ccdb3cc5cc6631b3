//! What the reconcilers share: the API client, the caches, the backends, Events and metrics.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Client;

use super::backends::Backends;
use crate::api::{DistributedLock, LockClaim};
use crate::metrics::Metrics;

/// First retry delay after a failed pass or an unavailable backend.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Shared state of the reconcilers.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The lock cache (filled by the lock controller's watch).
    pub locks: Store<DistributedLock>,
    /// The claim cache (filled by the shared claim watch).
    pub claims: Store<LockClaim>,
    /// The lock backends.
    pub backends: Backends,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: Metrics,
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    /// Assembles a context.
    pub fn new(
        client: Client,
        locks: Store<DistributedLock>,
        claims: Store<LockClaim>,
        backends: Backends,
        recorder: Recorder,
        metrics: Metrics,
    ) -> Self {
        Self {
            client,
            locks,
            claims,
            backends,
            recorder,
            metrics,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the lock exists in the cache.
    pub fn lock_exists(&self, namespace: &str, name: &str) -> bool {
        self.locks
            .get(&ObjectRef::new(name).within(namespace))
            .is_some()
    }

    /// The next retry delay for `key` (exponential, capped), counting this failure.
    pub fn backoff(&self, key: &str) -> Duration {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = failures.entry(key.to_owned()).or_insert(0);
        let delay = BACKOFF_BASE.saturating_mul(2u32.saturating_pow(*count));
        *count = count.saturating_add(1).min(16);
        delay.min(BACKOFF_MAX)
    }

    /// Forgets the failures of `key` after a clean pass.
    pub fn reset_backoff(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(key);
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("backends", &self.backends)
            .finish_non_exhaustive()
    }
}
