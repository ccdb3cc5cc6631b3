//! The world the multi-lock tests run in: a simulated API server holding four locks and their
//! claims, the real in-memory lock engine behind them, a clock, and each lock's pass as
//! `lock_reconciler` makes it, followed by the checks every pass must pass.

use crate::*;
use sim::{arrival_key_of, arrival_of, patched};

/// The world's API server as a lock's pass writes to it (every write lands).
pub(crate) struct WorldApi<'w> {
    world: &'w mut World,
    /// The lock whose pass writes.
    lock: String,
}

impl PassStore for WorldApi<'_> {
    async fn patch(
        &mut self,
        PassWrite { target, write }: &PassWrite,
        _resource_version: Option<&str>,
    ) -> Result<Option<String>, ControllerError> {
        match target {
            Target::Claim => self.world.apply_to_claim(write),
            Target::Lock => {
                let patched = patched(&self.world.locks[&self.lock], write);
                self.world.locks.insert(self.lock.clone(), patched);
            }
        }
        Ok(None)
    }
}

pub(crate) const NS: &str = "team-a";
pub(crate) const LOCKS: [&str; 4] = ["a", "b", "c", "d"];

pub(crate) struct World {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) locks: BTreeMap<String, DistributedLock>,
    pub(crate) claims: BTreeMap<String, LockClaim>,
    pub(crate) start: Timestamp,
    pub(crate) elapsed: Duration,
    pub(crate) next: u64,
    /// Per lock, the tokens of its grants in the order they were announced.
    pub(crate) tokens: BTreeMap<String, Vec<i64>>,
    /// Claims ever granted.
    pub(crate) granted: BTreeSet<String>,
    /// The controller's arrivals, fed each claim as it is created.
    pub(crate) arrivals: Arrivals,
}

pub(crate) fn phase(claim: &LockClaim) -> ClaimPhase {
    claim
        .status
        .as_ref()
        .and_then(|status| status.phase)
        .unwrap_or_default()
}

impl World {
    pub(crate) fn new(max_holders: &[i32]) -> Self {
        let locks = LOCKS
            .iter()
            .zip(max_holders)
            .map(|(name, max)| {
                let mut lock = DistributedLock::new(
                    name,
                    DistributedLockSpec {
                        backend: Some(BackendKind::Memory),
                        lease_duration_seconds: 60,
                        max_holders: *max,
                        key: None,
                        max_hold_seconds: None,
                        lock_delay_seconds: None,
                        queue: None,
                        max_overtake_seconds: None,
                    },
                );
                lock.metadata.namespace = Some(NS.to_owned());
                lock.metadata.uid = Some(format!("lock-{name}"));
                lock.metadata.generation = Some(1);
                ((*name).to_owned(), lock)
            })
            .collect();
        Self {
            backend: Arc::new(MemoryBackend::new()),
            locks,
            claims: BTreeMap::new(),
            start: "2030-01-01T00:00:00Z".parse().expect("timestamp"),
            elapsed: Duration::ZERO,
            next: 0,
            tokens: BTreeMap::new(),
            granted: BTreeSet::new(),
            arrivals: Arrivals::default(),
        }
    }

    /// As [`World::new`], every lock `queue: FirstRunnable` with this `maxOvertakeSeconds`.
    pub(crate) fn first_runnable(max_holders: &[i32], window: i64) -> Self {
        let mut world = World::new(max_holders);
        for lock in world.locks.values_mut() {
            lock.spec.queue = Some(QueueOrder::FirstRunnable);
            lock.spec.max_overtake_seconds = Some(window);
        }
        world
    }

