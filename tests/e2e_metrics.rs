//! End to end with the controller's metrics server on a free 127.0.0.1 port: after a flow of
//! known grants, one release and one expiry, `/metrics` (scraped over HTTP) shows exactly
//! those counts, the queue depth follows the queue, and `/readyz` answers ready.

mod e2e_support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use e2e_support::scrape::{get, sample};
use e2e_support::{position_of, Env, WAIT};
use turnstile_api::ClaimPhase;
use turnstile_controller::ControllerConfig;

fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    listener.local_addr().expect("address")
}

/// Scrapes until every `(series, value)` in `expected` is shown (the metrics of a pass are
/// recorded just after its writes, so a scrape may briefly lag the API); panics with the
/// exposition after [`WAIT`].
async fn wait_for_samples(addr: SocketAddr, expected: &[(&str, f64)]) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = get(addr, "/metrics").await;
        assert_eq!(answer.status, 200);
        let missing: Vec<_> = expected
            .iter()
            .filter(|(series, value)| sample(&answer.body, series) != Some(*value))
            .collect();
        if missing.is_empty() {
            return answer.body;
        }
        assert!(
            Instant::now() < deadline,
            "never saw {missing:?} in:\n{}",
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const GRANTS: &str = r#"turnstile_grants_total{backend="memory"}"#;
const RELEASES: &str = r#"turnstile_releases_total{backend="memory"}"#;
const EXPIRIES: &str = r#"turnstile_expiries_total{backend="memory"}"#;
const QUEUE: &str = r#"turnstile_queue_depth{backend="memory"}"#;
const WAITS: &str = r#"turnstile_wait_seconds_count{backend="memory"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_shows_its_grants_releases_and_expiries_in_metrics() {
    let mut env = Env::new().await;
    let addr = free_addr();
    env.start_controller(ControllerConfig {
        metrics_addr: Some(addr),
        ..ControllerConfig::default()
    });

    // One holder and one waiter on a long lease.
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply_claim("a", "db", "");
    env.wait_phase("a", ClaimPhase::Held).await;
    env.apply_claim("b", "db", "");
    env.wait_claim("b", |c| position_of(c) == Some(1)).await;
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
