//! The one way the controller writes to the API server: leadership gate → conditional merge
//! patch → error with context.
//!
//! A write is first decided as data ([`Write`]: which object, which part, the merge patch) and
//! then made by an [`ApiWriter`], conditional on the resourceVersion the decision was made from.
//! [`PassWrites`] decides a lock pass's writes from the core's [`Decision`], and a
//! [`PassWriter`] makes them through a [`PassStore`]: the API server ([`ApiStore`]), or the
//! simulated one of the controller's property tests, which so run the shell's own pass.
//!
//! Beside it: [`patch`] (the merge patches), [`own_writes`] (a lock's pass waits until the
//! cache shows its previous pass's writes), [`events`] (Events are writes too) and
//! [`budget`] (how many optional writes a second).

pub mod budget;
pub mod events;
pub mod own_writes;
pub mod patch;

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::core::{claim_address, ClaimChange, Decision, FinalizerChange, LockInput};
use crate::error::ControllerError;
use crate::leader::LeadershipGate;
use crate::writer::own_writes::GONE;
use crate::writer::patch::merge_diff;
use turnstile_api::{
    ClusterDistributedLock, DistributedLock, LockClaim, LockClaimStatus, FINALIZER,
};

/// The part of an object a [`Write`] changes, which picks the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The status subresource.
    Status,
    /// `metadata.finalizers` (the whole list: a merge patch replaces arrays).
    Finalizers,
    /// Anything else of the main resource (metadata and spec).
    Object,
}

impl Part {
    fn doing(self) -> &'static str {
        match self {
            Part::Status => "writing status of",
            Part::Finalizers => "setting finalizers of",
            Part::Object => "patching",
        }
    }
}

/// One decided write: a JSON merge patch (RFC 7386) of one part of the object `name`, without
/// the resourceVersion precondition (the [`ApiWriter`] adds it when the write is made).
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    /// The object's name (in the namespace of the `Api` it is written through).
    pub name: String,
    /// Which part the patch changes.
    pub part: Part,
    /// The merge patch.
    pub patch: Value,
}

impl Write {
    /// The status write turning `old` into `new`; `None` when they are equal (an unchanged
    /// status is never written).
    pub fn status<S: Serialize>(
        name: &str,
        old: Option<&S>,
        new: &S,
    ) -> Result<Option<Self>, ControllerError> {
        let new = to_json(new)?;
        let diff = match old {
            Some(old) => merge_diff(&to_json(old)?, &new),
            None => Some(new),
        };
        Ok(diff.map(|status| Self {
            name: name.to_owned(),
            part: Part::Status,
            patch: serde_json::json!({ "status": status }),
        }))
    }

    /// The write setting `metadata.finalizers` to `finalizers`.
    pub fn finalizers(name: &str, finalizers: &[String]) -> Self {
        Self {
            name: name.to_owned(),
            part: Part::Finalizers,
            patch: serde_json::json!({ "metadata": { "finalizers": finalizers } }),
        }
    }

    /// Any other merge patch of the object.
    pub fn object(name: &str, patch: Value) -> Self {
        Self {
            name: name.to_owned(),
            part: Part::Object,
            patch,
        }
    }

    /// The patch as sent: with `metadata.resourceVersion`, when given, so the server refuses
    /// it (409) if the object changed since the write was decided.
    pub fn conditional_patch(&self, resource_version: Option<&str>) -> Value {
        let mut patch = self.patch.clone();
        if let (Some(version), Value::Object(members)) = (resource_version, &mut patch) {
            let metadata = members
                .entry("metadata")
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            if let Value::Object(metadata) = metadata {
                metadata.insert(
                    "resourceVersion".to_owned(),
                    Value::String(version.to_owned()),
                );
            }
        }
        patch
    }
}

fn to_json<S: Serialize>(value: &S) -> Result<Value, ControllerError> {
    serde_json::to_value(value).map_err(|source| ControllerError::Serialize {
        what: "status",
        source,
    })
}

/// What [`ApiWriter::create`] found.
#[derive(Debug)]
pub enum Created<K> {
    /// The object was created.
    New(K),
    /// An object of that name exists already (the cache lagged behind).
    AlreadyExists,
}

/// Makes [`Write`]s and creates objects, each only while this replica leads, and names the
/// object and the action in every error.
#[derive(Debug, Clone)]
pub struct ApiWriter {
    leadership: LeadershipGate,
}

impl ApiWriter {
    /// A writer that writes while `leadership` is open.
    pub fn new(leadership: LeadershipGate) -> Self {
        Self { leadership }
    }

