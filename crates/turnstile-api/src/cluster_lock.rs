//! `ClusterDistributedLock`: one lock for claims from several namespaces — those its
//! `namespaceSelector` selects — in one queue.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::lock::{DistributedLock, DistributedLockSpec, DistributedLockStatus};

/// A cluster-scoped lock: claims name it with `lockKind: ClusterDistributedLock`, from the
/// namespaces `namespaceSelector` selects, and queue for it together, in arrival order across
/// namespaces. A claim from any other namespace waits with reason `NamespaceNotAllowed`.
// clippy reads the repeated `type_` keys of separate `printcolumn(...)` groups as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[kube(
    group = "turnstile.dev",
    version = "v1alpha1",
    kind = "ClusterDistributedLock",
    plural = "clusterdistributedlocks",
    singular = "clusterdistributedlock",
    shortname = "cdlock",
    category = "locks",
    status = "DistributedLockStatus",
    derive = "PartialEq",
    doc = "A cluster-scoped distributed lock granted to LockClaims of the namespaces it selects, in one FIFO queue.",
    printcolumn(
        name = "Backend",
        type_ = "string",
        json_path = ".spec.lock.backend",
        description = "The backend holding the lock (empty: the controller's default)"
    ),
    printcolumn(
        name = "Holders",
        type_ = "string",
        json_path = ".status.holderSummary",
        description = "Every current holder (namespace/claim), in grant order"
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
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDistributedLockSpec {
    /// The namespaces whose claims may queue for this lock, by their labels (`{}` selects
    /// every namespace). A claim from another namespace waits with reason
    /// `NamespaceNotAllowed` until its namespace is selected; a claim already holding keeps
    /// its grant until it ends.
    pub namespace_selector: LabelSelector,
    /// The lock, as a `DistributedLock`'s spec (backend, lease, maxHolders, policies). Its
    /// backend key is `/<key>` (default `/<name>`): no namespaced lock's key starts with `/`.
    #[serde(default)]
    pub lock: DistributedLockSpec,
}

impl ClusterDistributedLock {
    /// The lock as a namespaceless `DistributedLock` (its metadata, `spec.lock`, its status):
    /// how the controller's pass and `turnstile queue` read it, with the code of every lock.
    pub fn as_namespaceless_lock(&self) -> DistributedLock {
        DistributedLock {
            metadata: self.metadata.clone(),
            spec: self.spec.lock.clone(),
            status: self.status.clone(),
        }
    }
}
