//! `turnstile wait`: block until a LockClaim is `Held`, for init containers and scripts.
//!
//! ```text
//! turnstile wait "$(POD_NAME)-db" --create --lock db-migrations --timeout 10m
//! ```
//!
//! With `--create` the claim is created owned by the current Pod (name, uid and namespace
//! from the downward API: `POD_NAME`, `POD_UID`, `POD_NAMESPACE`), so the controller renews
//! the grant while the Pod runs and releases it when the Pod finishes. The wait runs on a
//! watch of the one claim; when it is `Held` the fencing token is printed on stdout (and
//! written to `--token-file`). Any other ending exits non-zero with one line on stderr; see
//! [`exit_codes::wait`].
//!
//! A client-side `--timeout` leaves the claim queued: an init container restarted by the
//! kubelet finds its claim again and keeps its place in the queue.

mod create;
mod verdict;

use std::path::PathBuf;
use std::pin::pin;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::time::Instant;

use crate::exit_codes::{self, wait as exit_code};
use crate::lock::WhenBusy;
use crate::oneshot::{init_logging, namespace_apis, Outcome};
use turnstile_api::error_chain;
use turnstile_api::{ClaimPhase, ClusterDistributedLock, DistributedLock, LockClaim, LockKind};

pub use self::create::{
    check_adoptable, claim_for_pod, create_or_adopt, AdoptError, Created, PodIdentity,
};
pub use self::verdict::{assess, describe, Verdict};

/// How often the existence of a DistributedLock is asked for before an error is accepted.
const LOCK_CHECK_ATTEMPTS: u32 = 3;
/// Pause between those attempts.
const LOCK_CHECK_PAUSE: Duration = Duration::from_secs(1);
/// Longest pause between watch retries after errors.
const MAX_WATCH_BACKOFF: Duration = Duration::from_secs(5);

/// Flags of `turnstile wait`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = exit_code::help())]
pub struct WaitArgs {
    /// The LockClaim to wait for.
    pub claim: String,
    /// Create the claim, owned by this Pod, if it does not exist yet (needs --lock, POD_NAME,
    /// POD_UID).
    #[arg(long, requires = "lock")]
    pub create: bool,
    /// With --create: the DistributedLock the claim asks for.
    #[arg(long, requires = "create", value_name = "NAME")]
    pub lock: Option<String>,
    /// With --create: --lock names a ClusterDistributedLock (one lock for the namespaces it
    /// selects) instead of a DistributedLock of the namespace.
    #[arg(long, requires = "create")]
    pub cluster: bool,
    /// Give up after this long (e.g. 30s, 10m); default: wait as long as it takes.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Namespace of the claim; default: the Pod's (POD_NAMESPACE), else the kubeconfig's.
    #[arg(long, short = 'n', env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// With --create: the owning Pod's name (downward API `metadata.name`).
    #[arg(long, env = "POD_NAME", value_name = "NAME")]
    pub pod_name: Option<String>,
    /// With --create: the owning Pod's uid (downward API `metadata.uid`).
    #[arg(long, env = "POD_UID", value_name = "UID")]
    pub pod_uid: Option<String>,
    /// Also write the fencing token to this file (e.g. on a volume shared with the app).
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// With --create: what to do when the lock is busy: `wait` (queue), `fail` (the claim
    /// fails at once, never queued: exit 3), `replace-pending` (queue, and end the older
    /// waiting claims of --group), `cancel-in-progress` (also end the grant of --group's
    /// older holder).
    #[arg(long, value_enum, default_value_t = WhenBusy::Wait, requires = "create")]
    pub when_busy: WhenBusy,
    /// With --create: the claim's concurrency group (a branch, an environment), which
    /// replace-pending and cancel-in-progress need.
    #[arg(
        long,
        requires = "create",
        required_if_eq_any = [("when_busy", "replace-pending"), ("when_busy", "cancel-in-progress")]
    )]
    pub group: Option<String>,
}

