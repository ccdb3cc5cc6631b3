//! The lock backends the controller serves locks from, configured on the controller (never by
//! tenants): the embedded memory backend, and Redis, MongoDB and etcd when their URLs are given. A
//! backend that is down at start-up is connected lazily, on the next reconcile that needs it
//! (a failed connect makes that lock's pass retry with the reconciler's exponential backoff).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use turnstile_api::BackendKind;
use turnstile_lock::backend::{MongoBackend, MongoBackendConfig};
use turnstile_lock::{
    Backend, EtcdBackend, EtcdBackendConfig, LockError, MemoryBackend, RedisBackend,
    RedisBackendConfig,
};

/// How long connecting to Redis may take per attempt during a reconcile.
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one MongoDB operation (and server selection at connect) may take.
const MONGO_OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

/// Environment variable: PEM file of the CA that signed the Redis server's certificate.
pub const REDIS_CA_FILE_ENV: &str = "TURNSTILE_REDIS_CA_FILE";
/// Environment variable: PEM client certificate (chain) for mutual TLS with Redis.
pub const REDIS_CLIENT_CERT_ENV: &str = "TURNSTILE_REDIS_CLIENT_CERT";
/// Environment variable: PEM private key of [`REDIS_CLIENT_CERT_ENV`]'s certificate.
pub const REDIS_CLIENT_KEY_ENV: &str = "TURNSTILE_REDIS_CLIENT_KEY";

/// TLS files for Redis (`rediss://` URLs), shared by `turnstile run` and `turnstile lock`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTlsFiles {
    /// Trust only this CA (PEM) for the server's certificate, instead of Mozilla's roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// Why Redis TLS settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedisTlsFilesError {
    /// Only one half of the client certificate pair was given.
    #[error("a Redis client certificate needs its key and the key its certificate: set both {REDIS_CLIENT_CERT_ENV} and {REDIS_CLIENT_KEY_ENV} (or neither)")]
    IncompleteClientCert,
}

impl RedisTlsFiles {
    /// From explicit paths (empty values count as unset).
    pub fn new(
        ca_file: Option<PathBuf>,
        client_cert: Option<PathBuf>,
        client_key: Option<PathBuf>,
    ) -> Result<Self, RedisTlsFilesError> {
        let set = |path: Option<PathBuf>| path.filter(|path| !path.as_os_str().is_empty());
        let client_cert = match (set(client_cert), set(client_key)) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(RedisTlsFilesError::IncompleteClientCert),
        };
        Ok(Self {
            ca_file: set(ca_file),
            client_cert,
        })
    }

    /// From `TURNSTILE_REDIS_CA_FILE`, `TURNSTILE_REDIS_CLIENT_CERT` and
    /// `TURNSTILE_REDIS_CLIENT_KEY`.
    pub fn from_env() -> Result<Self, RedisTlsFilesError> {
        let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
        Self::new(
            var(REDIS_CA_FILE_ENV),
            var(REDIS_CLIENT_CERT_ENV),
            var(REDIS_CLIENT_KEY_ENV),
        )
    }

    /// Adds these files to `config`.
    pub fn apply(&self, mut config: RedisBackendConfig) -> RedisBackendConfig {
        if let Some(ca_file) = &self.ca_file {
            config = config.ca_file(ca_file);
        }
        if let Some((cert, key)) = &self.client_cert {
            config = config.client_cert(cert, key);
        }
        config
    }
}

/// Where the controller's MongoDB backend keeps its locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MongoSettings {
    /// `mongodb://…` or `mongodb+srv://…` connection string.
    pub url: String,
    /// Database of the locks collection (default: the URL's database, else `turnstile`).
    pub database: Option<String>,
    /// The locks collection (default `turnstile_locks`).
    pub collection: Option<String>,
}

impl MongoSettings {
    /// Settings for `url` with the default database and collection.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            database: None,
            collection: None,
        }
    }

    fn backend_config(&self) -> MongoBackendConfig {
        let mut config = MongoBackendConfig::new().operation_timeout(MONGO_OPERATION_TIMEOUT);
        if let Some(database) = &self.database {
            config = config.database(database.clone());
        }
        if let Some(collection) = &self.collection {
            config = config.collection(collection.clone());
        }
        config
    }
}

