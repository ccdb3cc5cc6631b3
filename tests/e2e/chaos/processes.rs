//! The processes a chaos run starts, each stopped by its PID: the controller replicas (the
//! real `turnstile run --leader-elect` binary) and a `redis-server` that can be restarted on
//! the same port, stopped and continued.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use test_servers::{free_port, wait_until, ServerProcess};

use super::history::Millis;

/// The Lease the replicas elect a leader on.
const LEADER_LEASE: &str = "turnstile-controller";

/// The replicas' log filter: `warn`, or `TURNSTILE_CHAOS_RUST_LOG` (e.g.
/// `info,turnstile_controller=debug` to see every pass of a long run).
fn replica_log_filter() -> String {
    std::env::var("TURNSTILE_CHAOS_RUST_LOG")
        .ok()
        .filter(|filter| !filter.is_empty())
        .unwrap_or_else(|| "warn".to_owned())
}

/// One `turnstile run` replica; its log goes to `<dir>/<identity>.log` (appended across
/// restarts).
pub struct Replica {
    pub identity: String,
    args: Vec<String>,
    kubeconfig: PathBuf,
    namespace: String,
    log: PathBuf,
    child: Option<Child>,
}

impl Replica {
    pub fn new(
        identity: &str,
        args: Vec<String>,
        kubeconfig: &Path,
        namespace: &str,
        dir: &Path,
    ) -> Self {
        Self {
            identity: identity.to_owned(),
            args,
            kubeconfig: kubeconfig.to_owned(),
            namespace: namespace.to_owned(),
            log: dir.join(format!("{identity}.log")),
            child: None,
        }
    }

    /// Starts the process (if it is not running).
    pub fn start(&mut self) {
        if self.child.is_some() {
            return;
        }
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("replica log");
        let child = Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args(["run", "--leader-elect", "--namespace", &self.namespace])
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("POD_NAME", &self.identity)
            .env("POD_NAMESPACE", &self.namespace)
            .env("RUST_LOG", replica_log_filter())
            .stdin(Stdio::null())
            // The binary's log lines go to stdout; errors before logging starts to stderr.
            .stdout(log.try_clone().expect("replica log"))
            .stderr(log)
            .spawn()
            .expect("start turnstile run");
        self.child = Some(child);
    }

    /// Sends `signal` and waits until the process is gone (SIGKILL after 20 s).
    pub fn stop(&mut self, signal: Signal) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), signal);
        let exited = wait_until(Duration::from_secs(20), || {
            matches!(child.try_wait(), Ok(Some(_)))
        });
        if !exited {
            let _ = child.kill();
        }
        let _ = child.wait();
    }

    pub fn log(&self) -> &Path {
        &self.log
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The identity the leader Lease names and when it was last renewed, if it names one.
pub async fn leader_lease(client: &Client, namespace: &str) -> Option<(String, Millis)> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let spec = leases.get_opt(LEADER_LEASE).await.ok()??.spec?;
    let holder = spec.holder_identity.filter(|holder| !holder.is_empty())?;
    Some((holder, spec.renew_time?.0.as_millisecond()))
}

/// A `redis-server` on a fixed 127.0.0.1 port (kept across restarts), no persistence.
pub struct Redis {
    pub port: u16,
    dir: tempfile::TempDir,
    process: Option<ServerProcess>,
}

impl Redis {
    pub fn start() -> Self {
        let mut redis = Self {
            port: free_port().expect("free port"),
            dir: tempfile::tempdir().expect("redis dir"),
            process: None,
        };
        redis.up();
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts the server (if down) and waits until it answers.
    pub fn up(&mut self) {
        if self.process.is_some() {
            return;
        }
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(self.dir.path());
        self.process = Some(ServerProcess::spawn(command).expect("spawn redis-server"));
        let port = self.port;
        assert!(
            wait_until(Duration::from_secs(10), || self
                .cli(&["PING"])
                .contains("PONG")),
            "redis-server on {port} did not come back"
        );
    }

    /// Kills the server (its data is gone: no persistence).
    pub fn down(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop();
        }
    }

    /// Sends SIGSTOP or SIGCONT to the running server.
    pub fn signal(&self, signal: Signal) -> Result<(), String> {
        let process = self.process.as_ref().ok_or("redis-server is not running")?;
        kill(Pid::from_raw(process.pid() as i32), signal)
            .map_err(|error| format!("{signal} to redis-server: {error}"))
    }

    /// Runs `redis-cli -p PORT ARGS`; its output ("" when it could not run).
    pub fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default()
    }
}