    /// Whether `claim` may still be passed on `lock` now (worked out from the spec here, not
    /// by the core's rule, so that a wrong rule is caught).
    fn passable(&self, lock: &str, claim: &LockClaim) -> bool {
        let spec = &self.locks[lock].spec;
        let created = claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |at| at.0.as_second());
        spec.queue == Some(QueueOrder::FirstRunnable)
            && self.now().as_second() < created + spec.max_overtake_seconds.unwrap_or(300)
    }

    /// Four single-holder locks, b held by a claim on b alone (returned with the world).
    pub(crate) async fn with_b_held() -> (Self, String) {
        let mut world = World::new(&[1, 1, 1, 1]);
        let on_b = world.create(&["b"]);
        world.pass("b", true).await;
        (world, on_b)
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.start + self.elapsed
    }

    pub(crate) async fn advance(&mut self, by: Duration) {
        self.elapsed += by;
        tokio::time::advance(by).await;
    }

    /// A new claim on `locks`. Names count *down* (c999, c998, ...) and the clock stands
    /// still between creations, so only the arrival the controller's watch gives each claim
    /// (in creation order) keeps the queue first come, first served.
    pub(crate) fn create(&mut self, locks: &[&str]) -> String {
        self.next += 1;
        let name = format!("c{:03}", 999 - self.next);
        let spec = if locks.len() == 1 {
            LockClaimSpec::for_lock(locks[0])
        } else {
            LockClaimSpec::for_locks(locks.iter().copied())
        };
        let mut claim = LockClaim::new(&name, spec);
        claim.metadata = ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(NS.to_owned()),
            uid: Some(format!("uid-{}", self.next)),
            generation: Some(1),
            creation_timestamp: Some(Time(self.now())),
            ..ObjectMeta::default()
        };
        // The controller's watch delivers the new claim.
        self.arrivals.applied(&claim, false, self.now());
        self.claims.insert(name.clone(), claim);
        name
    }

    pub(crate) fn release(&mut self, name: &str) {
        if let Some(claim) = self.claims.get_mut(name) {
            claim.spec.release = Some(true);
        }
    }

    pub(crate) fn delete(&mut self, name: &str) {
        let now = Time(self.now());
        let Some(claim) = self.claims.get_mut(name) else {
            return;
        };
        if claim.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
            self.claims.remove(name);
        } else {
            claim.metadata.deletion_timestamp.get_or_insert(now);
        }
    }

    pub(crate) fn views_of(&self, lock: &str) -> Vec<ClaimView> {
        self.claims
            .values()
            .filter(|claim| claim.spec.locks().contains(&lock))
            .map(|claim| {
                let view = ClaimView::for_lock(claim, lock).expect("complete claim");
                view.observed_arrival(arrival_of(claim, &self.arrivals))
            })
            .collect()
    }

    pub(crate) async fn backend_view(&self, lock: &LockView) -> BackendView {
        BackendView::Ready {
            backend: BackendKind::Memory,
            snapshot: self
                .backend
                .snapshot(&lock.backend_key())
                .await
                .expect("snapshot"),
        }
    }

    /// One pass of `lock`: the shell's own [`run_pass`]. `follow_others: false` is the
    /// control: the calls on the other locks go to a backend of their own, not theirs.
    pub(crate) async fn pass(&mut self, lock: &str, follow_others: bool) {
        let object = self.locks[lock].clone();
        let view = LockView::from_resource(&object);
        let mut claims = self.views_of(lock);
        let mut others = HashMap::new();
        for name in other_locks_needed(&view, &claims) {
            let other_view = LockView::from_resource(&self.locks[&name]);
            let backend_view = self.backend_view(&other_view).await;
            others.insert(
                name.clone(),
                OtherLock {
                    lock: other_view,
                    claims: self.views_of(&name),
                    backend: Some(self.backend.clone()),
                    view: backend_view,
                },
            );
        }
        let now = self.now();
        let mut members = prepare(&view, &mut claims, &others, |_| true, now);
        if !follow_others {
            // The control: a shell that makes the other locks' calls on the wrong backend.
            let elsewhere: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
            for (name, other) in &others {
                let terms = CallTerms::of(&other.lock);
                members.add(
                    name,
                    Some(elsewhere.clone()),
                    other.lock.backend_key(),
                    terms,
                );
            }
        }
        let key = view.backend_key();
        let backend = self.backend_view(&view).await;
        let input = LockInput {
            lock: view,
            claims,
            now,
            backend,
            may_refresh_positions: true,
        };
        let objects: HashMap<String, Arc<LockClaim>> = self
            .claims
            .iter()
            .map(|(name, claim)| (name.clone(), Arc::new(claim.clone())))
            .collect();
        let backend = Arc::clone(&self.backend);
        let engine = Engine {
            backend: backend.as_ref(),
            key: &key,
        };
        let store = WorldApi {
            world: self,
            lock: lock.to_owned(),
        };
        let mut pass = PassWriter::new(store, &object, &objects);
        let outcome = run_pass(&mut pass, &input, Some(engine), &members, || true)
            .await
            .expect("finalizer writes land");
        outcome.applied.expect("writes land");
    }

    /// A claim write as the API server applies it; records grants; checks FIFO per lock.
    pub(crate) fn apply_to_claim(&mut self, write: &Write) {
        let before = self.claims.get(&write.name).expect("claim").clone();
        let claim = patched(&before, write);
        if phase(&claim) == ClaimPhase::Held && phase(&before) != ClaimPhase::Held {
            for lock in claim.spec.locks() {
                // A lock without a token is a partial grant: `check` reports it.
                let Some(token) = claim.fencing_token_on(lock) else {
                    continue;
                };
                self.tokens.entry(lock.to_owned()).or_default().push(token);
                // FIFO: a claim granted while earlier ones on this lock wait leaves room for
                // each of them (they wait for another of their locks); none is overtaken, but
                // on a first-runnable lock, within its window.
                let on_lock = |other: &&LockClaim| {
                    other.spec.locks().contains(&lock) && other.metadata.name != claim.metadata.name
                };
                let earlier_waiting: Vec<_> = self
                    .claims
                    .values()
                    .filter(on_lock)
                    .filter(|other| {
                        arrival_key_of(other, &self.arrivals)
                            < arrival_key_of(&claim, &self.arrivals)
                            && phase(other) == ClaimPhase::Pending
                            && other.metadata.deletion_timestamp.is_none()
                            && other.spec.release != Some(true)
                            && !self.passable(lock, other)
                    })
                    .filter_map(|other| other.metadata.name.clone())
                    .collect();
                let holding = 1 + self
                    .claims
                    .values()
                    .filter(on_lock)
                    .filter(|other| phase(other) == ClaimPhase::Held)
                    .count();
                let max = usize::try_from(self.locks[lock].spec.max_holders).expect("positive");
                assert!(
                    earlier_waiting.is_empty() || holding + earlier_waiting.len() <= max,
                    "{} granted lock {lock} ({holding} holding, maxHolders {max}) while \
                     {earlier_waiting:?} wait before it",
                    write.name,
                );
            }
            self.granted.insert(write.name.clone());
        }
        if claim.metadata.deletion_timestamp.is_some()
            && claim.metadata.finalizers.as_ref().is_none_or(Vec::is_empty)
        {
            self.claims.remove(&write.name);
        } else {
            self.claims.insert(write.name.clone(), claim);
        }
    }

    /// A held claim's grant is in every one of its locks' backends, with the token its
    /// status records there, while its lease runs (no shell takes a lock somewhere else).
    pub(crate) async fn check_grants_in_backends(&self) {
        let now = self.now();
        for (name, claim) in &self.claims {
            let status = claim.status.clone().unwrap_or_default();
            let running = status.expires_at.as_ref().is_some_and(|at| at.0 > now);
            if phase(claim) != ClaimPhase::Held || !running {
                continue;
            }
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            for lock in claim.spec.locks() {
                let token = claim
                    .fencing_token_on(lock)
                    .and_then(|t| u64::try_from(t).ok());
                let key = format!("{NS}/{lock}");
                let snapshot = self.backend.snapshot(&key).await.expect("snapshot");
                let held = snapshot
                    .holders
                    .iter()
                    .find(|holder| holder.owner == uid)
                    .map(|holder| holder.fencing_token);
                assert!(
                    held.is_some() && held == token,
                    "{name} is Held with token {token:?} on lock {lock}, its backend holds {held:?}"
                );
            }
        }
    }

    /// The invariants that hold after every pass.
    pub(crate) async fn check(&self) {
        let mut held_on: BTreeMap<&str, usize> = BTreeMap::new();
        for (name, claim) in &self.claims {
            let locks = claim.spec.locks();
            let status = claim.status.clone().unwrap_or_default();
            if phase(claim) == ClaimPhase::Held {
                for lock in &locks {
                    *held_on.entry(lock).or_default() += 1;
                }
                if claim.spec.is_multi_lock() {
                    let recorded: Vec<&str> = status
                        .locks
                        .iter()
                        .map(|entry| entry.lock_name.as_str())
                        .collect();
                    assert_eq!(recorded, locks, "{name} is held on part of its locks");
                }
                continue;
            }
            // Not held: no backend keeps any grant of it (a lease cut to run out at once, as
            // an involuntary end leaves it, is none).
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            for lock in &locks {
                let key = format!("{NS}/{lock}");
                let snapshot = self.backend.snapshot(&key).await.expect("snapshot");
                assert!(
                    !snapshot
                        .holders
                        .iter()
                        .any(|holder| holder.owner == uid && holder.expires_in > LEASE_CUT),
                    "{name} ({:?}) keeps a grant of lock {lock}",
                    phase(claim)
                );
            }
        }
        for (lock, held) in held_on {
            let max = usize::try_from(self.locks[lock].spec.max_holders).expect("positive");
            assert!(held <= max, "{held} hold lock {lock}, maxHolders {max}");
        }
        for (lock, tokens) in &self.tokens {
            assert!(
                tokens.windows(2).all(|pair| pair[0] < pair[1]),
                "tokens of lock {lock} not increasing: {tokens:?}"
            );
        }
    }
}
