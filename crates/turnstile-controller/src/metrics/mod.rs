//! Prometheus metrics of the controller, and the HTTP server for `/metrics`, `/healthz` and
//! `/readyz`.
//!
//! One struct per concern registers its series and records into them ([`GrantMetrics`],
//! [`BackendMetrics`], [`ReconcileMetrics`], [`ReplicaMetrics`]); [`server`] serves them.
//! Label values come from closed enums ([`labels`]), so the number of series is bounded by
//! construction: no lock, claim or namespace name ever becomes a label.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `turnstile_grants_total` | counter | `backend` | claims granted |
//! | `turnstile_renewals_total` | counter | `backend` | leases renewed |
//! | `turnstile_releases_total` | counter | `backend` | grants released (on request, deletion, owner gone) |
//! | `turnstile_expiries_total` | counter | `backend` | grants that ran out unrenewed |
//! | `turnstile_lock_lost_total` | counter | `backend`, `cause` | grants a holder lost: `expired`, `backend_lost`, `lock_deleted` |
//! | `turnstile_claim_failures_total` | counter | `backend` | claims failed without a grant (timeout, invalid) |
//! | `turnstile_wait_seconds` | histogram | `backend` | from claim creation to grant |
//! | `turnstile_hold_seconds` | histogram | `backend`, `outcome` | from grant to `released`, `expired` or `lost` |
//! | `turnstile_queue_depth` | gauge | `backend` | claims waiting, summed over locks |
//! | `turnstile_backend_errors_total` | counter | `backend`, `operation` | failed backend calls |
//! | `turnstile_reconcile_total` | counter | `controller`, `result` | reconcile passes of the `lock`, `claim` and `job` controllers, `ok` or `error` |
//! | `turnstile_reconcile_duration_seconds` | histogram | `controller` | how long a pass took |
//! | `turnstile_reconcile_errors_total` | counter | `kind` | failed reconciliations: `api`, `backend`, `other` |
//! | `turnstile_leader` | gauge | | 1 while this replica leads |
//! | `turnstile_invalid_objects` | gauge | | locks and claims the controller cannot read (skipped; each has a Warning Event) |
//!
//! The reconcilers record through a shared [`Metrics`] (cheap to clone); [`bind`] and [`serve`] expose it:
//!
//! ```no_run
//! # async fn demo() -> Result<(), turnstile_controller::metrics::MetricsError> {
//! use turnstile_api::BackendKind;
//! use turnstile_controller::metrics::{self, Metrics, Readiness};
//! let metrics = Metrics::new();
//! let readiness = Readiness::new();
//! let listener = metrics::bind("0.0.0.0:8080".parse().expect("a socket address")).await?;
//! let server = tokio::spawn(metrics::serve(
//!     listener,
//!     metrics.clone(),
//!     readiness.clone(),
//!     std::future::pending(),
//! ));
//! readiness.set_ready(true); // caches synced
//! metrics.grants.record_grant(BackendKind::Memory, std::time::Duration::from_millis(40));
//! # drop(server); Ok(()) }
//! ```

pub mod backends;
pub mod grants;
pub mod labels;
pub mod reconcile;
pub mod replica;
pub mod server;

use std::sync::Arc;

use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

pub use self::backends::BackendMetrics;
pub use self::grants::GrantMetrics;
pub use self::labels::{
    BackendOperation, ControllerKind, LockLostCause, ReconcileErrorKind, ReconcileResult,
};
pub use self::reconcile::{ReconcileMetrics, ReconcileTimer};
pub use self::replica::ReplicaMetrics;
pub use self::server::{bind, router, serve, MetricsError, Readiness, METRICS_CONTENT_TYPE};
pub use turnstile_api::BackendKind;

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Registers `metric` (a handle sharing its values) and returns it for recording.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Creates `family`'s series for `labels` (at zero), so it is exported before anything is
/// recorded in it.
fn create_at_zero<S, M, C>(family: &Family<S, M, C>, labels: &S)
where
    S: Clone + std::hash::Hash + Eq,
    C: MetricConstructor<M>,
{
    // `get_or_create` creates the series; the guard it returns is not needed.
    drop(family.get_or_create(labels));
}

