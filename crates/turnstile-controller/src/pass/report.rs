//! What a pass tells the world once its writes are made: metrics (failed calls, grants,
//! queue depth), the backend's outage state, the claims' OpenTelemetry spans, and Events.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::ObjectRef;
use kube::Resource;

use crate::core::{
    BackendOp, BackendView, Decision, EventSubject, FinalizerChange, GrantEnd, LockInput,
    Observation, OpOutcome, PlannedOp,
};
use crate::metrics::{BackendOperation, LockLostCause, Metrics, ReconcileErrorKind};
use crate::runtime::context::Context;
use crate::traces::SpanLock;
use crate::writer::events::publish;
use turnstile_api::{BackendKind, ClusterDistributedLock, DistributedLock, LockClaim};

/// The backend's state after a pass: the queue-depth gauge, and the outage wake-ups (the
/// lock `woken_on_return`, if any, is woken when a backend that failed answers again).
pub(crate) fn record_backend_state(
    ctx: &Context,
    woken_on_return: Option<ObjectRef<DistributedLock>>,
    input: &LockInput,
    decision: &Decision,
    kind: BackendKind,
    backend_key: &str,
    reached_backend: bool,
) {
    if input.lock.deleting {
        ctx.metrics.backends.forget_lock(backend_key);
    } else {
        let waiting = decision
            .lock_status
            .as_ref()
            .map_or(input.lock.status.waiting, |status| status.waiting);
        ctx.metrics.backends.set_queue_depth(
            backend_key,
            kind,
            u64::try_from(waiting).unwrap_or(0),
        );
    }
    let backend_failed = decision.backend_failure.is_some()
        || matches!(input.backend, BackendView::Unavailable { .. });
    if let Some(lock_ref) = woken_on_return {
        if backend_failed {
            // Retried with backoff, or sooner: when the backend answers again
            // (`backend_outages`).
            ctx.retries.outages.failed(kind, lock_ref);
        } else if reached_backend {
            ctx.retries.outages.succeeded(kind, &lock_ref);
        }
    }
    if decision.backend_failure.is_some() {
        ctx.metrics
            .reconciles
            .record_error(ReconcileErrorKind::Backend);
    }
}

/// Counts the backend calls that failed, by operation.
pub(crate) fn record_failed_calls(
    metrics: &Metrics,
    backend: BackendKind,
    ops: &[PlannedOp],
    outcomes: &[OpOutcome],
) {
    for (planned, outcome) in ops.iter().zip(outcomes) {
        if matches!(outcome, OpOutcome::Failed { .. }) {
            let operation = match planned.op {
                BackendOp::RaiseFloor { .. } => BackendOperation::RaiseFloor,
                BackendOp::Acquire { .. } => BackendOperation::Acquire,
                BackendOp::Extend { .. } => BackendOperation::Extend,
                BackendOp::Release { .. } => BackendOperation::Release,
            };
            metrics.backends.record_error(backend, operation);
        }
    }
}

/// Feeds the pass's facts to the metrics.
pub(crate) fn record_observations(
    metrics: &Metrics,
    backend: BackendKind,
    observations: &[Observation],
) {
    for observation in observations {
        match observation {
            Observation::Granted { waited } => metrics.grants.record_grant(backend, *waited),
            Observation::Renewed => metrics.grants.record_renewal(backend),
            Observation::GrantEnded { end, held_for } => match end {
                GrantEnd::Released => metrics.grants.record_release(backend, *held_for),
                GrantEnd::Expired => metrics.grants.record_expiry(backend, *held_for),
                GrantEnd::BackendLost => {
                    metrics
                        .grants
                        .record_lock_lost(backend, LockLostCause::BackendLost, *held_for)
                }
                GrantEnd::LockDeleted => {
                    metrics
                        .grants
                        .record_lock_lost(backend, LockLostCause::LockDeleted, *held_for)
                }
                GrantEnd::Superseded => {
                    metrics
                        .grants
                        .record_lock_lost(backend, LockLostCause::Superseded, *held_for)
                }
                GrantEnd::ForceReleased => metrics.grants.record_lock_lost(
                    backend,
                    LockLostCause::ForceReleased,
                    *held_for,
                ),
            },
            Observation::Failed => metrics.grants.record_claim_failed(backend),
        }
    }
}

/// Records the spans of the claims whose status the pass wrote (with `only`, just those named
/// there) or whose finalizer it removed (see [`crate::traces`]).
pub(crate) fn record_spans(
    ctx: &Context,
    objects: &HashMap<String, Arc<LockClaim>>,
    input: &LockInput,
    decision: &Decision,
    backend: BackendKind,
    only: Option<&HashSet<String>>,
) {
    let Some(traces) = &ctx.api.traces else {
        return;
    };
    let lock = SpanLock {
        namespace: &input.lock.namespace,
        name: &input.lock.name,
        backend: backend.as_str(),
    };
    for change in &decision.claims {
        let Some(claim) = objects.get(&change.name) else {
            continue;
        };
        match &change.status {
            Some(status) if only.is_none_or(|only| only.contains(&change.name)) => {
                traces.record(lock, claim, Some(status), input.now);
            }
            None if only.is_none()
                && change.finalizer == FinalizerChange::Remove
                && claim.metadata.deletion_timestamp.is_some() =>
            {
                traces.record(lock, claim, None, input.now);
            }
            _ => {}
        }
    }
}

/// The object Events about the lock are about: the cluster lock, else the `DistributedLock`.
pub(crate) fn regarding(
    lock: &DistributedLock,
    cluster: Option<&ClusterDistributedLock>,
) -> ObjectReference {
    match cluster {
        Some(cluster) => cluster.object_ref(&()),
        None => lock.object_ref(&()),
    }
}

/// Publishes the pass's Events (those about the lock regarding `lock`); with `only`, just
/// those about the claims named there.
pub(crate) async fn publish_events(
    ctx: &Context,
    lock: &ObjectReference,
    objects: &HashMap<String, Arc<LockClaim>>,
    input: &LockInput,
    decision: &Decision,
    only: Option<&HashSet<String>>,
) {
    // The API server takes no new object into a namespace being deleted.
    if ctx.cache.namespace_terminating(&input.lock.namespace) {
        return;
    }
    for event in &decision.events {
        if !ctx.api.leadership.is_open() {
            return;
        }
        let regarding = match &event.subject {
            EventSubject::Lock if only.is_some() => continue,
            EventSubject::LockFor(name) | EventSubject::Claim(name)
                if only.is_some_and(|only| !only.contains(name)) =>
            {
                continue;
            }
            EventSubject::Lock | EventSubject::LockFor(_) => lock.clone(),
            EventSubject::Claim(name) => match objects.get(name) {
                Some(claim) => claim.object_ref(&()),
                None => continue,
            },
        };
        publish(
            &ctx.api.events,
            &regarding,
            event,
            &input.lock.namespace,
            &input.lock.name,
        )
        .await;
    }
}
