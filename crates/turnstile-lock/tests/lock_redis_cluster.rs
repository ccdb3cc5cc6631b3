//! Redis Cluster specifics against a real cluster (3 primaries, 3 replicas): every lock's keys
//! and wake-up channel on one slot, and a lock's slot moved to another primary
//! (`CLUSTER SETSLOT … IMPORTING/MIGRATING`, `MIGRATE`, `SETSLOT … NODE`) while a contended,
//! bounded stress run goes on, and a `CLUSTER FAILOVER` on the replica of the lock's primary
//! in the middle of another — violations (more than one holder, a token not above every
//! earlier one) counted, and required to be zero; and `rediss+cluster://` on a TLS cluster.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use test_servers::RedisCluster;
use turnstile_lock::backend::redis::RedisConnectError;
use turnstile_lock::{Locker, RedisBackend, RedisBackendConfig, RetryPolicy};

/// Parses a RESP integer reply (`:42\r\n`).
fn integer(reply: &str) -> i64 {
    reply
        .strip_prefix(':')
        .and_then(|rest| rest.trim_end().parse().ok())
        .unwrap_or_else(|| panic!("not an integer reply: {reply:?}"))
}

/// Parses a flat RESP array of bulk strings.
fn strings(reply: &str) -> Vec<String> {
    let mut lines = reply.split("\r\n");
    let header = lines.next().unwrap_or_default();
    let count: usize = header
        .strip_prefix('*')
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("not an array reply: {reply:?}"));
    let mut items = Vec::with_capacity(count);
    while items.len() < count {
        let _length = lines.next().expect("bulk header");
        items.push(lines.next().expect("bulk body").to_owned());
    }
    items
}

/// A bulk string reply's text (`$n\r\ntext\r\n`).
fn bulk(reply: &str) -> String {
    let (_, body) = reply.split_once("\r\n").expect("bulk reply");
    body.trim_end_matches("\r\n").to_owned()
}

/// One primary: its node id, port and slot ranges.
#[derive(Debug, Clone)]
struct Primary {
    id: String,
    port: u16,
    slots: Vec<(u16, u16)>,
}

fn primaries(cluster: &RedisCluster) -> Vec<Primary> {
    let nodes = bulk(
        &cluster
            .command(&["CLUSTER", "NODES"])
            .expect("CLUSTER NODES"),
    );
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 8 || !fields[2].contains("master") {
                return None;
            }
            let port = fields[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|port| port.parse().ok())?;
            let slots = fields[8..]
                .iter()
                .filter(|range| !range.starts_with('['))
                .filter_map(|range| {
                    let (start, end) = range.split_once('-').unwrap_or((range, range));
                    Some((start.parse().ok()?, end.parse().ok()?))
                })
                .collect();
            Some(Primary {
                id: fields[0].to_owned(),
                port,
                slots,
            })
        })
        .collect()
}

fn owner_of(cluster: &RedisCluster, slot: u16) -> Primary {
    primaries(cluster)
        .into_iter()
        .find(|primary| {
            primary
                .slots
                .iter()
                .any(|&(start, end)| (start..=end).contains(&slot))
        })
        .unwrap_or_else(|| panic!("nobody serves slot {slot}"))
}

/// Moves `slot` to the primary `to` (keys included), the way `redis-cli --cluster reshard`
/// does. Returns how many keys moved.
fn move_slot(cluster: &RedisCluster, slot: u16, to: &Primary) -> usize {
    let from = owner_of(cluster, slot);
    assert_ne!(from.id, to.id);
    let slot_arg = slot.to_string();
    let node = |port: u16| cluster.node(port).expect("node");
    let ok = |reply: std::io::Result<String>| {
        let reply = reply.expect("command");
        assert_eq!(reply, "+OK\r\n", "{reply}");
    };
    ok(node(to.port).command(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from.id]));
    ok(node(from.port).command(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to.id]));
    let mut moved = 0;
    for _ in 0..1000 {
        let keys = strings(
            &node(from.port)
                .command(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"])
                .expect("GETKEYSINSLOT"),
        );
        if keys.is_empty() {
            break;
        }
        let port = to.port.to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        let reply = node(from.port).command(&args).expect("MIGRATE");
        assert!(
            reply == "+OK\r\n" || reply == "+NOKEY\r\n",
            "MIGRATE: {reply}"
        );
        moved += keys.len();
    }
    for primary in primaries(cluster) {
        ok(node(primary.port).command(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to.id]));
    }
    moved
}

