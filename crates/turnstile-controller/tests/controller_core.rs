//! The pure decision core driven through whole passes against the real in-memory lock engine,
//! with a simulated API (objects, finalizers, deletion) and a simulated clock: scenario tests
//! and property tests of the invariants (never more than `maxHolders` held, FIFO grants,
//! strictly increasing fencing tokens, terminal phases final, idle passes write nothing,
//! restarts of the backend keep holders and tokens).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use turnstile_api::{
    BackendKind, ClaimPhase, DistributedLock, DistributedLockSpec, LockClaim, LockClaimSpec,
    FINALIZER,
};
use turnstile_controller::backend_ops::execute;
use turnstile_controller::core::{
    decide_orphan, fold, plan, BackendOp, BackendView, ClaimView, Decision, EventSubject,
    FinalizerChange, LockInput, LockView, OwnerState,
};
use turnstile_lock::{Backend, MemoryBackend};

const NS: &str = "team-a";
const LOCK: &str = "db";
/// A change takes effect in one pass; the next pass confirms there is nothing left to do.
const MAX_PASSES_TO_SETTLE: usize = 2;

/// A simulated API server holding one lock and its claims, a real memory backend, and a
/// clock shared by both (tokio's paused clock drives the backend's leases).
struct Sim {
    backend: Arc<dyn Backend>,
    lock: DistributedLock,
    claims: BTreeMap<String, LockClaim>,
    start: Timestamp,
    elapsed: Duration,
    next_uid: u64,
    /// API writes (status patches and finalizer changes) so far.
    writes: usize,
    /// Events so far, as (subject, reason).
    events: Vec<(String, &'static str)>,
    /// Every grant announced so far, in order: (claim, token).
    grants: Vec<(String, i64)>,
    /// Sequence numbers for FIFO checks: when each claim was created / last granted.
    seq: u64,
    created_seq: BTreeMap<String, u64>,
    granted_seq: BTreeMap<String, u64>,
    /// Phases once terminal.
    terminal: BTreeMap<String, ClaimPhase>,
    /// The state of each owned claim's Pod (what the shell would look up).
    owners: BTreeMap<String, OwnerState>,
    /// When the last settled pass asked to be woken up.
    requeue_after: Duration,
}

impl Sim {
    fn new(max_holders: i32, lease: i64) -> Self {
        let mut lock = DistributedLock::new(
            LOCK,
            DistributedLockSpec {
                backend: Some(BackendKind::Memory),
                lease_duration_seconds: lease,
                max_holders,
                key: None,
            },
        );
        lock.metadata.namespace = Some(NS.to_owned());
        lock.metadata.uid = Some("lock-uid".to_owned());
        lock.metadata.generation = Some(1);
        Self {
            backend: Arc::new(MemoryBackend::new()),
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
        }
    }

    fn now(&self) -> Timestamp {
        self.start + self.elapsed
    }

    fn now_time(&self) -> Time {
        Time(self.now())
    }

    /// Lets `by` pass with the controller running: it wakes up whenever its last pass asked
    /// to (`requeue_after`), as the runtime would, and settles each time.
    async fn advance(&mut self, by: Duration) {
        let mut left = by;
        while !left.is_zero() {
            let step = left.min(self.requeue_after);
            self.advance_while_down(step).await;
            left -= step;
            self.settle().await;
        }
    }

    /// Lets `by` pass without any reconcile (the controller is down).
    async fn advance_while_down(&mut self, by: Duration) {
        self.elapsed += by;
        tokio::time::advance(by).await;
    }

    fn create(&mut self, name: &str, spec: LockClaimSpec) {
        if self.claims.contains_key(name) {
            return;
        }
        // A new object under an old name.
        self.terminal.remove(name);
        self.owners.remove(name);
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
            ..ObjectMeta::default()
        };
        self.created_seq.insert(name.to_owned(), self.seq);
        self.claims.insert(name.to_owned(), claim);
    }

