//! Gating workloads without an init container: a workload marked with a lock gets a
//! `LockClaim` owned by it (`<name>-<lock>`), and is let go once the claim is `Held`, with the
//! claim's fencing token written to its annotation `turnstile.dev/fencing-token` first (for
//! the downward API). The owner rule then renews the claim while the workload runs and
//! releases it when the workload finishes or is deleted. Two kinds ([`Gated`]):
//!
//! - [`job`]: a Job created with `spec.suspend: true` and the annotation `turnstile.dev/lock`
//!   is un-suspended;
//! - [`pod`]: a Pod with the label `turnstile.dev/lock` and the scheduling gate
//!   `turnstile.dev/lock` (any Pod: bare, or from a Deployment, StatefulSet or CronJob) has the
//!   gate removed, so the scheduler places it.
//!
//! Either may carry the annotation `turnstile.dev/locks: a,b` (a label value cannot hold a
//! list): its claim is then one claim on all those locks at once (`spec.lockNames`), still
//! named after the marking lock, and the token written is the first lock's (name order).
//!
//! The decision ([`decide`]) is pure; [`reconcile`] performs it. Every step is idempotent:
//! the claim has a fixed name, creating it twice answers AlreadyExists, and the release patch
//! is conditional on the workload's resourceVersion.

pub mod job;
pub mod pod;

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::controller::{Action, Config as ControllerRuntimeConfig, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::core::{WorkloadKind, WorkloadOwner};
use crate::error::ControllerError;
use crate::metrics::ControllerKind;
use crate::runtime::context::Context;
use crate::writer::events::Repeats;
use crate::writer::{ApiWriter, Created, Write};
use turnstile_api::{
    gate_event_reasons, BusyPolicy, ClaimPhase, LockClaim, LockClaimSpec, LockKind,
    GROUP_ANNOTATION, LOCKS_ANNOTATION, LOCK_KIND_ANNOTATION, TOKEN_ANNOTATION,
    TRACEPARENT_ANNOTATION, WHEN_BUSY_ANNOTATION,
};

/// How long a name may be (DNS-1123 subdomain).
const MAX_NAME_LENGTH: usize = 253;
/// Retry delay after a failed pass.
const RETRY: Duration = Duration::from_secs(2);

/// A kind of workload the controller can hold back until its claim is held.
pub trait Gated:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + DeserializeOwned
    + serde::Serialize
    + Send
    + Sync
    + 'static
{
    /// The owner kind of its claims.
    const KIND: WorkloadKind;
    /// The metrics label of its passes.
    const CONTROLLER: ControllerKind;
    /// What "held back" means for it, for Events ("suspended", "gated").
    const HELD_BACK: &'static str;

    /// The value of its marking, as written (a Job's annotation, a Pod's label).
    fn marking(&self) -> Option<&String>;
    /// The lock it is gated on, if it is marked with a non-empty one.
    fn gate_lock(&self) -> Option<&str> {
        self.marking()
            .map(|lock| lock.trim())
            .filter(|lock| !lock.is_empty())
    }
    /// Whether it is still held back (suspended, or carrying the scheduling gate).
    fn held_back(&self) -> bool;
    /// Whether it has finished (nothing is gated any more).
    fn finished(&self) -> bool;
    /// The patch that records `token` and lets it go (conditional on its resourceVersion).
    fn release_patch(&self, token: i64) -> serde_json::Value;
    /// Another controller that holds it back too, as far as its object tells.
    fn other_holder(&self) -> Option<OtherHolder> {
        None
    }
}

/// Another controller holding a gated workload back besides Turnstile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OtherHolder {
    /// It lets the workload go by itself, and nothing runs before it has (another scheduling
    /// gate): the claim is made once it has, so the lock is never held by a workload that
    /// cannot run. Says what, for people.
    LetsGoFirst(String),
    /// It decides itself when the workload runs (a queueing controller's `suspend`): letting
    /// the workload go would run it past that controller, which may also let it go without
    /// the lock. Not gated. Says what, for people.
    Decides(String),
}

