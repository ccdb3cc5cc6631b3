//! The simulation the core's tests drive: a simulated API server holding one lock and its
//! claims, the real in-memory lock engine, a simulated clock, and the shell's own pass
//! ([`run_pass`]: plan → finalizers → backend calls → fold → the decided writes), writing to
//! the simulated server as to the real one: merge patches, conditional on resourceVersions,
//! failing as the test schedules.
// Each test binary uses a different part of this shared support.
#![allow(dead_code)]

mod faults;
mod invariants;

pub use faults::{Faults, FaultyBackend};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use turnstile_api::error_chain;
use turnstile_api::reasons;
use turnstile_api::{
    BackendKind, ClaimPhase, DistributedLock, DistributedLockSpec, LockClaim, LockClaimSpec, Micros,
};
use turnstile_controller::core::{
    plan, BackendView, ClaimView, Decision, EventSubject, LockInput, LockView, OpOutcome,
    OwnerState,
};
use turnstile_controller::pass::execute::{run_pass, Engine, PassOutcome};
use turnstile_controller::pass::multi_lock::MemberEngines;
use turnstile_controller::runtime::arrivals::Arrivals;
use turnstile_controller::writer::patch::apply_merge_patch;
use turnstile_controller::writer::{PassStore, PassWriter};
use turnstile_controller::writer::{PassWrite, Target, Write};
use turnstile_controller::ControllerError;
use turnstile_lock::{Backend, MemoryBackend};

pub const NS: &str = "team-a";
pub const LOCK: &str = "db";
/// A change takes effect in one pass; the next pass confirms there is nothing left to do.
pub const MAX_PASSES_TO_SETTLE: usize = 2;

/// What became of one pass of [`Sim::pass_with_failures`].
pub struct PassResult {
    /// How many backend calls it planned.
    pub ops: usize,
    /// Its decision, unless a finalizer write failed before its backend calls.
    pub decision: Option<Decision>,
    /// Whether one of its API writes failed (and the later ones were not made).
    pub write_failed: bool,
}

/// What [`Sim::run_pass`] did.
struct SimPass {
    /// How many backend calls the pass planned.
    calls: usize,
    /// Whether its snapshot failed (so it made no call).
    backend_away: bool,
    /// The pass's outcome (`Err`: a finalizer write failed, before any call).
    outcome: Result<PassOutcome, ControllerError>,
}

/// The simulated API server as a pass writes to it: each write checked against the object's
/// resourceVersion (409 Conflict when the pass read an older one, as from a stale cache),
/// failing as the test scheduled ([`Sim::fail_api_write`], or every write), else applied as
/// a merge patch.
struct SimApi<'s> {
    sim: &'s mut Sim,
    /// Every write fails.
    writes_fail: bool,
    /// The index, within the current step of writes, of the one that fails.
    failing: Option<usize>,
    /// Writes made so far in the current step.
    made: usize,
}

/// The API server's answer to a write it refuses: `code` (409 Conflict, 500 for a failure).
fn api_error(code: u16, write: &Write) -> ControllerError {
    let (message, reason) = match code {
        409 => ("the object has been modified", "Conflict"),
        _ => ("injected by the simulation", "InternalError"),
    };
    let status = kube::core::Status::failure(message, reason).with_code(code);
    ControllerError::kube(
        format!("writing {}", write.name),
        kube::Error::Api(status.boxed()),
    )
}

impl PassStore for SimApi<'_> {
    fn before_writes(&mut self, count: usize) {
        self.made = 0;
        if count > 0 && self.failing.is_none() {
            self.failing = self.sim.api_write_fails.take().map(|k| k % count);
        }
    }

    async fn patch(
        &mut self,
        PassWrite { target, write }: &PassWrite,
        resource_version: Option<&str>,
    ) -> Result<Option<String>, ControllerError> {
        let index = self.made;
        self.made += 1;
        let current = match target {
            Target::Claim => self
                .sim
                .claims
                .get(&write.name)
                .and_then(|claim| claim.metadata.resource_version.clone()),
            Target::Lock => self.sim.lock.metadata.resource_version.clone(),
        };
        if resource_version.is_some() && resource_version != current.as_deref() {
            return Err(api_error(409, write));
        }
        if self.writes_fail || self.failing == Some(index) {
            self.failing = None;
            return Err(api_error(500, write));
        }
        match target {
            Target::Claim => {
                self.sim.apply_to_claim(write);
                Ok(self
                    .sim
                    .claims
                    .get(&write.name)
                    .and_then(|claim| claim.metadata.resource_version.clone()))
            }
            Target::Lock => {
                let mut lock = patched(&self.sim.lock, write);
                lock.metadata.resource_version = self.sim.next_version();
                self.sim.lock = lock;
                self.sim.writes += 1;
                Ok(self.sim.lock.metadata.resource_version.clone())
            }
        }
    }
}

