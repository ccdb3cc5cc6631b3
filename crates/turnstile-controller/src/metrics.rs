//! Prometheus metrics of the controller, and the HTTP server for `/metrics`, `/healthz` and
//! `/readyz`.
//!
//! Label values come from closed enums ([`BackendKind`], [`LockLostCause`],
//! [`BackendOperation`], [`ReconcileErrorKind`]), so the number of series is bounded by
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
//! | `turnstile_reconcile_errors_total` | counter | `kind` | failed reconciliations: `api`, `backend`, `other` |
//! | `turnstile_leader` | gauge | | 1 while this replica leads |
//! | `turnstile_invalid_objects` | gauge | | locks and claims the controller cannot read (skipped; each has a Warning Event) |
//!
//! The reconciler calls the `record_*`/`set_*` methods of a shared [`Metrics`] (cheap to
//! clone); [`serve`] exposes it:
//!
//! ```no_run
//! # async fn demo() -> Result<(), turnstile_controller::metrics::MetricsError> {
//! use turnstile_api::BackendKind;
//! use turnstile_controller::metrics::{self, Metrics, Readiness};
//! let metrics = Metrics::new();
//! let readiness = Readiness::new();
//! let server = tokio::spawn(metrics::serve(
//!     "0.0.0.0:8080".parse().expect("a socket address"),
//!     metrics.clone(),
//!     readiness.clone(),
//!     std::future::pending(),
//! ));
//! readiness.set_ready(true); // caches synced
//! metrics.record_grant(BackendKind::Memory, std::time::Duration::from_millis(40));
//! # drop(server); Ok(()) }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};
use tokio::net::TcpListener;

pub use turnstile_api::BackendKind;

/// The `Content-Type` of `/metrics` (OpenMetrics text, which Prometheus scrapes natively).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Errors of the metrics server.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server stopped on an I/O error.
    #[error("metrics server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// Why a holder lost its grant (label `cause` of `turnstile_lock_lost_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockLostCause {
    /// The lease ran out without a renewal.
    Expired,
    /// The backend no longer had the grant (restart, data loss, eviction).
    BackendLost,
    /// The DistributedLock was deleted while the claim held it.
    LockDeleted,
}

impl LockLostCause {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::BackendLost => "backend_lost",
            Self::LockDeleted => "lock_deleted",
        }
    }
}

/// The backend call that failed (label `operation` of `turnstile_backend_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendOperation {
    /// Connecting or checking the connection.
    Connect,
    /// A grant attempt.
    Acquire,
    /// A lease extension.
    Extend,
    /// A release.
    Release,
    /// Raising the fencing counter to the lock's high-water mark.
    RaiseFloor,
}

impl BackendOperation {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Acquire => "acquire",
            Self::Extend => "extend",
            Self::Release => "release",
            Self::RaiseFloor => "raise_floor",
        }
    }
}

/// What made a reconciliation fail (label `kind` of `turnstile_reconcile_errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReconcileErrorKind {
    /// A Kubernetes API call failed (conflict, network, server error).
    Api,
    /// The lock backend failed.
    Backend,
    /// Anything else.
    Other,
}

impl ReconcileErrorKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Backend => "backend",
            Self::Other => "other",
        }
    }
}

/// How a grant ended (label `outcome` of `turnstile_hold_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum HoldOutcome {
    Released,
    Expired,
    Lost,
}

impl HoldOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Expired => "expired",
            Self::Lost => "lost",
        }
    }
}

/// The `backend` label: [`BackendKind`] is the API crate's, so the label encoding wraps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct BackendLabel(BackendKind);

impl BackendLabel {
    fn as_str(self) -> &'static str {
        self.0.as_str()
    }
}

