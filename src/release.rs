//! `turnstile release LOCK --reason TEXT`: an administrator ends a holder's grant now, on the
//! record.
//!
//! ```text
//! turnstile release db-migrations --reason "migration hung on a dead replica" [--claim C] [-n NS]
//! ```
//!
//! It finds the claim holding the lock (or checks that `--claim` does), asks the API server
//! who the caller is (`SelfSubjectReview`), and sets the annotations
//! `turnstile.dev/force-release` (the reason) and `turnstile.dev/force-released-by` (who) on
//! the claim. The controller then ends the grant as an involuntary end: the claim becomes
//! `Expired` with reason `ForceReleased` (so the holder is told as for any lost lock:
//! `turnstile lock` stops its command, `turnstile wait` and `kubectl wait` see the `Held`
//! condition go), a Warning Event on the claim and one on the lock say who and why, the
//! metric `turnstile_lock_lost_total{cause="force_released"}` counts it, a lock-delay starts,
//! and the next waiter is granted with a higher token. The command watches the claim until the
//! controller has ended the grant (or `--timeout` passes).

use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use turnstile_api::{
    ClaimPhase, LockClaim, FORCE_RELEASED_BY_ANNOTATION, FORCE_RELEASE_ANNOTATION,
};

use crate::exit_codes::release as exit_code;
use crate::exit_codes::USAGE;
use crate::oneshot::{client_in_namespace, existing_lock, init_logging, Outcome};

/// Flags of `turnstile release`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = exit_code::help())]
pub struct ReleaseArgs {
    /// The DistributedLock.
    pub lock: String,
    /// Why (shown in the claim's status and in the Events on the claim and the lock).
    #[arg(long)]
    pub reason: String,
    /// The holding claim to end (needed when several claims hold the lock).
    #[arg(long)]
    pub claim: Option<String>,
    /// Namespace of the lock; default: the kubeconfig's.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// How long to wait for the controller to end the grant.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub timeout: Duration,
}

/// Runs `turnstile release`.
pub async fn release_command(args: ReleaseArgs) -> Outcome {
    init_logging();
    if args.reason.trim().is_empty() {
        return Outcome::with_reason(USAGE, "--reason must say why (it is recorded)");
    }
    let (client, namespace) =
        match client_in_namespace(args.namespace.as_deref(), exit_code::ERROR).await {
            Ok(found) => found,
            Err(outcome) => return outcome,
        };
    let claims: Api<LockClaim> = Api::namespaced(client.clone(), &namespace);
    let holder = match holder_to_end(&client, &claims, &namespace, &args).await {
        Ok(holder) => holder,
        Err(outcome) => return outcome,
    };
    let name = holder.name_any();
    let mut annotations = serde_json::Map::new();
    annotations.insert(FORCE_RELEASE_ANNOTATION.into(), args.reason.trim().into());
    if let Some(user) = caller(&client).await {
        annotations.insert(FORCE_RELEASED_BY_ANNOTATION.into(), user.into());
    }
    // The uid in the patch: if the claim was deleted and made again meanwhile, nothing happens.
    let patch = serde_json::json!({"metadata": {
        "uid": holder.metadata.uid,
        "annotations": annotations,
    }});
    let patched = match claims
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(patched) => patched,
        Err(error) => {
            return Outcome::cannot(
                exit_code::ERROR,
                format!("annotate LockClaim {name} in namespace {namespace}"),
                &error,
            )
        }
    };
    let version = patched.resource_version().unwrap_or_default();
    wait_until_ended(&claims, &name, &version, &args).await
}

