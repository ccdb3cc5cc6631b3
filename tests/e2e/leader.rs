//! End to end with two controller replicas and leader election: only the leader grants,
//! and when it stops the standby takes over (rebuilding the memory backend from the claims'
//! statuses) without a double grant or a token going backwards. The leadership gate: a
//! replica that is not (or no longer) the leader grants nothing and writes nothing, even in a
//! pass already running.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use support::actor::{requests_of, tagged_client};
use support::jobs::{is_suspended, jobs};
use support::scrape::{free_addr, get, sample};
use support::{arrival_of, phase_of, position_of, token_of, Env, HolderMonitor, WAIT};
use tokio::sync::watch;
use turnstile_api::{BackendKind, ClaimPhase, DistributedLock, LockClaim};
use turnstile_controller::leader::LeaderConfig;
use turnstile_controller::leader::LeadershipGate;
use turnstile_controller::metrics::Metrics;
use turnstile_controller::pass::lock_reconciler::reconcile_lock;
use turnstile_controller::runtime::backends::Backends;
use turnstile_controller::runtime::claim_index::ClaimIndex;
use turnstile_controller::runtime::context::Context;
use turnstile_controller::writer::events::EventPublisher;
use turnstile_controller::ControllerConfig;
use turnstile_lock::Backend;

