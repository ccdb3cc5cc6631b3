//! End to end: a claim owned by a Pod (as `turnstile wait --create` makes them) is renewed by
//! the controller while the Pod runs and released when it finishes; a Job owner likewise;
//! a deleted Pod takes its claim with it (garbage collection) and the lock moves on.
//!
//! The controller watches Pods and Jobs, so an owner's end is acted on at once: with a 300 s
//! lease (renewal checks every 150 s) the next claim must be `Held` within [`HANDOFF`].

use crate::support;

use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use serde_json::json;
use support::jobs::{finish_job, held_pods, job_owning_a_claim};
use support::pods::{create_pod, owned_claim, pods, set_pod_phase};
use support::{annotate, phase_of, position_of, reason_of, token_of, Env};
use turnstile_api::ClaimPhase;

/// How soon after its owner ends a claim must be released and the next one granted: far
/// below the 300 s leases (and the 150 s renewal checks) of the tests that measure it, with
/// room for a loaded CI machine.
const HANDOFF: Duration = Duration::from_secs(15);

/// Waits for a pass over lock `db` after the setup (a positive sign, see
/// `Env::after_a_pass_over`), so that what follows is noticed because of the owner, not by a
/// pass of the setup's that happened to be on its way.
async fn settle(env: &Env) {
    env.after_a_pass_over(&["db"]).await;
}

/// Asserts that `since` is less than [`HANDOFF`] ago.
fn assert_prompt(since: Instant, what: &str) {
    let took = since.elapsed();
    assert!(
        took < HANDOFF,
        "{what} took {took:?}: the owner's end was not acted on promptly"
    );
}

/// A Pod `name` in phase `Running`; returns its uid.
async fn start_pod(env: &Env, name: &str) -> String {
    let uid = create_pod(env, name).await;
    set_pod_phase(env, name, "Running").await;
    uid
}

async fn delete_pod(env: &Env, name: &str, params: &DeleteParams) {
    pods(env).delete(name, params).await.expect("delete pod");
}

/// A running Pod `pod` whose claim `<pod>-db` holds lock `db` (with `lease_line`), and a
/// claim `next` queued behind it. Returns the Pod's uid and its held claim.
async fn pod_holds_with_one_waiting(
    env: &Env,
    pod: &str,
    lease_line: &str,
) -> (String, turnstile_api::LockClaim) {
    env.apply_lock("db", lease_line);
    let uid = start_pod(env, pod).await;
    let claim = format!("{pod}-db");
    env.apply(&owned_claim(&claim, "db", "Pod", "v1", pod, &uid));
    env.apply_claim("next", "db", "");
    let held = env.wait_phase(&claim, ClaimPhase::Held).await;
    let next = env.wait_claim("next", |c| position_of(c) == Some(1)).await;
    assert_eq!(reason_of(&next).as_deref(), Some("Queued"));
    (uid, held)
}

