//! End to end against the fake API server with the controller in-process: semaphores, lease
//! expiry and renewal, release on request, acquire timeouts, and bad input (a claim for a
//! missing lock, a lock deleted while held, a backend that is not configured, durations out
//! of bounds).

use crate::support;

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use support::{phase_of, position_of, reason_of, token_of, Env};
use turnstile_api::ClaimPhase;

/// A fresh namespace with the default controller running and lock `lock` (spec `lock_spec`).
async fn controller_and_lock(lock: &str, lock_spec: &str) -> Env {
    let env = Env::started().await;
    env.apply_lock(lock, lock_spec);
    env
}

/// [`controller_and_lock`] on `db`; `a` holds `db`, then `b` (extra spec `b_spec`) and `c`
/// queue behind it (`c` second in line).
async fn a_holds_then_b_and_c_queue(lock_spec: &str, b_spec: &str) -> Env {
    let env = controller_and_lock("db", lock_spec).await;
    env.hold("a", "db", "").await;
    env.apply_claim("b", "db", b_spec);
    env.apply_claim("c", "db", "");
    env.wait_claim("c", |c| position_of(c) == Some(2)).await;
    env
}

/// [`controller_and_lock`] on `db` with a 300 s lease; `a` and `b` claim it together: `a`
/// holds it and `b` waits first in line.
async fn a_holds_and_b_waits_on_db() -> Env {
    let env = controller_and_lock("db", "leaseDurationSeconds: 300").await;
    env.apply_claim("a", "db", "");
    env.apply_claim("b", "db", "");
    env.wait_phase("a", ClaimPhase::Held).await;
    env.wait_claim("b", |c| position_of(c) == Some(1)).await;
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_admits_max_holders_in_order() {
    let mut env = controller_and_lock("pool", "maxHolders: 2\nleaseDurationSeconds: 300").await;
    for name in ["a", "b", "c", "d"] {
        env.apply_claim(name, "pool", "");
    }
    env.wait_held(&["a", "b"]).await;
    env.wait_claim("c", |c| position_of(c) == Some(1)).await;
    env.wait_claim("d", |c| position_of(c) == Some(2)).await;
    assert_eq!(env.held_count().await, 2);
    // The lock's status is written after the claims' (off their critical path): wait for
    // the one that counts both waiters.
    let lock = env
        .wait_lock("pool", |l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.holders.len() == 2 && s.waiting == 2)
        })
        .await;
    let status = lock.status.expect("status");
    assert_eq!(status.fencing_token, Some(2));

    env.delete_claim("b").await;
    let c = env.wait_phase("c", ClaimPhase::Held).await;
    assert_eq!(token_of(&c), Some(3));
    env.wait_claim("d", |c| position_of(c) == Some(1)).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_hands_on_and_renewal_keeps_the_lock() {
    let mut env = a_holds_then_b_and_c_queue("leaseDurationSeconds: 3", "").await;

    // a does not renew: it expires and b gets the lock.
    let a = env.wait_phase("a", ClaimPhase::Expired).await;
    assert_eq!(reason_of(&a).as_deref(), Some("LeaseExpired"));
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert!(token_of(&b) > token_of(&a));

    // b renews every second for seven seconds (over two leases): it keeps the lock.
    let held_at = Timestamp::now();
    while Timestamp::now().duration_since(held_at).as_secs() < 7 {
        env.renew("b").await;
        // Time: b renews once a second, over two leases.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let b = env.claim("b").await;
        assert_eq!(
            phase_of(&b),
            Some(ClaimPhase::Held),
            "b lost the lock: {b:#?}"
        );
    }
    assert_eq!(phase_of(&env.claim("c").await), Some(ClaimPhase::Pending));
    // Then it stops renewing and c follows.
    env.wait_phase("b", ClaimPhase::Expired).await;
    let c = env.wait_phase("c", ClaimPhase::Held).await;
    assert!(token_of(&c) > token_of(&b));
    // Expired is terminal: a late renewal changes nothing.
    env.renew("a").await;
    env.after_a_pass_over(&["db"]).await;
    assert_eq!(phase_of(&env.claim("a").await), Some(ClaimPhase::Expired));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_request_keeps_the_record() {
    let mut env = a_holds_and_b_waits_on_db().await;

    env.kubectl(&[
        "patch",
        "lockclaim/a",
        "--type=merge",
        "-p",
        r#"{"spec":{"release":true}}"#,
    ]);
    let a = env.wait_phase("a", ClaimPhase::Released).await;
    assert_eq!(reason_of(&a).as_deref(), Some("ReleaseRequested"));
    let status = a.status.clone().expect("status");
    assert_eq!(
        status.observed_generation, a.metadata.generation,
        "the status was computed from the spec that asked for the release"
    );
    assert_eq!(status.fencing_token, Some(1), "the record keeps the token");
    assert!(status.released_at.is_some());
    assert!(status.expires_at.is_none());
    let held = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Held")
        .expect("Held condition");
    assert_eq!(held.status, "False");
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(token_of(&b), Some(2));
    let lock = env
        .wait_lock("db", |lock| {
            lock.status.as_ref().and_then(|s| s.fencing_token) == Some(2)
        })
        .await;
    assert_eq!(
        lock.status.as_ref().and_then(|s| s.observed_generation),
        lock.metadata.generation,
        "the lock's status names the generation it was computed from"
    );
    // The released claim stays as a record, without our finalizer.
    let a = env.claim("a").await;
    assert!(a.metadata.finalizers.unwrap_or_default().is_empty());
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_timeout_fails_the_claim() {
    let mut env =
        a_holds_then_b_and_c_queue("leaseDurationSeconds: 300", "acquireTimeoutSeconds: 2").await;
    let b = env.wait_phase("b", ClaimPhase::Failed).await;
    assert_eq!(reason_of(&b).as_deref(), Some("AcquireTimeout"));
    env.wait_claim("c", |c| position_of(c) == Some(1)).await;
    // An Event tells the user.
    env.wait_event("b", "Failed").await;
    env.wait_event("b", "Queued").await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_for_a_missing_lock_waits_then_is_granted() {
    let mut env = Env::started().await;
    env.apply_claim("early", "later", "");
    let early = env.wait_pending_for("early", "LockNotFound").await;
    assert_eq!(position_of(&early), None);
    env.apply_lock("later", "leaseDurationSeconds: 300");
    let early = env.wait_phase("early", ClaimPhase::Held).await;
    assert_eq!(token_of(&early), Some(1));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_deleted_while_claimed() {
    let mut env = a_holds_and_b_waits_on_db().await;

    env.locks()
        .delete("db", &DeleteParams::default())
        .await
        .expect("delete lock");
    let a = env.wait_phase("a", ClaimPhase::Expired).await;
    assert_eq!(reason_of(&a).as_deref(), Some("LockDeleted"));
    env.wait_pending_for("b", "LockNotFound").await;
    // The lock goes away (its finalizer is removed), and claims can still be deleted.
    env.wait_lock_gone("db").await;
    env.delete_claim("b").await;
    env.wait_gone("b").await;

    // A new lock of the same name serves the waiting claims again, tokens still growing.
    env.apply_claim("c", "db", "");
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let c = env.wait_phase("c", ClaimPhase::Held).await;
    assert!(token_of(&c) >= Some(1));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_not_configured_reports_and_grants_nothing() {
    // The default controller is memory only: no --redis-url.
    let mut env = controller_and_lock("cache", "backend: redis\nleaseDurationSeconds: 30").await;
    env.apply_claim("a", "cache", "");
    let ready = env.wait_ready("cache", "False").await;
    assert_eq!(ready.reason, "BackendNotConfigured");
    let a = env.wait_pending_for("a", "BackendNotConfigured").await;
    assert_eq!(position_of(&a), Some(1));
    env.wait_event("cache", "BackendNotConfigured").await;
    // Deleting the claim is not blocked by the missing backend.
    env.delete_claim("a").await;
    env.wait_gone("a").await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_bounds_durations_are_rejected_by_the_schema() {
    let env = Env::new().await;
    for (kind, spec) in [
        ("lock", "leaseDurationSeconds: 0"),
        ("lock", "leaseDurationSeconds: 9999999"),
        ("lock", "maxHolders: 0"),
        ("claim", "leaseDurationSeconds: -5"),
        ("claim", "acquireTimeoutSeconds: 0"),
    ] {
        let yaml = match kind {
            "lock" => format!(
                "apiVersion: turnstile.dev/v1alpha1\nkind: DistributedLock\nmetadata:\n  name: bad\nspec:\n  {spec}\n"
            ),
            _ => format!(
                "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: bad\nspec:\n  lockName: x\n  {spec}\n"
            ),
        };
        let output = env.kubectl_apply_output(&yaml);
        assert!(!output.status.success(), "{kind} with {spec} was accepted");
    }
    // lockName is required and immutable.
    let output = env.kubectl_apply_output(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: nolock\nspec: {}\n",
    );
    assert!(
        !output.status.success(),
        "a claim without lockName was accepted"
    );
    env.apply_claim("moving", "one", "");
    env.assert_patch_refused(
        "lockclaim/moving",
        r#"{"spec":{"lockName":"two"}}"#,
        "lockName changed",
        "immutable",
    );
}
