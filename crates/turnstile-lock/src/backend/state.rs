//! One lock's state and the rules that change it, free of any store: the memory backend keeps
//! a [`KeyState`] per key under a mutex, the etcd backend reads one from its key, applies the
//! same rules and writes it back with a compare-and-swap. Redis and MongoDB apply these rules
//! inside the server (Lua, pipeline updates), and the conformance suite holds all of them to
//! the same behaviour.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    admits, admitted_prefix, AcquireMode, AcquireOutcome, AcquireRequest, Handoff, HolderInfo,
    LockSnapshot, ShareMode,
};

#[derive(Debug)]
pub(crate) struct Holder {
    pub(crate) fencing_token: u64,
    pub(crate) expires_at: Instant,
    pub(crate) share: ShareMode,
    pub(crate) lock_delay: Duration,
    /// The max-hold deadline, if any: no lease reaches past it.
    pub(crate) hold_until: Option<Instant>,
}

impl Holder {
    /// A lease of `ttl` from `now`, capped at the max-hold deadline.
    fn lease(&self, ttl: Duration, now: Instant) -> Duration {
        self.hold_until
            .map_or(ttl, |until| ttl.min(until.saturating_duration_since(now)))
    }
}

/// Queue order: priority descending (stored negated), then arrival.
pub(crate) type Place = (i64, u64);

#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) place: Place,
    pub(crate) heartbeat_expires_at: Instant,
    /// What it asked for, granted to it on hand-off.
    pub(crate) ttl: Duration,
    pub(crate) share: ShareMode,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) lock_delay: Duration,
}

/// One lock's whole state: what every backend keeps for a key (see the [module docs](super)).
#[derive(Debug, Default)]
pub(crate) struct KeyState {
    pub(crate) holders: HashMap<String, Holder>,
    pub(crate) fence: u64,
    /// Place → owner: iteration order is queue order.
    pub(crate) queue: BTreeMap<Place, String>,
    pub(crate) waiters: HashMap<String, Waiter>,
    pub(crate) next_seq: u64,
    /// No grant before this (a lock-delay after an involuntary end).
    pub(crate) delay_until: Option<Instant>,
}

/// What a new grant records.
struct GrantTerms {
    ttl: Duration,
    share: ShareMode,
    max_hold: Option<Duration>,
    lock_delay: Duration,
}

#[cfg(test)]
mod tests;

impl KeyState {
    fn prune(&mut self, now: Instant) {
        // A lease that ran out ended involuntarily: its lock-delay starts at its end.
        for holder in self.holders.values() {
            if holder.expires_at <= now && !holder.lock_delay.is_zero() {
                let until = holder.expires_at + holder.lock_delay;
                self.delay_until = Some(self.delay_until.map_or(until, |d| d.max(until)));
            }
        }
        self.holders.retain(|_, holder| holder.expires_at > now);
        if self.delay_until.is_some_and(|until| until <= now) {
            self.delay_until = None;
        }
        let dead: Vec<String> = self
            .waiters
            .iter()
            .filter(|(_, waiter)| waiter.heartbeat_expires_at <= now)
            .map(|(owner, _)| owner.clone())
            .collect();
        for owner in dead {
            self.leave_queue(&owner);
        }
    }

    fn leave_queue(&mut self, owner: &str) {
        if let Some(waiter) = self.waiters.remove(owner) {
            self.queue.remove(&waiter.place);
        }
    }

    fn held_exclusive(&self) -> bool {
        self.holders
            .values()
            .any(|holder| holder.share.is_exclusive())
    }

    /// Modes of the waiters queued before `place`.
    fn modes_before(&self, place: Place) -> impl Iterator<Item = ShareMode> + '_ {
        self.queue
            .range(..place)
            .filter_map(|(_, owner)| self.waiters.get(owner).map(|waiter| waiter.share))
    }

    /// When a grant could next happen without a release: the earliest lease end or the end
    /// of the lock-delay, whichever is later.
    fn retry_after(&self, now: Instant) -> Option<Duration> {
        let expiry = self
            .holders
            .values()
            .map(|holder| holder.expires_at.saturating_duration_since(now))
            .min();
        let delay = self
            .delay_until
            .map(|until| until.saturating_duration_since(now));
        expiry.max(delay)
    }

    fn insert_holder(&mut self, owner: &str, terms: &GrantTerms, now: Instant) -> (u64, Duration) {
        self.fence += 1;
        let lease = terms.max_hold.map_or(terms.ttl, |max| terms.ttl.min(max));
        self.holders.insert(
            owner.to_owned(),
            Holder {
                fencing_token: self.fence,
                expires_at: now + lease,
                share: terms.share,
                lock_delay: terms.lock_delay,
                hold_until: terms.max_hold.map(|max| now + max),
            },
        );
        (self.fence, lease)
    }

    /// Grants the compatible head of the queue and tells those waiters. Each hand-off
    /// lease is capped by the waiter's remaining heartbeat, so a waiter that vanished blocks
    /// the lock no longer than its queue place would have.
    fn hand_off(&mut self, max_holders: u32, now: Instant) -> Vec<(String, Handoff)> {
        let mut handoffs = Vec::new();
        if self.delay_until.is_some() {
            return handoffs;
        }
        let modes = self
            .queue
            .values()
            .filter_map(|owner| self.waiters.get(owner).map(|waiter| waiter.share));
        let count = admitted_prefix(
            self.holders.len(),
            self.held_exclusive(),
            modes,
            max_holders,
        );
        let admitted: Vec<String> = self.queue.values().take(count).cloned().collect();
        for owner in admitted {
            let Some(waiter) = self.waiters.remove(&owner) else {
                continue;
            };
            self.queue.remove(&waiter.place);
            let terms = GrantTerms {
                ttl: waiter
                    .ttl
                    .min(waiter.heartbeat_expires_at.saturating_duration_since(now)),
                share: waiter.share,
                max_hold: waiter.max_hold,
                lock_delay: waiter.lock_delay,
            };
            if terms.ttl.is_zero() {
                continue;
            }
            let (fencing_token, lease) = self.insert_holder(&owner, &terms, now);
            handoffs.push((
                owner,
                Handoff {
                    fencing_token,
                    lease,
                },
            ));
        }
        handoffs
    }
}

