//! Connection setup and command routing: one server, a Redis Cluster, or a master behind
//! Redis Sentinel, over TLS when the URL asks for it.

use std::sync::{Arc, Once};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{RedisFuture, Value};

use super::error::connect_error;
use super::pubsub::{PubSubSource, WakeChannels};
use super::sentinel::{self, Resolver, SentinelCommands, SentinelTarget};
use super::{RedisBackendConfig, RedisConnectError, BACKEND};
use crate::error::{LockError, LockResult};

/// Reconnect attempts per failed command before it reports the backend unavailable.
const RECONNECT_RETRIES: usize = 2;
/// Cluster: retries of one command on `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` or a lost
/// node connection (with backoff of 20–500 ms between them).
const CLUSTER_RETRIES: u32 = 6;

/// Makes `ring` the process' rustls crypto provider unless one was installed already (redis'
/// rustls has none of its own; without one, the first TLS handshake would panic).
pub(super) fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // An error means another thread installed one first: that one is used.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// One server (or a replica set behind it): a reconnecting multiplexed connection and a
/// dedicated pub/sub connection.
pub(super) async fn connect_single(
    config: &RedisBackendConfig,
) -> LockResult<(Commands, WakeChannels)> {
    let client = config
        .client()
        .map_err(|error| LockError::backend(BACKEND, "open", error))?;
    // Fail fast while the server is down: a lock call should report BackendUnavailable
    // within about a second rather than sit in the client's reconnect backoff.
    let manager_config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(config.response_timeout))
        .set_connection_timeout(Some(config.connect_timeout))
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(200));
    let connection = client
        .get_connection_manager_with_config(manager_config)
        .await
        .map_err(connect_error("connect"))?;
    let wake_channels = WakeChannels::connect(PubSubSource::Server(Box::new(client)))
        .await
        .map_err(connect_error("connect pub/sub"))?;
    Ok((Commands::Single(connection), wake_channels))
}

/// Redis Sentinel: commands and pub/sub on the master the sentinels name, both moved to the
/// new master after a failover, plus a task following `+switch-master`.
pub(super) async fn connect_sentinel(
    config: &RedisBackendConfig,
    target: &SentinelTarget,
) -> LockResult<(Commands, WakeChannels)> {
    let open = |error| LockError::backend(BACKEND, "open", error);
    let certificates = config.tls_certificates().map_err(open)?;
    let resolver = Resolver::new(
        target,
        certificates.clone(),
        config.connect_timeout,
        config.response_timeout,
    )
    .map_err(open)?;
    let sentinels = sentinel::sentinel_clients(target, certificates.as_ref()).map_err(open)?;
    let connection = SentinelCommands::connect(Arc::clone(&resolver))
        .await
        .map_err(connect_error("connect"))?;
    let wake_channels = WakeChannels::connect(PubSubSource::Sentinel(Arc::clone(&resolver)))
        .await
        .map_err(connect_error("connect pub/sub"))?;
    tokio::spawn(sentinel::watch_switches(
        Arc::downgrade(&resolver),
        sentinels,
    ));
    Ok((Commands::Sentinel(connection), wake_channels))
}

/// Redis Cluster: the crate's cluster connection (slot map, `MOVED`/`ASK` followed, each
/// script routed by its first key, hence by the lock's hash tag), plus a second cluster
/// connection speaking RESP3 for the sharded wake-up channels (`SSUBSCRIBE`).
pub(super) async fn connect_cluster(
    config: &RedisBackendConfig,
    nodes: Vec<String>,
) -> LockResult<(Commands, WakeChannels)> {
    let tls = config
        .tls_certificates()
        .map_err(|error| LockError::backend(BACKEND, "open", error))?;
    let builder = |nodes: &[String]| {
        let mut builder = ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.response_timeout)
            // Bounded: while a slot moves, TRYAGAIN and ASK are retried a few times, but a
            // cluster that is down must still fail a call within seconds.
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(20)
            .max_retry_wait(500);
        if let Some(certificates) = tls.clone() {
            builder = builder.certs(certificates);
        }
        builder
    };
    let open = |error| {
        let error = RedisConnectError::InvalidUrl(error);
        LockError::backend(BACKEND, "open", error)
    };
    let client = builder(&nodes).build().map_err(open)?;
    let connection = client
        .get_async_connection()
        .await
        .map_err(connect_error("connect"))?;
    let (pushes, received) = tokio::sync::mpsc::unbounded_channel();
    let pubsub_client = builder(&nodes)
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(pushes)
        .build()
        .map_err(open)?;
    let pubsub = pubsub_client
        .get_async_connection()
        .await
        .map_err(connect_error("connect pub/sub"))?;
    let wake_channels = WakeChannels::connect_cluster(pubsub, received);
    Ok((Commands::Cluster(connection), wake_channels))
}

/// The node URLs of a `redis+cluster://` / `rediss+cluster://` URL (`None` for any other
/// scheme): `redis+cluster://[user:password@]host1:port1,host2:port2[/]` becomes
/// `redis://[user:password@]host1:port1`, … (the credentials apply to every node).
pub(super) fn cluster_nodes(url: &str) -> Result<Option<Vec<String>>, RedisConnectError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    let node_scheme = match scheme.to_ascii_lowercase().as_str() {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return Ok(None),
    };
    let invalid = |detail: &'static str| {
        RedisConnectError::InvalidUrl(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            detail,
        )))
    };
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    if !matches!(path, "" | "/" | "/0") {
        return Err(invalid("a Redis Cluster URL takes no database or options"));
    }
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("{node_scheme}://{userinfo}{host}"))
        .collect();
    if nodes.is_empty() {
        return Err(invalid("a Redis Cluster URL needs at least one host:port"));
    }
    Ok(Some(nodes))
}

/// The command connection: one server, a cluster, or a sentinel-managed master.
#[derive(Clone)]
pub(super) enum Commands {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelCommands),
}

impl ConnectionLike for Commands {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Commands::Single(connection) => connection.req_packed_command(cmd),
            Commands::Cluster(connection) => connection.req_packed_command(cmd),
            Commands::Sentinel(connection) => Box::pin(connection.command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Commands::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Commands::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            Commands::Sentinel(connection) => {
                Box::pin(connection.pipeline(pipeline, offset, count))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Commands::Single(connection) => connection.get_db(),
            Commands::Cluster(connection) => connection.get_db(),
            Commands::Sentinel(connection) => connection.db(),
        }
    }
}
