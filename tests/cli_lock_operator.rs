//! `turnstile lock --lock NAME`: the real binary holds a DistributedLock through the operator
//! (a LockClaim of its own, on the fake API server with the real controller): the command
//! runs with the grant's fencing token, a second run waits for the first, the lease is
//! renewed while the command runs, and the claim is deleted when it ends. A claim lost while
//! the command runs stops it (exit 76); `--wait` gives up (75) and SIGTERM while waiting exits
//! 143, both leaving no claim behind; a lock that does not exist is a usage error (2).

mod e2e_support;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use e2e_support::{phase_of, Env, WAIT};
use kube::api::ListParams;
use tokio::process::{Child, Command};
use turnstile_api::{ClaimPhase, LockClaim};

/// `turnstile lock --lock LOCK ARGS… -- sh -c SCRIPT` in `dir`, against the test's cluster.
fn spawn_lock(env: &Env, lock: &str, args: &[&str], script: &str, dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["lock", "--lock", lock, "-n", &env.namespace])
        .args(args)
        .args(["--", "sh", "-c", script])
        .current_dir(dir)
        .env("KUBECONFIG", &env.kubeconfig)
        .env_remove("POD_NAMESPACE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnstile lock")
}

async fn finish(child: Child) -> Output {
    tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("turnstile lock ends in time")
        .expect("turnstile lock output")
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

async fn until_exists(path: PathBuf) {
    let deadline = Instant::now() + WAIT;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn claims_of(env: &Env, lock: &str) -> Vec<LockClaim> {
    env.claims()
        .list(&ListParams::default())
        .await
        .expect("list claims")
        .items
        .into_iter()
        .filter(|claim| claim.spec.lock_name == lock)
        .collect()
}

/// Waits until `lock` has `count` claims (those of the runs in flight).
async fn until_claims(env: &Env, lock: &str, count: usize) -> Vec<LockClaim> {
    let deadline = Instant::now() + WAIT;
    loop {
        let claims = claims_of(env, lock).await;
        if claims.len() == count {
            return claims;
        }
        assert!(
            Instant::now() < deadline,
            "{lock} has {} claims, not {count}",
            claims.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The fake API server, the controller, and the DistributedLock `db`.
async fn env_with_lock() -> Env {
    let mut env = Env::new().await;
    env.start_default_controller();
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env
}

const RECORD: &str =
    "echo $TURNSTILE_FENCING_TOKEN > $1.token; echo $TURNSTILE_LOCK_CLAIM > $1.claim";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_under_a_claim_of_its_own_and_a_second_run_waits_for_the_first() {
    let mut env = env_with_lock().await;
    let dir = tempfile::tempdir().expect("dir");

    // The first run holds until `go` exists; the second waits behind it.
    let first = spawn_lock(
        &env,
        "db",
        &[],
        &format!("set -- first; {RECORD}; while [ ! -e go ]; do sleep 0.05; done"),
        dir.path(),
    );
    until_exists(dir.path().join("first.token")).await;
    let second = spawn_lock(
        &env,
        "db",
        &[],
        &format!("set -- second; {RECORD}; [ -e go ] || echo overlapped > second.overlap"),
        dir.path(),
    );
    let claims = until_claims(&env, "db", 2).await;
    let first_claim = read(dir.path(), "first.claim");
    let holder = claims
        .iter()
        .find(|claim| claim.metadata.name.as_deref() == Some(first_claim.as_str()))
        .expect("the first run's claim");
    assert_eq!(phase_of(holder), Some(ClaimPhase::Held));
    assert_eq!(read(dir.path(), "first.token"), "1");
    let holder_identity = holder.spec.holder_identity.clone().unwrap_or_default();
    assert!(holder_identity.contains('/'), "host/pid: {holder_identity}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !dir.path().join("second.token").exists(),
        "the second run started while the first held the lock"
    );

    std::fs::write(dir.path().join("go"), "").expect("go");
    let first = finish(first).await;
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    let second = finish(second).await;
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    assert_eq!(read(dir.path(), "second.token"), "2", "a larger token");
    assert!(!dir.path().join("second.overlap").exists());
    until_claims(&env, "db", 0).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_renewed_while_the_command_runs() {
    let mut env = env_with_lock().await;
    let dir = tempfile::tempdir().expect("dir");
    // A 3 s lease and a command of 8 s: only renewals keep the grant.
    let run = spawn_lock(
        &env,
        "db",
        &["--ttl", "3s"],
        &format!("set -- run; {RECORD}; sleep 8"),
        dir.path(),
    );
    until_exists(dir.path().join("run.token")).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let claims = until_claims(&env, "db", 1).await;
    assert_eq!(phase_of(&claims[0]), Some(ClaimPhase::Held), "still held");
    let output = finish(run).await;
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    until_claims(&env, "db", 0).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_while_the_command_runs_stops_it_with_76() {
    let mut env = env_with_lock().await;
    let dir = tempfile::tempdir().expect("dir");
    let run = spawn_lock(
        &env,
        "db",
        &["--grace", "2s"],
        &format!("set -- run; {RECORD}; sleep 60"),
        dir.path(),
    );
    until_exists(dir.path().join("run.token")).await;
    // Someone deletes the claim (or the controller ends it): the critical section is over.
    env.delete_claim(&read(dir.path(), "run.claim")).await;
    let output = finish(run).await;
    assert_eq!(code(&output), 76, "{}", stderr(&output));
    let line = stderr(&output);
    assert!(
        line.starts_with("turnstile: lost lock db (fencing token 1)"),
        "{line}"
    );
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giving_up_leaves_no_claim_behind() {
    let mut env = env_with_lock().await;
    env.apply_claim("holder", "db", "");
    env.wait_phase("holder", ClaimPhase::Held).await;
    let dir = tempfile::tempdir().expect("dir");

    let timed_out = finish(spawn_lock(
        &env,
        "db",
        &["--wait", "1s"],
        "true",
        dir.path(),
    ))
    .await;
    assert_eq!(code(&timed_out), 75, "{}", stderr(&timed_out));
    assert!(stderr(&timed_out).starts_with("turnstile: could not get lock db within 1s"));
    until_claims(&env, "db", 1).await;

    let waiting = spawn_lock(&env, "db", &[], "true", dir.path());
    until_claims(&env, "db", 2).await;
    let pid = waiting.id().expect("pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let terminated = finish(waiting).await;
    assert_eq!(code(&terminated), 128 + 15, "{}", stderr(&terminated));
    until_claims(&env, "db", 1).await;

    let missing = finish(spawn_lock(&env, "nope", &[], "true", dir.path())).await;
    assert_eq!(code(&missing), 2, "{}", stderr(&missing));
    assert!(
        stderr(&missing).contains("DistributedLock nope does not exist"),
        "{}",
        stderr(&missing)
    );
    assert!(claims_of(&env, "nope").await.is_empty());
    env.stop_controller().await;
}
