//! End to end: the controller survives its own restarts (memory backend: grants rebuilt from
//! the claims' statuses), forced watch 410s (each followed by a re-list, however often they
//! come) and injected 409/500 write errors — same holder,
//! same order, tokens still increasing, never a double grant.

use crate::support;

use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use support::{annotate, phase_of, position_of, token_of, Env, HolderMonitor};
use turnstile_api::{ClaimPhase, FORCE_RELEASE_ANNOTATION};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_queue_keeps_holder_order_and_tokens() {
    let mut env = Env::started().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.queue_of_three("db").await;
    let monitor = HolderMonitor::start(&env, "db", 1);

    // Restart with the holder in place: the new controller's memory backend is empty.
    env.stop_controller().await;
    env.start_default_controller();
    env.apply_claim("d", "db", "");
    env.wait_claim("d", |c| position_of(c) == Some(3)).await;
    let a = env.claim("a").await;
    assert_eq!(phase_of(&a), Some(ClaimPhase::Held), "same holder");
    assert_eq!(token_of(&a), Some(1), "same token");
    assert_eq!(position_of(&env.claim("b").await), Some(1), "same order");
    assert_eq!(position_of(&env.claim("c").await), Some(2), "same order");

    // The rebuilt grant is real: a's release hands the lock to b with a larger token.
    env.patch_claim_spec("a", serde_json::json!({"release": true}))
        .await;
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(token_of(&b), Some(2));

    // Restart again; the next grant is still above the high-water mark.
    env.stop_controller().await;
    env.start_default_controller();
    env.wait_claim("c", |c| position_of(c) == Some(1)).await;
    env.delete_claim("b").await;
    let c = env.wait_phase("c", ClaimPhase::Held).await;
    assert_eq!(token_of(&c), Some(3));
    env.wait_claim("d", |c| position_of(c) == Some(1)).await;

    let report = monitor.finish().await;
    assert_eq!(report.tokens(), [1, 2, 3]);
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_watch_410_does_not_break_anything() {
    let mut env = Env::fake_only_started("it answers watches with 410 Gone on cue").await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.queue_of_three("db").await;
    let monitor = HolderMonitor::start(&env, "db", 1);

    // Every watch must start over from a fresh list (410 Gone on resume).
    env.server().compact();
    env.server().close_watches();
    env.apply_claim("d", "db", "");
    env.wait_claim("d", |c| position_of(c) == Some(3)).await;
    env.delete_claim("a").await;
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(token_of(&b), Some(2));
    env.wait_claim("d", |c| position_of(c) == Some(2)).await;

    monitor.finish().await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watch_410_is_followed_by_a_relist_however_often_it_comes() {
    // No bookmarks: they would move the claim watch's resourceVersion past the compaction.
    let fake = FakeApiServer::builder().bookmark_interval(Duration::from_secs(3_600));
    let mut env = Env::fake_only_with("it answers watches with 410 Gone on cue", fake).await;
    env.start_default_controller();
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.hold("first", "db", "").await;
    let claim_requests = |verb: &str| {
        env.server()
            .request_log()
            .iter()
            .filter(|r| r.resource == "lockclaims" && r.verb == verb)
            .count()
    };
    // Six 410s in a row, each once the claim watch is back from the one before.
    for round in 0..6 {
        let (lists, watches) = (claim_requests("list"), claim_requests("watch"));
        // A write the claim watch does not see, then its resourceVersion compacted away.
        env.apply_lock(&format!("free-{round}"), "leaseDurationSeconds: 300");
        tokio::time::sleep(Duration::from_millis(300)).await;
        env.server().compact();
        env.server().close_watches();
        let deadline = Instant::now() + Duration::from_secs(90);
        // Re-listed, and watching again (after the resume the 410 answered).
        while claim_requests("list") <= lists || claim_requests("watch") < watches + 2 {
            assert!(Instant::now() < deadline, "round {round}: no re-list");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    env.server().compact();
    env.server().close_watches();
    let why = "a claim created after the seventh 410 waits";
    env.hold_within(Duration::from_secs(5), why, "after", "free-0")
        .await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_write_errors_are_retried_without_double_grants() {
    let mut env = Env::fake_only_started("it fails writes on cue").await;
    env.apply_lock("db", "leaseDurationSeconds: 300\nmaxHolders: 1");
    for name in ["a", "b", "c", "d"] {
        env.apply_claim(name, "db", "");
    }
    env.wait_phase("a", ClaimPhase::Held).await;
    env.wait_claim("d", |c| position_of(c) == Some(3)).await;
    let monitor = HolderMonitor::start(&env, "db", 1);

    // Conflicts on the controller's writes while the lock changes hands (the user's own
    // write to a's spec is not affected: it goes to lockclaims/a, not lockclaims/a/status).
    env.server()
        .inject_faults(&env.turnstile_path("lockclaims/a/status"), 1, 409);
    env.server()
        .inject_faults(&env.turnstile_path("lockclaims/b"), 3, 409);
    env.patch_claim_spec("a", serde_json::json!({"release": true}))
        .await;
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(token_of(&b), Some(2));
    env.wait_phase("a", ClaimPhase::Released).await;
    // b is released next: the monitor must have sampled its grant first.
    monitor.wait_seen(2).await;

    // Server errors on a claim and on the lock's status.
    env.server()
        .inject_faults(&env.turnstile_path("lockclaims/c"), 3, 500);
    env.server()
        .inject_faults(&env.turnstile_path("distributedlocks/db/status"), 2, 500);
    env.patch_claim_spec("b", serde_json::json!({"release": true}))
        .await;
    let c = env.wait_phase("c", ClaimPhase::Held).await;
    assert_eq!(token_of(&c), Some(3));
    env.wait_claim("d", |c| position_of(c) == Some(1)).await;
    env.wait_lock("db", |lock| {
        lock.status
            .as_ref()
            .is_some_and(|s| s.fencing_token == Some(3) && s.waiting == 1)
    })
    .await;
    let faults = env
        .server()
        .request_log()
        .iter()
        .filter(|request| request.injected_fault)
        .count();
    assert_eq!(faults, 9, "every injected fault was hit");

    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = monitor.finish().await;
    assert_eq!(report.tokens(), [1, 2, 3]);
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_status_write_that_fails_after_a_force_release_loses_no_event() {
    let mut env = Env::fake_only_started("it fails writes on cue").await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.hold("a", "db", "").await;
    // The pass writes a's status (Expired) and then the lock's, which fails: the retry sees
    // a already Expired and plans no Event for it, so the lock's Event must go out with a's.
    let lock_status = env.turnstile_path("distributedlocks/db/status");
    env.server().inject_faults(&lock_status, 1, 500);
    annotate(&env.claims(), "a", FORCE_RELEASE_ANNOTATION, "stuck").await;
    env.wait_phase("a", ClaimPhase::Expired).await;
    env.wait_event("db", "ForceReleased").await;
    env.wait_event("a", "LockLost").await;
    let hit = env
        .server()
        .request_log()
        .iter()
        .any(|request| request.injected_fault && request.path == lock_status);
    assert!(hit, "the lock's status write failed once");
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_after_the_servers_retry_after() {
    let mut env = Env::fake_only_started("it answers 429 with a Retry-After on cue").await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.hold("a", "db", "").await;
    let status_path = env.turnstile_path("lockclaims/b/status");
    // The fake answers 429 with `Retry-After: 1`, as API priority and fairness does.
    env.server().inject_faults(&status_path, 1, 429);
    let start = env.server().request_log().len();
    env.apply_claim("b", "db", "");
    let created = std::time::Instant::now();
    env.wait_claim("b", |c| position_of(c) == Some(1)).await;
    let waited = created.elapsed();
    // The fake logs a request once it has answered, so the write that made b's status may
    // show a moment after the status itself.
    let answers = || -> Vec<u16> {
        env.server().request_log()[start..]
            .iter()
            .filter(|request| request.path == status_path)
            .map(|request| request.status)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !answers().contains(&200) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answers = answers();
    assert_eq!(answers.first(), Some(&429), "{answers:?}");
    assert!(answers.contains(&200), "retried after the 429: {answers:?}");
    assert!(
        waited >= Duration::from_millis(900),
        "the retry came {waited:?} after the create, before the server's Retry-After of 1 s"
    );
    env.stop_controller().await;
}
