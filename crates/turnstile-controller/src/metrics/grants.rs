//! The life of grants: how many, how long claims waited, how long grants were held and how
//! they ended.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::labels::{
    BackendLabel, BackendLabels, HoldLabels, HoldOutcome, LockLostCause, LostLabels,
};
use super::{create_at_zero, register, HistogramFamily};
use turnstile_api::BackendKind;

/// From 5 ms up to about 6 hours: waits range from an instant handoff to a long queue.
fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 4.0, 12))
}

/// From 100 ms up to about 29 hours: holds last from a quick critical section to a day.
fn hold_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 4.0, 11))
}

/// `turnstile_grants_total`, `_renewals_total`, `_releases_total`, `_expiries_total`,
/// `_lock_lost_total`, `_claim_failures_total`, `_wait_seconds` and `_hold_seconds`.
#[derive(Debug, Clone)]
pub struct GrantMetrics {
    grants: Family<BackendLabels, Counter>,
    renewals: Family<BackendLabels, Counter>,
    releases: Family<BackendLabels, Counter>,
    expiries: Family<BackendLabels, Counter>,
    lock_lost: Family<LostLabels, Counter>,
    claim_failures: Family<BackendLabels, Counter>,
    wait_seconds: HistogramFamily<BackendLabels>,
    hold_seconds: HistogramFamily<HoldLabels>,
}

impl GrantMetrics {
    /// Registers the series in `registry`, every label set at zero.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            grants: register(registry, "grants", "Claims granted", Family::default()),
            renewals: register(registry, "renewals", "Leases renewed", Family::default()),
            releases: register(
                registry,
                "releases",
                "Grants released (on request, on deletion, owner finished)",
                Family::default(),
            ),
            expiries: register(
                registry,
                "expiries",
                "Grants whose lease ran out without a renewal",
                Family::default(),
            ),
            lock_lost: register(
                registry,
                "lock_lost",
                "Grants their holder lost (expired, lost by the backend, lock deleted)",
                Family::default(),
            ),
            claim_failures: register(
                registry,
                "claim_failures",
                "Claims failed without being granted",
                Family::default(),
            ),
            wait_seconds: register(
                registry,
                "wait_seconds",
                "Time from a claim's creation to its grant",
                HistogramFamily::new_with_constructor(wait_histogram),
            ),
            hold_seconds: register(
                registry,
                "hold_seconds",
                "Time from a grant to its end",
                HistogramFamily::new_with_constructor(hold_histogram),
            ),
        };
        for backend in BackendLabel::ALL {
            let labels = BackendLabels { backend };
            for family in [
                &metrics.grants,
                &metrics.renewals,
                &metrics.releases,
                &metrics.expiries,
                &metrics.claim_failures,
            ] {
                create_at_zero(family, &labels);
            }
            create_at_zero(&metrics.wait_seconds, &labels);
            for cause in LockLostCause::ALL {
                create_at_zero(&metrics.lock_lost, &LostLabels { backend, cause });
            }
            for outcome in HoldOutcome::ALL {
                create_at_zero(&metrics.hold_seconds, &HoldLabels { backend, outcome });
            }
        }
        metrics
    }

    /// A claim on a `backend` lock was granted after waiting `waited` since its creation.
    pub fn record_grant(&self, backend: BackendKind, waited: Duration) {
        let labels = BackendLabels::of(backend);
        self.grants.get_or_create(&labels).inc();
        self.wait_seconds
            .get_or_create(&labels)
            .observe(waited.as_secs_f64());
    }

    /// A holder's lease was renewed.
    pub fn record_renewal(&self, backend: BackendKind) {
        self.renewals
            .get_or_create(&BackendLabels::of(backend))
            .inc();
    }

    /// A grant was released after being held `held_for`.
    pub fn record_release(&self, backend: BackendKind, held_for: Duration) {
        self.releases
            .get_or_create(&BackendLabels::of(backend))
            .inc();
        self.observe_hold(backend, HoldOutcome::Released, held_for);
    }

    /// A grant expired after being held `held_for`; also counts as a lost lock
    /// (cause `expired`).
    pub fn record_expiry(&self, backend: BackendKind, held_for: Duration) {
        self.expiries
            .get_or_create(&BackendLabels::of(backend))
            .inc();
        self.lock_lost
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
        self.lock_lost
            .get_or_create(&LostLabels {
                backend: BackendLabel(backend),
                cause,
            })
            .inc();
        self.observe_hold(backend, HoldOutcome::Lost, held_for);
    }

    /// A claim failed without being granted (acquire timeout, invalid spec, unknown lock).
    pub fn record_claim_failed(&self, backend: BackendKind) {
        self.claim_failures
            .get_or_create(&BackendLabels::of(backend))
            .inc();
    }

    fn observe_hold(&self, backend: BackendKind, outcome: HoldOutcome, held_for: Duration) {
        self.hold_seconds
            .get_or_create(&HoldLabels {
                backend: BackendLabel(backend),
                outcome,
            })
            .observe(held_for.as_secs_f64());
    }
}
