//! A real Redis Cluster for tests: 3 primaries and 3 replicas on free 127.0.0.1 ports, created
//! with `redis-cli --cluster create … --cluster-replicas 1`. With TLS
//! ([`RedisCluster::start_tls`]) every node also listens on a TLS port, and the cluster bus
//! and replication use TLS with client certificates.

use std::io;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{free_port, shared_instance, wait_until, ServerProcess};
use crate::redis::{
    add_ephemeral_args, add_settings, command_on, first_reply, redis_server_binary, retry_start,
    tls_peer_settings, wait_for_pong, TlsFiles,
};

/// How many nodes: 3 primaries, each with one replica.
const NODES: usize = 6;
/// How long the cluster may take to agree on its slots after `--cluster create`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// One node of a [`RedisCluster`].
#[derive(Debug)]
pub struct ClusterNode {
    // Field order matters: the process stops before its directory is removed.
    process: ServerProcess,
    port: u16,
    tls_port: Option<u16>,
    _dir: TempDir,
}

impl ClusterNode {
    /// The node's plain client port (the tests' own commands).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node's TLS port, in a TLS cluster.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The node's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Runs one command on this node and returns the raw RESP reply.
    pub fn command(&self, args: &[&str]) -> io::Result<String> {
        command_on(self.port, None, args)
    }
}

/// A Redis Cluster of 3 primaries and 3 replicas (`--cluster-enabled yes`, no persistence,
/// node timeout 2 s), each node in its own temporary directory, stopped by PID on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    url: String,
    tls: Option<TlsFiles>,
    // Last: removed after every node stopped.
    _tls_dir: Option<TempDir>,
}

impl RedisCluster {
    /// Starts six nodes, creates the cluster and waits until every node reports
    /// `cluster_state:ok` and knows all six nodes, three of them as replicas.
    pub fn start() -> io::Result<Self> {
        Self::start_with_tls(None)
    }

    /// As [`Self::start`], every node also on a TLS port (certificates generated for this
    /// cluster, [`Self::tls_files`]; mutual TLS required; `tls-cluster yes`, so the cluster
    /// names TLS ports to TLS clients). [`Self::url`] is `rediss+cluster://` with the TLS
    /// ports; [`ClusterNode::command`] still uses the plain ports.
    pub fn start_tls() -> io::Result<Self> {
        Self::start_with_tls(Some(TlsFiles::generate_in_new_dir(
            "turnstile-redis-cluster-tls-",
        )?))
    }

    fn start_with_tls(tls: Option<(TempDir, TlsFiles)>) -> io::Result<Self> {
        let binary = redis_server_binary();
        let files = tls.as_ref().map(|(_, files)| files);
        let mut nodes = Vec::with_capacity(NODES);
        while nodes.len() < NODES {
            nodes.push(retry_start(|| start_node(&binary, files))?);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let ready = wait_until(READY_TIMEOUT, || {
            nodes.iter().all(|node| {
                node.command(&["CLUSTER", "INFO"]).is_ok_and(|info| {
                    info.contains("cluster_state:ok")
                        && info.contains(&format!("cluster_known_nodes:{NODES}"))
                }) && node
                    .command(&["CLUSTER", "NODES"])
                    .is_ok_and(|nodes| nodes.matches("slave").count() == NODES / 2)
            })
        });
        if !ready {
            return Err(io::Error::other("the Redis Cluster did not become ready"));
        }
        let url = match files {
            None => format!("redis+cluster://{}", addresses.join(",")),
            Some(_) => {
                let tls_addresses: Vec<String> = nodes
                    .iter()
                    .filter_map(|node| node.tls_port)
                    .map(|port| format!("127.0.0.1:{port}"))
                    .collect();
                format!("rediss+cluster://{}", tls_addresses.join(","))
            }
        };
        let (tls_dir, tls) = match tls {
            Some((dir, files)) => (Some(dir), Some(files)),
            None => (None, None),
        };
        Ok(RedisCluster {
            nodes,
            url,
            tls,
            _tls_dir: tls_dir,
        })
    }

    /// The certificates of a TLS cluster.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// A cluster shared by the tests of this binary: started on first use, stopped when the
    /// last user drops it (give each test its own key prefix).
    pub fn shared() -> io::Result<Arc<RedisCluster>> {
        static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
        shared_instance(&SHARED, Self::start)
    }

    /// As [`Self::shared`], a TLS cluster ([`Self::start_tls`]).
    pub fn shared_tls() -> io::Result<Arc<RedisCluster>> {
        static SHARED: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
        shared_instance(&SHARED, Self::start_tls)
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…` (every node; `rediss+cluster://` and the
    /// TLS ports in a TLS cluster).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// All six nodes.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> Option<&ClusterNode> {
        self.nodes.iter().find(|node| node.port == port)
    }

    /// Runs one command on any node that answers (for cluster-wide questions such as
    /// `CLUSTER KEYSLOT`).
    pub fn command(&self, args: &[&str]) -> io::Result<String> {
        first_reply(&self.nodes, |node| node.command(args), "no cluster node")
    }
}

fn start_node(binary: &Path, tls: Option<&TlsFiles>) -> io::Result<ClusterNode> {
    let dir = tempfile::Builder::new()
        .prefix("turnstile-redis-cluster-")
        .tempdir()?;
    let port = free_port()?;
    // The cluster bus needs a port of its own; the default (port + 10000) may not be free.
    let bus_port = free_port()?;
    let tls_port = match tls {
        Some(_) => Some(free_port()?),
        None => None,
    };
    let mut command = Command::new(binary);
    if let (Some(files), Some(tls_port)) = (tls, tls_port) {
        // The bus and replication connect out with the client certificate.
        add_settings(&mut command, tls_peer_settings(files, tls_port));
        command.args(["--tls-cluster", "yes"]);
    }
    command
        .arg("--port")
        .arg(port.to_string())
        .arg("--cluster-port")
        .arg(bus_port.to_string())
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", "nodes.conf"])
        .args(["--cluster-node-timeout", "2000"]);
    add_ephemeral_args(&mut command, dir.path());
    let mut process = ServerProcess::spawn(command)?;
    wait_for_pong(&mut process, port, "cluster node")?;
    Ok(ClusterNode {
        process,
        port,
        tls_port,
        _dir: dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts a cluster (over TLS when `tls`) and checks that it serves the matching URL and
    /// has 3 masters with a replica each.
    fn assert_three_masters_with_replicas(tls: bool) {
        let (cluster, scheme) = if tls {
            (RedisCluster::start_tls(), "rediss+cluster")
        } else {
            (RedisCluster::start(), "redis+cluster")
        };
        let cluster = cluster.expect("cluster starts");
        let url = cluster.url();
        assert!(url.starts_with(&format!("{scheme}://127.0.0.1:")), "{url}");
        let nodes = cluster
            .command(&["CLUSTER", "NODES"])
            .expect("CLUSTER NODES");
        assert_eq!(nodes.matches("master").count(), 3, "{nodes}");
        assert_eq!(nodes.matches("slave").count(), 3, "{nodes}");
    }

    #[test]
    fn six_nodes_form_a_cluster_with_replicas() {
        assert_three_masters_with_replicas(false);
    }

    #[test]
    fn a_tls_cluster_forms_over_tls() {
        assert_three_masters_with_replicas(true);
    }
}
