//! The typed errors of the Redis backend: connect-time causes a person has to fix, and
//! missing replica acknowledgements.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::BACKEND;
#[cfg(doc)]
use super::{RedisBackend, RedisBackendConfig};
use crate::error::LockError;

/// Why [`RedisBackend::connect`] failed, when the cause is one a person has to fix: kept as
/// the `source` of [`LockError::BackendUnavailable`] (find it with
/// [`RedisConnectError::find`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConnectError {
    /// TLS: the server's certificate is not signed by a trusted CA, expired, or does not name
    /// the host of the URL.
    #[error(
        "the Redis server's TLS certificate was rejected: {reason} (is the CA file \
         (ca_file, TURNSTILE_REDIS_CA_FILE) the CA that signed it, and does it name the URL's host?)"
    )]
    CertificateRejected {
        /// What rustls objected to (`UnknownIssuer`, `NotValidForName`, `Expired`, ...).
        reason: String,
        /// The client library's error.
        #[source]
        source: redis::RedisError,
    },
    /// The server refused the user name / password of the URL, or wants one.
    #[error("the Redis server refused the credentials (user name and password in the URL)")]
    AuthenticationFailed {
        /// The client library's error.
        #[source]
        source: redis::RedisError,
    },
    /// A TLS file could not be read.
    #[error("cannot read the {what} {path:?}")]
    ReadFile {
        /// `CA file`, `client certificate` or `client key`.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A CA file or client certificate was given for a URL without TLS.
    #[error("a CA file or client certificate needs a rediss:// URL (TLS)")]
    TlsSettingsWithoutTls,
    /// The URL (or a PEM file) could not be used.
    #[error("invalid Redis URL or TLS material")]
    InvalidUrl(#[source] redis::RedisError),
    /// [`RedisBackendConfig::min_replica_acks`] was asked of a Redis Cluster.
    #[error("min_replica_acks is not supported on Redis Cluster")]
    ReplicaAcksOnCluster,
    /// [`RedisBackendConfig::min_replica_acks`]' timeout is not shorter than the response
    /// timeout.
    #[error("the min_replica_acks timeout ({acks:?}) must be shorter than the response timeout ({response:?})")]
    ReplicaAcksTimeout {
        /// The `WAIT` timeout.
        acks: Duration,
        /// The response timeout.
        response: Duration,
    },
}

/// A grant that fewer replicas than [`RedisBackendConfig::min_replica_acks`] asks for
/// acknowledged in time: it was released (best effort) and the acquire failed with
/// [`LockError::BackendUnavailable`], whose `source` this is.
#[derive(Debug, thiserror::Error)]
#[error("only {acknowledged} of {wanted} replica(s) acknowledged the grant within {timeout:?}; released it")]
pub struct ReplicaAcksMissing {
    /// Replicas that acknowledged.
    pub acknowledged: i64,
    /// Replicas asked for.
    pub wanted: u32,
    /// The `WAIT` timeout.
    pub timeout: Duration,
}

impl RedisConnectError {
    /// The `RedisConnectError` in `error`'s source chain, if any.
    pub fn find<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut current = Some(error);
        while let Some(error) = current {
            if let Some(found) = error.downcast_ref::<Self>() {
                return Some(found);
            }
            current = error.source();
        }
        None
    }

    /// Sorts a connect-time client error into a typed cause, or `None` for the ordinary
    /// "cannot reach the server" kind.
    fn classify(error: redis::RedisError) -> Result<Self, redis::RedisError> {
        if error.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(error.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        {
            return Ok(RedisConnectError::AuthenticationFailed { source: error });
        }
        match rejected_certificate(&error) {
            Some(reason) => Ok(RedisConnectError::CertificateRejected {
                reason,
                source: error,
            }),
            None => Err(error),
        }
    }
}

/// The rustls certificate complaint somewhere in `error`'s chain. rustls' error travels inside
/// an `io::Error` (whose own `source` skips it, hence the `get_ref`), which redis keeps in an
/// `Arc` (a type of its own for `downcast_ref`).
fn rejected_certificate(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let mut current = Some(error);
    while let Some(error) = current {
        let unshared: &(dyn std::error::Error + 'static) = match error.downcast_ref::<Shared>() {
            Some(shared) => shared.as_ref(),
            None => error,
        };
        let tls = unshared.downcast_ref::<rustls::Error>().or_else(|| {
            unshared
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        match tls {
            Some(rustls::Error::InvalidCertificate(reason)) => return Some(format!("{reason:?}")),
            Some(
                other @ (rustls::Error::NoCertificatesPresented
                | rustls::Error::UnsupportedNameType),
            ) => return Some(other.to_string()),
            _ => {}
        }
        current = error.source();
    }
    // The cluster client keeps only the text of its initial connections' errors: rustls'
    // `InvalidCertificate` displays as "invalid peer certificate: <reason>".
    const INVALID_CERTIFICATE: &str = "invalid peer certificate: ";
    let text = error.to_string();
    let reason = &text[text.find(INVALID_CERTIFICATE)? + INVALID_CERTIFICATE.len()..];
    let reason: String = reason
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!reason.is_empty()).then_some(reason)
}

/// Wraps a connect-time client error, typed when a person has to fix its cause.
pub(super) fn connect_error(
    operation: &'static str,
) -> impl FnOnce(redis::RedisError) -> LockError {
    move |error| match RedisConnectError::classify(error) {
        Ok(typed) => LockError::backend(BACKEND, operation, typed),
        Err(error) => LockError::backend(BACKEND, operation, error),
    }
}
