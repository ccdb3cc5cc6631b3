//! Step 2 of the plan: who is granted now. Admission walks the queue and stops at the first
//! claim that does not fit: shared claims hold together up to `maxHolders`, an exclusive one
//! alone, and a waiting exclusive claim keeps later shared ones from overtaking it. On a
//! `FirstRunnable` lock a claim that does not fit blocks nobody while it may still be passed:
//! claims behind it that fit are granted (each pass walks the whole queue, so they are found);
//! once its window closes the lock drains for it. Nobody is granted in a lock-delay.

use turnstile_api::{reasons, ClaimPhase};

use super::builder::Builder;
use super::drafts::Drafts;
use super::{Draft, LockMode};
use crate::core::busy;
use crate::core::expiry::backend_ttl;
use crate::core::model::{ClaimView, LockInput, Seconds};

/// What admission decided besides the grants it drafted.
#[derive(Default)]
pub(super) struct Admitted {
    /// The fencing floor to raise the backend's counter to before any grant.
    pub floor: Option<u64>,
    /// Claims on several locks, not first here, that this lock would admit now.
    pub admits_for_other_locks: Vec<String>,
}

/// The walk down the queue: who holds so far, and whether the queue is blocked.
#[derive(Clone, Copy)]
struct Walk {
    max: usize,
    holding: usize,
    exclusive: bool,
    blocked: bool,
    /// Grants this pass ends, still counted for another lock's pass until they are written.
    ending: usize,
    ending_exclusive: bool,
    /// Slots this lock admits claims on several locks that may still be passed into (their
    /// first locks' passes may take them): not kept idle for them, but not admitted twice.
    promised: usize,
    promised_exclusive: bool,
}

impl Walk {
    /// Whether a claim fits beside the holders so far, unless the queue is blocked.
    fn fits(&self, shared: bool) -> bool {
        !self.blocked
            && if shared {
                !self.exclusive && self.holding < self.max
            } else {
                self.holding == 0
            }
    }

    /// Whether there is room even counting the grants this pass ends as held.
    fn room_now(&self, shared: bool) -> bool {
        if shared {
            !self.ending_exclusive && self.holding + self.ending < self.max
        } else {
            self.ending == 0
        }
    }

    fn take(&mut self, shared: bool) {
        self.holding += 1;
        self.exclusive |= !shared;
    }

    /// Whether a claim on several locks that may still be passed is admitted: it fits beside
    /// the holders and the slots already promised to others like it. If so, its slot is
    /// promised.
    fn promise(&mut self, shared: bool) -> bool {
        let counting_promised = Walk {
            holding: self.holding + self.promised,
            exclusive: self.exclusive || self.promised_exclusive,
            ..*self
        };
        let admits = counting_promised.fits(shared) && counting_promised.room_now(shared);
        if admits {
            self.promised += 1;
            self.promised_exclusive |= !shared;
        }
        admits
    }
}

/// Drafts the grants at the head of the queue, as many as there are free slots.
pub(super) fn admit(
    builder: &mut Builder<'_>,
    all: &mut Drafts,
    mode: &LockMode,
    high_water: u64,
    locked_until: Option<Seconds>,
    now: Seconds,
) -> Admitted {
    let input = builder.input;
    let mut admitted = Admitted::default();
    if *mode != LockMode::Serving {
        return admitted;
    }
    let queue = std::mem::take(&mut all.queue);
    if locked_until.is_some_and(|until| until > now) {
        // Nobody is granted now: a claim that does not wait ends.
        for slot in queue {
            let claim = &input.claims[all.drafts[slot].0];
            if busy::fails_when_busy(claim) {
                all.drafts[slot].1 = busy_failure(builder, claim);
            }
        }
        return admitted;
    }
    if high_water > input.backend.snapshot().map_or(0, |s| s.fencing_token) {
        admitted.floor = Some(high_water);
    }
    let (ending, ending_exclusive) = ending_grants(input, &all.drafts);
    let mut walk = Walk {
        max: input.lock.max_holders() as usize,
        holding: all.held,
        exclusive: all.held_exclusive,
        blocked: false,
        ending,
        ending_exclusive,
        promised: 0,
        promised_exclusive: false,
    };
    for slot in queue {
        let claim = &input.claims[all.drafts[slot].0];
        if claim.kept_by(&input.lock.name) {
            if kept_turn(&mut walk, input, claim, now) {
                admitted.admits_for_other_locks.push(claim.name.clone());
            }
        } else if let Some(draft) = own_turn(builder, &mut walk, claim, high_water, now) {
            all.drafts[slot].1 = draft;
        }
    }
    admitted
}

