//! A real Kubernetes control plane on loopback: etcd, kube-apiserver (TLS, client-certificate
//! admin, RBAC, service-account tokens, an audit log of writes and of every ServiceAccount
//! request), kube-controller-manager (the garbage collector, Job, namespace and
//! service-account controllers), kube-scheduler and KWOK (Nodes and Pods without a kubelet: a
//! Job's Pods run and succeed).
//!
//! The binaries are built from their Go modules by `scripts/control-plane.sh build`, pinned by
//! `tools/*/go.mod`; this module asks that script where they are, so the versions are written
//! down once. Each process listens on 127.0.0.1 only, writes its log into the plane's folder
//! and is stopped by its PID.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use crate::mongo::Unavailable;
use crate::process::{free_port, wait_until, ServerProcess};
use crate::tls::{new_rsa_key, self_signed_ca, signed_certificate};
use crate::tools::under_ci;

/// The start of the name of the temporary folder a plane of a test process lives in.
pub const CONTROL_PLANE_DIR_PREFIX: &str = "turnstile-control-plane-";

/// How long a component may take to answer after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The annotation KWOK's `--manage-nodes-with-annotation-selector` is given: KWOK plays the
/// kubelet of the Nodes that carry it.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// The Node KWOK runs the Pods of.
pub const KWOK_NODE: &str = "kwok-node-0";

/// The kube-apiserver's audit policy (no bodies): every request of a ServiceAccount (the
/// controller runs as one: its reads, and the 403s of a role that lacks a rule), and who
/// created, changed or deleted what (the unit of cost on a real control plane).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: [system:serviceaccounts]
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
";

/// The folder with the built binaries: `$TURNSTILE_CONTROL_PLANE_BIN`, else what
/// `scripts/control-plane.sh bin-dir` says (the one place the versions are pinned).
///
/// # Errors
/// When the script cannot be run, or the binaries are not built there.
pub fn binaries() -> io::Result<PathBuf> {
    let dir = match std::env::var_os("TURNSTILE_CONTROL_PLANE_BIN").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/control-plane.sh");
            let output = Command::new("bash").arg(&script).arg("bin-dir").output()?;
            if !output.status.success() {
                return Err(io::Error::other(format!(
                    "{} bin-dir failed: {}",
                    script.display(),
                    String::from_utf8_lossy(&output.stderr)
                )));
            }
            PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
        }
    };
    for binary in [
        "etcd",
        "etcdctl",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    ] {
        if !dir.join(binary).is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "the control plane is not built ({} is missing): run `bash scripts/control-plane.sh build` \
                     (about 10 minutes, once)",
                    dir.join(binary).display()
                ),
            ));
        }
    }
    Ok(dir)
}

/// The Kubernetes release `scripts/control-plane.sh` pins (`KUBERNETES_VERSION=`), what a
/// plane's servers report as their version.
///
/// # Errors
/// When the script cannot be read or pins none.
pub fn kubernetes_version() -> io::Result<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/control-plane.sh");
    std::fs::read_to_string(&script)?
        .lines()
        .find_map(|line| line.strip_prefix("KUBERNETES_VERSION=").map(str::to_owned))
        .ok_or_else(|| io::Error::other(format!("no KUBERNETES_VERSION= in {}", script.display())))
}

/// The files a plane's clients and components read.
#[derive(Debug, Clone)]
pub struct ControlPlaneFiles {
    /// The CA that signed the serving and client certificates.
    pub ca_cert: PathBuf,
    /// An admin kubeconfig (client certificate in `system:masters`).
    pub kubeconfig: PathBuf,
    /// The service-account signing key (RSA).
    pub service_account_key: PathBuf,
    /// The kube-apiserver's audit log (JSON lines, one per write).
    pub audit_log: PathBuf,
    /// The folder each component writes its log into (`<component>.log`).
    pub logs: PathBuf,
}

