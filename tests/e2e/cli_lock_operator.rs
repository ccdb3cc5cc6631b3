//! `turnstile lock --lock NAME`: the real binary holds a DistributedLock through the operator
//! (a LockClaim of its own, on the fake API server with the real controller): the command
//! runs with the grant's fencing token, a second run waits for the first, the lease is
//! renewed while the command runs, and the claim is deleted when it ends. A claim lost while
//! the command runs stops it (exit 76); `--wait` gives up (75) and SIGTERM while waiting exits
//! 143, both leaving no claim behind; a lock that does not exist is a usage error (2). An API
//! server that cannot be reached is 69; the requests it makes need exactly the RBAC verbs the
//! README lists; a `turnstile lock` killed outright frees the lock once its `--ttl` runs out.
//! `turnstile release` (an administrator's force-release) ends such a run's grant on the
//! record: the run stops with 76, the next waiter is granted with a higher token, and the
//! Events on the lock and the claim say who and why.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use kube::api::ListParams;
use support::actor::{sent_by, tagged_client};
use support::child::one_line_exit;
use support::child::{finish_within, spawn_captured};
use support::output::{stderr, stdout};
use support::roles::{example_role, verbs};
use support::{phase_of, position_of, token_of, write_unreachable_kubeconfig, Env, WAIT};
use tempfile::TempDir;
use tokio::process::{Child, Command};
use turnstile_api::{ClaimPhase, LockClaim};
use turnstile_controller::ControllerConfig;

/// `turnstile lock --lock db ARGS… -- sh -c SCRIPT` in `dir`, against the test's cluster.
fn spawn_lock(env: &Env, dir: &TempDir, args: &[&str], script: &str) -> Child {
    spawn_lock_on(env, "db", dir, args, script)
}

/// [`spawn_lock`] on `lock`.
fn spawn_lock_on(env: &Env, lock: &str, dir: &TempDir, args: &[&str], script: &str) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_turnstile"));
    command
        .args(["lock", "--lock", lock, "-n", &env.namespace])
        .args(args)
        .args(["--", "sh", "-c", script])
        .current_dir(dir.path())
        .env("KUBECONFIG", &env.kubeconfig)
        .env_remove("POD_NAMESPACE")
        .env_remove("RUST_LOG");
    spawn_captured(&mut command, Stdio::null(), "turnstile lock")
}

/// [`spawn_lock_on`] `lock` of a script recorded as `run` that goes on with `then`, once it
/// holds the lock (its token is recorded).
async fn holding_run(env: &Env, lock: &str, dir: &TempDir, args: &[&str], then: &str) -> Child {
    let run = spawn_lock_on(env, lock, dir, args, &recorded("run", then));
    until_exists(dir.path().join("run.token")).await;
    run
}

async fn finish(child: Child) -> Output {
    finish_within(WAIT, child, "turnstile lock").await
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
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
    let env = Env::started().await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env
}

/// [`env_with_lock`], and a scratch directory for the command to run in.
async fn env_with_lock_and_dir() -> (Env, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    (env_with_lock().await, dir)
}

