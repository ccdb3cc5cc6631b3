//! The workspace's promises about the engine crate, checked with cargo itself: no Kubernetes
//! dependency, a memory-only build without default features, and a package that builds from
//! what `cargo package` would publish. The builds use a target folder of their own
//! (`target/workspace-check`), since the suite's own build folder is locked while it runs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn cargo(args: &[&str]) -> std::process::Output {
    let target: PathBuf = workspace().join("target").join("workspace-check");
    Command::new(env!("CARGO"))
        .args(args)
        .arg("--target-dir")
        .arg(&target)
        .current_dir(workspace())
        .env("CARGO_INCREMENTAL", "0")
        .output()
        .expect("run cargo")
}

fn succeeded(what: &str, output: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn the_engine_depends_on_nothing_of_kubernetes() {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-p",
            "turnstile-lock",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(workspace())
        .output()
        .expect("run cargo tree");
    let tree = succeeded("cargo tree", &output);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        crates.contains(&"redis") && crates.contains(&"mongodb"),
        "{tree}"
    );
    for banned in ["kube", "kube-client", "k8s-openapi", "axum", "clap"] {
        assert!(
            !crates.contains(&banned),
            "turnstile-lock depends on {banned}:\n{tree}"
        );
    }
}

#[test]
fn the_engine_builds_memory_only_and_packages() {
    succeeded(
        "cargo check -p turnstile-lock --no-default-features",
        &cargo(&["check", "-p", "turnstile-lock", "--no-default-features"]),
    );
    // Builds the crate from the packaged files alone, as crates.io would.
    succeeded(
        "cargo package -p turnstile-lock",
        &cargo(&["package", "-p", "turnstile-lock", "--allow-dirty"]),
    );
}
