//! Backends under test and the instrumentation shared by the cases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use test_servers::{
    EtcdCluster, EtcdOptions, MongoServer, RedisCluster, RedisOptions, RedisSentinel, RedisServer,
    TlsClientAuth,
};
use turnstile_lock::backend::{
    AcquireOutcome, AcquireRequest, LockSnapshot, MongoBackend, MongoBackendConfig,
    WakeSubscription,
};
use turnstile_lock::{
    Backend, EtcdBackend, EtcdBackendConfig, LockResult, Locker, RedisBackend, RedisBackendConfig,
    RetryPolicy,
};

// The cases take it from here; it lives in `support`, shared with the other test binaries.
pub use crate::support::eventually;
use crate::support::launch;
use crate::support::tls::mutual_tls_config;

/// A backend under test, wrapped in a counter, plus whatever keeps its server alive.
pub struct Harness {
    pub backend: Arc<CountingBackend>,
    _server: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Harness {
    /// Wraps `backend` in a [`CountingBackend`], keeping `server` (if any) alive with it.
    fn new(
        backend: impl Backend + 'static,
        server: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Self {
        Harness {
            backend: Arc::new(CountingBackend::new(Arc::new(backend))),
            _server: server,
        }
    }

    /// A locker with a generous hang guard (no test should ever wait this long).
    pub fn locker(&self) -> Locker {
        Locker::from_arc(self.backend.clone()).with_retry(
            RetryPolicy::new()
                .total_time(Duration::from_secs(20))
                .retry_delay(Duration::from_millis(200)),
        )
    }

    /// The raw backend (behind the counter).
    pub fn raw(&self) -> &dyn Backend {
        self.backend.as_ref()
    }
}

/// Starts an in-memory backend.
pub async fn memory() -> Harness {
    Harness::new(turnstile_lock::MemoryBackend::new(), None)
}

/// Starts a real redis-server on a free port and connects a backend to it.
pub async fn redis() -> Harness {
    let server = launch("redis-server starts", RedisServer::start).await;
    let backend = RedisBackend::connect(RedisBackendConfig::new(server.url()))
        .await
        .expect("connect to redis");
    Harness::new(backend, Some(Box::new(server)))
}

/// Starts a TLS-only redis-server (mutual TLS, certificates generated for it) and connects a
/// backend with the CA file and a client certificate.
pub async fn redis_tls() -> Harness {
    let server = launch("TLS redis-server starts", || {
        RedisServer::start_with(&RedisOptions::new().tls(TlsClientAuth::Required))
    })
    .await;
    let files = server.tls_files().expect("certificates").clone();
    let backend = RedisBackend::connect(mutual_tls_config(server.url(), &files))
        .await
        .expect("connect to redis over TLS");
    Harness::new(backend, Some(Box::new(server)))
}

/// Connects a backend to a Redis Cluster (3 primaries, 3 replicas) shared by this binary's
/// tests, under a key prefix of its own.
pub async fn redis_cluster() -> Harness {
    let cluster = launch("Redis Cluster starts", RedisCluster::shared).await;
    let config = RedisBackendConfig::new(cluster.url());
    connect_with_own_prefix(config, cluster, "connect to the cluster").await
}

/// As [`redis_cluster`], on a TLS cluster (mutual TLS, `rediss+cluster://`).
pub async fn redis_cluster_tls() -> Harness {
    let cluster = launch("TLS Redis Cluster starts", RedisCluster::shared_tls).await;
    let files = cluster.tls_files().expect("certificates").clone();
    let config = mutual_tls_config(cluster.url(), &files);
    connect_with_own_prefix(config, cluster, "connect to the cluster over TLS").await
}

/// Connects a backend through Redis Sentinel (a master, a replica, three sentinels) shared
/// by this binary's tests, under a key prefix of its own.
pub async fn redis_sentinel() -> Harness {
    let setup = shared_sentinel().await;
    let config = RedisBackendConfig::new(setup.url());
    connect_with_own_prefix(config, setup, "connect through the sentinels").await
}

/// As [`redis_sentinel`], with every grant acknowledged by the replica
/// (`min_replica_acks(1, 1 s)`).
pub async fn redis_sentinel_acks() -> Harness {
    let setup = shared_sentinel().await;
    let config = RedisBackendConfig::new(setup.url()).min_replica_acks(1, Duration::from_secs(1));
    connect_with_own_prefix(config, setup, "connect through the sentinels").await
}

async fn shared_sentinel() -> Arc<RedisSentinel> {
    launch("Redis Sentinel setup starts", RedisSentinel::shared).await
}

/// Connects `config` under a fresh key prefix, so tests sharing one server never see each
/// other's keys, and keeps `server` alive as long as the harness.
async fn connect_with_own_prefix(
    config: RedisBackendConfig,
    server: impl std::any::Any + Send + Sync,
    connecting: &str,
) -> Harness {
    let prefix = format!("t{}:", uuid::Uuid::new_v4().simple());
    let backend = RedisBackend::connect(config.key_prefix(prefix))
        .await
        .unwrap_or_else(|error| panic!("{connecting}: {error:?}"));
    Harness::new(backend, Some(Box::new(server)))
}

/// Connects a MongoDB backend, in a database of its own, to the test server (`MONGODB_URI`'s,
/// else a SecantusDB process shared by this binary's tests). `None` skips the test when no
/// server is installed; under `CI=true` that panics instead.
pub async fn mongo() -> Option<Harness> {
    let server = tokio::task::spawn_blocking(MongoServer::shared_or_skip)
        .await
        .expect("launcher thread")?;
    let database = format!("conformance_{}", uuid::Uuid::new_v4().simple());
    let backend = MongoBackend::connect(server.uri(), MongoBackendConfig::new().database(database))
        .await
        .expect("connect to mongo");
    Some(Harness::new(backend, Some(Box::new(server))))
}

/// Connects an etcd backend, under a key prefix of its own, to one etcd member shared by
/// this binary's tests.
pub async fn etcd() -> Harness {
    let server = launch("etcd starts", EtcdCluster::shared).await;
    connect_etcd(EtcdBackendConfig::new(server.url()), server).await
}

/// Connects an etcd backend to a three-member etcd cluster (over TLS, with a user and
/// password), shared by this binary's tests, under a key prefix of its own.
pub async fn etcd_cluster_tls_auth() -> Harness {
    let cluster = launch("a three-member etcd cluster starts", shared_etcd_cluster).await;
    let files = cluster.tls_files().expect("certificates");
    let config = EtcdBackendConfig::new(cluster.url()).ca_file(&files.ca_cert);
    connect_etcd(config, cluster).await
}

fn shared_etcd_cluster() -> std::io::Result<Arc<EtcdCluster>> {
    static SHARED: Mutex<std::sync::Weak<EtcdCluster>> = Mutex::new(std::sync::Weak::new());
    test_servers::shared_instance(&SHARED, || {
        let options = EtcdOptions::new()
            .members(3)
            .tls()
            .user("turnstile", "s3cret");
        EtcdCluster::start_with(&options)
    })
}

async fn connect_etcd(config: EtcdBackendConfig, server: Arc<EtcdCluster>) -> Harness {
    let prefix = format!("t{}/", uuid::Uuid::new_v4().simple());
    let backend = EtcdBackend::connect(config.key_prefix(prefix))
        .await
        .unwrap_or_else(|error| panic!("connect to etcd: {error:?}"));
    Harness::new(backend, Some(Box::new(server)))
}

/// Counts backend calls, to check that a release costs O(1) attempts, not O(waiters).
#[derive(Debug)]
pub struct CountingBackend {
    inner: Arc<dyn Backend>,
    pub acquires: AtomicU64,
    pub releases: AtomicU64,
    per_owner: Mutex<HashMap<String, u64>>,
}

impl CountingBackend {
    fn new(inner: Arc<dyn Backend>) -> Self {
        CountingBackend {
            inner,
            acquires: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            per_owner: Mutex::new(HashMap::new()),
        }
    }

    /// Acquire calls made so far.
    pub fn acquire_calls(&self) -> u64 {
        self.acquires.load(Ordering::SeqCst)
    }

    /// Acquire calls made for one owner token.
    pub fn acquire_calls_of(&self, owner: &str) -> u64 {
        self.per_owner
            .lock()
            .unwrap()
            .get(owner)
            .copied()
            .unwrap_or(0)
    }
}

#[async_trait]
impl Backend for CountingBackend {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        *self
            .per_owner
            .lock()
            .unwrap()
            .entry(request.owner.to_owned())
            .or_default() += 1;
        self.inner.acquire(request).await
    }
    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(key, owner, max_holders).await
    }
    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        self.inner.extend(key, owner, ttl).await
    }
    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        self.inner.is_held(key, owner).await
    }
    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        self.inner.snapshot(key).await
    }
    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        self.inner.raise_fencing_floor(key, floor).await
    }
    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        self.inner.subscribe(key, owner).await
    }
    fn subscribe_if_live(&self, key: &str, owner: &str) -> Option<WakeSubscription> {
        self.inner.subscribe_if_live(key, owner)
    }
}

/// Waits until `owner` is queued on `key`.
pub async fn until_queued(harness: &Harness, key: &str, owner: &str) {
    crate::support::until_queued(harness.raw(), key, owner).await;
}