/// A simulated API server holding one lock and its claims, a real memory backend, and a
/// clock shared by both (tokio's paused clock drives the backend's leases).
pub struct Sim {
    /// The lock engine's true state: what the tests and the invariants look at. Passes reach
    /// it through [`FaultyBackend`], failing as `faults` says.
    pub backend: Arc<dyn Backend>,
    /// Backend failures scheduled by the test.
    pub faults: Arc<Faults>,
    /// Armed by [`Sim::fail_api_write`]: which write of the next pass that writes fails.
    pub api_write_fails: Option<usize>,
    /// Whether the last pass met a backend failure (its snapshot, or one of its calls).
    pub last_pass_failed: bool,
    /// Held claims a pass may not have renewed because of a backend failure, a lost API write
    /// (or a lock spec it cannot serve), since their last pass without one: a running owner's
    /// lease that runs out meanwhile is not the controller's failure (README: "while a
    /// backend is away, holders keep their grants (and tokens) until their leases run out").
    pub renewals_blocked: BTreeSet<String>,
    pub lock: DistributedLock,
    pub claims: BTreeMap<String, LockClaim>,
    pub start: Timestamp,
    pub elapsed: Duration,
    pub next_uid: u64,
    /// API writes (status patches and finalizer changes) so far.
    pub writes: usize,
    /// Events so far, as (subject, reason).
    pub events: Vec<(String, &'static str)>,
    /// Every grant announced so far, in order: (claim, token).
    pub grants: Vec<(String, i64)>,
    /// Sequence numbers for FIFO checks: when each claim was created / last granted.
    pub seq: u64,
    pub created_seq: BTreeMap<String, u64>,
    pub granted_seq: BTreeMap<String, u64>,
    /// Phases once terminal.
    pub terminal: BTreeMap<String, ClaimPhase>,
    /// The state of each owned claim's Pod (what the shell would look up).
    pub owners: BTreeMap<String, OwnerState>,
    /// When the last settled pass asked to be woken up.
    pub requeue_after: Duration,
    /// Every grant's `acquiredAt` and every involuntary end's `releasedAt` (expiry, maximum
    /// hold, owner gone), in whole seconds: for the lock-delay check.
    pub grant_times: Vec<i64>,
    /// With the number of grants made before each end: only later grants are checked.
    pub involuntary_ends: Vec<(i64, usize)>,
    /// How many held the lock when `maxHolders` was last lowered below that.
    pub held_when_lowered: usize,
    /// Claims whose lease ran out while the controller was down.
    pub lapsed_while_down: BTreeSet<String>,
    /// Holders a pass on a stale cache took for waiters (held in the API, not in its view).
    /// The README says what such a pass may do to them ("### Tests": a holder it takes for a
    /// waiter is re-granted with a new token, and a claim released meanwhile is taken back),
    /// and only that is excused, until they stop holding: the backend may hold them under a
    /// larger token than the API shows, or have lost them, so that they end `LockLost`.
    pub taken_for_waiters: BTreeSet<String>,
    /// The controller's budget for position refreshes is spent (passes may not refresh).
    pub position_refreshes_denied: bool,
    /// The namespace is being deleted (the shell's namespaces cache says so).
    pub namespace_terminating: bool,
    /// Extra passes the next `settle` may take: one after a stale pass, whose stray grants
    /// are released by the pass after the one that finds them.
    pub extra_passes: usize,
    /// The last resourceVersion the simulated API server gave out (one counter for all
    /// objects, as etcd's revision).
    pub revision: u64,
    /// The controller's arrivals (its own `Arrivals`, fed each claim as it is created): in
    /// creation order, many within one second.
    pub arrivals: Arrivals,
}

impl Sim {
    /// [`Sim::new`] with plain claims `names` (no owner, the lock's lease and no timeout)
    /// created in that order, after the passes they cause.
    pub async fn settled_with(max_holders: i32, lease: i64, names: &[&str]) -> Self {
        let mut sim = Sim::new(max_holders, lease);
        for name in names {
            sim.create(name, Sim::claim_spec(None, None));
        }
        sim.settle().await;
        sim
    }

