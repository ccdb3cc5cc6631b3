//! The reconciler of one `DistributedLock` (or `ClusterDistributedLock`): a pass in three
//! steps, a module each — [`gather`](super::gather) what the core decides on,
//! [`run_pass`](super::execute::run_pass) (plan, the calls, fold, writes), then
//! [`report`](super::report) — and when to look again.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tracing::Instrument;

use crate::core::{claim_address, BackendOp, Decision, LockInput, LockView, OpOutcome, PlannedOp};
use crate::error::ControllerError;
use crate::metrics::{ControllerKind, ReconcileErrorKind};
use crate::pass::cluster_locks;
use crate::pass::execute::{run_pass, Engine, PassOutcome};
use crate::pass::gather::{claims_of, gather, lock_view, Gathered};
use crate::pass::report::{
    publish_events, record_backend_state, record_failed_calls, record_observations, record_spans,
    regarding,
};
use crate::runtime::caches::cache_filled;
use crate::runtime::context::Context;
use crate::templates;
use crate::writer::{ApiStore, PassWriter};
use turnstile_api::{ClusterDistributedLock, DistributedLock};
use turnstile_lock::Backend;

/// Reconciles one lock (see the module docs). Errors are retried with backoff by the caller.
pub async fn reconcile_lock(
    lock: Arc<DistributedLock>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    let mut timer = ctx.metrics.reconciles.start(ControllerKind::Lock);
    let view = lock_view(&ctx, &lock);
    let span = tracing::info_span!("reconcile", namespace = %view.namespace, lock = %view.name);
    let result = reconcile_inner(&lock, None, view, &ctx)
        .instrument(span)
        .await;
    timer.set_failed(result.is_err());
    result
}

/// The last pass's writes the caches do not show yet (see `own_writes`).
fn own_writes_pending(
    ctx: &Context,
    view: &LockView,
    cluster: Option<&ClusterDistributedLock>,
) -> Option<std::time::Duration> {
    let Some(cluster) = cluster else {
        return ctx.api.own_writes.pending(
            &view.namespace,
            &view.name,
            &ctx.cache.locks,
            &ctx.cache.claims,
        );
    };
    ctx.api.own_writes.pending_in_caches(
        &view.namespace,
        &view.name,
        || cluster_locks::cached_version(ctx, &cluster.name_any()),
        |key| {
            let (namespace, name) = claim_address(&view.namespace, key);
            ctx.cache
                .claims
                .get(&ObjectRef::new(name).within(namespace))
                .and_then(|claim| claim.resource_version())
        },
    )
}

/// One pass over `lock`: a `DistributedLock`, or the `cluster` lock as a namespaceless one
/// (see `cluster_locks`).
pub(crate) async fn reconcile_inner(
    lock: &DistributedLock,
    cluster: Option<&ClusterDistributedLock>,
    view: LockView,
    ctx: &Context,
) -> Result<Action, ControllerError> {
    // A pass over a half-filled cache would miss claims.
    cache_filled(&ctx.cache.claims).await;
    let pass_key = pass_key(&view);
    if let Some(wait) = own_writes_pending(ctx, &view, cluster) {
        // The events of the last pass's writes are on their way and will wake this lock.
        tracing::trace!(
            ?wait,
            "waiting for the cache to show the last pass's writes"
        );
        return Ok(Action::requeue(wait));
    }
    let objects = claims_of(ctx, &view, cluster);
    let Gathered {
        input,
        member_engines,
        kind,
        backend_key,
        backend,
    } = gather(ctx, view, &objects).await;
    let store = match cluster {
        None => ApiStore::new(
            ctx.api.writer(),
            ctx.api.client.clone(),
            &input.lock.namespace,
        ),
        Some(_) => ApiStore::for_cluster_lock(ctx.api.writer(), ctx.api.client.clone()),
    };
    let mut pass = PassWriter::new(store, lock, &objects);
    let engine = backend.as_deref().map(|backend| Engine {
        backend,
        key: &backend_key,
    });
    let PassOutcome {
        planned,
        outcomes,
        decision,
        applied,
    } = run_pass(&mut pass, &input, engine, &member_engines, || {
        ctx.api.leadership.is_open()
    })
    .await?;
    record_failed_calls(&ctx.metrics, kind, &planned.ops, &outcomes);
    if decision.refreshed_positions {
        ctx.api.position_refreshes.spend();
    }
    ctx.api.own_writes.record(
        &input.lock.namespace,
        &input.lock.name,
        pass.lock_written.take(),
        std::mem::take(&mut pass.written),
    );
    if let Err(error) = applied {
        // The statuses already written changed for good (the next pass sees them as they are
        // now): their Events would never be planned again, so they go out before the retry.
        let written = std::mem::take(&mut pass.statuses_written);
        record_spans(ctx, &objects, &input, &decision, kind, Some(&written));
        let regarding = regarding(lock, cluster);
        publish_events(ctx, &regarding, &objects, &input, &decision, Some(&written)).await;
        return Err(error);
    }
    // A cluster lock is retried with backoff only: the outage wake-ups name `DistributedLock`s.
    let woken_on_return = cluster.is_none().then(|| ObjectRef::from_obj(lock));
    if let (Some(lock), Some(backend)) = (&woken_on_return, &backend) {
        watch_backend_queue(ctx, backend, &backend_key, lock, &planned.ops, &outcomes);
    }
    record_backend_state(
        ctx,
        woken_on_return,
        &input,
        &decision,
        kind,
        &backend_key,
        backend.is_some(),
    );
    record_observations(&ctx.metrics, kind, &decision.observations);
    record_spans(ctx, &objects, &input, &decision, kind, None);
    publish_events(
        ctx,
        &regarding(lock, cluster),
        &objects,
        &input,
        &decision,
        None,
    )
    .await;
    // Claims on several locks that this one now admits: their first lock may grant them. A
    // lock being deleted ends such claims' grants: their first lock's pass does that.
    for claim in input.claims.iter().filter(|claim| {
        planned.admits_for_other_locks.contains(&claim.name)
            || (input.lock.deleting && claim.kept_by(&input.lock.name))
    }) {
        ctx.retries
            .wakes
            .wake(ObjectRef::new(claim.first_lock()).within(&input.lock.namespace));
    }
    next_pass(ctx, lock, cluster, &input, &decision, &pass_key).await
}

