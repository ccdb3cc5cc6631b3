//! Publishing Events: the core's (logged with structured fields too), the gates' and the
//! watches'.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;

use super::core::{EventSeverity, PlannedEvent};
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

/// Publishes Events through kube-runtime's [`Recorder`], keeping its cache only for the
/// Events that repeat.
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
}

impl EventPublisher {
    /// Publishes as `reporter` (the controller's name and this replica's instance).
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            repeating: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
        }
    }

    /// Publishes `event` about `regarding`.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        repeats: Repeats,
    ) -> Result<(), kube::Error> {
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
