//! The reconciler of claims whose `DistributedLock` does not exist: a template makes it
//! (`templates`), or they wait with a reason (and are granted by the lock's reconciler once it
//! appears), time out, or lose the grant of a lock that was deleted. Claims on a
//! `ClusterDistributedLock` that does not take their namespace wait here too
//! (`cluster_locks`). Claims of existing locks are left to the lock's reconciler, which sees
//! the whole queue.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};

use crate::runtime::caches::cache_filled;
use crate::runtime::context::Context;

use crate::core::{decide_unserved, ClaimChange, ClaimView, FinalizerChange, Unserved};
use crate::error::ControllerError;
use crate::metrics::{ControllerKind, ReconcileErrorKind};
use crate::pass::cluster_locks::{self, Admission};
use crate::templates::make_missing_locks;
use crate::writer::events::publish;
use crate::writer::{PassWrites, Write};
use turnstile_api::LockClaim;

/// Reconciles one claim if its lock is missing (see the module docs).
pub async fn reconcile_claim(
    claim: Arc<LockClaim>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    let mut timer = ctx.metrics.reconciles.start(ControllerKind::Claim);
    let result = reconcile_orphan(&claim, &ctx).await;
    timer.set_failed(result.is_err());
    result
}

/// Why no lock's pass decides about `claim`; `None` when one does.
async fn unserved(ctx: &Context, claim: &LockClaim) -> Result<Option<Unserved>, ControllerError> {
    let namespace = claim.namespace().unwrap_or_default();
    if claim.spec.claims_cluster_lock() {
        if let Some(locks) = &ctx.cache.cluster_locks {
            cache_filled(locks).await;
        }
        if let Some(namespaces) = &ctx.cache.namespaces {
            cache_filled(namespaces).await;
        }
        return Ok(match cluster_locks::admission(ctx, claim) {
            Admission::Admitted => None,
            Admission::LockMissing => Some(Unserved::LockMissing),
            Admission::NotAllowed(why) => Some(Unserved::NamespaceNotAllowed(why)),
        });
    }
    // A missing lock a template makes is made (nothing new goes into a namespace being
    // deleted); the new lock's pass takes the claim from there.
    if !ctx.cache.namespace_terminating(&namespace) && make_missing_locks(ctx, claim).await? {
        return Ok(None);
    }
    // A claim on several locks is its first lock's to decide while that lock exists (the
    // first lock's pass reports a missing other lock).
    let first_lock = claim.spec.locks().first().map(|lock| (*lock).to_owned());
    if ctx
        .cache
        .lock_exists(&namespace, first_lock.as_deref().unwrap_or_default())
    {
        return Ok(None);
    }
    Ok(Some(Unserved::LockMissing))
}

async fn reconcile_orphan(claim: &LockClaim, ctx: &Context) -> Result<Action, ControllerError> {
    // A claim must not be judged an orphan before the lock cache has been filled.
    cache_filled(&ctx.cache.locks).await;
    let namespace = claim.namespace().unwrap_or_default();
    let Some(why) = unserved(ctx, claim).await? else {
        return Ok(Action::await_change());
    };
    if ctx.cache.namespace_terminating(&namespace) && claim.metadata.deletion_timestamp.is_none() {
        // It goes with its namespace: nothing to write until the namespace controller marks
        // it for deletion (that event brings it back here, to remove the finalizer).
        return Ok(Action::await_change());
    }
    let view = match ClaimView::from_resource(claim) {
        Ok(view) => view.observed_arrival(ctx.cache.claim_index.arrival(claim)),
        Err(error) => {
            tracing::warn!(%error, "ignoring incomplete claim");
            return Ok(Action::await_change());
        }
    };
    let decision = decide_unserved(&view, &why, Timestamp::now());
    let api: Api<LockClaim> = Api::namespaced(ctx.api.client.clone(), &namespace);
    let writer = ctx.api.writer();
    let name = claim.name_any();
    let mut version = claim.resource_version();
    if let Some(status) = &decision.status {
        if let Some(write) = Write::status(&name, claim.status.as_ref(), status)? {
            version = writer
                .apply(&api, &write, version.as_deref())
                .await?
                .resource_version();
        }
    }
    if decision.remove_finalizer {
        let mut writes = PassWrites::new([(&name, claim)]);
        let removal = ClaimChange {
            name: name.clone(),
            status: None,
            finalizer: FinalizerChange::Remove,
        };
        for write in writes.claim_change(None, &removal)? {
            writer.apply(&api, &write, version.as_deref()).await?;
        }
    }
    if decision
        .status
        .as_ref()
        .is_some_and(|status| status.phase == Some(turnstile_api::ClaimPhase::Failed))
    {
        ctx.metrics
            .grants
            .record_claim_failed(ctx.backends.default_kind());
    }
    let regarding = claim.object_ref(&());
    for event in &decision.events {
        // The API server takes no new object into a namespace being deleted.
        if !writer.may_write() || ctx.cache.namespace_terminating(&namespace) {
            break;
        }
        publish(
            &ctx.api.events,
            &regarding,
            event,
            &namespace,
            &claim.spec.lock_name,
        )
        .await;
    }
    Ok(Action::requeue(decision.requeue_after))
}

/// The retry policy after a failed claim pass.
pub fn claim_error_policy(
    claim: Arc<LockClaim>,
    error: &ControllerError,
    ctx: Arc<Context>,
) -> Action {
    if error.is_not_leader() {
        tracing::info!(claim = %claim.name_any(), %error, "pass stopped");
        return Action::await_change();
    }
    ctx.metrics.reconciles.record_error(match error {
        ControllerError::Kube { .. } => ReconcileErrorKind::Api,
        _ => ReconcileErrorKind::Other,
    });
    let key = format!(
        "claim/{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    );
    let delay = ctx.retries.retry_delay(&key, error);
    error.log_failed_pass(&key, delay);
    Action::requeue(delay)
}
