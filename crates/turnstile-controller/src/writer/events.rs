//! Publishing Events: the core's (logged with structured fields too), the gates' and the
//! watches'. An Event is an API write like any other, so `Normal` ones have a budget
//! ([`EventPolicy`]); a `Warning` is always published.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use prometheus_client::metrics::counter::Counter;

use crate::writer::budget::WriteBudget;

use crate::core::{EventSeverity, PlannedEvent};
use turnstile_api::event_reasons;

/// Whether an Event can be published again about the same object with the same reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeats {
    /// Said once in an object's life (a claim is `Acquired` once): nothing to merge it with.
    Never,
    /// Said again and again (a lease's renewals, a gate that stays blocked): repeats within
    /// six minutes become one Event whose count rises, as kube-runtime's [`Recorder`] makes them.
    Often,
}

/// Which `Normal` Events the controller publishes (`turnstile run --events`,
/// `--events-per-second`). Warnings (a lock lost, a bad spec, an unreadable object) are
/// never held back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventPolicy {
    /// Publish `Normal` Events (`Queued`, `Acquired`, `Released`, `Renewed`, ...) at all.
    pub normal: bool,
    /// At most this many `Normal` Events a second on average, in bursts of up to
    /// [`crate::writer::budget::BURST_SECONDS`] seconds' worth; the rest are counted in
    /// `turnstile_events_skipped_total` and logged at debug. Zero: no limit.
    pub normal_per_second: u32,
}

impl Default for EventPolicy {
    /// Every Event, `Normal` ones at up to 20 a second (bursts of 100): a wave of hand-offs
    /// then spends its API writes on the grants, and a quiet cluster sees every Event.
    fn default() -> Self {
        Self {
            normal: true,
            normal_per_second: 20,
        }
    }
}

/// Publishes Events through kube-runtime's [`Recorder`], keeping its cache only for the
/// Events that repeat, within the [`EventPolicy`].
///
/// The `Recorder` remembers every Event it published for six minutes, to merge repeats into a
/// series, and scans all of them on every publish. Most of the controller's Events are said
/// once per claim, so at 10 000 claims that memory was 30 MB of the controller's 76 MB (the
/// operator benchmark), and growing with the rate of grants. Those go through a `Recorder`
/// made for the one Event, which forgets it at once.
#[derive(Clone)]
pub struct EventPublisher {
    client: Client,
    reporter: Reporter,
    repeating: Recorder,
    policy: EventPolicy,
    budget: WriteBudget,
    skipped: Counter,
}

impl EventPublisher {
    /// Publishes as `reporter` (the controller's name and this replica's instance), within
    /// the default [`EventPolicy`].
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            repeating: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
            policy: EventPolicy::default(),
            budget: WriteBudget::unlimited(),
            skipped: Counter::default(),
        }
        .with_policy(EventPolicy::default(), Counter::default())
    }

    /// The same publisher within `policy`, counting the Events it holds back in `skipped`.
    pub fn with_policy(mut self, policy: EventPolicy, skipped: Counter) -> Self {
        self.budget = WriteBudget::new(policy.normal_per_second);
        self.policy = policy;
        self.skipped = skipped;
        self
    }

    /// Whether a `Normal` Event may be published now (taking from the budget).
    fn normal_allowed(&self) -> bool {
        self.policy.normal && self.budget.try_take()
    }

    /// Publishes `event` about `regarding`, unless it is `Normal` and the policy holds it back
    /// (then it is counted, and `Ok`).
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        repeats: Repeats,
    ) -> Result<(), kube::Error> {
        if matches!(event.type_, EventType::Normal) && !self.normal_allowed() {
            self.skipped.inc();
            tracing::debug!(
                reason = event.reason,
                name = regarding.name.as_deref().unwrap_or_default(),
                "Event not published (--events, --events-per-second)"
            );
            return Ok(());
        }
        match repeats {
            Repeats::Often => self.repeating.publish(event, regarding).await,
            Repeats::Never => {
                Recorder::new(self.client.clone(), self.reporter.clone())
                    .publish(event, regarding)
                    .await
            }
        }
    }
}

/// Publishes `event` about the object `regarding`. A failed publish is logged and otherwise
/// ignored: Events are for people, never a reason to fail or repeat a pass.
pub async fn publish(
    events: &EventPublisher,
    regarding: &ObjectReference,
    event: &PlannedEvent,
    namespace: &str,
    lock: &str,
) {
    let claim = regarding
        .kind
        .as_deref()
        .filter(|kind| *kind == "LockClaim")
        .and(regarding.name.as_deref())
        .unwrap_or("");
    // Logs the Event at the level `$level` (tracing's levels are fixed per call site).
    macro_rules! log_at {
        ($level:ident) => {
            tracing::$level!(
                namespace,
                lock,
                claim,
                reason = event.reason,
                "{}",
                event.note
            )
        };
    }
    match event.severity {
        // Phase changes are logged (with the token) where the status is written.
        EventSeverity::Normal => log_at!(debug),
        EventSeverity::Warning => log_at!(warn),
    }
    let published = Event {
        type_: match event.severity {
            EventSeverity::Normal => EventType::Normal,
            EventSeverity::Warning => EventType::Warning,
        },
        reason: event.reason.to_owned(),
        note: Some(truncate(&event.note, 1000)),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    // A lease is renewed every half of it; everything else happens once to a claim.
    let repeats = if event.reason == event_reasons::RENEWED {
        Repeats::Often
    } else {
        Repeats::Never
    };
    if let Err(error) = events.publish(&published, regarding, repeats).await {
        tracing::debug!(namespace, lock, claim, %error, "cannot publish event");
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}