    /// Creates a claim owned by a running Pod of the same name.
    fn create_owned(&mut self, name: &str, spec: LockClaimSpec) {
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

    fn set_owner(&mut self, name: &str, state: OwnerState) {
        if let Some(owner) = self.owners.get_mut(name) {
            *owner = state;
        }
    }

    fn claim_spec(lease: Option<i64>, timeout: Option<i64>) -> LockClaimSpec {
        LockClaimSpec {
            lock_name: LOCK.to_owned(),
            holder_identity: None,
            lease_duration_seconds: lease,
            acquire_timeout_seconds: timeout,
            renew_time: None,
            release: None,
        }
    }

    fn edit_spec(&mut self, name: &str, edit: impl FnOnce(&mut LockClaimSpec)) {
        if let Some(claim) = self.claims.get_mut(name) {
            let before = claim.spec.clone();
            edit(&mut claim.spec);
            if claim.spec != before {
                claim.metadata.generation = claim.metadata.generation.map(|g| g + 1);
            }
        }
    }

    fn renew(&mut self, name: &str) {
        let now = self.now_time();
        self.edit_spec(name, |spec| spec.renew_time = Some(now));
    }

    fn release(&mut self, name: &str) {
        self.edit_spec(name, |spec| spec.release = Some(true));
    }

    fn delete(&mut self, name: &str) {
        let now = self.now_time();
        let Some(claim) = self.claims.get_mut(name) else {
            return;
        };
        if claim.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
            self.claims.remove(name);
        } else {
            claim.metadata.deletion_timestamp.get_or_insert(now);
        }
    }

    fn restart_backend(&mut self) {
        self.backend = Arc::new(MemoryBackend::new());
    }

