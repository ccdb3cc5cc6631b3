//! The behaviours every backend must show, written once, generic over the backend.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use turnstile_lock::backend::{AcquireMode, AcquireOutcome, AcquireRequest};
use turnstile_lock::{Lock, LockError, LockResult, Locker, RetryDecision, RetryPolicy};

use crate::harness::{eventually, until_queued, Harness};

const LONG: Duration = Duration::from_secs(60);
/// A retry delay so long that only push wake-ups can explain a prompt acquisition.
const NO_POLLING: Duration = Duration::from_secs(30);

fn no_polling() -> RetryPolicy {
    RetryPolicy::forever().retry_delay(NO_POLLING)
}

/// Nobody holds `key` right now.
async fn no_holders(locker: &Locker, key: &str) -> bool {
    locker
        .snapshot(key)
        .await
        .expect("snapshot")
        .holders
        .is_empty()
}

/// Starts `owner`'s acquire of `key` (lease [`LONG`]) in the background.
fn spawn_waiter(
    locker: &Locker,
    key: &'static str,
    owner: &'static str,
    policy: RetryPolicy,
) -> tokio::task::JoinHandle<LockResult<Lock>> {
    let request = locker.lock(key, LONG).owner(owner).retry(policy);
    tokio::spawn(async move { request.acquire().await })
}

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
    assert!(locker
        .lock("m", LONG)
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    first.release().await.expect("release");
    assert!(!first.is_locked().await.expect("is_locked after release"));
    let second = locker
        .lock("m", LONG)
        .try_acquire()
        .await
        .expect("try")
        .expect("free after release");
    assert!(second.fencing_token() > first.fencing_token());
    second.release().await.expect("release");
    // Another key has its own lock and its own counter.
    let other = locker.lock("m2", LONG).acquire().await.expect("other key");
    assert!(other.fencing_token() >= 1);
    other.release().await.expect("release");
}

pub async fn release_is_idempotent_and_never_hits_the_next_holder(h: Harness) {
    let locker = h.locker();
    let a = locker
        .lock("idem", Duration::from_millis(150))
        .acquire()
        .await
        .expect("a");
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
    let stale = locker
        .lock("idem", Duration::from_millis(50))
        .acquire()
        .await
        .expect("stale");
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
    let expiring = locker
        .lock("strict", Duration::from_millis(50))
        .acquire()
        .await
        .expect("expiring");
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
    let lock = locker
        .lock("ext", Duration::from_millis(300))
        .acquire()
        .await
        .expect("lock");
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
    assert!(locker
        .lock("ext", LONG)
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    lock.extend(Duration::from_millis(40))
        .await
        .expect("shorten");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let thief = locker
        .lock("ext", LONG)
        .acquire()
        .await
        .expect("next holder");
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
    let lock = locker
        .lock("lapse", Duration::from_millis(40))
        .acquire()
        .await
        .expect("lock");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!backend
        .is_held("lapse", lock.owner())
        .await
        .expect("is_held"));
    assert!(!backend
        .extend("lapse", lock.owner(), LONG)
        .await
        .expect("extend"));
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
    let again = locker
        .lock("own", LONG)
        .owner("claim-uid-1")
        .try_acquire()
        .await
        .expect("try")
        .expect("the same owner gets it again");
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
    assert!(locker
        .lock("own", LONG)
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    again.release().await.expect("release");
}

pub async fn semaphore_admits_max_holders(h: Harness) {
    let locker = h.locker();
    let request = locker.lock("sem", LONG).max_holders(3);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            request
                .try_acquire()
                .await
                .expect("try")
                .expect("free slot"),
        );
    }
    assert!(request.try_acquire().await.expect("try").is_none());
    let tokens: Vec<u64> = held.iter().map(Lock::fencing_token).collect();
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    let snapshot = locker.snapshot("sem").await.expect("snapshot");
    assert_eq!(snapshot.holders.len(), 3);
    assert_eq!(snapshot.fencing_token, tokens[2]);
    held.remove(1).release().await.expect("release one");
    let refill = request
        .try_acquire()
        .await
        .expect("try")
        .expect("slot freed");
    assert!(refill.fencing_token() > tokens[2]);
    assert!(request.try_acquire().await.expect("try").is_none());
    for lock in held.into_iter().chain([refill]) {
        lock.release_strict().await.expect("release");
    }
    assert!(no_holders(&locker, "sem").await);
}

