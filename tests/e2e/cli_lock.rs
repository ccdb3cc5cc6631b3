//! `turnstile lock` end to end: the built binary against a real `redis-server`.
//!
//! - the command runs with its fencing token and key in the environment, its exit status is
//!   passed through like a shell's, and the lock is released afterwards;
//! - a second `turnstile lock` on the key waits for the first and gets a larger token;
//!   `--max-holders 2` admits two at once (shared, a semaphore), and an `--exclusive` one
//!   waits for every shared holder;
//!   `--wait 1s` on a held key exits 75;
//! - `--max-hold` stops the command when the hold time is up, renewals notwithstanding (76);
//! - `--priority`: a later waiter of higher priority is served first, the holder kept;
//!   `--lock-delay` keeps the key from everyone after an involuntary end, not after a release;
//!   a new `--max-holders` takes effect at the next grant and lowering it revokes nobody; a
//!   waiting `--exclusive` keeps later `--shared` requests out;
//! - SIGTERM is passed on to the command; SIGTERM while waiting leaves the queue;
//! - a lost lock (holder keys deleted, or Redis gone until the lease runs out) stops the
//!   command and everything it started (SIGKILL after `--grace` if SIGTERM is ignored) and
//!   exits 76;
//! - concurrent processes never overlap in the critical section (violations counted);
//! - memory backends are refused (2) and unreachable ones reported (69);
//! - on MongoDB, by `mongodb://` and by `mongodb+srv://` (its SRV record served by a DNS
//!   server of the test's, which turnstile is pointed at in a mount namespace of its own);
//! - on etcd, by `etcd://` and by `etcds://` with user/password and the CA from
//!   `TURNSTILE_ETCD_CA_FILE`.

use crate::support;
mod fixture;

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::child::{finish_within, spawn_captured};
use support::launch::{blocking, launch};
use support::output::{stderr, stdout};
use tempfile::TempDir;
use test_servers::RedisServer;
use tokio::process::{Child, Command};

use fixture::*;

#[tokio::test]
async fn runs_the_command_with_its_token_and_key_then_releases() {
    let mut fx = Fixture::start().await;
    let script = r#"echo "$TURNSTILE_FENCING_TOKEN $TURNSTILE_LOCK_KEY""#;
    let first = fx.run("team/report", &[], script).await;
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    assert_eq!(stdout(&first), "1 team/report\n");
    assert_eq!(fx.zcard("team/report", "holders").await, 0, "released");

    let second = fx.run("team/report", &[], script).await;
    assert_eq!(stdout(&second), "2 team/report\n", "{}", stderr(&second));

    // The backend from TURNSTILE_BACKEND_URL instead of --backend.
    let from_env = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["lock", "team/report", "--", "sh", "-c", script])
        .env("TURNSTILE_BACKEND_URL", &fx.url)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run turnstile lock");
    assert_eq!(code(&from_env), 0, "{}", stderr(&from_env));
    assert_eq!(stdout(&from_env), "3 team/report\n");
}

#[tokio::test]
async fn exit_status_is_the_commands_as_a_shell_reports_it() {
    let mut fx = Fixture::start().await;
    let exit_7 = fx.run("k", &[], "exit 7").await;
    assert_eq!(code(&exit_7), 7);
    assert_eq!(
        stderr(&exit_7),
        "",
        "a command's own failure is not turnstile's to report"
    );
    let killed = fx.run("k", &[], "kill -TERM $$").await;
    assert_eq!(code(&killed), 128 + 15);

    let missing = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["lock", "--backend", &fx.url, "k", "--"])
        .arg("/nonexistent/turnstile-test-command")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(code(&missing), 127);
    assert!(
        stderr(&missing).contains("cannot run"),
        "{}",
        stderr(&missing)
    );
    // A file that is there but not executable: 126, as a shell reports it.
    let not_executable = fx.path("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["lock", "--backend", &fx.url, "k", "--"])
        .arg(&not_executable)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(code(&refused), 126, "{}", stderr(&refused));
    assert!(
        stderr(&refused).starts_with("turnstile: "),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        fx.zcard("k", "holders").await,
        0,
        "released after every run"
    );
}

