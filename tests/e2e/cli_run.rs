//! `turnstile run` as the binary, configured only by its environment, as `deploy/` passes
//! Secrets: `TURNSTILE_REDIS_URL`, `TURNSTILE_MONGO_URL`, `TURNSTILE_MONGO_DATABASE` and `TURNSTILE_MONGO_COLLECTION` (a
//! real `redis-server` and the MongoDB test server), against the fake API server. A lock on
//! each backend gets its claim granted, and the grant is in that backend under the
//! documented names: the env vars work as their flags do. `--metrics-addr` serves the probes
//! and the metrics; `--log-format json` writes JSON lines, and text logs to a pipe carry no
//! colour codes.
//!
//! Also through the binary: `--namespace` scopes the watch (and a claim that does not decode
//! is one WARN line naming it), without it every namespace is served; the TLS files come from
//! `TURNSTILE_REDIS_CA_FILE` / `_CLIENT_CERT` / `_CLIENT_KEY` (a certificate without its key
//! refuses to start); on Redis Sentinel with `TURNSTILE_REDIS_MIN_REPLICA_ACKS` the lock is
//! handed on, a grant no replica acknowledges makes the lock `Ready=False` /
//! `BackendUnavailable`, and it is granted once the replica is back.

use crate::support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use support::child::spawn_captured;
use support::launch::{blocking, launch};
use support::scrape::get;
use support::{namespace_with_a_claim, phase_of, token_of, Env, WAIT};
use test_servers::{MongoServer, RedisOptions, RedisSentinel, RedisServer, TlsClientAuth};
use tokio::process::{Child, Command};
use turnstile_api::ClaimPhase;
use turnstile_lock::backend::MongoBackendConfig;

const DATABASE: &str = "turnstile_env_test";
const COLLECTION: &str = "env_test_locks";

/// Stops `turnstile run` (SIGKILL) and returns what it logged, whole and as JSON lines.
async fn stop(mut controller: Child) -> (String, Vec<serde_json::Value>) {
    controller.start_kill().expect("stop turnstile run");
    let output = controller.wait_with_output().await.expect("output");
    let logs = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    let lines = logs
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    (logs, lines)
}

/// A free loopback address for `--metrics-addr`.
fn free_metrics_addr() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    listener.local_addr().expect("address")
}

/// `turnstile run --namespace <the test's> --log-format json` with `--metrics-addr`.
fn spawn_run(env: &Env, vars: &[(&str, &str)], metrics: std::net::SocketAddr) -> Child {
    spawn_run_with(
        env,
        &[
            "--namespace",
            &env.namespace,
            &format!("--metrics-addr={metrics}"),
        ],
        vars,
    )
}

