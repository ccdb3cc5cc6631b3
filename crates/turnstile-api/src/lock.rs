//! `DistributedLock`: a named mutex (`maxHolders: 1`) or counting semaphore in a namespace.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::vocabulary::{
    DEFAULT_LEASE_DURATION_SECONDS, DEFAULT_MAX_OVERTAKE_SECONDS, MAX_HOLDERS, MAX_HOLD_SECONDS,
    MAX_LEASE_DURATION_SECONDS, MAX_LOCK_DELAY_SECONDS, MAX_OVERTAKE_SECONDS,
};

/// A distributed lock: a mutex (`maxHolders: 1`) or a counting semaphore, granted to
/// `LockClaim`s in the same namespace in FIFO order.
// clippy reads the repeated `type_` keys of separate `printcolumn(...)` groups as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[kube(
    group = "turnstile.dev",
    version = "v1alpha1",
    kind = "DistributedLock",
    plural = "distributedlocks",
    singular = "distributedlock",
    shortname = "dlock",
    category = "locks",
    namespaced,
    status = "DistributedLockStatus",
    derive = "PartialEq",
    doc = "A distributed lock (mutex or counting semaphore) granted to LockClaims in FIFO order.",
    printcolumn(
        name = "Backend",
        type_ = "string",
        json_path = ".spec.backend",
        description = "The backend holding the lock (empty: the controller's default)"
    ),
    printcolumn(
        name = "Holders",
        type_ = "string",
        json_path = ".status.holderSummary",
        description = "Every current holder (a semaphore's too), in grant order"
    ),
    printcolumn(
        name = "Token",
        type_ = "integer",
        json_path = ".status.fencingToken",
        description = "The highest fencing token ever issued for this lock"
    ),
    printcolumn(
        name = "Waiting",
        type_ = "integer",
        json_path = ".status.waiting",
        description = "Claims queued behind the holders"
    ),
    printcolumn(
        name = "Expires",
        type_ = "string",
        json_path = ".status.holders[0].expiresAt",
        description = "When the (first) holder's lease runs out (RFC 3339)"
    ),
    printcolumn(
        name = "Delayed-Until",
        type_ = "string",
        json_path = ".status.lockedUntil",
        description = "No grant before this time: the lock-delay after a grant ended involuntarily",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.maxOvertakeSeconds) || (has(self.queue) && self.queue == 'FirstRunnable')")
        .message("maxOvertakeSeconds is for queue: FirstRunnable"),
)]
pub struct DistributedLockSpec {
    /// The backend that holds the lock; omitted means the controller's default backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    /// The lease of each grant, in seconds, unless the claim overrides it.
    #[serde(default = "default_lease_duration_seconds")]
    #[schemars(range(min = 1, max = MAX_LEASE_DURATION_SECONDS))]
    pub lease_duration_seconds: i64,
    /// How many claims may hold the lock at once: 1 is a mutex, more a counting semaphore.
    #[serde(default = "default_max_holders")]
    #[schemars(range(min = 1, max = MAX_HOLDERS))]
    pub max_holders: i32,
    /// Optional backend key, for sharing the lock with non-Kubernetes users of the same
    /// backend. The controller always prefixes it with the namespace
    /// (`<namespace>/<key>`, default `<namespace>/<name>`; a `ClusterDistributedLock`'s with
    /// `/`), so tenants cannot collide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub key: Option<String>,
    /// A grant ends this many seconds after it was made, whatever its renewals or its owner
    /// (claim `Expired`, reason `MaxHoldExceeded`). Omitted: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_HOLD_SECONDS))]
    pub max_hold_seconds: Option<i64>,
    /// After a grant ends involuntarily (its lease or `maxHoldSeconds` ran out, its owner
    /// vanished) no claim is granted for this many seconds, so a stalled holder's last writes
    /// drain first; a release hands on at once. Omitted or 0: no delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_LOCK_DELAY_SECONDS))]
    pub lock_delay_seconds: Option<i64>,
    /// The order claims are granted in. `Fifo` (the default): strictly in queue order, so a
    /// claim that cannot be granted yet (an exclusive claim behind shared holders, a claim on
    /// several locks waiting for another of them) holds up everyone behind it. `FirstRunnable`:
    /// a claim that can be granted now may pass the waiting claims ahead of it, each of them
    /// only within `maxOvertakeSeconds` of its creation; after that the lock drains for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueOrder>,
    /// With `queue: FirstRunnable`: for how many seconds after its creation a waiting claim
    /// may be passed (default 300); then nobody behind it is granted before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_OVERTAKE_SECONDS))]
    pub max_overtake_seconds: Option<i64>,
}