#[tokio::test]
async fn a_second_holder_waits_for_the_first_and_gets_a_larger_token() {
    let mut fx = Fixture::start().await;
    let first = fx.lock(
        "deploy",
        &[],
        &format!("echo $TURNSTILE_FENCING_TOKEN > first.token; {AWAIT_GO}; touch first.done"),
    );
    fx.until_exists("first.token").await;
    // The second may only run once the first's command has finished.
    let second = fx.lock(
        "deploy",
        &[],
        "test -e first.done || exit 99; echo $TURNSTILE_FENCING_TOKEN > second.token",
    );
    fx.until_queued("deploy").await;
    assert!(!fx.path("second.token").exists());
    fx.go();

    let (first, second) = (finish(first).await, finish(second).await);
    assert_eq!(code(&first), 0, "{}", stderr(&first));
    assert_eq!(
        code(&second),
        0,
        "second ran before the first finished: {}",
        stderr(&second)
    );
    let (a, b) = (
        read_token(fx.path("first.token")),
        read_token(fx.path("second.token")),
    );
    assert!(b > a, "tokens must increase: first {a}, second {b}");
}

#[tokio::test]
async fn max_holders_admits_that_many_at_once() {
    let fx = Fixture::start().await;
    let script = |name: &str| {
        format!("touch {name}.in; {AWAIT_GO}; echo $TURNSTILE_FENCING_TOKEN > {name}.token")
    };
    // Without a mode, a lock of several holders is a counting semaphore (shared).
    let a = fx.lock("pool", &["--max-holders", "2"], &script("a"));
    let b = fx.lock("pool", &["--max-holders", "2"], &script("b"));
    // Both inside at once: neither can leave before `go`.
    fx.until_exists("a.in").await;
    fx.until_exists("b.in").await;
    fx.go();
    let (a, b) = (finish(a).await, finish(b).await);
    assert_succeeded(&[&a, &b]);
    assert_ne!(
        read_token(fx.path("a.token")),
        read_token(fx.path("b.token"))
    );
}

#[tokio::test]
async fn shared_holders_run_together_and_an_exclusive_one_waits_for_them() {
    let fx = Fixture::start().await;
    let shared = |name: &str| {
        fx.lock(
            "rw",
            &["--max-holders", "3", "--shared"],
            &format!("touch {name}.in; {AWAIT_GO}; touch {name}.out"),
        )
    };
    let (a, b) = (shared("a"), shared("b"));
    fx.until_exists("a.in").await;
    fx.until_exists("b.in").await;
    // Both readers hold the lock: the writer must not get in, not even with a bounded wait.
    fx.assert_refused("rw", &["--max-holders", "3", "--exclusive"], "w.in")
        .await;
    // A patient writer gets in once both readers are done, and finds both finished.
    let writer = fx.lock(
        "rw",
        &["--max-holders", "3", "--exclusive"],
        "test -e a.out && test -e b.out && touch w.ok",
    );
    fx.go();
    let (a, b, writer) = (finish(a).await, finish(b).await, finish(writer).await);
    assert_succeeded(&[&a, &b, &writer]);
    assert!(fx.path("w.ok").exists(), "the writer overlapped a reader");
}

#[tokio::test]
async fn max_hold_stops_the_command_as_a_lost_lock_does() {
    let fx = Fixture::start().await;
    // Renewed every 200 ms, yet held for 1.5 s at most.
    let holder = fx
        .run(
            "bounded",
            &["--ttl", "600ms", "--max-hold", "1.5"],
            "sleep 30; touch survived",
        )
        .await;
    fx.assert_stopped_as_lost(&holder, "lost lock \"bounded\"");
}

