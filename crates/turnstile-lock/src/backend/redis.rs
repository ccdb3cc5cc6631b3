//! Redis backend: every state change is one Lua script, expiry by the server's `TIME`,
//! targeted wake-ups over pub/sub.
//!
//! # Keys of lock `K` (prefix `P`, default `turnstile:`)
//!
//! All share the hash tag `{K}` (with `{`, `}` and `%` in `K` percent-encoded so the tag can't
//! be cut short), so one lock lives in one Redis Cluster slot and scripts may touch them all.
//!
//! | key            | type   | content                                          | expiry            |
//! |----------------|--------|--------------------------------------------------|-------------------|
//! | `P{K}:holders` | ZSET   | owner → lease expiry (server ms)                 | ≥ longest lease   |
//! | `P{K}:tokens`  | HASH   | owner → fencing token                            | same              |
//! | `P{K}:fence`   | STRING | fence counter                                    | never             |
//! | `P{K}:queue`   | ZSET   | owner → arrival sequence                         | ≥ longest heartbeat |
//! | `P{K}:beats`   | ZSET   | owner → waiter heartbeat expiry (server ms)      | same              |
//! | `P{K}:seq`     | STRING | arrival sequence counter                         | same              |
//! | `P{K}:ttls`    | HASH   | waiter → the lease it asked for                  | same              |
//!
//! A release hands free slots straight to the head of the queue in the same script (token
//! issued there; lease = the waiter's ttl capped by its remaining heartbeat) and publishes one
//! line `owner token lease_ms` per hand-off on channel `P{K}:wake`, so the new holder learns
//! it without a round trip. Each [`RedisBackend`] keeps one dedicated pub/sub connection
//! (reconnecting with backoff, then re-subscribing and waking every local waiter to re-poll),
//! subscribed to the channels of keys that have local waiters.
//!
//! Fencing tokens and positions travel through Lua numbers (doubles): exact below 2^53.

mod pubsub;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use self::pubsub::WakeChannels;

use super::{
    ceil_millis, validate_key, validate_max_holders, validate_owner, validate_request,
    validate_ttl, AcquireMode, AcquireOutcome, AcquireRequest, Backend, HolderInfo, LockSnapshot,
    WakeSubscription,
};
use crate::error::{LockError, LockResult};

const BACKEND: &str = "redis";
/// Reconnect attempts per failed command before it reports the backend unavailable.
const RECONNECT_RETRIES: usize = 2;