    pub fn new(max_holders: i32, lease: i64) -> Self {
        let mut lock = DistributedLock::new(
            LOCK,
            DistributedLockSpec {
                backend: Some(BackendKind::Memory),
                lease_duration_seconds: lease,
                max_holders,
                key: None,
                max_hold_seconds: None,
                lock_delay_seconds: None,
                queue: None,
                max_overtake_seconds: None,
            },
        );
        lock.metadata.namespace = Some(NS.to_owned());
        lock.metadata.uid = Some("lock-uid".to_owned());
        lock.metadata.generation = Some(1);
        lock.metadata.resource_version = Some("1".to_owned());
        Self {
            backend: Arc::new(MemoryBackend::new()),
            faults: Arc::new(Faults::default()),
            api_write_fails: None,
            last_pass_failed: false,
            renewals_blocked: BTreeSet::new(),
            lock,
            claims: BTreeMap::new(),
            start: "2030-01-01T00:00:00Z".parse().expect("timestamp"),
            elapsed: Duration::ZERO,
            next_uid: 0,
            writes: 0,
            events: Vec::new(),
            grants: Vec::new(),
            seq: 0,
            created_seq: BTreeMap::new(),
            granted_seq: BTreeMap::new(),
            terminal: BTreeMap::new(),
            owners: BTreeMap::new(),
            requeue_after: Duration::from_secs(300),
            grant_times: Vec::new(),
            involuntary_ends: Vec::new(),
            held_when_lowered: 0,
            lapsed_while_down: BTreeSet::new(),
            taken_for_waiters: BTreeSet::new(),
            position_refreshes_denied: false,
            namespace_terminating: false,
            extra_passes: 0,
            revision: 1,
            arrivals: Arrivals::default(),
        }
    }

    /// The next resourceVersion: every change of an object gets a new one.
    fn next_version(&mut self) -> Option<String> {
        self.revision += 1;
        Some(self.revision.to_string())
    }

    pub fn now(&self) -> Timestamp {
        self.start + self.elapsed
    }

    pub fn now_time(&self) -> Time {
        Time(self.now())
    }

    /// Lets `by` pass with the controller running: it wakes up whenever its last pass asked
    /// to (`requeue_after`), as the runtime would, and settles each time.
    pub async fn advance(&mut self, by: Duration) {
        let mut left = by;
        while !left.is_zero() {
            let step = left.min(self.requeue_after);
            self.advance_while_down(step).await;
            left -= step;
            self.settle().await;
        }
    }

    /// Lets `by` pass without any reconcile (the controller is down).
    pub async fn advance_while_down(&mut self, by: Duration) {
        self.elapsed += by;
        tokio::time::advance(by).await;
    }

    /// The controller is down for `by`: a running owner's lease that runs out meanwhile is
    /// not the controller's failure (nobody could renew it), so it is excused from the
    /// "a running owner never loses its lease" invariant.
    pub async fn controller_down(&mut self, by: Duration) {
        self.advance_while_down(by).await;
        let now = self.now();
        for (name, claim) in &self.claims {
            let status = claim.status.as_ref();
            let held = status.and_then(|s| s.phase) == Some(ClaimPhase::Held);
            let lapsed = status
                .and_then(|s| s.expires_at.as_ref())
                .is_some_and(|expires| expires.0 <= now);
            if held && lapsed {
                self.lapsed_while_down.insert(name.clone());
            }
        }
    }

