//! The simulation the core's tests drive: a simulated API server holding one lock and its
//! claims, the real in-memory lock engine, a simulated clock, and the shell's own pass
//! ([`run_pass`]: plan → finalizers → backend calls → fold → the decided writes), writing to
//! the simulated server as to the real one: merge patches, conditional on resourceVersions,
//! failing as the test schedules.
// Each test binary uses a different part of this shared support.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use turnstile_api::reasons;
use turnstile_api::{
    BackendKind, ClaimPhase, DistributedLock, DistributedLockSpec, LockClaim, LockClaimSpec,
};
use turnstile_controller::core::{
    plan, BackendView, ClaimView, Decision, EventSubject, LockInput, LockView, OpOutcome,
    OwnerState, EXACT_POSITIONS,
};
use turnstile_controller::error::describe;
use turnstile_controller::lock_reconciler::{run_pass, Engine, PassOutcome};
use turnstile_controller::multi_lock::MemberGrants;
use turnstile_controller::patch::apply_merge_patch;
use turnstile_controller::writer::{PassStore, PassWriter};
use turnstile_controller::writer::{PassWrite, Target, Write};
use turnstile_controller::ControllerError;
use turnstile_lock::{
    AcquireOutcome, AcquireRequest, Backend, LockError, LockResult, LockSnapshot, MemoryBackend,
    WakeSubscription,
};

pub const NS: &str = "team-a";
pub const LOCK: &str = "db";
/// A change takes effect in one pass; the next pass confirms there is nothing left to do.
pub const MAX_PASSES_TO_SETTLE: usize = 2;

/// The failures the test has scheduled for the lock engine's next calls: `pass_first` calls
/// still answer, then `fail_next` calls fail as an unreachable backend does. Shared by every
/// pass's [`FaultyBackend`], so a schedule survives a backend restart.
#[derive(Debug, Default)]
pub struct Faults {
    script: Mutex<FaultScript>,
}

#[derive(Debug, Default, Clone, Copy)]
struct FaultScript {
    pass_first: usize,
    fail_next: usize,
    /// Armed by [`Faults::mid_pass`]: `(ok, n)` for the next pass that makes calls.
    mid_pass: Option<(usize, usize)>,
    /// Calls failed so far (a pass that saw one is a change of the world, see `settle`).
    fired: usize,
}

impl Faults {
    /// The next `n` calls fail (the backend is down for them).
    pub fn down(&self, n: usize) {
        self.schedule(0, n);
    }

    /// The next `ok` calls answer, then `n` calls fail.
    pub fn fail_after(&self, ok: usize, n: usize) {
        self.schedule(ok, n);
    }

    /// The backend goes in the middle of the next pass that makes calls: after its snapshot
    /// and `ok` of its calls (modulo their number, so that one of them fails), `n` calls fail
    /// (the rest of the pass's are not made; what remains fails the next passes).
    pub fn mid_pass(&self, ok: usize, n: usize) {
        self.script.lock().expect("faults").mid_pass = Some((ok, n));
    }

    /// Schedules an armed mid-pass failure for a pass about to make `calls` calls.
    fn arm_for(&self, calls: usize) {
        let armed = self.script.lock().expect("faults").mid_pass;
        if let Some((ok, n)) = armed.filter(|_| calls > 0) {
            self.script.lock().expect("faults").mid_pass = None;
            self.schedule(ok % calls, n);
        }
    }

    fn schedule(&self, ok: usize, n: usize) {
        let mut script = self.script.lock().expect("faults");
        script.pass_first = ok;
        script.fail_next = n;
    }

    /// How many calls have failed so far.
    pub fn fired(&self) -> usize {
        self.script.lock().expect("faults").fired
    }

    /// Counts one call; `Err` if it is to fail.
    fn call(&self, what: &str) -> LockResult<()> {
        let mut script = self.script.lock().expect("faults");
        if script.fail_next == 0 {
            return Ok(());
        }
        if script.pass_first > 0 {
            script.pass_first -= 1;
            return Ok(());
        }
        script.fail_next -= 1;
        script.fired += 1;
        Err(LockError::backend(
            "memory",
            format!("{what} (injected by the simulation)"),
            "connection refused",
        ))
    }
}

