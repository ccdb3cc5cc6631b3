//! Step one of a lock's pass in the shell: what the core decides on — the lock, its claims
//! (read through the claim index, each with its owner's state and arrival), one snapshot of
//! the lock's backend key, and for claims on several locks their other locks (see
//! `multi_lock`) — and the time.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use crate::core::{claim_key, BackendView, ClaimView, LockInput, LockView};
use crate::metrics::BackendOperation;
use crate::pass::cluster_locks;
use crate::pass::multi_lock::{self, MemberEngines, OtherLock};
use crate::pass::owners::fill_owner_states;
use crate::runtime::backends::BackendLookupError;
use crate::runtime::context::Context;
use turnstile_api::{error_chain, BackendKind, ClusterDistributedLock, DistributedLock, LockClaim};
use turnstile_lock::Backend;

/// The claims of `lock` in the cache, with their objects by name in the pass ([`claim_key`];
/// read through the index: a pass costs its own claims, not the whole cache). A
/// `ClusterDistributedLock`'s are those it admits (see `cluster_locks`).
pub(super) fn claims_of(
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
pub(super) fn lock_view(ctx: &Context, lock: &DistributedLock) -> LockView {
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

/// What a pass starts from, besides the claims' objects.
pub(super) struct Gathered {
    /// The core's input.
    pub(super) input: LockInput,
    /// Where the calls on the other locks of claims on several locks are made.
    pub(super) member_engines: MemberEngines,
    /// The lock's backend kind.
    pub(super) kind: BackendKind,
    /// The lock's key in it.
    pub(super) backend_key: String,
    /// The backend, when it answered.
    pub(super) backend: Option<Arc<dyn Backend>>,
}

/// Observes what the pass decides on: the claims (with their owners' states and, for claims
/// on several locks, their other locks), the backend's snapshot, the time.
pub(super) async fn gather(
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
