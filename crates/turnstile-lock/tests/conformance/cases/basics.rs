//! Basic lock behaviour: typed argument errors, mutual exclusion, release, extend, expiry,
//! idempotent re-acquire, semaphores and snapshots.

use std::time::Duration;

use turnstile_lock::backend::{AcquireMode, AcquireOutcome, AcquireRequest};
use turnstile_lock::{Lock, LockError, ShareMode};

use super::{no_holders, no_polling, spawn_waiter, LONG};
use crate::harness::{until_queued, Harness};
use crate::support::grants::{hold, is_taken, take_free, take_places};

pub async fn invalid_arguments_are_typed_errors(h: Harness) {
    let locker = h.locker();
    let cases = [
        locker.lock("", LONG),
        locker.lock("k", Duration::ZERO),
        locker.lock("k", Duration::from_micros(10)),
        locker.lock("k", LONG).max_holders(0),
        locker.lock("k", LONG).owner(""),
        locker.lock("k", LONG).owner("two words"),
        locker.lock("k", LONG).owner("line\nbreak"),
        locker.lock("k".repeat(10_000), LONG),
    ];
    for request in &cases {
        assert!(
            matches!(request.acquire().await, Err(LockError::InvalidArgument(_))),
            "{request:?} acquire"
        );
        assert!(
            matches!(
                request.try_acquire().await,
                Err(LockError::InvalidArgument(_))
            ),
            "{request:?} try_acquire"
        );
    }
    assert!(matches!(
        locker.raise_fencing_floor("", 3).await,
        Err(LockError::InvalidArgument(_))
    ));
    let backend = h.raw();
    let bad = AcquireRequest {
        key: "k",
        owner: "o",
        ttl: LONG,
        max_holders: 0,
        mode: AcquireMode::Wait,
        waiter_lease: LONG,
        share: ShareMode::Exclusive,
        priority: 0,
        max_hold: None,
        lock_delay: Duration::ZERO,
    };
    assert!(matches!(
        backend.acquire(&bad).await,
        Err(LockError::InvalidArgument(_))
    ));
    assert!(matches!(
        backend.release("k", "", 1).await,
        Err(LockError::InvalidArgument(_))
    ));
    assert!(matches!(
        backend.extend("k", "o", Duration::ZERO).await,
        Err(LockError::InvalidArgument(_))
    ));
    let lock = locker.lock("k", LONG).acquire().await.expect("valid");
    assert!(matches!(
        lock.extend(Duration::ZERO).await,
        Err(LockError::InvalidArgument(_))
    ));
    lock.release().await.expect("release");
}

pub async fn mutex_excludes_and_tokens_increase(h: Harness) {
    let locker = h.locker();
    let first = locker.lock("m", LONG).acquire().await.expect("first");
    assert!(first.fencing_token() > 0);
    assert!(first.is_locked().await.expect("is_locked"));
    assert!(!first.is_lost());
    assert!(is_taken(&locker.lock("m", LONG)).await);
    first.release().await.expect("release");
    assert!(!first.is_locked().await.expect("is_locked after release"));
    let second = take_free(&locker.lock("m", LONG), "free after release").await;
    assert!(second.fencing_token() > first.fencing_token());
    second.release().await.expect("release");
    // Another key has its own lock and its own counter.
    let other = locker.lock("m2", LONG).acquire().await.expect("other key");
    assert!(other.fencing_token() >= 1);
    other.release().await.expect("release");
}

pub async fn release_is_idempotent_and_never_hits_the_next_holder(h: Harness) {
    let locker = h.locker();
    let a = hold(&locker, "idem", Duration::from_millis(150), "a").await;
    let a_copy = a.clone();
    a.release().await.expect("first release");
    a.release().await.expect("second release is a no-op");
    let b = locker.lock("idem", LONG).acquire().await.expect("b");
    a_copy
        .release()
        .await
        .expect("release through another handle");
    a.release().await.expect("again");
    assert!(b.is_locked().await.expect("b still holds"));
    // An expired lease taken over by someone else is left alone too.
    b.release().await.expect("b release");
    let stale = hold(&locker, "idem", Duration::from_millis(50), "stale").await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let next = locker.lock("idem", LONG).acquire().await.expect("next");
    stale.release().await.expect("stale release is silent");
    assert!(stale.is_lost());
    assert!(next.is_locked().await.expect("next still holds"));
    assert!(next.fencing_token() > stale.fencing_token());
    next.release().await.expect("release");
}

pub async fn release_strict_reports_a_lost_lock(h: Harness) {
    let locker = h.locker();
    let held = locker.lock("strict", LONG).acquire().await.expect("held");
    held.release_strict()
        .await
        .expect("held lock releases strictly");
    assert!(matches!(
        held.release_strict().await,
        Err(LockError::LockLost { .. })
    ));
    let expiring = hold(&locker, "strict", Duration::from_millis(50), "expiring").await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(
        expiring.is_lost(),
        "local lost flag after the lease ran out"
    );
    assert!(matches!(
        expiring.release_strict().await,
        Err(LockError::LockLost { .. })
    ));
}

