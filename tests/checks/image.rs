//! The image, tested where it can be: no Docker daemon runs on the project's machines, so the
//! image itself is never built here. What is tested instead:
//!
//! - the Dockerfile's `USER`, `ENTRYPOINT`, `CMD` and `EXPOSE` against `deploy/deployment.yaml`;
//! - the binary run as uid/gid 65532 (the Dockerfile's `USER`; `setpriv` when the test runs as
//!   root) in a read-only working directory with an empty environment: `--version`, `crds`
//!   (the committed `crds/`) and `run --help` (every flag the Deployment passes is there);
//! - which binary: with `TURNSTILE_IMAGE_RELEASE_BUILD=1`, the release binary built with the
//!   `cargo build` command and `ENV` of the Dockerfile's builder stage (read from the
//!   Dockerfile), for the Dockerfile's musl target when its Rust target and `musl-gcc` are
//!   installed, else for the host target (the test says which), and checked stripped. That
//!   build took 38 minutes from a cold target directory on this project's shared 2-core
//!   machine, too long for CI; without the variable (CI) the test runs this test run's own build of the
//!   same package and binary (debug profile), and checks that the Dockerfile's command resolves
//!   (`--locked`, `-p turnstile`, `--bin turnstile`) with `cargo metadata --locked`.

use crate::deploy;
use crate::output;
use crate::scratch;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use deploy::{find, render_base, repo, strings};
use output::succeeded;
use scratch::scratch;
use serde_json::Value;

/// The uid and gid of distroless's `nonroot` user, and the Dockerfile's `USER`.
const NONROOT: u32 = 65532;

/// The Dockerfile's instructions, continuation lines joined: (INSTRUCTION, arguments).
fn dockerfile() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("read the Dockerfile");
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let (instruction, args) = current.split_once(' ').unwrap_or((&current, ""));
        out.push((instruction.to_uppercase(), args.trim().to_string()));
        current.clear();
    }
    out
}

/// The last argument list of `instruction` (there is one per image stage that matters).
fn last(instruction: &str) -> String {
    dockerfile()
        .into_iter()
        .filter(|(i, _)| i == instruction)
        .map(|(_, args)| args)
        .next_back()
        .unwrap_or_else(|| panic!("no {instruction} in the Dockerfile"))
}

/// The JSON (exec) form of an instruction's arguments.
fn exec_form(instruction: &str) -> Vec<String> {
    let args = last(instruction);
    serde_json::from_str(&args)
        .unwrap_or_else(|e| panic!("{instruction} {args} is not the exec (JSON) form: {e}"))
}

/// The `cargo build …` of the builder stage, as words; `"$target"` left for the caller.
fn dockerfile_cargo_build() -> Vec<String> {
    let runs: Vec<String> = dockerfile()
        .into_iter()
        .filter(|(i, _)| i == "RUN")
        .map(|(_, args)| args)
        .collect();
    let run = runs
        .iter()
        .find(|run| run.contains("cargo build"))
        .expect("a RUN with cargo build");
    let command = run
        .split(';')
        .map(str::trim)
        .find(|step| step.starts_with("cargo build"))
        .expect("a `cargo build` step");
    command.split_whitespace().map(str::to_string).collect()
}