fn expires_at(claim: &turnstile_api::LockClaim) -> Option<k8s_openapi::jiff::Timestamp> {
    claim.status.as_ref()?.expires_at.as_ref().map(|t| t.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_keeps_its_claim_and_finishing_releases_it() {
    let mut env = Env::started().await;
    let (_, first) = pod_holds_with_one_waiting(&env, "worker-1", "leaseDurationSeconds: 3").await;

    // Over three leases go by without anyone touching spec.renewTime.
    // Time: three leases go by: the controller must renew the running Pod's claim meanwhile.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let renewed = env.claim("worker-1-db").await;
    assert_eq!(phase_of(&renewed), Some(ClaimPhase::Held));
    assert!(
        expires_at(&renewed) > expires_at(&first),
        "the lease moved on"
    );
    assert_eq!(
        token_of(&renewed),
        token_of(&first),
        "same grant, same token"
    );
    assert_eq!(
        phase_of(&env.claim("next").await),
        Some(ClaimPhase::Pending),
        "the next claim still waits"
    );
    env.wait_event("worker-1-db", "Renewed").await;

    set_pod_phase(&env, "worker-1", "Succeeded").await;
    let done = env.wait_phase("worker-1-db", ClaimPhase::Released).await;
    assert_eq!(reason_of(&done).as_deref(), Some("OwnerFinished"));
    env.wait_phase("next", ClaimPhase::Held).await;
    env.stop_controller().await;
}

/// A Job-owned claim, held, released once the Job gets the `condition` (`Complete` or `Failed`).
async fn a_finished_job_releases_its_claim(condition: &str) {
    let mut env = Env::started().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    // Its Pods wait unscheduled until finish_job ends the Job (see support::jobs).
    let job = json!({
        "metadata": {"name": "migrate"},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "nodeSelector": held_pods(&env),
            "containers": [{"name": "main", "image": "busybox"}]
        }}}
    });
    job_owning_a_claim(&env, job, "migrate-db", "db").await;
    env.wait_phase("migrate-db", ClaimPhase::Held).await;
    settle(&env).await;

    finish_job(&env, "migrate", condition).await;
    let finished = Instant::now();
    // Nothing about the claim changed: only the Job watch can tell the controller.
    let done = env.wait_phase("migrate-db", ClaimPhase::Released).await;
    assert_prompt(
        finished,
        &format!("releasing the claim of a Job that is {condition}"),
    );
    assert_eq!(reason_of(&done).as_deref(), Some("OwnerFinished"));
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_job_releases_its_claim() {
    a_finished_job_releases_its_claim("Complete").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_releases_its_claim() {
    a_finished_job_releases_its_claim("Failed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_takes_its_claim_and_the_lock_moves_on() {
    let mut env = Env::started().await;
    pod_holds_with_one_waiting(&env, "worker-2", "leaseDurationSeconds: 300").await;

    delete_pod(&env, "worker-2", &DeleteParams::default()).await;
    let deleted = Instant::now();
    env.wait_gone("worker-2-db").await;
    env.wait_phase("next", ClaimPhase::Held).await;
    assert_prompt(
        deleted,
        "handing the lock on after the owner Pod was deleted",
    );
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pod_hands_the_lock_on_long_before_its_lease_ends() {
    let mut env = Env::started().await;
    let (_, first) =
        pod_holds_with_one_waiting(&env, "worker-3", "leaseDurationSeconds: 300").await;

    settle(&env).await;
    set_pod_phase(&env, "worker-3", "Failed").await;
    let failed = Instant::now();
    let next = env.wait_phase("next", ClaimPhase::Held).await;
    assert_prompt(failed, "handing the lock on after the owner Pod failed");
    let done = env.claim("worker-3-db").await;
    assert_eq!(phase_of(&done), Some(ClaimPhase::Released));
    assert_eq!(reason_of(&done).as_deref(), Some("OwnerFinished"));
    assert!(token_of(&next) > token_of(&first));

    // Running Pods are not watched: every Pod list/watch filters on finished phases, or (the
    // Pod gate's) on the gate label.
    if let Some(fake) = &env.fake {
        let pod_reads: Vec<_> = fake
            .request_log()
            .into_iter()
            .filter(|r| r.resource == "pods" && matches!(r.verb.as_str(), "list" | "watch"))
            .collect();
        assert!(!pod_reads.is_empty(), "the controller watches Pods");
        for read in &pod_reads {
            let query = read
                .query
                .replace("%21", "!")
                .replace("%3D", "=")
                .replace("%2F", "/");
            assert!(
                query.contains("status.phase!=Running")
                    || query.contains("labelSelector=turnstile.dev/lock"),
                "a Pod {} without the finished-phase or gate-label selector: {}",
                read.verb,
                read.query
            );
        }
    }
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_owned_waiters_cost_no_api_lookup_per_pass() {
    let env = Env::fake_only("its request log counts the Pod lookups").await;
    let controller = env.spawn_controller(Default::default());
    env.apply_lock("db", "leaseDurationSeconds: 300");
    const WAITERS: usize = 20;
    for n in 0..=WAITERS {
        let pod = format!("worker-{n:02}");
        let uid = start_pod(&env, &pod).await;
        env.apply(&owned_claim(
            &format!("{pod}-db"),
            "db",
            "Pod",
            "v1",
            &pod,
            &uid,
        ));
    }
    env.wait_phase("worker-00-db", ClaimPhase::Held).await;
    let last = format!("worker-{WAITERS:02}-db");
    env.wait_claim(&last, |c| position_of(c).is_some()).await;
    settle(&env).await;

    let start = env.server().request_log().len();
    set_pod_phase(&env, "worker-00", "Succeeded").await;
    env.wait_phase("worker-01-db", ClaimPhase::Held).await;
    settle(&env).await;
    let pod_gets = env.server().request_log()[start..]
        .iter()
        .filter(|r| r.resource == "pods" && r.verb == "get")
        .count();
    println!("Pod GETs for one hand-off among {WAITERS} Pod-owned waiters: {pod_gets}");
    // Before, every pass looked up every waiter's Pod: 20 GETs and more per hand-off. Now
    // the waiters' states come from the watches, and only a holder's Pod is looked up.
    assert!(
        pod_gets <= 4,
        "{pod_gets} Pod GETs for one hand-off among {WAITERS} Pod-owned waiters"
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaning_pod_delete_leaves_a_plain_claim_that_runs_out() {
    let mut env = Env::started().await;
    pod_holds_with_one_waiting(&env, "worker-4", "leaseDurationSeconds: 4").await;
    // Orphaning strips the owner reference from the claim: nobody renews it any more.
    delete_pod(&env, "worker-4", &DeleteParams::orphan()).await;
    let done = env.wait_phase("worker-4-db", ClaimPhase::Expired).await;
    assert_eq!(reason_of(&done).as_deref(), Some("LeaseExpired"));
    env.wait_phase("next", ClaimPhase::Held).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaning_pod_delete_seen_before_the_claims_change_keeps_the_grant() {
    let mut env = Env::fake_only("it delays the claims' watch events to order the race").await;
    // The claims' changes reach the controller 1.5 s late; a holder's Pod is looked up at
    // once. So after an orphaning delete a pass finds the Pod gone while its cache still
    // shows the claim's owner reference, which the garbage collector removed before the Pod.
    env.server()
        .delay_watch_events("lockclaims", Duration::from_millis(1500));
    env.start_default_controller();
    let (_, held) = pod_holds_with_one_waiting(&env, "worker-5", "leaseDurationSeconds: 20").await;
    settle(&env).await;
    delete_pod(&env, "worker-5", &DeleteParams::orphan()).await;
    // Wakes the lock's pass while the claim's change is still on its way.
    annotate(&env.locks(), "db", "test/wake", "1").await;
    // Once a pass has seen the claim's change (the marker's event comes after it, through the
    // same delayed watch): the plain claim still holds the same grant (its lease runs on);
    // nothing was released on the stale view and taken again.
    env.after_a_pass_over(&["db"]).await;
    let claim = env.claim("worker-5-db").await;
    assert!(claim
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .is_empty());
    assert_eq!(
        phase_of(&claim),
        Some(ClaimPhase::Held),
        "{:?}",
        claim.status
    );
    assert_eq!(token_of(&claim), token_of(&held));
    let reasons = env.event_reasons("worker-5-db").await;
    assert!(
        !reasons.iter().any(|r| r == "LockLost" || r == "Released"),
        "{reasons:?}"
    );
    assert_eq!(
        phase_of(&env.claim("next").await),
        Some(ClaimPhase::Pending)
    );
    env.stop_controller().await;
}
