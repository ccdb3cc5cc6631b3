//! [`Locker`] and [`LockRequest`]: acquiring locks with retries, push wake-ups and safe
//! cancellation.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

use crate::backend::{
    validate_key, validate_lock_delay, validate_max_holders, validate_owner, validate_ttl,
    AcquireMode, AcquireOutcome, AcquireRequest, Backend, Handoff, LockSnapshot, ShareMode,
    WakeSubscription, WakeUp,
};
use crate::error::{LockError, LockResult};
use crate::handle::{local_lease_deadline, GrantParts, Lock};
use crate::retry::{RetryContext, RetryPolicy};

/// Slack added to a waiter's queue heartbeat beyond twice its polling delay, so a live
/// waiter never ages out between two of its attempts.
const WAITER_LEASE_SLACK: Duration = Duration::from_secs(1);

/// Entry point of the engine: a backend plus default retry settings.
///
/// Cheap to clone; clones share the backend.
#[derive(Clone, Debug)]
pub struct Locker {
    backend: Arc<dyn Backend>,
    retry: RetryPolicy,
}

impl Locker {
    /// A locker over `backend` with [`RetryPolicy::default`].
    pub fn new(backend: impl Backend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A locker over a shared, runtime-chosen backend.
    pub fn from_arc(backend: Arc<dyn Backend>) -> Self {
        Locker {
            backend,
            retry: RetryPolicy::default(),
        }
    }

    /// Replaces the default retry policy of requests made by this locker.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The default retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Prepares a lock on `key` with a lease of `ttl`. Nothing happens until
    /// [`acquire`](LockRequest::acquire), [`try_acquire`](LockRequest::try_acquire) or
    /// [`run`](LockRequest::run).
    pub fn lock(&self, key: impl Into<String>, ttl: Duration) -> LockRequest {
        LockRequest {
            backend: Arc::clone(&self.backend),
            key: key.into(),
            ttl,
            retry: self.retry.clone(),
            max_holders: 1,
            owner: None,
            share: None,
            priority: 0,
            max_hold: None,
            lock_delay: Duration::ZERO,
        }
    }

    /// Raises `key`'s fence counter to at least `floor`, so the next grant's token exceeds it
    /// (after backend data loss). Returns the counter afterwards.
    pub async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        validate_key(key)?;
        self.backend.raise_fencing_floor(key, floor).await
    }

    /// Live holders, waiters and the fence counter of `key`.
    pub async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        validate_key(key)?;
        self.backend.snapshot(key).await
    }
}

/// A prepared lock: builder methods, then one of the acquire methods (each may be called
/// repeatedly; every call is a separate request).
#[derive(Clone, Debug)]
pub struct LockRequest {
    backend: Arc<dyn Backend>,
    key: String,
    ttl: Duration,
    retry: RetryPolicy,
    max_holders: u32,
    owner: Option<String>,
    /// `None`: shared with more than one holder allowed (a counting semaphore, as before
    /// modes existed), else exclusive; the two are the same for a mutex.
    share: Option<ShareMode>,
    priority: i32,
    max_hold: Option<Duration>,
    lock_delay: Duration,
}

impl LockRequest {
    setters! {
        /// Overrides the locker's retry policy for this request.
        retry(policy: RetryPolicy) => retry = policy;

        /// Admits up to `max_holders` holders at once, of any mode (with
        /// [`shared`](LockRequest::shared): a counting semaphore or a read/write lock); default 1.
        /// A different value takes effect at the next grant: lowering it never revokes a holder,
        /// it only stops grants until the holders drop below it.
        max_holders(max_holders: u32) => max_holders = max_holders;
    }

    /// Holds together with other shared holders, up to `max_holders` at once (a reader of a
    /// read/write lock, a slot of a semaphore). A waiting exclusive request stops later
    /// shared ones from overtaking it.
    pub fn shared(mut self) -> Self {
        self.share = Some(ShareMode::Shared);
        self
    }

    /// Holds alone: granted only when nobody else holds the lock (the writer of a read/write
    /// lock). Without [`shared`](LockRequest::shared) or `exclusive`, a request with
    /// `max_holders` above 1 is shared (a counting semaphore, as before modes existed) and a
    /// mutex request exclusive (for a mutex the two are the same).
    pub fn exclusive(mut self) -> Self {
        self.share = Some(ShareMode::Exclusive);
        self
    }

    /// The mode this request holds in (see [`exclusive`](LockRequest::exclusive)).
    pub fn share_mode(&self) -> ShareMode {
        self.share.unwrap_or(if self.max_holders > 1 {
            ShareMode::Shared
        } else {
            ShareMode::Exclusive
        })
    }

