//! End to end with real kubectl against the real control plane and the controller: claim
//! priority (kept across a controller restart), arrival order to the event (claims created in
//! one second, a reader a tenth of a second behind a writer, a restart between creations),
//! the lock's maximum hold time and its lock-delay after an involuntary end, a semaphore limit
//! lowered on a live lock, and shared readers with an exclusive writer that later readers do
//! not overtake.

use crate::support;

use std::time::Duration;

use kube::api::ListParams;
use support::{arrival_of, create_from_json, phase_of, position_of, reason_of, Env, WAIT};
use tokio::time::Instant;
use turnstile_api::ClaimPhase;

/// Waits until exactly one of `candidates` holds the lock and returns its name.
async fn next_holder(env: &Env, candidates: &[String]) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let claims = env
            .claims()
            .list(&ListParams::default())
            .await
            .expect("list claims");
        let held: Vec<String> = claims
            .items
            .iter()
            .filter(|claim| phase_of(claim) == Some(ClaimPhase::Held))
            .filter_map(|claim| claim.metadata.name.clone())
            .filter(|name| candidates.contains(name))
            .collect();
        match held.as_slice() {
            [one] => return one.clone(),
            [] => assert!(
                Instant::now() < deadline,
                "none of {candidates:?} was granted"
            ),
            several => panic!("{several:?} hold a mutex at once"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_created_back_to_back_are_granted_in_arrival_order_not_name_order() {
    twenty_claims_granted_in_arrival_order(Env::started().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_created_back_to_back_are_granted_in_arrival_order_on_the_fake_too() {
    let env = Env::fake_only_started(
        "the in-memory API server's watch must deliver creations in order too",
    )
    .await;
    twenty_claims_granted_in_arrival_order(env).await;
}

/// Twenty claims created one after another in reverse name order are granted in the order
/// they were created.
async fn twenty_claims_granted_in_arrival_order(mut env: Env) {
    env.apply_lock("fifo", "leaseDurationSeconds: 300");
    env.hold("holder", "fifo", "").await;
    // c19, c18, ..., c00: reverse name order, created one after another by one `kubectl
    // apply` (so within a second or two: `creationTimestamp` cannot tell them apart).
    let created: Vec<String> = (0..20).rev().map(|n| format!("c{n:02}")).collect();
    let stream: Vec<String> = created
        .iter()
        .map(|name| {
            format!(
                "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: {name}\n\
                 spec:\n  lockName: fifo\n"
            )
        })
        .collect();
    env.apply(&stream.join("---\n"));
    let mut arrivals = Vec::new();
    for name in &created {
        let claim = env.wait_claim(name, |c| arrival_of(c).is_some()).await;
        arrivals.push(arrival_of(&claim));
    }
    assert!(
        arrivals.windows(2).all(|pair| pair[0] < pair[1]),
        "arrivals follow creation: {arrivals:?}"
    );
    // The head of the queue shows it too (positions are exact there).
    for (place, name) in created.iter().take(3).enumerate() {
        let place = i32::try_from(place).expect("small") + 1;
        env.wait_claim(name, |c| position_of(c) == Some(place))
            .await;
    }

    let mut granted = Vec::new();
    let mut holder = "holder".to_owned();
    let mut waiting = created.clone();
    while !waiting.is_empty() {
        env.delete_claim(&holder).await;
        holder = next_holder(&env, &waiting).await;
        waiting.retain(|name| *name != holder);
        granted.push(holder.clone());
    }
    assert_eq!(granted, created, "granted in the order they were created");
    env.stop_controller().await;
}

/// The claim `name` on `lock` in `mode`, created through the API (no `kubectl` start-up
/// between creations).
async fn create_claim(env: &Env, name: &str, lock: &str, mode: &str) {
    create_from_json(
        &env.claims(),
        serde_json::json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
            "metadata": {"name": name},
            "spec": {"lockName": lock, "mode": mode}
        }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_a_tenth_of_a_second_behind_a_writer_never_overtakes_it() {
    let mut env = Env::started().await;
    for round in 0..20 {
        let lock = format!("table-{round}");
        env.apply_lock(&lock, "maxHolders: 10\nleaseDurationSeconds: 300");
        for reader in ["r1", "r2"] {
            create_claim(&env, &format!("{reader}-{round}"), &lock, "Shared").await;
        }
        env.wait_held(&[&format!("r1-{round}"), &format!("r2-{round}")])
            .await;
        // Eight slots are free. "r3" sorts before "w" by name, and both are created within
        // one second: only their arrival order keeps the reader behind the writer.
        let writer = format!("w-{round}");
        let reader = format!("r3-{round}");
        create_claim(&env, &writer, &lock, "Exclusive").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        create_claim(&env, &reader, &lock, "Shared").await;
        // The positive sign that a pass has queued both, then the verdict.
        let r3 = env.wait_claim(&reader, |c| position_of(c).is_some()).await;
        let w = env.wait_claim(&writer, |c| position_of(c).is_some()).await;
        assert_eq!(
            (position_of(&w), position_of(&r3)),
            (Some(1), Some(2)),
            "round {round}: the writer first, the later reader behind it"
        );
        assert!(arrival_of(&w) < arrival_of(&r3), "round {round}");
        assert_eq!(
            phase_of(&env.claim(&reader).await),
            Some(ClaimPhase::Pending)
        );
    }
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrival_order_survives_a_controller_restart_between_creations() {
    let mut env = Env::started().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.hold("holder", "db", "").await;
    env.apply_claim("z-first", "db", "");
    let first = env.wait_claim("z-first", |c| arrival_of(c).is_some()).await;

    // A new controller (as after a restart or a leader change) sees a claim arrive.
    env.stop_controller().await;
    env.start_default_controller();
    env.a_later_claim_queues_behind("db", "holder", &first, "a-second")
        .await;
    env.stop_controller().await;
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_policies_fail_replace_the_waiting_and_cancel_the_running() {
    let mut env = Env::started().await;
    env.apply_lock("deploy", "leaseDurationSeconds: 300");
    env.hold("deploy-1", "deploy", "group: prod").await;

    // Skip if busy: no queue entry.
    env.apply_claim("check", "deploy", "whenBusy: Fail");
    let check = env.wait_phase("check", ClaimPhase::Failed).await;
    assert_eq!(reason_of(&check).as_deref(), Some("LockBusy"));
    assert_eq!(position_of(&check), None);

    // The newest waiting run of a group replaces the older one, not another group's.
    env.apply_claim("deploy-2", "deploy", "group: prod");
    env.apply_claim("staging-1", "deploy", "group: staging");
    env.wait_claim("staging-1", |c| position_of(c) == Some(2))
        .await;
    env.apply_claim(
        "deploy-3",
        "deploy",
        "group: prod\nwhenBusy: ReplacePending",
    );
    let replaced = env.wait_phase("deploy-2", ClaimPhase::Failed).await;
    assert_eq!(reason_of(&replaced).as_deref(), Some("Superseded"));
    assert_eq!(
        phase_of(&env.claim("deploy-1").await),
        Some(ClaimPhase::Held)
    );
    assert_eq!(
        phase_of(&env.claim("staging-1").await),
        Some(ClaimPhase::Pending)
    );

    // Cancel in progress: the group's holder loses its grant, with a LockLost Warning, and the
    // queue goes on in order with a higher token.
    let first = env.claim("deploy-1").await;
    env.apply_claim(
        "deploy-4",
        "deploy",
        "group: prod\nwhenBusy: CancelInProgress",
    );
    let cancelled = env.wait_phase("deploy-1", ClaimPhase::Expired).await;
    assert_eq!(reason_of(&cancelled).as_deref(), Some("Superseded"));
    env.wait_event("deploy-1", "LockLost").await;
    let deploy_3 = env.wait_phase("deploy-3", ClaimPhase::Failed).await;
    assert_eq!(reason_of(&deploy_3).as_deref(), Some("Superseded"));
    let staging = env.wait_phase("staging-1", ClaimPhase::Held).await;
    assert!(
        staging.status.and_then(|s| s.fencing_token) > first.status.and_then(|s| s.fencing_token)
    );

    // The schema refuses a replacing policy without a group, and on several locks.
    let refused = env.kubectl_apply_output(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata: {name: bad}\n\
         spec: {lockName: deploy, whenBusy: ReplacePending}\n",
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "accepted: {said}");
    assert!(
        said.contains("whenBusy ReplacePending and CancelInProgress need spec.group"),
        "{said}"
    );
    let refused = env.kubectl_apply_output(
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata: {name: bad}\n\
         spec: {lockNames: [deploy, other], whenBusy: Fail}\n",
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("whenBusy other than Wait is for a claim on one lock"),
        "{said}"
    );
    env.stop_controller().await;
}

/// A suspended Job gated on `lock`, with the extra annotations `annotations` (`key: value`
/// lines).
fn gated_job(env: &Env, name: &str, lock: &str, annotations: &str) {
    let annotations: String = annotations
        .lines()
        .map(|line| format!("    {}\n", line.trim()))
        .collect();
    env.apply(&format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  annotations:\n    turnstile.dev/lock: {lock}\n{annotations}spec:\n  suspend: true\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: main, image: busybox}}]\n"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_jobs_take_their_busy_policy_and_group_from_annotations() {
    let mut env = Env::started().await;
    env.apply_lock("deploy", "leaseDurationSeconds: 300");
    env.hold("holder", "deploy", "").await;

    // Skip if busy: the Job's claim fails at once, and the Job stays suspended, saying why.
    gated_job(&env, "check", "deploy", "turnstile.dev/when-busy: Fail");
    let check = env.wait_phase("check-deploy", ClaimPhase::Failed).await;
    assert_eq!(reason_of(&check).as_deref(), Some("LockBusy"));
    env.wait_event("check", "GateBlocked").await;

    // The newest run of a group replaces the waiting one.
    let replacing = "turnstile.dev/when-busy: ReplacePending\nturnstile.dev/group: prod";
    gated_job(&env, "deploy-a", "deploy", replacing);
    env.wait_claim("deploy-a-deploy", |claim| position_of(claim) == Some(1))
        .await;
    gated_job(&env, "deploy-b", "deploy", replacing);
    let replaced = env.wait_phase("deploy-a-deploy", ClaimPhase::Failed).await;
    assert_eq!(reason_of(&replaced).as_deref(), Some("Superseded"));
    let newest = env
        .wait_claim("deploy-b-deploy", |claim| position_of(claim) == Some(1))
        .await;
    assert_eq!(newest.spec.group.as_deref(), Some("prod"));
    env.wait_event("deploy-a", "GateBlocked").await;

    // A replacing policy without a group: no claim (the schema would refuse it), and the Job
    // says why.
    gated_job(
        &env,
        "lonely",
        "deploy",
        "turnstile.dev/when-busy: CancelInProgress",
    );
    env.wait_event("lonely", "GateBlocked").await;
    assert!(env.claim_opt("lonely-deploy").await.is_none());
    env.stop_controller().await;
}
