//! No poison pills: a stored claim that does not match the controller's types (written under
//! another schema, stored here through the fake's hook that bypasses validation) is skipped and
//! reported; every other claim keeps being granted; once fixed, it is picked up.

use crate::support;

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use kube::Api;
use serde_json::json;
use support::scrape::{get, sample};
use support::{Env, WAIT};
use turnstile_api::{object_event_reasons, ClaimPhase, DistributedLock};
use turnstile_controller::ControllerConfig;

fn bad_claim(namespace: &str, release: serde_json::Value, label: usize) -> serde_json::Value {
    json!({
        "apiVersion": "turnstile.dev/v1alpha1",
        "kind": "LockClaim",
        "metadata": {
            "name": "bad", "namespace": namespace, "uid": "bad-claim-uid",
            "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1,
            "labels": {"edit": label.to_string()}
        },
        "spec": {"lockName": "db", "release": release}
    })
}

async fn invalid_objects(addr: SocketAddr) -> Option<f64> {
    sample(
        &get(addr, "/metrics").await.body,
        "turnstile_invalid_objects",
    )
}

/// Polls `check` until it holds; panics after [`WAIT`].
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts the controller with `/metrics` on a free port (returned) and applies the locks
/// `db` and `other`.
fn start_with_two_locks(env: &mut Env) -> SocketAddr {
    let metrics_addr: SocketAddr = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port");
    env.start_controller(ControllerConfig {
        metrics_addr: Some(metrics_addr),
        ..ControllerConfig::default()
    });
    env.apply_locks(&["db", "other"], "leaseDurationSeconds: 300");
    metrics_addr
}

/// Waits for the Event `InvalidObject` about `object`, and asserts a Warning of that reason
/// in the test's namespace names `field`; returns the notes of all those Warnings.
async fn invalid_object_warned(env: &Env, object: &str, field: &str) -> Vec<String> {
    env.wait_event(object, object_event_reasons::INVALID_OBJECT)
        .await;
    let notes: Vec<String> = env
        .events()
        .await
        .into_iter()
        .filter(|event| event.reason.as_deref() == Some(object_event_reasons::INVALID_OBJECT))
        .filter(|event| event.type_.as_deref() == Some("Warning"))
        .filter_map(|event| event.note)
        .collect();
    assert!(notes.iter().any(|note| note.contains(field)), "{notes:?}");
    notes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_does_not_decode_stops_nothing_and_is_picked_up_once_fixed() {
    let mut env = Env::fake_only("it stores a claim the schema would refuse").await;
    let metrics_addr = start_with_two_locks(&mut env);

    // The bad claim, then five more edits of it: before the fix each event failed the shared
    // claim watch and stalled every grant for seconds (about 59 s after six events).
    for edit in 0..6 {
        env.server().store_unvalidated(
            "turnstile.dev",
            "lockclaims",
            &env.namespace,
            bad_claim(&env.namespace, json!("maybe"), edit),
        );
    }
    let why = "another lock's claim waits behind the bad object";
    env.hold_within(Duration::from_secs(3), why, "good", "other")
        .await;

    // The bad object is named, with its field, in a Warning Event, a log line and the gauge.
    let notes = invalid_object_warned(&env, "bad", "spec.release").await;
    assert!(
        notes
            .iter()
            .all(|note| note.contains("maybe") || note.contains("boolean")),
        "{notes:?}"
    );
    eventually("turnstile_invalid_objects is 1", || async {
        invalid_objects(metrics_addr).await == Some(1.0)
    })
    .await;
    let raw = env.kubectl(&["get", "lockclaim", "bad", "-o", "jsonpath={.status}"]);
    assert_eq!(raw.trim(), "", "the bad claim was never reconciled");

    // Fixed (as a corrected schema or object would be): decoded, reconciled, no longer counted.
    env.server().store_unvalidated(
        "turnstile.dev",
        "lockclaims",
        &env.namespace,
        bad_claim(&env.namespace, json!(false), 99),
    );
    env.wait_phase("bad", ClaimPhase::Held).await;
    eventually("turnstile_invalid_objects is 0", || async {
        invalid_objects(metrics_addr).await == Some(0.0)
    })
    .await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_that_does_not_decode_keeps_its_holder_stops_no_other_lock_and_is_picked_up() {
    let mut env = Env::fake_only("it stores a lock the schema would refuse").await;
    let metrics_addr = start_with_two_locks(&mut env);
    let granted = env.hold("holder", "db", "").await;
    let token = granted.status.and_then(|s| s.fencing_token);

    // The lock as stored, with a field of another type (an older or newer schema).
    let stored = env.kubectl(&["get", "distributedlock", "db", "-o", "json"]);
    let mut lock: serde_json::Value = serde_json::from_str(&stored).expect("the lock as JSON");
    lock["spec"]["maxHolders"] = json!("two");
    env.server().store_unvalidated(
        "turnstile.dev",
        "distributedlocks",
        &env.namespace,
        lock.clone(),
    );
    invalid_object_warned(&env, "db", "spec.maxHolders").await;
    eventually("turnstile_invalid_objects is 1", || async {
        invalid_objects(metrics_addr).await == Some(1.0)
    })
    .await;

    // Other locks are served at once.
    let why = "another lock's claim waits behind the bad lock";
    env.hold_within(Duration::from_secs(3), why, "elsewhere", "other")
        .await;
    // The lock's cached good version (maxHolders 1) stays in force: its holder keeps the
    // grant (no LockDeleted), and a new claim queues behind it.
    env.apply_claim("next", "db", "");
    env.wait_claim("next", |claim| {
        claim.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Pending)
    })
    .await;
    env.after_a_pass_over(&["db"]).await;
    let holder = env.claim("holder").await;
    let status = holder.status.expect("status");
    assert_eq!(status.phase, Some(ClaimPhase::Held), "{status:?}");
    assert_eq!(status.fencing_token, token);
    assert_eq!(
        env.claim("next").await.status.and_then(|s| s.phase),
        Some(ClaimPhase::Pending)
    );

    // Fixed (a new generation of it): picked up, its status computed from the fixed
    // generation, and the queue moves on as usual.
    let generation = lock["metadata"]["generation"].as_i64().expect("generation") + 1;
    lock["spec"]["maxHolders"] = json!(1);
    lock["metadata"]["generation"] = json!(generation);
    env.server()
        .store_unvalidated("turnstile.dev", "distributedlocks", &env.namespace, lock);
    let locks: Api<DistributedLock> = Api::namespaced(env.client.clone(), &env.namespace);
    eventually("the fixed lock's status names its generation", || async {
        locks
            .get("db")
            .await
            .ok()
            .and_then(|lock| lock.status)
            .and_then(|status| status.observed_generation)
            == Some(generation)
    })
    .await;
    env.delete_claim("holder").await;
    let next = env.wait_phase("next", ClaimPhase::Held).await;
    assert!(next.status.and_then(|s| s.fencing_token) > token);
    eventually("turnstile_invalid_objects is 0", || async {
        invalid_objects(metrics_addr).await == Some(0.0)
    })
    .await;
    env.stop_controller().await;
}