    fn phase(&self, name: &str) -> Option<ClaimPhase> {
        self.claims
            .get(name)
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase)
    }

    fn token(&self, name: &str) -> Option<i64> {
        self.claims[name].status.as_ref()?.fencing_token
    }

    fn position(&self, name: &str) -> Option<i32> {
        self.claims[name].status.as_ref()?.position
    }

    fn input(&self, backend: BackendView) -> LockInput {
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

    /// One reconcile pass, as the shell performs it. Returns the plan's op count and the
    /// decision.
    async fn pass(&mut self) -> (usize, Decision) {
        let key = LockView::from_resource(&self.lock).backend_key();
        let snapshot = self.backend.snapshot(&key).await.expect("snapshot");
        let input = self.input(BackendView::Ready {
            backend: BackendKind::Memory,
            snapshot,
        });
        let planned = plan(&input);
        for name in &planned.finalizers_to_add {
            let claim = self.claims.get_mut(name).expect("claim");
            claim
                .metadata
                .finalizers
                .get_or_insert_with(Vec::new)
                .push(FINALIZER.to_owned());
            self.writes += 1;
        }
        let max_holders = input.lock.max_holders();
        let outcomes = execute(self.backend.as_ref(), &key, max_holders, &planned.ops).await;
        let decision = fold(&input, &planned, &outcomes);
        self.apply(&decision);
        (planned.ops.len(), decision)
    }

    fn apply(&mut self, decision: &Decision) {
        for change in &decision.claims {
            let claim = self.claims.get_mut(&change.name).expect("claim");
            if let Some(status) = &change.status {
                let was_held =
                    claim.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Held);
                if status.phase == Some(ClaimPhase::Held) && !was_held {
                    self.seq += 1;
                    self.granted_seq.insert(change.name.clone(), self.seq);
                    self.grants
                        .push((change.name.clone(), status.fencing_token.expect("token")));
                }
                claim.status = Some(status.clone());
                self.writes += 1;
            }
            if change.finalizer == FinalizerChange::Remove {
                if let Some(finalizers) = claim.metadata.finalizers.as_mut() {
                    finalizers.retain(|f| f != FINALIZER);
                }
                self.writes += 1;
                if claim.metadata.deletion_timestamp.is_some()
                    && claim.metadata.finalizers.as_ref().is_none_or(Vec::is_empty)
                {
                    self.claims.remove(&change.name);
                }
            }
        }
        if let Some(status) = &decision.lock_status {
            self.lock.status = Some(status.clone());
            self.writes += 1;
        }
        if decision.add_lock_finalizer {
            self.lock
                .metadata
                .finalizers
                .get_or_insert_with(Vec::new)
                .push(FINALIZER.to_owned());
            self.writes += 1;
        }
        for event in &decision.events {
            let subject = match &event.subject {
                EventSubject::Lock => format!("lock/{LOCK}"),
                EventSubject::Claim(name) => name.clone(),
            };
            self.events.push((subject, event.reason));
        }
    }

    /// Passes until one changes nothing; asserts the idle pass plans no backend calls and
    /// writes nothing, and checks the invariants.
    async fn settle(&mut self) {
        for _ in 0..MAX_PASSES_TO_SETTLE {
            let (ops, decision) = self.pass().await;
            if ops == 0 && !decision.writes_anything() {
                assert!(
                    decision.requeue_after > Duration::ZERO,
                    "an idle pass asks to run again at once"
                );
                self.requeue_after = decision.requeue_after;
                self.check_invariants().await;
                return;
            }
        }
        panic!(
            "no fixed point after {MAX_PASSES_TO_SETTLE} passes: {:#?}",
            self.claims
        );
    }

    async fn check_invariants(&mut self) {
        let max = usize::try_from(self.lock.spec.max_holders).expect("positive");
        let held: Vec<&LockClaim> = self
            .claims
            .values()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Held))
            .collect();
        assert!(held.len() <= max, "{} held > maxHolders {max}", held.len());

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

        // A claim whose owner runs never loses its lease.
        for (name, state) in &self.owners {
            if *state == OwnerState::Alive && self.claims.contains_key(name) {
                assert_ne!(
                    self.phase(name),
                    Some(ClaimPhase::Expired),
                    "{name} expired although its owner runs"
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

        // FIFO: no queued claim that existed when a holder was granted is ahead of it.
        let order = |c: &LockClaim| {
            (
                c.metadata.creation_timestamp.as_ref().map(|t| t.0),
                c.metadata.name.clone(),
            )
        };
        let mut queued: Vec<&LockClaim> = self
            .claims
            .values()
            .filter(|c| c.status.as_ref().and_then(|s| s.position).is_some())
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
        // Positions are 1..=n in queue order.
        for (expected, claim) in queued.iter().enumerate() {
            let position = claim.status.as_ref().and_then(|s| s.position);
            assert_eq!(position, i32::try_from(expected + 1).ok());
        }
        // With a free slot nobody waits.
        if held.len() < max {
            assert!(queued.is_empty(), "free slot but {} queued", queued.len());
        }

        // The backend agrees with the API about every holder and its token.
        let key = LockView::from_resource(&self.lock).backend_key();
        let snapshot = self.backend.snapshot(&key).await.expect("snapshot");
        for holder in &held {
            let uid = holder.metadata.uid.clone().expect("uid");
            let token = holder.status.as_ref().and_then(|s| s.fencing_token);
            let backend = snapshot.holders.iter().find(|h| h.owner == uid);
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
        // The lock status lists exactly the holders, and its token is the high-water mark.
        let status = self.lock.status.clone().unwrap_or_default();
        let mut listed: Vec<String> = status.holders.iter().map(|h| h.claim.clone()).collect();
        listed.sort();
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

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

#[tokio::test(start_paused = true)]
async fn three_claims_one_holder_two_waiting_in_order() {
    let mut sim = Sim::new(1, 30);
    for name in ["a", "b", "c"] {
        sim.create(name, Sim::claim_spec(None, None));
    }
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
    assert_eq!(sim.token("a"), Some(1));
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Pending));
    assert_eq!(sim.position("b"), Some(1));
    assert_eq!(sim.position("c"), Some(2));
    let status = sim.lock.status.clone().expect("lock status");
    assert_eq!(status.waiting, 2);
    assert_eq!(status.fencing_token, Some(1));
    assert_eq!(status.holders[0].claim, "a");
    let ready = &status.conditions[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );
    assert!(sim.events.contains(&("a".to_owned(), "Acquired")));
    assert!(sim.events.contains(&("b".to_owned(), "Queued")));
    assert!(sim.events.contains(&("c".to_owned(), "Queued")));

    // Deleting the holder hands the lock to b, then c.
    sim.delete("a");
    sim.settle().await;
    assert!(
        !sim.claims.contains_key("a"),
        "finalizer removed after release"
    );
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Held));
    assert_eq!(sim.token("b"), Some(2));
    assert_eq!(sim.position("c"), Some(1));
    assert!(sim.events.contains(&("a".to_owned(), "Released")));
}

#[tokio::test(start_paused = true)]
async fn idle_passes_write_nothing() {
    let mut sim = Sim::new(2, 30);
    for name in ["a", "b", "c", "d"] {
        sim.create(name, Sim::claim_spec(None, None));
    }
    sim.settle().await;
    let writes = sim.writes;
    let events = sim.events.len();
    for _ in 0..5 {
        sim.advance(Duration::from_secs(1)).await;
        let (ops, decision) = sim.pass().await;
        assert_eq!(ops, 0, "an idle pass calls the backend");
        assert!(
            !decision.writes_anything(),
            "an idle pass writes: {decision:#?}"
        );
    }
    assert_eq!(sim.writes, writes);
    assert_eq!(sim.events.len(), events);
}

