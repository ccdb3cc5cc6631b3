//! Redis Cluster specifics against a real cluster (3 primaries, 3 replicas): every lock's keys
//! and wake-up channel on one slot, and a lock's slot moved to another primary
//! (`CLUSTER SETSLOT … IMPORTING/MIGRATING`, `MIGRATE`, `SETSLOT … NODE`) while a contended,
//! bounded stress run goes on, and a `CLUSTER FAILOVER` on the replica of the lock's primary
//! in the middle of another — violations (more than one holder, a token not above every
//! earlier one) counted, and required to be zero; and `rediss+cluster://` on a TLS cluster.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::contended::{run_contended_with_fault, ContendedReport, ContendedRun, Progress};

use support::launch;
use support::tls::{assert_an_unknown_ca_is_rejected, mutual_tls_config};
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

/// One line of `CLUSTER NODES`: `<id> <ip:port@cport> <flags> <master id or -> … <slots…>`.
struct NodeLine<'a> {
    id: &'a str,
    port: u16,
    flags: &'a str,
    master_id: &'a str,
    slots: &'a [&'a str],
}

/// Calls `each` on every line of the cluster's `CLUSTER NODES`; returns what it kept.
fn cluster_nodes<T>(cluster: &RedisCluster, each: impl Fn(&NodeLine<'_>) -> Option<T>) -> Vec<T> {
    let nodes = bulk(
        &cluster
            .command(&["CLUSTER", "NODES"])
            .expect("CLUSTER NODES"),
    );
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 8 {
                return None;
            }
            let port = fields[1].split(['@', ':']).nth(1)?.parse().ok()?;
            each(&NodeLine {
                id: fields[0],
                port,
                flags: fields[2],
                master_id: fields[3],
                slots: &fields[8..],
            })
        })
        .collect()
}

fn primaries(cluster: &RedisCluster) -> Vec<Primary> {
    cluster_nodes(cluster, |node| {
        if !node.flags.contains("master") {
            return None;
        }
        let slots = node
            .slots
            .iter()
            .filter(|range| !range.starts_with('['))
            .filter_map(|range| {
                let (start, end) = range.split_once('-').unwrap_or((range, range));
                Some((start.parse().ok()?, end.parse().ok()?))
            })
            .collect();
        Some(Primary {
            id: node.id.to_owned(),
            port: node.port,
            slots,
        })
    })
}