/// What a pass over one workload does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateStep {
    /// Not a gated workload, or nothing left to do.
    Nothing,
    /// Create the workload's claim on these locks.
    CreateClaim {
        /// The claim's name.
        claim: String,
        /// The locks it asks for: one, or several at once (`turnstile.dev/locks`).
        locks: Vec<String>,
    },
    /// The claim waits in the queue: stay held back.
    Wait,
    /// Another controller's gate comes first: no claim yet, and this says what it waits for.
    WaitForOthers {
        /// For people.
        reason: String,
    },
    /// The claim is held: write the token and let the workload go.
    Release {
        /// The grant's fencing token.
        token: i64,
    },
    /// The workload cannot be gated; it stays as it is, and this says why.
    Blocked {
        /// For people.
        reason: String,
    },
}

/// The locks a gated workload asks for: those of the annotation `turnstile.dev/locks`
/// (comma-separated, for one claim on all of them at once) when it names any, else its marking
/// lock alone. In name order, each once.
pub fn gate_locks<W: Gated>(workload: &W, lock: &str) -> Vec<String> {
    let mut locks: Vec<String> = workload
        .annotations()
        .get(LOCKS_ANNOTATION)
        .into_iter()
        .flat_map(|names| names.split(','))
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();
    if locks.is_empty() {
        locks.push(lock.to_owned());
    }
    locks.sort_unstable();
    locks.dedup();
    locks
}

/// The kind of lock a gated workload names (`turnstile.dev/lock-kind`: `ClusterDistributedLock`,
/// or `DistributedLock`, the default), for its `locks`; else why it cannot be gated.
pub fn gate_lock_kind<W: Gated>(workload: &W, locks: &[String]) -> Result<LockKind, String> {
    let kind = workload
        .annotations()
        .get(LOCK_KIND_ANNOTATION)
        .map(|kind| kind.trim());
    match kind {
        None | Some("" | "DistributedLock") => Ok(LockKind::DistributedLock),
        Some("ClusterDistributedLock") if locks.len() == 1 => Ok(LockKind::ClusterDistributedLock),
        Some("ClusterDistributedLock") => Err(format!(
            "a ClusterDistributedLock is claimed alone: {LOCK_KIND_ANNOTATION} does not go with \
             {LOCKS_ANNOTATION}"
        )),
        Some(other) => Err(format!(
            "annotation {LOCK_KIND_ANNOTATION}: {other:?} is neither DistributedLock nor \
             ClusterDistributedLock"
        )),
    }
}

/// What a gated workload's claim does when its lock is busy: `turnstile.dev/when-busy` and
/// `turnstile.dev/group` (the claim's `spec.whenBusy` and `spec.group`, checked as the schema
/// checks them, so that a bad pair blocks the workload with a reason instead of a claim the
/// API server refuses); else why it cannot be gated.
pub fn gate_busy_policy<W: Gated>(
    workload: &W,
    locks: &[String],
) -> Result<(Option<BusyPolicy>, Option<String>), String> {
    let annotation = |key: &str| {
        workload
            .annotations()
            .get(key)
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    };
    let group = annotation(GROUP_ANNOTATION);
    let Some(policy) = annotation(WHEN_BUSY_ANNOTATION) else {
        return Ok((None, group));
    };
    let policy: BusyPolicy = serde_json::from_value(serde_json::Value::String(policy.clone()))
        .map_err(|_| {
            format!(
                "annotation {WHEN_BUSY_ANNOTATION}: {policy:?} is none of Wait, Fail, \
                 ReplacePending, CancelInProgress"
            )
        })?;
    if policy != BusyPolicy::Wait && locks.len() > 1 {
        return Err(format!(
            "{WHEN_BUSY_ANNOTATION} other than Wait is for one lock, not {LOCKS_ANNOTATION}"
        ));
    }
    if policy.replaces_pending() && group.is_none() {
        return Err(format!(
            "{WHEN_BUSY_ANNOTATION}: {policy:?} needs the annotation {GROUP_ANNOTATION}"
        ));
    }
    Ok((Some(policy), group))
}

/// The claim name of a gated workload: `<name>-<lock>` (its marking lock).
pub fn claim_name(workload: &str, lock: &str) -> String {
    format!("{workload}-{lock}")
}