/// Encodes any of the closed label enums by its `as_str`.
macro_rules! label_value {
    ($($kind:ty),*) => {$(
        impl EncodeLabelValue for $kind {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                EncodeLabelValue::encode(&self.as_str(), encoder)
            }
        }
    )*};
}
label_value!(
    BackendLabel,
    LockLostCause,
    BackendOperation,
    ReconcileErrorKind,
    HoldOutcome
);

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BackendLabels {
    backend: BackendLabel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LostLabels {
    backend: BackendLabel,
    cause: LockLostCause,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HoldLabels {
    backend: BackendLabel,
    outcome: HoldOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BackendErrorLabels {
    backend: BackendLabel,
    operation: BackendOperation,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReconcileErrorLabels {
    kind: ReconcileErrorKind,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Registers `metric` (a handle sharing its values) and returns it for recording.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// From 5 ms up to about 6 hours: waits range from an instant handoff to a long queue.
fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 4.0, 12))
}

/// From 100 ms up to about 29 hours: holds last from a quick critical section to a day.
fn hold_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 4.0, 11))
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    grants: Family<BackendLabels, Counter>,
    renewals: Family<BackendLabels, Counter>,
    releases: Family<BackendLabels, Counter>,
    expiries: Family<BackendLabels, Counter>,
    lock_lost: Family<LostLabels, Counter>,
    claim_failures: Family<BackendLabels, Counter>,
    wait_seconds: HistogramFamily<BackendLabels>,
    hold_seconds: HistogramFamily<HoldLabels>,
    queue_depth: Family<BackendLabels, Gauge>,
    backend_errors: Family<BackendErrorLabels, Counter>,
    reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    leader: Gauge,
    invalid_objects: Gauge,
    /// Each lock's last reported queue, so `queue_depth` stays a sum over locks without a
    /// per-lock label.
    queues: Mutex<HashMap<String, (BackendKind, i64)>>,
}

