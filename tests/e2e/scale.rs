//! The operator's cost shape, counted on the fake API server (counts, not timings): a hand-off
//! costs three object writes whether 50 or 400 claims wait behind it, a burst of hand-offs one
//! refresh of the positions a little later, after which the head of the queue shows exact
//! positions and exactly two stale ones behind it are up to date; every waiter's position
//! stays an upper bound, and a claim joining behind hundreds shows its exact place at once; a
//! new waiting claim costs four writes.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fake_apiserver::RecordedRequest;
use kube::api::{DeleteParams, PostParams};
use support::actor::{requests_of, tagged_client};
use support::scrape::{self, free_addr};
use support::{phase_of, position_of, Env, RunningController, WAIT};
use turnstile_api::{ClaimPhase, DistributedLock, LockClaim, LockClaimSpec};
use turnstile_controller::core::{EXACT_POSITIONS, POSITION_REFRESHES_PER_PASS};
use turnstile_controller::{ControllerConfig, EventPolicy};

const CONTROLLER: &str = "controller";
/// Hand-offs measured per queue depth.
const HAND_OFFS: usize = 3;

fn claim_name(index: usize) -> String {
    format!("c{index:04}")
}

fn is_write(request: &RecordedRequest) -> bool {
    matches!(
        request.verb.as_str(),
        "create" | "update" | "patch" | "delete"
    )
}

/// The default controller, its requests tagged [`CONTROLLER`] in the fake's log.
fn spawn_tagged_controller(env: &Env) -> RunningController {
    env.spawn_controller_with(
        tagged_client(env.server(), CONTROLLER),
        ControllerConfig::default(),
    )
}

/// [`Env::fake_only`] (its request log counts the controller's writes) with
/// [`spawn_tagged_controller`]'s controller running.
async fn fake_only_tagged() -> (Env, RunningController) {
    let env = Env::fake_only("its request log counts the controller's writes").await;
    let controller = spawn_tagged_controller(&env);
    (env, controller)
}

/// [`fake_only_tagged`] with lock `db` and claims `a` (held), `b` and `c` (waiting).
async fn tagged_with_a_queue_of_three() -> (Env, RunningController) {
    let (env, controller) = fake_only_tagged().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.queue_of_three("db").await;
    (env, controller)
}

/// The controller's writes (Events included) in the fake's log so far.
fn controller_writes(env: &Env) -> Vec<RecordedRequest> {
    requests_of(&env.server().request_log(), CONTROLLER)
        .into_iter()
        .filter(is_write)
        .collect()
}

/// The writes among `writes` that met a conflict (409), as `METHOD path`.
fn conflicts(writes: &[RecordedRequest]) -> Vec<String> {
    writes
        .iter()
        .filter(|request| request.status == 409)
        .map(|request| format!("{} {}", request.method, request.path))
        .collect()
}

/// Waits until the controller has written nothing for `quiet`, then returns its writes.
async fn settled_writes(env: &Env, quiet: Duration) -> Vec<RecordedRequest> {
    let deadline = Instant::now() + WAIT;
    let mut last = controller_writes(env).len();
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = controller_writes(env).len();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return controller_writes(env);
        }
        assert!(Instant::now() < deadline, "the controller never settled");
    }
}

/// Creates lock `name` (lease 300 s) through the API (not kubectl: hundreds are quick).
async fn create_lock(env: &Env, name: &str) {
    let lock: DistributedLock = serde_json::from_value(serde_json::json!({
        "apiVersion": "turnstile.dev/v1alpha1", "kind": "DistributedLock",
        "metadata": {"name": name},
        "spec": {"leaseDurationSeconds": 300}
    }))
    .expect("lock");
    env.locks()
        .create(&PostParams::default(), &lock)
        .await
        .expect("create lock");
}

/// Creates claim `name` on `lock` through the API.
async fn create_claim(env: &Env, name: &str, lock: &str) {
    let claim: LockClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
        "metadata": {"name": name},
        "spec": {"lockName": lock}
    }))
    .expect("claim");
    env.claims()
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
}