/// Decides what to do about `workload`, given its claim (looked up by [`claim_name`]) if it
/// exists.
pub fn decide<W: Gated>(workload: &W, claim: Option<&LockClaim>) -> GateStep {
    let Some(lock) = workload.gate_lock() else {
        return GateStep::Nothing;
    };
    if workload.meta().deletion_timestamp.is_some() || workload.finished() {
        return GateStep::Nothing;
    }
    let name = claim_name(&workload.name_any(), lock);
    let locks = gate_locks(workload, lock);
    let kind = match gate_lock_kind(workload, &locks)
        .and_then(|kind| gate_busy_policy(workload, &locks).map(|_| kind))
    {
        Ok(kind) => kind,
        Err(reason) if workload.held_back() => return GateStep::Blocked { reason },
        Err(_) => return GateStep::Nothing,
    };
    match claim {
        None => without_claim(workload, name, locks),
        Some(claim) => claim_mismatch(workload, claim, &name, &locks, kind)
            .unwrap_or_else(|| by_phase(workload, claim, &name)),
    }
}

/// A workload without its claim yet: create it, unless the workload already runs or
/// another holder decides first.
fn without_claim<W: Gated>(workload: &W, name: String, locks: Vec<String>) -> GateStep {
    // Only a workload still held back can be; one that runs already is not gated.
    if !workload.held_back() {
        return GateStep::Nothing;
    }
    if name.len() > MAX_NAME_LENGTH {
        return GateStep::Blocked {
            reason: format!("claim name {name:?} is longer than {MAX_NAME_LENGTH} characters"),
        };
    }
    match workload.other_holder() {
        Some(OtherHolder::Decides(what)) => {
            return GateStep::Blocked {
                reason: format!(
                    "{what}: another controller decides when this {kind} runs, so Turnstile \
                     does not gate it (gate its Pods instead: the lock label and scheduling \
                     gate in its Pod template)",
                    kind = W::kind(&())
                ),
            }
        }
        Some(OtherHolder::LetsGoFirst(what)) => {
            return GateStep::WaitForOthers {
                reason: format!(
                    "waiting for {what} to be removed before claiming {}",
                    describe_locks(&locks)
                ),
            }
        }
        None => {}
    }
    GateStep::CreateClaim { claim: name, locks }
}

/// Why the existing claim is not the workload's (another owner, another lock kind or other
/// locks), if it is not.
fn claim_mismatch<W: Gated>(
    workload: &W,
    claim: &LockClaim,
    name: &str,
    locks: &[String],
    kind: LockKind,
) -> Option<GateStep> {
    let owned = WorkloadOwner::of(claim.owner_references()).is_some_and(|owner| {
        owner.kind == W::KIND && Some(&owner.uid) == workload.meta().uid.as_ref()
    });
    if !owned {
        return Some(GateStep::Blocked {
            reason: format!(
                "claim {name} exists but is not owned by this {}",
                W::kind(&())
            ),
        });
    }
    if claim.spec.lock_kind.unwrap_or_default() != kind {
        return Some(GateStep::Blocked {
            reason: format!(
                "claim {name} asks for a {}, not a {}",
                claim.spec.lock_kind.unwrap_or_default().as_str(),
                kind.as_str()
            ),
        });
    }
    if claim.spec.locks() != locks {
        return Some(GateStep::Blocked {
            reason: format!(
                "claim {name} asks for {}, not {}",
                describe_locks(&claim.spec.locks()),
                describe_locks(locks)
            ),
        });
    }
    None
}

/// The workload's next step as its claim's phase says.
fn by_phase<W: Gated>(workload: &W, claim: &LockClaim, name: &str) -> GateStep {
    let status = claim.status.as_ref();
    match status.and_then(|s| s.phase).unwrap_or_default() {
        ClaimPhase::Pending => GateStep::Wait,
        ClaimPhase::Held => match status.and_then(|s| s.fencing_token) {
            Some(token) => {
                let written =
                    workload.annotations().get(TOKEN_ANNOTATION) == Some(&token.to_string());
                if workload.held_back() || !written {
                    GateStep::Release { token }
                } else {
                    GateStep::Nothing
                }
            }
            None => GateStep::Wait,
        },
        // Released (the workload finished), Expired or Failed: a terminal claim is never
        // granted again, so a workload still held back stays so (the claim's reason says why).
        phase => {
            if workload.held_back() {
                GateStep::Blocked {
                    reason: format!(
                        "claim {name} is {phase}; the {} stays {}",
                        W::kind(&()),
                        W::HELD_BACK
                    ),
                }
            } else {
                GateStep::Nothing
            }
        }
    }
}

