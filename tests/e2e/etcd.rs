//! End to end with the etcd backend (etcd members started by `test-servers` on free 127.0.0.1
//! ports): the memory backend's flows (FIFO hand-off, expiry, a semaphore) on a lock with
//! `spec.backend: etcd`, with the grants in etcd under the lock's key; a gated Job and
//! `turnstile lock --lock` taking turns on it; the queue handed on through an etcd leader
//! change. One etcd lock shared by two clusters is in `clusters.rs`.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::child::{finish_within, spawn_captured};
use support::jobs::{finish_job, held_pods, is_suspended, jobs, wait_job};
use support::launch::launch;
use support::output::stderr;
use support::{create_from_json, token_of, Env, HolderMonitor, WAIT};
use test_servers::{EtcdCluster, EtcdOptions};
use turnstile_api::{BackendKind, ClaimPhase, LOCK_ANNOTATION};
use turnstile_controller::runtime::backends::EtcdSettings;
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
