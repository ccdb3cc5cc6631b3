//! A real `redis-server` for tests: plain, with TLS (certificates generated per server with
//! `openssl`), and/or with a password.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{free_port, wait_until, ServerProcess};
use crate::tls::{self_signed_ca, signed_certificate};

/// How many fresh ports to try before giving up on a start.
const START_ATTEMPTS: usize = 8;
/// How long a started server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a TLS server asks clients for a certificate (`--tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsClientAuth {
    /// `--tls-auth-clients optional`: a client certificate is checked if one is sent.
    Optional,
    /// `--tls-auth-clients yes`: mutual TLS, clients without a certificate are refused.
    Required,
}

/// How to start a [`RedisServer`].
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    tls: Option<TlsClientAuth>,
    password: Option<String>,
    extra_args: Vec<String>,
}

impl RedisOptions {
    /// A plain server (what [`RedisServer::start`] starts).
    pub fn new() -> Self {
        Self::default()
    }

    /// Serve TLS only (`--port 0 --tls-port P`), with certificates generated for this server.
    pub fn tls(mut self, client_auth: TlsClientAuth) -> Self {
        self.tls = Some(client_auth);
        self
    }

    /// `--requirepass PASSWORD` (the `default` user's password).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// More `redis-server` arguments, appended as given.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }
}

/// Certificates generated with `openssl` for one test run (ECDSA P-256, valid 2 days): a CA,
/// a server certificate for `127.0.0.1`/`localhost` signed by it, a client certificate signed
/// by it, and an unrelated CA that signed nothing here (to test a rejected server certificate).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA that signed the server and client certificates.
    pub ca_cert: PathBuf,
    /// The server's certificate and key.
    pub server_cert: PathBuf,
    /// The server's private key.
    pub server_key: PathBuf,
    /// A client certificate signed by [`TlsFiles::ca_cert`] (for mutual TLS).
    pub client_cert: PathBuf,
    /// The client certificate's private key.
    pub client_key: PathBuf,
    /// A CA that did not sign the server's certificate.
    pub other_ca_cert: PathBuf,
}

impl TlsFiles {
    /// Generates the certificates into a new temporary directory named `prefix…`; the
    /// directory must outlive every process that reads the files.
    pub(crate) fn generate_in_new_dir(prefix: &str) -> io::Result<(TempDir, Self)> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let files = Self::generate(dir.path())?;
        Ok((dir, files))
    }

    /// Generates the certificates into `dir` (existing files are overwritten).
    pub fn generate(dir: &Path) -> io::Result<Self> {
        let files = TlsFiles {
            ca_cert: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            other_ca_cert: dir.join("other-ca.crt"),
        };
        let ca_key = dir.join("ca.key");
        let other_ca_key = dir.join("other-ca.key");
        self_signed_ca(&ca_key, &files.ca_cert, "turnstile test CA")?;
        self_signed_ca(&other_ca_key, &files.other_ca_cert, "unrelated test CA")?;
        // (name, key and certificate, subject, extensions) of each certificate the CA signs.
        let leaves = [
            (
                "server",
                (&files.server_key, &files.server_cert),
                "/CN=127.0.0.1",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            ),
            (
                "client",
                (&files.client_key, &files.client_cert),
                "/CN=turnstile test client",
                "extendedKeyUsage=clientAuth\n",
            ),
        ];
        for (name, (key, cert), subject, extensions) in leaves {
            let ext = dir.join(format!("{name}.ext"));
            std::fs::write(&ext, extensions)?;
            signed_certificate((&ca_key, &files.ca_cert), (key, cert), subject, &ext)?;
        }
        Ok(files)
    }
}

/// A `redis-server` on a free 127.0.0.1 port with no persistence (`--save "" --appendonly
/// no`) in its own temporary directory. Stopped by PID, and the directory removed, on drop.
///
/// The binary is `$TURNSTILE_REDIS_SERVER` if set, else `redis-server` from `PATH`.
#[derive(Debug)]
pub struct RedisServer {
    // Field order matters: the process stops before its directory is removed.
    process: ServerProcess,
    port: u16,
    url: String,
    tls: Option<TlsFiles>,
    password: Option<String>,
    _dir: TempDir,
}