#[tokio::test(start_paused = true)]
async fn semaphore_grants_max_holders() {
    let mut sim = Sim::new(2, 30);
    for name in ["a", "b", "c"] {
        sim.create(name, Sim::claim_spec(None, None));
    }
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Held));
    assert_eq!(sim.position("c"), Some(1));
    assert_eq!(sim.lock.status.as_ref().expect("status").holders.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn expiry_without_renewal_hands_on_and_renewal_keeps_it() {
    let mut sim = Sim::new(1, 10);
    sim.create("a", Sim::claim_spec(None, None));
    sim.create("b", Sim::claim_spec(None, None));
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));

    // Renewing at t=8 extends a's lease to t=18.
    sim.advance(Duration::from_secs(8)).await;
    sim.renew("a");
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
    assert!(sim.events.contains(&("a".to_owned(), "Renewed")));
    sim.advance(Duration::from_secs(5)).await; // t=13: past the original lease
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));

    sim.advance(Duration::from_secs(6)).await; // t=19: past the renewed lease
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Expired));
    assert!(sim.events.contains(&("a".to_owned(), "LockLost")));
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Held));
    assert_eq!(sim.token("b"), Some(2));

    // Terminal is final: a late renewal does not revive it.
    sim.renew("a");
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Expired));
}

#[tokio::test(start_paused = true)]
async fn release_on_request_and_acquire_timeout() {
    let mut sim = Sim::new(1, 30);
    sim.create("a", Sim::claim_spec(None, None));
    sim.create("b", Sim::claim_spec(None, Some(5)));
    sim.create("c", Sim::claim_spec(None, None));
    sim.settle().await;
    sim.advance(Duration::from_secs(6)).await;
    sim.settle().await;
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Failed));
    assert!(sim.events.contains(&("b".to_owned(), "Failed")));
    assert_eq!(sim.position("c"), Some(1));

    sim.release("a");
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Released));
    let a = sim.claims["a"].status.clone().expect("status");
    assert!(a.released_at.is_some());
    assert_eq!(a.fencing_token, Some(1), "the record keeps the token");
    assert!(a.expires_at.is_none());
    assert_eq!(sim.phase("c"), Some(ClaimPhase::Held));
    assert_eq!(sim.token("c"), Some(2));
}

#[tokio::test(start_paused = true)]
async fn backend_restart_keeps_holder_and_tokens_increase() {
    let mut sim = Sim::new(1, 30);
    for name in ["a", "b", "c"] {
        sim.create(name, Sim::claim_spec(None, None));
    }
    sim.settle().await;
    sim.release("a");
    sim.settle().await;
    assert_eq!(sim.token("b"), Some(2));

    sim.restart_backend();
    sim.settle().await;
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Held), "b re-attached");
    assert_eq!(sim.token("b"), Some(2));
    let key = LockView::from_resource(&sim.lock).backend_key();
    let snapshot = sim.backend.snapshot(&key).await.expect("snapshot");
    assert_eq!(
        snapshot.holders[0].fencing_token, 2,
        "same token in the backend"
    );

    sim.release("b");
    sim.settle().await;
    assert_eq!(sim.phase("c"), Some(ClaimPhase::Held));
    assert_eq!(sim.token("c"), Some(3), "above the high-water mark");
}

#[tokio::test(start_paused = true)]
async fn backend_restart_while_idle_restores_the_fencing_floor() {
    let mut sim = Sim::new(1, 30);
    sim.create("a", Sim::claim_spec(None, None));
    sim.settle().await;
    sim.release("a");
    sim.settle().await;
    sim.restart_backend();
    sim.settle().await;
    sim.create("b", Sim::claim_spec(None, None));
    let (_, decision) = sim.pass().await;
    assert!(decision.writes_anything());
    assert_eq!(
        sim.phase("b"),
        Some(ClaimPhase::Held),
        "granted in one pass"
    );
    assert_eq!(sim.token("b"), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_live_owner_keeps_the_lease_and_its_end_releases_it() {
    let mut sim = Sim::new(1, 10);
    sim.create_owned("a", Sim::claim_spec(None, None));
    sim.create("b", Sim::claim_spec(None, None));
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
    // Thirty seconds (three leases) pass in small steps: the controller renews for the Pod.
    for _ in 0..10 {
        sim.advance(Duration::from_secs(3)).await;
        sim.settle().await;
        assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
    }
    assert!(sim.events.contains(&("a".to_owned(), "Renewed")));
    // The Pod finishes: the grant is released and b is next.
    sim.set_owner("a", OwnerState::Finished);
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Released));
    let reason = sim.claims["a"]
        .status
        .as_ref()
        .and_then(|s| s.reason.clone());
    assert_eq!(reason.as_deref(), Some("OwnerFinished"));
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Held));

    // A waiting claim whose Pod is gone is withdrawn.
    sim.create_owned("c", Sim::claim_spec(None, None));
    sim.settle().await;
    assert_eq!(sim.position("c"), Some(1));
    sim.set_owner("c", OwnerState::Gone);
    sim.settle().await;
    assert_eq!(sim.phase("c"), Some(ClaimPhase::Released));
    // An unknown owner state (API error) decides nothing: the lease runs as usual.
    sim.create_owned("d", Sim::claim_spec(None, None));
    sim.set_owner("d", OwnerState::Unknown);
    sim.settle().await;
    assert_eq!(sim.position("d"), Some(1));
}

