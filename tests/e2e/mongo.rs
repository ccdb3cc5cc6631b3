//! End to end with the MongoDB backend (SecantusDB started by `test-servers` on a free
//! 127.0.0.1 port, or the server `MONGODB_URI` names): `--default-backend mongo` serves a lock
//! that names no backend; three claims are granted in FIFO order as each holder's claim is
//! deleted, with increasing fencing tokens, and the grants live in the Mongo collection.
//! A MongoDB crash and restart between grants keeps tokens increasing; an unreachable MongoDB
//! shows as `Ready=False` (BackendUnavailable) and grants nothing; one that goes away while a
//! claim is held keeps the holder and grants nothing until it is back.
//! Without a server a test is skipped with one line, except under `CI=true` (a failure).

use crate::support;

use std::sync::Arc;

use support::launch::blocking;
use support::{phase_of, position_of, token_of, Env, HolderMonitor};
use test_servers::{free_port, MongoFlavor, MongoServer};
use turnstile_api::{BackendKind, ClaimPhase};
use turnstile_controller::runtime::backends::MongoSettings;
use turnstile_controller::ControllerConfig;
use turnstile_lock::backend::{MongoBackend, MongoBackendConfig};
use turnstile_lock::Backend;

/// The shared test server, or `None` (after one line saying why) when there is none here.
async fn mongo_server() -> Option<Arc<MongoServer>> {
    blocking(MongoServer::shared_or_skip).await
}

/// A server of this test's own (to crash it), or `None` after one line when none can be
/// started here (no binary, outside CI only). Started whatever `MONGODB_URI` names: that
/// external server must not be crashed, and the crash must still be tested (it was skipped).
async fn own_server() -> Option<MongoServer> {
    blocking(|| MongoServer::start_or_skip(MongoFlavor::ReplicaSet)).await
}

/// Whether the `what` step (a crash, an outage) could not be made on this test server, which
/// only a server that cannot be restarted with its data (`secantusd-py`) excuses, and only
/// outside CI; says so when skipping.
fn skipped(what: &str, made: std::io::Result<()>) -> bool {
    let Err(error) = made else {
        return false;
    };
    assert_eq!(error.kind(), std::io::ErrorKind::Unsupported, "{error}");
    assert!(
        !test_servers::under_ci(),
        "under CI the {what} test must run: {error}"
    );
    test_servers::record_skip(&format!("the {what}"), &error.to_string());
    true
}

