//! Redis-specific behaviour of the lock engine, against a real redis-server: key layout for
//! Redis Cluster, no leaked keys, pub/sub across processes and after reconnects, and typed
//! errors when the server is gone.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::AsyncCommands;
use support::grants::{
    acquire_as, hold, is_taken, joined_within, no_polling, pushed_on_release, LONG,
};
use support::{eventually, launch, until_queued};
use test_servers::RedisServer;
use turnstile_lock::{
    Backend, Lock, LockError, LockResult, Locker, RedisBackend, RedisBackendConfig, RetryPolicy,
};

async fn start_server() -> RedisServer {
    launch("redis-server starts", RedisServer::start).await
}

/// Starts a redis-server and a locker on it under key prefix `prefix`.
async fn server_and_locker(prefix: &str) -> (RedisServer, Locker) {
    let server = start_server().await;
    let locker = Locker::new(connect(&server, prefix).await);
    (server, locker)
}

/// Starts a background acquire of `key` (lease [`LONG`]) retrying by `policy`, and waits
/// until it is the one waiter queued on `key`.
async fn queued_waiter(
    locker: &Locker,
    key: &str,
    policy: RetryPolicy,
) -> tokio::task::JoinHandle<LockResult<Lock>> {
    let request = locker.lock(key, LONG).retry(policy);
    let waiter = tokio::spawn(async move { request.acquire().await });
    eventually("the waiter is queued", || async {
        locker.snapshot(key).await.expect("snapshot").waiters.len() == 1
    })
    .await;
    waiter
}

async fn connect(server: &RedisServer, prefix: &str) -> RedisBackend {
    RedisBackend::connect(RedisBackendConfig::new(server.url()).key_prefix(prefix))
        .await
        .expect("connect")
}

async fn raw_connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// The part of a key Redis Cluster hashes (its hash tag rule).
fn hash_slot_input(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(close) = key[open + 1..].find('}') {
            if close > 0 {
                return &key[open + 1..open + 1 + close];
            }
        }
    }
    key
}

#[tokio::test]
async fn keys_share_one_hash_tag_use_the_prefix_and_expire() {
    let (server, locker) = server_and_locker("app:").await;
    let mut raw = raw_connection(&server).await;
    // Braces and percent signs in a key must not break the hash tag.
    for key in [
        "plain",
        "ns/name",
        "}starts-with-close",
        "{tagged}x",
        "50%{a}b}",
    ] {
        let holder = locker.lock(key, LONG).acquire().await.expect("holder");
        let waiter = queued_waiter(&locker, key, RetryPolicy::forever()).await;
        let keys: Vec<String> = raw.keys("*").await.expect("KEYS");
        assert!(keys.iter().all(|name| name.starts_with("app:")), "{keys:?}");
        let mut suffixes: Vec<&str> = keys
            .iter()
            .filter_map(|name| name.rsplit(':').next())
            .collect();
        suffixes.sort_unstable();
        assert_eq!(
            suffixes,
            ["beats", "fence", "holders", "meta", "queue", "seq", "tokens", "waits"],
            "the documented layout: {keys:?}"
        );
        let tags: Vec<&str> = keys.iter().map(|name| hash_slot_input(name)).collect();
        assert!(
            tags.windows(2).all(|pair| pair[0] == pair[1]),
            "one slot per lock: {keys:?}"
        );
        for name in &keys {
            let ttl: i64 = raw.pttl(name).await.expect("PTTL");
            if name.ends_with(":fence") {
                assert_eq!(ttl, -1, "the fence counter never expires");
            } else {
                assert!(ttl > 0, "{name} would leak (PTTL {ttl})");
            }
        }
        holder.release().await.expect("release");
        waiter
            .await
            .expect("join")
            .expect("acquire")
            .release()
            .await
            .expect("release");
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut raw)
            .await
            .expect("FLUSHALL");
    }
    // A grant that ends involuntarily under a lock-delay leaves the `delay` key, which
    // expires with the delay.
    let short = locker
        .lock("delayed", Duration::from_millis(300))
        .lock_delay(Duration::from_secs(5))
        .acquire()
        .await
        .expect("holder");
    let token = short.fencing_token();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        is_taken(&locker.lock("delayed", LONG)).await,
        "granted inside the lock-delay after token {token}"
    );
    let keys: Vec<String> = raw.keys("app:{delayed}:delay").await.expect("KEYS");
    assert_eq!(keys.len(), 1, "a delay key: {keys:?}");
    let ttl: i64 = raw.pttl(&keys[0]).await.expect("PTTL");
    assert!(
        ttl > 0 && ttl <= 5_000,
        "the delay key expires with the delay: {ttl}"
    );
    drop(short);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_in_other_processes_are_woken_in_fifo_order() {
    let server = start_server().await;
    // Two backends = two independent connections and pub/sub listeners, as two processes.
    let processes = [connect(&server, "t:").await, connect(&server, "t:").await];
    let lockers: Vec<Locker> = processes
        .iter()
        .map(|backend| Locker::new(backend.clone()))
        .collect();
    let holder = lockers[0].lock("x", LONG).acquire().await.expect("holder");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let locker = lockers[i % 2].clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            // Polling every 30 s: only pub/sub explains a prompt hand-off.
            let lock = acquire_as(&locker, "x", format!("p{}-w{i}", i % 2), no_polling()).await;
            order.lock().unwrap().push(i);
            lock.release().await.expect("release");
        }));
        until_queued(&processes[0], "x", &format!("p{}-w{i}", i % 2)).await;
    }
    holder.release().await.expect("release");
    for task in tasks {
        joined_within(Duration::from_secs(15), task, "pushed, not polled").await;
    }
    assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
}

