//! The metrics server over real HTTP on 127.0.0.1: `/metrics` shows what was recorded (in
//! the OpenMetrics text Prometheus scrapes), `/healthz` answers while the runtime runs,
//! `/readyz` follows the readiness flag, and the server stops on its shutdown signal.

use std::time::Duration;

use tokio::net::TcpListener;
#[path = "e2e_support/scrape.rs"]
mod scrape;

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
    let server = tokio::spawn(metrics::serve_on(
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

    for _ in 0..3 {
        metrics
            .grants
            .record_grant(BackendKind::Memory, Duration::from_millis(250));
    }
    metrics
        .grants
        .record_grant(BackendKind::Redis, Duration::from_secs(2));
    for _ in 0..2 {
        metrics
            .grants
            .record_release(BackendKind::Memory, Duration::from_secs(1));
    }
    metrics
        .grants
        .record_expiry(BackendKind::Redis, Duration::from_secs(30));
    metrics.grants.record_lock_lost(
        BackendKind::Memory,
        LockLostCause::BackendLost,
        Duration::from_secs(5),
    );
    metrics.grants.record_renewal(BackendKind::Memory);
    metrics
        .backends
        .record_error(BackendKind::Redis, BackendOperation::Acquire);
    metrics.reconciles.record_error(ReconcileErrorKind::Api);
    metrics
        .backends
        .set_queue_depth("team-a/db", BackendKind::Memory, 4);
    metrics
        .backends
        .set_queue_depth("team-b/db", BackendKind::Memory, 2);
    metrics.replica.set_leader(true);

    let scrape = get(addr, "/metrics").await;
    assert_eq!(scrape.status, 200);
    assert_eq!(scrape.content_type, METRICS_CONTENT_TYPE);
    let text = scrape.body;
    let expect = |series: &str, value: f64| {
        assert_eq!(sample(&text, series), Some(value), "{series} in:\n{text}");
    };
    expect(r#"turnstile_grants_total{backend="memory"}"#, 3.0);
    expect(r#"turnstile_grants_total{backend="redis"}"#, 1.0);
    expect(r#"turnstile_grants_total{backend="mongo"}"#, 0.0);
    expect(r#"turnstile_releases_total{backend="memory"}"#, 2.0);
    expect(r#"turnstile_expiries_total{backend="redis"}"#, 1.0);
    expect(
        r#"turnstile_lock_lost_total{backend="redis",cause="expired"}"#,
        1.0,
    );
    expect(
        r#"turnstile_lock_lost_total{backend="memory",cause="backend_lost"}"#,
        1.0,
    );
    expect(r#"turnstile_renewals_total{backend="memory"}"#, 1.0);
    expect(
        r#"turnstile_backend_errors_total{backend="redis",operation="acquire"}"#,
        1.0,
    );
    expect(r#"turnstile_reconcile_errors_total{kind="api"}"#, 1.0);
    expect(r#"turnstile_queue_depth{backend="memory"}"#, 6.0);
    expect("turnstile_leader", 1.0);
    // Histograms: counts, sums and cumulative buckets.
    expect(r#"turnstile_wait_seconds_count{backend="memory"}"#, 3.0);
    expect(r#"turnstile_wait_seconds_sum{backend="memory"}"#, 0.75);
    expect(
        r#"turnstile_wait_seconds_bucket{le="0.32",backend="memory"}"#,
        3.0,
    );
    expect(
        r#"turnstile_wait_seconds_bucket{le="0.08",backend="memory"}"#,
        0.0,
    );
    expect(
        r#"turnstile_hold_seconds_count{backend="memory",outcome="released"}"#,
        2.0,
    );
    expect(
        r#"turnstile_hold_seconds_count{backend="memory",outcome="lost"}"#,
        1.0,
    );
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
    let result = metrics::serve(addr, Metrics::new(), Readiness::new(), async {}).await;
    assert!(
        matches!(result, Err(MetricsError::Bind { addr: failed, .. }) if failed == addr),
        "{result:?}"
    );
}
