//! A memory backend that counts the engine's calls, for unit tests of what a wait costs in
//! round trips (the conformance suite checks what it achieves, not how many calls it made).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    AcquireOutcome, AcquireRequest, Backend, LockSnapshot, MemoryBackend, WakeSubscription,
};
use crate::error::LockResult;

/// [`MemoryBackend`] plus call counters; with `subscribes_at_once`, it answers
/// [`Backend::subscribe_if_live`] as Redis does while its channel is already subscribed.
#[derive(Debug, Default)]
pub(crate) struct CountingBackend {
    inner: MemoryBackend,
    subscribes_at_once: bool,
    pub(crate) acquires: AtomicU32,
    pub(crate) extends: AtomicU32,
    pub(crate) subscribes: AtomicU32,
    pub(crate) live_subscribes: AtomicU32,
}

impl CountingBackend {
    /// Counts, and subscribes at once when asked before an attempt.
    pub(crate) fn subscribing_at_once() -> Self {
        CountingBackend {
            subscribes_at_once: true,
            ..Self::default()
        }
    }

    /// One counter's value.
    pub(crate) fn count(counter: &AtomicU32) -> u32 {
        counter.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Backend for CountingBackend {
    fn kind(&self) -> &'static str {
        "counting"
    }
    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(request).await
    }
    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        self.inner.release(key, owner, max_holders).await
    }
    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.inner.extend(key, owner, ttl).await
    }
    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        self.inner.is_held(key, owner).await
    }
    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        self.inner.snapshot(key).await
    }
    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        self.inner.raise_fencing_floor(key, floor).await
    }
    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        self.subscribes.fetch_add(1, Ordering::SeqCst);
        self.inner.subscribe(key, owner).await
    }
    fn subscribe_if_live(&self, key: &str, owner: &str) -> Option<WakeSubscription> {
        self.live_subscribes.fetch_add(1, Ordering::SeqCst);
        if !self.subscribes_at_once {
            return None;
        }
        // The memory backend's subscription is a local registration: it never waits.
        futures::executor::block_on(self.inner.subscribe(key, owner)).ok()
    }
}