#[tokio::test]
async fn wait_gives_up_on_a_held_key_and_sigterm_reaches_the_holders_command() {
    let mut fx = Fixture::start().await;
    let holder = fx.holder("busy", &[], "held").await;

    let impatient = fx.run("busy", &["--wait", "1s"], "touch ran").await;
    assert_eq!(code(&impatient), NOT_ACQUIRED, "{}", stderr(&impatient));
    let message = stderr(&impatient);
    assert!(
        message.contains("could not get lock \"busy\" within 1s"),
        "{message}"
    );
    assert!(
        !fx.path("ran").exists(),
        "the command must not run without the lock"
    );
    assert_eq!(
        fx.zcard("busy", "queue").await,
        0,
        "gave up its queue place"
    );

    // SIGTERM to turnstile goes on to the command (the shell and its sleep); turnstile then
    // releases and reports the command's death like a shell.
    kill(pid_of(&holder), Signal::SIGTERM).unwrap();
    let holder = finish(holder).await;
    assert_eq!(code(&holder), 128 + 15, "{}", stderr(&holder));
    assert_eq!(fx.zcard("busy", "holders").await, 0, "released");
    // SIGINT (Ctrl-C) alike: on to the command, 128+2, released.
    let holder = fx.holder("busy", &[], "held-again").await;
    kill(pid_of(&holder), Signal::SIGINT).unwrap();
    let holder = finish(holder).await;
    assert_eq!(code(&holder), 128 + 2, "{}", stderr(&holder));
    assert_eq!(fx.zcard("busy", "holders").await, 0, "released");
}

#[tokio::test]
async fn sigterm_while_waiting_leaves_the_queue() {
    let mut fx = Fixture::start().await;
    let holder = fx.holder("q", &[], "held").await;
    // SIGTERM and SIGINT alike: leave the queue and exit with 128+N.
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let waiter = fx.lock("q", &[], "touch ran");
        fx.until_queued("q").await;
        kill(pid_of(&waiter), signal).unwrap();
        let waiter = finish(waiter).await;
        assert_eq!(code(&waiter), 128 + signal as i32, "{}", stderr(&waiter));
        assert!(
            stderr(&waiter).contains("while waiting for lock"),
            "{}",
            stderr(&waiter)
        );
        assert_eq!(fx.zcard("q", "queue").await, 0, "{signal}: left the queue");
        assert!(!fx.path("ran").exists());
    }

    fx.go();
    assert_eq!(code(&finish(holder).await), 0);
}

#[tokio::test]
async fn a_lost_lock_stops_the_command_and_what_it_started() {
    let mut fx = Fixture::start().await;
    // The shell starts a background sleep and waits for it: both must be stopped.
    let holder = fx.lock(
        "fragile",
        &["--ttl", "2s"],
        "sleep 60 & echo $! > sleeper.pid; wait; touch survived",
    );
    let pid_file = fx.path("sleeper.pid");
    eventually("the command runs", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|pid| pid.ends_with('\n'))
    })
    .await;
    let sleeper: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    fx.delete_holders("fragile").await;
    let holder = finish(holder).await;
    assert_eq!(code(&holder), LOCK_LOST, "{}", stderr(&holder));
    let message = stderr(&holder);
    assert!(
        message.contains("lost lock \"fragile\" (fencing token 1)"),
        "{message}"
    );
    assert!(message.contains("no longer holds our lease"), "{message}");
    assert!(
        message.contains("stopped the command (SIGTERM)"),
        "{message}"
    );
    eventually("the background sleep is stopped too", || {
        process_gone(sleeper)
    })
    .await;
    // And reaped by turnstile (its subreaper), not left a zombie: its pid is gone entirely.
    eventually("the background sleep is reaped", || {
        !std::path::Path::new(&format!("/proc/{sleeper}")).exists()
    })
    .await;
    assert!(!fx.path("survived").exists());
}

