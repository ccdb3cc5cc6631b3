//! `turnstile queue LOCK`: who holds a DistributedLock (or, with `--cluster`, a
//! ClusterDistributedLock) and who waits for it, in the order the controller will grant it.
//!
//! ```text
//! turnstile queue db-migrations [-n NS] [-o wide|json]
//! turnstile queue db-migrations --cluster   # a ClusterDistributedLock: claims of every namespace
//! kubectl turnstile queue db-migrations      # the same, as a kubectl plugin
//! ```
//!
//! `-o wide` also lists the grants that ended (the lock's `status.history`, as
//! `turnstile history` does).
//!
//! It reads the lock and its claims from the API (one get, one list) and orders them by
//! [`LockClaim::queue_place`], the order the controller's reconcile pass grants in, so the
//! waiters are listed exactly in grant order. Nothing is written.

use std::fmt::Write as _;

use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;

use crate::exit_codes::queue as exit_code;
use crate::oneshot::{client_in_namespace, existing_lock, init_logging, namespace_apis, Outcome};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use turnstile_api::{
    queue_place, reasons, ClaimPhase, ClusterDistributedLock, DistributedLock, LockClaim, PastGrant,
};

/// Unix seconds.
pub type Seconds = i64;

fn seconds_of(time: &Time) -> Seconds {
    time.0.as_second()
}

/// Output formats besides the default table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// The table with more columns (times as RFC 3339, the controller's position and reason).
    Wide,
    /// One JSON object: the lock, `holders[]` and `waiters[]` in grant order.
    Json,
}

/// Flags of `turnstile queue`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = exit_code::help())]
pub struct QueueArgs {
    /// The DistributedLock.
    pub lock: String,
    /// Namespace of the lock; default: the kubeconfig's.
    #[arg(long, short = 'n', conflicts_with = "cluster")]
    pub namespace: Option<String>,
    /// LOCK is a ClusterDistributedLock: its claims come from every namespace it takes
    /// (shown as NAMESPACE/CLAIM).
    #[arg(long)]
    pub cluster: bool,
    /// Output format: wide or json (default: a table).
    #[arg(long, short = 'o', value_enum)]
    pub output: Option<OutputFormat>,
}

/// A lock's queue at one moment: what `turnstile queue` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    /// `DistributedLock` or `ClusterDistributedLock`.
    pub kind: String,
    /// The lock's name.
    pub lock: String,
    /// The lock's namespace (empty for a `ClusterDistributedLock`).
    pub namespace: String,
    /// `spec.backend`, or `default` (the controller's `--default-backend`).
    pub backend: String,
    /// `spec.maxHolders`.
    pub max_holders: i32,
    /// The claims holding the lock, oldest grant (lowest fencing token) first.
    pub holders: Vec<Holder>,
    /// The claims waiting for it, in the order they will be granted.
    pub waiters: Vec<Waiter>,
}

/// A claim holding the lock.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// The claim's name (`namespace/name` on a `ClusterDistributedLock`).
    pub claim: String,
    /// The grant's fencing token.
    pub fencing_token: Option<i64>,
    /// `status.holderIdentity` (else what the controller would write there).
    pub holder_identity: String,
    /// The owning object as `Kind/name`, if any.
    pub owner: Option<String>,
    /// `status.acquiredAt` (RFC 3339).
    pub acquired_at: Option<String>,
    /// `status.expiresAt` (RFC 3339).
    pub expires_at: Option<String>,
    /// Seconds since the grant.
    pub held_for_seconds: Option<i64>,
    /// Seconds until the lease runs out unless renewed (negative: overdue).
    pub expires_in_seconds: Option<i64>,
}

/// A claim waiting for the lock.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Waiter {
    /// 1-based place in grant order.
    pub position: usize,
    /// The claim's name (`namespace/name` on a `ClusterDistributedLock`).
    pub claim: String,
    /// Who will hold the grant (`spec.holderIdentity`, else the owner's name, else the claim's).
    pub holder_identity: String,
    /// The owning object as `Kind/name`, if any.
    pub owner: Option<String>,
    /// `metadata.creationTimestamp` (RFC 3339): the claim's place in the queue.
    pub created_at: Option<String>,
    /// Seconds since the claim was created.
    pub waiting_for_seconds: i64,
    /// `status.position` as the controller last wrote it (it may lag behind).
    pub reported_position: Option<i32>,
    /// `status.reason` (for example `Queued`, `LockBusy`, `BackendUnavailable`).
    pub reason: Option<String>,
}

