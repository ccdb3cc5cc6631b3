//! [`Lock`]: a granted lease, with its fencing token, renewal and release.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{validate_ttl, Backend};
use crate::error::{LockError, LockResult};

/// A granted lock (or one of a semaphore's slots).
///
/// Cloning yields another handle to the same grant; releasing through any handle releases it.
///
/// **Drop:** when the last handle of a lock that was not released is dropped, the lock is
/// released in the background if a tokio runtime is available (best effort: errors are only
/// logged). Without a runtime the lease simply runs out. Prefer an explicit
/// [`release`](Lock::release) or [`LockRequest::run`](crate::LockRequest::run).
#[derive(Clone)]
pub struct Lock {
    inner: Arc<Grant>,
}

struct Grant {
    backend: Arc<dyn Backend>,
    key: String,
    owner: String,
    ttl: Duration,
    max_holders: u32,
    fencing_token: u64,
    /// Local, conservative end of the lease: measured from *before* the request that granted
    /// or extended it was sent, minus a small margin (see [`local_lease_deadline`]), so it
    /// never lies later than the backend's expiry.
    lease_deadline: Mutex<Instant>,
    lost: AtomicBool,
    released: AtomicBool,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("backend", &self.inner.backend.kind())
            .field("key", &self.inner.key)
            .field("owner", &self.inner.owner)
            .field("fencing_token", &self.inner.fencing_token)
            .field("lost", &self.is_lost())
            .field("released", &self.is_released())
            .finish()
    }
}

/// The local end of a lease granted or extended by a request sent at `sent_at`.
///
/// Kept a little short of `sent_at + ttl` so the local "lost" verdict never comes later than
/// the backend's: backends count expiry in whole milliseconds (up to 1 ms less than the ttl)
/// on their own clock, whose rate may differ slightly from ours (NTP slews by at most 0.05%).
/// The margin is 1 ms plus 0.2% of the ttl.
pub(crate) fn local_lease_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    let margin = Duration::from_millis(1) + ttl / 500;
    sent_at + ttl.saturating_sub(margin)
}

/// Everything [`Lock::new`] needs, as granted by a backend.
pub(crate) struct GrantParts {
    pub backend: Arc<dyn Backend>,
    pub key: String,
    pub owner: String,
    pub ttl: Duration,
    pub max_holders: u32,
    pub fencing_token: u64,
    pub lease_deadline: Instant,
}

impl Lock {
    pub(crate) fn new(parts: GrantParts) -> Self {
        Lock {
            inner: Arc::new(Grant {
                backend: parts.backend,
                key: parts.key,
                owner: parts.owner,
                ttl: parts.ttl,
                max_holders: parts.max_holders,
                fencing_token: parts.fencing_token,
                lease_deadline: Mutex::new(parts.lease_deadline),
                lost: AtomicBool::new(false),
                released: AtomicBool::new(false),
            }),
        }
    }

    /// The fencing token of this grant: strictly greater than every earlier grant's on this key.
    /// Pass it to the resource you protect so it can reject writes from stale holders.
    pub fn fencing_token(&self) -> u64 {
        self.inner.fencing_token
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The owner token this grant is held under.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The lease length requested at acquire time (what [`refresh`](Lock::refresh) restores).
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// 1 for a mutex, N for a semaphore slot.
    pub fn max_holders(&self) -> u32 {
        self.inner.max_holders
    }

    /// Local, conservative end of the lease (earlier than or equal to the backend's view).
    pub fn lease_deadline(&self) -> Instant {
        *self.deadline_guard()
    }

    /// Cheap local check, no backend call: true once the lease ran out by the local clock or a
    /// backend call reported the lock gone. A lost lock stays lost.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.load(Ordering::Acquire) || Instant::now() >= self.lease_deadline()
    }

    /// True once [`release`](Lock::release) or [`release_strict`](Lock::release_strict)
    /// succeeded through any handle.
    pub fn is_released(&self) -> bool {
        self.inner.released.load(Ordering::Acquire)
    }

    /// Asks the backend whether this owner still holds a live lease. A `false` also marks
    /// the lock lost.
    pub async fn is_locked(&self) -> LockResult<bool> {
        if self.is_released() || self.inner.lost.load(Ordering::Acquire) {
            return Ok(false);
        }
        let held = self
            .inner
            .backend
            .is_held(&self.inner.key, &self.inner.owner)
            .await?;
        if !held {
            self.mark_lost();
        }
        Ok(held)
    }

    /// Sets the lease to `ttl` from now, capped at the grant's max-hold deadline (see
    /// [`LockRequest::max_hold`](crate::LockRequest::max_hold)). Fails with
    /// [`LockError::LockLost`] if the lock was released, expired (also at that deadline) or
    /// taken over: an old holder can never extend someone else's lease.
    pub async fn extend(&self, ttl: Duration) -> LockResult<()> {
        validate_ttl(ttl)?;
        if self.is_released() || self.inner.lost.load(Ordering::Acquire) {
            return Err(self.lost_error());
        }
        let sent_at = Instant::now();
        let extended = self
            .inner
            .backend
            .extend(&self.inner.key, &self.inner.owner, ttl)
            .await?;
        let Some(lease) = extended else {
            self.mark_lost();
            return Err(self.lost_error());
        };
        // The backend may have granted less (max hold): the local deadline follows it.
        *self.deadline_guard() = local_lease_deadline(sent_at, lease);
        tracing::debug!(key = %self.inner.key, fencing_token = self.inner.fencing_token, lease_ms = lease.as_millis() as u64, "lock extended");
        Ok(())
    }

