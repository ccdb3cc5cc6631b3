//! A real `redis-server` for tests.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{free_port, wait_until, ServerProcess};

/// How many fresh ports to try before giving up on a start.
const START_ATTEMPTS: usize = 8;
/// How long a started server may take to answer PING.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

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
    _dir: TempDir,
}

impl RedisServer {
    /// Starts a server and waits until it answers PING.
    pub fn start() -> io::Result<Self> {
        let binary = std::env::var_os("TURNSTILE_REDIS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-server"));
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&binary) {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    fn try_start(binary: &PathBuf) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("turnstile-redis-")
            .tempdir()?;
        let port = free_port()?;
        let mut command = Command::new(binary);
        command
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--loglevel", "warning"])
            .arg("--dir")
            .arg(dir.path());
        let mut process = ServerProcess::spawn(command)?;
        let ready = wait_until(READY_TIMEOUT, || {
            // A server that lost the port race exits at once: stop waiting, try another port.
            process.has_exited() || ping(port).is_ok()
        });
        if !ready || process.has_exited() {
            return Err(io::Error::other(format!(
                "redis-server on port {port} did not become ready"
            )));
        }
        Ok(RedisServer {
            process,
            port,
            url: format!("redis://127.0.0.1:{port}/"),
            _dir: dir,
        })
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Runs one command over a fresh connection and returns the raw RESP reply (for
    /// assertions on `INFO commandstats`, `DBSIZE`, ...; errors come back as `-ERR ...`).
    pub fn command(&self, args: &[&str]) -> io::Result<String> {
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream.write_all(request.as_bytes())?;
        read_reply(&mut stream)
    }

    /// Stops the server now (dropping does the same).
    pub fn stop(mut self) {
        self.process.stop();
    }
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
    fn parses_nested_and_partial_replies() {
        assert_eq!(complete_reply_len(b"$3\r\nab"), None);
        assert_eq!(complete_reply_len(b"$3\r\nabc\r\n"), Some(9));
        assert_eq!(complete_reply_len(b"*2\r\n:1\r\n$-1\r\n"), Some(13));
        assert_eq!(complete_reply_len(b"*2\r\n:1\r\n"), None);
    }
}
