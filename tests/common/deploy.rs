//! Rendering the kustomize base in `deploy/` with the `kubectl` on PATH and reading its
//! objects and RBAC rules: shared by the manifest checks and the e2e RBAC coverage test.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl kustomize DIR`, as kubectl prints it.
pub fn kustomize_text(dir: &Path) -> String {
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl on PATH (the deploy tests render with it)");
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 manifests")
}

/// Multi-document YAML, split into objects.
pub fn objects(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).expect("a YAML object"))
        .filter(|object| !object.is_null())
        .collect()
}

/// `kubectl kustomize DIR`, split into objects.
pub fn kustomize(dir: &Path) -> Vec<Value> {
    objects(&kustomize_text(dir))
}

/// `kubectl kustomize deploy/`, split into objects.
pub fn render_base() -> Vec<Value> {
    kustomize(&repo().join("deploy"))
}

/// `to` relative to the directory `from` (kustomize refuses absolute resource paths).
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for component in &to[common..] {
        path.push(component);
    }
    path
}

/// The base plus one of `deploy/components/`, through an overlay as a user would write it.
pub fn render_with_component(name: &str) -> Vec<Value> {
    render_with_components(&[name])
}

/// The base plus some of `deploy/components/`, through an overlay as a user would write it.
pub fn render_with_components(names: &[&str]) -> Vec<Value> {
    objects(&render_text_with_components(names))
}

/// [`render_with_components`] as kubectl prints it.
pub fn render_text_with_components(names: &[&str]) -> String {
    let overlay = tempfile::Builder::new()
        .prefix("deploy-overlay-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary overlay directory");
    let root = overlay.path().canonicalize().expect("overlay path");
    let deploy = repo().join("deploy").canonicalize().expect("deploy path");
    let base = relative(&root, &deploy);
    let mut kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n",
        base.display()
    );
    for name in names {
        let component = base.join("components").join(name);
        kustomization.push_str(&format!("  - {}\n", component.display()));
    }
    std::fs::write(root.join("kustomization.yaml"), kustomization).expect("write the overlay");
    kustomize_text(&root)
}

/// The string at a JSON `pointer`.
pub fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

/// An object's `kind`.
pub fn kind_of(object: &Value) -> &str {
    str_at(object, "/kind").unwrap_or_default()
}

/// An object's `metadata.name`.
pub fn name_of(object: &Value) -> &str {
    str_at(object, "/metadata/name").unwrap_or_default()
}

/// The rendered object of `kind` named `name`; panics when missing.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| kind_of(o) == kind && name_of(o) == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// A JSON array of strings (empty when absent).
pub fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// One `(apiGroup, resource, verb)` a rule grants, with its resourceNames (empty: any).
pub type Grant = (String, String, String, Vec<String>);

/// Every grant of a Role or ClusterRole, one per group × resource × verb.
pub fn grants(role: &Value) -> Vec<Grant> {
    let mut out = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert!(
            rule.get("nonResourceURLs").is_none(),
            "{}: non-resource URLs",
            name_of(role)
        );
        let names = strings(rule.get("resourceNames"));
        for group in strings(rule.get("apiGroups")) {
            for resource in strings(rule.get("resources")) {
                for verb in strings(rule.get("verbs")) {
                    out.push((group.clone(), resource.clone(), verb, names.clone()));
                }
            }
        }
    }
    out
}

/// The helm built from its Go module (`scripts/helm.sh`), if it is built.
pub fn helm() -> Option<PathBuf> {
    let output = Command::new("bash")
        .arg(repo().join("scripts/helm.sh"))
        .arg("bin")
        .output()
        .expect("run scripts/helm.sh");
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    path.is_file().then_some(path)
}

/// The helm binary; panics (naming how to build it) when it is not built.
pub fn helm_or_panic() -> PathBuf {
    helm().expect("helm is not built: bash scripts/helm.sh build (.ci/install does it)")
}

/// `helm template turnstile charts/turnstile -n turnstile-system` with the values files
/// `values`, as helm prints it.
pub fn helm_template_text(values: &[&str]) -> String {
    let mut command = Command::new(helm_or_panic());
    command
        .args(["template", "turnstile"])
        .arg(repo().join("charts/turnstile"))
        .args(["--namespace", "turnstile-system"]);
    for file in values {
        command.arg("-f").arg(repo().join(file));
    }
    let output = command.output().expect("run helm template");
    assert!(
        output.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 manifests")
}

/// The chart's values file with every toggle on.
pub const ALL_TOGGLES: &str = "charts/turnstile/ci/all-toggles-values.yaml";
