//! The workspace's promises about the engine crate, checked with cargo itself: no Kubernetes
//! dependency, a memory-only build without default features, and a package that builds from
//! what `cargo package` would publish. The builds use a target folder of their own
//! (`target/workspace-check`), since the suite's own build folder is locked while it runs.

use crate::docs;
use crate::json;
use crate::output;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::lines::readme_line;
use docs::readme_text;
use json::strings_of;
use output::succeeded;

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

/// `cargo tree -p turnstile-lock -e normal --prefix none ARGS…`: one crate per line.
fn engine_tree(args: &[&str]) -> String {
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
        .args(args)
        .current_dir(workspace())
        .output()
        .expect("run cargo tree");
    succeeded("cargo tree", &output)
}

#[test]
fn the_engine_depends_on_nothing_of_kubernetes() {
    let tree = engine_tree(&[]);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        crates.contains(&"redis") && crates.contains(&"mongodb") && crates.contains(&"etcd-client"),
        "{tree}"
    );
    for banned in ["kube", "kube-client", "k8s-openapi", "clap"] {
        assert!(
            !crates.contains(&banned),
            "turnstile-lock depends on {banned}:\n{tree}"
        );
    }
    // axum comes in only as tonic's default router (the etcd client's gRPC transport, whose
    // features etcd-client does not let us turn off), never as a dependency of ours.
    let dependents = engine_tree(&["-i", "axum", "--depth", "1"]);
    let names: Vec<&str> = dependents
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        names.iter().all(|name| *name == "tonic"),
        "axum reaches turnstile-lock other than through tonic:\n{dependents}"
    );
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

/// The commands a shell script runs, one per line: comments, blank lines and `set` left out.
fn commands(script: &str) -> Vec<String> {
    script
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#') && !line.starts_with("set "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn ci_runs_the_readmes_test_command_and_nothing_else() {
    let readme = readme_text();
    let row = readme_line("| pass the tests:");
    let command = row
        .rsplit('|')
        .map(str::trim)
        .find(|cell| !cell.is_empty())
        .and_then(|cell| cell.strip_prefix('`')?.strip_suffix('`'))
        .expect("the row's command, in backticks");
    let (install, test) = command.split_once(" && ").expect("install && test");

    let script = std::fs::read_to_string(workspace().join(".ci/run")).expect(".ci/run");
    let commands = commands(&script);
    // The README's two steps, in its order, and besides them only the cd to the
    // repository and the environment the README names.
    // CI=true comes before the install, so that a tool or server it cannot install fails it.
    let expected = [
        r#"cd "$(dirname "$0")/..""#,
        "export CI=true",
        install,
        "export CARGO_INCREMENTAL=0",
        "export CARGO_PROFILE_DEV_DEBUG=line-tables-only",
        test,
    ];
    assert_eq!(commands, expected, "{script}");
    for variable in ["CARGO_INCREMENTAL=0", "CI=true", "line-table"] {
        assert!(
            readme.contains(variable),
            "the README should name {variable}"
        );
    }
}

/// What `.ci/install` promises to leave behind, checked where it ran (`CI=true`): every tool
/// the suite needs on `PATH`, and no Prometheus server running (the package is there only
/// for promtool, installed with service starts denied).
#[test]
fn ci_install_leaves_every_tool_on_path_and_no_prometheus_running() {
    const TEST: &str = "ci_install_leaves_every_tool_on_path_and_no_prometheus_running";
    if !test_servers::under_ci() {
        test_servers::record_skip(TEST, "it checks a machine `.ci/install` set up (CI=true)");
        return;
    }
    for tool in [
        "redis-server",
        "redis-cli",
        "openssl",
        "kubectl",
        "promtool",
        "kubernetes-validate",
        "checkov",
    ] {
        // Under CI a missing tool fails here, naming it.
        test_servers::tool_or_skip(tool, TEST, "`bash .ci/install` installs it");
    }
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
    };
    assert!(
        on_path("secantusd-rs") || on_path("secantusd-py"),
        "no MongoDB test server (secantusd-rs or secantusd-py) on PATH"
    );
    let prometheus: Vec<PathBuf> = std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .map(|entry| entry.path().join("comm"))
        .filter(|comm| std::fs::read_to_string(comm).is_ok_and(|name| name.trim() == "prometheus"))
        .collect();
    assert!(
        prometheus.is_empty(),
        "a Prometheus server runs: {prometheus:?}"
    );
}

