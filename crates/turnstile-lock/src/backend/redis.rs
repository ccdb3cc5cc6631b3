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
//! - `redis+cluster://` / `rediss+cluster://`: Redis Cluster, see [`connect_cluster`];
//! - `redis+sentinel://` / `rediss+sentinel://`: a master found through Redis Sentinel and
//!   found again after a failover (module `sentinel`).
//!
//! Replication is asynchronous: a failover may lose the last writes, grants included.
//! [`RedisBackendConfig::min_replica_acks`] makes every grant wait for `WAIT n timeout`
//! before it counts.
//!
//! Fencing tokens and positions travel through Lua numbers (doubles): exact below 2^53.

mod pubsub;
mod scripts;
mod sentinel;

use std::path::PathBuf;
use std::sync::{Arc, Once};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ClientTlsConfig, RedisFuture, TlsCertificates, Value};

use self::pubsub::{PubSubSource, WakeChannels};
use self::scripts::Scripts;
use self::sentinel::{Resolver, SentinelCommands, SentinelTarget};

use super::{
    ceil_millis, validate_key, validate_max_holders, validate_owner, validate_request,
    validate_ttl, AcquireMode, AcquireOutcome, AcquireRequest, Backend, HolderInfo, LockSnapshot,
    ShareMode, WakeSubscription,
};
use crate::error::{LockError, LockResult};

const BACKEND: &str = "redis";
/// Reconnect attempts per failed command before it reports the backend unavailable.
const RECONNECT_RETRIES: usize = 2;
/// Cluster: retries of one command on `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` or a lost
/// node connection (with backoff of 20–500 ms between them).
const CLUSTER_RETRIES: u32 = 6;

/// Connection settings of a [`RedisBackend`].
///
/// Its `Debug` output hides the URL's password.
#[derive(Clone)]
pub struct RedisBackendConfig {
    url: String,
    key_prefix: String,
    response_timeout: Duration,
    connect_timeout: Duration,
    ca_file: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    min_replica_acks: Option<ReplicaAcks>,
}

/// `WAIT replicas timeout` after every grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReplicaAcks {
    replicas: u32,
    timeout: Duration,
}

impl std::fmt::Debug for RedisBackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackendConfig")
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("min_replica_acks", &self.min_replica_acks)
            .finish()
    }
}

/// `url` with the userinfo (user name and password) replaced by `<redacted>`.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://<redacted>@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

impl RedisBackendConfig {
    /// Settings for `url`, key prefix `turnstile:`, response timeout 5 s, connect timeout
    /// 1 s. URL forms:
    ///
    /// - `redis://[user:password@]host:port[/db]`, and `rediss://…` for TLS (server
    ///   certificate checked against Mozilla's roots, or [`Self::ca_file`]);
    /// - `redis+cluster://[user:password@]host1:port1,host2:port2` (`rediss+cluster://`):
    ///   Redis Cluster, any one reachable node is enough;
    /// - `redis+sentinel://[user:password@]s1:26379,s2:26379/MASTERNAME[/db]`
    ///   (`rediss+sentinel://`): the master the sentinels name, asked again after a
    ///   failover. The credentials and database are the data nodes'; the sentinels are asked
    ///   without credentials (over TLS with the same CA file and client certificate).
    ///
    /// Any of them (but the cluster forms) may end in `?min_replica_acks=N` and
    /// `&replica_ack_timeout_ms=MS` (default 1000): the same as [`Self::min_replica_acks`],
    /// for tools that take only a URL.
    pub fn new(url: impl Into<String>) -> Self {
        RedisBackendConfig {
            url: url.into(),
            key_prefix: "turnstile:".to_owned(),
            response_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            ca_file: None,
            client_cert: None,
            min_replica_acks: None,
        }
    }

    /// After every grant, `WAIT replicas timeout` on the connection that wrote it: unless at
    /// least `replicas` replicas acknowledged the write within `timeout`, the grant is
    /// released and the call fails with [`LockError::BackendUnavailable`] (source:
    /// [`ReplicaAcksMissing`]). A hand-off then travels as a wake-up, and the waiter's own
    /// acquire (which writes, then waits) confirms it. This narrows what a failover can lose
    /// (a promoted replica has every acknowledged grant) but does not make Redis
    /// consistent: see the README. Lease extensions are not waited for. `timeout` must be
    /// shorter than the response timeout. Not available on Redis Cluster.
    ///
    /// While replicas lag, every acquire attempt (also one that finds the lock busy) takes
    /// up to `timeout`, and so do the other commands multiplexed on the same connection.
    pub fn min_replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.min_replica_acks = (replicas > 0).then_some(ReplicaAcks { replicas, timeout });
        self
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

