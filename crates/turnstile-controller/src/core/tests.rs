//! Unit tests of the core's small rules; whole passes are tested in `tests/controller_core.rs`.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::expiry::{backend_lease_outlasts, effective_expiry, recorded_expiry};
use super::model::{time_at, BackendView, ClaimView, LockInput, LockView};
use super::ops::{AcquirePurpose, BackendOp, OpOutcome};
use turnstile_api::{
    BackendKind, ClaimPhase, DistributedLockSpec, DistributedLockStatus, LockClaimSpec,
    LockClaimStatus,
};
use turnstile_lock::{HolderInfo, LockSnapshot, ShareMode};

pub(super) const T0: i64 = 1_900_000_000;

fn lock() -> LockView {
    LockView {
        namespace: "ns".to_owned(),
        name: "db".to_owned(),
        generation: Some(1),
        deleting: false,
        namespace_terminating: false,
        has_finalizer: true,
        spec: DistributedLockSpec {
            lease_duration_seconds: 10,
            ..DistributedLockSpec::default()
        },
        status: DistributedLockStatus::default(),
    }
}

pub(super) fn held_claim(expires: i64, renew: Option<i64>) -> ClaimView {
    ClaimView {
        name: "a".to_owned(),
        owner_token: "uid-a".to_owned(),
        created: T0,
        generation: Some(1),
        deleting: false,
        has_finalizer: true,
        owner_name: None,
        owner: None,
        owner_state: super::model::OwnerState::NotTracked,
        spec: LockClaimSpec {
            renew_time: renew.map(time_at),
            ..LockClaimSpec::for_lock("db")
        },
        status: LockClaimStatus {
            phase: Some(ClaimPhase::Held),
            fencing_token: Some(1),
            acquired_at: Some(time_at(T0)),
            expires_at: Some(time_at(expires)),
            ..LockClaimStatus::default()
        },
        locks: vec!["db".to_owned()],
        members: Vec::new(),
        members_max_hold: None,
        force_release: None,
    }
}

pub(super) fn input_at(now: i64, claim: ClaimView) -> LockInput {
    LockInput {
        lock: lock(),
        claims: vec![claim],
        now: Timestamp::from_second(now).expect("time") + Duration::from_millis(250),
        backend: BackendView::Ready {
            backend: BackendKind::Memory,
            snapshot: LockSnapshot::default(),
        },
        may_refresh_positions: true,
    }
}

/// The effective expiry of a claim held until `expires` and renewed at `renewed`, at `now`.
fn expiry_of(expires: i64, renewed: Option<i64>, now: i64) -> (i64, bool) {
    let claim = held_claim(expires, renewed);
    let input = input_at(now, claim.clone());
    effective_expiry(&input, &claim)
}

#[test]
fn renewal_counts_from_renew_time_plus_lease() {
    assert_eq!(expiry_of(T0 + 10, Some(T0 + 8), T0 + 9), (T0 + 18, true));
}

#[test]
fn renewal_dated_in_the_future_counts_from_now() {
    assert_eq!(
        expiry_of(T0 + 10, Some(T0 + 9_000), T0 + 5),
        (T0 + 15, true)
    );
}

#[test]
fn renewal_after_the_lease_ran_out_is_too_late() {
    assert_eq!(expiry_of(T0 + 10, Some(T0 + 11), T0 + 12), (T0 + 10, false));
}

#[test]
fn an_applied_renewal_is_not_applied_again() {
    assert_eq!(expiry_of(T0 + 18, Some(T0 + 8), T0 + 9), (T0 + 18, false));
}

#[test]
fn reattach_raises_the_floor_just_below_the_recorded_token_then_to_the_high_water() {
    let mut claim = held_claim(T0 + 10, None);
    claim.status.fencing_token = Some(7);
    let mut input = input_at(T0 + 1, claim);
    input.lock.status.fencing_token = Some(9);
    let plan = super::plan(&input);
    let ops: Vec<&BackendOp> = plan.ops.iter().map(|op| &op.op).collect();
    assert!(matches!(ops[0], BackendOp::RaiseFloor { floor: 6 }));
    assert!(matches!(
        ops[1],
        BackendOp::Acquire {
            purpose: AcquirePurpose::Reattach,
            ..
        }
    ));
    assert!(matches!(ops[2], BackendOp::RaiseFloor { floor: 9 }));
    assert_eq!(ops.len(), 3);
}