pub async fn fencing_floor_raises_and_never_lowers(h: Harness) {
    let locker = h.locker();
    let lock = locker.lock("floor", LONG).acquire().await.expect("lock");
    let before = lock.fencing_token();
    lock.release().await.expect("release");
    assert_eq!(
        locker
            .raise_fencing_floor("floor", 1_000)
            .await
            .expect("raise"),
        1_000
    );
    assert_eq!(
        locker
            .raise_fencing_floor("floor", 10)
            .await
            .expect("lower"),
        1_000,
        "a floor never lowers the counter"
    );
    let after = locker.lock("floor", LONG).acquire().await.expect("lock");
    assert_eq!(after.fencing_token(), 1_001);
    assert!(after.fencing_token() > before);
    assert_eq!(
        locker
            .snapshot("floor")
            .await
            .expect("snapshot")
            .fencing_token,
        1_001
    );
    after.release().await.expect("release");
    // A floor on a never-used key.
    assert_eq!(
        locker.raise_fencing_floor("fresh", 7).await.expect("raise"),
        7
    );
    let fresh = locker.lock("fresh", LONG).acquire().await.expect("lock");
    assert_eq!(fresh.fencing_token(), 8);
    fresh.release().await.expect("release");
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

pub async fn release_wakes_the_waiter_without_polling(h: Harness) {
    let locker = h.locker();
    let holder = locker.lock("push", LONG).acquire().await.expect("holder");
    let waiter = spawn_waiter(&locker, "push", "pushed", no_polling());
    until_queued(&h, "push", "pushed").await;
    holder.release().await.expect("release");
    let lock = tokio::time::timeout(NO_POLLING / 2, waiter)
        .await
        .expect("woken by the release, not by polling")
        .expect("join")
        .expect("acquired");
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
    let stalled = locker
        .lock("expiry", Duration::from_millis(100))
        .acquire()
        .await
        .expect("stalled");
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

pub async fn waiters_are_served_first_come_first_served(h: Harness) {
    const WAITERS: usize = 8;
    let locker = h.locker();
    let holder = locker.lock("fifo", LONG).acquire().await.expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (locker, order) = (locker.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lock = locker
                .lock("fifo", LONG)
                .owner(format!("fifo-{i}"))
                .retry(no_polling())
                .acquire()
                .await
                .expect("acquire");
            order.lock().unwrap().push((i, lock.fencing_token()));
            lock.release().await.expect("release");
        }));
        until_queued(&h, "fifo", &format!("fifo-{i}")).await;
    }
    holder.release().await.expect("release");
    for task in tasks {
        task.await.expect("join");
    }
    let order = order.lock().unwrap().clone();
    let served: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(served, (0..WAITERS).collect::<Vec<_>>());
    assert!(order.windows(2).all(|pair| pair[0].1 < pair[1].1));
}

pub async fn try_acquire_never_jumps_the_queue_and_dead_waiters_age_out(h: Harness) {
    let backend = h.raw();
    let locker = h.locker();
    let holder = locker.lock("queue", LONG).acquire().await.expect("holder");
    let queued = |owner: &'static str, lease: Duration| AcquireRequest {
        key: "queue",
        owner,
        ttl: LONG,
        max_holders: 1,
        mode: AcquireMode::Wait,
        waiter_lease: lease,
    };
    // A waiter that never comes back: its place survives for its lease.
    let outcome = backend
        .acquire(&queued("patient", LONG))
        .await
        .expect("enqueue");
    assert!(matches!(
        outcome,
        AcquireOutcome::Waiting { position: 1, .. }
    ));
    let outcome = backend
        .acquire(&queued("second", Duration::from_millis(60)))
        .await
        .expect("enqueue");
    assert!(matches!(
        outcome,
        AcquireOutcome::Waiting { position: 2, .. }
    ));
    holder.release().await.expect("release");
    // The lock is free but "patient" is first in line.
    assert!(locker
        .lock("queue", LONG)
        .try_acquire()
        .await
        .expect("try")
        .is_none());
    let granted = backend
        .acquire(&AcquireRequest {
            mode: AcquireMode::Try,
            ..queued("patient", LONG)
        })
        .await
        .expect("patient");
    assert!(matches!(granted, AcquireOutcome::Granted { .. }));
    assert!(backend
        .release("queue", "patient", 1)
        .await
        .expect("release"));
    // "second" stopped polling: once its heartbeat lapses it no longer blocks anyone.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(locker
        .snapshot("queue")
        .await
        .expect("snapshot")
        .waiters
        .is_empty());
    let lock = locker
        .lock("queue", LONG)
        .try_acquire()
        .await
        .expect("try")
        .expect("dead waiter aged out");
    lock.release().await.expect("release");
}