    setters! {
        /// Queue priority (default 0): a waiter of higher priority is served first, first come
        /// first served within one priority. A holder is never preempted.
        priority(priority: i32) => priority = priority;

        /// A hard limit on how long one grant lasts: it ends at (backend clock at the grant) +
        /// `max_hold`, whatever its renewals or re-acquires; `extend` after that fails with
        /// [`LockError::LockLost`]. Validated like a ttl.
        max_hold(max_hold: Duration) => max_hold = Some(max_hold);

        /// If this grant ends involuntarily (its lease runs out, also at the max-hold deadline),
        /// nobody is granted the key until `lease_end + lock_delay`, so a stalled holder's last
        /// writes drain first. A release hands off at once. Default zero.
        lock_delay(lock_delay: Duration) => lock_delay = lock_delay;

        /// Uses an explicit owner token instead of a fresh random 128-bit one. Re-acquiring with a
        /// token that already holds the lock is idempotent (same fencing token, lease refreshed).
        /// The token must be unique to one logical holder: cancelling an acquire releases whatever
        /// this token holds on the key.
        owner(token: impl Into<String>) => owner = Some(token.into());
    }

    /// Acquires the lock, waiting per the retry policy. Fails with [`LockError::Timeout`]
    /// when the policy gives up. If this future is dropped, or `fail_after` fires, while an
    /// attempt is in flight, whatever it may have won is released and the queue place is left.
    pub async fn acquire(&self) -> LockResult<Lock> {
        let owner = self.checked_owner()?;
        let started = Instant::now();
        let attempts = AtomicU32::new(0);
        let mut guard = CancelGuard::new(self, &owner);
        let result = match self.retry.fail_after_limit() {
            Some(limit) => {
                match tokio::time::timeout(limit, self.wait_loop(&owner, started, &attempts)).await
                {
                    Ok(result) => result,
                    Err(_) => Err(self.timeout_error(&attempts, started)),
                }
            }
            None => self.wait_loop(&owner, started, &attempts).await,
        };
        guard.disarm();
        if result.is_err() {
            self.abandon(&owner).await;
        }
        result
    }

    /// One attempt, no waiting (tryLock): `Ok(None)` if the lock is busy or others are queued
    /// for it (it never jumps the queue).
    pub async fn try_acquire(&self) -> LockResult<Option<Lock>> {
        let owner = self.checked_owner()?;
        let mut guard = CancelGuard::new(self, &owner);
        let sent_at = Instant::now();
        let outcome = self.attempt(&owner, AcquireMode::Try, Duration::ZERO).await;
        guard.disarm();
        match outcome {
            Ok(AcquireOutcome::Granted {
                fencing_token, ttl, ..
            }) => Ok(Some(self.grant(
                owner,
                fencing_token,
                local_lease_deadline(sent_at, ttl),
            ))),
            Ok(AcquireOutcome::Busy { .. } | AcquireOutcome::Waiting { .. }) => Ok(None),
            Err(error) => {
                self.abandon(&owner).await;
                Err(error)
            }
        }
    }

