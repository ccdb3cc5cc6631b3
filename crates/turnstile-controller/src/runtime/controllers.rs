//! The controllers of one term, built on the term's [`Watches`]: the `DistributedLock`
//! controller (every lock with all its claims), the `LockClaim` controller (claims whose lock
//! does not exist), the Job and Pod gates, the `ClusterDistributedLock` controller (a
//! controller of all namespaces only), and the backend probe.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::{Config as ControllerRuntimeConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::watches::{Caches, ClaimFeeds, ClusterLockFeeds, Feeds, LockFeeds};
use crate::claim_reconciler::{claim_error_policy, reconcile_claim};
use crate::core::WorkloadKind;
use crate::gate::{run_gate, BlockedSaid, GateContext};
use crate::pass::cluster_locks;
use crate::pass::lock_reconciler::{
    cluster_lock_error_policy, lock_error_policy, reconcile_cluster_lock, reconcile_lock,
};
use crate::runtime::context::Context;
use crate::templates::claims_waiting_in;
use crate::wakes::backend_outages;
use crate::wakes::owner_watch::{cluster_owner_trigger, owner_trigger};
use turnstile_api::{DistributedLock, LockClaim, LockTemplate};

/// Passes of each controller that run at once. Each pass makes its API calls one after the
/// other (owner lookups: a few at once), so this bounds the requests in flight to the API
/// server; the kube client retries 429s and 503s after the server's `Retry-After`.
const MAX_CONCURRENT_PASSES: u16 = 16;

/// Runs every controller of a term on `feeds` until `stop` (a fresh one per controller).
pub(super) fn run_all<S>(
    feeds: Feeds,
    caches: &Caches,
    ctx: &Arc<Context>,
    gate_ctx: Arc<GateContext>,
    stop: impl Fn() -> S,
) -> impl Future<Output = ()> + Send
where
    S: Future<Output = ()> + Send + Sync + 'static,
{
    // No debounce: a lone event is handled at once. A burst still costs at most two passes,
    // as kube-runtime runs one pass of a lock at a time and folds every trigger that arrives
    // meanwhile into one more; and a pass woken by the first echo of its predecessor's writes
    // waits until the cache shows all of them (`own_writes`).
    let config = ControllerRuntimeConfig::default().concurrency(MAX_CONCURRENT_PASSES);
    let locks = lock_controller(feeds.locks, caches, ctx, config.clone(), stop());
    let claims = claim_controller(feeds.claims, caches, ctx, config.clone(), stop());
    let cluster_locks: BoxFuture<'static, ()> = match feeds.cluster_locks {
        Some(feeds) => cluster_lock_controller(feeds, caches, ctx.clone(), config, stop()).boxed(),
        None => futures::future::ready(()).boxed(),
    };
    let job_gate = run_gate(
        caches.jobs.clone(),
        feeds.job_gate.workloads,
        gate_ctx.clone(),
        feeds.job_gate.claims,
        stop(),
    );
    let pod_gate = run_gate(
        caches.gated_pods.clone(),
        feeds.pod_gate.workloads,
        gate_ctx,
        feeds.pod_gate.claims,
        stop(),
    );
    let probe = {
        let (ctx, stop) = (ctx.clone(), stop());
        async move { backend_outages::probe(&ctx.retries.outages, &ctx.backends, stop).await }
    };
    futures::future::join(
        futures::future::join5(locks, claims, job_gate, pod_gate, probe),
        cluster_locks,
    )
    .map(|_| ())
}

/// The gates' context: the lock controller's, and what only the gates keep.
pub(super) fn gate_context(ctx: &Arc<Context>) -> Arc<GateContext> {
    Arc::new(GateContext {
        shared: ctx.clone(),
        blocked_said: BlockedSaid::default(),
    })
}

