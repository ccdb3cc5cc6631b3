//! `scripts/quickstart.sh`, run for real.
//!
//! - The kind path, with stand-ins for `docker`, `kind` and `kubectl` on `PATH` that record
//!   their arguments (this machine has no Docker daemon): the image built is the image loaded
//!   into the nodes and the image the applied manifest runs, for `IMAGE=...` and the default;
//!   `CLUSTER=...` names the cluster and the kubectl context. The `kubectl` stand-in renders
//!   `apply -k` with the real `kubectl kustomize`, so the manifest checked is what would be
//!   applied.
//! - The playground path (forced with `TURNSTILE_QUICKSTART=playground`, so the result does
//!   not depend on what is installed), given the built binaries so it builds nothing: it
//!   ends on a `kubectl get locks` table where job-a holds db-migrations, prints the
//!   `export KUBECONFIG=` line, leaves both processes serving after it exits, and `stop` ends
//!   them by PID.

use crate::docs;
use crate::json;
use crate::output;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use json::strings_of;
use output::text;
use serde::Deserialize as _;

/// The repository root (the script `cd`s there itself; tests run from it too).
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The real kubectl, found before `PATH` is changed.
fn real_kubectl() -> PathBuf {
    let output = Command::new("sh")
        .args(["-c", "command -v kubectl"])
        .output()
        .expect("sh");
    let path = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert!(!path.is_empty(), "kubectl must be on PATH for this test");
    PathBuf::from(path)
}

fn write_executable(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, body).expect("write stub");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod stub");
}