/// A lock with one holder and `waiters` claims queued behind it; returns the controller's
/// writes for each of [`HAND_OFFS`] hand-offs (the holder's claim deleted, the next one `Held`).
async fn writes_per_hand_off(waiters: usize) -> Vec<HandOffWrites> {
    let (env, controller) = fake_only_tagged().await;
    create_lock(&env, "db").await;
    for index in 0..=waiters {
        create_claim(&env, &claim_name(index), "db").await;
    }
    env.wait_phase(&claim_name(0), ClaimPhase::Held).await;
    env.wait_lock("db", |lock| {
        lock.status.as_ref().map(|status| status.waiting) == Some(waiters as i32)
    })
    .await;
    // Settled: the head's positions refreshed after the first grant.
    env.wait_claim(&claim_name(1), |claim| position_of(claim) == Some(1))
        .await;
    settled_writes(&env, Duration::from_millis(500)).await;

    let mut counts = Vec::new();
    // (During the set-up the claim controller may race the lock controller for a claim
    // created before its lock was cached: only the hand-offs are judged.)
    let hand_offs_start = controller_writes(&env).len();
    for hand_off in 0..HAND_OFFS {
        let before = controller_writes(&env).len();
        env.claims()
            .delete(&claim_name(hand_off), &DeleteParams::default())
            .await
            .expect("delete holder");
        env.wait_phase(&claim_name(hand_off + 1), ClaimPhase::Held)
            .await;
        // The next hand-off follows within a second of this grant, before the positions'
        // refresh is due (POSITION_REFRESH_DELAY after it): each window holds one hand-off.
        let after = settled_writes(&env, Duration::from_millis(500)).await;
        counts.push(HandOffWrites::of(&after[before..]));
    }
    // A burst of hand-offs costs one refresh of the positions, a little after the last grant.
    let before_refresh = controller_writes(&env).len();
    env.wait_claim(&claim_name(HAND_OFFS + 1), |claim| {
        position_of(claim) == Some(1)
    })
    .await;
    let after = settled_writes(&env, Duration::from_millis(500)).await;
    let refresh = HandOffWrites::of(&after[before_refresh..]);
    assert_eq!(refresh.events, 0, "a refresh announces nothing");
    assert!(
        refresh.objects <= EXACT_POSITIONS as usize + POSITION_REFRESHES_PER_PASS,
        "{waiters} waiters: the refresh wrote {} objects",
        refresh.objects
    );
    // A pass woken by the echo of its predecessor's first write waits for the rest
    // (`own_writes`), so it never writes from objects it has already changed: no 409s.
    let conflicts = conflicts(&controller_writes(&env)[hand_offs_start..]);
    assert!(
        conflicts.is_empty(),
        "{waiters} waiters: the controller's writes met conflicts: {conflicts:?}"
    );

    // Positions: exact at the head, never below the truth further back.
    let lock = env.lock("db").await;
    assert_eq!(
        lock.status.as_ref().map(|status| status.waiting),
        Some((waiters - HAND_OFFS) as i32),
        "status.waiting stays exact"
    );
    // The lock's history recorded each ended grant within those same writes.
    let history: Vec<(String, i64, String)> = lock
        .status
        .as_ref()
        .map(|status| status.history.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|past| (past.claim, past.fencing_token, past.reason))
        .collect();
    let expected: Vec<(String, i64, String)> = (0..HAND_OFFS)
        .map(|index| {
            (
                claim_name(index),
                index as i64 + 1,
                "ClaimDeleted".to_owned(),
            )
        })
        .collect();
    assert_eq!(history, expected, "{waiters} waiters: the lock's history");
    let mut exact_behind_the_head = Vec::new();
    for (place, index) in (HAND_OFFS + 1..=waiters).enumerate() {
        let claim = env.claim(&claim_name(index)).await;
        assert_eq!(phase_of(&claim), Some(ClaimPhase::Pending));
        let exact = place as i32 + 1;
        let shown = position_of(&claim).expect("a waiter shows a position");
        if exact <= EXACT_POSITIONS {
            assert_eq!(shown, exact, "{} at the head", claim_name(index));
        } else {
            assert!(
                shown >= exact,
                "{} shows {shown}, is {exact}",
                claim_name(index)
            );
            if shown == exact {
                exact_behind_the_head.push(claim_name(index));
            }
        }
    }
    // The hand-offs moved every waiter up; behind the head only the ones the refresh
    // reached show the truth.
    assert_eq!(
        exact_behind_the_head.len(),
        POSITION_REFRESHES_PER_PASS,
        "{waiters} waiters: refreshed after the last hand-off: {exact_behind_the_head:?}"
    );

    // A claim joining the queue shows its exact place at once, however deep.
    create_claim(&env, "late", "db").await;
    let late = env
        .wait_claim("late", |claim| position_of(claim).is_some())
        .await;
    assert_eq!(
        position_of(&late),
        Some((waiters - HAND_OFFS + 1) as i32),
        "the first position written for a claim joining behind {} waiters",
        waiters - HAND_OFFS
    );
    controller.stop().await;
    counts
}