/// `lock db` or `locks a, b`, for messages.
fn describe_locks<S: AsRef<str>>(locks: &[S]) -> String {
    let names: Vec<&str> = locks.iter().map(AsRef::as_ref).collect();
    match names.as_slice() {
        [one] => format!("lock {one}"),
        several => format!("locks {}", several.join(", ")),
    }
}

/// The claim a gated workload gets: owned (controller) by it, so it follows its life. On
/// several locks, one claim on all of them at once. It carries the controller's finalizer
/// from the start: its grant takes one write.
pub fn claim_for<W: Gated>(workload: &W, claim: &str, locks: &[String]) -> LockClaim {
    let mut spec = match locks {
        [lock] if gate_lock_kind(workload, locks) == Ok(LockKind::ClusterDistributedLock) => {
            LockClaimSpec::for_cluster_lock(lock.clone())
        }
        [lock] => LockClaimSpec::for_lock(lock.clone()),
        several => LockClaimSpec::for_locks(several.iter().cloned()),
    };
    if let Ok((when_busy, group)) = gate_busy_policy(workload, locks) {
        spec.when_busy = when_busy;
        spec.group = group;
    }
    let mut object = LockClaim::new(claim, spec).with_release_finalizer();
    object.metadata.namespace = workload.namespace();
    object.metadata.owner_references = Some(vec![OwnerReference {
        api_version: W::api_version(&()).into_owned(),
        kind: W::kind(&()).into_owned(),
        name: workload.name_any(),
        uid: workload.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        // Setting blockOwnerDeletion needs `update` on the owner's finalizers; the claim's own
        // finalizer already guarantees the backend release.
        block_owner_deletion: None,
    }]);
    // The workload's trace context, if it names one: the claim's spans join its trace.
    if let Some(traceparent) = workload.annotations().get(TRACEPARENT_ANNOTATION) {
        object
            .annotations_mut()
            .insert(TRACEPARENT_ANNOTATION.to_owned(), traceparent.clone());
    }
    object
}

/// What the gates' passes share.
pub struct GateContext {
    /// The lock controller's handles (the claim cache and its index, the API client, the
    /// leadership gate checked right before every write, Events, metrics): a gate reads the
    /// same caches and writes through the same gate.
    pub shared: Arc<Context>,
    /// Why each blocked workload was last said to be blocked (see [`BlockedSaid`]).
    pub blocked_said: BlockedSaid,
}

/// The `GateBlocked` (or `WaitingForGates`) reason last published per workload uid, so that a
/// workload that stays blocked for the same reason is told once, not on every pass (each of which was an Event
/// write: every change of the workload, every event of its claim).
#[derive(Debug, Clone, Default)]
pub struct BlockedSaid {
    said: Arc<Mutex<HashMap<String, String>>>,
}

impl BlockedSaid {
    /// At most this many workloads are remembered; past it the memory starts afresh (each is
    /// then told once more), so workloads deleted while blocked cannot pile up.
    const MAX_REMEMBERED: usize = 10_000;

    /// Whether `reason` is news for the workload `uid` (and remembers it).
    fn is_news(&self, uid: &str, reason: &str) -> bool {
        let mut said = self.lock();
        if said.get(uid).is_some_and(|last| last == reason) {
            return false;
        }
        if said.len() >= Self::MAX_REMEMBERED {
            said.clear();
        }
        said.insert(uid.to_owned(), reason.to_owned());
        true
    }