/// Stand-ins for the kind path's tools: each appends `tool args…` to `$STUB_LOG`. `docker
/// info` fails when `$STUB_DOCKER_DOWN` is set (no daemon); `kind get clusters` lists
/// `$STUB_CLUSTERS`; `kubectl apply -k DIR` writes what the real `kubectl kustomize DIR`
/// renders to `$STUB_APPLIED`; `kubectl get deployment/…` finds it only when `$STUB_DEPLOYED`
/// is set; `kubectl get distributedlocks …` answers a token, so the script's wait for a
/// grant ends at once.
fn write_kind_stubs(bin: &Path) {
    let log = "#!/usr/bin/env bash\necho \"$(basename \"$0\") $*\" >> \"$STUB_LOG\"\n";
    write_executable(
        &bin.join("docker"),
        &format!(
            "{log}{}",
            r#"[ "$1" = info ] && [ -n "${STUB_DOCKER_DOWN:-}" ] && exit 1
exit 0
"#
        ),
    );
    write_executable(
        &bin.join("kind"),
        &format!(
            "{log}{}",
            r#"[ "$1 $2" = "get clusters" ] && [ -n "${STUB_CLUSTERS:-}" ] && echo "$STUB_CLUSTERS"
exit 0
"#
        ),
    );
    write_executable(
        &bin.join("kubectl"),
        &format!(
            "{log}{}",
            r#"args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    -k) exec "$REAL_KUBECTL" kustomize "${args[$((i + 1))]}" > "$STUB_APPLIED" ;;
    distributedlocks) echo 1; exit 0 ;;
    deployment/*) [ "${args[$((i - 1))]}" = get ] && { [ -n "${STUB_DEPLOYED:-}" ]; exit; } ;;
  esac
done
exit 0
"#
        ),
    );
}

/// A directory of stand-ins (see [`write_kind_stubs`]) and the `PATH` that puts them first.
fn kind_stubs(dir: &Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    write_kind_stubs(&bin);
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// What one run of the kind path did.
struct KindRun {
    /// `tool args…`, one line per call of a stand-in.
    calls: Vec<String>,
    /// The images of the Deployment's containers in the applied manifest.
    deployed_images: Vec<String>,
    /// The applied manifest, whole.
    applied: String,
}

/// How the kind path is run: what the environment names and what the stand-ins find.
#[derive(Default)]
struct KindSetup<'a> {
    /// `CLUSTER` (unset when `None`).
    cluster: Option<&'a str>,
    /// `IMAGE` (unset when `None`).
    image: Option<&'a str>,
    /// `TURNSTILE_QUICKSTART` (unset when `None`: the script chooses).
    mode: Option<&'a str>,
    /// The clusters `kind get clusters` lists.
    existing_cluster: Option<&'a str>,
    /// Whether the controller's Deployment exists already.
    deployed: bool,
}

/// Runs the script's kind path with the stand-ins.
fn run_kind_path(setup: KindSetup<'_>) -> KindRun {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = kind_stubs(dir.path());
    let log = dir.path().join("calls.log");
    let applied = dir.path().join("applied.yaml");
    let mut command = Command::new("bash");
    command
        .arg(repo().join("scripts/quickstart.sh"))
        .env("PATH", path)
        .env("REAL_KUBECTL", real_kubectl())
        .env("STUB_LOG", &log)
        .env("STUB_APPLIED", &applied)
        .env("TURNSTILE_QUICKSTART_DIR", dir.path().join("state"))
        .env_remove("STUB_DOCKER_DOWN")
        .stdin(Stdio::null());
    let optional = [
        ("CLUSTER", setup.cluster),
        ("IMAGE", setup.image),
        ("TURNSTILE_QUICKSTART", setup.mode),
        ("STUB_CLUSTERS", setup.existing_cluster),
        ("STUB_DEPLOYED", setup.deployed.then_some("1")),
    ];
    for (name, value) in optional {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    let output = command.output().expect("run quickstart.sh");
    assert!(output.status.success(), "{}", text(&output));

    let calls = std::fs::read_to_string(&log)
        .expect("the stand-ins were called")
        .lines()
        .map(str::to_owned)
        .collect();
    let applied = std::fs::read_to_string(&applied).expect("kubectl apply -k was called");
    let mut deployed_images = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&applied) {
        let value = serde_yaml::Value::deserialize(document).expect("applied YAML");
        if value["kind"].as_str() == Some("Deployment") {
            let containers = value["spec"]["template"]["spec"]["containers"]
                .as_sequence()
                .expect("containers");
            deployed_images.extend(
                containers
                    .iter()
                    .filter_map(|container| container["image"].as_str().map(str::to_owned)),
            );
        }
    }
    KindRun {
        calls,
        deployed_images,
        applied,
    }
}

impl KindRun {
    /// Where the first call starting with `prefix` came, in call order.
    fn index_of(&self, prefix: &str) -> Option<usize> {
        self.calls.iter().position(|call| call.starts_with(prefix))
    }

    /// Panics unless a call starts with each of `prefixes`, in this order.
    fn assert_in_order(&self, prefixes: &[String]) {
        let order: Vec<Option<usize>> = prefixes
            .iter()
            .map(|prefix| self.index_of(prefix))
            .collect();
        assert!(
            order.iter().all(Option::is_some) && order.is_sorted(),
            "calls missing or out of order ({order:?} for {prefixes:#?}): {:#?}",
            self.calls
        );
    }
}

#[test]
fn kind_path_rolls_out_the_image_it_built_and_loaded() {
    // (IMAGE, the image reference docker, kind and the Deployment must all use)
    let cases = [
        (
            Some("registry.example:5000/team/turnstile:v1"),
            "registry.example:5000/team/turnstile:v1",
        ),
        (Some("localhost/turnstile"), "localhost/turnstile:latest"),
        (None, "turnstile:dev"),
    ];
    for (image, expected) in cases {
        let run = run_kind_path(KindSetup {
            cluster: Some("qs-test"),
            image,
            mode: Some("kind"),
            ..KindSetup::default()
        });
        let built = image.unwrap_or("turnstile:dev");
        let wanted = [
            "kind create cluster --name qs-test --config kind-config.yaml --wait 120s".to_owned(),
            format!("docker build -t {built} ."),
            format!("kind load docker-image {built} --name qs-test"),
        ];
        for call in &wanted {
            assert!(
                run.calls.contains(call),
                "{image:?}: no `{call}` in {:#?}",
                run.calls
            );
        }
        assert_eq!(run.deployed_images, [expected], "{image:?}");
        if image.is_some() {
            assert!(
                !run.applied.contains("turnstile:dev"),
                "{image:?}: the manifest still names turnstile:dev"
            );
        }
        // Every kubectl call goes to the kind cluster's context.
        for call in run.calls.iter().filter(|call| call.starts_with("kubectl ")) {
            assert!(
                call.starts_with("kubectl --context kind-qs-test "),
                "{image:?}: {call}"
            );
        }
    }
}

#[test]
fn the_default_cluster_has_three_nodes_and_the_examples_follow_the_rollout() {
    let config: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("kind-config.yaml")).expect("kind-config.yaml"),
    )
    .expect("kind-config.yaml is YAML");
    assert_eq!(config["name"].as_str(), Some("turnstile"));
    assert_eq!(
        strings_of(&config["nodes"], "role"),
        ["control-plane", "worker", "worker"]
    );

    let run = run_kind_path(KindSetup {
        mode: Some("kind"),
        ..KindSetup::default()
    });
    let k = "kubectl --context kind-turnstile";
    run.assert_in_order(&[
        "kind create cluster --name turnstile --config kind-config.yaml --wait 120s".to_owned(),
        "kind load docker-image turnstile:dev --name turnstile".to_owned(),
        format!("{k} apply -k "),
        format!("{k} -n turnstile-system rollout status deployment/turnstile-controller"),
        format!("{k} apply -f examples/lock.yaml"),
        format!("{k} apply -f examples/claims.yaml"),
        format!("{k} get locks"),
    ]);
    // A first run has nothing to restart.
    assert_eq!(
        run.index_of(&format!("{k} -n turnstile-system rollout restart")),
        None
    );
}

#[test]
fn a_second_kind_run_reuses_the_cluster_rebuilds_and_restarts_the_controller() {
    let run = run_kind_path(KindSetup {
        cluster: Some("qs-again"),
        mode: Some("kind"),
        existing_cluster: Some("qs-again"),
        deployed: true,
        ..KindSetup::default()
    });
    assert_eq!(run.index_of("kind create"), None, "{:#?}", run.calls);
    let k = "kubectl --context kind-qs-again -n turnstile-system";
    run.assert_in_order(&[
        "kind get clusters".to_owned(),
        "docker build -t turnstile:dev .".to_owned(),
        "kind load docker-image turnstile:dev --name qs-again".to_owned(),
        "kubectl --context kind-qs-again apply -k ".to_owned(),
        format!("{k} rollout restart deployment/turnstile-controller"),
        format!("{k} rollout status deployment/turnstile-controller"),
    ]);
}

#[test]
fn without_turnstile_quickstart_kind_and_an_answering_docker_mean_the_kind_path() {
    // Another cluster exists: this one is still created.
    let run = run_kind_path(KindSetup {
        cluster: Some("qs-auto"),
        existing_cluster: Some("someone-elses"),
        ..KindSetup::default()
    });
    for call in [
        "docker info",
        "kind create cluster --name qs-auto --config kind-config.yaml --wait 120s",
        "docker build -t turnstile:dev .",
    ] {
        assert!(
            run.index_of(call).is_some(),
            "no `{call}` in {:#?}",
            run.calls
        );
    }
}

/// The fake API server's binary. `cargo test --workspace` builds it next to `turnstile`; when
/// it is missing there or older than the fake's sources (`cargo test -p turnstile` alone), it
/// is built here with `cargo build -p fake-apiserver`.
fn fake_apiserver_bin() -> PathBuf {
    let sibling = Path::new(env!("CARGO_BIN_EXE_turnstile")).with_file_name("fake-apiserver");
    let sources = repo().join("crates/fake-apiserver");
    if modified(&sibling).is_some_and(|built| newest(&sources) <= built) {
        return sibling;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "-p", "fake-apiserver", "--bin", "fake-apiserver"])
        .arg("--message-format=json-render-diagnostics")
        .current_dir(repo())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo build -p fake-apiserver");
    assert!(
        output.status.success(),
        "cargo build -p fake-apiserver failed"
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|message| message["executable"].as_str().map(PathBuf::from))
        .find(|path| {
            path.file_name()
                .is_some_and(|name| name == "fake-apiserver")
        })
        .expect("cargo names the fake-apiserver executable")
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path)
        .and_then(|meta| meta.modified())
        .ok()
}

/// The latest modification time of a file under `dir`.
fn newest(dir: &Path) -> SystemTime {
    let mut latest = SystemTime::UNIX_EPOCH;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Some(time) = modified(&path) {
                latest = latest.max(time);
            }
        }
    }
    latest
}

/// A playground's state directory; dropping it runs the script's `stop`, so that a failing
/// test leaves no processes behind.
struct Playground {
    dir: tempfile::TempDir,
    fake_apiserver: PathBuf,
}

impl Playground {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            fake_apiserver: fake_apiserver_bin(),
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// `bash scripts/quickstart.sh ARGS…` for this playground, its output in files (the
    /// processes it leaves running must not hold a pipe of ours open), within `limit`.
    fn script(&self, args: &[&str], limit: Duration) -> Output {
        self.script_with(args, &[], limit)
    }

    /// [`script`](Self::script) with the environment changed: each `(name, Some(value))`
    /// set, each `(name, None)` removed, after this playground's own settings
    /// (`TURNSTILE_QUICKSTART=playground`, no `PLAYGROUND_PORT`).
    fn script_with(
        &self,
        args: &[&str],
        changes: &[(&str, Option<&std::ffi::OsStr>)],
        limit: Duration,
    ) -> Output {
        let stdout = self.dir.path().join("script.out");
        let stderr = self.dir.path().join("script.err");
        let mut command = Command::new("bash");
        command
            .arg(repo().join("scripts/quickstart.sh"))
            .args(args)
            .env("TURNSTILE_QUICKSTART", "playground")
            .env("TURNSTILE_QUICKSTART_DIR", self.state())
            .env("TURNSTILE_BIN", env!("CARGO_BIN_EXE_turnstile"))
            .env("FAKE_APISERVER_BIN", &self.fake_apiserver)
            .env_remove("KUBECONFIG")
            .env_remove("PLAYGROUND_PORT");
        for (name, value) in changes {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("run quickstart.sh");
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for quickstart.sh") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "quickstart.sh {args:?} did not finish within {limit:?}:\n{}",
                    std::fs::read_to_string(&stdout).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        Output {
            status,
            stdout: std::fs::read(&stdout).unwrap_or_default(),
            stderr: std::fs::read(&stderr).unwrap_or_default(),
        }
    }

    /// The `name pid` lines of the script's PID file.
    fn pids(&self) -> Vec<(String, i32)> {
        std::fs::read_to_string(self.state().join("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let (name, pid) = line.split_once(' ')?;
                Some((name.to_owned(), pid.trim().parse().ok()?))
            })
            .collect()
    }
}

impl Drop for Playground {
    fn drop(&mut self) {
        if !self.pids().is_empty() {
            let _ = self.script(&["stop"], Duration::from_secs(60));
        }
    }
}

/// Whether process `pid` runs (a zombie does not: nobody may reap it in a container).
fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) state …`: the state follows the last `)`.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    state.is_some_and(|state| state != "Z" && state != "X")
}

/// The row of `name` in a `kubectl get` table, as `column header -> cell`.
fn table_row(table: &str, name: &str) -> Option<Vec<(String, String)>> {
    let mut header: Option<Vec<&str>> = None;
    for line in table.lines() {
        let cells: Vec<&str> = line.split_whitespace().collect();
        if cells.first() == Some(&"NAME") {
            header = Some(cells);
        } else if cells.first() == Some(&name) {
            let header = header.as_ref()?;
            return Some(
                header
                    .iter()
                    .zip(cells)
                    .map(|(column, cell)| ((*column).to_owned(), cell.to_owned()))
                    .collect(),
            );
        }
    }
    None
}

fn cell<'a>(row: &'a [(String, String)], column: &str) -> &'a str {
    row.iter()
        .find(|(name, _)| name == column)
        .map_or("", |(_, cell)| cell.as_str())
}

#[test]
fn playground_ends_on_a_held_lock_and_stops_by_pid() {
    let playground = Playground::new();
    let output = playground.script(&[], Duration::from_secs(180));
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{}", text(&output));

    // The table after the last step is what the user sees last.
    let (_, last_table) = out
        .rsplit_once("==> kubectl get locks")
        .unwrap_or_else(|| panic!("no kubectl get locks step:\n{out}"));
    let lock = table_row(last_table, "distributedlock.turnstile.dev/db-migrations")
        .unwrap_or_else(|| panic!("no db-migrations row:\n{last_table}"));
    assert_eq!(cell(&lock, "BACKEND"), "memory", "{last_table}");
    assert_eq!(cell(&lock, "HOLDERS"), "job-a", "{last_table}");
    assert_eq!(cell(&lock, "TOKEN"), "1", "{last_table}");
    assert_eq!(cell(&lock, "WAITING"), "2", "{last_table}");
    let claim = table_row(last_table, "lockclaim.turnstile.dev/job-a")
        .unwrap_or_else(|| panic!("no job-a row:\n{last_table}"));
    assert_eq!(cell(&claim, "PHASE"), "Held", "{last_table}");

    let kubeconfig = playground.state().join("kubeconfig");
    assert!(
        out.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "{out}"
    );
    assert!(
        out.contains("not Kubernetes"),
        "says what it is not:\n{out}"
    );
    // What "Getting started" shows the script print (its first console block), with the
    // page's example folder for this run's.
    let blocks = docs::console_blocks(&docs::docs_page("getting-started.md"));
    let block = blocks.first().expect("a console block");
    let shown = &block.steps;
    assert_eq!(shown[0].command, "bash scripts/quickstart.sh");
    assert!(shown[2]
        .command
        .starts_with("bash scripts/quickstart.sh stop"));
    let as_on_the_page = out.replace(
        &playground.state().display().to_string(),
        "/home/me/turnstile/.quickstart",
    );
    if let Err(diff) = docs::output_matches(&shown[0].expected, &as_on_the_page) {
        panic!(
            "getting-started.md (the block at line {}) shows another output of the script:\n{diff}",
            block.line
        );
    }

    // Both processes outlive the script, and the API answers through the printed kubeconfig.
    let pids = playground.pids();
    let names: Vec<&str> = pids.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["fake-apiserver", "turnstile"], "{pids:?}");
    for (name, pid) in &pids {
        assert!(running(*pid), "{name} (PID {pid}) is not running");
    }
    let phase = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cache-dir")
        .arg(playground.dir.path().join("kube-cache"))
        .args([
            "get",
            "lockclaim",
            "job-b",
            "-o",
            "jsonpath={.status.phase}",
        ])
        .output()
        .expect("kubectl");
    assert_eq!(
        String::from_utf8_lossy(&phase.stdout),
        "Pending",
        "{}",
        text(&phase)
    );

    let stopped = playground.script(&["stop"], Duration::from_secs(60));
    assert!(stopped.status.success(), "{}", text(&stopped));
    for (name, pid) in &pids {
        assert!(!running(*pid), "{name} (PID {pid}) still runs after stop");
    }
    assert!(playground.pids().is_empty(), "the PID file is gone");
}

/// `TURNSTILE_QUICKSTART=control-plane`: the same steps on the real control plane
/// (`scripts/control-plane.sh`): the real server's version, job-a held, and `stop` ends the
/// controller and every process of the plane by PID.
#[test]
fn control_plane_path_ends_on_a_held_lock_on_a_real_apiserver_and_stops_by_pid() {
    let built = Command::new("bash")
        .arg(repo().join("scripts/control-plane.sh"))
        .arg("built")
        .status()
        .expect("control-plane.sh built");
    if !built.success() {
        test_servers::skip_or_fail(
            "control_plane_path_ends_on_a_held_lock_on_a_real_apiserver_and_stops_by_pid",
            "the control plane is not built (bash scripts/control-plane.sh build)",
            test_servers::under_ci(),
        );
        return;
    }
    let playground = Playground::new();
    let output = playground.script_with(
        &[],
        &[("TURNSTILE_QUICKSTART", Some("control-plane".as_ref()))],
        Duration::from_secs(300),
    );
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{}", text(&output));
    let (_, last_table) = out
        .rsplit_once("==> kubectl get locks")
        .unwrap_or_else(|| panic!("no kubectl get locks step:\n{out}"));
    let claim = table_row(last_table, "lockclaim.turnstile.dev/job-a")
        .unwrap_or_else(|| panic!("no job-a row:\n{last_table}"));
    assert_eq!(cell(&claim, "PHASE"), "Held", "{last_table}");
    let pinned = test_servers::kubernetes_version().expect("the pinned version");
    assert!(
        out.contains(&format!("kube-apiserver ({pinned})")),
        "names the real server:\n{out}"
    );

    let pids = playground.pids();
    let names: Vec<&str> = pids.iter().map(|(name, _)| name.as_str()).collect();
    for component in [
        "etcd",
        "kube-apiserver",
        "kube-controller",
        "kube-scheduler",
        "kwok",
        "turnstile",
    ] {
        assert!(names.contains(&component), "{component} among {pids:?}");
    }
    for (name, pid) in &pids {
        assert!(running(*pid), "{name} (PID {pid}) is not running");
    }
    let stopped = playground.script(&["stop"], Duration::from_secs(60));
    assert!(stopped.status.success(), "{}", text(&stopped));
    for (name, pid) in &pids {
        assert!(!running(*pid), "{name} (PID {pid}) still runs after stop");
    }
}

#[test]
fn without_docker_the_script_starts_the_playground_and_a_second_run_replaces_the_first() {
    // `kind` is installed but no Docker daemon answers: the script must choose the playground.
    let stubs = tempfile::tempdir().expect("tempdir");
    let path = kind_stubs(stubs.path());
    // The playground runs the real kubectl.
    std::fs::remove_file(stubs.path().join("bin/kubectl")).expect("drop the kubectl stand-in");
    let log = stubs.path().join("calls.log");
    let port = test_servers::free_port().expect("free port").to_string();
    // No control plane built either (an empty tools cache): the fake is the fallback.
    let no_tools = tempfile::tempdir().expect("tempdir");
    let playground = Playground::new();
    let first = playground.script_with(
        &[],
        &[
            ("TURNSTILE_QUICKSTART", None),
            ("TURNSTILE_TOOLS_CACHE", Some(no_tools.path().as_os_str())),
            ("PATH", Some(path.as_ref())),
            ("STUB_LOG", Some(log.as_os_str())),
            ("STUB_DOCKER_DOWN", Some("1".as_ref())),
            ("PLAYGROUND_PORT", Some(port.as_ref())),
        ],
        Duration::from_secs(180),
    );
    let out = String::from_utf8_lossy(&first.stdout).into_owned();
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        out.contains("kind or a Docker daemon is missing, and no real control plane is built")
            && out.contains("starting the local playground instead"),
        "{out}"
    );
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(calls.lines().any(|call| call == "docker info"), "{calls}");
    assert!(!calls.contains("kind create"), "{calls}");
    // PLAYGROUND_PORT is where the API server listens and what the kubeconfig names.
    let address = format!("127.0.0.1:{port}");
    let kubeconfig =
        std::fs::read_to_string(playground.state().join("kubeconfig")).expect("kubeconfig");
    assert!(kubeconfig.contains(&address), "{kubeconfig}");
    assert!(
        std::net::TcpStream::connect(&address).is_ok(),
        "nothing listens on {address}"
    );
    let first_pids = playground.pids();
    assert_eq!(first_pids.len(), 2, "{first_pids:?}");
    for (name, pid) in &first_pids {
        assert!(running(*pid), "{name} (PID {pid}) is not running");
    }

    // Again, without `stop`: the first pair is ended by PID and one new pair runs.
    let second = playground.script(&[], Duration::from_secs(180));
    let out = String::from_utf8_lossy(&second.stdout).into_owned();
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        out.contains("stopping the previous playground first"),
        "{out}"
    );
    for (name, pid) in &first_pids {
        assert!(!running(*pid), "the first {name} (PID {pid}) still runs");
    }
    let second_pids = playground.pids();
    let names: Vec<&str> = second_pids.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["fake-apiserver", "turnstile"], "{second_pids:?}");
    for (name, pid) in &second_pids {
        assert!(running(*pid), "the new {name} (PID {pid}) is not running");
        assert!(
            !first_pids.iter().any(|(_, old)| old == pid),
            "{name} kept PID {pid}"
        );
    }
    let table = out
        .rsplit_once("==> kubectl get locks")
        .map(|(_, table)| table.to_owned())
        .unwrap_or_default();
    let lock = table_row(&table, "distributedlock.turnstile.dev/db-migrations")
        .unwrap_or_else(|| panic!("no db-migrations row:\n{out}"));
    // A fresh API server: the grant starts over at token 1.
    assert_eq!(cell(&lock, "TOKEN"), "1", "{table}");
}

#[test]
fn without_the_binaries_given_the_playground_builds_them_with_cargo() {
    // A stand-in for cargo: records its arguments and names the binaries this test run
    // already built, as `cargo build --message-format=json-render-diagnostics` does.
    let playground = Playground::new();
    let stubs = tempfile::tempdir().expect("tempdir");
    let bin = stubs.path().join("bin");
    std::fs::create_dir(&bin).expect("bin dir");
    let log = stubs.path().join("cargo.log");
    let turnstile = env!("CARGO_BIN_EXE_turnstile");
    write_executable(
        &bin.join("cargo"),
        &format!(
            "#!/usr/bin/env bash\necho \"$*\" >> {log}\n\
             echo '{{\"reason\":\"compiler-artifact\",\"executable\":\"{turnstile}\"}}'\n\
             echo '{{\"reason\":\"compiler-artifact\",\"executable\":\"{fake}\"}}'\n",
            log = log.display(),
            fake = playground.fake_apiserver.display(),
        ),
    );
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = playground.script_with(
        &[],
        &[
            ("TURNSTILE_BIN", None),
            ("FAKE_APISERVER_BIN", None),
            ("PATH", Some(path.as_ref())),
        ],
        Duration::from_secs(180),
    );
    assert!(output.status.success(), "{}", text(&output));
    let calls = std::fs::read_to_string(&log).expect("cargo was called");
    assert_eq!(
        calls,
        "build -p turnstile -p fake-apiserver --bins --message-format=json-render-diagnostics\n"
    );
    // The processes left running are the binaries cargo named.
    let expected = [
        ("fake-apiserver", playground.fake_apiserver.clone()),
        ("turnstile", PathBuf::from(turnstile)),
    ];
    let pids = playground.pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    for ((name, pid), (expected_name, expected_exe)) in pids.iter().zip(expected) {
        assert_eq!(name, expected_name);
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe of a running PID");
        assert_eq!(
            exe.canonicalize().ok(),
            expected_exe.canonicalize().ok(),
            "{name}"
        );
    }
}
