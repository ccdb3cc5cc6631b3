//! A real Redis Sentinel setup for tests: one master, one replica (`--replicaof`) and three
//! `redis-server --sentinel` processes with generated config files, all on free 127.0.0.1
//! ports, each in its own temporary directory, stopped by PID on drop. With TLS
//! ([`RedisSentinel::start_tls`]) every process also listens on a TLS port, and replication
//! and the sentinels' own connections use TLS with client certificates. With a password
//! ([`RedisSentinel::start_with_password`]) the data nodes require it (replication and the
//! sentinels authenticate with it) and the sentinels themselves do not.

use std::io;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{free_port, shared_instance, wait_until, ServerProcess};
use crate::redis::{
    add_ephemeral_args, add_settings, command_on, first_reply, redis_server_binary, retry_start,
    tls_peer_settings, wait_for_pong, wait_ready, TlsFiles,
};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "turnstile";
/// How many sentinels (the quorum is 2).
const SENTINELS: usize = 3;
/// How long the setup may take to replicate and for the sentinels to find each other.
const READY_TIMEOUT: Duration = Duration::from_secs(40);

/// A `redis-server` (data node) or `redis-server --sentinel` process of a [`RedisSentinel`].
#[derive(Debug)]
struct Node {
    // Field order matters: the process stops before its directory is removed.
    process: Mutex<ServerProcess>,
    /// Plain port (the tests' own commands).
    port: u16,
    /// The port clients and the sentinels use: the TLS port with TLS, else `port`.
    client_port: u16,
    /// What the node requires (`requirepass`), if anything.
    password: Option<String>,
    _dir: TempDir,
}

impl Node {
    fn command(&self, args: &[&str]) -> io::Result<String> {
        command_on(self.port, self.password.as_deref(), args)
    }
}

/// One master, one replica and three sentinels monitoring the master as [`MASTER_NAME`]
/// (quorum 2, `down-after-milliseconds` 1000, `failover-timeout` 10000). No persistence.
#[derive(Debug)]
pub struct RedisSentinel {
    data: Vec<Node>,
    sentinels: Vec<Node>,
    url: String,
    tls: Option<TlsFiles>,
    // Last: removed after every process stopped.
    _tls_dir: Option<TempDir>,
}

impl RedisSentinel {
    /// Starts the master, the replica (waits for its link to be up), the three sentinels, and
    /// waits until every sentinel knows the replica and the two other sentinels.
    pub fn start() -> io::Result<Self> {
        Self::start_with(None, None)
    }

    /// As [`Self::start`], the data nodes requiring `password` (`requirepass`, and
    /// `masterauth` for replication; the sentinels' `auth-pass`); the sentinels require
    /// nothing. [`Self::url`] carries no credentials: a client adds them.
    pub fn start_with_password(password: &str) -> io::Result<Self> {
        Self::start_with(None, Some(password))
    }

    /// As [`Self::start`], every process also on a TLS port (certificates generated for this
    /// setup, [`Self::tls_files`]; mutual TLS required): clients reach the sentinels and the
    /// data nodes over TLS (`rediss+sentinel://…`), replication and the sentinels' own
    /// connections use TLS too. The tests' own commands use the plain ports.
    pub fn start_tls() -> io::Result<Self> {
        let files = TlsFiles::generate_in_new_dir("turnstile-redis-sentinel-tls-")?;
        Self::start_with(Some(files), None)
    }

