//! Mutual TLS against a test server's generated certificates.

use std::time::Duration;

use test_servers::TlsFiles;
use turnstile_lock::backend::redis::RedisConnectError;
use turnstile_lock::{RedisBackend, RedisBackendConfig};

/// A config for `url` that trusts the test CA and presents the test client certificate.
pub fn mutual_tls_config(url: &str, files: &TlsFiles) -> RedisBackendConfig {
    RedisBackendConfig::new(url)
        .ca_file(&files.ca_cert)
        .client_cert(&files.client_cert, &files.client_key)
}

/// Connects to `url` trusting only a CA that did not sign the servers' certificates, and
/// asserts the connection is refused with a clear error: backend unavailable, the
/// certificate rejected as `UnknownIssuer`.
pub async fn assert_an_unknown_ca_is_rejected(url: &str, files: &TlsFiles) {
    let error = RedisBackend::connect(
        RedisBackendConfig::new(url)
            .ca_file(&files.other_ca_cert)
            .client_cert(&files.client_cert, &files.client_key)
            .connect_timeout(Duration::from_millis(500)),
    )
    .await
    .expect_err("a wrong CA fails");
    assert!(error.is_backend_unavailable(), "{error}");
    assert!(
        matches!(
            RedisConnectError::find(&error),
            Some(RedisConnectError::CertificateRejected { reason, .. }) if reason == "UnknownIssuer"
        ),
        "{error:?}"
    );
}
