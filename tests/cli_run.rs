//! `turnstile run` as the binary, configured only by its environment, as `deploy/` passes
//! Secrets: `TURNSTILE_REDIS_URL`, `TURNSTILE_MONGO_URL`, `TURNSTILE_MONGO_DATABASE` and `TURNSTILE_MONGO_COLLECTION` (a
//! real `redis-server` and the MongoDB test server), against the fake API server. A lock on
//! each backend gets its claim granted, and the grant is in that backend under the
//! documented names: the env vars work as their flags do. `--metrics-addr` serves the probes
//! and the metrics; `--log-format json` writes JSON lines.

mod e2e_support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use e2e_support::scrape::get;
use e2e_support::{token_of, Env, WAIT};
use test_servers::{MongoServer, RedisServer};
use tokio::process::{Child, Command};
use turnstile_api::ClaimPhase;
use turnstile_lock::backend::{MongoBackend, MongoBackendConfig};
use turnstile_lock::Backend;

const DATABASE: &str = "turnstile_env_test";
const COLLECTION: &str = "env_test_locks";

fn spawn_run(env: &Env, vars: &[(&str, &str)], metrics: std::net::SocketAddr) -> Child {
    Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["run", "--namespace", &env.namespace, "--log-format", "json"])
        .arg(format!("--metrics-addr={metrics}"))
        .envs(vars.iter().copied())
        .env("KUBECONFIG", &env.kubeconfig)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnstile run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_takes_its_backends_from_the_environment() {
    let mongo = tokio::task::spawn_blocking(MongoServer::shared_or_skip)
        .await
        .expect("launcher thread");
    let redis = RedisServer::start().expect("start redis-server");
    let env = Env::new().await;
    let mut vars = vec![("TURNSTILE_REDIS_URL", redis.url().to_owned())];
    if let Some(mongo) = &mongo {
        vars.push(("TURNSTILE_MONGO_URL", mongo.uri().to_owned()));
        vars.push(("TURNSTILE_MONGO_DATABASE", DATABASE.to_owned()));
        vars.push(("TURNSTILE_MONGO_COLLECTION", COLLECTION.to_owned()));
    }
    let borrowed: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let metrics = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        listener.local_addr().expect("address")
    };
    let mut controller = spawn_run(&env, &borrowed, metrics);

    env.apply_lock("on-redis", "backend: redis\nleaseDurationSeconds: 300");
    env.apply_claim("r", "on-redis", "");
    let held = env.wait_phase("r", ClaimPhase::Held).await;
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
        env.apply_claim("m", "on-mongo", "");
        env.wait_phase("m", ClaimPhase::Held).await;
        // In the database and collection TURNSTILE_MONGO_DATABASE and _COLLECTION name, not
        // the default ones.
        let names = MongoBackendConfig::new()
            .database(DATABASE)
            .collection(COLLECTION);
        let reader = MongoBackend::connect(mongo.uri(), names)
            .await
            .expect("connect to MongoDB");
        let snapshot = reader
            .snapshot(&format!("{}/on-mongo", env.namespace))
            .await
            .expect("snapshot");
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

    controller.start_kill().expect("stop turnstile run");
    let output = controller.wait_with_output().await.expect("output");
    // JSON lines with a level, a message and the span's lock.
    let logs = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    assert!(!lines.is_empty(), "no JSON log lines: {logs}");
    // The grant's line names where and what (the fields `kubectl logs | jq` selects on).
    let granted = lines.iter().find(|line| {
        line["fields"]["message"] == "claim is Held" && line["fields"]["lock"] == "on-redis"
    });
    let granted = granted.unwrap_or_else(|| panic!("no grant line: {logs}"));
    assert_eq!(granted["fields"]["namespace"], env.namespace.as_str());
    assert_eq!(granted["fields"]["claim"], "r");
    assert_eq!(granted["fields"]["token"], 1);
    // RUST_LOG=info: nothing below info.
    assert!(
        lines
            .iter()
            .all(|line| line["level"] != "DEBUG" && line["level"] != "TRACE"),
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
