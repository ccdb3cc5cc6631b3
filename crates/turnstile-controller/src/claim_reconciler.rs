//! The reconciler of claims whose `DistributedLock` does not exist: they wait with a reason
//! (and are granted by the lock's reconciler once it appears), time out, or lose the grant of
//! a lock that was deleted. Claims of existing locks are left to the lock's reconciler, which
//! sees the whole queue.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};

use super::context::{cache_filled, Context};
use turnstile_api::FINALIZER;

use super::core::{decide_orphan, ClaimView};
use super::error::ControllerError;
use super::events::publish;
use super::patch::{finalizers_patch, status_patch};
use crate::metrics::ReconcileErrorKind;
use turnstile_api::LockClaim;

/// Reconciles one claim if its lock is missing (see the module docs).
pub async fn reconcile_claim(
    claim: Arc<LockClaim>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    // A claim must not be judged an orphan before the lock cache has been filled.
    cache_filled(&ctx.locks).await;
    let namespace = claim.namespace().unwrap_or_default();
    if ctx.lock_exists(&namespace, &claim.spec.lock_name) {
        return Ok(Action::await_change());
    }
    let view = match ClaimView::from_resource(&claim) {
        Ok(view) => view,
        Err(error) => {
            tracing::warn!(%error, "ignoring incomplete claim");
            return Ok(Action::await_change());
        }
    };
    let decision = decide_orphan(&view, Timestamp::now());
    let api: Api<LockClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let name = claim.name_any();
    let mut version = claim.resource_version();
    if let Some(status) = &decision.status {
        if let Some(patch) = status_patch(claim.status.as_ref(), status, version.as_deref())? {
            ctx.leadership
                .check(&format!("writing status of claim {name}"))?;
            let updated = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| ControllerError::kube(format!("writing status of claim {name}"), e))?;
            version = updated.resource_version();
        }
    }
    if decision.remove_finalizer {
        let finalizers: Vec<String> = claim
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        ctx.leadership
            .check(&format!("removing finalizer of claim {name}"))?;
        let patch = finalizers_patch(&finalizers, version.as_deref());
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| ControllerError::kube(format!("removing finalizer of claim {name}"), e))?;
    }
    if decision
        .status
        .as_ref()
        .is_some_and(|status| status.phase == Some(turnstile_api::ClaimPhase::Failed))
    {
        ctx.metrics.record_claim_failed(ctx.backends.default_kind());
    }
    let regarding = claim.object_ref(&());
    for event in &decision.events {
        if !ctx.leadership.is_open() {
            break;
        }
        publish(
            &ctx.recorder,
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
    ctx.metrics.record_reconcile_error(match error {
        ControllerError::Kube { .. } => ReconcileErrorKind::Api,
        _ => ReconcileErrorKind::Other,
    });
    let key = format!(
        "claim/{}/{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    );
    let delay = ctx.retry_delay(&key, error);
    error.log_failed_pass(&key, delay);
    Action::requeue(delay)
}