    fn start_with(tls: Option<(TempDir, TlsFiles)>, password: Option<&str>) -> io::Result<Self> {
        let binary = redis_server_binary();
        let files = tls.as_ref().map(|(_, files)| files);
        let master = retry_start(|| start_data_node(&binary, None, files, password))?;
        let replica =
            retry_start(|| start_data_node(&binary, Some(master.client_port), files, password))?;
        let linked = wait_until(READY_TIMEOUT, || {
            replica
                .command(&["INFO", "replication"])
                .is_ok_and(|info| info.contains("master_link_status:up"))
        });
        if !linked {
            return Err(io::Error::other("the replica did not sync with the master"));
        }
        let mut sentinels = Vec::with_capacity(SENTINELS);
        for _ in 0..SENTINELS {
            sentinels.push(retry_start(|| {
                start_sentinel(&binary, master.client_port, files, password)
            })?);
        }
        let ready = wait_until(READY_TIMEOUT, || {
            sentinels.iter().all(|sentinel| {
                sentinel
                    .command(&["SENTINEL", "MASTER", MASTER_NAME])
                    .is_ok_and(|reply| {
                        let fields = pairs(&reply);
                        field(&fields, "num-other-sentinels") == Some("2")
                            && field(&fields, "num-slaves") == Some("1")
                    })
            })
        });
        if !ready {
            return Err(io::Error::other(
                "the sentinels did not find each other and the replica",
            ));
        }
        let hosts: Vec<String> = sentinels
            .iter()
            .map(|sentinel| format!("127.0.0.1:{}", sentinel.client_port))
            .collect();
        let scheme = if tls.is_some() { "rediss" } else { "redis" };
        let url = format!("{scheme}+sentinel://{}/{MASTER_NAME}", hosts.join(","));
        let (tls_dir, tls) = match tls {
            Some((dir, files)) => (Some(dir), Some(files)),
            None => (None, None),
        };
        Ok(RedisSentinel {
            data: vec![master, replica],
            sentinels,
            url,
            tls,
            _tls_dir: tls_dir,
        })
    }

    /// A setup shared by the tests of this binary: started on first use, stopped when the
    /// last user drops it (give each test its own key prefix; don't fail it over).
    pub fn shared() -> io::Result<Arc<RedisSentinel>> {
        static SHARED: Mutex<Weak<RedisSentinel>> = Mutex::new(Weak::new());
        shared_instance(&SHARED, Self::start)
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/turnstile`
    /// (`rediss+sentinel://` and the TLS ports with TLS).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The certificates of a TLS setup.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// The sentinels' client ports (TLS ports with TLS).
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels
            .iter()
            .map(|sentinel| sentinel.client_port)
            .collect()
    }

