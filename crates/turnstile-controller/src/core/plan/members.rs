//! The calls a claim on several locks makes on its other locks, planned in its first lock's
//! pass as ordinary entries of the plan, each in the claim's [`Step`]: a grant takes every
//! other lock right after the first (and gives all back if one refuses), a re-attach takes
//! back the grants other backends lost with their own tokens, a renewal extends them all, and
//! a claim that does not hold after the pass keeps nothing anywhere. (How the other locks
//! keep the claim's place meanwhile: the shell's `multi_lock` module.)

use std::time::Duration;

use crate::core::execution::{Expect, Step};
use crate::core::model::{ClaimView, MemberLock};
use crate::core::ops::{AcquirePurpose, BackendOp, PlannedOp};

fn release(claim: &ClaimView, involuntary: bool) -> BackendOp {
    BackendOp::Release {
        owner: claim.owner_token.clone(),
        involuntary,
    }
}

fn acquire(
    claim: &ClaimView,
    member: &MemberLock,
    ttl: Duration,
    purpose: AcquirePurpose,
) -> BackendOp {
    BackendOp::Acquire {
        owner: claim.owner_token.clone(),
        ttl,
        purpose,
        shared: member.shared,
        queue: false,
    }
}

/// `op` on `member`, a follow-up of the claim's lead whose answer must meet `expect`.
fn follow(claim: &ClaimView, member: &MemberLock, op: BackendOp, expect: Expect) -> PlannedOp {
    PlannedOp::on_member(claim, &member.name, op, Step::Follow { expect })
}

/// On `member`: its fence counter raised to `floor`, then the claim's grant for `purpose`,
/// whose token must meet `expect`.
fn take(
    claim: &ClaimView,
    member: &MemberLock,
    ttl: Duration,
    purpose: AcquirePurpose,
    floor: u64,
    expect: Expect,
) -> [PlannedOp; 2] {
    let raise = BackendOp::RaiseFloor { floor };
    let acquire = acquire(claim, member, ttl, purpose);
    [
        follow(claim, member, raise, Expect::Any),
        follow(claim, member, acquire, expect),
    ]
}

/// `lead` with its expectation, then `follows`, then the give-backs: the claim's grant on
/// its own lock (`own_give_back`, when the step may leave one there) and on every other lock.
fn step(
    claim: &ClaimView,
    lead: PlannedOp,
    expect: Expect,
    follows: Vec<PlannedOp>,
    own_give_back: Option<BackendOp>,
) -> Vec<PlannedOp> {
    let mut ops = vec![PlannedOp {
        step: Step::Lead { expect },
        ..lead
    }];
    ops.extend(follows);
    if let Some(op) = own_give_back {
        ops.push(PlannedOp {
            step: Step::GiveBack,
            ..PlannedOp::for_claim(claim, op)
        });
    }
    ops.extend(claim.members.iter().map(|member| {
        PlannedOp::on_member(claim, &member.name, release(claim, false), Step::GiveBack)
    }));
    ops
}

/// A new grant: the first lock's (`lead`, above `high_water`), then each other lock in name
/// order, above that lock's own high-water mark (a grant left there by an earlier pass is
/// given back first: its token may be at or below one announced since). If any refuses,
/// everything taken is given back: no backend holds part of a grant beyond the pass.
pub(super) fn grant(
    claim: &ClaimView,
    lead: PlannedOp,
    ttl: Duration,
    high_water: u64,
) -> Vec<PlannedOp> {
    if claim.members.is_empty() {
        return vec![lead];
    }
    let mut follows = Vec::new();
    for member in &claim.members {
        if member.holds == Some(true) {
            follows.push(follow(claim, member, release(claim, false), Expect::Any));
        }
        let above = Expect::Above(member.high_water);
        follows.extend(take(
            claim,
            member,
            ttl,
            AcquirePurpose::Grant,
            member.high_water,
            above,
        ));
    }
    step(
        claim,
        lead,
        Expect::Above(high_water),
        follows,
        Some(release(claim, false)),
    )
}

/// Taking back a grant a backend lost, with its recorded tokens: the first lock's (`lead`,
/// `token`), then each other lock whose backend lost its part. If one comes back with
/// another token or is refused, the claim has lost its grant: the first lock's goes as at
/// the end of a lease (its lock-delay starts), the other locks' are given back.
pub(super) fn reattach(
    claim: &ClaimView,
    lead: PlannedOp,
    ttl: Duration,
    token: u64,
) -> Vec<PlannedOp> {
    if claim.members.is_empty() {
        return vec![lead];
    }
    let mut follows = Vec::new();
    for member in claim
        .members
        .iter()
        .filter(|member| member.holds == Some(false))
    {
        // No token recorded: no grant is the one lost (tokens start at 1).
        let recorded = member.fencing_token.unwrap_or(0);
        let floor = recorded.saturating_sub(1);
        let same = Expect::Exactly(recorded);
        follows.extend(take(
            claim,
            member,
            ttl,
            AcquirePurpose::Reattach,
            floor,
            same,
        ));
    }
    step(
        claim,
        lead,
        Expect::Exactly(token),
        follows,
        Some(release(claim, true)),
    )
}