#[tokio::test]
async fn pub_sub_reconnects_and_resubscribes() {
    let (server, locker) = server_and_locker("t:").await;
    let mut raw = raw_connection(&server).await;
    let holder = locker.lock("rc", LONG).acquire().await.expect("holder");
    let waiter = queued_waiter(&locker, "rc", no_polling()).await;
    let channel = "t:{rc}:wake";
    let subscribers = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            let reply: (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query_async(&mut raw)
                .await
                .expect("NUMSUB");
            reply.1
        }
    };
    assert_eq!(subscribers(&mut raw).await, 1);
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(&mut raw)
        .await
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);
    eventually("the listener re-subscribed", || {
        let mut raw = raw.clone();
        async move { subscribers(&mut raw).await == 1 }
    })
    .await;
    // Woken through the new subscription.
    let lock = pushed_on_release(&holder, waiter).await;
    lock.release().await.expect("release");
}

#[tokio::test]
async fn unreachable_or_stopped_server_is_a_typed_error() {
    let port = test_servers::free_port().expect("port");
    let refused = RedisBackend::connect(
        RedisBackendConfig::new(format!("redis://127.0.0.1:{port}/"))
            .response_timeout(Duration::from_millis(500)),
    )
    .await;
    let Err(error) = refused else {
        panic!("connected to nothing");
    };
    assert!(error.is_backend_unavailable(), "{error}");
    assert!(std::error::Error::source(&error).is_some());
    assert!(matches!(
        RedisBackend::connect(RedisBackendConfig::new("not a url")).await,
        Err(LockError::BackendUnavailable { .. })
    ));

    let server = start_server().await;
    let backend = RedisBackend::connect(
        RedisBackendConfig::new(server.url()).response_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("connect");
    let locker = Locker::new(backend.clone())
        .with_retry(RetryPolicy::new().total_time(Duration::from_secs(2)));
    let lock = locker.lock("gone", LONG).acquire().await.expect("lock");
    server.stop();
    assert!(matches!(
        locker.lock("gone", LONG).acquire().await,
        Err(LockError::BackendUnavailable {
            backend: "redis",
            ..
        })
    ));
    assert!(lock
        .extend(LONG)
        .await
        .expect_err("no server")
        .is_backend_unavailable());
    assert!(lock
        .release()
        .await
        .expect_err("no server")
        .is_backend_unavailable());
    assert!(!lock.is_released(), "a failed release can be retried");
    assert!(backend
        .raise_fencing_floor("gone", 5)
        .await
        .expect_err("no server")
        .is_backend_unavailable());
}

#[tokio::test]
async fn expiry_follows_the_server_clock() {
    let (server, locker) = server_and_locker("t:").await;
    let lock = hold(&locker, "clock", Duration::from_millis(1500), "lock").await;
    let mut raw = raw_connection(&server).await;
    let (score, time): (f64, (u64, u64)) = redis::pipe()
        .zscore("t:{clock}:holders", lock.owner())
        .cmd("TIME")
        .query_async(&mut raw)
        .await
        .expect("ZSCORE + TIME");
    let server_now_ms = time.0 * 1000 + time.1 / 1000;
    let remaining = score - server_now_ms as f64;
    assert!(
        (0.0..=1500.0).contains(&remaining),
        "lease expiry is server TIME + ttl (remaining {remaining} ms)"
    );
    lock.release().await.expect("release");
}