    /// The two data nodes' client ports, as the sentinels name them (TLS ports with TLS; the
    /// first one started as the master).
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(|node| node.client_port).collect()
    }

    fn data_node(&self, port: u16) -> io::Result<&Node> {
        self.data
            .iter()
            .find(|node| node.client_port == port)
            .ok_or_else(|| io::Error::other(format!("no data node on port {port}")))
    }

    /// The port of the master as the first answering sentinel reports it.
    pub fn master_port(&self) -> io::Result<u16> {
        let reply = self.sentinel_command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])?;
        let fields = bulk_strings(&reply);
        fields
            .get(1)
            .and_then(|port| port.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no master address in {reply:?}")))
    }

    /// Runs one command on the data node whose client port is `port` (over its plain port;
    /// raw RESP reply).
    pub fn node_command(&self, port: u16, args: &[&str]) -> io::Result<String> {
        self.data_node(port)?.command(args)
    }

    /// Runs one command on the first sentinel that answers (raw RESP reply).
    pub fn sentinel_command(&self, args: &[&str]) -> io::Result<String> {
        first_reply(
            &self.sentinels,
            |sentinel| sentinel.command(args),
            "no sentinel",
        )
    }

    /// `SENTINEL FAILOVER`: a coordinated failover (the replica is promoted after it caught
    /// up, the old master becomes its replica).
    pub fn failover(&self) -> io::Result<()> {
        let reply = self.sentinel_command(&["SENTINEL", "FAILOVER", MASTER_NAME])?;
        if reply.starts_with('+') {
            Ok(())
        } else {
            Err(io::Error::other(format!("SENTINEL FAILOVER: {reply:?}")))
        }
    }

    /// Waits until every sentinel names a master other than `old_port` and that node says
    /// `role:master`. Returns the new master's port.
    pub fn wait_for_new_master(&self, old_port: u16, timeout: Duration) -> io::Result<u16> {
        let mut found = None;
        let switched = wait_until(timeout, || {
            let ports: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|sentinel| {
                    sentinel
                        .command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
                        .ok()
                        .and_then(|reply| bulk_strings(&reply).get(1).and_then(|p| p.parse().ok()))
                })
                .collect();
            let Some(Some(port)) = ports.first().copied() else {
                return false;
            };
            if port == old_port || ports.iter().any(|other| *other != Some(port)) {
                return false;
            }
            let promoted = self
                .node_command(port, &["INFO", "replication"])
                .is_ok_and(|info| info.contains("role:master"));
            if promoted {
                found = Some(port);
            }
            promoted
        });
        match (switched, found) {
            (true, Some(port)) => Ok(port),
            _ => Err(io::Error::other(format!(
                "no new master (other than {old_port}) within {timeout:?}"
            ))),
        }
    }

    /// Cuts the replica of the master on `master` off and keeps it off: its link is killed
    /// and its reconnects fail (a wrong `masterauth`: the master refuses the AUTH). Returns
    /// the replica's port. (On a setup with a password the master refuses the wrong one too.)
    pub fn cut_off_replica(&self, master: u16) -> io::Result<u16> {
        let replica = self
            .data_ports()
            .into_iter()
            .find(|&port| port != master)
            .ok_or_else(|| io::Error::other("no replica"))?;
        let set = self.node_command(replica, &["CONFIG", "SET", "masterauth", "cut-off"])?;
        if set != "+OK\r\n" {
            return Err(io::Error::other(format!("CONFIG SET masterauth: {set}")));
        }
        self.node_command(master, &["CLIENT", "KILL", "TYPE", "replica"])?;
        Ok(replica)
    }

    /// Kills the data node on `port` with SIGKILL (by its PID) and reaps it.
    pub fn kill(&self, port: u16) -> io::Result<()> {
        self.data_node(port)?
            .process
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .stop();
        Ok(())
    }

    /// The PID of the data node on `port`.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.data_node(port).ok().map(|node| {
            node.process
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .pid()
        })
    }
}

/// A new node's own directory (named `prefix…`), its port and the port clients use: a
/// second free port when it serves TLS (`tls`), else the same one.
fn node_dir_and_ports(prefix: &str, tls: Option<&TlsFiles>) -> io::Result<(TempDir, u16, u16)> {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
    let port = free_port()?;
    let client_port = match tls {
        Some(_) => free_port()?,
        None => port,
    };
    Ok((dir, port, client_port))
}

/// A data node; a replica of `master` if given; requiring `password` if given.
fn start_data_node(
    binary: &Path,
    master: Option<u16>,
    tls: Option<&TlsFiles>,
    password: Option<&str>,
) -> io::Result<Node> {
    let (dir, port, client_port) = node_dir_and_ports("turnstile-redis-sentinel-data-", tls)?;
    let mut command = Command::new(binary);
    if let Some(files) = tls {
        add_settings(&mut command, tls_peer_settings(files, client_port));
    }
    command.arg("--port").arg(port.to_string());
    add_ephemeral_args(&mut command, dir.path());
    command
        // Either node may become the master: no 5 s wait before a full sync.
        .args(["--repl-diskless-sync", "yes"])
        .args(["--repl-diskless-sync-delay", "0"]);
    if let Some(master) = master {
        command
            .arg("--replicaof")
            .arg("127.0.0.1")
            .arg(master.to_string());
    }
    if let Some(password) = password {
        // Either node may be the master, so each authenticates to the other with it too.
        command
            .arg("--requirepass")
            .arg(password)
            .arg("--masterauth")
            .arg(password);
    }
    let mut process = ServerProcess::spawn(command)?;
    wait_ready(&mut process, port, "redis-server", || {
        command_on(port, password, &["PING"]).is_ok_and(|reply| reply == "+PONG\r\n")
    })?;
    Ok(Node {
        process: Mutex::new(process),
        port,
        client_port,
        password: password.map(str::to_owned),
        _dir: dir,
    })
}

