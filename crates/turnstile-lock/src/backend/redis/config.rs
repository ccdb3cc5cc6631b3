//! [`RedisBackendConfig`]: the settings of a [`RedisBackend`], and the options read out of
//! its URL.

use std::path::PathBuf;
use std::time::Duration;

use redis::{ClientTlsConfig, TlsCertificates};

use super::RedisConnectError;
#[cfg(doc)]
use super::{RedisBackend, ReplicaAcksMissing};
#[cfg(doc)]
use crate::error::LockError;

/// Connection settings of a [`RedisBackend`].
///
/// Its `Debug` output hides the URL's password.
#[derive(Clone)]
pub struct RedisBackendConfig {
    pub(super) url: String,
    pub(super) key_prefix: String,
    pub(super) response_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) client_cert: Option<(PathBuf, PathBuf)>,
    pub(super) min_replica_acks: Option<ReplicaAcks>,
}

/// `WAIT replicas timeout` after every grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReplicaAcks {
    pub(super) replicas: u32,
    pub(super) timeout: Duration,
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

    setters! {
        /// How long one connection attempt may take (a few are made before a command fails).
        connect_timeout(timeout: Duration) => connect_timeout = timeout;

        /// Prefix of every key and channel (lets several applications share one Redis).
        key_prefix(prefix: impl Into<String>) => key_prefix = prefix.into();

        /// How long a command may take before it fails as [`LockError::BackendUnavailable`].
        response_timeout(timeout: Duration) => response_timeout = timeout;

        /// Trust only the CA certificate(s) in this PEM file for the server's certificate
        /// (instead of Mozilla's roots). Needs a `rediss://` URL.
        ca_file(path: impl Into<PathBuf>) => ca_file = Some(path.into());
    }

    /// Present this client certificate (PEM chain) and private key (PEM) to the server:
    /// mutual TLS, for servers started with `--tls-auth-clients yes`. Needs a `rediss://` URL.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Takes `min_replica_acks` and `replica_ack_timeout_ms` out of the URL's query (other
    /// query parameters stay for the client library).
    pub(super) fn take_url_options(&mut self) -> Result<(), RedisConnectError> {
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
    pub(super) fn tls_certificates(&self) -> Result<Option<TlsCertificates>, RedisConnectError> {
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
    pub(super) fn client(&self) -> Result<redis::Client, RedisConnectError> {
        let client = match self.tls_certificates()? {
            Some(certificates) => redis::Client::build_with_tls(self.url.as_str(), certificates),
            None => redis::Client::open(self.url.as_str()),
        };
        client.map_err(RedisConnectError::InvalidUrl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_ca_file_the_server_is_checked_against_mozillas_roots() {
        // No root certificate of ours (with or without a client certificate): redis' rustls
        // client then verifies the server against its built-in store, which this crate
        // builds as webpki-roots (Mozilla's), never as the no-verification "insecure" one.
        // (That it does verify: `lock_redis_modes::a_server_certificate_from_another_ca_…`.)
        let plain = RedisBackendConfig::new("rediss://h:6380/0");
        assert!(plain.tls_certificates().expect("no file to read").is_none());
        let dir = std::env::temp_dir().join(format!("turnstile-roots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (cert, key) = (dir.join("client.pem"), dir.join("client.key"));
        std::fs::write(&cert, "cert").expect("write");
        std::fs::write(&key, "key").expect("write");
        let mutual = RedisBackendConfig::new("rediss://h:6380/0").client_cert(&cert, &key);
        let certificates = mutual.tls_certificates().expect("readable").expect("some");
        assert!(
            certificates.root_cert.is_none(),
            "no CA file, no roots of ours"
        );
        let with_ca = RedisBackendConfig::new("rediss://h:6380/0").ca_file(&cert);
        let certificates = with_ca.tls_certificates().expect("readable").expect("some");
        assert_eq!(
            certificates.root_cert.as_deref(),
            Some(&b"cert"[..]),
            "the CA file replaces them"
        );
        let _ = std::fs::remove_dir_all(&dir);
        let manifest = include_str!("../../../Cargo.toml");
        assert!(
            manifest.contains("\"tls-rustls-webpki-roots\""),
            "redis built with Mozilla's roots"
        );
        assert!(
            !manifest.contains("insecure"),
            "and never without verification"
        );
    }

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
