//! `scripts/quickstart.sh`, run for real.
//!
//! - The kind path, with stand-ins for `docker`, `kind` and `kubectl` on `PATH` that record
//!   their arguments (this machine has no Docker daemon): the image built is the image loaded
//!   into the nodes and the image the applied manifest runs, for `IMAGE=...` and the default;
//!   `CLUSTER=...` names the cluster and the kubectl context. The `kubectl` stand-in renders
//!   `apply -k` with the real `kubectl kustomize`, so the manifest checked is what would be
//!   applied.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde::Deserialize as _;

/// The repository root (the script `cd`s there itself; tests run from it too).
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
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

/// Stand-ins for the kind path's tools: each appends `tool args…` to `$STUB_LOG`. `kind get
/// clusters` lists none; `kubectl apply -k DIR` writes what the real `kubectl kustomize DIR`
/// renders to `$STUB_APPLIED`; `kubectl get deployment/…` finds nothing; `kubectl get
/// distributedlocks …` answers a token, so the script's wait for a grant ends at once.
fn write_kind_stubs(bin: &Path) {
    let log = "#!/usr/bin/env bash\necho \"$(basename \"$0\") $*\" >> \"$STUB_LOG\"\n";
    write_executable(&bin.join("docker"), log);
    write_executable(&bin.join("kind"), log);
    write_executable(
        &bin.join("kubectl"),
        &format!(
            "{log}{}",
            r#"args=("$@")
for i in "${!args[@]}"; do
  case "${args[$i]}" in
    -k) exec "$REAL_KUBECTL" kustomize "${args[$((i + 1))]}" > "$STUB_APPLIED" ;;
    distributedlocks) echo 1; exit 0 ;;
    deployment/*) [ "${args[$((i - 1))]}" = get ] && exit 1 ;;
  esac
done
exit 0
"#
        ),
    );
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

/// Runs the script's kind path with the stand-ins, `CLUSTER=cluster` and `IMAGE=image`
/// (unset when `None`).
fn run_kind_path(cluster: &str, image: Option<&str>) -> KindRun {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin dir");
    write_kind_stubs(&bin);
    let log = dir.path().join("calls.log");
    let applied = dir.path().join("applied.yaml");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("bash");
    command
        .arg(repo().join("scripts/quickstart.sh"))
        .env("PATH", path)
        .env("REAL_KUBECTL", real_kubectl())
        .env("STUB_LOG", &log)
        .env("STUB_APPLIED", &applied)
        .env("CLUSTER", cluster)
        .env("TURNSTILE_QUICKSTART", "kind")
        .env("TURNSTILE_QUICKSTART_DIR", dir.path().join("state"))
        .stdin(Stdio::null());
    match image {
        Some(image) => command.env("IMAGE", image),
        None => command.env_remove("IMAGE"),
    };
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
        let run = run_kind_path("qs-test", image);
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
