//! Redis Sentinel: the master of `redis+sentinel://s1:26379,s2:26379/MASTERNAME` is asked of
//! the sentinels (the crate's `SentinelClient`, which also checks the named node's `ROLE`),
//! and asked again whenever it may have changed:
//!
//! - a command answered `READONLY` or `MASTERDOWN` (we reached a demoted master): resolve
//!   again and retry the command, a few times with backoff (nothing was written: a script's
//!   first write fails on a replica, and every script writes before it answers);
//! - a command's connection failed (the master died): the command reports the error (it may
//!   or may not have run, as on a single server) and the next one resolves again;
//! - a sentinel announced `+switch-master` for our master: the next command resolves again,
//!   and the pub/sub listener reconnects to the new master.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisResult, TlsCertificates, TlsMode, Value};
use tokio::sync::watch;

use super::RedisConnectError;

/// Resolve-and-retry rounds of one command that reached a node which is no longer master.
const NOT_MASTER_RETRIES: u32 = 8;
/// The `+switch-master` watcher's pause between two sentinels it could not follow.
const WATCH_RETRY: Duration = Duration::from_millis(500);

/// The parts of a `redis+sentinel://` / `rediss+sentinel://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SentinelTarget {
    /// TLS to the sentinels and to the data nodes.
    pub tls: bool,
    /// The sentinels' `host:port`s.
    pub sentinels: Vec<(String, u16)>,
    /// The master's name in the sentinels' configuration.
    pub master_name: String,
    /// User name for the data nodes (ACL).
    pub username: Option<String>,
    /// Password for the data nodes.
    pub password: Option<String>,
    /// Database number on the data nodes.
    pub db: i64,
}

fn invalid(detail: &'static str) -> RedisConnectError {
    RedisConnectError::InvalidUrl(redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        detail,
    )))
}

/// `%XX` escapes of a URL part decoded.
fn percent_decode(text: &str) -> Result<String, RedisConnectError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| invalid("a bad %-escape in the Redis URL"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid("the Redis URL's credentials are not UTF-8"))
}

/// Parses `redis+sentinel://[user:password@]host1:port1[,host2:port2…]/MASTERNAME[/db]`
/// (`rediss+sentinel://` for TLS); `None` for any other scheme. The credentials and the
/// database apply to the data nodes; the sentinels are asked without credentials.
pub(super) fn parse(url: &str) -> Result<Option<SentinelTarget>, RedisConnectError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "redis+sentinel" => false,
        "rediss+sentinel" => true,
        _ => return Ok(None),
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(userinfo) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (userinfo, None),
            };
            let user = (!user.is_empty())
                .then(|| percent_decode(user))
                .transpose()?;
            let password = password
                .filter(|password| !password.is_empty())
                .map(percent_decode)
                .transpose()?;
            (user, password)
        }
    };
    let mut sentinels = Vec::new();
    for host in hosts.split(',').filter(|host| !host.is_empty()) {
        let (name, port) = host
            .rsplit_once(':')
            .ok_or_else(|| invalid("a Redis Sentinel URL needs host:port for every sentinel"))?;
        let port = port
            .parse::<u16>()
            .map_err(|_| invalid("a sentinel's port is not a number"))?;
        let name = name.trim_start_matches('[').trim_end_matches(']');
        sentinels.push((name.to_owned(), port));
    }
    if sentinels.is_empty() {
        return Err(invalid(
            "a Redis Sentinel URL needs at least one sentinel host:port",
        ));
    }
    let mut segments = path.trim_start_matches('/').split('/');
    let master_name = segments.next().unwrap_or_default();
    if master_name.is_empty() {
        return Err(invalid(
            "a Redis Sentinel URL needs the master's name: redis+sentinel://host:port/NAME",
        ));
    }
    let master_name = percent_decode(master_name)?;
    let db = match segments.next() {
        None | Some("") => 0,
        Some(db) => db
            .parse()
            .map_err(|_| invalid("the Redis Sentinel URL's database is not a number"))?,
    };
    if segments.next().is_some_and(|extra| !extra.is_empty()) {
        return Err(invalid("a Redis Sentinel URL is …/MASTERNAME[/db]"));
    }
    Ok(Some(SentinelTarget {
        tls,
        sentinels,
        master_name,
        username,
        password,
        db,
    }))
}