    /// Trust only the CA certificate(s) in this PEM file for the server's certificate
    /// (instead of Mozilla's roots). Needs a `rediss://` URL.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Present this client certificate (PEM chain) and private key (PEM) to the server:
    /// mutual TLS, for servers started with `--tls-auth-clients yes`. Needs a `rediss://` URL.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Takes `min_replica_acks` and `replica_ack_timeout_ms` out of the URL's query (other
    /// query parameters stay for the client library).
    fn take_url_options(&mut self) -> Result<(), RedisConnectError> {
        let Some((base, query)) = self.url.split_once('?') else {
            return Ok(());
        };
        let invalid = |detail: &'static str| {
            RedisConnectError::InvalidUrl(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                detail,
            )))
        };
        let mut replicas = None;
        let mut timeout = None;
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            match pair.split_once('=') {
                Some(("min_replica_acks", value)) => {
                    replicas = Some(
                        value
                            .parse::<u32>()
                            .map_err(|_| invalid("min_replica_acks is not a number"))?,
                    );
                }
                Some(("replica_ack_timeout_ms", value)) => {
                    timeout =
                        Some(Duration::from_millis(value.parse::<u64>().map_err(
                            |_| invalid("replica_ack_timeout_ms is not a number"),
                        )?));
                }
                _ => rest.push(pair),
            }
        }
        let base = base.to_owned();
        self.url = if rest.is_empty() {
            base
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        match (replicas, timeout) {
            (Some(replicas), timeout) => {
                let timeout = timeout.unwrap_or(Duration::from_secs(1));
                self.min_replica_acks = (replicas > 0).then_some(ReplicaAcks { replicas, timeout });
            }
            (None, Some(_)) => {
                return Err(invalid("replica_ack_timeout_ms needs min_replica_acks"));
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// The URL's scheme in lower case.
    fn scheme(&self) -> String {
        self.url
            .split_once("://")
            .map_or("", |(scheme, _)| scheme)
            .to_ascii_lowercase()
    }

    /// Reads the TLS files, if any were given.
    fn tls_certificates(&self) -> Result<Option<TlsCertificates>, RedisConnectError> {
        if self.ca_file.is_none() && self.client_cert.is_none() {
            return Ok(None);
        }
        if !self.scheme().starts_with("rediss") {
            return Err(RedisConnectError::TlsSettingsWithoutTls);
        }
        let read = |what: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|source| RedisConnectError::ReadFile {
                what,
                path: path.clone(),
                source,
            })
        };
        let root_cert = match &self.ca_file {
            Some(path) => Some(read("CA file", path)?),
            None => None,
        };
        let client_tls = match &self.client_cert {
            Some((cert, key)) => Some(ClientTlsConfig {
                client_cert: read("client certificate", cert)?,
                client_key: read("client key", key)?,
            }),
            None => None,
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    /// A client for the URL and TLS settings.
    fn client(&self) -> Result<redis::Client, RedisConnectError> {
        let client = match self.tls_certificates()? {
            Some(certificates) => redis::Client::build_with_tls(self.url.as_str(), certificates),
            None => redis::Client::open(self.url.as_str()),
        };
        client.map_err(RedisConnectError::InvalidUrl)
    }
}

/// Why [`RedisBackend::connect`] failed, when the cause is one a person has to fix: kept as
/// the `source` of [`LockError::BackendUnavailable`] (find it with
/// [`RedisConnectError::find`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConnectError {
    /// TLS: the server's certificate is not signed by a trusted CA, expired, or does not name
    /// the host of the URL.
    #[error(
        "the Redis server's TLS certificate was rejected: {reason} (is the CA file \
         (ca_file, TURNSTILE_REDIS_CA_FILE) the CA that signed it, and does it name the URL's host?)"
    )]
    CertificateRejected {
        /// What rustls objected to (`UnknownIssuer`, `NotValidForName`, `Expired`, ...).
        reason: String,
        /// The client library's error.
        #[source]
        source: redis::RedisError,
    },
    /// The server refused the user name / password of the URL, or wants one.
    #[error("the Redis server refused the credentials (user name and password in the URL)")]
    AuthenticationFailed {
        /// The client library's error.
        #[source]
        source: redis::RedisError,
    },
    /// A TLS file could not be read.
    #[error("cannot read the {what} {path:?}")]
    ReadFile {
        /// `CA file`, `client certificate` or `client key`.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A CA file or client certificate was given for a URL without TLS.
    #[error("a CA file or client certificate needs a rediss:// URL (TLS)")]
    TlsSettingsWithoutTls,
    /// The URL (or a PEM file) could not be used.
    #[error("invalid Redis URL or TLS material")]
    InvalidUrl(#[source] redis::RedisError),
    /// [`RedisBackendConfig::min_replica_acks`] was asked of a Redis Cluster.
    #[error("min_replica_acks is not supported on Redis Cluster")]
    ReplicaAcksOnCluster,
    /// [`RedisBackendConfig::min_replica_acks`]' timeout is not shorter than the response
    /// timeout.
    #[error("the min_replica_acks timeout ({acks:?}) must be shorter than the response timeout ({response:?})")]
    ReplicaAcksTimeout {
        /// The `WAIT` timeout.
        acks: Duration,
        /// The response timeout.
        response: Duration,
    },
}

/// A grant that fewer replicas than [`RedisBackendConfig::min_replica_acks`] asks for
/// acknowledged in time: it was released (best effort) and the acquire failed with
/// [`LockError::BackendUnavailable`], whose `source` this is.
#[derive(Debug, thiserror::Error)]
#[error("only {acknowledged} of {wanted} replica(s) acknowledged the grant within {timeout:?}; released it")]
pub struct ReplicaAcksMissing {
    /// Replicas that acknowledged.
    pub acknowledged: i64,
    /// Replicas asked for.
    pub wanted: u32,
    /// The `WAIT` timeout.
    pub timeout: Duration,
}

impl RedisConnectError {
    /// The `RedisConnectError` in `error`'s source chain, if any.
    pub fn find<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut current = Some(error);
        while let Some(error) = current {
            if let Some(found) = error.downcast_ref::<Self>() {
                return Some(found);
            }
            current = error.source();
        }
        None
    }

    /// Sorts a connect-time client error into a typed cause, or `None` for the ordinary
    /// "cannot reach the server" kind.
    fn classify(error: redis::RedisError) -> Result<Self, redis::RedisError> {
        if error.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(error.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        {
            return Ok(RedisConnectError::AuthenticationFailed { source: error });
        }
        match rejected_certificate(&error) {
            Some(reason) => Ok(RedisConnectError::CertificateRejected {
                reason,
                source: error,
            }),
            None => Err(error),
        }
    }
}

/// The rustls certificate complaint somewhere in `error`'s chain. rustls' error travels inside
/// an `io::Error` (whose own `source` skips it, hence the `get_ref`), which redis keeps in an
/// `Arc` (a type of its own for `downcast_ref`).
fn rejected_certificate(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let mut current = Some(error);
    while let Some(error) = current {
        let unshared: &(dyn std::error::Error + 'static) = match error.downcast_ref::<Shared>() {
            Some(shared) => shared.as_ref(),
            None => error,
        };
        let tls = unshared.downcast_ref::<rustls::Error>().or_else(|| {
            unshared
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        match tls {
            Some(rustls::Error::InvalidCertificate(reason)) => return Some(format!("{reason:?}")),
            Some(
                other @ (rustls::Error::NoCertificatesPresented
                | rustls::Error::UnsupportedNameType),
            ) => return Some(other.to_string()),
            _ => {}
        }
        current = error.source();
    }
    // The cluster client keeps only the text of its initial connections' errors: rustls'
    // `InvalidCertificate` displays as "invalid peer certificate: <reason>".
    const INVALID_CERTIFICATE: &str = "invalid peer certificate: ";
    let text = error.to_string();
    let reason = &text[text.find(INVALID_CERTIFICATE)? + INVALID_CERTIFICATE.len()..];
    let reason: String = reason
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!reason.is_empty()).then_some(reason)
}

/// Wraps a connect-time client error, typed when a person has to fix its cause.
fn connect_error(operation: &'static str) -> impl FnOnce(redis::RedisError) -> LockError {
    move |error| match RedisConnectError::classify(error) {
        Ok(typed) => LockError::backend(BACKEND, operation, typed),
        Err(error) => LockError::backend(BACKEND, operation, error),
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
    waits: String,
    meta: String,
    delay: String,
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
            waits: name("waits"),
            meta: name("meta"),
            delay: name("delay"),
            channel: name("wake"),
        }
    }
}

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

/// Makes `ring` the process' rustls crypto provider unless one was installed already (redis'
/// rustls has none of its own; without one, the first TLS handshake would panic).
fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // An error means another thread installed one first: that one is used.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
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

    /// The acquire script and `WAIT` in one pipeline (one connection: `WAIT` covers the
    /// writes of the connection it runs on). A grant fewer replicas acknowledged is released.
    async fn acquire_acknowledged(
        &self,
        request: &AcquireRequest<'_>,
        script_keys: &[&String],
        args: &[String],
        acks: ReplicaAcks,
    ) -> LockResult<Vec<i64>> {
        let script = &self.shared.scripts.acquire;
        let mut connection = self.connection();
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(script.get_hash())
            .arg(script_keys.len())
            .arg(script_keys)
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

/// One server (or a replica set behind it): a reconnecting multiplexed connection and a
/// dedicated pub/sub connection.
async fn connect_single(config: &RedisBackendConfig) -> LockResult<(Commands, WakeChannels)> {
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
async fn connect_sentinel(
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
async fn connect_cluster(
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
fn cluster_nodes(url: &str) -> Result<Option<Vec<String>>, RedisConnectError> {
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
enum Commands {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelCommands),
}

impl ConnectionLike for Commands {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Commands::Single(connection) => connection.req_packed_command(cmd),
            Commands::Cluster(connection) => connection.req_packed_command(cmd),
            Commands::Sentinel(connection) => connection.req_packed_command(cmd),
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
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Commands::Single(connection) => connection.get_db(),
            Commands::Cluster(connection) => connection.get_db(),
            Commands::Sentinel(connection) => connection.get_db(),
        }
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
        let script_keys = [
            &keys.holders,
            &keys.tokens,
            &keys.fence,
            &keys.queue,
            &keys.beats,
            &keys.seq,
            &keys.waits,
            &keys.meta,
            &keys.delay,
        ];
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
                let mut invocation = self.shared.scripts.acquire.prepare_invoke();
                for key in script_keys {
                    invocation.key(key);
                }
                for arg in &args {
                    invocation.arg(arg);
                }
                invocation
                    .invoke_async(&mut self.connection())
                    .await
                    .map_err(redis_error("acquire"))?
            }
            Some(acks) => {
                self.acquire_acknowledged(request, &script_keys, &args, acks)
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
        let removed: i64 = self
            .shared
            .scripts
            .release
            .key(&keys.holders)
            .key(&keys.tokens)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.beats)
            .key(&keys.waits)
            .key(&keys.meta)
            .key(&keys.delay)
            .arg(owner)
            .arg(max_holders)
            .arg(&keys.channel)
            .arg(self.shared.publish)
            // With replica acks a hand-off is only a wake-up: the waiter's own acquire
            // confirms it (and waits for the replicas).
            .arg(if self.shared.replica_acks.is_some() {
                "wake"
            } else {
                "handoff"
            })
            .invoke_async(&mut self.connection())
            .await
            .map_err(redis_error("release"))?;
        Ok(removed == 1)
    }

    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        validate_key(key)?;
        validate_owner(owner)?;
        validate_ttl(ttl)?;
        let keys = self.keys(key);
        let lease: i64 = self
            .shared
            .scripts
            .extend
            .key(&keys.holders)
            .key(&keys.tokens)
            .key(&keys.meta)
            .arg(owner)
            .arg(ceil_millis(ttl))
            .invoke_async(&mut self.connection())
            .await
            .map_err(redis_error("extend"))?;
        Ok(millis_from_reply(lease))
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
        let (flat_holders, waiters, fence, delayed): (Vec<String>, Vec<String>, String, String) =
            self.shared
                .scripts
                .snapshot
                .key(&keys.holders)
                .key(&keys.tokens)
                .key(&keys.fence)
                .key(&keys.queue)
                .key(&keys.beats)
                .key(&keys.meta)
                .key(&keys.delay)
                .invoke_async(&mut self.connection())
                .await
                .map_err(redis_error("snapshot"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_acks_come_out_of_the_url_query() {
        let mut config = RedisBackendConfig::new(
            "redis+sentinel://s1:26379/m?protocol=resp3&min_replica_acks=2&replica_ack_timeout_ms=250",
        );
        config.take_url_options().expect("valid");
        assert_eq!(config.url, "redis+sentinel://s1:26379/m?protocol=resp3");
        assert_eq!(
            config.min_replica_acks,
            Some(ReplicaAcks {
                replicas: 2,
                timeout: Duration::from_millis(250)
            })
        );

        let mut config = RedisBackendConfig::new("redis://h:6379/0?min_replica_acks=1");
        config.take_url_options().expect("valid");
        assert_eq!(config.url, "redis://h:6379/0");
        assert_eq!(
            config.min_replica_acks.map(|acks| acks.timeout),
            Some(Duration::from_secs(1))
        );

        let mut plain = RedisBackendConfig::new("redis://h:6379/0");
        plain.take_url_options().expect("valid");
        assert_eq!(plain.min_replica_acks, None);

        for bad in [
            "redis://h?min_replica_acks=x",
            "redis://h?replica_ack_timeout_ms=5",
            "redis://h?min_replica_acks=1&replica_ack_timeout_ms=-1",
        ] {
            assert!(
                RedisBackendConfig::new(bad).take_url_options().is_err(),
                "{bad}"
            );
        }
    }
}