pub async fn one_release_costs_one_waiter_one_attempt(h: Harness) {
    const WAITERS: u64 = 32;
    let locker = h.locker();
    let holder = locker.lock("herd", LONG).acquire().await.expect("holder");
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let locker = locker.clone();
        tasks.push(tokio::spawn(async move {
            let lock = locker
                .lock("herd", LONG)
                .owner(format!("herd-{i}"))
                .retry(no_polling())
                .acquire()
                .await
                .expect("acquire");
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

pub async fn releaser_does_not_regrab_its_own_lock(h: Harness) {
    const WORKERS: usize = 6;
    const ROUNDS: usize = 8;
    let locker = h.locker();
    let gate = locker.lock("rr", LONG).acquire().await.expect("gate");
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let (locker, grants) = (locker.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lock = locker
                    .lock("rr", LONG)
                    .retry(no_polling())
                    .acquire()
                    .await
                    .expect("acquire");
                grants.lock().unwrap().push(worker);
                tokio::task::yield_now().await;
                lock.release().await.expect("release");
            }
        }));
    }
    eventually("all workers queued", || async {
        locker.snapshot("rr").await.expect("snapshot").waiters.len() == WORKERS
    })
    .await;
    gate.release().await.expect("release gate");
    for task in tasks {
        task.await.expect("join");
    }
    let grants = grants.lock().unwrap().clone();
    assert_eq!(grants.len(), WORKERS * ROUNDS);
    // A releaser re-queues behind everyone already waiting, so it can only follow itself
    // when every other worker is done or (a scheduling hiccup) has not re-queued yet. The
    // ancestor's releaser re-grabbed nearly every time.
    let mut served = [0usize; WORKERS];
    let mut regrabs = Vec::new();
    for (index, pair) in grants.windows(2).enumerate() {
        served[pair[0]] += 1;
        let others_busy = (0..WORKERS).any(|w| w != pair[0] && served[w] < ROUNDS);
        if pair[0] == pair[1] && others_busy {
            regrabs.push(index + 1);
        }
    }
    assert!(
        regrabs.len() <= grants.len() / 10,
        "re-grabbed at grants {regrabs:?}: {grants:?}"
    );
}

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
    let lock = locker
        .lock("ghost", LONG)
        .try_acquire()
        .await
        .expect("try")
        .expect("no ghost holds the lock");
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
    holder.release().await.expect("release");
    let lock = tokio::time::timeout(NO_POLLING / 2, patient)
        .await
        .expect("woken, not polled")
        .expect("join")
        .expect("acquire");
    assert_eq!(lock.owner(), "patient");
    lock.release().await.expect("release");
}

/// Shared bookkeeping of a stress run.
#[derive(Default)]
struct Referee {
    /// Locks inside their critical section right now.
    inside: Mutex<Vec<Lock>>,
    /// Highest token of any holder that left its critical section.
    finished_max: AtomicU64,
    tokens: Mutex<Vec<u64>>,
    violations: Mutex<Vec<String>>,
    stalled_told: AtomicUsize,
    stalled: AtomicUsize,
}

