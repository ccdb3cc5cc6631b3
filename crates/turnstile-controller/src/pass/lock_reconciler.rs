//! The reconciler of one `DistributedLock`: gathers the lock, all its claims and a backend
//! snapshot, runs one pass on them ([`run_pass`]: the core decides, the backend calls are made
//! on the lock engine ([`execute`]), only what changed is written), and does what follows:
//! metrics, Events, wakes, the requeue. The controller's property tests run the same
//! [`run_pass`] over a simulated API server.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tracing::Instrument;

use crate::core::{
    claim_address, claim_key, fold, plan, BackendOp, BackendView, CallTerms, ClaimView, Decision,
    ExecutionGate, LockInput, LockView, OpOutcome, Plan, PlannedOp,
};
use crate::error::ControllerError;
use crate::metrics::{BackendOperation, ControllerKind, ReconcileErrorKind};
use crate::pass::backend_call::perform;
use crate::pass::cluster_locks;
use crate::pass::multi_lock::{self, MemberEngines, OtherLock};
use crate::pass::owners::fill_owner_states;
use crate::pass::report::{
    publish_events, record_backend_state, record_failed_calls, record_observations, record_spans,
    regarding,
};
use crate::runtime::backends::BackendLookupError;
use crate::runtime::caches::cache_filled;
use crate::runtime::context::Context;
use crate::templates;
use crate::writer::{ApiStore, PassStore, PassWriter};
use turnstile_api::{error_chain, BackendKind, ClusterDistributedLock, DistributedLock, LockClaim};
use turnstile_lock::Backend;

/// The claims of `lock` in the cache, with their objects by name in the pass ([`claim_key`];
/// read through the index: a pass costs its own claims, not the whole cache). A
/// `ClusterDistributedLock`'s are those it admits (see `cluster_locks`).
fn claims_of(
    ctx: &Context,
    lock: &LockView,
    cluster: Option<&ClusterDistributedLock>,
) -> HashMap<String, Arc<LockClaim>> {
    ctx.cache
        .claim_index
        .claims_of_lock(&ctx.cache.claims, &lock.namespace, &lock.name)
        .into_iter()
        .filter(|claim| {
            cluster.is_none_or(|cluster| cluster_locks::admits(ctx, cluster, claim).is_ok())
        })
        .map(|claim| {
            let namespace = claim.namespace().unwrap_or_default();
            (
                claim_key(&lock.namespace, &namespace, &claim.name_any()),
                claim,
            )
        })
        .collect()
}

/// The claims' views, each seen from lock `lock` with its arrival and its owner token in
/// this cluster, named as in `objects` (incomplete objects are skipped).
fn claim_views(
    ctx: &Context,
    objects: &HashMap<String, Arc<LockClaim>>,
    lock: &str,
) -> Vec<ClaimView> {
    objects
        .iter()
        .filter_map(|(name, claim)| match ClaimView::for_lock(claim, lock) {
            Ok(view) => Some(
                ClaimView {
                    name: name.clone(),
                    ..view
                }
                .in_cluster(ctx.backends.cluster_name())
                .observed_arrival(ctx.cache.claim_index.arrival(claim)),
            ),
            Err(error) => {
                tracing::warn!(%error, "ignoring incomplete claim");
                None
            }
        })
        .collect()
}

/// The core's view of `lock`, counted as being deleted when its namespace is.
fn lock_view(ctx: &Context, lock: &DistributedLock) -> LockView {
    LockView::from_resource(lock).going_with_namespace(
        ctx.cache
            .namespace_terminating(&lock.namespace().unwrap_or_default()),
    )
}

/// One snapshot of `lock`'s key in its backend, and the backend when it answered.
async fn backend_of(ctx: &Context, lock: &LockView) -> (BackendView, Option<Arc<dyn Backend>>) {
    let kind = lock.spec.backend.unwrap_or(ctx.backends.default_kind());
    match ctx.backends.get(kind).await {
        Ok(backend) => match backend.snapshot(&lock.backend_key()).await {
            Ok(snapshot) => (
                BackendView::Ready {
                    backend: kind,
                    snapshot,
                },
                Some(backend),
            ),
            Err(error) => (
                BackendView::Unavailable {
                    backend: kind,
                    message: error_chain(&error),
                },
                None,
            ),
        },
        Err(BackendLookupError::NotConfigured(_)) => {
            (BackendView::NotConfigured { backend: kind }, None)
        }
        Err(BackendLookupError::Unavailable(error)) => (
            BackendView::Unavailable {
                backend: kind,
                message: error_chain(&error),
            },
            None,
        ),
    }
}