/// Environment variable: PEM file of the CA that signed the etcd members' certificates.
pub const ETCD_CA_FILE_ENV: &str = "TURNSTILE_ETCD_CA_FILE";
/// Environment variable: PEM client certificate for etcd's `--client-cert-auth`.
pub const ETCD_CLIENT_CERT_ENV: &str = "TURNSTILE_ETCD_CLIENT_CERT";
/// Environment variable: PEM private key of [`ETCD_CLIENT_CERT_ENV`]'s certificate.
pub const ETCD_CLIENT_KEY_ENV: &str = "TURNSTILE_ETCD_CLIENT_KEY";

/// How long one etcd request may take during a reconcile.
const ETCD_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long connecting to etcd may take per attempt during a reconcile.
const ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Where the controller's etcd backend keeps its locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// `etcd://[user:password@]host1:2379,host2:2379` (`etcds://` for TLS).
    pub url: String,
    /// Prefix of the lock keys (default `turnstile/`). Controllers of several clusters that
    /// share a lock use the same prefix and lock key.
    pub key_prefix: Option<String>,
    /// Trust only this CA (PEM) for the members' certificates (`etcds://`; default: Mozilla's
    /// roots).
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for etcd's `--client-cert-auth`.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl EtcdSettings {
    /// Settings for `url`, default prefix, no TLS files.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            key_prefix: None,
            ca_file: None,
            client_cert: None,
        }
    }

    /// The engine's configuration for these settings.
    pub fn backend_config(&self) -> EtcdBackendConfig {
        let mut config = EtcdBackendConfig::new(self.url.as_str())
            .request_timeout(ETCD_REQUEST_TIMEOUT)
            .connect_timeout(ETCD_CONNECT_TIMEOUT);
        if let Some(prefix) = &self.key_prefix {
            config = config.key_prefix(prefix.clone());
        }
        if let Some(ca_file) = &self.ca_file {
            config = config.ca_file(ca_file);
        }
        if let Some((cert, key)) = &self.client_cert {
            config = config.client_cert(cert, key);
        }
        config
    }
}

/// The backends of one controller process.
#[derive(Debug)]
pub struct Backends {
    default: BackendKind,
    memory: Arc<MemoryBackend>,
    redis: Option<LazyRedis>,
    mongo: Option<LazyMongo>,
    etcd: Option<LazyEtcd>,
    /// This controller's cluster in the owner tokens it writes (`--cluster-name`).
    cluster_name: Option<String>,
}

/// An etcd backend connected on first use (and again after a failed connect).
#[derive(Debug)]
struct LazyEtcd {
    settings: EtcdSettings,
    connected: Mutex<Option<Arc<EtcdBackend>>>,
}

/// A Redis backend connected on first use (and again after a failed connect).
#[derive(Debug)]
struct LazyRedis {
    /// The settings, or why they were refused (reported by every connect attempt).
    config: Result<RedisBackendConfig, RedisTlsFilesError>,
    connected: Mutex<Option<Arc<RedisBackend>>>,
}

/// A MongoDB backend connected on first use (and again after a failed connect).
#[derive(Debug)]
struct LazyMongo {
    settings: MongoSettings,
    connected: Mutex<Option<Arc<MongoBackend>>>,
}

/// The backend in `slot`, connected by `connect` if it is not yet (one connect at a time; a
/// failed one is tried again by the next caller).
async fn connect_once<B, F, Fut>(
    slot: &Mutex<Option<Arc<B>>>,
    connect: F,
) -> Result<Arc<dyn Backend>, BackendLookupError>
where
    B: Backend + 'static,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<B, LockError>>,
{
    let mut connected = slot.lock().await;
    if let Some(backend) = connected.as_ref() {
        return Ok(backend.clone());
    }
    // Boxed: the connect futures are deep, and every pass's future would otherwise embed them.
    let backend = Arc::new(Box::pin(connect()).await?);
    *connected = Some(backend.clone());
    Ok(backend)
}

