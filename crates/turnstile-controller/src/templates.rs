//! Locks made on first use from `LockTemplate`s, and deleted once unused.
//!
//! A claim naming a lock that does not exist gets it when a template of its namespace matches
//! the name ([`make_missing_locks`], from the claim reconciler, which sees every claim that
//! waits for a missing lock). The lock carries the template's spec and, when the template says
//! so, its unused lifetime; the lock's own pass deletes it once no claim has used it for that
//! long ([`unused_lock_due`]). A new claim on a lock being deleted waits, and gets the lock
//! made again.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};

use crate::error::ControllerError;
use crate::runtime::context::Context;
use crate::writer::Created;
use turnstile_api::{template_for, unused_lock_deadline, DistributedLock, LockClaim, LockTemplate};

/// Makes the locks `claim` names that do not exist and a template of its namespace matches.
/// Returns whether it made (or found just made) any: their passes take the claim from there.
pub async fn make_missing_locks(ctx: &Context, claim: &LockClaim) -> Result<bool, ControllerError> {
    let Some(templates) = &ctx.cache.templates else {
        return Ok(false);
    };
    let ended = claim
        .status
        .as_ref()
        .and_then(|status| status.phase)
        .is_some_and(|phase| phase.is_terminal());
    if claim.metadata.deletion_timestamp.is_some() || ended {
        return Ok(false);
    }
    let namespace = claim.namespace().unwrap_or_default();
    // Every claim event comes here: the template cache is read only for a lock that is missing.
    let missing: Vec<&str> = claim
        .spec
        .locks()
        .into_iter()
        .filter(|name| !ctx.cache.lock_exists(&namespace, name))
        .collect();
    if missing.is_empty() {
        return Ok(false);
    }
    let in_namespace: Vec<_> = templates
        .state()
        .into_iter()
        .filter(|template| template.namespace().as_deref() == Some(namespace.as_str()))
        .collect();
    let api: Api<DistributedLock> = Api::namespaced(ctx.api.client.clone(), &namespace);
    let writer = ctx.api.writer();
    let mut made = false;
    for name in missing {
        let Some(template) = template_for(in_namespace.iter().map(AsRef::as_ref), name) else {
            continue;
        };
        match writer
            .create(&api, &template.lock_named(&namespace, name))
            .await?
        {
            Created::New(_) => tracing::info!(
                namespace,
                lock = name,
                template = template.name_any(),
                claim = claim.name_any(),
                "made lock from template on first use"
            ),
            // Made meanwhile (another claim's pass, a user): it exists, which is all we want.
            Created::AlreadyExists => tracing::debug!(namespace, lock = name, "lock already made"),
        }
        made = true;
    }
    Ok(made)
}

/// For a lock made from a template with an unused lifetime and no live claim (`in_use`
/// false): deletes it once the lifetime is over, else says when to look again. `None` for
/// every other lock.
pub async fn unused_lock_due(
    ctx: &Context,
    lock: &DistributedLock,
    in_use: bool,
    now: Timestamp,
) -> Result<Option<Duration>, ControllerError> {
    if in_use || lock.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let Some(deadline) = unused_lock_deadline(lock) else {
        return Ok(None);
    };
    if deadline > now {
        let wait = Duration::try_from(deadline.duration_since(now)).unwrap_or(Duration::ZERO);
        return Ok(Some(wait + Duration::from_secs(1)));
    }
    let writer = ctx.api.writer();
    if !writer.may_write() {
        return Ok(None);
    }
    let namespace = lock.namespace().unwrap_or_default();
    let api: Api<DistributedLock> = Api::namespaced(ctx.api.client.clone(), &namespace);
    // Only the lock this pass judged: a lock made again since is a new object.
    if writer.delete(&api, lock).await? {
        tracing::info!(
            namespace,
            lock = lock.name_any(),
            "deleted unused lock made from a template"
        );
    }
    Ok(None)
}

/// The claims a template change may concern: those of its namespace waiting for a lock that
/// does not exist.
pub fn claims_waiting_in(
    template: &LockTemplate,
    claims: &Store<LockClaim>,
    locks: &Store<DistributedLock>,
) -> Vec<ObjectRef<LockClaim>> {
    let Some(namespace) = template.namespace() else {
        return Vec::new();
    };
    claims
        .state()
        .into_iter()
        .filter(|claim| claim.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|claim| {
            claim.spec.locks().into_iter().any(|lock| {
                locks
                    .get(&ObjectRef::new(lock).within(&namespace))
                    .is_none()
                    && template.spec.specificity(lock).is_some()
            })
        })
        .map(|claim| ObjectRef::from_obj(claim.as_ref()))
        .collect()
}