/// Helpers shared by every script. Scripts touch as few keys as the common case needs:
/// every `redis.call` costs server time on the path every lock operation takes.
const PRELUDE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Runs `cmd key members...` in chunks (Lua's unpack has a small stack limit).
local function call_chunked(cmd, key, list)
  local i = 1
  while i <= #list do
    local last = math.min(i + 999, #list)
    redis.call(cmd, key, unpack(list, i, last))
    i = last + 1
  end
end
-- Drops holders whose lease ran out.
local function prune_holders(holders, tokens, now)
  local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
    call_chunked('HDEL', tokens, expired)
  end
end
-- Drops waiters whose heartbeat ran out.
local function prune_waiters(queue, beats, ttls, now)
  local dead = redis.call('ZRANGEBYSCORE', beats, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', beats, '-inf', now)
    call_chunked('ZREM', queue, dead)
    call_chunked('HDEL', ttls, dead)
  end
end
-- Takes `owner` out of the queue.
local function dequeue(queue, beats, ttls, owner)
  redis.call('ZREM', queue, owner)
  redis.call('ZREM', beats, owner)
  redis.call('HDEL', ttls, owner)
end
-- Makes sure `key` lives at least `ms` more (never shortens its life).
local function keep_alive(key, ms)
  local ttl = redis.call('PTTL', key)
  if ttl == -1 or (ttl >= 0 and ttl < ms) then
    redis.call('PEXPIRE', key, ms)
  end
end
"#;

/// KEYS: holders tokens fence queue beats seq ttls.
/// ARGV: owner ttl_ms max_holders mode(wait|try) waiter_lease_ms.
/// Returns {1, token, already_held} | {0, retry_after_ms} | {2, position, retry_after_ms}
/// (retry_after_ms = -1 when nobody holds the lock).
const ACQUIRE: &str = r#"
local owner, ttl, max_holders = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
prune_holders(KEYS[1], KEYS[2], now)
local held = redis.call('ZCARD', KEYS[1])
if held > 0 and redis.call('ZSCORE', KEYS[1], owner) then
  redis.call('ZADD', KEYS[1], now + ttl, owner)
  keep_alive(KEYS[1], ttl)
  keep_alive(KEYS[2], ttl)
  return {1, tonumber(redis.call('HGET', KEYS[2], owner) or '0'), 1}
end
local rank = false
local queued = 0
if redis.call('EXISTS', KEYS[4]) == 1 then
  prune_waiters(KEYS[4], KEYS[5], KEYS[7], now)
  rank = redis.call('ZRANK', KEYS[4], owner)
  queued = redis.call('ZCARD', KEYS[4])
end
local ahead = rank or queued
if ahead < max_holders - held then
  local token = redis.call('INCR', KEYS[3])
  redis.call('ZADD', KEYS[1], now + ttl, owner)
  redis.call('HSET', KEYS[2], owner, token)
  if held == 0 then
    -- The only live holder: the keys live exactly as long as this lease.
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
  else
    keep_alive(KEYS[1], ttl)
    keep_alive(KEYS[2], ttl)
  end
  if rank then
    dequeue(KEYS[4], KEYS[5], KEYS[7], owner)
  end
  return {1, token, 0}
end
local retry_after = -1
local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #earliest > 0 then
  retry_after = math.max(tonumber(earliest[2]) - now, 0)
end
if ARGV[4] ~= 'wait' then
  return {0, retry_after}
end
local lease = tonumber(ARGV[5])
if not rank then
  redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[6]), owner)
  rank = queued
end
redis.call('ZADD', KEYS[5], now + lease, owner)
redis.call('HSET', KEYS[7], owner, ttl)
keep_alive(KEYS[4], lease)
keep_alive(KEYS[5], lease)
keep_alive(KEYS[6], lease)
keep_alive(KEYS[7], lease)
return {2, rank + 1, retry_after}
"#;

/// KEYS: holders tokens fence queue beats ttls. ARGV: owner max_holders channel.
/// Returns 1 if `owner` held a live lease. Then hands the free slots to the head of the
/// queue (lease = min(its ttl, its remaining heartbeat), token issued here) and publishes one
/// line `owner token lease_ms` per hand-off.
const RELEASE: &str = r#"
local owner = ARGV[1]
local now = now_ms()
local held = 0
local expiry = redis.call('ZSCORE', KEYS[1], owner)
if expiry then
  redis.call('ZREM', KEYS[1], owner)
  redis.call('HDEL', KEYS[2], owner)
  if tonumber(expiry) > now then
    held = 1
  end
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  dequeue(KEYS[4], KEYS[5], KEYS[6], owner)
  prune_waiters(KEYS[4], KEYS[5], KEYS[6], now)
  local free = tonumber(ARGV[2]) - redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  if free > 0 then
    local lines = {}
    for _, next in ipairs(redis.call('ZRANGE', KEYS[4], 0, free - 1)) do
      local beat = tonumber(redis.call('ZSCORE', KEYS[5], next) or '0')
      local ttl = tonumber(redis.call('HGET', KEYS[6], next) or '0')
      local lease = math.min(ttl, beat - now)
      dequeue(KEYS[4], KEYS[5], KEYS[6], next)
      if lease > 0 then
        local token = redis.call('INCR', KEYS[3])
        redis.call('ZADD', KEYS[1], now + lease, next)
        redis.call('HSET', KEYS[2], next, token)
        keep_alive(KEYS[1], lease)
        keep_alive(KEYS[2], lease)
        lines[#lines + 1] = next .. ' ' .. token .. ' ' .. lease
      end
    end
    if #lines > 0 then
      redis.call('PUBLISH', ARGV[3], table.concat(lines, '\n'))
    end
  end
end
return held
"#;

/// KEYS: holders tokens. ARGV: owner ttl_ms. Returns 1 if the live lease was extended.
const EXTEND: &str = r#"
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local expiry = redis.call('ZSCORE', KEYS[1], owner)
if not expiry or tonumber(expiry) <= now then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + ttl, owner)
keep_alive(KEYS[1], ttl)
keep_alive(KEYS[2], ttl)
return 1
"#;

/// KEYS: holders. ARGV: owner. Returns 1 if `owner` holds a live lease.
const IS_HELD: &str = r#"
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expiry and tonumber(expiry) > now_ms() then
  return 1
end
return 0
"#;

/// KEYS: holders tokens fence queue beats.
/// Returns {{owner, token, remaining_ms, ...}, {live waiters in order}, fence}.
const SNAPSHOT: &str = r#"
local now = now_ms()
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local holders = {}
for i = 1, #live, 2 do
  holders[#holders + 1] = live[i]
  holders[#holders + 1] = redis.call('HGET', KEYS[2], live[i]) or '0'
  holders[#holders + 1] = tostring(tonumber(live[i + 1]) - now)
end
local waiters = {}
for _, owner in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  local beat = redis.call('ZSCORE', KEYS[5], owner)
  if beat and tonumber(beat) > now then
    waiters[#waiters + 1] = owner
  end
end
return {holders, waiters, redis.call('GET', KEYS[3]) or '0'}
"#;

/// KEYS: fence. ARGV: floor. Returns the counter afterwards (as a string, exact).
const RAISE_FLOOR: &str = r#"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return redis.call('GET', KEYS[1]) or '0'
"#;

struct Scripts {
    acquire: Script,
    release: Script,
    extend: Script,
    is_held: Script,
    snapshot: Script,
    raise_floor: Script,
}

impl Scripts {
    fn new() -> Self {
        let build = |body: &str| Script::new(&format!("{PRELUDE}\n{body}"));
        Scripts {
            acquire: build(ACQUIRE),
            release: build(RELEASE),
            extend: build(EXTEND),
            is_held: build(IS_HELD),
            snapshot: build(SNAPSHOT),
            raise_floor: build(RAISE_FLOOR),
        }
    }

    fn all(&self) -> [&Script; 6] {
        [
            &self.acquire,
            &self.release,
            &self.extend,
            &self.is_held,
            &self.snapshot,
            &self.raise_floor,
        ]
    }
}

/// Connection settings of a [`RedisBackend`].
#[derive(Debug, Clone)]
pub struct RedisBackendConfig {
    url: String,
    key_prefix: String,
    response_timeout: Duration,
    connect_timeout: Duration,
}

impl RedisBackendConfig {
    /// Settings for `url` (`redis://host:port/db`), key prefix `turnstile:`, response
    /// timeout 5 s, connect timeout 1 s.
    pub fn new(url: impl Into<String>) -> Self {
        RedisBackendConfig {
            url: url.into(),
            key_prefix: "turnstile:".to_owned(),
            response_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
        }
    }

    /// How long one connection attempt may take (a few are made before a command fails).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Prefix of every key and channel (lets several applications share one Redis).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// How long a command may take before it fails as [`LockError::BackendUnavailable`].
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }
}

/// The Redis names of one lock.
struct LockKeys {
    holders: String,
    tokens: String,
    fence: String,
    queue: String,
    beats: String,
    seq: String,
    ttls: String,
    channel: String,
}

impl LockKeys {
    fn new(prefix: &str, key: &str) -> Self {
        let mut tag = String::with_capacity(key.len() + 2);
        for c in key.chars() {
            match c {
                '%' => tag.push_str("%25"),
                '{' => tag.push_str("%7B"),
                '}' => tag.push_str("%7D"),
                other => tag.push(other),
            }
        }
        let name = |suffix: &str| format!("{prefix}{{{tag}}}:{suffix}");
        LockKeys {
            holders: name("holders"),
            tokens: name("tokens"),
            fence: name("fence"),
            queue: name("queue"),
            beats: name("beats"),
            seq: name("seq"),
            ttls: name("ttls"),
            channel: name("wake"),
        }
    }
}

struct Shared {
    connection: ConnectionManager,
    prefix: String,
    scripts: Scripts,
    wake_channels: WakeChannels,
}

/// Locks in Redis (standalone or Cluster), shared by every process using the same server and
/// key prefix. Cloning shares the connections.
#[derive(Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.shared.prefix)
            .finish_non_exhaustive()
    }
}

fn redis_error(operation: &'static str) -> impl FnOnce(redis::RedisError) -> LockError {
    move |error| LockError::backend(BACKEND, operation, error)
}

fn malformed(operation: &str, detail: impl std::fmt::Display) -> LockError {
    LockError::backend(
        BACKEND,
        operation.to_owned(),
        format!("unexpected script reply: {detail}"),
    )
}

impl RedisBackend {
    /// Connects the command connection and the pub/sub connection and loads the scripts.
    /// Must be called inside a tokio runtime (it spawns the pub/sub listener).
    pub async fn connect(config: RedisBackendConfig) -> LockResult<Self> {
        let client = redis::Client::open(config.url.as_str()).map_err(redis_error("open"))?;
        // Fail fast while the server is down: a lock call should report BackendUnavailable
        // within about a second rather than sit in the client's reconnect backoff.
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout))
            .set_connection_timeout(Some(config.connect_timeout))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(200));
        let mut connection = client
            .get_connection_manager_with_config(manager_config)
            .await
            .map_err(redis_error("connect"))?;
        let scripts = Scripts::new();
        for script in scripts.all() {
            script
                .prepare_invoke()
                .load_async(&mut connection)
                .await
                .map_err(redis_error("load scripts"))?;
        }
        let wake_channels = WakeChannels::connect(client)
            .await
            .map_err(redis_error("connect pub/sub"))?;
        Ok(RedisBackend {
            shared: Arc::new(Shared {
                connection,
                prefix: config.key_prefix,
                scripts,
                wake_channels,
            }),
        })
    }

    fn keys(&self, key: &str) -> LockKeys {
        LockKeys::new(&self.shared.prefix, key)
    }

    fn connection(&self) -> ConnectionManager {
        self.shared.connection.clone()
    }
}