/// The claim whose grant to end: `--claim`, checked to hold the lock, or the lock's one holder.
async fn holder_to_end(
    client: &kube::Client,
    claims: &Api<LockClaim>,
    namespace: &str,
    args: &ReleaseArgs,
) -> Result<LockClaim, Outcome> {
    let locks: Api<turnstile_api::DistributedLock> = Api::namespaced(client.clone(), namespace);
    existing_lock(
        &locks,
        &args.lock,
        namespace,
        exit_code::ERROR,
        exit_code::LOCK_NOT_FOUND,
    )
    .await?;
    let listed = claims.list(&ListParams::default()).await.map_err(|error| {
        Outcome::cannot(
            exit_code::ERROR,
            format!("list LockClaims in namespace {namespace}"),
            &error,
        )
    })?;
    let mut holders: Vec<LockClaim> = listed
        .items
        .into_iter()
        .filter(|claim| claim.spec.locks().contains(&args.lock.as_str()))
        .filter(|claim| claim.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Held))
        .collect();
    let not_holding = |what: String| Outcome::with_reason(exit_code::NOT_HELD, what);
    match &args.claim {
        Some(wanted) => holders
            .into_iter()
            .find(|claim| claim.name_any() == *wanted)
            .ok_or_else(|| {
                not_holding(format!(
                    "LockClaim {wanted} does not hold lock {} in namespace {namespace}",
                    args.lock
                ))
            }),
        None if holders.len() == 1 => Ok(holders.remove(0)),
        None if holders.is_empty() => Err(not_holding(format!(
            "nobody holds lock {} in namespace {namespace}",
            args.lock
        ))),
        None => {
            let names: Vec<String> = holders.iter().map(ResourceExt::name_any).collect();
            Err(Outcome::with_reason(
                USAGE,
                format!(
                    "lock {} has {} holders ({}): name one with --claim",
                    args.lock,
                    names.len(),
                    names.join(", ")
                ),
            ))
        }
    }
}

/// The caller's user name, as the API server authenticated it; `None` where the server does
/// not answer `SelfSubjectReview` (then the API server's audit log is the record).
async fn caller(client: &kube::Client) -> Option<String> {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()?;
    review.status?.user_info?.username
}

/// Waits, on a watch of the claim from the version the annotation was written at, until the
/// controller ended its grant; prints how (the phase and message, also when the holder deleted
/// its claim right after: `turnstile lock` does).
async fn wait_until_ended(
    claims: &Api<LockClaim>,
    name: &str,
    version: &str,
    args: &ReleaseArgs,
) -> Outcome {
    let timeout_seconds = u32::try_from(args.timeout.as_secs().max(1)).unwrap_or(u32::MAX);
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(timeout_seconds.min(290));
    let deadline = tokio::time::Instant::now() + args.timeout;
    let timed_out = || {
        Outcome::with_reason(
            exit_code::TIMEOUT,
            format!(
                "LockClaim {name} is marked for release, but still held after {} (is the controller running?)",
                humantime::format_duration(args.timeout)
            ),
        )
    };
    let stream = match claims.watch(&params, version).await {
        Ok(stream) => stream,
        Err(error) => {
            return Outcome::cannot(exit_code::ERROR, format!("watch LockClaim {name}"), &error)
        }
    };
    let mut stream = std::pin::pin!(stream);
    loop {
        let next = match tokio::time::timeout_at(deadline, stream.try_next()).await {
            Err(_) | Ok(Ok(None)) => return timed_out(),
            Ok(Ok(Some(event))) => event,
            Ok(Err(error)) => {
                return Outcome::cannot(exit_code::ERROR, format!("watch LockClaim {name}"), &error)
            }
        };
        let (claim, deleted) = match next {
            WatchEvent::Added(claim) | WatchEvent::Modified(claim) => (claim, false),
            WatchEvent::Deleted(claim) => (claim, true),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(error) => {
                return Outcome::cannot(exit_code::ERROR, format!("watch LockClaim {name}"), &error)
            }
        };
        let status = claim.status.unwrap_or_default();
        if status.phase == Some(ClaimPhase::Held) && !deleted {
            continue;
        }
        let phase = status.phase.map_or("gone", ClaimPhase::as_str);
        println!("{name}: {phase} ({})", status.message.unwrap_or_default());
        return Outcome::quiet(exit_code::RELEASED);
    }
}