    /// Resets the lease to the ttl it was acquired with (simple-redis-mutex's
    /// `refreshTimeout`). Fails like [`extend`](Lock::extend).
    pub async fn refresh(&self) -> LockResult<()> {
        self.extend(self.inner.ttl).await
    }

    /// Releases the lock. Idempotent: later calls (through any handle) are no-ops, and a lease
    /// that expired and went to someone else is left alone. If the backend cannot be reached
    /// the error is returned and a later call may retry.
    pub async fn release(&self) -> LockResult<()> {
        if self.release_once().await? == Some(false) {
            self.mark_lost();
        }
        Ok(())
    }

    /// Releases the lock, failing with [`LockError::LockLost`] if it was no longer held (its
    /// lease ran out, or it was already released) — locco's `throwOnFail`.
    pub async fn release_strict(&self) -> LockResult<()> {
        match self.release_once().await? {
            Some(true) => Ok(()),
            Some(false) | None => {
                self.mark_lost();
                Err(self.lost_error())
            }
        }
    }

    /// `None` if already released, else whether the backend still had our lease.
    async fn release_once(&self) -> LockResult<Option<bool>> {
        if self.inner.released.swap(true, Ordering::AcqRel) {
            return Ok(None);
        }
        match self
            .inner
            .backend
            .release(&self.inner.key, &self.inner.owner, self.inner.max_holders)
            .await
        {
            Ok(was_held) => {
                tracing::debug!(key = %self.inner.key, fencing_token = self.inner.fencing_token, was_held, "lock released");
                Ok(Some(was_held))
            }
            Err(error) => {
                // Nothing changed in the backend: allow a retry.
                self.inner.released.store(false, Ordering::Release);
                Err(error)
            }
        }
    }

    fn mark_lost(&self) {
        self.inner.lost.store(true, Ordering::Release);
    }

    fn lost_error(&self) -> LockError {
        LockError::LockLost {
            key: self.inner.key.clone(),
        }
    }

    fn deadline_guard(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.inner
            .lease_deadline
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if *self.released.get_mut() {
            return;
        }
        let (key, owner) = (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.owner),
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(%key, fencing_token = self.fencing_token, "lock dropped outside a tokio runtime; its lease will run out");
            return;
        };
        let backend = Arc::clone(&self.backend);
        let (max_holders, fencing_token) = (self.max_holders, self.fencing_token);
        runtime.spawn(async move {
            if let Err(error) = backend.release(&key, &owner, max_holders).await {
                tracing::warn!(%key, fencing_token, %error, "background release of a dropped lock failed; its lease will run out");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Locker, MemoryBackend};

    const TTL: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn a_lock_tells_what_it_holds() {
        let locker = Locker::new(MemoryBackend::new());
        let request = locker.lock("k", TTL).max_holders(3).owner("me");
        let lock = request.acquire().await.expect("acquire");
        assert_eq!(
            (lock.key(), lock.owner(), lock.ttl(), lock.max_holders()),
            ("k", "me", TTL, 3)
        );
        assert_eq!(lock.fencing_token(), 1);
        let shown = format!("{lock:?}");
        for part in [
            "backend: \"memory\"",
            "key: \"k\"",
            "owner: \"me\"",
            "fencing_token: 1",
            "lost: false",
            "released: false",
        ] {
            assert!(shown.contains(part), "{shown} shows {part}");
        }
        lock.release().await.expect("release");
        assert!(format!("{lock:?}").contains("released: true"));
    }

    #[tokio::test]
    async fn a_released_handle_never_speaks_for_a_later_grant_to_the_same_owner() {
        let locker = Locker::new(MemoryBackend::new());
        let request = locker.lock("k", TTL).owner("me");
        let first = request.acquire().await.expect("acquire");
        let other_handle = first.clone();
        first.release().await.expect("release");
        assert!(other_handle.is_released(), "released through any handle");
        assert!(!other_handle.is_lost(), "released is not lost");
        let second = request.acquire().await.expect("acquire again");
        assert_eq!(second.fencing_token(), 2);
        assert!(!first.is_locked().await.expect("is_locked"));
        assert!(matches!(
            first.extend(TTL).await,
            Err(LockError::LockLost { .. })
        ));
        assert!(second.is_locked().await.expect("is_locked"));
        second.release().await.expect("release");
    }

    #[tokio::test]
    async fn a_release_that_finds_the_grant_gone_marks_the_lock_lost() {
        let locker = Locker::new(MemoryBackend::new());
        let kept = locker.lock("k", TTL).acquire().await.expect("acquire");
        kept.release().await.expect("release");
        assert!(
            !kept.is_lost(),
            "a release that found its grant loses nothing"
        );

        let taken = locker.lock("k", TTL).acquire().await.expect("acquire");
        // Someone else ended the grant behind this handle's back.
        assert!(locker
            .backend()
            .release("k", taken.owner(), 1)
            .await
            .expect("release"));
        assert!(!taken.is_lost(), "nothing told the handle yet");
        taken
            .release()
            .await
            .expect("a lost grant's release is no error");
        assert!(taken.is_lost());

        let checked = locker.lock("k", TTL).acquire().await.expect("acquire");
        locker
            .backend()
            .release("k", checked.owner(), 1)
            .await
            .expect("release");
        assert!(!checked.is_locked().await.expect("is_locked"));
        assert!(checked.is_lost(), "is_locked's answer marks it lost");
    }
}