/// The README's Layout: each crate depends only on those above it (lock → api → controller →
/// root); the test support crates are never a normal dependency of a product crate.
#[test]
fn each_crate_depends_only_on_the_crates_above_it() {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace())
        .output()
        .expect("run cargo metadata");
    let metadata: serde_json::Value =
        serde_json::from_str(&succeeded("cargo metadata", &output)).expect("metadata JSON");
    let layers = [
        "turnstile-lock",
        "turnstile-api",
        "turnstile-controller",
        "turnstile",
    ];
    let members = strings_of(&metadata["packages"], "name");
    let mut edges = Vec::new();
    for package in metadata["packages"].as_array().expect("packages") {
        let name = package["name"].as_str().expect("name");
        let Some(layer) = layers.iter().position(|layer| *layer == name) else {
            continue;
        };
        let ours: Vec<&str> = package["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            // Normal dependencies (dev and build ones have a kind).
            .filter(|dependency| dependency["kind"].is_null())
            .filter_map(|dependency| dependency["name"].as_str())
            .filter(|dependency| members.contains(dependency))
            .collect();
        for dependency in ours {
            let above = layers[..layer].contains(&dependency);
            assert!(
                above,
                "{name} depends on {dependency}, which is not above it"
            );
            edges.push((name, dependency));
        }
    }
    // The graph was read: the controller builds on both crates above it.
    for edge in [
        ("turnstile-controller", "turnstile-api"),
        ("turnstile-controller", "turnstile-lock"),
    ] {
        assert!(edges.contains(&edge), "{edge:?} missing from {edges:?}");
    }
    // The resources do not build on the engine: they share one limit, checked where both meet.
    assert!(
        !edges.contains(&("turnstile-api", "turnstile-lock")),
        "{edges:?}"
    );
}

/// The newest test binary `name-<hash>` beside this one (`cargo test --workspace` builds
/// every test binary before it runs any).
fn sibling_test_binary(name: &str) -> Option<PathBuf> {
    let current = std::env::current_exe().ok()?;
    let dir = current.parent()?;
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.extension().is_none()
                && path
                    .file_name()
                    .and_then(|file| file.to_str())
                    .and_then(|file| file.strip_prefix(name))
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|hash| hash.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .max_by_key(|path| {
            std::fs::metadata(path)
                .and_then(|meta| meta.modified())
                .ok()
        })
}

/// The function's own name in a test's `module::function` path (what a skip line names).
fn function_name(test: &str) -> &str {
    test.rsplit("::").next().unwrap_or(test)
}