/// The queue of `lock` from its claims (any order, any lock: others are skipped), at `now`
/// (Unix seconds). Holders are the `Held` claims, oldest grant first; waiters the `Pending`
/// ones that are neither being deleted nor withdrawn (`spec.release`), in the controller's
/// grant order ([`LockClaim::queue_place`]).
pub fn queue_view(lock: &DistributedLock, claims: &[LockClaim], now: Seconds) -> QueueView {
    queue_view_of(lock, false, claims, now)
}

/// [`queue_view`] of the ClusterDistributedLock `lock`: its claims, from every namespace, are
/// named `namespace/name` (as in the lock's status); those its `namespaceSelector` does not
/// take are in no queue.
pub fn cluster_queue_view(
    lock: &ClusterDistributedLock,
    claims: &[LockClaim],
    now: Seconds,
) -> QueueView {
    queue_view_of(&lock.as_namespaceless_lock(), true, claims, now)
}

fn queue_view_of(
    lock: &DistributedLock,
    cluster: bool,
    claims: &[LockClaim],
    now: Seconds,
) -> QueueView {
    let name = lock.name_any();
    // A claim's name as the controller's pass names it (see its `claim_key`).
    let claim_name = |claim: &LockClaim| match cluster {
        true => format!(
            "{}/{}",
            claim.namespace().unwrap_or_default(),
            claim.name_any()
        ),
        false => claim.name_any(),
    };
    let mut ours: Vec<(String, &LockClaim)> = claims
        .iter()
        .filter(|claim| claim.spec.claims_cluster_lock() == cluster)
        .filter(|claim| claim.spec.locks().contains(&name.as_str()))
        .filter(|claim| {
            claim
                .status
                .as_ref()
                .and_then(|status| status.reason.as_deref())
                != Some(reasons::NAMESPACE_NOT_ALLOWED)
        })
        .map(|claim| (claim_name(claim), claim))
        .collect();
    ours.sort_by(|(a_name, a), (b_name, b)| {
        let place = |name, claim: &LockClaim| {
            let status = claim.status.as_ref();
            queue_place(
                claim.spec.priority,
                status.and_then(|status| status.arrived_at.as_ref()),
                claim.creation_timestamp().as_ref(),
                name,
            )
        };
        place(a_name, a).cmp(&place(b_name, b))
    });
    let mut holders = Vec::new();
    let mut waiters = Vec::new();
    for (claim_name, claim) in ours {
        let status = claim.status.clone().unwrap_or_default();
        let deleting = claim.metadata.deletion_timestamp.is_some();
        let owner = owner_of(claim);
        match status.phase.unwrap_or_default() {
            ClaimPhase::Held if !deleting => {
                let acquired = status.acquired_at.as_ref().map(seconds_of);
                let expires = status.expires_at.as_ref().map(seconds_of);
                holders.push(Holder {
                    claim: claim_name,
                    fencing_token: claim.fencing_token_on(&name),
                    holder_identity: status
                        .holder_identity
                        .clone()
                        .unwrap_or_else(|| claim.holder_identity()),
                    owner,
                    acquired_at: status.acquired_at.as_ref().map(|t| t.0.to_string()),
                    expires_at: status.expires_at.as_ref().map(|t| t.0.to_string()),
                    held_for_seconds: acquired.map(|at| now.saturating_sub(at).max(0)),
                    expires_in_seconds: expires.map(|at| at.saturating_sub(now)),
                });
            }
            ClaimPhase::Pending if !deleting && claim.spec.release != Some(true) => {
                let created = claim.creation_timestamp();
                waiters.push(Waiter {
                    position: waiters.len() + 1,
                    claim: claim_name,
                    holder_identity: claim.holder_identity(),
                    owner,
                    created_at: created.as_ref().map(|t| t.0.to_string()),
                    waiting_for_seconds: created
                        .as_ref()
                        .map_or(0, |at| now.saturating_sub(seconds_of(at)).max(0)),
                    reported_position: status.position,
                    reason: status.reason.clone(),
                });
            }
            _ => {}
        }
    }
    // Holders in the order they were granted: by fencing token (the queue order breaks ties).
    holders.sort_by_key(|holder| holder.fencing_token.unwrap_or(i64::MAX));
    QueueView {
        kind: match cluster {
            true => "ClusterDistributedLock",
            false => "DistributedLock",
        }
        .to_owned(),
        lock: name,
        namespace: lock.namespace().unwrap_or_default(),
        backend: lock
            .spec
            .backend
            .map_or_else(|| "default".to_owned(), |backend| backend.to_string()),
        max_holders: lock.spec.max_holders,
        holders,
        waiters,
    }
}

