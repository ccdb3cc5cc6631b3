//! Reconcile passes: how many, how they ended and how long they took, per controller.

use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::labels::{
    ControllerKind, ControllerLabels, ReconcileErrorKind, ReconcileErrorLabels, ReconcileLabels,
    ReconcileResult,
};
use super::{create_at_zero, register, HistogramFamily};

/// From 0.5 ms up to about 35 s: a pass is a few API and backend round trips.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 3.0, 11))
}

/// `turnstile_reconcile_total`, `turnstile_reconcile_duration_seconds` and
/// `turnstile_reconcile_errors_total`.
#[derive(Debug, Clone)]
pub struct ReconcileMetrics {
    passes: Family<ReconcileLabels, Counter>,
    duration: HistogramFamily<ControllerLabels>,
    errors: Family<ReconcileErrorLabels, Counter>,
}

impl ReconcileMetrics {
    /// Registers the series in `registry`, every label set at zero.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            passes: register(
                registry,
                "reconcile",
                "Reconcile passes, by controller and result",
                Family::default(),
            ),
            duration: register(
                registry,
                "reconcile_duration_seconds",
                "How long a reconcile pass took, by controller",
                HistogramFamily::new_with_constructor(duration_histogram),
            ),
            errors: register(
                registry,
                "reconcile_errors",
                "Failed reconciliations",
                Family::default(),
            ),
        };
        for controller in ControllerKind::ALL {
            create_at_zero(&metrics.duration, &ControllerLabels { controller });
            for result in ReconcileResult::ALL {
                create_at_zero(&metrics.passes, &ReconcileLabels { controller, result });
            }
        }
        for kind in ReconcileErrorKind::ALL {
            create_at_zero(&metrics.errors, &ReconcileErrorLabels { kind });
        }
        metrics
    }

    /// Starts measuring a pass of `controller`: the pass is counted and its duration observed
    /// when the returned timer is dropped (also when the pass is cancelled or panics).
    pub fn start(&self, controller: ControllerKind) -> ReconcileTimer {
        ReconcileTimer {
            metrics: self.clone(),
            controller,
            started: Instant::now(),
            result: ReconcileResult::Ok,
        }
    }

    /// A reconciliation failed.
    pub fn record_error(&self, kind: ReconcileErrorKind) {
        self.errors
            .get_or_create(&ReconcileErrorLabels { kind })
            .inc();
    }
}

/// Measures one pass (see [`ReconcileMetrics::start`]).
#[derive(Debug)]
pub struct ReconcileTimer {
    metrics: ReconcileMetrics,
    controller: ControllerKind,
    started: Instant,
    result: ReconcileResult,
}

impl ReconcileTimer {
    /// Counts the pass as failed (`result="error"`) when `failed`.
    pub fn set_failed(&mut self, failed: bool) {
        self.result = if failed {
            ReconcileResult::Error
        } else {
            ReconcileResult::Ok
        };
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        let controller = self.controller;
        self.metrics
            .passes
            .get_or_create(&ReconcileLabels {
                controller,
                result: self.result,
            })
            .inc();
        self.metrics
            .duration
            .get_or_create(&ControllerLabels { controller })
            .observe(self.started.elapsed().as_secs_f64());
    }
}