impl RedisServer {
    /// Starts a plain server and waits until it answers PING.
    pub fn start() -> io::Result<Self> {
        Self::start_with(&RedisOptions::new())
    }

    /// Starts a server as `options` say and waits until it is ready.
    pub fn start_with(options: &RedisOptions) -> io::Result<Self> {
        let binary = redis_server_binary();
        retry_start(|| Self::try_start(&binary, options))
    }

    fn try_start(binary: &PathBuf, options: &RedisOptions) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("turnstile-redis-")
            .tempdir()?;
        let port = free_port()?;
        let mut command = Command::new(binary);
        let tls = match options.tls {
            None => {
                command.arg("--port").arg(port.to_string());
                None
            }
            Some(client_auth) => {
                let files = TlsFiles::generate(dir.path())?;
                let auth_clients = match client_auth {
                    TlsClientAuth::Optional => "optional",
                    TlsClientAuth::Required => "yes",
                };
                command.args(["--port", "0"]);
                add_settings(
                    &mut command,
                    tls_listen_settings(&files, port, auth_clients),
                );
                Some(files)
            }
        };
        if let Some(password) = &options.password {
            command.arg("--requirepass").arg(password);
        }
        add_ephemeral_args(&mut command, dir.path());
        command.args(&options.extra_args);
        let mut process = ServerProcess::spawn(command)?;
        wait_ready(&mut process, port, "redis-server", || {
            match (&tls, &options.password) {
                // No TLS client here: a listening TLS port is ready (nothing to load).
                (Some(_), _) => TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok(),
                (None, Some(_)) => command_on(port, options.password.as_deref(), &["PING"])
                    .is_ok_and(|reply| reply == "+PONG\r\n"),
                (None, None) => ping(port).is_ok(),
            }
        })?;
        let scheme = if tls.is_some() { "rediss" } else { "redis" };
        Ok(RedisServer {
            process,
            port,
            url: format!("{scheme}://127.0.0.1:{port}/"),
            tls,
            password: options.password.clone(),
            _dir: dir,
        })
    }

    /// `redis://127.0.0.1:PORT/` (`rediss://` with TLS), without credentials.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's port (the TLS port in TLS mode).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The certificates of a TLS server.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// Runs one command over a fresh plain connection (authenticating first if the server
    /// has a password) and returns the raw RESP reply (for assertions on `INFO
    /// commandstats`, `DBSIZE`, ...; errors come back as `-ERR ...`). Not available in TLS
    /// mode.
    pub fn command(&self, args: &[&str]) -> io::Result<String> {
        if self.tls.is_some() {
            return Err(io::Error::other(
                "command() speaks plain TCP; this server is TLS-only",
            ));
        }
        command_on(self.port, self.password.as_deref(), args)
    }

    /// Stops the server now (dropping does the same).
    pub fn stop(mut self) {
        self.process.stop();
    }
}

