//! A MongoDB-wire-compatible server for tests.
//!
//! No real `mongod` can be installed on the project's machines; tests run against SecantusDB
//! (`secantusd-rs`, or its Python fallback `secantusd-py`), always as a separate process and
//! never linked. Both present a one-node replica set, so change streams work; started with
//! [`MongoFlavor::Standalone`] `secantusd-rs` presents a standalone server instead (no change
//! streams), for testing the polling fallback.
//!
//! [`MongoServer::for_tests`] decides what a test talks to: the server `MONGODB_URI` names,
//! else one it starts. With neither a URI nor a server binary the test is skipped with one
//! printed line, except under `CI=true`, where that is an error.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{free_port, wait_until, ServerProcess};
use crate::tools::under_ci;

/// How many fresh ports to try before giving up on a start.
const START_ATTEMPTS: usize = 5;
/// How long a started server may take to answer `ping`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The server binaries tried in order when `TURNSTILE_MONGO_SERVER` is not set.
const CANDIDATES: [&str; 2] = ["secantusd-rs", "secantusd-py"];

/// What the server presents to drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MongoFlavor {
    /// A one-node replica set: change streams work.
    ReplicaSet,
    /// A standalone server: no change streams (`secantusd-rs --standalone`).
    Standalone,
}

/// A MongoDB-compatible server: spawned on a free 127.0.0.1 port and stopped by PID on drop,
/// or an external one named by `MONGODB_URI` (left alone).
#[derive(Debug)]
pub struct MongoServer {
    // Field order matters: the process stops before its directory is removed.
    process: Option<ServerProcess>,
    uri: String,
    launch: Option<Launch>,
}

/// How a spawned server was started, to start it again the same way.
#[derive(Debug)]
struct Launch {
    binary: PathBuf,
    python: bool,
    flavor: MongoFlavor,
    port: u16,
    dir: TempDir,
}

impl Launch {
    fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .args(["--host", "127.0.0.1"])
            .arg("--port")
            .arg(self.port.to_string());
        if self.python {
            command.args(["--storage-path", ":memory:"]);
        } else {
            command
                .arg("--storage-path")
                .arg(self.dir.path().join("data"))
                .args(["--cache-size", "256M", "--log-file-max", "16MB"])
                .args(["--log-level", "WARNING"]);
            if self.flavor == MongoFlavor::Standalone {
                command.arg("--standalone");
            }
        }
        // Its own working directory: no stray config file is picked up, nothing left behind.
        command.current_dir(self.dir.path());
        command
    }

    /// Spawns the server and waits until it answers `ping`.
    fn spawn(&self) -> io::Result<ServerProcess> {
        let mut process = ServerProcess::spawn(self.command())?;
        let port = self.port;
        let ready = wait_until(READY_TIMEOUT, || {
            // A server that lost the port race exits: stop waiting.
            process.has_exited() || ping(port).is_ok()
        });
        if !ready || process.has_exited() {
            return Err(io::Error::other(format!(
                "{} on port {port} did not become ready",
                self.binary.display()
            )));
        }
        Ok(process)
    }
}

/// What a failed start means for a test: no server binary installed, or one that cannot run
/// the flavor asked for, skips it, except under `CI=true` (where `.ci/install` put the right
/// one there); any other failure fails it.
fn unavailable(error: io::Error, ci: bool) -> Unavailable {
    match error.kind() {
        io::ErrorKind::NotFound if !ci => Unavailable::Skip(format!(
            "no MongoDB test server: set MONGODB_URI or install secantusd-rs (.ci/install): {error}"
        )),
        io::ErrorKind::Unsupported if !ci => Unavailable::Skip(error.to_string()),
        _ => Unavailable::Fail(error),
    }
}

/// The value, or `None` after one `skipped:` line.
///
/// # Panics
/// On [`Unavailable::Fail`]: the test must fail, not pass by skipping.
fn or_skip<T>(result: Result<T, Unavailable>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(Unavailable::Skip(reason)) => {
            crate::record_skip("(a MongoDB test)", &reason);
            None
        }
        Err(Unavailable::Fail(error)) => panic!("MongoDB test server unavailable: {error}"),
    }
}