/// The connection to the current master, as last resolved.
struct Current {
    generation: u64,
    address: String,
    connection: MultiplexedConnection,
}

/// Finds the master through the sentinels and keeps one multiplexed connection to it.
pub(super) struct Resolver {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// Held while resolving, so concurrent commands resolve once.
    resolving: tokio::sync::Mutex<()>,
    current: Mutex<Option<Current>>,
    generation: Mutex<u64>,
    connection_config: AsyncConnectionConfig,
    /// How long one resolution (sentinels, then the master's `ROLE`) may take.
    resolve_timeout: Duration,
    master_name: String,
    db: i64,
    /// Bumped on every `+switch-master` of our master: the pub/sub listener reconnects.
    switched: watch::Sender<u64>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("master_name", &self.master_name)
            .finish_non_exhaustive()
    }
}

fn timed_out(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Io, what))
}

fn describe(address: &ConnectionAddr) -> String {
    match address {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port} (TLS)"),
        other => format!("{other:?}"),
    }
}

impl Resolver {
    /// Builds the sentinel client of `target` (connects nothing yet).
    pub(super) fn new(
        target: &SentinelTarget,
        certificates: Option<TlsCertificates>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Arc<Self>, RedisConnectError> {
        let addresses = target.sentinels.iter().map(|(host, port)| {
            if target.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let mut builder =
            SentinelClientBuilder::new(addresses, &target.master_name, SentinelServerType::Master)
                .map_err(RedisConnectError::InvalidUrl)?
                .set_client_to_redis_db(target.db);
        if let Some(username) = &target.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &target.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if target.tls {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(certificates) = certificates {
                builder = builder
                    .set_client_to_redis_certificates(certificates.clone())
                    .set_client_to_sentinel_certificates(certificates);
            }
        }
        let sentinel = builder.build().map_err(RedisConnectError::InvalidUrl)?;
        let (switched, _) = watch::channel(0);
        Ok(Arc::new(Resolver {
            sentinel: tokio::sync::Mutex::new(sentinel),
            resolving: tokio::sync::Mutex::new(()),
            current: Mutex::new(None),
            generation: Mutex::new(0),
            connection_config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout)),
            // Every sentinel may be asked, then the master's role.
            resolve_timeout: connect_timeout * 4 + response_timeout,
            master_name: target.master_name.clone(),
            db: target.db,
            switched,
        }))
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A client for the master the sentinels name now (its role checked).
    pub(super) async fn master_client(&self) -> redis::RedisResult<redis::Client> {
        let mut sentinel = self.sentinel.lock().await;
        tokio::time::timeout(self.resolve_timeout, sentinel.async_get_client())
            .await
            .map_err(|_| timed_out("asking the sentinels for the master timed out"))?
    }

    /// The connection to the current master, resolving and connecting if there is none.
    async fn connection(&self) -> redis::RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = self.current().as_ref() {
            return Ok((current.generation, current.connection.clone()));
        }
        let _resolving = self.resolving.lock().await;
        if let Some(current) = self.current().as_ref() {
            return Ok((current.generation, current.connection.clone()));
        }
        let client = self.master_client().await?;
        let address = describe(client.get_connection_info().addr());
        let connection = client
            .get_multiplexed_async_connection_with_config(&self.connection_config)
            .await?;
        let generation = {
            let mut generation = self
                .generation
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            *generation += 1;
            *generation
        };
        tracing::info!(master_name = %self.master_name, %address, generation, "redis sentinel: connected to the master");
        *self.current() = Some(Current {
            generation,
            address,
            connection: connection.clone(),
        });
        Ok((generation, connection))
    }

    /// Forgets the connection of `generation` (if still the current one).
    fn invalidate(&self, generation: u64, why: &'static str) {
        let mut current = self.current();
        if current
            .as_ref()
            .is_some_and(|current| current.generation == generation)
        {
            if let Some(old) = current.take() {
                tracing::warn!(master_name = %self.master_name, address = %old.address, generation, why, "redis sentinel: asking for the master again");
            }
        }
    }

    /// A sentinel announced a new master: the next command resolves it, the pub/sub
    /// listener reconnects.
    fn switched(&self) {
        self.current().take();
        self.switched.send_modify(|count| *count += 1);
    }

    /// Notified on every `+switch-master` of our master.
    pub(super) fn switches(&self) -> watch::Receiver<u64> {
        self.switched.subscribe()
    }
}

/// How a reply (or failure) of the current master bears on the resolution.
enum Verdict {
    /// Nothing to do with the master: hand it to the caller.
    Done,
    /// The node is not (or no longer) a master: nothing was written; resolve and retry.
    NotMaster,
    /// The connection failed: resolve for the next command.
    Lost,
}

fn not_master_code(code: Option<&str>) -> bool {
    matches!(code, Some("READONLY" | "MASTERDOWN"))
}

fn verdict_of_error(error: &redis::RedisError) -> Verdict {
    if not_master_code(error.code()) {
        Verdict::NotMaster
    } else if error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
    {
        Verdict::Lost
    } else {
        Verdict::Done
    }
}

fn verdict_of_value(value: &Value) -> Verdict {
    match value {
        Value::ServerError(error) if not_master_code(Some(error.code())) => Verdict::NotMaster,
        Value::Array(items)
            if items
                .iter()
                .any(|item| matches!(verdict_of_value(item), Verdict::NotMaster)) =>
        {
            Verdict::NotMaster
        }
        _ => Verdict::Done,
    }
}

/// The command connection of a sentinel-managed master: always the master the sentinels name
/// now, see the module documentation.
#[derive(Clone)]
pub(super) struct SentinelCommands {
    resolver: Arc<Resolver>,
}

impl SentinelCommands {
    /// Resolves the master and connects to it.
    pub(super) async fn connect(resolver: Arc<Resolver>) -> redis::RedisResult<Self> {
        resolver.connection().await?;
        Ok(SentinelCommands { resolver })
    }