#[test]
fn under_ci_a_test_missing_its_tool_or_server_fails_and_otherwise_skips() {
    // A tool (promtool) and a test server (the MongoDB one), each taken away by an empty PATH.
    let cases = [
        (
            "e2e",
            "monitoring::the_rules_pass_promtool_check_and_every_unit_case",
        ),
        (
            "e2e",
            "mongo::fifo_handover_with_increasing_tokens_on_mongo",
        ),
    ];
    let empty = tempfile::tempdir().expect("an empty directory for PATH");
    // The children's skips go to a log of this test's, not the run's (they are on purpose).
    let skips = tempfile::tempdir().expect("a folder for the children's skip log");
    for (binary, test) in cases {
        let Some(path) = sibling_test_binary(binary) else {
            test_servers::skip_or_fail(
                "under_ci_a_test_missing_its_tool_or_server_fails",
                &format!("no {binary} test binary beside this one (run cargo test --workspace)"),
                test_servers::under_ci(),
            );
            continue;
        };
        let run = |ci: Option<&str>| {
            let mut command = Command::new(&path);
            command
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env("PATH", empty.path())
                .env("CARGO_TARGET_DIR", skips.path())
                .env_remove("MONGODB_URI")
                .env_remove("TURNSTILE_MONGO_SERVER")
                .env_remove("TURNSTILE_E2E_KUBECONFIG");
            match ci {
                Some(value) => command.env("CI", value),
                None => command.env_remove("CI"),
            };
            let output = command.output().expect("run the test binary");
            let said = String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr);
            (output.status.success(), said)
        };
        let (passed, said) = run(None);
        assert!(passed, "{binary}::{test} without CI: {said}");
        assert!(
            said.contains("skipped"),
            "{binary}::{test} said why: {said}"
        );
        assert!(said.contains("1 passed"), "{binary}::{test} ran: {said}");
        let listed =
            std::fs::read_to_string(skips.path().join("test-skips.log")).unwrap_or_default();
        assert!(
            listed.contains(&format!("skipped {}", function_name(test)))
                || listed.contains("skipped ("),
            "{binary}::{test}'s skip is listed in the skip log: {listed}"
        );
        for ci in ["true", "1"] {
            let (passed, said) = run(Some(ci));
            assert!(!passed, "{binary}::{test} passed under CI={ci}: {said}");
            assert!(said.contains("1 failed"), "{binary}::{test}: {said}");
        }
    }
}

