//! End to end with the etcd backend (etcd members started by `test-servers` on free 127.0.0.1
//! ports): the memory backend's flows (FIFO hand-off, expiry, a semaphore) on a lock with
//! `spec.backend: etcd`, with the grants in etcd under the lock's key; a gated Job and
//! `turnstile lock --lock` taking turns on it; the queue handed on through an etcd leader
//! change; and one lock shared by two clusters — two control planes, a
//! controller each, one etcd: one holder across both, tokens rising across both, and a
//! cluster whose controller dies while holding gives the lock up when the lease runs out.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::child::{finish_within, spawn_captured};
use support::jobs::{finish_job, held_pods, is_suspended, jobs, wait_job};
use support::launch::launch;
use support::output::stderr;
use support::{create_from_json, phase_of, token_of, Env, HolderMonitor, WAIT};
use test_servers::{EtcdCluster, EtcdOptions};
use tokio::sync::oneshot;
use turnstile_api::{BackendKind, ClaimPhase, DistributedLock, LockClaim, LOCK_ANNOTATION};
use turnstile_controller::backends::EtcdSettings;
use turnstile_controller::ControllerConfig;

fn etcd_config(url: &str) -> ControllerConfig {
    ControllerConfig {
        etcd: Some(EtcdSettings::new(url)),
        ..ControllerConfig::default()
    }
}

