//! Lock-delay: after a lease runs out nobody gets the key for the delay; a release hands
//! off at once.

use std::time::Duration;

use tokio::time::Instant;
use turnstile_lock::backend::{AcquireMode, AcquireOutcome, AcquireRequest};

use super::{no_polling, spawn_waiter, LONG};
use crate::harness::{until_queued, Harness};
use crate::support::grants::acquired_within;

const TTL: Duration = Duration::from_millis(200);
const DELAY: Duration = Duration::from_millis(800);
/// Clock-rate and rounding slack of the lower bounds (the backend counts whole ms).
const SLACK: Duration = Duration::from_millis(20);

pub async fn lock_delay_follows_an_expiry_but_not_a_release(h: Harness) {
    let locker = h.locker();
    // A release, even of a holder with a very long lock-delay, hands off at once.
    let holder = locker
        .lock("ld", LONG)
        .lock_delay(Duration::from_secs(3600))
        .acquire()
        .await
        .expect("holder");
    let waiter = spawn_waiter(&locker, "ld", "next", no_polling());
    until_queued(&h, "ld", "next").await;
    holder.release().await.expect("release");
    let next = acquired_within(Duration::from_secs(10), waiter, "handed off at once").await;
    next.release().await.expect("release");
    assert_eq!(
        locker.snapshot("ld").await.expect("snapshot").delayed_for,
        None
    );

    // An expiry starts the delay: no grant of any kind until the lease end + the delay.
    let sent = Instant::now();
    let stalled = locker
        .lock("ld", TTL)
        .lock_delay(DELAY)
        .acquire()
        .await
        .expect("stalled holder");
    let patient = spawn_waiter(&locker, "ld", "patient", locker.retry_policy().clone());
    until_queued(&h, "ld", "patient").await;
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    assert!(stalled.is_lost());
    let busy = h
        .raw()
        .acquire(&AcquireRequest::new(
            "ld",
            "eager",
            LONG,
            1,
            AcquireMode::Try,
            LONG,
        ))
        .await
        .expect("try");
    let AcquireOutcome::Busy { retry_after } = busy else {
        panic!("granted during the lock-delay: {busy:?}");
    };
    assert!(retry_after.is_some_and(|after| after > Duration::ZERO && after <= DELAY));
    let delayed = locker.snapshot("ld").await.expect("snapshot").delayed_for;
    assert!(delayed.is_some_and(|left| left <= DELAY), "{delayed:?}");
    let patient = patient.await.expect("join").expect("acquire");
    let got_at = Instant::now();
    assert!(
        got_at + SLACK >= sent + TTL + DELAY,
        "granted before the delay ended"
    );
    assert!(patient.fencing_token() > stalled.fencing_token());
    patient.release().await.expect("release");
    assert_eq!(
        locker.snapshot("ld").await.expect("snapshot").delayed_for,
        None
    );
}