    /// Whether writes are allowed right now (for work that is not a write, e.g. Events).
    pub fn may_write(&self) -> bool {
        self.leadership.is_open()
    }

    /// Makes `write` through `api`, conditional on `resource_version`; returns the object as
    /// the server stored it.
    pub async fn apply<K>(
        &self,
        api: &Api<K>,
        write: &Write,
        resource_version: Option<&str>,
    ) -> Result<K, ControllerError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let action = format!("{} {} {}", write.part.doing(), K::kind(&()), write.name);
        self.leadership.check(&action)?;
        let patch = write.conditional_patch(resource_version);
        let params = PatchParams::default();
        let written = match write.part {
            Part::Status => {
                api.patch_status(&write.name, &params, &Patch::Merge(&patch))
                    .await
            }
            Part::Finalizers | Part::Object => {
                api.patch(&write.name, &params, &Patch::Merge(&patch)).await
            }
        };
        written.map_err(|source| ControllerError::kube(action, source))
    }

    /// Creates `object` through `api`; an existing object of that name is reported, not an
    /// error.
    pub async fn create<K>(&self, api: &Api<K>, object: &K) -> Result<Created<K>, ControllerError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    {
        let action = format!("creating {} {}", K::kind(&()), object.name_any());
        self.leadership.check(&action)?;
        match api.create(&PostParams::default(), object).await {
            Ok(created) => Ok(Created::New(created)),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Created::AlreadyExists),
            Err(source) => Err(ControllerError::kube(action, source)),
        }
    }

    /// Deletes `object` through `api`, only that very object (its uid): one gone already, or
    /// made again since under the same name, is left alone and reported as `false`.
    pub async fn delete<K>(&self, api: &Api<K>, object: &K) -> Result<bool, ControllerError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let action = format!("deleting {} {}", K::kind(&()), object.name_any());
        self.leadership.check(&action)?;
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: object.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&object.name_any(), &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
            Err(source) => Err(ControllerError::kube(action, source)),
        }
    }
}

/// Whose object a [`PassWrite`] changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A claim of the lock (the write names it).
    Claim,
    /// The lock itself.
    Lock,
}

/// One write of a pass and the object it is for.
#[derive(Debug, Clone, PartialEq)]
pub struct PassWrite {
    /// A claim or the lock.
    pub target: Target,
    /// The write.
    pub write: Write,
}

/// Decides a pass's writes in order, keeping each claim's finalizers as the pass's own earlier
/// writes left them (a merge patch replaces the whole list, so each write must start from the
/// previous one).
#[derive(Debug, Clone, Default)]
pub struct PassWrites {
    finalizers: HashMap<String, Vec<String>>,
}

impl PassWrites {
    /// Starts from the claims as the pass read them, each by its name in the pass (see
    /// [`claim_key`](crate::core::claim_key)).
    pub fn new<'a>(claims: impl IntoIterator<Item = (&'a String, &'a LockClaim)>) -> Self {
        Self {
            finalizers: claims
                .into_iter()
                .map(|(name, claim)| {
                    let finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
                    (name.clone(), finalizers)
                })
                .collect(),
        }
    }

    /// Adds the controller's finalizer to each claim named that lacks it (before any backend
    /// call for it: a claim is never granted without the finalizer that guarantees its release).
    pub fn add_finalizers(&mut self, names: &[String]) -> Vec<Write> {
        names
            .iter()
            .filter_map(|name| self.set_finalizer(name, true))
            .collect()
    }

    /// The writes of one claim's change: its status (when it differs from `old`), then the
    /// removal of the finalizer.
    pub fn claim_change(
        &mut self,
        old: Option<&LockClaimStatus>,
        change: &ClaimChange,
    ) -> Result<Vec<Write>, ControllerError> {
        let mut writes = Vec::new();
        if let Some(status) = &change.status {
            writes.extend(Write::status(&change.name, old, status)?);
        }
        if change.finalizer == FinalizerChange::Remove {
            writes.extend(self.set_finalizer(&change.name, false));
        }
        Ok(writes)
    }

    /// The lock's own writes, after its claims': its status, then its finalizer.
    pub fn lock(
        lock: &DistributedLock,
        decision: &Decision,
    ) -> Result<Vec<Write>, ControllerError> {
        let name = lock.metadata.name.as_deref().unwrap_or_default();
        let mut writes = Vec::new();
        if let Some(status) = &decision.lock_status {
            writes.extend(Write::status(name, lock.status.as_ref(), status)?);
        }
        if decision.add_lock_finalizer || decision.remove_lock_finalizer {
            let mut finalizers = lock.metadata.finalizers.clone().unwrap_or_default();
            finalizers.retain(|f| f != FINALIZER);
            if decision.add_lock_finalizer {
                finalizers.push(FINALIZER.to_owned());
            }
            writes.push(Write::finalizers(name, &finalizers));
        }
        Ok(writes)
    }

    /// Every write of `decision`, in order: the claims' (status of each `old_status` names),
    /// then the lock's.
    pub fn decision<'a>(
        &mut self,
        lock: &DistributedLock,
        old_status: impl Fn(&str) -> Option<&'a LockClaimStatus>,
        decision: &Decision,
    ) -> Result<Vec<PassWrite>, ControllerError> {
        let mut writes = Vec::new();
        for change in &decision.claims {
            for write in self.claim_change(old_status(&change.name), change)? {
                writes.push(PassWrite {
                    target: Target::Claim,
                    write,
                });
            }
        }
        for write in Self::lock(lock, decision)? {
            writes.push(PassWrite {
                target: Target::Lock,
                write,
            });
        }
        Ok(writes)
    }

    fn set_finalizer(&mut self, name: &str, present: bool) -> Option<Write> {
        let finalizers = self.finalizers.entry(name.to_owned()).or_default();
        if finalizers.iter().any(|f| f == FINALIZER) == present {
            return None;
        }
        if present {
            finalizers.push(FINALIZER.to_owned());
        } else {
            finalizers.retain(|f| f != FINALIZER);
        }
        Some(Write::finalizers(name, finalizers))
    }
}

