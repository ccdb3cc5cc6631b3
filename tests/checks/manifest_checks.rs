//! The manifests checked by the tools the ecosystem trusts: `deploy/` rendered by the kubectl
//! on PATH (the base alone, with each component, and with all of them), the Helm chart
//! rendered by `helm template` (default values, and `ci/all-toggles-values.yaml`) and
//! `examples/`,
//!
//! - validated with `kubernetes-validate --strict` against the Kubernetes OpenAPI schemas of
//!   the oldest and the newest version the README's "Supported Kubernetes versions" line names
//!   (a kind an optional component takes from a later version, against that version instead of
//!   the oldest: [`NEWER_KINDS`]);
//! - the custom resources (`turnstile.dev`, which kubernetes-validate has no schema for)
//!   validated by `tests/manifest_checks/validate_custom_resources.py`: the same jsonschema
//!   validator, against the strict openAPIV3Schema of `crds/`, `metadata` against
//!   kubernetes-validate's ObjectMeta of each version (CEL rules are not evaluated there; the
//!   fake API server's e2e tests run them);
//! - scanned by `checkov --framework kubernetes --skip-download` to 0 failures, each skip an
//!   annotated `checkov.io/skipN: CKV_K8S_xx=reason` on its object.
//!
//! The monitoring component's ServiceMonitor and PrometheusRule (monitoring.coreos.com) have no
//! schema here: kubernetes-validate does not ship the Prometheus Operator's, so they are only
//! checked by tests/e2e/monitoring.rs (structure, promtool). The examples are validated, not
//! scanned by checkov: they are samples to copy (busybox Jobs in your namespace), not hardened
//! deployments.
//!
//! The tools come from PyPI into a venv (`.ci/install`). Without them each test says so and
//! passes, except under `CI=true`, where it fails.

use crate::deploy;
use crate::files::file_names;
use crate::scratch;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::files::scratch_file;
use crate::lines::docs_line;
use deploy::{
    helm_template_text, kind_of, kustomize_text, name_of, objects, render_base,
    render_text_with_components, repo, ALL_TOGGLES,
};
use scratch::scratch;
use serde_json::Value;

/// `tool` on PATH, or None after saying why (a failure under `CI=true`).
fn tool(name: &str, test: &str) -> Option<PathBuf> {
    test_servers::tool_or_skip(name, test, "PyPI; `bash .ci/install` installs it")
}

/// The oldest and newest supported Kubernetes versions, from the install guide's line
/// "Supported Kubernetes versions: **1.X to 1.Y**".
fn supported_versions() -> (String, String) {
    let line = docs_line("how-to/install.md", "Supported Kubernetes versions:");
    let range = line
        .split("**")
        .nth(1)
        .unwrap_or_else(|| panic!("no **1.X to 1.Y** in {line:?}"));
    let (oldest, newest) = range
        .split_once(" to ")
        .unwrap_or_else(|| panic!("no \"1.X to 1.Y\" in {range:?}"));
    for version in [oldest, newest] {
        let mut parts = version.split('.');
        assert!(
            parts.next() == Some("1")
                && parts
                    .next()
                    .is_some_and(|minor| minor.parse::<u32>().is_ok())
                && parts.next().is_none(),
            "{version:?} is not a Kubernetes minor version"
        );
    }
    (format!("{oldest}.0"), format!("{newest}.0"))
}

/// Every rendering of `deploy/` (the base, with each component, with all), written to files
/// as kubectl printed it: (what, file, objects).
fn renderings(dir: &Path) -> Vec<(String, PathBuf, Vec<Value>)> {
    let mut out = Vec::new();
    let mut add = |what: &str, text: String| {
        let file = dir.join(format!("{}.yaml", what.replace('+', "-")));
        std::fs::write(&file, &text).expect("write a rendering");
        out.push((what.to_string(), file, objects(&text)));
    };
    add("base", kustomize_text(&repo().join("deploy")));
    let components: Vec<String> = file_names(&repo().join("deploy/components"))
        .into_iter()
        .collect();
    assert!(components.len() >= 3, "{components:?}");
    for component in &components {
        add(
            &format!("base+{component}"),
            render_text_with_components(&[component.as_str()]),
        );
    }
    let all: Vec<&str> = components.iter().map(String::as_str).collect();
    add("base+all", render_text_with_components(&all));
    // The Helm chart, with its default values and with every toggle on.
    add("helm-default", helm_template_text(&[]));
    add("helm-all-toggles", helm_template_text(&[ALL_TOGGLES]));
    out
}

/// `examples/*.yaml`: (file, objects).
fn examples() -> Vec<(PathBuf, Vec<Value>)> {
    let dir = repo().join("examples");
    let files: Vec<PathBuf> = file_names(&dir)
        .into_iter()
        .filter(|name| name.ends_with(".yaml"))
        .map(|name| dir.join(name))
        .collect();
    assert!(!files.is_empty());
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read an example");
            (path, objects(&text))
        })
        .collect()
}

