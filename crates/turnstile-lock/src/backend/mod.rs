//! The storage side of the lock engine: the [`Backend`] trait every store implements, and the
//! value types that cross it.
//!
//! # Model every backend implements
//!
//! For each lock key a backend keeps, atomically updated as one unit:
//!
//! - **holders**: owner token → (fencing token, lease expiry). At most `max_holders` live ones.
//! - **fence counter**: the highest fencing token ever issued (or the floor it was raised to).
//!   It never decreases and never expires. A grant increments it *in the same atomic step* that
//!   records the holder, so tokens strictly increase in grant order.
//!   Each holder also records its [`ShareMode`], its lock-delay and its max-hold deadline.
//! - **wait queue**: owner tokens by priority (higher first), then arrival order, each with a
//!   heartbeat expiry so a crashed waiter ages out. Admission walks the queue in order and
//!   stops at the first request that is not compatible (see [`admits`]): an exclusive request
//!   holds alone, shared ones hold together up to `max_holders` (of the request deciding the
//!   grant), and a waiting exclusive request stops later shared ones from overtaking it. A
//!   request that is not queued is judged at the place it would join (after every waiter of
//!   its priority or higher); a `Try` request never jumps the queue.
//! - **delay-until**: when a lease runs out (including at its max-hold deadline), the prune
//!   that notices it sets "no grant before `lease_end + lock_delay`"; a voluntary release
//!   sets nothing.
//!
//! Expiry is judged by the backend's own clock (Redis `TIME`, the Mongo server's `$$NOW`, the
//! process clock in memory), never by the clients' clocks. etcd has no clock a client can
//! read: there a deadline is stored relative to the write that set it and each process counts
//! it from when it saw that write (module `etcd`), which no clock skew can make end early.
//!
//! Releasing admits the waiter(s) now at the head of the queue (as many as there are free
//! slots) and tells exactly those, by owner token; each process routes the message to the
//! matching local [`WakeSubscription`]. Two levels, both free of stampedes:
//!
//! - **hand-off** (memory, Redis): the release grants the slot itself, in the same atomic step
//!   (token issued there), and sends a [`WakeUp::Granted`]; the new holder needs no round
//!   trip. The hand-off lease is the waiter's ttl capped by what is left of its queue
//!   heartbeat, so a waiter that died in the queue blocks the lock no longer than its queue
//!   place would have; the engine extends it to the full ttl right away.
//! - **wake** (any backend, e.g. MongoDB): the release sends [`WakeUp::Retry`] and the named
//!   waiter makes one attempt.
//!
//! Polling at the retry policy's delay (capped by [`AcquireOutcome`]'s `retry_after` hint) is
//! only the safety net for expiries and lost messages.
//!
//! # Ordering requirement
//!
//! The engine cancels an acquire by releasing its owner token afterwards. A backend must apply a
//! `release` issued after an `acquire` on the same backend value *after* that acquire (Redis: one
//! multiplexed connection keeps order). Owner tokens are unique per request, so that release can
//! never hurt anyone else.

#[cfg(test)]
pub(crate) mod counting;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memory;
#[cfg(feature = "mongo")]
pub mod mongo;
#[cfg(feature = "redis")]
pub mod redis;
mod state;
#[cfg(test)]
mod tests;
mod wake;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{LockError, LockResult};

#[cfg(feature = "etcd")]
pub use self::etcd::{EtcdBackend, EtcdBackendConfig, EtcdConnectError};
pub use self::memory::MemoryBackend;
#[cfg(feature = "mongo")]
pub use self::mongo::{MongoBackend, MongoBackendConfig, MongoWakeMode, MongoWakeSource};
#[cfg(feature = "redis")]
pub use self::redis::{RedisBackend, RedisBackendConfig};
// The network backends' wake-up tables share it; the memory backend calls it in place.
#[cfg(any(feature = "redis", feature = "mongo", feature = "etcd"))]
pub(crate) use self::wake::drop_counted;
pub use self::wake::{Handoff, WakeRegistry, WakeSubscription, WakeUp};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;
/// Longest owner token accepted, in bytes.
pub const MAX_OWNER_LEN: usize = 256;
/// Largest `max_holders` accepted (a semaphore wider than this is a configuration error). The
/// operator's schema and checks use this same value.
pub const MAX_HOLDERS: u32 = 10_000;
/// Longest lease accepted (one year): keeps millisecond arithmetic far from overflow everywhere.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Whether an acquire may join the wait queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireMode {
    /// Grant now or report [`AcquireOutcome::Busy`]; never enqueue (tryLock). A requester that
    /// is already queued keeps its place and is granted if its place admits it.
    Try,
    /// Grant now, or enqueue (keeping an existing place) and report
    /// [`AcquireOutcome::Waiting`]. Also refreshes the waiter's heartbeat.
    Wait,
}