/// The `DistributedLock` controller: a lock's pass is woken by the lock, by any of its claims
/// (a claim on several locks wakes each of them), and at once by a claim owner's finish or
/// deletion (see `owner_watch`), a backend's return or another lock's room (`ctx.retries.wakes`).
fn lock_controller(
    feeds: LockFeeds,
    caches: &Caches,
    ctx: &Arc<Context>,
    config: ControllerRuntimeConfig,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send {
    let controller = Controller::for_stream(feeds.locks, caches.locks.clone())
        .watches_shared_stream(feeds.claims, |claim: Arc<LockClaim>| {
            let namespace = claim.namespace().unwrap_or_default();
            claim
                .spec
                .locks()
                .into_iter()
                .map(|lock| ObjectRef::<DistributedLock>::new(lock).within(&namespace))
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(
            feeds.finished_pods,
            owner_trigger::<Pod>(
                caches.claims.clone(),
                ctx.cache.claim_index.clone(),
                WorkloadKind::Pod,
            ),
        )
        .watches_shared_stream(
            feeds.jobs,
            owner_trigger::<Job>(
                caches.claims.clone(),
                ctx.cache.claim_index.clone(),
                WorkloadKind::Job,
            ),
        )
        .with_config(config)
        .graceful_shutdown_on(stop);
    // Wake-ups no watch brings: a backend answers again (`backend_outages`), another lock of
    // a multi-lock claim admits it (`multi_lock`).
    let controller = match ctx.retries.wakes.take_stream() {
        Some(wakes) => controller.reconcile_on(wakes),
        None => controller,
    };
    let results = controller.run(reconcile_lock, lock_error_policy, ctx.clone());
    log_failed_passes(results, "lock controller")
}

/// The `LockClaim` controller: claims whose lock does not exist (a LockTemplate's change wakes
/// those of its namespace), and, in a controller of all namespaces, the claims a cluster lock
/// does not take (woken again when it or a namespace's labels change).
fn claim_controller(
    feeds: ClaimFeeds,
    caches: &Caches,
    ctx: &Arc<Context>,
    config: ControllerRuntimeConfig,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send {
    let controller = Controller::for_shared_stream(feeds.claims, caches.claims.clone())
        .watches_stream(feeds.templates, {
            let (claims, locks) = (caches.claims.clone(), caches.locks.clone());
            move |template: LockTemplate| claims_waiting_in(&template, &claims, &locks)
        });
    let controller = match feeds.cluster {
        Some((cluster_locks, namespaces)) => controller
            .watches_shared_stream(
                cluster_locks,
                cluster_locks::claims_of_lock(caches.claims.clone(), ctx.cache.claim_index.clone()),
            )
            .watches_shared_stream(
                namespaces,
                cluster_locks::claims_in_namespace(caches.claims.clone()),
            ),
        None => controller,
    };
    let results = controller
        .with_config(config)
        .graceful_shutdown_on(stop)
        .run(reconcile_claim, claim_error_policy, ctx.clone());
    log_failed_passes(results, "claim controller")
}

/// The `ClusterDistributedLock` controller (see `cluster_locks`).
fn cluster_lock_controller(
    feeds: ClusterLockFeeds,
    caches: &Caches,
    ctx: Arc<Context>,
    config: ControllerRuntimeConfig,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send {
    let (claims, index) = (caches.claims.clone(), ctx.cache.claim_index.clone());
    let results = Controller::for_shared_stream(feeds.locks, caches.cluster_locks.clone())
        .watches_shared_stream(feeds.claims, cluster_locks::lock_of_claim)
        .watches_shared_stream(
            feeds.namespaces,
            cluster_locks::every_lock(caches.cluster_locks.clone()),
        )
        .watches_shared_stream(
            feeds.jobs,
            cluster_owner_trigger::<Job>(claims.clone(), index.clone(), WorkloadKind::Job),
        )
        .watches_shared_stream(
            feeds.finished_pods,
            cluster_owner_trigger::<Pod>(claims, index, WorkloadKind::Pod),
        )
        .with_config(config)
        .graceful_shutdown_on(stop)
        .run(reconcile_cluster_lock, cluster_lock_error_policy, ctx);
    log_failed_passes(results, "cluster lock controller")
}

/// Drives a controller's stream of pass results; a failed pass is logged at debug (its error
/// policy has already scheduled the retry, and routine conflicts are not warnings).
async fn log_failed_passes<T, E: std::fmt::Display>(
    results: impl futures::Stream<Item = Result<T, E>>,
    controller: &'static str,
) {
    results
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "{controller}");
            }
        })
        .await;
}
