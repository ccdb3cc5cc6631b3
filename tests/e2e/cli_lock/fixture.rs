//! What the `turnstile lock` tests share: a `redis-server` and a scratch directory to run
//! commands in, spawning `turnstile lock`, and reading what its commands left behind (tokens,
//! exit codes, processes).

use super::*;

/// Upper bound on anything that should finish in a few seconds, even on a loaded box.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

pub(crate) const NOT_ACQUIRED: i32 = 75;
pub(crate) const LOCK_LOST: i32 = 76;

/// A `redis-server` and a scratch directory the commands run in.
pub(crate) struct Fixture {
    server: Option<RedisServer>,
    /// The server's `redis://` URL.
    pub(crate) url: String,
    /// Where the commands run (their working directory).
    pub(crate) dir: TempDir,
    connection: redis::aio::MultiplexedConnection,
}

impl Fixture {
    pub(crate) async fn start() -> Self {
        let server = launch(RedisServer::start, "redis-server starts").await;
        let connection = redis::Client::open(server.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("redis connection");
        Fixture {
            url: server.url().to_owned(),
            server: Some(server),
            dir: tempfile::tempdir().unwrap(),
            connection,
        }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `turnstile lock --backend URL KEY ARGS… -- sh -c SCRIPT`, run in the directory.
    pub(crate) fn lock(&self, key: &str, args: &[&str], script: &str) -> Child {
        spawn_lock(&self.url, key, args, script, &self.dir, Stdio::null())
    }

    /// Runs `turnstile lock` to the end.
    pub(crate) async fn run(&self, key: &str, args: &[&str], script: &str) -> Output {
        finish(self.lock(key, args, script)).await
    }

    /// Starts a holder whose command touches `marker`, then waits for file `go`; returns once
    /// the command runs.
    pub(crate) async fn holder(&self, key: &str, args: &[&str], marker: &str) -> Child {
        let child = self.lock(key, args, &format!("touch {marker}; {AWAIT_GO}"));
        self.until_exists(marker).await;
        child
    }

    /// Starts `turnstile lock KEY --ttl 2s --grace 1s` running `script`; returns once the
    /// script has touched `ready`.
    pub(crate) async fn holder_with_grace(&self, key: &str, script: &str) -> Child {
        let child = self.lock(key, &["--ttl", "2s", "--grace", "1s"], script);
        self.until_exists("ready").await;
        child
    }

    /// Runs `turnstile lock KEY ARGS… --wait 1s` and checks it was refused: exit 75, its
    /// command (which would touch `marker`) never ran.
    pub(crate) async fn assert_refused(&self, key: &str, args: &[&str], marker: &str) {
        let args = [args, &["--wait", "1s"]].concat();
        let output = self.run(key, &args, &format!("touch {marker}")).await;
        assert_eq!(code(&output), NOT_ACQUIRED, "{}", stderr(&output));
        assert!(!self.path(marker).exists(), "{marker}: granted");
    }

    /// Lets every holder started with [`Fixture::holder`] finish.
    pub(crate) fn go(&self) {
        std::fs::write(self.path("go"), "").unwrap();
    }

    /// The command was stopped for a lost lock (`reason`, as [`assert_lost`]) before it could
    /// `touch survived`.
    pub(crate) fn assert_stopped_as_lost(&self, output: &Output, reason: &str) {
        assert_lost(output, reason);
        assert!(!self.path("survived").exists());
    }

    pub(crate) async fn until_exists(&self, name: &str) {
        let path = self.path(name);
        eventually(&format!("{name} exists"), || path.exists()).await;
    }

    /// Members of one of the engine's sorted sets for `key` (`holders` or `queue`).
    pub(crate) async fn zcard(&mut self, key: &str, set: &str) -> u64 {
        redis::cmd("ZCARD")
            .arg(format!("turnstile:{{{key}}}:{set}"))
            .query_async(&mut self.connection)
            .await
            .expect("ZCARD")
    }

    /// Waits until someone is queued for `key`.
    pub(crate) async fn until_queued(&mut self, key: &str) {
        self.until_waiting(key, 1).await;
    }

    /// Waits until at least `count` requests are queued for `key`.
    pub(crate) async fn until_waiting(&mut self, key: &str, count: u64) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while self.zcard(key, "queue").await < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "fewer than {count} queued for {key}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Deletes `key`'s holder lease(s) behind the holders' backs.
    pub(crate) async fn delete_holders(&mut self, key: &str) {
        let _: () = redis::cmd("DEL")
            .arg(format!("turnstile:{{{key}}}:holders"))
            .arg(format!("turnstile:{{{key}}}:tokens"))
            .query_async(&mut self.connection)
            .await
            .unwrap();
    }

    /// Stops the server (by PID).
    pub(crate) fn stop_server(&mut self) {
        self.server = None;
    }
}

/// `turnstile lock --backend URL KEY ARGS… -- sh -c SCRIPT`, run in `dir` with `stdin`.
pub(crate) fn spawn_lock(
    url: &str,
    key: &str,
    args: &[&str],
    script: &str,
    dir: &TempDir,
    stdin: Stdio,
) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_turnstile"));
    command
        .arg("lock")
        .args(["--backend", url, key])
        .args(args)
        .args(["--", "sh", "-c", script])
        .current_dir(dir.path())
        .env_remove("TURNSTILE_BACKEND_URL");
    spawn_captured(&mut command, stdin, "turnstile lock")
}

/// Waits (bounded) for the process to end.
pub(crate) async fn finish(child: Child) -> Output {
    finish_within(PATIENCE, child, "turnstile lock").await
}

/// Every run exited 0.
pub(crate) fn assert_succeeded(outputs: &[&Output]) {
    for output in outputs {
        assert_eq!(code(output), 0, "{}", stderr(output));
    }
}

/// Two runs one after the other that printed their fencing tokens: both exited 0, and the
/// second token is larger.
pub(crate) fn assert_tokens_increase(first: &Output, second: &Output) {
    assert_succeeded(&[first, second]);
    let tokens: Vec<u64> = [first, second]
        .iter()
        .map(|output| stdout(output).trim().parse().expect("a token"))
        .collect();
    assert!(tokens[1] > tokens[0], "{tokens:?}");
}

/// The command was stopped for a lost lock: exit code 76, and `reason` in the message.
pub(crate) fn assert_lost(output: &Output, reason: &str) {
    assert_eq!(code(output), LOCK_LOST, "{}", stderr(output));
    assert!(stderr(output).contains(reason), "{}", stderr(output));
}

pub(crate) fn code(output: &Output) -> i32 {
    output
        .status
        .code()
        .unwrap_or_else(|| panic!("turnstile itself was killed: {output:?}"))
}

/// Polls (bounded) until `condition` holds.
pub(crate) async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn read_token(path: PathBuf) -> u64 {
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .trim()
        .parse()
        .expect("a numeric token")
}

pub(crate) fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id().expect("running")).unwrap())
}

/// The fields of `/proc/PID/stat` after the parenthesised command name (field 3 on), or
/// `None` when there is no such process.
pub(crate) fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Whether `pid` is gone (or a zombie nobody reaped yet: it runs no code either).
pub(crate) fn process_gone(pid: i32) -> bool {
    // Field 3 is the state.
    stat_fields(pid).is_none_or(|fields| fields.first().is_some_and(|s| s.starts_with(['Z', 'X'])))
}

/// A shell loop that waits (at most 60 s) for file `go` to appear.
pub(crate) const AWAIT_GO: &str =
    "i=0; while [ ! -e go ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done";

/// The process group of `pid` (field 5 of `/proc/PID/stat`).
pub(crate) fn process_group(pid: i32) -> i32 {
    let fields = stat_fields(pid).expect("a running process");
    fields.get(2).expect("pgrp").parse().expect("a number")
}