/// Waits until the leader-election Lease in the test's namespace names `identity` as holder.
async fn wait_for_lease_holder(env: &Env, identity: &str) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: kube::Api<Lease> = kube::Api::namespaced(env.client.clone(), &env.namespace);
    let deadline = Instant::now() + WAIT;
    loop {
        let holder = leases
            .get_opt(turnstile_controller::leader::DEFAULT_LEASE_NAME)
            .await
            .expect("get the Lease")
            .and_then(|lease| lease.spec?.holder_identity);
        if holder.as_deref() == Some(identity) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{identity} never held the Lease: {holder:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn replica(env: &Env, identity: &str) -> ControllerConfig {
    ControllerConfig {
        instance: Some(identity.to_owned()),
        leader_election: Some(
            LeaderConfig::new(env.namespace.clone(), identity).with_timings(
                Duration::from_secs(3),
                Duration::from_secs(2),
                Duration::from_millis(300),
            ),
        ),
        ..ControllerConfig::default()
    }
}

async fn reporting_instances(env: &Env) -> Vec<String> {
    env.events()
        .await
        .into_iter()
        .filter_map(|event| event.reporting_instance)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_without_double_grants() {
    let env = Env::new().await;
    let leader_metrics = free_addr();
    let first = env.spawn_controller(ControllerConfig {
        metrics_addr: Some(leader_metrics),
        ..replica(&env, "replica-1")
    });
    // replica-1 holds the Lease before replica-2 starts.
    wait_for_lease_holder(&env, "replica-1").await;
    let standby_metrics = free_addr();
    let second = env.spawn_controller(ControllerConfig {
        metrics_addr: Some(standby_metrics),
        ..replica(&env, "replica-2")
    });
    let monitor = HolderMonitor::start(&env, "db", 1);

    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.queue_of_three("db").await;
    assert_eq!(token_of(&env.claim("a").await), Some(1));
    // The standby is ready (a rolling update may go on) and serves its metrics.
    assert_eq!(get(standby_metrics, "/readyz").await.status, 200);
    let standby_gauge = || async {
        sample(
            &get(standby_metrics, "/metrics").await.body,
            "turnstile_leader",
        )
    };
    assert_eq!(
        standby_gauge().await,
        Some(0.0),
        "the standby does not lead"
    );
    // Both replicas serve OpenMetrics text, the leader and the standby alike.
    for (replica, addr) in [("leader", leader_metrics), ("standby", standby_metrics)] {
        let answer = get(addr, "/metrics").await;
        assert_eq!(answer.status, 200, "{replica}");
        assert!(
            answer
                .content_type
                .starts_with("application/openmetrics-text"),
            "{replica}: {}",
            answer.content_type
        );
        assert!(
            answer.body.ends_with("# EOF\n"),
            "{replica}: {}",
            answer.body
        );
    }
    assert_eq!(
        sample(
            &get(leader_metrics, "/metrics").await.body,
            "turnstile_leader"
        ),
        Some(1.0),
        "the leader leads"
    );

    // Only the leader acted: every Event so far comes from replica-1. Events are published
    // after the status writes, so wait for the grant's before looking.
    env.wait_event("a", "Acquired").await;
    let reporters = reporting_instances(&env).await;
    assert!(!reporters.is_empty());
    assert!(
        reporters.iter().all(|r| r == "replica-1"),
        "events from {reporters:?}"
    );

    // The leader goes away; the standby takes the Lease and carries on with the same queue.
    first.stop().await;
    env.patch_claim_spec("a", serde_json::json!({"release": true}))
        .await;
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(token_of(&b), Some(2));
    env.wait_claim("c", |c| position_of(c) == Some(1)).await;

    // As above: the grant's Event follows its status write.
    env.wait_event("b", "Acquired").await;
    let reporters = reporting_instances(&env).await;
    assert!(reporters.iter().any(|r| r == "replica-2"), "{reporters:?}");

    assert_eq!(standby_gauge().await, Some(1.0), "the former standby leads");
    // Ready again once its fresh caches have synced (moments after its first passes).
    let deadline = Instant::now() + WAIT;
    while get(standby_metrics, "/readyz").await.status != 200 {
        assert!(Instant::now() < deadline, "the new leader never got ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let report = monitor.finish().await;
    assert_eq!(report.tokens(), [1, 2]);
    second.stop().await;
}

/// Claims that arrived under one leader keep their place under the next: a claim created
/// after the change queues behind them, whatever the names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_between_creations_keeps_the_arrival_order() {
    let env = Env::new().await;
    let first = env.spawn_controller(replica(&env, "replica-1"));
    env.apply_locks(&["db", "probe"], "leaseDurationSeconds: 300");
    env.hold("holder", "db", "").await;
    env.apply_claim("z-first", "db", "");
    let z = env.wait_claim("z-first", |c| arrival_of(c).is_some()).await;
    let second = env.spawn_controller(replica(&env, "replica-2"));

    first.stop().await;
    // The positive sign that replica-2 leads: it grants a claim on another lock.
    env.hold("probe-claim", "probe", "").await;
    env.a_later_claim_queues_behind("db", "holder", &z, "a-second")
        .await;
    second.stop().await;
}

/// Caches filled from the API as a watch would fill them (for driving one pass by hand).
async fn filled_stores(
    env: &Env,
) -> (
    reflector::Store<DistributedLock>,
    reflector::Store<LockClaim>,
    ClaimIndex,
) {
    let (locks, mut lock_writer) = reflector::store::<DistributedLock>();
    let (claims, mut claim_writer) = reflector::store::<LockClaim>();
    lock_writer.apply_watcher_event(&watcher::Event::Init);
    for lock in env.locks().list(&Default::default()).await.expect("locks") {
        lock_writer.apply_watcher_event(&watcher::Event::InitApply(lock));
    }
    lock_writer.apply_watcher_event(&watcher::Event::InitDone);
    // The index sees every event the store does, first (as in the runtime).
    let index = ClaimIndex::new();
    let listed = env
        .claims()
        .list(&Default::default())
        .await
        .expect("claims");
    let events = std::iter::once(watcher::Event::Init)
        .chain(listed.into_iter().map(watcher::Event::InitApply))
        .chain(std::iter::once(watcher::Event::InitDone));
    for event in events {
        index.observe(&event);
        claim_writer.apply_watcher_event(&event);
    }
    (locks, claims, index)
}

fn writes(log: &[fake_apiserver::RecordedRequest]) -> Vec<String> {
    log.iter()
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .map(|r| format!("{} {}", r.verb, r.path))
        .collect()
}

/// A pass of the lock reconciler on a replica that is not the leader neither grants in the
/// backend nor writes to the API; the same pass once the gate opens grants the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_leadership_gate_stops_grants_and_writes() {
    let env = Env::fake_only("its request log shows that a closed gate writes nothing").await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply_claim("a", "db", "");
    let (locks, claims, index) = filled_stores(&env).await;
    let (is_leader, leading) = watch::channel(false);
    let events = EventPublisher::new(
        env.client.clone(),
        Reporter {
            controller: "turnstile".to_owned(),
            instance: None,
        },
    );
    let ctx = Arc::new(
        Context::new(
            env.client.clone(),
            locks.clone(),
            claims,
            index,
            Backends::new(BackendKind::Memory, None),
            events,
            Metrics::new(),
        )
        .with_leadership(LeadershipGate::following(leading)),
    );
    let lock = locks
        .get(&ObjectRef::new("db").within(&env.namespace))
        .expect("cached lock");
    let key = format!("{}/db", env.namespace);
    let backend = ctx.backends.get(BackendKind::Memory).await.expect("memory");

    env.server().clear_request_log();
    let result = reconcile_lock(lock.clone(), ctx.clone()).await;
    let error = result.expect_err("a pass without leadership stops");
    assert!(error.is_not_leader(), "{error}");
    assert_eq!(writes(&env.server().request_log()), Vec::<String>::new());
    let snapshot = backend.snapshot(&key).await.expect("snapshot");
    assert!(snapshot.holders.is_empty(), "granted: {snapshot:?}");
    assert_eq!(phase_of(&env.claim("a").await), None);

    is_leader.send(true).expect("gate open");
    reconcile_lock(lock, ctx).await.expect("a leader's pass");
    assert!(!writes(&env.server().request_log()).is_empty());
    let snapshot = backend.snapshot(&key).await.expect("snapshot");
    assert_eq!(snapshot.holders.len(), 1);
    let a = env.claim("a").await;
    assert_eq!(phase_of(&a), Some(ClaimPhase::Held));
    assert_eq!(token_of(&a), Some(1));
}

/// The leader's Lease renewals start failing: once it reports the loss (the leader gauge
/// drops to 0) none of its requests writes a claim, a lock or an Event, although the test
/// releases the holder and adds a claim; the next claim stays queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_loses_the_lease_stops_granting() {
    let env = Env::fake_only("it fails the leader's Lease renewals on cue").await;
    let metrics_addr = free_addr();
    let controller_client = tagged_client(env.server(), "replica-1");
    let replica = env.spawn_controller_with(
        controller_client,
        ControllerConfig {
            metrics_addr: Some(metrics_addr),
            ..replica(&env, "replica-1")
        },
    );
    env.apply_locks(&["db", "free"], "leaseDurationSeconds: 300");
    env.queue_of_three("db").await;
    let leader_gauge = || async {
        sample(
            &get(metrics_addr, "/metrics").await.body,
            "turnstile_leader",
        )
    };
    assert_eq!(leader_gauge().await, Some(1.0));

    env.server().inject_faults(
        &format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
            env.namespace
        ),
        100_000,
        500,
    );
    let deadline = Instant::now() + WAIT;
    while leader_gauge().await != Some(0.0) {
        assert!(
            Instant::now() < deadline,
            "the replica never reported the loss"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lost_at = env.server().request_log().len();

    // Work that a leader would act on at once.
    env.patch_claim_spec("a", serde_json::json!({"release": true}))
        .await;
    env.apply_claim("d", "db", "");
    // A gated Job on a free lock: a leader would create its claim and un-suspend it.
    env.apply(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: gated\n  annotations:\n    turnstile.dev/lock: free\nspec:\n  suspend: true\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: job\n          image: busybox:1.36\n",
    );
    // Time: nothing can show that a replica without the Lease chose not to act; a leader acts
    // within a second, so three seconds without a write from it is the test.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let log = env.server().request_log();
    let before = requests_of(&log[..lost_at], "replica-1");
    assert!(
        writes(&before).iter().any(|w| w.contains("/lockclaims/")),
        "the replica wrote claims while leading"
    );
    let after: Vec<String> = writes(&requests_of(&log[lost_at..], "replica-1"))
        .into_iter()
        .filter(|write| !write.contains("/leases"))
        .collect();
    assert_eq!(after, Vec::<String>::new(), "writes after losing the lease");
    assert_eq!(phase_of(&env.claim("b").await), Some(ClaimPhase::Pending));
    assert_eq!(phase_of(&env.claim("d").await), None);
    // The Job gate stopped too: no claim for the Job, and the Job still suspended.
    assert!(env.claim_opt("gated-free").await.is_none());
    assert!(is_suspended(&jobs(&env).get("gated").await.expect("job")));
    replica.stop().await;
}