fn api_group(object: &Value) -> &str {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    api_version
        .split_once('/')
        .map(|(group, _)| group)
        .unwrap_or_default()
}

/// Groups kubernetes-validate has no schema for: ours (validated from crds/) and the
/// Prometheus Operator's (the monitoring component).
const CUSTOM_GROUPS: [&str; 2] = ["turnstile.dev", "monitoring.coreos.com"];

/// Built-in kinds newer than the oldest supported version, with the Kubernetes minor version
/// that serves them: an optional component uses them, and says so. They are validated against
/// that version and the newest.
const NEWER_KINDS: [(&str, u32); 2] = [
    ("MutatingAdmissionPolicy", 36),
    ("MutatingAdmissionPolicyBinding", 36),
];

/// The minor of a version `1.X` or `1.X.0`.
fn minor(version: &str) -> u32 {
    version
        .split('.')
        .nth(1)
        .and_then(|minor| minor.parse().ok())
        .unwrap_or_else(|| panic!("{version:?} is not a Kubernetes version"))
}

/// The minor version from which `kind` is served, if it is one of the [`NEWER_KINDS`].
fn served_since(kind: &str) -> Option<u32> {
    NEWER_KINDS
        .iter()
        .find(|(newer, _)| *newer == kind)
        .map(|(_, minor)| *minor)
}

