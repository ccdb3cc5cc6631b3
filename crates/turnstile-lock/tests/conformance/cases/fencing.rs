//! Fencing counters: the floor raised after data loss.

use super::LONG;
use crate::harness::Harness;

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
