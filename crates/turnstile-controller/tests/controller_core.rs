//! The pure decision core driven through whole passes against the real in-memory lock engine,
//! with a simulated API (objects, finalizers, deletion) and a simulated clock: scenario tests
//! and property tests of the invariants (never more than `maxHolders` held, FIFO grants,
//! strictly increasing fencing tokens, terminal phases final, idle passes write nothing,
//! restarts of the backend keep holders and tokens).

mod sim;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use proptest::prelude::*;
use sim::{paused_runtime, Sim};
use turnstile_api::{reasons, BackendKind, ClaimPhase};
use turnstile_controller::core::{
    decide_orphan, fold, plan, BackendOp, BackendView, ClaimView, FinalizerChange, LockView,
    OwnerState, POSITION_REFRESH_DELAY,
};

#[tokio::test(start_paused = true)]
async fn three_claims_one_holder_two_waiting_in_order() {
    let mut sim = Sim::settled_with(1, 30, &["a", "b", "c"]).await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
    assert_eq!(sim.token("a"), Some(1));
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Pending));
    assert_eq!(sim.position("b"), Some(1));
    assert_eq!(sim.position("c"), Some(2));
    let status = sim.lock.status.clone().expect("lock status");
    assert_eq!(status.waiting, 2);
    assert_eq!(status.fencing_token, Some(1));
    assert_eq!(status.holders.len(), 1);
    // Each entry is the holder claim's own grant, field for field.
    let holder = &status.holders[0];
    let held = sim.claims["a"].status.clone().expect("a's status");
    assert_eq!(holder.claim, "a");
    assert_eq!(Some(&holder.holder_identity), held.holder_identity.as_ref());
    assert_eq!(Some(holder.fencing_token), held.fencing_token);
    assert_eq!(holder.acquired_at, held.acquired_at);
    assert_eq!(holder.expires_at, held.expires_at);
    assert!(holder.acquired_at.is_some() && holder.expires_at.is_some());
    let ready = &status.conditions[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );
    assert!(sim.events.contains(&("a".to_owned(), "Acquired")));
    assert!(sim.events.contains(&("b".to_owned(), "Queued")));
    assert!(sim.events.contains(&("c".to_owned(), "Queued")));

    // Deleting the holder hands the lock to b, then c.
    let writes = sim.writes;
    sim.delete("a");
    sim.settle().await;
    assert!(
        !sim.claims.contains_key("a"),
        "finalizer removed after release"
    );
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Held));
    assert_eq!(sim.token("b"), Some(2));
    assert!(sim.events.contains(&("a".to_owned(), "Released")));
    // The hand-off writes b's grant, the lock's status and a's finalizer, no waiter: c still
    // shows the place it had, an upper bound, until the refresh a little later.
    assert_eq!(sim.writes - writes, 3, "writes of the hand-off");
    assert_eq!(sim.position("c"), Some(2));
    let delay = u64::try_from(POSITION_REFRESH_DELAY).expect("positive");
    sim.advance(Duration::from_secs(delay)).await;
    assert_eq!(sim.position("c"), Some(1));
    assert_eq!(sim.writes - writes, 4, "and one refresh");
}

#[tokio::test(start_paused = true)]
async fn a_spent_refresh_budget_holds_positions_back_and_the_controller_comes_back() {
    let mut sim = Sim::settled_with(1, 30, &["a", "b", "c"]).await;
    sim.position_refreshes_denied = true;
    sim.delete("a");
    sim.settle().await;
    sim.advance(Duration::from_secs(5)).await;
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Held), "grants do not wait");
    assert_eq!(sim.position("c"), Some(2), "no budget: the refresh waits");
    assert!(
        sim.requeue_after <= Duration::from_secs(1),
        "and is tried again soon"
    );
    sim.position_refreshes_denied = false;
    sim.advance(Duration::from_secs(1)).await;
    assert_eq!(sim.position("c"), Some(1));
}