/// A pending claim of group `g` with `policy`, arrived at `T0 + seconds`.
fn grouped_claim(name: &str, seconds: i64, policy: turnstile_api::BusyPolicy) -> ClaimView {
    let mut claim = held_claim(T0 + 10, None);
    claim.name = name.to_owned();
    claim.owner_token = format!("uid-{name}");
    claim.spec.group = Some("g".to_owned());
    claim.spec.when_busy = Some(policy);
    claim.status = LockClaimStatus {
        phase: Some(ClaimPhase::Pending),
        arrived_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            Timestamp::from_second(T0 + seconds).expect("time"),
        )),
        ..LockClaimStatus::default()
    };
    claim
}

#[test]
fn only_a_live_newer_claim_of_the_group_replaces_and_says_by_whom() {
    use turnstile_api::BusyPolicy::{ReplacePending, Wait};
    let older = grouped_claim("older", 0, Wait);
    let newer = grouped_claim("newer", 1, ReplacePending);
    let mut input = input_at(T0 + 2, older.clone());
    input.claims.push(newer.clone());
    let replaced = super::busy::replacements(&input);
    let replacement = &replaced[&0];
    assert_eq!(replaced.len(), 1, "only the older one");
    assert_eq!(
        replacement.message(false),
        "replaced by claim newer of group g (whenBusy: ReplacePending)"
    );
    assert_eq!(
        replacement.message(true),
        "cancelled by claim newer of group g (whenBusy: ReplacePending)"
    );

    // A newer claim being deleted, ended, or on several locks replaces nobody.
    let mut deleted = newer.clone();
    deleted.deleting = true;
    let mut ended = newer.clone();
    ended.status.phase = Some(ClaimPhase::Failed);
    let mut several = newer.clone();
    several.locks = vec!["db".to_owned(), "cache".to_owned()];
    for gone in [deleted, ended, several] {
        let mut input = input_at(T0 + 2, older.clone());
        input.claims.push(gone.clone());
        assert!(
            super::busy::replacements(&input).is_empty(),
            "{:?} replaced a claim",
            (gone.deleting, gone.status.phase, gone.locks)
        );
    }
}

/// An exclusive grant to `owner` with `fencing_token`, for `expires_in` more.
pub(super) fn holding(owner: &str, fencing_token: u64, expires_in: Duration) -> HolderInfo {
    HolderInfo {
        owner: owner.to_owned(),
        fencing_token,
        expires_in,
        share: ShareMode::Exclusive,
    }
}

/// [`input_at`] with the backend holding claim `a`'s grant for `expires_in` more.
fn input_with_backend_lease(now: i64, claim: ClaimView, expires_in: Duration) -> LockInput {
    let mut input = input_at(now, claim);
    input.backend = BackendView::Ready {
        backend: BackendKind::Memory,
        snapshot: LockSnapshot {
            holders: vec![holding("uid-a", 1, expires_in)],
            ..LockSnapshot::default()
        },
    };
    input
}

const GRACE: Duration = super::model::BACKEND_LEASE_GRACE;

#[test]
fn the_backend_outlasts_a_lease_by_more_than_the_grace_and_a_second_counting_the_overdue() {
    let now = T0 + 100;
    // Ten seconds overdue, and the backend holds 3 s more: 13 s past the recorded end is
    // more than the grace and a second.
    let input = input_with_backend_lease(
        now,
        held_claim(now - 10, None),
        GRACE - Duration::from_secs(2),
    );
    assert!(backend_lease_outlasts(&input, &input.claims[0], now - 10));
    // Exactly the grace and a second: not more.
    let input =
        input_with_backend_lease(now, held_claim(now, None), GRACE + Duration::from_secs(1));
    assert!(!backend_lease_outlasts(&input, &input.claims[0], now));
}