/// The controller's metrics: a registry and handles to record into it. Clones share them.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every Turnstile metric registered (prefix `turnstile_`).
    pub fn new() -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("turnstile");
        let grants = register(registry, "grants", "Claims granted", Family::default());
        let renewals = register(registry, "renewals", "Leases renewed", Family::default());
        let releases = register(
            registry,
            "releases",
            "Grants released (on request, on deletion, owner finished)",
            Family::default(),
        );
        let expiries = register(
            registry,
            "expiries",
            "Grants whose lease ran out without a renewal",
            Family::default(),
        );
        let lock_lost = register(
            registry,
            "lock_lost",
            "Grants their holder lost (expired, lost by the backend, lock deleted)",
            Family::default(),
        );
        let claim_failures = register(
            registry,
            "claim_failures",
            "Claims failed without being granted",
            Family::default(),
        );
        let wait_seconds = register(
            registry,
            "wait_seconds",
            "Time from a claim's creation to its grant",
            HistogramFamily::new_with_constructor(wait_histogram),
        );
        let hold_seconds = register(
            registry,
            "hold_seconds",
            "Time from a grant to its end",
            HistogramFamily::new_with_constructor(hold_histogram),
        );
        let queue_depth = register(
            registry,
            "queue_depth",
            "Claims waiting behind the holders, summed over locks",
            Family::default(),
        );
        let backend_errors = register(
            registry,
            "backend_errors",
            "Failed lock backend calls",
            Family::default(),
        );
        let reconcile_errors = register(
            registry,
            "reconcile_errors",
            "Failed reconciliations",
            Family::default(),
        );
        let leader = register(
            registry,
            "leader",
            "1 while this replica is the leader",
            Gauge::default(),
        );
        let invalid_objects = register(
            registry,
            "invalid_objects",
            "Locks and claims the controller cannot read (skipped until fixed)",
            Gauge::default(),
        );
        let metrics = Self {
            inner: Arc::new(Inner {
                registry: root,
                grants,
                renewals,
                releases,
                expiries,
                lock_lost,
                claim_failures,
                wait_seconds,
                hold_seconds,
                queue_depth,
                backend_errors,
                reconcile_errors,
                leader,
                invalid_objects,
                queues: Mutex::new(HashMap::new()),
            }),
        };
        metrics.create_every_series();
        metrics
    }

    /// Creates every labelled series at zero, so a scrape shows the full set from the start
    /// (`rate()` and absence alerts work before the first grant). The label sets are closed
    /// enums, so this is a small fixed number of series.
    fn create_every_series(&self) {
        const BACKENDS: [BackendKind; 3] =
            [BackendKind::Memory, BackendKind::Redis, BackendKind::Mongo];
        const CAUSES: [LockLostCause; 3] = [
            LockLostCause::Expired,
            LockLostCause::BackendLost,
            LockLostCause::LockDeleted,
        ];
        const OUTCOMES: [HoldOutcome; 3] = [
            HoldOutcome::Released,
            HoldOutcome::Expired,
            HoldOutcome::Lost,
        ];
        const OPERATIONS: [BackendOperation; 5] = [
            BackendOperation::Connect,
            BackendOperation::Acquire,
            BackendOperation::Extend,
            BackendOperation::Release,
            BackendOperation::RaiseFloor,
        ];
        let inner = &self.inner;
        // `get_or_create` creates the series; the read guard it returns is not needed.
        for backend in BACKENDS {
            let labels = BackendLabels {
                backend: BackendLabel(backend),
            };
            for family in [
                &inner.grants,
                &inner.renewals,
                &inner.releases,
                &inner.expiries,
                &inner.claim_failures,
            ] {
                drop(family.get_or_create(&labels));
            }
            drop(inner.wait_seconds.get_or_create(&labels));
            drop(inner.queue_depth.get_or_create(&labels));
            for cause in CAUSES {
                drop(inner.lock_lost.get_or_create(&LostLabels {
                    backend: BackendLabel(backend),
                    cause,
                }));
            }
            for outcome in OUTCOMES {
                drop(inner.hold_seconds.get_or_create(&HoldLabels {
                    backend: BackendLabel(backend),
                    outcome,
                }));
            }
            for operation in OPERATIONS {
                drop(inner.backend_errors.get_or_create(&BackendErrorLabels {
                    backend: BackendLabel(backend),
                    operation,
                }));
            }
        }
        for kind in [
            ReconcileErrorKind::Api,
            ReconcileErrorKind::Backend,
            ReconcileErrorKind::Other,
        ] {
            drop(
                inner
                    .reconcile_errors
                    .get_or_create(&ReconcileErrorLabels { kind }),
            );
        }
    }

    /// A claim on a `backend` lock was granted after waiting `waited` since its creation.
    pub fn record_grant(&self, backend: BackendKind, waited: Duration) {
        let labels = BackendLabels {
            backend: BackendLabel(backend),
        };
        self.inner.grants.get_or_create(&labels).inc();
        self.inner
            .wait_seconds
            .get_or_create(&labels)
            .observe(waited.as_secs_f64());
    }

    /// A holder's lease was renewed.
    pub fn record_renewal(&self, backend: BackendKind) {
        self.inner
            .renewals
            .get_or_create(&BackendLabels {
                backend: BackendLabel(backend),
            })
            .inc();
    }

    /// A grant was released after being held `held_for`.
    pub fn record_release(&self, backend: BackendKind, held_for: Duration) {
        self.inner
            .releases
            .get_or_create(&BackendLabels {
                backend: BackendLabel(backend),
            })
            .inc();
        self.observe_hold(backend, HoldOutcome::Released, held_for);
    }

    /// A grant expired after being held `held_for`; also counts as a lost lock
    /// (cause `expired`).
    pub fn record_expiry(&self, backend: BackendKind, held_for: Duration) {
        self.inner
            .expiries
            .get_or_create(&BackendLabels {
                backend: BackendLabel(backend),
            })
            .inc();
        self.inner
            .lock_lost
            .get_or_create(&LostLabels {
                backend: BackendLabel(backend),
                cause: LockLostCause::Expired,
            })
            .inc();
        self.observe_hold(backend, HoldOutcome::Expired, held_for);
    }

    /// A holder lost its grant after `held_for`. For expiries call [`Self::record_expiry`],
    /// which also counts `turnstile_expiries_total`.
    pub fn record_lock_lost(&self, backend: BackendKind, cause: LockLostCause, held_for: Duration) {
        if cause == LockLostCause::Expired {
            self.record_expiry(backend, held_for);
            return;
        }
        self.inner
            .lock_lost
            .get_or_create(&LostLabels {
                backend: BackendLabel(backend),
                cause,
            })
            .inc();
        self.observe_hold(backend, HoldOutcome::Lost, held_for);
    }

    /// A claim failed without being granted (acquire timeout, invalid spec, unknown lock).
    pub fn record_claim_failed(&self, backend: BackendKind) {
        self.inner
            .claim_failures
            .get_or_create(&BackendLabels {
                backend: BackendLabel(backend),
            })
            .inc();
    }

    /// A backend call failed.
    pub fn record_backend_error(&self, backend: BackendKind, operation: BackendOperation) {
        self.inner
            .backend_errors
            .get_or_create(&BackendErrorLabels {
                backend: BackendLabel(backend),
                operation,
            })
            .inc();
    }

    /// A reconciliation failed.
    pub fn record_reconcile_error(&self, kind: ReconcileErrorKind) {
        self.inner
            .reconcile_errors
            .get_or_create(&ReconcileErrorLabels { kind })
            .inc();
    }

    /// The lock `lock` (any stable key, e.g. `namespace/name`; never exported) now has
    /// `waiting` claims queued. Call it after each reconciliation of the lock.
    pub fn set_queue_depth(&self, lock: &str, backend: BackendKind, waiting: u64) {
        let waiting = i64::try_from(waiting).unwrap_or(i64::MAX);
        let mut queues = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = queues.insert(lock.to_string(), (backend, waiting));
        self.shift_queue_depth(previous, Some((backend, waiting)));
    }

    /// The lock `lock` is gone: its waiting claims leave `turnstile_queue_depth`.
    pub fn forget_lock(&self, lock: &str) {
        let mut queues = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = queues.remove(lock);
        self.shift_queue_depth(previous, None);
    }

    /// How many locks and claims cannot be read (`turnstile_invalid_objects`).
    pub fn set_invalid_objects(&self, count: usize) {
        self.inner
            .invalid_objects
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Whether this replica leads (`turnstile_leader`).
    pub fn set_leader(&self, leading: bool) {
        self.inner.leader.set(i64::from(leading));
    }

    /// The registry, for registering more metrics' encoders elsewhere or encoding by hand.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Every metric in the OpenMetrics text format (what `/metrics` serves).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.inner.registry)?;
        Ok(text)
    }

    fn observe_hold(&self, backend: BackendKind, outcome: HoldOutcome, held_for: Duration) {
        self.inner
            .hold_seconds
            .get_or_create(&HoldLabels {
                backend: BackendLabel(backend),
                outcome,
            })
            .observe(held_for.as_secs_f64());
    }

    /// Moves one lock's contribution from `previous` to `current` (called under the
    /// `queues` lock, so concurrent updates of one lock cannot interleave).
    fn shift_queue_depth(
        &self,
        previous: Option<(BackendKind, i64)>,
        current: Option<(BackendKind, i64)>,
    ) {
        if let Some((backend, waiting)) = previous {
            self.inner
                .queue_depth
                .get_or_create(&BackendLabels {
                    backend: BackendLabel(backend),
                })
                .dec_by(waiting);
        }
        if let Some((backend, waiting)) = current {
            self.inner
                .queue_depth
                .get_or_create(&BackendLabels {
                    backend: BackendLabel(backend),
                })
                .inc_by(waiting);
        }
    }
}