/// Grants this pass ends are written by this lock's pass before its own grants; another
/// lock's pass, which admits through this plan but writes nothing here, counts them until
/// they are written (so the API never shows more holders than `maxHolders`). How many, and
/// whether one is exclusive.
fn ending_grants(input: &LockInput, drafts: &[(usize, Draft)]) -> (usize, bool) {
    drafts
        .iter()
        .filter(|(index, draft)| {
            let claim = &input.claims[*index];
            claim.phase() == ClaimPhase::Held
                && matches!(draft, Draft::End { .. } | Draft::Delete { .. })
        })
        .fold((0usize, false), |(count, exclusive), (index, _)| {
            let claim = &input.claims[*index];
            (count + 1, exclusive || !claim.shared(&input.lock))
        })
}

/// The turn of a claim on several locks whose first lock is another: the slot is kept for
/// it (nobody behind overtakes it) while its first lock's pass takes all its locks at once.
/// Its backend grant is that pass's to make and to give back. Whether this lock admits it.
fn kept_turn(walk: &mut Walk, input: &LockInput, claim: &ClaimView, now: Seconds) -> bool {
    let shared = claim.shared(&input.lock);
    if input.lock.may_be_passed(claim.created, now) {
        // Its first lock grants it when all its locks are free at once; the slot is not
        // kept idle for it meanwhile. Nor is it promised to another such claim behind it:
        // one pass may take both, and the slot of a claim that may no longer be passed
        // with them.
        return walk.promise(shared);
    }
    let admits = walk.fits(shared) && walk.room_now(shared);
    walk.blocked |= !admits;
    if admits {
        walk.take(shared);
    }
    admits
}

/// The turn of a claim this lock grants: its new draft when it is granted, or fails for
/// not waiting.
fn own_turn(
    builder: &mut Builder<'_>,
    walk: &mut Walk,
    claim: &ClaimView,
    high_water: u64,
    now: Seconds,
) -> Option<Draft> {
    let input = builder.input;
    let shared = claim.shared(&input.lock);
    let backend_token = input
        .backend
        .holder(&claim.owner_token)
        .map(|holder| holder.fencing_token);
    // On several locks, granted only when every other lock admits it too; until then it
    // waits at the head here as well.
    let fits = walk.fits(shared)
        && (!claim.is_multi_lock() || claim.members.len() + 1 == claim.locks.len())
        && claim.members.iter().all(|member| member.admits);
    if !fits && busy::fails_when_busy(claim) {
        // It does not wait, so it holds nobody up either.
        return Some(busy_failure(builder, claim));
    }
    walk.blocked |= !fits && !input.lock.may_be_passed(claim.created, now);
    if !fits {
        if backend_token.is_some() {
            // Granted in an earlier pass but no longer at the head: give the slot back.
            builder.release(claim);
        }
        return None;
    }
    walk.take(shared);
    // A grant the backend made in an earlier pass whose status write failed is re-used,
    // unless a later grant was announced meanwhile: then it is taken again, so announced
    // tokens keep increasing.
    if backend_token.is_some_and(|token| token <= high_water) {
        builder.release(claim);
    }
    let lease_end = now.saturating_add(claim.lease_seconds(&input.lock));
    let expiry = claim
        .hold_deadline(&input.lock, now)
        .map_or(lease_end, |deadline| lease_end.min(deadline));
    let ttl = backend_ttl(input, expiry);
    Some(Draft::Grant {
        expiry,
        op: builder.grant(claim, ttl),
    })
}

/// The end of a claim with `whenBusy: Fail` that the lock cannot grant now (a grant an
/// earlier pass made for it in the backend is given back).
fn busy_failure(builder: &mut Builder<'_>, claim: &ClaimView) -> Draft {
    Draft::End {
        phase: ClaimPhase::Failed,
        reason: reasons::LOCK_BUSY,
        message: busy::BUSY_MESSAGE.to_owned(),
        released_at: None,
        release_op: builder.release_if_held(claim, false),
    }
}

#[cfg(test)]
mod tests {
    use super::Walk;

    fn free(max: usize) -> Walk {
        Walk {
            max,
            holding: 0,
            exclusive: false,
            blocked: false,
            ending: 0,
            ending_exclusive: false,
            promised: 0,
            promised_exclusive: false,
        }
    }

    /// The free slots of a lock are promised to claims on several locks that may still be
    /// passed one at a time: shared ones up to `maxHolders`, an exclusive one alone.
    #[test]
    fn a_free_slot_is_promised_to_one_claim_that_may_be_passed() {
        let mut walk = free(2);
        assert!(walk.promise(true));
        assert!(walk.promise(true));
        assert!(!walk.promise(true), "two shared claims fill maxHolders 2");
        assert!(
            !walk.promise(false),
            "nor is an exclusive claim admitted beside them"
        );
        let mut walk = free(2);
        assert!(walk.promise(false));
        assert!(
            !walk.promise(true),
            "an exclusive claim was promised the lock"
        );
        assert!(!walk.promise(false));
        // Promises take no slot from the lock's own claims.
        assert_eq!(walk.holding, 0);
        assert!(walk.fits(true));
    }
}
