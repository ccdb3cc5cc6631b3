//! Publishing the core's Events (and logging them with structured fields).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

use super::core::{EventSeverity, PlannedEvent};

/// Publishes `event` about the object `regarding`. A failed publish is logged and otherwise
/// ignored: Events are for people, never a reason to fail or repeat a pass.
pub async fn publish(
    recorder: &Recorder,
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
    match event.severity {
        // Phase changes are logged (with the token) where the status is written.
        EventSeverity::Normal => tracing::debug!(
            namespace,
            lock,
            claim,
            reason = event.reason,
            "{}",
            event.note
        ),
        EventSeverity::Warning => tracing::warn!(
            namespace,
            lock,
            claim,
            reason = event.reason,
            "{}",
            event.note
        ),
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
    if let Err(error) = recorder.publish(&published, regarding).await {
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