/// The builder stage's `ENV NAME=value` pairs.
fn dockerfile_env() -> Vec<(String, String)> {
    dockerfile()
        .into_iter()
        .filter(|(i, _)| i == "ENV")
        .flat_map(|(_, args)| {
            args.split_whitespace()
                .map(|pair| {
                    let (name, value) = pair.split_once('=').expect("ENV NAME=value");
                    (name.to_string(), value.to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn controller(objects: &[Value]) -> &Value {
    find(objects, "Deployment", "turnstile-controller")
        .pointer("/spec/template/spec/containers/0")
        .expect("the controller container")
}

#[test]
fn the_dockerfile_user_entrypoint_and_port_match_the_deployment() {
    let objects = render_base();
    let deployment = find(&objects, "Deployment", "turnstile-controller");
    let pod = deployment.pointer("/spec/template/spec").expect("pod spec");
    let container = controller(&objects);

    // USER is the Pod's uid:gid, and numeric (runAsNonRoot can only verify a numeric USER).
    let user = last("USER");
    assert_eq!(user, format!("{NONROOT}:{NONROOT}"));
    assert_eq!(pod["securityContext"]["runAsUser"], NONROOT);
    assert_eq!(pod["securityContext"]["runAsGroup"], NONROOT);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(last("FROM").contains("distroless/static") && last("FROM").ends_with(":nonroot"));
    // distroless/static has no libc: the binary must be static, built for a musl target
    // (with musl-tools for ring's C parts), and that binary is the one copied out.
    let build = dockerfile()
        .into_iter()
        .filter(|(instruction, _)| instruction == "RUN")
        .map(|(_, args)| args)
        .find(|args| args.contains("cargo build"))
        .expect("a RUN that builds");
    assert!(build.contains("-unknown-linux-musl"), "{build}");
    assert!(
        build.contains("--target \"$target\"")
            && build.contains("target/$target/release/turnstile"),
        "{build}"
    );
    assert!(
        dockerfile()
            .iter()
            .any(|(i, args)| i == "RUN" && args.contains("musl-tools")),
        "musl-gcc for the static target"
    );

    // The entrypoint is the binary the builder installs; the Deployment keeps it (no
    // `command`) and passes the subcommand CMD names first.
    let entrypoint = exec_form("ENTRYPOINT");
    assert_eq!(entrypoint, ["/usr/local/bin/turnstile"]);
    let copy = last("COPY");
    assert!(
        copy.ends_with(&format!(" {}", entrypoint[0])),
        "COPY {copy} does not install {}",
        entrypoint[0]
    );
    assert!(
        container.get("command").is_none(),
        "the Deployment overrides the entrypoint"
    );
    let cmd = exec_form("CMD");
    let args = strings(container.get("args"));
    assert_eq!(cmd, ["run"]);
    assert_eq!(args.first(), Some(&cmd[0]), "{args:?}");

    // EXPOSE is the metrics port the Deployment opens and serves on.
    let exposed: u16 = last("EXPOSE").parse().expect("EXPOSE PORT");
    let ports = container["ports"].as_array().expect("ports");
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "metrics" && p["containerPort"] == exposed),
        "{ports:?}"
    );
    assert!(
        args.contains(&format!("--metrics-addr=0.0.0.0:{exposed}")),
        "{args:?}"
    );
    // The image's filesystem is read-only in the Pod; the binary writes nothing (see the run
    // test, which uses a read-only working directory).
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
}

fn host_triple() -> String {
    let output = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .expect("a host line")
        .to_string()
}

/// The Dockerfile's musl target when it can be built here, else the host target; and why.
fn target() -> (String, String) {
    let musl = format!("{}-unknown-linux-musl", std::env::consts::ARCH);
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l == musl)
        })
        .unwrap_or(false);
    let musl_gcc = Command::new("musl-gcc").arg("--version").output().is_ok();
    if installed && musl_gcc {
        (musl.clone(), format!("the Dockerfile's target {musl}"))
    } else {
        let host = host_triple();
        (
            host.clone(),
            format!(
                "the host target {host}: {musl} is {} here (`rustup target add` cannot download it on this machine)",
                if installed { "installed but musl-gcc is not" } else { "not installed" }
            ),
        )
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
}

/// Builds the release binary as the Dockerfile does; its path.
fn build_release() -> PathBuf {
    let (target, why) = target();
    println!("building the release binary for {why}");
    let words = dockerfile_cargo_build();
    assert_eq!(words[..2], ["cargo", "build"]);
    for flag in ["--release", "--locked", "--target"] {
        assert!(words.iter().any(|w| w == flag), "{flag} in {words:?}");
    }
    let args: Vec<String> = words[1..]
        .iter()
        .map(|word| {
            if word.contains("$target") {
                target.clone()
            } else {
                word.clone()
            }
        })
        .collect();
    let mut command = Command::new(env!("CARGO"));
    command
        .args(&args)
        .current_dir(repo())
        .env("CARGO_TARGET_DIR", target_dir());
    for (name, value) in dockerfile_env() {
        command.env(name, value);
    }
    let started = std::time::Instant::now();
    let status = command.status().expect("run cargo build --release");
    assert!(status.success(), "cargo {} failed", args.join(" "));
    println!("cargo {} took {:.0?}", args.join(" "), started.elapsed());
    target_dir().join(&target).join("release").join("turnstile")
}

/// Whether this process runs as root (the owner of `/proc/self` is its effective uid).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").expect("/proc/self").uid() == 0
}

/// Runs `binary args` as uid/gid 65532, with no environment, in the read-only `dir`.
fn run_as_nonroot(binary: &Path, dir: &Path, args: &[&str]) -> Output {
    let mut command;
    if is_root() {
        command = Command::new("setpriv");
        command
            .arg(format!("--reuid={NONROOT}"))
            .arg(format!("--regid={NONROOT}"))
            .arg("--clear-groups")
            .arg("--inh-caps=-all")
            .arg("--")
            .arg(binary);
    } else {
        println!("not root: running as this process's own uid");
        command = Command::new(binary);
    }
    command
        .args(args)
        .current_dir(dir)
        .env_clear()
        .output()
        .expect("run the release binary")
}

/// Set to 1: build and test the release binary as the Dockerfile does.
const RELEASE_BUILD_ENV: &str = "TURNSTILE_IMAGE_RELEASE_BUILD";

/// Without the release build: the Dockerfile's `cargo build` names a package and binary that
/// exist, with a lock file that needs no update (`--locked`).
fn check_the_dockerfile_build_resolves() {
    let words = dockerfile_cargo_build();
    let after = |flag: &str| {
        words
            .iter()
            .position(|w| w == flag)
            .and_then(|i| words.get(i + 1))
            .unwrap_or_else(|| panic!("no {flag} in {words:?}"))
            .clone()
    };
    assert!(words.iter().any(|w| w == "--locked"), "{words:?}");
    assert!(words.iter().any(|w| w == "--release"), "{words:?}");
    let (package, bin) = (after("-p"), after("--bin"));
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--locked",
            "--offline",
            "--format-version",
            "1",
            "--no-deps",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo metadata");
    // Were it to fail, the Dockerfile's --locked build would too.
    let metadata: Value = serde_json::from_str(&succeeded("cargo metadata --locked", &output))
        .expect("metadata JSON");
    let found = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["name"] == package.as_str())
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .any(|t| t["name"] == bin.as_str() && strings(t.get("kind")).contains(&"bin".to_string()));
    assert!(found, "no binary {bin} in package {package}");
}