#[tokio::test(start_paused = true)]
async fn idle_passes_write_nothing() {
    let mut sim = Sim::settled_with(2, 30, &["a", "b", "c", "d"]).await;
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
    let sim = Sim::settled_with(2, 30, &["a", "b", "c"]).await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Held));
    assert_eq!(sim.position("c"), Some(1));
    assert_eq!(sim.lock.status.as_ref().expect("status").holders.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn expiry_without_renewal_hands_on_and_renewal_keeps_it() {
    let mut sim = Sim::settled_with(1, 10, &["a", "b"]).await;
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
    let mut sim = Sim::settled_with(1, 30, &["a", "b", "c"]).await;
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
    let mut sim = Sim::settled_with(1, 30, &["a"]).await;
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
    let reason = sim.reason("a");
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
        let reason = sim.reason(name);
        assert_eq!(reason.as_deref(), Some("InvalidSpec"));
    }
    assert_eq!(sim.phase("d"), Some(ClaimPhase::Held));
}

#[tokio::test(start_paused = true)]
async fn invalid_lock_blocks_grants_with_a_condition() {
    let mut sim = Sim::settled_with(0, 30, &["a"]).await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Pending));
    let reason = sim.reason("a");
    assert_eq!(reason.as_deref(), Some("InvalidLockSpec"));
    let ready = &sim.lock.status.as_ref().expect("status").conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );
    // One `InvalidSpec` Event on the lock, when its condition turned; none while it stays.
    let lock_events = |sim: &Sim, reason: &str| {
        sim.events
            .iter()
            .filter(|(subject, r)| subject == "lock/db" && *r == reason)
            .count()
    };
    assert_eq!(lock_events(&sim, "InvalidSpec"), 1, "{:?}", sim.events);
    sim.advance(Duration::from_secs(60)).await;
    assert_eq!(lock_events(&sim, "InvalidSpec"), 1, "{:?}", sim.events);

    sim.lock.spec.max_holders = 1;
    sim.settle().await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
    assert_eq!(lock_events(&sim, "BackendReady"), 1, "{:?}", sim.events);
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
    let mut sim = Sim::settled_with(1, 30, &["a", "b"]).await;
    sim.lock.metadata.deletion_timestamp = Some(sim.now_time());
    let (_, decision) = sim.pass().await;
    assert!(decision.remove_lock_finalizer);
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Expired));
    assert_eq!(sim.phase("b"), Some(ClaimPhase::Pending));
    assert_eq!(sim.position("b"), None);
    let key = LockView::from_resource(&sim.lock).backend_key();
    let snapshot = sim.backend.snapshot(&key).await.expect("snapshot");
    assert!(snapshot.holders.is_empty(), "backend released");
    // Once the lock is gone, the claim controller has nothing more to write to the waiter:
    // its status already says what it would.
    let view = ClaimView::from_resource(&sim.claims["b"]).expect("view");
    let orphan = decide_orphan(&view, sim.now());
    assert_eq!(orphan.status, None, "a second write to the waiter");
    assert!(orphan.events.is_empty());
}

/// A namespace being deleted takes its lock and claims with it: the pass grants nothing,
/// releases the grant, writes no status (to objects about to vanish), and removes the
/// finalizer of each claim once the namespace controller has marked it (the write before that
/// would race the mark, and be refused).
#[tokio::test(start_paused = true)]
async fn a_namespace_being_deleted_gets_releases_and_finalizer_removals_only() {
    let mut sim = Sim::settled_with(1, 30, &["a", "b", "c"]).await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));
    sim.namespace_terminating = true;
    let (_, decision) = sim.pass().await;
    assert_eq!(decision.lock_status, None, "no lock status");
    assert!(
        !decision.remove_lock_finalizer,
        "the lock stays while its claims keep their finalizers: its passes remove them"
    );
    assert!(decision.events.is_empty(), "{:?}", decision.events);
    assert!(
        decision.claims.is_empty(),
        "nothing written to unmarked claims: {:?}",
        decision.claims
    );
    let key = LockView::from_resource(&sim.lock).backend_key();
    let snapshot = sim.backend.snapshot(&key).await.expect("snapshot");
    assert!(snapshot.holders.is_empty(), "the grant released");
    // The status stays as it was; nobody reads it again.
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Held));

    // The namespace controller marks the claims: each loses its finalizer, and nothing else.
    for name in ["a", "b", "c"] {
        sim.delete(name);
    }
    let (_, decision) = sim.pass().await;
    assert_eq!(decision.claims.len(), 3, "{:?}", decision.claims);
    for change in &decision.claims {
        assert_eq!(change.status, None, "{}: a status write", change.name);
        assert_eq!(change.finalizer, FinalizerChange::Remove, "{}", change.name);
    }
    assert!(decision.events.is_empty(), "{:?}", decision.events);
    assert!(
        decision.remove_lock_finalizer,
        "every claim let go: the lock goes"
    );
    assert_eq!(decision.lock_status, None);
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