/// Runs `turnstile wait` and says how it ended.
pub async fn wait_command(args: WaitArgs) -> Outcome {
    init_logging();
    let owner = match owner_pod(&args) {
        Ok(owner) => owner,
        Err(outcome) => return outcome,
    };
    let mut last_seen = None;
    let waiting = wait_for_claim(&args, owner.as_ref(), &mut last_seen);
    let Some(timeout) = args.timeout else {
        return waiting.await;
    };
    match tokio::time::timeout_at(Instant::now() + timeout, waiting).await {
        Ok(outcome) => outcome,
        Err(_elapsed) => Outcome::with_reason(
            exit_code::TIMEOUT,
            format!(
                "timed out after {} waiting for LockClaim {} to be Held; it is {}",
                humantime::format_duration(timeout),
                args.claim,
                last_seen
                    .as_ref()
                    .map_or_else(|| "not read yet".to_owned(), describe)
            ),
        ),
    }
}

/// The Pod to own a `--create`d claim, from the flags or the downward API.
fn owner_pod(args: &WaitArgs) -> Result<Option<PodIdentity>, Outcome> {
    if !args.create {
        return Ok(None);
    }
    let given = |value: &Option<String>| value.clone().filter(|value| !value.is_empty());
    let (Some(name), Some(uid)) = (given(&args.pod_name), given(&args.pod_uid)) else {
        return Err(Outcome::with_reason(
            exit_codes::USAGE,
            "--create needs the Pod's name and uid: set POD_NAME and POD_UID from the downward \
             API (fieldRef metadata.name / metadata.uid), or pass --pod-name and --pod-uid",
        ));
    };
    // An ownerReference must point into the claim's own namespace, or the garbage collector
    // treats the owner as gone and deletes the claim.
    if let (Ok(pod_namespace), Some(namespace)) =
        (std::env::var("POD_NAMESPACE"), args.namespace.as_ref())
    {
        if !pod_namespace.is_empty() && pod_namespace != *namespace {
            return Err(Outcome::with_reason(
                exit_codes::USAGE,
                format!(
                    "--create makes a claim owned by this Pod, so it must live in the Pod's \
                     namespace {pod_namespace:?}, not {namespace:?}"
                ),
            ));
        }
    }
    Ok(Some(PodIdentity { name, uid }))
}

/// Everything but the timeout. `last_seen` keeps the latest claim, for the timeout message.
async fn wait_for_claim(
    args: &WaitArgs,
    owner: Option<&PodIdentity>,
    last_seen: &mut Option<LockClaim>,
) -> Outcome {
    let (namespace, locks, claims) =
        match namespace_apis(args.namespace.as_deref(), exit_code::ERROR).await {
            Ok(apis) => apis,
            Err(outcome) => return outcome,
        };
    let cluster_locks = Api::all(locks.clone().into_client());
    let target = Target {
        claim: &args.claim,
        namespace: &namespace,
        locks: &locks,
        cluster_locks: &cluster_locks,
    };

    let claim = match (owner, args.lock.as_deref()) {
        (Some(pod), Some(lock)) => {
            // Checked first, so that a typo does not leave a claim behind.
            if let Some(outcome) = target.confirm_lock_missing(lock, args.cluster, false).await {
                return outcome;
            }
            let mut wanted = claim_for_pod(&args.claim, &namespace, lock, pod);
            if args.cluster {
                wanted.spec.lock_kind = Some(LockKind::ClusterDistributedLock);
            }
            if args.when_busy != WhenBusy::Wait {
                wanted.spec.when_busy = Some(args.when_busy.policy());
            }
            wanted.spec.group = args.group.clone();
            match create_or_adopt(&claims, &wanted, pod).await {
                Ok(Created::New(claim)) => {
                    tracing::info!(claim = %args.claim, %namespace, lock, pod = %pod.name, "claim created");
                    claim
                }
                Ok(Created::Existing(claim)) => claim,
                Ok(Created::Conflict(conflict)) => {
                    return Outcome::with_reason(exit_code::CLAIM_CONFLICT, conflict.to_string())
                }
                Err(error) => return target.api_failure("create", &error),
            }
        }
        _ => match claims.get_opt(&args.claim).await {
            Ok(Some(claim)) => claim,
            Ok(None) => return target.claim_gone("does not exist"),
            Err(error) => return target.api_failure("read", &error),
        },
    };
    if owner.is_none() {
        if let Some(outcome) = target
            .confirm_lock_missing(
                &claim.spec.lock_name,
                claim.spec.claims_cluster_lock(),
                false,
            )
            .await
        {
            return outcome;
        }
    }
    if let Some(outcome) = target.judge(&claim, args).await {
        return outcome;
    }
    *last_seen = Some(claim);

    // From here on only the watch: no polling.
    let mut updates = pin!(watcher::watch_object(claims, &args.claim));
    let mut backoff = Duration::from_millis(100);
    while let Some(update) = updates.next().await {
        match update {
            Ok(Some(claim)) => {
                backoff = Duration::from_millis(100);
                if let Some(outcome) = target.judge(&claim, args).await {
                    return outcome;
                }
                tracing::debug!(claim = %args.claim, state = %describe(&claim), "still waiting");
                *last_seen = Some(claim);
            }
            Ok(None) => return target.claim_gone("was deleted while waiting"),
            Err(error) if watch_forbidden(&error) => {
                return Outcome::cannot(
                    exit_code::ERROR,
                    format!("watch LockClaim {} in namespace {namespace}", args.claim),
                    &error,
                )
            }
            Err(error) => {
                tracing::warn!(claim = %args.claim, error = %error_chain(&error), retry_in_ms = backoff.as_millis() as u64, "watch failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_WATCH_BACKOFF);
            }
        }
    }
    Outcome::with_reason(
        exit_code::ERROR,
        format!("the watch of LockClaim {} ended unexpectedly", args.claim),
    )
}

/// The claim being waited for, and how to talk about it.
struct Target<'a> {
    claim: &'a str,
    namespace: &'a str,
    locks: &'a Api<DistributedLock>,
    cluster_locks: &'a Api<ClusterDistributedLock>,
}