/// Why no server is available for a test.
#[derive(Debug)]
pub enum Unavailable {
    /// Not under CI and no server binary installed: skip the test.
    Skip(String),
    /// Under `CI=true`, or a server that exists failed to start: fail the test.
    Fail(io::Error),
}

impl MongoServer {
    /// The server tests should use: the one `MONGODB_URI` names, else a process shared by
    /// the tests of this binary (started on first use, stopped when the last user drops it;
    /// give each test its own database). Returns [`Unavailable::Skip`] when no server binary
    /// is installed, unless `CI=true`.
    pub fn for_tests() -> Result<Arc<MongoServer>, Unavailable> {
        if let Some(external) = Self::external(std::env::var("MONGODB_URI").ok()) {
            return Ok(Arc::new(external));
        }
        static SHARED: Mutex<Weak<MongoServer>> = Mutex::new(Weak::new());
        let mut shared = SHARED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(server) = shared.upgrade() {
            return Ok(server);
        }
        let server = Arc::new(
            Self::start(MongoFlavor::ReplicaSet).map_err(|error| unavailable(error, under_ci()))?,
        );
        *shared = Arc::downgrade(&server);
        Ok(server)
    }

    /// The server a non-empty `MONGODB_URI` names (never started nor stopped here).
    fn external(uri: Option<String>) -> Option<MongoServer> {
        uri.filter(|uri| !uri.is_empty()).map(|uri| MongoServer {
            process: None,
            uri,
            launch: None,
        })
    }

    /// [`Self::for_tests`] for a test body: the server, or `None` after one `skipped:` line
    /// when there is none here.
    ///
    /// # Panics
    /// When a server should be there and is not ([`Unavailable::Fail`]: under `CI=true`, or a
    /// server that failed to start): the test must fail, not pass by skipping.
    pub fn shared_or_skip() -> Option<Arc<MongoServer>> {
        or_skip(Self::for_tests())
    }

    /// [`Self::start`] for a test that needs a server of its own (to crash or restart it):
    /// the server, or `None` after one `skipped:` line when none can be started here.
    ///
    /// # Panics
    /// Under `CI=true`, or when an installed server fails to start.
    pub fn start_or_skip(flavor: MongoFlavor) -> Option<MongoServer> {
        or_skip(Self::start(flavor).map_err(|error| unavailable(error, under_ci())))
    }