#[tokio::test(start_paused = true)]
async fn invalid_claim_fails_and_does_not_block_the_queue() {
    let mut sim = Sim::new(1, 30);
    sim.create("a", Sim::claim_spec(Some(0), None));
    sim.create("b", Sim::claim_spec(Some(10_000_000), None));
    sim.create("c", Sim::claim_spec(None, Some(-3)));
    sim.create("d", Sim::claim_spec(None, None));
    sim.settle().await;
    for name in ["a", "b", "c"] {
        assert_eq!(sim.phase(name), Some(ClaimPhase::Failed), "{name}");
        let reason = sim.claims[name]
            .status
            .as_ref()
            .and_then(|s| s.reason.clone());
        assert_eq!(reason.as_deref(), Some("InvalidSpec"));
    }
    assert_eq!(sim.phase("d"), Some(ClaimPhase::Held));
}

#[tokio::test(start_paused = true)]
async fn invalid_lock_blocks_grants_with_a_condition() {
    let mut sim = Sim::new(0, 30);
    sim.create("a", Sim::claim_spec(None, None));
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Pending));
    let reason = sim.claims["a"]
        .status
        .as_ref()
        .and_then(|s| s.reason.clone());
    assert_eq!(reason.as_deref(), Some("InvalidLockSpec"));
    let ready = &sim.lock.status.as_ref().expect("status").conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );

    sim.lock.spec.max_holders = 1;
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
}

#[tokio::test(start_paused = true)]
async fn unavailable_or_unconfigured_backend_grants_nothing_and_reports() {
    let mut sim = Sim::new(1, 30);
    sim.create("a", Sim::claim_spec(None, Some(100)));
    for backend in [
        BackendView::NotConfigured {
            backend: BackendKind::Redis,
        },
        BackendView::Unavailable {
            backend: BackendKind::Redis,
            message: "connection refused".to_owned(),
        },
    ] {
        let input = sim.input(backend);
        let planned = plan(&input);
        assert!(
            planned
                .ops
                .iter()
                .all(|op| !matches!(op.op, BackendOp::Acquire { .. })),
            "no grants without a backend"
        );
        let decision = fold(&input, &planned, &[]);
        let lock = decision.lock_status.expect("lock status");
        assert_eq!(lock.conditions[0].status, "False");
        let claim = &decision.claims[0];
        let status = claim.status.as_ref().expect("claim status");
        assert_eq!(status.phase, Some(ClaimPhase::Pending));
        assert!(decision.requeue_after <= Duration::from_secs(101));
    }
}

#[tokio::test(start_paused = true)]
async fn lock_deletion_ends_holders_and_unqueues_waiters() {
    let mut sim = Sim::new(1, 30);
    sim.create("a", Sim::claim_spec(None, None));
    sim.create("b", Sim::claim_spec(None, None));
    sim.settle().await;
    sim.lock.metadata.deletion_timestamp = Some(sim.now_time());
    let (_, decision) = sim.pass().await;
    assert!(decision.remove_lock_finalizer);
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Expired));
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Pending));
    assert_eq!(sim.position("b"), None);
    let key = LockView::from_resource(&sim.lock).backend_key();
    let snapshot = sim.backend.snapshot(&key).await.expect("snapshot");
    assert!(snapshot.holders.is_empty(), "backend released");
}