impl KeyState {
    /// One acquire attempt at `now` (the request already validated): prune, then grant,
    /// enqueue or refuse, as [`Backend::acquire`](super::Backend::acquire) says.
    pub(crate) fn acquire(&mut self, request: &AcquireRequest<'_>, now: Instant) -> AcquireOutcome {
        self.prune(now);
        if let Some(holder) = self.holders.get_mut(request.owner) {
            // Idempotent re-acquire: the lease is refreshed, the max-hold deadline is not.
            let lease = holder.lease(request.ttl, now);
            holder.expires_at = now + lease;
            return AcquireOutcome::Granted {
                fencing_token: holder.fencing_token,
                ttl: lease,
                already_held: true,
            };
        }

        let queued_place = self.waiters.get(request.owner).map(|waiter| waiter.place);
        // Not queued: judged at the place it would join (after its priority and higher).
        let place = queued_place.unwrap_or((-i64::from(request.priority), u64::MAX));
        let granted = self.delay_until.is_none()
            && admits(
                self.holders.len(),
                self.held_exclusive(),
                self.modes_before(place),
                request.share,
                request.max_holders,
            );
        if granted {
            self.leave_queue(request.owner);
            let terms = GrantTerms {
                ttl: request.ttl,
                share: request.share,
                max_hold: request.max_hold,
                lock_delay: request.lock_delay,
            };
            let (fencing_token, lease) = self.insert_holder(request.owner, &terms, now);
            return AcquireOutcome::Granted {
                fencing_token,
                ttl: lease,
                already_held: false,
            };
        }

        let retry_after = self.retry_after(now);
        if request.mode == AcquireMode::Try {
            return AcquireOutcome::Busy { retry_after };
        }
        let heartbeat_expires_at = now + request.waiter_lease;
        let place = match self.waiters.get_mut(request.owner) {
            Some(waiter) => {
                waiter.heartbeat_expires_at = heartbeat_expires_at;
                waiter.ttl = request.ttl;
                waiter.place
            }
            None => {
                self.next_seq += 1;
                let place = (-i64::from(request.priority), self.next_seq);
                self.queue.insert(place, request.owner.to_owned());
                self.waiters.insert(
                    request.owner.to_owned(),
                    Waiter {
                        place,
                        heartbeat_expires_at,
                        ttl: request.ttl,
                        share: request.share,
                        max_hold: request.max_hold,
                        lock_delay: request.lock_delay,
                    },
                );
                place
            }
        };
        let position = self.queue.range(..=place).count();
        AcquireOutcome::Waiting {
            position: u32::try_from(position).unwrap_or(u32::MAX),
            retry_after,
        }
    }

    /// Removes `owner` as holder and as waiter, then grants the compatible head of the queue:
    /// whether `owner` held a live lease, and the hand-offs to tell.
    pub(crate) fn release(
        &mut self,
        owner: &str,
        max_holders: u32,
        now: Instant,
    ) -> (bool, Vec<(String, Handoff)>) {
        self.prune(now);
        let was_held = self.holders.remove(owner).is_some();
        self.leave_queue(owner);
        (was_held, self.hand_off(max_holders, now))
    }

    /// Sets `owner`'s lease to `ttl` from `now` (capped at its max-hold deadline) if it holds a
    /// live one; the lease granted.
    pub(crate) fn extend(&mut self, owner: &str, ttl: Duration, now: Instant) -> Option<Duration> {
        self.prune(now);
        self.holders.get_mut(owner).map(|holder| {
            let lease = holder.lease(ttl, now);
            holder.expires_at = now + lease;
            lease
        })
    }

    /// Does `owner` hold a live lease at `now`?
    pub(crate) fn is_held(&self, owner: &str, now: Instant) -> bool {
        self.holders
            .get(owner)
            .is_some_and(|holder| holder.expires_at > now)
    }

    /// The live holders (in grant order), waiters (in queue order) and fence counter at `now`.
    pub(crate) fn snapshot(&mut self, now: Instant) -> LockSnapshot {
        self.prune(now);
        let mut holders: Vec<HolderInfo> = self
            .holders
            .iter()
            .map(|(owner, holder)| HolderInfo {
                owner: owner.clone(),
                fencing_token: holder.fencing_token,
                expires_in: holder.expires_at.saturating_duration_since(now),
                share: holder.share,
            })
            .collect();
        holders.sort_by_key(|holder| holder.fencing_token);
        LockSnapshot {
            holders,
            waiters: self.queue.values().cloned().collect(),
            fencing_token: self.fence,
            delayed_for: self
                .delay_until
                .map(|until| until.saturating_duration_since(now)),
        }
    }

    /// Raises the fence counter to at least `floor`; the counter afterwards.
    pub(crate) fn raise_fencing_floor(&mut self, floor: u64) -> u64 {
        self.fence = self.fence.max(floor);
        self.fence
    }
}