/// Where a lock pass's writes land: the API server ([`ApiStore`]), or a test's simulated
/// one (the controller's property tests run the shell's own pass over it).
pub trait PassStore: Send {
    /// Makes `write` on its object, conditional on `resource_version`; returns the object's
    /// resourceVersion after it.
    fn patch(
        &mut self,
        write: &PassWrite,
        resource_version: Option<&str>,
    ) -> impl Future<Output = Result<Option<String>, ControllerError>> + Send;

    /// The pass is about to make `count` writes as one step (its claims' finalizers, or the
    /// writes it decided). The API server needs no notice; a simulated one schedules the
    /// failures a test asked for among them.
    fn before_writes(&mut self, _count: usize) {}
}

/// [`PassStore`] on the API server, through the [`ApiWriter`] (leadership gate → conditional
/// patch → error with context).
pub struct ApiStore {
    api: ApiWriter,
    client: Client,
    /// The lock's namespace; empty for a `ClusterDistributedLock`, whose claims are named
    /// `namespace/name` in its pass (see [`claim_address`]).
    namespace: String,
    locks: LockApi,
}

/// Where a pass's lock is written.
enum LockApi {
    Namespaced(Api<DistributedLock>),
    Cluster(Api<ClusterDistributedLock>),
}

impl ApiStore {
    /// Writes through `api` to the claims and locks of `namespace`.
    pub fn new(api: ApiWriter, client: Client, namespace: &str) -> Self {
        Self {
            api,
            locks: LockApi::Namespaced(Api::namespaced(client.clone(), namespace)),
            client,
            namespace: namespace.to_owned(),
        }
    }

    /// Writes through `api` to a `ClusterDistributedLock` and its claims, in any namespace.
    pub fn for_cluster_lock(api: ApiWriter, client: Client) -> Self {
        Self {
            api,
            locks: LockApi::Cluster(Api::all(client.clone())),
            client,
            namespace: String::new(),
        }
    }
}

impl PassStore for ApiStore {
    async fn patch(
        &mut self,
        PassWrite { target, write }: &PassWrite,
        resource_version: Option<&str>,
    ) -> Result<Option<String>, ControllerError> {
        Ok(match (target, &self.locks) {
            (Target::Claim, _) => {
                let (namespace, name) = claim_address(&self.namespace, &write.name);
                let claims: Api<LockClaim> = Api::namespaced(self.client.clone(), namespace);
                let write = Write {
                    name: name.to_owned(),
                    ..write.clone()
                };
                self.api
                    .apply(&claims, &write, resource_version)
                    .await?
                    .resource_version()
            }
            (Target::Lock, LockApi::Namespaced(locks)) => self
                .api
                .apply(locks, write, resource_version)
                .await?
                .resource_version(),
            (Target::Lock, LockApi::Cluster(locks)) => self
                .api
                .apply(locks, write, resource_version)
                .await?
                .resource_version(),
        })
    }
}

