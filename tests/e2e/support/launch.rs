//! Starting the test servers (redis-server, MongoDB, ...) from async tests: their start
//! functions block until the processes answer, so they run on a blocking thread.

/// `start` run on a blocking thread (for a launcher that may skip, returning an Option).
pub async fn blocking<T: Send + 'static>(start: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(start)
        .await
        .expect("launcher thread")
}

/// The server `start` starts on a blocking thread; panics with `what` if it does not start.
pub async fn launch<T, E>(start: impl FnOnce() -> Result<T, E> + Send + 'static, what: &str) -> T
where
    T: Send + 'static,
    E: std::fmt::Debug + Send + 'static,
{
    blocking(start)
        .await
        .unwrap_or_else(|error| panic!("{what}: {error:?}"))
}