#[tokio::test]
async fn on_a_terminal_the_command_stays_in_turnstiles_group_and_only_it_is_signalled() {
    let fx = Fixture::start().await;
    // stdin a terminal: the far side of a fresh pseudo-terminal.
    let terminal = nix::pty::openpty(None, None).expect("openpty");
    let holder = spawn_lock(
        &fx.url,
        "interactive",
        &[],
        // (The sleep's output away from turnstile's pipes, whose end the test waits for.)
        "sleep 60 >/dev/null 2>&1 & echo $! > sleeper.pid; echo $$ > shell.pid; wait; touch survived",
        &fx.dir,
        Stdio::from(terminal.slave),
    );
    let (shell_file, sleeper_file) = (fx.path("shell.pid"), fx.path("sleeper.pid"));
    eventually("the command runs", || {
        [&shell_file, &sleeper_file]
            .iter()
            .all(|file| std::fs::read_to_string(file).is_ok_and(|pid| pid.ends_with('\n')))
    })
    .await;
    let pid_in = |file: &PathBuf| -> i32 {
        std::fs::read_to_string(file)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (shell, sleeper) = (pid_in(&shell_file), pid_in(&sleeper_file));
    let turnstile = pid_of(&holder);
    assert_eq!(
        process_group(shell),
        process_group(turnstile.as_raw()),
        "the command is in turnstile's (foreground) group"
    );
    assert_ne!(process_group(shell), shell, "not a group of its own");

    kill(turnstile, Signal::SIGTERM).expect("SIGTERM turnstile");
    let holder = finish(holder).await;
    assert_eq!(
        code(&holder),
        128 + 15,
        "the shell's SIGTERM: {}",
        stderr(&holder)
    );
    let survived = !process_gone(sleeper);
    // Ours to end (a grandchild this test started), by PID.
    let _ = kill(Pid::from_raw(sleeper), Signal::SIGKILL);
    assert!(
        survived,
        "only the command itself was signalled, not what it started"
    );
    assert!(!fx.path("survived").exists());
}

#[tokio::test]
async fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let mut fx = Fixture::start().await;
    let holder = fx
        .holder_with_grace(
            "stubborn",
            "trap '' TERM; touch ready; i=0; \
             while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; touch survived",
        )
        .await;
    fx.delete_holders("stubborn").await;
    let holder = finish(holder).await;
    fx.assert_stopped_as_lost(&holder, "SIGKILL after 1s grace");
}

#[tokio::test]
async fn a_backend_outage_stops_the_command_once_the_lease_runs_out() {
    let mut fx = Fixture::start().await;
    let holder = fx
        .holder_with_grace("outage", "touch ready; sleep 60; touch survived")
        .await;
    fx.stop_server(); // renewals now fail
    let holder = finish(holder).await;
    fx.assert_stopped_as_lost(&holder, "lease ran out");
}

/// Four processes, three rounds each, on one mutex: the critical section (an atomic `mkdir`
/// marker) is never entered by two at once, and the tokens are all distinct.
#[tokio::test]
async fn concurrent_processes_never_overlap() {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 3;
    let fx = std::sync::Arc::new(Fixture::start().await);
    let section = "if mkdir inside 2>/dev/null; then sleep 0.05; rmdir inside; \
                   else echo overlap >> violations; fi; echo $TURNSTILE_FENCING_TOKEN >> tokens";
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let fx = fx.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let output = fx.run("mutex", &[], section).await;
                assert_eq!(code(&output), 0, "{}", stderr(&output));
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let violations = std::fs::read_to_string(fx.path("violations"))
        .map(|text| text.lines().count())
        .unwrap_or(0);
    assert_eq!(violations, 0, "critical sections overlapped");
    let mut tokens: Vec<u64> = std::fs::read_to_string(fx.path("tokens"))
        .unwrap()
        .lines()
        .map(|line| line.parse().unwrap())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        WORKERS * ROUNDS,
        "every grant has its own token"
    );
}

