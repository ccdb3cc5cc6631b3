//! The controller on a Redis Cluster (3 primaries + 3 replicas on loopback, started by
//! `test-servers`): `redis+cluster://` and `rediss+cluster://` with mutual TLS, as
//! `turnstile run --redis-url` passes them. Grants and hand-offs go through the cluster, with
//! increasing tokens and never two holders.

use crate::support;

use support::launch::launch;
use support::{Env, HolderMonitor};
use test_servers::RedisCluster;
use turnstile_controller::runtime::backends::RedisTlsFiles;
use turnstile_controller::ControllerConfig;

/// A queue of three claims on a mutex served by `config`'s Redis, handed on twice.
async fn hand_off_through_the_queue(config: ControllerConfig) {
    let mut env = Env::new().await;
    env.start_controller(config);
    env.apply_lock("db", "backend: redis\nleaseDurationSeconds: 300");
    let monitor = HolderMonitor::start(&env, "db", 1);
    env.queue_of_three("db").await;
    env.wait_ready("db", "True").await;
    env.hand_on_down_the_queue(monitor).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_serves_locks_from_a_redis_cluster() {
    let cluster = launch(RedisCluster::shared, "start the Redis Cluster").await;
    assert!(cluster.url().starts_with("redis+cluster://"));
    hand_off_through_the_queue(ControllerConfig {
        redis_url: Some(cluster.url().to_owned()),
        ..ControllerConfig::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_serves_locks_from_a_tls_redis_cluster() {
    let cluster = launch(RedisCluster::shared_tls, "start the TLS Redis Cluster").await;
    assert!(cluster.url().starts_with("rediss+cluster://"));
    let files = cluster.tls_files().expect("certificates");
    let redis_tls = RedisTlsFiles::new(
        Some(files.ca_cert.clone()),
        Some(files.client_cert.clone()),
        Some(files.client_key.clone()),
    )
    .expect("TLS files");
    hand_off_through_the_queue(ControllerConfig {
        redis_url: Some(cluster.url().to_owned()),
        redis_tls,
        ..ControllerConfig::default()
    })
    .await;
}
