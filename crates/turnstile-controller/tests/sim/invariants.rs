//! What every settled state of the simulation satisfies, and what a pass that found the
//! backend away or the lock's spec invalid must have done: the checks `Sim::settle` runs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use turnstile_api::reasons;
use turnstile_api::{BusyPolicy, ClaimPhase, LockClaim, QueueOrder, DEFAULT_MAX_OVERTAKE_SECONDS};
use turnstile_controller::core::{
    ClaimView, LockView, OwnerState, EXACT_POSITIONS, POSITION_REFRESH_DELAY,
};

use super::Sim;

impl Sim {
    /// The invariants of a settled state, each excused only where a comment says why: at
    /// most `maxHolders` holders (an exclusive one alone), terminal phases final, running
    /// owners keeping their leases, no hold past `maxHoldSeconds` nor grant inside a
    /// lock-delay, tokens strictly rising, FIFO within a priority, exact head positions, no
    /// needless wait, invalid claims failed, the backend agreeing with the API, and the lock's
    /// status listing exactly the holders and the waiters' count.
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
            // A newer claim of its group cancelled it (`whenBusy: CancelInProgress`).
            let cancelled = self.claims.get(name).is_some_and(|claim| {
                claim.status.as_ref().and_then(|s| s.reason.as_deref()) == Some(reasons::SUPERSEDED)
            });
            let excused = self.lapsed_while_down.contains(name)
                || self.renewals_blocked.contains(name)
                || (lost && self.taken_for_waiters.contains(name));
            if *state == OwnerState::Alive
                && self.claims.contains_key(name)
                && !max_hold
                && !cancelled
                && !excused
            {
                assert_ne!(
                    self.phase(name),
                    Some(ClaimPhase::Expired),
                    "{name} expired although its owner runs"
                );
            }
        }

        // A Held status never shows a lease that has run out (after a pass whose writes
        // landed): whoever reads `expiresAt` may rely on it.
        if !self.last_pass_failed {
            let now = self.now().as_second();
            for claim in &held {
                let status = claim.status.as_ref().expect("status");
                let expires = status.expires_at.as_ref().expect("expiresAt").0.as_second();
                assert!(
                    expires >= now,
                    "{} shows Held with expiresAt {expires}, before now ({now})",
                    claim.metadata.name.as_deref().unwrap_or_default()
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
        // order is the controller's: priority, then arrival (many claims arrive within one
        // second: names alone would misorder them), then name.
        let order = |c: &LockClaim| self.place(c);
        // A claim being deleted has left the queue (its status stays as it was until its
        // finalizer goes, and `fold` counts it nowhere).
        let mut queued: Vec<&LockClaim> = self
            .claims
            .values()
            .filter(|c| c.status.as_ref().and_then(|s| s.position).is_some())
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .collect();
        queued.sort_by_key(|c| order(c));
        // On a `queue: FirstRunnable` lock a holder may have passed a waiting claim, but only
        // within that claim's `maxOvertakeSeconds`: the bound on how long anyone is passed.
        // (Worked out here from the spec, not by the core's own rule, so a wrong rule is caught.)
        let window = (self.lock.spec.queue == Some(QueueOrder::FirstRunnable)).then(|| {
            self.lock
                .spec
                .max_overtake_seconds
                .unwrap_or(DEFAULT_MAX_OVERTAKE_SECONDS)
        });
        let created = |claim: &LockClaim| {
            claim
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |at| at.0.as_second())
        };
        let passable_at =
            |claim: &LockClaim, at: i64| window.is_some_and(|window| at < created(claim) + window);
        for holder in &held {
            let holder_name = holder.metadata.name.clone().expect("name");
            let granted_at = holder
                .status
                .as_ref()
                .and_then(|s| s.acquired_at.as_ref())
                .map_or(i64::MAX, |at| at.0.as_second());
            for waiting in &queued {
                let waiting_name = waiting.metadata.name.clone().expect("name");
                let existed = self.created_seq[&waiting_name] < self.granted_seq[&holder_name];
                assert!(
                    !(existed
                        && order(waiting) < order(holder)
                        && !passable_at(waiting, granted_at)),
                    "{waiting_name} waits although it is ahead of holder {holder_name}"
                );
            }
        }
        // A claim with `whenBusy: Fail` never waits in the queue.
        for claim in &queued {
            assert_ne!(
                claim.spec.when_busy,
                Some(BusyPolicy::Fail),
                "{} waits although whenBusy is Fail",
                claim.metadata.name.as_deref().unwrap_or_default()
            );
        }
        // Positions at the head of the queue are exact once POSITION_REFRESH_DELAY has passed
        // since the latest grant (until then a hand-off writes no waiter, and the controller
        // asks to look again by then); behind the head a shown position may lag, but only
        // ever as an upper bound (waiters only move forward).
        let now = self.now().as_second();
        let last_grant = held
            .iter()
            .filter_map(|c| c.status.as_ref()?.acquired_at.as_ref())
            .map(|at| at.0.as_second())
            .max();
        let refresh_at = last_grant.map(|granted| granted + POSITION_REFRESH_DELAY);
        let refresh_pending = refresh_at.is_some_and(|at| at > now);
        let mut head_stale = false;
        for (index, claim) in queued.iter().enumerate() {
            let exact = i32::try_from(index + 1).expect("small queue");
            let shown = claim
                .status
                .as_ref()
                .and_then(|s| s.position)
                .expect("queued");
            assert!(shown >= exact, "position {shown} shown for place {exact}");
            if exact <= EXACT_POSITIONS && shown != exact {
                assert!(
                    refresh_pending || self.position_refreshes_denied,
                    "head of the queue: {shown} shown for {exact}"
                );
                head_stale = true;
            }
        }
        if head_stale {
            // The controller comes back when the refresh is due, or soon to try the budget.
            let until = match refresh_at.filter(|_| refresh_pending) {
                Some(at) => Duration::from_secs(u64::try_from(at - now).expect("later")),
                None => Duration::ZERO,
            };
            assert!(
                self.requeue_after <= until + Duration::from_secs(1),
                "stale positions at the head; the controller looks again in {:?}",
                self.requeue_after
            );
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
        let fits = |claim: &LockClaim| {
            if shared(claim) {
                !held_exclusive && held.len() < max
            } else {
                held.is_empty()
            }
        };
        if let Some(head) = queued.first().filter(|_| !delayed && served) {
            assert!(!fits(head), "the head of the queue fits but waits");
        }
        // First-runnable: nobody that fits waits, unless a claim ahead of it may no longer be
        // passed (the lock drains for that one).
        if !delayed && served {
            let now = self.now().as_second();
            for (place, claim) in queued.iter().enumerate() {
                if !queued[..place].iter().all(|ahead| passable_at(ahead, now)) {
                    break;
                }
                assert!(
                    !fits(claim),
                    "{} fits and may pass every claim ahead of it, but waits",
                    claim.metadata.name.as_deref().unwrap_or_default()
                );
            }
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

    /// What the README promises of a pass whose backend did not answer: "holders keep their
    /// grants (and tokens) until their leases run out, waiting claims show reason
    /// `BackendUnavailable`, and nothing is granted", and the lock says so in `Ready`; the
    /// same of a pass on a lock whose spec cannot be served, with its reasons. `reasons`:
    /// the `Ready` condition's, the waiting claims'; `backend_away`: whether the pass's
    /// snapshot failed.
    pub(super) fn check_blocked_pass(
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
            reasons::SUPERSEDED,
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
}
