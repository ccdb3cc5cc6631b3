//! The lock backends the controller serves locks from, configured on the controller (never by
//! tenants): the embedded memory backend, and Redis and MongoDB when their URLs are given. A
//! backend that is down at start-up is connected lazily, on the next reconcile that needs it
//! (a failed connect makes that lock's pass retry with the reconciler's exponential backoff).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use turnstile_api::BackendKind;
use turnstile_lock::backend::{MongoBackend, MongoBackendConfig};
use turnstile_lock::{Backend, LockError, MemoryBackend, RedisBackend, RedisBackendConfig};

/// How long connecting to Redis may take per attempt during a reconcile.
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one MongoDB operation (and server selection at connect) may take.
const MONGO_OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

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

/// The backends of one controller process.
#[derive(Debug)]
pub struct Backends {
    default: BackendKind,
    memory: Arc<MemoryBackend>,
    redis: Option<LazyRedis>,
    mongo: Option<LazyMongo>,
}

/// A Redis backend connected on first use (and again after a failed connect).
#[derive(Debug)]
struct LazyRedis {
    config: RedisBackendConfig,
    connected: Mutex<Option<Arc<RedisBackend>>>,
}

/// A MongoDB backend connected on first use (and again after a failed connect).
#[derive(Debug)]
struct LazyMongo {
    settings: MongoSettings,
    connected: Mutex<Option<Arc<MongoBackend>>>,
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
    /// Backends for a controller: memory always, Redis when `redis_url` is given.
    /// `default` serves locks that do not name a backend.
    pub fn new(default: BackendKind, redis_url: Option<String>) -> Self {
        Self {
            default,
            memory: Arc::new(MemoryBackend::new()),
            redis: redis_url.map(|url| LazyRedis {
                config: RedisBackendConfig::new(url).connect_timeout(REDIS_CONNECT_TIMEOUT),
                connected: Mutex::new(None),
            }),
            mongo: None,
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
                let mut connected = redis.connected.lock().await;
                if let Some(backend) = connected.as_ref() {
                    return Ok(backend.clone());
                }
                let backend = Arc::new(RedisBackend::connect(redis.config.clone()).await?);
                *connected = Some(backend.clone());
                Ok(backend)
            }
            BackendKind::Mongo => {
                let mongo = self
                    .mongo
                    .as_ref()
                    .ok_or(BackendLookupError::NotConfigured(kind))?;
                let mut connected = mongo.connected.lock().await;
                if let Some(backend) = connected.as_ref() {
                    return Ok(backend.clone());
                }
                let backend = Arc::new(
                    MongoBackend::connect(&mongo.settings.url, mongo.settings.backend_config())
                        .await?,
                );
                *connected = Some(backend.clone());
                Ok(backend)
            }
        }
    }
}
