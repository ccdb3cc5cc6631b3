//! Live limits: a different `max_holders` takes effect at the next grant; lowering it never
//! revokes a holder.

use super::LONG;
use crate::harness::Harness;

pub async fn lowering_max_holders_revokes_nobody(h: Harness) {
    let locker = h.locker();
    let at = |max: u32| locker.lock("live", LONG).max_holders(max).shared();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(at(3).try_acquire().await.expect("try").expect("free"));
    }
    // Raised: the next grant may go above the old limit.
    held.push(
        at(4)
            .try_acquire()
            .await
            .expect("try")
            .expect("raised limit"),
    );
    // Lowered to 2: nobody is revoked, and nobody else gets in until fewer than 2 hold.
    assert!(at(2).try_acquire().await.expect("try").is_none());
    for lock in &held {
        assert!(
            lock.is_locked().await.expect("is_locked"),
            "a holder was revoked"
        );
    }
    assert_eq!(
        locker
            .snapshot("live")
            .await
            .expect("snapshot")
            .holders
            .len(),
        4
    );
    while held.len() > 2 {
        held.pop()
            .expect("one")
            .release_strict()
            .await
            .expect("release");
        assert!(
            at(2).try_acquire().await.expect("try").is_none(),
            "{} hold",
            held.len()
        );
    }
    held.pop()
        .expect("one")
        .release_strict()
        .await
        .expect("release");
    let refill = at(2)
        .try_acquire()
        .await
        .expect("try")
        .expect("below the new limit");
    assert!(at(2).try_acquire().await.expect("try").is_none());
    for lock in held.into_iter().chain([refill]) {
        lock.release_strict().await.expect("release");
    }
}