    pub fn create(&mut self, name: &str, spec: LockClaimSpec) {
        if self.claims.contains_key(name) {
            return;
        }
        // A new object under an old name.
        self.terminal.remove(name);
        self.owners.remove(name);
        self.taken_for_waiters.remove(name);
        self.renewals_blocked.remove(name);
        self.granted_seq.remove(name);
        self.next_uid += 1;
        self.seq += 1;
        let mut claim = LockClaim::new(name, spec);
        claim.metadata = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NS.to_owned()),
            uid: Some(format!("uid-{}", self.next_uid)),
            generation: Some(1),
            creation_timestamp: Some(self.now_time()),
            resource_version: self.next_version(),
            ..ObjectMeta::default()
        };
        self.created_seq.insert(name.to_owned(), self.seq);
        // The controller's watch delivers the new claim.
        self.arrivals.applied(&claim, false, self.now());
        self.claims.insert(name.to_owned(), claim);
    }

    /// Creates a claim owned by a running Pod of the same name.
    pub fn create_owned(&mut self, name: &str, spec: LockClaimSpec) {
        if self.claims.contains_key(name) {
            return;
        }
        self.create(name, spec);
        let claim = self.claims.get_mut(name).expect("created");
        claim.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Pod".to_owned(),
            name: format!("pod-{name}"),
            uid: format!("pod-uid-{name}"),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        self.owners.insert(name.to_owned(), OwnerState::Alive);
    }

    pub fn set_owner(&mut self, name: &str, state: OwnerState) {
        if let Some(owner) = self.owners.get_mut(name) {
            *owner = state;
        }
    }

    pub fn claim_spec(lease: Option<i64>, timeout: Option<i64>) -> LockClaimSpec {
        LockClaimSpec {
            lease_duration_seconds: lease,
            acquire_timeout_seconds: timeout,
            ..LockClaimSpec::for_lock(LOCK)
        }
    }

    pub fn edit_spec(&mut self, name: &str, edit: impl FnOnce(&mut LockClaimSpec)) {
        let version = self.next_version();
        if let Some(claim) = self.claims.get_mut(name) {
            let before = claim.spec.clone();
            edit(&mut claim.spec);
            if claim.spec != before {
                claim.metadata.generation = claim.metadata.generation.map(|g| g + 1);
                claim.metadata.resource_version = version;
            }
        }
    }

    /// Sets annotation `key` on claim `name` (as `kubectl annotate` or `turnstile release`).
    pub fn annotate(&mut self, name: &str, key: &str, value: &str) {
        let version = self.next_version();
        if let Some(claim) = self.claims.get_mut(name) {
            claim
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key.to_owned(), value.to_owned());
            claim.metadata.resource_version = version;
        }
    }

    pub fn renew(&mut self, name: &str) {
        let now = self.now_time();
        self.edit_spec(name, |spec| spec.renew_time = Some(now));
    }

    /// Sets `spec.renewTime` to `offset_seconds` from now: a late renewal (negative, the
    /// holder's clock behind or its patch delayed) or one from the future (a clock ahead).
    pub fn renew_at(&mut self, name: &str, offset_seconds: i64) {
        let at = Time(self.now() + k8s_openapi::jiff::SignedDuration::from_secs(offset_seconds));
        self.edit_spec(name, |spec| spec.renew_time = Some(at));
    }

    pub fn release(&mut self, name: &str) {
        self.edit_spec(name, |spec| spec.release = Some(true));
    }

    pub fn delete(&mut self, name: &str) {
        let now = self.now_time();
        let version = self.next_version();
        let Some(claim) = self.claims.get_mut(name) else {
            return;
        };
        if claim.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
            self.claims.remove(name);
        } else if claim.metadata.deletion_timestamp.is_none() {
            claim.metadata.deletion_timestamp = Some(now);
            claim.metadata.resource_version = version;
        }
    }

    /// Changes the lock's `maxHolders` live (a lowered limit revokes nobody).
    pub fn set_max_holders(&mut self, max_holders: i32) {
        let held = self
            .claims
            .values()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Held))
            .count();
        if held > usize::try_from(max_holders).expect("positive") {
            self.held_when_lowered = self.held_when_lowered.max(held);
        }
        self.lock.spec.max_holders = max_holders;
        self.lock.metadata.generation = self.lock.metadata.generation.map(|g| g + 1);
        self.lock.metadata.resource_version = self.next_version();
    }

    pub fn restart_backend(&mut self) {
        self.backend = Arc::new(MemoryBackend::new());
    }

    pub fn phase(&self, name: &str) -> Option<ClaimPhase> {
        self.claims
            .get(name)
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase)
    }

    pub fn token(&self, name: &str) -> Option<i64> {
        self.claims[name].status.as_ref()?.fencing_token
    }

    pub fn position(&self, name: &str) -> Option<i32> {
        self.claims[name].status.as_ref()?.position
    }

    /// `status.reason` of claim `name`.
    pub fn reason(&self, name: &str) -> Option<String> {
        self.claims[name].status.as_ref()?.reason.clone()
    }

    /// `status.expiresAt` of claim `name`.
    pub fn expires_at(&self, name: &str) -> Option<Time> {
        self.claims[name].status.as_ref()?.expires_at.clone()
    }

    /// The claim's place in the queue as the controller orders it: priority, then its
    /// arrival (recorded in its status, else as the watch gave it), then name.
    pub fn place(&self, claim: &LockClaim) -> (std::cmp::Reverse<i32>, i64, String) {
        let (arrival, name) = arrival_key_of(claim, &self.arrivals);
        (
            std::cmp::Reverse(claim.spec.priority.unwrap_or(0)),
            arrival,
            name,
        )
    }

    pub fn input(&self, backend: BackendView) -> LockInput {
        LockInput {
            lock: LockView::from_resource(&self.lock)
                .going_with_namespace(self.namespace_terminating),
            claims: self
                .claims
                .iter()
                .map(|(name, claim)| {
                    let mut view = ClaimView::from_resource(claim)
                        .expect("complete claim")
                        .observed_arrival(arrival_of(claim, &self.arrivals));
                    if let Some(state) = self.owners.get(name) {
                        view.owner_state = *state;
                    }
                    view
                })
                .collect(),
            now: self.now(),
            backend,
            may_refresh_positions: !self.position_refreshes_denied,
        }
    }

    /// The lock engine as a pass reaches it: through the scheduled failures.
    fn engine(&self) -> FaultyBackend {
        FaultyBackend {
            inner: Arc::clone(&self.backend),
            faults: Arc::clone(&self.faults),
        }
    }

    /// What a pass reads before it runs, on the current claims and backend: the lock's
    /// backend key, the pass's input, and the engine if its snapshot answered (as the shell's
    /// `backend_of`: a failed snapshot is `BackendView::Unavailable`, and no call is made).
    async fn read_now(&self) -> (String, LockInput, Option<FaultyBackend>) {
        let key = LockView::from_resource(&self.lock).backend_key();
        let engine = self.engine();
        let (view, engine) = match engine.snapshot(&key).await {
            Ok(snapshot) => (
                BackendView::Ready {
                    backend: BackendKind::Memory,
                    snapshot,
                },
                Some(engine),
            ),
            Err(error) => (
                BackendView::Unavailable {
                    backend: BackendKind::Memory,
                    message: error_chain(&error),
                },
                None,
            ),
        };
        (key, self.input(view), engine)
    }

    /// Runs the shell's own pass ([`run_pass`]) on the current claims, writing to this
    /// simulated API server (every write failing with `writes_fail`). Returns the number of
    /// calls it planned and what it did (`Err`: a finalizer write failed, before any call).
    async fn run_pass(&mut self, writes_fail: bool) -> SimPass {
        let (key, input, engine) = self.read_now().await;
        // The plan the pass is about to make (it is pure), to schedule a mid-pass failure.
        let calls = plan(&input).ops.len();
        if let Some(engine) = &engine {
            engine.faults.arm_for(calls);
        }
        let lock = self.lock.clone();
        let objects: HashMap<String, Arc<LockClaim>> = self
            .claims
            .iter()
            .map(|(name, claim)| (name.clone(), Arc::new(claim.clone())))
            .collect();
        let store = SimApi {
            sim: self,
            writes_fail,
            failing: None,
            made: 0,
        };
        let mut pass = PassWriter::new(store, &lock, &objects);
        let backend_away = engine.is_none();
        let engine = engine.as_ref().map(|engine| Engine {
            backend: engine,
            key: &key,
        });
        let outcome = run_pass(&mut pass, &input, engine, &MemberEngines::default(), || {
            true
        })
        .await;
        SimPass {
            calls,
            backend_away,
            outcome,
        }
    }

    /// One pass whose API writes all fail (a 500, or the 409s of a stale cache), reading
    /// `view` as its claim cache (a stale one, or `None` for the current claims). Nothing of
    /// it reaches the API; the backend keeps what it did.
    pub async fn pass_losing_writes(&mut self, view: Option<BTreeMap<String, LockClaim>>) {
        // Claims gone from the API meanwhile are gone from any cache that shows them again.
        let current = self.claims.clone();
        if let Some(mut stale) = view {
            stale.retain(|name, _| current.contains_key(name));
            let held = |claim: &LockClaim| {
                claim.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Held)
            };
            for (name, claim) in &current {
                if held(claim) && !stale.get(name).is_some_and(held) {
                    self.taken_for_waiters.insert(name.clone());
                }
            }
            self.extra_passes = 1;
            self.claims = stale;
        }
        let pass = self.run_pass(true).await;
        if let Ok(outcome) = &pass.outcome {
            assert!(
                outcome.applied.is_err() || !outcome.decision.writes_anything(),
                "a pass whose writes all fail reported them landed"
            );
        }
        self.claims = current;
    }

    /// One reconcile pass, as the shell performs it. Returns the plan's op count and the
    /// decision.
    pub async fn pass(&mut self) -> (usize, Decision) {
        let pass = self.pass_with_failures().await;
        (
            pass.ops,
            pass.decision.expect("a pass whose writes all landed"),
        )
    }

    /// The next pass that writes anything fails at its write number `k` (from 0, modulo their
    /// number, in the order the shell makes them: finalizers, then the decided writes), as a
    /// 409 or a 500 does: the writes before it landed, it and every later one did not (the
    /// shell's writer stops at the first failure, and a failing finalizer write ends the pass
    /// before its backend calls).
    pub fn fail_api_write(&mut self, k: usize) {
        self.api_write_fails = Some(k);
    }

    /// One pass, failing as scheduled ([`Faults`], [`Sim::fail_api_write`]). The backend keeps
    /// what the pass did. Events of a pass cut short are not recorded.
    pub async fn pass_with_failures(&mut self) -> PassResult {
        let fired = self.faults.fired();
        let before = self.claims.clone();
        let grants_before = self.grants.len();
        let SimPass {
            calls: ops,
            backend_away,
            outcome,
        } = self.run_pass(false).await;
        let Ok(outcome) = outcome else {
            // No backend call was made: nothing to note about renewals.
            return PassResult {
                ops,
                decision: None,
                write_failed: true,
            };
        };
        let decision = outcome.decision;
        let complete = outcome.applied.is_ok();
        let met_failure = backend_away
            || self.faults.fired() > fired
            || outcome
                .outcomes
                .iter()
                .any(|outcome| matches!(outcome, OpOutcome::Failed { .. }));
        if complete {
            for event in &decision.events {
                let subject = match &event.subject {
                    EventSubject::Lock | EventSubject::LockFor(_) => format!("lock/{LOCK}"),
                    EventSubject::Claim(name) => name.clone(),
                };
                self.events.push((subject, event.reason));
            }
            let lock = LockView::from_resource(&self.lock);
            if lock.deleting {
            } else if lock.spec_problem().is_some() {
                // The core blocks the lock the same way as for an outage (`LockMode::Blocked`),
                // with the reasons the README lists for an invalid lock spec.
                let reasons = (reasons::INVALID_SPEC, reasons::INVALID_LOCK_SPEC);
                self.check_blocked_pass(&before, grants_before, reasons, backend_away);
            } else if backend_away {
                let reasons = (reasons::BACKEND_UNAVAILABLE, reasons::BACKEND_UNAVAILABLE);
                self.check_blocked_pass(&before, grants_before, reasons, true);
            }
        }
        // A pass whose writes did not all land may have lost a renewal, as one whose backend
        // failed may not have made it.
        let blocked = !complete || LockView::from_resource(&self.lock).spec_problem().is_some();
        self.after_pass(&before, met_failure, met_failure || blocked);
        PassResult {
            ops,
            decision: Some(decision),
            write_failed: !complete,
        }
    }

    /// Bookkeeping after a pass: whether it met a backend failure, and whether it may have
    /// renewed nothing (a backend failure, a lost write, or a lock spec it cannot serve).
    fn after_pass(&mut self, before: &BTreeMap<String, LockClaim>, failed: bool, blocked: bool) {
        self.last_pass_failed = failed;
        if blocked {
            for (name, claim) in before {
                if claim.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Held) {
                    self.renewals_blocked.insert(name.clone());
                }
            }
        } else {
            // A holder that went through a pass without a failure was renewed if it was due,
            // unless its recorded lease had run out already (the pass keeps such a grant only
            // while the backend's copy lasts, see `backend_lease_outlasts` in the core).
            let now = self.now();
            let held: Vec<String> = self
                .claims
                .iter()
                .filter(|(_, c)| {
                    c.status.as_ref().is_some_and(|s| {
                        s.phase == Some(ClaimPhase::Held)
                            && s.expires_at.as_ref().is_some_and(|at| at.0 > now)
                    })
                })
                .map(|(name, _)| name.clone())
                .collect();
            for name in held {
                self.renewals_blocked.remove(&name);
            }
        }
    }

    /// Applies one of the shell's claim writes as the API server would: a merge patch, then
    /// the deletion of a deleted claim whose last finalizer went.
    pub fn apply_to_claim(&mut self, write: &Write) {
        let is_held = |claim: &LockClaim| {
            claim.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Held)
        };
        let others_held = self
            .claims
            .iter()
            .filter(|(name, claim)| **name != write.name && is_held(claim))
            .count();
        let version = self.next_version();
        let before = self.claims.get(&write.name).expect("claim");
        let was_held = is_held(before);
        let mut claim = patched(before, write);
        claim.metadata.resource_version = version;
        self.writes += 1;
        let status = claim.status.clone().unwrap_or_default();
        let now_held = is_held(&claim);
        if now_held && !was_held {
            // Grants go only to free slots (claims leaving Held are written first).
            let max = usize::try_from(self.lock.spec.max_holders).expect("positive");
            assert!(
                others_held < max,
                "granted with {others_held} holding, maxHolders {max}"
            );
            self.seq += 1;
            self.granted_seq.insert(write.name.clone(), self.seq);
            let token = status.fencing_token.expect("token");
            self.grants.push((write.name.clone(), token));
            let acquired = status.acquired_at.as_ref().expect("acquiredAt");
            self.grant_times.push(acquired.0.as_second());
        }
        let involuntary = ["LeaseExpired", "MaxHoldExceeded", "OwnerGone", "Superseded"];
        if was_held
            && !now_held
            && status
                .reason
                .as_deref()
                .is_some_and(|reason| involuntary.contains(&reason))
        {
            let ended = status.released_at.as_ref().expect("releasedAt");
            self.involuntary_ends
                .push((ended.0.as_second(), self.grant_times.len()));
        }
        if claim.metadata.deletion_timestamp.is_some()
            && claim.metadata.finalizers.as_ref().is_none_or(Vec::is_empty)
        {
            self.claims.remove(&write.name);
        } else {
            self.claims.insert(write.name.clone(), claim);
        }
    }

    /// Passes until one changes nothing; asserts the idle pass plans no backend calls and
    /// writes nothing, and checks the invariants.
    pub async fn settle(&mut self) {
        let mut counted = 0;
        let budget = MAX_PASSES_TO_SETTLE + std::mem::take(&mut self.extra_passes);
        while counted < budget {
            let fired = self.faults.fired();
            let pass = self.pass_with_failures().await;
            let idle = pass
                .decision
                .as_ref()
                .filter(|decision| pass.ops == 0 && !decision.writes_anything());
            if let Some(decision) = idle {
                assert!(
                    decision.requeue_after > Duration::ZERO,
                    "an idle pass asks to run again at once"
                );
                self.requeue_after = decision.requeue_after;
                self.check_invariants().await;
                return;
            }
            // A pass that met a scheduled failure is a change of the world (the backend went
            // away, the pass after it finds it back; an API write failed): the passes after
            // it get the whole budget again. Failures are finite, so this ends.
            if self.faults.fired() == fired && !pass.write_failed {
                counted += 1;
            } else {
                counted = 0;
            }
        }
        panic!(
            "no fixed point after {MAX_PASSES_TO_SETTLE} passes: {:#?}",
            self.claims
        );
    }
}

/// `object` with `write`'s merge patch applied, as the API server stores it.
/// The claim's arrival: recorded in its status, else as the controller's watch gave it.
pub fn arrival_of(claim: &LockClaim, arrivals: &Arrivals) -> Option<MicroTime> {
    let recorded = claim.status.as_ref().and_then(|s| s.arrived_at.clone());
    recorded.or_else(|| arrivals.of(claim.metadata.uid.as_deref()?))
}

/// The claim's place among the claims of one priority, as the controller orders it.
pub fn arrival_key_of(claim: &LockClaim, arrivals: &Arrivals) -> (Micros, String) {
    turnstile_api::arrival_key(
        arrival_of(claim, arrivals).as_ref(),
        claim.metadata.creation_timestamp.as_ref(),
        claim.metadata.name.as_deref().unwrap_or_default(),
    )
}

pub fn patched<K: serde::Serialize + serde::de::DeserializeOwned>(object: &K, write: &Write) -> K {
    let mut json = serde_json::to_value(object).expect("serializable object");
    apply_merge_patch(&mut json, &write.patch);
    serde_json::from_value(json).expect("a patched object of the same kind")
}

pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}
