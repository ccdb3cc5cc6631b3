//! What the examples share: the backend named on the command line, and the tests' servers.

use turnstile_lock::{Locker, MemoryBackend, RedisBackend, RedisBackendConfig};

/// A locker on the backend the first argument names: a `redis://` (or `rediss://`) URL, else
/// the in-process memory backend.
pub async fn locker_from_args() -> Result<Locker, turnstile_lock::LockError> {
    match std::env::args().nth(1) {
        Some(url) => locker_on_redis(&url, "examples:").await,
        None => Ok(Locker::new(MemoryBackend::new())),
    }
}

/// A locker on the Redis at `url`, its keys under `prefix`.
pub async fn locker_on_redis(url: &str, prefix: &str) -> Result<Locker, turnstile_lock::LockError> {
    let backend = RedisBackend::connect(RedisBackendConfig::new(url).key_prefix(prefix)).await?;
    Ok(Locker::new(backend))
}

/// Runs `example` on the memory backend and on a real redis-server started for the test.
#[cfg(test)]
pub async fn on_every_backend<F, Fut>(example: F)
where
    F: Fn(Locker) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    example(Locker::new(MemoryBackend::new())).await;
    let server = test_servers::RedisServer::start().expect("redis-server starts");
    let locker = locker_on_redis(server.url(), "examples-test:")
        .await
        .expect("connect to redis");
    example(locker).await;
    server.stop();
}