/// Makes one lock pass's writes (decided by [`PassWrites`]) through a [`PassStore`], each
/// conditional on the resourceVersion the pass read or the one its own previous write
/// produced; and keeps what they left.
pub struct PassWriter<'a, S> {
    store: S,
    lock: &'a DistributedLock,
    claims: &'a HashMap<String, Arc<LockClaim>>,
    writes: PassWrites,
    versions: HashMap<String, Option<String>>,
    /// The resourceVersion of every claim this pass wrote.
    pub written: HashMap<String, String>,
    /// The lock's resourceVersion after this pass's last write of it.
    pub lock_written: Option<String>,
    /// The claims whose status this pass wrote.
    pub statuses_written: HashSet<String>,
}

impl<'a, S: PassStore> PassWriter<'a, S> {
    /// The writer of a pass over `lock` and its `claims` as read (by name), writing through
    /// `store`.
    pub fn new(
        store: S,
        lock: &'a DistributedLock,
        claims: &'a HashMap<String, Arc<LockClaim>>,
    ) -> Self {
        Self {
            store,
            lock,
            claims,
            writes: PassWrites::new(claims.iter().map(|(name, claim)| (name, claim.as_ref()))),
            versions: claims
                .iter()
                .map(|(name, claim)| (name.clone(), claim.resource_version()))
                .collect(),
            written: HashMap::new(),
            lock_written: None,
            statuses_written: HashSet::new(),
        }
    }

    async fn write(&mut self, pass_write: &PassWrite) -> Result<(), ControllerError> {
        let write = &pass_write.write;
        match pass_write.target {
            Target::Claim => {
                let version = self.versions.get(&write.name).cloned().flatten();
                let updated = self.store.patch(pass_write, version.as_deref()).await?;
                if self.deletes(write) {
                    self.written.insert(write.name.clone(), GONE.to_owned());
                } else if let Some(version) = &updated {
                    self.written.insert(write.name.clone(), version.clone());
                }
                self.versions.insert(write.name.clone(), updated);
                if write.part == Part::Status {
                    self.statuses_written.insert(write.name.clone());
                }
            }
            Target::Lock => {
                let version = match &self.lock_written {
                    Some(version) => Some(version.clone()),
                    None => self.lock.resource_version(),
                };
                self.lock_written = self.store.patch(pass_write, version.as_deref()).await?;
            }
        }
        Ok(())
    }

    /// Whether `write` removes the last finalizer of a claim being deleted: the API server
    /// then deletes the claim.
    fn deletes(&self, write: &Write) -> bool {
        write.part == Part::Finalizers
            && write.patch["metadata"]["finalizers"]
                .as_array()
                .is_some_and(Vec::is_empty)
            && self
                .claims
                .get(&write.name)
                .is_some_and(|claim| claim.metadata.deletion_timestamp.is_some())
    }

    /// Adds the controller's finalizer to the claims named that lack it (before the pass's
    /// backend calls).
    pub async fn add_claim_finalizers(&mut self, names: &[String]) -> Result<(), ControllerError> {
        let writes = self.writes.add_finalizers(names);
        self.store.before_writes(writes.len());
        for write in writes {
            let write = PassWrite {
                target: Target::Claim,
                write,
            };
            self.write(&write).await?;
        }
        Ok(())
    }

    /// Writes claims in the decided order (claims leaving `Held` first), then the lock.
    /// Stops at the first failure.
    pub async fn apply(
        &mut self,
        input: &LockInput,
        decision: &Decision,
    ) -> Result<(), ControllerError> {
        let claims = self.claims;
        let writes = self.writes.decision(
            self.lock,
            |name| claims.get(name).and_then(|claim| claim.status.as_ref()),
            decision,
        )?;
        self.store.before_writes(writes.len());
        let mut landed = HashSet::new();
        let mut result = Ok(());
        for pass_write in &writes {
            result = self.write(pass_write).await;
            if result.is_err() {
                break;
            }
            landed.insert(pass_write.write.name.as_str());
        }
        for change in decision
            .claims
            .iter()
            .filter(|c| landed.contains(c.name.as_str()))
        {
            log_claim_change(input, change, claims.get(&change.name).map(Arc::as_ref));
        }
        result
    }
}

