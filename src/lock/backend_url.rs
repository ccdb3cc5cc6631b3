//! `--backend URL`: which lock backend `turnstile lock` talks to, chosen by the URL's scheme.

use std::fmt;
use std::sync::Arc;

use turnstile_controller::runtime::backends::{
    EtcdSettings, RedisTlsFiles, ETCD_CA_FILE_ENV, ETCD_CLIENT_CERT_ENV, ETCD_CLIENT_KEY_ENV,
};
use turnstile_lock::backend::{MongoBackend, MongoBackendConfig};
use turnstile_lock::{
    Backend, EtcdBackend, LockError, LockResult, RedisBackend, RedisBackendConfig,
};

/// A backend URL accepted by `turnstile lock`. Its `Debug` output hides the URL, which may
/// carry a password.
#[derive(Clone, PartialEq, Eq)]
pub enum BackendUrl {
    /// `redis://`, `rediss://`, `redis+unix://`, `unix://`, a Redis Cluster's
    /// `redis+cluster://h1:p1,h2:p2`, or a Sentinel-managed master's
    /// `redis+sentinel://s1:p1,s2:p2/MASTERNAME` (`rediss+…` for TLS): a [`RedisBackend`].
    Redis(String),
    /// `mongodb://` or `mongodb+srv://`: a [`MongoBackend`].
    Mongo(String),
    /// `etcd://h1:p1,h2:p2` or `etcds://…` (TLS): an [`EtcdBackend`].
    Etcd(String),
}

impl fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BackendUrl::{}(<redacted>)", self.kind())
    }
}

/// Why a `--backend` value was refused (clap prints it as the usage error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendUrlError {
    /// `memory`: an in-process backend cannot be shared with any other process.
    #[error(
        "the memory backend lives inside one process, so no other process could ever see the \
         lock; use a shared backend: redis://HOST:PORT, mongodb://HOST:PORT or etcd://HOST:PORT"
    )]
    Memory,
    /// Any other scheme, or no scheme at all.
    #[error(
        "unsupported backend URL {0:?}: expected redis://, rediss://, redis+cluster://, \
         redis+sentinel://, mongodb://, mongodb+srv://, etcd:// or etcds://"
    )]
    Unsupported(String),
}

impl BackendUrl {
    /// Parses a `--backend` value by its scheme (case-insensitive).
    pub fn parse(url: &str) -> Result<Self, BackendUrlError> {
        let scheme = url
            .split_once("://")
            .map_or(url, |(scheme, _)| scheme)
            .to_ascii_lowercase();
        match scheme.as_str() {
            "redis" | "rediss" | "redis+unix" | "unix" | "redis+cluster" | "rediss+cluster"
            | "redis+sentinel" | "rediss+sentinel" => Ok(BackendUrl::Redis(url.to_owned())),
            "mongodb" | "mongodb+srv" => Ok(BackendUrl::Mongo(url.to_owned())),
            "etcd" | "etcds" => Ok(BackendUrl::Etcd(url.to_owned())),
            "memory" => Err(BackendUrlError::Memory),
            // Only the scheme: the rest may hold credentials.
            _ => Err(BackendUrlError::Unsupported(format!("{scheme}://…"))),
        }
    }

    /// `redis` or `mongo`, as the lock engine names its backends.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendUrl::Redis(_) => "redis",
            BackendUrl::Mongo(_) => "mongo",
            BackendUrl::Etcd(_) => "etcd",
        }
    }

    /// Connects to the backend. Redis TLS files come from `TURNSTILE_REDIS_CA_FILE`,
    /// `TURNSTILE_REDIS_CLIENT_CERT` and `TURNSTILE_REDIS_CLIENT_KEY`; etcd's from
    /// `TURNSTILE_ETCD_CA_FILE`, `TURNSTILE_ETCD_CLIENT_CERT` and `TURNSTILE_ETCD_CLIENT_KEY`.
    pub async fn connect(&self) -> LockResult<Arc<dyn Backend>> {
        Ok(match self {
            BackendUrl::Redis(url) => {
                let tls = RedisTlsFiles::from_env()
                    .map_err(|error| LockError::backend("redis", "configure TLS", error))?;
                let config = tls.apply(RedisBackendConfig::new(url.as_str()));
                Arc::new(RedisBackend::connect(config).await?)
            }
            BackendUrl::Mongo(url) => {
                Arc::new(MongoBackend::connect(url, MongoBackendConfig::new()).await?)
            }
            BackendUrl::Etcd(url) => {
                let var = |name: &str| std::env::var_os(name).map(std::path::PathBuf::from);
                // The same rules as Redis' files (empty is unset, a certificate needs its key).
                let files = RedisTlsFiles::new(
                    var(ETCD_CA_FILE_ENV),
                    var(ETCD_CLIENT_CERT_ENV),
                    var(ETCD_CLIENT_KEY_ENV),
                )
                .map_err(|_| {
                    LockError::invalid(format!(
                        "an etcd client certificate needs its key: set both \
                         {ETCD_CLIENT_CERT_ENV} and {ETCD_CLIENT_KEY_ENV} (or neither)"
                    ))
                })?;
                let settings = EtcdSettings {
                    ca_file: files.ca_file,
                    client_cert: files.client_cert,
                    ..EtcdSettings::new(url.as_str())
                };
                Arc::new(EtcdBackend::connect(settings.backend_config()).await?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_choose_the_backend() {
        for url in [
            "redis://127.0.0.1:6379/0",
            "REDIS://h",
            "rediss://h:6380",
            "unix:///tmp/r.sock",
            "redis+cluster://a:7000,b:7001",
            "rediss+cluster://user:pw@a:7000",
            "redis+sentinel://s1:26379,s2:26379/mymaster?min_replica_acks=1",
        ] {
            assert_eq!(
                BackendUrl::parse(url).map(|b| b.kind()),
                Ok("redis"),
                "{url}"
            );
        }
        for url in ["etcd://a:2379,b:2379", "etcds://u:p@a:2379"] {
            assert_eq!(
                BackendUrl::parse(url).map(|b| b.kind()),
                Ok("etcd"),
                "{url}"
            );
        }
        for url in ["mongodb://h:27017/db", "mongodb+srv://cluster.example"] {
            assert_eq!(
                BackendUrl::parse(url).map(|b| b.kind()),
                Ok("mongo"),
                "{url}"
            );
        }
    }

    #[test]
    fn memory_and_unknown_schemes_are_refused_without_echoing_credentials() {
        assert_eq!(BackendUrl::parse("memory"), Err(BackendUrlError::Memory));
        assert_eq!(BackendUrl::parse("memory://"), Err(BackendUrlError::Memory));
        let error = BackendUrl::parse("http://user:secret@h").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
        assert!(BackendUrl::parse("localhost:6379").is_err());
    }

    #[test]
    fn debug_output_hides_the_url() {
        let url = BackendUrl::parse("redis://:hunter2@h:6379").unwrap();
        assert!(!format!("{url:?}").contains("hunter2"));
    }
}
