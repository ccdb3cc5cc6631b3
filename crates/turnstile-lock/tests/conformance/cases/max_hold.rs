//! Maximum hold time: a grant ends at its first grant + max hold, whatever its renewals.

use std::time::Duration;

use tokio::time::Instant;
use turnstile_lock::backend::{AcquireMode, AcquireOutcome, AcquireRequest};
use turnstile_lock::LockError;

use super::LONG;
use crate::harness::Harness;
use crate::support::grants::take_free;

const TTL: Duration = Duration::from_millis(200);
const MAX_HOLD: Duration = Duration::from_millis(600);
/// Clock-rate and rounding slack of the lower bounds (the backend counts whole ms).
const SLACK: Duration = Duration::from_millis(20);

pub async fn max_hold_ends_a_renewed_grant(h: Harness) {
    let locker = h.locker();
    assert!(matches!(
        locker
            .lock("mh", TTL)
            .max_hold(Duration::ZERO)
            .try_acquire()
            .await,
        Err(LockError::InvalidArgument(_))
    ));
    let request = locker.lock("mh", TTL).max_hold(MAX_HOLD).owner("renewer");
    let sent = Instant::now();
    let lock = request.acquire().await.expect("acquire");
    let granted = Instant::now();
    // The handle knows the lease is capped at the deadline, from the first grant on.
    let deadline = granted + MAX_HOLD;
    let mut renewals = 0;
    let lost_at = loop {
        assert!(
            lock.lease_deadline() <= deadline,
            "local lease past the max hold"
        );
        match lock.extend(TTL).await {
            Ok(()) => renewals += 1,
            Err(LockError::LockLost { .. }) => break Instant::now(),
            Err(error) => panic!("extend: {error}"),
        }
        assert!(
            lock.lease_deadline() <= deadline,
            "extended past the max hold"
        );
        // An idempotent re-acquire by the same owner does not reset the deadline either.
        if renewals == 3 {
            let request = AcquireRequest {
                max_hold: Some(MAX_HOLD),
                ..AcquireRequest::new("mh", "renewer", TTL, 1, AcquireMode::Try, TTL)
            };
            let sent_again = Instant::now();
            let outcome = h.raw().acquire(&request).await.expect("re-acquire");
            let AcquireOutcome::Granted {
                ttl,
                already_held: true,
                fencing_token,
            } = outcome
            else {
                panic!("re-acquire by the holder: {outcome:?}");
            };
            assert_eq!(fencing_token, lock.fencing_token());
            assert!(
                sent_again + ttl <= deadline,
                "re-acquire reset the max hold"
            );
        }
        assert!(
            Instant::now() < sent + MAX_HOLD + Duration::from_secs(10),
            "never lost"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(renewals >= 3, "only {renewals} renewals");
    assert!(
        lost_at + SLACK >= sent + MAX_HOLD,
        "lost before the max hold"
    );
    assert!(lock.is_lost());
    // Free for the next one (no lock-delay was asked for).
    let next = take_free(&locker.lock("mh", LONG), "free").await;
    assert!(next.fencing_token() > lock.fencing_token());
    next.release().await.expect("release");
}