/// What became of one pass of [`Sim::pass_with_failures`].
pub struct PassResult {
    /// How many backend calls it planned.
    pub ops: usize,
    /// Its decision, unless a finalizer write failed before its backend calls.
    pub decision: Option<Decision>,
    /// Whether one of its API writes failed (and the later ones were not made).
    pub write_failed: bool,
}

/// The lock engine as a pass sees it: the real [`MemoryBackend`] behind a switch the test
/// flips ([`Faults`]). A failed call changes nothing in the engine (a request that never
/// reached it); that an unreachable backend may also have applied a call is not modelled.
#[derive(Debug)]
pub struct FaultyBackend {
    pub inner: Arc<dyn Backend>,
    pub faults: Arc<Faults>,
}

#[async_trait::async_trait]
impl Backend for FaultyBackend {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        self.faults.call("acquire")?;
        self.inner.acquire(request).await
    }
    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        self.faults.call("release")?;
        self.inner.release(key, owner, max_holders).await
    }
    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        self.faults.call("extend")?;
        self.inner.extend(key, owner, ttl).await
    }
    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        self.faults.call("is_held")?;
        self.inner.is_held(key, owner).await
    }
    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        self.faults.call("snapshot")?;
        self.inner.snapshot(key).await
    }
    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        self.faults.call("raise_fencing_floor")?;
        self.inner.raise_fencing_floor(key, floor).await
    }
    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        self.faults.call("subscribe")?;
        self.inner.subscribe(key, owner).await
    }
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
    /// Extra passes the next `settle` may take: one after a stale pass, whose stray grants
    /// are released by the pass after the one that finds them.
    pub extra_passes: usize,
    /// The last resourceVersion the simulated API server gave out (one counter for all
    /// objects, as etcd's revision).
    pub revision: u64,
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
            extra_passes: 0,
            revision: 1,
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
            lock_name: LOCK.to_owned(),
            lock_names: None,
            holder_identity: None,
            lease_duration_seconds: lease,
            acquire_timeout_seconds: timeout,
            renew_time: None,
            release: None,
            priority: None,
            mode: None,
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

    pub fn input(&self, backend: BackendView) -> LockInput {
        LockInput {
            lock: LockView::from_resource(&self.lock),
            claims: self
                .claims
                .iter()
                .map(|(name, claim)| {
                    let mut view = ClaimView::from_resource(claim).expect("complete claim");
                    if let Some(state) = self.owners.get(name) {
                        view.owner_state = *state;
                    }
                    view
                })
                .collect(),
            now: self.now(),
            backend,
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
                    message: describe(&error),
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
        let (key, mut input, engine) = self.read_now().await;
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
        let outcome = run_pass(
            &mut pass,
            &mut input,
            engine,
            &mut MemberGrants::default(),
            || true,
        )
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
                    EventSubject::Lock => format!("lock/{LOCK}"),
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

    /// What the README promises of a pass whose backend did not answer: "holders keep their
    /// grants (and tokens) until their leases run out, waiting claims show reason
    /// `BackendUnavailable`, and nothing is granted", and the lock says so in `Ready`; the
    /// same of a pass on a lock whose spec cannot be served, with its reasons. `reasons`:
    /// the `Ready` condition's, the waiting claims'; `backend_away`: whether the pass's
    /// snapshot failed.
    fn check_blocked_pass(
        &self,
        before: &BTreeMap<String, LockClaim>,
        grants_before: usize,
        (ready_reason, waiting_reason): (&str, &str),
        backend_away: bool,
    ) {
        assert_eq!(
            self.grants.len(),
            grants_before,
            "granted while the lock was blocked"
        );
        let now = self.now().as_second();
        // Ends that need no backend: the holder's own, its owner's, or its lease's.
        let allowed = [
            reasons::RELEASE_REQUESTED,
            reasons::OWNER_FINISHED,
            reasons::OWNER_GONE,
            reasons::LEASE_EXPIRED,
            reasons::MAX_HOLD_EXCEEDED,
        ];
        for (name, old) in before {
            let old_status = old.status.clone().unwrap_or_default();
            if old_status.phase != Some(ClaimPhase::Held) {
                continue;
            }
            // The finalizer stays until the backend confirms a release: a deleted holder goes
            // only if the backend answered.
            let Some(claim) = self.claims.get(name) else {
                assert!(
                    !backend_away,
                    "holder {name} gone while the backend was away"
                );
                continue;
            };
            let status = claim.status.clone().unwrap_or_default();
            if status.phase == Some(ClaimPhase::Held) {
                assert_eq!(
                    status.fencing_token, old_status.fencing_token,
                    "{name}'s token changed while the lock was blocked"
                );
                continue;
            }
            let reason = status.reason.as_deref().unwrap_or_default();
            assert!(
                allowed.contains(&reason),
                "holder {name} ended ({reason}) while the lock was blocked"
            );
            if [reasons::LEASE_EXPIRED, reasons::MAX_HOLD_EXCEEDED].contains(&reason) {
                let expires = old_status.expires_at.expect("expiresAt").0.as_second();
                assert!(
                    expires <= now,
                    "{name}'s lease (until {expires}) ended at {now} while the lock was blocked"
                );
            }
        }
        // A deleted claim no longer waits: the core leaves its status as it was while its
        // finalizer waits for the backend (see the holders above), so it keeps the reason it
        // had when it was deleted (`InvalidLockSpec`, say, with the backend away since).
        for (name, claim) in self
            .claims
            .iter()
            .filter(|(_, claim)| claim.metadata.deletion_timestamp.is_none())
        {
            let status = claim.status.clone().unwrap_or_default();
            if status.phase == Some(ClaimPhase::Pending) && status.position.is_some() {
                assert_eq!(
                    status.reason.as_deref(),
                    Some(waiting_reason),
                    "{name} waits on a blocked lock"
                );
            }
        }
        let ready = self
            .lock
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .expect("Ready condition");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", ready_reason)
        );
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
        let involuntary = ["LeaseExpired", "MaxHoldExceeded", "OwnerGone"];
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

    pub async fn check_invariants(&mut self) {
        let max = usize::try_from(self.lock.spec.max_holders).expect("positive");
        let held: Vec<&LockClaim> = self
            .claims
            .values()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Held))
            .collect();
        // A lowered maxHolders revokes nobody: more may hold until enough have let go.
        assert!(
            held.len() <= max.max(self.held_when_lowered),
            "{} held > maxHolders {max}",
            held.len()
        );
        if held.len() <= max {
            self.held_when_lowered = 0;
        }

        // A holder taken for a waiter by a stale pass is excused while it holds, and for
        // good if it ended `LockLost`.
        let holding: BTreeSet<String> = held
            .iter()
            .map(|c| c.metadata.name.clone().expect("name"))
            .collect();
        let claims = &self.claims;
        self.taken_for_waiters.retain(|name| {
            holding.contains(name)
                || claims.get(name).is_some_and(|claim| {
                    claim.status.as_ref().and_then(|s| s.reason.as_deref())
                        == Some(reasons::LOCK_LOST)
                })
        });

        // A deleted claim keeps its finalizer only while the backend has not confirmed its
        // release: after a pass that met a backend failure; otherwise it is gone.
        let deleting: Vec<&String> = self
            .claims
            .iter()
            .filter(|(_, c)| c.metadata.deletion_timestamp.is_some())
            .map(|(name, _)| name)
            .collect();
        assert!(
            deleting.is_empty() || self.last_pass_failed,
            "deleted claims stay although the backend answered: {deleting:?}"
        );

        // Terminal phases are final.
        for (name, claim) in &self.claims {
            let phase = claim.status.as_ref().and_then(|s| s.phase);
            if let Some(terminal) = self.terminal.get(name) {
                assert_eq!(
                    phase,
                    Some(*terminal),
                    "terminal claim {name} changed phase"
                );
            } else if let Some(phase) = phase.filter(|p| p.is_terminal()) {
                self.terminal.insert(name.clone(), phase);
            }
        }

        // A claim whose owner runs never loses its lease (only the maximum hold ends it).
        for (name, state) in &self.owners {
            let max_hold = self.claims.get(name).is_some_and(|claim| {
                claim.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("MaxHoldExceeded")
            });
            let lost = self.claims.get(name).is_some_and(|claim| {
                claim.status.as_ref().and_then(|s| s.reason.as_deref()) == Some(reasons::LOCK_LOST)
            });
            let excused = self.lapsed_while_down.contains(name)
                || self.renewals_blocked.contains(name)
                || (lost && self.taken_for_waiters.contains(name));
            if *state == OwnerState::Alive
                && self.claims.contains_key(name)
                && !max_hold
                && !excused
            {
                assert_ne!(
                    self.phase(name),
                    Some(ClaimPhase::Expired),
                    "{name} expired although its owner runs"
                );
            }
        }

        // maxHoldSeconds: no claim is held past its hard deadline.
        if let Some(max_hold) = self.lock.spec.max_hold_seconds {
            let now = self.now().as_second();
            for claim in &held {
                let status = claim.status.as_ref().expect("status");
                let acquired = status
                    .acquired_at
                    .as_ref()
                    .expect("acquiredAt")
                    .0
                    .as_second();
                assert!(
                    now < acquired + max_hold,
                    "held since {acquired}, past maxHoldSeconds {max_hold} at {now}"
                );
                let expires = status.expires_at.as_ref().expect("expiresAt").0.as_second();
                assert!(expires <= acquired + max_hold, "lease beyond the max hold");
            }
        }
        // lockDelaySeconds: no grant within the delay after an involuntary end.
        let delay = self.lock.spec.lock_delay_seconds.unwrap_or(0);
        for &(ended, grants_before) in &self.involuntary_ends {
            for &granted in &self.grant_times[grants_before..] {
                assert!(
                    !(ended <= granted && granted < ended + delay),
                    "granted at {granted}, within the lock-delay of an end at {ended}"
                );
            }
        }

        // Announced tokens strictly increase.
        for pair in self.grants.windows(2) {
            assert!(
                pair[1].1 > pair[0].1,
                "token of {} ({}) not above {} ({})",
                pair[1].0,
                pair[1].1,
                pair[0].0,
                pair[0].1
            );
        }

        // FIFO: no queued claim that existed when a holder was granted is ahead of it. The
        // order is the API's: whole seconds of creation (all it stores), then name.
        let order = |c: &LockClaim| {
            (
                std::cmp::Reverse(c.spec.priority.unwrap_or(0)),
                c.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_second()),
                c.metadata.name.clone(),
            )
        };
        // A claim being deleted has left the queue (its status stays as it was until its
        // finalizer goes, and `fold` counts it nowhere).
        let mut queued: Vec<&LockClaim> = self
            .claims
            .values()
            .filter(|c| c.status.as_ref().and_then(|s| s.position).is_some())
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect();
        queued.sort_by_key(|c| order(c));
        for holder in &held {
            let holder_name = holder.metadata.name.clone().expect("name");
            for waiting in &queued {
                let waiting_name = waiting.metadata.name.clone().expect("name");
                let existed = self.created_seq[&waiting_name] < self.granted_seq[&holder_name];
                assert!(
                    !(existed && order(waiting) < order(holder)),
                    "{waiting_name} waits although it is ahead of holder {holder_name}"
                );
            }
        }
        // Positions are exact at the head of the queue; behind it a shown position may lag,
        // but only ever as an upper bound (waiters only move forward).
        for (index, claim) in queued.iter().enumerate() {
            let exact = i32::try_from(index + 1).expect("small queue");
            let shown = claim
                .status
                .as_ref()
                .and_then(|s| s.position)
                .expect("queued");
            if exact <= EXACT_POSITIONS {
                assert_eq!(shown, exact, "head of the queue");
            } else {
                assert!(shown >= exact, "position {shown} shown for place {exact}");
            }
        }
        // With a free slot nobody waits, unless a lock-delay runs.
        let delayed = self
            .lock
            .status
            .as_ref()
            .and_then(|s| s.locked_until.as_ref())
            .is_some_and(|until| until.0.as_second() > self.now().as_second());
        // Shared/exclusive: an exclusive holder holds alone, and the head of the queue waits
        // only if it does not fit beside the holders.
        let lock_view = LockView::from_resource(&self.lock);
        let shared = |claim: &LockClaim| {
            ClaimView::from_resource(claim)
                .expect("complete claim")
                .shared(&lock_view)
        };
        // Holders count in the mode they were granted in, as the backend records it.
        let key = lock_view.backend_key();
        let granted = self.backend.snapshot(&key).await.expect("snapshot");
        let held_exclusive = held.iter().any(|claim| {
            let uid = claim.metadata.uid.as_deref().unwrap_or_default();
            granted
                .holders
                .iter()
                .find(|holder| holder.owner == uid)
                .map_or(!shared(claim), |holder| {
                    holder.share == turnstile_lock::ShareMode::Exclusive
                })
        });
        // (An omitted mode follows the lock's maxHolders, which may have been lowered under
        // its holders: only a claim asking for Exclusive must hold alone.)
        let asked_exclusive = held
            .iter()
            .any(|claim| claim.spec.mode == Some(turnstile_api::ClaimMode::Exclusive));
        assert!(
            !(asked_exclusive && held.len() > 1),
            "an exclusive holder beside {} others",
            held.len() - 1
        );
        let served = self.lock.status.as_ref().is_some_and(|status| {
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if let Some(head) = queued.first().filter(|_| !delayed && served) {
            let fits = if shared(head) {
                !held_exclusive && held.len() < max
            } else {
                held.is_empty()
            };
            assert!(!fits, "the head of the queue fits but waits");
        }

        // A claim whose spec cannot be served has failed with `InvalidSpec`: it never holds
        // nor waits (so never blocks the queue).
        for (name, claim) in &self.claims {
            let view = ClaimView::from_resource(claim).expect("complete claim");
            if view.spec_problem().is_some() {
                let status = claim.status.clone().unwrap_or_default();
                assert_eq!(
                    (status.phase, status.reason.as_deref()),
                    (Some(ClaimPhase::Failed), Some(reasons::INVALID_SPEC)),
                    "{name}'s spec cannot be served"
                );
            }
        }

        // The backend agrees with the API about every holder and its token, and its counter
        // is at the high-water mark, once a pass reached it. Not while the backend is away
        // (the settled pass's snapshot failed): a holder it lost (restarted meanwhile) keeps
        // its grant in the API until its lease runs out, and is re-attached only when the
        // backend answers again (README, "While a backend is away").
        // Nor while the lock's spec cannot be served: the core then keeps holders as they
        // are (`LockMode::Blocked`) and re-attaches nothing.
        if self.last_pass_failed || LockView::from_resource(&self.lock).spec_problem().is_some() {
            return self.check_lock_status(&held, &queued);
        }
        let key = LockView::from_resource(&self.lock).backend_key();
        let snapshot = self.backend.snapshot(&key).await.expect("snapshot");
        for holder in &held {
            let uid = holder.metadata.uid.clone().expect("uid");
            let token = holder.status.as_ref().and_then(|s| s.fencing_token);
            let backend = snapshot.holders.iter().find(|h| h.owner == uid);
            let name = holder.metadata.name.clone().expect("name");
            if self.taken_for_waiters.contains(&name) {
                // Re-granted by a stale pass: under a larger token (README, "### Tests").
                let regranted = backend.map(|h| i64::try_from(h.fencing_token).expect("token"));
                assert!(
                    regranted >= token,
                    "backend holds {name} under {regranted:?}, below its token {token:?}"
                );
                continue;
            }
            assert_eq!(
                backend.map(|h| i64::try_from(h.fencing_token).expect("token")),
                token,
                "backend disagrees about {:?}",
                holder.metadata.name
            );
        }
        // The backend's counter is back at (or above) the high-water mark: the next grant
        // gets a larger token even after the backend lost its state.
        let high_water = self
            .lock
            .status
            .as_ref()
            .and_then(|s| s.fencing_token)
            .unwrap_or(0);
        assert!(
            i64::try_from(snapshot.fencing_token).expect("token") >= high_water,
            "backend counter {} below the high-water mark {high_water}",
            snapshot.fencing_token
        );
        self.check_lock_status(&held, &queued);
    }

    /// The lock status lists exactly the holders and the waiters' count, and its token is at
    /// least every token announced.
    fn check_lock_status(&self, held: &[&LockClaim], queued: &[&LockClaim]) {
        let status = self.lock.status.clone().unwrap_or_default();
        let mut listed: Vec<String> = status.holders.iter().map(|h| h.claim.clone()).collect();
        listed.sort();
        // A holder being deleted is not listed (see `check_invariants`).
        let held: Vec<&LockClaim> = held
            .iter()
            .copied()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect();
        let mut actual: Vec<String> = held
            .iter()
            .map(|c| c.metadata.name.clone().expect("name"))
            .collect();
        actual.sort();
        assert_eq!(listed, actual);
        assert_eq!(status.waiting, i32::try_from(queued.len()).expect("small"));
        let max_token = self.grants.iter().map(|(_, t)| *t).max();
        if let Some(max_token) = max_token {
            assert!(status.fencing_token >= Some(max_token));
        }
    }
}

/// `object` with `write`'s merge patch applied, as the API server stores it.
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