/// Logs a claim's phase change (the story of a lock; other status updates are not) and the
/// release of a deleted claim's grant.
fn log_claim_change(input: &LockInput, change: &ClaimChange, object: Option<&LockClaim>) {
    let old = object.and_then(|claim| claim.status.as_ref());
    if let Some(status) = change
        .status
        .as_ref()
        .filter(|status| old.and_then(|old| old.phase) != status.phase)
    {
        let phase = status.phase.unwrap_or_default();
        tracing::info!(
            namespace = %input.lock.namespace,
            lock = %input.lock.name,
            claim = %change.name,
            %phase,
            token = status.fencing_token.unwrap_or_default(),
            position = status.position.unwrap_or_default(),
            reason = status.reason.as_deref().unwrap_or(""),
            "claim is {phase}"
        );
    }
    if change.finalizer == FinalizerChange::Remove
        && object.is_some_and(|claim| claim.metadata.deletion_timestamp.is_some())
    {
        tracing::info!(
            namespace = %input.lock.namespace,
            lock = %input.lock.name,
            claim = %change.name,
            token = old.and_then(|s| s.fencing_token).unwrap_or_default(),
            "claim deleted; its grant is released"
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use turnstile_api::LockClaimSpec;

    #[test]
    fn status_writes_only_what_changed() {
        let write = Write::status(
            "a",
            Some(&json!({"x": 1, "y": 2})),
            &json!({"x": 1, "y": 3}),
        )
        .expect("serialize")
        .expect("changed");
        assert_eq!(write.part, Part::Status);
        assert_eq!(write.patch, json!({"status": {"y": 3}}));
        assert!(Write::status("a", Some(&json!({"x": 1})), &json!({"x": 1}))
            .expect("serialize")
            .is_none());
    }

    #[test]
    fn the_patch_as_sent_carries_the_resource_version() {
        let write = Write::finalizers("a", &["f".to_owned()]);
        assert_eq!(
            write.conditional_patch(Some("42")),
            json!({"metadata": {"finalizers": ["f"], "resourceVersion": "42"}})
        );
        let status = Write::status("a", None, &json!({"x": 1}))
            .expect("serialize")
            .expect("new");
        assert_eq!(
            status.conditional_patch(Some("7")),
            json!({"status": {"x": 1}, "metadata": {"resourceVersion": "7"}})
        );
        assert_eq!(status.conditional_patch(None), status.patch);
    }

    fn claim(name: &str, finalizers: &[&str]) -> LockClaim {
        let mut claim = LockClaim::new(name, LockClaimSpec::for_lock("db"));
        claim.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        claim
    }

    #[test]
    fn finalizer_writes_keep_other_finalizers_and_follow_earlier_writes() {
        let claims = [claim("a", &["other"]), claim("b", &[FINALIZER])];
        let names = ["a".to_owned(), "b".to_owned()];
        let mut writes = PassWrites::new(names.iter().zip(&claims));
        let added = writes.add_finalizers(&["a".to_owned(), "b".to_owned()]);
        assert_eq!(added.len(), 1, "b has it already: {added:?}");
        assert_eq!(
            added[0].patch,
            json!({"metadata": {"finalizers": ["other", FINALIZER]}})
        );
        let removal = ClaimChange {
            name: "a".to_owned(),
            status: None,
            finalizer: FinalizerChange::Remove,
        };
        let removed = writes.claim_change(None, &removal).expect("serialize");
        assert_eq!(
            removed[0].patch,
            json!({"metadata": {"finalizers": ["other"]}}),
            "starts from the list the add left"
        );
        assert!(
            writes
                .claim_change(None, &removal)
                .expect("serialize")
                .is_empty(),
            "a second removal writes nothing"
        );
    }

    /// The lock's finalizer is added or removed among whatever other finalizers it has.
    #[test]
    fn the_locks_finalizer_goes_and_comes_among_the_others() {
        let mut lock = DistributedLock::new("db", turnstile_api::DistributedLockSpec::default());
        lock.metadata.finalizers = Some(vec!["other".to_owned(), FINALIZER.to_owned()]);
        let decision = |add: bool| Decision {
            claims: Vec::new(),
            lock_status: None,
            add_lock_finalizer: add,
            remove_lock_finalizer: !add,
            events: Vec::new(),
            observations: Vec::new(),
            requeue_after: std::time::Duration::from_secs(1),
            backend_failure: None,
            refreshed_positions: false,
        };
        let removed = PassWrites::lock(&lock, &decision(false)).expect("writes");
        assert_eq!(removed, [Write::finalizers("db", &["other".to_owned()])]);
        lock.metadata.finalizers = Some(vec!["other".to_owned()]);
        let added = PassWrites::lock(&lock, &decision(true)).expect("writes");
        let both = ["other".to_owned(), FINALIZER.to_owned()];
        assert_eq!(added, [Write::finalizers("db", &both)]);
    }
}

#[cfg(test)]
mod api_tests;