/// The claim's owner as `Kind/name`: the controlling owner reference, else the first.
fn owner_of(claim: &LockClaim) -> Option<String> {
    let owners = claim.owner_references();
    owners
        .iter()
        .find(|owner| owner.controller == Some(true))
        .or_else(|| owners.first())
        .map(|owner| format!("{}/{}", owner.kind, owner.name))
}

/// A number of seconds as kubectl writes ages: `45s`, `5m3s`, `2h5m`, `3d4h`; negative as
/// `-5s`.
pub fn short_duration(seconds: i64) -> String {
    if seconds < 0 {
        return format!("-{}", short_duration(seconds.saturating_neg()));
    }
    let (days, hours, minutes, secs) = (
        seconds / 86_400,
        seconds % 86_400 / 3_600,
        seconds % 3_600 / 60,
        seconds % 60,
    );
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, _) => format!("{minutes}m{secs}s"),
        (0, _, _) => format!("{hours}h{minutes}m"),
        _ => format!("{days}d{hours}h"),
    }
}

/// Left-aligned columns separated by three spaces, as kubectl prints them.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|cell| (*cell).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}   ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn or_dash(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

/// The queue as tables: a summary line, the holders, the waiters in grant order. `wide`
/// adds the times as RFC 3339, the holder identity of waiters, and the controller's own
/// position and reason.
pub fn render_table(view: &QueueView, wide: bool) -> String {
    let lock = match view.namespace.as_str() {
        "" => view.lock.clone(),
        namespace => format!("{namespace}/{}", view.lock),
    };
    let mut out = format!(
        "{} {lock} (backend {}, maxHolders {}): {} holding, {} waiting\n\nHOLDERS\n",
        view.kind,
        view.backend,
        view.max_holders,
        view.holders.len(),
        view.waiters.len()
    );
    if view.holders.is_empty() {
        out.push_str("(none)\n");
    } else {
        let mut header = vec![
            "CLAIM",
            "TOKEN",
            "HOLDER",
            "OWNER",
            "HELD-FOR",
            "EXPIRES-IN",
        ];
        if wide {
            header.extend(["ACQUIRED", "EXPIRES"]);
        }
        let rows: Vec<Vec<String>> = view
            .holders
            .iter()
            .map(|holder| {
                let mut row = vec![
                    holder.claim.clone(),
                    or_dash(holder.fencing_token),
                    holder.holder_identity.clone(),
                    or_dash(holder.owner.as_ref()),
                    or_dash(holder.held_for_seconds.map(short_duration)),
                    or_dash(holder.expires_in_seconds.map(short_duration)),
                ];
                if wide {
                    row.push(or_dash(holder.acquired_at.as_ref()));
                    row.push(or_dash(holder.expires_at.as_ref()));
                }
                row
            })
            .collect();
        out.push_str(&table(&header, &rows));
    }
    out.push_str("\nWAITERS (grant order)\n");
    if view.waiters.is_empty() {
        out.push_str("(none)\n");
    } else {
        let mut header = vec!["#", "CLAIM", "OWNER", "WAITING-FOR"];
        if wide {
            header.extend(["HOLDER", "CREATED", "STATUS-POSITION", "REASON"]);
        }
        let rows: Vec<Vec<String>> = view
            .waiters
            .iter()
            .map(|waiter| {
                let mut row = vec![
                    waiter.position.to_string(),
                    waiter.claim.clone(),
                    or_dash(waiter.owner.as_ref()),
                    short_duration(waiter.waiting_for_seconds),
                ];
                if wide {
                    row.push(waiter.holder_identity.clone());
                    row.push(or_dash(waiter.created_at.as_ref()));
                    row.push(or_dash(waiter.reported_position));
                    row.push(or_dash(waiter.reason.as_ref()));
                }
                row
            })
            .collect();
        out.push_str(&table(&header, &rows));
    }
    out
}