fn run(command: &mut Command) -> (bool, String) {
    let output = command.output().expect("run the tool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Asserts that the validator's output `text` says `object` of `file` passed against
/// Kubernetes `version` (its own line, as kubernetes-validate prints it).
fn assert_passed(text: &str, file: &Path, object: &Value, version: &str) {
    let minor = version.trim_end_matches(".0");
    let expected = format!(
        "INFO {} passed for resource {}/{} against version {minor}",
        file.display(),
        kind_of(object).to_lowercase(),
        name_of(object)
    );
    assert!(
        text.lines().any(|line| line == expected),
        "no {expected:?} in:\n{text}"
    );
}

#[test]
fn the_supported_versions_line_names_a_range_the_schemas_cover() {
    let (oldest, newest) = supported_versions();
    // x-kubernetes-validations (CEL) in the CRDs are GA from 1.29.
    assert!(
        minor(&oldest) >= 29,
        "{oldest}: the CRDs' CEL rules need 1.29"
    );
    assert!(minor(&oldest) <= minor(&newest));
    let crds = std::fs::read_to_string(repo().join("crds/lockclaims.turnstile.dev.yaml"))
        .expect("read the LockClaim CRD");
    assert!(crds.contains("x-kubernetes-validations"));
}

#[test]
fn every_manifest_passes_kubernetes_validate_strict_on_the_oldest_and_newest_versions() {
    let test = "every_manifest_passes_kubernetes_validate_strict_on_the_oldest_and_newest_versions";
    let Some(validate) = tool("kubernetes-validate", test) else {
        return;
    };
    let (oldest, newest) = supported_versions();
    let dir = scratch("kubernetes-validate-");
    let mut files: Vec<(PathBuf, Vec<Value>)> = renderings(dir.path())
        .into_iter()
        .map(|(_, file, objects)| (file, objects))
        .collect();
    files.extend(examples());
    let newer: BTreeSet<String> = NEWER_KINDS
        .iter()
        .map(|(_, since)| format!("1.{since}.0"))
        .filter(|version| minor(version) > minor(&oldest) && minor(version) < minor(&newest))
        .collect();
    let (ok, text) = run(Command::new(&validate)
        .arg("--strict")
        .args(["-k", &oldest, "-k", &newest])
        .args(newer.iter().flat_map(|version| ["-k", version.as_str()]))
        .args(files.iter().map(|(file, _)| file)));
    assert!(ok, "kubernetes-validate failed:\n{text}");
    for line in text.lines() {
        assert!(
            line.starts_with("INFO ") || line.starts_with("WARN "),
            "unexpected output: {line}\n{text}"
        );
        if line.starts_with("WARN ") {
            let custom = CUSTOM_GROUPS
                .iter()
                .any(|group| line.contains(&format!("api version {group}/")));
            let not_yet_served = NEWER_KINDS.iter().any(|(kind, since)| {
                line.contains(&format!("for kind {kind} with"))
                    && line
                        .rsplit_once("for kubernetes version ")
                        .is_some_and(|(_, version)| minor(version) < *since)
            });
            assert!(
                line.contains("Couldn't find schema for kind") && (custom || not_yet_served),
                "a built-in kind without a schema: {line}"
            );
        }
    }
    // Every built-in object passed against both versions, by name.
    let mut checked = 0;
    for (file, objects) in &files {
        for object in objects {
            if CUSTOM_GROUPS.contains(&api_group(object)) {
                continue;
            }
            let first = served_since(kind_of(object))
                .map_or(oldest.clone(), |since| format!("1.{since}.0"));
            for version in [&first, &newest] {
                assert_passed(&text, file, object, version);
                checked += 1;
            }
        }
    }
    assert!(checked > 40, "only {checked} validations");
    println!(
        "kubernetes-validate --strict: {checked} object validations passed ({oldest}, {newest})"
    );
}

#[test]
fn kubernetes_validate_strict_rejects_an_unknown_field() {
    let Some(validate) = tool(
        "kubernetes-validate",
        "kubernetes_validate_strict_rejects_an_unknown_field",
    ) else {
        return;
    };
    let (oldest, _) = supported_versions();
    let (_dir, file) = scratch_file(
        "kubernetes-validate-bad-",
        "bad.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: 80\n      targetPorts: 8080\n",
    );
    let (ok, text) = run(Command::new(&validate)
        .args(["--strict", "-k", &oldest])
        .arg(&file));
    assert!(!ok, "an unknown field passed:\n{text}");
    assert!(text.contains("targetPorts"), "{text}");
}

/// The Python of kubernetes-validate's venv (it has jsonschema and kubernetes_validate).
fn venv_python(validate: &Path) -> PathBuf {
    let script = std::fs::canonicalize(validate).expect("resolve kubernetes-validate");
    script.parent().expect("bin/").join("python")
}

fn validate_custom_resources(
    python: &Path,
    version: &str,
    manifests: &[PathBuf],
) -> (bool, String) {
    let dir = repo().join("crds");
    let crds: Vec<PathBuf> = file_names(&dir)
        .into_iter()
        .map(|name| dir.join(name))
        .collect();
    run(Command::new(python)
        .arg(repo().join("tests/manifest_checks/validate_custom_resources.py"))
        .arg(version)
        .args(&crds)
        .arg("--")
        .args(manifests))
}

#[test]
fn every_custom_resource_passes_the_crd_schemas_strictly() {
    let test = "every_custom_resource_passes_the_crd_schemas_strictly";
    let Some(validate) = tool("kubernetes-validate", test) else {
        return;
    };
    let python = venv_python(&validate);
    let (oldest, newest) = supported_versions();
    let examples = examples();
    let files: Vec<PathBuf> = examples.iter().map(|(file, _)| file.clone()).collect();
    let custom: Vec<(&PathBuf, &Value)> = examples
        .iter()
        .flat_map(|(file, objects)| objects.iter().map(move |object| (file, object)))
        .filter(|(_, object)| api_group(object) == "turnstile.dev")
        .collect();
    assert!(
        custom.len() >= 5,
        "{} custom resources in examples/",
        custom.len()
    );
    for version in [&oldest, &newest] {
        let (ok, text) = validate_custom_resources(&python, version, &files);
        assert!(ok, "custom resources failed against {version}:\n{text}");
        for (file, object) in &custom {
            assert_passed(&text, file, object, version);
        }
    }
    // And it can fail: an unknown spec field, unknown metadata, a mode outside the enum.
    let (_dir, bad) = scratch_file(
        "custom-resources-bad-",
        "bad.yaml",
        "apiVersion: turnstile.dev/v1alpha1\nkind: LockClaim\nmetadata:\n  name: x\n  labelz: {}\nspec:\n  lockName: db\n  mode: Weird\n  lockname: db\n",
    );
    let (ok, text) = validate_custom_resources(&python, &oldest, &[bad]);
    assert!(!ok, "a bad claim passed:\n{text}");
    for field in ["labelz", "Weird", "lockname"] {
        assert!(text.contains(field), "{field} not reported:\n{text}");
    }
}

/// The `checkov.io/skipN` annotations of `object`: (check id, reason).
fn skips(object: &Value) -> Vec<(String, String)> {
    object["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| key.starts_with("checkov.io/skip"))
        .map(|(key, value)| {
            let value = value.as_str().expect("a string annotation");
            let (id, reason) = value
                .split_once('=')
                .unwrap_or_else(|| panic!("{key}: {value:?} is not CKV_…=reason"));
            assert!(id.starts_with("CKV"), "{key}: {id}");
            assert!(reason.len() >= 20, "{key}: say why, not {reason:?}");
            (id.to_string(), reason.to_string())
        })
        .collect()
}

#[test]
fn checkov_finds_nothing_in_deploy_but_the_annotated_skips() {
    let test = "checkov_finds_nothing_in_deploy_but_the_annotated_skips";
    let Some(checkov) = tool("checkov", test) else {
        return;
    };
    let dir = scratch("checkov-");
    let renderings = renderings(dir.path());
    // A Pod that should fail, to show the scan does scan.
    let bad = dir.path().join("unhardened.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: unhardened\n  namespace: x\nspec:\n  containers:\n    - name: c\n      image: busybox\n",
    )
    .expect("write");
    let mut command = Command::new(&checkov);
    command
        .args(["--framework", "kubernetes", "--skip-download", "-o", "json"])
        .current_dir(dir.path());
    for (_, file, _) in &renderings {
        command.arg("-f").arg(file);
    }
    command.arg("-f").arg(&bad);
    let output = command.output().expect("run checkov");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "checkov's JSON ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let report = if report.is_array() {
        report
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["check_type"] == "kubernetes")
            .expect("the kubernetes report")
            .clone()
    } else {
        report
    };
    assert_eq!(
        report["summary"]["parsing_errors"], 0,
        "{}",
        report["summary"]
    );
    let in_file = |check: &Value, file: &Path| {
        check["file_path"]
            .as_str()
            .is_some_and(|path| path.ends_with(&*file.file_name().unwrap().to_string_lossy()))
    };
    let results = &report["results"];
    let list = |key: &str| results[key].as_array().cloned().unwrap_or_default();
    let failed = list("failed_checks");
    let passed = list("passed_checks");
    let skipped = list("skipped_checks");

    let unhardened: Vec<_> = failed.iter().filter(|c| in_file(c, &bad)).collect();
    assert!(
        unhardened.len() >= 5,
        "checkov found only {} problems in an unhardened Pod",
        unhardened.len()
    );
    let ours: Vec<String> = failed
        .iter()
        .filter(|c| !in_file(c, &bad))
        .map(|c| format!("{} {} ({})", c["check_id"], c["resource"], c["file_path"]))
        .collect();
    assert!(
        ours.is_empty(),
        "checkov failures in deploy/:\n{}",
        ours.join("\n")
    );
    assert!(passed.len() > 300, "only {} checks passed", passed.len());

    // Every skip is an annotation with its reason on the object, and every annotation is used.
    let mut annotated = BTreeSet::new();
    for (_, _, objects) in &renderings {
        for object in objects {
            for (id, _) in skips(object) {
                annotated.insert((kind_of(object).to_string(), name_of(object).to_string(), id));
            }
        }
    }
    let used: BTreeSet<(String, String, String)> = skipped
        .iter()
        .map(|check| {
            let resource = check["resource"].as_str().expect("resource");
            // "Kind.namespace.name"
            let mut parts = resource.splitn(3, '.');
            let kind = parts.next().unwrap_or_default().to_string();
            let _namespace = parts.next();
            let name = parts.next().unwrap_or_default().to_string();
            (
                kind,
                name,
                check["check_id"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        used, annotated,
        "checkov's skips and the manifests' annotations differ"
    );
    println!(
        "checkov: {} passed, 0 failed in deploy/, skipped {:?}",
        passed.iter().filter(|c| !in_file(c, &bad)).count(),
        annotated
    );
}

#[test]
fn the_controller_network_policy_admits_only_the_metrics_port() {
    let objects = render_base();
    let policy = deploy::find(&objects, "NetworkPolicy", "turnstile-controller");
    let deployment = deploy::find(&objects, "Deployment", "turnstile-controller");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(pod_labels.get(key), Some(value), "the Pod lacks {key}");
    }
    assert_eq!(
        deploy::strings(policy.pointer("/spec/policyTypes")),
        ["Ingress", "Egress"]
    );
    let ingress = policy["spec"]["ingress"].as_array().expect("ingress");
    assert_eq!(ingress.len(), 1);
    let ports = ingress[0]["ports"].as_array().expect("ingress ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["port"], "metrics");
    let container_ports: Vec<&Value> = deployment["spec"]["template"]["spec"]["containers"][0]
        ["ports"]
        .as_array()
        .expect("container ports")
        .iter()
        .collect();
    assert!(container_ports.iter().any(|p| p["name"] == "metrics"));
    let egress_ports: BTreeSet<(i64, String)> = policy["spec"]["egress"]
        .as_array()
        .expect("egress")
        .iter()
        .flat_map(|rule| rule["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| {
            (
                p["port"].as_i64().expect("a numbered port"),
                p["protocol"].as_str().unwrap_or("TCP").to_string(),
            )
        })
        .collect();
    // Exactly the README's list: DNS, the API server, the backends (Redis plain and TLS).
    let listed: BTreeSet<(i64, String)> = [
        (53, "UDP"),
        (53, "TCP"),
        (443, "TCP"),
        (6443, "TCP"),
        (6379, "TCP"),
        (6380, "TCP"),
        (27017, "TCP"),
    ]
    .into_iter()
    .map(|(port, protocol)| (port, protocol.to_owned()))
    .collect();
    assert_eq!(egress_ports, listed, "egress ports");
}