#[test]
fn a_renewal_the_backend_took_whose_status_write_was_lost_is_recovered() {
    let now = T0 + 100;
    // The status says the lease ended 3 s ago (or ends this very second), but the backend
    // holds the grant 20 s more than the grace: the lease the backend implies is the one.
    for recorded in [now - 3, now] {
        let input = input_with_backend_lease(
            now,
            held_claim(recorded, None),
            GRACE + Duration::from_secs(20),
        );
        assert_eq!(
            recorded_expiry(&input, &input.claims[0]),
            now + 20,
            "recorded {recorded}"
        );
    }
}

#[test]
fn a_recorded_lease_still_running_is_kept_whatever_the_backend_holds() {
    let now = T0 + 100;
    let input = input_with_backend_lease(
        now,
        held_claim(now + 10, None),
        GRACE + Duration::from_secs(60),
    );
    assert_eq!(recorded_expiry(&input, &input.claims[0]), now + 10);
}

/// Claim `a` on `db`, waiting, with no status reason yet.
pub(super) fn waiting_claim() -> ClaimView {
    ClaimView {
        status: LockClaimStatus {
            phase: Some(ClaimPhase::Pending),
            ..LockClaimStatus::default()
        },
        ..held_claim(T0, None)
    }
}

#[test]
fn a_claim_whose_lock_is_missing_waits_saying_so_and_looks_again_at_its_deadline() {
    let mut claim = waiting_claim();
    claim.spec.acquire_timeout_seconds = Some(30);
    let now = Timestamp::from_second(T0 + 10).expect("time");
    let decision = super::decide_orphan(&claim, now);
    let status = decision.status.expect("a status");
    assert_eq!(status.phase, Some(ClaimPhase::Pending));
    assert_eq!(status.reason.as_deref(), Some("LockNotFound"));
    assert_eq!(
        status.message.as_deref(),
        Some("DistributedLock db does not exist")
    );
    // Its acquire timeout ends in 20 s: it is looked at again then, not at the resync.
    assert_eq!(
        decision.requeue_after,
        Duration::from_secs(20) + Duration::from_millis(50)
    );
    let reasons: Vec<&str> = decision.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["LockNotFound"]);
    assert!(!decision.remove_finalizer);
}

#[test]
fn a_holder_whose_lock_was_deleted_loses_the_grant_and_a_deleting_waiter_is_let_go() {
    let now = Timestamp::from_second(T0 + 5).expect("time");
    let decision = super::decide_orphan(&held_claim(T0 + 10, None), now);
    let status = decision.status.expect("a status");
    assert_eq!(status.phase, Some(ClaimPhase::Expired));
    assert_eq!(status.reason.as_deref(), Some("LockDeleted"));
    let reasons: Vec<&str> = decision.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["LockLost"]);
    assert!(decision.remove_finalizer);

    // A waiter being deleted: no status to write, its finalizer goes.
    let deleting = ClaimView {
        deleting: true,
        ..waiting_claim()
    };
    let decision = super::decide_orphan(&deleting, now);
    assert_eq!(decision.status, None);
    assert!(decision.events.is_empty());
    assert!(decision.remove_finalizer);
}

#[test]
fn a_claim_whose_lock_is_missing_times_out_or_is_withdrawn_with_its_event() {
    // Past its acquire timeout: Failed, with a Failed Warning.
    let mut late = waiting_claim();
    late.spec.acquire_timeout_seconds = Some(5);
    let decision = super::decide_orphan(&late, Timestamp::from_second(T0 + 6).expect("time"));
    let status = decision.status.expect("a status");
    assert_eq!(
        (status.phase, status.reason.as_deref()),
        (Some(ClaimPhase::Failed), Some("AcquireTimeout"))
    );
    let reasons: Vec<&str> = decision.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["Failed"]);

    // Withdrawn: Released, with a Released Event.
    let mut withdrawn = waiting_claim();
    withdrawn.spec.release = Some(true);
    let decision = super::decide_orphan(&withdrawn, Timestamp::from_second(T0).expect("time"));
    let status = decision.status.expect("a status");
    assert_eq!(
        (status.phase, status.reason.as_deref()),
        (Some(ClaimPhase::Released), Some("Withdrawn"))
    );
    let reasons: Vec<&str> = decision.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["Released"]);
}

