//! The metrics server over real HTTP on 127.0.0.1: `/metrics` shows what was recorded (in
//! the OpenMetrics text Prometheus scrapes), `/healthz` answers while the runtime runs,
//! `/readyz` follows the readiness flag, and the server stops on its shutdown signal.

use std::time::Duration;

use crate::support::scrape;
use tokio::net::TcpListener;

use scrape::{get, sample};
use turnstile_api::BackendKind;
use turnstile_controller::metrics::{
    self, BackendOperation, LockLostCause, Metrics, MetricsError, Readiness, ReconcileErrorKind,
    METRICS_CONTENT_TYPE,
};

#[tokio::test]
async fn scrapes_show_what_was_recorded_and_probes_follow_readiness() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let metrics = Metrics::new();
    let readiness = Readiness::new();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(metrics::serve(
        listener,
        metrics.clone(),
        readiness.clone(),
        async {
            let _ = stopped.await;
        },
    ));

    assert_eq!(get(addr, "/healthz").await.status, 200);
    assert_eq!(
        get(addr, "/readyz").await.status,
        503,
        "ready before the caches synced"
    );
    readiness.set_ready(true);
    assert_eq!(get(addr, "/readyz").await.status, 200);

    let grants = &metrics.grants;
    // Three grants on memory after 250 ms each, one on Redis after 2 s.
    let waits = [(BackendKind::Memory, Duration::from_millis(250)); 3];
    for (backend, wait) in waits
        .into_iter()
        .chain([(BackendKind::Redis, Duration::from_secs(2))])
    {
        grants.record_grant(backend, wait);
    }
    for _ in 0..2 {
        grants.record_release(BackendKind::Memory, Duration::from_secs(1));
    }
    grants.record_expiry(BackendKind::Redis, Duration::from_secs(30));
    let lost = LockLostCause::BackendLost;
    grants.record_lock_lost(BackendKind::Memory, lost, Duration::from_secs(5));
    grants.record_renewal(BackendKind::Memory);
    let backends = &metrics.backends;
    backends.record_error(BackendKind::Redis, BackendOperation::Acquire);
    metrics.reconciles.record_error(ReconcileErrorKind::Api);
    for (lock, depth) in [("team-a/db", 4), ("team-b/db", 2)] {
        backends.set_queue_depth(lock, BackendKind::Memory, depth);
    }
    metrics.replica.set_leader(true);

    let scrape = get(addr, "/metrics").await;
    assert_eq!(scrape.status, 200);
    assert_eq!(scrape.content_type, METRICS_CONTENT_TYPE);
    let text = scrape.body;
    let expected = [
        (r#"turnstile_grants_total{backend="memory"}"#, 3.0),
        (r#"turnstile_grants_total{backend="redis"}"#, 1.0),
        (r#"turnstile_grants_total{backend="mongo"}"#, 0.0),
        (r#"turnstile_releases_total{backend="memory"}"#, 2.0),
        (r#"turnstile_expiries_total{backend="redis"}"#, 1.0),
        (
            r#"turnstile_lock_lost_total{backend="redis",cause="expired"}"#,
            1.0,
        ),
        (
            r#"turnstile_lock_lost_total{backend="memory",cause="backend_lost"}"#,
            1.0,
        ),
        (r#"turnstile_renewals_total{backend="memory"}"#, 1.0),
        (
            r#"turnstile_backend_errors_total{backend="redis",operation="acquire"}"#,
            1.0,
        ),
        (r#"turnstile_reconcile_errors_total{kind="api"}"#, 1.0),
        (r#"turnstile_queue_depth{backend="memory"}"#, 6.0),
        ("turnstile_leader", 1.0),
        // Histograms: counts, sums and cumulative buckets.
        (r#"turnstile_wait_seconds_count{backend="memory"}"#, 3.0),
        (r#"turnstile_wait_seconds_sum{backend="memory"}"#, 0.75),
        (
            r#"turnstile_wait_seconds_bucket{le="0.32",backend="memory"}"#,
            3.0,
        ),
        (
            r#"turnstile_wait_seconds_bucket{le="0.08",backend="memory"}"#,
            0.0,
        ),
        (
            r#"turnstile_hold_seconds_count{backend="memory",outcome="released"}"#,
            2.0,
        ),
        (
            r#"turnstile_hold_seconds_count{backend="memory",outcome="lost"}"#,
            1.0,
        ),
    ];
    for (series, value) in expected {
        assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"));
    // No lock name leaks into a label.
    assert!(!text.contains("team-a") && !text.contains("team-b"));

    assert_eq!(get(addr, "/nothing-here").await.status, 404);
    stop.send(()).expect("server still running");
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops on its shutdown signal")
        .expect("server task")
        .expect("served without error");
}

#[tokio::test]
async fn a_taken_address_is_a_typed_error() {
    let taken = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = taken.local_addr().expect("address");
    let result = metrics::bind(addr).await;
    assert!(
        matches!(result, Err(MetricsError::Bind { addr: failed, .. }) if failed == addr),
        "{result:?}"
    );
}
