//! Redis as production runs it, against real servers: TLS (server certificate checked against a
//! CA file), mutual TLS, a rejected certificate as a typed error, and ACL users / passwords in
//! the URL.

mod support;

use std::time::Duration;

use support::grants::{acquired_within, is_taken, locker_retrying};
use support::launch;
use support::tls::mutual_tls_config;
use test_servers::{RedisOptions, RedisServer, TlsClientAuth, TlsFiles};
use turnstile_lock::backend::redis::RedisConnectError;
use turnstile_lock::{LockError, RedisBackend, RedisBackendConfig};

const TTL: Duration = Duration::from_secs(30);

async fn start(options: RedisOptions) -> RedisServer {
    launch("redis-server starts", move || {
        RedisServer::start_with(&options)
    })
    .await
}

fn tls(server: &RedisServer) -> TlsFiles {
    server.tls_files().expect("a TLS server").clone()
}

/// Two owners take turns on one key: exclusion, increasing tokens and a pushed hand-off.
async fn exercise(backend: RedisBackend) {
    let locker = locker_retrying(backend, Duration::from_secs(10), Duration::from_secs(5));
    let first = locker
        .lock("tls-key", TTL)
        .acquire()
        .await
        .expect("acquire");
    assert!(is_taken(&locker.lock("tls-key", TTL)).await);
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("tls-key", TTL).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first_token = first.fencing_token();
    first.release().await.expect("release");
    // Polling every 5 s: a prompt grant is the pub/sub hand-off (over TLS too).
    let second = acquired_within(Duration::from_secs(3), waiter, "handed over promptly").await;
    assert!(second.fencing_token() > first_token);
    assert!(second.is_locked().await.expect("is_locked"));
    second.release().await.expect("release");
}

fn connect_error(result: Result<RedisBackend, LockError>) -> LockError {
    match result {
        Ok(_) => panic!("connect should have failed"),
        Err(error) => error,
    }
}

fn typed(error: &LockError) -> &RedisConnectError {
    RedisConnectError::find(error).unwrap_or_else(|| panic!("no RedisConnectError in {error:?}"))
}

#[tokio::test]
async fn tls_with_a_ca_file_acquires_and_releases() {
    let server = start(RedisOptions::new().tls(TlsClientAuth::Optional)).await;
    let files = tls(&server);
    let backend =
        RedisBackend::connect(RedisBackendConfig::new(server.url()).ca_file(&files.ca_cert))
            .await
            .expect("connect over TLS");
    exercise(backend).await;
}

