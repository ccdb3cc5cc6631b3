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
    validate_key, validate_max_holders, validate_owner, validate_request, validate_ttl,
    AcquireMode, AcquireOutcome, AcquireRequest, Backend, Handoff, HolderInfo, LockSnapshot,
    WakeRegistry, WakeSubscription,
};
use crate::error::LockResult;

#[derive(Debug)]
struct Holder {
    fencing_token: u64,
    expires_at: Instant,
}

#[derive(Debug)]
struct Waiter {
    seq: u64,
    heartbeat_expires_at: Instant,
    /// The lease it asked for, granted to it on hand-off.
    ttl: Duration,
}

#[derive(Debug, Default)]
struct KeyState {
    holders: HashMap<String, Holder>,
    fence: u64,
    /// Arrival sequence → owner: iteration order is queue order.
    queue: BTreeMap<u64, String>,
    waiters: HashMap<String, Waiter>,
    next_seq: u64,
}

impl KeyState {
    fn prune(&mut self, now: Instant) {
        self.holders.retain(|_, holder| holder.expires_at > now);
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
            self.queue.remove(&waiter.seq);
        }
    }

    /// 0-based place of `owner` in the queue, if queued.
    fn rank(&self, owner: &str) -> Option<usize> {
        let seq = self.waiters.get(owner)?.seq;
        Some(self.queue.range(..seq).count())
    }

    fn earliest_expiry(&self, now: Instant) -> Option<Duration> {
        self.holders
            .values()
            .map(|holder| holder.expires_at.saturating_duration_since(now))
            .min()
    }

    fn free_slots(&self, max_holders: u32) -> usize {
        (max_holders as usize).saturating_sub(self.holders.len())
    }

    /// Grants free slots to the head of the queue and tells those waiters. Each hand-off
    /// lease is capped by the waiter's remaining heartbeat, so a waiter that vanished blocks
    /// the lock no longer than its queue place would have.
    fn hand_off(&mut self, key: &str, max_holders: u32, now: Instant, wakes: &WakeRegistry) {
        let admitted: Vec<String> = self
            .queue
            .values()
            .take(self.free_slots(max_holders))
            .cloned()
            .collect();
        for owner in admitted {
            let Some(waiter) = self.waiters.get(&owner) else {
                continue;
            };
            let lease = waiter
                .ttl
                .min(waiter.heartbeat_expires_at.saturating_duration_since(now));
            self.leave_queue(&owner);
            if lease.is_zero() {
                continue;
            }
            self.fence += 1;
            let fencing_token = self.fence;
            self.holders.insert(
                owner.clone(),
                Holder {
                    fencing_token,
                    expires_at: now + lease,
                },
            );
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
            holder.expires_at = now + request.ttl;
            return Ok(AcquireOutcome::Granted {
                fencing_token: holder.fencing_token,
                ttl: request.ttl,
                already_held: true,
            });
        }

        let free = state.free_slots(request.max_holders);
        let rank = state.rank(request.owner);
        let ahead = rank.unwrap_or(state.queue.len());
        if ahead < free {
            state.fence += 1;
            let fencing_token = state.fence;
            state.holders.insert(
                request.owner.to_owned(),
                Holder {
                    fencing_token,
                    expires_at: now + request.ttl,
                },
            );
            state.leave_queue(request.owner);
            return Ok(AcquireOutcome::Granted {
                fencing_token,
                ttl: request.ttl,
                already_held: false,
            });
        }

        let retry_after = state.earliest_expiry(now);
        if request.mode == AcquireMode::Try {
            return Ok(AcquireOutcome::Busy { retry_after });
        }
        let heartbeat_expires_at = now + request.waiter_lease;
        let position = match state.waiters.get_mut(request.owner) {
            Some(waiter) => {
                waiter.heartbeat_expires_at = heartbeat_expires_at;
                waiter.ttl = request.ttl;
                ahead + 1
            }
            None => {
                state.next_seq += 1;
                let seq = state.next_seq;
                state.queue.insert(seq, request.owner.to_owned());
                state.waiters.insert(
                    request.owner.to_owned(),
                    Waiter {
                        seq,
                        heartbeat_expires_at,
                        ttl: request.ttl,
                    },
                );
                state.queue.len()
            }
        };
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

    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_ttl(ttl)?;
        let now = Instant::now();
        let mut locks = self.locks();
        let Some(state) = locks.get_mut(key) else {
            return Ok(false);
        };
        state.prune(now);
        match state.holders.get_mut(owner) {
            Some(holder) => {
                holder.expires_at = now + ttl;
                Ok(true)
            }
            None => Ok(false),
        }
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
            })
            .collect();
        holders.sort_by_key(|holder| holder.fencing_token);
        Ok(LockSnapshot {
            holders,
            waiters: state.queue.values().cloned().collect(),
            fencing_token: state.fence,
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