pub(crate) fn redis_server_binary() -> PathBuf {
    std::env::var_os("TURNSTILE_REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

// What every launcher here (single server, cluster node, sentinel setup) does the same way
// when it starts a `redis-server`.

/// Calls `start` up to [`START_ATTEMPTS`] times until it succeeds: a server that lost the
/// race for its free port exits at once, and the next attempt picks fresh ports. Returns the
/// last error if every attempt failed.
pub(crate) fn retry_start<T>(mut start: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut last_error = None;
    for _ in 0..START_ATTEMPTS {
        match start() {
            Ok(started) => return Ok(started),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| io::Error::other("redis-server did not start")))
}

/// Adds the arguments every test server gets: loopback only, no persistence, in the
/// foreground, quiet, working in `dir`.
pub(crate) fn add_ephemeral_args(command: &mut Command, dir: &Path) {
    command
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--daemonize", "no"])
        .args(["--loglevel", "warning"])
        .arg("--dir")
        .arg(dir);
}

/// The TLS settings (name, value) of a server listening for TLS on `tls_port` with the
/// generated server certificate; `auth_clients` is `tls-auth-clients` (`yes`, `optional`).
pub(crate) fn tls_listen_settings(
    files: &TlsFiles,
    tls_port: u16,
    auth_clients: &str,
) -> Vec<(&'static str, String)> {
    let path = |path: &Path| path.display().to_string();
    vec![
        ("tls-port", tls_port.to_string()),
        ("tls-cert-file", path(&files.server_cert)),
        ("tls-key-file", path(&files.server_key)),
        ("tls-ca-cert-file", path(&files.ca_cert)),
        ("tls-auth-clients", auth_clients.to_owned()),
    ]
}

/// As [`tls_listen_settings`] with mutual TLS, for a node that also connects out to its peers
/// (replication, the cluster bus, sentinel to node, sentinel to sentinel): those connections
/// use TLS too and present the client certificate.
pub(crate) fn tls_peer_settings(files: &TlsFiles, tls_port: u16) -> Vec<(&'static str, String)> {
    let mut settings = tls_listen_settings(files, tls_port, "yes");
    settings.extend([
        (
            "tls-client-cert-file",
            files.client_cert.display().to_string(),
        ),
        (
            "tls-client-key-file",
            files.client_key.display().to_string(),
        ),
        ("tls-replication", "yes".to_owned()),
    ]);
    settings
}

/// Adds `settings` as `--name value` arguments.
pub(crate) fn add_settings(command: &mut Command, settings: Vec<(&'static str, String)>) {
    for (name, value) in settings {
        command.arg(format!("--{name}")).arg(value);
    }
}

/// Waits up to [`READY_TIMEOUT`] until `ready` holds. Stops early if the process exits (a
/// server that lost the port race exits at once), so the caller can retry on another port.
/// `what` names the server in the error.
pub(crate) fn wait_ready(
    process: &mut ServerProcess,
    port: u16,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> io::Result<()> {
    let became_ready = wait_until(READY_TIMEOUT, || process.has_exited() || ready());
    if !became_ready || process.has_exited() {
        return Err(io::Error::other(format!(
            "{what} on port {port} did not become ready"
        )));
    }
    Ok(())
}

/// [`wait_ready`] for a plain port that must answer `PING` with `PONG`.
pub(crate) fn wait_for_pong(process: &mut ServerProcess, port: u16, what: &str) -> io::Result<()> {
    wait_ready(process, port, what, || {
        TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
            && command_on(port, None, &["PING"]).is_ok_and(|reply| reply == "+PONG\r\n")
    })
}

/// The reply of the first of `nodes` that answers `args`, else the last node's error (or
/// `none`, when there are no nodes).
pub(crate) fn first_reply<'a, N: 'a>(
    nodes: impl IntoIterator<Item = &'a N>,
    command: impl Fn(&N) -> io::Result<String>,
    none: &str,
) -> io::Result<String> {
    let mut last = None;
    for node in nodes {
        match command(node) {
            Ok(reply) => return Ok(reply),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other(none.to_owned())))
}

fn encode(args: &[&str]) -> String {
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    request
}

/// One command on 127.0.0.1:`port` over a fresh connection, after `AUTH password` if given.
pub(crate) fn command_on(port: u16, password: Option<&str>, args: &[&str]) -> io::Result<String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    if let Some(password) = password {
        stream.write_all(encode(&["AUTH", password]).as_bytes())?;
        let reply = read_reply(&mut stream)?;
        if reply != "+OK\r\n" {
            return Err(io::Error::other(format!("AUTH failed: {reply}")));
        }
    }
    stream.write_all(encode(args).as_bytes())?;
    read_reply(&mut stream)
}

fn ping(port: u16) -> io::Result<()> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.write_all(b"PING\r\n")?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply)?;
    if &reply == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(io::Error::other("unexpected PING reply"))
    }
}