    /// Starts a server of `flavor` and waits until it answers `ping`. The binary is
    /// `$TURNSTILE_MONGO_SERVER` if set, else `secantusd-rs` or `secantusd-py` from `PATH`;
    /// an error of kind `NotFound` means none is installed.
    pub fn start(flavor: MongoFlavor) -> io::Result<Self> {
        let binary = find_binary()?;
        let python = binary
            .file_name()
            .is_some_and(|name| name.to_string_lossy().ends_with("-py"));
        if python && flavor == MongoFlavor::Standalone {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "secantusd-py has no standalone mode",
            ));
        }
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&binary, python, flavor) {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("MongoDB test server did not start")))
    }

    fn try_start(binary: &Path, python: bool, flavor: MongoFlavor) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("turnstile-mongo-")
            .tempdir()?;
        let launch = Launch {
            binary: binary.to_path_buf(),
            python,
            flavor,
            port: free_port()?,
            dir,
        };
        let process = launch.spawn()?;
        Ok(MongoServer {
            process: Some(process),
            uri: format!("mongodb://127.0.0.1:{}/", launch.port),
            launch: Some(launch),
        })
    }

    /// Stops a spawned server cleanly (SIGTERM to its PID, SIGKILL after 10 s) and starts it
    /// again on the same port with the same storage: a maintenance restart as clients see it.
    /// Not possible for an external server or the in-memory Python server.
    pub fn restart(&mut self) -> io::Result<()> {
        self.relaunch(true, false)
    }

    /// Kills a spawned server (SIGKILL) and starts it again on the same port and storage: a
    /// crash. SecantusDB may lose its most recent acknowledged writes this way (it does not
    /// sync every commit), which is how tests provoke backend data loss.
    pub fn crash_and_restart(&mut self) -> io::Result<()> {
        self.relaunch(false, false)
    }

    /// Kills a spawned server (SIGKILL), empties its storage and starts it again on the same
    /// port: a crash that loses every write, for tests that must see the loss happen (a plain
    /// [`Self::crash_and_restart`] may lose nothing).
    pub fn crash_losing_everything(&mut self) -> io::Result<()> {
        self.relaunch(false, true)
    }

    /// Kills a spawned server (SIGKILL) and leaves it down, its storage kept, until
    /// [`Self::start_again`]: an outage as clients see it.
    pub fn kill(&mut self) -> io::Result<()> {
        self.take_down(false, false)
    }

    /// Starts a server stopped by [`Self::kill`] again on the same port and storage.
    pub fn start_again(&mut self) -> io::Result<()> {
        let launch = self.restartable()?;
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            match launch.spawn() {
                Ok(process) => {
                    self.process = Some(process);
                    return Ok(());
                }
                // The old socket may linger a moment.
                Err(error) => last_error = Some(error),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("restart failed")))
    }

    fn relaunch(&mut self, graceful: bool, lose_data: bool) -> io::Result<()> {
        self.take_down(graceful, lose_data)?;
        self.start_again()
    }

    fn restartable(&self) -> io::Result<&Launch> {
        self.launch
            .as_ref()
            .filter(|launch| !launch.python)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "only a spawned secantusd-rs can be restarted with its data",
                )
            })
    }

    fn take_down(&mut self, graceful: bool, lose_data: bool) -> io::Result<()> {
        let dir = self.restartable()?.dir.path().to_path_buf();
        if let Some(mut process) = self.process.take() {
            if graceful {
                let _ = Command::new("kill")
                    .args(["-TERM", &process.pid().to_string()])
                    .status();
                wait_until(Duration::from_secs(10), || process.has_exited());
            }
            process.stop();
        }
        if lose_data {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        Ok(())
    }

    /// The connection string, e.g. `mongodb://127.0.0.1:PORT/`.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The spawned server's process id (`None` for an external server).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ServerProcess::pid)
    }

    /// Stops a spawned server now (dropping does the same; an external one is left alone).
    pub fn stop(mut self) {
        if let Some(process) = self.process.as_mut() {
            process.stop();
        }
    }
}

fn find_binary() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("TURNSTILE_MONGO_SERVER").filter(|path| !path.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in CANDIDATES {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("none of {CANDIDATES:?} is on PATH"),
    ))
}

/// Sends `{ping: 1}` as an OP_MSG and checks the reply says `ok: 1`.
fn ping(port: u16) -> io::Result<()> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(&ping_message())?;
    let mut header = [0u8; 16];
    stream.read_exact(&mut header)?;
    let length = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let body_length = usize::try_from(length)
        .ok()
        .and_then(|length| length.checked_sub(16))
        .filter(|length| *length < 1 << 24)
        .ok_or_else(|| io::Error::other("bad reply length"))?;
    let mut body = vec![0u8; body_length];
    stream.read_exact(&mut body)?;
    if reply_is_ok(&body) {
        Ok(())
    } else {
        Err(io::Error::other("ping did not answer ok: 1"))
    }
}

/// An OP_MSG (opcode 2013) with one body section: `{ping: 1, $db: "admin"}`.
fn ping_message() -> Vec<u8> {
    let mut document = Vec::new();
    document.push(0x10); // int32
    document.extend_from_slice(b"ping\0");
    document.extend_from_slice(&1i32.to_le_bytes());
    document.push(0x02); // string
    document.extend_from_slice(b"$db\0");
    document.extend_from_slice(&6i32.to_le_bytes());
    document.extend_from_slice(b"admin\0");
    document.push(0x00);
    let document_length = (document.len() + 4) as i32;
    let mut body = Vec::new();
    body.extend_from_slice(&0u32.to_le_bytes()); // flag bits
    body.push(0); // section kind 0: body
    body.extend_from_slice(&document_length.to_le_bytes());
    body.extend_from_slice(&document);
    let mut message = Vec::new();
    message.extend_from_slice(&((16 + body.len()) as i32).to_le_bytes());
    message.extend_from_slice(&1i32.to_le_bytes()); // request id
    message.extend_from_slice(&0i32.to_le_bytes()); // response to
    message.extend_from_slice(&2013i32.to_le_bytes());
    message.extend_from_slice(&body);
    message
}