/// The controller's metrics: one registry and a handle per concern. Clones share them.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Grants, waits, holds and how they ended.
    pub grants: GrantMetrics,
    /// Backend call failures and queue depth.
    pub backends: BackendMetrics,
    /// Reconcile passes.
    pub reconciles: ReconcileMetrics,
    /// Leadership and unreadable objects.
    pub replica: ReplicaMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every Turnstile metric registered (prefix `turnstile_`). Every
    /// labelled series exists at zero from the start (`rate()` and absence alerts work before
    /// the first grant); the label sets are closed enums, so that is a small fixed number.
    pub fn new() -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("turnstile");
        let grants = GrantMetrics::register(registry);
        let backends = BackendMetrics::register(registry);
        let reconciles = ReconcileMetrics::register(registry);
        let replica = ReplicaMetrics::register(registry);
        Self {
            registry: Arc::new(root),
            grants,
            backends,
            reconciles,
            replica,
        }
    }

    /// The registry, for encoding by hand.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Every metric in the OpenMetrics text format (what `/metrics` serves).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Asserts that each series in `expected` has its value in `text`.
    fn assert_samples(text: &str, expected: &[(&str, f64)]) {
        for &(series, value) in expected {
            assert_eq!(sample(text, series), Some(value), "{series} in:\n{text}");
        }
    }

    #[test]
    fn queue_depth_is_a_sum_over_locks_that_forgets_deleted_locks() {
        let metrics = Metrics::new();
        // In this order: ns/a reports twice, the second replaces the first.
        for (lock, backend, depth) in [
            ("ns/a", BackendKind::Memory, 3),
            ("ns/b", BackendKind::Memory, 2),
            ("ns/c", BackendKind::Redis, 5),
            ("ns/a", BackendKind::Memory, 1),
        ] {
            metrics.backends.set_queue_depth(lock, backend, depth);
        }
        let text = metrics.encode().expect("encode");
        assert_samples(
            &text,
            &[
                (r#"turnstile_queue_depth{backend="memory"}"#, 3.0),
                (r#"turnstile_queue_depth{backend="redis"}"#, 5.0),
            ],
        );

        metrics.backends.forget_lock("ns/b");
        // A lock whose spec moved to another backend leaves the old one.
        metrics
            .backends
            .set_queue_depth("ns/c", BackendKind::Mongo, 4);
        metrics.backends.forget_lock("ns/unknown");
        let text = metrics.encode().expect("encode");
        assert_samples(
            &text,
            &[
                (r#"turnstile_queue_depth{backend="memory"}"#, 1.0),
                (r#"turnstile_queue_depth{backend="redis"}"#, 0.0),
                (r#"turnstile_queue_depth{backend="mongo"}"#, 4.0),
            ],
        );
    }

    #[test]
    fn an_expiry_counts_as_expired_and_as_lost() {
        let metrics = Metrics::new();
        metrics.grants.record_lock_lost(
            BackendKind::Redis,
            LockLostCause::Expired,
            Duration::from_secs(3),
        );
        metrics.grants.record_lock_lost(
            BackendKind::Redis,
            LockLostCause::LockDeleted,
            Duration::from_secs(1),
        );
        let text = metrics.encode().expect("encode");
        assert_samples(
            &text,
            &[
                (r#"turnstile_expiries_total{backend="redis"}"#, 1.0),
                (
                    r#"turnstile_lock_lost_total{backend="redis",cause="expired"}"#,
                    1.0,
                ),
                (
                    r#"turnstile_lock_lost_total{backend="redis",cause="lock_deleted"}"#,
                    1.0,
                ),
                (
                    r#"turnstile_hold_seconds_count{backend="redis",outcome="expired"}"#,
                    1.0,
                ),
                (
                    r#"turnstile_hold_seconds_count{backend="redis",outcome="lost"}"#,
                    1.0,
                ),
            ],
        );
    }

    #[test]
    fn the_exposition_ends_with_eof_and_declares_types() {
        let metrics = Metrics::new();
        metrics.replica.set_leader(true);
        let text = metrics.encode().expect("encode");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("# TYPE turnstile_grants counter"), "{text}");
        assert!(
            text.contains("# TYPE turnstile_wait_seconds histogram"),
            "{text}"
        );
        assert_eq!(sample(&text, "turnstile_leader"), Some(1.0));
        // Every series exists at zero before anything happened.
        assert_samples(
            &text,
            &[
                (r#"turnstile_grants_total{backend="mongo"}"#, 0.0),
                (
                    r#"turnstile_backend_errors_total{backend="redis",operation="raise_floor"}"#,
                    0.0,
                ),
                (r#"turnstile_reconcile_errors_total{kind="api"}"#, 0.0),
                (r#"turnstile_wait_seconds_count{backend="memory"}"#, 0.0),
                (
                    r#"turnstile_reconcile_total{controller="job",result="error"}"#,
                    0.0,
                ),
            ],
        );
    }

    #[test]
    fn a_reconcile_timer_counts_the_pass_by_result_when_dropped() {
        let metrics = Metrics::new();
        drop(metrics.reconciles.start(ControllerKind::Lock));
        let mut failed = metrics.reconciles.start(ControllerKind::Lock);
        failed.set_failed(true);
        drop(failed);
        let text = metrics.encode().expect("encode");
        for result in ["ok", "error"] {
            assert_eq!(
                sample(
                    &text,
                    &format!(r#"turnstile_reconcile_total{{controller="lock",result="{result}"}}"#)
                ),
                Some(1.0),
                "{text}"
            );
        }
        assert_eq!(
            sample(
                &text,
                r#"turnstile_reconcile_duration_seconds_count{controller="lock"}"#
            ),
            Some(2.0)
        );
    }
}
