//! [`EtcdCluster`]: etcd members on loopback (one, or three forming a cluster), built from
//! etcd's Go module with the control plane's binaries (`scripts/control-plane.sh build`).
//! Optionally TLS for clients (certificates generated per run) and user/password auth.

use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tempfile::TempDir;

use crate::control_plane::binaries;
use crate::process::{free_port, shared_instance, wait_until, ServerProcess};
use crate::redis::{retry_start, TlsFiles};

/// How long a member may take to answer after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What an [`EtcdCluster`] is started with.
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    members: usize,
    tls: bool,
    user: Option<(String, String)>,
}

impl EtcdOptions {
    /// One member, plain HTTP, no auth.
    pub fn new() -> Self {
        EtcdOptions {
            members: 1,
            ..Self::default()
        }
    }

    /// `count` members in one cluster.
    pub fn members(mut self, count: usize) -> Self {
        self.members = count.max(1);
        self
    }

    /// Clients must use TLS (the server's CA in [`EtcdCluster::tls_files`]; no client
    /// certificates).
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Auth enabled, with this user as `root`-role user.
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<ServerProcess>,
}

/// Running etcd members; every process stopped by PID when dropped.
#[derive(Debug)]
pub struct EtcdCluster {
    bin: PathBuf,
    dir: TempDir,
    members: Vec<Member>,
    tls: Option<TlsFiles>,
    user: Option<(String, String)>,
}

impl EtcdCluster {
    /// One plain member.
    ///
    /// # Errors
    /// When etcd is not built or does not start.
    pub fn start() -> io::Result<Self> {
        Self::start_with(&EtcdOptions::new())
    }