/// A script that records, as `NAME.token` and `NAME.claim`, the fencing token and claim it
/// ran under, then goes on with `then` (if any).
fn recorded(name: &str, then: &str) -> String {
    let record = format!(
        "echo $TURNSTILE_FENCING_TOKEN > {name}.token; echo $TURNSTILE_LOCK_CLAIM > {name}.claim"
    );
    if then.is_empty() {
        record
    } else {
        format!("{record}; {then}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_under_a_claim_of_its_own_and_a_second_run_waits_for_the_first() {
    let (mut env, dir) = env_with_lock_and_dir().await;

    // The first run holds until `go` exists; the second waits behind it.
    let first = spawn_lock(
        &env,
        &dir,
        &[],
        &recorded("first", "while [ ! -e go ]; do sleep 0.05; done"),
    );
    until_exists(dir.path().join("first.token")).await;
    let second = spawn_lock(
        &env,
        &dir,
        &[],
        &recorded("second", "[ -e go ] || echo overlapped > second.overlap"),
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
    let (mut env, dir) = env_with_lock_and_dir().await;
    // A 3 s lease and a command of 8 s: only renewals keep the grant.
    let run = holding_run(&env, "db", &dir, &["--ttl", "3s"], "sleep 8").await;
    // Watched while the command runs: always Held, one token, and the lease moved on again
    // and again (each expiry seen stays ahead of the clock).
    let started = Instant::now();
    let mut expiries = std::collections::BTreeSet::new();
    let mut tokens = std::collections::BTreeSet::new();
    while started.elapsed() < Duration::from_secs(7) {
        let claims = until_claims(&env, "db", 1).await;
        let claim = &claims[0];
        assert_eq!(phase_of(claim), Some(ClaimPhase::Held), "still held");
        let status = claim.status.clone().expect("status");
        tokens.insert(status.fencing_token.expect("token"));
        let expires = status.expires_at.expect("expiresAt").0;
        assert!(
            expires.as_second() >= k8s_openapi::jiff::Timestamp::now().as_second(),
            "a lease run out shown while the command runs: {expires}"
        );
        expiries.insert(expires);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(tokens.len(), 1, "one grant throughout: {tokens:?}");
    assert!(
        expiries.len() >= 3,
        "renewed over several lease periods: {expiries:?}"
    );
    let output = finish(run).await;
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    until_claims(&env, "db", 0).await;
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_while_the_command_runs_stops_it_with_76() {
    let (mut env, dir) = env_with_lock_and_dir().await;
    let run = holding_run(&env, "db", &dir, &["--grace", "2s"], "sleep 60").await;
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

/// `turnstile release ARGS… -n <the test's namespace>`, run to its end.
async fn release(env: &Env, args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .arg("release")
        .args(args)
        .args(["-n", &env.namespace])
        .env("KUBECONFIG", &env.kubeconfig)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output();
    tokio::time::timeout(WAIT, output)
        .await
        .expect("turnstile release ends")
        .expect("run turnstile release")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turnstile_release_ends_the_holders_grant_on_the_record() {
    let (mut env, dir) = env_with_lock_and_dir().await;
    let nobody = release(&env, &["db", "--reason", "stuck"]).await;
    assert_eq!(code(&nobody), 9, "{}", stderr(&nobody));
    assert!(
        stderr(&nobody).contains("nobody holds lock db"),
        "{}",
        stderr(&nobody)
    );
    let missing = release(&env, &["nope", "--reason", "stuck"]).await;
    assert_eq!(code(&missing), 6, "{}", stderr(&missing));

    let run = holding_run(&env, "db", &dir, &["--grace", "2s"], "sleep 60").await;
    let held = read(dir.path(), "run.claim");
    env.apply_claim("next", "db", "");
    env.wait_claim("next", |claim| position_of(claim) == Some(1))
        .await;
    let not_holding = release(&env, &["db", "--claim", "next", "--reason", "stuck"]).await;
    assert_eq!(code(&not_holding), 9, "{}", stderr(&not_holding));

    let released = release(&env, &["db", "--reason", "hung on a dead replica"]).await;
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    let said = stdout(&released);
    assert!(
        said.starts_with(&format!("{held}: Expired (force-released from lock db by ")),
        "{said}"
    );
    assert!(said.contains("hung on a dead replica"), "{said}");
    // The holder is told as for any lost lock, and the next waiter is granted after it.
    let output = finish(run).await;
    assert_eq!(code(&output), 76, "{}", stderr(&output));
    let next = env.wait_phase("next", ClaimPhase::Held).await;
    assert_eq!(token_of(&next), Some(2));
    // On the record: who (as the API server authenticated the caller; the fake does not say)
    // and why, on the lock.
    env.wait_event("db", "ForceReleased").await;
    let note = env
        .events_about("db")
        .await
        .into_iter()
        .find(|event| event.reason.as_deref() == Some("ForceReleased"))
        .and_then(|event| event.note)
        .unwrap_or_default();
    let who = if env.fake.is_some() {
        "an unnamed user"
    } else {
        "turnstile-test-admin"
    };
    assert!(
        note.contains(&format!("by {who}: hung on a dead replica"))
            && note.contains(&format!("claim {held}, fencing token 1")),
        "{note}"
    );
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giving_up_leaves_no_claim_behind() {
    let mut env = env_with_lock().await;
    env.hold("holder", "db", "").await;
    let dir = tempfile::tempdir().expect("dir");

    let timed_out = finish(spawn_lock(&env, &dir, &["--wait", "1s"], "true")).await;
    assert_eq!(code(&timed_out), 75, "{}", stderr(&timed_out));
    assert!(stderr(&timed_out).starts_with("turnstile: could not get lock db within 1s"));
    until_claims(&env, "db", 1).await;

    let waiting = spawn_lock(&env, &dir, &[], "true");
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

    let missing = finish(spawn_lock_on(&env, "nope", &dir, &[], "true")).await;
    assert_eq!(code(&missing), 2, "{}", stderr(&missing));
    assert!(
        stderr(&missing).contains("DistributedLock nope does not exist"),
        "{}",
        stderr(&missing)
    );
    assert!(claims_of(&env, "nope").await.is_empty());
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uses_exactly_the_rbac_verbs_the_readme_lists() {
    let env = Env::fake_only("its request log shows each verb the command used").await;
    // The controller's requests are tagged, so what is left in the log is the binary's.
    let controller = env.spawn_controller_with(
        tagged_client(env.server(), "controller"),
        ControllerConfig::default(),
    );
    env.apply_lock("db", "leaseDurationSeconds: 300");
    env.wait_ready("db", "True").await;
    env.server().clear_request_log();
    let dir = tempfile::tempdir().expect("dir");
    // A 3 s lease renewed every second, so a 2.5 s command sees renewals.
    let output = finish(spawn_lock(&env, &dir, &["--ttl", "3s"], "sleep 2.5")).await;
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let log: Vec<_> = env
        .server()
        .request_log()
        .into_iter()
        .filter(|request| !sent_by(request, "controller"))
        .collect();
    let readme = BTreeMap::from([
        (
            ("turnstile.dev".to_owned(), "lockclaims".to_owned()),
            verbs(&["create", "list", "watch", "patch", "delete"]),
        ),
        (
            ("turnstile.dev".to_owned(), "distributedlocks".to_owned()),
            verbs(&["get"]),
        ),
    ]);
    assert_eq!(
        fake_apiserver::rbac_summary(&log),
        readme,
        "what turnstile lock --lock used, against the README's list"
    );
    assert_eq!(
        example_role("lock-in-a-container.yaml", "turnstile-lock"),
        readme,
        "the example's Role"
    );
    controller.stop().await;
}

#[test]
fn an_unreachable_api_server_exits_69_with_one_line() {
    let port = test_servers::free_port().expect("free port");
    let dir = tempfile::tempdir().expect("dir");
    let kubeconfig = dir.path().join("kubeconfig");
    write_unreachable_kubeconfig(&kubeconfig, port, "default");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["lock", "--lock", "db", "--", "sh", "-c", "touch ran"])
        .current_dir(dir.path())
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run turnstile lock");
    one_line_exit(&output, 69, "turnstile lock");
    assert!(!dir.path().join("ran").exists(), "the command ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_turnstile_frees_the_lock_once_its_ttl_runs_out() {
    let (mut env, dir) = env_with_lock_and_dir().await;
    let ttl = Duration::from_secs(3);
    // The command records its shell's PID, so the test can end it after killing turnstile.
    let mut first = spawn_lock(
        &env,
        &dir,
        &["--ttl", "3s"],
        &recorded("first", "echo $$ > first.pid; sleep 60"),
    );
    until_exists(dir.path().join("first.pid")).await;
    // SIGKILL: no cleanup at all, the claim stays behind unrenewed.
    first.start_kill().expect("SIGKILL turnstile lock");
    let _ = first.wait().await;
    let killed = Instant::now();
    let second = spawn_lock(&env, &dir, &["--ttl", "3s"], &recorded("second", ""));
    let second = finish(second).await;
    let waited = killed.elapsed();
    if let Ok(pid) = read(dir.path(), "first.pid").parse::<i32>() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    assert_eq!(read(dir.path(), "second.token"), "2");
    // The first claim was not released but left to expire, and that came well within a wide
    // margin of its lease.
    let first_claim = env.claim(&read(dir.path(), "first.claim")).await;
    assert_eq!(
        phase_of(&first_claim),
        Some(ClaimPhase::Expired),
        "{first_claim:?}"
    );
    assert!(waited < ttl + Duration::from_secs(15), "{waited:?}");
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_refused_for_a_whole_ttl_stop_the_command_with_76() {
    let mut env = Env::fake_only_started("it refuses the renewals on cue").await;
    env.apply_lock("db", "leaseDurationSeconds: 300");
    let dir = tempfile::tempdir().expect("dir");
    let args = ["--ttl", "3s", "--grace", "2s"];
    let run = holding_run(&env, "db", &dir, &args, "sleep 60").await;
    // The controller away (the claim keeps reading `Held`), then every write to the claims
    // refused with 503, which the client retries for minutes: turnstile cannot know the grant
    // lasts past its lease.
    env.stop_controller().await;
    let claims_path = env.turnstile_path("lockclaims");
    env.server().inject_faults(&claims_path, 100_000, 503);
    let refused = Instant::now();
    let output = finish(run).await;
    let after = refused.elapsed();
    assert_eq!(code(&output), 76, "{}", stderr(&output));
    // The last line says why (before it, a warning that the claim could not be deleted).
    let said = stderr(&output);
    assert!(
        said.lines().last().is_some_and(|line| line.starts_with(
            "turnstile: lost lock db (fencing token 1): no renewal reached the API server"
        )),
        "{said}"
    );
    // About one lease after the last renewal that landed, plus the grace: far below 60 s.
    assert!(after < Duration::from_secs(3 + 2 + 15), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_controller_expires_stops_the_command_with_76() {
    let mut env = env_with_lock().await;
    // The lock's maximum hold ends every grant after 2 s, renewed or not.
    env.apply_lock("short", "leaseDurationSeconds: 300\nmaxHoldSeconds: 2");
    let dir = tempfile::tempdir().expect("dir");
    let run = holding_run(&env, "short", &dir, &["--grace", "2s"], "sleep 60").await;
    let output = finish(run).await;
    assert_eq!(code(&output), 76, "{}", stderr(&output));
    let said = stderr(&output);
    assert!(
        said.starts_with("turnstile: lost lock short (fencing token 1)")
            && said.contains("Expired"),
        "{said}"
    );
    env.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_busy_fail_exits_75_and_cancel_in_progress_stops_the_older_run_of_its_group() {
    let (mut env, dir) = env_with_lock_and_dir().await;
    let first = holding_run(
        &env,
        "db",
        &dir,
        &["--group", "prod", "--grace", "2s"],
        "sleep 60",
    )
    .await;

    // Busy: never queued, 75 at once, no claim left behind.
    let busy = finish(spawn_lock(&env, &dir, &["--when-busy", "fail"], "true")).await;
    assert_eq!(code(&busy), 75, "{}", stderr(&busy));
    assert!(stderr(&busy).contains("LockBusy"), "{}", stderr(&busy));
    until_claims(&env, "db", 1).await;

    // The newest run of the group cancels the one in progress (stopped as on a lost lock),
    // then runs with a higher token.
    let second = spawn_lock(
        &env,
        &dir,
        &["--group", "prod", "--when-busy", "cancel-in-progress"],
        &recorded("second", ""),
    );
    let first = finish(first).await;
    assert_eq!(code(&first), 76, "{}", stderr(&first));
    assert!(stderr(&first).contains("Superseded"), "{}", stderr(&first));
    let second = finish(second).await;
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    let token = |name: &str| -> i64 { read(dir.path(), name).parse().expect("a token") };
    assert!(token("second.token") > token("run.token"));
    until_claims(&env, "db", 0).await;

    // A replacing policy needs a group.
    let usage = finish(spawn_lock(
        &env,
        &dir,
        &["--when-busy", "replace-pending"],
        "true",
    ))
    .await;
    assert_eq!(code(&usage), 2, "{}", stderr(&usage));
    assert!(stderr(&usage).contains("--group"), "{}", stderr(&usage));
    env.stop_controller().await;
}
