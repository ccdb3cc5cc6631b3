//! Queue fairness: first come first served, no queue jumping, no re-grab by the releaser.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use turnstile_lock::backend::{AcquireMode, AcquireOutcome, AcquireRequest};

use super::{no_polling, LONG};
use crate::harness::{eventually, until_queued, Harness};
use crate::support::grants::{acquire_as, is_taken, take_free};

pub async fn waiters_are_served_first_come_first_served(h: Harness) {
    const WAITERS: usize = 8;
    let locker = h.locker();
    let holder = locker.lock("fifo", LONG).acquire().await.expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (locker, order) = (locker.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lock = acquire_as(&locker, "fifo", format!("fifo-{i}"), no_polling()).await;
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
        ..AcquireRequest::new("queue", owner, LONG, 1, AcquireMode::Wait, lease)
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
    assert!(is_taken(&locker.lock("queue", LONG)).await);
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
    let lock = take_free(&locker.lock("queue", LONG), "dead waiter aged out").await;
    lock.release().await.expect("release");
}

pub async fn releaser_does_not_regrab_its_own_lock(h: Harness) {
    const WORKERS: usize = 6;
    const ROUNDS: usize = 8;
    let locker = h.locker();
    let gate = locker.lock("rr", LONG).acquire().await.expect("gate");
    let grants = Arc::new(Mutex::new(Vec::new()));
    // One worker: ROUNDS acquires, each recorded, then released after a yield.
    let rounds_of = |worker: usize| {
        let (locker, grants) = (locker.clone(), grants.clone());
        async move {
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
        }
    };
    let tasks: Vec<_> = (0..WORKERS)
        .map(|worker| tokio::spawn(rounds_of(worker)))
        .collect();
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
