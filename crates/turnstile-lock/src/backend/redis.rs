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
//! | `P{K}:holders` | ZSET   | owner → lease expiry (server ms)                 | ≥ longest lease + its lock-delay |
//! | `P{K}:tokens`  | HASH   | owner → fencing token                            | same              |
//! | `P{K}:meta`    | HASH   | owner → `mode lock_delay_ms deadline_ms`          | same              |
//! | `P{K}:fence`   | STRING | fence counter                                    | never             |
//! | `P{K}:delay`   | STRING | no grant before this (server ms)                 | until then        |
//! | `P{K}:queue`   | ZSET   | `seq(16 digits)owner` → minus the priority       | ≥ longest heartbeat |
//! | `P{K}:beats`   | ZSET   | owner → waiter heartbeat expiry (server ms)      | same              |
//! | `P{K}:seq`     | STRING | arrival sequence counter                         | same              |
//! | `P{K}:waits`   | HASH   | waiter → `member ttl_ms mode max_hold_ms lock_delay_ms` | same       |
//!
//! A release hands the lock straight to the compatible head of the queue in the same script
//! (token issued there; lease = the waiter's ttl capped by its remaining heartbeat and its
//! max hold) and publishes one
//! line `owner token lease_ms` per hand-off on channel `P{K}:wake`, so the new holder learns
//! it without a round trip. Each [`RedisBackend`] keeps one dedicated pub/sub connection
//! (reconnecting with backoff, then re-subscribing and waking every local waiter to re-poll),
//! subscribed to the channels of keys that have local waiters.
//!
//! # Deployments
//!
//! - `redis://` / `rediss://`: one server (or a fixed address in front of a replica set);
//! - `redis+cluster://` / `rediss+cluster://`: Redis Cluster, each script routed by the lock's
//!   hash tag (module `connection`);
//! - `redis+sentinel://` / `rediss+sentinel://`: a master found through Redis Sentinel and
//!   found again after a failover (module `sentinel`).
//!
//! Replication is asynchronous: a failover may lose the last writes, grants included.
//! [`RedisBackendConfig::min_replica_acks`] makes every grant wait for `WAIT n timeout`
//! before it counts.
//!
//! Fencing tokens and positions travel through Lua numbers (doubles): exact below 2^53.

mod config;
mod connection;
mod error;
mod keys;
mod pubsub;
mod scripts;
mod sentinel;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{FromRedisValue, Script, ScriptInvocation};

pub use self::config::RedisBackendConfig;
use self::config::ReplicaAcks;
use self::connection::{
    cluster_nodes, connect_cluster, connect_sentinel, connect_single, install_crypto_provider,
    Commands,
};
use self::error::connect_error;
pub use self::error::{RedisConnectError, ReplicaAcksMissing};
use self::keys::LockKeys;
use self::pubsub::WakeChannels;
use self::scripts::Scripts;

use super::{
    ceil_millis, validate_key, validate_max_holders, validate_owner, validate_request,
    validate_ttl, AcquireMode, AcquireOutcome, AcquireRequest, Backend, HolderInfo, LockSnapshot,
    ShareMode, WakeSubscription,
};
use crate::error::{LockError, LockResult};

const BACKEND: &str = "redis";

struct Shared {
    connection: Commands,
    replica_acks: Option<ReplicaAcks>,
    /// `PUBLISH`, or `SPUBLISH` (sharded pub/sub) on a cluster.
    publish: &'static str,
    prefix: String,
    scripts: Scripts,
    wake_channels: WakeChannels,
}