    /// Acquires the lock, runs `critical_section` with it, and releases it when the section
    /// ends — also when it returns an error or panics (the panic is resumed after the release).
    /// A failed release is logged, not returned: the section's result matters more, and the
    /// lease runs out anyway.
    pub async fn run<F, Fut, T>(&self, critical_section: F) -> LockResult<T>
    where
        F: FnOnce(Lock) -> Fut,
        Fut: Future<Output = T>,
    {
        let lock = self.acquire().await?;
        let outcome = AssertUnwindSafe(critical_section(lock.clone()))
            .catch_unwind()
            .await;
        if let Err(error) = lock.release().await {
            tracing::warn!(key = %self.key, fencing_token = lock.fencing_token(), %error, "release after critical section failed; the lease will run out");
        }
        match outcome {
            Ok(value) => Ok(value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    fn checked_owner(&self) -> LockResult<String> {
        validate_key(&self.key)?;
        validate_ttl(self.ttl)?;
        validate_max_holders(self.max_holders)?;
        if let Some(max_hold) = self.max_hold {
            validate_ttl(max_hold)?;
        }
        validate_lock_delay(self.lock_delay)?;
        let owner = match &self.owner {
            Some(owner) => owner.clone(),
            None => uuid::Uuid::new_v4().simple().to_string(),
        };
        validate_owner(&owner)?;
        Ok(owner)
    }

    async fn attempt(
        &self,
        owner: &str,
        mode: AcquireMode,
        waiter_lease: Duration,
    ) -> LockResult<AcquireOutcome> {
        self.backend
            .acquire(&AcquireRequest {
                key: &self.key,
                owner,
                ttl: self.ttl,
                max_holders: self.max_holders,
                mode,
                waiter_lease,
                share: self.share_mode(),
                priority: self.priority,
                max_hold: self.max_hold,
                lock_delay: self.lock_delay,
            })
            .await
    }

    async fn wait_loop(
        &self,
        owner: &str,
        started: Instant,
        attempts: &AtomicU32,
    ) -> LockResult<Lock> {
        let mut subscription: Option<WakeSubscription> = None;
        let mut previous_delay = None;
        loop {
            let context = RetryContext {
                attempt: attempts.load(Ordering::Relaxed),
                started_at: started,
                previous_delay,
            };
            // Decided before the attempt so the queue heartbeat can cover the coming pause.
            let next_delay = self.retry.plan(&context, Instant::now());
            let (mode, waiter_lease) = match next_delay {
                Some(delay) => (AcquireMode::Wait, delay * 2 + WAITER_LEASE_SLACK),
                None => (AcquireMode::Try, Duration::ZERO),
            };
            if subscription.is_none() && mode == AcquireMode::Wait {
                // Free when others already wait here; then no wake-up can slip past us.
                subscription = self.backend.subscribe_if_live(&self.key, owner);
            }
            attempts.fetch_add(1, Ordering::Relaxed);
            // A lease granted by this attempt, or handed over after it, starts no earlier.
            let mut sent_at = Instant::now();
            let mut outcome = self.attempt(owner, mode, waiter_lease).await?;
            if subscription.is_none() && mode == AcquireMode::Wait && !outcome.is_granted() {
                // Subscribe only once contended (the uncontended path stays one round trip),
                // then look again: a release between the attempt and the subscription named
                // us to nobody. This confirmation is part of the same attempt.
                subscription = Some(self.backend.subscribe(&self.key, owner).await?);
                // Whatever is granted from here on, by this attempt or a hand-off after it,
                // starts no earlier than this attempt was sent.
                sent_at = Instant::now();
                outcome = self.attempt(owner, mode, waiter_lease).await?;
            }
            let retry_after = match outcome {
                AcquireOutcome::Granted {
                    fencing_token, ttl, ..
                } => {
                    tracing::debug!(key = %self.key, fencing_token, attempts = attempts.load(Ordering::Relaxed), "lock acquired");
                    return Ok(self.grant(
                        owner.to_owned(),
                        fencing_token,
                        local_lease_deadline(sent_at, ttl),
                    ));
                }
                AcquireOutcome::Waiting {
                    position,
                    retry_after,
                } => {
                    tracing::trace!(key = %self.key, position, "waiting for lock");
                    retry_after
                }
                AcquireOutcome::Busy { retry_after } => retry_after,
            };
            let Some(delay) = next_delay else {
                return Err(self.timeout_error(attempts, started));
            };
            // A lease that runs out frees a slot without any wake-up: look again right then.
            let pause =
                retry_after.map_or(delay, |expiry| delay.min(expiry + Duration::from_millis(1)));
            let wake_up = match &subscription {
                Some(subscription) => {
                    tokio::select! {
                        wake_up = subscription.notified() => wake_up,
                        () = tokio::time::sleep(pause) => subscription.take_handoff(),
                    }
                }
                None => {
                    tokio::time::sleep(pause).await;
                    WakeUp::Retry
                }
            };
            if let WakeUp::Granted(handoff) = wake_up {
                return Ok(self.take_handoff(owner, handoff, sent_at, attempts));
            }
            previous_delay = Some(delay);
        }
    }

    /// Builds the lock a release handed to us and, if the hand-off lease is shorter than our
    /// ttl, extends it in the background (the lock is usable at once; its local deadline is
    /// the conservative hand-off one until the extension lands).
    fn take_handoff(
        &self,
        owner: &str,
        handoff: Handoff,
        last_attempt_sent_at: Instant,
        attempts: &AtomicU32,
    ) -> Lock {
        tracing::debug!(key = %self.key, fencing_token = handoff.fencing_token, attempts = attempts.load(Ordering::Relaxed), "lock handed over");
        // The hand-off happened after our last attempt reached the backend.
        let lock = self.grant(
            owner.to_owned(),
            handoff.fencing_token,
            local_lease_deadline(last_attempt_sent_at, handoff.lease),
        );
        if handoff.lease < self.ttl && self.max_hold.is_none_or(|max| handoff.lease < max) {
            let background = lock.clone();
            tokio::spawn(async move {
                match background.refresh().await {
                    Ok(()) => {}
                    Err(LockError::LockLost { .. }) if background.is_released() => {}
                    Err(error) => {
                        tracing::warn!(key = %background.key(), fencing_token = background.fencing_token(), %error, "could not extend a handed-over lease to its full ttl");
                    }
                }
            });
        }
        lock
    }

    fn grant(&self, owner: String, fencing_token: u64, lease_deadline: Instant) -> Lock {
        Lock::new(GrantParts {
            backend: Arc::clone(&self.backend),
            key: self.key.clone(),
            owner,
            ttl: self.ttl,
            max_holders: self.max_holders,
            fencing_token,
            lease_deadline,
        })
    }

    fn timeout_error(&self, attempts: &AtomicU32, started: Instant) -> LockError {
        LockError::Timeout {
            key: self.key.clone(),
            attempts: attempts.load(Ordering::Relaxed),
            elapsed: started.elapsed(),
        }
    }

    /// After giving up: release anything the owner may have won and leave the queue. Safe
    /// because owner tokens are unique and release is compare-and-delete.
    async fn abandon(&self, owner: &str) {
        if let Err(error) = self
            .backend
            .release(&self.key, owner, self.max_holders)
            .await
        {
            tracing::warn!(key = %self.key, %error, "could not clean up an abandoned acquire; its lease and queue place will age out");
        }
    }
}

impl AcquireOutcome {
    fn is_granted(&self) -> bool {
        matches!(self, AcquireOutcome::Granted { .. })
    }
}

/// Releases the owner's grant and queue place in the background if an acquire future is
/// dropped mid-flight.
struct CancelGuard {
    armed: Option<(Arc<dyn Backend>, String, String, u32)>,
}

impl CancelGuard {
    fn new(request: &LockRequest, owner: &str) -> Self {
        CancelGuard {
            armed: Some((
                Arc::clone(&request.backend),
                request.key.clone(),
                owner.to_owned(),
                request.max_holders,
            )),
        }
    }

    fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        let Some((backend, key, owner, max_holders)) = self.armed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(%key, "acquire cancelled outside a tokio runtime; a won lease will run out");
            return;
        };
        runtime.spawn(async move {
            if let Err(error) = backend.release(&key, &owner, max_holders).await {
                tracing::warn!(%key, %error, "cleanup of a cancelled acquire failed; its lease and queue place will age out");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::counting::CountingBackend;
    use crate::MemoryBackend;

    fn counted(backend: &Arc<CountingBackend>) -> Locker {
        Locker::from_arc(Arc::clone(backend) as Arc<dyn Backend>)
    }

    /// Lets every task that can run, run (the clock is paused: nothing else advances it).
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_locker_keeps_the_retry_policy_it_was_given() {
        let locker = Locker::new(MemoryBackend::new()).with_retry(RetryPolicy::no_retry());
        assert_eq!(locker.retry_policy().retry_times, Some(0));
        assert_eq!(locker.backend().kind(), "memory");
    }

    #[tokio::test(start_paused = true)]
    async fn an_uncontended_acquire_is_one_attempt_and_no_subscription() {
        let backend = Arc::new(CountingBackend::default());
        let lock = counted(&backend)
            .lock("k", Duration::from_secs(30))
            .acquire()
            .await
            .expect("acquire");
        assert_eq!(CountingBackend::count(&backend.acquires), 1);
        assert_eq!(CountingBackend::count(&backend.subscribes), 0);
        lock.release().await.expect("release");
    }

    /// A holder, then a waiter that polls every `delay` while the holder keeps the lock for
    /// `hold`; the waiter's task and the holder's lock.
    async fn hold_and_wait(
        locker: &Locker,
        delay: Duration,
        hold: Duration,
    ) -> (tokio::task::JoinHandle<LockResult<Lock>>, Lock) {
        let holder = locker.lock("k", hold).acquire().await.expect("acquire");
        let waiter = locker
            .lock("k", Duration::from_secs(30))
            .retry(RetryPolicy::forever().retry_delay(delay));
        let waiting = tokio::spawn(async move { waiter.acquire().await });
        settle().await;
        (waiting, holder)
    }

    #[tokio::test(start_paused = true)]
    async fn a_contended_wait_subscribes_once_then_is_woken_by_the_hand_off() {
        let backend = Arc::new(CountingBackend::default());
        let locker = counted(&backend);
        let hour = Duration::from_secs(3600);
        let (waiting, holder) = hold_and_wait(&locker, hour, hour).await;
        // The holder's attempt, the waiter's, and the one confirming after it subscribed.
        assert_eq!(CountingBackend::count(&backend.acquires), 3);
        assert_eq!(CountingBackend::count(&backend.subscribes), 1);
        holder.release().await.expect("release");
        let next = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("handed over, not polled an hour later")
            .expect("task")
            .expect("acquire");
        assert_eq!(next.fencing_token(), 2);
        assert_eq!(CountingBackend::count(&backend.acquires), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscription_made_at_once_saves_the_confirming_attempt_and_is_made_once() {
        let backend = Arc::new(CountingBackend::subscribing_at_once());
        let locker = counted(&backend);
        let second = Duration::from_secs(1);
        let (waiting, holder) = hold_and_wait(&locker, second, Duration::from_secs(3600)).await;
        assert_eq!(CountingBackend::count(&backend.acquires), 2);
        // Three polls later, still one subscription each (asked before the first attempt).
        tokio::time::sleep(3 * second + second / 2).await;
        settle().await;
        assert_eq!(CountingBackend::count(&backend.acquires), 5);
        assert_eq!(CountingBackend::count(&backend.live_subscribes), 2);
        assert_eq!(CountingBackend::count(&backend.subscribes), 0);
        holder.release().await.expect("release");
        waiting.await.expect("task").expect("acquire");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_keeps_its_place_between_two_polls() {
        let backend = Arc::new(CountingBackend::default());
        let locker = counted(&backend);
        let delay = Duration::from_secs(10);
        let (waiting, holder) = hold_and_wait(&locker, delay, Duration::from_secs(3600)).await;
        // Its heartbeat covers two pauses and a second more: after 8 s it is still queued.
        tokio::time::sleep(Duration::from_secs(8)).await;
        let queue = locker.snapshot("k").await.expect("snapshot").waiters;
        assert_eq!(queue.len(), 1);
        holder.release().await.expect("release");
        waiting.await.expect("task").expect("acquire");
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_hand_off_lease_is_extended_unless_max_hold_capped_it() {
        let secs = Duration::from_secs;
        // The hand-off lease is what is left of the waiter's heartbeat (5 s), capped by its ttl
        // and max hold: extended at once only when that is below both.
        let cases = [
            (secs(30), None, 1),
            (secs(30), Some(secs(20)), 1),
            (secs(30), Some(secs(5)), 0),
            (secs(3), None, 0),
        ];
        for (ttl, max_hold, extends) in cases {
            let backend = Arc::new(CountingBackend::default());
            let locker = counted(&backend);
            let holder = locker
                .lock("k", secs(3600))
                .acquire()
                .await
                .expect("acquire");
            let mut waiter = locker
                .lock("k", ttl)
                .retry(RetryPolicy::forever().retry_delay(secs(2)));
            if let Some(max_hold) = max_hold {
                waiter = waiter.max_hold(max_hold);
            }
            let waiting = tokio::spawn(async move { waiter.acquire().await });
            settle().await;
            holder.release().await.expect("release");
            let lock = waiting.await.expect("task").expect("acquire");
            settle().await;
            assert_eq!(
                CountingBackend::count(&backend.extends),
                extends,
                "ttl {ttl:?}, max hold {max_hold:?}"
            );
            lock.release().await.expect("release");
        }
    }

    #[tokio::test]
    async fn without_a_mode_a_semaphore_is_shared_and_a_mutex_exclusive() {
        let locker = Locker::new(MemoryBackend::new());
        let ttl = Duration::from_secs(30);
        let slots = locker.lock("jobs", ttl).max_holders(2);
        assert_eq!(slots.share_mode(), ShareMode::Shared);
        let first = slots.try_acquire().await.expect("acquire").expect("a slot");
        let second = slots.try_acquire().await.expect("acquire").expect("a slot");
        assert!(
            slots.try_acquire().await.expect("acquire").is_none(),
            "full"
        );
        first.release().await.expect("release");
        // An explicit exclusive request on the same key waits for every holder to go.
        let writer = locker.lock("jobs", ttl).max_holders(2).exclusive();
        assert!(writer.try_acquire().await.expect("acquire").is_none());
        second.release().await.expect("release");
        let alone = writer.try_acquire().await.expect("acquire").expect("alone");
        assert!(
            slots.try_acquire().await.expect("acquire").is_none(),
            "held alone"
        );
        alone.release().await.expect("release");
        assert_eq!(
            locker.lock("m", ttl).share_mode(),
            ShareMode::Exclusive,
            "a mutex"
        );
    }
}
