//! Wake-ups and hand-off: a release hands the lock over without polling.

use std::time::Duration;

use turnstile_lock::backend::{AcquireMode, AcquireOutcome, AcquireRequest};
use turnstile_lock::{RetryPolicy, ShareMode};

use super::{no_polling, spawn_waiter, LONG, NO_POLLING};
use crate::harness::{eventually, until_queued, Harness};
use crate::support::grants::{acquire_as, hold, pushed_on_release};

pub async fn release_wakes_the_waiter_without_polling(h: Harness) {
    let locker = h.locker();
    let holder = locker.lock("push", LONG).acquire().await.expect("holder");
    let waiter = spawn_waiter(&locker, "push", "pushed", no_polling());
    until_queued(&h, "push", "pushed").await;
    let lock = pushed_on_release(&holder, waiter).await;
    // First attempt and the confirmation after subscribing, then either the release hands
    // the lock over (no further call) or wakes the waiter for one more attempt. Polling
    // would add more.
    let calls = h.backend.acquire_calls_of("pushed");
    assert!((2..=3).contains(&calls), "{calls} acquire calls");
    lock.release().await.expect("release");
}

pub async fn handed_over_lease_reaches_the_full_ttl(h: Harness) {
    let locker = h.locker();
    let holder = locker.lock("full", LONG).acquire().await.expect("holder");
    // Polling every 100 ms keeps this waiter's queue heartbeat short (about 1.2 s), which
    // caps a lease handed over to it until it renews.
    let waiter = spawn_waiter(
        &locker,
        "full",
        "heir",
        RetryPolicy::forever().retry_delay(Duration::from_millis(100)),
    );
    until_queued(&h, "full", "heir").await;
    holder.release().await.expect("release");
    let lock = waiter.await.expect("join").expect("acquired");
    assert!(lock.fencing_token() > holder.fencing_token());
    eventually("the new holder's lease is the full ttl", || async {
        let snapshot = locker.snapshot("full").await.expect("snapshot");
        snapshot.holders.len() == 1
            && snapshot.holders[0].owner == "heir"
            && snapshot.holders[0].expires_in > LONG - Duration::from_secs(10)
    })
    .await;
    eventually("the local deadline follows", || async {
        lock.lease_deadline() > tokio::time::Instant::now() + LONG - Duration::from_secs(10)
    })
    .await;
    assert!(!lock.is_lost());
    lock.release_strict().await.expect("release");
}

pub async fn a_vanished_waiter_holds_a_handed_over_lock_no_longer_than_its_heartbeat(h: Harness) {
    let backend = h.raw();
    let locker = h.locker();
    let holder = locker.lock("vanish", LONG).acquire().await.expect("holder");
    // Queued with a 200 ms heartbeat, then never heard of again.
    let outcome = backend
        .acquire(&AcquireRequest {
            key: "vanish",
            owner: "vanished",
            ttl: LONG,
            max_holders: 1,
            mode: AcquireMode::Wait,
            waiter_lease: Duration::from_millis(200),
            share: ShareMode::Exclusive,
            priority: 0,
            max_hold: None,
            lock_delay: Duration::ZERO,
        })
        .await
        .expect("enqueue");
    assert!(matches!(outcome, AcquireOutcome::Waiting { .. }));
    holder.release().await.expect("release");
    // Whether the release handed it over or only woke it, the lock is free again once the
    // vanished waiter's heartbeat has run out, not after its 60 s ttl.
    let next = tokio::time::timeout(
        Duration::from_secs(10),
        locker
            .lock("vanish", LONG)
            .retry(RetryPolicy::forever().retry_delay(Duration::from_millis(300)))
            .acquire(),
    )
    .await
    .expect("not blocked for the vanished waiter's ttl")
    .expect("acquire");
    assert!(next.fencing_token() > holder.fencing_token());
    next.release().await.expect("release");
}

pub async fn expiry_frees_the_lock_for_waiters(h: Harness) {
    let locker = h.locker();
    let stalled = hold(&locker, "expiry", Duration::from_millis(100), "stalled").await;
    // Polls every 30 s, but the backend's hint (the lease ends in 100 ms) bounds the pause.
    let next = tokio::time::timeout(
        NO_POLLING / 2,
        locker.lock("expiry", LONG).retry(no_polling()).acquire(),
    )
    .await
    .expect("woke at the lease's end")
    .expect("acquired");
    assert!(next.fencing_token() > stalled.fencing_token());
    assert!(stalled.is_lost());
    next.release().await.expect("release");
}

pub async fn one_release_costs_one_waiter_one_attempt(h: Harness) {
    const WAITERS: u64 = 32;
    let locker = h.locker();
    let holder = locker.lock("herd", LONG).acquire().await.expect("holder");
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let locker = locker.clone();
        tasks.push(tokio::spawn(async move {
            let lock = acquire_as(&locker, "herd", format!("herd-{i}"), no_polling()).await;
            lock.release().await.expect("release");
        }));
    }
    for i in 0..WAITERS {
        until_queued(&h, "herd", &format!("herd-{i}")).await;
    }
    let before = h.backend.acquire_calls();
    holder.release().await.expect("release");
    for task in tasks {
        task.await.expect("join");
    }
    let after_release = h.backend.acquire_calls() - before;
    // Each release hands the lock to the next waiter (no attempt at all) or wakes exactly
    // that waiter (one attempt). A stampede would cost about WAITERS²/2 attempts.
    assert!(
        after_release <= WAITERS,
        "{after_release} acquire attempts after the first release"
    );
}