/// A sentinel monitoring the master on `master` (which requires `password`, if given), its
/// config file in its own directory (the sentinel rewrites it).
fn start_sentinel(
    binary: &Path,
    master: u16,
    tls: Option<&TlsFiles>,
    password: Option<&str>,
) -> io::Result<Node> {
    let (dir, port, client_port) = node_dir_and_ports("turnstile-redis-sentinel-", tls)?;
    let tls_lines: String = match tls {
        Some(files) => tls_peer_settings(files, client_port)
            .into_iter()
            .map(|(name, value)| format!("{name} {value}\n"))
            .collect(),
        None => String::new(),
    };
    let auth_line = match password {
        Some(password) => format!("sentinel auth-pass {MASTER_NAME} {password}\n"),
        None => String::new(),
    };
    let config = dir.path().join("sentinel.conf");
    std::fs::write(
        &config,
        format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             daemonize no\n\
             loglevel warning\n\
             dir {dir}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 10000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n\
             {auth_line}\
             {tls_lines}",
            dir = dir.path().display(),
        ),
    )?;
    let mut command = Command::new(binary);
    command.arg(&config).arg("--sentinel");
    let mut process = ServerProcess::spawn(command)?;
    wait_for_pong(&mut process, port, "redis sentinel")?;
    Ok(Node {
        process: Mutex::new(process),
        port,
        client_port,
        password: None,
        _dir: dir,
    })
}

/// The bulk strings of a flat RESP array reply.
fn bulk_strings(reply: &str) -> Vec<String> {
    let mut lines = reply.split("\r\n");
    let Some(count) = lines
        .next()
        .and_then(|header| header.strip_prefix('*'))
        .and_then(|count| count.parse::<usize>().ok())
    else {
        return Vec::new();
    };
    let mut items = Vec::with_capacity(count);
    while items.len() < count {
        match (lines.next(), lines.next()) {
            (Some(_length), Some(body)) => items.push(body.to_owned()),
            _ => break,
        }
    }
    items
}

/// A flat RESP array of alternating names and values, as pairs.
fn pairs(reply: &str) -> Vec<(String, String)> {
    let items = bulk_strings(reply);
    items
        .chunks(2)
        .filter_map(|pair| match pair {
            [name, value] => Some((name.clone(), value.clone())),
            _ => None,
        })
        .collect()
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks that `setup` serves a `scheme` URL with the first data node as master, and
    /// that a `SENTINEL FAILOVER` promotes the second.
    fn assert_fails_over_to_the_replica(setup: RedisSentinel, scheme: &str) {
        let url = setup.url();
        assert!(url.starts_with(&format!("{scheme}://127.0.0.1:")), "{url}");
        let master = setup.master_port().expect("master port");
        assert_eq!(
            master,
            setup.data_ports()[0],
            "the sentinels name the first data node's client port (its TLS port under TLS)"
        );
        setup.failover().expect("SENTINEL FAILOVER");
        let promoted = setup
            .wait_for_new_master(master, Duration::from_secs(30))
            .expect("a new master");
        assert_eq!(promoted, setup.data_ports()[1]);
    }

    #[test]
    fn a_master_a_replica_and_three_sentinels_fail_over() {
        let setup = RedisSentinel::start().expect("sentinel setup starts");
        assert_fails_over_to_the_replica(setup, "redis+sentinel");
    }

    #[test]
    fn a_tls_setup_replicates_and_fails_over_over_tls() {
        let setup = RedisSentinel::start_tls().expect("TLS sentinel setup starts");
        assert_fails_over_to_the_replica(setup, "rediss+sentinel");
    }
}
