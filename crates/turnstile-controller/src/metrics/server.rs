//! The HTTP side: `/metrics` (OpenMetrics text), `/healthz` and `/readyz`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use super::Metrics;

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

/// Binds `addr` for [`serve`]; a taken or forbidden address is [`MetricsError::Bind`].
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, MetricsError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })
}

/// Serves [`router`] on `listener` (from [`bind`], or a test's own) until `shutdown` completes.
pub async fn serve<F>(
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