/// A renewal: the first lock's (`lead`), then every other lock's. One that is no longer
/// held ends the claim: the other locks' grants are given back (the first lock's goes with
/// the claim's next pass, as a single lock's does).
pub(super) fn renew(claim: &ClaimView, lead: PlannedOp, ttl: Duration) -> Vec<PlannedOp> {
    if claim.members.is_empty() {
        return vec![lead];
    }
    let follows = claim
        .members
        .iter()
        .map(|member| {
            let extend = BackendOp::Extend {
                owner: claim.owner_token.clone(),
                ttl,
            };
            follow(claim, member, extend, Expect::Any)
        })
        .collect();
    step(claim, lead, Expect::Any, follows, None)
}

/// A claim that does not hold after the pass keeps no other lock's grant: a release on each
/// other lock that may hold one (its backend holds it, or did not answer). Its finalizer
/// stays until they all answer.
pub(super) fn give_back(claim: &ClaimView) -> impl Iterator<Item = PlannedOp> + '_ {
    let may_hold = claim.has_finalizer;
    claim
        .members
        .iter()
        .filter(move |member| may_hold && member.holds != Some(false))
        .map(|member| PlannedOp::on_member(claim, &member.name, release(claim, false), Step::LEAD))
}

#[cfg(test)]
mod tests {
    use turnstile_api::{ClaimPhase, LockClaimSpec};
    use turnstile_lock::LockSnapshot;

    use crate::core::decision::FinalizerChange;
    use crate::core::execution::ExecutionGate;
    use crate::core::model::{BackendView, ClaimView, LockInput, MemberLock};
    use crate::core::ops::{AcquirePurpose, BackendOp, OpOutcome};
    use crate::core::tests::{held_claim, holding, input_at, waiting_claim, T0};
    use crate::core::{fold, plan, Decision};

    /// Claim `a` on `db` (the pass's lock) and `cache`, as `db`'s pass sees it.
    fn on_db_and_cache(mut claim: ClaimView, cache_holds: Option<bool>) -> ClaimView {
        claim.locks = vec!["cache".to_owned(), "db".to_owned()];
        claim.locks.rotate_left(1);
        claim.spec = LockClaimSpec {
            lock_name: String::new(),
            lock_names: Some(vec!["cache".to_owned(), "db".to_owned()]),
            ..claim.spec
        };
        claim.members = vec![MemberLock {
            name: "cache".to_owned(),
            exists: true,
            admits: true,
            holds: cache_holds,
            fencing_token: Some(5),
            high_water: 7,
            shared: false,
        }];
        claim
    }

    /// A pass whose calls run through the gate, answered by `answer(lock, call)` (`None`:
    /// the pass's own lock), as the shell runs them.
    fn run(
        input: &LockInput,
        answer: impl Fn(Option<&str>, &BackendOp) -> OpOutcome,
    ) -> (Vec<(Option<String>, BackendOp)>, Decision) {
        let planned = plan(input);
        let mut gate = ExecutionGate::default();
        let mut made = Vec::new();
        let outcomes: Vec<OpOutcome> = (planned.ops.iter())
            .map(|call| {
                if !gate.admits(call) {
                    return OpOutcome::Skipped;
                }
                made.push((call.on_lock.clone(), call.op.clone()));
                let outcome = answer(call.on_lock.as_deref(), &call.op);
                gate.record(call, &outcome);
                outcome
            })
            .collect();
        (made, fold(input, &planned, &outcomes))
    }

    fn granted(token: u64) -> OpOutcome {
        OpOutcome::Granted {
            fencing_token: token,
            already_held: false,
        }
    }

    fn answers(own_token: u64, cache: OpOutcome) -> impl Fn(Option<&str>, &BackendOp) -> OpOutcome {
        move |lock, op| match (lock, op) {
            (_, BackendOp::RaiseFloor { floor }) => OpOutcome::FloorRaised { counter: *floor },
            (_, BackendOp::Release { .. }) => OpOutcome::Released { was_held: true },
            (None, BackendOp::Acquire { .. }) => granted(own_token),
            (Some(_), BackendOp::Acquire { .. }) => cache.clone(),
            (_, BackendOp::Extend { .. }) => OpOutcome::Extended { still_held: true },
        }
    }

