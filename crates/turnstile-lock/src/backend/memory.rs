//! In-process backend: one mutex-protected map, tokio's clock, a [`WakeRegistry`] as notifier.
//!
//! Locks live as long as the [`MemoryBackend`] value (and its clones). Fence counters are kept
//! for every key ever used, so tokens keep increasing after a lock goes idle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::state::KeyState;
use super::{
    validate_key, validate_max_holders, validate_owner, validate_request, validate_ttl,
    AcquireOutcome, AcquireRequest, Backend, LockSnapshot, WakeRegistry, WakeSubscription,
};
use crate::error::LockResult;

#[derive(Debug, Default)]
struct Shared {
    locks: Mutex<HashMap<String, KeyState>>,
    wakes: WakeRegistry,
}

/// Locks held in this process only: for tests, single-replica deployments and the embedded
/// default of the controller. Cloning shares the same locks.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    shared: Arc<Shared>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn locks(&self) -> MutexGuard<'_, HashMap<String, KeyState>> {
        // Every critical section leaves the map consistent before it could panic.
        self.shared
            .locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        validate_request(request)?;
        // Nothing here ever waits, so a task looping acquire/release would never yield and
        // could starve every other task (the waiters, timers) on its runtime thread.
        tokio::task::consume_budget().await;
        let now = Instant::now();
        let mut locks = self.locks();
        let state = locks.entry(request.key.to_owned()).or_default();
        Ok(state.acquire(request, now))
    }

    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_max_holders(max_holders)?;
        tokio::task::consume_budget().await;
        let was_held = {
            let now = Instant::now();
            let mut locks = self.locks();
            let Some(state) = locks.get_mut(key) else {
                return Ok(false);
            };
            let (was_held, handoffs) = state.release(owner, max_holders, now);
            for (next, handoff) in handoffs {
                self.shared.wakes.hand_off(key, &next, handoff);
            }
            was_held
        };
        // Let other tasks run before this one can come back for the lock. Nothing in this
        // backend ever waits, so on a single-threaded runtime a releaser that re-requests at
        // once would otherwise beat tasks that never got scheduled far enough to queue.
        tokio::task::yield_now().await;
        Ok(was_held)
    }

    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_ttl(ttl)?;
        let now = Instant::now();
        let mut locks = self.locks();
        Ok(locks
            .get_mut(key)
            .and_then(|state| state.extend(owner, ttl, now)))
    }

    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        let now = Instant::now();
        let locks = self.locks();
        Ok(locks
            .get(key)
            .is_some_and(|state| state.is_held(owner, now)))
    }

    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        validate_key(key)?;
        let now = Instant::now();
        let mut locks = self.locks();
        Ok(locks
            .get_mut(key)
            .map(|state| state.snapshot(now))
            .unwrap_or_default())
    }

    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        validate_key(key)?;
        let mut locks = self.locks();
        Ok(locks
            .entry(key.to_owned())
            .or_default()
            .raise_fencing_floor(floor))
    }

    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        validate_key(key)?;
        validate_owner(owner)?;
        Ok(self.shared.wakes.register(key, owner, None))
    }
}