impl Default for DistributedLockSpec {
    /// A mutex on the controller's default backend with the default lease: what `{}` means.
    fn default() -> Self {
        Self {
            backend: None,
            lease_duration_seconds: DEFAULT_LEASE_DURATION_SECONDS,
            max_holders: 1,
            key: None,
            max_hold_seconds: None,
            lock_delay_seconds: None,
            queue: None,
            max_overtake_seconds: None,
        }
    }
}

/// The order a lock grants its claims in (`spec.queue`): `Fifo` (the default) strictly in queue
/// order; `FirstRunnable` lets a claim that can be granted now pass waiting claims that cannot,
/// each only within `maxOvertakeSeconds` of its creation.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum QueueOrder {
    /// Strictly in queue order (priority, then arrival): nobody passes a waiting claim.
    #[default]
    Fifo,
    /// A claim that can be granted now passes waiting claims that cannot, within their
    /// `maxOvertakeSeconds`: no head-of-line blocking, and a bound on how long anyone waits
    /// for claims that arrived after it.
    FirstRunnable,
}

impl DistributedLockSpec {
    /// `spec.queue` (`Fifo` when unset).
    pub fn queue_order(&self) -> QueueOrder {
        self.queue.unwrap_or_default()
    }

    /// `maxOvertakeSeconds` (the default when unset; clamped into the accepted range).
    pub fn max_overtake_seconds(&self) -> i64 {
        self.max_overtake_seconds
            .unwrap_or(DEFAULT_MAX_OVERTAKE_SECONDS)
            .clamp(1, MAX_OVERTAKE_SECONDS)
    }
}

fn default_lease_duration_seconds() -> i64 {
    DEFAULT_LEASE_DURATION_SECONDS
}

fn default_max_holders() -> i32 {
    1
}

/// The backends a lock can live on. The connection details are configured on the
/// controller (`turnstile run --redis-url …`), never by tenants.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The controller's embedded, in-process backend.
    Memory,
    /// A Redis server (`--redis-url`).
    Redis,
    /// A MongoDB replica set (`--mongo-url`).
    Mongo,
    /// An etcd cluster (`--etcd-url`).
    Etcd,
}

impl BackendKind {
    /// The name used in the CRD, on the command line and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            BackendKind::Redis => "redis",
            BackendKind::Mongo => "mongo",
            BackendKind::Etcd => "etcd",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "memory" => Ok(BackendKind::Memory),
            "redis" => Ok(BackendKind::Redis),
            "mongo" => Ok(BackendKind::Mongo),
            "etcd" => Ok(BackendKind::Etcd),
            other => Err(format!(
                "unknown backend {other:?} (memory | redis | mongo | etcd)"
            )),
        }
    }
}

/// The observed state of a `DistributedLock`, written by the controller.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DistributedLockStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One entry per granted claim, and per grant the backend holds for another cluster, in
    /// grant order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<LockHolder>,
    /// Every current holder's identity in grant order, comma-separated (the first
    /// [`HOLDER_SUMMARY_NAMES`] and a count of the rest; `cluster NAME` for a grant held
    /// from another cluster): a printer column shows one field only, and a semaphore has
    /// many holders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_summary: Option<String>,
    /// Claims queued behind the holders.
    #[serde(default)]
    pub waiting: i32,
    /// The highest fencing token ever issued for this lock; it never decreases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    /// `Ready`: False with reason `BackendUnavailable`, `BackendNotConfigured`, `InvalidSpec`, ….
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The end of the last lock-delay (`spec.lockDelaySeconds`): no grant is made before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked_until: Option<Time>,
    /// The last grants that ended, oldest first (at most [`LOCK_HISTORY_LEN`]): who held the
    /// lock when, with which token, and how it ended. Written with the holders' change, so it
    /// costs no write of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<PastGrant>,
}