#[test]
fn a_claim_already_told_its_lock_is_missing_is_not_told_again() {
    let now = Timestamp::from_second(T0 + 1).expect("time");
    let first = super::decide_orphan(&waiting_claim(), now);
    // Its status as written, then a new generation of its spec: the status changes (the
    // observed generation), the Event is not said again.
    let told = ClaimView {
        generation: Some(2),
        status: first.status.expect("a status"),
        ..waiting_claim()
    };
    let decision = super::decide_orphan(&told, now);
    assert!(decision.status.is_some(), "the new generation is recorded");
    assert!(decision.events.is_empty(), "{:?}", decision.events);
}

#[test]
fn a_claim_a_cluster_lock_does_not_take_waits_saying_why_once_and_times_out_saying_it_too() {
    let why = super::Unserved::NamespaceNotAllowed("not this namespace".to_owned());
    let mut claim = waiting_claim();
    claim.spec = LockClaimSpec::for_cluster_lock("db");
    let now = Timestamp::from_second(T0 + 1).expect("time");
    let first = super::decide_unserved(&claim, &why, now);
    let status = first.status.expect("a status");
    assert_eq!(
        (
            status.phase,
            status.reason.as_deref(),
            status.message.as_deref()
        ),
        (
            Some(ClaimPhase::Pending),
            Some("NamespaceNotAllowed"),
            Some("not this namespace")
        )
    );
    let reasons: Vec<&str> = first.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["NamespaceNotAllowed"]);

    // Told once: a new generation writes its status, not the Event again.
    let told = ClaimView {
        generation: Some(2),
        status,
        ..claim.clone()
    };
    let again = super::decide_unserved(&told, &why, now);
    assert!(
        again.status.is_some() && again.events.is_empty(),
        "{again:?}"
    );
    // Told its lock is missing after that (the lock deleted): a new Event says so.
    let missing = super::decide_unserved(&told, &super::Unserved::LockMissing, now);
    let status = missing.status.expect("a status");
    assert_eq!(
        status.message.as_deref(),
        Some("ClusterDistributedLock db does not exist")
    );
    let reasons: Vec<&str> = missing.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["LockNotFound"]);

    // Past its acquire timeout: Failed, and the message says why it was never granted.
    claim.spec.acquire_timeout_seconds = Some(5);
    let late = super::decide_unserved(&claim, &why, Timestamp::from_second(T0 + 6).expect("time"));
    let status = late.status.expect("a status");
    assert_eq!(
        (status.phase, status.reason.as_deref()),
        (Some(ClaimPhase::Failed), Some("AcquireTimeout"))
    );
    assert!(
        status
            .message
            .is_some_and(|message| message.ends_with("not this namespace")),
        "the timeout names the refusal"
    );
}

/// One pass over `input` whose backend calls all answer as `answer` says.
pub(super) fn pass(input: &LockInput, answer: impl Fn(&BackendOp) -> OpOutcome) -> super::Decision {
    let plan = super::plan(input);
    let outcomes: Vec<OpOutcome> = plan.ops.iter().map(|planned| answer(&planned.op)).collect();
    super::fold(input, &plan, &outcomes)
}

fn granted(op: &BackendOp) -> OpOutcome {
    match op {
        BackendOp::Acquire { .. } => OpOutcome::Granted {
            fencing_token: 1,
            already_held: false,
        },
        other => panic!("no other call expected: {other:?}"),
    }
}

/// A waiting claim granted at `T0 + 0.25 s` on the lock of lease `lease`, its owner `owner`.
fn grant_with(lease: i64, owner: super::model::OwnerState) -> super::Decision {
    let mut claim = waiting_claim();
    claim.owner_state = owner;
    let mut input = input_at(T0, claim);
    input.lock.spec.lease_duration_seconds = lease;
    pass(&input, granted)
}

#[test]
fn a_grant_says_what_it_holds_and_looks_again_when_it_ends() {
    let decision = grant_with(10, super::model::OwnerState::NotTracked);
    let status = decision.claims[0].status.clone().expect("a status");
    assert_eq!(status.phase, Some(ClaimPhase::Held));
    assert_eq!(
        status.message.as_deref(),
        Some("holds lock db with fencing token 1")
    );
    // Granted at T0 + 0.25 s for 10 s: looked at again when the lease ends (and 50 ms).
    assert_eq!(decision.requeue_after, Duration::from_millis(9_800));
}