/// The binary to run, and what it is.
fn binary_under_test() -> PathBuf {
    if std::env::var(RELEASE_BUILD_ENV).as_deref() == Ok("1") {
        let built = build_release();
        let bytes = std::fs::read(&built).expect("read the release binary");
        // CARGO_PROFILE_RELEASE_STRIP=symbols took effect: no symbol table.
        assert!(
            !bytes.windows(8).any(|w| w == b".symtab\0"),
            "{} keeps its symbol table",
            built.display()
        );
        println!("release binary: {} bytes", bytes.len());
        built
    } else {
        check_the_dockerfile_build_resolves();
        println!(
            "running this test run's own (debug) build of the turnstile binary, not the release \
             build: set {RELEASE_BUILD_ENV}=1 to build it as the Dockerfile does (38 minutes \
             from a cold target directory here)"
        );
        PathBuf::from(env!("CARGO_BIN_EXE_turnstile"))
    }
}

#[test]
fn the_binary_runs_as_nonroot_in_a_read_only_directory() {
    if is_root() {
        let found = Command::new("setpriv").arg("--version").output().is_ok();
        if !found {
            test_servers::skip_or_fail(
                "the_binary_runs_as_nonroot_in_a_read_only_directory",
                "setpriv (util-linux) is not on PATH",
                test_servers::under_ci(),
            );
            return;
        }
    }
    let built = binary_under_test();

    // A directory only root may write, readable by all: the image's `/`, as the Pod mounts it.
    let scratch = scratch("image-");
    let root = scratch.path();
    let binary = root.join("turnstile");
    std::fs::copy(&built, &binary).expect("copy the binary");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let workdir = root.join("work");
    std::fs::create_dir(&workdir).expect("work directory");
    std::fs::set_permissions(&workdir, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o555)).expect("chmod");

    // The uid cannot write there (so the checks below would fail if the binary needed to).
    if is_root() {
        let probe = Command::new("setpriv")
            .args([
                &format!("--reuid={NONROOT}"),
                &format!("--regid={NONROOT}"),
                "--clear-groups",
                "--",
                "sh",
                "-c",
                "id -u; touch probe",
            ])
            .current_dir(&workdir)
            .output()
            .expect("probe");
        let text = String::from_utf8_lossy(&probe.stdout);
        assert_eq!(text.lines().next(), Some("65532"), "{probe:?}");
        assert!(
            !probe.status.success(),
            "uid {NONROOT} could write the working directory"
        );
    }

    let version = run_as_nonroot(&binary, &workdir, &["--version"]);
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("turnstile {}", env!("CARGO_PKG_VERSION"))
    );

    let printed = run_as_nonroot(&binary, &workdir, &["crds"]);
    assert!(printed.status.success(), "{printed:?}");
    let mut expected = String::new();
    for crd in turnstile_api::crds() {
        let name = crd.metadata.name.clone().expect("a CRD name");
        expected.push_str("---\n");
        expected.push_str(
            &std::fs::read_to_string(repo().join("crds").join(format!("{name}.yaml")))
                .expect("read crds/"),
        );
    }
    assert!(
        String::from_utf8_lossy(&printed.stdout) == expected,
        "the release binary's `turnstile crds` differs from crds/"
    );

    let help = run_as_nonroot(&binary, &workdir, &["run", "--help"]);
    assert!(help.status.success(), "{help:?}");
    let help = String::from_utf8_lossy(&help.stdout);
    let objects = render_base();
    for arg in strings(controller(&objects).get("args")).iter().skip(1) {
        let flag = arg.split('=').next().expect("a flag");
        assert!(
            help.split_whitespace()
                .any(|word| word.trim_end_matches(',') == flag),
            "`turnstile run --help` lacks the Deployment's {flag}:\n{help}"
        );
    }

    // Let the temporary directory be removed.
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&workdir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}
