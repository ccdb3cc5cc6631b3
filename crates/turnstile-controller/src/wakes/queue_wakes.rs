//! Wake-ups from a backend's queue. A claim refused because its lock's key is held from
//! outside this cluster joins the backend's queue for the key (see `BackendOp::Acquire`'s
//! `queue`), and the backend hands the key to the head of that queue when it is released —
//! in another cluster. The backend says so to a subscriber: the lock's pass runs then, not
//! at its next retry (up to [`MAX_BUSY_RETRY`](crate::core::MAX_BUSY_RETRY) later).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::ObjectRef;
use turnstile_api::DistributedLock;
use turnstile_lock::Backend;

use crate::pass::backend_call::WAITER_LEASE;
use crate::wakes::lock_wakes::LockWakes;

/// The subscriptions live now, one per backend key and owner.
#[derive(Debug, Clone, Default)]
pub struct QueueWakes {
    live: Arc<Mutex<HashSet<(String, String)>>>,
}

impl QueueWakes {
    /// Wakes `lock` through `wakes` when `backend` hands `key` to `owner` (or otherwise
    /// wakes `owner`'s place), for at most [`WAITER_LEASE`] — as long as the place lasts
    /// without another try; the pass that tries again watches again. One subscription per
    /// key and owner at a time.
    pub fn watch(
        &self,
        backend: Arc<dyn Backend>,
        key: &str,
        owner: &str,
        lock: ObjectRef<DistributedLock>,
        wakes: LockWakes,
    ) {
        let place = (key.to_owned(), owner.to_owned());
        if !self.lock().insert(place.clone()) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let (key, owner) = &place;
            match backend.subscribe(key, owner).await {
                Ok(subscription) => {
                    let woken = tokio::time::timeout(WAITER_LEASE, subscription.notified()).await;
                    if woken.is_ok() {
                        tracing::debug!(key, owner, "the backend's queue woke a claim");
                        wakes.wake(lock);
                    }
                }
                // The pass's retry comes anyway.
                Err(error) => tracing::debug!(key, %error, "no queue wake-ups"),
            }
            this.lock().remove(&place);
        });
    }

    /// How many subscriptions are live.
    pub fn live(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        // A panic while holding this lock leaves a plain set behind: still usable.
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use turnstile_lock::{AcquireMode, AcquireOutcome, AcquireRequest, MemoryBackend};

    use super::*;

    fn request<'a>(owner: &'a str, mode: AcquireMode) -> AcquireRequest<'a> {
        let ttl = Duration::from_secs(30);
        AcquireRequest::new("ns/db", owner, ttl, 1, mode, WAITER_LEASE)
    }

    /// The backend hands the key to the claim waiting in its queue when the other cluster
    /// releases it: its lock is woken then, once, and the subscription ends.
    #[tokio::test]
    async fn a_hand_off_from_the_backends_queue_wakes_the_lock_once() {
        let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        let held = backend.acquire(&request("east/e1", AcquireMode::Try)).await;
        assert!(matches!(held, Ok(AcquireOutcome::Granted { .. })));
        let queued = backend
            .acquire(&request("west/w1", AcquireMode::Wait))
            .await;
        assert!(
            matches!(queued, Ok(AcquireOutcome::Waiting { .. })),
            "{queued:?}"
        );

        let (queue_wakes, wakes) = (QueueWakes::default(), LockWakes::default());
        let mut woken = wakes.take_stream().expect("the wake-ups");
        let lock = ObjectRef::<DistributedLock>::new("db").within("ns");
        for _ in 0..2 {
            queue_wakes.watch(
                backend.clone(),
                "ns/db",
                "west/w1",
                lock.clone(),
                wakes.clone(),
            );
        }
        assert_eq!(queue_wakes.live(), 1, "one subscription per place");
        // Subscribed before the release: let the task get there.
        tokio::time::sleep(Duration::from_millis(50)).await;

        assert!(backend
            .release("ns/db", "east/e1", 1)
            .await
            .expect("release"));
        let next = tokio::time::timeout(Duration::from_secs(5), woken.next()).await;
        assert_eq!(next.expect("woken in time"), Some(lock));
        assert!(backend.is_held("ns/db", "west/w1").await.expect("is_held"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(queue_wakes.live(), 0, "the subscription ended");
    }
}