#[test]
fn orphan_claims_wait_with_a_reason_then_time_out() {
    let mut sim = Sim::new(1, 30);
    sim.create("a", Sim::claim_spec(None, Some(10)));
    let view = ClaimView::from_resource(&sim.claims["a"]).expect("view");
    let decision = decide_orphan(&view, sim.now());
    let status = decision.status.expect("status");
    assert_eq!(status.phase, Some(ClaimPhase::Pending));
    assert_eq!(status.reason.as_deref(), Some("LockNotFound"));
    assert!(decision.requeue_after <= Duration::from_secs(11));
    let reasons: Vec<&str> = decision.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["LockNotFound"], "a Warning Event says so");

    // Idempotent: no second status write, no second Event.
    sim.claims.get_mut("a").expect("a").status = Some(status);
    let view = ClaimView::from_resource(&sim.claims["a"]).expect("view");
    let again = decide_orphan(&view, sim.now());
    assert!(again.status.is_none());
    assert!(again.events.is_empty());

    let later = sim.now() + Duration::from_secs(11);
    let decision = decide_orphan(&view, later);
    assert_eq!(
        decision.status.and_then(|s| s.phase),
        Some(ClaimPhase::Failed)
    );
}

#[test]
fn holder_identity_defaults_to_owner_then_name() {
    let mut sim = Sim::new(1, 30);
    sim.create("a", Sim::claim_spec(None, None));
    let mut claim = sim.claims["a"].clone();
    assert_eq!(
        ClaimView::from_resource(&claim)
            .expect("view")
            .holder_identity(),
        "a"
    );
    claim.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: "job-a-7x2k".to_owned(),
        uid: "pod-uid".to_owned(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    assert_eq!(
        ClaimView::from_resource(&claim)
            .expect("view")
            .holder_identity(),
        "job-a-7x2k"
    );
    claim.spec.holder_identity = Some("explicit".to_owned());
    assert_eq!(
        ClaimView::from_resource(&claim)
            .expect("view")
            .holder_identity(),
        "explicit"
    );
}

#[test]
fn backend_key_is_always_namespaced() {
    let mut sim = Sim::new(1, 30);
    assert_eq!(
        LockView::from_resource(&sim.lock).backend_key(),
        "team-a/db"
    );
    sim.lock.spec.key = Some("shared/with-cron".to_owned());
    assert_eq!(
        LockView::from_resource(&sim.lock).backend_key(),
        "team-a/shared/with-cron"
    );
}

/// One thing a user (or the world) does between reconciles.
#[derive(Debug, Clone)]
enum Step {
    Create {
        name: u8,
        lease: Option<i64>,
        timeout: Option<i64>,
        owned: bool,
    },
    OwnerEnds(u8),
    Delete(u8),
    Release(u8),
    Renew(u8),
    Advance(u64),
    RestartBackend,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..8, prop::option::of(1i64..12), prop::option::of(1i64..20), any::<bool>())
            .prop_map(|(name, lease, timeout, owned)| Step::Create { name, lease, timeout, owned }),
        1 => (0u8..8).prop_map(Step::OwnerEnds),
        1 => (0u8..8).prop_map(Step::Delete),
        1 => (0u8..8).prop_map(Step::Release),
        2 => (0u8..8).prop_map(Step::Renew),
        3 => (0u64..15).prop_map(Step::Advance),
        1 => Just(Step::RestartBackend),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random workloads: every settled state satisfies the invariants (checked in `settle`).
    #[test]
    fn invariants_hold_under_random_workloads(
        max_holders in 1i32..4,
        lease in 1i64..10,
        steps in prop::collection::vec(step(), 1..40),
    ) {
        paused_runtime().block_on(async {
            let mut sim = Sim::new(max_holders, lease);
            for step in steps {
                match step {
                    Step::Create { name, lease, timeout, owned: false } => {
                        sim.create(&format!("c{name}"), Sim::claim_spec(lease, timeout))
                    }
                    Step::Create { name, lease, timeout, owned: true } => {
                        sim.create_owned(&format!("c{name}"), Sim::claim_spec(lease, timeout))
                    }
                    Step::OwnerEnds(name) => sim.set_owner(&format!("c{name}"), OwnerState::Finished),
                    Step::Delete(name) => sim.delete(&format!("c{name}")),
                    Step::Release(name) => sim.release(&format!("c{name}")),
                    Step::Renew(name) => sim.renew(&format!("c{name}")),
                    Step::Advance(seconds) => sim.advance(Duration::from_secs(seconds)).await,
                    Step::RestartBackend => sim.restart_backend(),
                }
                sim.settle().await;
            }
        });
    }
}