/// A running control plane; every process stopped by PID when dropped.
#[derive(Debug)]
pub struct ControlPlane {
    bin: PathBuf,
    dir: PathBuf,
    _owned_dir: Option<TempDir>,
    files: ControlPlaneFiles,
    etcd_ports: (u16, u16),
    apiserver_port: u16,
    etcd: Option<ServerProcess>,
    apiserver: Option<ServerProcess>,
    others: Vec<ServerProcess>,
}

impl ControlPlane {
    /// The plane of this test process, started on first use and stopped when the process ends
    /// (a watchdog process ends its servers by PID once the test process is gone).
    ///
    /// # Errors
    /// [`Unavailable::Skip`] when the binaries are not built (outside CI);
    /// [`Unavailable::Fail`] under CI or when a component did not start.
    pub fn for_this_process() -> Result<&'static ControlPlane, Unavailable> {
        // The error's kind and text: an io::Error cannot be cloned out of the cell.
        static SHARED: OnceLock<Result<ControlPlane, (io::ErrorKind, String)>> = OnceLock::new();
        let started = SHARED.get_or_init(|| {
            let plane = ControlPlane::start().map_err(|error| (error.kind(), error.to_string()))?;
            plane
                .watch_over(std::process::id())
                .map_err(|error| (error.kind(), error.to_string()))?;
            Ok(plane)
        });
        match started {
            Ok(plane) => Ok(plane),
            // NotFound: the binaries are not built (see `binaries`).
            Err((io::ErrorKind::NotFound, why)) if !under_ci() => {
                Err(Unavailable::Skip(why.clone()))
            }
            Err((kind, why)) => Err(Unavailable::Fail(io::Error::new(*kind, why.clone()))),
        }
    }

    /// Starts a plane of its own in a new temporary folder (for a test that restarts parts of
    /// it, or changes what every namespace sees).
    ///
    /// # Errors
    /// When the binaries are not built or a component does not start (its log is kept and
    /// named in the error).
    pub fn start() -> io::Result<ControlPlane> {
        let owned = tempfile::Builder::new()
            .prefix("turnstile-control-plane-")
            .tempdir()?;
        let dir = owned.path().to_path_buf();
        Self::start_in(dir, Some(owned))
    }

    /// Starts a plane whose files live in `dir` (kept after the plane stops): what
    /// `scripts/control-plane.sh up` runs.
    ///
    /// # Errors
    /// As [`ControlPlane::start`].
    pub fn start_in(dir: PathBuf, owned: Option<TempDir>) -> io::Result<ControlPlane> {
        let bin = binaries()?;
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let files = ControlPlaneFiles {
            ca_cert: dir.join("ca.crt"),
            kubeconfig: dir.join("admin.kubeconfig"),
            service_account_key: dir.join("service-account.key"),
            audit_log: logs.join("audit.log"),
            logs,
        };
        let mut plane = ControlPlane {
            bin,
            dir,
            _owned_dir: owned,
            files,
            etcd_ports: (0, 0),
            apiserver_port: 0,
            etcd: None,
            apiserver: None,
            others: Vec::new(),
        };
        plane.write_credentials()?;
        crate::redis::retry_start(|| plane.start_etcd_on_new_ports())?;
        crate::redis::retry_start(|| plane.start_apiserver_on_new_port())?;
        plane.install_crds()?;
        plane.start_controllers()?;
        Ok(plane)
    }

    /// The files clients read (kubeconfig, CA, audit log, logs).
    pub fn files(&self) -> &ControlPlaneFiles {
        &self.files
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.files.kubeconfig
    }

    /// The PIDs of every process of the plane.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .etcd
            .iter()
            .chain(&self.apiserver)
            .map(ServerProcess::pid)
            .collect();
        pids.extend(self.others.iter().map(ServerProcess::pid));
        pids
    }

    /// Runs `etcdctl` against the plane's etcd; its standard output.
    ///
    /// # Errors
    /// When etcdctl fails (its standard error is the message).
    pub fn etcdctl(&self, args: &[&str]) -> io::Result<String> {
        let endpoint = format!("http://127.0.0.1:{}", self.etcd_ports.0);
        let output = Command::new(self.bin.join("etcdctl"))
            .arg("--endpoints")
            .arg(&endpoint)
            .args(args)
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "etcdctl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Kills the kube-apiserver (SIGKILL) and starts it again on the same port; returns once it
    /// is ready.
    ///
    /// # Errors
    /// When it does not come back.
    pub fn restart_apiserver(&mut self) -> io::Result<()> {
        self.kill_apiserver();
        self.start_apiserver()
    }

    /// Kills the kube-apiserver (SIGKILL): clients see connections refused.
    pub fn kill_apiserver(&mut self) {
        if let Some(mut apiserver) = self.apiserver.take() {
            apiserver.stop();
        }
    }

    /// Starts the kube-apiserver again on its port after [`ControlPlane::kill_apiserver`].
    ///
    /// # Errors
    /// When it does not become ready.
    pub fn start_apiserver(&mut self) -> io::Result<()> {
        // The port was ours a moment ago; a restart retries a while for the kernel to free it.
        let mut last = None;
        for _ in 0..5 {
            match self.spawn_apiserver() {
                Ok(()) => return Ok(()),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("kube-apiserver did not restart")))
    }

    /// Kills etcd (SIGKILL) and starts it again on the same ports and data; returns once it
    /// answers.
    ///
    /// # Errors
    /// When it does not come back.
    pub fn restart_etcd(&mut self) -> io::Result<()> {
        if let Some(mut etcd) = self.etcd.take() {
            etcd.stop();
        }
        self.spawn_etcd()
    }

    /// Leaves the processes running after this value is gone (for `scripts/control-plane.sh
    /// up`, whose `down` stops them by the PIDs returned).
    pub fn detach(mut self) -> Vec<u32> {
        let pids = self.pids();
        let processes = self
            .etcd
            .take()
            .into_iter()
            .chain(self.apiserver.take())
            .chain(self.others.drain(..));
        processes.for_each(ServerProcess::forget);
        if let Some(owned) = self._owned_dir.take() {
            let _ = owned.keep();
        }
        pids
    }

    /// Starts a watchdog that, once process `pid` has exited, stops this plane's processes by
    /// PID and removes its folder: the plane of a test process outlives every test in it and
    /// must not outlive the process.
    fn watch_over(&self, pid: u32) -> io::Result<()> {
        let pids: Vec<String> = self.pids().iter().map(u32::to_string).collect();
        let script = "while kill -0 \"$0\" 2>/dev/null; do sleep 1; done; kill -9 \"$@\" 2>/dev/null; sleep 1; rm -rf \"$TURNSTILE_PLANE_DIR\"";
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(script)
            .arg(pid.to_string())
            .args(&pids)
            .env("TURNSTILE_PLANE_DIR", &self.dir);
        ServerProcess::spawn(command)?.forget();
        Ok(())
    }

    fn write_credentials(&self) -> io::Result<()> {
        let dir = &self.dir;
        let ca_key = dir.join("ca.key");
        self_signed_ca(&ca_key, &self.files.ca_cert, "turnstile test cluster CA")?;
        let leaves = [
            (
                "apiserver",
                "/CN=kube-apiserver",
                "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,\
                 DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n\
                 basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
            ),
            (
                "admin",
                "/O=system:masters/CN=turnstile-test-admin",
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
            ),
        ];
        for (name, subject, extensions) in leaves {
            let ext = dir.join(format!("{name}.ext"));
            std::fs::write(&ext, extensions)?;
            let key = dir.join(format!("{name}.key"));
            let cert = dir.join(format!("{name}.crt"));
            signed_certificate((&ca_key, &self.files.ca_cert), (&key, &cert), subject, &ext)?;
        }
        new_rsa_key(&self.files.service_account_key)?;
        std::fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY)?;
        std::fs::write(&self.files.kubeconfig, self.admin_kubeconfig_text(0))
    }

    /// The admin kubeconfig for an apiserver on `port`.
    fn admin_kubeconfig_text(&self, port: u16) -> String {
        let path = |name: &str| self.dir.join(name).display().to_string();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: turnstile-test\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {ca}\n\
             users:\n- name: admin\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n\
             contexts:\n- name: turnstile-test\n  context:\n    cluster: turnstile-test\n    user: admin\n    namespace: default\n\
             current-context: turnstile-test\n",
            ca = self.files.ca_cert.display(),
            cert = path("admin.crt"),
            key = path("admin.key"),
        )
    }

    fn log_file(&self, component: &str) -> PathBuf {
        self.files.logs.join(format!("{component}.log"))
    }

    /// An error naming `component` and the tail of its log.
    fn failed(&self, component: &str, what: &str) -> io::Error {
        let log = self.log_file(component);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        io::Error::other(format!(
            "{component} {what} (log {}):\n{}",
            log.display(),
            tail.join("\n")
        ))
    }

    fn start_etcd_on_new_ports(&mut self) -> io::Result<()> {
        self.etcd_ports = (free_port()?, free_port()?);
        self.spawn_etcd()
    }

    fn spawn_etcd(&mut self) -> io::Result<()> {
        let (client, peer) = self.etcd_ports;
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut command = Command::new(self.bin.join("etcd"));
        command
            .arg("--name=default")
            .arg(format!("--data-dir={}", self.dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=default={peer_url}"))
            .arg("--listen-metrics-urls=")
            .arg("--log-level=warn");
        let mut process = ServerProcess::spawn_logged(command, &self.log_file("etcd"))?;
        let ready = wait_until(START_TIMEOUT, || {
            process.has_exited() || self.etcdctl(&["endpoint", "health"]).is_ok()
        });
        if !ready || process.has_exited() {
            return Err(self.failed("etcd", "did not start"));
        }
        self.etcd = Some(process);
        Ok(())
    }

    fn start_apiserver_on_new_port(&mut self) -> io::Result<()> {
        self.apiserver_port = free_port()?;
        std::fs::write(
            &self.files.kubeconfig,
            self.admin_kubeconfig_text(self.apiserver_port),
        )?;
        self.spawn_apiserver()
    }

    fn spawn_apiserver(&mut self) -> io::Result<()> {
        let path = |name: &str| self.dir.join(name).display().to_string();
        let mut command = Command::new(self.bin.join("kube-apiserver"));
        command
            .arg(format!(
                "--etcd-servers=http://127.0.0.1:{}",
                self.etcd_ports.0
            ))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--secure-port={}", self.apiserver_port))
            // With the default reconciler it refuses 127.0.0.1 as the `kubernetes` Service's
            // endpoint; nothing here needs that endpoint.
            .arg("--endpoint-reconciler-type=none")
            .arg(format!("--cert-dir={}", path("apiserver-certs")))
            .arg(format!("--tls-cert-file={}", path("apiserver.crt")))
            .arg(format!("--tls-private-key-file={}", path("apiserver.key")))
            .arg(format!("--client-ca-file={}", self.files.ca_cert.display()))
            .arg("--authorization-mode=Node,RBAC")
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!(
                "--service-account-key-file={}",
                self.files.service_account_key.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                self.files.service_account_key.display()
            ))
            .arg("--allow-privileged=true")
            .arg("--profiling=false")
            .arg(format!("--audit-policy-file={}", path("audit-policy.yaml")))
            .arg(format!(
                "--audit-log-path={}",
                self.files.audit_log.display()
            ))
            .arg("--audit-log-format=json")
            .arg("--audit-log-mode=blocking");
        let mut process = ServerProcess::spawn_logged(command, &self.log_file("kube-apiserver"))?;
        let ready = wait_until(START_TIMEOUT, || {
            process.has_exited() || self.kubectl(&["get", "--raw", "/readyz"]).is_ok()
        });
        if !ready || process.has_exited() {
            return Err(self.failed("kube-apiserver", "did not become ready"));
        }
        self.apiserver = Some(process);
        Ok(())
    }

    /// Runs `kubectl` with the admin kubeconfig; its standard output.
    ///
    /// # Errors
    /// When kubectl fails (its standard error is the message).
    pub fn kubectl(&self, args: &[&str]) -> io::Result<String> {
        let output = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.files.kubeconfig)
            .args(args)
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Turnstile's CRDs (`crds/`), installed before kube-controller-manager starts: its garbage
    /// collector learns of a resource type only at start and then every 30 s, so claims made
    /// just after a later install would wait up to 30 s for it, which no cluster whose CRDs
    /// were installed long before shows.
    fn install_crds(&self) -> io::Result<()> {
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
        self.kubectl(&["apply", "--server-side", "-f", &crds.display().to_string()])?;
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/lockclaims.turnstile.dev",
            "crd/distributedlocks.turnstile.dev",
            "--timeout=60s",
        ])
        .map(drop)
    }

    /// kube-controller-manager, kube-scheduler, KWOK and its Node; returns once the
    /// service-account controller has made the `default` namespace's ServiceAccount (the
    /// controllers run) and KWOK has made the Node Ready.
    fn start_controllers(&mut self) -> io::Result<()> {
        let kubeconfig = self.files.kubeconfig.display().to_string();
        let mut manager = Command::new(self.bin.join("kube-controller-manager"));
        manager
            .arg(format!("--kubeconfig={kubeconfig}"))
            .arg("--controllers=*")
            .arg("--leader-elect=false")
            .arg(format!(
                "--service-account-private-key-file={}",
                self.files.service_account_key.display()
            ))
            .arg(format!("--root-ca-file={}", self.files.ca_cert.display()))
            .arg("--secure-port=0");
        self.others.push(ServerProcess::spawn_logged(
            manager,
            &self.log_file("kube-controller-manager"),
        )?);
        let mut scheduler = Command::new(self.bin.join("kube-scheduler"));
        scheduler
            .arg(format!("--kubeconfig={kubeconfig}"))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", free_port()?));
        self.others.push(ServerProcess::spawn_logged(
            scheduler,
            &self.log_file("kube-scheduler"),
        )?);
        let mut kwok = Command::new(self.bin.join("kwok"));
        kwok.arg(format!("--kubeconfig={kubeconfig}"))
            .arg("--manage-all-nodes=false")
            .arg(format!(
                "--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"
            ))
            .arg(format!(
                "--config={}",
                self.bin.join("kwok-stages.yaml").display()
            ))
            .arg(format!("--server-address=127.0.0.1:{}", free_port()?));
        self.others
            .push(ServerProcess::spawn_logged(kwok, &self.log_file("kwok"))?);
        let node = format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{KWOK_NODE}\",\
             \"annotations\":{{\"{KWOK_NODE_ANNOTATION}\":\"fake\"}},\"labels\":{{\"kubernetes.io/hostname\":\"{KWOK_NODE}\",\"type\":\"kwok\"}}}},\
             \"status\":{{\"allocatable\":{{\"cpu\":\"64\",\"memory\":\"256Gi\",\"pods\":\"1000\"}},\
             \"capacity\":{{\"cpu\":\"64\",\"memory\":\"256Gi\",\"pods\":\"1000\"}}}}}}"
        );
        let node_file = self.dir.join("node.json");
        std::fs::write(&node_file, node)?;
        self.kubectl(&["create", "-f", &node_file.display().to_string()])?;
        let ready = wait_until(START_TIMEOUT, || {
            self.others.iter_mut().any(ServerProcess::has_exited)
                || (self
                    .kubectl(&["get", "serviceaccount", "default", "-n", "default"])
                    .is_ok()
                    && self
                        .kubectl(&[
                            "get",
                            "node",
                            KWOK_NODE,
                            "-o",
                            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                        ])
                        .is_ok_and(|status| status.trim() == "True"))
        });
        for (index, component) in ["kube-controller-manager", "kube-scheduler", "kwok"]
            .into_iter()
            .enumerate()
        {
            if self.others[index].has_exited() {
                return Err(self.failed(component, "exited"));
            }
        }
        if !ready {
            return Err(self.failed(
                "kube-controller-manager",
                "made no default ServiceAccount, or KWOK no Ready Node, in time",
            ));
        }
        Ok(())
    }
}
