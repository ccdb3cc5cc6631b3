//! End to end with real kubectl against the fake API server and the controller: claim
//! priority (kept across a controller restart), the lock's maximum hold time and its
//! lock-delay after an involuntary end, a semaphore limit lowered on a live lock, and shared
//! readers with an exclusive writer that later readers do not overtake.

mod e2e_support;

use e2e_support::{phase_of, position_of, reason_of, Env};
use turnstile_api::ClaimPhase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_orders_the_queue_and_a_restart_keeps_it() {
    let mut env = Env::started().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.hold("holder", "db", "").await;
    env.apply_claim("early-low", "db", "");
    env.apply_claim("late-high", "db", "priority: 10");
    env.wait_claim("late-high", |c| position_of(c) == Some(1))
        .await;
    env.wait_claim("early-low", |c| position_of(c) == Some(2))
        .await;

    // A new controller (as after a restart or a leader change) reads the same order.
    env.stop_controller().await;
    env.start_default_controller();
    env.delete_claim("holder").await;
    env.wait_phase("late-high", ClaimPhase::Held).await;
    let low = env
        .wait_claim("early-low", |c| position_of(c) == Some(1))
        .await;
    assert_eq!(phase_of(&low), Some(ClaimPhase::Pending));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maximum_hold_ends_a_grant_and_the_lock_delay_holds_the_next() {
    let mut env = Env::started().await;
    env.apply_lock(
        "db",
        "leaseDurationSeconds: 300\nmaxHoldSeconds: 2\nlockDelaySeconds: 2",
    );
    env.apply_claim("a", "db", "");
    env.apply_claim("b", "db", "");
    env.wait_phase("a", ClaimPhase::Held).await;
    // A 300 s lease, yet the grant ends after 2 s.
    let a = env.wait_phase("a", ClaimPhase::Expired).await;
    assert_eq!(reason_of(&a).as_deref(), Some("MaxHoldExceeded"));
    let b = env.wait_phase("b", ClaimPhase::Held).await;

    let status = |claim: &turnstile_api::LockClaim| claim.status.clone().expect("status");
    let ended = status(&a).released_at.expect("releasedAt").0;
    let granted = status(&b).acquired_at.expect("acquiredAt").0;
    assert!(
        granted.as_second() >= ended.as_second() + 2,
        "b granted at {granted}, inside the 2 s lock-delay after {ended}"
    );
    let lock = env.kubectl(&["get", "distributedlock", "db", "-o", "wide"]);
    assert!(lock.contains("DELAYED-UNTIL"), "{lock}");
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_limit_revokes_nobody_and_stops_grants() {
    let mut env = Env::started().await;
    env.apply_lock("pool", "maxHolders: 2\nleaseDurationSeconds: 300");
    for name in ["a", "b", "c"] {
        env.apply_claim(name, "pool", "");
    }
    env.wait_held(&["a", "b"]).await;
    env.wait_claim("c", |c| position_of(c) == Some(1)).await;
    // `kubectl get locks` names every holder of a semaphore, not only the first.
    env.wait_lock("pool", |lock| {
        lock.status
            .as_ref()
            .is_some_and(|s| s.holder_summary.as_deref() == Some("a, b"))
    })
    .await;
    let table = env.kubectl(&["get", "distributedlock", "pool"]);
    assert!(table.contains("a, b"), "{table}");

    env.apply_lock("pool", "maxHolders: 1\nleaseDurationSeconds: 300");
    env.delete_claim("a").await;
    // b still holds (not revoked); with one holder at a limit of one, c keeps waiting.
    env.wait_lock("pool", |lock| {
        lock.status
            .as_ref()
            .is_some_and(|s| s.holders.len() == 1 && s.holders[0].claim == "b" && s.waiting == 1)
    })
    .await;
    assert_eq!(phase_of(&env.claim("c").await), Some(ClaimPhase::Pending));
    assert_eq!(phase_of(&env.claim("b").await), Some(ClaimPhase::Held));
    env.delete_claim("b").await;
    env.wait_phase("c", ClaimPhase::Held).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_a_writer_holds_alone_and_is_not_overtaken() {
    let mut env = Env::started().await;
    env.apply_lock("table", "maxHolders: 3\nleaseDurationSeconds: 300");
    env.apply_claim("reader-1", "table", "mode: Shared");
    env.apply_claim("reader-2", "table", "mode: Shared");
    env.wait_held(&["reader-1", "reader-2"]).await;
    env.apply_claim("writer", "table", "mode: Exclusive");
    env.wait_claim("writer", |c| position_of(c) == Some(1))
        .await;
    // The queue orders by whole creation seconds, then name: reader-3 comes a second later
    // so that it is behind the writer.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    env.apply_claim("reader-3", "table", "mode: Shared");
    // A slot is free, but reader-3 waits behind the writer (no writer starvation).
    env.wait_claim("reader-3", |c| position_of(c) == Some(2))
        .await;
    let wide = env.kubectl(&["get", "lockclaim", "writer", "-o", "wide"]);
    assert!(wide.contains("Exclusive"), "{wide}");
    env.assert_patch_refused(
        "lockclaim/writer",
        r#"{"spec":{"mode":"Shared"}}"#,
        "spec.mode is immutable",
        "mode is immutable",
    );

    env.delete_claim("reader-1").await;
    env.delete_claim("reader-2").await;
    env.wait_phase("writer", ClaimPhase::Held).await;
    let lock = env
        .wait_lock("table", |lock| {
            lock.status
                .as_ref()
                .is_some_and(|s| s.holder_summary.as_deref() == Some("writer"))
        })
        .await;
    assert_eq!(lock.status.expect("status").holders.len(), 1, "alone");
    assert_eq!(
        phase_of(&env.claim("reader-3").await),
        Some(ClaimPhase::Pending)
    );
    env.delete_claim("writer").await;
    env.wait_phase("reader-3", ClaimPhase::Held).await;
    env.stop_controller().await;
}
