//! etcd against real processes (a three-member cluster on loopback):
//!
//! - the leader SIGKILLed in the middle of a contended, bounded stress run, and started again
//!   later: violations (more than one holder, a token not above every earlier one) counted and
//!   zero, every round completed (grants resume under the new leader);
//! - a follower stopped and restarted mid-run: the same;
//! - a holder whose only member is stopped past its lease: the lock goes to a waiter on the
//!   other members, and once the member is back the cut-off holder is told it lost the lock;
//! - the control: the same checker, run on a lock that does not exclude (each owner locks a
//!   key of its own), counts overlaps (so a zero above means something).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use support::contended::{run_contended_with_fault, ContendedRun};
use support::grants::locker_retrying;
use support::launch;
use test_servers::{EtcdCluster, EtcdOptions};
use turnstile_lock::{
    AcquireOutcome, AcquireRequest, Backend, EtcdBackend, EtcdBackendConfig, LockError, LockResult,
    LockSnapshot, Locker, WakeSubscription,
};

async fn three_members() -> Arc<Mutex<EtcdCluster>> {
    let cluster = launch("a three-member etcd cluster starts", || {
        EtcdCluster::start_with(&EtcdOptions::new().members(3))
    })
    .await;
    Arc::new(Mutex::new(cluster))
}

async fn locker_on(url: String) -> Locker {
    let backend =
        EtcdBackend::connect(EtcdBackendConfig::new(url).request_timeout(Duration::from_secs(2)))
            .await
            .expect("connect to etcd");
    locker_retrying(backend, Duration::from_secs(60), Duration::from_millis(50))
}

fn url(cluster: &Mutex<EtcdCluster>) -> String {
    cluster.lock().unwrap().url()
}