#[test]
fn a_grant_to_a_running_owner_looks_again_when_its_renewal_is_due_not_within_the_second() {
    // Lease 10 s: the controller renews for the owner after half of it.
    let decision = grant_with(10, super::model::OwnerState::Alive);
    assert_eq!(decision.requeue_after, Duration::from_millis(4_800));
    // Lease 1 s: the renewal is due at once, but not before the next whole second (a
    // renewal within the same second changes nothing).
    let decision = grant_with(1, super::model::OwnerState::Alive);
    assert_eq!(decision.requeue_after, Duration::from_millis(800));
}

#[test]
fn a_backend_call_that_fails_is_the_passes_backend_failure() {
    // Held until T0 + 10, renewed at T0 + 2: the pass calls the backend for it.
    let input = input_at(T0 + 2, held_claim(T0 + 10, Some(T0 + 2)));
    let decision = pass(&input, |_| OpOutcome::Failed {
        message: "connection refused".to_owned(),
    });
    assert_eq!(
        decision.backend_failure.as_deref(),
        Some("connection refused")
    );
    // The holder keeps its recorded grant meanwhile.
    let kept = decision
        .claims
        .iter()
        .find_map(|change| change.status.clone());
    assert!(kept.is_none_or(|status| status.phase == Some(ClaimPhase::Held)));
}

#[test]
fn with_its_backend_away_a_pass_says_so_to_every_waiter_on_one_lock_or_several() {
    // A claim on db and cache, cache not yet free for it; db's backend does not answer.
    let mut claim = waiting_claim();
    claim.locks = vec!["db".to_owned(), "cache".to_owned()];
    claim.spec = LockClaimSpec {
        lock_name: String::new(),
        lock_names: Some(claim.locks.clone()),
        ..claim.spec
    };
    claim.members = vec![super::model::MemberLock {
        name: "cache".to_owned(),
        exists: true,
        admits: false,
        holds: Some(false),
        fencing_token: None,
        high_water: 0,
        shared: false,
    }];
    let mut input = input_at(T0, claim);
    input.backend = BackendView::Unavailable {
        backend: BackendKind::Redis,
        message: "redis: connection refused".to_owned(),
    };
    let decision = pass(&input, |op| panic!("no call with the backend away: {op:?}"));
    assert_eq!(
        decision.backend_failure.as_deref(),
        Some("redis: connection refused")
    );
    // Not "waiting for lock cache": nothing is granted here until db's backend answers.
    let status = decision.claims[0].status.clone().expect("a status");
    assert_eq!(status.reason.as_deref(), Some("BackendUnavailable"));
}

fn named(claim: ClaimView, name: &str, created: i64) -> ClaimView {
    ClaimView {
        name: name.to_owned(),
        owner_token: format!("uid-{name}"),
        created,
        ..claim
    }
}

#[test]
fn a_new_grant_is_written_before_a_renewal_and_a_waiters_position() {
    // A semaphore of 2: a holds (renewed just now), b and c wait; b is granted, c waits on.
    let holder = held_claim(T0 + 10, Some(T0 + 2));
    let mut input = input_with_backend_lease(T0 + 2, holder, Duration::from_secs(8));
    input.lock.spec.max_holders = 2;
    if let BackendView::Ready { snapshot, .. } = &mut input.backend {
        snapshot.holders[0].share = ShareMode::Shared;
    }
    input.claims.push(named(waiting_claim(), "b", T0 + 1));
    input.claims.push(named(waiting_claim(), "c", T0 + 2));
    let decision = pass(&input, |op| match op {
        BackendOp::Acquire { .. } => OpOutcome::Granted {
            fencing_token: 2,
            already_held: false,
        },
        BackendOp::Extend { .. } => OpOutcome::Extended { still_held: true },
        BackendOp::RaiseFloor { floor } => OpOutcome::FloorRaised { counter: *floor },
        other => panic!("no other call expected: {other:?}"),
    });
    let order: Vec<&str> = decision.claims.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        order,
        ["b", "a", "c"],
        "the new grant's write goes first: {:#?}",
        decision.claims
    );
}