/// A fresh namespace with the controller on the etcd at `url` and lock `db` on it (`spec`: its
/// lines after `backend: etcd`).
async fn controller_and_db_on_etcd(url: &str, spec: &str) -> Env {
    let mut env = Env::new().await;
    env.start_controller(etcd_config(url));
    env.apply_lock("db", &format!("backend: etcd\n{spec}"));
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_handover_expiry_and_semaphore_on_etcd() {
    let server = launch(EtcdCluster::start, "etcd starts").await;
    let mut env = controller_and_db_on_etcd(&server.url(), "leaseDurationSeconds: 4").await;
    env.fifo_handover_expiry_and_semaphore("etcd").await;

    // The grants live in etcd, under the namespaced key.
    let keys = server
        .etcdctl(&["get", "--prefix", "--keys-only", "turnstile/"])
        .expect("etcdctl get");
    assert!(
        keys.contains(&format!("turnstile/{}/db", env.namespace)),
        "keys: {keys}"
    );
    let lock = env.lock("db").await;
    assert_eq!(lock.spec.backend, Some(BackendKind::Etcd));
    env.stop_controller().await;
}

/// Polls until the test's namespace has `count` claims; panics after [`WAIT`].
async fn until_claim_count(env: &Env, count: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let claims = env.claims().list(&Default::default()).await.expect("list");
        if claims.items.len() == count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} claims, not {count}",
            claims.items.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_job_and_turnstile_lock_take_turns_on_an_etcd_lock() {
    let server = launch(EtcdCluster::start, "etcd starts").await;
    let env = controller_and_db_on_etcd(&server.url(), "leaseDurationSeconds: 300").await;
    env.wait_ready("db", "True").await;
    let job = serde_json::json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "migrate", "annotations": {LOCK_ANNOTATION: "db"}},
        "spec": {
            "suspend": true,
            "template": {"spec": {
                "restartPolicy": "Never",
                "nodeSelector": held_pods(&env),
                "containers": [{"name": "main", "image": "busybox"}]
            }}
        }
    });
    create_from_json(&jobs(&env), job).await;
    wait_job(&env, "migrate", |job| !is_suspended(job)).await;
    let claim = env.wait_phase("migrate-db", ClaimPhase::Held).await;
    assert_eq!(token_of(&claim), Some(1));

    // `turnstile lock --lock db` waits behind the Job, and runs once the Job is done.
    let dir = tempfile::tempdir().expect("dir");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_turnstile"));
    command
        .args(["lock", "--lock", "db", "-n", &env.namespace])
        .args(["--", "sh", "-c", "echo $TURNSTILE_FENCING_TOKEN > token"])
        .current_dir(dir.path())
        .env("KUBECONFIG", &env.kubeconfig)
        .env_remove("POD_NAMESPACE");
    let run = spawn_captured(&mut command, std::process::Stdio::null(), "turnstile lock");
    until_claim_count(&env, 2).await;
    // The controller has looked at the run's claim and queued it behind the Job's.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let claims = env.claims().list(&Default::default()).await.expect("list");
        let queued = claims.items.iter().any(|claim| {
            claim.metadata.name.as_deref() != Some("migrate-db")
                && support::position_of(claim) == Some(1)
        });
        if queued {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run's claim never queued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!dir.path().join("token").exists(), "ran beside the Job");
    finish_job(&env, "migrate", "Complete").await;
    let output = finish_within(WAIT, run, "turnstile lock").await;
    assert!(output.status.success(), "{}", stderr(&output));
    let token = std::fs::read_to_string(dir.path().join("token")).expect("token");
    assert_eq!(token.trim(), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_handed_on_through_an_etcd_leader_change() {
    let cluster = launch(
        || EtcdCluster::start_with(&EtcdOptions::new().members(3)),
        "a three-member etcd cluster starts",
    )
    .await;
    let cluster = Arc::new(Mutex::new(cluster));
    let url = cluster.lock().unwrap().url();
    let mut env = controller_and_db_on_etcd(&url, "leaseDurationSeconds: 300").await;
    env.queue_of_three("db").await;
    let monitor = HolderMonitor::start(&env, "db", 1);

    let killed = {
        let cluster = Arc::clone(&cluster);
        tokio::task::spawn_blocking(move || {
            let mut cluster = cluster.lock().unwrap();
            let leader = cluster.leader().expect("a leader");
            cluster.kill_member(leader);
            leader
        })
        .await
        .expect("kill thread")
    };
    env.delete_claim("a").await;
    let b = env.wait_phase("b", ClaimPhase::Held).await;
    assert_eq!(token_of(&b), Some(2));
    {
        let cluster = Arc::clone(&cluster);
        tokio::task::spawn_blocking(move || cluster.lock().unwrap().restart_member(killed))
            .await
            .expect("restart thread")
            .expect("the old leader restarts");
    }
    env.delete_claim("b").await;
    let c = env.wait_phase("c", ClaimPhase::Held).await;
    assert_eq!(token_of(&c), Some(3));
    let report = monitor.finish().await;
    assert_eq!(report.tokens(), [1, 2, 3]);
    assert_eq!((report.over_capacity, report.token_regressions), (0, 0));
    env.stop_controller().await;
}

/// Samples the claims of lock `db` in both clusters every 20 ms: holders at once across both
/// (only those whose `expiresAt` is still ahead: a dead controller's claim keeps its last
/// status), and the tokens of new holders in the order seen.
struct TwoClusterMonitor {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(usize, usize, Vec<i64>)>,
}

impl TwoClusterMonitor {
    fn start(a: &Env, b: &Env) -> Self {
        let apis = [a.claims(), b.claims()];
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let (mut samples, mut over, mut tokens) = (0, 0, Vec::<i64>::new());
            loop {
                // Asked to stop: one more sample, taken after the ask, so that what the test
                // saw before it asked (the last grant) is in the report.
                let stopping = stopped.try_recv().is_ok();
                let mut holders = Vec::new();
                for api in &apis {
                    if let Ok(list) = api.list(&Default::default()).await {
                        holders.extend(list.items.into_iter().filter(is_live_holder));
                    }
                }
                samples += 1;
                if holders.len() > 1 {
                    over += 1;
                }
                for token in holders.iter().filter_map(token_of) {
                    if !tokens.contains(&token) {
                        tokens.push(token);
                    }
                }
                if stopping {
                    return (samples, over, tokens);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        TwoClusterMonitor { stop, task }
    }

    /// Stops sampling: (samples, samples with two holders, tokens in the order seen).
    async fn finish(self) -> (usize, usize, Vec<i64>) {
        let _ = self.stop.send(());
        self.task.await.expect("monitor task")
    }
}

fn is_live_holder(claim: &LockClaim) -> bool {
    let expires_at = claim.status.as_ref().and_then(|s| s.expires_at.as_ref());
    phase_of(claim) == Some(ClaimPhase::Held)
        && expires_at.is_some_and(|at| at.0.as_second() >= unix_seconds())
}

fn unix_seconds() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |since| {
        i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
    })
}

/// [`etcd_config`] for the cluster named `cluster` (`--cluster-name`).
fn etcd_config_in(cluster: &str, url: &str) -> ControllerConfig {
    ControllerConfig {
        cluster_name: Some(cluster.to_owned()),
        ..etcd_config(url)
    }
}

/// Waits until `env`'s lock `db` shows `summary` in its Holders column (`kubectl get locks`).
async fn until_holders_shown(env: &Env, summary: &str) {
    let shown = |lock: &DistributedLock| {
        lock.status
            .as_ref()
            .and_then(|s| s.holder_summary.as_deref())
            == Some(summary)
    };
    env.wait_lock("db", shown).await;
    let table = env.kubectl(&["get", "distributedlocks", "db"]);
    assert!(table.contains(summary), "kubectl get locks:\n{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_share_one_lock_on_etcd() {
    let server = launch(EtcdCluster::start, "etcd starts").await;
    let lock_spec = "backend: etcd\nleaseDurationSeconds: 6";
    let mut east = Env::new().await;
    east.start_controller(etcd_config_in("east", &server.url()));
    east.apply_lock("db", lock_spec);
    let mut west = east.another_cluster_like().await;
    west.start_controller(etcd_config_in("west", &server.url()));
    west.apply_lock("db", lock_spec);
    let monitor = TwoClusterMonitor::start(&east, &west);

    // east holds; west's claim waits, told the key is busy, and west's lock names the
    // holder's cluster.
    east.apply_claim("e1", "db", "");
    let e1 = east.wait_phase("e1", ClaimPhase::Held).await;
    assert_eq!(token_of(&e1), Some(1));
    west.apply_claim("w1", "db", "");
    west.wait_pending_for("w1", "LockBusy").await;
    until_holders_shown(&west, "cluster east").await;
    let holder = west.lock("db").await.status.expect("status").holders;
    assert_eq!(
        (holder[0].cluster.as_deref(), holder[0].fencing_token),
        (Some("east"), 1)
    );

    // east lets go: west's controller, trying again every 2 s, takes it with the next token.
    east.delete_claim("e1").await;
    let w1 = west.wait_phase("w1", ClaimPhase::Held).await;
    assert_eq!(token_of(&w1), Some(2));
    until_holders_shown(&west, &w1.holder_identity()).await;
    east.apply_claim("e2", "db", "");
    east.wait_pending_for("e2", "LockBusy").await;
    until_holders_shown(&east, "cluster west").await;

    // west's controller dies while w1 holds: nothing renews the grant, and east's claim is
    // granted once its lease ran out in etcd, not before.
    west.stop_controller().await;
    let w1 = west.claim("w1").await;
    let w1_expires = w1
        .status
        .as_ref()
        .and_then(|s| s.expires_at.clone())
        .expect("w1's expiry");
    let e2 = east.wait_phase("e2", ClaimPhase::Held).await;
    assert_eq!(token_of(&e2), Some(3));
    let e2_acquired = e2
        .status
        .as_ref()
        .and_then(|s| s.acquired_at.clone())
        .expect("e2's grant time");
    // Both whole seconds (the API server's Time).
    assert!(
        e2_acquired.0.as_second() >= w1_expires.0.as_second() - 1,
        "e2 granted at {e2_acquired:?}, before w1's lease ended at {w1_expires:?}"
    );
    let (samples, over, tokens) = monitor.finish().await;
    assert!(samples > 10, "the monitor sampled ({samples})");
    assert_eq!(over, 0, "two live holders across the clusters");
    assert_eq!(tokens, [1, 2, 3], "tokens rise across both clusters");

    // Back, west's controller finds w1's grant gone and says so.
    west.start_controller(etcd_config_in("west", &server.url()));
    let w1 = west.wait_phase("w1", ClaimPhase::Expired).await;
    println!("w1 after its controller came back: {:?}", w1.status);
    until_holders_shown(&west, "cluster east").await;
    west.stop_controller().await;
    east.stop_controller().await;
}