    /// Runs `send` on the master, re-resolving as the verdict says.
    async fn run<T>(
        &self,
        mut send: impl FnMut(
            MultiplexedConnection,
        ) -> futures::future::BoxFuture<'static, redis::RedisResult<T>>,
        verdict_of: impl Fn(&T) -> Verdict,
    ) -> redis::RedisResult<T> {
        let mut backoff = Duration::from_millis(50);
        let mut attempt = 0;
        loop {
            let (generation, connection) = self.resolver.connection().await?;
            let result = send(connection).await;
            let verdict = match &result {
                Ok(value) => verdict_of(value),
                Err(error) => verdict_of_error(error),
            };
            match verdict {
                Verdict::Done => return result,
                Verdict::Lost => {
                    self.resolver.invalidate(generation, "connection failed");
                    return result;
                }
                Verdict::NotMaster => {
                    self.resolver
                        .invalidate(generation, "the node is not master");
                    attempt += 1;
                    if attempt > NOT_MASTER_RETRIES {
                        return result;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(400));
                }
            }
        }
    }
}

// Not `ConnectionLike` itself: [`super::connection::Commands`] is the one implementation,
// and dispatches to these.
impl SentinelCommands {
    /// One command on the current master, retried on the next one while a failover is seen.
    pub(super) async fn command(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        let cmd = cmd.clone();
        self.run(
            move |mut connection| {
                let cmd = cmd.clone();
                Box::pin(async move { connection.req_packed_command(&cmd).await })
            },
            verdict_of_value,
        )
        .await
    }

    /// A pipeline on the current master, as [`SentinelCommands::command`]; `offset` and
    /// `count` select the replies as in `ConnectionLike::req_packed_commands`.
    pub(super) async fn pipeline(
        &mut self,
        pipeline: &redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let pipeline = pipeline.clone();
        self.run(
            move |mut connection| {
                let pipeline = pipeline.clone();
                Box::pin(async move {
                    connection
                        .req_packed_commands(&pipeline, offset, count)
                        .await
                })
            },
            |values: &Vec<Value>| {
                if values
                    .iter()
                    .any(|value| matches!(verdict_of_value(value), Verdict::NotMaster))
                {
                    Verdict::NotMaster
                } else {
                    Verdict::Done
                }
            },
        )
        .await
    }

