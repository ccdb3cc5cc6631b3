//! End to end with the controller's metrics server on a free 127.0.0.1 port: after a flow of
//! known grants, one release and one expiry, `/metrics` (scraped over HTTP) shows exactly
//! those counts, the queue depth follows the queue, and `/readyz` answers ready; then every
//! other way a grant or claim ends, and the error and reconcile series, one event at a time.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use support::pods::{create_pod, owned_claim, set_pod_phase};
use support::scrape::{free_addr, get, sample};
use support::{Env, WAIT};
use turnstile_api::ClaimPhase;
use turnstile_controller::ControllerConfig;

/// Scrapes until `done` holds for the exposition (the metrics of a pass are recorded just
/// after its writes, so a scrape may briefly lag the API); returns it, or panics with it and
/// `what` after [`WAIT`].
async fn scrape_until(addr: SocketAddr, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = get(addr, "/metrics").await;
        assert_eq!(answer.status, 200);
        if done(&answer.body) {
            return answer.body;
        }
        assert!(
            Instant::now() < deadline,
            "never saw {what} in:\n{}",
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Scrapes until every `(series, value)` in `expected` is shown exactly.
async fn wait_for_samples(addr: SocketAddr, expected: &[(&str, f64)]) -> String {
    scrape_until(addr, &format!("{expected:?}"), |body| {
        expected
            .iter()
            .all(|(series, value)| sample(body, series) == Some(*value))
    })
    .await
}

/// Scrapes until `series` shows at least `at_least`.
async fn wait_for_at_least(addr: SocketAddr, series: &str, at_least: f64) -> String {
    scrape_until(addr, &format!("{series} >= {at_least}"), |body| {
        sample(body, series).is_some_and(|value| value >= at_least)
    })
    .await
}

const GRANTS: &str = r#"turnstile_grants_total{backend="memory"}"#;
const RELEASES: &str = r#"turnstile_releases_total{backend="memory"}"#;
const EXPIRIES: &str = r#"turnstile_expiries_total{backend="memory"}"#;
const QUEUE: &str = r#"turnstile_queue_depth{backend="memory"}"#;
const WAITS: &str = r#"turnstile_wait_seconds_count{backend="memory"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_shows_its_grants_releases_and_expiries_in_metrics() {
    let mut env = Env::new().await;
    let addr = env.start_controller_serving_metrics();

    // One holder and one waiter on a long lease.
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.a_holds_and_b_waits("db").await;
    let deadline = Instant::now() + WAIT;
    while get(addr, "/readyz").await.status != 200 {
        let answer = get(addr, "/readyz").await;
        assert!(
            Instant::now() < deadline,
            "never ready: {} {}",
            answer.status,
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for_samples(
        addr,
        &[
            (GRANTS, 1.0),
            (QUEUE, 1.0),
            (RELEASES, 0.0),
            (EXPIRIES, 0.0),
        ],
    )
    .await;

    // a releases: b is granted.
    env.patch_claim_spec("a", serde_json::json!({"release": true}))
        .await;
    env.wait_phase("a", ClaimPhase::Released).await;
    env.wait_phase("b", ClaimPhase::Held).await;

    // A short lease nobody renews expires.
    env.apply_lock("short", "leaseDurationSeconds: 1");
    env.apply_claim("x", "short", "");
    env.wait_phase("x", ClaimPhase::Expired).await;

    let text = wait_for_samples(
        addr,
        &[
            (GRANTS, 3.0),
            (WAITS, 3.0),
            (RELEASES, 1.0),
            (EXPIRIES, 1.0),
            (QUEUE, 0.0),
        ],
    )
    .await;
    // Nothing was counted on the backends this flow never used.
    assert_eq!(
        sample(&text, r#"turnstile_grants_total{backend="redis"}"#),
        Some(0.0)
    );
    let ready = get(addr, "/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    env.stop_controller().await;
}

/// Every other way a grant or a claim ends, one at a time, each shown by its own counter as
/// the controller counts it: a renewal, a release on deletion and when the owner Pod
/// finishes, a claim timing out, a lock deleted under its holder (`lock_lost` and
/// `hold_seconds{outcome="lost"}`), injected API errors (`reconcile_errors_total{kind="api"}`)
/// and a Redis nobody listens on (`backend_errors_total{operation="connect"}`), beside the
/// reconcile counts and durations of the passes that did all this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_failures_losses_and_errors_are_counted_as_they_happen() {
    let mut env = Env::fake_only("it injects the API errors the counters must show").await;
    let addr = free_addr();
    let closed = free_addr();
    env.start_controller(ControllerConfig {
        metrics_addr: Some(addr),
        // A port nothing listens on.
        redis_url: Some(format!("redis://{closed}/")),
        ..ControllerConfig::default()
    });
    let renewals = r#"turnstile_renewals_total{backend="memory"}"#;
    let failures = r#"turnstile_claim_failures_total{backend="memory"}"#;
    let deleted = r#"turnstile_lock_lost_total{backend="memory",cause="lock_deleted"}"#;
    let lost = r#"turnstile_hold_seconds_count{backend="memory",outcome="lost"}"#;
    let released = r#"turnstile_hold_seconds_count{backend="memory",outcome="released"}"#;

    // A renewal.
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let a = env.hold("a", "db", "").await;
    wait_for_samples(addr, &[(renewals, 0.0), (failures, 0.0), (RELEASES, 0.0)]).await;
    // Created after that scrape: with a timeout of one second (and creation times in whole
    // seconds) b may fail before a scrape on a busy machine.
    env.apply_claim("b", "db", "acquireTimeoutSeconds: 1");
    // Times are whole seconds: a renewal dated in the grant's own second extends nothing.
    let acquired = a
        .status
        .and_then(|status| status.acquired_at)
        .expect("acquiredAt")
        .0
        .as_second();
    while Timestamp::now().as_second() <= acquired {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.renew("a").await;
    env.wait_event("a", "Renewed").await;
    // b times out behind a.
    env.wait_phase("b", ClaimPhase::Failed).await;
    wait_for_samples(addr, &[(renewals, 1.0), (failures, 1.0), (RELEASES, 0.0)]).await;

    // The holder's claim is deleted: a release.
    env.delete_claim("a").await;
    env.wait_gone("a").await;
    wait_for_samples(addr, &[(RELEASES, 1.0), (released, 1.0)]).await;

    // A Pod-owned holder whose Pod finishes: a release.
    let uid = create_pod(&env, "worker").await;
    set_pod_phase(&env, "worker", "Running").await;
    env.apply(&owned_claim("worker-db", "db", "Pod", "v1", "worker", &uid));
    env.wait_phase("worker-db", ClaimPhase::Held).await;
    set_pod_phase(&env, "worker", "Succeeded").await;
    env.wait_phase("worker-db", ClaimPhase::Released).await;
    wait_for_samples(addr, &[(RELEASES, 2.0), (released, 2.0)]).await;

    // The lock is deleted under a holder: lost, not released.
    env.apply_lock("doomed", "leaseDurationSeconds: 300");
    env.hold("h", "doomed", "").await;
    env.locks()
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete lock");
    env.wait_phase("h", ClaimPhase::Expired).await;
    wait_for_samples(addr, &[(deleted, 1.0), (lost, 1.0), (RELEASES, 2.0)]).await;

    // Injected server errors on a claim's status writes fail a pass: an API error.
    let api_errors = r#"turnstile_reconcile_errors_total{kind="api"}"#;
    let before = sample(&get(addr, "/metrics").await.body, api_errors).expect("api errors");
    env.server()
        .inject_faults(&env.turnstile_path("lockclaims/c/status"), 2, 500);
    env.hold("c", "db", "").await;
    wait_for_at_least(addr, api_errors, before + 1.0).await;

    // A Redis lock while nobody listens on the controller's Redis: connect errors.
    env.apply_lock("cache", "backend: redis\nleaseDurationSeconds: 300");
    env.wait_ready("cache", "False").await;
    let text = wait_for_at_least(
        addr,
        r#"turnstile_backend_errors_total{backend="redis",operation="connect"}"#,
        1.0,
    )
    .await;

    // The passes that did all this are counted and timed.
    for series in [
        r#"turnstile_reconcile_total{controller="lock",result="ok"}"#,
        r#"turnstile_reconcile_total{controller="lock",result="error"}"#,
        r#"turnstile_reconcile_duration_seconds_count{controller="lock"}"#,
    ] {
        assert!(
            sample(&text, series).is_some_and(|value| value >= 1.0),
            "{series} in:\n{text}"
        );
    }
    env.stop_controller().await;
}