/// The controller's writes as `verb resource[/subresource]`, sorted.
fn shapes(writes: &[RecordedRequest]) -> Vec<String> {
    let mut shapes: Vec<String> = writes
        .iter()
        .map(|request| {
            let resource = if request.subresource.is_empty() {
                request.resource.clone()
            } else {
                format!("{}/{}", request.resource, request.subresource)
            };
            format!("{} {resource}", request.verb)
        })
        .collect();
    shapes.sort();
    shapes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_waiting_claim_costs_four_writes() {
    let (env, controller) = fake_only_tagged().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.hold("holder", "db", "").await;
    let before = settled_writes(&env, Duration::from_millis(500)).await.len();

    env.apply_claim("waiter", "db", "");
    env.wait_claim("waiter", |claim| position_of(claim) == Some(1))
        .await;
    let after = settled_writes(&env, Duration::from_millis(500)).await;
    // Its finalizer, its status, the lock's `waiting`, one `Queued` Event.
    assert_eq!(
        shapes(&after[before..]),
        [
            "create events",
            "patch distributedlocks/status",
            "patch lockclaims",
            "patch lockclaims/status",
        ],
        "{:?}",
        &after[before..]
    );
    controller.stop().await;
}

/// A claim created with the controller's finalizer (as Turnstile's own clients create them):
/// its grant is one write to it, its status; its whole uncontended life four object writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_created_with_the_finalizer_is_granted_in_one_write() {
    let (env, controller) = fake_only_tagged().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let before = settled_writes(&env, Duration::from_millis(500)).await.len();

    let claim = LockClaim::new("a", LockClaimSpec::for_lock("db")).with_release_finalizer();
    env.claims()
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    env.wait_phase("a", ClaimPhase::Held).await;
    let granted = settled_writes(&env, Duration::from_millis(500)).await;
    assert_eq!(
        shapes(&granted[before..]),
        [
            "create events",
            "patch distributedlocks/status",
            "patch lockclaims/status",
        ],
        "no finalizer write before the grant: {:?}",
        &granted[before..]
    );

    env.delete_claim("a").await;
    env.wait_gone("a").await;
    let ended = settled_writes(&env, Duration::from_millis(500)).await;
    let objects = ended[before..]
        .iter()
        .filter(|request| request.resource != "events")
        .count();
    assert_eq!(objects, 4, "{:?}", &ended[before..]);
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_per_hand_off_do_not_grow_with_the_queue() {
    let shallow = writes_per_hand_off(50).await;
    let deep = writes_per_hand_off(400).await;
    println!("controller writes per hand-off: 50 waiters {shallow:?}, 400 waiters {deep:?}");
    for (waiters, counts) in [(50, &shallow), (400, &deep)] {
        for count in counts {
            // The new holder's status, the lock's status (with the ended grant in its
            // history), the old holder's finalizer: no waiter (before positions were bounded
            // a hand-off rewrote every one, ~N writes).
            assert_eq!(count.objects, 3, "{waiters} waiters: {counts:?}");
            // `Released` and `Acquired`.
            assert!(count.events <= 2, "{waiters} waiters: {counts:?}");
        }
    }
}

/// One hand-off's controller writes: to objects, and Events (counted apart).
#[derive(Debug)]
struct HandOffWrites {
    objects: usize,
    events: usize,
}

impl HandOffWrites {
    fn of(writes: &[RecordedRequest]) -> Self {
        let events = writes
            .iter()
            .filter(|request| request.resource == "events")
            .count();
        Self {
            objects: writes.len() - events,
            events,
        }
    }
}

/// Claims cached but finished long ago, on locks that no longer exist: the history a busy
/// cluster keeps.
const ARCHIVED: usize = 10_000;

fn archived_claim(namespace: &str, index: usize) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "turnstile.dev/v1alpha1",
        "kind": "LockClaim",
        "metadata": {
            "name": format!("archived-{index:05}"), "namespace": namespace,
            "uid": format!("archived-uid-{index}"),
            "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1,
        },
        "spec": {"lockName": format!("gone-{}", index % 1000), "holderIdentity": "job"},
        "status": {
            "phase": "Released", "reason": "ReleaseRequested", "message": "released",
            "observedGeneration": 1,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_among_ten_thousand_cached_claims_touches_only_its_own() {
    let env = Env::fake_only("its request log counts the pass's requests").await;
    for index in 0..ARCHIVED {
        env.server().store_unvalidated(
            "turnstile.dev",
            "lockclaims",
            &env.namespace,
            archived_claim(&env.namespace, index),
        );
    }
    let controller = spawn_tagged_controller(&env);
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.queue_of_three("db").await;
    let before = settled_writes(&env, Duration::from_millis(500)).await;
    assert!(
        before.iter().all(|write| !write.path.contains("archived-")),
        "the controller wrote to a finished claim of a deleted lock"
    );

    let start = env.server().request_log().len();
    env.delete_claim("a").await;
    env.wait_phase("b", ClaimPhase::Held).await;
    settled_writes(&env, Duration::from_millis(500)).await;
    let hand_off: Vec<RecordedRequest> =
        requests_of(&env.server().request_log()[start..], CONTROLLER)
            .into_iter()
            .filter(|request| request.verb != "watch")
            .collect();
    let described: Vec<String> = hand_off
        .iter()
        .map(|request| format!("{} {}", request.verb, request.path))
        .collect();
    println!(
        "one hand-off among {ARCHIVED} cached claims: {} requests: {described:?}",
        hand_off.len()
    );
    assert!(
        hand_off
            .iter()
            .all(|request| is_write(request) && !request.path.contains("archived-")),
        "a pass reads from its caches and writes only its own lock's objects: {described:?}"
    );
    assert!(
        hand_off.len() <= 12,
        "a hand-off costs a small constant: {described:?}"
    );
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_re_syncs_without_writing() {
    let (env, controller) = tagged_with_a_queue_of_three().await;
    settled_writes(&env, Duration::from_millis(500)).await;
    controller.stop().await;
    let before = controller_writes(&env).len();

    // A new controller (fresh caches, fresh memory backend rebuilt from the statuses) finds
    // everything as it should be: nothing to write. Judged once it has finished a pass of the
    // lock (the positive sign that it looked), not after a guessed wait.
    let metrics = free_addr();
    let restarted = spawn_with_events(&env, EventPolicy::default(), metrics);
    scrape::passed_since(metrics, "lock", 0.0, WAIT).await;
    let after = settled_writes(&env, Duration::from_millis(500)).await;
    let extra: Vec<String> = after[before..]
        .iter()
        .map(|request| format!("{} {}", request.verb, request.path))
        .collect();
    assert!(extra.is_empty(), "the re-sync wrote: {extra:?}");
    assert_eq!(phase_of(&env.claim("a").await), Some(ClaimPhase::Held));
    restarted.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watch_per_kind_and_pods_only_through_selectors() {
    let (env, controller) = tagged_with_a_queue_of_three().await;
    env.delete_claim("a").await;
    env.wait_phase("b", ClaimPhase::Held).await;
    settled_writes(&env, Duration::from_millis(500)).await;

    let requests = requests_of(&env.server().request_log(), CONTROLLER);
    let mut watches: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for request in requests.iter().filter(|request| request.verb == "watch") {
        watches
            .entry(request.resource.as_str())
            .or_default()
            .push(request.query.as_str());
    }
    let count = |resource: &str| watches.get(resource).map_or(0, Vec::len);
    // Every consumer of claims and Jobs shares one watch; locks have one of their own.
    assert_eq!(count("lockclaims"), 1, "{watches:#?}");
    assert_eq!(count("jobs"), 1, "{watches:#?}");
    assert_eq!(count("distributedlocks"), 1, "{watches:#?}");
    // Pods: the labelled ones (gating) and the finished ones (owners), never all of them.
    assert_eq!(count("pods"), 2, "{watches:#?}");
    let pod_reads: Vec<&str> = requests
        .iter()
        .filter(|request| request.resource == "pods" && request.name.is_empty())
        .map(|request| request.query.as_str())
        .collect();
    let by_label = |query: &&str| query.contains("labelSelector=turnstile.dev%2Flock");
    let by_phase = |query: &&str| query.contains("fieldSelector=status.phase");
    assert!(
        pod_reads
            .iter()
            .all(|query| by_label(query) || by_phase(query)),
        "a list or watch of every Pod: {pod_reads:#?}"
    );
    assert!(
        watches["pods"].iter().any(by_label) && watches["pods"].iter().any(by_phase),
        "{watches:#?}"
    );
    controller.stop().await;
}

/// Locks changed at once in the concurrency test.
const BURST: usize = 40;

/// The most requests of `requests` in flight at one instant.
fn most_in_flight(requests: &[RecordedRequest]) -> usize {
    // (when, +1 at arrival / -1 at the answer); answers sort before arrivals at one instant.
    let mut edges: Vec<(Instant, i32)> = requests
        .iter()
        .flat_map(|request| [(request.received, 1), (request.answered, -1)])
        .collect();
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_sixteen_passes_write_at_once() {
    let env = Env::fake_only("it holds writes open to count those in flight").await;
    for index in 0..BURST {
        create_lock(&env, &format!("burst-{index}")).await;
        create_claim(&env, &format!("claim-{index}"), &format!("burst-{index}")).await;
    }
    // Every request answered a second late: each pass's writes stay in flight long enough
    // to overlap with every other pass's that runs at the same time.
    env.server().slow_down(
        "/apis/turnstile.dev",
        Duration::from_secs(120),
        Duration::from_secs(1),
    );
    let controller = spawn_tagged_controller(&env);
    // One list a round (each read is a second late too).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let held = env.held_count().await;
        if held == BURST {
            break;
        }
        assert!(Instant::now() < deadline, "{held} of {BURST} claims held");
    }
    let writes: Vec<RecordedRequest> = controller_writes(&env)
        .into_iter()
        .filter(|request| request.api_group == "turnstile.dev")
        .collect();
    let most = most_in_flight(&writes);
    println!("{BURST} locks at once, every request 1 s late: at most {most} writes in flight");
    assert!(most <= 16, "{most} passes wrote at once");
    // The bound was reached, not just respected by a slow start.
    assert!(most >= 8, "only {most} writes ever overlapped");
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_after_a_hand_off_waits_for_its_writes_even_when_the_lock_cache_lags() {
    let env = Env::fake_only("it delays the locks' watch events").await;
    // The lock's status reaches the controller 400 ms after it was written, the claims' at
    // once: the claim events of a hand-off wake the lock's next pass while its cache still
    // shows the lock as it was. Without the wait for its own writes that pass writes the
    // lock's status from a stale resourceVersion and meets 409s.
    env.server()
        .delay_watch_events("distributedlocks", Duration::from_millis(400));
    let controller = spawn_tagged_controller(&env);
    env.apply_lock("db", "leaseDurationSeconds: 300");
    for index in 0..6 {
        env.apply_claim(&claim_name(index), "db", "");
    }
    env.wait_phase(&claim_name(0), ClaimPhase::Held).await;
    settled_writes(&env, Duration::from_millis(1000)).await;
    let start = controller_writes(&env).len();
    for index in 0..5 {
        env.delete_claim(&claim_name(index)).await;
        env.wait_phase(&claim_name(index + 1), ClaimPhase::Held)
            .await;
    }
    let writes = settled_writes(&env, Duration::from_millis(1000)).await;
    let conflicts = conflicts(&writes[start..]);
    assert!(
        conflicts.is_empty(),
        "hand-offs met conflicts: {conflicts:?}"
    );
    controller.stop().await;
}

/// A controller publishing `events` and serving its metrics on `metrics`, its requests
/// tagged [`CONTROLLER`].
fn spawn_with_events(env: &Env, events: EventPolicy, metrics: SocketAddr) -> RunningController {
    env.spawn_controller_with(
        tagged_client(env.server(), CONTROLLER),
        ControllerConfig {
            events,
            metrics_addr: Some(metrics),
            ..ControllerConfig::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_warnings_only_a_hand_off_publishes_no_event_and_a_warning_still_goes_out() {
    let env = Env::fake_only("its request log counts the controller's writes").await;
    let controller = spawn_with_events(
        &env,
        EventPolicy {
            normal: false,
            ..EventPolicy::default()
        },
        free_addr(),
    );
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.queue_of_three("db").await;
    let before = settled_writes(&env, Duration::from_millis(500)).await.len();
    env.delete_claim("a").await;
    env.wait_phase("b", ClaimPhase::Held).await;
    let after = settled_writes(&env, Duration::from_millis(500)).await;
    assert_eq!(
        shapes(&after[before..]),
        [
            "patch distributedlocks/status",
            "patch lockclaims",
            "patch lockclaims/status",
        ],
        "{:?}",
        &after[before..]
    );
    // A claim for a lock that does not exist is a Warning: it still goes out.
    env.apply_claim("typo", "no-such-lock", "");
    env.wait_event("typo", "LockNotFound").await;
    let normal: Vec<Option<String>> = env
        .events()
        .await
        .into_iter()
        .filter(|event| event.type_.as_deref() != Some("Warning"))
        .map(|event| event.reason)
        .collect();
    assert!(normal.is_empty(), "Normal Events published: {normal:?}");
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn normal_events_beyond_the_budget_are_skipped_and_counted() {
    let env = Env::fake_only("its request log counts the controller's writes").await;
    let metrics = free_addr();
    let controller = spawn_with_events(
        &env,
        EventPolicy {
            normal: true,
            normal_per_second: 1,
        },
        metrics,
    );
    // 20 new locks, each granted to one claim at once: 20 `Ready` and 20 `Acquired` Events
    // asked for, a budget of 5 at once and 1 a second.
    let start = Instant::now();
    for index in 0..20 {
        create_lock(&env, &format!("lock-{index}")).await;
        create_claim(&env, &claim_name(index), &format!("lock-{index}")).await;
    }
    for index in 0..20 {
        env.wait_phase(&claim_name(index), ClaimPhase::Held).await;
    }
    settled_writes(&env, Duration::from_millis(500)).await;
    let seconds = start.elapsed().as_secs();
    let normal = env
        .events()
        .await
        .into_iter()
        .filter(|event| event.type_.as_deref() == Some("Normal"))
        .count();
    println!("{normal} Normal Events published in {seconds} s");
    assert!(normal >= 5, "the burst goes out: {normal}");
    let most = usize::try_from(5 + seconds + 1).expect("small");
    assert!(
        normal <= most,
        "{normal} Normal Events in {seconds} s on a budget of 1 a second, 5 at once"
    );
    let exposition = scrape::get(metrics, "/metrics").await.body;
    let skipped = scrape::sample(&exposition, "turnstile_events_skipped_total")
        .expect("turnstile_events_skipped_total");
    assert_eq!(
        skipped,
        (40 - normal) as f64,
        "every held-back Event is counted"
    );
    controller.stop().await;
}