impl Target<'_> {
    /// The outcome for the claim as it is now, or `None` to keep waiting.
    async fn judge(&self, claim: &LockClaim, args: &WaitArgs) -> Option<Outcome> {
        match assess(claim) {
            Verdict::Held { fencing_token } => Some(held(fencing_token, args)),
            Verdict::Waiting => None,
            Verdict::LockMissing => {
                let cluster = claim.spec.claims_cluster_lock();
                self.confirm_lock_missing(&claim.spec.lock_name, cluster, true)
                    .await
            }
            Verdict::Ended { phase } => {
                let code = match phase {
                    ClaimPhase::Failed => exit_code::FAILED,
                    ClaimPhase::Expired => exit_code::EXPIRED,
                    _ => exit_code::RELEASED,
                };
                Some(Outcome::with_reason(
                    code,
                    format!(
                        "LockClaim {} in namespace {} will not be held: it is {}",
                        self.claim,
                        self.namespace,
                        describe(claim)
                    ),
                ))
            }
            Verdict::Deleting => Some(self.claim_gone("is being deleted")),
        }
    }

    /// `Some(outcome)` if DistributedLock `lock` (with `cluster`, ClusterDistributedLock
    /// `lock`) does not exist. A lock that exists means wait on (the controller's
    /// `LockNotFound` may predate it). If the lock cannot be read, the claim's status decides:
    /// `status_says_missing` is whether it reports `LockNotFound`.
    async fn confirm_lock_missing(
        &self,
        lock: &str,
        cluster: bool,
        status_says_missing: bool,
    ) -> Option<Outcome> {
        let where_ = match cluster {
            true => format!("ClusterDistributedLock {lock} does not exist"),
            false => format!(
                "DistributedLock {lock} does not exist in namespace {}",
                self.namespace
            ),
        };
        let missing = Outcome::with_reason(
            exit_code::LOCK_NOT_FOUND,
            format!("{where_} (claimed by LockClaim {})", self.claim),
        );
        let mut attempts_left = LOCK_CHECK_ATTEMPTS;
        loop {
            attempts_left -= 1;
            let found = match cluster {
                true => self
                    .cluster_locks
                    .get_opt(lock)
                    .await
                    .map(|lock| lock.is_some()),
                false => self.locks.get_opt(lock).await.map(|lock| lock.is_some()),
            };
            match found {
                Ok(true) => return None,
                Ok(false) => return Some(missing),
                Err(error) => {
                    let forbidden =
                        matches!(&error, kube::Error::Api(status) if status.is_forbidden());
                    if forbidden || attempts_left == 0 {
                        tracing::warn!(lock, error = %error_chain(&error), "cannot check that the DistributedLock exists; relying on the claim's status");
                        return status_says_missing.then_some(missing);
                    }
                    tokio::time::sleep(LOCK_CHECK_PAUSE).await;
                }
            }
        }
    }

    fn claim_gone(&self, what: &str) -> Outcome {
        Outcome::with_reason(
            exit_code::CLAIM_NOT_FOUND,
            format!(
                "LockClaim {} in namespace {} {what}",
                self.claim, self.namespace
            ),
        )
    }

    fn api_failure(&self, verb: &str, error: &kube::Error) -> Outcome {
        Outcome::with_reason(
            exit_code::ERROR,
            format!(
                "cannot {verb} LockClaim {} in namespace {}: {}",
                self.claim,
                self.namespace,
                error_chain(error)
            ),
        )
    }
}