    /// The database index every master connection selects.
    pub(super) fn db(&self) -> i64 {
        self.resolver.db
    }
}

/// Follows `+switch-master` on one sentinel at a time (the next one when it fails) and tells
/// `resolver` when our master changed; stops once the resolver is gone.
pub(super) async fn watch_switches(resolver: Weak<Resolver>, sentinels: Vec<redis::Client>) {
    let Some(master_name) = resolver.upgrade().map(|r| r.master_name.clone()) else {
        return;
    };
    for client in sentinels.iter().cycle() {
        if resolver.strong_count() == 0 {
            return;
        }
        let address = describe(client.get_connection_info().addr());
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let pubsub = match tokio::time::timeout(Duration::from_secs(2), subscribed).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(error)) => {
                tracing::debug!(sentinel = %address, %error, "redis sentinel: cannot follow +switch-master here");
                tokio::time::sleep(WATCH_RETRY).await;
                continue;
            }
            Err(_) => {
                tracing::debug!(sentinel = %address, "redis sentinel: subscribing to +switch-master timed out");
                tokio::time::sleep(WATCH_RETRY).await;
                continue;
            }
        };
        tracing::debug!(sentinel = %address, %master_name, "redis sentinel: following +switch-master");
        let mut messages = pubsub.into_on_message();
        loop {
            let message = tokio::select! {
                message = messages.next() => message,
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if resolver.strong_count() == 0 {
                        return;
                    }
                    continue;
                }
            };
            let Some(message) = message else {
                tracing::debug!(sentinel = %address, "redis sentinel: +switch-master subscription lost");
                break;
            };
            let Ok(payload) = message.get_payload::<String>() else {
                continue;
            };
            // `<name> <old ip> <old port> <new ip> <new port>`
            let mut fields = payload.split(' ');
            if fields.next() != Some(master_name.as_str()) {
                continue;
            }
            let Some(resolver) = resolver.upgrade() else {
                return;
            };
            tracing::info!(%master_name, switch = %payload, "redis sentinel: +switch-master");
            resolver.switched();
        }
        tokio::time::sleep(WATCH_RETRY).await;
    }
}

/// Plain clients of every sentinel (for `+switch-master`).
pub(super) fn sentinel_clients(
    target: &SentinelTarget,
    certificates: Option<&TlsCertificates>,
) -> Result<Vec<redis::Client>, RedisConnectError> {
    target
        .sentinels
        .iter()
        .map(|(host, port)| {
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host.clone()
            };
            let client = if target.tls {
                let url = format!("rediss://{host}:{port}");
                match certificates {
                    Some(certificates) => {
                        redis::Client::build_with_tls(url.as_str(), certificates.clone())
                    }
                    None => redis::Client::open(url.as_str()),
                }
            } else {
                redis::Client::open(format!("redis://{host}:{port}").as_str())
            };
            client.map_err(RedisConnectError::InvalidUrl)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sentinel_urls() {
        let target = parse("redis+sentinel://s1:26379,s2:26380/mymaster")
            .expect("valid")
            .expect("sentinel");
        assert!(!target.tls);
        assert_eq!(
            target.sentinels,
            vec![("s1".to_owned(), 26379), ("s2".to_owned(), 26380)]
        );
        assert_eq!(target.master_name, "mymaster");
        assert_eq!(target.db, 0);
        assert_eq!(target.username, None);

        let target = parse("rediss+sentinel://app:p%40ss@10.0.0.1:26379/m/3")
            .expect("valid")
            .expect("sentinel");
        assert!(target.tls);
        assert_eq!(target.username.as_deref(), Some("app"));
        assert_eq!(target.password.as_deref(), Some("p@ss"));
        assert_eq!(target.db, 3);

        assert!(parse("redis://127.0.0.1:6379").expect("valid").is_none());
        assert!(
            parse("redis+sentinel://s1:26379").is_err(),
            "no master name"
        );
        assert!(parse("redis+sentinel:///m").is_err(), "no sentinel");
        assert!(parse("redis+sentinel://s1/m").is_err(), "no port");
    }
}
