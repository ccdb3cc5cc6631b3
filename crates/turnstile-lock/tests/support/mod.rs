//! Code shared by the lock engine's test binaries (`mod support;` in each).

// Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

pub mod contended;
pub mod grants;
pub mod tls;

use std::time::Duration;

/// Polls `condition` every 5 ms until it holds; panics after 10 s (a hang guard, not a
/// performance assertion).
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `owner` is queued for `key` on `backend`.
pub async fn until_queued(backend: &dyn turnstile_lock::Backend, key: &str, owner: &str) {
    eventually(&format!("{owner} is queued on {key}"), || async {
        backend
            .snapshot(key)
            .await
            .expect("snapshot")
            .waiters
            .iter()
            .any(|waiter| waiter == owner)
    })
    .await;
}

/// Runs a test server's launcher `start` on a blocking thread (it waits for processes to come
/// up); panics with `what` and the error when it fails.
pub async fn launch<T, E>(what: &str, start: impl FnOnce() -> Result<T, E> + Send + 'static) -> T
where
    T: Send + 'static,
    E: std::fmt::Debug + Send + 'static,
{
    tokio::task::spawn_blocking(start)
        .await
        .expect("launcher thread")
        .unwrap_or_else(|error| panic!("{what}: {error:?}"))
}