/// The lock's queue and its ended grants (`status.history`) as `turnstile queue` reads them;
/// on failure the outcome to end with.
async fn read_queue(args: &QueueArgs) -> Result<(QueueView, Vec<PastGrant>), Outcome> {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    if args.cluster {
        let (client, _) = client_in_namespace(None, exit_code::ERROR).await?;
        let lock = match Api::<ClusterDistributedLock>::all(client.clone())
            .get_opt(&args.lock)
            .await
        {
            Ok(Some(lock)) => lock,
            Ok(None) => {
                return Err(Outcome::with_reason(
                    exit_code::LOCK_NOT_FOUND,
                    format!("ClusterDistributedLock {} does not exist", args.lock),
                ))
            }
            Err(error) => {
                return Err(Outcome::cannot(
                    exit_code::ERROR,
                    format!("read ClusterDistributedLock {}", args.lock),
                    &error,
                ))
            }
        };
        let claims = list_claims(&Api::all(client), "every namespace").await?;
        let history = lock.status.clone().unwrap_or_default().history;
        return Ok((cluster_queue_view(&lock, &claims, now), history));
    }
    let (namespace, locks, claims) =
        namespace_apis(args.namespace.as_deref(), exit_code::ERROR).await?;
    let lock = existing_lock(
        &locks,
        &args.lock,
        &namespace,
        exit_code::ERROR,
        exit_code::LOCK_NOT_FOUND,
    )
    .await?;
    let claims = list_claims(&claims, &format!("namespace {namespace}")).await?;
    let history = lock.status.clone().unwrap_or_default().history;
    Ok((queue_view(&lock, &claims, now), history))
}

/// Every claim `claims` lists, filtered by the caller: a field selector on spec.lockName needs
/// the CRD's selectableFields, which older API servers ignore.
async fn list_claims(claims: &Api<LockClaim>, where_: &str) -> Result<Vec<LockClaim>, Outcome> {
    match claims.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(error) => Err(Outcome::cannot(
            exit_code::ERROR,
            format!("list LockClaims in {where_}"),
            &error,
        )),
    }
}