/// Locks in Redis (standalone, Cluster or behind Sentinel), shared by every process using the same server and
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
    pub async fn connect(mut config: RedisBackendConfig) -> LockResult<Self> {
        install_crypto_provider();
        let open = |error| LockError::backend(BACKEND, "open", error);
        config.take_url_options().map_err(open)?;
        if let Some(acks) = config.min_replica_acks {
            if acks.timeout >= config.response_timeout {
                return Err(open(RedisConnectError::ReplicaAcksTimeout {
                    acks: acks.timeout,
                    response: config.response_timeout,
                }));
            }
        }
        let sentinel = sentinel::parse(&config.url).map_err(open)?;
        let (mut connection, wake_channels) =
            match (sentinel, cluster_nodes(&config.url).map_err(open)?) {
                (Some(target), _) => connect_sentinel(&config, &target).await?,
                (None, None) => connect_single(&config).await?,
                (None, Some(_)) if config.min_replica_acks.is_some() => {
                    return Err(open(RedisConnectError::ReplicaAcksOnCluster));
                }
                (None, Some(nodes)) => connect_cluster(&config, nodes).await?,
            };
        let scripts = Scripts::new();
        // In a cluster `SCRIPT LOAD` goes to every primary; a node that joins later gets the
        // script from the `EVALSHA` → `NOSCRIPT` → load fallback.
        for script in scripts.all() {
            script
                .prepare_invoke()
                .load_async(&mut connection)
                .await
                .map_err(connect_error("load scripts"))?;
        }
        Ok(RedisBackend {
            shared: Arc::new(Shared {
                publish: match connection {
                    Commands::Single(_) | Commands::Sentinel(_) => "PUBLISH",
                    Commands::Cluster(_) => "SPUBLISH",
                },
                connection,
                replica_acks: config.min_replica_acks,
                prefix: config.key_prefix,
                scripts,
                wake_channels,
            }),
        })
    }

    fn keys(&self, key: &str) -> LockKeys {
        LockKeys::new(&self.shared.prefix, key)
    }

    fn connection(&self) -> Commands {
        self.shared.connection.clone()
    }

    /// Runs `invocation` on the command connection; a failure is `operation`'s.
    async fn run<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        operation: &'static str,
    ) -> LockResult<T> {
        invocation
            .invoke_async(&mut self.connection())
            .await
            .map_err(redis_error(operation))
    }

    /// An invocation of `script` on the lock `keys` (all of them, as every script takes).
    fn script<'a>(script: &'a Script, keys: &LockKeys) -> ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in keys.all() {
            invocation.key(key);
        }
        invocation
    }

    /// The acquire script and `WAIT` in one pipeline (one connection: `WAIT` covers the
    /// writes of the connection it runs on). A grant fewer replicas acknowledged is released.
    async fn acquire_acknowledged(
        &self,
        request: &AcquireRequest<'_>,
        keys: &LockKeys,
        args: &[String],
        acks: ReplicaAcks,
    ) -> LockResult<Vec<i64>> {
        let script = &self.shared.scripts.acquire;
        let mut connection = self.connection();
        let script_keys = keys.all();
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(script.get_hash())
            .arg(script_keys.len())
            .arg(&script_keys[..])
            .arg(args);
        let mut pipeline = redis::pipe();
        pipeline
            .add_command(evalsha)
            .cmd("WAIT")
            .arg(acks.replicas)
            .arg(ceil_millis(acks.timeout));
        let mut result = pipeline
            .query_async::<(Vec<i64>, i64)>(&mut connection)
            .await;
        if matches!(&result, Err(error) if error.code() == Some("NOSCRIPT")) {
            script
                .load_async(&mut connection)
                .await
                .map_err(redis_error("acquire"))?;
            result = pipeline.query_async(&mut connection).await;
        }
        let (reply, acknowledged) = result.map_err(redis_error("acquire"))?;
        if reply.first() == Some(&1) && acknowledged < i64::from(acks.replicas) {
            let released = self
                .release(request.key, request.owner, request.max_holders)
                .await;
            tracing::warn!(
                key = request.key,
                acknowledged,
                wanted = acks.replicas,
                released = released.is_ok(),
                "redis: a grant was not acknowledged by enough replicas; released it"
            );
            return Err(LockError::backend(
                BACKEND,
                "acquire",
                ReplicaAcksMissing {
                    acknowledged,
                    wanted: acks.replicas,
                    timeout: acks.timeout,
                },
            ));
        }
        Ok(reply)
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
        let args = [
            request.owner.to_owned(),
            ceil_millis(request.ttl).to_string(),
            request.max_holders.to_string(),
            mode.to_owned(),
            ceil_millis(request.waiter_lease).max(1).to_string(),
            if request.share.is_exclusive() {
                "x"
            } else {
                "s"
            }
            .to_owned(),
            request.priority.to_string(),
            request
                .max_hold
                .map_or(-1, |max| ceil_millis(max) as i64)
                .to_string(),
            ceil_millis(request.lock_delay).to_string(),
            // With replica acks, a re-acquire by a holder writes, so that its WAIT covers
            // the hand-off that made it one.
            if self.shared.replica_acks.is_some() {
                "1"
            } else {
                "0"
            }
            .to_owned(),
        ];
        let reply: Vec<i64> = match self.shared.replica_acks {
            None => {
                let mut invocation = Self::script(&self.shared.scripts.acquire, &keys);
                for arg in &args {
                    invocation.arg(arg);
                }
                self.run(&invocation, "acquire").await?
            }
            Some(acks) => {
                self.acquire_acknowledged(request, &keys, &args, acks)
                    .await?
            }
        };
        match reply.as_slice() {
            [1, token, already_held, lease] => Ok(AcquireOutcome::Granted {
                fencing_token: u64::try_from(*token).map_err(|_| malformed("acquire", token))?,
                ttl: millis_from_reply(*lease).ok_or_else(|| malformed("acquire", lease))?,
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
        // With replica acks a hand-off is only a wake-up: the waiter's own acquire confirms it
        // (and waits for the replicas).
        let announce = if self.shared.replica_acks.is_some() {
            "wake"
        } else {
            "handoff"
        };
        let mut release = Self::script(&self.shared.scripts.release, &keys);
        release
            .arg(owner)
            .arg(max_holders)
            .arg(&keys.channel)
            .arg(self.shared.publish)
            .arg(announce);
        let removed: i64 = self.run(&release, "release").await?;
        Ok(removed == 1)
    }

    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_ttl(ttl)?;
        let keys = self.keys(key);
        let mut extend = Self::script(&self.shared.scripts.extend, &keys);
        extend.arg(owner).arg(ceil_millis(ttl));
        let lease: i64 = self.run(&extend, "extend").await?;
        Ok(millis_from_reply(lease))
    }

    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        validate_key(key)?;
        validate_owner(owner)?;
        let keys = self.keys(key);
        let mut is_held = Self::script(&self.shared.scripts.is_held, &keys);
        is_held.arg(owner);
        let held: i64 = self.run(&is_held, "is_held").await?;
        Ok(held == 1)
    }

    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        validate_key(key)?;
        let keys = self.keys(key);
        let snapshot = Self::script(&self.shared.scripts.snapshot, &keys);
        let (flat_holders, waiters, fence, delayed): (Vec<String>, Vec<String>, String, String) =
            self.run(&snapshot, "snapshot").await?;
        let mut holders = Vec::with_capacity(flat_holders.len() / 4);
        for quad in flat_holders.chunks(4) {
            let [owner, token, remaining, mode] = quad else {
                return Err(malformed("snapshot", "holder record"));
            };
            holders.push(HolderInfo {
                owner: owner.clone(),
                fencing_token: token.parse().map_err(|_| malformed("snapshot", token))?,
                expires_in: Duration::from_millis(
                    remaining
                        .parse()
                        .map_err(|_| malformed("snapshot", remaining))?,
                ),
                share: if mode == "s" {
                    ShareMode::Shared
                } else {
                    ShareMode::Exclusive
                },
            });
        }
        holders.sort_by_key(|holder| holder.fencing_token);
        Ok(LockSnapshot {
            holders,
            waiters,
            fencing_token: fence.parse().map_err(|_| malformed("snapshot", &fence))?,
            delayed_for: match delayed.parse::<u64>() {
                Ok(0) => None,
                Ok(millis) => Some(Duration::from_millis(millis)),
                Err(_) => return Err(malformed("snapshot", &delayed)),
            },
        })
    }

    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        validate_key(key)?;
        let keys = self.keys(key);
        let mut raise_floor = Self::script(&self.shared.scripts.raise_floor, &keys);
        raise_floor.arg(floor);
        let counter: String = self.run(&raise_floor, "raise_fencing_floor").await?;
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