/// Does an OP_MSG reply body hold `ok: 1` (as a double or int32)?
fn reply_is_ok(body: &[u8]) -> bool {
    let double_one = [&[0x01u8][..], b"ok\0", &1.0f64.to_le_bytes()].concat();
    let int_one = [&[0x10u8][..], b"ok\0", &1i32.to_le_bytes()].concat();
    [double_one, int_one].iter().any(|needle| {
        body.windows(needle.len())
            .any(|window| window == needle.as_slice())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mongodb_uri_else_the_test_server_else_a_skip_that_fails_under_ci() {
        let external = MongoServer::external(Some("mongodb://db.example:27017/".into()))
            .expect("a URI names the server");
        assert_eq!(external.uri(), "mongodb://db.example:27017/");
        assert!(
            external.process.is_none(),
            "an external server is never stopped"
        );
        assert!(
            MongoServer::external(Some(String::new())).is_none(),
            "empty: start ours"
        );
        assert!(MongoServer::external(None).is_none());
        let missing = || io::Error::new(io::ErrorKind::NotFound, "secantusd-rs");
        assert!(
            matches!(unavailable(missing(), false), Unavailable::Skip(why) if why.contains("MONGODB_URI"))
        );
        assert!(
            matches!(unavailable(missing(), true), Unavailable::Fail(_)),
            "under CI"
        );
        let flavor = || io::Error::new(io::ErrorKind::Unsupported, "no standalone here");
        assert!(matches!(unavailable(flavor(), false), Unavailable::Skip(_)));
        assert!(
            matches!(unavailable(flavor(), true), Unavailable::Fail(_)),
            "under CI"
        );
        let broken = io::Error::other("exited at once");
        assert!(
            matches!(unavailable(broken, false), Unavailable::Fail(_)),
            "a server that fails"
        );
    }

    fn port_of(server: &MongoServer) -> u16 {
        server
            .uri()
            .trim_start_matches("mongodb://127.0.0.1:")
            .trim_end_matches('/')
            .parse()
            .expect("port in uri")
    }

    #[test]
    fn starts_answers_ping_and_stops_by_pid() {
        let Some(server) = MongoServer::start_or_skip(MongoFlavor::ReplicaSet) else {
            return;
        };
        assert!(server.uri().starts_with("mongodb://127.0.0.1:"));
        assert!(server.pid().is_some());
        let port = port_of(&server);
        ping(port).expect("ping");
        server.stop();
        assert!(ping(port).is_err(), "server still answers after stop");
    }

    #[test]
    fn restart_serves_the_same_port_again() {
        let Some(mut server) = MongoServer::start_or_skip(MongoFlavor::Standalone) else {
            return;
        };
        let (port, pid) = (port_of(&server), server.pid());
        server.restart().expect("restart");
        ping(port).expect("ping after restart");
        assert_ne!(server.pid(), pid, "a new process serves the port");
    }

    #[test]
    fn ping_replies_are_checked() {
        let ok = [&[0x01u8][..], b"ok\0", &1.0f64.to_le_bytes()].concat();
        let not_ok = [&[0x01u8][..], b"ok\0", &0.0f64.to_le_bytes()].concat();
        assert!(reply_is_ok(&ok));
        assert!(!reply_is_ok(&not_ok));
        let message = ping_message();
        assert_eq!(
            i32::from_le_bytes([message[0], message[1], message[2], message[3]]) as usize,
            message.len()
        );
    }
}