#[test]
fn a_holder_deleted_while_the_backend_is_away_is_not_history_yet() {
    let mut holder = held_claim(T0 + 10, None);
    holder.deleting = true;
    let mut input = input_at(T0 + 2, holder);
    input.backend = BackendView::Unavailable {
        backend: BackendKind::Redis,
        message: "redis: connection refused".to_owned(),
    };
    let decision = pass(&input, |op| panic!("no call with the backend away: {op:?}"));
    // Its grant is not released yet: it keeps its finalizer and is not in the history.
    let history = decision.lock_status.map(|status| status.history);
    assert!(
        history.as_ref().is_none_or(|grants| grants.is_empty()),
        "{history:?}"
    );
    assert!(decision.claims.is_empty(), "{:?}", decision.claims);
}

#[test]
fn in_a_namespace_being_deleted_the_lock_stays_while_a_claim_keeps_its_finalizer() {
    let gone = |claims: Vec<ClaimView>| {
        let mut input = input_at(T0, waiting_claim());
        input.claims = claims;
        input.lock.deleting = true;
        input.lock.namespace_terminating = true;
        pass(&input, |op| panic!("nothing held, no call: {op:?}"))
    };
    let mut marked = waiting_claim();
    marked.deleting = true;
    // Only the marked claim's finalizer goes (no status, no Event); the other still keeps
    // its own, so the lock's stays.
    let decision = gone(vec![marked.clone(), named(waiting_claim(), "b", T0)]);
    assert_eq!(decision.claims.len(), 1);
    assert_eq!(decision.claims[0].name, "a");
    assert_eq!(decision.claims[0].status, None);
    assert!(decision.events.is_empty());
    assert!(!decision.remove_lock_finalizer);
    // Once every claim lets go, so does the lock.
    let decision = gone(vec![marked]);
    assert!(decision.remove_lock_finalizer);
}

#[test]
fn a_grant_released_on_request_lets_go_of_the_finalizer_once_the_backend_released_it() {
    let mut holder = held_claim(T0 + 10, None);
    holder.spec.release = Some(true);
    let input = input_with_backend_lease(T0 + 2, holder, Duration::from_secs(8));
    let released = |was_held| {
        move |op: &BackendOp| match op {
            BackendOp::Release { .. } => OpOutcome::Released { was_held },
            BackendOp::RaiseFloor { floor } => OpOutcome::FloorRaised { counter: *floor },
            other => panic!("no other call expected: {other:?}"),
        }
    };
    let decision = pass(&input, released(true));
    let change = &decision.claims[0];
    assert_eq!(
        change.status.as_ref().and_then(|status| status.phase),
        Some(ClaimPhase::Released)
    );
    assert_eq!(change.finalizer, super::FinalizerChange::Remove);
    // A release the backend did not confirm keeps it.
    let failed = pass(&input, |_| OpOutcome::Failed {
        message: "connection refused".to_owned(),
    });
    assert!(failed
        .claims
        .iter()
        .all(|change| change.finalizer == super::FinalizerChange::Keep));
}

/// A claim's name in a pass, and back: its own name on a namespaced lock; `namespace/name` on
/// a cluster lock (no namespace), whose claims come from several namespaces.
#[test]
fn a_claims_key_in_a_pass_names_its_namespace_only_on_a_cluster_lock() {
    use super::model::{claim_address, claim_key};
    assert_eq!(claim_key("ns", "ns", "job-1"), "job-1");
    assert_eq!(claim_address("ns", "job-1"), ("ns", "job-1"));
    assert_eq!(claim_key("", "team-a", "job-1"), "team-a/job-1");
    assert_eq!(claim_address("", "team-a/job-1"), ("team-a", "job-1"));
    for (namespace, name) in [("team-a", "job-1"), ("b", "x")] {
        let key = claim_key("", namespace, name);
        assert_eq!(claim_address("", &key), (namespace, name));
    }
}

/// The backend key (`namespace/key`) may be as long as the engine takes, not a byte more.
#[test]
fn a_lock_whose_backend_key_is_longer_than_the_engine_takes_is_invalid() {
    let with_key_of = |length: usize| {
        let mut lock = lock();
        // `ns/` and the key.
        lock.spec.key = Some("k".repeat(length - "ns/".len()));
        assert_eq!(lock.backend_key().len(), length);
        lock.spec_problem()
    };
    let limit = super::model::MAX_BACKEND_KEY_LEN;
    assert_eq!(with_key_of(limit), None);
    let problem = with_key_of(limit + 1).expect("one byte too long");
    assert!(
        problem.contains(&format!("is {} bytes, the limit is {limit}", limit + 1)),
        "{problem}"
    );
}