/// Reads one complete RESP2 reply (simple, error, integer, bulk or a flat array of those).
fn read_reply(stream: &mut TcpStream) -> io::Result<String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed mid-reply",
            ));
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(end) = complete_reply_len(&buffer) {
            buffer.truncate(end);
            return String::from_utf8(buffer)
                .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error));
        }
    }
}

/// Length of the first complete reply in `buffer`, if it is complete.
fn complete_reply_len(buffer: &[u8]) -> Option<usize> {
    fn line_end(buffer: &[u8], from: usize) -> Option<usize> {
        buffer
            .get(from..)?
            .windows(2)
            .position(|pair| pair == b"\r\n")
            .map(|offset| from + offset)
    }
    fn element(buffer: &[u8], at: usize) -> Option<usize> {
        let end = line_end(buffer, at)?;
        let header = std::str::from_utf8(buffer.get(at + 1..end)?).ok()?;
        match buffer.get(at)? {
            b'+' | b'-' | b':' => Some(end + 2),
            b'$' => {
                let len: i64 = header.parse().ok()?;
                if len < 0 {
                    return Some(end + 2);
                }
                let total = end + 2 + usize::try_from(len).ok()? + 2;
                (buffer.len() >= total).then_some(total)
            }
            b'*' => {
                let count: i64 = header.parse().ok()?;
                let mut next = end + 2;
                for _ in 0..count.max(0) {
                    next = element(buffer, next)?;
                }
                Some(next)
            }
            _ => None,
        }
    }
    element(buffer, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_and_stops_by_pid() {
        let server = RedisServer::start().expect("redis-server starts");
        assert!(server.url().starts_with("redis://127.0.0.1:"));
        assert_eq!(server.command(&["PING"]).expect("ping"), "+PONG\r\n");
        assert_eq!(server.command(&["SET", "k", "v"]).expect("set"), "+OK\r\n");
        assert_eq!(server.command(&["GET", "k"]).expect("get"), "$1\r\nv\r\n");
        let port = server.port();
        server.stop();
        assert!(ping(port).is_err(), "server still answers after stop");
    }

    #[test]
    fn parallel_servers_get_distinct_ports() {
        let servers: Vec<RedisServer> = (0..4)
            .map(|_| RedisServer::start().expect("redis-server starts"))
            .collect();
        let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), servers.len());
        for server in &servers {
            assert_eq!(server.command(&["PING"]).expect("ping"), "+PONG\r\n");
        }
    }

    #[test]
    fn tls_server_listens_with_generated_certificates() {
        let server = RedisServer::start_with(&RedisOptions::new().tls(TlsClientAuth::Required))
            .expect("TLS redis-server starts");
        assert!(server.url().starts_with("rediss://127.0.0.1:"));
        let files = server.tls_files().expect("certificates");
        for path in [
            &files.ca_cert,
            &files.client_cert,
            &files.client_key,
            &files.other_ca_cert,
        ] {
            assert!(path.is_file(), "{path:?}");
        }
        assert!(
            server.command(&["PING"]).is_err(),
            "no plain TCP on a TLS server"
        );
    }

    #[test]
    fn password_server_authenticates_commands() {
        let server = RedisServer::start_with(&RedisOptions::new().password("s3cret"))
            .expect("redis-server starts");
        assert_eq!(server.command(&["PING"]).expect("ping"), "+PONG\r\n");
        assert!(
            ping(server.port()).is_err(),
            "unauthenticated PING must be refused"
        );
    }

    #[test]
    fn parses_nested_and_partial_replies() {
        assert_eq!(complete_reply_len(b"$3\r\nab"), None);
        assert_eq!(complete_reply_len(b"$3\r\nabc\r\n"), Some(9));
        assert_eq!(complete_reply_len(b"*2\r\n:1\r\n$-1\r\n"), Some(13));
        assert_eq!(complete_reply_len(b"*2\r\n:1\r\n"), None);
    }
}