fn mongo_config(url: &str, database: &str) -> ControllerConfig {
    ControllerConfig {
        mongo: Some(MongoSettings {
            url: url.to_owned(),
            database: Some(database.to_owned()),
            collection: None,
        }),
        ..ControllerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mongo_crash_between_grants_keeps_tokens_increasing() {
    let Some(mut server) = own_server().await else {
        return;
    };
    let mut env = Env::new().await;
    env.start_controller(mongo_config(server.uri(), "turnstile_crash"));
    env.apply_lock("db", "backend: mongo\nleaseDurationSeconds: 300");
    let monitor = HolderMonitor::start(&env, "db", 1);
    env.queue_of_three("db").await;

    // The controller is away during the crash, so the check below sees the loss before the
    // controller re-attaches a's grant.
    env.stop_controller().await;
    let crashed = tokio::task::block_in_place(|| server.crash_losing_everything());
    if skipped("crash", crashed) {
        return;
    }
    // The loss really happened: the restarted server knows neither a's grant nor the counter,
    // so only the controller's floor (a's token in the API) keeps the next token above 1.
    let config = MongoBackendConfig::new().database("turnstile_crash");
    let lost = env.mongo_snapshot(server.uri(), config, "db").await;
    assert!(
        lost.holders.is_empty() && lost.fencing_token == 0,
        "the crash lost nothing: {lost:?}"
    );
    env.start_controller(mongo_config(server.uri(), "turnstile_crash"));
    env.hand_on_down_the_queue(monitor).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_gone_while_held_keeps_the_holder_and_grants_nothing() {
    let Some(mut server) = own_server().await else {
        return;
    };
    let database = "turnstile_outage";
    let mut env = Env::new().await;
    env.start_controller(mongo_config(server.uri(), database));
    env.apply_lock("db", "backend: mongo\nleaseDurationSeconds: 300");
    let monitor = HolderMonitor::start(&env, "db", 1);
    env.a_holds_and_b_waits("db").await;

    if skipped("outage", tokio::task::block_in_place(|| server.kill())) {
        return;
    }
    env.backend_gone_while_a_holds_and_b_waits().await;

    tokio::task::block_in_place(|| server.start_again()).expect("MongoDB back");
    env.wait_ready("db", "True").await;
    // The grant is in MongoDB again (kept, or re-attached if the kill lost it).
    let reader = MongoBackend::connect(server.uri(), MongoBackendConfig::new().database(database))
        .await
        .expect("connect to the restarted server");
    let key = format!("{}/db", env.namespace);
    let mut snapshot = None;
    for _ in 0..150 {
        let now = reader.snapshot(&key).await.expect("snapshot");
        if now.holders.len() == 1 && now.fencing_token >= 1 {
            snapshot = Some(now);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(snapshot.is_some(), "a's grant is not back in MongoDB");
    let after = env.claim("a").await;
    assert_eq!(phase_of(&after), Some(ClaimPhase::Held));
    assert_eq!(token_of(&after), Some(1), "a keeps its own token");
    env.hand_on_down_the_queue(monitor).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_mongo_is_reported_and_grants_nothing() {
    let port = free_port().expect("free port");
    let mut env = Env::new().await;
    env.start_controller(mongo_config(
        &format!("mongodb://127.0.0.1:{port}/?directConnection=true"),
        "turnstile_down",
    ));
    env.apply_lock("db", "backend: mongo\nleaseDurationSeconds: 300");
    env.apply_claim("a", "db", "");
    let ready = env.wait_ready("db", "False").await;
    assert_eq!(ready.reason, "BackendUnavailable");
    assert!(ready.message.contains("mongo"), "{}", ready.message);
    env.wait_pending_for("a", "BackendUnavailable").await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_handover_with_increasing_tokens_on_mongo() {
    let Some(server) = mongo_server().await else {
        return;
    };
    let mut env = Env::new().await;
    // A database per test: runs against a shared server never see each other's locks.
    let database = format!("turnstile_{}", env.namespace.replace('-', "_"));
    env.start_controller(ControllerConfig {
        default_backend: BackendKind::Mongo,
        mongo: Some(MongoSettings {
            url: server.uri().to_owned(),
            database: Some(database.clone()),
            collection: None,
        }),
        ..ControllerConfig::default()
    });
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let monitor = HolderMonitor::start(&env, "db", 1);
    env.queue_of_three("db").await;
    let a = env.claim("a").await;
    assert_eq!(token_of(&a), Some(1));

    env.delete_claim("a").await;
    env.wait_gone("a").await;
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(token_of(&b), Some(2));
    env.wait_claim("c", |c| position_of(c) == Some(1)).await;

    env.delete_claim("b").await;
    let c = env.wait_phase("c", ClaimPhase::Held).await;
    assert_eq!(token_of(&c), Some(3));
    env.wait_ready("db", "True").await;

    // The grant is in MongoDB, under the namespaced key, as the claim says.
    let config = MongoBackendConfig::new().database(database.clone());
    let snapshot = env.mongo_snapshot(server.uri(), config, "db").await;
    assert_eq!(snapshot.fencing_token, 3);
    let tokens: Vec<u64> = snapshot.holders.iter().map(|h| h.fencing_token).collect();
    assert_eq!(tokens, [3]);

    let report = monitor.finish().await;
    assert_eq!(report.tokens(), [1, 2, 3]);
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_backend_mongo_needs_a_url() {
    let env = Env::new().await;
    let result = turnstile_controller::run(
        env.client.clone(),
        ControllerConfig {
            default_backend: BackendKind::Mongo,
            namespace: Some(env.namespace.clone()),
            ..ControllerConfig::default()
        },
        std::future::pending(),
    )
    .await;
    let error = result.expect_err("a mongo default without a URL is refused");
    assert!(error.to_string().contains("--mongo-url"), "{error}");
}
