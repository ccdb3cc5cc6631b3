//! End to end with two controller replicas and leader election: only the leader grants,
//! and when it stops the standby takes over (rebuilding the memory backend from the claims'
//! statuses) without a double grant or a token going backwards.

mod e2e_support;

use std::time::Duration;

use e2e_support::{position_of, token_of, Env, HolderMonitor};
use turnstile::api::ClaimPhase;
use turnstile::controller::ControllerConfig;
use turnstile::leader::LeaderConfig;

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
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &env.namespace);
    events
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter_map(|event| event.reporting_instance)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_without_double_grants() {
    let env = Env::new().await;
    let first = env.spawn_controller(replica(&env, "replica-1"));
    // Let replica-1 win the Lease before replica-2 starts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = env.spawn_controller(replica(&env, "replica-2"));
    let monitor = HolderMonitor::start(&env, "db", 1);

    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.queue_of_three("db").await;
    assert_eq!(token_of(&env.claim("a").await), Some(1));

    // Only the leader acted: every Event so far comes from replica-1.
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

    let reporters = reporting_instances(&env).await;
    assert!(reporters.iter().any(|r| r == "replica-2"), "{reporters:?}");

    let report = monitor.finish().await;
    assert_eq!(report.tokens(), [1, 2]);
    second.stop().await;
}
