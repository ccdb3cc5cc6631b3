//! Live limits: a different `max_holders` takes effect at the next grant; lowering it never
//! revokes a holder.

use super::LONG;
use crate::harness::Harness;
use crate::support::grants::{is_taken, take_free, take_places};

pub async fn lowering_max_holders_revokes_nobody(h: Harness) {
    let locker = h.locker();
    let at = |max: u32| locker.lock("live", LONG).max_holders(max).shared();
    let mut held = take_places(&at(3), 3, "free").await;
    // Raised: the next grant may go above the old limit.
    held.push(take_free(&at(4), "raised limit").await);
    // Lowered to 2: nobody is revoked, and nobody else gets in until fewer than 2 hold.
    assert!(is_taken(&at(2)).await);
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
        assert!(is_taken(&at(2)).await, "{} hold", held.len());
    }
    held.pop()
        .expect("one")
        .release_strict()
        .await
        .expect("release");
    let refill = take_free(&at(2), "below the new limit").await;
    assert!(is_taken(&at(2)).await);
    for lock in held.into_iter().chain([refill]) {
        lock.release_strict().await.expect("release");
    }
}
