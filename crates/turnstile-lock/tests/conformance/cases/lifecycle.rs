//! Lifecycles of a request: `run`, drop, retry bounds, timeouts and cancellation.

use std::time::Duration;

use rand::Rng;
use turnstile_lock::{LockError, RetryDecision, RetryPolicy};

use super::{no_holders, no_polling, spawn_waiter, LONG};
use crate::harness::{eventually, until_queued, Harness};
use crate::support::grants::{pushed_on_release, take_free};

pub async fn run_releases_on_success_error_and_panic(h: Harness) {
    let locker = h.locker();
    let token = locker
        .lock("run", LONG)
        .run(|lock| async move { lock.fencing_token() })
        .await
        .expect("run");
    assert!(token > 0);
    assert!(no_holders(&locker, "run").await);

    let failed: Result<Result<(), &str>, LockError> = locker
        .lock("run", LONG)
        .run(|_lock| async { Err("boom") })
        .await;
    assert_eq!(failed.expect("lock acquired"), Err("boom"));
    assert!(no_holders(&locker, "run").await);

    let panicking = {
        let locker = locker.clone();
        tokio::spawn(async move {
            locker
                .lock("run", LONG)
                .run(|_lock| async {
                    panic!("critical section panicked");
                })
                .await
        })
    };
    assert!(panicking.await.expect_err("panic propagates").is_panic());
    assert!(no_holders(&locker, "run").await);
}

pub async fn dropping_an_unreleased_lock_releases_it(h: Harness) {
    let locker = h.locker();
    let lock = locker.lock("drop", LONG).acquire().await.expect("lock");
    let clone = lock.clone();
    drop(lock);
    assert!(clone.is_locked().await.expect("a clone keeps it"));
    drop(clone);
    eventually("the dropped lock is released", || async {
        locker
            .snapshot("drop")
            .await
            .expect("snapshot")
            .holders
            .is_empty()
    })
    .await;
}

pub async fn retry_policy_bounds_the_wait(h: Harness) {
    let locker = h.locker();
    let holder = locker.lock("bound", LONG).acquire().await.expect("holder");
    let policies = [
        RetryPolicy::forever()
            .retry_times(3)
            .retry_delay(Duration::from_millis(10)),
        RetryPolicy::new()
            .total_time(Duration::from_millis(60))
            .retry_delay(Duration::from_millis(10)),
        RetryPolicy::forever().fail_after(Duration::from_millis(60)),
        RetryPolicy::forever().delay_fn(|ctx| {
            if ctx.attempt >= 2 {
                RetryDecision::Stop
            } else {
                RetryDecision::RetryAfter(Duration::from_millis(10))
            }
        }),
        RetryPolicy::no_retry(),
    ];
    for (index, policy) in policies.into_iter().enumerate() {
        let owner = format!("bounded-{index}");
        let result = locker
            .lock("bound", LONG)
            .owner(owner.clone())
            .retry(policy)
            .acquire()
            .await;
        assert!(
            matches!(result, Err(LockError::Timeout { .. })),
            "policy {index}: {result:?}"
        );
        let snapshot = locker.snapshot("bound").await.expect("snapshot");
        assert!(
            !snapshot.waiters.contains(&owner),
            "policy {index} left its queue place behind"
        );
    }
    let Err(LockError::Timeout { attempts, .. }) = locker
        .lock("bound", LONG)
        .retry(
            RetryPolicy::forever()
                .retry_times(3)
                .retry_delay(Duration::from_millis(5)),
        )
        .acquire()
        .await
    else {
        panic!("expected a timeout");
    };
    assert_eq!(attempts, 4, "first attempt plus three retries");
    holder.release().await.expect("release");
}

/// Returns how many acquires were cut short (an in-process backend answers before any
/// timer can fire, so only remote backends get above zero).
pub async fn timeouts_and_cancellation_leave_no_ghost_grant(h: Harness) -> usize {
    const TRIALS: usize = 150;
    let locker = h.locker();
    let mut ghosts = 0;
    let mut timeouts = 0;
    let mut rng = rand::rng();
    // fail_after firing while an attempt is in flight (the ancestor's ghost-lock bug): the
    // cleanup is awaited before the error returns, so the check can be immediate.
    for trial in 0..TRIALS {
        let limit = Duration::from_micros(rng.random_range(0..400));
        let result = locker
            .lock("ghost", LONG)
            .retry(RetryPolicy::forever().fail_after(limit))
            .acquire()
            .await;
        match result {
            Ok(lock) => lock.release().await.expect("release"),
            Err(LockError::Timeout { .. }) => {
                timeouts += 1;
                if !locker
                    .snapshot("ghost")
                    .await
                    .expect("snapshot")
                    .holders
                    .is_empty()
                {
                    ghosts += 1;
                    for holder in locker.snapshot("ghost").await.expect("s").holders {
                        h.raw()
                            .release("ghost", &holder.owner, 1)
                            .await
                            .expect("clean");
                    }
                }
            }
            Err(other) => panic!("trial {trial}: {other}"),
        }
    }
    assert_eq!(
        ghosts, 0,
        "ghost grants after {timeouts} fail_after timeouts"
    );

    // Dropping the acquire future mid-flight: cleanup runs in the background.
    let mut dropped = 0;
    for _ in 0..TRIALS {
        let limit = Duration::from_micros(rng.random_range(0..400));
        match tokio::time::timeout(limit, locker.lock("ghost", LONG).acquire()).await {
            Ok(lock) => lock.expect("acquire").release().await.expect("release"),
            Err(_) => dropped += 1,
        }
        eventually("a cancelled acquire is cleaned up", || async {
            locker
                .snapshot("ghost")
                .await
                .expect("snapshot")
                .holders
                .is_empty()
        })
        .await;
    }
    let lock = take_free(&locker.lock("ghost", LONG), "no ghost holds the lock").await;
    lock.release().await.expect("release");
    timeouts + dropped
}

pub async fn cancelled_waiter_leaves_the_queue_and_passes_the_turn(h: Harness) {
    let locker = h.locker();
    let holder = locker.lock("leave", LONG).acquire().await.expect("holder");
    let quitter = spawn_waiter(&locker, "leave", "quitter", no_polling());
    until_queued(&h, "leave", "quitter").await;
    let patient = spawn_waiter(&locker, "leave", "patient", no_polling());
    until_queued(&h, "leave", "patient").await;
    quitter.abort();
    eventually("the cancelled waiter left the queue", || async {
        locker.snapshot("leave").await.expect("snapshot").waiters == ["patient"]
    })
    .await;
    let lock = pushed_on_release(&holder, patient).await;
    assert_eq!(lock.owner(), "patient");
    lock.release().await.expect("release");
}