/// Claims the pass put in the backend's queue for `key` (refused while another cluster
/// holds it): `lock` is woken when the backend hands one of them the key.
fn watch_backend_queue(
    ctx: &Context,
    backend: &Arc<dyn Backend>,
    key: &str,
    lock: &ObjectRef<DistributedLock>,
    ops: &[PlannedOp],
    outcomes: &[OpOutcome],
) {
    for (planned, outcome) in ops.iter().zip(outcomes) {
        if let (
            BackendOp::Acquire {
                owner, queue: true, ..
            },
            OpOutcome::Busy { .. },
        ) = (&planned.op, outcome)
        {
            ctx.retries.queue_wakes.watch(
                backend.clone(),
                key,
                owner,
                lock.clone(),
                ctx.retries.wakes.clone(),
            );
        }
    }
}

/// When to look at the lock again: the decision's time, sooner when a lock made from a
/// template is due to go unused, and with backoff after a backend failure.
async fn next_pass(
    ctx: &Context,
    lock: &DistributedLock,
    cluster: Option<&ClusterDistributedLock>,
    input: &LockInput,
    decision: &Decision,
    pass_key: &str,
) -> Result<Action, ControllerError> {
    // A lock made from a template goes once unused for its lifetime.
    let in_use = input
        .claims
        .iter()
        .any(|claim| !claim.phase().is_terminal());
    let unused_due = match cluster {
        None => templates::unused_lock_due(ctx, lock, in_use, input.now).await?,
        Some(_) => None,
    };
    let requeue_after = unused_due.map_or(decision.requeue_after, |due| {
        due.min(decision.requeue_after)
    });
    Ok(match &decision.backend_failure {
        Some(_) => Action::requeue(ctx.retries.backoff(pass_key).min(requeue_after)),
        None => {
            // Also forgets API failures: the error policy counts them under the same key.
            ctx.retries.reset_backoff(pass_key);
            Action::requeue(requeue_after)
        }
    })
}

/// The key of one lock's passes in [`Context`]'s backoff, in the passes and in the error
/// policy alike. (Not the backend key: two locks may share one.) A cluster lock's has no
/// namespace: `lock//<name>`.
fn pass_key(lock: &LockView) -> String {
    format!("lock/{}/{}", lock.namespace, lock.name)
}

/// The retry policy after a failed pass (API errors; 409 Conflicts retry quickly).
pub fn lock_error_policy(
    lock: Arc<DistributedLock>,
    error: &ControllerError,
    ctx: Arc<Context>,
) -> Action {
    pass_error_policy(&LockView::from_resource(&lock), error, &ctx)
}

/// [`lock_error_policy`] for the lock `view`, whichever its kind.
pub(crate) fn pass_error_policy(view: &LockView, error: &ControllerError, ctx: &Context) -> Action {
    if error.is_not_leader() {
        // The controllers are stopping; the next leader takes the lock from here.
        tracing::info!(namespace = %view.namespace, lock = %view.name, %error, "pass stopped");
        return Action::await_change();
    }
    ctx.metrics.reconciles.record_error(match error {
        ControllerError::Kube { .. } => ReconcileErrorKind::Api,
        _ => ReconcileErrorKind::Other,
    });
    let key = pass_key(view);
    let delay = ctx.retries.retry_delay(&key, error);
    error.log_failed_pass(&key, delay);
    Action::requeue(delay)
}

/// Reconciles one cluster lock: the lock pass of `lock_reconciler` on it.
pub async fn reconcile_cluster_lock(
    lock: Arc<ClusterDistributedLock>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    let mut timer = ctx.metrics.reconciles.start(ControllerKind::Lock);
    if let Some(namespaces) = &ctx.cache.namespaces {
        // Admission reads the namespaces' labels.
        cache_filled(namespaces).await;
    }
    let pass_lock = lock.as_namespaceless_lock();
    let view = LockView::from_resource(&pass_lock);
    let span = tracing::info_span!("reconcile", cluster_lock = %view.name);
    let result = reconcile_inner(&pass_lock, Some(&lock), view, &ctx)
        .instrument(span)
        .await;
    timer.set_failed(result.is_err());
    result
}

/// The retry policy after a failed pass of a cluster lock (that of every lock).
pub fn cluster_lock_error_policy(
    lock: Arc<ClusterDistributedLock>,
    error: &ControllerError,
    ctx: Arc<Context>,
) -> Action {
    pass_error_policy(
        &LockView::from_resource(&lock.as_namespaceless_lock()),
        error,
        &ctx,
    )
}
