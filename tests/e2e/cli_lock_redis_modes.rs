//! `turnstile lock` end to end against Redis as production runs it: the built binary over TLS
//! (CA file and client certificate from `TURNSTILE_REDIS_*`), a rejected server certificate
//! reported clearly (exit 69), an ACL user in the URL, a `redis+cluster://` URL (and
//! `rediss+cluster://` with mutual TLS), a
//! `redis+sentinel://` URL (with and without `?min_replica_acks=1`), `rediss+sentinel://` with
//! mutual TLS, and the controller's Redis settings (`Backends`) over TLS.

use crate::support::child;
use crate::support::launch;
use crate::support::output;

use std::process::{Output, Stdio};
use std::time::Duration;

use test_servers::{
    RedisCluster, RedisOptions, RedisSentinel, RedisServer, TlsClientAuth, TlsFiles,
};
use tokio::process::Command;
use turnstile_api::BackendKind;
use turnstile_controller::runtime::backends::{Backends, RedisTlsFiles};
use turnstile_lock::Locker;

use child::{finish_within, spawn_captured};
use launch::launch;
use output::{stderr, stdout};

/// Upper bound on anything that should finish in a few seconds, even on a loaded box.
const PATIENCE: Duration = Duration::from_secs(60);
const BACKEND_UNAVAILABLE: i32 = 69;

async fn start(options: RedisOptions) -> RedisServer {
    launch(
        move || RedisServer::start_with(&options),
        "redis-server starts",
    )
    .await
}

/// `turnstile lock --backend URL KEY -- sh -c SCRIPT` with exactly the `TURNSTILE_REDIS_*`
/// variables given.
async fn lock(url: &str, key: &str, env: &[(&str, &std::path::Path)], script: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_turnstile"));
    command
        .arg("lock")
        .args(["--backend", url, key, "--wait", "10s"])
        .args(["--", "sh", "-c", script])
        .env_remove("TURNSTILE_BACKEND_URL")
        .env_remove("TURNSTILE_REDIS_CA_FILE")
        .env_remove("TURNSTILE_REDIS_CLIENT_CERT")
        .env_remove("TURNSTILE_REDIS_CLIENT_KEY");
    for (name, value) in env {
        command.env(name, value);
    }
    let child = spawn_captured(&mut command, Stdio::null(), "turnstile lock");
    finish_within(PATIENCE, child, "turnstile lock").await
}

/// `turnstile lock` could not reach or use the backend: exit 69. Its stderr.
fn unavailable(output: &Output) -> String {
    let message = stderr(output);
    assert_eq!(output.status.code(), Some(BACKEND_UNAVAILABLE), "{message}");
    message
}

/// `turnstile lock` of `key` printing its fencing token: it must exit 0. The token.
async fn token_from_lock(url: &str, key: &str, env: &[(&str, &std::path::Path)]) -> u64 {
    let output = lock(url, key, env, "echo $TURNSTILE_FENCING_TOKEN").await;
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    stdout(&output).trim().parse().expect("a fencing token")
}

/// `turnstile lock` of `key` that must not get to run its command: exit 69, nothing on
/// stdout. Its stderr.
async fn refused_lock(url: &str, key: &str, env: &[(&str, &std::path::Path)]) -> String {
    let output = lock(url, key, env, "echo ran").await;
    let message = unavailable(&output);
    assert_eq!(stdout(&output), "", "the command must not run: {message}");
    message
}

fn mtls_env(files: &TlsFiles) -> Vec<(&'static str, &std::path::Path)> {
    vec![
        ("TURNSTILE_REDIS_CA_FILE", files.ca_cert.as_path()),
        ("TURNSTILE_REDIS_CLIENT_CERT", files.client_cert.as_path()),
        ("TURNSTILE_REDIS_CLIENT_KEY", files.client_key.as_path()),
    ]
}

#[tokio::test]
async fn lock_over_mutual_tls_runs_the_command_with_increasing_tokens() {
    let server = start(RedisOptions::new().tls(TlsClientAuth::Required)).await;
    let files = server.tls_files().expect("certificates").clone();
    let env = mtls_env(&files);
    let mut tokens = Vec::new();
    for _ in 0..2 {
        tokens.push(token_from_lock(server.url(), "tls-job", &env).await);
    }
    assert!(tokens[1] > tokens[0], "{tokens:?}");
}

#[tokio::test]
async fn a_rejected_server_certificate_is_reported_and_exits_69() {
    let server = start(RedisOptions::new().tls(TlsClientAuth::Optional)).await;
    let files = server.tls_files().expect("certificates").clone();
    let wrong_ca = [("TURNSTILE_REDIS_CA_FILE", files.other_ca_cert.as_path())];
    let message = refused_lock(server.url(), "tls-job", &wrong_ca).await;
    assert!(
        message.contains("TLS certificate was rejected") && message.contains("UnknownIssuer"),
        "{message}"
    );

    // Half a client certificate pair is refused before connecting.
    let half_a_pair = [("TURNSTILE_REDIS_CLIENT_CERT", files.client_cert.as_path())];
    let message = refused_lock(server.url(), "tls-job", &half_a_pair).await;
    assert!(message.contains("TURNSTILE_REDIS_CLIENT_KEY"), "{message}");
}