/// A claim's workload owner: the controlling Pod or Job reference, else the first Pod or Job
/// one; other kinds (a ReplicaSet) are no workload of a claim.
#[test]
fn a_claims_workload_owner_is_its_controlling_pod_or_job() {
    use super::model::{WorkloadKind, WorkloadOwner};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let reference = |api_version: &str, kind: &str, name: &str, controller: bool| OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: format!("uid-{name}"),
        controller: controller.then_some(true),
        ..OwnerReference::default()
    };
    let owner = |references: &[OwnerReference]| {
        WorkloadOwner::of(references).map(|owner| (owner.kind, owner.name, owner.uid))
    };
    let job = reference("batch/v1", "Job", "migrate", false);
    let pod = reference("v1", "Pod", "worker", true);
    let replica_set = reference("apps/v1", "ReplicaSet", "web", true);
    assert_eq!(
        owner(&[job.clone(), pod.clone()]),
        Some((
            WorkloadKind::Pod,
            "worker".to_owned(),
            "uid-worker".to_owned()
        ))
    );
    assert_eq!(
        owner(&[replica_set.clone(), job.clone()]),
        Some((
            WorkloadKind::Job,
            "migrate".to_owned(),
            "uid-migrate".to_owned()
        ))
    );
    assert_eq!(owner(&[replica_set]), None);
    assert_eq!(owner(&[]), None);
}

/// A claim names its locks in exactly one way: `spec.lockName`, or `spec.lockNames` (the
/// schema says so too; this is what a claim stored past the schema is told).
#[test]
fn a_claim_names_one_lock_or_several_never_neither_nor_both() {
    let with = |lock_name: &str, lock_names: Option<Vec<&str>>| {
        let mut claim = waiting_claim();
        claim.spec.lock_name = lock_name.to_owned();
        claim.spec.lock_names =
            lock_names.map(|names| names.into_iter().map(str::to_owned).collect());
        claim.locks = claim.spec.locks().into_iter().map(str::to_owned).collect();
        claim.spec_problem()
    };
    assert_eq!(with("db", None), None);
    assert_eq!(with("", Some(vec!["a", "b"])), None);
    assert_eq!(
        with("", None).as_deref(),
        Some("spec.lockName must not be empty")
    );
    assert_eq!(
        with("db", Some(vec!["a", "b"])).as_deref(),
        Some("set exactly one of spec.lockName and spec.lockNames")
    );
}

/// A busy policy other than `Wait` is for a claim on one lock, and one that replaces pending
/// claims needs the group they share.
#[test]
fn a_busy_policy_says_when_it_cannot_be_served() {
    use turnstile_api::BusyPolicy;
    let with = |policy: BusyPolicy, group: Option<&str>, several: bool| {
        let mut claim = waiting_claim();
        claim.spec.when_busy = Some(policy);
        claim.spec.group = group.map(str::to_owned);
        if several {
            claim.spec.lock_name = String::new();
            claim.spec.lock_names = Some(vec!["a".to_owned(), "b".to_owned()]);
            claim.locks = vec!["a".to_owned(), "b".to_owned()];
        }
        claim.spec_problem()
    };
    assert_eq!(with(BusyPolicy::Wait, None, true), None);
    assert_eq!(with(BusyPolicy::Wait, None, false), None);
    assert_eq!(
        with(BusyPolicy::Fail, None, true).as_deref(),
        Some("spec.whenBusy other than Wait is for a claim on one lock (spec.lockName)")
    );
    assert_eq!(with(BusyPolicy::Fail, None, false), None);
    for replacing in [BusyPolicy::ReplacePending, BusyPolicy::CancelInProgress] {
        assert_eq!(
            with(replacing, None, false),
            Some(format!("spec.whenBusy {replacing:?} needs spec.group"))
        );
        assert_eq!(with(replacing, Some("deploy"), false), None);
    }
}