#[tokio::test]
async fn memory_is_refused_and_an_unreachable_backend_reported() {
    let dir = tempfile::tempdir().unwrap();
    let memory = finish(spawn_lock(
        "memory://",
        "k",
        &[],
        "touch ran",
        &dir,
        Stdio::null(),
    ))
    .await;
    assert_eq!(code(&memory), 2);
    assert!(
        stderr(&memory).contains("memory backend"),
        "{}",
        stderr(&memory)
    );

    let port = test_servers::free_port().unwrap();
    let url = format!("redis://127.0.0.1:{port}/");
    let unreachable = finish(spawn_lock(&url, "k", &[], "touch ran", &dir, Stdio::null())).await;
    assert_eq!(code(&unreachable), 69, "{}", stderr(&unreachable));
    let message = stderr(&unreachable);
    assert!(
        message.contains("cannot connect to the redis backend"),
        "{message}"
    );
    assert!(!dir.path().join("ran").exists());
}

#[tokio::test]
async fn runs_on_mongodb_too() {
    let Some(mongo) = blocking(test_servers::MongoServer::shared_or_skip).await else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let url = mongo.uri().to_owned();
    let key = format!("cli-{}", std::process::id());
    let script = r#"echo "$TURNSTILE_FENCING_TOKEN""#;
    let first = finish(spawn_lock(&url, &key, &[], script, &dir, Stdio::null())).await;
    let second = finish(spawn_lock(&url, &key, &[], script, &dir, Stdio::null())).await;
    assert_tokens_increase(&first, &second);
}

#[tokio::test]
async fn runs_on_etcd_plain_and_over_tls_with_a_password() {
    let plain = launch(test_servers::EtcdCluster::start, "etcd starts").await;
    let dir = tempfile::tempdir().expect("dir");
    let script = r#"echo "$TURNSTILE_FENCING_TOKEN""#;
    let first = finish(spawn_lock(
        &plain.url(),
        "cli",
        &[],
        script,
        &dir,
        Stdio::null(),
    ))
    .await;
    let second = finish(spawn_lock(
        &plain.url(),
        "cli",
        &[],
        script,
        &dir,
        Stdio::null(),
    ))
    .await;
    assert_tokens_increase(&first, &second);

    let secured = launch(
        || {
            test_servers::EtcdCluster::start_with(
                &test_servers::EtcdOptions::new()
                    .tls()
                    .user("turnstile", "s3cret"),
            )
        },
        "etcd with TLS and auth starts",
    )
    .await;
    let ca_file = secured.tls_files().expect("certificates").ca_cert.clone();
    let run = |ca: Option<&std::path::Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_turnstile"));
        command
            .args([
                "lock",
                "--backend",
                &secured.url(),
                "tls",
                "--",
                "sh",
                "-c",
                script,
            ])
            .stdin(Stdio::null());
        if let Some(ca) = ca {
            command.env("TURNSTILE_ETCD_CA_FILE", ca);
        }
        command.output()
    };
    let held = run(Some(&ca_file)).await.expect("run turnstile");
    assert_eq!(code(&held), 0, "{}", stderr(&held));
    assert_eq!(stdout(&held), "1\n");
    // Without the CA, Mozilla's roots do not trust the test's certificate: unreachable (69).
    let untrusted = run(None).await.expect("run turnstile");
    assert_eq!(code(&untrusted), 69, "{}", stderr(&untrusted));
}

#[tokio::test]
async fn a_later_waiter_of_higher_priority_is_served_first_and_the_holder_kept() {
    let mut fx = Fixture::start().await;
    let holder = fx.holder("prio", &[], "holder.in").await;
    let low = fx.lock("prio", &[], "echo low >> order");
    fx.until_waiting("prio", 1).await;
    let high = fx.lock("prio", &["--priority", "5"], "echo high >> order");
    fx.until_waiting("prio", 2).await;
    // Nobody preempts the holder: it is still inside when both wait.
    assert!(!fx.path("order").exists(), "a waiter ran beside the holder");
    fx.go();
    let (holder, low, high) = (finish(holder).await, finish(low).await, finish(high).await);
    assert_succeeded(&[&holder, &low, &high]);
    let order = std::fs::read_to_string(fx.path("order")).expect("order");
    assert_eq!(
        order, "high\nlow\n",
        "the later, higher-priority waiter first"
    );
}

