//! This replica's own state: whether it leads, and what it cannot read.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::register;

/// `turnstile_leader`, `turnstile_invalid_objects` and `turnstile_events_skipped_total`.
#[derive(Debug, Clone)]
pub struct ReplicaMetrics {
    leader: Gauge,
    invalid_objects: Gauge,
    events_skipped: Counter,
}

impl ReplicaMetrics {
    /// Registers the series in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            leader: register(
                registry,
                "leader",
                "1 while this replica is the leader",
                Gauge::default(),
            ),
            invalid_objects: register(
                registry,
                "invalid_objects",
                "Locks and claims the controller cannot read (skipped until fixed)",
                Gauge::default(),
            ),
            events_skipped: register(
                registry,
                "events_skipped",
                "Normal Events not published: over --events-per-second, or --events warnings",
                Counter::default(),
            ),
        }
    }

    /// The count of `Normal` Events held back (`turnstile_events_skipped_total`), for the
    /// Event publisher to increment.
    pub fn events_skipped(&self) -> Counter {
        self.events_skipped.clone()
    }

    /// Whether this replica leads (`turnstile_leader`).
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// How many locks and claims cannot be read (`turnstile_invalid_objects`).
    pub fn set_invalid_objects(&self, count: usize) {
        self.invalid_objects
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}