/// How a holder shares the lock with other holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ShareMode {
    /// Holds alone: granted only when nobody else (of any mode) holds the lock.
    #[default]
    Exclusive,
    /// Holds together with other shared holders, up to `max_holders` at once.
    Shared,
}

impl ShareMode {
    /// True for [`ShareMode::Exclusive`].
    pub fn is_exclusive(self) -> bool {
        self == ShareMode::Exclusive
    }
}

/// Would a request of mode `share` be granted now, given `held` live holders (`held_exclusive`:
/// one of them is exclusive) and the modes of the waiters queued ahead of it?
///
/// Admission walks the queue in order and stops at the first request that is not compatible,
/// so the request is granted exactly when it and everyone ahead of it fit together: at most
/// `max_holders` in all, and either it is alone or everyone is shared.
pub fn admits(
    held: usize,
    held_exclusive: bool,
    ahead: impl IntoIterator<Item = ShareMode>,
    share: ShareMode,
    max_holders: u32,
) -> bool {
    let mut total = held + 1;
    let mut all_shared = !held_exclusive && !share.is_exclusive();
    for mode in ahead {
        total += 1;
        all_shared &= !mode.is_exclusive();
    }
    total <= max_holders as usize && (total == 1 || all_shared)
}

/// How many of the waiters at the head of the queue (modes in queue order) a hand-off admits
/// next to `held` live holders: the longest compatible prefix (see [`admits`]).
pub fn admitted_prefix(
    held: usize,
    held_exclusive: bool,
    queue: impl IntoIterator<Item = ShareMode>,
    max_holders: u32,
) -> usize {
    let (mut count, mut exclusive) = (held, held_exclusive);
    let mut admitted = 0;
    for mode in queue {
        let fits = if mode.is_exclusive() {
            count == 0
        } else {
            !exclusive && count < max_holders as usize
        };
        if !fits {
            break;
        }
        count += 1;
        exclusive |= mode.is_exclusive();
        admitted += 1;
    }
    admitted
}

/// One acquire attempt, as sent to a [`Backend`].
#[derive(Debug, Clone, Copy)]
pub struct AcquireRequest<'a> {
    /// The lock's key.
    pub key: &'a str,
    /// The requester's owner token (unique per request unless the caller chose one).
    pub owner: &'a str,
    /// Lease to grant, measured from the backend's clock at the grant.
    pub ttl: Duration,
    /// 1 for a mutex, N for a counting semaphore.
    pub max_holders: u32,
    /// May the request join the queue?
    pub mode: AcquireMode,
    /// In [`AcquireMode::Wait`]: how long the queue entry survives without another attempt.
    /// The engine sets it comfortably above its polling delay.
    pub waiter_lease: Duration,
    /// Exclusive (alone) or shared (with other shared holders, up to `max_holders`).
    pub share: ShareMode,
    /// Queue order: higher first, first come first served within one priority. Never
    /// preempts a holder.
    pub priority: i32,
    /// The grant ends at (backend clock at the first grant) + this, whatever its renewals:
    /// every lease is capped at that deadline. `None`: no limit.
    pub max_hold: Option<Duration>,
    /// Recorded with the grant: when it ends involuntarily (its lease ran out, also at the
    /// max-hold deadline), nobody is granted the key until `lease_end + lock_delay`.
    pub lock_delay: Duration,
}