#[tokio::test(start_paused = true)]
async fn a_pass_on_a_cache_behind_a_renewal_keeps_the_grant() {
    // A pass can read a cache that lags the controller's own writes (an echo later than the
    // wait for it, a re-list still under way). On such a view a renewed lease looks run out;
    // the backend, which the pass that saw the renewal extended, tells it is not.
    let mut sim = Sim::new(2, 10);
    sim.create("plain", Sim::claim_spec(None, None));
    sim.create_owned("owned", Sim::claim_spec(None, None));
    sim.settle().await;
    let stale = sim.claims.clone();
    sim.advance(Duration::from_secs(6)).await;
    sim.renew("plain");
    sim.settle().await;
    sim.advance(Duration::from_secs(6)).await;
    let tokens = (sim.token("plain"), sim.token("owned"));
    // Twelve seconds into a 10 s lease, on the view from before either renewal.
    sim.pass_losing_writes(Some(stale)).await;
    sim.settle().await;
    for name in ["plain", "owned"] {
        assert_eq!(
            sim.phase(name),
            Some(ClaimPhase::Held),
            "{name} lost a renewed lease"
        );
    }
    assert_eq!((sim.token("plain"), sim.token("owned")), tokens);
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
    /// The owner's Pod is gone, or cannot be looked up.
    OwnerGone(u8),
    OwnerUnknown(u8),
    /// A renewal stamped late (seconds in the past) or in the future.
    RenewAt(u8, i64),
    /// The controller is down for a while, then resumes.
    Down(u64),
    /// A pass whose API writes fail after its backend calls.
    WritesFail,
    /// The backend's next `n` calls fail (snapshots included): the passes that meet them see
    /// it unavailable, or a call of theirs failed.
    BackendDown(u8),
    /// The backend goes in the middle of the next pass that makes calls: its snapshot and
    /// first `ok` calls answer (modulo their number), then `n` calls fail.
    BackendFailsMidPass {
        ok: u8,
        n: u8,
    },
    /// The next pass that writes fails at its write number `k` (modulo their number), after
    /// its backend calls and the writes before it landed.
    WriteFailsAt(u8),
    /// A claim whose spec cannot be served (see `invalid_spec`).
    CreateInvalid {
        name: u8,
        which: u8,
    },
    /// A pass (its writes lost, as the 409s of a stale cache lose them) reading the claims as
    /// they stood before the step before this one: a cache lagging by one step.
    StalePass,
    /// The lock's spec made invalid (`maxHolders: 0`, which only an API server without the
    /// CRD's schema lets through), and valid again (its `maxHolders` as drawn).
    LockSpecInvalid,
    LockSpecValid,
}

