//! The lock backends as the controller sees them: failed calls and the queues waiting on them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::{BackendErrorLabels, BackendLabel, BackendLabels, BackendOperation};
use super::{create_at_zero, register};
use turnstile_api::BackendKind;

/// `turnstile_backend_errors_total` and `turnstile_queue_depth`.
#[derive(Debug, Clone)]
pub struct BackendMetrics {
    errors: Family<BackendErrorLabels, Counter>,
    queue_depth: Family<BackendLabels, Gauge>,
    /// Each lock's last reported queue, so `queue_depth` stays a sum over locks without a
    /// per-lock label.
    queues: Arc<Mutex<HashMap<String, (BackendKind, i64)>>>,
}

impl BackendMetrics {
    /// Registers the series in `registry`, every label set at zero.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            errors: register(
                registry,
                "backend_errors",
                "Failed lock backend calls",
                Family::default(),
            ),
            queue_depth: register(
                registry,
                "queue_depth",
                "Claims waiting behind the holders, summed over locks",
                Family::default(),
            ),
            queues: Arc::default(),
        };
        for backend in BackendLabel::ALL {
            create_at_zero(&metrics.queue_depth, &BackendLabels { backend });
            for operation in BackendOperation::ALL {
                create_at_zero(&metrics.errors, &BackendErrorLabels { backend, operation });
            }
        }
        metrics
    }

    /// A backend call failed.
    pub fn record_error(&self, backend: BackendKind, operation: BackendOperation) {
        self.errors
            .get_or_create(&BackendErrorLabels {
                backend: BackendLabel(backend),
                operation,
            })
            .inc();
    }

    /// The lock `lock` (any stable key, e.g. `namespace/name`; never exported) now has
    /// `waiting` claims queued. Call it after each reconciliation of the lock.
    pub fn set_queue_depth(&self, lock: &str, backend: BackendKind, waiting: u64) {
        let waiting = i64::try_from(waiting).unwrap_or(i64::MAX);
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = queues.insert(lock.to_string(), (backend, waiting));
        self.shift_queue_depth(previous, Some((backend, waiting)));
    }

    /// The lock `lock` is gone: its waiting claims leave `turnstile_queue_depth`.
    pub fn forget_lock(&self, lock: &str) {
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = queues.remove(lock);
        self.shift_queue_depth(previous, None);
    }

    /// Moves one lock's contribution from `previous` to `current` (called under the
    /// `queues` lock, so concurrent updates of one lock cannot interleave).
    fn shift_queue_depth(
        &self,
        previous: Option<(BackendKind, i64)>,
        current: Option<(BackendKind, i64)>,
    ) {
        if let Some((backend, waiting)) = previous {
            self.queue_depth
                .get_or_create(&BackendLabels::of(backend))
                .dec_by(waiting);
        }
        if let Some((backend, waiting)) = current {
            self.queue_depth
                .get_or_create(&BackendLabels::of(backend))
                .inc_by(waiting);
        }
    }
}
