//! End to end with real kubectl on the fake API server: claims on several locks at once
//! (`spec.lockNames`). Two claims on `[a, b]` and `[b, a]` applied together both complete in
//! turn, never both held, each with one increasing token per lock; a claim on several locks
//! waits at the head of the queue of a busy lock while holding nothing, and nobody behind it
//! on its free lock overtakes it; its lease runs out like any other, freeing all its locks.

mod e2e_support;

use std::time::Duration;

use e2e_support::{phase_of, reason_of, token_on, Env, HolderMonitor};
use turnstile_api::{ClaimPhase, LockClaim};

fn multi_claim(name: &str, locks: &str, extra: &str) -> String {
    format!(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: {name}\nspec:\n  lockNames: [{locks}]\n{extra}"
    )
}

fn lock_names(claim: &LockClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .map(|status| {
            status
                .locks
                .iter()
                .map(|entry| entry.lock_name.clone())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_on_the_same_locks_in_opposite_order_both_complete_in_turn() {
    let mut env = Env::new().await;
    env.start_default_controller();
    env.apply_lock("a", "leaseDurationSeconds: 300");
    env.apply_lock("b", "leaseDurationSeconds: 300");
    let on_a = HolderMonitor::start(&env, "a", 1);
    let on_b = HolderMonitor::start(&env, "b", 1);
    // One apply: both exist before either is granted.
    env.apply(&format!(
        "{}---\n{}",
        multi_claim("ab", "a, b", ""),
        multi_claim("ba", "b, a", "")
    ));

    // `kubectl wait` works for a claim on several locks as for any other.
    let waited = env.kubectl_output(&[
        "wait",
        "--for=condition=Held",
        "lockclaim/ab",
        "--timeout=30s",
    ]);
    assert!(waited.status.success(), "kubectl wait: {waited:?}");
    let ab = env.claim("ab").await;
    assert_eq!(lock_names(&ab), ["a", "b"], "one grant per lock");
    assert_eq!(token_on(&ab, "a"), Some(1));
    assert_eq!(token_on(&ab, "b"), Some(1));
    // Its status may come a pass later than ab's grant.
    let ba = env.wait_phase("ba", ClaimPhase::Pending).await;
    assert!(lock_names(&ba).is_empty(), "a waiter holds nothing: {ba:?}");
    // Both locks show the holder.
    for lock in ["a", "b"] {
        let status = env.lock(lock).await.status.unwrap_or_default();
        let holders: Vec<&str> = status.holders.iter().map(|h| h.claim.as_str()).collect();
        assert_eq!(holders, ["ab"], "lock {lock}");
    }

    env.delete_claim("ab").await;
    let ba = env.wait_phase("ba", ClaimPhase::Held).await;
    assert_eq!(lock_names(&ba), ["a", "b"]);
    assert_eq!(token_on(&ba, "a"), Some(2));
    assert_eq!(token_on(&ba, "b"), Some(2));
    env.wait_gone("ab").await;
    env.delete_claim("ba").await;
    env.wait_gone("ba").await;
    for monitor in [on_a, on_b] {
        let report = monitor.finish().await;
        assert_eq!(report.tokens(), [1, 2]);
    }
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_several_locks_waits_at_the_head_and_nobody_overtakes_it() {
    let mut env = Env::new().await;
    env.start_default_controller();
    env.apply_lock("a", "leaseDurationSeconds: 300");
    env.apply_lock("b", "leaseDurationSeconds: 300");
    env.apply_claim("holds-b", "b", "");
    env.wait_phase("holds-b", ClaimPhase::Held).await;
    env.apply(&multi_claim("both", "a, b", ""));
    env.wait_claim("both", |claim| {
        reason_of(claim).as_deref() == Some("Queued")
    })
    .await;
    env.apply_claim("later-on-a", "a", "");
    env.wait_claim("later-on-a", |claim| {
        reason_of(claim).as_deref() == Some("Queued")
    })
    .await;
    // A while later, lock a is still free for `both` (nobody overtook it) and `both` holds
    // nothing anywhere.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let both = env.claim("both").await;
    assert_eq!(phase_of(&both), Some(ClaimPhase::Pending));
    let message = both
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("lock b"),
        "says what it waits for: {message}"
    );
    assert_eq!(
        phase_of(&env.claim("later-on-a").await),
        Some(ClaimPhase::Pending)
    );
    let a = env.lock("a").await.status.unwrap_or_default();
    assert!(a.holders.is_empty(), "lock a is kept free: {a:?}");
    assert_eq!(a.waiting, 2);

    // b's holder goes: `both` gets both locks (woken by lock b's pass), then the claim behind.
    env.delete_claim("holds-b").await;
    let both = env.wait_phase("both", ClaimPhase::Held).await;
    assert_eq!(token_on(&both, "a"), Some(1));
    assert_eq!(token_on(&both, "b"), Some(2));
    env.patch_claim_spec("both", serde_json::json!({ "release": true }))
        .await;
    let later = env.wait_phase("later-on-a", ClaimPhase::Held).await;
    assert_eq!(e2e_support::token_of(&later), Some(2));
    let both = env.claim("both").await;
    assert_eq!(phase_of(&both), Some(ClaimPhase::Released));
    assert_eq!(lock_names(&both), ["a", "b"], "the grants stay on record");
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_claim_on_several_locks_expires_and_frees_them_all() {
    let mut env = Env::new().await;
    env.start_default_controller();
    env.apply_lock("a", "leaseDurationSeconds: 300");
    env.apply_lock("b", "leaseDurationSeconds: 2");
    // The shortest lease of its locks: b's two seconds.
    env.apply(&multi_claim("both", "a, b", ""));
    let both = env.wait_phase("both", ClaimPhase::Held).await;
    let status = both.status.clone().unwrap_or_default();
    let (acquired, expires) = (
        status
            .acquired_at
            .as_ref()
            .expect("acquiredAt")
            .0
            .as_second(),
        status.expires_at.as_ref().expect("expiresAt").0.as_second(),
    );
    assert_eq!(expires - acquired, 2, "the shortest lease: {status:?}");
    env.apply_claim("next-a", "a", "");
    env.apply_claim("next-b", "b", "leaseDurationSeconds: 300");
    let expired = env.wait_phase("both", ClaimPhase::Expired).await;
    assert_eq!(reason_of(&expired).as_deref(), Some("LeaseExpired"));
    env.wait_phase("next-a", ClaimPhase::Held).await;
    env.wait_phase("next-b", ClaimPhase::Held).await;
    env.stop_controller().await;
}