/// `turnstile run --log-format json ARGS…` with only `vars` of the `TURNSTILE_*` variables
/// (and `RUST_LOG=info` unless `vars` sets it).
fn spawn_run_with(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_turnstile"));
    for (name, _) in std::env::vars() {
        if name.starts_with("TURNSTILE_") {
            command.env_remove(name);
        }
    }
    command
        .args(["run", "--log-format", "json"])
        .args(args)
        .env("RUST_LOG", "info")
        .envs(vars.iter().copied())
        .env("KUBECONFIG", &env.kubeconfig);
    spawn_captured(&mut command, Stdio::null(), "turnstile run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_takes_its_backends_from_the_environment() {
    let mongo = blocking(MongoServer::shared_or_skip).await;
    let redis = RedisServer::start().expect("start redis-server");
    let env = Env::new().await;
    // A level that is not the default, for one target: the filter must be read, not assumed.
    let mut vars = vec![
        ("TURNSTILE_REDIS_URL", redis.url().to_owned()),
        ("RUST_LOG", "info,turnstile_controller=debug".to_owned()),
    ];
    if let Some(mongo) = &mongo {
        vars.push(("TURNSTILE_MONGO_URL", mongo.uri().to_owned()));
        vars.push(("TURNSTILE_MONGO_DATABASE", DATABASE.to_owned()));
        vars.push(("TURNSTILE_MONGO_COLLECTION", COLLECTION.to_owned()));
    }
    let borrowed: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let metrics = free_metrics_addr();
    let controller = spawn_run(&env, &borrowed, metrics);

    env.apply_lock("on-redis", "backend: redis\nleaseDurationSeconds: 300");
    let held = env.hold("r", "on-redis", "").await;
    assert_eq!(token_of(&held), Some(1));
    let key = format!("turnstile:{{{}/on-redis}}:holders", env.namespace);
    let deadline = Instant::now() + WAIT;
    loop {
        let keys = std::process::Command::new("redis-cli")
            .args(["-p", &redis.port().to_string(), "--scan"])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        if keys.contains(&key) {
            break;
        }
        assert!(Instant::now() < deadline, "no {key} in Redis: {keys}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    if let Some(mongo) = &mongo {
        env.apply_lock("on-mongo", "backend: mongo\nleaseDurationSeconds: 300");
        env.hold("m", "on-mongo", "").await;
        // In the database and collection TURNSTILE_MONGO_DATABASE and _COLLECTION name, not
        // the default ones.
        let names = MongoBackendConfig::new()
            .database(DATABASE)
            .collection(COLLECTION);
        let snapshot = env.mongo_snapshot(mongo.uri(), names, "on-mongo").await;
        assert_eq!(snapshot.holders.len(), 1, "{snapshot:?}");
    }

    // --metrics-addr: the probes and the metrics are served there.
    assert_eq!(get(metrics, "/healthz").await.status, 200);
    assert_eq!(get(metrics, "/readyz").await.status, 200);
    let scraped = get(metrics, "/metrics").await;
    assert!(
        scraped.body.contains("turnstile_grants_total"),
        "{}",
        scraped.body
    );

    // JSON lines with a level, a message and the span's lock.
    let (logs, lines) = stop(controller).await;
    assert!(!lines.is_empty(), "no JSON log lines: {logs}");
    // The grant's line names where and what (the fields `kubectl logs | jq` selects on).
    let granted = lines.iter().find(|line| {
        line["fields"]["message"] == "claim is Held" && line["fields"]["lock"] == "on-redis"
    });
    let granted = granted.unwrap_or_else(|| panic!("no grant line: {logs}"));
    assert_eq!(granted["fields"]["namespace"], env.namespace.as_str());
    assert_eq!(granted["fields"]["claim"], "r");
    assert_eq!(granted["fields"]["token"], 1);
    // RUST_LOG=info,turnstile_controller=debug: the controller's debug lines (its Normal
    // Events are logged at debug), nobody else's, and no trace.
    assert!(
        lines.iter().any(|line| line["level"] == "DEBUG"
            && line["target"]
                .as_str()
                .is_some_and(|target| target.starts_with("turnstile_controller"))),
        "no debug line of the controller: {logs}"
    );
    assert!(
        lines.iter().all(|line| line["level"] != "TRACE"
            && (line["level"] != "DEBUG"
                || line["target"]
                    .as_str()
                    .is_some_and(|target| target.starts_with("turnstile_controller")))),
        "{logs}"
    );
    assert!(
        lines
            .iter()
            .all(|line| line.get("level").is_some() && line.get("timestamp").is_some()),
        "{logs}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line["fields"]["message"] == "controller starting"),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_scopes_the_watch_and_without_it_every_namespace_is_served() {
    let env = Env::fake_only("it stores a claim the schema would refuse").await;
    let other = format!("{}-other", env.namespace);
    let theirs = namespace_with_a_claim(&env.client, &other, "db", "theirs").await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply_claim("mine", "db", "");

    let scoped = spawn_run_with(&env, &["--namespace", &env.namespace], &[]);
    let held = env.wait_phase("mine", ClaimPhase::Held).await;
    assert_eq!(token_of(&held), Some(1));
    // A claim in the watched namespace that does not decode: skipped and named in one line.
    env.store_unvalidated_claim(
        "bad",
        "bad-claim-uid",
        json!({}),
        json!({"lockName": "db", "release": "yes please"}),
    );
    // Once it has run a pass over `db` since (so it has seen `bad` too), the scoped controller
    // has still not touched `other`.
    env.after_a_pass_over(&["db"]).await;
    let untouched = theirs.get("theirs").await.expect("get theirs");
    assert_eq!(phase_of(&untouched), None, "{untouched:?}");
    let (logs, lines) = stop(scoped).await;
    let object = format!("LockClaim/{}/bad", env.namespace);
    let skipped: Vec<_> = lines
        .iter()
        .filter(|line| line["fields"]["object"] == object.as_str())
        .collect();
    assert_eq!(skipped.len(), 1, "{logs}");
    assert_eq!(skipped[0]["level"], "WARN", "{logs}");
    assert_eq!(
        skipped[0]["fields"]["message"], "skipping an object that does not match the schema",
        "{logs}"
    );
    assert!(
        skipped[0]["fields"]["problem"]
            .as_str()
            .is_some_and(|problem| problem.contains("spec.release")),
        "the problem names the field: {logs}"
    );

    // Without --namespace: every namespace, the other one's claim granted too.
    let everywhere = spawn_run_with(&env, &[], &[]);
    let deadline = Instant::now() + WAIT;
    loop {
        let claim = theirs.get("theirs").await.expect("get theirs");
        if phase_of(&claim) == Some(ClaimPhase::Held) {
            assert_eq!(token_of(&claim), Some(1));
            break;
        }
        assert!(Instant::now() < deadline, "theirs never held: {claim:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        token_of(&env.claim("mine").await),
        Some(1),
        "mine kept its grant"
    );
    stop(everywhere).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_takes_the_redis_tls_files_from_the_environment() {
    let options = RedisOptions::new().tls(TlsClientAuth::Required);
    let redis = launch(
        move || RedisServer::start_with(&options),
        "redis-server with TLS",
    )
    .await;
    let files = redis.tls_files().expect("certificates").clone();
    assert!(redis.url().starts_with("rediss://"), "{}", redis.url());
    let env = Env::new().await;
    env.apply_lock("db", "backend: redis\nleaseDurationSeconds: 300");
    let (ca, cert, key) = (
        files.ca_cert.display().to_string(),
        files.client_cert.display().to_string(),
        files.client_key.display().to_string(),
    );
    let url = ("TURNSTILE_REDIS_URL", redis.url());
    let namespace = ["--namespace", env.namespace.as_str()];

    // A client certificate without its key: refused before anything starts.
    let half = spawn_run_with(
        &env,
        &namespace,
        &[url, ("TURNSTILE_REDIS_CLIENT_CERT", &cert)],
    );
    let output = tokio::time::timeout(WAIT, half.wait_with_output())
        .await
        .expect("exits in time")
        .expect("output");
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{said}");
    assert!(said.contains("client"), "names what is missing: {said}");

    // Without the CA file the test CA is not among the trusted roots: the server's
    // certificate is rejected and the lock says so.
    let untrusting = spawn_run_with(&env, &namespace, &[url]);
    let ready = env.wait_ready("db", "False").await;
    assert_eq!(ready.reason, "BackendUnavailable", "{ready:?}");
    assert!(ready.message.contains("certificate"), "{ready:?}");
    stop(untrusting).await;

    // The CA and the client pair from the environment: mutual TLS, the claim granted.
    let trusting = spawn_run_with(
        &env,
        &namespace,
        &[
            url,
            ("TURNSTILE_REDIS_CA_FILE", &ca),
            ("TURNSTILE_REDIS_CLIENT_CERT", &cert),
            ("TURNSTILE_REDIS_CLIENT_KEY", &key),
        ],
    );
    let held = env.hold("c", "db", "").await;
    assert_eq!(token_of(&held), Some(1));
    env.wait_ready("db", "True").await;
    stop(trusting).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sentinel_grants_wait_for_the_replica_acks_the_environment_asks_for() {
    let sentinel = launch(RedisSentinel::start, "Redis Sentinel starts").await;
    let env = Env::new().await;
    env.apply_lock("db", "backend: redis\nleaseDurationSeconds: 300");
    let controller = spawn_run_with(
        &env,
        &["--namespace", &env.namespace],
        &[
            ("TURNSTILE_REDIS_URL", sentinel.url()),
            ("TURNSTILE_REDIS_MIN_REPLICA_ACKS", "1"),
            ("TURNSTILE_REDIS_REPLICA_ACK_TIMEOUT", "300ms"),
        ],
    );
    // Hand-offs through the master Sentinel names, each grant acknowledged by the replica.
    env.apply_claim("a", "db", "");
    env.apply_claim("b", "db", "");
    assert_eq!(
        token_of(&env.wait_phase("a", ClaimPhase::Held).await),
        Some(1)
    );
    env.delete_claim("a").await;
    assert_eq!(
        token_of(&env.wait_phase("b", ClaimPhase::Held).await),
        Some(2)
    );

    // The replica cut off: the next grant is not acknowledged, so it is released again and
    // the lock reports its backend unavailable; `c` keeps waiting.
    let master = sentinel.master_port().expect("master");
    let replica = sentinel
        .cut_off_replica(master)
        .expect("cut the replica off");
    env.apply_claim("c", "db", "");
    env.delete_claim("b").await;
    let ready = env.wait_ready("db", "False").await;
    assert_eq!(ready.reason, "BackendUnavailable", "{ready:?}");
    assert_eq!(phase_of(&env.claim("c").await), Some(ClaimPhase::Pending));

    // The replica back: retried with backoff, `c` is granted with a larger token.
    let restored = sentinel
        .node_command(replica, &["CONFIG", "SET", "masterauth", ""])
        .expect("restore masterauth");
    assert_eq!(restored, "+OK\r\n");
    let held = env.wait_phase("c", ClaimPhase::Held).await;
    assert!(token_of(&held) > Some(2), "{held:?}");
    env.wait_ready("db", "True").await;
    stop(controller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_mongo_locks_from_a_mongodb_srv_url() {
    use support::dns::MongoSrv;

    let Some(mongo) = blocking(MongoServer::shared_or_skip).await else {
        return;
    };
    let Some(srv) = MongoSrv::serve(mongo.uri(), "serves_mongo_locks_from_a_mongodb_srv_url").await
    else {
        return;
    };
    let env = Env::new().await;
    let script = r#"mount --bind "$RESOLV" /etc/resolv.conf &&
        exec "$TURNSTILE" run --namespace "$NAMESPACE" --log-format json"#;
    let controller = support::in_own_mount_namespace(script)
        .env("RESOLV", &srv.resolv_conf)
        .env("NAMESPACE", &env.namespace)
        .env("KUBECONFIG", &env.kubeconfig)
        .env("TURNSTILE_MONGO_URL", srv.url)
        .env("TURNSTILE_MONGO_DATABASE", "turnstile_srv_test")
        .env_remove("TURNSTILE_REDIS_URL")
        .env("RUST_LOG", "info")
        .spawn()
        .expect("spawn unshare");
    env.apply_lock("db", "backend: mongo\nleaseDurationSeconds: 300");
    env.apply_claim("a", "db", "");
    env.apply_claim("b", "db", "");
    let a = env.wait_phase("a", ClaimPhase::Held).await;
    env.delete_claim("a").await;
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert!(token_of(&b) > token_of(&a), "{a:?} {b:?}");
    srv.assert_srv_looked_up();
    stop(controller).await;
}

/// Text logs written to a file or a pipe carry no terminal colour codes (a log collector or
/// `turnstile run > controller.log` would keep them as garbage); the grant's line is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_to_a_pipe_carry_no_colour_codes() {
    let env = Env::new().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.apply_claim("mine", "db", "");
    let mut command = Command::new(env!("CARGO_BIN_EXE_turnstile"));
    command
        .args(["run", "--namespace", &env.namespace])
        .env("RUST_LOG", "info")
        .env("KUBECONFIG", &env.kubeconfig);
    let controller = spawn_captured(&mut command, Stdio::null(), "turnstile run");
    env.wait_phase("mine", ClaimPhase::Held).await;
    let (logs, _) = stop(controller).await;
    // (The grant's own line may still be on its way when the process is killed.)
    assert!(logs.contains("controller starting"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "colour codes in: {logs}");
}