impl<'a> AcquireRequest<'a> {
    /// A request with the defaults of the newer fields: exclusive, priority 0, no maximum
    /// hold time, no lock-delay.
    pub fn new(
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
        max_holders: u32,
        mode: AcquireMode,
        waiter_lease: Duration,
    ) -> Self {
        AcquireRequest {
            key,
            owner,
            ttl,
            max_holders,
            mode,
            waiter_lease,
            share: ShareMode::Exclusive,
            priority: 0,
            max_hold: None,
            lock_delay: Duration::ZERO,
        }
    }
}

/// What an acquire attempt achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The owner holds the lock.
    Granted {
        /// The fencing token of this grant.
        fencing_token: u64,
        /// The lease now granted: the requested ttl, capped by the grant's max-hold deadline.
        ttl: Duration,
        /// The owner already held the lock: the lease was refreshed and the existing token
        /// returned (idempotent re-acquire by the same owner token).
        already_held: bool,
    },
    /// Enqueued (or still queued) behind others.
    Waiting {
        /// 1-based place in the queue.
        position: u32,
        /// When the earliest current lease runs out, or the lock-delay ends, whichever is
        /// later, if any: the next moment a grant could happen without a release.
        retry_after: Option<Duration>,
    },
    /// Not granted and not enqueued ([`AcquireMode::Try`]).
    Busy {
        /// As in [`AcquireOutcome::Waiting`].
        retry_after: Option<Duration>,
    },
}

/// A live holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    /// The holder's owner token.
    pub owner: String,
    /// The fencing token of its grant.
    pub fencing_token: u64,
    /// Remaining lease by the backend's clock.
    pub expires_in: Duration,
    /// Whether it holds alone or shared.
    pub share: ShareMode,
}

/// A point-in-time view of one lock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockSnapshot {
    /// Live holders, in grant order (ascending fencing token).
    pub holders: Vec<HolderInfo>,
    /// Live waiters' owner tokens, head of the queue first.
    pub waiters: Vec<String>,
    /// The fence counter: the highest token ever issued or the floor it was raised to.
    pub fencing_token: u64,
    /// While a lock-delay after an involuntary end is running: how much of it remains (no
    /// grant until then).
    pub delayed_for: Option<Duration>,
}

/// A lock store. Object safe: the controller picks one at runtime as `Arc<dyn Backend>`.
///
/// Every method that changes state must be one atomic step in the store (a Lua script in
/// Redis, one filtered single-document write in Mongo, one critical section in memory).
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Short name for errors and logs: `memory`, `redis`, `mongo`.
    fn kind(&self) -> &'static str;

    /// One acquire attempt: prune expired holders and dead waiters, then grant, enqueue or
    /// refuse (see the module docs). Re-acquiring with an owner token that already holds the
    /// lock refreshes its lease and returns its existing token.
    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome>;

    /// Compare-and-delete: removes `owner` as holder *and* as waiter, then wakes the waiter(s)
    /// now admitted (up to `max_holders` minus live holders). Returns whether `owner` held a
    /// live lease. Releasing a lease that expired, or that someone else holds, changes nothing
    /// of theirs.
    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool>;

    /// Compare-and-expire: sets `owner`'s lease to `ttl` from now, capped at its max-hold
    /// deadline, if it still holds a live lease, and returns the lease granted. Returns `None`
    /// (and changes nothing) otherwise.
    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>>;

    /// Does `owner` hold a live lease?
    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool>;

    /// Live holders, live waiters and the fence counter.
    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot>;

    /// Raises the fence counter to at least `floor` (used after backend data loss, with the
    /// high-water mark kept elsewhere); the next grant gets a larger token. Returns the counter
    /// afterwards. Never lowers it.
    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64>;

    /// Registers interest in wake-ups naming `owner` on `key`. Once this returns, a release
    /// that names `owner` is guaranteed to reach the subscription (a wake-up that arrives
    /// before [`WakeSubscription::notified`] is awaited is kept). Dropping it unregisters.
    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription>;

    /// Like [`subscribe`](Backend::subscribe), but only if it can be done at once, without a
    /// round trip, with the same guarantee (e.g. the Redis channel is already subscribed for
    /// another local waiter). The engine calls it *before* a waiting attempt; on `Some` it
    /// skips the confirming second attempt that a late subscription needs. The default,
    /// `None`, is always correct.
    fn subscribe_if_live(&self, _key: &str, _owner: &str) -> Option<WakeSubscription> {
        None
    }
}