/// Runs `turnstile queue` and says how it ended.
pub async fn queue_command(args: QueueArgs) -> Outcome {
    init_logging();
    let (view, history) = match read_queue(&args).await {
        Ok(read) => read,
        Err(outcome) => return outcome,
    };
    let text = match args.output {
        None => render_table(&view, false),
        Some(OutputFormat::Wide) => {
            // The grants that ended, as `turnstile history` lists them.
            let ended = match crate::history::render_table(&history) {
                table if table.is_empty() => "(none)\n".to_owned(),
                table => table,
            };
            format!(
                "{}\nENDED (the last {} grants, oldest first)\n{ended}",
                render_table(&view, true),
                history.len()
            )
        }
        Some(OutputFormat::Json) => match serde_json::to_string_pretty(&view) {
            Ok(json) => format!("{json}\n"),
            Err(error) => {
                return Outcome::with_reason(
                    exit_code::ERROR,
                    format!("cannot render the queue as JSON: {error}"),
                )
            }
        },
    };
    print!("{text}");
    Outcome::quiet(exit_code::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lock(max_holders: i32) -> DistributedLock {
        serde_json::from_value(json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "DistributedLock",
            "metadata": {"name": "pool", "namespace": "ns"},
            "spec": {"maxHolders": max_holders, "backend": "memory"}
        }))
        .expect("lock")
    }

    fn claim(name: &str, created: &str, status: serde_json::Value) -> LockClaim {
        serde_json::from_value(json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "LockClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "creationTimestamp": created},
            "spec": {"lockName": "pool"},
            "status": status
        }))
        .expect("claim")
    }

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:00:01Z";

    #[test]
    fn a_cluster_locks_queue_spans_namespaces_and_leaves_out_the_claims_it_does_not_take() {
        let now = 1_767_225_660; // 2026-01-01T00:01:00Z
        let cluster_lock: ClusterDistributedLock = serde_json::from_value(json!({
            "apiVersion": "turnstile.dev/v1alpha1", "kind": "ClusterDistributedLock",
            "metadata": {"name": "pool"},
            "spec": {"namespaceSelector": {}, "lock": {"backend": "memory"}}
        }))
        .expect("cluster lock");
        let on_cluster_lock =
            |namespace: &str, name: &str, arrived: &str, status: serde_json::Value| {
                let mut claim = claim(name, T0, status);
                claim.metadata.namespace = Some(namespace.to_owned());
                claim.spec.lock_kind = Some(turnstile_api::LockKind::ClusterDistributedLock);
                if let Some(status) = claim.status.as_mut() {
                    status.arrived_at =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                            arrived.parse().expect("time"),
                        ));
                }
                claim
            };
        let claims = [
            on_cluster_lock(
                "web",
                "second",
                "2026-01-01T00:00:00.2Z",
                json!({"phase": "Pending"}),
            ),
            on_cluster_lock(
                "pay",
                "first",
                "2026-01-01T00:00:00.1Z",
                json!({"phase": "Pending"}),
            ),
            on_cluster_lock(
                "other",
                "refused",
                "2026-01-01T00:00:00.0Z",
                json!({"phase": "Pending", "reason": "NamespaceNotAllowed"}),
            ),
            on_cluster_lock(
                "pay",
                "holder",
                "2026-01-01T00:00:00.0Z",
                json!({"phase": "Held", "fencingToken": 3}),
            ),
            // The namespaced lock of the same name is another lock.
            claim("namespaced", T0, json!({"phase": "Pending"})),
        ];
        let view = cluster_queue_view(&cluster_lock, &claims, now);
        let waiters: Vec<_> = view.waiters.iter().map(|w| w.claim.as_str()).collect();
        assert_eq!(
            waiters,
            ["pay/first", "web/second"],
            "arrival order across namespaces"
        );
        assert_eq!(view.holders[0].claim, "pay/holder");
        assert_eq!(
            (view.kind.as_str(), view.namespace.as_str()),
            ("ClusterDistributedLock", "")
        );
        assert!(
            render_table(&view, false).starts_with("ClusterDistributedLock pool (backend memory")
        );
        let namespaced = queue_view(&lock(1), &claims, now);
        let waiters: Vec<_> = namespaced
            .waiters
            .iter()
            .map(|w| w.claim.as_str())
            .collect();
        assert_eq!(
            waiters,
            ["namespaced"],
            "a namespaced lock's queue has no cluster lock's claim"
        );
    }

    #[test]
    fn waiters_come_in_grant_order_creation_second_then_name() {
        let now = 1_767_225_660; // 2026-01-01T00:01:00Z
        let claims = [
            claim("zed", T1, json!({"phase": "Pending"})),
            claim("bob", T1, json!({"phase": "Pending"})),
            claim("yan", T0, json!({"phase": "Pending"})),
            claim(
                "holder",
                T0,
                json!({"phase": "Held", "fencingToken": 4, "holderIdentity": "h",
                       "acquiredAt": T1, "expiresAt": "2026-01-01T00:05:00Z"}),
            ),
            claim("done", T0, json!({"phase": "Released"})),
        ];
        let view = queue_view(&lock(1), &claims, now);
        let waiters: Vec<_> = view.waiters.iter().map(|w| w.claim.as_str()).collect();
        assert_eq!(waiters, ["yan", "bob", "zed"]);
        assert_eq!(view.waiters[2].position, 3);
        assert_eq!(view.waiters[0].waiting_for_seconds, 60);
        let holder = &view.holders[0];
        assert_eq!(
            (
                holder.claim.as_str(),
                holder.fencing_token,
                holder.held_for_seconds
            ),
            ("holder", Some(4), Some(59))
        );
        assert_eq!(holder.expires_in_seconds, Some(240));
    }

    #[test]
    fn deleting_and_withdrawn_claims_do_not_wait_and_an_overdue_holder_shows_a_negative_expiry() {
        let now = 1_767_225_660; // 2026-01-01T00:01:00Z
        let mut deleting = claim("deleting", T0, json!({"phase": "Pending"}));
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(T1.parse().expect("time")),
        );
        deleting.metadata.finalizers = Some(vec![turnstile_api::FINALIZER.to_owned()]);
        let mut withdrawn = claim("withdrawn", T0, json!({"phase": "Pending"}));
        withdrawn.spec.release = Some(true);
        let claims = [
            deleting,
            withdrawn,
            claim("waits", T1, json!({"phase": "Pending"})),
            claim(
                "overdue",
                T0,
                json!({"phase": "Held", "fencingToken": 2, "acquiredAt": T0,
                       "expiresAt": "2026-01-01T00:00:50Z"}),
            ),
        ];
        let view = queue_view(&lock(1), &claims, now);
        let waiters: Vec<_> = view.waiters.iter().map(|w| w.claim.as_str()).collect();
        assert_eq!(
            waiters,
            ["waits"],
            "neither a deleting nor a withdrawn claim waits"
        );
        assert_eq!(view.waiters[0].position, 1);
        assert_eq!(
            view.holders[0].expires_in_seconds,
            Some(-10),
            "10 s overdue"
        );
        assert!(
            render_table(&view, false).contains("-10s"),
            "{}",
            render_table(&view, false)
        );
    }

    #[test]
    fn durations_read_like_kubectl_ages() {
        assert_eq!(short_duration(45), "45s");
        assert_eq!(short_duration(303), "5m3s");
        assert_eq!(short_duration(7_500), "2h5m");
        assert_eq!(short_duration(273_600), "3d4h");
        assert_eq!(short_duration(-5), "-5s");
    }
}