/// Invalid claim specs (`ClaimView::spec_problem`): a lease or an acquire timeout out of
/// range.
fn invalid_spec(which: u8) -> turnstile_api::LockClaimSpec {
    use turnstile_api::{MAX_ACQUIRE_TIMEOUT_SECONDS, MAX_LEASE_DURATION_SECONDS};
    match which % 4 {
        0 => Sim::claim_spec(Some(0), None),
        1 => Sim::claim_spec(Some(MAX_LEASE_DURATION_SECONDS + 1), None),
        2 => Sim::claim_spec(None, Some(0)),
        _ => Sim::claim_spec(None, Some(-MAX_ACQUIRE_TIMEOUT_SECONDS)),
    }
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
        1 => (0u8..8).prop_map(Step::OwnerGone),
        1 => (0u8..8).prop_map(Step::OwnerUnknown),
        1 => (0u8..8, -120i64..3_600).prop_map(|(name, offset)| Step::RenewAt(name, offset)),
        1 => (0u64..30).prop_map(Step::Down),
        1 => Just(Step::WritesFail),
        2 => (1u8..6).prop_map(Step::BackendDown),
        1 => (0u8..4, 1u8..4).prop_map(|(ok, n)| Step::BackendFailsMidPass { ok, n }),
        1 => (0u8..6).prop_map(Step::WriteFailsAt),
        1 => (0u8..8, 0u8..4).prop_map(|(name, which)| Step::CreateInvalid { name, which }),
        1 => Just(Step::StalePass),
        1 => Just(Step::LockSpecInvalid),
        2 => Just(Step::LockSpecValid),
    ]
}

/// Runs `steps` on a fresh simulation, settling (and so checking the invariants) after each:
/// the property test's interpreter, and the replay of every recorded regression. Returns the
/// simulation as the steps left it.
async fn run_steps(max_holders: i32, lease: i64, steps: impl IntoIterator<Item = Step>) -> Sim {
    let mut sim = Sim::new(max_holders, lease);
    // The claims as they stood before each step so far (for `StalePass`).
    let mut views = Vec::new();
    for step in steps {
        views.push(sim.claims.clone());
        match step {
            Step::OwnerGone(name) => sim.set_owner(&format!("c{name}"), OwnerState::Gone),
            Step::OwnerUnknown(name) => sim.set_owner(&format!("c{name}"), OwnerState::Unknown),
            Step::RenewAt(name, offset) => sim.renew_at(&format!("c{name}"), offset),
            Step::Down(seconds) => sim.controller_down(Duration::from_secs(seconds)).await,
            Step::WritesFail => sim.pass_losing_writes(None).await,
            Step::Create {
                name,
                lease,
                timeout,
                owned: false,
            } => sim.create(&format!("c{name}"), Sim::claim_spec(lease, timeout)),
            Step::Create {
                name,
                lease,
                timeout,
                owned: true,
            } => sim.create_owned(&format!("c{name}"), Sim::claim_spec(lease, timeout)),
            Step::OwnerEnds(name) => sim.set_owner(&format!("c{name}"), OwnerState::Finished),
            Step::Delete(name) => sim.delete(&format!("c{name}")),
            Step::Release(name) => sim.release(&format!("c{name}")),
            Step::Renew(name) => sim.renew(&format!("c{name}")),
            Step::Advance(seconds) => sim.advance(Duration::from_secs(seconds)).await,
            Step::RestartBackend => sim.restart_backend(),
            Step::BackendDown(n) => sim.faults.down(n.into()),
            Step::BackendFailsMidPass { ok, n } => sim.faults.mid_pass(ok.into(), n.into()),
            Step::WriteFailsAt(k) => sim.fail_api_write(k.into()),
            Step::CreateInvalid { name, which } => {
                sim.create(&format!("c{name}"), invalid_spec(which));
            }
            Step::LockSpecInvalid => sim.set_max_holders(0),
            Step::LockSpecValid => sim.set_max_holders(max_holders),
            Step::StalePass => {
                let stale = views.len().checked_sub(2).map(|i| views[i].clone());
                sim.pass_losing_writes(stale).await;
            }
        }
        sim.settle().await;
    }
    sim
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Random workloads, owners that vanish or cannot be looked up, late and future renewals,
    /// controller downtime, backend restarts, a backend that fails its next calls (whole
    /// passes see it unavailable, or it goes in the middle of one), passes whose API writes
    /// all fail after their backend calls or fail from the k-th on, claims with invalid
    /// specs, a lock spec made invalid and valid again, and passes (writes lost) on a cache
    /// one step behind: every settled state satisfies the invariants (checked in `settle`),
    /// and every pass that found the backend away or the lock's spec invalid did what the
    /// README says of one (`Sim::check_blocked_pass`). Of a stale pass only what the README
    /// admits is excused (`Sim::taken_for_waiters`): the safety invariants (at most
    /// `maxHolders`, tokens rising) stay strict.
    #[test]
    fn invariants_hold_under_random_workloads(
        max_holders in 1i32..4,
        lease in 1i64..10,
        steps in prop::collection::vec(step(), 1..40),
    ) {
        paused_runtime().block_on(run_steps(max_holders, lease, steps));
    }
}