    fn is_release_on(lock: Option<&str>) -> impl Fn(&(Option<String>, BackendOp)) -> bool + '_ {
        move |(on, op)| on.as_deref() == lock && matches!(op, BackendOp::Release { .. })
    }

    #[test]
    fn a_grant_takes_the_other_lock_above_its_high_water_and_records_its_token() {
        let input = input_at(T0, on_db_and_cache(waiting_claim(), Some(false)));
        let (made, decision) = run(&input, answers(1, granted(8)));
        let on_cache: Vec<_> = made.iter().filter(|(on, _)| on.is_some()).collect();
        assert!(
            matches!(on_cache[0].1, BackendOp::RaiseFloor { floor: 7 }),
            "{made:?}"
        );
        assert!(matches!(
            on_cache[1].1,
            BackendOp::Acquire {
                purpose: AcquirePurpose::Grant,
                ..
            }
        ));
        assert_eq!(on_cache.len(), 2, "nothing given back: {made:?}");
        let status = decision.claims[0].status.clone().expect("a status");
        assert_eq!(status.phase, Some(ClaimPhase::Held));
        let cache = status.locks.iter().find(|entry| entry.lock_name == "cache");
        assert_eq!(cache.map(|entry| entry.fencing_token), Some(8));
    }

    #[test]
    fn a_refused_or_stale_grant_on_the_other_lock_gives_everything_back() {
        for cache in [OpOutcome::Busy { retry_after: None }, granted(7)] {
            let input = input_at(T0, on_db_and_cache(waiting_claim(), Some(false)));
            let (made, decision) = run(&input, answers(1, cache.clone()));
            assert!(made.iter().any(is_release_on(None)), "{cache:?}: {made:?}");
            assert!(
                made.iter().any(is_release_on(Some("cache"))),
                "{cache:?}: {made:?}"
            );
            let status = decision.claims[0].status.clone().expect("a status");
            assert_eq!(status.phase, Some(ClaimPhase::Pending), "{cache:?}");
        }
    }

    #[test]
    fn a_grant_left_on_the_other_lock_by_an_earlier_pass_goes_before_a_new_one() {
        let input = input_at(T0, on_db_and_cache(waiting_claim(), Some(true)));
        let (made, _) = run(&input, answers(1, granted(8)));
        let on_cache: Vec<_> = made.iter().filter(|(on, _)| on.is_some()).collect();
        assert!(
            matches!(
                on_cache[0].1,
                BackendOp::Release {
                    involuntary: false,
                    ..
                }
            ),
            "{made:?}"
        );
    }

    #[test]
    fn a_lost_grant_is_taken_back_with_its_own_tokens_or_the_claim_ends() {
        // db's backend lost the grant (token 1), cache's too (token 5).
        let input = input_at(
            T0 + 1,
            on_db_and_cache(held_claim(T0 + 10, None), Some(false)),
        );
        let (made, decision) = run(&input, answers(1, granted(5)));
        assert!(made
            .iter()
            .any(|(on, op)| on.is_some() && matches!(op, BackendOp::RaiseFloor { floor: 4 })));
        let status = decision.claims[0].status.clone().expect("a status");
        assert_eq!(status.phase, Some(ClaimPhase::Held));
        // Cache hands out another token: not the grant it lost. The claim ends, db's grant
        // goes as at the end of a lease and cache's is given back.
        let (made, decision) = run(&input, answers(1, granted(9)));
        assert!(made.iter().any(|(on, op)| on.is_none()
            && matches!(
                op,
                BackendOp::Release {
                    involuntary: true,
                    ..
                }
            )));
        assert!(made.iter().any(is_release_on(Some("cache"))), "{made:?}");
        let status = decision.claims[0].status.clone().expect("a status");
        assert_eq!(status.phase, Some(ClaimPhase::Expired));
    }

    #[test]
    fn a_deleted_claim_keeps_its_finalizer_until_the_other_lock_gave_its_grant_back() {
        let mut claim = on_db_and_cache(held_claim(T0 + 10, None), Some(true));
        claim.deleting = true;
        let mut input = input_at(T0 + 1, claim);
        input.backend = BackendView::Ready {
            backend: turnstile_api::BackendKind::Memory,
            snapshot: LockSnapshot {
                holders: vec![holding("uid-a", 1, std::time::Duration::from_secs(9))],
                fencing_token: 1,
                ..LockSnapshot::default()
            },
        };
        let finalizer = |cache_release: OpOutcome| {
            let (made, decision) = run(&input, |lock, op| match (lock, op) {
                (Some(_), BackendOp::Release { .. }) => cache_release.clone(),
                (_, BackendOp::Release { .. }) => OpOutcome::Released { was_held: true },
                other => panic!("no other call: {other:?}"),
            });
            assert_eq!(made.len(), 2, "{made:?}");
            (decision.claims.iter()).any(|change| change.finalizer == FinalizerChange::Remove)
        };
        let down = OpOutcome::Failed {
            message: "cache's backend is down".to_owned(),
        };
        assert!(!finalizer(down), "kept while cache may hold the grant");
        let back = OpOutcome::Released { was_held: true };
        assert!(finalizer(back), "removed once every grant is back");
    }
}
