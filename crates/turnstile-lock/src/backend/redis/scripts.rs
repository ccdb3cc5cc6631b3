//! The Lua scripts of the Redis backend: every state change of a lock is one of them.
//!
//! Per-entry records are space-separated strings:
//! - `meta` (holder → `mode lock_delay_ms deadline_ms`): mode `x` (exclusive) or `s`
//!   (shared); deadline `-1` without a max hold;
//! - `waits` (waiter → `member ttl_ms mode max_hold_ms lock_delay_ms`): `member` is the
//!   waiter's `queue` member, its arrival sequence zero-padded to 16 digits then the owner
//!   token, so members of one score (= minus the priority) sort first come first served;
//!   max hold `-1` for none.

use redis::Script;

/// Helpers shared by every script. Scripts touch as few keys as the common case needs:
/// every `redis.call` costs server time on the path every lock operation takes.
///
/// Every script is passed all of the lock's keys in one order (`LockKeys::all`) and reads
/// them by name from here, so that a name means the same key in each script.
const PRELUDE: &str = r#"
local holders, tokens, fence, queue, beats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local seq, waits, meta, delay = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
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
local function words(s)
  local out = {}
  for w in string.gmatch(s or '', '%S+') do out[#out + 1] = w end
  return out
end
-- Makes sure `key` lives at least `ms` more (never shortens its life).
local function keep_alive(key, ms)
  local ttl = redis.call('PTTL', key)
  if ttl == -1 or (ttl >= 0 and ttl < ms) then
    redis.call('PEXPIRE', key, ms)
  end
end
-- Drops holders whose lease ran out: each ended involuntarily, so its lock-delay (from its
-- lease end) is folded into the `delay` key (value: no grant before this server ms).
local function prune_holders(holders, tokens, meta, delay, now)
  local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now, 'WITHSCORES')
  if #expired == 0 then return end
  local owners, until_ms = {}, 0
  for i = 1, #expired, 2 do
    owners[#owners + 1] = expired[i]
    local d = tonumber(words(redis.call('HGET', meta, expired[i]))[2] or '0')
    if d > 0 then until_ms = math.max(until_ms, tonumber(expired[i + 1]) + d) end
  end
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  call_chunked('HDEL', tokens, owners)
  call_chunked('HDEL', meta, owners)
  if until_ms > now and until_ms > tonumber(redis.call('GET', delay) or '0') then
    redis.call('SET', delay, until_ms, 'PX', until_ms - now)
  end
end
-- Milliseconds of lock-delay left (0: none).
local function delay_left(delay, now)
  return math.max(tonumber(redis.call('GET', delay) or '0') - now, 0)
end
-- Does one of the `count` live holders hold exclusively (a holder without a record counts)?
local function held_exclusive(meta, count)
  if count == 0 then return false end
  local records = redis.call('HVALS', meta)
  if #records < count then return true end
  for _, record in ipairs(records) do
    if string.sub(record, 1, 1) == 'x' then return true end
  end
  return false
end
-- Drops waiters whose heartbeat ran out.
local function prune_waiters(queue, beats, waits, now)
  local dead = redis.call('ZRANGEBYSCORE', beats, '-inf', now)
  if #dead == 0 then return end
  local members = {}
  for _, owner in ipairs(dead) do
    local member = words(redis.call('HGET', waits, owner))[1]
    if member then members[#members + 1] = member end
  end
  redis.call('ZREMRANGEBYSCORE', beats, '-inf', now)
  call_chunked('ZREM', queue, members)
  call_chunked('HDEL', waits, dead)
end
-- Takes `owner` out of the queue.
local function dequeue(queue, beats, waits, owner)
  local member = words(redis.call('HGET', waits, owner))[1]
  if member then redis.call('ZREM', queue, member) end
  redis.call('ZREM', beats, owner)
  redis.call('HDEL', waits, owner)
end
-- Records a grant (token issued here). The lease is the ttl capped by the max hold; the
-- keys outlive it by the lock-delay, so the prune that notices its end still sees it.
-- Returns token, lease.
local function grant(holders, tokens, fence, meta, owner, ttl, mode, max_hold, lock_delay, now, alone)
  local lease, deadline = ttl, -1
  if max_hold > 0 then
    lease = math.min(ttl, max_hold)
    deadline = now + max_hold
  end
  local token = redis.call('INCR', fence)
  redis.call('ZADD', holders, now + lease, owner)
  redis.call('HSET', tokens, owner, token)
  redis.call('HSET', meta, owner, mode .. ' ' .. lock_delay .. ' ' .. deadline)
  for _, key in ipairs({holders, tokens, meta}) do
    if alone then
      redis.call('PEXPIRE', key, lease + lock_delay)
    else
      keep_alive(key, lease + lock_delay)
    end
  end
  return token, lease
end
-- Refreshes a live holder's lease to `ttl`, capped at its max-hold deadline. Returns it.
local function refresh(holders, tokens, meta, owner, ttl, now)
  local record = words(redis.call('HGET', meta, owner))
  local lease = ttl
  local deadline = tonumber(record[3] or '-1')
  if deadline >= 0 then lease = math.min(ttl, deadline - now) end
  redis.call('ZADD', holders, 'XX', now + lease, owner)
  local keep = lease + tonumber(record[2] or '0')
  keep_alive(holders, keep)
  keep_alive(tokens, keep)
  keep_alive(meta, keep)
  return lease
end
"#;

/// ARGV: owner ttl_ms max_holders mode(wait|try) waiter_lease_ms share(x|s) priority
/// max_hold_ms(-1: none) lock_delay_ms acked(1: a holder's re-acquire writes its token again,
/// so that the caller's `WAIT` covers the hand-off that made it a holder).
/// Returns {1, token, already_held, lease_ms} | {0, retry_after_ms} |
/// {2, position, retry_after_ms} (retry_after_ms = -1 when nothing but a release can help).
const ACQUIRE: &str = r#"
local owner, ttl, max_holders = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local share, priority = ARGV[6], tonumber(ARGV[7])
local max_hold, lock_delay = tonumber(ARGV[8]), tonumber(ARGV[9])
local now = now_ms()
prune_holders(holders, tokens, meta, delay, now)
local held = redis.call('ZCARD', holders)
if held > 0 and redis.call('ZSCORE', holders, owner) then
  local lease = refresh(holders, tokens, meta, owner, ttl, now)
  local token = redis.call('HGET', tokens, owner) or '0'
  if ARGV[10] == '1' then
    redis.call('HSET', tokens, owner, token)
  end
  return {1, tonumber(token), 1, lease}
end
local member = false
local ahead = 0
if redis.call('EXISTS', queue) == 1 then
  prune_waiters(queue, beats, waits, now)
  member = words(redis.call('HGET', waits, owner))[1] or false
  if member then
    ahead = redis.call('ZRANK', queue, member)
  else
    -- Judged at the place it would join: after every waiter of its priority or higher.
    ahead = redis.call('ZCOUNT', queue, '-inf', -priority)
  end
end
local delayed = delay_left(delay, now)
local total = held + ahead + 1
local granted = delayed == 0 and total <= max_holders
if granted and total > 1 then
  granted = share == 's' and not held_exclusive(meta, held)
  if granted and ahead > 0 then
    for _, m in ipairs(redis.call('ZRANGE', queue, 0, ahead - 1)) do
      if words(redis.call('HGET', waits, string.sub(m, 17)))[3] ~= 's' then
        granted = false
        break
      end
    end
  end
end
if granted then
  local token, lease = grant(holders, tokens, fence, meta, owner, ttl, share,
    max_hold, lock_delay, now, held == 0)
  if member then
    dequeue(queue, beats, waits, owner)
  end
  return {1, token, 0, lease}
end
local retry_after = -1
local earliest = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
if #earliest > 0 then
  retry_after = math.max(tonumber(earliest[2]) - now, 0)
end
if delayed > 0 then
  retry_after = math.max(retry_after, delayed)
end
if ARGV[4] ~= 'wait' then
  return {0, retry_after}
end
local lease = tonumber(ARGV[5])
if not member then
  member = string.format('%016d', redis.call('INCR', seq)) .. owner
  redis.call('ZADD', queue, -priority, member)
end
redis.call('ZADD', beats, now + lease, owner)
redis.call('HSET', waits, owner,
  member .. ' ' .. ttl .. ' ' .. share .. ' ' .. max_hold .. ' ' .. lock_delay)
for _, key in ipairs({queue, beats, seq, waits}) do
  keep_alive(key, lease)
end
return {2, redis.call('ZRANK', queue, member) + 1, retry_after}
"#;

/// ARGV: owner max_holders channel
/// publish (`PUBLISH`, or `SPUBLISH` on a cluster: the channel shares the lock's hash tag,
/// so the message stays on the lock's shard) announce (`handoff`: lines `owner token lease`;
/// `wake`: bare owners, who confirm with an acquire of their own).
/// Returns 1 if `owner` held a live lease (a voluntary end: no lock-delay). Then, unless a
/// lock-delay runs, hands the lock to the compatible head of the queue (lease = min(its ttl,
/// its remaining heartbeat, its max hold), token issued here) and publishes one line
/// `owner token lease_ms` per hand-off.
const RELEASE: &str = r#"
local owner, max_holders = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local held = 0
local expiry = redis.call('ZSCORE', holders, owner)
if expiry and tonumber(expiry) > now then
  redis.call('ZREM', holders, owner)
  redis.call('HDEL', tokens, owner)
  redis.call('HDEL', meta, owner)
  held = 1
end
prune_holders(holders, tokens, meta, delay, now)
if redis.call('EXISTS', queue) == 1 then
  dequeue(queue, beats, waits, owner)
  prune_waiters(queue, beats, waits, now)
  local count = redis.call('ZCARD', holders)
  local free = max_holders - count
  if free > 0 and delay_left(delay, now) == 0 then
    local exclusive = held_exclusive(meta, count)
    local lines = {}
    for _, m in ipairs(redis.call('ZRANGE', queue, 0, free - 1)) do
      local next = string.sub(m, 17)
      local w = words(redis.call('HGET', waits, next))
      local mode = w[3] or 'x'
      if mode == 'x' and count > 0 then break end
      if mode == 's' and (exclusive or count >= max_holders) then break end
      local beat = tonumber(redis.call('ZSCORE', beats, next) or '0')
      local ttl = math.min(tonumber(w[2] or '0'), beat - now)
      dequeue(queue, beats, waits, next)
      if ttl > 0 then
        local token, lease = grant(holders, tokens, fence, meta, next, ttl, mode,
          tonumber(w[4] or '-1'), tonumber(w[5] or '0'), now, false)
        if ARGV[5] == 'wake' then
          lines[#lines + 1] = next
        else
          lines[#lines + 1] = next .. ' ' .. token .. ' ' .. lease
        end
        count = count + 1
        exclusive = exclusive or mode == 'x'
      end
    end
    if #lines > 0 then
      redis.call(ARGV[4], ARGV[3], table.concat(lines, '\n'))
    end
  end
end
return held
"#;

/// ARGV: owner ttl_ms. Returns the lease granted (ms, capped at
/// the max-hold deadline), or -1 if `owner` holds no live lease.
const EXTEND: &str = r#"
local owner = ARGV[1]
local now = now_ms()
local expiry = redis.call('ZSCORE', holders, owner)
if not expiry or tonumber(expiry) <= now then
  return -1
end
return refresh(holders, tokens, meta, owner, tonumber(ARGV[2]), now)
"#;

/// ARGV: owner. Returns 1 if `owner` holds a live lease.
const IS_HELD: &str = r#"
local expiry = redis.call('ZSCORE', holders, ARGV[1])
if expiry and tonumber(expiry) > now_ms() then
  return 1
end
return 0
"#;

/// Returns {{owner, token, remaining_ms, mode, ...}, {live waiters in order}, fence,
/// delay_left_ms}.
const SNAPSHOT: &str = r#"
local now = now_ms()
local live = redis.call('ZRANGEBYSCORE', holders, '(' .. now, '+inf', 'WITHSCORES')
local records = {}
for i = 1, #live, 2 do
  records[#records + 1] = live[i]
  records[#records + 1] = redis.call('HGET', tokens, live[i]) or '0'
  records[#records + 1] = tostring(tonumber(live[i + 1]) - now)
  records[#records + 1] = string.sub(redis.call('HGET', meta, live[i]) or 'x', 1, 1)
end
local waiters = {}
for _, m in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  local owner = string.sub(m, 17)
  local beat = redis.call('ZSCORE', beats, owner)
  if beat and tonumber(beat) > now then
    waiters[#waiters + 1] = owner
  end
end
-- A lease that ran out but was not pruned yet starts its lock-delay all the same.
local delayed = delay_left(delay, now)
local ended = redis.call('ZRANGEBYSCORE', holders, '-inf', now, 'WITHSCORES')
for i = 1, #ended, 2 do
  local d = tonumber(words(redis.call('HGET', meta, ended[i]))[2] or '0')
  if d > 0 then delayed = math.max(delayed, tonumber(ended[i + 1]) + d - now) end
end
return {records, waiters, redis.call('GET', fence) or '0', tostring(delayed)}
"#;

/// ARGV: floor. Returns the counter afterwards (as a string, exact).
const RAISE_FLOOR: &str = r#"
local current = tonumber(redis.call('GET', fence) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', fence, ARGV[1])
end
return redis.call('GET', fence) or '0'
"#;

/// The loaded scripts.
pub(super) struct Scripts {
    pub acquire: Script,
    pub release: Script,
    pub extend: Script,
    pub is_held: Script,
    pub snapshot: Script,
    pub raise_floor: Script,
}

impl Scripts {
    pub fn new() -> Self {
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

    pub fn all(&self) -> [&Script; 6] {
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