// The shrunk cases recorded in `controller_core.proptest-regressions`, replayed step for step
// through the interpreter above. The seeds in that file were recorded under older strategies
// and no longer draw these cases, so each is kept here by name, whatever the strategy becomes.
// (Cases recorded before `Create` had `owned` create plain claims, as they did then.)

/// The step creating plain claim `c{name}` with the lock's lease and no acquire timeout.
/// [`run_steps`] on a mutex with a one-second lease, where most regressions were found.
async fn on_a_one_second_mutex(steps: impl IntoIterator<Item = Step>) -> Sim {
    run_steps(1, 1, steps).await
}

fn create(name: u8) -> Step {
    Step::Create {
        name,
        lease: None,
        timeout: None,
        owned: false,
    }
}

/// A one-second lease: a claim name deleted and created again after its lease ran out.
#[tokio::test(start_paused = true)]
async fn regression_a_name_deleted_and_created_again_after_its_lease() {
    on_a_one_second_mutex([create(4), Step::Advance(1), Step::Delete(4), create(4)]).await;
}

/// Two claims on a mutex with a one-second lease.
#[tokio::test(start_paused = true)]
async fn regression_two_claims_on_a_one_second_lease() {
    on_a_one_second_mutex([create(0), create(1)]).await;
}

/// Six claims created out of name order, then a waiter in the middle of the queue deleted.
#[tokio::test(start_paused = true)]
async fn regression_a_waiter_deleted_from_the_middle_of_the_queue() {
    let mut steps: Vec<Step> = [6, 3, 2, 0, 1, 4].into_iter().map(create).collect();
    steps.push(Step::Delete(0));
    on_a_one_second_mutex(steps).await;
}

/// A pass on the cache from before a controller downtime, in which the holder's one-second
/// lease ran out and the waiter was granted: the stale pass takes the new holder for a
/// waiter and re-grants it in the backend under a new token (the excuse the README gives).
#[tokio::test(start_paused = true)]
async fn regression_a_stale_pass_after_a_downtime() {
    let sim = on_a_one_second_mutex([create(0), create(1), Step::Down(1), Step::StalePass]).await;
    assert_eq!(sim.phase("c1"), Some(ClaimPhase::Held));
    assert_eq!(sim.token("c1"), Some(2));
    let key = LockView::from_resource(&sim.lock).backend_key();
    let snapshot = sim.backend.snapshot(&key).await.expect("snapshot");
    let tokens: Vec<u64> = snapshot.holders.iter().map(|h| h.fencing_token).collect();
    assert_eq!(tokens, [3], "re-granted under a new token");
    assert!(sim.taken_for_waiters.contains("c1"));
}

/// A stale pass re-grants the new holder in the backend under a lease its lost writes never
/// recorded: once the recorded lease has passed, the status shows the lease the backend holds
/// (it was `Held` with an `expiresAt` in the past until the backend's lease ran out).
#[tokio::test(start_paused = true)]
async fn regression_a_lease_the_backend_holds_longer_is_shown_not_one_run_out() {
    let steps = [
        create(0),
        create(1),
        Step::Advance(4),
        Step::Advance(4),
        Step::StalePass,
        Step::Advance(5),
    ];
    // The invariants (checked after every step) include "a Held status never shows a lease
    // that has run out".
    let sim = run_steps(1, 6, steps).await;
    assert_eq!(sim.phase("c1"), Some(ClaimPhase::Held));
    let expires = sim.expires_at("c1").expect("expiresAt").0.as_second();
    assert!(expires >= sim.now().as_second(), "shown until {expires}");
}

