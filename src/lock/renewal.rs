//! Keeping the lease alive while the command runs, and noticing when it is gone.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use turnstile_api::error_chain;
use turnstile_lock::{Lock, LockError};

/// Longest pause between renewal attempts after a backend error (shorter when the lease ends
/// sooner), so a brief outage is ridden out.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Why the lease is gone.
#[derive(Debug)]
pub enum Loss {
    /// The backend no longer had our lease: it ran out, or someone removed or took it.
    Taken,
    /// Renewals kept failing (backend unreachable) until the lease ran out by our clock.
    Lapsed {
        /// The last renewal error, if a renewal got an answer at all.
        last_error: Option<LockError>,
    },
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::Taken => f.write_str("the backend no longer holds our lease"),
            Loss::Lapsed { last_error: None } => {
                f.write_str("the lease ran out before a renewal got through")
            }
            Loss::Lapsed {
                last_error: Some(error),
            } => write!(
                f,
                "the lease ran out while renewals failed ({})",
                error_chain(error)
            ),
        }
    }
}

/// How often to renew a lease of `ttl`: a third of it, so two renewals in a row may fail
/// before the lease is in danger.
pub fn renewal_interval(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// Renews `lock` to its full ttl every `every` until it is lost; returns only then. Cancel
/// the future to stop renewing.
pub async fn keep_renewed(lock: &Lock, every: Duration) -> Loss {
    let retry_pause = (every / 4).clamp(Duration::from_millis(1), MAX_RETRY_PAUSE);
    let mut next = Instant::now() + every;
    let mut last_error = None;
    loop {
        tokio::time::sleep_until(next.min(lock.lease_deadline())).await;
        if lock.is_lost() {
            return Loss::Lapsed { last_error };
        }
        // A renewal still in flight when the lease runs out cannot save it.
        match tokio::time::timeout_at(lock.lease_deadline(), lock.refresh()).await {
            Ok(Ok(())) => {
                last_error = None;
                next = Instant::now() + every;
                tracing::debug!(
                    key = lock.key(),
                    fencing_token = lock.fencing_token(),
                    "lease renewed"
                );
            }
            Ok(Err(LockError::LockLost { .. })) => return Loss::Taken,
            Ok(Err(error)) => {
                tracing::warn!(key = lock.key(), fencing_token = lock.fencing_token(), error = %error_chain(&error), "lease renewal failed; retrying");
                last_error = Some(error);
                next = Instant::now() + retry_pause;
            }
            Err(_elapsed) => return Loss::Lapsed { last_error },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use turnstile_lock::{Locker, MemoryBackend};

    #[test]
    fn renews_three_times_per_lease() {
        assert_eq!(
            renewal_interval(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        assert_eq!(
            renewal_interval(Duration::from_millis(2)),
            Duration::from_millis(1)
        );
    }

    // Paused clock: the memory backend and the renewals share tokio's clock, so the test is
    // deterministic however loaded the machine is.
    #[tokio::test(start_paused = true)]
    async fn keeps_a_lease_alive_past_its_ttl_then_reports_it_taken() {
        let ttl = Duration::from_secs(30);
        let locker = Locker::new(MemoryBackend::new());
        let lock = locker.lock("k", ttl).acquire().await.unwrap();
        let renewing = keep_renewed(&lock, renewal_interval(ttl));
        tokio::pin!(renewing);
        // Three lease lengths later the lock is still ours: the renewals worked.
        tokio::select! {
            loss = &mut renewing => panic!("lost while renewing: {loss}"),
            () = tokio::time::sleep(ttl * 3) => {}
        }
        assert!(lock.is_locked().await.unwrap());
        // Someone else removes our lease (as an operator deleting keys would).
        locker
            .backend()
            .release("k", lock.owner(), 1)
            .await
            .unwrap();
        let loss = tokio::time::timeout(ttl, &mut renewing)
            .await
            .expect("loss noticed at the next renewal");
        assert!(matches!(loss, Loss::Taken), "{loss:?}");
    }
}