#[tokio::test]
async fn mutual_tls_needs_and_accepts_the_client_certificate() {
    let server = start(RedisOptions::new().tls(TlsClientAuth::Required)).await;
    let files = tls(&server);
    let backend = RedisBackend::connect(mutual_tls_config(server.url(), &files))
        .await
        .expect("connect with a client certificate");
    exercise(backend).await;

    // Without the certificate the server refuses the handshake.
    let refused = connect_error(
        RedisBackend::connect(
            RedisBackendConfig::new(server.url())
                .ca_file(&files.ca_cert)
                .connect_timeout(Duration::from_millis(500)),
        )
        .await,
    );
    assert!(refused.is_backend_unavailable(), "{refused:?}");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_a_clear_typed_error() {
    let server = start(RedisOptions::new().tls(TlsClientAuth::Optional)).await;
    let files = tls(&server);
    let error = connect_error(
        RedisBackend::connect(RedisBackendConfig::new(server.url()).ca_file(&files.other_ca_cert))
            .await,
    );
    assert!(error.is_backend_unavailable(), "{error:?}");
    match typed(&error) {
        RedisConnectError::CertificateRejected { reason, .. } => {
            assert!(reason.contains("UnknownIssuer"), "{reason}");
        }
        other => panic!("expected CertificateRejected, got {other:?}"),
    }
    let message = typed(&error).to_string();
    assert!(message.contains("certificate was rejected"), "{message}");

    // Mozilla's roots (no CA file) do not know the test CA either.
    let error = connect_error(RedisBackend::connect(RedisBackendConfig::new(server.url())).await);
    assert!(
        matches!(typed(&error), RedisConnectError::CertificateRejected { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn unreadable_tls_files_and_tls_files_without_tls_are_typed_errors() {
    let missing = connect_error(
        RedisBackend::connect(
            RedisBackendConfig::new("rediss://127.0.0.1:1/").ca_file("/nonexistent/ca.pem"),
        )
        .await,
    );
    assert!(
        matches!(
            typed(&missing),
            RedisConnectError::ReadFile {
                what: "CA file",
                ..
            }
        ),
        "{missing:?}"
    );
    let plain = connect_error(
        RedisBackend::connect(RedisBackendConfig::new("redis://127.0.0.1:1/").ca_file("/x")).await,
    );
    assert!(
        matches!(typed(&plain), RedisConnectError::TlsSettingsWithoutTls),
        "{plain:?}"
    );
}

#[tokio::test]
async fn password_and_acl_user_in_the_url() {
    let server = start(RedisOptions::new().password("default-secret")).await;
    let port = server.port();
    // An ACL user that may do what the backend does: its keys, channels, scripts.
    let reply = server
        .command(&[
            "ACL",
            "SETUSER",
            "locker",
            "on",
            ">locker-secret",
            "~turnstile:*",
            "&turnstile:*",
            "+@all",
        ])
        .expect("ACL SETUSER");
    assert_eq!(reply, "+OK\r\n");

    let backend = RedisBackend::connect(RedisBackendConfig::new(format!(
        "redis://:default-secret@127.0.0.1:{port}/"
    )))
    .await
    .expect("connect with the default user's password");
    exercise(backend).await;

    let backend = RedisBackend::connect(RedisBackendConfig::new(format!(
        "redis://locker:locker-secret@127.0.0.1:{port}/"
    )))
    .await
    .expect("connect as an ACL user");
    exercise(backend).await;

    for url in [
        format!("redis://locker:wrong@127.0.0.1:{port}/"),
        format!("redis://:wrong@127.0.0.1:{port}/"),
        format!("redis://127.0.0.1:{port}/"),
    ] {
        let error = connect_error(RedisBackend::connect(RedisBackendConfig::new(&url)).await);
        assert!(
            matches!(
                typed(&error),
                RedisConnectError::AuthenticationFailed { .. }
            ),
            "{url}: {error:?}"
        );
        assert!(
            !format!("{error:?} {error}").contains("wrong"),
            "the password leaked into the error: {error:?}"
        );
    }
}

#[test]
fn config_debug_hides_the_password() {
    let config = RedisBackendConfig::new("rediss://user:hunter2@redis.example:6380/0");
    let debug = format!("{config:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(debug.contains("redis.example:6380"), "{debug}");
}

#[tokio::test]
async fn a_replica_ack_timeout_must_be_below_the_response_timeout() {
    let server = start(RedisOptions::new()).await;
    // The default response timeout is 5 s: an acknowledgement wait of 5 s could never end
    // before the reply it waits in.
    let error = connect_error(
        RedisBackend::connect(
            RedisBackendConfig::new(server.url()).min_replica_acks(1, Duration::from_secs(5)),
        )
        .await,
    );
    assert!(
        matches!(
            typed(&error),
            RedisConnectError::ReplicaAcksTimeout { acks, response }
                if *acks == Duration::from_secs(5) && *response == Duration::from_secs(5)
        ),
        "{error:?}"
    );
    // The default (1 s) is below it: the backend connects.
    RedisBackend::connect(RedisBackendConfig::new(format!(
        "{}?min_replica_acks=1",
        server.url()
    )))
    .await
    .expect("the default acknowledgement timeout");
}