/// Whether the controller is ready (its caches synced). Clones share the flag; `/readyz`
/// answers 503 until [`Readiness::set_ready`]`(true)`.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
}

impl Readiness {
    /// Not ready yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the state `/readyz` reports.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// The state `/readyz` reports.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

#[derive(Debug, Clone)]
struct ServerState {
    metrics: Metrics,
    readiness: Readiness,
}

/// The routes: `GET /metrics`, `GET /healthz` (200 while the runtime answers), `GET /readyz`
/// (200 when ready, 503 before).
pub fn router(metrics: Metrics, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ServerState { metrics, readiness })
}

/// Binds `addr` and serves [`router`] until `shutdown` completes.
pub async fn serve<F>(
    addr: SocketAddr,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: F,
) -> Result<(), MetricsError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })?;
    serve_on(listener, metrics, readiness, shutdown).await
}

/// Serves [`router`] on an already bound listener until `shutdown` completes.
pub async fn serve_on<F>(
    listener: TcpListener,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: F,
) -> Result<(), MetricsError>
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    axum::serve(listener, router(metrics, readiness))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(MetricsError::Serve)
}

async fn scrape(State(state): State<ServerState>) -> Response {
    match state.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response(),
        Err(error) => {
            tracing::error!(%error, "encoding the metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding the metrics failed\n",
            )
                .into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<ServerState>) -> Response {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: caches not synced\n",
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn queue_depth_is_a_sum_over_locks_that_forgets_deleted_locks() {
        let metrics = Metrics::new();
        metrics.set_queue_depth("ns/a", BackendKind::Memory, 3);
        metrics.set_queue_depth("ns/b", BackendKind::Memory, 2);
        metrics.set_queue_depth("ns/c", BackendKind::Redis, 5);
        metrics.set_queue_depth("ns/a", BackendKind::Memory, 1);
        let text = metrics.encode().expect("encode");
        assert_eq!(
            sample(&text, r#"turnstile_queue_depth{backend="memory"}"#),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, r#"turnstile_queue_depth{backend="redis"}"#),
            Some(5.0)
        );

        metrics.forget_lock("ns/b");
        // A lock whose spec moved to another backend leaves the old one.
        metrics.set_queue_depth("ns/c", BackendKind::Mongo, 4);
        metrics.forget_lock("ns/unknown");
        let text = metrics.encode().expect("encode");
        assert_eq!(
            sample(&text, r#"turnstile_queue_depth{backend="memory"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"turnstile_queue_depth{backend="redis"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, r#"turnstile_queue_depth{backend="mongo"}"#),
            Some(4.0)
        );
    }

    #[test]
    fn an_expiry_counts_as_expired_and_as_lost() {
        let metrics = Metrics::new();
        metrics.record_lock_lost(
            BackendKind::Redis,
            LockLostCause::Expired,
            Duration::from_secs(3),
        );
        metrics.record_lock_lost(
            BackendKind::Redis,
            LockLostCause::LockDeleted,
            Duration::from_secs(1),
        );
        let text = metrics.encode().expect("encode");
        assert_eq!(
            sample(&text, r#"turnstile_expiries_total{backend="redis"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"turnstile_lock_lost_total{backend="redis",cause="expired"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"turnstile_lock_lost_total{backend="redis",cause="lock_deleted"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"turnstile_hold_seconds_count{backend="redis",outcome="expired"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"turnstile_hold_seconds_count{backend="redis",outcome="lost"}"#
            ),
            Some(1.0)
        );
    }

    #[test]
    fn the_exposition_ends_with_eof_and_declares_types() {
        let metrics = Metrics::new();
        metrics.set_leader(true);
        let text = metrics.encode().expect("encode");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("# TYPE turnstile_grants counter"), "{text}");
        assert!(
            text.contains("# TYPE turnstile_wait_seconds histogram"),
            "{text}"
        );
        assert_eq!(sample(&text, "turnstile_leader"), Some(1.0));
        // Every series exists at zero before anything happened.
        assert_eq!(
            sample(&text, r#"turnstile_grants_total{backend="mongo"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"turnstile_backend_errors_total{backend="redis",operation="raise_floor"}"#
            ),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, r#"turnstile_reconcile_errors_total{kind="api"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, r#"turnstile_wait_seconds_count{backend="memory"}"#),
            Some(0.0)
        );
    }
}