/// Reports a grant: the token on stdout and in `--token-file`.
fn held(fencing_token: u64, args: &WaitArgs) -> Outcome {
    if let Some(path) = &args.token_file {
        if let Err(error) = std::fs::write(path, format!("{fencing_token}\n")) {
            return Outcome::with_reason(
                exit_code::ERROR,
                format!(
                    "LockClaim {} is Held (fencing token {fencing_token}) but the token file {} \
                     cannot be written: {error}",
                    args.claim,
                    path.display()
                ),
            );
        }
    }
    println!("{fencing_token}");
    Outcome::quiet(exit_code::HELD)
}

/// Whether a watch error is a 403: retrying will not help until RBAC changes.
fn watch_forbidden(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status,
        watcher::Error::WatchError(status) => status,
        _ => return false,
    };
    status.is_forbidden()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ParseFlags;

    #[test]
    fn create_and_lock_go_together() {
        let args =
            WaitArgs::parse_flags(&["c", "--create", "--lock", "db", "--timeout", "10m"]).unwrap();
        assert!(args.create);
        assert_eq!(args.lock.as_deref(), Some("db"));
        assert_eq!(args.timeout, Some(Duration::from_secs(600)));
        assert!(WaitArgs::parse_flags(&["c", "--create"]).is_err());
        assert!(WaitArgs::parse_flags(&["c", "--lock", "db"]).is_err());
        assert!(WaitArgs::parse_flags(&["c", "--timeout", "later"]).is_err());
        // A busy policy only with --create; the group policies need a group.
        assert!(WaitArgs::parse_flags(&["c", "--when-busy", "fail"]).is_err());
        let create = ["c", "--create", "--lock", "db", "--when-busy"];
        let fail = [&create[..], &["fail"]].concat();
        assert_eq!(
            WaitArgs::parse_flags(&fail).unwrap().when_busy,
            WhenBusy::Fail
        );
        let replace = [&create[..], &["replace-pending"]].concat();
        assert!(WaitArgs::parse_flags(&replace).is_err());
        let grouped = [&replace[..], &["--group", "main"]].concat();
        assert!(WaitArgs::parse_flags(&grouped).is_ok());
    }

    #[test]
    fn create_needs_the_pod_identity() {
        let mut args = WaitArgs::parse_flags(&["c", "--create", "--lock", "db"]).unwrap();
        args.pod_name = None;
        args.pod_uid = Some("u".into());
        assert_eq!(owner_pod(&args).unwrap_err().code, exit_codes::USAGE);
        args.pod_name = Some("p".into());
        assert_eq!(
            owner_pod(&args).unwrap(),
            Some(PodIdentity {
                name: "p".into(),
                uid: "u".into()
            })
        );
        args.create = false;
        assert_eq!(owner_pod(&args).unwrap(), None);
    }
}
