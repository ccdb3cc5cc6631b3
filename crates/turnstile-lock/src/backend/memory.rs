//! In-process backend: one mutex-protected map, tokio's clock, a [`WakeRegistry`] as notifier.
//!
//! Locks live as long as the [`MemoryBackend`] value (and its clones). Fence counters are kept
//! for every key ever used, so tokens keep increasing after a lock goes idle.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{
    admits, admitted_prefix, validate_key, validate_max_holders, validate_owner, validate_request,
    validate_ttl, AcquireMode, AcquireOutcome, AcquireRequest, Backend, Handoff, HolderInfo,
    LockSnapshot, ShareMode, WakeRegistry, WakeSubscription,
};
use crate::error::LockResult;

#[derive(Debug)]
struct Holder {
    fencing_token: u64,
    expires_at: Instant,
    share: ShareMode,
    lock_delay: Duration,
    /// The max-hold deadline, if any: no lease reaches past it.
    hold_until: Option<Instant>,
}

impl Holder {
    /// A lease of `ttl` from `now`, capped at the max-hold deadline.
    fn lease(&self, ttl: Duration, now: Instant) -> Duration {
        self.hold_until
            .map_or(ttl, |until| ttl.min(until.saturating_duration_since(now)))
    }
}

/// Queue order: priority descending (stored negated), then arrival.
type Place = (i64, u64);

#[derive(Debug)]
struct Waiter {
    place: Place,
    heartbeat_expires_at: Instant,
    /// What it asked for, granted to it on hand-off.
    ttl: Duration,
    share: ShareMode,
    max_hold: Option<Duration>,
    lock_delay: Duration,
}

#[derive(Debug, Default)]
struct KeyState {
    holders: HashMap<String, Holder>,
    fence: u64,
    /// Place → owner: iteration order is queue order.
    queue: BTreeMap<Place, String>,
    waiters: HashMap<String, Waiter>,
    next_seq: u64,
    /// No grant before this (a lock-delay after an involuntary end).
    delay_until: Option<Instant>,
}

/// What a new grant records.
struct GrantTerms {
    ttl: Duration,
    share: ShareMode,
    max_hold: Option<Duration>,
    lock_delay: Duration,
}

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
    fn hand_off(&mut self, key: &str, max_holders: u32, now: Instant, wakes: &WakeRegistry) {
        if self.delay_until.is_some() {
            return;
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
            wakes.hand_off(
                key,
                &owner,
                Handoff {
                    fencing_token,
                    lease,
                },
            );
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    locks: Mutex<HashMap<String, KeyState>>,
    wakes: WakeRegistry,
}

/// Locks held in this process only: for tests, single-replica deployments and the embedded
/// default of the controller. Cloning shares the same locks.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    shared: Arc<Shared>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn locks(&self) -> MutexGuard<'_, HashMap<String, KeyState>> {
        // Every critical section leaves the map consistent before it could panic.
        self.shared
            .locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        validate_request(request)?;
        // Nothing here ever waits, so a task looping acquire/release would never yield and
        // could starve every other task (the waiters, timers) on its runtime thread.
        tokio::task::consume_budget().await;
        let now = Instant::now();
        let mut locks = self.locks();
        let state = locks.entry(request.key.to_owned()).or_default();
        state.prune(now);

        if let Some(holder) = state.holders.get_mut(request.owner) {
            // Idempotent re-acquire: the lease is refreshed, the max-hold deadline is not.
            let lease = holder.lease(request.ttl, now);
            holder.expires_at = now + lease;
            return Ok(AcquireOutcome::Granted {
                fencing_token: holder.fencing_token,
                ttl: lease,
                already_held: true,
            });
        }

        let queued_place = state.waiters.get(request.owner).map(|waiter| waiter.place);
        // Not queued: judged at the place it would join (after its priority and higher).
        let place = queued_place.unwrap_or((-i64::from(request.priority), u64::MAX));
        let granted = state.delay_until.is_none()
            && admits(
                state.holders.len(),
                state.held_exclusive(),
                state.modes_before(place),
                request.share,
                request.max_holders,
            );
        if granted {
            state.leave_queue(request.owner);
            let terms = GrantTerms {
                ttl: request.ttl,
                share: request.share,
                max_hold: request.max_hold,
                lock_delay: request.lock_delay,
            };
            let (fencing_token, lease) = state.insert_holder(request.owner, &terms, now);
            return Ok(AcquireOutcome::Granted {
                fencing_token,
                ttl: lease,
                already_held: false,
            });
        }

        let retry_after = state.retry_after(now);
        if request.mode == AcquireMode::Try {
            return Ok(AcquireOutcome::Busy { retry_after });
        }
        let heartbeat_expires_at = now + request.waiter_lease;
        let place = match state.waiters.get_mut(request.owner) {
            Some(waiter) => {
                waiter.heartbeat_expires_at = heartbeat_expires_at;
                waiter.ttl = request.ttl;
                waiter.place
            }
            None => {
                state.next_seq += 1;
                let place = (-i64::from(request.priority), state.next_seq);
                state.queue.insert(place, request.owner.to_owned());
                state.waiters.insert(
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
        let position = state.queue.range(..=place).count();
        Ok(AcquireOutcome::Waiting {
            position: u32::try_from(position).unwrap_or(u32::MAX),
            retry_after,
        })
    }

    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_max_holders(max_holders)?;
        tokio::task::consume_budget().await;
        let was_held = {
            let now = Instant::now();
            let mut locks = self.locks();
            let Some(state) = locks.get_mut(key) else {
                return Ok(false);
            };
            state.prune(now);
            let was_held = state.holders.remove(owner).is_some();
            state.leave_queue(owner);
            state.hand_off(key, max_holders, now, &self.shared.wakes);
            was_held
        };
        // Let other tasks run before this one can come back for the lock. Nothing in this
        // backend ever waits, so on a single-threaded runtime a releaser that re-requests at
        // once would otherwise beat tasks that never got scheduled far enough to queue.
        tokio::task::yield_now().await;
        Ok(was_held)
    }

    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_ttl(ttl)?;
        let now = Instant::now();
        let mut locks = self.locks();
        let Some(state) = locks.get_mut(key) else {
            return Ok(None);
        };
        state.prune(now);
        Ok(state.holders.get_mut(owner).map(|holder| {
            let lease = holder.lease(ttl, now);
            holder.expires_at = now + lease;
            lease
        }))
    }

    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        let now = Instant::now();
        let locks = self.locks();
        Ok(locks
            .get(key)
            .and_then(|state| state.holders.get(owner))
            .is_some_and(|holder| holder.expires_at > now))
    }

    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        validate_key(key)?;
        let now = Instant::now();
        let mut locks = self.locks();
        let Some(state) = locks.get_mut(key) else {
            return Ok(LockSnapshot::default());
        };
        state.prune(now);
        let mut holders: Vec<HolderInfo> = state
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
        Ok(LockSnapshot {
            holders,
            waiters: state.queue.values().cloned().collect(),
            fencing_token: state.fence,
            delayed_for: state
                .delay_until
                .map(|until| until.saturating_duration_since(now)),
        })
    }

    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        validate_key(key)?;
        let mut locks = self.locks();
        let state = locks.entry(key.to_owned()).or_default();
        state.fence = state.fence.max(floor);
        Ok(state.fence)
    }

    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        validate_key(key)?;
        validate_owner(owner)?;
        Ok(self.shared.wakes.register(key, owner, None))
    }
}
