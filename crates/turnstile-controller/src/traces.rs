//! OpenTelemetry traces of claims (opt-in: `turnstile run --otlp-endpoint`).
//!
//! Each claim gets a span for the time it waited (`turnstile.claim.wait`: from its arrival to
//! its grant, or to its end if it never got one) and one for the time it held its lock
//! (`turnstile.claim.hold`: from the grant to the grant's end), with the lock, namespace,
//! claim, backend and fencing token as attributes. The spans are made when the pass that
//! ends them writes the claim's status, with the times that status records, so a wait that
//! began under another replica is whole. A claim annotated with `turnstile.dev/traceparent`
//! (a W3C trace context, as the workload's own tracer writes it) gets both spans as children
//! of that span: they show in the workload's trace.

use std::collections::HashMap;
use std::time::SystemTime;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span, SpanKind, Status, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use turnstile_api::{ClaimPhase, LockClaim, LockClaimStatus, TRACEPARENT_ANNOTATION};

/// The span of a claim's wait.
pub const WAIT_SPAN: &str = "turnstile.claim.wait";
/// The span of a claim's grant.
pub const HOLD_SPAN: &str = "turnstile.claim.hold";

/// Makes the claims' spans (see the module docs).
#[derive(Clone, Debug)]
pub struct ClaimTraces {
    tracer: SdkTracer,
}

/// The lock a pass is about, as the spans name it.
#[derive(Debug, Clone, Copy)]
pub struct SpanLock<'a> {
    /// The lock's namespace.
    pub namespace: &'a str,
    /// The lock's name.
    pub name: &'a str,
    /// The backend that serves it.
    pub backend: &'a str,
}

impl ClaimTraces {
    /// Spans through `provider`'s exporter.
    pub fn new(provider: &SdkTracerProvider) -> Self {
        Self {
            tracer: provider.tracer("turnstile"),
        }
    }

    /// Records the spans that a change of `claim`'s status to `new` ends (`None`: the claim
    /// goes away with its finalizer, its status as it was). `now` ends a grant whose end the
    /// status does not record.
    pub fn record(
        &self,
        lock: SpanLock<'_>,
        claim: &LockClaim,
        new: Option<&LockClaimStatus>,
        now: Timestamp,
    ) {
        let old = claim.status.clone().unwrap_or_default();
        let old_phase = old.phase.unwrap_or_default();
        let parent = parent_of(claim);
        let attributes = |token: Option<i64>, reason: Option<&str>| {
            let mut attributes = vec![
                KeyValue::new("k8s.namespace.name", lock.namespace.to_owned()),
                KeyValue::new("turnstile.lock", lock.name.to_owned()),
                KeyValue::new("turnstile.claim", claim.name_any()),
                KeyValue::new("turnstile.backend", lock.backend.to_owned()),
            ];
            if let Some(token) = token {
                attributes.push(KeyValue::new("turnstile.fencing_token", token));
            }
            if let Some(reason) = reason {
                attributes.push(KeyValue::new("turnstile.reason", reason.to_owned()));
            }
            attributes
        };
        // Where a wait starts: the arrival its status records, else the claim's creation.
        let arrival = |status: &LockClaimStatus| {
            status.arrived_at.as_ref().map(|at| at.0).or(claim
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|at| at.0))
        };
        let acquired = old.acquired_at.as_ref().map_or(now, |at| at.0);
        match new {
            Some(new) if old_phase != ClaimPhase::Held && new.phase == Some(ClaimPhase::Held) => {
                let granted = new.acquired_at.as_ref().map_or(now, |at| at.0);
                self.span(
                    WAIT_SPAN,
                    &parent,
                    arrival(new).unwrap_or(granted),
                    granted,
                    attributes(new.fencing_token, new.reason.as_deref()),
                    None,
                );
            }
            Some(new)
                if old_phase == ClaimPhase::Pending
                    && new.phase.is_some_and(ClaimPhase::is_terminal) =>
            {
                // It never got the lock (timed out, busy, superseded...).
                let ended = new.released_at.as_ref().map_or(now, |at| at.0);
                let why = new.reason.clone().unwrap_or_default();
                self.span(
                    WAIT_SPAN,
                    &parent,
                    arrival(&old).unwrap_or(now),
                    ended,
                    attributes(new.fencing_token, new.reason.as_deref()),
                    Some(why),
                );
            }
            Some(new) if old_phase == ClaimPhase::Held && new.phase != Some(ClaimPhase::Held) => {
                // The grant's token, whatever the new status keeps of it.
                let ended = new.released_at.as_ref().map_or(now, |at| at.0);
                let attributes = attributes(old.fencing_token, new.reason.as_deref());
                self.span(HOLD_SPAN, &parent, acquired, ended, attributes, None);
            }
            None if old_phase == ClaimPhase::Held => {
                // A deleted holder: its grant ends as it goes.
                let attributes = attributes(old.fencing_token, Some("ClaimDeleted"));
                self.span(HOLD_SPAN, &parent, acquired, now, attributes, None);
            }
            _ => {}
        }
    }

    fn span(
        &self,
        name: &'static str,
        parent: &Context,
        start: Timestamp,
        end: Timestamp,
        attributes: Vec<KeyValue>,
        failed: Option<String>,
    ) {
        let mut span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(SystemTime::from(start))
            .with_attributes(attributes)
            .start_with_context(&self.tracer, parent);
        if let Some(why) = failed {
            span.set_status(Status::error(why));
        }
        span.end_with_timestamp(SystemTime::from(end.max(start)));
    }
}

/// The workload's span the claim names in `turnstile.dev/traceparent`, else no parent.
fn parent_of(claim: &LockClaim) -> Context {
    let Some(traceparent) = claim.annotations().get(TRACEPARENT_ANNOTATION) else {
        return Context::new();
    };
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.trim().to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn a_traceparent_annotation_is_the_parent_and_a_bad_one_is_none() {
        let mut claim = LockClaim::new("c", turnstile_api::LockClaimSpec::for_lock("db"));
        claim.annotations_mut().insert(
            TRACEPARENT_ANNOTATION.to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        );
        let parent = parent_of(&claim);
        let context = parent.span().span_context().clone();
        assert_eq!(
            context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");
        claim
            .annotations_mut()
            .insert(TRACEPARENT_ANNOTATION.to_owned(), "not a trace".to_owned());
        assert!(!parent_of(&claim).span().span_context().is_valid());
    }
}