/// Why a lock's backend cannot be used right now.
#[derive(Debug, thiserror::Error)]
pub enum BackendLookupError {
    /// The controller has no connection settings for this backend.
    #[error("the controller has no {0} backend configured")]
    NotConfigured(BackendKind),
    /// Connecting failed.
    #[error(transparent)]
    Unavailable(#[from] LockError),
}

impl Backends {
    /// Backends for a controller: memory always, Redis when `redis_url` is given (no TLS
    /// files: system roots for `rediss://`). `default` serves locks that do not name a backend.
    pub fn new(default: BackendKind, redis_url: Option<String>) -> Self {
        Self::with_redis_tls(default, redis_url, Ok(RedisTlsFiles::default()))
    }

    /// [`Backends::new`] with explicit Redis TLS files.
    pub fn with_redis_tls(
        default: BackendKind,
        redis_url: Option<String>,
        tls: Result<RedisTlsFiles, RedisTlsFilesError>,
    ) -> Self {
        Self {
            default,
            memory: Arc::new(MemoryBackend::new()),
            redis: redis_url.map(|url| LazyRedis {
                config: tls.map(|tls| {
                    tls.apply(RedisBackendConfig::new(url).connect_timeout(REDIS_CONNECT_TIMEOUT))
                }),
                connected: Mutex::new(None),
            }),
            mongo: None,
            etcd: None,
            cluster_name: None,
        }
    }

    /// Also serves locks with `backend: mongo`, from the server `settings` names.
    pub fn with_mongo(mut self, settings: Option<MongoSettings>) -> Self {
        self.mongo = settings.map(|settings| LazyMongo {
            settings,
            connected: Mutex::new(None),
        });
        self
    }

    /// Also serves locks with `backend: etcd`, from the cluster `settings` names.
    pub fn with_etcd(mut self, settings: Option<EtcdSettings>) -> Self {
        self.etcd = settings.map(|settings| LazyEtcd {
            settings,
            connected: Mutex::new(None),
        });
        self
    }

    /// Names this controller's cluster in the owner tokens it writes, so that the other
    /// clusters sharing a lock's backend key can tell whose grant it is (see
    /// [`owner_token_in`](crate::core::owner_token_in)).
    pub fn with_cluster_name(mut self, cluster_name: Option<String>) -> Self {
        self.cluster_name = cluster_name;
        self
    }

    /// This controller's cluster, as its owner tokens name it.
    pub fn cluster_name(&self) -> Option<&str> {
        self.cluster_name.as_deref()
    }

    /// The backend serving locks that do not name one.
    pub fn default_kind(&self) -> BackendKind {
        self.default
    }

    /// Whether `kind` has connection settings (it may still be down).
    pub fn is_configured(&self, kind: BackendKind) -> bool {
        match kind {
            BackendKind::Memory => true,
            BackendKind::Redis => self.redis.is_some(),
            BackendKind::Mongo => self.mongo.is_some(),
            BackendKind::Etcd => self.etcd.is_some(),
        }
    }

    /// The backend for `kind`, connecting it if needed.
    pub async fn get(&self, kind: BackendKind) -> Result<Arc<dyn Backend>, BackendLookupError> {
        match kind {
            BackendKind::Memory => Ok(self.memory.clone()),
            BackendKind::Redis => {
                let redis = self
                    .redis
                    .as_ref()
                    .ok_or(BackendLookupError::NotConfigured(kind))?;
                connect_once(&redis.connected, || async {
                    let config = redis
                        .config
                        .clone()
                        .map_err(|error| LockError::backend("redis", "configure TLS", error))?;
                    RedisBackend::connect(config).await
                })
                .await
            }
            BackendKind::Mongo => {
                let mongo = self
                    .mongo
                    .as_ref()
                    .ok_or(BackendLookupError::NotConfigured(kind))?;
                let settings = &mongo.settings;
                connect_once(&mongo.connected, || {
                    MongoBackend::connect(&settings.url, settings.backend_config())
                })
                .await
            }
            BackendKind::Etcd => {
                let etcd = self
                    .etcd
                    .as_ref()
                    .ok_or(BackendLookupError::NotConfigured(kind))?;
                connect_once(&etcd.connected, || {
                    EtcdBackend::connect(etcd.settings.backend_config())
                })
                .await
            }
        }
    }
}