/// Four tasks of forty rounds on one lock while `fault` acts on the cluster (given the run's
/// progress); asserts the run safe and complete and returns what the fault returned.
async fn contended_through<T: Send + 'static>(
    cluster: &Arc<Mutex<EtcdCluster>>,
    fault: impl FnOnce(&Mutex<EtcdCluster>, &support::contended::Progress) -> T + Send + 'static,
) -> T {
    let locker = locker_on(url(cluster)).await;
    let run = ContendedRun::four_tasks_of_forty_rounds(
        "contended",
        Duration::from_secs(3),
        Duration::from_secs(120),
    );
    let report = run_contended_with_fault(&locker, run, {
        let cluster = Arc::clone(cluster);
        move |progress| fault(&cluster, &progress)
    })
    .await;
    println!(
        "grants {}, over max holders {}, token regressions {}, backend errors {}",
        report.grants, report.over_max_holders, report.token_regressions, report.backend_errors
    );
    report.assert_safe_and_complete(&run);
    report.fault
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_mid_stress_counts_zero_violations() {
    let cluster = three_members().await;
    let (old, new) = contended_through(&cluster, |cluster, progress| {
        progress.wait_for_grants(160 / 3, Duration::from_secs(30));
        let old = cluster.lock().unwrap().leader().expect("a leader");
        cluster.lock().unwrap().kill_member(old);
        // Grants go on under a new leader before the old one comes back.
        let elected = test_servers::wait_until(Duration::from_secs(20), || {
            cluster.lock().unwrap().leader().is_ok()
        });
        assert!(elected, "the two remaining members elect a leader");
        let new = cluster.lock().unwrap().leader().expect("a new leader");
        progress.wait_for_grants(2 * 160 / 3, Duration::from_secs(30));
        cluster
            .lock()
            .unwrap()
            .restart_member(old)
            .expect("the old leader restarts");
        (old, new)
    })
    .await;
    assert_ne!(old, new, "the leader changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_stopped_and_restarted_mid_stress_counts_zero_violations() {
    let cluster = three_members().await;
    contended_through(&cluster, |cluster, progress| {
        progress.wait_for_grants(160 / 3, Duration::from_secs(30));
        let leader = cluster.lock().unwrap().leader().expect("a leader");
        let follower = (leader + 1) % 3;
        cluster.lock().unwrap().kill_member(follower);
        progress.wait_for_grants(2 * 160 / 3, Duration::from_secs(30));
        cluster
            .lock()
            .unwrap()
            .restart_member(follower)
            .expect("the follower restarts");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_past_its_lease_is_told_it_lost_the_lock() {
    let cluster = three_members().await;
    let (cut_off_member, cut_off_url, others) = {
        let cluster = cluster.lock().unwrap();
        let leader = cluster.leader().expect("a leader");
        // Cut off a follower, so the other two keep a quorum.
        let member = (leader + 1) % 3;
        let others: Vec<String> = (0..3)
            .filter(|&index| index != member)
            .map(|index| cluster.member_url(index))
            .collect();
        (member, cluster.member_url(member), others)
    };
    let cut_off = locker_on(cut_off_url).await;
    let waiting = locker_on(others[0].clone()).await;

    let lease = Duration::from_secs(2);
    let held = cut_off
        .lock("cut", lease)
        .acquire()
        .await
        .expect("the holder takes the lock");
    let waiter = tokio::spawn(async move {
        let lock = waiting.lock("cut", Duration::from_secs(30)).acquire().await;
        (lock, waiting)
    });
    {
        let cluster = Arc::clone(&cluster);
        tokio::task::spawn_blocking(move || cluster.lock().unwrap().kill_member(cut_off_member))
            .await
            .expect("kill thread");
    }
    // The holder cannot renew; the waiter is granted once the lease ran out (as the other
    // members' clients count it).
    let (next, _waiting) = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter is granted within 30 s of a 2 s lease")
        .expect("waiter task");
    let next = next.expect("the waiter is granted");
    assert!(next.fencing_token() > held.fencing_token());
    assert!(held.is_lost(), "the holder's own clock ended its lease");

    {
        let cluster = Arc::clone(&cluster);
        tokio::task::spawn_blocking(move || {
            cluster
                .lock()
                .unwrap()
                .restart_member(cut_off_member)
                .expect("the member restarts")
        })
        .await
        .expect("restart thread");
    }
    // Back on the cluster, the backend itself says so too.
    let mut answer = held.extend(lease).await;
    for _ in 0..50 {
        if !matches!(answer, Err(LockError::BackendUnavailable { .. })) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        answer = held.extend(lease).await;
    }
    assert!(
        matches!(answer, Err(LockError::LockLost { .. })),
        "extend after the partition: {answer:?}"
    );
    next.release().await.expect("release");
}

/// The control: the same run on a broken lock (each request locks a key of its own, on the
/// same etcd) must count overlaps, or the zeros above would prove nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_counts_overlaps_on_a_lock_that_does_not_exclude() {
    let cluster = launch("etcd starts", EtcdCluster::start).await;
    let backend = EtcdBackend::connect(EtcdBackendConfig::new(cluster.url()))
        .await
        .expect("connect to etcd");
    let locker = locker_retrying(
        KeyPerOwner(backend),
        Duration::from_secs(60),
        Duration::from_millis(50),
    );
    let run = ContendedRun::four_tasks_of_forty_rounds(
        "control",
        Duration::from_secs(3),
        Duration::from_secs(60),
    );
    let report = run_contended_with_fault(&locker, run, |_| ()).await;
    println!(
        "control: over max holders {}, token regressions {}",
        report.over_max_holders, report.token_regressions
    );
    assert!(
        report.over_max_holders > 0,
        "four tasks holding a non-exclusive lock never overlapped?"
    );
}

/// A broken backend for the control: every owner gets a lock of its own.
#[derive(Debug)]
struct KeyPerOwner(EtcdBackend);

fn own_key(key: &str, owner: &str) -> String {
    format!("{key}/{owner}")
}

#[async_trait]
impl Backend for KeyPerOwner {
    fn kind(&self) -> &'static str {
        "etcd"
    }
    async fn acquire(&self, request: &AcquireRequest<'_>) -> LockResult<AcquireOutcome> {
        let key = own_key(request.key, request.owner);
        self.0
            .acquire(&AcquireRequest {
                key: &key,
                ..*request
            })
            .await
    }
    async fn release(&self, key: &str, owner: &str, max_holders: u32) -> LockResult<bool> {
        self.0
            .release(&own_key(key, owner), owner, max_holders)
            .await
    }
    async fn extend(&self, key: &str, owner: &str, ttl: Duration) -> LockResult<Option<Duration>> {
        self.0.extend(&own_key(key, owner), owner, ttl).await
    }
    async fn is_held(&self, key: &str, owner: &str) -> LockResult<bool> {
        self.0.is_held(&own_key(key, owner), owner).await
    }
    async fn snapshot(&self, key: &str) -> LockResult<LockSnapshot> {
        self.0.snapshot(key).await
    }
    async fn raise_fencing_floor(&self, key: &str, floor: u64) -> LockResult<u64> {
        self.0.raise_fencing_floor(key, floor).await
    }
    async fn subscribe(&self, key: &str, owner: &str) -> LockResult<WakeSubscription> {
        self.0.subscribe(&own_key(key, owner), owner).await
    }
}

/// `etcds://` with user/password: the right CA and password connect and lock; a CA that did
/// not sign the server, a wrong password, or a CA file on a plain URL fail at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_and_auth_connect_only_with_the_right_ca_and_password() {
    let server = launch("etcd with TLS and auth starts", || {
        EtcdCluster::start_with(&EtcdOptions::new().tls().user("turnstile", "s3cret"))
    })
    .await;
    let files = server.tls_files().expect("certificates").clone();
    let url = server.url();
    assert!(url.starts_with("etcds://turnstile:s3cret@"), "{url}");

    let backend = EtcdBackend::connect(EtcdBackendConfig::new(&url).ca_file(&files.ca_cert))
        .await
        .expect("the right CA and password connect");
    let lock = Locker::new(backend)
        .lock("tls", Duration::from_secs(5))
        .acquire()
        .await
        .expect("lock over TLS");
    lock.release().await.expect("release");

    let unknown_ca =
        EtcdBackend::connect(EtcdBackendConfig::new(&url).ca_file(&files.other_ca_cert)).await;
    assert!(
        matches!(unknown_ca, Err(LockError::BackendUnavailable { .. })),
        "an unknown CA: {unknown_ca:?}"
    );
    let wrong_password = url.replace(":s3cret@", ":wrong@");
    let refused =
        EtcdBackend::connect(EtcdBackendConfig::new(wrong_password).ca_file(&files.ca_cert)).await;
    let message = format!("{:?}", refused.expect_err("a wrong password is refused"));
    assert!(message.contains("authentication failed"), "{message}");
    let plain = url.replacen("etcds://", "etcd://", 1);
    let mixed = EtcdBackend::connect(EtcdBackendConfig::new(plain).ca_file(&files.ca_cert)).await;
    let message = format!("{:?}", mixed.expect_err("a CA file needs etcds://"));
    assert!(message.contains("TlsSettingsWithoutTls"), "{message}");
}