impl Referee {
    /// A holder enters: count live leases inside (including its own).
    fn enter(&self, lock: &Lock, max_holders: usize, started_after_token: u64) {
        let mut inside = self.inside.lock().unwrap();
        let live = inside.iter().filter(|other| !other.is_lost()).count() + 1;
        if live > max_holders {
            let now = tokio::time::Instant::now();
            let others: Vec<String> = inside
                .iter()
                .map(|other| {
                    format!(
                        "token {} owner {} lost {} left {:?}",
                        other.fencing_token(),
                        other.owner(),
                        other.is_lost(),
                        other.lease_deadline().checked_duration_since(now)
                    )
                })
                .collect();
            self.violation(format!(
                "{live} live holders inside (max {max_holders}), token {} owner {} left {:?}: {others:?}",
                lock.fencing_token(),
                lock.owner(),
                lock.lease_deadline().checked_duration_since(now)
            ));
        }
        if lock.fencing_token() <= started_after_token {
            self.violation(format!(
                "token {} not above {started_after_token}, held before the acquire began",
                lock.fencing_token()
            ));
        }
        inside.push(lock.clone());
        self.tokens.lock().unwrap().push(lock.fencing_token());
    }

    fn leave(&self, lock: &Lock) {
        self.inside
            .lock()
            .unwrap()
            .retain(|other| other.fencing_token() != lock.fencing_token());
        self.finished_max
            .fetch_max(lock.fencing_token(), Ordering::SeqCst);
    }

    fn violation(&self, message: String) {
        self.violations.lock().unwrap().push(message);
    }

    fn check(&self, expected_grants: usize, mutex: bool) {
        let violations = self.violations.lock().unwrap();
        assert!(
            violations.is_empty(),
            "{} violations: {violations:?}",
            violations.len()
        );
        let tokens = self.tokens.lock().unwrap();
        assert_eq!(tokens.len(), expected_grants);
        let mut unique = tokens.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), tokens.len(), "duplicate fencing tokens");
        if mutex {
            assert!(
                tokens.windows(2).all(|pair| pair[0] < pair[1]),
                "tokens out of grant order"
            );
        }
    }
}

async fn stress(
    h: Harness,
    key: &'static str,
    max_holders: u32,
    tasks: usize,
    rounds: usize,
    stall_every: Option<usize>,
) {
    let locker = h.locker();
    let referee = Arc::new(Referee::default());
    let ttl = if stall_every.is_some() {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(10)
    };
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (locker, referee) = (locker.clone(), referee.clone());
        handles.push(tokio::spawn(async move {
            for round in 0..rounds {
                let started_after = referee.finished_max.load(Ordering::SeqCst);
                let lock = locker
                    .lock(key, ttl)
                    .max_holders(max_holders)
                    .acquire()
                    .await
                    .expect("acquire");
                referee.enter(&lock, max_holders as usize, started_after);
                let stall =
                    stall_every.is_some_and(|every| (task * rounds + round).is_multiple_of(every));
                if stall {
                    referee.stalled.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(ttl * 2).await;
                    // The holder must learn it lost the lock, every way it can ask.
                    let told = lock.is_lost()
                        && matches!(lock.extend(ttl).await, Err(LockError::LockLost { .. }))
                        && !lock.is_locked().await.expect("is_locked")
                        && matches!(lock.release_strict().await, Err(LockError::LockLost { .. }));
                    if told {
                        referee.stalled_told.fetch_add(1, Ordering::SeqCst);
                    } else {
                        referee.violation(format!(
                            "stalled holder {} was not told it lost the lock",
                            lock.fencing_token()
                        ));
                    }
                } else {
                    tokio::task::yield_now().await;
                    if lock.is_lost() {
                        referee
                            .violation(format!("holder {} lost its lease", lock.fencing_token()));
                    }
                }
                referee.leave(&lock);
                lock.release().await.expect("release");
            }
        }));
    }
    for handle in handles {
        handle.await.expect("join");
    }
    referee.check(tasks * rounds, max_holders == 1 && stall_every.is_none());
    if stall_every.is_some() {
        assert!(referee.stalled.load(Ordering::SeqCst) > 0);
        assert_eq!(
            referee.stalled_told.load(Ordering::SeqCst),
            referee.stalled.load(Ordering::SeqCst)
        );
    }
}

pub async fn stress_mutex_counts_zero_violations(h: Harness) {
    stress(h, "stress-mutex", 1, 8, 25, None).await;
}

pub async fn stress_semaphore_counts_zero_violations(h: Harness) {
    stress(h, "stress-sem", 3, 12, 15, None).await;
}

pub async fn stress_with_stalled_holders_counts_zero_violations(h: Harness) {
    stress(h, "stress-stall", 2, 6, 6, Some(4)).await;
}