#[tokio::test]
async fn lock_as_an_acl_user_and_a_wrong_password_is_reported() {
    let server = start(RedisOptions::new().password("admin-secret")).await;
    let reply = server
        .command(&[
            "ACL",
            "SETUSER",
            "ci",
            "on",
            ">ci-secret",
            "~turnstile:*",
            "&turnstile:*",
            "+@all",
        ])
        .expect("ACL SETUSER");
    assert_eq!(reply, "+OK\r\n");
    let port = server.port();
    let as_ci = format!("redis://ci:ci-secret@127.0.0.1:{port}/");
    assert_eq!(token_from_lock(&as_ci, "acl-job", &[]).await, 1);

    let wrong_password = format!("redis://ci:not-it@127.0.0.1:{port}/");
    let message = refused_lock(&wrong_password, "acl-job", &[]).await;
    assert!(message.contains("refused the credentials"), "{message}");
    assert!(!message.contains("not-it"), "password leaked: {message}");
}

#[tokio::test]
async fn controller_backends_serve_redis_over_mutual_tls() {
    let server = start(RedisOptions::new().tls(TlsClientAuth::Required)).await;
    let files = server.tls_files().expect("certificates").clone();
    let tls = RedisTlsFiles::new(
        Some(files.ca_cert.clone()),
        Some(files.client_cert.clone()),
        Some(files.client_key.clone()),
    );
    let backends =
        Backends::with_redis_tls(BackendKind::Memory, Some(server.url().to_owned()), tls);
    let backend = backends.get(BackendKind::Redis).await.expect("connected");
    let locker = Locker::from_arc(backend);
    let lock = locker
        .lock("controller/tls", Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire over TLS");
    lock.release().await.expect("release");

    // Without the CA file the server's certificate is rejected, on every attempt.
    let backends = Backends::with_redis_tls(
        BackendKind::Memory,
        Some(server.url().to_owned()),
        Ok(RedisTlsFiles::default()),
    );
    let error = backends
        .get(BackendKind::Redis)
        .await
        .expect_err("untrusted certificate");
    assert!(
        format!("{:?}", anyhow_chain(&error)).contains("certificate was rejected"),
        "{error:?}"
    );
}

fn anyhow_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut current = error.source();
    while let Some(source) = current {
        parts.push(source.to_string());
        current = source.source();
    }
    parts.join(": ")
}

#[tokio::test]
async fn lock_on_a_redis_cluster_url() {
    let cluster = launch(RedisCluster::start, "Redis Cluster starts").await;
    let mut tokens = Vec::new();
    // Keys on different slots: each is served by the primary that owns it.
    for key in ["cluster-a", "cluster-b", "cluster-a"] {
        tokens.push(token_from_lock(cluster.url(), key, &[]).await);
    }
    assert_eq!(tokens, [1, 1, 2]);
}

#[tokio::test]
async fn lock_on_a_redis_sentinel_url_with_and_without_replica_acks() {
    let setup = launch(RedisSentinel::start, "Redis Sentinel setup starts").await;
    let acked = format!(
        "{}?min_replica_acks=1&replica_ack_timeout_ms=500",
        setup.url()
    );
    let mut tokens = Vec::new();
    for url in [setup.url(), acked.as_str()] {
        tokens.push(token_from_lock(url, "sentinel-job", &[]).await);
    }
    assert_eq!(tokens, [1, 2]);
    // The grants went to the master the sentinels name.
    let master = setup.master_port().expect("master");
    let fence = setup
        .node_command(master, &["GET", "turnstile:{sentinel-job}:fence"])
        .expect("GET");
    assert!(fence.ends_with("2\r\n"), "{fence:?}");

    let wrong = setup.url().replace("/turnstile", "/nosuchmaster");
    unavailable(&lock(&wrong, "sentinel-job", &[], "true").await);

    // The replica cut off (its reconnects fail: a wrong masterauth): no replica acknowledges
    // the grant, so `turnstile lock` exits 69 and the command does not run.
    setup.cut_off_replica(master).expect("cut the replica off");
    let message = refused_lock(&acked, "sentinel-cut", &[]).await;
    assert!(message.contains("replica"), "{message}");
}

#[tokio::test]
async fn lock_on_a_rediss_sentinel_url_over_mutual_tls() {
    let setup = launch(RedisSentinel::start_tls, "TLS Redis Sentinel setup starts").await;
    let files = setup.tls_files().expect("certificates").clone();
    let token = token_from_lock(setup.url(), "tls-sentinel-job", &mtls_env(&files)).await;
    assert_eq!(token, 1);
}

#[tokio::test]
async fn lock_on_a_rediss_cluster_url_over_mutual_tls() {
    let cluster = launch(RedisCluster::start_tls, "TLS Redis Cluster starts").await;
    let files = cluster.tls_files().expect("certificates").clone();
    let env = mtls_env(&files);
    let mut tokens = Vec::new();
    for key in ["cluster-a", "cluster-b", "cluster-a"] {
        tokens.push(token_from_lock(cluster.url(), key, &env).await);
    }
    assert_eq!(tokens, [1, 1, 2]);
}
