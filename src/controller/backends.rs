//! The lock backends the controller serves locks from, configured on the controller (never by
//! tenants): the embedded memory backend, and Redis when a URL is given. A backend that is
//! down at start-up is connected lazily, on the next reconcile that needs it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::api::BackendKind;
use crate::lock::{Backend, LockError, MemoryBackend, RedisBackend, RedisBackendConfig};

/// How long connecting to Redis may take per attempt during a reconcile.
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The backends of one controller process.
#[derive(Debug)]
pub struct Backends {
    default: BackendKind,
    memory: Arc<MemoryBackend>,
    redis: Option<LazyRedis>,
}

/// A Redis backend connected on first use (and again after a failed connect).
#[derive(Debug)]
struct LazyRedis {
    config: RedisBackendConfig,
    connected: Mutex<Option<Arc<RedisBackend>>>,
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
        }
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
            BackendKind::Mongo => false,
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
            BackendKind::Mongo => Err(BackendLookupError::NotConfigured(kind)),
        }
    }
}
