//! End to end with real kubectl on the fake API server: claims on several locks at once
//! (`spec.lockNames`). Two claims on `[a, b]` and `[b, a]` applied together both complete in
//! turn, never both held, each with one increasing token per lock; a claim on several locks
//! waits at the head of the queue of a busy lock while holding nothing, and nobody behind it
//! on its free lock overtakes it; its lease runs out like any other, freeing all its locks; a
//! gated Job with `turnstile.dev/locks` runs only while it holds all of them; deleting one of
//! its locks ends the grant and frees the others at once; a missing lock holds back nobody.

use crate::support;

use std::time::Duration;

use support::jobs::{finish_job, held_pods, is_suspended, jobs, wait_job};
use support::{phase_of, position_of, reason_of, token_annotation, token_on, Env, HolderMonitor};
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
    let mut env = Env::started().await;
    env.apply_locks(&["a", "b"], "leaseDurationSeconds: 300");
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
    let mut env = Env::started().await;
    env.apply_locks(&["a", "b"], "leaseDurationSeconds: 300");
    env.hold("holds-b", "b", "").await;
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
    // After further passes over both locks, lock a is still free for `both` (nobody overtook
    // it) and `both` holds nothing anywhere.
    env.after_a_pass_over(&["a", "b"]).await;
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
    assert_eq!(support::token_of(&later), Some(2));
    let both = env.claim("both").await;
    assert_eq!(phase_of(&both), Some(ClaimPhase::Released));
    assert_eq!(lock_names(&both), ["a", "b"], "the grants stay on record");
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_first_runnable_locks_claims_pass_a_waiting_multi_lock_claim_within_its_window() {
    let mut env = Env::started().await;
    let window = 6;
    env.apply_locks(
        &["a", "b"],
        &format!("leaseDurationSeconds: 300\nqueue: FirstRunnable\nmaxOvertakeSeconds: {window}"),
    );
    env.hold("holds-b", "b", "").await;
    env.apply(&multi_claim("both", "a, b", ""));
    env.wait_claim("both", |claim| {
        reason_of(claim).as_deref() == Some("Queued")
    })
    .await;
    // Lock a is free and `both` waits for b: the claim behind it on a runs now.
    env.apply_claim("passes", "a", "");
    let passes = env.wait_phase("passes", ClaimPhase::Held).await;
    assert_eq!(support::token_of(&passes), Some(1));
    assert_eq!(
        phase_of(&env.claim("both").await),
        Some(ClaimPhase::Pending)
    );
    env.delete_claim("passes").await;

    // Once `both` has waited its window, nobody passes it: the next claim on a queues.
    let created = env
        .claim("both")
        .await
        .metadata
        .creation_timestamp
        .expect("created")
        .0;
    let closes = created + Duration::from_secs(window + 1);
    while k8s_openapi::jiff::Timestamp::now() < closes {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.apply_claim("waits", "a", "");
    env.wait_claim("waits", |claim| position_of(claim) == Some(2))
        .await;
    assert_eq!(
        phase_of(&env.claim("waits").await),
        Some(ClaimPhase::Pending)
    );

    env.delete_claim("holds-b").await;
    env.wait_phase("both", ClaimPhase::Held).await;
    env.patch_claim_spec("both", serde_json::json!({ "release": true }))
        .await;
    env.wait_phase("waits", ClaimPhase::Held).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_claim_on_several_locks_expires_and_frees_them_all() {
    let mut env = Env::started().await;
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
    env.wait_held(&["next-a", "next-b"]).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_job_with_the_locks_annotation_runs_holding_all_its_locks() {
    let mut env = Env::started().await;
    env.apply_locks(&["cache", "db"], "leaseDurationSeconds: 300");
    env.hold("holds-cache", "cache", "").await;
    // Its Pods wait unscheduled until finish_job ends the Job (see support::jobs).
    env.apply(&format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: report\n  annotations:\n    turnstile.dev/lock: db\n    turnstile.dev/locks: db,cache\nspec:\n  suspend: true\n  template:\n    spec:\n      restartPolicy: Never\n      nodeSelector: {}\n      containers:\n        - name: report\n          image: busybox:1.36\n",
        held_pods(&env)
    ));
    // One claim on both locks, named after the Job and the lock that marks it, owned by it.
    let claim = env
        .wait_claim("report-db", |claim| {
            reason_of(claim).as_deref() == Some("Queued")
        })
        .await;
    assert_eq!(
        claim.spec.lock_names,
        Some(vec!["cache".to_owned(), "db".to_owned()])
    );
    let owners = claim.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(
        owners.iter().map(|o| o.kind.as_str()).collect::<Vec<_>>(),
        ["Job"]
    );
    // Lock db is free, but cache is not: after further passes over both, the Job stays
    // suspended, and db is not taken.
    env.after_a_pass_over(&["cache", "db"]).await;
    assert!(is_suspended(&jobs(&env).get("report").await.expect("job")));
    let db = env.lock("db").await.status.unwrap_or_default();
    assert!(db.holders.is_empty(), "it holds nothing while it waits");

    env.delete_claim("holds-cache").await;
    let held = env.wait_phase("report-db", ClaimPhase::Held).await;
    let cache_token = token_on(&held, "cache").expect("a token on cache");
    assert!(token_on(&held, "db").is_some(), "a token on db");
    let job = wait_job(&env, "report", |job| !is_suspended(job)).await;
    assert_eq!(
        token_annotation(job.metadata.annotations.as_ref()),
        Some(cache_token.to_string()),
        "the first lock's (cache) token"
    );

    // The Job completes: both locks go on to the claims behind it.
    env.apply_claim("next-cache", "cache", "");
    env.apply_claim("next-db", "db", "");
    finish_job(&env, "report", "Complete").await;
    let released = env.wait_phase("report-db", ClaimPhase::Released).await;
    assert_eq!(reason_of(&released).as_deref(), Some("OwnerFinished"));
    // Its tokens stay as a record; the leases are gone.
    let record = released.status.clone().unwrap_or_default();
    assert_eq!(lock_names(&released), ["cache", "db"], "{record:?}");
    assert!(
        record.locks.iter().all(|entry| entry.expires_at.is_none()),
        "no lease after the end: {record:?}"
    );
    env.wait_held(&["next-cache", "next-db"]).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_one_of_its_locks_ends_the_grant_and_frees_the_others() {
    let mut env = Env::started().await;
    env.apply_locks(&["a", "b"], "leaseDurationSeconds: 300");
    env.apply(&multi_claim("ab", "a, b", ""));
    env.wait_phase("ab", ClaimPhase::Held).await;
    env.apply_claim("later-on-a", "a", "");
    env.wait_phase("later-on-a", ClaimPhase::Pending).await;

    env.kubectl(&["delete", "distributedlock", "b", "--wait=false"]);
    let ended = env.wait_phase("ab", ClaimPhase::Expired).await;
    assert_eq!(reason_of(&ended).as_deref(), Some("LockDeleted"));
    // Lock a is given back at once, not at the end of its 300 s lease.
    let later = env.wait_phase("later-on-a", ClaimPhase::Held).await;
    assert_eq!(token_on(&later, "a"), Some(2));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_naming_a_missing_lock_waits_and_holds_back_nobody() {
    let mut env = Env::started().await;
    env.apply_lock("present", "leaseDurationSeconds: 300");
    env.apply(&multi_claim("both", "absent, present", ""));
    env.wait_pending_for("both", "LockNotFound").await;
    // Queued nowhere: a later claim on the lock that exists is granted.
    env.hold("later", "present", "").await;
    let present = env.lock("present").await.status.unwrap_or_default();
    assert_eq!(present.waiting, 0, "{present:?}");
    env.wait_event("both", "LockNotFound").await;
    env.stop_controller().await;
}