/// How many ended grants [`DistributedLockStatus::history`] keeps.
pub const LOCK_HISTORY_LEN: usize = 10;

/// A grant of the lock that ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PastGrant {
    /// The name of the claim that held it (`namespace/name` on a `ClusterDistributedLock`).
    pub claim: String,
    /// Who held it (the claim's `status.holderIdentity`).
    pub holder_identity: String,
    /// The grant's fencing token.
    pub fencing_token: i64,
    /// When it was granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<Time>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
    /// How it ended: the claim's reason (`ReleaseRequested`, `LeaseExpired`, `OwnerFinished`,
    /// `ForceReleased`, …), or `ClaimDeleted`.
    pub reason: String,
}

/// How many holder identities [`DistributedLockStatus::holder_summary`] names before it
/// counts the rest (`a, b, c, d, e (+95 more)`), so a wide semaphore's status stays small.
pub const HOLDER_SUMMARY_NAMES: usize = 5;

/// The value of [`DistributedLockStatus::holder_summary`] for `holders` (in grant order).
pub fn holder_summary(holders: &[LockHolder]) -> Option<String> {
    if holders.is_empty() {
        return None;
    }
    let mut summary = holders
        .iter()
        .take(HOLDER_SUMMARY_NAMES)
        .map(|holder| match &holder.cluster {
            Some(cluster) => format!("cluster {cluster}"),
            None => holder.holder_identity.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if holders.len() > HOLDER_SUMMARY_NAMES {
        summary.push_str(&format!(
            " (+{} more)",
            holders.len() - HOLDER_SUMMARY_NAMES
        ));
    }
    Some(summary)
}

/// One current grant of a lock.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockHolder {
    /// The name of the granted `LockClaim` (`namespace/name` on a `ClusterDistributedLock`);
    /// empty for a grant held from outside this cluster.
    pub claim: String,
    /// Who holds the grant (the claim's `status.holderIdentity`); for a grant held from
    /// outside this cluster, its owner token in the backend.
    pub holder_identity: String,
    /// For a grant held from outside this cluster — another cluster's controller sharing the
    /// lock's backend key — the name that controller runs with (`--cluster-name`). Such a
    /// grant is shown as of this cluster's last pass over the lock, without its times (its
    /// own cluster renews it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The grant's fencing token.
    pub fencing_token: i64,
    /// When the grant was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<Time>,
    /// When the grant lapses unless renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(identity: &str) -> LockHolder {
        LockHolder {
            claim: identity.to_owned(),
            holder_identity: identity.to_owned(),
            fencing_token: 1,
            cluster: None,
            acquired_at: None,
            expires_at: None,
        }
    }

    #[test]
    fn the_holder_summary_names_a_few_and_counts_the_rest() {
        assert_eq!(holder_summary(&[]), None);
        let two = [holder("a"), holder("b")];
        assert_eq!(holder_summary(&two).as_deref(), Some("a, b"));
        let many: Vec<LockHolder> = (0..8).map(|i| holder(&format!("h{i}"))).collect();
        assert_eq!(
            holder_summary(&many).as_deref(),
            Some("h0, h1, h2, h3, h4 (+3 more)")
        );
        let elsewhere = LockHolder {
            cluster: Some("east".to_owned()),
            ..holder("east/0b1c")
        };
        assert_eq!(
            holder_summary(&[holder("a"), elsewhere]).as_deref(),
            Some("a, cluster east")
        );
    }
}