/// Every `path.rs::name` the promise ledger (`docs/src/development/promises.md`) gives as a promise's test
/// names a file that exists and defines that test (or item), every row is `tested`, and the
/// count line at its top is the count of its rows: a renamed or deleted test, or a row added
/// untested, makes the ledger wrong, and this says where.
#[test]
fn the_promise_ledger_names_tests_that_exist_and_counts_its_rows() {
    let ledger = std::fs::read_to_string(workspace().join("docs/src/development/promises.md"))
        .expect("ledger");
    let rows: Vec<&str> = ledger
        .lines()
        .filter(|line| line.starts_with("| "))
        .filter(|line| !line.starts_with("| promise") && !line.starts_with("| ---"))
        .collect();
    let mut wrong = Vec::new();
    let mut named = 0;
    for row in &rows {
        if !row.trim_end().ends_with("| tested |") {
            wrong.push(format!("not tested: {row}"));
        }
        // The test cells: `path.rs::function` in backticks.
        for quoted in row.split('`').skip(1).step_by(2) {
            let Some((path, item)) = quoted.split_once(".rs::") else {
                continue;
            };
            named += 1;
            let path = format!("{path}.rs");
            // `module::function` names the function; `Item (what it is)` the item.
            let name = item
                .rsplit("::")
                .next()
                .and_then(|last| last.split_whitespace().next())
                .unwrap_or_default();
            let Ok(source) = std::fs::read_to_string(workspace().join(&path)) else {
                wrong.push(format!("no file {path} (for {quoted})"));
                continue;
            };
            let defined = ["fn ", "struct "].iter().any(|keyword| {
                source
                    .match_indices(&format!("{keyword}{name}"))
                    .any(|(at, found)| {
                        let after = source[at + found.len()..].chars().next();
                        after.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                    })
            });
            if !defined {
                wrong.push(format!("{path} defines no {name} (for {quoted})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the ledger is wrong:\n{}",
        wrong.join("\n")
    );
    assert!(
        named > rows.len(),
        "{named} tests named for {} rows",
        rows.len()
    );
    let count_line = format!("Now {} rows, all tested.", rows.len());
    assert!(
        ledger.contains(&count_line),
        "the ledger's count line should read {count_line:?}"
    );
}

/// ARCHITECTURE.md names files by their paths from the workspace root (the pass's steps, the
/// places to change things): each one exists, so the page cannot drift from the code unseen.
#[test]
fn every_path_architecture_md_names_exists() {
    let page =
        std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let roots = ["crates/", "src/", "tests/", "deploy/"];
    let paths: Vec<&str> = page
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| roots.iter().any(|root| span.starts_with(root)))
        .filter(|span| !span.contains(' '))
        .collect();
    assert!(paths.len() >= 10, "read the page's paths: {paths:?}");
    let missing: Vec<&&str> = paths
        .iter()
        .filter(|path| !workspace().join(path).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names missing paths: {missing:?}"
    );
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
    assert!(
        readme.contains("(ARCHITECTURE.md)"),
        "the README links the page"
    );
}

/// The `.rs` files under `dir`, recursively.
fn rust_files_under(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files_under(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
}

/// Whether a test's `sleep(…)` line is a short poll (a literal under a second), which needs no
/// reason: it only paces a loop that waits for a sign.
fn is_short_poll(line: &str) -> bool {
    line.split("from_millis(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|millis| millis.replace('_', "").parse::<u64>().ok())
        .is_some_and(|millis| millis < 1000)
}

/// A test that sleeps and then asserts "nothing changed" passes against a controller that is
/// merely slow or stuck. So every sleep in the tests of a second or more (or of a computed
/// length) says, in a `// Time:` comment just above it, why time itself must pass there (a
/// lease running out, a fault's length, an idle window); waits for the controller use a
/// positive sign instead (`Env::after_a_pass_over`, a status, an Event).
#[test]
fn every_long_sleep_in_the_tests_says_why_time_must_pass() {
    let mut files = Vec::new();
    rust_files_under(&workspace().join("tests"), &mut files);
    for crate_dir in std::fs::read_dir(workspace().join("crates"))
        .expect("crates/")
        .flatten()
    {
        rust_files_under(&crate_dir.path().join("tests"), &mut files);
    }
    assert!(
        files.len() > 50,
        "read the test tree: {} files",
        files.len()
    );
    let mut unexplained = Vec::new();
    let mut explained = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a test file");
        let lines: Vec<&str> = text.lines().collect();
        for (index, line) in lines.iter().enumerate() {
            let code = line.trim_start();
            if !code.contains("sleep(") || code.starts_with("//") || code.contains("fn ") {
                continue;
            }
            if is_short_poll(code) {
                continue;
            }
            let reason = lines[index.saturating_sub(3)..index]
                .iter()
                .any(|above| above.trim_start().starts_with("// Time:"));
            if reason {
                explained += 1;
            } else {
                unexplained.push(format!(
                    "{}:{}: {code}",
                    file.strip_prefix(workspace()).unwrap_or(file).display(),
                    index + 1
                ));
            }
        }
    }
    assert!(explained >= 20, "found {explained} explained sleeps");
    assert!(
        unexplained.is_empty(),
        "sleeps without a `// Time:` reason (wait for a positive sign instead, or say why time \
         must pass):\n{}",
        unexplained.join("\n")
    );
}

/// The folders of the controller's shell that only group modules: each file in them is a
/// module of its own in the import graph (`pass::multi_lock`); any other folder (`core`,
/// `gate`, `metrics`) is one module.
const GROUPS: [&str; 4] = ["pass", "runtime", "wakes", "writer"];

/// The paths after `crate::` (and after `super::`, read as `parent::`, when given) a
/// controller source file names, each cut to the module it is in (see [`GROUPS`]), every
/// branch of a `{…}` tree included. Comment lines are left out (a doc link is no import), as
/// is the `cfg(test)` part.
fn modules_named(text: &str, parent: Option<&[String]>) -> BTreeSet<String> {
    let code: String = text
        .split("#[cfg(test)]")
        .next()
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut prefixes: Vec<(&str, Vec<String>)> = vec![("crate::", Vec::new())];
    if let Some(parent) = parent {
        prefixes.push(("super::", parent.to_vec()));
    }
    let mut named = BTreeSet::new();
    for (prefix, base) in &prefixes {
        for (at, _) in code.match_indices(prefix) {
            if at > 0 && code[..at].ends_with(|ch: char| ch.is_alphanumeric() || ch == '_') {
                continue;
            }
            for path in use_paths(&code[at + prefix.len()..], base.clone()) {
                named.insert(module_of(&path));
            }
        }
    }
    named.remove("");
    named
}

/// The paths of the use tree at the start of `rest`, after `base`, to two segments deep.
fn use_paths(rest: &str, base: Vec<String>) -> Vec<Vec<String>> {
    let name: String = rest
        .chars()
        .take_while(|ch| ch.is_ascii_lowercase() || *ch == '_')
        .collect();
    if let Some(group) = rest.strip_prefix('{') {
        // Each top-level branch of the group.
        let (mut depth, mut start, mut paths) = (0, 0, Vec::new());
        for (at, ch) in group.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    paths.extend(use_paths(group[start..at].trim_start(), base.clone()));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths.extend(use_paths(group[start..at].trim_start(), base.clone()));
                    start = at + 1;
                }
                _ => {}
            }
        }
        return paths;
    }
    if name.is_empty() || name == "self" {
        return vec![base];
    }
    let mut path = base;
    path.push(name.clone());
    match rest[name.len()..].strip_prefix("::") {
        Some(next) if path.len() < 2 => use_paths(next, path),
        _ => vec![path],
    }
}

/// The module of the import graph a path is in (see [`GROUPS`]).
fn module_of(path: &[String]) -> String {
    match path {
        [group, module, ..] if GROUPS.contains(&group.as_str()) => format!("{group}::{module}"),
        [module, ..] => module.clone(),
        [] => String::new(),
    }
}

/// The controller's modules (`src/X.rs`, `src/X/…`, and each file of the shell's grouping
/// folders: [`GROUPS`]) import one another in one direction: no module is imported,
/// directly or around a loop, by a module it imports. (The wiring, `runtime/context.rs`,
/// holds handles of many modules; they take the handles they need, not it.)
#[test]
fn the_controllers_modules_import_one_another_in_one_direction() {
    let src = workspace().join("crates/turnstile-controller/src");
    let mut files = Vec::new();
    rust_files_under(&src, &mut files);
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let parts: Vec<String> = relative
            .components()
            .map(|part| {
                let part = part.as_os_str().to_string_lossy();
                part.trim_end_matches(".rs").to_owned()
            })
            .collect();
        if parts == ["lib"] {
            continue;
        }
        let grouped = GROUPS.contains(&parts[0].as_str()) && parts.len() == 2;
        // What `super` is, where it is a module of the graph's level.
        let parent: Option<Vec<String>> = match parts.as_slice() {
            [_] => Some(Vec::new()),
            [_, last] if last == "mod" => Some(Vec::new()),
            [group, _] if grouped => Some(vec![group.clone()]),
            _ => None,
        };
        let module = if grouped && parts[1] != "mod" {
            format!("{}::{}", parts[0], parts[1])
        } else {
            parts[0].clone()
        };
        let text = std::fs::read_to_string(file).expect("source");
        let named = modules_named(&text, parent.as_deref());
        let entry = imports.entry(module.clone()).or_default();
        entry.extend(named.into_iter().filter(|name| *name != module));
    }
    let modules: BTreeSet<String> = imports.keys().cloned().collect();
    for named in imports.values_mut() {
        named.retain(|name| modules.contains(name));
    }
    // The graph was read: the pass's modules are in it with their known imports.
    assert!(modules.len() > 20, "{modules:?}");
    for (from, to) in [
        ("pass::lock_reconciler", "pass::gather"),
        ("pass::execute", "pass::multi_lock"),
        ("pass::multi_lock", "pass::backend_call"),
        ("runtime", "runtime::context"),
        ("writer", "leader"),
        ("writer", "writer::own_writes"),
    ] {
        assert!(imports[from].contains(to), "{from} → {to}: {imports:?}");
    }
    // Depth-first search for a loop, printing the first one found.
    fn visit<'a>(
        module: &'a str,
        imports: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(at) = path.iter().position(|on| *on == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module);
            return Some(cycle);
        }
        if !done.insert(module) {
            return None;
        }
        path.push(module);
        for next in &imports[module] {
            if let Some(cycle) = visit(next, imports, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for module in &modules {
        let cycle = visit(module, &imports, &mut Vec::new(), &mut done);
        assert!(
            cycle.is_none(),
            "an import loop: {}",
            cycle.unwrap_or_default().join(" → ")
        );
    }
}