#[tokio::test]
async fn lock_delay_follows_an_involuntary_end_but_not_a_release() {
    let fx = Fixture::start().await;
    // Released: the next one gets the key at once (a 1 s wait is plenty).
    let released = fx.run("delayed", &["--lock-delay", "3"], "true").await;
    let next = fx.run("delayed", &["--wait", "1s"], "touch next.ran").await;
    assert_succeeded(&[&released, &next]);
    assert!(fx.path("next.ran").exists());

    // Ended by its maximum hold: nobody gets the key for the 3 s delay, not even a process
    // that never heard of it, then the key is free again.
    let cut = fx
        .run(
            "delayed",
            &["--ttl", "600ms", "--max-hold", "1", "--lock-delay", "3"],
            "sleep 30",
        )
        .await;
    assert_lost(&cut, "lost lock \"delayed\"");
    fx.assert_refused("delayed", &[], "refused.ran").await;
    let later = fx.run("delayed", &[], "touch later.ran").await;
    assert_succeeded(&[&later]);
    assert!(fx.path("later.ran").exists());
}

#[tokio::test]
async fn a_new_max_holders_applies_at_the_next_grant_and_lowering_it_revokes_nobody() {
    let fx = Fixture::start().await;
    // Shared holders (a mutex would be exclusive, and hold alone whatever the limit): one
    // holds under a limit of 1; a request that raises the limit to 2 is granted beside it.
    let first = fx
        .holder("live", &["--max-holders", "1", "--shared"], "first.in")
        .await;
    let second = fx
        .holder(
            "live",
            &["--max-holders", "2", "--shared", "--wait", "1s"],
            "second.in",
        )
        .await;
    // Back to 1 with two holding: nobody is revoked, the newcomer waits in vain.
    fx.assert_refused("live", &["--max-holders", "1", "--shared"], "third.ran")
        .await;
    fx.go();
    let (first, second) = (finish(first).await, finish(second).await);
    assert_succeeded(&[&first, &second]);
}

#[tokio::test]
async fn a_waiting_exclusive_request_keeps_later_shared_ones_out() {
    let mut fx = Fixture::start().await;
    let rw = ["--max-holders", "3"];
    let reader = fx
        .holder("rwq", &[&rw[..], &["--shared"]].concat(), "reader.in")
        .await;
    let writer = fx.lock(
        "rwq",
        &[&rw[..], &["--exclusive"]].concat(),
        "test -e reader.out && touch writer.ok",
    );
    fx.until_queued("rwq").await;
    // Room for two more readers, but a writer waits first: no writer starvation.
    fx.assert_refused("rwq", &[&rw[..], &["--shared"]].concat(), "late.ran")
        .await;
    std::fs::write(fx.path("reader.out"), "").expect("reader.out");
    fx.go();
    let (reader, writer) = (finish(reader).await, finish(writer).await);
    assert_succeeded(&[&reader, &writer]);
    assert!(
        fx.path("writer.ok").exists(),
        "the writer overlapped the reader"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_on_a_mongodb_srv_url() {
    use support::dns::MongoSrv;

    let Some(mongo) = blocking(test_servers::MongoServer::shared_or_skip).await else {
        return;
    };
    let Some(srv) = MongoSrv::serve(mongo.uri(), "runs_on_a_mongodb_srv_url").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let key = format!("srv-{}", std::process::id());
    let script = r#"mount --bind "$RESOLV" /etc/resolv.conf &&
        exec "$TURNSTILE" lock --backend "$URL" "$KEY" -- sh -c 'echo "$TURNSTILE_FENCING_TOKEN"'"#;
    let run = || {
        support::in_own_mount_namespace(script)
            .env("RESOLV", &srv.resolv_conf)
            .env("URL", srv.url)
            .env("KEY", &key)
            .env_remove("TURNSTILE_BACKEND_URL")
            .env_remove("RUST_LOG")
            .current_dir(dir.path())
            .spawn()
            .expect("spawn unshare")
    };
    let first = finish(run()).await;
    let second = finish(run()).await;
    assert_tokens_increase(&first, &second);
    srv.assert_srv_looked_up();
}