/// The slot of `key` (a whole Redis key, prefix and hash tag included).
fn keyslot(cluster: &RedisCluster, key: &str) -> u16 {
    let slot = integer(
        &cluster
            .command(&["CLUSTER", "KEYSLOT", key])
            .expect("KEYSLOT"),
    );
    u16::try_from(slot).expect("slot")
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

/// A contended run set up on a cluster of the test's own (the test disturbs it).
#[derive(Clone)]
struct ClusterStress {
    cluster: Arc<RedisCluster>,
    /// Under the test's key prefix, retrying ([`retrying_for_a_minute`]).
    locker: Locker,
    run: ContendedRun,
    /// The slot every key of the run's lock hashes to.
    slot: u16,
    /// The primary serving `slot` before the test disturbs the cluster.
    start_owner: Primary,
    /// The name of the lock's fence counter in Redis.
    fence_key: String,
}

/// Starts a cluster, sets up a contended run on lock `key` (under the prefix `<key>:`) with
/// leases of `lease`, its calls retried every `retry_delay` ([`retrying_for_a_minute`]), and
/// runs it while `fault` (on a blocking thread, given the set-up and the run's progress)
/// disturbs the cluster. Checks what every such run must show: no violation, every round
/// done, and the fence counter, on whichever primary owns the slot at the end, at the last
/// token granted. Returns the set-up and the run's report.
async fn stress_on_own_cluster<T, F>(
    key: &'static str,
    lease: Duration,
    retry_delay: Duration,
    fault: F,
) -> (ClusterStress, ContendedReport<T>)
where
    F: FnOnce(ClusterStress, Progress) -> T + Send + 'static,
    T: Send + 'static,
{
    let prefix = format!("{key}:");
    let cluster = Arc::new(launch("Redis Cluster starts", RedisCluster::start).await);
    let backend = RedisBackend::connect(RedisBackendConfig::new(cluster.url()).key_prefix(&prefix))
        .await
        .expect("connect to the cluster");
    let locker = Locker::new(backend).with_retry(retrying_for_a_minute(retry_delay));
    let slot = keyslot(&cluster, &format!("{prefix}{{{key}}}:holders"));
    let start_owner = owner_of(&cluster, slot);
    let stress = ClusterStress {
        cluster,
        locker,
        run: ContendedRun::four_tasks_of_forty_rounds(key, lease, Duration::from_secs(120)),
        slot,
        start_owner,
        fence_key: format!("{prefix}{{{key}}}:fence"),
    };
    let site = stress.clone();
    let report = run_contended_with_fault(&stress.locker, stress.run, move |progress| {
        fault(site, progress)
    })
    .await;
    report.assert_safe_and_complete(&stress.run);
    let end_owner = owner_of(&stress.cluster, stress.slot);
    assert_eq!(
        stress.fence_counter_on(end_owner.port),
        report.last_token,
        "the fence counter moved with the slot and kept counting"
    );
    (stress, report)
}

/// Retries every `delay` for up to 60 s: calls fail while the fault happens.
fn retrying_for_a_minute(delay: Duration) -> RetryPolicy {
    RetryPolicy::new()
        .total_time(Duration::from_secs(60))
        .retry_delay(delay)
}

impl ClusterStress {
    /// The value of the lock's fence counter on the node `port` (the slot's owner).
    fn fence_counter_on(&self, port: u16) -> u64 {
        let counter = bulk(
            &self
                .cluster
                .node(port)
                .expect("the owner node")
                .command(&["GET", &self.fence_key])
                .expect("GET fence"),
        );
        counter.parse().expect("fence counter")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_locks_slot_mid_stress_counts_zero_violations() {
    // Move the slot away and back while the tasks contend.
    let move_twice = |stress: ClusterStress, progress: Progress| {
        let (cluster, slot) = (&stress.cluster, stress.slot);
        let mut moves = Vec::new();
        for target_fraction in [4, 2] {
            progress.wait_for_grants(
                stress.run.total_grants() / target_fraction,
                Duration::from_secs(60),
            );
            let current = owner_of(cluster, slot);
            let target = primaries(cluster)
                .into_iter()
                .find(|primary| primary.id != current.id)
                .expect("another primary");
            let keys = move_slot(cluster, slot, &target);
            moves.push((current.port, target.port, keys));
        }
        moves
    };
    let (lease, retry_delay) = (Duration::from_secs(20), Duration::from_millis(100));
    let (stress, report) = stress_on_own_cluster("migrating", lease, retry_delay, move_twice).await;
    let moves = &report.fault;

    let slot = stress.slot;
    let end_owner = owner_of(&stress.cluster, slot);
    println!(
        "slot {slot}: moves (from, to, keys) {moves:?}; start {} end {}; grants {}; backend errors {}",
        stress.start_owner.port, end_owner.port, report.grants, report.backend_errors
    );
    assert_eq!(moves.len(), 2);
    assert!(
        moves.iter().all(|&(_, _, keys)| keys >= 1),
        "the fence counter moves with every move: {moves:?}"
    );
    assert_ne!(moves[0].0, moves[0].1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locks_keys_and_channel_live_on_one_slot_of_the_cluster() {
    let cluster = launch("Redis Cluster starts", RedisCluster::shared).await;
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
    let slots: std::collections::HashSet<u16> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|key| keyslot(&cluster, &format!("slot:{{{key}}}:fence")))
        .collect();
    assert!(slots.len() > 1, "the test keys should spread over slots");
    let owners: std::collections::HashSet<u16> = slots
        .iter()
        .map(|&slot| owner_of(&cluster, slot).port)
        .collect();
    assert!(
        owners.len() > 1,
        "the test keys should spread over primaries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_are_refused_on_a_cluster() {
    let cluster = launch("Redis Cluster starts", RedisCluster::shared).await;
    // `WAIT` answers for one primary's replicas only, so on a cluster it promises nothing
    // about the slot's next owner: refused at connect, by the config and by the URL option.
    let url = cluster.url();
    let separator = if url.contains('?') { '&' } else { '?' };
    for config in [
        RedisBackendConfig::new(url).min_replica_acks(1, Duration::from_millis(500)),
        RedisBackendConfig::new(format!("{url}{separator}min_replica_acks=1")),
    ] {
        let error = match RedisBackend::connect(config).await {
            Ok(_) => panic!("replica acks on a cluster should be refused"),
            Err(error) => error,
        };
        assert!(
            matches!(
                RedisConnectError::find(&error),
                Some(RedisConnectError::ReplicaAcksOnCluster)
            ),
            "{error:?}"
        );
    }
}

/// The port of the replica of the primary `primary_id`.
fn replica_of(cluster: &RedisCluster, primary_id: &str) -> u16 {
    let replicas = cluster_nodes(cluster, |node| {
        (node.flags.contains("slave") && node.master_id == primary_id).then_some(node.port)
    });
    *replicas
        .first()
        .unwrap_or_else(|| panic!("no replica of {primary_id}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_mid_stress_counts_zero_violations() {
    // A manual failover of the lock's primary once a third of the grants are done: the
    // replica catches up (the primary pauses its clients meanwhile), then takes over.
    let fail_over = |stress: ClusterStress, progress: Progress| {
        let (cluster, slot) = (&stress.cluster, stress.slot);
        progress.wait_for_grants(stress.run.total_grants() / 3, Duration::from_secs(60));
        let replica = replica_of(cluster, &stress.start_owner.id);
        let reply = cluster
            .node(replica)
            .expect("replica node")
            .command(&["CLUSTER", "FAILOVER"])
            .expect("CLUSTER FAILOVER");
        assert_eq!(reply, "+OK\r\n", "{reply}");
        let promoted = test_servers::wait_until(Duration::from_secs(30), || {
            owner_of(cluster, slot).port == replica
        });
        assert!(promoted, "the replica took over slot {slot}");
        replica
    };
    let (lease, retry_delay) = (Duration::from_secs(5), Duration::from_millis(50));
    let (stress, report) =
        stress_on_own_cluster("failing-over", lease, retry_delay, fail_over).await;
    let promoted = report.fault;

    let slot = stress.slot;
    println!(
        "slot {slot}: primary {} failed over to {promoted}; grants {}; backend errors {}",
        stress.start_owner.port, report.grants, report.backend_errors
    );
    assert_eq!(owner_of(&stress.cluster, slot).port, promoted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_cluster_with_mutual_tls_serves_locks_on_every_primary() {
    let cluster = launch("TLS Redis Cluster starts", RedisCluster::start_tls).await;
    assert!(cluster.url().starts_with("rediss+cluster://"));
    let files = cluster.tls_files().expect("certificates").clone();
    let backend =
        RedisBackend::connect(mutual_tls_config(cluster.url(), &files).key_prefix("tls:"))
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
        .map(|key| owner_of(&cluster, keyslot(&cluster, &format!("tls:{{{key}}}:fence"))).port)
        .collect();
    assert!(owners.len() > 1, "the keys spread over primaries");

    assert_an_unknown_ca_is_rejected(cluster.url(), &files).await;
}