#[derive(Default)]
struct Violations {
    over_max_holders: AtomicU64,
    token_regressions: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_locks_slot_mid_stress_counts_zero_violations() {
    const TASKS: usize = 4;
    const ROUNDS: usize = 40;
    let cluster = Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("launcher thread")
            .expect("Redis Cluster starts"),
    );
    let backend = RedisBackend::connect(RedisBackendConfig::new(cluster.url()).key_prefix("mig:"))
        .await
        .expect("connect to the cluster");
    let locker = Locker::new(backend).with_retry(
        RetryPolicy::new()
            .total_time(Duration::from_secs(60))
            .retry_delay(Duration::from_millis(100)),
    );
    let key = "migrating";
    let slot = u16::try_from(integer(
        &cluster
            .command(&["CLUSTER", "KEYSLOT", "mig:{migrating}:holders"])
            .expect("KEYSLOT"),
    ))
    .expect("slot");
    let start_owner = owner_of(&cluster, slot);

    let violations = Arc::new(Violations::default());
    let inside = Arc::new(AtomicU64::new(0));
    let last_token = Arc::new(Mutex::new(0u64));
    let grants = Arc::new(AtomicU64::new(0));
    let backend_errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let locker = locker.clone();
        let (violations, inside, last_token, grants, backend_errors) = (
            violations.clone(),
            inside.clone(),
            last_token.clone(),
            grants.clone(),
            backend_errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < ROUNDS && Instant::now() < deadline {
                let lock = match locker.lock(key, Duration::from_secs(20)).acquire().await {
                    Ok(lock) => lock,
                    // A call may fail while the slot moves; the lock's state must not.
                    Err(error) if error.is_backend_unavailable() => {
                        backend_errors.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(error) => panic!("acquire: {error}"),
                };
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    violations.over_max_holders.fetch_add(1, Ordering::SeqCst);
                }
                {
                    let mut last = last_token.lock().unwrap();
                    if lock.fencing_token() <= *last {
                        violations.token_regressions.fetch_add(1, Ordering::SeqCst);
                    }
                    *last = lock.fencing_token();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                grants.fetch_add(1, Ordering::SeqCst);
                done += 1;
                // A failed release leaves a lease that runs out; it cannot break exclusion.
                if lock.release().await.is_err() {
                    backend_errors.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }

    // Move the slot away and back while the tasks contend.
    let mover = {
        let cluster = cluster.clone();
        let grants = grants.clone();
        tokio::task::spawn_blocking(move || {
            let total = (TASKS * ROUNDS) as u64;
            let mut moves = Vec::new();
            for target_fraction in [4, 2] {
                let wait_until = Instant::now() + Duration::from_secs(60);
                while grants.load(Ordering::SeqCst) < total / target_fraction
                    && Instant::now() < wait_until
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let current = owner_of(&cluster, slot);
                let target = primaries(&cluster)
                    .into_iter()
                    .find(|primary| primary.id != current.id)
                    .expect("another primary");
                let keys = move_slot(&cluster, slot, &target);
                moves.push((current.port, target.port, keys));
            }
            moves
        })
    };
    for task in tasks {
        task.await.expect("stress task");
    }
    let moves = mover.await.expect("mover");

    let end_owner = owner_of(&cluster, slot);
    println!(
        "slot {slot}: moves (from, to, keys) {moves:?}; start {} end {}; grants {}; backend errors {}",
        start_owner.port,
        end_owner.port,
        grants.load(Ordering::SeqCst),
        backend_errors.load(Ordering::SeqCst)
    );
    assert_eq!(violations.over_max_holders.load(Ordering::SeqCst), 0);
    assert_eq!(violations.token_regressions.load(Ordering::SeqCst), 0);
    assert_eq!(grants.load(Ordering::SeqCst), (TASKS * ROUNDS) as u64);
    assert_eq!(moves.len(), 2);
    assert!(
        moves.iter().all(|&(_, _, keys)| keys >= 1),
        "the fence counter moves with every move: {moves:?}"
    );
    assert_ne!(moves[0].0, moves[0].1);
    // The fence counter lives on the new owner and kept counting.
    let counter = bulk(
        &cluster
            .node(end_owner.port)
            .expect("owner")
            .command(&["GET", "mig:{migrating}:fence"])
            .expect("GET fence"),
    );
    assert_eq!(
        counter.parse::<u64>().expect("fence counter"),
        *last_token.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locks_keys_and_channel_live_on_one_slot_of_the_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::shared)
        .await
        .expect("launcher thread")
        .expect("Redis Cluster starts");
    let backend = RedisBackend::connect(RedisBackendConfig::new(cluster.url()).key_prefix("slot:"))
        .await
        .expect("connect");
    let locker = Locker::new(backend);
    // Keys on different slots (so on different primaries) all work.
    let mut tokens = Vec::new();
    for key in ["a", "b", "c", "d", "e", "f"] {
        let lock = locker
            .lock(key, Duration::from_secs(10))
            .acquire()
            .await
            .expect("acquire");
        tokens.push(lock.fencing_token());
        lock.release().await.expect("release");
    }
    assert!(tokens.iter().all(|&token| token == 1), "{tokens:?}");
    let slots: std::collections::HashSet<i64> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|key| {
            integer(
                &cluster
                    .command(&["CLUSTER", "KEYSLOT", &format!("slot:{{{key}}}:fence")])
                    .expect("KEYSLOT"),
            )
        })
        .collect();
    assert!(slots.len() > 1, "the test keys should spread over slots");
    let owners: std::collections::HashSet<u16> = slots
        .iter()
        .map(|&slot| owner_of(&cluster, slot as u16).port)
        .collect();
    assert!(
        owners.len() > 1,
        "the test keys should spread over primaries"
    );
}

/// The port of the replica of the primary `primary_id`.
fn replica_of(cluster: &RedisCluster, primary_id: &str) -> u16 {
    let nodes = bulk(
        &cluster
            .command(&["CLUSTER", "NODES"])
            .expect("CLUSTER NODES"),
    );
    nodes
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 8 || !fields[2].contains("slave") || fields[3] != primary_id {
                return None;
            }
            fields[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|port| port.parse().ok())
        })
        .unwrap_or_else(|| panic!("no replica of {primary_id}: {nodes}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_mid_stress_counts_zero_violations() {
    const TASKS: usize = 4;
    const ROUNDS: usize = 40;
    let cluster = Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("launcher thread")
            .expect("Redis Cluster starts"),
    );
    let backend = RedisBackend::connect(RedisBackendConfig::new(cluster.url()).key_prefix("fo:"))
        .await
        .expect("connect to the cluster");
    let locker = Locker::new(backend).with_retry(
        RetryPolicy::new()
            .total_time(Duration::from_secs(60))
            .retry_delay(Duration::from_millis(50)),
    );
    let key = "failing-over";
    let slot = u16::try_from(integer(
        &cluster
            .command(&["CLUSTER", "KEYSLOT", "fo:{failing-over}:holders"])
            .expect("KEYSLOT"),
    ))
    .expect("slot");
    let start_owner = owner_of(&cluster, slot);

    let violations = Arc::new(Violations::default());
    let inside = Arc::new(AtomicU64::new(0));
    let last_token = Arc::new(Mutex::new(0u64));
    let grants = Arc::new(AtomicU64::new(0));
    let backend_errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let locker = locker.clone();
        let (violations, inside, last_token, grants, backend_errors) = (
            violations.clone(),
            inside.clone(),
            last_token.clone(),
            grants.clone(),
            backend_errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < ROUNDS && Instant::now() < deadline {
                let lock = match locker.lock(key, Duration::from_secs(5)).acquire().await {
                    Ok(lock) => lock,
                    // A call may fail while the replica takes over; the lock's state must not.
                    Err(error) if error.is_backend_unavailable() => {
                        backend_errors.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(error) => panic!("acquire: {error}"),
                };
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    violations.over_max_holders.fetch_add(1, Ordering::SeqCst);
                }
                {
                    let mut last = last_token.lock().unwrap();
                    if lock.fencing_token() <= *last {
                        violations.token_regressions.fetch_add(1, Ordering::SeqCst);
                    }
                    *last = (*last).max(lock.fencing_token());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                grants.fetch_add(1, Ordering::SeqCst);
                done += 1;
                if lock.release().await.is_err() {
                    backend_errors.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }

    // A manual failover of the lock's primary once a third of the grants are done: the
    // replica catches up (the primary pauses its clients meanwhile), then takes over.
    let failover = {
        let cluster = cluster.clone();
        let grants = grants.clone();
        let start_owner = start_owner.clone();
        tokio::task::spawn_blocking(move || {
            let until = Instant::now() + Duration::from_secs(60);
            while grants.load(Ordering::SeqCst) < (TASKS * ROUNDS / 3) as u64
                && Instant::now() < until
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            let replica = replica_of(&cluster, &start_owner.id);
            let reply = cluster
                .node(replica)
                .expect("replica node")
                .command(&["CLUSTER", "FAILOVER"])
                .expect("CLUSTER FAILOVER");
            assert_eq!(reply, "+OK\r\n", "{reply}");
            let promoted = test_servers::wait_until(Duration::from_secs(30), || {
                owner_of(&cluster, slot).port == replica
            });
            assert!(promoted, "the replica took over slot {slot}");
            replica
        })
    };
    for task in tasks {
        task.await.expect("stress task");
    }
    let promoted = failover.await.expect("failover thread");

    println!(
        "slot {slot}: primary {} failed over to {promoted}; grants {}; backend errors {}",
        start_owner.port,
        grants.load(Ordering::SeqCst),
        backend_errors.load(Ordering::SeqCst)
    );
    assert_eq!(violations.over_max_holders.load(Ordering::SeqCst), 0);
    assert_eq!(violations.token_regressions.load(Ordering::SeqCst), 0);
    assert_eq!(grants.load(Ordering::SeqCst), (TASKS * ROUNDS) as u64);
    assert_eq!(owner_of(&cluster, slot).port, promoted);
    // The fence counter is on the promoted primary and kept counting.
    let counter = bulk(
        &cluster
            .node(promoted)
            .expect("promoted")
            .command(&["GET", "fo:{failing-over}:fence"])
            .expect("GET fence"),
    );
    assert_eq!(
        counter.parse::<u64>().expect("fence counter"),
        *last_token.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_cluster_with_mutual_tls_serves_locks_on_every_primary() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start_tls)
        .await
        .expect("launcher thread")
        .expect("TLS Redis Cluster starts");
    assert!(cluster.url().starts_with("rediss+cluster://"));
    let files = cluster.tls_files().expect("certificates").clone();
    let backend = RedisBackend::connect(
        RedisBackendConfig::new(cluster.url())
            .key_prefix("tls:")
            .ca_file(&files.ca_cert)
            .client_cert(&files.client_cert, &files.client_key),
    )
    .await
    .expect("connect to the cluster over TLS");
    let locker = Locker::new(backend);
    let keys = ["a", "b", "c", "d", "e", "f"];
    for round in 1..=2 {
        for key in keys {
            let lock = locker
                .lock(key, Duration::from_secs(10))
                .acquire()
                .await
                .expect("acquire over TLS");
            assert_eq!(lock.fencing_token(), round, "{key}");
            lock.release().await.expect("release");
        }
    }
    let owners: std::collections::HashSet<u16> = keys
        .iter()
        .map(|key| {
            let slot = integer(
                &cluster
                    .command(&["CLUSTER", "KEYSLOT", &format!("tls:{{{key}}}:fence")])
                    .expect("KEYSLOT"),
            );
            owner_of(&cluster, slot as u16).port
        })
        .collect();
    assert!(owners.len() > 1, "the keys spread over primaries");

    let error = RedisBackend::connect(
        RedisBackendConfig::new(cluster.url())
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