/// The other locks of the multi-lock claims `lock` is first for, each read once: from the
/// caches, and one snapshot of its backend.
async fn other_locks(
    ctx: &Context,
    lock: &LockView,
    claims: &[ClaimView],
) -> HashMap<String, OtherLock> {
    let mut others = HashMap::new();
    for name in multi_lock::other_locks_needed(lock, claims) {
        // A lock that does not exist is left out: the claim's pass sees it missing.
        let Some(object) = ctx
            .cache
            .locks
            .get(&ObjectRef::new(&name).within(&lock.namespace))
        else {
            continue;
        };
        let view = lock_view(ctx, &object);
        let claims = claim_views(ctx, &claims_of(ctx, &view, None), &name);
        let (backend_view, backend) = backend_of(ctx, &view).await;
        let other = OtherLock {
            lock: view,
            claims,
            backend,
            view: backend_view,
        };
        others.insert(name, other);
    }
    others
}

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

/// What a pass starts from, besides the claims' objects.
struct Gathered {
    input: LockInput,
    member_engines: MemberEngines,
    kind: BackendKind,
    backend_key: String,
    backend: Option<Arc<dyn Backend>>,
}

/// Observes what the pass decides on: the claims (with their owners' states and, for claims
/// on several locks, their other locks), the backend's snapshot, the time.
async fn gather(
    ctx: &Context,
    view: LockView,
    objects: &HashMap<String, Arc<LockClaim>>,
) -> Gathered {
    let mut claims = claim_views(ctx, objects, &view.name);
    fill_owner_states(
        &ctx.api.client,
        ctx.cache.owners.as_ref(),
        &view.namespace,
        &mut claims,
    )
    .await;
    let kind = view.spec.backend.unwrap_or(ctx.backends.default_kind());
    let backend_key = view.backend_key();
    let (backend_view, backend) = backend_of(ctx, &view).await;
    if let BackendView::Unavailable { message, .. } = &backend_view {
        ctx.metrics
            .backends
            .record_error(kind, BackendOperation::Connect);
        tracing::warn!(backend = %kind, error = %message, "backend unavailable");
    }
    let now = Timestamp::now();
    let others = other_locks(ctx, &view, &claims).await;
    let member_engines = multi_lock::prepare(
        &view,
        &mut claims,
        &others,
        |name| ctx.cache.lock_exists(&view.namespace, name),
        now,
    );
    Gathered {
        input: LockInput {
            lock: view,
            claims,
            now,
            backend: backend_view,
            may_refresh_positions: ctx.api.position_refreshes.has_token(),
        },
        member_engines,
        kind,
        backend_key,
        backend,
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

/// The lock engine as a pass calls it: the backend and the lock's key in it.
#[derive(Clone, Copy)]
pub struct Engine<'a> {
    /// The backend that answered the pass's snapshot.
    pub backend: &'a dyn Backend,
    /// The lock's key in it.
    pub key: &'a str,
}

/// What one pass did (its writes' resourceVersions stay in the [`PassWriter`]).
#[derive(Debug)]
pub struct PassOutcome {
    /// The core's plan.
    pub planned: Plan,
    /// One outcome per planned call (none without an engine).
    pub outcomes: Vec<OpOutcome>,
    /// The core's decision on those outcomes.
    pub decision: Decision,
    /// `Ok` when every decided write landed; otherwise the first failure (no later write was
    /// made: the next pass recomputes from fresh state).
    pub applied: Result<(), ControllerError>,
}

/// One pass over a lock, the code the shell and the controller's property tests share: on
/// `input` (the views of the objects given to `writer`): plan, finalizers, the planned calls
/// — on `engine` (none when the backend did not answer), and on the other locks of claims on
/// several locks through `members` — while `may_write` says yes, fold, writes. The pass only
/// carries the core's plan out: it never changes the core's input or decision. `Err` when a
/// finalizer write failed: then no backend call was made.
pub async fn run_pass<S: PassStore>(
    writer: &mut PassWriter<'_, S>,
    input: &LockInput,
    engine: Option<Engine<'_>>,
    members: &MemberEngines,
    may_write: impl Fn() -> bool,
) -> Result<PassOutcome, ControllerError> {
    let planned = plan(input);
    writer
        .add_claim_finalizers(&planned.finalizers_to_add)
        .await?;
    let outcomes = match engine {
        Some(engine) => {
            execute_following(
                engine.backend,
                engine.key,
                planned.terms,
                &planned.ops,
                &may_write,
                members,
            )
            .await
        }
        None => Vec::new(),
    };
    let decision = fold(input, &planned, &outcomes);
    let applied = writer.apply(input, &decision).await;
    Ok(PassOutcome {
        planned,
        outcomes,
        decision,
        applied,
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

/// Performs `ops` in order on `backend` for the lock `key` (a semaphore of `max_holders`),
/// honouring the [`ExecutionGate`]: nothing runs after a failure, no grant runs after a
/// refused grant. Returns one outcome per op.
pub async fn execute(
    backend: &dyn Backend,
    key: &str,
    terms: CallTerms,
    ops: &[PlannedOp],
) -> Vec<OpOutcome> {
    execute_while(backend, key, terms, ops, || true).await
}

/// [`execute`], asking `may_write` right before each call: once it says no, that call and
/// every later one is [`OpOutcome::Skipped`] (a replica that lost the leadership must not
/// grant, even in a pass that was already running).
pub async fn execute_while(
    backend: &dyn Backend,
    key: &str,
    terms: CallTerms,
    ops: &[PlannedOp],
    may_write: impl Fn() -> bool,
) -> Vec<OpOutcome> {
    execute_following(
        backend,
        key,
        terms,
        ops,
        may_write,
        &MemberEngines::default(),
    )
    .await
}

/// [`execute_while`], the calls on the other locks of claims on several locks made through
/// `members` (see [`PlannedOp::on_lock`]).
pub async fn execute_following(
    backend: &dyn Backend,
    key: &str,
    terms: CallTerms,
    ops: &[PlannedOp],
    may_write: impl Fn() -> bool,
    members: &MemberEngines,
) -> Vec<OpOutcome> {
    let mut gate = ExecutionGate::default();
    let mut outcomes = Vec::with_capacity(ops.len());
    let mut stopped = false;
    for planned in ops {
        stopped = stopped || !may_write();
        if stopped || !gate.admits(planned) {
            outcomes.push(OpOutcome::Skipped);
            continue;
        }
        let outcome = match &planned.on_lock {
            None => perform(backend, key, terms, &planned.op)
                .await
                .unwrap_or_else(|error| OpOutcome::Failed {
                    message: error_chain(&error),
                }),
            Some(lock) => members.perform(lock, &planned.op).await,
        };
        tracing::debug!(
            key,
            lock = planned.on_lock.as_deref().unwrap_or(""),
            claim = planned.claim.as_deref().unwrap_or(""),
            op = ?planned.op,
            outcome = ?outcome,
            "backend call"
        );
        gate.record(planned, &outcome);
        outcomes.push(outcome);
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::core::{AcquirePurpose, BackendOp, Step};
    use turnstile_lock::MemoryBackend;

    fn grant(owner: &str) -> PlannedOp {
        PlannedOp {
            claim: Some(owner.to_owned()),
            op: BackendOp::Acquire {
                owner: owner.to_owned(),
                ttl: Duration::from_secs(60),
                purpose: AcquirePurpose::Grant,
                shared: true,
                queue: false,
            },
            on_lock: None,
            step: Step::LEAD,
        }
    }

    #[tokio::test]
    async fn calls_stop_once_writes_are_no_longer_allowed() {
        let backend = MemoryBackend::new();
        let ops = [grant("a"), grant("b"), grant("c")];
        // Leadership is lost after the first call.
        let asked = AtomicUsize::new(0);
        let terms = CallTerms {
            max_holders: 3,
            lock_delay: Duration::ZERO,
        };
        let outcomes = execute_while(&backend, "ns/db", terms, &ops, || {
            asked.fetch_add(1, Ordering::SeqCst) == 0
        })
        .await;
        assert!(
            matches!(outcomes[0], OpOutcome::Granted { .. }),
            "{outcomes:?}"
        );
        assert_eq!(outcomes[1..], [OpOutcome::Skipped, OpOutcome::Skipped]);
        let snapshot = backend.snapshot("ns/db").await.expect("snapshot");
        assert_eq!(
            snapshot.holders.len(),
            1,
            "only the call made before the loss"
        );
    }
}
