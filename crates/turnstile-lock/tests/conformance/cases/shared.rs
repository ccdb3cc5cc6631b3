//! Shared and exclusive holders: shared ones together up to the limit, an exclusive one
//! alone, and a waiting exclusive request that later shared ones cannot overtake.

use std::time::Duration;

use turnstile_lock::{Lock, LockResult, Locker, RetryPolicy, ShareMode};

use super::{no_holders, no_polling, LONG};
use crate::harness::{until_queued, Harness};
use crate::support::grants::{acquired_within, is_taken, take_free, take_places};

/// Starts `owner`'s acquire of `key` (max 3 holders, lease [`LONG`]) in the background.
fn spawn_mode(
    locker: &Locker,
    key: &'static str,
    owner: &'static str,
    share: ShareMode,
    policy: RetryPolicy,
) -> tokio::task::JoinHandle<LockResult<Lock>> {
    let request = locker
        .lock(key, LONG)
        .max_holders(3)
        .owner(owner)
        .retry(policy);
    let request = match share {
        ShareMode::Shared => request.shared(),
        ShareMode::Exclusive => request.exclusive(),
    };
    tokio::spawn(async move { request.acquire().await })
}

/// Awaits a background acquire, with a hang guard far below the no-polling delay: only a
/// wake-up or hand-off explains getting the lock in time.
async fn woken(handle: tokio::task::JoinHandle<LockResult<Lock>>) -> Lock {
    acquired_within(Duration::from_secs(10), handle, "woken, not polled").await
}

pub async fn shared_holders_coexist_up_to_the_limit(h: Harness) {
    let locker = h.locker();
    let readers = locker.lock("rw", LONG).max_holders(3).shared();
    let mut held = take_places(&readers, 3, "a free place").await;
    assert!(is_taken(&readers).await, "a 4th of 3");
    let snapshot = locker.snapshot("rw").await.expect("snapshot");
    assert_eq!(snapshot.holders.len(), 3);
    assert!(snapshot
        .holders
        .iter()
        .all(|holder| holder.share == ShareMode::Shared));
    let writer = locker.lock("rw", LONG).max_holders(3).exclusive();
    assert!(is_taken(&writer).await, "writer beside readers");
    held.pop().expect("one").release().await.expect("release");
    assert!(is_taken(&writer).await, "writer beside 2 readers");
    for lock in held {
        lock.release_strict().await.expect("release");
    }
    assert!(no_holders(&locker, "rw").await);
}

pub async fn exclusive_holds_alone(h: Harness) {
    let locker = h.locker();
    let writer = locker.lock("x", LONG).max_holders(5).exclusive();
    let reader = locker.lock("x", LONG).max_holders(5).shared();
    let lock = take_free(&writer, "free").await;
    let snapshot = locker.snapshot("x").await.expect("snapshot");
    assert_eq!(snapshot.holders[0].share, ShareMode::Exclusive);
    assert!(is_taken(&reader).await, "reader beside writer");
    assert!(is_taken(&writer).await, "two writers");
    lock.release().await.expect("release");
    let shared = take_free(&reader, "free again").await;
    assert!(shared.fencing_token() > lock.fencing_token());
    assert!(is_taken(&writer).await, "writer beside reader");
    shared.release().await.expect("release");
}

pub async fn a_waiting_exclusive_blocks_later_shared_and_shared_are_admitted_together(h: Harness) {
    let locker = h.locker();
    let reader = locker.lock("fair", LONG).max_holders(3).shared();
    let first = take_free(&reader, "free").await;
    let writer = spawn_mode(
        &locker,
        "fair",
        "writer",
        ShareMode::Exclusive,
        no_polling(),
    );
    until_queued(&h, "fair", "writer").await;
    // A place is free for a reader, but the writer came first.
    assert!(is_taken(&reader).await, "reader overtook writer");
    let r1 = spawn_mode(&locker, "fair", "r1", ShareMode::Shared, no_polling());
    until_queued(&h, "fair", "r1").await;
    let r2 = spawn_mode(&locker, "fair", "r2", ShareMode::Shared, no_polling());
    until_queued(&h, "fair", "r2").await;
    first.release().await.expect("release");
    let writer = woken(writer).await;
    assert!(writer.fencing_token() > first.fencing_token());
    let snapshot = locker.snapshot("fair").await.expect("snapshot");
    assert_eq!(snapshot.holders.len(), 1, "the writer holds alone");
    assert_eq!(snapshot.waiters, ["r1", "r2"]);
    // The writer's release admits both readers at once.
    writer.release().await.expect("release");
    let (r1, r2) = (woken(r1).await, woken(r2).await);
    assert!(r1.fencing_token() > writer.fencing_token());
    // (Both woken at once: on a backend that wakes rather than hands off, either may win.)
    assert!(r2.fencing_token() > writer.fencing_token());
    assert_ne!(r1.fencing_token(), r2.fencing_token());
    assert_eq!(
        locker
            .snapshot("fair")
            .await
            .expect("snapshot")
            .holders
            .len(),
        2
    );
    r1.release().await.expect("release");
    r2.release().await.expect("release");
}