    /// One plain member shared by the tests of this process while any of them holds it.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn shared() -> io::Result<Arc<Self>> {
        static SHARED: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());
        shared_instance(&SHARED, Self::start)
    }

    /// Members as `options` say, each on free loopback ports.
    ///
    /// # Errors
    /// When etcd is not built or a member does not start.
    pub fn start_with(options: &EtcdOptions) -> io::Result<Self> {
        retry_start(|| Self::try_start(options))
    }

    fn try_start(options: &EtcdOptions) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("turnstile-etcd-")
            .tempdir()?;
        let tls = if options.tls {
            Some(TlsFiles::generate(dir.path())?)
        } else {
            None
        };
        let mut members = Vec::new();
        for index in 0..options.members.max(1) {
            members.push(Member {
                name: format!("m{index}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                process: None,
            });
        }
        let mut cluster = EtcdCluster {
            bin: binaries()?,
            dir,
            members,
            tls,
            user: None,
        };
        for index in 0..cluster.members.len() {
            cluster.spawn(index)?;
        }
        cluster.wait_healthy(None)?;
        if let Some((name, password)) = &options.user {
            cluster.etcdctl(&["user", "add", &format!("{name}:{password}")])?;
            cluster.etcdctl(&["user", "grant-role", name, "root"])?;
            if name != "root" {
                cluster.etcdctl(&["user", "add", "root", "--new-user-password", password])?;
                cluster.etcdctl(&["user", "grant-role", "root", "root"])?;
            }
            cluster.etcdctl(&["auth", "enable"])?;
            cluster.user = Some((name.clone(), password.clone()));
        }
        Ok(cluster)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|member| format!("{}=http://127.0.0.1:{}", member.name, member.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, index: usize) -> io::Result<()> {
        let initial_cluster = self.initial_cluster();
        let member = &self.members[index];
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let mut command = Command::new(self.bin.join("etcd"));
        command
            .arg(format!("--name={}", member.name))
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join(&member.name).display()
            ))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .arg("--initial-cluster-state=new")
            .arg("--initial-cluster-token=turnstile-test")
            .arg("--listen-metrics-urls=")
            // Fast elections: a killed leader is replaced within about a second.
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=500")
            .arg("--log-level=warn");
        if let Some(files) = &self.tls {
            command
                .arg(format!("--cert-file={}", files.server_cert.display()))
                .arg(format!("--key-file={}", files.server_key.display()));
        }
        let log = self.dir.path().join(format!("{}.log", member.name));
        let process = ServerProcess::spawn_logged(command, &log)?;
        self.members[index].process = Some(process);
        Ok(())
    }

    fn wait_healthy(&mut self, only: Option<usize>) -> io::Result<()> {
        let indexes: Vec<usize> = match only {
            Some(index) => vec![index],
            None => (0..self.members.len()).collect(),
        };
        for index in indexes {
            let endpoint = self.endpoint(index);
            let ready = wait_until(START_TIMEOUT, || {
                self.member_exited(index)
                    || self.etcdctl_at(&endpoint, &["endpoint", "health"]).is_ok()
            });
            if !ready || self.member_exited(index) {
                let log = self
                    .dir
                    .path()
                    .join(format!("{}.log", self.members[index].name));
                return Err(io::Error::other(format!(
                    "etcd member {index} did not start: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    /// Whether member `index` is not running (never started, stopped, or exited).
    fn member_exited(&mut self, index: usize) -> bool {
        self.members[index]
            .process
            .as_mut()
            .is_none_or(ServerProcess::has_exited)
    }

    fn endpoint(&self, index: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[index].client_port)
    }

    /// `etcd://[user:password@]127.0.0.1:P1,…` (`etcds://` with TLS): every member.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        let user = self
            .user
            .as_ref()
            .map(|(name, password)| format!("{name}:{password}@"))
            .unwrap_or_default();
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|member| format!("127.0.0.1:{}", member.client_port))
            .collect();
        format!("{scheme}://{user}{}", hosts.join(","))
    }

    /// As [`Self::url`], naming member `index` only: a client that can reach no other.
    pub fn member_url(&self, index: usize) -> String {
        let url = self.url();
        let (head, _) = url.rsplit_once(['@', '/']).unwrap_or((&url, ""));
        let separator = if self.user.is_some() { "@" } else { "/" };
        format!(
            "{head}{separator}127.0.0.1:{}",
            self.members[index].client_port
        )
    }

    /// The client certificates, when started with TLS.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// Number of members.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Runs `etcdctl` against every running member; its standard output.
    ///
    /// # Errors
    /// When etcdctl fails (its standard error is the message).
    pub fn etcdctl(&self, args: &[&str]) -> io::Result<String> {
        let endpoints: Vec<String> = (0..self.members.len())
            .filter(|&index| self.members[index].process.is_some())
            .map(|index| self.endpoint(index))
            .collect();
        self.etcdctl_at(&endpoints.join(","), args)
    }

    fn etcdctl_at(&self, endpoints: &str, args: &[&str]) -> io::Result<String> {
        let mut command = Command::new(self.bin.join("etcdctl"));
        command
            .arg(format!("--endpoints={endpoints}"))
            .arg("--command-timeout=5s")
            .args(args);
        if let Some(files) = &self.tls {
            command.arg(format!("--cacert={}", files.ca_cert.display()));
        }
        if let Some((name, password)) = &self.user {
            command.arg(format!("--user={name}:{password}"));
        }
        let output = command.output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "etcdctl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The index of the current leader: the running member whose own ID is the leader ID it
    /// reports.
    ///
    /// # Errors
    /// When no running member is the leader.
    pub fn leader(&self) -> io::Result<usize> {
        let field = |status: &str, name: &str| {
            status.lines().find_map(|line| {
                line.strip_prefix(&format!("\"{name}\" : "))
                    .map(str::to_owned)
            })
        };
        for index in (0..self.members.len()).filter(|&i| self.members[i].process.is_some()) {
            let Ok(status) = self.etcdctl_at(
                &self.endpoint(index),
                &["endpoint", "status", "--write-out=fields"],
            ) else {
                continue;
            };
            let member = field(&status, "MemberID");
            if member.is_some() && member == field(&status, "Leader") {
                return Ok(index);
            }
        }
        Err(io::Error::other("no running etcd member is the leader"))
    }

    /// Kills member `index` (SIGKILL); its data stays for [`Self::restart_member`].
    pub fn kill_member(&mut self, index: usize) {
        if let Some(mut process) = self.members[index].process.take() {
            process.stop();
        }
    }

    /// Starts member `index` again on its ports and data; returns once it answers.
    ///
    /// # Errors
    /// When it does not come back.
    pub fn restart_member(&mut self, index: usize) -> io::Result<()> {
        self.kill_member(index);
        self.spawn(index)?;
        self.wait_healthy(Some(index))
    }
}
