//! Real `kubectl` driving the fake (or the real cluster named by `TURNSTILE_E2E_KUBECONFIG`): apply CRDs and objects, `get` with printer columns and a
//! category, `wait`, `delete`; the repository's own CRDs; and the `fake-apiserver` binary.

mod support;

/// Real kubectl against the fake (the real plane's behaviour is the contract suite's,
/// `contract_on_real_plane.rs`).
pub(crate) const ON_REAL_PLANE: bool = false;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::Env;

/// Two CRDs of the group `kubectl.turnstile.dev` in one multi-document YAML: gizmos (status,
/// printer columns, short name and category) and doohickeys (same category, loose schema).
const FIXTURE_CRDS: &str = include_str!("fixtures/kubectl_crds.yaml");

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[track_caller]
fn ok(out: Output) -> String {
    assert!(out.status.success(), "kubectl failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts that kubectl failed and said `needle`.
#[track_caller]
fn fails_saying(out: &Output, needle: &str) {
    assert!(!out.status.success(), "kubectl succeeded: {}", text(out));
    assert!(
        text(out).contains(needle),
        "{needle:?} not in {}",
        text(out)
    );
}

/// Waits for a background kubectl and asserts that it said `needle`.
#[track_caller]
fn finishes_saying(child: std::process::Child, needle: &str) {
    let out = child.wait_with_output().expect("kubectl output");
    assert!(
        text(&out).contains(needle),
        "{needle:?} not in {}",
        text(&out)
    );
}

/// Lets background `kubectl wait`s start watching, then patches gizmo/g1 in `ns` with
/// `patch_args` (panics if kubectl fails).
async fn patch_g1_under_waiters(env: &Env, ns: &str, patch_args: &[&str]) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut args = vec!["patch", "gizmo", "g1", "-n", ns];
    args.extend_from_slice(patch_args);
    ok(env.kubectl(&args));
}

/// Starts a kubectl command in the background (for `wait` while another command acts).
fn spawn_kubectl(env: &Env, args: &[&str]) -> std::process::Child {
    env.kubectl_command(args).spawn().expect("spawn kubectl")
}

/// Starts `kubectl wait --for=<what> gizmo/g1` in `ns` (30 s at most) in the background.
fn spawn_wait_for_g1(env: &Env, ns: &str, what: &str) -> std::process::Child {
    let what = format!("--for={what}");
    spawn_kubectl(env, &["wait", &what, "gizmo/g1", "-n", ns, "--timeout=30s"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_gets_waits_and_deletes() {
    let env = Env::new().await;
    let ns = env.namespace.clone();
    let out = ok(env.kubectl_stdin(&["apply", "-f", "-"], FIXTURE_CRDS));
    assert!(
        out.contains("customresourcedefinition.apiextensions.k8s.io/gizmos.kubectl.turnstile.dev"),
        "{out}"
    );
    ok(env.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/gizmos.kubectl.turnstile.dev",
        "crd/doohickeys.kubectl.turnstile.dev",
        "--timeout=30s",
    ]));

    let objects = "apiVersion: kubectl.turnstile.dev/v1\nkind: Gizmo\nmetadata: {name: g1, finalizers: [kubectl.turnstile.dev/hold]}\nspec: {size: 3}\n---\n\
                   apiVersion: kubectl.turnstile.dev/v1\nkind: Doohickey\nmetadata: {name: d1}\nspec: {anything: [1, 2]}\n";
    let out = ok(env.kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], objects));
    assert!(
        out.contains("gizmo.kubectl.turnstile.dev/g1 created")
            && out.contains("doohickey.kubectl.turnstile.dev/d1 created"),
        "{out}"
    );
    let out = ok(env.kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], objects));
    assert!(
        out.contains("gizmo.kubectl.turnstile.dev/g1 unchanged"),
        "{out}"
    );

    // Printer columns, short name, category.
    let out = ok(env.kubectl(&["get", "gizmos", "-n", &ns]));
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["NAME", "SIZE", "PHASE", "AGE"], "{out}");
    assert_eq!(&lines[1][..2], ["g1", "3"], "{out}");
    assert!(
        lines[1][2].ends_with('s'),
        "empty phase, then an age: {out}"
    );
    let out = ok(env.kubectl(&["get", "toys", "-n", &ns]));
    assert!(
        out.contains("gizmo.kubectl.turnstile.dev/g1")
            && out.contains("doohickey.kubectl.turnstile.dev/d1"),
        "{out}"
    );
    assert_eq!(
        ok(env.kubectl(&["get", "gz", "g1", "-n", &ns, "-o", "jsonpath={.spec.color}"])),
        "blue",
        "schema default"
    );

    // Server-side validation through kubectl apply.
    let invalid = "apiVersion: kubectl.turnstile.dev/v1\nkind: Gizmo\nmetadata: {name: bad}\nspec: {size: 0}\n";
    fails_saying(
        &env.kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], invalid),
        "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1",
    );
    let unknown = "apiVersion: kubectl.turnstile.dev/v1\nkind: Gizmo\nmetadata: {name: bad}\nspec: {size: 1, bogus: 2}\n";
    fails_saying(
        &env.kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], unknown),
        "unknown field \"spec.bogus\"",
    );

    // wait --for=condition and --for=jsonpath while the status changes.
    let waiter = spawn_wait_for_g1(&env, &ns, "condition=Ready");
    let json_waiter = spawn_wait_for_g1(&env, &ns, "jsonpath={.status.phase}=Ready");
    patch_g1_under_waiters(
        &env,
        &ns,
        &[
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Ready","conditions":[{"type":"Ready","status":"True"}]}}"#,
        ],
    )
    .await;
    finishes_saying(waiter, "condition met");
    finishes_saying(json_waiter, "condition met");
    let out = ok(env.kubectl(&["get", "gizmos", "-n", &ns]));
    assert!(
        out.lines().nth(1).unwrap().split_whitespace().nth(2) == Some("Ready"),
        "{out}"
    );

    // delete with a finalizer; wait --for=delete completes when it is removed.
    ok(env.kubectl(&["delete", "gizmo", "g1", "-n", &ns, "--wait=false"]));
    assert!(!ok(env.kubectl(&[
        "get",
        "gizmo",
        "g1",
        "-n",
        &ns,
        "-o",
        "jsonpath={.metadata.deletionTimestamp}"
    ]))
    .is_empty());
    let deleter = spawn_wait_for_g1(&env, &ns, "delete");
    patch_g1_under_waiters(
        &env,
        &ns,
        &[
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ],
    )
    .await;
    let out = deleter.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    ok(env.kubectl(&["delete", "doohickey", "d1", "-n", &ns]));
    let out = ok(env.kubectl(&["get", "toys", "-n", &ns, "-o", "name"]));
    assert!(out.trim().is_empty(), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_imperative_create_commands_work() {
    let env = Env::new().await;
    let ns = format!("{}-imp", env.namespace);
    ok(env.kubectl(&["create", "namespace", &ns]));
    ok(env.kubectl(&["create", "configmap", "cm", "-n", &ns, "--from-literal=k=v"]));
    ok(env.kubectl(&[
        "create",
        "secret",
        "generic",
        "s",
        "-n",
        &ns,
        "--from-literal=k=v",
    ]));
    assert_eq!(
        ok(env.kubectl(&[
            "get",
            "configmap",
            "cm",
            "-n",
            &ns,
            "-o",
            "jsonpath={.data.k}"
        ])),
        "v"
    );
    assert_eq!(
        ok(env.kubectl(&[
            "get",
            "secret",
            "s",
            "-n",
            &ns,
            "-o",
            "jsonpath={.data.k} {.type}"
        ])),
        "dg== Opaque"
    );
    ok(env.kubectl(&["delete", "namespace", &ns]));
}

fn repository_crds() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_the_repository_crds() {
    let files = repository_crds();
    if files.is_empty() {
        test_servers::skip_or_fail(
            "kubectl_applies_the_repository_crds",
            "no crds/*.yaml in the repository",
            test_servers::under_ci(),
        );
        return;
    }
    let env = Env::new().await;
    let ns = env.namespace.clone();
    for f in &files {
        ok(env.kubectl(&["apply", "-f", f.to_str().unwrap()]));
    }
    ok(env.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/distributedlocks.turnstile.dev",
        "crd/lockclaims.turnstile.dev",
        "--timeout=30s",
    ]));
    let objects = "apiVersion: turnstile.dev/v1alpha1\nkind: DistributedLock\nmetadata: {name: db}\nspec: {maxHolders: 1}\n---\n\
                   apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata: {name: job-a}\nspec: {lockName: db}\n";
    ok(env.kubectl_stdin(&["apply", "-n", &ns, "-f", "-"], objects));
    let out = ok(env.kubectl(&["get", "locks", "-n", &ns]));
    assert!(
        out.contains("distributedlock.turnstile.dev/db")
            && out.contains("lockclaim.turnstile.dev/job-a"),
        "{out}"
    );
    let out = ok(env.kubectl(&["get", "lclaim", "-n", &ns]));
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "LOCK", "PHASE", "HOLDER", "TOKEN", "POSITION", "EXPIRES", "AGE"],
        "{out}"
    );
    // The CRD's CEL rule keeps lockName immutable.
    fails_saying(
        &env.kubectl(&[
            "patch",
            "lclaim",
            "job-a",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"lockName":"other"}}"#,
        ]),
        "lockName is immutable",
    );
}

#[tokio::test]
async fn the_binary_prints_its_url_writes_a_kubeconfig_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fake-apiserver"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first_line)
        .unwrap();
    let url = first_line.trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let config = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(config.contains(&url), "{config}");
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .args(["get", "namespace", "default", "-o", "name"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "namespace/default",
        "{}",
        text(&out)
    );
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exits cleanly on SIGTERM: {status}");
            break;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("the binary did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