#[async_trait]
impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        (**self).acquire(request).await
    }
    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        (**self).release(key, owner, max_holders).await
    }
    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        (**self).extend(key, owner, ttl).await
    }
    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        (**self).is_held(key, owner).await
    }
    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        (**self).snapshot(key).await
    }
    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        (**self).raise_fencing_floor(key, floor).await
    }
    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        (**self).subscribe(key, owner).await
    }
    fn subscribe_if_live(&self, key: &str, owner: &str) -> Option<WakeSubscription> {
        (**self).subscribe_if_live(key, owner)
    }
}

/// Rejects an empty or oversized key.
pub fn validate_key(key: &str) -> LockResult<()> {
    validate_length("lock key", key, MAX_KEY_LEN)
}

/// Rejects an empty or oversized owner token, or one with whitespace or control characters
/// (wake-up messages separate owner tokens with newlines).
pub fn validate_owner(owner: &str) -> LockResult<()> {
    validate_length("owner token", owner, MAX_OWNER_LEN)?;
    if owner.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(LockError::invalid(
            "owner token must not contain whitespace or control characters",
        ));
    }
    Ok(())
}

/// Rejects an empty `value`, or one longer than `max_len` bytes; `what` names it.
fn validate_length(what: &str, value: &str, max_len: usize) -> LockResult<()> {
    if value.is_empty() {
        return Err(LockError::invalid(format!("{what} must not be empty")));
    }
    if value.len() > max_len {
        return Err(LockError::invalid(format!(
            "{what} is {} bytes, the limit is {max_len}",
            value.len()
        )));
    }
    Ok(())
}

/// Rejects a lease shorter than a millisecond (the backends' resolution) or longer than
/// [`MAX_TTL`].
pub fn validate_ttl(ttl: Duration) -> LockResult<()> {
    if ttl < Duration::from_millis(1) {
        return Err(LockError::invalid(format!(
            "lease must be at least 1ms, got {ttl:?}"
        )));
    }
    if ttl > MAX_TTL {
        return Err(LockError::invalid(format!(
            "lease must be at most {MAX_TTL:?}, got {ttl:?}"
        )));
    }
    Ok(())
}

/// Rejects `max_holders` of 0 or above [`MAX_HOLDERS`].
pub fn validate_max_holders(max_holders: u32) -> LockResult<()> {
    if max_holders == 0 || max_holders > MAX_HOLDERS {
        return Err(LockError::invalid(format!(
            "max_holders must be between 1 and {MAX_HOLDERS}, got {max_holders}"
        )));
    }
    Ok(())
}

/// Validates every field of an [`AcquireRequest`]; backends call this first.
pub fn validate_request(request: &AcquireRequest<'_>) -> LockResult<()> {
    validate_key(request.key)?;
    validate_owner(request.owner)?;
    validate_ttl(request.ttl)?;
    validate_max_holders(request.max_holders)?;
    if request.mode == AcquireMode::Wait {
        validate_ttl(request.waiter_lease)?;
    }
    if let Some(max_hold) = request.max_hold {
        validate_ttl(max_hold)?;
    }
    validate_lock_delay(request.lock_delay)
}

/// Rejects a lock-delay longer than [`MAX_TTL`] (zero is allowed: no delay).
pub fn validate_lock_delay(lock_delay: Duration) -> LockResult<()> {
    if lock_delay > MAX_TTL {
        return Err(LockError::invalid(format!(
            "lock-delay must be at most {MAX_TTL:?}, got {lock_delay:?}"
        )));
    }
    Ok(())
}

/// Whole milliseconds of a duration, rounded up so a positive duration never becomes 0 (for
/// the stores that take milliseconds: Redis and MongoDB).
#[cfg(any(feature = "redis", feature = "mongo", feature = "etcd"))]
pub(crate) fn ceil_millis(duration: Duration) -> u64 {
    let millis = duration.as_millis();
    let rounded = if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        millis + 1
    } else {
        millis
    };
    u64::try_from(rounded).unwrap_or(u64::MAX)
}