pub async fn extend_and_refresh_keep_the_lock_and_fail_once_lost(h: Harness) {
    let locker = h.locker();
    let lock = hold(&locker, "ext", Duration::from_millis(300), "lock").await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        lock.refresh().await.expect("refresh while held");
    }
    lock.extend(Duration::from_millis(600))
        .await
        .expect("extend");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // 700 ms after acquiring with a 300 ms lease: only the renewals explain this.
    assert!(lock.is_locked().await.expect("still held"));
    assert!(is_taken(&locker.lock("ext", LONG)).await);
    lock.extend(Duration::from_millis(40))
        .await
        .expect("shorten");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let thief = hold(&locker, "ext", LONG, "next holder").await;
    assert!(matches!(
        lock.extend(LONG).await,
        Err(LockError::LockLost { .. })
    ));
    assert!(matches!(
        lock.refresh().await,
        Err(LockError::LockLost { .. })
    ));
    assert!(lock.is_lost());
    assert!(!lock.is_locked().await.expect("is_locked"));
    assert!(thief.is_locked().await.expect("thief keeps it"));
    // Released locks cannot be extended either.
    thief.release().await.expect("release");
    assert!(matches!(
        thief.extend(LONG).await,
        Err(LockError::LockLost { .. })
    ));
}

pub async fn expired_lease_is_lost_even_without_a_successor(h: Harness) {
    let backend = h.raw();
    let locker = h.locker();
    let lock = hold(&locker, "lapse", Duration::from_millis(40), "lock").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!backend
        .is_held("lapse", lock.owner())
        .await
        .expect("is_held"));
    assert_eq!(
        backend
            .extend("lapse", lock.owner(), LONG)
            .await
            .expect("extend"),
        None
    );
    assert!(matches!(
        lock.extend(LONG).await,
        Err(LockError::LockLost { .. })
    ));
}

pub async fn explicit_owner_reacquire_is_idempotent(h: Harness) {
    let locker = h.locker();
    let first = locker
        .lock("own", Duration::from_millis(200))
        .owner("claim-uid-1")
        .acquire()
        .await
        .expect("first");
    let again = take_free(
        &locker.lock("own", LONG).owner("claim-uid-1"),
        "the same owner gets it again",
    )
    .await;
    assert_eq!(again.fencing_token(), first.fencing_token());
    // The re-acquire refreshed the lease to the new ttl.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(again.is_locked().await.expect("still held"));
    let outcome = h
        .raw()
        .acquire(&AcquireRequest {
            key: "own",
            owner: "claim-uid-1",
            ttl: LONG,
            max_holders: 1,
            mode: AcquireMode::Try,
            waiter_lease: LONG,
            share: ShareMode::Exclusive,
            priority: 0,
            max_hold: None,
            lock_delay: Duration::ZERO,
        })
        .await
        .expect("acquire");
    assert_eq!(
        outcome,
        AcquireOutcome::Granted {
            fencing_token: first.fencing_token(),
            ttl: LONG,
            already_held: true
        }
    );
    assert!(is_taken(&locker.lock("own", LONG)).await);
    again.release().await.expect("release");
}

pub async fn semaphore_admits_max_holders(h: Harness) {
    let locker = h.locker();
    let request = locker.lock("sem", LONG).max_holders(3).shared();
    let mut held = take_places(&request, 3, "free slot").await;
    assert!(is_taken(&request).await);
    let tokens: Vec<u64> = held.iter().map(Lock::fencing_token).collect();
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    let snapshot = locker.snapshot("sem").await.expect("snapshot");
    assert_eq!(snapshot.holders.len(), 3);
    assert_eq!(snapshot.fencing_token, tokens[2]);
    held.remove(1).release().await.expect("release one");
    let refill = take_free(&request, "slot freed").await;
    assert!(refill.fencing_token() > tokens[2]);
    assert!(is_taken(&request).await);
    for lock in held.into_iter().chain([refill]) {
        lock.release_strict().await.expect("release");
    }
    assert!(no_holders(&locker, "sem").await);
}

pub async fn snapshot_shows_holders_waiters_and_counter(h: Harness) {
    let locker = h.locker();
    let lock = locker
        .lock("snap", LONG)
        .owner("holder")
        .acquire()
        .await
        .expect("lock");
    let waiter = spawn_waiter(&locker, "snap", "waiter-1", no_polling());
    until_queued(&h, "snap", "waiter-1").await;
    let snapshot = locker.snapshot("snap").await.expect("snapshot");
    assert_eq!(snapshot.holders.len(), 1);
    assert_eq!(snapshot.holders[0].owner, "holder");
    assert_eq!(snapshot.holders[0].fencing_token, lock.fencing_token());
    assert!(snapshot.holders[0].expires_in <= LONG);
    assert!(snapshot.holders[0].expires_in > LONG - Duration::from_secs(10));
    assert_eq!(snapshot.waiters, vec!["waiter-1".to_owned()]);
    assert_eq!(snapshot.fencing_token, lock.fencing_token());
    lock.release().await.expect("release");
    let next = waiter.await.expect("join").expect("waiter acquires");
    let snapshot = locker.snapshot("snap").await.expect("snapshot");
    assert!(snapshot.waiters.is_empty());
    assert_eq!(snapshot.holders[0].owner, "waiter-1");
    next.release().await.expect("release");
    assert_eq!(
        locker.snapshot("never-used").await.expect("snapshot"),
        Default::default()
    );
}