fn millis_from_reply(value: i64) -> Option<Duration> {
    u64::try_from(value).ok().map(Duration::from_millis)
}

#[async_trait]
impl Backend for RedisBackend {
    fn kind(&self) -> &'static str {
        BACKEND
    }

    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        validate_request(request)?;
        let keys = self.keys(request.key);
        let mode = match request.mode {
            AcquireMode::Wait => "wait",
            AcquireMode::Try => "try",
        };
        let reply: Vec<i64> = self
            .shared
            .scripts
            .acquire
            .key(&keys.holders)
            .key(&keys.tokens)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.beats)
            .key(&keys.seq)
            .key(&keys.ttls)
            .arg(request.owner)
            .arg(ceil_millis(request.ttl))
            .arg(request.max_holders)
            .arg(mode)
            .arg(ceil_millis(request.waiter_lease).max(1))
            .invoke_async(&mut self.connection())
            .await
            .map_err(redis_error("acquire"))?;
        match reply.as_slice() {
            [1, token, already_held] => Ok(AcquireOutcome::Granted {
                fencing_token: u64::try_from(*token).map_err(|_| malformed("acquire", token))?,
                ttl: request.ttl,
                already_held: *already_held == 1,
            }),
            [0, retry_after] => Ok(AcquireOutcome::Busy {
                retry_after: millis_from_reply(*retry_after),
            }),
            [2, position, retry_after] => Ok(AcquireOutcome::Waiting {
                position: u32::try_from(*position).unwrap_or(u32::MAX),
                retry_after: millis_from_reply(*retry_after),
            }),
            other => Err(malformed("acquire", format!("{other:?}"))),
        }
    }

    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_max_holders(max_holders)?;
        let keys = self.keys(key);
        let removed: i64 = self
            .shared
            .scripts
            .release
            .key(&keys.holders)
            .key(&keys.tokens)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.beats)
            .key(&keys.ttls)
            .arg(owner)
            .arg(max_holders)
            .arg(&keys.channel)
            .invoke_async(&mut self.connection())
            .await
            .map_err(redis_error("release"))?;
        Ok(removed == 1)
    }

    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_ttl(ttl)?;
        let keys = self.keys(key);
        let extended: i64 = self
            .shared
            .scripts
            .extend
            .key(&keys.holders)
            .key(&keys.tokens)
            .arg(owner)
            .arg(ceil_millis(ttl))
            .invoke_async(&mut self.connection())
            .await
            .map_err(redis_error("extend"))?;
        Ok(extended == 1)
    }

    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        let keys = self.keys(key);
        let held: i64 = self
            .shared
            .scripts
            .is_held
            .key(&keys.holders)
            .arg(owner)
            .invoke_async(&mut self.connection())
            .await
            .map_err(redis_error("is_held"))?;
        Ok(held == 1)
    }

    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        validate_key(key)?;
        let keys = self.keys(key);
        let (flat_holders, waiters, fence): (Vec<String>, Vec<String>, String) = self
            .shared
            .scripts
            .snapshot
            .key(&keys.holders)
            .key(&keys.tokens)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.beats)
            .invoke_async(&mut self.connection())
            .await
            .map_err(redis_error("snapshot"))?;
        let mut holders = Vec::with_capacity(flat_holders.len() / 3);
        for triple in flat_holders.chunks(3) {
            let [owner, token, remaining] = triple else {
                return Err(malformed("snapshot", "holder triple"));
            };
            holders.push(HolderInfo {
                owner: owner.clone(),
                fencing_token: token.parse().map_err(|_| malformed("snapshot", token))?,
                expires_in: Duration::from_millis(
                    remaining
                        .parse()
                        .map_err(|_| malformed("snapshot", remaining))?,
                ),
            });
        }
        holders.sort_by_key(|holder| holder.fencing_token);
        Ok(LockSnapshot {
            holders,
            waiters,
            fencing_token: fence.parse().map_err(|_| malformed("snapshot", &fence))?,
        })
    }

    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        validate_key(key)?;
        let keys = self.keys(key);
        let counter: String = self
            .shared
            .scripts
            .raise_floor
            .key(&keys.fence)
            .arg(floor)
            .invoke_async(&mut self.connection())
            .await
            .map_err(redis_error("raise_fencing_floor"))?;
        counter
            .parse()
            .map_err(|_| malformed("raise_fencing_floor", &counter))
    }

    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        validate_key(key)?;
        validate_owner(owner)?;
        let channel = self.keys(key).channel;
        let subscription = self.shared.wake_channels.subscribe(&channel, owner).await;
        Ok(subscription)
    }

    fn subscribe_if_live(&self, key: &str, owner: &str) -> Option<WakeSubscription> {
        if validate_key(key).is_err() || validate_owner(owner).is_err() {
            return None;
        }
        let channel = self.keys(key).channel;
        self.shared.wake_channels.subscribe_if_live(&channel, owner)
    }
}