    /// The workload `uid` is no longer blocked: if it is again, that is news.
    fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // A panic while holding the lock leaves a map that is still valid.
        self.said
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl GateContext {
    /// Publishes an Event about `workload`; a failed publish is only logged.
    async fn event<W: Gated>(&self, workload: &W, type_: EventType, reason: &str, note: String) {
        if self
            .shared
            .api
            .leadership
            .check("publishing a gate Event")
            .is_err()
        {
            return;
        }
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(error) = self
            .shared
            .api
            .events
            // A blocked workload says so once per reason (`BlockedSaid`); after a restart, or
            // blocked again later, the Event's count rises instead of a new one.
            .publish(&event, &workload.object_ref(&()), Repeats::Often)
            .await
        {
            tracing::debug!(kind = %W::kind(&()), name = %workload.name_any(), %error, "cannot publish gate Event");
        }
    }
}

/// One pass over a workload (see the module docs).
pub async fn reconcile<W: Gated>(
    workload: Arc<W>,
    ctx: Arc<GateContext>,
) -> Result<Action, ControllerError> {
    let mut timer = ctx.shared.metrics.reconciles.start(W::CONTROLLER);
    let result = gate(workload, &ctx).await;
    timer.set_failed(result.is_err());
    result
}

async fn gate<W: Gated>(workload: Arc<W>, ctx: &GateContext) -> Result<Action, ControllerError> {
    let Some(lock) = workload.gate_lock() else {
        return Ok(Action::await_change());
    };
    let namespace = workload.namespace().unwrap_or_default();
    if crate::runtime::context::is_terminating(ctx.shared.cache.namespaces.as_ref(), &namespace) {
        return Ok(Action::await_change());
    }
    let name = workload.name_any();
    let claim_name = claim_name(&name, lock);
    let cached = ctx
        .shared
        .cache
        .claims
        .get(&ObjectRef::new(&claim_name).within(&namespace));
    let mut step = decide(workload.as_ref(), cached.as_deref());
    if let GateStep::CreateClaim { claim, locks } = &step {
        match create_claim(workload.as_ref(), ctx, claim, locks).await? {
            None => return Ok(Action::await_change()),
            Some(again) => step = again,
        }
    }
    if !matches!(
        step,
        GateStep::Blocked { .. } | GateStep::WaitForOthers { .. }
    ) {
        if let Some(uid) = workload.uid() {
            ctx.blocked_said.forget(&uid);
        }
    }
    take_step(workload.as_ref(), ctx, step, lock).await?;
    Ok(Action::await_change())
}

/// Creates the workload's claim; None once created, else the step decided again on the claim
/// that already exists (the cache lagged behind).
async fn create_claim<W: Gated>(
    workload: &W,
    ctx: &GateContext,
    claim: &str,
    locks: &[String],
) -> Result<Option<GateStep>, ControllerError> {
    // `Job` or `Pod`, as people call it in logs.
    let (kind, namespace, name) = (
        W::kind(&()),
        workload.namespace().unwrap_or_default(),
        workload.name_any(),
    );
    let claims: Api<LockClaim> = Api::namespaced(ctx.shared.api.client.clone(), &namespace);
    let writer = ApiWriter::new(ctx.shared.api.leadership.clone());
    // The claim queues from when the workload arrived, not from when this pass (one of
    // several at once) gets to create it.
    if let Some(uid) = workload.uid() {
        ctx.shared
            .cache
            .claim_index
            .expect_arrival(&namespace, claim, &uid);
    }
    match writer
        .create(&claims, &claim_for(workload, claim, locks))
        .await?
    {
        Created::New(_) => {
            tracing::info!(%namespace, %kind, %name, ?locks, %claim, "gated workload: claim created");
            ctx.event(
                workload,
                EventType::Normal,
                gate_event_reasons::WAITING_FOR_LOCK,
                format!(
                    "{} until LockClaim {claim} holds {}",
                    W::HELD_BACK,
                    describe_locks(locks)
                ),
            )
            .await;
            Ok(None)
        }
        // The cache lags behind: decide again on the claim as it is.
        Created::AlreadyExists => {
            let existing = claims
                .get(claim)
                .await
                .map_err(|e| ControllerError::kube(format!("reading claim {claim}"), e))?;
            Ok(Some(decide(workload, Some(&existing))))
        }
    }
}

/// Takes a step other than creating the claim: lets the workload go, or says why it waits.
async fn take_step<W: Gated>(
    workload: &W,
    ctx: &GateContext,
    step: GateStep,
    lock: &str,
) -> Result<(), ControllerError> {
    // `Job` or `Pod`, as people call it in logs.
    let (kind, namespace, name) = (
        W::kind(&()),
        workload.namespace().unwrap_or_default(),
        workload.name_any(),
    );
    let writer = ApiWriter::new(ctx.shared.api.leadership.clone());
    match step {
        GateStep::Release { token } => {
            let api: Api<W> = Api::namespaced(ctx.shared.api.client.clone(), &namespace);
            let write = Write::object(&name, workload.release_patch(token));
            writer
                .apply(&api, &write, workload.resource_version().as_deref())
                .await?;
            tracing::info!(%namespace, %kind, %name, %lock, token, "gated workload: lock held, let go");
            ctx.event(
                workload,
                EventType::Normal,
                gate_event_reasons::LOCK_HELD,
                format!(
                    "lock {lock} held with fencing token {token}; no longer {}",
                    W::HELD_BACK
                ),
            )
            .await;
        }
        GateStep::Blocked { reason } => {
            let uid = workload.uid().unwrap_or_default();
            if !ctx.blocked_said.is_news(&uid, &reason) {
                tracing::debug!(%namespace, %kind, %name, %lock, %reason, "gated workload still blocked");
                return Ok(());
            }
            tracing::warn!(%namespace, %kind, %name, %lock, %reason, "gated workload blocked");
            ctx.event(
                workload,
                EventType::Warning,
                gate_event_reasons::GATE_BLOCKED,
                reason,
            )
            .await;
        }
        GateStep::WaitForOthers { reason } => {
            let uid = workload.uid().unwrap_or_default();
            if ctx.blocked_said.is_news(&uid, &reason) {
                tracing::info!(%namespace, %kind, %name, %lock, %reason, "gated workload: another gate first");
                ctx.event(
                    workload,
                    EventType::Normal,
                    gate_event_reasons::WAITING_FOR_GATES,
                    reason,
                )
                .await;
            }
        }
        GateStep::Nothing | GateStep::Wait | GateStep::CreateClaim { .. } => {}
    }
    Ok(())
}

/// Retries a failed pass soon (409s included: the next pass reads fresh state).
pub fn error_policy<W: Gated>(
    workload: Arc<W>,
    error: &ControllerError,
    _ctx: Arc<GateContext>,
) -> Action {
    if error.is_not_leader() {
        // The controllers are stopping; the next leader takes over.
        return Action::await_change();
    }
    let object = format!(
        "{}/{}/{}",
        W::kind(&()),
        workload.namespace().unwrap_or_default(),
        workload.name_any()
    );
    error.log_failed_pass(&object, RETRY);
    Action::requeue(RETRY)
}

/// The workload of kind `W` a claim event concerns: its owner, if it is one.
fn owner_of_claim<W: Gated>(claim: Arc<LockClaim>) -> Option<ObjectRef<W>> {
    let owner = WorkloadOwner::of(claim.owner_references())?;
    let namespace = claim.namespace()?;
    (owner.kind == W::KIND).then(|| ObjectRef::new(&owner.name).within(&namespace))
}

/// The gate of `W` over the cache `workloads` (fed by `events`) and the shared claim watch's
/// `claim_events`, until `stop` completes.
pub fn run_gate<W: Gated>(
    workloads: Store<W>,
    events: impl Stream<Item = Arc<W>> + Send + 'static,
    ctx: Arc<GateContext>,
    claim_events: impl Stream<Item = Arc<LockClaim>> + Send + 'static,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send {
    // No debounce: a lone event is handled at once (bursts merge in the scheduler).
    Controller::for_shared_stream(events, workloads)
        .watches_shared_stream(claim_events, owner_of_claim::<W>)
        .with_config(ControllerRuntimeConfig::default())
        .graceful_shutdown_on(stop)
        .run(reconcile::<W>, error_policy::<W>, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(kind = %W::kind(&()), %error, "gate");
            }
        })
}