/// While the backend is away no renewal reaches it, so none extends a grant: an owned claim
/// ends `LeaseExpired` when its recorded lease runs out (it was shown `Held` with an
/// `expiresAt` in the past until a later pass).
#[tokio::test(start_paused = true)]
async fn an_owned_claim_ends_at_its_recorded_lease_while_the_backend_is_away() {
    let mut sim = Sim::new(1, 10);
    sim.create_owned("a", Sim::claim_spec(None, None));
    sim.settle().await;
    let recorded = sim.expires_at("a").expect("expiresAt").0.as_second();
    sim.faults.down(1_000);
    sim.advance(Duration::from_secs(6)).await;
    assert_eq!(
        sim.phase("a"),
        Some(ClaimPhase::Held),
        "the lease still runs"
    );
    // The pass past the renewal's due time asks to be woken when the recorded lease ends,
    // not when a renewed one would (between the two the status showed a lease run out).
    let left = Duration::from_secs(u64::try_from(recorded - sim.now().as_second()).expect("ahead"));
    assert!(
        sim.requeue_after <= left + Duration::from_secs(1),
        "woken in {:?}, the recorded lease ends in {left:?}",
        sim.requeue_after
    );
    sim.advance(Duration::from_secs(6)).await;
    assert_eq!(sim.phase("a"), Some(ClaimPhase::Expired));
    let status = sim.claims["a"].status.clone().expect("status");
    assert_eq!(status.reason.as_deref(), Some(reasons::LEASE_EXPIRED));
    assert_eq!(
        status.released_at.expect("releasedAt").0.as_second(),
        recorded,
        "ended when the recorded lease ran out"
    );
}

/// A pass on the cache from before the holder released the lock and the next was granted:
/// the stale pass takes the released claim back in the backend and the new holder for a
/// waiter, which then ends `LockLost` (the excuse the README gives).
#[tokio::test(start_paused = true)]
async fn regression_a_stale_pass_after_a_release() {
    let sim =
        on_a_one_second_mutex([create(1), create(2), Step::Release(1), Step::StalePass]).await;
    assert_eq!(sim.phase("c1"), Some(ClaimPhase::Released));
    assert_eq!(sim.phase("c2"), Some(ClaimPhase::Expired));
    let reason = sim.reason("c2");
    assert_eq!(reason.as_deref(), Some("LockLost"));
}

/// A waiter queued on an invalid lock, deleted while the backend is away, then the lock made
/// valid again: the deleted claim lingers (its finalizer waits for the backend) with the
/// reason it had, and is not taken for a waiter (found by CI's run of the property test).
#[tokio::test(start_paused = true)]
async fn regression_a_waiter_deleted_on_an_invalid_lock_while_the_backend_is_away() {
    let sim = on_a_one_second_mutex([
        Step::LockSpecInvalid,
        create(7),
        Step::BackendDown(4),
        Step::Delete(7),
        Step::LockSpecValid,
    ])
    .await;
    assert!(sim
        .claims
        .get("c7")
        .is_none_or(|claim| claim.metadata.deletion_timestamp.is_some()));
}

/// A waiter granted in the backend by a stale pass (its writes lost), announced in the same
/// pass as a new grant behind it in the backend's order: the re-used grant's token (1) is
/// below the new one's (2), and grants are written in token order, so the API shows them
/// rising (found by the property test once stale passes were drawn at random).
#[tokio::test(start_paused = true)]
async fn regression_a_grant_re_used_beside_a_new_one_is_announced_first() {
    let sim = run_steps(
        2,
        1,
        vec![
            Step::BackendDown(4),
            create(2),
            Step::BackendDown(5),
            Step::RestartBackend,
            Step::OwnerEnds(0),
            create(0),
            Step::StalePass,
        ],
    )
    .await;
    let order: Vec<(&str, i64)> = sim.grants.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    assert_eq!(order, [("c2", 1), ("c0", 2)]);
}
